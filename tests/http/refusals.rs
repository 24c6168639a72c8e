//! Waiting and the penalty box on the memory store, through the layer:
//! what a policy accepts, a gRPC call's deadline, and what a blocked client
//! is told.

use axum::body::Body;
use http::{Request, Response, StatusCode};
use std::convert::Infallible;
use std::time::{Duration, Instant};
use tower::{service_fn, Layer, ServiceExt};
use tower_ratelimit::clock::ManualClock;
use tower_ratelimit::key::Header;
use tower_ratelimit::rate::{Penalty, Wait};
use tower_ratelimit::{Algorithm, ConfigErrorKind, Policy, Quota, RateLimitLayer};

fn gcra(limit: u64, window: Duration) -> Quota {
    Quota::new(limit, window)
        .unwrap()
        .with_algorithm(Algorithm::Gcra)
        .unwrap()
}

fn layer(policy: Policy, clock: &ManualClock) -> RateLimitLayer {
    RateLimitLayer::builder()
        .quota(policy)
        .key(Header::try_new("x-client").unwrap())
        .clock(clock.clone())
        .build()
        .unwrap()
}

async fn send(layer: &RateLimitLayer, req: Request<Body>) -> Response<Body> {
    let ok =
        service_fn(|_: Request<Body>| async { Ok::<_, Infallible>(Response::new(Body::empty())) });
    layer.layer(ok).oneshot(req).await.unwrap().map(Body::new)
}

fn get(client: &str) -> Request<Body> {
    Request::get("/")
        .header("x-client", client)
        .body(Body::empty())
        .unwrap()
}

#[test]
fn only_gcra_quotas_counting_requests_of_at_most_a_thousand_a_second_may_wait() {
    let wait = || Wait::up_to(Duration::from_secs(1));
    let second = Duration::from_secs(1);
    assert!(Policy::new(gcra(5, second)).wait(wait()).is_ok());
    let both = Policy::new(gcra(5, second))
        .and(gcra(100, Duration::from_secs(60)))
        .unwrap();
    assert!(both.wait(wait()).is_ok());
    for (policy, why) in [
        (Policy::new(Quota::new(5, second).unwrap()), "GCRA"),
        (
            Policy::new(
                Quota::new(5, second)
                    .unwrap()
                    .with_algorithm(Algorithm::TokenBucket)
                    .unwrap(),
            ),
            "token bucket makes the same decisions",
        ),
        (Policy::new(gcra(2_000, second)), "1ms apart"),
        (
            Policy::new(gcra(5, second).with_unit("tokens").unwrap()),
            "counting requests",
        ),
    ] {
        let err = policy.wait(wait()).unwrap_err();
        assert_eq!(err.kind(), ConfigErrorKind::Quota);
        assert!(err.to_string().contains(why), "{err}");
    }
    let err = Policy::new(gcra(5, second))
        .wait(Wait::up_to(Duration::ZERO))
        .unwrap_err();
    assert!(err.to_string().contains("between 1ms and 1 day"), "{err}");
    let err = Policy::new(gcra(5, second))
        .penalty(Penalty::after(0))
        .unwrap_err();
    assert!(err.to_string().contains("at least one refusal"), "{err}");
}

#[tokio::test]
async fn a_grpc_call_waits_for_its_turn_only_until_its_deadline() {
    let clock = ManualClock::new(1_700_000_000_000);
    // One turn a second, after a burst of one; waits of up to 10 s.
    let policy = Policy::new(gcra(1, Duration::from_secs(1)))
        .wait(Wait::up_to(Duration::from_secs(10)))
        .unwrap();
    let layer = layer(policy, &clock);
    let grpc = |timeout: &str| {
        Request::post("/pkg.Svc/Call")
            .version(http::Version::HTTP_2)
            .header("content-type", "application/grpc")
            .header("x-client", "a")
            .header("grpc-timeout", timeout)
            .body(Body::empty())
            .unwrap()
    };
    // The burst: one call goes at once.
    assert_eq!(send(&layer, grpc("5S")).await.status(), StatusCode::OK);
    // Its turn is 1 s away: past a 300 ms deadline, refused at once.
    let sent = Instant::now();
    let res = send(&layer, grpc("300m")).await;
    assert_eq!(res.headers()["grpc-status"], "8", "RESOURCE_EXHAUSTED");
    assert!(sent.elapsed() < Duration::from_millis(200));
    // Within a 5 s deadline, it waits for its turn and goes on.
    let res = send(&layer, grpc("5S")).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers().get("grpc-status").is_none_or(|s| s == "0"));
}

#[tokio::test]
async fn a_blocked_client_is_told_it_is_blocked_until_when_and_its_quota_is_not_charged() {
    let clock = ManualClock::new(1_700_000_000_000);
    let policy = Policy::new(Quota::new(2, Duration::from_secs(10)).unwrap())
        .penalty(Penalty::after(2).block_for(Duration::from_secs(60)))
        .unwrap();
    let layer = layer(policy, &clock);
    for want in [200, 200, 429, 429] {
        assert_eq!(send(&layer, get("a")).await.status(), want);
    }
    // Blocked: a minute from the second refusal, told in the answer.
    clock.advance(Duration::from_secs(20));
    let res = send(&layer, get("a")).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["retry-after"], "40");
    let body = axum::body::to_bytes(res.into_body(), 4096).await.unwrap();
    let body = String::from_utf8_lossy(&body);
    assert!(
        body.contains("blocked") && body.contains("2023-11-14T22:14:20Z"),
        "{body}"
    );
    // Another client is not blocked, and the block charged nothing: once it
    // ends, the quota is whole again.
    assert_eq!(send(&layer, get("b")).await.status(), StatusCode::OK);
    clock.advance(Duration::from_secs(40));
    for want in [200, 200, 429] {
        assert_eq!(send(&layer, get("a")).await.status(), want);
    }
}
