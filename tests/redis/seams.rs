//! The limit holds where two parts meet, against real `redis-server`
//! processes: an application clock seconds off Redis's, a deny cache and
//! several policies for one key, credentials a client invents, a path no
//! route matches, two limiters given one name, shared limits whose keys
//! Redis lost, refunds to evicted state, and debt without end.

use crate::support::http as http_support;
use crate::support::logs;
use crate::support::redis as redis_support;

use crate::support::recorder;
use axum::body::Body;
use axum::{http::StatusCode, routing::get, Router};
use http::{Request, Response};
use http_support::{HttpClient, TestServer};
use metrics_util::debugging::DebugValue;
use redis_support::{assert_every_key_has_a_ttl, require_redis, RedisServer, Value};
use std::collections::{HashMap, HashSet};
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tower::ServiceExt;
use tower_ratelimit::clock::{Clock, ManualClock, SystemClock};
use tower_ratelimit::key::{
    ApiKey, ClientIp, Constant, Header, Key, KeyExtractorExt, MatchedRoute,
};
use tower_ratelimit::rate::SharedLimits;
use tower_ratelimit::store::{Charge, MemoryStore, Namespace, RedisStore, Settle, Store};
use tower_ratelimit::ConcurrencyLimitLayer;
use tower_ratelimit::{
    failure::OnStoreError, rate::DenyCache, Algorithm, Policy, Quota, RateLimitLayer,
};
use tower_ratelimit::{shed::Priority, LoadShedLayer};

/// The five algorithms, each as a quota of 10 per second.
fn ten_per_second() -> Vec<Quota> {
    [
        Algorithm::FixedWindow,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ]
    .into_iter()
    .map(|a| {
        Quota::new(10, Duration::from_secs(1))
            .unwrap()
            .with_algorithm(a)
            .unwrap()
    })
    .collect()
}

/// A clock standing `offset_ms` from Redis's own (frozen there: tests move it).
fn off_redis(server: &RedisServer, offset_ms: i64) -> ManualClock {
    ManualClock::new(server.time_ms().checked_add_signed(offset_ms).unwrap())
}

fn get_with(path: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut b = Request::get(path);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Body::empty()).unwrap()
}

fn header(res: &Response<Body>, name: &str) -> Option<u64> {
    res.headers().get(name)?.to_str().ok()?.parse().ok()
}

/// The gauge `name` of `limiter`, if it was set.
fn gauge(name: &str, limiter: &str) -> Option<f64> {
    recorder::take(limiter).into_iter().find_map(|(k, v)| {
        let ours = k.key().name() == name
            && k.key()
                .labels()
                .any(|l| l.key() == "limiter" && l.value() == limiter);
        match v {
            DebugValue::Gauge(g) if ours => Some(g.into_inner()),
            _ => None,
        }
    })
}

// ---------------------------------------------------------------------------
// Clocks that disagree
// ---------------------------------------------------------------------------

