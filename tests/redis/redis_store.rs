//! The Redis store against real `redis-server` processes started by the tests.

use crate::support::http as http_support;
use crate::support::redis as redis_support;

use axum::{http::StatusCode, routing::get, Router};
use http_support::{app, HttpClient, TestServer};
use redis_support::{assert_every_key_has_a_ttl, require_redis, RedisServer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::{ServiceBuilder, ServiceExt};
use tower_ratelimit::clock::{Clock, ManualClock, SystemClock};
use tower_ratelimit::key::{Header, Key};
use tower_ratelimit::store::{
    Charge, EvictionCheck, Namespace, RedisStore, Settle, Store, TimeSource,
};
use tower_ratelimit::{
    failure::OnStoreError, rate::DenyCache, Policy, Quota, RateLimitLayer, StoreError,
};

fn layer(store: RedisStore, limit: u64, window: Duration, clock: &ManualClock) -> RateLimitLayer {
    RateLimitLayer::builder()
        .quota(Quota::new(limit, window).unwrap())
        .key(Header::try_new("x-client").unwrap())
        .store(store)
        .clock(clock.clone())
        .store_timeout(Duration::from_secs(2))
        .on_store_error(OnStoreError::FailClosed)
        // Every request goes to Redis here; tests/redis_faults.rs covers the deny cache.
        .deny_cache(DenyCache::disabled())
        .build()
        .unwrap()
}

/// Polls `cond` until it holds or `within` passes (for effects of spawned work, e.g. refunds).
async fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn script_calls(server: &RedisServer) -> u64 {
    server.command_calls("evalsha") + server.command_calls("eval")
}

/// Commands clients sent (not the ones scripts ran inside Redis, nor the
/// test's own `INFO`/`ECHO`), by name.
fn client_commands(entries: &[redis_support::MonitorEntry]) -> Vec<String> {
    entries
        .iter()
        .filter(|e| !e.is_from_script())
        .map(|e| e.command())
        .filter(|c| c != "INFO" && c != "ECHO")
        .collect()
}

#[tokio::test]
async fn one_command_per_allowed_or_rejected_request_and_two_per_refunded_304() {
    require_redis();
    let server = RedisServer::start();
    let clock = ManualClock::new(SystemClock.now_ms());
    let store = RedisStore::new(server.url()).unwrap();
    let warm_key = store.redis_key(&Namespace::new("default"), &Key::new("warmup"));
    let http =
        TestServer::start(app().layer(layer(store, 100, Duration::from_secs(60), &clock))).await;
    let c = HttpClient::new();
    let url = http.url("/");
    // Load the script and open every connection (2 by default), then count from zero.
    for _ in 0..4 {
        c.get_with(&url, &[("x-client", b"warmup")]).await;
    }
    // ... and load the refund script too (its first EVALSHA answers NOSCRIPT).
    c.get_with(&http.url("/not-modified"), &[("x-client", b"warmup")])
        .await;
    // Its refund has landed once the warm-up key is back to 4 units.
    let refunded = || {
        server
            .query::<Option<String>>(&["HGET", &warm_key, "fw60000c"])
            .as_deref()
            == Some("4")
    };
    assert!(eventually(Duration::from_secs(10), refunded).await);
    server.config_resetstat();

    let monitor = server.monitor();
    let mut statuses = [0usize; 2];
    for _ in 0..300 {
        let r = c.get_with(&url, &[("x-client", b"a")]).await;
        statuses[usize::from(r.status == StatusCode::TOO_MANY_REQUESTS)] += 1;
    }
    assert_eq!(statuses, [100, 200]);
    assert_eq!(script_calls(&server), 300);
    let sent = client_commands(&monitor.stop());
    let others: Vec<_> = sent.iter().filter(|c| *c != "EVALSHA").collect();
    assert_eq!(
        sent.len(),
        300,
        "one command per request, no PING, no second read; others: {others:?}"
    );
    assert!(sent.iter().all(|c| c == "EVALSHA"));

    server.config_resetstat();
    let monitor = server.monitor();
    for _ in 0..100 {
        let r = c
            .get_with(&http.url("/not-modified"), &[("x-client", b"b")])
            .await;
        assert_eq!(r.status, StatusCode::NOT_MODIFIED);
        // Refunds land in the background: a 304 sees at most the one in flight
        // before it, and shows its own refund.
        assert!(r.header_u64("x-ratelimit-remaining") >= 99);
    }
    // Refunds run in the background: wait for them, then check none is extra.
    assert!(eventually(Duration::from_secs(10), || script_calls(&server) >= 200).await);
    assert_eq!(script_calls(&server), 200);
    let sent = client_commands(&monitor.stop());
    assert_eq!(sent.len(), 200, "a charge and a refund per 304");
    let r = c.get_with(&url, &[("x-client", b"b")]).await;
    assert_eq!(
        r.header_u64("x-ratelimit-remaining"),
        99,
        "the 304s cost nothing in the end"
    );
    assert_every_key_has_a_ttl(&server);
}

#[test]
fn four_layers_with_their_own_pools_admit_exactly_the_quota_under_64_tasks() {
    require_redis();
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let clock = ManualClock::new(SystemClock.now_ms());
        let quota = 500;
        let calls = Arc::new(AtomicUsize::new(0));
        let apps: Vec<Router> = (0..4)
            .map(|_| {
                let calls = calls.clone();
                let store = RedisStore::new(server.url()).unwrap();
                Router::new()
                    .route(
                        "/",
                        get(move || {
                            calls.fetch_add(1, Ordering::SeqCst);
                            async { "ok" }
                        }),
                    )
                    .layer(layer(store, quota, Duration::from_secs(3600), &clock))
            })
            .collect();
        let admitted = Arc::new(AtomicUsize::new(0));
        let mut tasks = vec![];
        for t in 0..64 {
            let app = apps[t % 4].clone();
            let admitted = admitted.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..20 {
                    let req = http::Request::get("/")
                        .header("x-client", "shared")
                        .body(axum::body::Body::empty())
                        .unwrap();
                    let res = app.clone().oneshot(req).await.unwrap();
                    match res.status() {
                        StatusCode::OK => {
                            admitted.fetch_add(1, Ordering::SeqCst);
                        }
                        StatusCode::TOO_MANY_REQUESTS => {}
                        other => panic!("unexpected {other}"),
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(admitted.load(Ordering::SeqCst), quota as usize);
        assert_eq!(calls.load(Ordering::SeqCst), quota as usize);
    });
    assert_every_key_has_a_ttl(&server);
}

#[tokio::test]
async fn one_reset_per_window_across_second_boundaries_and_rejections_show_zero_and_a_future_reset()
{
    require_redis();
    let server = RedisServer::start();
    // Mid-second, so the window crosses second boundaries.
    let start = SystemClock.now_ms() / 1000 * 1000 + 400;
    let clock = ManualClock::new(start);
    let store = RedisStore::new(server.url()).unwrap();
    let http =
        TestServer::start(app().layer(layer(store, 4, Duration::from_secs(10), &clock))).await;
    let c = HttpClient::new();
    let url = http.url("/");
    let want_reset = (start + 10_000).div_ceil(1000);
    for i in 0..6u64 {
        let r = c.get_with(&url, &[("x-client", b"a")]).await;
        assert_eq!(r.header_u64("x-ratelimit-reset"), want_reset, "request {i}");
        if i < 4 {
            assert_eq!(r.status, StatusCode::OK);
        } else {
            assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(r.header_u64("x-ratelimit-remaining"), 0);
            assert!(r.header_u64("x-ratelimit-reset") * 1000 > clock.now_ms());
            assert!(r.header_u64("retry-after") > 0);
        }
        clock.advance(Duration::from_millis(700));
    }
    assert_every_key_has_a_ttl(&server);
}

fn charge<'a>(
    ns: &'a Namespace,
    key: &'a Key,
    policy: &'a Policy,
    cost: u64,
    now_ms: u64,
) -> Charge<'a> {
    Charge::new(ns, key, policy, now_ms)
        .with_cost(cost)
        .with_timeout(Duration::from_secs(2))
}

