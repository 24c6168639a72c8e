//! Every series a layer registers carries the layer's name in the label
//! `limiter`, whatever registers it: the limiter, its store, its extras.
//! Each test records on its own thread (a current-thread runtime) with a
//! recorder of its own, so it sees its layer's series and no other.

use crate::support::labels;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use std::convert::Infallible;
use std::num::NonZeroU32;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_ratelimit::key::Header;
use tower_ratelimit::store::MemoryStore;
use tower_ratelimit::{ConcurrencyLimitLayer, LoadShedLayer, Quota, RateLimitLayer};

fn ok(
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future = impl Send> + Clone
{
    service_fn(|_: Request<Body>| async { Ok::<_, Infallible>(Response::new(Body::empty())) })
}

fn from(header: &str, value: &str) -> Request<Body> {
    Request::get("/")
        .header(header, value)
        .body(Body::empty())
        .unwrap()
}

/// A memory store full at one key, two clients: the second client's key
/// evicts the first's, and that eviction is counted under the layer's
/// name like every other series of the limiter.
#[tokio::test]
async fn every_series_of_a_rate_limiter_on_a_memory_store_carries_its_name_evictions_too() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recording = metrics::set_default_local_recorder(&recorder);
    let layer = RateLimitLayer::builder()
        .name("labelled-rate")
        .quota(Quota::per_hour(NonZeroU32::new(1).unwrap()))
        .key(Header::try_new("x-client").unwrap())
        .store(MemoryStore::builder().max_keys(1).shards(1).build())
        .build()
        .unwrap();
    let svc = layer.layer(ok());
    let mut statuses = Vec::new();
    for client in ["a", "a", "b"] {
        let res = svc.clone().oneshot(from("x-client", client)).await.unwrap();
        statuses.push(res.status());
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::OK
        ]
    );
    let series = labels::of(&snapshotter, "labelled-rate");
    assert_eq!(
        labels::names(&series),
        [
            "ratelimit_breaker_state",
            "ratelimit_decisions_total",
            "ratelimit_deny_cache_hits_total",
            "ratelimit_memory_evictions_total",
            "ratelimit_refunds_total",
            "ratelimit_shadow_rejections_total",
            "ratelimit_store_duration_seconds",
            "ratelimit_store_failure_decisions_total",
        ]
    );
    assert_eq!(
        series["ratelimit_decisions_total{outcome=allowed}"],
        DebugValue::Counter(2)
    );
    assert_eq!(
        series["ratelimit_decisions_total{outcome=rejected}"],
        DebugValue::Counter(1)
    );
    assert_eq!(
        series["ratelimit_memory_evictions_total{}"],
        DebugValue::Counter(1),
        "b's key made room"
    );
}

/// One request holds the only slot (its response body is still alive),
/// the next is refused: every series counts under the layer's name.
#[tokio::test]
async fn every_series_of_a_concurrency_limiter_carries_its_name() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recording = metrics::set_default_local_recorder(&recorder);
    let layer = ConcurrencyLimitLayer::builder()
        .name("labelled-concurrency")
        .limit(1)
        .build()
        .unwrap();
    let svc = layer.layer(ok());
    let held = svc
        .clone()
        .oneshot(Request::new(Body::empty()))
        .await
        .unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    let refused = svc
        .clone()
        .oneshot(Request::new(Body::empty()))
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let series = labels::of(&snapshotter, "labelled-concurrency");
    assert_eq!(
        labels::names(&series),
        [
            "concurrency_breaker_state",
            "concurrency_decisions_total",
            "concurrency_in_flight",
            "concurrency_limit",
            "concurrency_releases_total",
            "concurrency_shadow_rejections_total",
            "concurrency_store_duration_seconds",
            "concurrency_store_failure_decisions_total",
        ]
    );
    assert_eq!(
        series["concurrency_decisions_total{outcome=allowed}"],
        DebugValue::Counter(1)
    );
    assert_eq!(
        series["concurrency_decisions_total{outcome=rejected}"],
        DebugValue::Counter(1)
    );
    assert_eq!(
        series["concurrency_in_flight{}"],
        DebugValue::Gauge(1.0.into())
    );
}

/// A shedder with a capacity of two, counted in this process and in a
/// fleet store: a critical request holds one, which is all the test class
/// may use, so a test-class request is shed.
#[tokio::test]
async fn every_series_of_a_load_shedder_and_of_its_fleet_store_carries_its_name() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recording = metrics::set_default_local_recorder(&recorder);
    let layer = LoadShedLayer::builder()
        .name("labelled-shed")
        .capacity(2)
        .fleet_capacity(10)
        .store(MemoryStore::new())
        .classify(crate::support::shed::by_header)
        .build()
        .unwrap();
    let svc = layer.layer(ok());
    let held = svc
        .clone()
        .oneshot(from("x-priority", "critical"))
        .await
        .unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    let shed = svc
        .clone()
        .oneshot(from("x-priority", "test"))
        .await
        .unwrap();
    assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
    let series = labels::of(&snapshotter, "labelled-shed");
    assert_eq!(
        labels::names(&series),
        [
            "load_shed_capacity",
            "load_shed_decisions_total",
            "load_shed_fleet_breaker_state",
            "load_shed_fleet_releases_total",
            "load_shed_fleet_store_duration_seconds",
            "load_shed_fleet_store_failure_decisions_total",
            "load_shed_in_flight",
            "load_shed_shadow_total",
            "load_shed_utilisation",
        ]
    );
    assert_eq!(
        series["load_shed_decisions_total{class=critical,outcome=admitted}"],
        DebugValue::Counter(1)
    );
    assert_eq!(
        series["load_shed_decisions_total{class=test,outcome=shed}"],
        DebugValue::Counter(1)
    );
}

/// The advisor's gauges are set when a window closes: a request in the
/// next window closes the first.
#[cfg(feature = "advisor")]
#[tokio::test]
async fn the_advisor_s_gauges_carry_the_layer_s_name_and_the_tier() {
    use std::time::Duration;
    use tower_ratelimit::clock::ManualClock;
    use tower_ratelimit::rate::Advisor;

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recording = metrics::set_default_local_recorder(&recorder);
    let clock = ManualClock::new(1_700_000_000_400);
    let layer = RateLimitLayer::builder()
        .name("labelled-advisor")
        .quota(Quota::per_second(NonZeroU32::new(10).unwrap()))
        .key(Header::try_new("x-client").unwrap())
        .clock(clock.clone())
        .advisor(Advisor::new().window(Duration::from_secs(1)))
        .build()
        .unwrap();
    let svc = layer.layer(ok());
    for _ in 0..3 {
        svc.clone().oneshot(from("x-client", "a")).await.unwrap();
    }
    clock.advance(Duration::from_secs(1));
    svc.clone().oneshot(from("x-client", "a")).await.unwrap();
    let series = labels::of(&snapshotter, "labelled-advisor");
    let advice: Vec<(&String, &DebugValue)> = series
        .iter()
        .filter(|(k, _)| k.starts_with("ratelimit_advice_"))
        .collect();
    let gauge = |name: &str| {
        advice
            .iter()
            .find(|(k, _)| k.starts_with(&format!("{name}{{tier=")))
            .map(|(_, v)| match v {
                DebugValue::Gauge(g) => g.into_inner(),
                other => panic!("{name}: {other:?}"),
            })
    };
    assert_eq!(advice.len(), 3, "{advice:?}");
    assert_eq!(gauge("ratelimit_advice_peak"), Some(3.0), "{advice:?}");
    assert_eq!(
        gauge("ratelimit_advice_current_limit"),
        Some(10.0),
        "{advice:?}"
    );
}