#[tokio::test]
async fn every_algorithm_stays_exact_and_keeps_ttls_with_the_clock_5s_behind_or_ahead_of_redis() {
    require_redis();
    let server = RedisServer::start();
    let store = RedisStore::new(server.url()).unwrap();
    let tokens = Quota::new(100, Duration::from_secs(1))
        .unwrap()
        .with_unit("tokens")
        .unwrap();
    for offset in [-5_000, 5_000] {
        for quota in ten_per_second() {
            let clock = off_redis(&server, offset);
            let ns = Namespace::new(&format!("skew{offset}-{}", quota.algorithm().code()));
            let key = Key::new("client");
            // A quota in tokens beside it, so settlements reach the hash too.
            let policy = Policy::new(quota.clone()).and(tokens.clone()).unwrap();
            let charge = |now_ms| {
                Charge::new(&ns, &key, &policy, now_ms).with_timeout(Duration::from_secs(2))
            };
            let what = format!(
                "{:?} with the clock {offset:+} ms off Redis's",
                quota.algorithm()
            );
            let mut admitted = 0;
            for i in 0..60 {
                let call = charge(clock.now_ms());
                let d = store.charge(&call).await.unwrap();
                if d.is_allowed() {
                    admitted += 1;
                    // Settle some: a refund, a debt of one token, as responses would.
                    let settle = match i % 3 {
                        0 => Settle::free(charge(call.now_ms), &d),
                        1 => Settle::units(charge(call.now_ms), &d, 2, clock.now_ms()),
                        _ => continue,
                    };
                    store.settle(&settle).await.unwrap();
                }
            }
            // Refunds give back what they charged: the two refunded requests
            // per three admitted make room for more, exactly as the memory
            // store counts them.
            let memory = MemoryStore::new();
            let mut expected = 0;
            for i in 0..60 {
                let call = charge(clock.now_ms());
                let d = memory.charge(&call).await.unwrap();
                if d.is_allowed() {
                    expected += 1;
                    let settle = match i % 3 {
                        0 => Settle::free(charge(call.now_ms), &d),
                        1 => Settle::units(charge(call.now_ms), &d, 2, clock.now_ms()),
                        _ => continue,
                    };
                    memory.settle(&settle).await.unwrap();
                }
            }
            assert_eq!(admitted, expected, "{what}: as the memory store decides");
            assert!(admitted < 60, "{what}: {admitted} of 60 admitted");
            // The state is still there: the next charge is still refused.
            assert!(
                !store
                    .charge(&charge(clock.now_ms()))
                    .await
                    .unwrap()
                    .is_allowed(),
                "{what}: the state was kept"
            );
            // A window later (by the layer's clock), the quota is back.
            clock.advance(Duration::from_secs(2));
            assert!(
                store
                    .charge(&charge(clock.now_ms()))
                    .await
                    .unwrap()
                    .is_allowed(),
                "{what}: the quota is back a window later"
            );
            // Every key has a TTL, and none outlives its state: two
            // windows (a sliding window's) plus the second of margin.
            assert_every_key_has_a_ttl(&server);
            for (k, ttl) in server.ttls() {
                assert!(ttl <= 3_000, "{what}: {k} has a TTL of {ttl} ms");
            }
            server.flushall();
        }
    }
}

