//! Coordinated mode: four layers sharing one real Redis, time moved by hand.

use crate::support::example;
use crate::support::logs;
use crate::support::redis as redis_support;

use axum::body::Body;
use http::{Request, StatusCode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use redis_support::{require_redis, RedisServer};
use std::convert::Infallible;
use std::time::Duration;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_ratelimit::clock::{Clock, ManualClock, SystemClock};
use tower_ratelimit::key::Constant;
use tower_ratelimit::store::{Coordinated, RedisStore};
use tower_ratelimit::{Quota, RateLimitLayer};

const INSTANCES: usize = 4;
const LIMIT: u64 = 100; // per second, fleet-wide
const OFFERED: usize = 150; // per second, 1.5× the limit
const INTERVAL: Duration = Duration::from_secs(1);

struct Fleet {
    layers: Vec<RateLimitLayer>,
    stores: Vec<Coordinated>,
    clock: ManualClock,
    next: usize,
}

impl Fleet {
    fn new(server: &RedisServer, shadow: bool) -> Self {
        let clock = ManualClock::new(SystemClock.now_ms());
        let (layers, stores) = (0..INSTANCES)
            .map(|i| {
                // Each instance has its own connections, as separate processes would.
                let store = RedisStore::new(server.url()).unwrap();
                let coordinated = Coordinated::builder(store)
                    .sync_interval(INTERVAL)
                    .sync_timeout(Duration::from_millis(100))
                    .clock(clock.clone())
                    .manual_sync()
                    .seed(1 + i as u64)
                    .build()
                    .unwrap();
                let layer = RateLimitLayer::builder()
                    .name("fleet")
                    .quota(Quota::new(LIMIT, Duration::from_secs(1)).unwrap())
                    .key(Constant::new("api"))
                    .store(coordinated.clone())
                    .clock(clock.clone())
                    .shadow(shadow)
                    .build()
                    .unwrap();
                (layer, coordinated)
            })
            .unzip();
        Self {
            layers,
            stores,
            clock,
            next: 0,
        }
    }

    /// One interval: `OFFERED` requests round-robin over the instances,
    /// evenly spread over it, then every instance syncs. Returns how many
    /// were admitted.
    async fn interval(&mut self) -> (usize, Option<http::HeaderMap>) {
        let mut admitted = 0;
        let mut rejection = None;
        let start = self.clock.now_ms();
        let step = INTERVAL.as_millis() as u64;
        for k in 0..OFFERED {
            let at = start + k as u64 * step / OFFERED as u64;
            self.clock
                .advance(Duration::from_millis(at - self.clock.now_ms()));
            let layer = &self.layers[self.next % INSTANCES];
            self.next += 1;
            let mut svc = layer.layer(service_fn(|_req: Request<Body>| async {
                Ok::<_, Infallible>(http::Response::new(Body::empty()))
            }));
            let res = svc
                .ready()
                .await
                .unwrap()
                .call(Request::new(Body::empty()))
                .await
                .unwrap();
            match res.status() {
                StatusCode::OK => admitted += 1,
                StatusCode::TOO_MANY_REQUESTS => rejection = Some(res.headers().clone()),
                other => panic!("unexpected {other}"),
            }
        }
        self.clock
            .advance(Duration::from_millis(start + step - self.clock.now_ms()));
        for store in &self.stores {
            let _ = store.sync_now(self.clock.now_ms()).await;
        }
        (admitted, rejection)
    }
}

#[tokio::test]
async fn four_layers_offered_one_and_a_half_times_the_limit_settle_within_ten_percent_after_three_intervals(
) {
    require_redis();
    let server = RedisServer::start();
    let mut fleet = Fleet::new(&server, false);
    for _ in 0..3 {
        fleet.interval().await;
    }
    let mut total = 0;
    let mut rejection = None;
    for i in 0..10 {
        let (admitted, r) = fleet.interval().await;
        assert!(
            (75..=125).contains(&admitted),
            "interval {i}: {admitted} admitted"
        );
        total += admitted;
        rejection = rejection.or(r);
    }
    let limit = 10 * LIMIT as usize;
    assert!(
        total.abs_diff(limit) <= limit / 10,
        "{total} admitted over 10 intervals, limit {limit}"
    );
    // A 429 in this mode still says when to come back: one sync interval.
    let headers = rejection.expect("some requests were dropped");
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(headers["x-ratelimit-limit"], "100");
}

#[tokio::test]
async fn the_request_path_makes_no_store_call_only_each_sync_does() {
    require_redis();
    let server = RedisServer::start();
    let mut fleet = Fleet::new(&server, false);
    fleet.interval().await; // connections open
    server.config_resetstat();
    let intervals = 8;
    for _ in 0..intervals {
        fleet.interval().await;
    }
    // 1,200 requests; Redis saw two HINCRBY (offered, admitted), one
    // PEXPIRE and one HMGET per instance per sync.
    let syncs = (intervals * INSTANCES) as u64;
    assert_eq!(server.command_calls("hincrby"), 2 * syncs);
    assert_eq!(server.command_calls("pexpire"), syncs);
    assert_eq!(server.command_calls("hmget"), syncs);
    assert_eq!(server.command_calls("evalsha"), 0);
}

/// Requests counted as allowed, and as admitted by the failure policy
/// (`action="open"`), since the last call (a snapshot drains counters).
fn allowed_and_failed_open(metrics: &Snapshotter) -> (u64, u64) {
    let mut counts = (0, 0);
    for (key, _, _, value) in metrics.snapshot().into_vec() {
        let DebugValue::Counter(n) = value else {
            continue;
        };
        let key = key.key();
        let has =
            |name: &str, value: &str| key.labels().any(|l| l.key() == name && l.value() == value);
        match key.name() {
            "ratelimit_decisions_total" if has("outcome", "allowed") => counts.0 += n,
            "ratelimit_store_failure_decisions_total" if has("action", "open") => counts.1 += n,
            _ => {}
        }
    }
    counts
}

/// A stale key is a store failure, which the failure policy (fail open by
/// default) answers: each such request counts as a fail-open decision (not
/// as allowed), logged as a store failure that names the limiter and not
/// the key.
#[tokio::test]
async fn a_frozen_redis_fails_open_after_the_staleness_bound_and_limiting_returns_two_syncs_after_it_does(
) {
    require_redis();
    let recorder = DebuggingRecorder::new();
    let metrics = recorder.snapshotter();
    let _recording = metrics::set_default_local_recorder(&recorder);
    let (logs, _logging) = logs::capture();
    let server = RedisServer::start();
    let mut fleet = Fleet::new(&server, false);
    let mut admitted = 0;
    for _ in 0..4 {
        admitted += fleet.interval().await.0;
    }
    let (limited, _) = fleet.interval().await;
    assert!(limited < OFFERED, "limiting before the freeze");
    admitted += limited;
    assert_eq!(
        allowed_and_failed_open(&metrics),
        (admitted as u64, 0),
        "while Redis answers, every admission is an allowed decision"
    );

    server.pause();
    // Ratios hold for three intervals (the staleness bound), then fall to zero.
    let mut unlimited_after = None;
    let (mut admitted, mut unlimited) = (0, 0);
    for i in 0..5 {
        let (a, _) = fleet.interval().await;
        admitted += a;
        if a == OFFERED {
            unlimited_after.get_or_insert(i);
            unlimited += a;
        }
    }
    assert!(
        unlimited_after.is_some_and(|i| i <= 3),
        "never failed open: {unlimited_after:?}"
    );
    let (allowed, open) = allowed_and_failed_open(&metrics);
    println!("during the freeze: {allowed} allowed, {open} failed open");
    assert_eq!(
        allowed + open,
        admitted as u64,
        "allowed {allowed}, open {open}"
    );
    assert!(
        open >= unlimited as u64,
        "{open} fail-open decisions, {unlimited} admitted without limit"
    );
    let warned = logs.text();
    assert!(
        warned.contains("rate limit store failed")
            && warned.contains("staleness bound")
            && warned.contains("limiter=fleet"),
        "{warned}"
    );
    assert!(!warned.contains("api"), "the key is in the log: {warned}");

    server.resume();
    // The first sync after Redis returns reports; the second reads a complete interval.
    fleet.interval().await;
    allowed_and_failed_open(&metrics);
    fleet.interval().await;
    let (admitted, _) = fleet.interval().await;
    assert!(
        (75..=125).contains(&admitted),
        "{admitted} admitted two syncs after Redis returned"
    );
    assert_eq!(
        allowed_and_failed_open(&metrics).1,
        0,
        "fail-open decisions once the keys synced again"
    );
}

#[tokio::test]
async fn shadow_mode_computes_drops_but_admits_everything() {
    require_redis();
    let server = RedisServer::start();
    let mut fleet = Fleet::new(&server, true);
    for _ in 0..6 {
        assert_eq!(fleet.interval().await.0, OFFERED);
    }
}

/// Runs the simulation with `args`; returns what it printed.
fn simulate(args: &[&str]) -> String {
    let run = std::process::Command::new(example::tool_path("simulate"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    String::from_utf8_lossy(&run.stdout).into_owned()
}

#[test]
fn the_simulation_prints_a_table_and_a_summary_per_profile_and_writes_an_svg() {
    let out = std::env::temp_dir().join(format!("tower-ratelimit-sim-{}.svg", std::process::id()));
    let table = simulate(&["--seconds", "10", "--out", out.to_str().unwrap()]);
    for profile in ["steady 1.5x", "spike 5x", "ramp 0.5x-2x", "surge 15x"] {
        assert!(table.contains(profile), "{table}");
    }
    assert_eq!(
        table
            .matches("offered  limit   memory   strict  coordinated")
            .count(),
        4
    );
    assert_eq!(table.matches("settled error").count(), 4, "{table}");
    // The per-process limiter never converges on a fleet limit.
    let memory = table.lines().find(|l| l.starts_with("memory ")).unwrap();
    assert!(memory.ends_with("never"), "{memory}");
    let svg = std::fs::read_to_string(&out).unwrap();
    assert!(svg.starts_with("<svg"), "not an SVG");
    for label in [
        "memory",
        "strict",
        "coordinated",
        "fleet limit",
        "surge 15x",
    ] {
        assert!(svg.contains(label), "the plot has no {label}");
    }
    let _ = std::fs::remove_file(out);
}

/// The simulation's scale table: Redis commands per simulated second are
/// the same at both request rates and double with the instances.
#[test]
fn the_simulation_s_scale_table_shows_redis_load_linear_in_instances_and_flat_in_rate() {
    let table = simulate(&[
        "--scale",
        "--scale-instances",
        "4,8",
        "--scale-keys",
        "2",
        "--scale-limit",
        "100",
        "--scale-seconds",
        "3",
        "--no-cluster",
    ]);
    // backend, instances, offered/s, admitted/s, error, redis cmds/s, cpu
    let rows: Vec<Vec<&str>> = table
        .lines()
        .filter(|l| l.starts_with("redis "))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 4, "{table}");
    let cmds = |row: &Vec<&str>| row[5].parse::<f64>().unwrap();
    assert_eq!(cmds(&rows[0]), cmds(&rows[1]), "{table}");
    assert_eq!(cmds(&rows[2]), cmds(&rows[3]), "{table}");
    assert_eq!(cmds(&rows[2]), 2.0 * cmds(&rows[0]), "{table}");
    // 4 commands per instance, key and second.
    assert_eq!(cmds(&rows[0]), 4.0 * 4.0 * 2.0, "{table}");
}

/// The binding quota (the lowest rate) need not come first: its state is
/// reported in its own slot, named by its own name, and the other quotas
/// are open. A quota in tokens is refused: the mode counts requests.
#[tokio::test]
async fn the_binding_quota_reports_in_its_own_slot_and_a_quota_in_tokens_is_refused() {
    require_redis();
    let server = RedisServer::start();
    let clock = ManualClock::new(SystemClock.now_ms());
    let coordinated = || {
        Coordinated::builder(RedisStore::new(server.url()).unwrap())
            .sync_interval(INTERVAL)
            .clock(clock.clone())
            .manual_sync()
            .build()
            .unwrap()
    };
    let second = Quota::new(100, Duration::from_secs(1))
        .unwrap()
        .named("second")
        .unwrap();
    let hour = Quota::new(1_000, Duration::from_secs(3600))
        .unwrap()
        .named("hour")
        .unwrap();
    let layer = RateLimitLayer::builder()
        .name("slots")
        .quota(
            tower_ratelimit::Policy::new(second.clone())
                .and(hour)
                .unwrap(),
        )
        .key(Constant::new("api"))
        .store(coordinated())
        .clock(clock.clone())
        .headers(tower_ratelimit::headers::HeaderStyle::Ietf)
        .build()
        .unwrap();
    let res = layer
        .layer(service_fn(|_req: Request<Body>| async {
            Ok::<_, Infallible>(http::Response::new(Body::empty()))
        }))
        .oneshot(Request::new(Body::empty()))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let field = res.headers()["ratelimit"].to_str().unwrap();
    assert!(
        field.starts_with(r#""second";r=100;"#) && field.contains(r#""hour";r=1000;"#),
        "{field}"
    );

    let tokens = Quota::new(1_000, Duration::from_secs(60))
        .unwrap()
        .with_unit("tokens")
        .unwrap();
    let err = RateLimitLayer::builder()
        .quota(tower_ratelimit::Policy::new(second).and(tokens).unwrap())
        .store(coordinated())
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("counts requests"), "{err}");
}
