//! Decision cost of the in-memory path, with governor's keyed limiter beside it.
//!
//! ```sh
//! cargo bench --bench memory                 # everything (~1 minute)
//! cargo bench --bench memory -- 'hot key'    # one group
//! ```
//!
//! Groups:
//! - `store/*`: one `MemoryStore::charge` (no layer, no clock read) against
//!   `governor`'s `DefaultKeyedRateLimiter::check_key`, same key type, on one
//!   hot key, over 100k keys, and with 2 threads on one hot key.
//! - `layer/*`: one request through `tower::Service::call` + poll on a no-op
//!   inner service: no limiter, this crate's layer (memory store, with and
//!   without headers), and `tower_governor`'s layer.
//! - `layer/5000 per s`: the layer with a quota of a common size, whose
//!   counts are all below 10,000 and whose reset changes once a second; a
//!   manual clock moves 1 ms per request so every request is admitted (the
//!   clock read is an atomic load here, not the system clock).
//!
//! Every quota is large enough that every decision admits: the steady-state
//! cost of an allowed request is what the performance targets are about.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use governor::{DefaultKeyedRateLimiter, Quota as GQuota, RateLimiter};
use http::{Request, Response};
use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};
use tower::{Layer, Service};
use tower_ratelimit::clock::ManualClock;
use tower_ratelimit::key::{Global, Key};
use tower_ratelimit::store::{Charge, MemoryStore, Namespace, Store};
use tower_ratelimit::{headers::HeaderStyle, Algorithm, Policy, Quota, RateLimitLayer};

const MANY_KEYS: u64 = 100_000;

fn big_quota() -> Quota {
    Quota::new(1 << 40, Duration::from_secs(3600)).expect("valid quota")
}

fn governor_limiter() -> DefaultKeyedRateLimiter<Key> {
    RateLimiter::keyed(GQuota::per_second(NonZeroU32::MAX))
}

fn keys(n: u64) -> Vec<Key> {
    (0..n).map(|i| Key::new(i.to_le_bytes())).collect()
}

struct Ours {
    store: MemoryStore,
    ns: Namespace,
    policy: Policy,
}

impl Ours {
    fn new(max_keys: usize) -> Self {
        Self::with(max_keys, big_quota())
    }

    fn with(max_keys: usize, quota: Quota) -> Self {
        Self {
            store: MemoryStore::builder().max_keys(max_keys).build(),
            ns: Namespace::new("bench"),
            policy: Policy::new(quota),
        }
    }

    #[inline]
    fn charge(&self, key: &Key, now_ms: u64) -> bool {
        let call = Charge::new(&self.ns, key, &self.policy, now_ms)
            .with_timeout(Duration::from_millis(50));
        let decision = self
            .store
            .charge(&call)
            .now_or_never()
            .expect("memory store answers at once")
            .expect("no store error");
        decision.is_allowed()
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn store_benches(c: &mut Criterion) {
    let now = now_ms();
    let mut g = c.benchmark_group("store/hot key");
    g.throughput(Throughput::Elements(1));
    let ours = Ours::new(100_000);
    let key = Key::new("hot");
    g.bench_function("memory fixed window", |b| {
        b.iter(|| black_box(ours.charge(black_box(&key), now)))
    });
    let gov = governor_limiter();
    g.bench_function("governor keyed", |b| {
        b.iter(|| black_box(gov.check_key(black_box(&key)).is_ok()))
    });
    g.finish();

    // Each algorithm on one hot key, time moving 1 ms every 1,000 decisions.
    // The sliding log's limit is capped (MAX_SLIDING_LOG_LIMIT), so in steady
    // state it mostly rejects; every other algorithm admits every decision.
    let mut g = c.benchmark_group("store/algorithm, hot key");
    g.throughput(Throughput::Elements(1));
    for alg in [
        Algorithm::FixedWindow,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ] {
        let limit = if alg == Algorithm::SlidingLog {
            tower_ratelimit::Quota::MAX_SLIDING_LOG_LIMIT
        } else {
            1 << 40
        };
        let quota = Quota::new(limit, Duration::from_secs(1))
            .and_then(|q| q.with_algorithm(alg))
            .expect("valid quota");
        let ours = Ours::with(100_000, quota);
        let mut i = 0u64;
        g.bench_function(alg.code(), |b| {
            b.iter(|| {
                i += 1;
                black_box(ours.charge(&key, now + i / 1000))
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("store/100k keys");
    g.throughput(Throughput::Elements(1));
    let ks = keys(MANY_KEYS);
    let ours = Ours::new(2 * MANY_KEYS as usize);
    let mut i = 0usize;
    g.bench_function("memory fixed window", |b| {
        b.iter(|| {
            i = (i + 7919) % ks.len();
            black_box(ours.charge(&ks[i], now))
        })
    });
    let gov = governor_limiter();
    g.bench_function("governor keyed", |b| {
        b.iter(|| {
            i = (i + 7919) % ks.len();
            black_box(gov.check_key(&ks[i]).is_ok())
        })
    });
    g.finish();

    // Two threads on one hot key: the time reported is wall time per decision
    // (both threads together), so lower is better and contention shows.
    let mut g = c.benchmark_group("store/2 threads hot key");
    g.throughput(Throughput::Elements(1));
    let ours = Arc::new(Ours::new(100_000));
    g.bench_function("memory fixed window", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, {
                let ours = ours.clone();
                move || black_box(ours.charge(&Key::new("hot"), now))
            })
        })
    });
    let gov = Arc::new(governor_limiter());
    g.bench_function("governor keyed", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, {
                let gov = gov.clone();
                move || black_box(gov.check_key(&Key::new("hot")).is_ok())
            })
        })
    });
    g.finish();
}