#[tokio::test]
async fn a_concurrency_slot_or_fleet_slot_outlives_no_lease_and_loses_none_to_a_clock_10s_ahead() {
    require_redis();
    let server = RedisServer::start();
    let (behind, ahead) = (off_redis(&server, -5_000), off_redis(&server, 5_000));
    let concurrency = |clock: &ManualClock| {
        ConcurrencyLimitLayer::builder()
            .name("skewed-concurrency")
            .limit(2)
            .key(Constant::new("one"))
            .store(RedisStore::new(server.url()).unwrap())
            .clock(clock.clone())
            .lease(Duration::from_secs(2))
            .store_timeout(Duration::from_secs(1))
            .on_store_error(OnStoreError::FailClosed)
            .build()
            .unwrap()
    };
    let shed = |clock: &ManualClock| {
        LoadShedLayer::builder()
            .name("skewed-shed")
            .fleet_capacity(2)
            .classify(|_| Priority::Critical)
            .store(RedisStore::new(server.url()).unwrap())
            .clock(clock.clone())
            .lease(Duration::from_secs(2))
            .store_timeout(Duration::from_secs(1))
            .build()
            .unwrap()
    };
    let app = || Router::new().route("/", get(|| async { "ok" }));
    let (a, b) = (
        app().layer(concurrency(&behind)),
        app().layer(concurrency(&ahead)),
    );
    let (fa, fb) = (app().layer(shed(&behind)), app().layer(shed(&ahead)));
    // The instance 5 s behind takes both slots (its responses, and so their
    // slots, are held); the one 5 s ahead, whose clock is past those leases'
    // ends by the other's reckoning, must still find them held.
    let mut held = Vec::new();
    for _ in 0..2 {
        let res = a.clone().oneshot(get_with("/", &[])).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        held.push(res);
        let res = fa.clone().oneshot(get_with("/", &[])).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        held.push(res);
    }
    let res = b.clone().oneshot(get_with("/", &[])).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "concurrency");
    let res = fb.clone().oneshot(get_with("/", &[])).await.unwrap();
    assert_eq!(
        res.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "fleet shedder"
    );
    // No slot key outlives its leases (2 s) by more than the margin.
    assert_every_key_has_a_ttl(&server);
    for (k, ttl) in server.ttls() {
        assert!(ttl <= 3_000, "{k} has a TTL of {ttl} ms");
    }
    // Released, the slots serve the other instance.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let c = b
            .clone()
            .oneshot(get_with("/", &[]))
            .await
            .unwrap()
            .status();
        let f = fb
            .clone()
            .oneshot(get_with("/", &[]))
            .await
            .unwrap()
            .status();
        if c == StatusCode::OK && f == StatusCode::OK {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the released slots never freed: {c} {f}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_manual_clock_at_the_epoch_keeps_its_state_in_redis() {
    require_redis();
    let server = RedisServer::start();
    let clock = ManualClock::new(0);
    let layer = RateLimitLayer::builder()
        .name("epoch")
        .quota(Quota::per_second(NonZeroU32::new(2).unwrap()))
        .store(RedisStore::new(server.url()).unwrap())
        .clock(clock.clone())
        .deny_cache(DenyCache::disabled())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let statuses = |n| {
        let app = app.clone();
        async move {
            let mut out = Vec::new();
            for _ in 0..n {
                out.push(
                    app.clone()
                        .oneshot(get_with("/", &[]))
                        .await
                        .unwrap()
                        .status(),
                );
            }
            out
        }
    };
    assert_eq!(statuses(3).await, [200, 200, 429]);
    assert_every_key_has_a_ttl(&server);
    clock.advance(Duration::from_secs(1));
    assert_eq!(statuses(3).await, [200, 200, 429]);
}

#[tokio::test]
async fn the_offset_from_redis_s_clock_is_a_gauge_and_a_warning_naming_it() {
    require_redis();
    recorder::install();
    let server = RedisServer::start();
    for (offset, name, way) in [
        (5_000, "ahead-5s", "ahead of"),
        (-5_000, "behind-5s", "behind"),
    ] {
        let (logs, _guard) = logs::capture();
        let layer = RateLimitLayer::builder()
            .name(name)
            .quota(Quota::per_second(NonZeroU32::new(2).unwrap()))
            .store(RedisStore::new(server.url()).unwrap())
            .clock(off_redis(&server, offset))
            .build()
            .unwrap();
        layer.connect().await.unwrap();
        let seconds = gauge("ratelimit_store_clock_offset_seconds", name).expect("the gauge");
        assert!(
            (seconds - offset as f64 / 1e3).abs() < 0.25,
            "{name}: {seconds} s measured"
        );
        let text = logs.text();
        assert!(text.contains("WARN"), "{text}");
        assert!(text.contains(&format!("ms {way} its store's")), "{text}");
        assert!(text.contains(&format!("limiter={name}")), "{text}");
    }
    // In step with Redis: the gauge, and no warning.
    let (logs, _guard) = logs::capture();
    let layer = RateLimitLayer::builder()
        .name("in-step")
        .quota(Quota::per_second(NonZeroU32::new(2).unwrap()))
        .store(RedisStore::new(server.url()).unwrap())
        .build()
        .unwrap();
    layer.connect().await.unwrap();
    let seconds = gauge("ratelimit_store_clock_offset_seconds", "in-step").expect("the gauge");
    assert!(seconds.abs() < 0.25, "{seconds} s measured");
    assert!(!logs.text().contains("its store's"), "{}", logs.text());
}

// ---------------------------------------------------------------------------
// The deny cache answers only the policy the store refused
// ---------------------------------------------------------------------------

fn two_routes(store: RedisStore, name: &str) -> Router {
    let hour = |n| Policy::new(Quota::per_hour(NonZeroU32::new(n).unwrap()));
    let (login, api) = (hour(2), hour(100));
    let layer = RateLimitLayer::builder()
        .name(name)
        .store(store)
        .key(Constant::new("client"))
        .policy_fn(move |p, _| {
            if p.uri.path() == "/login" {
                login.clone()
            } else {
                api.clone()
            }
        })
        .build()
        .unwrap();
    Router::new()
        .route("/login", get(|| async { "ok" }))
        .route("/api", get(|| async { "ok" }))
        .layer(layer)
}

#[tokio::test]
async fn a_refusal_cached_for_one_route_s_policy_does_not_answer_another_policy_of_the_same_key() {
    require_redis();
    let server = RedisServer::start();
    let app = two_routes(RedisStore::new(server.url()).unwrap(), "two-routes");
    let status = |path: &'static str| {
        let app = app.clone();
        async move { app.oneshot(get_with(path, &[])).await.unwrap() }
    };
    let codes: Vec<u16> = [
        status("/login").await,
        status("/login").await,
        status("/login").await,
    ]
    .iter()
    .map(|r| r.status().as_u16())
    .collect();
    assert_eq!(codes, [200, 200, 429]);
    // The login refusal is cached; /api is another policy with its quota.
    // (Both are hourly fixed windows of one key: they count in one state, so
    // the two logins count against /api's 100 as well; see the `quota` module.)
    let res = status("/api").await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "x-ratelimit-limit"), Some(100));
    assert_eq!(header(&res, "x-ratelimit-remaining"), Some(97));
    let mut admitted = 1;
    loop {
        let res = status("/api").await;
        if res.status() != StatusCode::OK {
            assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(header(&res, "x-ratelimit-limit"), Some(100));
            break;
        }
        admitted += 1;
        assert!(admitted <= 98);
    }
    assert_eq!(admitted, 98, "/api admitted until its own quota ran out");
    // And /login is still refused, from the cache: no script call.
    server.config_resetstat();
    let res = status("/login").await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "x-ratelimit-limit"), Some(2));
    assert_eq!(server.command_calls("evalsha"), 0);
}

