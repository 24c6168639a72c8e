//! The fleet load shedder against real `redis-server` processes, over real
//! TCP: two instances on one Redis never serve more than a class's share of
//! the fleet's capacity at once, the critical reserve stays open, slots a
//! crashed instance never gave back stop counting when their lease ends, and
//! a Redis that is down follows the failure policy and is counted. Handlers
//! wait on a semaphore the test controls, never on a timer.

use crate::support::example;
use crate::support::http as http_support;
use crate::support::redis as redis_support;
use crate::support::shed as shed_support;

use crate::support::poll::eventually;
use crate::support::recorder;
use axum::{http::StatusCode, routing::get, Router};
use http::Request;
use http_support::{HttpClient, TestServer};
use metrics_util::debugging::DebugValue;
use redis_support::{assert_every_key_has_a_ttl, pick_free_port, require_redis, RedisServer};
use shed_support::{assert_shed, by_header, send};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use tower::ServiceExt;
use tower_ratelimit::clock::{Clock, ManualClock, SystemClock};
use tower_ratelimit::failure::OnStoreError;
use tower_ratelimit::key::Key;
use tower_ratelimit::store::{Namespace, RedisStore};
use tower_ratelimit::{shed::Priority, LoadShedLayer};

/// Requests in flight in the handler, by class, with high-water marks; a
/// signal per request entering; a gate the test opens.
#[derive(Clone)]
struct Probe {
    in_flight: Arc<[AtomicU64; 4]>,
    max: Arc<[AtomicU64; 4]>,
    entered: mpsc::UnboundedSender<Priority>,
    gate: Arc<Semaphore>,
}

impl Probe {
    fn new() -> (Self, mpsc::UnboundedReceiver<Priority>) {
        let (entered, rx) = mpsc::unbounded_channel();
        let probe = Probe {
            in_flight: Arc::new(Default::default()),
            max: Arc::new(Default::default()),
            entered,
            gate: Arc::new(Semaphore::new(0)),
        };
        (probe, rx)
    }

    fn app(&self) -> Router {
        let probe = self.clone();
        Router::new().route(
            "/",
            get(move |req: Request<axum::body::Body>| {
                let probe = probe.clone();
                async move {
                    let class = by_header(&req.into_parts().0);
                    let i = slot(class);
                    let now = probe.in_flight[i].fetch_add(1, Ordering::SeqCst) + 1;
                    probe.max[i].fetch_max(now, Ordering::SeqCst);
                    let _ = probe.entered.send(class);
                    probe.gate.acquire().await.unwrap().forget();
                    probe.in_flight[i].fetch_sub(1, Ordering::SeqCst);
                    "done"
                }
            }),
        )
    }
}

/// The probe's counter of `class`.
fn slot(class: Priority) -> usize {
    Priority::ALL.iter().position(|p| *p == class).unwrap()
}

fn fleet_layer(name: &str, url: &str, capacity: u64) -> tower_ratelimit::LoadShedLayerBuilder {
    LoadShedLayer::builder()
        .name(name)
        .fleet_capacity(capacity)
        .classify(by_header)
        .store(RedisStore::new(url).unwrap())
        .store_timeout(Duration::from_secs(2))
}

/// The sorted set that holds the fleet's slots.
fn fleet_key(server: &RedisServer, name: &str) -> String {
    RedisStore::new(server.url())
        .unwrap()
        .slots_key(&Namespace::new(name), &Key::new("fleet"))
}

/// Every counter of `limiter` since the last read (a read resets them),
/// as `name{label=value,...}` without the `limiter` label.
fn counters(limiter: &str) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    for (k, v) in recorder::take(limiter) {
        let key = k.key();
        if !key
            .labels()
            .any(|l| l.key() == "limiter" && l.value() == limiter)
        {
            continue;
        }
        let labels: Vec<String> = key
            .labels()
            .filter(|l| l.key() != "limiter")
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        if let DebugValue::Counter(n) = v {
            *out.entry(format!("{}{{{}}}", key.name(), labels.join(",")))
                .or_default() += n;
        }
    }
    out
}

