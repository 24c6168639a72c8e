//! Adaptive limits against a simulated backend whose latency grows with
//! concurrency: a pool of workers, each request holding one for 10 ms,
//! queueing (first come, first served) when all are busy. The pool loses
//! three quarters of its workers halfway through. Time is tokio's paused
//! clock, so 20 simulated seconds run in a moment and every run is the same.
//!
//! Offered: one request a millisecond. Goodput counts the requests answered
//! 200 within the client's 100 ms deadline. Each test prints the table for
//! no limit, fixed limits from too low to too high, and the adaptive limit,
//! and holds the adaptive one to the best fixed one: its goodput within
//! 10 %, its p99 no worse. One test puts the limit in the load shedder's
//! capacity, the other in the concurrency limiter's limit.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use tower::util::BoxCloneService;
use tower::{service_fn, BoxError, Layer, Service, ServiceExt};
use tower_ratelimit::concurrency::ConcurrencyLimitLayer;
use tower_ratelimit::shed::{Adaptive, LoadShedLayer, Priority};

const SECONDS: u64 = 20;
const SERVICE: Duration = Duration::from_millis(10);
const DEADLINE: Duration = Duration::from_millis(100);
const WORKERS: usize = 16;
/// Workers lost halfway through.
const LOST: u32 = 12;
/// The fixed limits tried, from too low to too high.
const FIXED: [u32; 12] = [2, 4, 8, 10, 12, 16, 24, 32, 48, 64, 128, 1_000];
/// The adaptive limit's bounds.
const ADAPTIVE: Adaptive = Adaptive::new().initial(20).min(2).max(1_000);

type Body = UnsyncBoxBody<Bytes, BoxError>;
/// The backend, or a limiter around it.
type Svc = BoxCloneService<Request<Empty<Bytes>>, Response<Body>, BoxError>;

/// What one configuration achieved.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// Requests answered 200 within the deadline, per second.
    goodput: f64,
    /// The 99th percentile latency of the requests answered 200.
    p99: Duration,
    /// Requests the limiter refused (503 or 429).
    refused: u64,
}

/// A limiter's service, its errors and body boxed.
fn boxed<S, B>(svc: S) -> Svc
where
    S: Service<Request<Empty<Bytes>>, Response = Response<B>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    BoxCloneService::new(
        svc.map_response(|r| r.map(|b| b.map_err(Into::into).boxed_unsync()))
            .map_err(Into::into),
    )
}

/// Offers the load to the backend wrapped by `limit` over `SECONDS`.
async fn run(limit: impl Fn(Svc) -> Svc) -> Run {
    let workers = Arc::new(Semaphore::new(WORKERS));
    let backend = {
        let workers = workers.clone();
        service_fn(move |_req: Request<Empty<Bytes>>| {
            let workers = workers.clone();
            async move {
                let _worker = workers.acquire().await.unwrap();
                tokio::time::sleep(SERVICE).await;
                Ok::<_, BoxError>(Response::new(
                    Empty::<Bytes>::new()
                        .map_err(|e: Infallible| match e {})
                        .boxed_unsync(),
                ))
            }
        })
    };
    let svc = limit(BoxCloneService::new(backend));
    let start = Instant::now();
    let lose = workers.clone();
    tokio::spawn(async move {
        tokio::time::sleep_until(start + Duration::from_secs(SECONDS / 2)).await;
        lose.acquire_many(LOST).await.unwrap().forget();
    });
    let (done, mut results) = mpsc::unbounded_channel();
    let total = SECONDS * 1_000;
    for i in 0..total {
        tokio::time::sleep_until(start + Duration::from_millis(i)).await;
        let (svc, done) = (svc.clone(), done.clone());
        tokio::spawn(async move {
            let sent = Instant::now();
            let res = svc
                .oneshot(Request::new(Empty::<Bytes>::new()))
                .await
                .unwrap();
            let status = res.status();
            res.into_body().collect().await.unwrap();
            let _ = done.send((status, sent.elapsed()));
        });
    }
    drop(done);
    let (mut good, mut refused, mut latencies) = (0u64, 0u64, Vec::new());
    while let Some((status, latency)) = results.recv().await {
        match status {
            StatusCode::OK => {
                latencies.push(latency);
                if latency <= DEADLINE {
                    good += 1;
                }
            }
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS => refused += 1,
            other => panic!("unexpected {other}"),
        }
    }
    latencies.sort();
    let p99 = latencies
        .get(latencies.len() * 99 / 100)
        .copied()
        .unwrap_or_default();
    Run {
        goodput: good as f64 / SECONDS as f64,
        p99,
        refused,
    }
}