#[tokio::test]
async fn a_runtime_override_or_a_new_tier_is_charged_not_answered_from_the_cache() {
    require_redis();
    let server = RedisServer::start();
    let hour = |n| Policy::new(Quota::per_hour(NonZeroU32::new(n).unwrap()));
    // A runtime override of one key.
    let layer = RateLimitLayer::builder()
        .name("override")
        .store(RedisStore::new(server.url()).unwrap())
        .key(Header::try_new("x-client").unwrap())
        .quota(hour(1))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer.clone());
    let send = |app: &Router| {
        let app = app.clone();
        async move {
            app.oneshot(get_with("/", &[("x-client", "acme")]))
                .await
                .unwrap()
        }
    };
    assert_eq!(send(&app).await.status(), StatusCode::OK);
    assert_eq!(send(&app).await.status(), StatusCode::TOO_MANY_REQUESTS);
    layer.limits().set("acme", hour(5)).await.unwrap();
    let res = send(&app).await;
    assert_eq!(res.status(), StatusCode::OK, "charged under the override");
    assert_eq!(header(&res, "x-ratelimit-limit"), Some(5));

    // A tier an async lookup chooses, changed while a refusal is cached.
    let tiers: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    tiers.lock().unwrap().insert("acme".into(), 1);
    let lookup = tiers.clone();
    let layer = RateLimitLayer::builder()
        .name("tiers")
        .store(RedisStore::new(server.url()).unwrap())
        .key(Header::try_new("x-client").unwrap())
        .policy_async(move |_, _| {
            let n = lookup.lock().unwrap()["acme"];
            async move { Ok(hour(n)) }
        })
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    assert_eq!(send(&app).await.status(), StatusCode::OK);
    assert_eq!(send(&app).await.status(), StatusCode::TOO_MANY_REQUESTS);
    tiers.lock().unwrap().insert("acme".into(), 50);
    let res = send(&app).await;
    assert_eq!(res.status(), StatusCode::OK, "charged under the new tier");
    assert_eq!(header(&res, "x-ratelimit-limit"), Some(50));
    assert_eq!(header(&res, "x-ratelimit-remaining"), Some(48));
}

