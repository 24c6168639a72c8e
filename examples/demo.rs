//! A configurable demo server: try settings by hand, and the target of the
//! black-box tests.
//!
//! ```text
//! cargo run --example demo -- --limit 3 --window 10s --key ip --headers both
//! cargo run --example demo -- --algorithm token-bucket --burst 20 --quota 10/1s --quota 1000/1h
//! # State in Redis: one primary, several primaries (sharded), or a Redis Cluster.
//! cargo run --example demo --features redis -- --store redis --redis-url redis://10.0.0.1
//! cargo run --example demo --features redis -- --store redis \
//!     --redis-url redis://10.0.0.1 --redis-url redis://10.0.0.2 --redis-url redis://10.0.0.3
//! cargo run --example demo --features cluster -- --store redis \
//!     --redis-cluster redis://10.0.0.1:7000,redis://10.0.0.2:7000
//! # A managed Redis over TLS, with its CA (and a client certificate for mutual TLS).
//! cargo run --example demo --features tls -- --store redis \
//!     --redis-url rediss://:PASSWORD@redis.example.com:6380 --redis-ca ca.pem \
//!     --redis-cert client.pem --redis-key client.key
//! # The primary Sentinel names.
//! cargo run --example demo --features sentinel -- --store redis \
//!     --redis-sentinel redis://10.0.0.1:26379,redis://10.0.0.2:26379 --sentinel-master mymaster
//! ```
//!
//! Routes: `GET /` → 200 `ok`; `GET /not-modified` → 304 (refunded);
//! `GET /now` → 200 with the time the handler ran (Unix ms);
//! `GET /status/{code}` → that status; `GET /slow/{ms}` → 200 after holding the
//! request that long; `GET /tokens/{n}` → 200 with `x-tokens-used: n` (what
//! `--token-quota` settles); `GET /rate_limit` → the caller's state
//! as JSON (`limit`, `remaining`, `reset`, `used`), not counted; `GET
//! /rate_limit/advice` → the limits the advisor suggests (with `--advise`). Prints one line `listening on ADDR` once
//! it accepts connections, and exits cleanly on SIGTERM or Ctrl-C.
//!
//! `--concurrency N` caps each key's requests in flight (in the store chosen
//! with `--store`), and `--shed-capacity N` sheds by the `x-priority` header
//! (`critical`, `normal`, `low`, `test`) when N requests are in flight
//! (`--adaptive`: with a capacity found from latency, starting at 20).
//! `--wait-up-to DUR` (GCRA quotas) holds a request until its turn instead
//! of refusing it, when its turn is that near; `--penalty-after N
//! --penalty-for DUR` blocks a client refused N times within a window:
//!
//! ```text
//! cargo run --example demo -- --algorithm gcra --limit 5 --window 1s --wait-up-to 10s
//! cargo run --example demo -- --limit 5 --window 10s --penalty-after 3 --penalty-for 30s
//! ```
//! `--fleet-shed-capacity N` (with `--store redis`) sheds by the same header
//! when the whole fleet has N requests in flight, counted in Redis:
//!
//! ```text
//! cargo run --features redis --example demo -- --store redis --concurrency 2 --shed-capacity 20
//! cargo run --features redis --example demo -- --store redis --fleet-shed-capacity 10
//! ```
//!
//! `--admin-listen [ADDR]` serves an admin interface (loopback by default)
//! that changes the rate limit at runtime, per key; with `--store redis` the
//! changes hold for every instance on the same Redis. Every request needs
//! `Authorization: Bearer TOKEN`, with the token from `--admin-token`, else
//! `TRL_ADMIN_TOKEN` (out of `ps`), else a random one the demo makes; and a
//! `Host` it serves (its address, `localhost`, `127.0.0.1` or `[::1]` on its
//! port, or an `--admin-host` name): 401 without the token, 421 for another
//! `Host`, so that neither a cross-site page nor DNS rebinding can change a
//! limit. It prints `admin listening on ADDR` after the first line, then
//! `admin token TOKEN` when it made the token:
//!
//! ```text
//! export TRL_ADMIN_TOKEN=$(openssl rand -hex 16)
//! cargo run --features redis --example demo -- --store redis --key header:x-client --admin-listen
//! curl -H "Authorization: Bearer $TRL_ADMIN_TOKEN" -X PUT --data '1000/1m' http://127.0.0.1:9091/limits/acme
//! curl -H "Authorization: Bearer $TRL_ADMIN_TOKEN" http://127.0.0.1:9091/limits
//! curl -H "Authorization: Bearer $TRL_ADMIN_TOKEN" -X DELETE http://127.0.0.1:9091/limits/acme
//! ```