#[tokio::test]
async fn a_stale_replica_reports_a_fresh_window_not_the_old_counts() {
    require_redis();
    let primary = RedisServer::start();
    let replica = RedisServer::replica_of(&primary);
    let store = RedisStore::builder(primary.url())
        .replica(replica.url())
        .build()
        .unwrap();
    let ns = Namespace::new("replica");
    let key = Key::new("client");
    let policy = Policy::new(Quota::new(10, Duration::from_secs(60)).unwrap());
    let t0 = SystemClock.now_ms();
    for _ in 0..2 {
        assert!(store
            .charge(&charge(&ns, &key, &policy, 1, t0))
            .await
            .unwrap()
            .is_allowed());
    }
    replica.wait_for_sync(&primary);
    // Detach the replica while the window is open; the primary moves on.
    replica.cmd(&["REPLICAOF", "NO", "ONE"]);
    store
        .charge(&charge(&ns, &key, &policy, 1, t0))
        .await
        .unwrap();
    let seen = store
        .status(&charge(&ns, &key, &policy, 0, t0 + 1))
        .await
        .unwrap();
    assert_eq!(
        seen.statuses()[0].remaining,
        8,
        "status reads the replica (2 used there, 3 on the primary)"
    );

    // The window's reset has passed, but the key's TTL (reset + 1 s, real time) has not.
    let redis_key = store.redis_key(&ns, &key);
    assert!(
        replica.query::<i64>(&["PTTL", &redis_key]) > 0,
        "the stale key is still on the replica"
    );
    let after = store
        .status(&charge(&ns, &key, &policy, 0, t0 + 60_000))
        .await
        .unwrap();
    assert_eq!(
        after.statuses()[0].remaining,
        10,
        "a window past its reset reads as fresh"
    );
    assert_eq!(after.statuses()[0].reset_ms, t0 + 120_000);
    assert_every_key_has_a_ttl(&primary);
}