// ---------------------------------------------------------------------------
// Credentials a client invents
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_thousand_invented_bearer_tokens_from_one_address_share_that_address_s_quota() {
    require_redis();
    let server = RedisServer::start();
    // The README's setup: a token your application issued keys its holder;
    // anything else is limited by its address.
    let issued: Arc<HashSet<Vec<u8>>> = Arc::new([b"issued-token".to_vec()].into());
    let layer = RateLimitLayer::builder()
        .name("github-style")
        .quota(Quota::per_hour(NonZeroU32::new(10).unwrap()))
        .key(
            ApiKey::bearer()
                .verify(move |token| issued.contains(token))
                .or(ClientIp::new().trust_private()),
        )
        .store(RedisStore::new(server.url()).unwrap())
        .build()
        .unwrap();
    let http = TestServer::start(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
    .await;
    let c = HttpClient::new();
    let mut admitted = 0;
    for _ in 0..1_000 {
        let token = format!("Bearer {:032x}", fastrand::u128(..));
        let r = c
            .get_with(&http.url("/"), &[("authorization", token.as_bytes())])
            .await;
        match r.status {
            StatusCode::OK => admitted += 1,
            s => assert_eq!(s, StatusCode::TOO_MANY_REQUESTS),
        }
    }
    assert_eq!(admitted, 10, "limited as its address, with one quota");
    assert_eq!(
        server.scan_keys("*").len(),
        1,
        "one Redis key, the address's, and none per invented token"
    );
    // The issued token is its holder's own quota.
    let r = c
        .get_with(&http.url("/"), &[("authorization", b"Bearer issued-token")])
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header_u64("x-ratelimit-remaining"), 9);
    assert_eq!(server.scan_keys("*").len(), 2);
}

// ---------------------------------------------------------------------------
// A path no route matches
// ---------------------------------------------------------------------------

#[tokio::test]
async fn an_unmatched_path_under_router_layer_keyed_by_route_keeps_its_404_and_is_limited_as_one() {
    let layer = RateLimitLayer::builder()
        .name("by-route")
        .quota(Quota::per_minute(NonZeroU32::new(3).unwrap()))
        .key(MatchedRoute)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/users/{id}", get(|| async { "ok" }))
        .layer(layer);
    // oneshot
    let res = app.clone().oneshot(get_with("/nope", &[])).await.unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    assert_eq!(header(&res, "x-ratelimit-remaining"), Some(2));
    // Over TCP: every unmatched path counts as one route, apart from real ones.
    let http = TestServer::start(app).await;
    let c = HttpClient::new();
    for (path, status) in [
        ("/also-nope", StatusCode::NOT_FOUND),
        ("/x/y/z", StatusCode::NOT_FOUND),
        ("/nope-again", StatusCode::TOO_MANY_REQUESTS),
        ("/users/7", StatusCode::OK),
    ] {
        assert_eq!(c.get(&http.url(path)).await.status, status, "{path}");
    }
}

// ---------------------------------------------------------------------------
// One name, one limiter
// ---------------------------------------------------------------------------