#[path = "common/admin_guard.rs"]
mod admin_guard;
#[path = "common/mod.rs"]
mod common;

use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::{http::StatusCode, routing::get, Router};
use clap::{Parser, ValueEnum};
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tower_ratelimit::rate::{
    Advisor, Limits, LimitsError, Penalty, Settlement, SharedLimits, Wait,
};
use tower_ratelimit::store::{Coordinated, RedisStore, RedisStoreBuilder, ShardedStore, Store};
use tower_ratelimit::ConcurrencyLimitLayer;
use tower_ratelimit::{adaptive::Adaptive, shed::Priority, LoadShedLayer};
use tower_ratelimit::{
    failure::OnStoreError, headers::HeaderStyle, rate::DenyCache, Algorithm, Policy, Quota,
    RateLimitLayer,
};

#[derive(Parser, Debug)]
#[command(about = "tower-ratelimit demo server")]
struct Args {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// Where limiter state lives; `none` runs without a limiter (a baseline).
    #[arg(long, value_enum, default_value_t = StoreKind::Memory)]
    store: StoreKind,
    /// The Redis primary (with `--store redis`; default `redis://127.0.0.1:6379`).
    /// Repeat it to shard keys over several primaries.
    #[arg(long)]
    redis_url: Vec<String>,
    /// A Redis replica serving `GET /rate_limit` reads (repeatable; with one `--redis-url`).
    #[arg(long)]
    replica_url: Vec<String>,
    /// Seed nodes of a Redis Cluster, comma-separated (with `--store redis`; needs the
    /// `cluster` feature): selects Cluster mode instead of `--redis-url`.
    #[arg(long, value_delimiter = ',', num_args = 1.., conflicts_with_all = ["redis_url", "replica_url"])]
    redis_cluster: Vec<String>,
    /// Sentinels that name the primary, comma-separated (with `--store redis`
    /// and `--sentinel-master`; needs the `sentinel` feature). With
    /// `rediss://` sentinels the data nodes are reached over TLS too.
    #[arg(long, value_delimiter = ',', num_args = 1.., requires = "sentinel_master",
          conflicts_with_all = ["redis_url", "replica_url", "redis_cluster"])]
    redis_sentinel: Vec<String>,
    /// The name Sentinel knows the primary by (with `--redis-sentinel`).
    #[arg(long, requires = "redis_sentinel")]
    sentinel_master: Option<String>,
    /// A CA certificate (PEM file) to trust for `rediss://` servers instead of
    /// the system's roots (needs the `tls` feature).
    #[arg(long)]
    redis_ca: Option<std::path::PathBuf>,
    /// A client certificate (PEM file) for mutual TLS, with `--redis-key`.
    #[arg(long, requires = "redis_key")]
    redis_cert: Option<std::path::PathBuf>,
    /// The client certificate's private key (PEM file), with `--redis-cert`.
    #[arg(long, requires = "redis_cert")]
    redis_key: Option<std::path::PathBuf>,
    /// Requests allowed per window.
    #[arg(long, default_value_t = 10)]
    limit: u64,
    /// Window length: 500ms, 1s, 60s, 1h.
    #[arg(long, default_value = "60s", value_parser = common::parse_duration)]
    window: Duration,
    /// A quota `LIMIT/WINDOW`, e.g. `10/1s` (repeatable: all are charged, all
    /// or nothing). When given, replaces `--limit` and `--window`.
    #[arg(long = "quota", value_parser = common::parse_quota)]
    quotas: Vec<(u64, Duration)>,
    /// A quota `LIMIT/WINDOW` named `tokens`, counted in tokens: each request
    /// reserves none at its start and is settled to the `x-tokens-used`
    /// response header (see `GET /tokens/{n}`). It admits while any token
    /// is left; a request that uses more goes into debt.
    #[arg(long, value_parser = common::parse_quota)]
    token_quota: Option<(u64, Duration)>,
    /// The algorithm of every quota.
    #[arg(long, value_enum, default_value_t = common::AlgorithmArg::FixedWindow)]
    algorithm: common::AlgorithmArg,
    /// Token bucket and GCRA: the most requests admitted at once (default: the limit).
    #[arg(long)]
    burst: Option<u64>,
    /// Wait up to this long for a request's turn instead of refusing it
    /// (GCRA quotas: `--algorithm gcra`), e.g. `10s`.
    #[arg(long, value_parser = common::parse_duration)]
    wait_up_to: Option<Duration>,
    /// With `--wait-up-to`: the most requests this instance holds waiting.
    #[arg(long, default_value_t = 1_000)]
    max_waiting: usize,
    /// Block a client refused this many times within one window (the
    /// penalty box), for `--penalty-for`.
    #[arg(long)]
    penalty_after: Option<u64>,
    /// With `--penalty-after`: how long a block lasts, e.g. `30s`.
    #[arg(long, default_value = "60s", value_parser = common::parse_duration)]
    penalty_for: Duration,
    /// What a client is: `ip` (the peer address), `global` (one shared limit) or `header:NAME`.
    #[arg(long, default_value = "ip", value_parser = common::parse_key)]
    key: common::KeyKind,
    /// Which rate-limit headers responses carry.
    #[arg(long, value_enum, default_value_t = Headers::Github)]
    headers: Headers,
    /// What a store failure does: admit (`open`), 503 (`closed`) or limit locally (`local`).
    #[arg(long, value_enum, default_value_t = OnError::Open)]
    on_store_error: OnError,
    /// With `--on-store-error local`: the share of each quota this instance admits alone.
    #[arg(long, default_value_t = 0.25)]
    local_share: f64,
    /// Latency budget of one store call.
    #[arg(long, default_value = "50ms", value_parser = common::parse_duration)]
    store_timeout: Duration,
    /// Reject keys already rejected until their Retry-After without a store call.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    deny_cache: OnOff,
    /// Never reject; count and log would-be rejections.
    #[arg(long)]
    shadow: bool,
    /// Serve Prometheus metrics (text format) on this address at `/metrics`.
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Requests a key may have in flight at once (in the `--store`'s state; memory with `none`).
    #[arg(long)]
    concurrency: Option<u32>,
    /// How long a concurrency or fleet shedder slot counts if its instance dies without releasing it.
    #[arg(long, default_value = "30s", value_parser = common::parse_duration)]
    lease: Duration,
    /// Shed requests by `x-priority` (critical, normal, low, test) with this many in flight.
    #[arg(long)]
    shed_capacity: Option<u64>,
    /// Shed requests by `x-priority` with a capacity found from latency
    /// (starting at 20 in flight), instead of `--shed-capacity`.
    #[arg(long, conflicts_with = "shed_capacity")]
    adaptive: bool,
    /// Shed requests by `x-priority` when the fleet (every instance on the
    /// same Redis) has this many in flight. Needs `--store redis`; slots are
    /// leased for `--lease`.
    #[arg(long)]
    fleet_shed_capacity: Option<u64>,
    /// `strict`: one store call per request; `coordinated`: local drops from
    /// fleet counts synced through Redis (needs `--store redis`).
    #[arg(long, value_enum, default_value_t = Mode::Strict)]
    mode: Mode,
    /// How often the coordinated mode syncs with Redis.
    #[arg(long, default_value = "1s", value_parser = common::parse_duration)]
    sync_interval: Duration,
    /// Serve the admin interface, which changes limits at runtime, on this
    /// address (given without one: 127.0.0.1:9091). Every request needs
    /// `Authorization: Bearer TOKEN` (see `--admin-token`) and a `Host` it
    /// serves (see `--admin-host`). `PUT /limits/{key}` with a policy as
    /// the body (`100/1m`, `10/1s gcra burst=50, 1000/1h`), `DELETE
    /// /limits/{key}`, `GET /limits`; `PUT /shadow` runs a policy in shadow
    /// beside the default, `POST /shadow/promote` makes it the default and
    /// `DELETE /shadow` stops it. A key is the text `--key header:NAME`
    /// reads. With `--store redis` (one `--redis-url` or Sentinel) the
    /// overrides live in Redis, for every instance and across restarts.
    #[arg(long, num_args = 0..=1, default_missing_value = "127.0.0.1:9091")]
    admin_listen: Option<SocketAddr>,
    /// The admin interface's token. Without it: the `TRL_ADMIN_TOKEN`
    /// environment variable (which `ps` does not show), else a random one,
    /// printed once as `admin token TOKEN`.
    #[arg(long, requires = "admin_listen")]
    admin_token: Option<admin_guard::Token>,
    /// A `Host` the admin interface also answers to (repeatable): `NAME` on
    /// any port, `NAME:PORT` on that one. It always answers to its address,
    /// `localhost`, `127.0.0.1` and `[::1]` on its port; any other `Host`
    /// gets 421 (DNS rebinding). Listening beyond loopback, name here each
    /// address or name clients reach it by.
    #[arg(long, requires = "admin_listen", value_parser = admin_guard::parse_host)]
    admin_host: Vec<admin_guard::AllowedHost>,
    /// Record each key's usage per `--window` (the last 60 windows) and
    /// serve the suggested limits at `GET /rate_limit/advice` (with
    /// `--store redis` on one Redis: for every instance on it).
    #[arg(long)]
    advise: bool,
    /// How often each instance reads the limits changed in Redis.
    #[arg(long, default_value = "1s", value_parser = common::parse_duration)]
    limits_poll: Duration,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Mode {
    Strict,
    Coordinated,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum OnError {
    Open,
    Closed,
    Local,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum OnOff {
    On,
    Off,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum StoreKind {
    Memory,
    Redis,
    None,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Headers {
    Github,
    Ietf,
    Both,
    None,
}

/// Holds the request for `ms` milliseconds (at most ten minutes): a slow endpoint.
/// A response that says it used `n` tokens.
async fn tokens(Path(n): Path<u64>) -> impl IntoResponse {
    ([("x-tokens-used", n.to_string())], "done")
}

/// The tokens a response says it used.
fn tokens_used(_: StatusCode, headers: &http::HeaderMap) -> Option<u64> {
    headers.get("x-tokens-used")?.to_str().ok()?.parse().ok()
}

async fn slow(Path(ms): Path<u64>) -> &'static str {
    tokio::time::sleep(Duration::from_millis(ms.min(600_000))).await;
    "done"
}

/// The `x-priority` header's class; `normal` when absent or unknown. A real
/// service must not trust a header clients can set: strip it at the edge.
fn priority(parts: &http::request::Parts) -> Priority {
    parts
        .headers
        .get("x-priority")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or_default()
}

async fn status(Path(code): Path<u16>) -> Result<StatusCode, (StatusCode, &'static str)> {
    StatusCode::from_u16(code).map_err(|_| (StatusCode::BAD_REQUEST, "not a status code\n"))
}

/// Installs a Prometheus recorder and serves its text on `addr` at `/metrics`.
async fn serve_metrics(addr: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let app = Router::new().route("/metrics", get(move || std::future::ready(handle.render())));
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(())
}

/// `PUT /limits/{key}`: the key's policy, from the body's text.
async fn put_limit(
    State(limits): State<Limits>,
    Path(key): Path<String>,
    body: String,
) -> Response {
    let policy = match policy_of(&body) {
        Ok(p) => p,
        Err(bad) => return bad.into_response(),
    };
    match limits.set(&key, policy.clone()).await {
        Ok(()) => json(format!(
            r#"{{"key":{},"policy":{}}}"#,
            quoted(&key),
            quoted(&policy.to_string())
        )),
        Err(e) => limits_error(e),
    }
}

/// `PUT /shadow`: runs the body's policy in shadow beside the default.
async fn put_shadow(State(limits): State<Limits>, body: String) -> Response {
    let policy = match policy_of(&body) {
        Ok(p) => p,
        Err(bad) => return bad.into_response(),
    };
    match limits.shadow(policy).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => limits_error(e),
    }
}

/// `DELETE /shadow`: stops the shadow policy.
async fn delete_shadow(State(limits): State<Limits>) -> Response {
    done_or_404(limits.stop_shadow().await, "no policy runs in shadow")
}

/// `POST /shadow/promote`: the shadow policy becomes the default.
async fn promote_shadow(State(limits): State<Limits>) -> Response {
    done_or_404(limits.promote().await, "no policy runs in shadow")
}

/// `DELETE /limits/{key}`: back to the default.
async fn delete_limit(State(limits): State<Limits>, Path(key): Path<String>) -> Response {
    done_or_404(limits.remove(&key).await, "no override for this key")
}

/// `GET /limits`: the runtime default and every override.
async fn get_limits(State(limits): State<Limits>) -> Response {
    let overrides: Vec<String> = limits
        .overrides()
        .iter()
        .map(|(k, p)| format!("{}:{}", quoted(k), quoted(&p.to_string())))
        .collect();
    let text = |p: Option<Policy>| p.map_or("null".to_owned(), |p| quoted(&p.to_string()));
    let (default, shadow) = (text(limits.default_policy()), text(limits.shadow_policy()));
    json(format!(
        r#"{{"default":{default},"shadow":{shadow},"overrides":{{{}}}}}"#,
        overrides.join(",")
    ))
}

/// The policy a request's body writes, or the 400 that says why it is none.
fn policy_of(body: &str) -> Result<Policy, (StatusCode, String)> {
    body.trim()
        .parse()
        .map_err(|e| (StatusCode::BAD_REQUEST, format!("{e}\n")))
}

/// 204 when the change found what it changes, 404 (saying `none`) when not.
fn done_or_404(changed: Result<bool, LimitsError>, none: &str) -> Response {
    match changed {
        Ok(true) => StatusCode::NO_CONTENT.into_response(),
        Ok(false) => (StatusCode::NOT_FOUND, format!("{none}\n")).into_response(),
        Err(e) => limits_error(e),
    }
}

/// A refused change is the caller's mistake (400); a store that cannot
/// take it is not (503).
fn limits_error(e: LimitsError) -> Response {
    let status = match e {
        LimitsError::Invalid(_) => StatusCode::BAD_REQUEST,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    (status, format!("{e}\n")).into_response()
}

fn json(body: String) -> Response {
    ([(http::header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// `s` as a JSON string.
fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `GET /rate_limit/advice`: the advisor's report as JSON (404 without `--advise`).
async fn advice(State(layer): State<RateLimitLayer>) -> Response {
    let a = match layer.fleet_advice().await {
        Ok(Some(a)) => a,
        Ok(None) => {
            return (StatusCode::NOT_FOUND, "start the demo with --advise\n").into_response()
        }
        Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
    };
    let keys: Vec<String> = a
        .keys
        .iter()
        .map(|k| {
            format!(
                r#"{{"key":{},"tier":{},"usage":[{}],"peak":{},"percentile":{},"current":{},"suggested":{}}}"#,
                k.text.as_deref().map_or("null".to_owned(), quoted),
                quoted(&k.tier),
                k.usage.iter().map(u64::to_string).collect::<Vec<_>>().join(","),
                k.peak,
                k.percentile,
                k.current,
                k.suggested
            )
        })
        .collect();
    let tiers: Vec<String> = a
        .tiers
        .iter()
        .map(|t| {
            format!(
                r#"{{"tier":{},"keys":{},"peak":{},"percentile":{},"current":{},"suggested":{}}}"#,
                quoted(&t.tier),
                t.keys,
                t.peak,
                t.percentile,
                t.current,
                t.suggested
            )
        })
        .collect();
    json(format!(
        r#"{{"window_ms":{},"windows":{},"keys":[{}],"tiers":[{}]}}"#,
        a.window.as_millis(),
        a.windows,
        keys.join(","),
        tiers.join(",")
    ))
}

/// GitHub-style `GET /rate_limit`: the caller's state, read without charging.
async fn rate_limit(State(layer): State<RateLimitLayer>, req: Request) -> Response {
    let (parts, _) = req.into_parts();
    match layer.status(&parts).await {
        Ok(Some(s)) => {
            let q = s.decision.binding_status().copied().unwrap_or_default();
            let body = format!(
                r#"{{"limit":{},"remaining":{},"reset":{},"used":{}}}"#,
                q.limit,
                q.remaining,
                q.reset_ms.div_ceil(1000),
                q.used()
            );
            ([(http::header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Ok(None) => (StatusCode::OK, "{\"exempt\":true}").into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

/// One primary (with its replicas), several primaries as shards, a cluster,
/// or the primary Sentinel names.
fn redis_store(args: &Args) -> Result<Arc<dyn Store>, Box<dyn std::error::Error>> {
    if !args.redis_cluster.is_empty() {
        return Ok(Arc::new(cluster_store(args)?));
    }
    if args.redis_url.len() > 1 {
        return Ok(Arc::new(sharded_store(args)?));
    }
    Ok(Arc::new(single_store(args)?))
}

/// One shard per `--redis-url`.
fn sharded_store(args: &Args) -> Result<ShardedStore, Box<dyn std::error::Error>> {
    if !args.replica_url.is_empty() {
        return Err(
            "--replica-url belongs to one primary: use it with a single --redis-url".into(),
        );
    }
    let mut shards = ShardedStore::builder();
    for url in &args.redis_url {
        shards = shards.shard(tls(RedisStore::builder(url), args)?.build()?);
    }
    Ok(shards.build()?)
}

/// The one primary: the one Sentinel names, or the one at `--redis-url`
/// (default `redis://127.0.0.1:6379`) with its replicas.
fn single_store(args: &Args) -> Result<RedisStore, Box<dyn std::error::Error>> {
    if !args.redis_sentinel.is_empty() {
        return sentinel_store(args);
    }
    let url = args
        .redis_url
        .first()
        .map_or("redis://127.0.0.1:6379", |u| u);
    let mut store = tls(RedisStore::builder(url), args)?;
    for r in &args.replica_url {
        store = store.replica(r);
    }
    Ok(store.build()?)
}

/// `builder` with the `--redis-ca`, `--redis-cert` and `--redis-key` files.
#[cfg(feature = "tls")]
fn tls(
    mut builder: RedisStoreBuilder,
    args: &Args,
) -> Result<RedisStoreBuilder, Box<dyn std::error::Error>> {
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
    };
    if let Some(ca) = &args.redis_ca {
        builder = builder.tls_ca_pem(read(ca)?);
    }
    if let (Some(cert), Some(key)) = (&args.redis_cert, &args.redis_key) {
        builder = builder.tls_client_cert_pem(read(cert)?, read(key)?);
    }
    Ok(builder)
}

#[cfg(not(feature = "tls"))]
fn tls(
    builder: RedisStoreBuilder,
    args: &Args,
) -> Result<RedisStoreBuilder, Box<dyn std::error::Error>> {
    if args.redis_ca.is_some() || args.redis_cert.is_some() {
        return Err(
            "--redis-ca, --redis-cert and --redis-key need the demo built with the `tls` feature"
                .into(),
        );
    }
    Ok(builder)
}

#[cfg(feature = "sentinel")]
fn sentinel_store(args: &Args) -> Result<RedisStore, Box<dyn std::error::Error>> {
    let master = args.sentinel_master.as_deref().unwrap_or_default();
    let builder = tls(
        RedisStore::sentinel_builder(master, args.redis_sentinel.iter().cloned()),
        args,
    )?;
    #[cfg(feature = "tls")]
    let builder = if args.redis_sentinel.iter().all(|u| u.starts_with("rediss:")) {
        builder.node_tls()
    } else {
        builder
    };
    Ok(builder.build()?)
}

#[cfg(not(feature = "sentinel"))]
fn sentinel_store(_: &Args) -> Result<RedisStore, Box<dyn std::error::Error>> {
    Err("--redis-sentinel needs the demo built with the `sentinel` feature".into())
}

#[cfg(feature = "cluster")]
fn cluster_store(args: &Args) -> Result<RedisStore, Box<dyn std::error::Error>> {
    let urls = args.redis_cluster.iter().cloned();
    Ok(tls(RedisStore::cluster_builder(urls), args)?.build()?)
}

#[cfg(not(feature = "cluster"))]
fn cluster_store(_: &Args) -> Result<RedisStore, Box<dyn std::error::Error>> {
    Err("--redis-cluster needs the demo built with the `cluster` feature".into())
}

/// Where `--concurrency` keeps its slots with `--store redis`: the one primary
/// (the same Redis as the rate limit, on its own connections) or the cluster.
fn slot_store(args: &Args) -> Result<RedisStore, Box<dyn std::error::Error>> {
    if !args.redis_cluster.is_empty() {
        return cluster_store(args);
    }
    if args.redis_url.len() > 1 {
        return Err(
            "--concurrency and --fleet-shed-capacity keep their slots in one Redis: use one \
             --redis-url or --redis-cluster"
                .into(),
        );
    }
    single_store(args)
}

/// Connections are opened before serving; a store not reachable yet is
/// retried on use, under the failure policy.
/// The system clock, Unix ms.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn connect_or_warn(result: Result<(), tower_ratelimit::StoreError>) {
    if let Err(e) = result {
        tracing::warn!(error = %e, "the store is not reachable yet; serving under the failure policy");
    }
}

/// Serves the admin interface on `addr`, behind `token` and a `Host` check;
/// returns where it listens.
async fn admin_server(
    addr: SocketAddr,
    limits: Limits,
    token: admin_guard::Token,
    hosts: &[admin_guard::AllowedHost],
) -> Result<SocketAddr, Box<dyn std::error::Error>> {
    if !addr.ip().is_loopback() {
        tracing::warn!(%addr, "the admin interface listens beyond loopback over plain HTTP: its token crosses the network unencrypted");
    }
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let at = listener.local_addr()?;
    let guard = admin_guard::Guard::new(token, at, hosts);
    let app = Router::new()
        .route("/limits", get(get_limits))
        .route(
            "/limits/{key}",
            axum::routing::put(put_limit).delete(delete_limit),
        )
        .route(
            "/shadow",
            axum::routing::put(put_shadow).delete(delete_shadow),
        )
        .route("/shadow/promote", axum::routing::post(promote_shadow))
        .with_state(limits);
    // Around the whole router, not per route: the guard answers before
    // routing, so an unknown path or method (an OPTIONS preflight) learns
    // nothing either.
    let guarded = axum::middleware::from_fn_with_state(guard, admin_guard::check);
    let app = tower::Layer::layer(&guarded, app);
    let app = axum::ServiceExt::<Request>::into_make_service(app);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(at)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    // Warnings by default (the store's eviction check, a clock off Redis's
    // at start); RUST_LOG says otherwise.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();

    if let Some(addr) = args.metrics_listen {
        serve_metrics(addr).await?;
    }

    let mut app = Router::new()
        .route("/", get(|| async { "ok" }))
        // When the handler ran (Unix ms): with --wait-up-to, each request's turn.
        .route("/now", get(|| async { now_ms().to_string() }))
        .route("/not-modified", get(|| async { StatusCode::NOT_MODIFIED }))
        .route("/status/{code}", get(status))
        .route("/slow/{ms}", get(slow))
        .route("/tokens/{n}", get(tokens));

    let header_style = match args.headers {
        Headers::Github => HeaderStyle::GitHub,
        Headers::Ietf => HeaderStyle::Ietf,
        Headers::Both => HeaderStyle::Both,
        Headers::None => HeaderStyle::None,
    };
    let on_store_error = match args.on_store_error {
        OnError::Open => OnStoreError::FailOpen,
        OnError::Closed => OnStoreError::FailClosed,
        OnError::Local => OnStoreError::Local {
            fraction: args.local_share,
        },
    };
    // The rate limit's runtime limits, for the admin interface.
    let mut admin = None;
    // The rate limit, whose waiting requests are answered at shutdown.
    let mut rate_limit_layer = None;
    // Innermost first: concurrency, then the rate limit, then shedding outermost.
    if let Some(limit) = args.concurrency {
        let mut builder = ConcurrencyLimitLayer::builder()
            .limit(limit)
            .key(common::key_extractor(&args.key)?)
            .lease(args.lease)
            .headers(header_style)
            .on_store_error(on_store_error)
            .store_timeout(args.store_timeout)
            .shadow(args.shadow);
        if let StoreKind::Redis = args.store {
            builder = builder.store(slot_store(&args)?);
        }
        let layer = builder.build()?;
        connect_or_warn(layer.connect().await);
        app = app.layer(layer);
    }

    if !matches!(args.store, StoreKind::None) {
        let mut policy = common::policy(
            &args.quotas,
            (args.limit, args.window),
            args.algorithm,
            args.burst,
        )?;
        if let Some((limit, window)) = args.token_quota {
            policy = policy.and(
                Quota::new(limit, window)?
                    .with_algorithm(Algorithm::from(args.algorithm))?
                    .named("tokens")?
                    .with_unit("tokens")?,
            )?;
        }
        if let Some(max) = args.wait_up_to {
            policy = policy.wait(Wait::up_to(max).max_waiting(args.max_waiting))?;
        }
        if let Some(after) = args.penalty_after {
            policy = policy.penalty(Penalty::after(after).block_for(args.penalty_for))?;
        }
        let mut builder = RateLimitLayer::builder()
            .quota(policy)
            .settlement(Settlement::new().reserve(|_| 0).from_head(tokens_used))
            .key(common::key_extractor(&args.key)?)
            .headers(header_style)
            .on_store_error(on_store_error)
            .store_timeout(args.store_timeout)
            .deny_cache(match args.deny_cache {
                OnOff::On => DenyCache::new(),
                OnOff::Off => DenyCache::disabled(),
            })
            .shadow(args.shadow);
        if args.advise {
            let mut advisor = Advisor::new().window(args.window);
            // One Redis: the report covers every instance on it.
            if let StoreKind::Redis = args.store {
                if args.redis_url.len() <= 1 && args.redis_cluster.is_empty() {
                    advisor = advisor.fleet(single_store(&args)?);
                }
            }
            builder = builder.advisor(advisor);
        }
        if let StoreKind::Redis = args.store {
            if let Mode::Coordinated = args.mode {
                // The counters go where the strict mode would keep each key.
                let coordinated = if !args.redis_cluster.is_empty() {
                    Coordinated::builder(cluster_store(&args)?)
                } else if args.redis_url.len() > 1 {
                    Coordinated::sharded(sharded_store(&args)?)
                } else {
                    Coordinated::builder(single_store(&args)?)
                };
                builder = builder.store(coordinated.sync_interval(args.sync_interval).build()?);
            } else {
                builder = builder.store(redis_store(&args)?);
            }
            if args.admin_listen.is_some() {
                if args.redis_url.len() > 1 || !args.redis_cluster.is_empty() {
                    return Err(
                        "--admin-listen with --store redis keeps the limits in one Redis: \
                                use a single --redis-url or --redis-sentinel"
                            .into(),
                    );
                }
                builder = builder.shared_limits(
                    SharedLimits::new(single_store(&args)?).poll_interval(args.limits_poll),
                );
            }
        } else if !args.redis_url.is_empty()
            || !args.redis_cluster.is_empty()
            || !args.redis_sentinel.is_empty()
        {
            return Err(
                "--redis-url, --redis-cluster and --redis-sentinel need --store redis".into(),
            );
        } else if let Mode::Coordinated = args.mode {
            return Err("--mode coordinated needs --store redis".into());
        }
        let layer = builder.build()?;
        connect_or_warn(layer.connect().await);
        admin = Some(layer.limits());
        rate_limit_layer = Some(layer.clone());
        // Added after `.layer`, so the status route itself is never counted.
        app = app
            .layer(layer.clone())
            .route("/rate_limit", get(rate_limit).with_state(layer.clone()))
            .route("/rate_limit/advice", get(advice).with_state(layer));
    }

    if args.shed_capacity.is_some() || args.adaptive || args.fleet_shed_capacity.is_some() {
        let mut shed = LoadShedLayer::builder()
            .classify(priority)
            .shadow(args.shadow);
        if let Some(capacity) = args.shed_capacity {
            shed = shed.capacity(capacity);
        } else if args.adaptive {
            shed = shed.adaptive(Adaptive::new());
        }
        if let Some(capacity) = args.fleet_shed_capacity {
            if !matches!(args.store, StoreKind::Redis) {
                return Err("--fleet-shed-capacity needs --store redis".into());
            }
            shed = shed
                .name("fleet")
                .fleet_capacity(capacity)
                .lease(args.lease)
                .on_store_error(on_store_error)
                .store_timeout(args.store_timeout)
                .store(slot_store(&args)?);
        }
        let shed = shed.build()?;
        connect_or_warn(shed.connect().await);
        app = app.layer(shed);
    }

    let admin = match (args.admin_listen, admin) {
        (Some(addr), Some(limits)) => {
            let (token, made) = admin_guard::Token::resolve(args.admin_token.clone())?;
            let at = admin_server(addr, limits, token.clone(), &args.admin_host).await?;
            // Only a token the demo made is printed: nobody else knows it.
            Some((at, made.then_some(token)))
        }
        (Some(_), None) => {
            return Err("--admin-listen changes the rate limit: not with --store none".into())
        }
        _ => None,
    };
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    // The socket is bound and listening: connections queue from here on.
    let mut out = std::io::stdout().lock();
    writeln!(out, "listening on {}", listener.local_addr()?)?;
    if let Some((addr, made)) = admin {
        writeln!(out, "admin listening on {addr}")?;
        if let Some(token) = made {
            writeln!(out, "admin token {}", token.expose())?;
        }
    }
    out.flush()?;
    drop(out);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async move {
        common::shutdown_signal().await;
        // Requests waiting for their turn get an answer now, not at their turn.
        if let Some(layer) = rate_limit_layer {
            layer.close_waiters();
        }
    })
    .await?;
    Ok(())
}