#[tokio::test]
async fn a_refund_that_arrives_after_its_window_ended_does_not_touch_the_new_window() {
    require_redis();
    let server = RedisServer::start();
    let store = RedisStore::new(server.url()).unwrap();
    let ns = Namespace::new("late-refund");
    let key = Key::new("c");
    let policy = Policy::new(Quota::new(5, Duration::from_secs(1)).unwrap());
    let t0 = SystemClock.now_ms();
    let old = charge(&ns, &key, &policy, 3, t0);
    let old_decision = store.charge(&old).await.unwrap();
    // The next window opens and spends 2.
    let new_decision = store
        .charge(&charge(&ns, &key, &policy, 2, t0 + 1_000))
        .await
        .unwrap();
    assert_eq!(new_decision.statuses()[0].remaining, 3);
    store
        .settle(&Settle::free(
            charge(&ns, &key, &policy, 3, t0 + 1_001),
            &old_decision,
        ))
        .await
        .unwrap();
    let now = store
        .status(&charge(&ns, &key, &policy, 0, t0 + 1_002))
        .await
        .unwrap();
    assert_eq!(
        now.statuses()[0].remaining,
        3,
        "the late refund was not applied to the new window"
    );
    let _ = old;
    assert_every_key_has_a_ttl(&server);
}

#[tokio::test]
async fn script_flush_and_a_restart_on_the_same_port_mid_traffic_recover_by_themselves() {
    require_redis();
    let mut server = RedisServer::start();
    let clock = ManualClock::new(SystemClock.now_ms());
    let store = RedisStore::builder(server.url())
        .connect_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let http =
        TestServer::start(app().layer(layer(store, 1_000_000, Duration::from_secs(3600), &clock)))
            .await;
    let c = HttpClient::new();
    let url = http.url("/");
    let get = || {
        let c = c.clone();
        let url = url.clone();
        async move { c.get_with(&url, &[("x-client", b"a")]).await }
    };
    for _ in 0..20 {
        assert_eq!(get().await.status, StatusCode::OK);
    }
    server.cmd(&["SCRIPT", "FLUSH"]);
    for _ in 0..20 {
        let r = get().await;
        assert_eq!(
            r.status,
            StatusCode::OK,
            "NOSCRIPT is reloaded transparently"
        );
        assert!(r.header("x-ratelimit-remaining").is_some());
    }
    server.restart();
    // Fail-closed while the old connection is found broken, then back by itself.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut unavailable = 0;
    loop {
        let r = get().await;
        if r.status == StatusCode::OK {
            break;
        }
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
        unavailable += 1;
        assert!(Instant::now() < deadline, "did not recover after a restart");
    }
    assert!(
        unavailable <= 3,
        "{unavailable} requests failed after the restart"
    );
    for _ in 0..20 {
        let r = get().await;
        assert_eq!(r.status, StatusCode::OK);
        assert!(r.header("x-ratelimit-remaining").is_some());
    }
    assert_every_key_has_a_ttl(&server);
}

