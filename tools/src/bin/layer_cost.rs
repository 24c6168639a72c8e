//! Sends `N` requests through the layer (memory store, one hot key, a no-op
//! inner service that answers as axum's hello world does) and prints how
//! many headers the responses carried. `scripts/layer_cost.sh` runs it under
//! callgrind twice, with two values of `N`, to count the instructions one
//! request costs: a figure that holds on a noisy machine where timings do not.
//!
//! ```sh
//! cargo run --release -p tower-ratelimit-tools --bin layer_cost -- github 1000000000 10000
//! ```
//!
//! Arguments: the header style (`github`, `ietf`, `both` or `none`; `off`
//! runs the service without the layer, the baseline), the
//! quota's limit per hour (the default of `scripts/bench.sh`, 10⁹, renders
//! every number in full; below 10 000 they come from a static table), and `N`.

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body_util::Full;
use std::convert::Infallible;
use std::future::Future;
use std::pin::pin;
use std::process::ExitCode;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tower::{Layer, Service};
use tower_ratelimit::key::Global;
use tower_ratelimit::{HeaderStyle, Quota, RateLimitLayer};

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
    if let [off, _, n] = args.as_slice() {
        if let ("off", Ok(n)) = (off.as_str(), n.parse()) {
            println!("{}", send(HelloWorld, n));
            return ExitCode::SUCCESS;
        }
    }
    let parsed = match args.as_slice() {
        [style, limit, n] => style_of(style)
            .zip(limit.parse::<u64>().ok())
            .zip(n.parse().ok()),
        _ => None,
    };
    let Some(((style, limit), n)) = parsed else {
        eprintln!("usage: layer_cost github|ietf|both|none|off LIMIT_PER_HOUR REQUESTS");
        return ExitCode::from(2);
    };
    let quota = match Quota::new(limit, Duration::from_secs(3600)) {
        Ok(q) => q,
        Err(e) => {
            eprintln!("layer_cost: {e}");
            return ExitCode::from(2);
        }
    };
    let layer = RateLimitLayer::builder()
        .quota(quota)
        .key(Global)
        .headers(style)
        .build()
        .expect("a memory layer with one quota builds");
    println!("{}", send(layer.layer(HelloWorld), n));
    ExitCode::SUCCESS
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

fn style_of(s: &str) -> Option<HeaderStyle> {
    Some(match s {
        "github" => HeaderStyle::GitHub,
        "ietf" => HeaderStyle::Ietf,
        "both" => HeaderStyle::Both,
        "none" => HeaderStyle::None,
        _ => return None,
    })
}