#[test]
fn a_second_different_limiter_with_the_same_name_on_one_store_is_refused_naming_it() {
    let per_minute = |n| Quota::per_minute(NonZeroU32::new(n).unwrap());
    let redis = RedisStore::new("redis://127.0.0.1:1").unwrap();
    let login = RateLimitLayer::builder()
        .quota(per_minute(5))
        .store(redis.clone())
        .build()
        .unwrap();
    let err = RateLimitLayer::builder()
        .quota(per_minute(1000))
        .store(redis.clone())
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("`default`"), "{err}");
    assert!(err.to_string().contains("5/1m"), "{err}");
    // Another store of the same Redis and prefix is the same place.
    let again = RedisStore::new("redis://127.0.0.1:1").unwrap();
    assert!(RateLimitLayer::builder()
        .quota(per_minute(1000))
        .store(again)
        .build()
        .is_err());
    // The same limiter built twice, a clone, or another name are fine.
    let _twin = RateLimitLayer::builder()
        .quota(per_minute(5))
        .store(redis.clone())
        .build()
        .unwrap();
    let _clone = login.clone();
    let _api = RateLimitLayer::builder()
        .name("api")
        .quota(per_minute(1000))
        .store(redis.clone())
        .build()
        .unwrap();
    // Limiters of other kinds with the name taken are refused too.
    let err = ConcurrencyLimitLayer::builder()
        .name("api")
        .limit(4)
        .store(redis.clone())
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("`api`"), "{err}");
    assert!(LoadShedLayer::builder()
        .name("api")
        .fleet_capacity(100)
        .store(redis.clone())
        .build()
        .is_err());
    // Two policies chosen per request are two limiters.
    let per_request = || {
        RateLimitLayer::builder()
            .name("tiers")
            .policy_fn(move |_, _| Policy::new(per_minute(5)))
            .store(redis.clone())
            .build()
    };
    let _first = per_request().unwrap();
    assert!(per_request().is_err());
    // Once every clone is gone, the name is free again.
    drop((login, _twin, _clone));
    let _now_free = RateLimitLayer::builder()
        .quota(per_minute(1000))
        .store(redis.clone())
        .build()
        .unwrap();
    // A shadow policy's state lives under a name no user can give.
    assert!(RateLimitLayer::builder()
        .name("api~shadow")
        .quota(per_minute(5))
        .build()
        .is_err());
}

#[tokio::test]
async fn two_clones_of_one_layer_share_its_state() {
    let store = MemoryStore::new();
    let layer = RateLimitLayer::builder()
        .quota(Quota::per_minute(NonZeroU32::new(2).unwrap()))
        .store(store)
        .build()
        .unwrap();
    let a = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer.clone());
    let b = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    assert_eq!(
        a.clone()
            .oneshot(get_with("/", &[]))
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        b.clone()
            .oneshot(get_with("/", &[]))
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(a.oneshot(get_with("/", &[])).await.unwrap().status(), 429);
}

// ---------------------------------------------------------------------------
// Shared limits whose keys Redis lost
// ---------------------------------------------------------------------------

