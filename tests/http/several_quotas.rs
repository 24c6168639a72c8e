//! Several quotas on one request (a per-second token bucket and an hourly
//! sliding log), charged all or nothing in one store call: when the hourly
//! quota rejects, the per-second quota is left exactly as it was — through
//! the memory store and a real Redis, in one Redis command per request.

use crate::support::redis as redis_support;

use axum::{body::Body, routing::get, Router};
use http::{Request, StatusCode};
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;
use tower_ratelimit::clock::{Clock, ManualClock, SystemClock};
use tower_ratelimit::key::{Header, Key};
use tower_ratelimit::store::{Charge, MemoryStore, Namespace, RedisStore, Store};
use tower_ratelimit::{
    failure::OnStoreError, headers::HeaderStyle, rate::DenyCache, Algorithm, Policy, Quota,
    RateLimitLayer,
};

fn policy() -> Policy {
    let per_second = Quota::new(3, Duration::from_secs(1))
        .unwrap()
        .with_algorithm(Algorithm::TokenBucket)
        .unwrap()
        .named("per-second")
        .unwrap();
    let hourly = Quota::new(5, Duration::from_secs(3_600))
        .unwrap()
        .with_algorithm(Algorithm::SlidingLog)
        .unwrap()
        .named("hourly")
        .unwrap();
    Policy::new(per_second).and(hourly).unwrap()
}

fn app(store: Arc<dyn Store>, clock: &ManualClock) -> Router {
    let layer = RateLimitLayer::builder()
        .name("several")
        .quota(policy())
        .key(Header::try_new("x-client").unwrap())
        .store(store)
        .clock(clock.clone())
        .headers(HeaderStyle::Ietf)
        .store_timeout(Duration::from_secs(2))
        .on_store_error(OnStoreError::FailClosed)
        // Every request goes to the store, so the command count is exact.
        .deny_cache(DenyCache::disabled())
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

/// The request's status and its `RateLimit` header (every quota, by name).
async fn request(app: &Router, client: &str) -> (StatusCode, String) {
    let (status, rl, _) = request_with_body(app, client).await;
    (status, rl)
}

/// [`request`], and the response body.
async fn request_with_body(app: &Router, client: &str) -> (StatusCode, String, String) {
    let req = Request::get("/")
        .header("x-client", client)
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let rl = res
        .headers()
        .get("ratelimit")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let status = res.status();
    let body = axum::body::to_bytes(res.into_body(), 1 << 16)
        .await
        .unwrap();
    (status, rl, String::from_utf8(body.to_vec()).unwrap())
}

/// Spends the hourly quota, then shows that its rejections leave the
/// per-second bucket untouched: 26 charges and 2 status reads.
async fn hourly_rejects_and_the_per_second_quota_is_unchanged(store: Arc<dyn Store>, t0: u64) {
    let clock = ManualClock::new(t0);
    let app = app(store.clone(), &clock);
    for _ in 0..3 {
        assert_eq!(request(&app, "a").await.0, StatusCode::OK);
    }
    clock.set(t0 + 1_000);
    let (s, _) = request(&app, "a").await;
    assert_eq!(s, StatusCode::OK);
    let (s, rl) = request(&app, "a").await;
    assert_eq!(s, StatusCode::OK);
    // 2 tokens spent this second (the bucket refilled 3), 5 of 5 this hour.
    assert_eq!(rl, r#""per-second";r=1;t=1, "hourly";r=0;t=3600"#);

    let ns = Namespace::new("several");
    let key = Key::new("a");
    let policy = policy();
    let status = |now_ms| {
        Charge::new(&ns, &key, &policy, now_ms)
            .with_cost(0)
            .with_timeout(Duration::from_secs(2))
    };
    let now = t0 + 1_500;
    clock.set(now);
    let before = store.status(&status(now)).await.unwrap().statuses()[0];
    assert_eq!((before.remaining, before.reset_ms), (2, t0 + 1_667));
    for i in 0..20 {
        let (s, rl, body) = request_with_body(&app, "a").await;
        assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "request {i}");
        // The problem document names the quota that refused, and only it.
        assert!(
            body.contains(
                r#""type":"https://iana.org/assignments/http-problem-types#quota-exceeded""#
            ),
            "{body}"
        );
        assert!(body.contains(r#""violated-policies":["hourly"]"#), "{body}");
        // The rejection reports the per-second quota as it stands, uncharged.
        assert_eq!(
            rl, r#""per-second";r=2;t=1, "hourly";r=0;t=3600"#,
            "request {i}"
        );
    }
    let after = store.status(&status(now)).await.unwrap().statuses()[0];
    assert_eq!(
        after, before,
        "20 rejections by the hourly quota spent nothing per second"
    );
    // Another client is unaffected.
    assert_eq!(request(&app, "b").await.0, StatusCode::OK);
}

#[tokio::test]
async fn memory_store_hourly_rejection_leaves_the_per_second_quota_unchanged() {
    hourly_rejects_and_the_per_second_quota_is_unchanged(Arc::new(MemoryStore::new()), 1_000_000)
        .await;
}

#[tokio::test]
async fn redis_store_hourly_rejection_leaves_the_per_second_quota_unchanged_in_one_command_per_request(
) {
    redis_support::require_redis();
    let server = redis_support::RedisServer::start();
    let store = Arc::new(RedisStore::new(server.url()).unwrap());
    // Load the charge and status scripts, then count every command from zero.
    let warm = app(store.clone(), &ManualClock::new(SystemClock.now_ms()));
    assert_eq!(request(&warm, "warm-up").await.0, StatusCode::OK);
    let (ns, key, policy) = (Namespace::new("warm-up"), Key::new("w"), policy());
    store
        .status(
            &Charge::new(&ns, &key, &policy, SystemClock.now_ms())
                .with_cost(0)
                .with_timeout(Duration::from_secs(2)),
        )
        .await
        .unwrap();
    server.config_resetstat();

    hourly_rejects_and_the_per_second_quota_is_unchanged(store, SystemClock.now_ms()).await;
    // 5 admitted, 20 rejected, 1 other client, 2 status reads: one EVALSHA
    // each. (Commands a script runs inside Redis are counted under their own
    // names, so round trips are counted as script calls.)
    assert_eq!(server.command_calls("evalsha"), 5 + 20 + 1 + 2);
    assert_eq!(server.command_calls("eval"), 0, "no script was re-sent");
    redis_support::assert_every_key_has_a_ttl(&server);
}
