//! Sends `N` requests through the layer (one hot key, a no-op inner
//! service that answers as axum's hello world does) and prints how many
//! headers the responses carried. `scripts/layer_cost.sh` and
//! `scripts/instructions.sh` run it under callgrind twice, with two values
//! of `N`, to count the instructions one request costs: a figure that holds
//! on a noisy machine where timings do not.
//!
//! ```sh
//! cargo run --release -p tower-ratelimit-tools --bin layer_cost -- github 1000000000 10000
//! cargo run --release -p tower-ratelimit-tools --bin layer_cost -- none 1000000000 4096 redis://127.0.0.1:6400 32
//! ```
//!
//! Arguments: the header style (`github`, `ietf`, `both` or `none`; `off`
//! runs the service without the layer, the baseline), the
//! quota's limit per hour (10⁹, the default of `scripts/bench.sh`, gives the
//! headers numbers of full length), and `N`.
//! With the memory store every request is answered at once, polled by hand.
//! With a Redis URL and a batch size `B` the layer charges that Redis, and
//! requests go in waves of `B` at once on a single-threaded tokio runtime:
//! each wave's charges leave in one script call, so a request costs its
//! share of the call (`off` drives the service alone in the same waves).

use bytes::Bytes;
use futures_util::future::join_all;
use http::{HeaderValue, Request, Response};
use http_body_util::Full;
use std::convert::Infallible;
use std::future::Future;
use std::pin::pin;
use std::process::ExitCode;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tower::{Layer, Service, ServiceExt};
use tower_ratelimit::key::Global;
use tower_ratelimit::store::RedisStore;
use tower_ratelimit::{failure::OnStoreError, headers::HeaderStyle, Quota, RateLimitLayer};

/// Answers at once with one header, as axum does for a `&'static str`.
#[derive(Clone)]
struct HelloWorld;

impl<B> Service<Request<B>> for HelloWorld {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<B>) -> Self::Future {
        let mut res = Response::new(Full::new(Bytes::from_static(b"Hello, World!")));
        res.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        std::future::ready(Ok(res))
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (style, limit, n, redis) = match args.as_slice() {
        [style, limit, n] => (style, limit, n, None),
        [style, limit, n, url, batch] => (style, limit, n, Some((url, batch))),
        _ => return usage(),
    };
    let (Ok(limit), Ok(n)) = (limit.parse::<u64>(), n.parse::<u64>()) else {
        return usage();
    };
    let redis = match redis.map(|(url, batch)| (url, batch.parse::<u64>())) {
        Some((url, Ok(batch))) if batch > 0 => Some((url.as_str(), batch)),
        Some(_) => return usage(),
        None => None,
    };
    if style == "off" {
        println!(
            "{}",
            match redis {
                Some((_, batch)) => waves(HelloWorld, n, batch),
                None => send(HelloWorld, n),
            }
        );
        return ExitCode::SUCCESS;
    }
    let Some(style) = style_of(style) else {
        return usage();
    };
    let quota = match Quota::new(limit, Duration::from_secs(3600)) {
        Ok(q) => q,
        Err(e) => {
            eprintln!("layer_cost: {e}");
            return ExitCode::from(2);
        }
    };
    let builder = RateLimitLayer::builder()
        .quota(quota)
        .key(Global)
        .headers(style);
    let headers = match redis {
        None => {
            let layer = builder
                .build()
                .expect("a memory layer with one quota builds");
            send(layer.layer(HelloWorld), n)
        }
        Some((url, batch)) => {
            // Long timeouts: callgrind slows the process twenty-fold, and a
            // charge that timed out would count the failure path instead;
            // failing closed, a store failure stops the run (a refusal).
            let store = RedisStore::builder(url)
                .response_timeout(Duration::from_secs(30))
                .build()
                .expect("a valid Redis URL");
            let layer = builder
                .store(store)
                .store_timeout(Duration::from_secs(30))
                .on_store_error(OnStoreError::FailClosed)
                .build()
                .expect("a Redis layer with one quota builds");
            waves(layer.layer(HelloWorld), n, batch)
        }
    };
    println!("{headers}");
    ExitCode::SUCCESS
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: layer_cost github|ietf|both|none|off LIMIT_PER_HOUR REQUESTS [REDIS_URL BATCH]"
    );
    ExitCode::from(2)
}

/// Sends `n` requests through `svc`; returns how many headers they carried.
fn send<S, B>(mut svc: S, n: u64) -> u64
where
    S: Service<Request<()>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    let mut cx = Context::from_waker(Waker::noop());
    let mut headers = 0;
    for _ in 0..n {
        assert!(svc.poll_ready(&mut cx).is_ready(), "the service is ready");
        let fut = pin!(svc.call(Request::new(())));
        match fut.poll(&mut cx) {
            Poll::Ready(Ok(res)) => headers += res.headers().len() as u64,
            _ => panic!("the memory store answers at once"),
        }
    }
    headers
}

/// Sends `n` requests through `svc` in waves of `batch` at once, on a
/// single-threaded runtime; returns how many headers they carried.
fn waves<S, B>(svc: S, n: u64, batch: u64) -> u64
where
    S: Service<Request<()>, Response = Response<B>> + Clone,
    S::Error: std::fmt::Debug,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async {
        let mut headers = 0;
        let mut left = n;
        while left > 0 {
            let wave = left.min(batch);
            left -= wave;
            let answers = join_all((0..wave).map(|_| svc.clone().oneshot(Request::new(()))));
            for res in answers.await {
                let res = res.expect("the service answers");
                assert!(res.status().is_success(), "a request was refused");
                headers += res.headers().len() as u64;
            }
        }
        headers
    })
}

fn style_of(s: &str) -> Option<HeaderStyle> {
    Some(match s {
        "github" => HeaderStyle::GitHub,
        "ietf" => HeaderStyle::Ietf,
        "both" => HeaderStyle::Both,
        "none" => HeaderStyle::None,
        _ => return None,
    })
}
