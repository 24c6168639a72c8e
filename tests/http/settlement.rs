//! Settling a request at its end: from the handler's `Usage` as a streamed
//! body goes, from the trailers, from the bytes sent; once, whichever
//! sources speak; and what a body dropped before its end keeps. Through
//! real servers and clients over TCP (HTTP/1.1 and HTTP/2) and `oneshot`,
//! with the memory store and a real Redis.

use crate::support::http as http_support;
use crate::support::logs;
#[cfg(feature = "redis")]
use crate::support::redis as redis_support;

use axum::body::Body;
use axum::extract::Path;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Empty, StreamBody};
use http_support::{HttpClient, TestServer};
use std::convert::Infallible;
use std::time::Duration;
use tower::{Layer, ServiceExt};
use tower_ratelimit::clock::ManualClock;
use tower_ratelimit::headers::HeaderStyle;
use tower_ratelimit::key::Global;
use tower_ratelimit::rate::{Dropped, Settlement, Usage};
use tower_ratelimit::{Quota, RateLimitLayer, RateLimitLayerBuilder};

const T0: u64 = 1_700_000_040_000;

fn tokens(limit: u64) -> Quota {
    Quota::new(limit, Duration::from_secs(60))
        .unwrap()
        .named("tokens")
        .unwrap()
        .with_unit("tokens")
        .unwrap()
}

fn bytes_quota(limit: u64) -> Quota {
    Quota::new(limit, Duration::from_secs(60))
        .unwrap()
        .named("egress")
        .unwrap()
        .with_unit("content-bytes")
        .unwrap()
}

fn builder(quota: Quota, clock: &ManualClock) -> RateLimitLayerBuilder {
    RateLimitLayer::builder()
        .quota(quota)
        .key(Global)
        .clock(clock.clone())
        .headers(HeaderStyle::Ietf)
}

/// 10,000 bytes a minute, each response reserving 1,000 and settled to the
/// bytes its body sent.
fn egress(clock: &ManualClock) -> RateLimitLayerBuilder {
    builder(bytes_quota(10_000), clock).settlement(egress_settlement())
}

/// [`egress`]'s settlement.
fn egress_settlement() -> Settlement {
    Settlement::new().reserve(|_| 1_000).from_body_bytes()
}

/// What the caller has left in its first quota, read without charging.
async fn remaining<M>(layer: &RateLimitLayer<M>) -> u64 {
    let (parts, ()) = Request::new(()).into_parts();
    let status = layer.status(&parts).await.unwrap().unwrap();
    status.decision.statuses()[0].remaining
}

/// A body of `n` chunks of `chunk`, each reported to `usage` as one token
/// as it is produced, then the trailers, if any.
fn streamed(n: u64, chunk: &'static [u8], usage: Usage, trailers: Option<HeaderMap>) -> Body {
    let data = futures_util::stream::iter(0..n).map(move |_| {
        usage.add(1);
        Ok::<_, Infallible>(Frame::data(Bytes::from_static(chunk)))
    });
    let end = futures_util::stream::iter(trailers.map(|t| Ok(Frame::trailers(t))));
    Body::new(StreamBody::new(data.chain(end)))
}

async fn stream_tokens(usage: Usage, Path(n): Path<u64>) -> Response<Body> {
    Response::new(streamed(n, b"tok ", usage, None))
}