#[tokio::test]
async fn after_a_flushdb_a_change_on_one_instance_is_enforced_by_both_and_they_agree() {
    require_redis();
    let server = RedisServer::start();
    let poll = Duration::from_millis(100);
    let instance = || {
        let store = RedisStore::new(server.url()).unwrap();
        RateLimitLayer::builder()
            .name("shared")
            .quota(Quota::per_hour(NonZeroU32::new(100).unwrap()))
            .key(Header::try_new("x-client").unwrap())
            .store(store.clone())
            .shared_limits(SharedLimits::new(store).poll_interval(poll))
            .build()
            .unwrap()
    };
    let (a, b) = (instance(), instance());
    for l in [&a, &b] {
        l.connect().await.unwrap();
    }
    let per_hour = |n| Policy::new(Quota::per_hour(NonZeroU32::new(n).unwrap()));
    // Some history: the version counter well above 1.
    for n in 1..=5 {
        a.limits().set("acme", per_hour(n)).await.unwrap();
    }
    let agree = |want: Vec<(String, Policy)>| {
        let (a, b) = (a.clone(), b.clone());
        async move {
            let deadline = Instant::now() + poll * 20;
            while a.limits().overrides() != want || b.limits().overrides() != want {
                assert!(
                    Instant::now() < deadline,
                    "a: {:?}, b: {:?}, want {want:?}",
                    a.limits().overrides(),
                    b.limits().overrides()
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    agree(vec![("acme".into(), per_hour(5))]).await;

    assert_eq!(server.cmd(&["FLUSHDB"]), Value::Okay);
    a.limits().set("globex", per_hour(7)).await.unwrap();
    let started = Instant::now();
    agree(vec![("globex".into(), per_hour(7))]).await;
    assert!(started.elapsed() < poll * 4, "{:?}", started.elapsed());
    // Enforced by both.
    for l in [&a, &b] {
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(l.clone());
        let res = app
            .oneshot(get_with("/", &[("x-client", "globex")]))
            .await
            .unwrap();
        assert_eq!(header(&res, "x-ratelimit-limit"), Some(7));
    }
}

// ---------------------------------------------------------------------------
// Refunds to evicted state, and debt
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_sliding_log_refund_after_its_hash_was_evicted_leaves_every_key_a_ttl() {
    require_redis();
    let server = RedisServer::start();
    let store = RedisStore::new(server.url()).unwrap();
    let (ns, key) = (Namespace::new("evicted"), Key::new("client"));
    // In tokens, so a settlement can charge debt as well as give back.
    let policy = Policy::new(
        Quota::per_minute(NonZeroU32::new(10).unwrap())
            .with_algorithm(Algorithm::SlidingLog)
            .unwrap()
            .with_unit("tokens")
            .unwrap(),
    );
    let now = SystemClock.now_ms();
    let call = || {
        Charge::new(&ns, &key, &policy, now)
            .with_cost(3)
            .with_timeout(Duration::from_secs(2))
    };
    let d = store.charge(&call()).await.unwrap();
    assert!(d.is_allowed());
    // The hash evicted, its log left.
    server.cmd(&["DEL", &store.redis_key(&ns, &key)]);
    store.settle(&Settle::free(call(), &d)).await.unwrap();
    assert_every_key_has_a_ttl(&server);
    // Every path: a debt after the eviction too.
    let d = store.charge(&call()).await.unwrap();
    server.cmd(&["DEL", &store.redis_key(&ns, &key)]);
    store
        .settle(&Settle::units(call(), &d, 9, now))
        .await
        .unwrap();
    assert_every_key_has_a_ttl(&server);
}

#[tokio::test]
async fn a_settlement_of_u64_max_is_one_full_bucket_of_debt_at_most() {
    require_redis();
    let server = RedisServer::start();
    let redis = RedisStore::new(server.url()).unwrap();
    let memory = MemoryStore::new();
    for algorithm in [Algorithm::TokenBucket, Algorithm::Gcra] {
        let tokens = Quota::new(10, Duration::from_secs(1))
            .unwrap()
            .with_algorithm(algorithm)
            .unwrap()
            .with_unit("tokens")
            .unwrap();
        let policy = Policy::new(tokens);
        let (ns, key) = (
            Namespace::new(&format!("debt-{}", algorithm.code())),
            Key::new("k"),
        );
        let now = SystemClock.now_ms();
        let call =
            |now_ms| Charge::new(&ns, &key, &policy, now_ms).with_timeout(Duration::from_secs(2));
        for store in [&redis as &dyn Store, &memory] {
            let d = store.charge(&call(now)).await.unwrap();
            assert!(d.is_allowed());
            store
                .settle(&Settle::units(call(now), &d, u64::MAX, now))
                .await
                .unwrap();
            let d = store.charge(&call(now)).await.unwrap();
            assert!(!d.is_allowed());
            // One full bucket (10 tokens, a second to refill) below empty,
            // then the token asked: 1.1 s.
            assert_eq!(d.retry_after_ms(), 1_100, "{algorithm:?}");
            assert!(!store.charge(&call(now + 1_099)).await.unwrap().is_allowed());
            assert!(store.charge(&call(now + 1_100)).await.unwrap().is_allowed());
        }
        let ttl = server.query::<i64>(&["PTTL", &redis.redis_key(&ns, &key)]);
        assert!(
            (1_000..=3_100).contains(&ttl),
            "{algorithm:?}: a TTL to match the debt, {ttl} ms"
        );
    }
}
