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
use tower_ratelimit::ConcurrencyLimitLayer;
use tower_ratelimit::{adaptive::Adaptive, shed::Priority, LoadShedLayer};

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

/// Offers a fast request every 5 ms (client `fast`, each body read at once)
/// for 12 s; from the third second to the tenth, 50 slow readers (client
/// `slow`) also send requests in a loop and hold each response body unread
/// for a second. Returns the limit the fast clients had found, and the
/// mean limit from the fourth second on.
async fn with_slow_readers(svc: Svc, now: impl Fn() -> u64 + Clone + Send + 'static) -> (u64, u64) {
    let start = Instant::now();
    let fast = |svc: Svc, until: Instant| async move {
        let mut i = (Instant::now() - start).as_millis() as u64;
        while Instant::now() < until {
            tokio::time::sleep_until(start + Duration::from_millis(i)).await;
            i += 5;
            let svc = svc.clone();
            tokio::spawn(async move {
                let req = Request::builder()
                    .header("x-client", "fast")
                    .body(Empty::new())
                    .unwrap();
                let res = svc.oneshot(req).await.unwrap();
                let _ = res.into_body().collect().await;
            });
        }
    };
    fast(svc.clone(), start + Duration::from_secs(2)).await;
    let measured = now();
    let slow_until = start + Duration::from_secs(10);
    for _ in 0..50 {
        let svc = svc.clone();
        tokio::spawn(async move {
            while Instant::now() < slow_until {
                let req = Request::builder()
                    .header("x-client", "slow")
                    .body(Empty::new())
                    .unwrap();
                let res = svc.clone().oneshot(req).await.unwrap();
                let pause = match res.status() {
                    // The head is here; the body is read only a second later.
                    StatusCode::OK => Duration::from_secs(1),
                    _ => Duration::from_millis(100),
                };
                tokio::time::sleep(pause).await;
                drop(res);
            }
        });
    }
    let watch = {
        let now = now.clone();
        tokio::spawn(async move {
            let mut seen = Vec::new();
            while Instant::now() < start + Duration::from_secs(12) {
                if Instant::now() >= start + Duration::from_secs(4) {
                    seen.push(now());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            seen
        })
    };
    fast(svc, start + Duration::from_secs(12)).await;
    let seen = watch.await.unwrap();
    (measured, seen.iter().sum::<u64>() / seen.len() as u64)
}

#[tokio::test(start_paused = true)]
async fn slow_readers_holding_bodies_open_move_neither_adaptive_limit() {
    let backend = || {
        BoxCloneService::new(service_fn(|_req: Request<Empty<Bytes>>| async {
            tokio::time::sleep(SERVICE).await;
            Ok::<_, BoxError>(Response::new(
                Empty::<Bytes>::new()
                    .map_err(|e: Infallible| -> BoxError { match e {} })
                    .boxed_unsync(),
            ))
        }))
    };
    let concurrency = ConcurrencyLimitLayer::builder()
        .adaptive(ADAPTIVE)
        .key(tower_ratelimit::key::Header::try_new("x-client").unwrap())
        .build()
        .unwrap();
    let now = concurrency.clone();
    let (fast, mean) =
        with_slow_readers(boxed(concurrency.layer(backend())), move || now.limit()).await;
    println!("concurrency limit: {fast} from fast clients, {mean} on average with slow readers");
    // Timed to the end of their bodies, the slow readers' seconds took it
    // to a quarter of that (20 to 5); timed to the head, what the service
    // took, it stays and grows: the slots they hold are not the service's.
    assert!(
        mean >= fast,
        "the slow readers moved the limit: {fast} to {mean}"
    );

    let shedder = LoadShedLayer::builder()
        .adaptive(ADAPTIVE)
        .share(Priority::Normal, 1.0)
        .build()
        .unwrap();
    let now = shedder.clone();
    let (fast, mean) = with_slow_readers(boxed(shedder.layer(backend())), move || {
        now.capacity().unwrap()
    })
    .await;
    println!("shedder capacity: {fast} from fast clients, {mean} on average with slow readers");
    assert!(
        mean >= fast,
        "the slow readers moved the capacity: {fast} to {mean}"
    );
}