#[tokio::test]
async fn a_handler_counts_a_streamed_response_on_its_usage_and_the_request_settles_when_the_body_ends(
) {
    let clock = ManualClock::new(T0);
    let layer = builder(tokens(100), &clock)
        .settlement(Settlement::new().reserve(|_| 50).from_usage())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/stream/{n}", get(stream_tokens))
        .layer(layer.clone());
    let server = TestServer::start(app).await;
    let client = HttpClient::new();
    let get = |n: u64| {
        let (client, url) = (client.clone(), server.url(&format!("/stream/{n}")));
        async move { client.get(&url).await }
    };

    // The head shows the reservation; the body's end settles the real count.
    let r = get(10).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, "tok ".repeat(10));
    assert_eq!(r.header("ratelimit"), Some(r#""tokens";r=50;t=60"#));
    assert_eq!(remaining(&layer).await, 90, "reserved 50, settled 10");

    let r = get(70).await;
    assert_eq!(r.header("ratelimit"), Some(r#""tokens";r=40;t=60"#));
    assert_eq!(remaining(&layer).await, 20, "reserved 50, settled 70");

    // 20 left: admitted, and the 60 it streams go 40 into debt.
    let r = get(60).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(remaining(&layer).await, 0);
    let r = get(1).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        r.body.contains(r#""violated-policies":["tokens"]"#),
        "{}",
        r.body
    );

    clock.advance(Duration::from_secs(60));
    assert_eq!(remaining(&layer).await, 100, "a new window");
}

#[tokio::test]
async fn outside_a_limiter_the_usage_extractor_is_a_detached_handle_that_settles_nothing() {
    let app = Router::new().route("/stream/{n}", get(stream_tokens));
    let res = app
        .oneshot(Request::get("/stream/3").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "tok tok tok ");
}

/// Answers with a body of three chunks, then `x-tokens-used: 40` in the
/// trailers; its head says 999 and the handler's usage 7, which the
/// trailers' word comes before.
async fn with_trailers(usage: Usage) -> Response<Body> {
    usage.settle(7);
    let mut trailers = HeaderMap::new();
    trailers.insert("x-tokens-used", HeaderValue::from_static("40"));
    let mut res = Response::new(streamed(3, b"chunk ", Usage::default(), Some(trailers)));
    res.headers_mut()
        .insert("x-tokens-used", HeaderValue::from_static("999"));
    res
}

fn read_header(name: &'static str) -> impl Fn(&HeaderMap) -> Option<u64> + Send + Sync {
    move |h| h.get(name)?.to_str().ok()?.parse().ok()
}

#[tokio::test]
async fn trailers_sent_over_http2_settle_the_request_once_and_come_before_the_head_and_the_handler()
{
    let clock = ManualClock::new(T0);
    let head = read_header("x-tokens-used");
    let layer = builder(tokens(1_000), &clock)
        .settlement(
            Settlement::new()
                .reserve(|_| 500)
                .from_head(move |_, h| head(h))
                .from_trailers(read_header("x-tokens-used"))
                .from_usage(),
        )
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(with_trailers))
        .layer(layer.clone());
    let server = TestServer::start(app).await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<Empty<Bytes>>();

    for (round, left) in [(1, 960), (2, 920)] {
        let res = client
            .request(Request::get(server.url("/")).body(Empty::new()).unwrap())
            .await
            .unwrap();
        assert_eq!(res.version(), http::Version::HTTP_2);
        let reserved = format!(r#""tokens";r={};t=60"#, left + 40 - 500);
        assert_eq!(
            res.headers().get("ratelimit").unwrap(),
            reserved.as_str(),
            "round {round}: the head shows the reservation"
        );
        let collected = res.into_body().collect().await.unwrap();
        let trailers = collected
            .trailers()
            .cloned()
            .expect("the client got the trailers");
        assert_eq!(trailers.get("x-tokens-used").unwrap(), "40");
        assert_eq!(collected.to_bytes(), "chunk chunk chunk ");
        // Once: a second settlement (to the head's 999 or the handler's 7)
        // would leave anything but 40 spent per request.
        assert_eq!(remaining(&layer).await, left, "round {round}");
    }
}

#[tokio::test]
async fn a_content_bytes_quota_settles_to_the_bytes_the_body_really_sent() {
    let clock = ManualClock::new(T0);
    let layer = egress(&clock).build().unwrap();
    let app = Router::new()
        .route("/stream/{n}", get(stream_tokens))
        .route("/whole", get(|| async { "x".repeat(250) }))
        .layer(layer.clone());
    let server = TestServer::start(app).await;
    let client = HttpClient::new();

    let r = client.get(&server.url("/stream/25")).await;
    assert_eq!(r.body.len(), 100);
    assert_eq!(r.header("ratelimit"), Some(r#""egress";r=9000;t=60"#));
    assert_eq!(remaining(&layer).await, 9_900, "reserved 1,000, sent 100");

    let r = client.get(&server.url("/whole")).await;
    assert_eq!(r.body.len(), 250);
    assert_eq!(remaining(&layer).await, 9_650, "a body sent in one frame");

    // An empty body has ended before it is sent: settled to 0 at once.
    let res = axum::Router::new()
        .route("/empty", get(|| async { "" }))
        .layer(layer.clone())
        .oneshot(Request::get("/empty").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(remaining(&layer).await, 9_650, "before its body is read");
    drop(res);
    assert_eq!(remaining(&layer).await, 9_650);
}

/// Sends one chunk of `bytes`, then reads the first frame of the answer and
/// drops the rest of the body, as a client that goes away does.
async fn drop_after_one_frame(layer: &RateLimitLayer) {
    let app = Router::new()
        .route("/stream/{n}", get(stream_tokens))
        .layer(layer.clone());
    let res = app
        .oneshot(Request::get("/stream/3").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let mut body = res.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "tok ");
    drop(body);
}

#[tokio::test]
async fn a_dropped_body_keeps_its_reservation_or_settles_as_configured() {
    let cases = [
        (None, 9_000, "by default the reservation stands"),
        (Some(Dropped::Reservation), 9_000, "the reservation stands"),
        (Some(Dropped::SoFar), 9_996, "the 4 bytes sent"),
        (Some(Dropped::Cost(10)), 9_990, "the configured cost"),
    ];
    for (dropped, left, why) in cases {
        let clock = ManualClock::new(T0);
        let mut b = egress(&clock);
        if let Some(d) = dropped {
            b = b.settlement(egress_settlement().on_dropped(d));
        }
        let layer = b.build().unwrap();
        drop_after_one_frame(&layer).await;
        assert_eq!(remaining(&layer).await, left, "{why}");
    }
}

#[tokio::test]
async fn a_body_that_fails_before_its_end_is_settled_as_dropped() {
    let clock = ManualClock::new(T0);
    let layer = egress(&clock)
        .settlement(egress_settlement().on_dropped(Dropped::SoFar))
        .build()
        .unwrap();
    let failing = || async {
        let frames = futures_util::stream::iter([
            Ok(Frame::data(Bytes::from_static(b"12345"))),
            Err(std::io::Error::other("the upstream went away")),
        ]);
        Response::new(Body::new(StreamBody::new(frames)))
    };
    let res = Router::new()
        .route("/", get(failing))
        .layer(layer.clone())
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let mut body = res.into_body();
    assert!(body.frame().await.unwrap().is_ok());
    assert!(body.frame().await.unwrap().is_err());
    assert_eq!(remaining(&layer).await, 9_995, "the 5 bytes sent");
    drop(body);
    assert_eq!(remaining(&layer).await, 9_995, "settled once");
}

#[tokio::test]
async fn input_and_output_tokens_settle_apart_while_the_request_quota_keeps_its_charge() {
    let clock = ManualClock::new(T0);
    let quota = |name: &'static str, limit| {
        Quota::new(limit, Duration::from_secs(60))
            .unwrap()
            .named(name)
            .unwrap()
            .with_unit(name)
            .unwrap()
    };
    let policy = tower_ratelimit::Policy::new(Quota::new(10, Duration::from_secs(60)).unwrap())
        .and(quota("input-tokens", 1_000))
        .unwrap()
        .and(quota("output-tokens", 2_000))
        .unwrap();
    let layer = RateLimitLayer::builder()
        .quota(policy)
        .key(Global)
        .clock(clock.clone())
        .settlement(Settlement::new().reserve(|_| 100).from_usage())
        .build()
        .unwrap();
    let handler = |usage: Usage| async move {
        usage.settle_unit("input-tokens", 30);
        usage.add_unit("output-tokens", 250);
        usage.add_unit("output-tokens", 50);
        "done"
    };
    let res = Router::new()
        .route("/", get(handler))
        .layer(layer.clone())
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    res.into_body().collect().await.unwrap();
    let (parts, ()) = Request::new(()).into_parts();
    let status = layer.status(&parts).await.unwrap().unwrap();
    let left: Vec<u64> = status
        .decision
        .statuses()
        .iter()
        .map(|s| s.remaining)
        .collect();
    assert_eq!(left, [9, 970, 1_700]);
}

#[tokio::test]
async fn with_the_inner_body_passed_through_a_request_settles_at_its_head_and_body_sources_are_warned_of(
) {
    let clock = ManualClock::new(T0);
    let layer = builder(tokens(1_000), &clock)
        .settlement(Settlement::new().reserve(|_| 100).from_usage())
        .build()
        .unwrap()
        .inner_body();
    let handler = |usage: Usage| async move {
        usage.settle(25);
        "done"
    };
    let res = Router::new()
        .route("/", get(handler))
        .layer(layer.clone())
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(
        remaining(&layer).await,
        975,
        "settled before the body is read"
    );
    drop(res);

    // Sources that read the body see nothing in this mode: a warning says so.
    let (logs, _guard) = logs::capture();
    let _quiet = builder(tokens(1_000), &clock).build().unwrap().inner_body();
    assert!(!logs.text().contains("unwatched"), "{}", logs.text());
    let _warned = builder(tokens(1_000), &clock)
        .settlement(Settlement::new().from_body_bytes())
        .build()
        .unwrap()
        .inner_body();
    assert!(logs.text().contains("WARN"), "{}", logs.text());
    assert!(
        logs.text().contains("the body's bytes sees nothing"),
        "{}",
        logs.text()
    );
}

#[cfg(feature = "redis")]
mod redis {
    use super::redis_support::{self, require_redis, RedisServer};
    use super::*;
    use std::sync::Arc;
    use tokio::sync::{mpsc, Semaphore};
    use tower_ratelimit::clock::{Clock, SystemClock};
    use tower_ratelimit::store::RedisStore;

    fn layer_on(
        server: &RedisServer,
        clock: &ManualClock,
        quota: Quota,
        reserve: u64,
    ) -> RateLimitLayer {
        builder(quota, clock)
            .name("fleet")
            .store(RedisStore::new(server.url()).unwrap())
            .settlement(
                Settlement::new()
                    .reserve(move |_| reserve)
                    .from_head(|_, h| read_header("x-tokens-used")(h)),
            )
            .build()
            .unwrap()
    }

    /// Answers `GET /{n}` with `x-tokens-used: n` once `gate` lets it,
    /// saying on `entered` when it starts (the request was admitted).
    fn app(
        layer: RateLimitLayer,
        gate: Arc<Semaphore>,
        entered: mpsc::UnboundedSender<()>,
    ) -> Router {
        let handler = move |Path(n): Path<u64>| {
            let (gate, entered) = (gate.clone(), entered.clone());
            async move {
                let _ = entered.send(());
                gate.acquire().await.unwrap().forget();
                ([("x-tokens-used", n.to_string())], "ok")
            }
        };
        Router::new().route("/{n}", get(handler)).layer(layer)
    }

    /// Waits (bounded) until `cmd` has been called `n` times since the last reset.
    fn wait_for_calls(server: &RedisServer, cmd: &str, n: u64) {
        tokio::task::block_in_place(|| {
            redis_support::wait_until(
                Duration::from_secs(10),
                "the settlements to land",
                || (server.command_calls(cmd) >= n).then_some(()),
                || format!("{cmd} calls: {}", server.command_calls(cmd)),
            )
        });
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_settled_request_costs_two_redis_calls_and_one_settled_to_its_reservation_one() {
        require_redis();
        let server = RedisServer::start();
        // Redis expires keys on its own clock: the test's starts at now.
        let clock = ManualClock::new(SystemClock.now_ms());
        let layer = layer_on(&server, &clock, tokens(1_000_000), 100);
        layer.connect().await.unwrap();
        let open = Arc::new(Semaphore::new(Semaphore::MAX_PERMITS));
        let app = app(layer.clone(), open, mpsc::unbounded_channel().0);
        let call = |path: &'static str| {
            let app = app.clone();
            async move {
                let res = app
                    .oneshot(Request::get(path).body(Body::empty()).unwrap())
                    .await
                    .unwrap();
                assert_eq!(res.status(), StatusCode::OK);
            }
        };
        // Every script is loaded once: charge, settle, status.
        call("/1").await;
        let mut left = 0;
        for _ in 0..1_000 {
            left = remaining(&layer).await;
            if left == 1_000_000 - 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(left, 1_000_000 - 1, "the first settlement landed");
        server.config_resetstat();
        for _ in 0..20 {
            call("/7").await;
        }
        // Settlements run off the response path: wait for the last to land.
        wait_for_calls(&server, "evalsha", 40);
        assert_eq!(remaining(&layer).await, 1_000_000 - 1 - 20 * 7);
        assert_eq!(
            server.command_calls("evalsha"),
            41,
            "20 charges, 20 settlements, and the status read"
        );

        server.config_resetstat();
        for _ in 0..20 {
            call("/100").await; // settled to its reservation: nothing to send
        }
        call("/7").await;
        wait_for_calls(&server, "evalsha", 22);
        assert_eq!(remaining(&layer).await, 1_000_000 - 1 - 21 * 7 - 20 * 100);
        assert_eq!(
            server.command_calls("evalsha"),
            23,
            "21 charges, 1 settlement, and the status read"
        );
        assert_eq!(
            server.command_calls("eval") + server.command_calls("script|load"),
            0
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_body_keeps_its_reservation_in_redis_and_costs_no_second_call() {
        require_redis();
        let server = RedisServer::start();
        let clock = ManualClock::new(SystemClock.now_ms());
        let layer = egress(&clock)
            .store(RedisStore::new(server.url()).unwrap())
            .build()
            .unwrap();
        layer.connect().await.unwrap();
        // The charge and status scripts are loaded.
        drop_after_one_frame(&layer).await;
        assert_eq!(remaining(&layer).await, 9_000, "the reservation stands");
        server.config_resetstat();
        drop_after_one_frame(&layer).await;
        assert_eq!(remaining(&layer).await, 8_000, "the reservation stands");
        assert_eq!(
            server.command_calls("evalsha"),
            2,
            "the charge and the status read: no settlement"
        );
    }

    /// Two layers (two processes' worth: each its own connections) share one
    /// Redis and a quota of 1,000 tokens with nothing reserved. Three
    /// requests of 300 settle one by one; then four are admitted while 100
    /// are left and held in flight, and each turns out to cost 300.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn what_two_layers_admit_beyond_a_unit_quota_is_bounded_by_the_settlements_in_flight_when_it_ran_out(
    ) {
        require_redis();
        let server = RedisServer::start();
        // Redis expires keys on its own clock: the test's starts at now.
        let clock = ManualClock::new(SystemClock.now_ms());
        let gate = Arc::new(Semaphore::new(0));
        let layers = [0, 1].map(|_| layer_on(&server, &clock, tokens(1_000), 0));
        let (entered, mut admitted_now) = mpsc::unbounded_channel();
        let apps = layers
            .clone()
            .map(|l| app(l, gate.clone(), entered.clone()));
        let client = HttpClient::new();
        let servers = [
            TestServer::start(apps[0].clone()).await,
            TestServer::start(apps[1].clone()).await,
        ];
        let url = |i: usize| servers[i % 2].url("/300");

        for i in 0..3 {
            gate.add_permits(1);
            let r = client.get(&url(i)).await;
            assert_eq!(r.status, StatusCode::OK);
            admitted_now.recv().await.unwrap();
        }
        // Each settlement lands before the next charge reads the state.
        wait_for_calls(&server, "evalsha", 6);
        assert_eq!(remaining(&layers[0]).await, 100);

        let in_flight: Vec<_> = (0..4)
            .map(|i| {
                let (client, url) = (client.clone(), url(i));
                tokio::spawn(async move { client.get(&url).await })
            })
            .collect();
        // All four admitted while 100 were left, none settled yet.
        for _ in 0..4 {
            admitted_now.recv().await.unwrap();
        }
        let before = server.command_calls("evalsha");
        gate.add_permits(4);
        let mut admitted = 0;
        for r in in_flight {
            let r = r.await.unwrap();
            assert_eq!(r.status, StatusCode::OK);
            admitted += 300;
        }
        wait_for_calls(&server, "evalsha", before + 4);
        let spent = 3 * 300 + admitted;
        // The bound: what was spent before the last admission (at most the
        // limit - 1, here 900) plus the real costs of the requests in
        // flight then (1,200).
        assert_eq!(spent, 2_100);
        assert!(spent <= 999 + 4 * 300);
        assert_eq!(remaining(&layers[1]).await, 0, "1,100 in debt");
        for i in 0..2 {
            gate.add_permits(1);
            let r = client.get(&url(i)).await;
            assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "layer {i}");
            assert!(r.body.contains(r#""violated-policies":["tokens"]"#));
        }

        // Reservations that must fit, and are exact, never overshoot: the
        // fourth of 300 does not fit in the 100 left, in either layer.
        let fits = tokens(1_000).only_while_the_reservation_fits();
        let layers = [0, 1].map(|_| {
            builder(fits.clone(), &clock)
                .name("fits")
                .store(RedisStore::new(server.url()).unwrap())
                .settlement(Settlement::new().reserve(|_| 300))
                .build()
                .unwrap()
        });
        let mut statuses = Vec::new();
        for i in 0..4 {
            let res = layers[i % 2]
                .clone()
                .layer(tower::service_fn(|_req: Request<Body>| async {
                    Ok::<_, Infallible>(Response::new(Body::empty()))
                }))
                .oneshot(Request::get("/").body(Body::empty()).unwrap())
                .await
                .unwrap();
            statuses.push(res.status());
        }
        assert_eq!(
            statuses,
            [
                StatusCode::OK,
                StatusCode::OK,
                StatusCode::OK,
                StatusCode::TOO_MANY_REQUESTS
            ]
        );
    }
}
