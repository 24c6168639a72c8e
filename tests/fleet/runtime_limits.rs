//! Limits changed at runtime. In one process, through `oneshot`: an
//! override or a new default applies at once to every clone of the layer,
//! removing it restores what was configured, and a bad change is refused
//! whole. Across a fleet, on the built demo as a black box against a real
//! `redis-server`: two instances on one Redis, changed through either
//! one's admin interface, enforce the change within 2 s, keep it across a
//! restart, and answer a malformed override 400 without changing anything.

use crate::support::admin;
use crate::support::example;
use crate::support::http as http_support;
use crate::support::redis as redis_support;

use crate::support::recorder;
use admin::Admin;
use bytes::Bytes;
use example::Running;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Empty;
use http_support::HttpClient;
use redis_support::{require_redis, RedisServer};
use std::convert::Infallible;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_ratelimit::key::{Header, Key};
use tower_ratelimit::rate::{LimitsError, MAX_OVERRIDE_KEY_LEN};
use tower_ratelimit::{Policy, Quota, RateLimitLayer};

fn layer() -> RateLimitLayer {
    RateLimitLayer::builder()
        .quota(Quota::per_hour(NonZeroU32::new(2).unwrap()))
        .key(Header::try_new("x-tenant").unwrap())
        .build()
        .unwrap()
}

/// [`layer`]'s limit, with its state in `redis` (and so a deny cache).
fn on_redis(redis: &RedisServer) -> RateLimitLayer {
    RateLimitLayer::builder()
        .quota(Quota::per_hour(NonZeroU32::new(2).unwrap()))
        .key(Header::try_new("x-tenant").unwrap())
        .store(tower_ratelimit::store::RedisStore::new(redis.url()).unwrap())
        .build()
        .unwrap()
}

fn policy(text: &str) -> Policy {
    text.parse().unwrap()
}

/// The handler behind the layer.
async fn ok(_: Request<Empty<Bytes>>) -> Result<Response<Empty<Bytes>>, Infallible> {
    Ok(Response::new(Empty::new()))
}

/// One request of `tenant` through `svc`: its status and `x-ratelimit-limit`.
async fn call<S>(svc: &mut S, tenant: &str) -> (StatusCode, String)
where
    S: Service<
        Request<Empty<Bytes>>,
        Response = Response<tower_ratelimit::body::ResponseBody<Empty<Bytes>>>,
    >,
    S::Error: std::fmt::Debug,
{
    let req = Request::builder()
        .header("x-tenant", tenant)
        .body(Empty::new())
        .unwrap();
    let res = svc.ready().await.unwrap().call(req).await.unwrap();
    let limit = res.headers()["x-ratelimit-limit"]
        .to_str()
        .unwrap()
        .to_owned();
    (res.status(), limit)
}

/// Statuses of `n` requests of `tenant`, alternating between two clones.
async fn statuses(layer: &RateLimitLayer, tenant: &str, n: usize) -> Vec<(StatusCode, String)> {
    let mut a = layer.clone().layer(service_fn(ok));
    let mut b = layer.clone().layer(service_fn(ok));
    let mut out = Vec::new();
    for i in 0..n {
        let svc = if i % 2 == 0 { &mut a } else { &mut b };
        out.push(call(svc, tenant).await);
    }
    out
}

fn ok_then_429(admitted: usize, total: usize, limit: &str) -> Vec<(StatusCode, String)> {
    (0..total)
        .map(|i| {
            let status = if i < admitted {
                StatusCode::OK
            } else {
                StatusCode::TOO_MANY_REQUESTS
            };
            (status, limit.to_owned())
        })
        .collect()
}

#[tokio::test]
async fn an_override_applies_at_once_to_every_clone_and_removing_it_restores_the_default() {
    let layer = layer();
    let limits = layer.limits();
    limits.set("acme", policy("5/1h")).await.unwrap();
    assert_eq!(statuses(&layer, "acme", 6).await, ok_then_429(5, 6, "5"));
    assert_eq!(
        statuses(&layer, "other", 3).await,
        ok_then_429(2, 3, "2"),
        "a key without an override keeps the configured policy"
    );
    assert!(limits.remove("acme").await.unwrap());
    assert!(
        !limits.remove("acme").await.unwrap(),
        "nothing left to remove"
    );
    // Back on the configured 2 an hour, in the same window: 5 spent already.
    assert_eq!(statuses(&layer, "acme", 1).await, ok_then_429(0, 1, "2"));
    assert!(limits.overrides().is_empty());
}