#[tokio::test]
async fn two_instances_on_one_redis_never_serve_more_low_requests_than_their_share_and_keep_the_reserve_for_critical(
) {
    require_redis();
    recorder::install();
    let redis = RedisServer::start();
    let name = "fleet-flood";
    let (probe, mut entered) = Probe::new();
    // Two instances: each its own layer and its own connections to the one Redis.
    let layer = || fleet_layer(name, &redis.url(), 10).build().unwrap();
    let a = TestServer::start(probe.app().layer(layer())).await;
    let b = TestServer::start(probe.app().layer(layer())).await;
    let key = fleet_key(&redis, name);
    let c = HttpClient::new();
    let url = |i: usize| {
        if i.is_multiple_of(2) {
            a.url("/")
        } else {
            b.url("/")
        }
    };

    // A flood of low requests over both instances: 7 of capacity 10 (share 0.7) run.
    let mut flood = JoinSet::new();
    for i in 0..40 {
        let (c, url) = (c.clone(), url(i));
        flood.spawn(async move { send(&c, &url, Priority::Low).await });
    }
    for _ in 0..33 {
        assert_shed(&flood.join_next().await.unwrap().unwrap(), Priority::Low);
    }
    for _ in 0..7 {
        assert_eq!(entered.recv().await, Some(Priority::Low));
    }
    assert_eq!(
        redis.query::<i64>(&["ZCARD", &key]),
        7,
        "seven slots in Redis"
    );
    assert_every_key_has_a_ttl(&redis);

    // The flood goes on; normal traffic may still use up to 9, critical all 10.
    let mut more = JoinSet::new();
    for (i, class) in [Priority::Normal, Priority::Normal, Priority::Critical]
        .into_iter()
        .enumerate()
    {
        let (c, url) = (c.clone(), url(i));
        more.spawn(async move { send(&c, &url, class).await });
        assert_eq!(entered.recv().await, Some(class), "{class} admitted");
    }
    for i in 0..4 {
        assert_shed(&send(&c, &url(i), Priority::Low).await, Priority::Low);
        assert_shed(&send(&c, &url(i), Priority::Normal).await, Priority::Normal);
        assert_shed(
            &send(&c, &url(i), Priority::Critical).await,
            Priority::Critical,
        );
    }
    assert_eq!(probe.max[slot(Priority::Low)].load(Ordering::SeqCst), 7);

    // The flood ends: every slot is given back, and low traffic runs again at once.
    probe.gate.add_permits(10);
    while let Some(r) = flood.join_next().await {
        assert_eq!(r.unwrap().status, StatusCode::OK);
    }
    while let Some(r) = more.join_next().await {
        assert_eq!(r.unwrap().status, StatusCode::OK);
    }
    eventually(Duration::from_secs(5), "every fleet slot released", || {
        redis.query::<i64>(&["ZCARD", &key]) == 0
    })
    .await;
    let mut again = JoinSet::new();
    for i in 0..7 {
        let (c, url) = (c.clone(), url(i));
        again.spawn(async move { send(&c, &url, Priority::Low).await });
        assert_eq!(entered.recv().await, Some(Priority::Low));
    }
    probe.gate.add_permits(7);
    while let Some(r) = again.join_next().await {
        assert_eq!(r.unwrap().status, StatusCode::OK);
    }
    assert_eq!(probe.max[slot(Priority::Low)].load(Ordering::SeqCst), 7);

    let counted = counters(name);
    let decisions = |class: &str, outcome: &str| {
        counted
            .get(&format!(
                "load_shed_decisions_total{{class={class},outcome={outcome}}}"
            ))
            .copied()
    };
    assert_eq!(decisions("low", "shed"), Some(37), "{counted:?}");
    assert_eq!(decisions("normal", "shed"), Some(4), "{counted:?}");
    assert_eq!(decisions("critical", "shed"), Some(4), "{counted:?}");
    assert_eq!(decisions("low", "admitted"), Some(14), "{counted:?}");
}

