//! The load shedder's adaptive capacity against a simulated backend whose
//! latency grows with concurrency: a pool of workers, each request holding
//! one for 10 ms, queueing (first come, first served) when all are busy.
//! The pool loses three quarters of its workers halfway through. Time is
//! tokio's paused clock, so 20 simulated seconds run in a moment and every
//! run is the same.
//!
//! Offered: one request a millisecond. Goodput counts the requests answered
//! 200 within the client's 100 ms deadline. The test prints the table for
//! no limit, fixed capacities from too low to too high, and the adaptive
//! capacity, and holds the adaptive one to the best fixed capacity: its
//! goodput within 10 %, its p99 no worse.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use tower::{service_fn, BoxError, Layer, ServiceExt};
use tower_ratelimit::shed::{Adaptive, LoadShedLayer, Priority};

const SECONDS: u64 = 20;
const SERVICE: Duration = Duration::from_millis(10);
const DEADLINE: Duration = Duration::from_millis(100);
const WORKERS: usize = 16;
/// Workers lost halfway through.
const LOST: u32 = 12;

/// What one configuration achieved.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// Requests answered 200 within the deadline, per second.
    goodput: f64,
    /// The 99th percentile latency of the requests answered 200.
    p99: Duration,
    shed: u64,
}

/// Offers the load to `layer` (none: the backend alone) over `SECONDS`.
async fn run(layer: Option<LoadShedLayer>) -> Run {
    let workers = Arc::new(Semaphore::new(WORKERS));
    let backend = {
        let workers = workers.clone();
        service_fn(move |_req: Request<Empty<Bytes>>| {
            let workers = workers.clone();
            async move {
                let _worker = workers.acquire().await.unwrap();
                tokio::time::sleep(SERVICE).await;
                Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
            }
        })
    };
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
        let (backend, layer, done) = (backend.clone(), layer.clone(), done.clone());
        tokio::spawn(async move {
            let sent = Instant::now();
            let req = Request::new(Empty::<Bytes>::new());
            let status = match layer {
                Some(l) => {
                    let res = l.layer(backend).oneshot(req).await.unwrap();
                    let status = res.status();
                    res.into_body()
                        .collect()
                        .await
                        .map_err(BoxError::from)
                        .unwrap();
                    status
                }
                None => backend.oneshot(req).await.unwrap().status(),
            };
            let _ = done.send((status, sent.elapsed()));
        });
    }
    drop(done);
    let (mut good, mut shed, mut latencies) = (0u64, 0u64, Vec::new());
    while let Some((status, latency)) = results.recv().await {
        match status {
            StatusCode::OK => {
                latencies.push(latency);
                if latency <= DEADLINE {
                    good += 1;
                }
            }
            StatusCode::SERVICE_UNAVAILABLE => shed += 1,
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
        shed,
    }
}

fn fixed(capacity: u64) -> LoadShedLayer {
    LoadShedLayer::builder()
        .capacity(capacity)
        .share(Priority::Normal, 1.0)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn an_adaptive_capacity_matches_the_best_fixed_one_without_being_told_it() {
    let mut table = vec![("no limit".to_owned(), run(None).await)];
    let mut best: Option<(u64, Run)> = None;
    for capacity in [2, 4, 8, 10, 12, 16, 24, 32, 48, 64, 128, 1_000] {
        let r = run(Some(fixed(capacity))).await;
        table.push((format!("fixed {capacity}"), r));
        let better = best.is_none_or(|(_, b)| {
            r.goodput > b.goodput || (r.goodput == b.goodput && r.p99 < b.p99)
        });
        if better {
            best = Some((capacity, r));
        }
    }
    let adaptive = LoadShedLayer::builder()
        .adaptive(Adaptive::new().initial(20).min(2).max(1_000))
        .share(Priority::Normal, 1.0)
        .build()
        .unwrap();
    let a = run(Some(adaptive.clone())).await;
    table.push(("adaptive".to_owned(), a));

    println!("| capacity | goodput (/s) | p99 of 200s | shed |");
    println!("|---|---:|---:|---:|");
    for (name, r) in &table {
        println!(
            "| {name} | {:.0} | {:.1} ms | {} |",
            r.goodput,
            r.p99.as_secs_f64() * 1e3,
            r.shed
        );
    }
    println!("adaptive capacity at the end: {:?}", adaptive.capacity());

    let (capacity, b) = best.unwrap();
    assert!(
        a.goodput >= 0.9 * b.goodput,
        "adaptive goodput {:.0}/s against {:.0}/s at the best fixed capacity ({capacity})",
        a.goodput,
        b.goodput
    );
    assert!(
        a.p99 <= b.p99,
        "adaptive p99 {:?} against {:?} at the best fixed capacity ({capacity})",
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
