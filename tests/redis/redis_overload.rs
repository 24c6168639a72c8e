//! An instance whose own runtime is saturated, with a healthy Redis: the
//! limiter decides every request exactly, slower, and never fails open.

use crate::support::redis as redis_support;

use http::{Request, StatusCode};
use redis_support::{require_redis, RedisServer};
use std::convert::Infallible;
use std::time::{Duration, Instant};
use tower::{service_fn, Layer, ServiceExt};
use tower_ratelimit::key::Header;
use tower_ratelimit::store::RedisStore;
use tower_ratelimit::{failure::OnStoreError, headers::HeaderStyle, Quota, RateLimitLayer};

const CLIENTS: usize = 10;
const PER_CLIENT: usize = 300;
const LIMIT: u64 = 100;
const TIMEOUT: Duration = Duration::from_millis(50);
/// CPU time the application spends on each admitted request, blocking its
/// runtime's only thread.
const WORK: Duration = Duration::from_millis(2);

/// Burns `d` of CPU on the calling thread (the application's own work).
fn busy(d: Duration) {
    let start = Instant::now();
    while start.elapsed() < d {
        std::hint::spin_loop();
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_saturated_current_thread_runtime_with_a_healthy_redis_never_fails_open() {
    require_redis();
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .connect_timeout(Duration::from_secs(5))
        .response_timeout(TIMEOUT)
        .build()
        .unwrap();
    let layer = RateLimitLayer::builder()
        .quota(Quota::new(LIMIT, Duration::from_secs(3600)).unwrap())
        .key(Header::try_new("x-client").unwrap())
        .store(store)
        .store_timeout(TIMEOUT)
        .on_store_error(OnStoreError::FailOpen)
        .headers(HeaderStyle::GitHub)
        .build()
        .unwrap();
    layer.connect().await.unwrap();
    let svc = layer.layer(service_fn(|_req: Request<()>| async {
        busy(WORK);
        Ok::<_, Infallible>(http::Response::new(
            http_body_util::Empty::<bytes::Bytes>::new(),
        ))
    }));

    // Every request at once, on the test's one thread: while admitted
    // requests burn it, the others' charges are in flight or answered and
    // waiting to be polled, for far longer than the store timeout.
    let started = Instant::now();
    let tasks: Vec<_> = (0..CLIENTS * PER_CLIENT)
        .map(|i| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let req = Request::builder()
                    .header("x-client", format!("client-{}", i % CLIENTS))
                    .body(())
                    .unwrap();
                let res = svc.oneshot(req).await.unwrap();
                let decided = res.headers().contains_key("x-ratelimit-remaining");
                (res.status(), decided)
            })
        })
        .collect();
    let (mut admitted, mut rejected, mut failed_open) = (0, 0, 0);
    for t in tasks {
        match t.await.unwrap() {
            (StatusCode::OK, true) => admitted += 1,
            (StatusCode::OK, false) => failed_open += 1,
            (StatusCode::TOO_MANY_REQUESTS, true) => rejected += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    let elapsed = started.elapsed();
    // The runtime was saturated: the admitted requests alone kept it busy
    // for many store timeouts.
    assert!(
        elapsed > TIMEOUT * 10,
        "the flood should saturate the runtime, took {elapsed:?}"
    );
    // No store call failed (a failure would fail open, and five in a row
    // would open the breaker, failing open every request after them).
    assert_eq!(failed_open, 0, "decisions that failed open");
    assert_eq!(admitted, CLIENTS * LIMIT as usize, "exactly the quota");
    assert_eq!(rejected, CLIENTS * (PER_CLIENT - LIMIT as usize));
}