#[tokio::test]
async fn slots_an_instance_never_gave_back_count_until_their_lease_ends_by_redis_s_clock_whatever_the_instance_s(
) {
    require_redis();
    let redis = RedisServer::start();
    let name = "fleet-lease";
    let clock = ManualClock::new(SystemClock.now_ms());
    let layer = fleet_layer(name, &redis.url(), 2)
        .clock(clock.clone())
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let (probe, _entered) = Probe::new();
    probe.gate.add_permits(1000);
    let svc = probe.app().layer(layer);
    let request = |class: &str| {
        Request::get("/")
            .header("x-priority", class)
            .body(axum::body::Body::empty())
            .unwrap()
    };
    let low = || request("low");
    // A crashed instance: its responses (and the slots they hold) are never dropped.
    for _ in 0..2 {
        let res = svc.clone().oneshot(request("critical")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        std::mem::forget(res);
    }
    let key = fleet_key(&redis, name);
    assert_eq!(redis.query::<i64>(&["ZCARD", &key]), 2);
    // Low may use floor(0.7 × 2) = 1: refused while the lost slots count,
    // whatever this instance's clock says (Redis's clock times leases).
    clock.advance(Duration::from_secs(3_600));
    let res = svc.clone().oneshot(low()).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    // Redis's clock a lease later, for these slots.
    redis.shift_scores(&key, -30_000);
    let res = svc.clone().oneshot(low()).await.unwrap();
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "admitted once the lease ended"
    );
}

#[tokio::test]
async fn a_redis_that_is_down_fails_open_by_default_and_counts_it_and_other_policies_hold() {
    require_redis();
    recorder::install();
    // Nothing listens on this port: every acquire fails at once.
    let url = format!("redis://127.0.0.1:{}", pick_free_port());
    let (probe, mut entered) = Probe::new();
    let request = |class: Priority| {
        Request::get("/")
            .header("x-priority", class.as_str())
            .body(axum::body::Body::empty())
            .unwrap()
    };

    // Fail open (the default): five low requests run at once, over a capacity of 2.
    let open = fleet_layer("fleet-down-open", &url, 2).build().unwrap();
    let svc = probe.app().layer(open);
    let mut running = JoinSet::new();
    for _ in 0..5 {
        let svc = svc.clone();
        running.spawn(async move { svc.oneshot(request(Priority::Low)).await.unwrap().status() });
        assert_eq!(entered.recv().await, Some(Priority::Low));
    }
    probe.gate.add_permits(5);
    while let Some(s) = running.join_next().await {
        assert_eq!(s.unwrap(), StatusCode::OK);
    }
    // Each request's slot release (spawned when it ended) fails too, and counts
    // a store error of its own: gather counters until all five have.
    let mut counted: HashMap<String, u64> = HashMap::new();
    let released = "load_shed_fleet_releases_total{result=failed}";
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while counted.get(released) != Some(&5) {
        assert!(
            std::time::Instant::now() < deadline,
            "releases never failed: {counted:?}"
        );
        for (k, n) in counters("fleet-down-open") {
            *counted.entry(k).or_default() += n;
        }
        tokio::task::yield_now().await;
    }
    let open = "load_shed_fleet_store_failure_decisions_total{action=open}";
    assert_eq!(counted.get(open), Some(&5), "{counted:?}");
    let errors: u64 = counted
        .iter()
        .filter(|(k, _)| k.starts_with("load_shed_fleet_store_errors_total"))
        .map(|(_, n)| n)
        .sum();
    assert_eq!(
        errors,
        5 + 5,
        "five acquires and five releases: {counted:?}"
    );
    assert_eq!(
        counted.get("load_shed_decisions_total{class=low,outcome=admitted}"),
        Some(&5)
    );

    // Fail closed: 503, the inner service is not called.
    let closed = fleet_layer("fleet-down-closed", &url, 2)
        .on_store_error(OnStoreError::FailClosed)
        .build()
        .unwrap();
    let res = probe
        .app()
        .layer(closed)
        .oneshot(request(Priority::Critical))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.headers().contains_key("retry-after"));

    // Local: each instance falls back to its fraction of each class's share.
    let local = fleet_layer("fleet-down-local", &url, 10)
        .on_store_error(OnStoreError::Local { fraction: 0.5 })
        .build()
        .unwrap();
    let svc = probe.app().layer(local);
    let mut running = JoinSet::new();
    // Critical: floor(0.5 × 10) = 5 here.
    for _ in 0..5 {
        let svc = svc.clone();
        running.spawn(async move {
            svc.oneshot(request(Priority::Critical))
                .await
                .unwrap()
                .status()
        });
        assert_eq!(entered.recv().await, Some(Priority::Critical));
    }
    let res = svc
        .clone()
        .oneshot(request(Priority::Critical))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    probe.gate.add_permits(5);
    while let Some(s) = running.join_next().await {
        assert_eq!(s.unwrap(), StatusCode::OK);
    }
}