#[tokio::test]
async fn a_new_default_applies_to_keys_without_an_override_and_reset_restores_the_configured_one() {
    let layer = layer();
    let limits = layer.limits();
    limits.set_default(policy("3/1m")).await.unwrap();
    limits.set("vip", policy("4/1m")).await.unwrap();
    assert_eq!(statuses(&layer, "a", 4).await, ok_then_429(3, 4, "3"));
    assert_eq!(statuses(&layer, "vip", 5).await, ok_then_429(4, 5, "4"));
    assert_eq!(limits.default_policy(), Some(policy("3/1m")));
    limits.reset_default().await.unwrap();
    assert_eq!(limits.default_policy(), None);
    assert_eq!(statuses(&layer, "b", 3).await, ok_then_429(2, 3, "2"));
    assert_eq!(
        statuses(&layer, "vip", 1).await,
        ok_then_429(0, 1, "4"),
        "the override outlives the default"
    );
}

#[tokio::test]
async fn an_async_key_and_a_status_read_find_the_override() {
    let layer = RateLimitLayer::builder()
        .quota(Quota::per_hour(NonZeroU32::new(2).unwrap()))
        .key_async(|parts| {
            let tenant = parts
                .headers
                .get("x-tenant")
                .map(|v| Key::new(v.as_bytes()));
            async move { Ok(tenant) }
        })
        .build()
        .unwrap();
    layer.limits().set("acme", policy("3/1h")).await.unwrap();
    assert_eq!(statuses(&layer, "acme", 4).await, ok_then_429(3, 4, "3"));
    let (parts, ()) = Request::builder()
        .header("x-tenant", "acme")
        .body(())
        .unwrap()
        .into_parts();
    let status = layer.status(&parts).await.unwrap().unwrap();
    assert_eq!(status.policy, policy("3/1h"));
}

#[tokio::test]
async fn a_bad_change_is_refused_whole_and_changes_nothing() {
    let layer = layer();
    let limits = layer.limits();
    limits.set("acme", policy("5/1h")).await.unwrap();
    let long = "k".repeat(MAX_OVERRIDE_KEY_LEN + 1);
    for (key, why) in [("", "1 to 256 bytes"), (long.as_str(), "1 to 256 bytes")] {
        match limits.set(key, policy("9/1h")).await {
            Err(LimitsError::Invalid(e)) => assert!(e.to_string().contains(why), "{e}"),
            other => panic!("{key:?}: {other:?}"),
        }
    }
    assert_eq!(
        limits.overrides(),
        vec![("acme".to_owned(), policy("5/1h"))]
    );
    assert_eq!(statuses(&layer, "acme", 6).await, ok_then_429(5, 6, "5"));
}

#[tokio::test]
async fn the_coordinated_mode_refuses_a_runtime_quota_in_another_unit() {
    use tower_ratelimit::store::{Coordinated, RedisStore};
    let store = Coordinated::builder(RedisStore::new("redis://127.0.0.1:1").unwrap())
        .manual_sync()
        .build()
        .unwrap();
    let layer = RateLimitLayer::builder()
        .quota(Quota::per_second(NonZeroU32::new(10).unwrap()))
        .store(store)
        .build()
        .unwrap();
    let tokens = policy("1000/1m unit=tokens");
    let err = layer.limits().set("acme", tokens).await.unwrap_err();
    assert!(err.to_string().contains("counts requests"), "{err}");
    assert!(layer.limits().overrides().is_empty());
}

// The fleet: two demo instances on one Redis.

/// A demo instance on `redis` with the admin interface, and the token it
/// printed for that interface.
fn instance(redis: &str) -> (Running, Admin) {
    let demo = Running::start(
        "demo",
        &[
            "--listen",
            "127.0.0.1:0",
            "--store",
            "redis",
            "--redis-url",
            redis,
            "--limit",
            "100",
            "--window",
            "1h",
            "--key",
            "header:x-client",
            "--store-timeout",
            "2s",
            "--admin-listen",
            "127.0.0.1:0",
        ],
    );
    let admin = Admin::printed(&demo);
    (demo, admin)
}

