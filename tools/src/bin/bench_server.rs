//! The axum hello world behind each limiter `scripts/bench.sh` compares.
//!
//! ```sh
//! cargo run --release -p tower-ratelimit-tools --bin bench_server -- --variant memory --workers 1
//! ```
//!
//! Variants: `none` (no limiter), `none-headers` (no limiter, but the hello
//! world answers with four constant `x-ratelimit-*` headers as long as the
//! ones `memory` sends: what sending them costs by itself, with no limiter
//! working them out), `governor` (tower_governor, in-memory, per
//! peer IP, no rate-limit headers on allowed responses), `governor-headers`
//! (tower_governor with `use_headers()`: `x-ratelimit-limit` and
//! `-remaining` on every response), `memory` and `redis`
//! (this crate, per peer IP, GitHub-style headers on every response),
//! `memory-bare` and `redis-bare` (this crate without headers, as
//! tower_governor and the hand-written baselines; all four answer in axum's
//! own body type, `RateLimitLayer::inner_body`, as the README advises for
//! axum), and two
//! hand-written baselines, axum `from_fn` middlewares that send one `EVALSHA`
//! of `benches/fixed_window_standalone.lua` per request: `naive` checks a
//! connection out of a deadpool pool for each, `multiplexed` shares one
//! multiplexed connection (concurrent calls are pipelined on it). `yield` is
//! not a limiter: a middleware that only answers asynchronously (it yields
//! once), to see what suspending a request costs at all. The quota is `--limit` per `--window`
//! (default: high enough that nothing is rejected). Prints exactly one line,
//! `listening on ADDR`, once it accepts connections.

use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use clap::{Parser, ValueEnum};
use deadpool_redis::redis::Script;
use governor::middleware::NoOpMiddleware;
use http::{HeaderName, HeaderValue};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::PeerIpKeyExtractor;
use tower_ratelimit::key::PeerIp;
use tower_ratelimit::store::RedisStore;
use tower_ratelimit::{headers::HeaderStyle, rate::DenyCache, Quota, RateLimitLayer};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Variant {
    None,
    /// No limiter; four constant GitHub-style rate-limit headers on every response.
    NoneHeaders,
    Governor,
    /// tower_governor with `use_headers()`: two rate-limit headers on every response.
    GovernorHeaders,
    Memory,
    /// `memory` without rate-limit headers (as tower_governor by default).
    MemoryBare,
    Redis,
    /// `redis` without rate-limit headers (as the hand-written baselines).
    RedisBare,
    Naive,
    Multiplexed,
    Yield,
}

#[derive(Parser, Debug)]
struct Args {
    /// Which limiter guards `GET /`.
    #[arg(long, value_enum, default_value = "none")]
    variant: Variant,
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// Tokio worker threads (default: one per core).
    #[arg(long)]
    workers: Option<usize>,
    /// Redis for the `redis` and `naive` variants (`rediss://` for TLS, with
    /// the `tls` feature).
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    /// A CA certificate (PEM file) that the `redis` variants trust for a
    /// `rediss://` URL (feature `tls`).
    #[arg(long)]
    redis_ca: Option<std::path::PathBuf>,
    /// Multiplexed connections of the `redis` variant; pool size of `naive`
    /// (times 8).
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Requests per window per client.
    #[arg(long, default_value_t = 1_000_000_000)]
    limit: u64,
    /// Window length in seconds.
    #[arg(long, default_value_t = 60)]
    window_secs: u64,
    /// Turn the `redis` variant's deny cache off.
    #[arg(long)]
    no_deny_cache: bool,
    /// The `redis` variant's store timeout in ms (default: the crate's, 50 ms);
    /// `scripts/server_cost.sh` raises it, since callgrind slows the app
    /// twenty-fold and a timed-out charge would measure the failure path.
    #[arg(long)]
    store_timeout_ms: Option<u64>,
    /// Count the limiter's decisions made without its store (failed open,
    /// failed closed or local), served as a number at `GET /failures`,
    /// outside the limiter. Installs a metrics recorder, which costs a
    /// little per request: for counting runs, not for speed.
    #[arg(long)]
    count_failures: bool,
}

fn main() {
    let args = Args::parse();
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = args.workers {
        rt.worker_threads(n.max(1));
    }
    rt.enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(serve(args));
}

