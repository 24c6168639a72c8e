//! Every series of a rate limiter on Redis carries the layer's name in the
//! label `limiter`, the store's own measurements included: the clock
//! offset, call durations, errors. The test records on its own thread (a
//! current-thread runtime) with a recorder of its own.

use crate::support::labels;
use crate::support::redis::{require_redis, RedisServer};

use axum::body::Body;
use http::{Request, Response, StatusCode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use std::convert::Infallible;
use std::num::NonZeroU32;
use std::time::Duration;
use tower::{service_fn, Layer, ServiceExt};
use tower_ratelimit::key::Header;
use tower_ratelimit::store::RedisStore;
use tower_ratelimit::{Quota, RateLimitLayer};

/// Connected (the clock offset is measured), a client allowed, refused by
/// Redis, refused again by the deny cache; then Redis freezes and another
/// client's charge times out and is admitted by the failure policy.
#[tokio::test]
async fn every_series_of_a_rate_limiter_on_redis_carries_its_name() {
    require_redis();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recording = metrics::set_default_local_recorder(&recorder);
    let server = RedisServer::start();
    let layer = RateLimitLayer::builder()
        .name("labelled-redis")
        .quota(Quota::per_hour(NonZeroU32::new(1).unwrap()))
        .key(Header::try_new("x-client").unwrap())
        .store(RedisStore::new(server.url()).unwrap())
        .store_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    layer.connect().await.unwrap();
    let svc = layer.layer(service_fn(|_: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::empty()))
    }));
    let from = |client: &str| {
        Request::get("/")
            .header("x-client", client)
            .body(Body::empty())
            .unwrap()
    };
    let mut statuses = Vec::new();
    for client in ["a", "a", "a"] {
        statuses.push(svc.clone().oneshot(from(client)).await.unwrap().status());
    }
    server.pause();
    statuses.push(svc.clone().oneshot(from("b")).await.unwrap().status());
    server.resume();
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::OK
        ]
    );

    let series = labels::of(&snapshotter, "labelled-redis");
    assert_eq!(
        labels::names(&series),
        [
            "ratelimit_breaker_state",
            "ratelimit_decisions_total",
            "ratelimit_deny_cache_hits_total",
            "ratelimit_refunds_total",
            "ratelimit_shadow_rejections_total",
            "ratelimit_store_clock_offset_seconds",
            "ratelimit_store_duration_seconds",
            "ratelimit_store_errors_total",
            "ratelimit_store_failure_decisions_total",
        ]
    );
    let counter = |name: &str| match &series[name] {
        DebugValue::Counter(n) => *n,
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(counter("ratelimit_decisions_total{outcome=allowed}"), 1);
    assert_eq!(counter("ratelimit_decisions_total{outcome=rejected}"), 2);
    assert_eq!(counter("ratelimit_deny_cache_hits_total{}"), 1);
    assert_eq!(counter("ratelimit_store_errors_total{kind=timeout}"), 1);
    assert_eq!(
        counter("ratelimit_store_failure_decisions_total{action=open}"),
        1
    );
    match &series["ratelimit_store_duration_seconds{op=charge}"] {
        DebugValue::Histogram(calls) => assert_eq!(
            calls.len(),
            3,
            "a's two charges Redis answered, and b's that timed out"
        ),
        other => panic!("{other:?}"),
    }
}