#[tokio::test]
async fn shadow_mode_counts_fleet_sheds_and_sheds_nothing() {
    require_redis();
    recorder::install();
    let redis = RedisServer::start();
    let name = "fleet-shadow";
    let layer = fleet_layer(name, &redis.url(), 2)
        .shadow(true)
        .build()
        .unwrap();
    let (probe, mut entered) = Probe::new();
    let svc = probe.app().layer(layer);
    let mut running = JoinSet::new();
    for _ in 0..4 {
        let svc = svc.clone();
        let req = Request::get("/")
            .header("x-priority", "low")
            .body(axum::body::Body::empty())
            .unwrap();
        running.spawn(async move { svc.oneshot(req).await.unwrap().status() });
        assert_eq!(entered.recv().await, Some(Priority::Low));
    }
    // Low may use 1 of 2: three would have been shed; none held a slot.
    assert_eq!(redis.query::<i64>(&["ZCARD", &fleet_key(&redis, name)]), 1);
    probe.gate.add_permits(4);
    while let Some(s) = running.join_next().await {
        assert_eq!(s.unwrap(), StatusCode::OK);
    }
    let counted = counters(name);
    assert_eq!(
        counted.get("load_shed_shadow_total{class=low}"),
        Some(&3),
        "{counted:?}"
    );
    assert_eq!(
        counted.get("load_shed_decisions_total{class=low,outcome=shed}"),
        Some(&0),
        "{counted:?}"
    );
}

#[tokio::test]
async fn two_demo_instances_with_a_fleet_capacity_of_10_serve_at_most_7_low_requests_at_once() {
    require_redis();
    let redis = RedisServer::start();
    let url = redis.url();
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--store",
        "redis",
        "--redis-url",
        &url,
        "--limit",
        "100000",
        "--fleet-shed-capacity",
        "10",
    ];
    let demos = [
        example::Running::start("demo", &args),
        example::Running::start("demo", &args),
    ];
    let c = HttpClient::new();
    let key = fleet_key(&redis, "fleet");
    // A flood of slow low requests over both instances, held for 5 minutes.
    let mut flood = JoinSet::new();
    for i in 0..30 {
        let (c, url) = (c.clone(), demos[i % 2].url("/slow/300000"));
        flood.spawn(async move { send(&c, &url, Priority::Low).await });
    }
    let mut shed = 0;
    while shed < 23 {
        let r = flood.join_next().await.unwrap().unwrap();
        assert_shed(&r, Priority::Low);
        shed += 1;
    }
    // Seven run (the others were all answered): the fleet holds seven slots.
    assert_eq!(redis.query::<i64>(&["ZCARD", &key]), 7);
    assert_shed(
        &send(&c, &demos[0].url("/"), Priority::Low).await,
        Priority::Low,
    );
    for d in &demos {
        let r = send(&c, &d.url("/"), Priority::Critical).await;
        assert_eq!(
            r.status,
            StatusCode::OK,
            "critical admitted during the flood"
        );
    }
    // The flood ends (its clients go away): low is admitted again.
    flood.abort_all();
    while flood.join_next().await.is_some() {}
    eventually(
        Duration::from_secs(10),
        "the flood's slots released",
        || redis.query::<i64>(&["ZCARD", &key]) == 0,
    )
    .await;
    for d in &demos {
        let r = send(&c, &d.url("/"), Priority::Low).await;
        assert_eq!(r.status, StatusCode::OK, "low admitted after the flood");
    }
}