async fn serve(args: Args) {
    let app = Router::new().route("/", get(|| async { "Hello, World!" }));
    let window = Duration::from_secs(args.window_secs);
    let quota = Quota::new(args.limit, window).expect("valid --limit and --window-secs");
    let app = match args.variant {
        Variant::None => app,
        Variant::NoneHeaders => {
            Router::new().route("/", get(|| async { (CONSTANT_HEADERS, "Hello, World!") }))
        }
        Variant::Governor => app.layer(tower_governor::GovernorLayer::new(
            governor(args.limit, window)
                .finish()
                .expect("governor config"),
        )),
        Variant::GovernorHeaders => app.layer(tower_governor::GovernorLayer::new(
            governor(args.limit, window)
                .use_headers()
                .finish()
                .expect("governor config"),
        )),
        Variant::Memory => app.layer(
            RateLimitLayer::builder()
                .quota(quota)
                .key(PeerIp::new())
                .build()
                .expect("layer")
                .inner_body(),
        ),
        Variant::MemoryBare => app.layer(
            RateLimitLayer::builder()
                .quota(quota)
                .key(PeerIp::new())
                .headers(HeaderStyle::None)
                .build()
                .expect("layer")
                .inner_body(),
        ),
        Variant::Redis | Variant::RedisBare => {
            #[allow(unused_mut)]
            let mut store = RedisStore::builder(&args.redis_url).connections(args.connections);
            #[cfg(feature = "tls")]
            if let Some(ca) = &args.redis_ca {
                store = store.tls_ca_pem(std::fs::read(ca).expect("--redis-ca"));
            }
            #[cfg(not(feature = "tls"))]
            assert!(args.redis_ca.is_none(), "--redis-ca needs the tls feature");
            let store = store.build().expect("redis store");
            let mut b = RateLimitLayer::builder()
                .quota(quota)
                .key(PeerIp::new())
                .store(store);
            if args.no_deny_cache {
                b = b.deny_cache(DenyCache::disabled());
            }
            if args.variant == Variant::RedisBare {
                b = b.headers(HeaderStyle::None);
            }
            if let Some(ms) = args.store_timeout_ms {
                b = b.store_timeout(Duration::from_millis(ms));
            }
            app.layer(b.build().expect("layer").inner_body())
        }
        Variant::Naive => {
            let cfg = deadpool_redis::Config::from_url(&args.redis_url);
            let pool = cfg
                .builder()
                .expect("pool config")
                .max_size(args.connections.max(1) * 8)
                .runtime(deadpool_redis::Runtime::Tokio1)
                .build()
                .expect("pool");
            let naive = Arc::new(Naive {
                conn: Conn::Pool(pool),
                script: Script::new(include_str!("../../../benches/fixed_window_standalone.lua")),
                limit: args.limit,
                window_ms: window.as_millis() as u64,
            });
            app.layer(middleware::from_fn_with_state(naive, naive_limit))
        }
        // Not a limiter: a middleware that only answers asynchronously (it
        // yields once), the floor for any limiter that waits for a network store.
        Variant::Yield => app.layer(middleware::from_fn(|req: Request, next: Next| async move {
            tokio::task::yield_now().await;
            next.run(req).await
        })),
        Variant::Multiplexed => {
            let client =
                deadpool_redis::redis::Client::open(args.redis_url.as_str()).expect("redis url");
            let conn = client
                .get_multiplexed_async_connection()
                .await
                .expect("redis connection");
            let naive = Arc::new(Naive {
                conn: Conn::Shared(conn),
                script: Script::new(include_str!("../../../benches/fixed_window_standalone.lua")),
                limit: args.limit,
                window_ms: window.as_millis() as u64,
            });
            app.layer(middleware::from_fn_with_state(naive, naive_limit))
        }
    };
    let app = if args.count_failures {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().expect("no other metrics recorder");
        app.route(
            "/failures",
            get(move || async move { failures(&snapshotter).to_string() }),
        )
    } else {
        app
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .expect("bind");
    println!(
        "listening on {}",
        listener.local_addr().expect("local addr")
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    })
    .await
    .expect("serve");
}

/// Decisions made without the store so far, whatever the failure policy did.
fn failures(snapshotter: &metrics_util::debugging::Snapshotter) -> u64 {
    use metrics_util::debugging::DebugValue;
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == "ratelimit_store_failure_decisions_total")
        .map(|(.., value)| match value {
            DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum()
}

/// The `none-headers` variant's headers: the names the `memory` variant
/// sends, with values as long as its (limit 10^9, a Unix reset, a busy window).
const CONSTANT_HEADERS: [(HeaderName, HeaderValue); 4] = [
    (
        HeaderName::from_static("x-ratelimit-limit"),
        HeaderValue::from_static("1000000000"),
    ),
    (
        HeaderName::from_static("x-ratelimit-remaining"),
        HeaderValue::from_static("999876543"),
    ),
    (
        HeaderName::from_static("x-ratelimit-reset"),
        HeaderValue::from_static("1796054400"),
    ),
    (
        HeaderName::from_static("x-ratelimit-used"),
        HeaderValue::from_static("123457"),
    ),
];

/// tower_governor's configuration for `limit` per `window` per peer IP.
fn governor(
    limit: u64,
    window: Duration,
) -> GovernorConfigBuilder<PeerIpKeyExtractor, NoOpMiddleware> {
    let per_ns = (window.as_nanos() / u128::from(limit)).max(1) as u64;
    let mut config = GovernorConfigBuilder::default();
    config
        .per_nanosecond(per_ns)
        .burst_size(limit.min(u64::from(u32::MAX)) as u32);
    config
}

/// The hand-written baselines: what a team writes in an afternoon, with a
/// connection checked out of a deadpool pool per request (`naive`), or one
/// shared multiplexed connection that pipelines concurrent calls (`multiplexed`).
struct Naive {
    conn: Conn,
    script: Script,
    limit: u64,
    window_ms: u64,
}

enum Conn {
    Pool(deadpool_redis::Pool),
    Shared(deadpool_redis::redis::aio::MultiplexedConnection),
}

async fn naive_limit(
    State(n): State<Arc<Naive>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request,
    next: Next,
) -> Response {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64;
    let reply: Result<Vec<i64>, String> = async {
        let mut inv = n.script.key(format!("naive:{{{}}}", peer.ip()));
        inv.arg(now)
            .arg(1)
            .arg(1)
            .arg("fw")
            .arg(n.limit)
            .arg(n.window_ms);
        match &n.conn {
            Conn::Pool(pool) => {
                let mut conn = pool.get().await.map_err(|e| e.to_string())?;
                inv.invoke_async(&mut *conn).await
            }
            Conn::Shared(conn) => inv.invoke_async(&mut conn.clone()).await,
        }
        .map_err(|e| e.to_string())
    }
    .await;
    match reply {
        Ok(r) if r.first() == Some(&0) => {
            (http::StatusCode::TOO_MANY_REQUESTS, "rate limited").into_response()
        }
        // Allowed, or the store failed: fail open.
        _ => next.run(req).await,
    }
}