fn two_threads(iters: u64, f: impl Fn() -> bool + Send + Clone + 'static) -> Duration {
    let barrier = Arc::new(std::sync::Barrier::new(3));
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let (f, barrier) = (f.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                for _ in 0..iters / 2 {
                    f();
                }
            })
        })
        .collect();
    barrier.wait();
    let t = Instant::now();
    for h in handles {
        h.join().unwrap();
    }
    t.elapsed()
}

/// A ready inner service answering with one header: what the layer's own
/// cost is measured against.
#[derive(Clone)]
struct Noop;

impl<B> Service<Request<B>> for Noop {
    // axum's body: tower_governor answers rejections with it.
    type Response = Response<axum::body::Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<axum::body::Body>, Infallible>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, _: Request<B>) -> Self::Future {
        // Headed as axum's hello world is (`&'static str`): the headers the
        // layer adds join a map that already exists, as they do in an app.
        let mut res = Response::new(axum::body::Body::empty());
        res.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        std::future::ready(Ok(res))
    }
}

/// One request through `svc`: ready, call, poll to completion (all ready at once).
fn one_request<S>(svc: &mut S) -> bool
where
    S: Service<Request<()>>,
{
    let mut cx = Context::from_waker(Waker::noop());
    assert!(svc.poll_ready(&mut cx).is_ready());
    let mut req = Request::new(());
    // tower_governor's default extractor and PeerIp read the peer address.
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            4000,
        )));
    let fut = pin!(svc.call(req));
    matches!(fut.poll(&mut cx), Poll::Ready(Ok(_)))
}

fn layer_benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("layer/hot key");
    g.throughput(Throughput::Elements(1));
    let mut svc = Noop;
    g.bench_function("no limiter", |b| {
        b.iter(|| black_box(one_request(&mut svc)))
    });
    for (name, style) in [
        ("memory, github headers", HeaderStyle::GitHub),
        ("memory, no headers", HeaderStyle::None),
    ] {
        let layer = RateLimitLayer::builder()
            .quota(big_quota())
            .key(Global)
            .headers(style)
            .build()
            .unwrap();
        let mut svc = layer.layer(Noop);
        g.bench_function(BenchmarkId::new("tower-ratelimit", name), |b| {
            b.iter(|| black_box(one_request(&mut svc)))
        });
    }
    let config = tower_governor::governor::GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(u32::MAX)
        .key_extractor(tower_governor::key_extractor::GlobalKeyExtractor)
        .finish()
        .unwrap();
    let mut svc = tower_governor::GovernorLayer::<_, _, axum::body::Body>::new(config).layer(Noop);
    g.bench_function("tower_governor", |b| {
        b.iter(|| black_box(one_request(&mut svc)))
    });
    g.finish();

    let mut g = c.benchmark_group("layer/5000 per s");
    g.throughput(Throughput::Elements(1));
    for (name, style) in [
        ("memory, github headers", HeaderStyle::GitHub),
        ("memory, no headers", HeaderStyle::None),
    ] {
        let clock = ManualClock::new(now_ms());
        let layer = RateLimitLayer::builder()
            .quota(Quota::per_second(NonZeroU32::new(5_000).unwrap()))
            .key(Global)
            .clock(clock.clone())
            .headers(style)
            .build()
            .unwrap();
        let mut svc = layer.layer(Noop);
        g.bench_function(BenchmarkId::new("tower-ratelimit", name), |b| {
            b.iter(|| {
                clock.advance(Duration::from_millis(1));
                black_box(one_request(&mut svc))
            })
        });
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
}

criterion_group! { name = store; config = config(); targets = store_benches }
criterion_group! { name = layer; config = config(); targets = layer_benches }
criterion_main!(store, layer);