/// The `limit` a demo's `GET /rate_limit` reports for `client` (not charged).
async fn limit_of(c: &HttpClient, demo: &Running, client: &str) -> u64 {
    let r = c
        .get_with(&demo.url("/rate_limit"), &[("x-client", client.as_bytes())])
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let at = r.body.find(r#""limit":"#).expect("a limit") + 8;
    let digits: String = r.body[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap()
}

/// How long until `demo` reports `want` as `client`'s limit; panics past 2 s.
async fn applied_within_2s(c: &HttpClient, demo: &Running, client: &str, want: u64) -> Duration {
    let start = Instant::now();
    loop {
        if limit_of(c, demo, client).await == want {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{client}'s limit is not {want} after 2 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn overrides_set_on_one_instance_hold_for_the_fleet_within_2s_and_across_a_restart() {
    require_redis();
    let redis = RedisServer::start();
    let url = redis.url();
    let c = HttpClient::new();
    let (a, admin_a) = instance(&url);
    let (b, admin_b) = instance(&url);
    assert_eq!(limit_of(&c, &b, "alice").await, 100);

    let put = admin_a.send(Method::PUT, "/limits/alice", "2/1h").await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.body);
    assert_eq!(
        limit_of(&c, &a, "alice").await,
        2,
        "at once where it was set"
    );
    let took = applied_within_2s(&c, &b, "alice", 2).await;
    println!("the override reached the other instance in {took:?}");
    // One count for the fleet: two requests over both, then 429 on either.
    let h: &[(&str, &[u8])] = &[("x-client", b"alice")];
    let mut got = Vec::new();
    for demo in [&a, &b, &a, &b] {
        got.push(c.get_with(&demo.url("/"), h).await.status);
    }
    assert_eq!(
        got,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert_eq!(
        limit_of(&c, &a, "bob").await,
        100,
        "other keys keep the default"
    );

    // Removed through the other instance: the default again, everywhere.
    let del = admin_b.send(Method::DELETE, "/limits/alice", "").await;
    assert_eq!(del.status, StatusCode::NO_CONTENT, "{}", del.body);
    applied_within_2s(&c, &a, "alice", 100).await;
    let again = admin_b.send(Method::DELETE, "/limits/alice", "").await;
    assert_eq!(again.status, StatusCode::NOT_FOUND);

    // A malformed override: 400, and nothing changes anywhere.
    let put = admin_a.send(Method::PUT, "/limits/carol", "7/1h").await;
    assert_eq!(put.status, StatusCode::OK);
    let before = admin_a.get("/limits").await.body;
    for bad in ["abc", "0/1m", "10/1s fast", "10/1s, 20/1s", ""] {
        let r = admin_a.send(Method::PUT, "/limits/carol", bad).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad:?}: {}", r.body);
    }
    let long = "k".repeat(MAX_OVERRIDE_KEY_LEN + 1);
    let r = admin_a
        .send(Method::PUT, &format!("/limits/{long}"), "5/1h")
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert_eq!(admin_a.get("/limits").await.body, before);
    assert_eq!(
        before,
        r#"{"default":null,"shadow":null,"overrides":{"carol":"7/1h"}}"#
    );
    applied_within_2s(&c, &b, "carol", 7).await;

    // A restarted instance starts with the fleet's overrides.
    assert!(b.terminate().success());
    let (b, admin_b) = instance(&url);
    assert_eq!(limit_of(&c, &b, "carol").await, 7, "before its first poll");
    assert_eq!(
        admin_b.get("/limits").await.body,
        before,
        "the restarted instance lists the same overrides"
    );

    // A policy in shadow, set through one instance, promoted through the
    // other: the default for every key without an override.
    let put = admin_a.send(Method::PUT, "/shadow", "50/1h").await;
    assert_eq!(put.status, StatusCode::NO_CONTENT, "{}", put.body);
    let bad = admin_a.send(Method::PUT, "/shadow", "50 an hour").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let promoted = admin_b.send(Method::POST, "/shadow/promote", "").await;
    assert_eq!(promoted.status, StatusCode::NO_CONTENT, "{}", promoted.body);
    applied_within_2s(&c, &a, "dave", 50).await;
    assert_eq!(limit_of(&c, &b, "dave").await, 50);
    assert_eq!(limit_of(&c, &a, "carol").await, 7, "overrides stay");
    let again = admin_a.send(Method::POST, "/shadow/promote", "").await;
    assert_eq!(again.status, StatusCode::NOT_FOUND);
    assert!(a.terminate().success());
    assert!(b.terminate().success());
}

#[tokio::test]
async fn raising_a_limit_lifts_the_rejections_the_deny_cache_holds() {
    require_redis();
    let redis = RedisServer::start();
    let layer = on_redis(&redis);
    // The third is rejected by Redis, the fourth by the deny cache.
    assert_eq!(statuses(&layer, "acme", 4).await, ok_then_429(2, 4, "2"));
    layer.limits().set("acme", policy("5/1h")).await.unwrap();
    assert_eq!(
        statuses(&layer, "acme", 4).await,
        ok_then_429(3, 4, "5"),
        "3 more of 5: the cached rejection is gone"
    );
}

#[tokio::test]
async fn a_change_redis_cannot_take_is_refused_and_nothing_changes() {
    use tower_ratelimit::rate::SharedLimits;
    use tower_ratelimit::store::RedisStore;
    // Nothing listens on port 1.
    let store = RedisStore::new("redis://127.0.0.1:1").unwrap();
    let layer = RateLimitLayer::builder()
        .quota(Quota::per_hour(NonZeroU32::new(2).unwrap()))
        .key(Header::try_new("x-tenant").unwrap())
        .shared_limits(SharedLimits::new(store).timeout(Duration::from_millis(200)))
        .build()
        .unwrap();
    let limits = layer.limits();
    match limits.set("acme", policy("5/1h")).await {
        Err(LimitsError::Store(_)) => {}
        other => panic!("{other:?}"),
    }
    assert!(limits.overrides().is_empty());
    assert_eq!(statuses(&layer, "acme", 3).await, ok_then_429(2, 3, "2"));
}

/// The would-be rejections counted for `limiter`'s shadow `policy` since
/// the last read (a read resets them).
fn shadow_rejections(limiter: &str, policy: &str) -> u64 {
    recorder::take(limiter)
        .into_iter()
        .filter(|(k, ..)| {
            let key = k.key();
            key.name() == "ratelimit_shadow_policy_rejections_total"
                && key
                    .labels()
                    .any(|l| l.key() == "limiter" && l.value() == limiter)
                && key
                    .labels()
                    .any(|l| l.key() == "policy" && l.value() == policy)
        })
        .map(|(.., v)| match v {
            metrics_util::debugging::DebugValue::Counter(n) => n,
            other => panic!("{other:?}"),
        })
        .sum()
}

#[tokio::test]
async fn a_policy_in_shadow_counts_its_would_be_rejections_and_is_promoted_whole() {
    recorder::install();
    let layer = RateLimitLayer::builder()
        .name("shadowed")
        .quota(Quota::per_hour(NonZeroU32::new(2).unwrap()))
        .key(Header::try_new("x-tenant").unwrap())
        .build()
        .unwrap();
    let limits = layer.limits();
    limits.shadow(policy("1/1h")).await.unwrap();
    limits.set("vip", policy("9/1h")).await.unwrap();
    assert_eq!(
        statuses(&layer, "a", 3).await,
        ok_then_429(2, 3, "2"),
        "the enforced policy alone decides"
    );
    assert_eq!(statuses(&layer, "vip", 2).await, ok_then_429(2, 2, "9"));
    assert_eq!(
        shadow_rejections("shadowed", "1/1h"),
        2,
        "a's 2nd and 3rd; keys with an override are not shadowed"
    );

    assert!(limits.promote().await.unwrap());
    assert_eq!(limits.default_policy(), Some(policy("1/1h")));
    assert_eq!(limits.shadow_policy(), None);
    assert_eq!(statuses(&layer, "b", 2).await, ok_then_429(1, 2, "1"));
    assert_eq!(
        shadow_rejections("shadowed", "1/1h"),
        0,
        "no shadow runs now"
    );
    assert!(!limits.promote().await.unwrap(), "nothing left to promote");
    assert_eq!(limits.default_policy(), Some(policy("1/1h")));
}

#[tokio::test]
async fn a_shadow_set_on_one_instance_is_promoted_from_another_through_redis() {
    use tower_ratelimit::rate::SharedLimits;
    use tower_ratelimit::store::RedisStore;
    require_redis();
    let redis = RedisServer::start();
    let instance = || {
        let store = RedisStore::new(redis.url()).unwrap();
        RateLimitLayer::builder()
            .quota(Quota::per_hour(NonZeroU32::new(2).unwrap()))
            .key(Header::try_new("x-tenant").unwrap())
            .store(store.clone())
            .shared_limits(SharedLimits::new(store))
            .build()
            .unwrap()
    };
    let (a, b) = (instance(), instance());
    a.limits().shadow(policy("5/1h")).await.unwrap();
    b.limits().refresh().await.unwrap();
    assert_eq!(b.limits().shadow_policy(), Some(policy("5/1h")));
    assert!(b.limits().promote().await.unwrap());
    a.limits().refresh().await.unwrap();
    assert_eq!(a.limits().default_policy(), Some(policy("5/1h")));
    assert_eq!(a.limits().shadow_policy(), None);
    assert_eq!(statuses(&a, "acme", 6).await, ok_then_429(5, 6, "5"));
}

#[tokio::test]
async fn a_rejection_decided_under_limits_changed_meanwhile_is_not_cached() {
    require_redis();
    let redis = RedisServer::start();
    let layer = on_redis(&redis);
    let mut svc = layer.clone().layer(service_fn(ok));
    assert_eq!(statuses(&layer, "acme", 2).await, ok_then_429(2, 2, "2"));
    let req = || {
        Request::builder()
            .header("x-tenant", "acme")
            .body(Empty::<Bytes>::new())
            .unwrap()
    };
    // The third is charged under 2 an hour; the limit is raised while its
    // answer is on the way, and a fourth is charged under the new one
    // before the third's rejection comes back.
    let third = svc.ready().await.unwrap().call(req());
    layer.limits().set("acme", policy("5/1h")).await.unwrap();
    let fourth = svc.ready().await.unwrap().call(req());
    assert_eq!(third.await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(fourth.await.unwrap().status(), StatusCode::OK);
    // Were the third's rejection cached, this one would be refused from it.
    assert_eq!(statuses(&layer, "acme", 3).await, ok_then_429(2, 3, "5"));
}

/// More overrides in Redis than a layer takes (written by hand, or by
/// another version): the layer reads at most `MAX_OVERRIDES` of them, as it
/// holds a change to, and the rest are left out.
#[tokio::test]
async fn shared_limits_read_from_redis_hold_at_most_max_overrides() {
    use tower_ratelimit::rate::{SharedLimits, MAX_OVERRIDES};
    use tower_ratelimit::store::{Namespace, RedisStore};
    require_redis();
    let redis = RedisServer::start();
    let store = RedisStore::new(redis.url()).unwrap();
    let hash = format!(
        "{}:limits",
        store.redis_key(&Namespace::new("default"), &Key::composite(&[]))
    );
    let mut hset = vec!["HSET".to_owned(), hash];
    for i in 0..=MAX_OVERRIDES {
        hset.push(format!("key:tenant-{i}"));
        hset.push("3/1h".to_owned());
    }
    assert_eq!(redis.query::<i64>(&hset), MAX_OVERRIDES as i64 + 1);
    let layer = RateLimitLayer::builder()
        .quota(Quota::per_hour(NonZeroU32::new(2).unwrap()))
        .key(Header::try_new("x-tenant").unwrap())
        .store(store.clone())
        .shared_limits(SharedLimits::new(store).timeout(Duration::from_secs(10)))
        .build()
        .unwrap();
    layer.connect().await.unwrap();
    assert_eq!(layer.limits().overrides().len(), MAX_OVERRIDES);
}