#[tokio::test]
async fn calls_dropped_mid_flight_never_answer_later_calls() {
    require_redis();
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .connections(1)
        .build()
        .unwrap();
    let clock = ManualClock::new(SystemClock.now_ms());
    let limited = ServiceBuilder::new()
        // The client gives up long before the store would.
        .timeout(Duration::from_millis(20))
        .layer(layer(store.clone(), 100, Duration::from_secs(60), &clock))
        .service(app());
    // Warm up: the script is loaded and the connection open.
    let req = |k: &str| {
        http::Request::get("/")
            .header("x-client", k)
            .body(axum::body::Body::empty())
            .unwrap()
    };
    assert!(limited.clone().oneshot(req("warm")).await.is_ok());

    // Redis stalls (CLIENT PAUSE answers at once, then holds every command);
    // every call in flight is dropped by the timeout.
    server.cmd(&["CLIENT", "PAUSE", "500", "ALL"]);
    let mut dropped = 0;
    for i in 0..50 {
        if limited
            .clone()
            .oneshot(req(&format!("dropped{i}")))
            .await
            .is_err()
        {
            dropped += 1;
        }
    }
    assert!(dropped >= 10, "only {dropped} calls were cut off");

    // 1,000 calls on distinct keys: each reply must be its own (its time and window).
    let ns = Namespace::new("cancel");
    let t0 = SystemClock.now_ms();
    let mut calls = vec![];
    for i in 0..1_000u64 {
        let store = store.clone();
        let ns = ns.clone();
        calls.push(tokio::spawn(async move {
            let key = Key::new(i.to_le_bytes());
            let policy = Policy::new(Quota::new(5, Duration::from_millis(60_000 + i)).unwrap());
            let d = store
                .charge(&charge(&ns, &key, &policy, 1, t0 + i))
                .await
                .unwrap();
            (i, d)
        }));
    }
    for c in calls {
        let (i, d) = c.await.unwrap();
        let s = d.statuses()[0];
        assert!(d.is_allowed());
        assert_eq!(
            s.reset_ms,
            t0 + i + 60_000 + i,
            "call {i} got another call's reply"
        );
        assert_eq!(s.remaining, 4);
    }
    assert_every_key_has_a_ttl(&server);
}

#[tokio::test]
async fn a_service_starts_with_redis_down_and_answers_per_its_failure_policy() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let clock = ManualClock::new(SystemClock.now_ms());
    for (policy, want) in [
        (OnStoreError::FailOpen, StatusCode::OK),
        (OnStoreError::FailClosed, StatusCode::SERVICE_UNAVAILABLE),
    ] {
        let store = RedisStore::new(url.clone()).unwrap();
        let l = RateLimitLayer::builder()
            .quota(Quota::new(1, Duration::from_secs(60)).unwrap())
            .store(store)
            .clock(clock.clone())
            .on_store_error(policy)
            .build()
            .unwrap();
        let http = TestServer::start(app().layer(l)).await;
        let c = HttpClient::new();
        for _ in 0..3 {
            let r = c.get(&http.url("/")).await;
            assert_eq!(r.status, want, "{policy:?}");
            assert!(r.header("x-ratelimit-remaining").is_none());
            if want == StatusCode::SERVICE_UNAVAILABLE {
                assert!(r.header_u64("retry-after") >= 1);
            }
        }
    }
}

#[tokio::test]
async fn redis_time_mode_takes_time_from_redis_not_the_application() {
    require_redis();
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .time_source(TimeSource::Redis)
        .build()
        .unwrap();
    let ns = Namespace::new("redis-time");
    let key = Key::new("c");
    let policy = Policy::new(Quota::new(5, Duration::from_secs(60)).unwrap());
    let real = SystemClock.now_ms();
    // The application's clock is a year off; Redis decides.
    let d = store
        .charge(&charge(&ns, &key, &policy, 1, 1_000))
        .await
        .unwrap();
    let reset = d.statuses()[0].reset_ms;
    assert!(
        reset >= real + 59_000 && reset <= real + 61_000 + 5_000,
        "reset {reset} vs real {real}"
    );
    assert_every_key_has_a_ttl(&server);
}