/// Runs no limit, each fixed limit and the adaptive one; prints the table
/// (headed `what`) and holds the adaptive limit to the best fixed one.
async fn compare(
    what: &str,
    fixed: impl Fn(u32) -> Box<dyn Fn(Svc) -> Svc>,
    adaptive: impl Fn(Svc) -> Svc,
    adaptive_now: impl Fn() -> u64,
) {
    let mut table = vec![("no limit".to_owned(), run(|svc| svc).await)];
    let mut best: Option<(u32, Run)> = None;
    for limit in FIXED {
        let r = run(fixed(limit)).await;
        table.push((format!("fixed {limit}"), r));
        let better = best.is_none_or(|(_, b)| {
            r.goodput > b.goodput || (r.goodput == b.goodput && r.p99 < b.p99)
        });
        if better {
            best = Some((limit, r));
        }
    }
    let a = run(adaptive).await;
    table.push(("adaptive".to_owned(), a));

    println!("| {what} | goodput (/s) | p99 of 200s | refused |");
    println!("|---|---:|---:|---:|");
    for (name, r) in &table {
        println!(
            "| {name} | {:.1} | {:.1} ms | {} |",
            r.goodput,
            r.p99.as_secs_f64() * 1e3,
            r.refused
        );
    }
    let (limit, b) = best.unwrap();
    println!(
        "best fixed {what}: {limit}; adaptive {what} at the end: {}",
        adaptive_now()
    );

    assert!(
        a.goodput >= 0.9 * b.goodput,
        "adaptive goodput {:.0}/s against {:.0}/s at the best fixed {what} ({limit})",
        a.goodput,
        b.goodput
    );
    assert!(
        a.p99 <= b.p99,
        "adaptive p99 {:?} against {:?} at the best fixed {what} ({limit})",
        a.p99,
        b.p99
    );
    let (_, none) = &table[0];
    assert!(
        none.goodput < b.goodput && none.p99 > DEADLINE,
        "without a limit the queue grows past the deadline: {:.0}/s, p99 {:?}",
        none.goodput,
        none.p99
    );
}

#[tokio::test(start_paused = true)]
async fn an_adaptive_capacity_matches_the_best_fixed_one_without_being_told_it() {
    let shedder = |layer: LoadShedLayer| move |inner| boxed(layer.layer(inner));
    let fixed = |capacity: u32| -> Box<dyn Fn(Svc) -> Svc> {
        let layer = LoadShedLayer::builder()
            .capacity(u64::from(capacity))
            .share(Priority::Normal, 1.0)
            .build()
            .unwrap();
        Box::new(shedder(layer))
    };
    let adaptive = LoadShedLayer::builder()
        .adaptive(ADAPTIVE)
        .share(Priority::Normal, 1.0)
        .build()
        .unwrap();
    let now = adaptive.clone();
    compare("capacity", fixed, shedder(adaptive), move || {
        now.capacity().unwrap()
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn an_adaptive_concurrency_limit_matches_the_best_fixed_one_without_being_told_it() {
    let limiter = |layer: ConcurrencyLimitLayer| move |inner| boxed(layer.layer(inner));
    let fixed = |n: u32| -> Box<dyn Fn(Svc) -> Svc> {
        Box::new(limiter(
            ConcurrencyLimitLayer::builder().limit(n).build().unwrap(),
        ))
    };
    let adaptive = ConcurrencyLimitLayer::builder()
        .adaptive(ADAPTIVE)
        .build()
        .unwrap();
    let now = adaptive.clone();
    compare("limit", fixed, limiter(adaptive), move || now.limit()).await;
}
