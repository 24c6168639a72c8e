//! Failures made for real against `redis-server` processes started by the tests:
//! frozen (SIGSTOP), killed and restarted, refusing connections, and answering
//! errors (OOM, BUSY, READONLY, paused writes); plus the breaker, deny cache,
//! shadow mode and an evicting Redis.

use crate::support::http as http_support;
use crate::support::redis as redis_support;

use crate::support::recorder;
use axum::{http::StatusCode, routing::get, Router};
use http_support::{HttpClient, Reply, TestServer};
use metrics_util::debugging::DebugValue;
use redis_support::{require_redis, RedisServer, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower_ratelimit::clock::{Clock, ManualClock, SystemClock};
use tower_ratelimit::key::{Header, Key};
use tower_ratelimit::store::{Charge, Namespace, RedisStore, Settle, Store, StoreFuture};
use tower_ratelimit::{
    decision::Decision, failure::CircuitBreaker, failure::OnStoreError, rate::DenyCache, Policy,
    Quota, RateLimitLayer, StoreError,
};

const TIMEOUT: Duration = Duration::from_millis(100);
/// Generous slack over the store timeout: this checks that nothing hangs, not speed.
const HANG: Duration = Duration::from_secs(2);

fn app(calls: Arc<AtomicUsize>) -> Router {
    Router::new().route(
        "/",
        get(move || {
            calls.fetch_add(1, Ordering::SeqCst);
            async { "ok" }
        }),
    )
}

fn builder(
    store: impl Store,
    limit: u64,
    clock: &ManualClock,
) -> tower_ratelimit::RateLimitLayerBuilder {
    RateLimitLayer::builder()
        .quota(Quota::new(limit, Duration::from_secs(60)).unwrap())
        .key(Header::try_new("x-client").unwrap())
        .store(store)
        .clock(clock.clone())
        .store_timeout(TIMEOUT)
}

fn fast_store(url: String) -> RedisStore {
    RedisStore::builder(url)
        .connect_timeout(TIMEOUT)
        .response_timeout(TIMEOUT)
        .build()
        .unwrap()
}

/// A GET that must be answered well within the timeout (fails instead of hanging).
async fn fetch(c: &HttpClient, url: &str, client: &str) -> Reply {
    tokio::time::timeout(
        TIMEOUT + HANG,
        c.get_with(url, &[("x-client", client.as_bytes())]),
    )
    .await
    .unwrap_or_else(|_| panic!("request hung past the store timeout"))
}

/// Whether the store decided this response (it carries rate-limit headers).
fn limited(r: &Reply) -> bool {
    r.header("x-ratelimit-remaining").is_some()
}

#[tokio::test]
async fn a_frozen_redis_is_answered_per_policy_within_the_timeout_and_limiting_resumes_after_sigcont(
) {
    require_redis();
    let server = RedisServer::start();
    let clock = ManualClock::new(SystemClock.now_ms());
    for (policy, want) in [
        (OnStoreError::FailOpen, StatusCode::OK),
        (OnStoreError::FailClosed, StatusCode::SERVICE_UNAVAILABLE),
    ] {
        let calls = Arc::new(AtomicUsize::new(0));
        let l = builder(fast_store(server.url()), 1_000_000, &clock)
            .on_store_error(policy)
            .circuit_breaker(
                CircuitBreaker::new()
                    .failures(3)
                    .cooldown(Duration::from_millis(200)),
            )
            .build()
            .unwrap();
        let http = TestServer::start(app(calls.clone()).layer(l)).await;
        let c = HttpClient::new();
        let url = http.url("/");
        assert!(limited(&fetch(&c, &url, "a").await));

        server.pause();
        // Under load: 8 concurrent clients for 40 requests each, all answered per policy.
        let mut tasks = vec![];
        for t in 0..8 {
            let (c, url) = (c.clone(), url.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..40 {
                    let r = fetch(&c, &url, &format!("c{t}")).await;
                    assert_eq!(r.status, want, "{policy:?}");
                    assert!(!limited(&r), "no rate-limit headers without a store answer");
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        server.resume();
        let resumed = Instant::now();
        loop {
            let r = fetch(&c, &url, "a").await;
            if r.status == StatusCode::OK && limited(&r) {
                break;
            }
            assert!(
                resumed.elapsed() < Duration::from_secs(1),
                "limiting did not resume within a second"
            );
            // The breaker's cool-down runs on the layer's clock.
            clock.advance(Duration::from_millis(50));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[tokio::test]
async fn a_killed_and_restarted_redis_is_answered_per_policy_and_the_limiter_recovers_by_itself() {
    require_redis();
    let mut server = RedisServer::start();
    let clock = ManualClock::new(SystemClock.now_ms());
    let calls = Arc::new(AtomicUsize::new(0));
    let l = builder(fast_store(server.url()), 3, &clock)
        .on_store_error(OnStoreError::FailClosed)
        .circuit_breaker(CircuitBreaker::new().cooldown(Duration::from_millis(100)))
        .build()
        .unwrap();
    let http = TestServer::start(app(calls.clone()).layer(l)).await;
    let c = HttpClient::new();
    let url = http.url("/");
    assert_eq!(fetch(&c, &url, "a").await.status, StatusCode::OK);
    server.stop();
    for _ in 0..20 {
        assert_eq!(
            fetch(&c, &url, "a").await.status,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
    server.restart();
    // A fresh Redis has no scripts and no state: the scripts are reloaded and a
    // new window opens.
    let deadline = Instant::now() + Duration::from_secs(10);
    let r = loop {
        let r = fetch(&c, &url, "a").await;
        if limited(&r) {
            break r;
        }
        assert!(Instant::now() < deadline, "did not recover");
        clock.advance(Duration::from_millis(50));
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header_u64("x-ratelimit-remaining"), 2);
    assert_eq!(fetch(&c, &url, "a").await.status, StatusCode::OK);
    assert_eq!(fetch(&c, &url, "a").await.status, StatusCode::OK);
    assert_eq!(
        fetch(&c, &url, "a").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// Charges through a store and returns the error, or panics if it succeeded.
async fn store_error(store: &RedisStore, key: &str) -> StoreError {
    let ns = Namespace::new("faults");
    let key = Key::new(key);
    let policy = Policy::new(Quota::new(5, Duration::from_secs(60)).unwrap());
    let call = Charge::new(&ns, &key, &policy, SystemClock.now_ms())
        .with_timeout(Duration::from_millis(500));
    match tokio::time::timeout(HANG, store.charge(&call))
        .await
        .expect("the store call hung")
    {
        Ok(d) => panic!("expected a store error, got {d:?}"),
        Err(e) => e,
    }
}

#[tokio::test]
async fn oom_under_noeviction_is_a_store_error_never_a_429() {
    require_redis();
    let server =
        RedisServer::start_with(&["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"]);
    // Fill memory until Redis refuses even a small write.
    let mut i = 0;
    for size in [64 * 1024, 4096, 256, 16] {
        let blob = "x".repeat(size);
        while !matches!(
            server.cmd(&["SET", &format!("junk{i}"), &blob]),
            Value::ServerError(_)
        ) {
            i += 1;
            assert!(i < 100_000, "Redis never ran out of memory");
        }
    }
    let store = RedisStore::new(server.url()).unwrap();
    let e = store_error(&store, "oom").await;
    assert_eq!(e.kind(), "oom", "{e}");
    // Through the layer: the failure policy answers, never a 429.
    let clock = ManualClock::new(SystemClock.now_ms());
    let l = builder(store, 1, &clock)
        .on_store_error(OnStoreError::FailClosed)
        .build()
        .unwrap();
    let http = TestServer::start(app(Arc::new(AtomicUsize::new(0))).layer(l)).await;
    let c = HttpClient::new();
    for _ in 0..3 {
        assert_eq!(
            fetch(&c, &http.url("/"), "a").await.status,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
}

#[tokio::test]
async fn busy_from_a_long_script_is_a_store_error() {
    require_redis();
    let server = RedisServer::start_with(&["--busy-reply-threshold", "50"]);
    let store = RedisStore::new(server.url()).unwrap();
    // Open the store's connection first (a new connection would wait behind the script).
    store.eviction_policy().await.unwrap();
    let blocker = {
        let server = server.clone_client();
        std::thread::spawn(move || {
            server.try_cmd(&["EVAL", "local i = 0 while true do i = i + 1 end", "0"])
        })
    };
    // Until the script runs, charges succeed; then every call gets BUSY.
    let ns = Namespace::new("faults");
    let policy = Policy::new(Quota::new(1_000_000, Duration::from_secs(60)).unwrap());
    let key = Key::new("busy");
    let deadline = Instant::now() + HANG;
    let e = loop {
        let call = Charge::new(&ns, &key, &policy, SystemClock.now_ms())
            .with_timeout(Duration::from_millis(500));
        match tokio::time::timeout(HANG, store.charge(&call))
            .await
            .expect("the store call hung")
        {
            Err(e) => break e,
            Ok(_) => assert!(
                Instant::now() < deadline,
                "the long script never made Redis busy"
            ),
        }
    };
    assert_eq!(e.kind(), "busy", "{e}");
    let _ = server.clone_client().try_cmd(&["SCRIPT", "KILL"]);
    let _ = blocker.join();
}

#[tokio::test]
async fn readonly_from_a_demoted_primary_is_a_store_error_and_the_connection_is_replaced() {
    require_redis();
    let primary = RedisServer::start();
    let replica = RedisServer::replica_of(&primary);
    replica.wait_for_sync(&primary);
    let store = RedisStore::new(primary.url()).unwrap();
    let ns = Namespace::new("ro");
    let key = Key::new("k");
    let policy = Policy::new(Quota::new(5, Duration::from_secs(60)).unwrap());
    let charge = || {
        Charge::new(&ns, &key, &policy, SystemClock.now_ms())
            .with_timeout(Duration::from_millis(500))
    };
    assert!(store.charge(&charge()).await.unwrap().is_allowed());
    // The connections that ran the charge script (the harness's own run
    // other commands).
    let script_clients = || -> Vec<String> {
        primary
            .query::<String>(&["CLIENT", "LIST"])
            .lines()
            .filter(|l| l.contains("cmd=evalsha") || l.contains("cmd=eval "))
            .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
            .collect()
    };
    let before = script_clients();
    assert!(!before.is_empty());
    // Demote the primary: FAILOVER hands the role to its replica.
    primary.cmd(&["FAILOVER"]);
    primary.wait_for_role("slave");
    let e = store.charge(&charge()).await.unwrap_err();
    assert_eq!(e.kind(), "readonly", "{e}");
    // Promote it back: the store reconnects instead of reusing the READONLY connection.
    primary.cmd(&["REPLICAOF", "NO", "ONE"]);
    primary.wait_for_role("master");
    assert!(store.charge(&charge()).await.unwrap().is_allowed());
    let after = script_clients();
    assert!(!after.is_empty());
    assert!(
        after.iter().all(|id| !before.contains(id)),
        "the READONLY connection was reused: {before:?} then {after:?}"
    );
}

#[tokio::test]
async fn writes_paused_with_client_pause_time_out_into_the_failure_policy() {
    require_redis();
    let server = RedisServer::start();
    let store = RedisStore::new(server.url()).unwrap();
    store.eviction_policy().await.unwrap();
    server.cmd(&["CLIENT", "PAUSE", "1000", "WRITE"]);
    let e = store_error(&store, "paused").await;
    assert_eq!(e.kind(), "timeout", "{e}");
    server.cmd(&["CLIENT", "UNPAUSE"]);
}

/// A store that counts the calls it passes on to a real Redis store.
#[derive(Clone)]
struct Counting {
    inner: RedisStore,
    charges: Arc<AtomicUsize>,
}

impl Store for Counting {
    fn charge(&self, call: &Charge<'_>) -> StoreFuture<Result<Decision, StoreError>> {
        self.charges.fetch_add(1, Ordering::SeqCst);
        self.inner.charge(call)
    }
    fn settle(&self, call: &Settle<'_>) -> StoreFuture<Result<(), StoreError>> {
        self.inner.settle(call)
    }
    fn status(&self, call: &Charge<'_>) -> StoreFuture<Result<Decision, StoreError>> {
        self.inner.status(call)
    }
}

/// A stopped Redis (restartable on its port) and a counting store on it.
fn counting_on_a_stopped_redis() -> (RedisServer, Counting, Arc<AtomicUsize>) {
    let mut server = RedisServer::start();
    let url = server.url();
    server.stop();
    let charges = Arc::new(AtomicUsize::new(0));
    let store = Counting {
        inner: fast_store(url),
        charges: charges.clone(),
    };
    (server, store, charges)
}

#[tokio::test]
async fn with_the_breaker_open_requests_make_no_store_call() {
    require_redis();
    let (mut server, store, charges) = counting_on_a_stopped_redis();
    let clock = ManualClock::new(SystemClock.now_ms());
    let l = builder(store, 10, &clock)
        .circuit_breaker(
            CircuitBreaker::new()
                .failures(3)
                .cooldown(Duration::from_secs(1)),
        )
        .build()
        .unwrap();
    let http = TestServer::start(app(Arc::new(AtomicUsize::new(0))).layer(l)).await;
    let c = HttpClient::new();
    for _ in 0..100 {
        assert_eq!(
            fetch(&c, &http.url("/"), "a").await.status,
            StatusCode::OK,
            "fail open"
        );
    }
    assert_eq!(
        charges.load(Ordering::SeqCst),
        3,
        "three failures open the breaker; then no calls"
    );
    // After the cool-down, exactly one probe goes through (and fails again).
    clock.advance(Duration::from_secs(1));
    for _ in 0..10 {
        fetch(&c, &http.url("/"), "a").await;
    }
    assert_eq!(charges.load(Ordering::SeqCst), 4);
    // Redis returns: the next probe closes the breaker and limiting resumes.
    server.restart();
    clock.advance(Duration::from_secs(1));
    assert!(limited(&fetch(&c, &http.url("/"), "a").await));
    assert!(limited(&fetch(&c, &http.url("/"), "a").await));
    assert_eq!(charges.load(Ordering::SeqCst), 6);
}

#[tokio::test]
async fn a_rejection_made_without_the_store_never_enters_the_deny_cache() {
    require_redis();
    let (mut server, store, charges) = counting_on_a_stopped_redis();
    let clock = ManualClock::new(SystemClock.now_ms());
    // Down, the scaled-down local policy decides: 2 admitted, then 429.
    let l = builder(store, 2, &clock)
        .on_store_error(OnStoreError::Local { fraction: 1.0 })
        .circuit_breaker(CircuitBreaker::disabled())
        .build()
        .unwrap();
    let http = TestServer::start(app(Arc::new(AtomicUsize::new(0))).layer(l)).await;
    let c = HttpClient::new();
    let url = http.url("/");
    assert_eq!(fetch(&c, &url, "a").await.status, StatusCode::OK);
    assert_eq!(fetch(&c, &url, "a").await.status, StatusCode::OK);
    let local = fetch(&c, &url, "a").await;
    assert_eq!(
        local.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        local.body
    );
    assert_eq!(charges.load(Ordering::SeqCst), 3, "each tried the store");
    // The store is back, and holds nothing for the client: its next request
    // goes to the store and is admitted there, not answered from a cache of
    // the local rejection.
    server.restart();
    let back = fetch(&c, &url, "a").await;
    assert_eq!(back.status, StatusCode::OK, "{}", back.body);
    assert!(limited(&back), "decided by the store");
    assert_eq!(charges.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn the_deny_cache_turns_a_hammering_client_into_one_store_call_per_window_with_identical_headers(
) {
    require_redis();
    let server = RedisServer::start();
    let clock = ManualClock::new(SystemClock.now_ms());
    let quota = 10;
    let l = builder(RedisStore::new(server.url()).unwrap(), quota, &clock)
        .build()
        .unwrap();
    let http = TestServer::start(app(Arc::new(AtomicUsize::new(0))).layer(l)).await;
    let c = HttpClient::new();
    let url = http.url("/");
    fetch(&c, &url, "warmup").await;
    server.config_resetstat();
    let mut first_rejection: Option<Reply> = None;
    for _ in 0..10 * quota {
        let r = fetch(&c, &url, "hammer").await;
        if r.status == StatusCode::TOO_MANY_REQUESTS {
            match &first_rejection {
                None => first_rejection = Some(r),
                Some(first) => {
                    for h in [
                        "x-ratelimit-limit",
                        "x-ratelimit-remaining",
                        "x-ratelimit-reset",
                        "x-ratelimit-used",
                        "retry-after",
                    ] {
                        assert_eq!(r.header(h), first.header(h), "{h}");
                    }
                    assert_eq!(r.body, first.body);
                }
            }
        }
    }
    assert!(first_rejection.is_some());
    // 10 admitted + 1 rejected by the store; the other 89 rejections were local.
    assert_eq!(server.command_calls("evalsha"), quota + 1);
    // Next window: one more store call opens it.
    clock.advance(Duration::from_secs(60));
    assert_eq!(fetch(&c, &url, "hammer").await.status, StatusCode::OK);
    assert_eq!(server.command_calls("evalsha"), quota + 2);
}

#[tokio::test]
async fn without_the_deny_cache_every_rejection_is_a_store_call() {
    require_redis();
    let server = RedisServer::start();
    let clock = ManualClock::new(SystemClock.now_ms());
    let l = builder(RedisStore::new(server.url()).unwrap(), 10, &clock)
        .deny_cache(DenyCache::disabled())
        .build()
        .unwrap();
    let http = TestServer::start(app(Arc::new(AtomicUsize::new(0))).layer(l)).await;
    let c = HttpClient::new();
    fetch(&c, &http.url("/"), "warmup").await;
    server.config_resetstat();
    for _ in 0..100 {
        fetch(&c, &http.url("/"), "hammer").await;
    }
    assert_eq!(server.command_calls("evalsha"), 100);
}

/// Every counter of `limiter`, by name, since the last read (a read resets them).
fn counters(limiter: &str) -> std::collections::HashMap<String, u64> {
    let mut out = std::collections::HashMap::new();
    for (k, v) in recorder::take(limiter) {
        if !k
            .key()
            .labels()
            .any(|l| l.key() == "limiter" && l.value() == limiter)
        {
            continue;
        }
        if let DebugValue::Counter(n) = v {
            *out.entry(k.key().name().to_owned()).or_default() += n;
        }
    }
    out
}

#[tokio::test]
async fn shadow_mode_lets_every_request_through_and_counts_the_would_be_rejections_exactly() {
    require_redis();
    recorder::install();
    let server = RedisServer::start();
    let clock = ManualClock::new(SystemClock.now_ms());
    let calls = Arc::new(AtomicUsize::new(0));
    let l = builder(RedisStore::new(server.url()).unwrap(), 7, &clock)
        .name("shadow-test")
        .shadow(true)
        .build()
        .unwrap();
    let http = TestServer::start(app(calls.clone()).layer(l)).await;
    let c = HttpClient::new();
    for _ in 0..25 {
        assert_eq!(fetch(&c, &http.url("/"), "a").await.status, StatusCode::OK);
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        25,
        "the inner service saw every request"
    );
    let counts = counters("shadow-test");
    assert_eq!(counts["ratelimit_shadow_rejections_total"], 18);
    assert_eq!(
        counts["ratelimit_decisions_total"], 7,
        "7 allowed, nothing rejected"
    );
}

#[tokio::test]
async fn an_allkeys_lru_redis_is_warned_about_and_evicted_state_reads_as_a_fresh_window() {
    require_redis();
    let server =
        RedisServer::start_with(&["--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"]);
    let logs = Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let writer = {
        let logs = logs.clone();
        move || LogWriter(logs.clone())
    };
    let subscriber = tracing_subscriber::fmt()
        .with_writer(writer)
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let store = RedisStore::new(server.url()).unwrap();
    let ns = Namespace::new("evicted");
    let key = Key::new("client");
    let policy = Policy::new(Quota::new(10, Duration::from_secs(60)).unwrap());
    let t0 = SystemClock.now_ms();
    let call =
        |now_ms| Charge::new(&ns, &key, &policy, now_ms).with_timeout(Duration::from_secs(1));
    for _ in 0..3 {
        store.charge(&call(t0)).await.unwrap();
    }
    let text = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    assert!(
        text.contains("maxmemory-policy") && text.contains("allkeys-lru"),
        "no warning in {text:?}"
    );

    // Memory pressure: junk evicts the limiter key.
    let redis_key = store.redis_key(&ns, &key);
    let blob = "y".repeat(32 * 1024);
    let mut i = 0;
    while server.query::<i64>(&["EXISTS", &redis_key]) == 1 {
        server.cmd(&["SET", &format!("junk{i}"), &blob]);
        i += 1;
        assert!(i < 10_000, "the limiter key was never evicted");
    }
    let d = store.charge(&call(t0 + 5)).await.unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.statuses()[0].remaining, 9, "a fresh window, not an error");
    assert_eq!(
        d.statuses()[0].reset_ms,
        t0 + 5 + 60_000,
        "the new window's own reset"
    );
}

#[derive(Clone)]
struct LogWriter(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One paused moment under load: 64 clients in a loop, so that each script
/// call carries dozens of charges, and Redis paused once for 1.5 times the
/// store timeout. The breaker counts the failed calls, not the requests in
/// them: it stays closed, and only the requests that were waiting on the
/// paused Redis fail open. A dead Redis still opens it within five calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pause_under_batched_load_is_one_failure_and_a_dead_redis_opens_the_breaker_in_five_calls(
) {
    require_redis();
    const STORE_TIMEOUT: Duration = Duration::from_millis(50);
    const CLIENTS: usize = 64;
    let mut server = RedisServer::start();
    let charges = Arc::new(AtomicUsize::new(0));
    let store = Counting {
        inner: fast_store(server.url()),
        charges: charges.clone(),
    };
    let layer = RateLimitLayer::builder()
        .name("paused-once")
        .quota(Quota::new(1_000_000_000, Duration::from_secs(60)).unwrap())
        .key(Header::try_new("x-client").unwrap())
        .store(store)
        .store_timeout(STORE_TIMEOUT)
        .circuit_breaker(
            CircuitBreaker::new()
                .failures(5)
                .cooldown(Duration::from_secs(1)),
        )
        .build()
        .unwrap();
    let svc = tower::Layer::layer(
        &layer,
        tower::service_fn(|_req: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
        }),
    );
    use tower::ServiceExt;
    layer.connect().await.unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let undecided = Arc::new(AtomicUsize::new(0));
    let decided = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let (svc, stop) = (svc.clone(), stop.clone());
            let (undecided, decided) = (undecided.clone(), decided.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let req = http::Request::builder()
                        .header("x-client", format!("c{i}"))
                        .body(())
                        .unwrap();
                    let res = svc.clone().oneshot(req).await.unwrap();
                    let counter = match res.headers().contains_key("x-ratelimit-remaining") {
                        true => &decided,
                        false => &undecided,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (calls_before, decided_before) = (
        server.command_calls("evalsha"),
        decided.load(Ordering::Relaxed),
    );
    assert_eq!(server.cmd(&["CLIENT", "PAUSE", "75", "ALL"]), Value::Okay);
    tokio::time::sleep(Duration::from_millis(600)).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    let calls = server.command_calls("evalsha") - calls_before;
    let per_call = (decided.load(Ordering::Relaxed) - decided_before) as f64 / calls as f64;
    let undecided = undecided.load(Ordering::Relaxed);
    println!("{undecided} failed open; {per_call:.1} charges per script call");
    assert!(
        per_call > 10.0,
        "batched load: {per_call:.1} charges per call"
    );
    // Each client had its request waiting through the pause, and perhaps
    // the next it sent when that timed out while Redis was still paused (a
    // busy two-core machine may stretch that to one more): never the
    // breaker's cool-down of fail-open decisions, which is tens of thousands.
    assert!(undecided >= 1, "the pause failed the requests it held");
    assert!(
        undecided <= 3 * CLIENTS,
        "{undecided} decisions failed open"
    );

    // Redis dead: each new call fails; the fifth in a row opens the breaker.
    server.stop();
    charges.store(0, Ordering::SeqCst);
    for _ in 0..20 {
        let req = http::Request::builder()
            .header("x-client", "c0")
            .body(())
            .unwrap();
        let res = svc.clone().oneshot(req).await.unwrap();
        assert!(!res.headers().contains_key("x-ratelimit-remaining"));
    }
    assert_eq!(
        charges.load(Ordering::SeqCst),
        5,
        "five failed calls, then none"
    );
    // Back: after the cool-down, a probe closes it.
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let req = http::Request::builder()
            .header("x-client", "c0")
            .body(())
            .unwrap();
        let res = svc.clone().oneshot(req).await.unwrap();
        if res.headers().contains_key("x-ratelimit-remaining") {
            break;
        }
        assert!(Instant::now() < deadline, "the breaker never closed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// With Redis frozen and 2,000 charges queued on one connection, each is
/// answered within its budget (the store timeout from when it queued, plus
/// slack), and those whose budget ran out in the queue never reach Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_charges_queued_on_a_frozen_redis_wait_one_budget_and_the_expired_are_never_sent(
) {
    require_redis();
    const BUDGET: Duration = Duration::from_millis(50);
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .response_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let ns = Namespace::new("queued");
    let policy = Policy::new(Quota::new(10, Duration::from_secs(60)).unwrap());
    let keys: Vec<Key> = (0..2_000).map(|i| Key::new(format!("k{i}"))).collect();
    let now = SystemClock.now_ms();
    let charge = |key| store.charge(&Charge::new(&ns, key, &policy, now).with_timeout(BUDGET));
    let warm = Key::new("warm-up");
    charge(&warm).await.unwrap();
    server.config_resetstat();
    server.pause();
    // All queued at once; each answer timed when it comes.
    use futures_util::stream::{FuturesUnordered, StreamExt};
    let started = Instant::now();
    let mut answers: FuturesUnordered<_> = keys.iter().map(charge).collect();
    let mut slowest = Duration::ZERO;
    while let Some(r) = answers.next().await {
        assert_eq!(r.unwrap_err().kind(), "timeout");
        slowest = started.elapsed();
    }
    server.resume();
    // Whatever reached Redis ran once it woke up: count what was charged.
    let charged = server.scan_keys("trl:queued:*").len();
    let calls = server.command_calls("evalsha");
    println!("slowest answer {slowest:?}; {calls} calls carried {charged} of 2000 charges");
    // One budget, plus slack for a busy two-core machine to poll 2,000
    // futures (queued behind calls that never return, each used to wait a
    // budget per round: ten budgets and more).
    assert!(slowest <= 2 * BUDGET, "{slowest:?}");
    // The calls made before the first timed out (four in flight of up to
    // 64), a few for requests queued a little later with budget left (how
    // many depends on how fast the 2,000 were queued), and none for
    // requests whose budget had run out: waiting a budget per round, calls
    // went on until every request was answered (33 calls, half the charges).
    assert!(calls <= 12, "{calls} script calls");
    assert!(charged <= 12 * 64, "{charged} charges reached Redis");
}

/// More charges than one connection queues (4,096), all at once on a Redis
/// that stopped answering: those past the cap are refused at once as an
/// overload (503, `temporary-reduced-capacity`), the rest are decided by the
/// store once it answers, and none is admitted without a charge, although
/// the failure policy is to fail open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_queue_cap_requests_are_refused_as_an_overload_and_none_is_admitted_unlimited() {
    require_redis();
    const REQUESTS: usize = 5_000;
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .response_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let layer = RateLimitLayer::builder()
        .name("overload")
        .quota(Quota::new(1_000_000, Duration::from_secs(60)).unwrap())
        .key(Header::try_new("x-client").unwrap())
        .store(store)
        .store_timeout(Duration::from_secs(20))
        .on_store_error(OnStoreError::FailOpen)
        .build()
        .unwrap();
    layer.connect().await.unwrap();
    let svc = tower::Layer::layer(
        &layer,
        tower::service_fn(|_req: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
        }),
    );
    use tower::ServiceExt;
    server.pause();
    let tasks: Vec<_> = (0..REQUESTS)
        .map(|i| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let req = http::Request::builder()
                    .header("x-client", format!("c{}", i % 100))
                    .body(())
                    .unwrap();
                let res = svc.oneshot(req).await.unwrap();
                let decided = res.headers().contains_key("x-ratelimit-remaining");
                let problem = res.headers().contains_key("retry-after")
                    && res.headers()["content-type"] == "application/problem+json";
                (res.status(), decided, problem)
            })
        })
        .collect();
    // The ones past the cap are answered while Redis is still stopped.
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.resume();
    let (mut decided, mut overloaded) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            (StatusCode::OK, true, _) => decided += 1,
            (StatusCode::SERVICE_UNAVAILABLE, false, true) => overloaded += 1,
            other => panic!("admitted without a charge, or another answer: {other:?}"),
        }
    }
    println!("{decided} decided by the store, {overloaded} refused as an overload");
    assert!(overloaded >= REQUESTS - 4_096 - 4 * 64, "{overloaded}");
    assert_eq!(decided + overloaded, REQUESTS);
}