#[tokio::test]
async fn an_evicting_redis_is_reported_and_refused_in_strict_mode() {
    require_redis();
    let server =
        RedisServer::start_with(&["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"]);
    let warn = RedisStore::builder(server.url())
        .eviction_check(EvictionCheck::Warn)
        .build()
        .unwrap();
    assert_eq!(warn.eviction_policy().await.unwrap(), "allkeys-lru");
    let ns = Namespace::new("evict");
    let key = Key::new("c");
    let policy = Policy::new(Quota::new(5, Duration::from_secs(60)).unwrap());
    let now = SystemClock.now_ms();
    assert!(warn
        .charge(&charge(&ns, &key, &policy, 1, now))
        .await
        .unwrap()
        .is_allowed());
    let strict = RedisStore::builder(server.url())
        .eviction_check(EvictionCheck::Refuse)
        .build()
        .unwrap();
    match strict.charge(&charge(&ns, &key, &policy, 1, now)).await {
        Err(StoreError::Unavailable(msg)) => assert!(msg.contains("noeviction"), "{msg}"),
        other => panic!("strict mode used an evicting Redis: {other:?}"),
    }
}

/// Bytes Redis sent clients while `f` ran, less what one `INFO stats` reply
/// (the measurement's own) takes.
fn bytes_sent(server: &RedisServer, f: impl FnOnce()) -> i64 {
    let out = || -> i64 {
        server.info_section("stats")["total_net_output_bytes"]
            .parse()
            .unwrap()
    };
    let (a, b) = (out(), out());
    let info = b - a;
    f();
    out() - b - info
}

/// A sliding log holding 10,000 entries (10,000 per hour, one per ms), then
/// the calls that used to walk it page by page and send it back: a
/// rejection at a cost of 10,000, a rejection after the limit was lowered
/// to 100, and a status read. Each now costs Redis under a millisecond and
/// answers under a kilobyte, and each decides as the memory store does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_sliding_log_costs_a_bounded_call_and_a_small_reply_for_every_rejection_and_read() {
    require_redis();
    let server = RedisServer::start();
    let redis = RedisStore::new(server.url()).unwrap();
    let memory = tower_ratelimit::store::MemoryStore::new();
    let (ns, key) = (Namespace::new("full-log"), Key::new("client"));
    let log = |limit| {
        Policy::new(
            Quota::new(limit, Duration::from_secs(3600))
                .unwrap()
                .with_algorithm(tower_ratelimit::Algorithm::SlidingLog)
                .unwrap(),
        )
    };
    let full = log(10_000);
    let t0 = SystemClock.now_ms();
    let call = |policy, cost, now_ms| {
        Charge::new(&ns, &key, policy, now_ms)
            .with_cost(cost)
            .with_timeout(Duration::from_secs(5))
    };
    for chunk in (0..10_000u64).collect::<Vec<_>>().chunks(500) {
        let calls: Vec<_> = chunk.iter().map(|i| call(&full, 1, t0 + i)).collect();
        for d in futures_util::future::join_all(calls.iter().map(|c| redis.charge(c))).await {
            assert!(d.unwrap().is_allowed());
        }
        for c in &calls {
            assert!(memory.charge(c).await.unwrap().is_allowed());
        }
    }
    let now = t0 + 10_000;
    // The status script loaded (a first call meets NOSCRIPT and loads it).
    let other = Key::new("other");
    redis
        .status(
            &Charge::new(&ns, &other, &full, now)
                .with_cost(0)
                .with_timeout(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    let lowered = log(100);
    for (what, policy, cost) in [
        ("a rejection at a cost of 10,000", &full, 10_000),
        (
            "a rejection after the limit was lowered to 100",
            &lowered,
            1,
        ),
        ("a status read", &full, 0),
    ] {
        server.config_resetstat();
        let status = what == "a status read";
        let c = call(policy, cost, now);
        let mut from_redis = None;
        let sent = bytes_sent(&server, || {
            from_redis = Some(tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(async {
                    if status {
                        redis.status(&c).await
                    } else {
                        redis.charge(&c).await
                    }
                })
            }));
        });
        let from_redis = from_redis.unwrap().unwrap();
        let from_memory = match status {
            true => memory.status(&c).await,
            false => memory.charge(&c).await,
        }
        .unwrap();
        assert_eq!(
            from_redis, from_memory,
            "{what}: as the memory store decides"
        );
        assert_eq!(from_redis.is_allowed(), status, "{what}");
        let stats = server.command_stats("evalsha").unwrap();
        let usec = stats.usec / stats.calls.max(1);
        println!("{what}: {usec} µs of Redis time, a {sent}-byte reply");
        assert_eq!(stats.calls, 1, "{what}");
        assert!(usec < 1_000, "{what}: {usec} µs");
        assert!(sent < 1_024, "{what}: {sent} bytes");
    }
}
