//! The series of the extras that reach Redis off the request path carry
//! the layer's name in the label `limiter`, like the limiter's own: the
//! coordinated mode's syncs, shared limits' polls, the shadow policy's
//! charges and the advisor's fleet report, each failing on a Redis that
//! is gone. Each test records on its own thread (a current-thread
//! runtime, where the background tasks run too) with a recorder of its own.

use crate::support::labels;
use crate::support::poll::eventually;
use crate::support::redis::{require_redis, RedisServer};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Empty;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use std::convert::Infallible;
use std::num::NonZeroU32;
use std::time::Duration;
use tower::{service_fn, Layer, ServiceExt};
use tower_ratelimit::clock::{Clock, ManualClock, SystemClock};
use tower_ratelimit::store::RedisStore;
use tower_ratelimit::{Quota, RateLimitLayer};

/// One request through `layer`.
async fn send(layer: &RateLimitLayer) {
    layer
        .layer(service_fn(|_: Request<Empty<Bytes>>| async {
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        }))
        .oneshot(Request::new(Empty::new()))
        .await
        .unwrap();
}

/// The counter `series` (`name{labels}` without `limiter`) of `limiter`
/// since the last snapshot, every series checked to be `limiter`'s.
fn counted(snapshotter: &Snapshotter, limiter: &str, series: &str) -> u64 {
    match labels::of(snapshotter, limiter).get(series) {
        Some(DebugValue::Counter(n)) => *n,
        Some(other) => panic!("{series}: {other:?}"),
        None => 0,
    }
}

/// Waits until `series` of `limiter` has counted something.
async fn counts(snapshotter: &Snapshotter, limiter: &str, series: &str) {
    let mut seen = 0;
    eventually(Duration::from_secs(10), series, || {
        seen += counted(snapshotter, limiter, series);
        seen > 0
    })
    .await;
}

#[cfg(feature = "coordinated")]
#[tokio::test]
async fn a_failed_coordinated_sync_counts_under_the_layer_s_name() {
    use tower_ratelimit::store::Coordinated;

    require_redis();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recording = metrics::set_default_local_recorder(&recorder);
    let mut server = RedisServer::start();
    let clock = ManualClock::new(SystemClock.now_ms());
    let coordinated = Coordinated::builder(RedisStore::new(server.url()).unwrap())
        .sync_timeout(Duration::from_millis(200))
        .clock(clock.clone())
        .manual_sync()
        .build()
        .unwrap();
    let layer = RateLimitLayer::builder()
        .name("labelled-coordinated")
        .quota(Quota::per_second(NonZeroU32::new(10).unwrap()))
        .store(coordinated.clone())
        .clock(clock.clone())
        .build()
        .unwrap();
    send(&layer).await;
    coordinated.sync_now(clock.now_ms()).await.unwrap();
    server.stop();
    send(&layer).await;
    clock.advance(Duration::from_secs(1));
    assert!(coordinated.sync_now(clock.now_ms()).await.is_err());
    assert_eq!(
        counted(
            &snapshotter,
            "labelled-coordinated",
            "ratelimit_coordinated_sync_failures_total{}"
        ),
        1
    );
}

#[cfg(feature = "runtime-limits")]
#[tokio::test]
async fn a_failed_poll_of_shared_limits_counts_under_the_layer_s_name() {
    use tower_ratelimit::rate::SharedLimits;

    require_redis();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recording = metrics::set_default_local_recorder(&recorder);
    let mut server = RedisServer::start();
    let layer = RateLimitLayer::builder()
        .name("labelled-shared")
        .quota(Quota::per_second(NonZeroU32::new(10).unwrap()))
        .shared_limits(
            SharedLimits::new(RedisStore::new(server.url()).unwrap())
                .poll_interval(Duration::from_millis(10))
                .timeout(Duration::from_millis(200)),
        )
        .build()
        .unwrap();
    send(&layer).await;
    server.stop();
    counts(
        &snapshotter,
        "labelled-shared",
        "ratelimit_shared_limits_poll_failures_total{}",
    )
    .await;
}

#[cfg(feature = "runtime-limits")]
#[tokio::test]
async fn a_failed_charge_of_the_shadow_policy_counts_under_the_layer_s_name() {
    require_redis();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recording = metrics::set_default_local_recorder(&recorder);
    let mut server = RedisServer::start();
    let layer = RateLimitLayer::builder()
        .name("labelled-shadow")
        .quota(Quota::per_second(NonZeroU32::new(10).unwrap()))
        .store(RedisStore::new(server.url()).unwrap())
        .store_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    layer
        .limits()
        .shadow("5/1s".parse().unwrap())
        .await
        .unwrap();
    server.stop();
    send(&layer).await;
    counts(
        &snapshotter,
        "labelled-shadow",
        "ratelimit_shadow_policy_errors_total{}",
    )
    .await;
}

#[cfg(feature = "advisor")]
#[tokio::test]
async fn a_failed_send_to_the_advisor_s_fleet_report_counts_under_the_layer_s_name() {
    use tower_ratelimit::rate::Advisor;

    require_redis();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recording = metrics::set_default_local_recorder(&recorder);
    let mut server = RedisServer::start();
    let clock = ManualClock::new(SystemClock.now_ms());
    let layer = RateLimitLayer::builder()
        .name("labelled-advice")
        .quota(Quota::per_second(NonZeroU32::new(10).unwrap()))
        .clock(clock.clone())
        .advisor(
            Advisor::new()
                .window(Duration::from_secs(1))
                .fleet(RedisStore::new(server.url()).unwrap()),
        )
        .build()
        .unwrap();
    send(&layer).await;
    server.stop();
    // The next window's first request closes the first, which goes to Redis.
    clock.advance(Duration::from_secs(1));
    send(&layer).await;
    counts(
        &snapshotter,
        "labelled-advice",
        "ratelimit_advice_fleet_failures_total{}",
    )
    .await;
}
