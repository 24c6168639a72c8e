//! The layer through a real axum server and a real HTTP client over TCP, and
//! through `oneshot` with `Router::layer`, `route_layer` and `ServiceBuilder`.

use crate::support::http as http_support;

use axum::{http::StatusCode, routing::get, Router};
use http::request::Parts;
use http_support::{app, HttpClient, TestServer};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower::{ServiceBuilder, ServiceExt};
use tower_ratelimit::clock::ManualClock;
use tower_ratelimit::key::{ClientIp, Global, Header, Key, KeyExtractorExt, PeerIp};
use tower_ratelimit::{headers::HeaderStyle, Policy, Quota, RateLimitLayer};

/// A time in the middle of a second, so second boundaries are crossed inside a window.
const T0: u64 = 1_700_000_000_400;

/// An empty `GET` of `path`, for `oneshot`.
fn get_req(path: &str) -> http::Request<axum::body::Body> {
    http::Request::get(path)
        .body(axum::body::Body::empty())
        .unwrap()
}

/// One request a minute for everyone (the global key), on the system clock.
fn one_a_minute() -> RateLimitLayer {
    RateLimitLayer::builder()
        .quota(Quota::new(1, Duration::from_secs(60)).unwrap())
        .key(|_: &Parts| Key::global())
        .build()
        .unwrap()
}

fn layer(limit: u64, window: Duration, clock: &ManualClock) -> RateLimitLayer {
    RateLimitLayer::builder()
        .quota(Quota::new(limit, window).unwrap())
        .key(PeerIp::new())
        .clock(clock.clone())
        .build()
        .unwrap()
}

#[tokio::test]
async fn allowed_responses_carry_github_headers_and_one_reset_across_second_boundaries() {
    let clock = ManualClock::new(T0);
    let server = TestServer::start(app().layer(layer(5, Duration::from_secs(60), &clock))).await;
    let client = HttpClient::new();
    let expected_reset = (T0 + 60_000).div_ceil(1000);
    for i in 0..5u64 {
        let r = client.get(&server.url("/")).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body, "ok");
        assert_eq!(r.header_u64("x-ratelimit-limit"), 5);
        assert_eq!(r.header_u64("x-ratelimit-remaining"), 4 - i);
        assert_eq!(r.header_u64("x-ratelimit-used"), i + 1);
        assert_eq!(
            r.header_u64("x-ratelimit-reset"),
            expected_reset,
            "request {i}"
        );
        assert!(r.header("retry-after").is_none());
        // 700 ms per request: crosses several second boundaries within the window.
        clock.advance(Duration::from_millis(700));
    }
}

#[tokio::test]
async fn rejected_response_has_remaining_zero_a_future_reset_retry_after_and_a_problem_document() {
    let clock = ManualClock::new(T0);
    let server = TestServer::start(app().layer(layer(2, Duration::from_secs(60), &clock))).await;
    let client = HttpClient::new();
    let first = client.get(&server.url("/")).await;
    client.get(&server.url("/")).await;
    clock.advance(Duration::from_millis(10_300));
    let r = client.get(&server.url("/")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header_u64("x-ratelimit-remaining"), 0);
    let reset = r.header_u64("x-ratelimit-reset");
    assert_eq!(
        reset,
        first.header_u64("x-ratelimit-reset"),
        "same window, same reset"
    );
    assert!(reset * 1000 > T0 + 10_300, "reset is in the future");
    let retry = r.header_u64("retry-after");
    assert!(retry > 0);
    assert_eq!(retry, (60_000u64 - 10_300).div_ceil(1000));
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert!(
        r.body.contains(&format!("\"retry_after\":{retry}")),
        "{}",
        r.body
    );
    assert!(r.body.contains("\"status\":429"));
}

#[tokio::test]
async fn not_modified_responses_are_refunded_and_show_the_refunded_remaining() {
    let clock = ManualClock::new(T0);
    let server = TestServer::start(app().layer(layer(2, Duration::from_secs(60), &clock))).await;
    let client = HttpClient::new();
    // As many free responses as the limit, in a window.
    for _ in 0..2 {
        let r = client.get(&server.url("/not-modified")).await;
        assert_eq!(r.status, StatusCode::NOT_MODIFIED);
        assert_eq!(
            r.header_u64("x-ratelimit-remaining"),
            2,
            "a 304 costs nothing"
        );
    }
    assert_eq!(client.get(&server.url("/")).await.status, StatusCode::OK);
    let r = client.get(&server.url("/not-modified")).await;
    assert_eq!(r.status, StatusCode::NOT_MODIFIED);
    assert_eq!(
        r.header_u64("x-ratelimit-remaining"),
        0,
        "past them, charged"
    );
    assert_eq!(
        client.get(&server.url("/")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // A new window, new free responses.
    clock.advance(Duration::from_secs(60));
    let r = client.get(&server.url("/not-modified")).await;
    assert_eq!(r.header_u64("x-ratelimit-remaining"), 2);
}

#[tokio::test]
async fn a_new_window_opens_once_the_stored_reset_has_passed() {
    let clock = ManualClock::new(T0);
    let server = TestServer::start(app().layer(layer(1, Duration::from_secs(10), &clock))).await;
    let client = HttpClient::new();
    let a = client.get(&server.url("/")).await;
    assert_eq!(
        client.get(&server.url("/")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    clock.advance(Duration::from_secs(10));
    let b = client.get(&server.url("/")).await;
    assert_eq!(b.status, StatusCode::OK);
    assert_eq!(
        b.header_u64("x-ratelimit-reset"),
        a.header_u64("x-ratelimit-reset") + 10
    );
}

#[tokio::test]
async fn ietf_style_names_every_policy_and_both_style_sends_both() {
    let clock = ManualClock::new(T0);
    let policy = Policy::new(Quota::new(10, Duration::from_secs(1)).unwrap())
        .and(
            Quota::new(100, Duration::from_secs(3600))
                .unwrap()
                .named("hourly")
                .unwrap(),
        )
        .unwrap();
    let l = RateLimitLayer::builder()
        .quota(policy)
        .clock(clock.clone())
        .headers(HeaderStyle::Both)
        .build()
        .unwrap();
    let server = TestServer::start(app().layer(l)).await;
    let r = HttpClient::new().get(&server.url("/")).await;
    assert_eq!(
        r.header("ratelimit-policy"),
        Some(r#""1s";q=10;w=1, "hourly";q=100;w=3600"#)
    );
    assert_eq!(
        r.header("ratelimit"),
        Some(r#""1s";r=9;t=1, "hourly";r=99;t=3600"#)
    );
    // GitHub headers report the most restrictive quota: 9 of 10 left beats 99 of 100.
    assert_eq!(r.header_u64("x-ratelimit-remaining"), 9);
}

#[tokio::test]
async fn header_style_none_sends_no_rate_limit_headers_but_rejections_keep_retry_after() {
    let clock = ManualClock::new(T0);
    let l = RateLimitLayer::builder()
        .quota(Quota::new(1, Duration::from_secs(5)).unwrap())
        .clock(clock)
        .headers(HeaderStyle::None)
        .build()
        .unwrap();
    let server = TestServer::start(app().layer(l)).await;
    let client = HttpClient::new();
    let ok = client.get(&server.url("/")).await;
    assert!(ok.headers.keys().all(|k| !k.as_str().contains("ratelimit")));
    let no = client.get(&server.url("/")).await;
    assert_eq!(no.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(no.header_u64("retry-after"), 5);
}

/// A handler that counts its calls.
fn counting_app(calls: Arc<AtomicUsize>) -> Router {
    Router::new().route(
        "/",
        get(move || {
            let calls = calls.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                "ok"
            }
        }),
    )
}

#[tokio::test]
async fn a_rejected_request_never_reaches_the_inner_service() {
    let clock = ManualClock::new(T0);
    let calls = Arc::new(AtomicUsize::new(0));
    let app = counting_app(calls.clone()).layer(layer(3, Duration::from_secs(60), &clock));
    let server = TestServer::start(app).await;
    let client = HttpClient::new();
    let mut ok = 0;
    for _ in 0..10 {
        if client.get(&server.url("/")).await.status == StatusCode::OK {
            ok += 1;
        }
    }
    assert_eq!(ok, 3);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn clones_of_one_layer_share_one_limiter() {
    let clock = ManualClock::new(T0);
    let l = RateLimitLayer::builder()
        .quota(Quota::new(3, Duration::from_secs(60)).unwrap())
        .clock(clock)
        .build()
        .unwrap();
    let a = Router::new()
        .route("/", get(|| async { "a" }))
        .layer(l.clone());
    let b = Router::new().route("/", get(|| async { "b" })).layer(l);
    let mut admitted = 0;
    for i in 0..6 {
        let svc = if i % 2 == 0 { a.clone() } else { b.clone() };
        let res = svc.oneshot(get_req("/")).await.unwrap();
        admitted += usize::from(res.status() == StatusCode::OK);
    }
    assert_eq!(admitted, 3);
}

#[tokio::test]
async fn route_layer_limits_only_matched_routes_and_unmatched_paths_stay_404() {
    let clock = ManualClock::new(T0);
    let app = Router::new()
        .route("/limited", get(|| async { "x" }))
        .route_layer(layer(1, Duration::from_secs(60), &clock))
        .route("/free", get(|| async { "y" }));
    let peer = axum::extract::connect_info::MockConnectInfo(std::net::SocketAddr::from((
        [10, 0, 0, 1],
        1234,
    )));
    let app = app.layer(peer);
    let first = app.clone().oneshot(get_req("/limited")).await.unwrap();
    assert_eq!(
        first.status(),
        StatusCode::OK,
        "{:?}",
        http_body_util::BodyExt::collect(first.into_body())
            .await
            .unwrap()
            .to_bytes()
    );
    assert_eq!(
        app.clone()
            .oneshot(get_req("/limited"))
            .await
            .unwrap()
            .status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    for _ in 0..3 {
        assert_eq!(
            app.clone()
                .oneshot(get_req("/free"))
                .await
                .unwrap()
                .status(),
            StatusCode::OK
        );
        assert_eq!(
            app.clone()
                .oneshot(get_req("/missing"))
                .await
                .unwrap()
                .status(),
            StatusCode::NOT_FOUND
        );
    }
}

#[tokio::test]
async fn a_bare_service_builder_stack_is_limited_and_keeps_its_error_type() {
    let clock = ManualClock::new(T0);
    let svc = ServiceBuilder::new()
        .layer(layer(2, Duration::from_secs(60), &clock))
        .service_fn(|_req: http::Request<String>| async {
            Ok::<_, Infallible>(http::Response::new(http_body_util::Full::new(
                bytes::Bytes::from("hi"),
            )))
        });
    let req = || {
        let mut r = http::Request::new(String::new());
        r.extensions_mut()
            .insert(std::net::SocketAddr::from(([192, 0, 2, 1], 80)));
        r
    };
    let statuses: Vec<u16> = {
        let mut v = vec![];
        for _ in 0..3 {
            let res: Result<_, Infallible> = svc.clone().oneshot(req()).await;
            v.push(res.unwrap().status().as_u16());
        }
        v
    };
    assert_eq!(statuses, [200, 200, 429]);
}

#[tokio::test]
async fn an_exempt_request_is_neither_counted_nor_given_headers() {
    let clock = ManualClock::new(T0);
    let l = RateLimitLayer::builder()
        .quota(Quota::new(1, Duration::from_secs(60)).unwrap())
        .key(
            |p: &Parts| -> Result<Option<Key>, tower_ratelimit::key::KeyError> {
                Ok((p.uri.path() != "/health").then(Key::global))
            },
        )
        .clock(clock)
        .build()
        .unwrap();
    let app = app().route("/health", get(|| async { "up" })).layer(l);
    let server = TestServer::start(app).await;
    let c = HttpClient::new();
    for _ in 0..3 {
        let r = c.get(&server.url("/health")).await;
        assert_eq!(r.status, StatusCode::OK);
        assert!(r.header("x-ratelimit-remaining").is_none());
    }
    assert_eq!(c.get(&server.url("/")).await.status, StatusCode::OK);
    assert_eq!(
        c.get(&server.url("/")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

async fn body_of<B: http_body::Body>(res: http::Response<B>) -> String
where
    B::Error: std::fmt::Debug,
{
    let body = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes();
    String::from_utf8_lossy(&body).into_owned()
}

fn keyed_by(key: impl tower_ratelimit::key::KeyExtractor) -> RateLimitLayer {
    RateLimitLayer::builder()
        .quota(Quota::new(5, Duration::from_secs(60)).unwrap())
        .key(key)
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_request_missing_its_bearer_token_or_key_header_gets_400_naming_the_header() {
    use tower_ratelimit::key::ApiKey;
    let client = HttpClient::new();
    for (layer, header) in [
        (keyed_by(ApiKey::bearer()), "authorization"),
        (keyed_by(Header::try_new("x-api-key").unwrap()), "x-api-key"),
        (
            keyed_by(ApiKey::header(http::HeaderName::from_static("x-api-key"))),
            "x-api-key",
        ),
    ] {
        // Through a real server over TCP, and through `oneshot`.
        let server = TestServer::start(app().layer(layer.clone())).await;
        let r = client.get(&server.url("/")).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{header}: {}", r.body);
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        assert!(r.body.contains(header), "{}", r.body);
        assert!(r.body.contains("\"status\":400"), "{}", r.body);
        let res = app().layer(layer).oneshot(get_req("/")).await.unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST);
        assert!(body_of(res).await.contains(header));
    }
    // With the token present, the same layer limits as usual.
    let server = TestServer::start(app().layer(keyed_by(ApiKey::bearer()))).await;
    let r = client
        .get_with(&server.url("/"), &[("authorization", b"Bearer t0ken")])
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header_u64("x-ratelimit-remaining"), 4);
}

#[tokio::test]
async fn an_api_key_with_the_client_ip_as_fallback_limits_callers_without_one_by_address() {
    use tower_ratelimit::key::{ApiKey, KeyExtractorExt};
    let layer = keyed_by(ApiKey::bearer().or(PeerIp::new()));
    let server = TestServer::start(app().layer(layer)).await;
    let c = HttpClient::new();
    for left in [4, 3] {
        let r = c.get(&server.url("/")).await;
        assert_eq!(r.status, StatusCode::OK, "keyed by the peer address");
        assert_eq!(r.header_u64("x-ratelimit-remaining"), left);
    }
    let r = c
        .get_with(&server.url("/"), &[("authorization", b"Bearer k")])
        .await;
    assert_eq!(
        r.header_u64("x-ratelimit-remaining"),
        4,
        "the key has its own quota"
    );
}

#[tokio::test]
async fn a_misconfiguration_is_500_missing_connect_info_or_an_extension_the_app_should_set() {
    #[derive(Clone)]
    struct User(u64);
    let by_user = keyed_by(tower_ratelimit::key::extension(|u: &User| {
        Key::new(u.0.to_le_bytes())
    }));
    // Over TCP there is a peer, but no middleware inserted `User`.
    let server = TestServer::start(app().layer(by_user)).await;
    let r = HttpClient::new().get(&server.url("/")).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", r.body);
    assert!(r.body.contains("User"), "{}", r.body);
}

#[tokio::test]
async fn a_missing_key_gets_a_500_naming_the_extractor_and_the_fix() {
    // No connect info: PeerIp cannot find the peer address.
    let app = app().layer(layer(5, Duration::from_secs(60), &ManualClock::new(T0)));
    let res = app.oneshot(get_req("/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes();
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("peer_ip"), "{body}");
    assert!(body.contains("connect_info"), "{body}");
}

#[tokio::test]
async fn the_key_error_response_is_configurable() {
    let l = RateLimitLayer::builder()
        .quota(Quota::new(5, Duration::from_secs(60)).unwrap())
        .key(Header::try_new("x-api-key").unwrap())
        .on_key_error(|_| {
            http::Response::builder()
                .status(401)
                .body(bytes::Bytes::from("who are you?"))
                .unwrap()
        })
        .build()
        .unwrap();
    let res = app().layer(l).oneshot(get_req("/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn async_policy_gives_tiers_per_key() {
    let clock = ManualClock::new(T0);
    let l = RateLimitLayer::builder()
        .key(Header::try_new("x-user").unwrap())
        .policy_async(|parts: &Parts, _key| {
            let premium = parts.headers.get("x-user").is_some_and(|v| v == "premium");
            async move {
                tokio::task::yield_now().await; // a real lookup would await a database here
                let limit = if premium { 5 } else { 2 };
                Ok(Policy::new(
                    Quota::new(limit, Duration::from_secs(60)).unwrap(),
                ))
            }
        })
        .clock(clock)
        .build()
        .unwrap();
    let server = TestServer::start(app().layer(l)).await;
    let c = HttpClient::new();
    let count = |user: &'static str| {
        let c = c.clone();
        let url = server.url("/");
        async move {
            let mut ok = 0;
            for _ in 0..8 {
                if c.get_with(&url, &[("x-user", user.as_bytes())])
                    .await
                    .status
                    == StatusCode::OK
                {
                    ok += 1;
                }
            }
            ok
        }
    };
    assert_eq!(count("premium").await, 5);
    assert_eq!(count("free").await, 2);
}

#[tokio::test]
async fn async_key_extraction_keys_and_exempts() {
    let l = RateLimitLayer::builder()
        .quota(Quota::new(1, Duration::from_secs(60)).unwrap())
        .key_async(|parts: &Parts| {
            let user = parts.headers.get("x-user").cloned();
            async move { Ok(user.map(|u| Key::new(u.as_bytes()))) }
        })
        .clock(ManualClock::new(T0))
        .build()
        .unwrap();
    let server = TestServer::start(app().layer(l)).await;
    let c = HttpClient::new();
    let url = server.url("/");
    assert_eq!(
        c.get_with(&url, &[("x-user", b"a")]).await.status,
        StatusCode::OK
    );
    assert_eq!(
        c.get_with(&url, &[("x-user", b"a")]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        c.get_with(&url, &[("x-user", b"b")]).await.status,
        StatusCode::OK
    );
    // No user: exempt.
    assert_eq!(c.get(&url).await.status, StatusCode::OK);
    assert_eq!(c.get(&url).await.status, StatusCode::OK);
}

#[tokio::test]
async fn cost_closure_spends_several_units_and_a_cost_above_the_limit_is_refused_with_a_reason() {
    let l = RateLimitLayer::builder()
        .quota(Quota::new(10, Duration::from_secs(60)).unwrap())
        .cost(|p: &Parts| {
            p.headers
                .get("x-cost")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        })
        .clock(ManualClock::new(T0))
        .build()
        .unwrap();
    let server = TestServer::start(app().layer(l)).await;
    let c = HttpClient::new();
    let url = server.url("/");
    let r = c.get_with(&url, &[("x-cost", b"4")]).await;
    assert_eq!(
        (r.status, r.header_u64("x-ratelimit-remaining")),
        (StatusCode::OK, 6)
    );
    let r = c.get_with(&url, &[("x-cost", b"11")]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(r.body.contains("can never be admitted"), "{}", r.body);
    assert!(r.header("retry-after").is_none(), "waiting never helps");
    assert_eq!(r.header_u64("x-ratelimit-remaining"), 6, "not charged");
    let r = c.get_with(&url, &[("x-cost", b"7")]).await;
    assert_eq!(
        (r.status, r.header_u64("x-ratelimit-remaining")),
        (StatusCode::TOO_MANY_REQUESTS, 6)
    );
    let r = c.get_with(&url, &[("x-cost", b"6")]).await;
    assert_eq!(
        (r.status, r.header_u64("x-ratelimit-remaining")),
        (StatusCode::OK, 0)
    );
}

#[tokio::test]
async fn a_spoofed_x_forwarded_for_from_an_untrusted_peer_does_not_change_the_key() {
    // The test client connects from 127.0.0.1, which is not trusted here.
    let l = RateLimitLayer::builder()
        .quota(Quota::new(2, Duration::from_secs(60)).unwrap())
        .key(ClientIp::new().trust_cidr("10.0.0.0/8".parse().unwrap()))
        .clock(ManualClock::new(T0))
        .build()
        .unwrap();
    let server = TestServer::start(app().layer(l)).await;
    let c = HttpClient::new();
    let url = server.url("/");
    let statuses: Vec<u16> = {
        let mut v = vec![];
        for spoof in ["1.1.1.1", "2.2.2.2", "3.3.3.3"] {
            v.push(
                c.get_with(&url, &[("x-forwarded-for", spoof.as_bytes())])
                    .await
                    .status
                    .as_u16(),
            );
        }
        v
    };
    assert_eq!(statuses, [200, 200, 429]);
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_rightmost_untrusted_hop_is_the_client() {
    let l = RateLimitLayer::builder()
        .quota(Quota::new(1, Duration::from_secs(60)).unwrap())
        .key(ClientIp::new().trust_loopback())
        .clock(ManualClock::new(T0))
        .build()
        .unwrap();
    let server = TestServer::start(app().layer(l)).await;
    let c = HttpClient::new();
    let url = server.url("/");
    // The leftmost entry is whatever the client wrote; only the rightmost untrusted hop counts.
    let get = |xff: &'static str| {
        let c = c.clone();
        let url = url.clone();
        async move {
            c.get_with(&url, &[("x-forwarded-for", xff.as_bytes())])
                .await
                .status
        }
    };
    assert_eq!(get("9.9.9.9, 203.0.113.7").await, StatusCode::OK);
    assert_eq!(
        get("8.8.8.8, 203.0.113.7").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(get("203.0.113.8").await, StatusCode::OK);
}

#[tokio::test]
async fn non_utf8_and_8_kib_header_values_get_a_defined_answer_not_a_panic() {
    let l = RateLimitLayer::builder()
        .quota(Quota::new(1, Duration::from_secs(60)).unwrap())
        .key(Header::try_new("x-client").unwrap())
        .clock(ManualClock::new(T0))
        .build()
        .unwrap();
    let ip = RateLimitLayer::builder()
        .name("ip")
        .quota(Quota::new(100, Duration::from_secs(60)).unwrap())
        .key(ClientIp::new().trust_loopback())
        .clock(ManualClock::new(T0))
        .build()
        .unwrap();
    let server = TestServer::start(app().layer(l).layer(ip)).await;
    let c = HttpClient::new();
    let url = server.url("/");
    let big = vec![b'a'; 8 * 1024];
    let non_utf8: &[u8] = &[0xff, 0xfe, b'x', 0x80];
    // Each distinct value is its own key, hashed to a bounded size.
    assert_eq!(
        c.get_with(&url, &[("x-client", &big)]).await.status,
        StatusCode::OK
    );
    assert_eq!(
        c.get_with(&url, &[("x-client", &big)]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        c.get_with(&url, &[("x-client", non_utf8)]).await.status,
        StatusCode::OK
    );
    assert_eq!(
        c.get_with(&url, &[("x-client", non_utf8)]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Garbage forwarding headers from a trusted peer fall back to that peer: still answered.
    let garbage_xff = vec![b'z'; 8 * 1024];
    let r = c
        .get_with(
            &url,
            &[("x-client", b"other"), ("x-forwarded-for", &garbage_xff)],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let r = c
        .get_with(
            &url,
            &[("x-client", b"third"), ("x-forwarded-for", non_utf8)],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
}

#[test]
fn sixty_four_tasks_hammering_one_key_admit_exactly_the_quota() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .build()
        .unwrap();
    rt.block_on(async {
        let quota = 1_000;
        let l = RateLimitLayer::builder()
            .quota(Quota::new(quota, Duration::from_secs(3600)).unwrap())
            .clock(ManualClock::new(T0))
            .build()
            .unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let app = counting_app(calls.clone()).layer(l);
        let admitted = Arc::new(AtomicUsize::new(0));
        let mut tasks = vec![];
        for _ in 0..64 {
            let app = app.clone();
            let admitted = admitted.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..50 {
                    let res = app.clone().oneshot(get_req("/")).await.unwrap();
                    if res.status() == StatusCode::OK {
                        admitted.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(admitted.load(Ordering::SeqCst), quota as usize);
        assert_eq!(calls.load(Ordering::SeqCst), quota as usize);
    });
}

/// A store that hands back an already completed future (a bug in a custom store).
struct SpentStore;

/// A future whose value was already taken.
fn spent<T>(value: T) -> tower_ratelimit::store::StoreFuture<T> {
    let mut fut = tower_ratelimit::store::StoreFuture::ready(value);
    assert!(fut.now_or_never().is_some());
    fut
}

impl tower_ratelimit::store::Store for SpentStore {
    fn charge(
        &self,
        _: &tower_ratelimit::store::Charge<'_>,
    ) -> tower_ratelimit::store::StoreFuture<
        Result<tower_ratelimit::decision::Decision, tower_ratelimit::StoreError>,
    > {
        spent(Err(tower_ratelimit::StoreError::CircuitOpen))
    }
    fn settle(
        &self,
        _: &tower_ratelimit::store::Settle<'_>,
    ) -> tower_ratelimit::store::StoreFuture<Result<(), tower_ratelimit::StoreError>> {
        tower_ratelimit::store::StoreFuture::ready(Ok(()))
    }
    fn status(
        &self,
        _: &tower_ratelimit::store::Charge<'_>,
    ) -> tower_ratelimit::store::StoreFuture<
        Result<tower_ratelimit::decision::Decision, tower_ratelimit::StoreError>,
    > {
        spent(Err(tower_ratelimit::StoreError::CircuitOpen))
    }
}

#[tokio::test]
async fn a_store_returning_a_spent_future_is_a_store_error_not_a_panic() {
    let layer = RateLimitLayer::builder()
        .quota(Quota::new(5, Duration::from_secs(60)).unwrap())
        .key(|_: &Parts| Key::global())
        .store(SpentStore)
        .build()
        .unwrap();
    let res = app().layer(layer).oneshot(get_req("/")).await.unwrap();
    // The default failure policy: fail open, without rate-limit headers.
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers().get("x-ratelimit-remaining").is_none());
}

#[tokio::test]
async fn inner_body_answers_exactly_as_the_wrapped_default_over_tcp() {
    let clock = ManualClock::new(T0);
    let window = Duration::from_secs(60);
    let wrapped = TestServer::start(app().layer(layer(2, window, &clock))).await;
    let inner = TestServer::start(app().layer(layer(2, window, &clock).inner_body())).await;
    let client = HttpClient::new();
    // Refunded, admitted twice, then rejected: for a 304 too.
    let steps = [
        ("/not-modified", StatusCode::NOT_MODIFIED),
        ("/", StatusCode::OK),
        ("/", StatusCode::OK),
        ("/", StatusCode::TOO_MANY_REQUESTS),
        ("/not-modified", StatusCode::TOO_MANY_REQUESTS),
    ];
    for (i, (path, status)) in steps.into_iter().enumerate() {
        let mut w = client.get(&wrapped.url(path)).await;
        let mut n = client.get(&inner.url(path)).await;
        assert_eq!(n.status, status, "step {i}");
        assert_eq!(w.status, status, "step {i}");
        if status == StatusCode::NOT_MODIFIED {
            assert_eq!(n.header_u64("x-ratelimit-remaining"), 2, "refunded");
        }
        if status == StatusCode::TOO_MANY_REQUESTS {
            assert!(n.body.contains("\"status\":429"), "{}", n.body);
        }
        // Written by hyper, per second: the one header that may differ.
        w.headers.remove(http::header::DATE);
        n.headers.remove(http::header::DATE);
        assert_eq!(n.headers, w.headers, "step {i}");
        assert_eq!(n.body, w.body, "step {i}");
    }
}

#[tokio::test]
async fn inner_body_answers_in_the_inner_services_own_body_type() {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    let hello = tower::service_fn(|_: http::Request<()>| async {
        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"hello"))))
    });
    let svc = ServiceBuilder::new()
        .layer(one_a_minute().inner_body())
        .service(hello);
    // Annotated: this compiles only if the layer's responses carry `Full<Bytes>`.
    let ok: http::Response<Full<Bytes>> =
        svc.clone().oneshot(http::Request::new(())).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(ok.headers()["x-ratelimit-remaining"], "0");
    assert_eq!(ok.into_body().collect().await.unwrap().to_bytes(), "hello");
    let no: http::Response<Full<Bytes>> = svc.oneshot(http::Request::new(())).await.unwrap();
    assert_eq!(no.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(no.headers()["content-type"], "application/problem+json");
    let body = no.into_body().collect().await.unwrap().to_bytes();
    assert!(body.starts_with(b"{") && body.ends_with(b"}"), "{body:?}");
}

#[tokio::test]
async fn a_grpc_answer_is_headers_only_in_either_body_mode() {
    use http_body::Body as _;
    let grpc = || {
        http::Request::post("/")
            .version(http::Version::HTTP_2)
            .header("content-type", "application/grpc")
            .body(axum::body::Body::empty())
            .unwrap()
    };
    let wrapped = app().layer(one_a_minute());
    let inner = app().layer(one_a_minute().inner_body());
    wrapped.clone().oneshot(grpc()).await.unwrap();
    inner.clone().oneshot(grpc()).await.unwrap();
    let w = wrapped.oneshot(grpc()).await.unwrap();
    let n = inner.oneshot(grpc()).await.unwrap();
    for res in [&w, &n] {
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["grpc-status"], "8");
        assert_eq!(res.headers()["cache-control"], "no-store");
        assert!(res.body().is_end_stream());
        assert_eq!(res.body().size_hint().exact(), Some(0));
    }
}

/// A REST route called over HTTP/1.1 with a gRPC content type (a client's
/// choice) gets the plain answers: a 429, a 400 for a missing key, a 503
/// from an overloaded or failing store, never an HTTP 200 that could be
/// taken for content. Every answer of each limiter says `no-store`.
#[tokio::test]
async fn over_http_1_a_grpc_content_type_gets_plain_answers_and_every_answer_is_no_store() {
    let rest = || {
        http::Request::post("/")
            .header("content-type", "application/grpc")
            .header("x-client", "c")
            .body(axum::body::Body::empty())
            .unwrap()
    };
    let post = || Router::new().route("/", axum::routing::post(|| async { "ok" }));
    let app = post().layer(one_a_minute());
    app.clone().oneshot(rest()).await.unwrap();
    let res = app.oneshot(rest()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["cache-control"], "no-store");
    assert!(!res.headers().contains_key("grpc-status"));

    let keyed = post().layer(
        RateLimitLayer::builder()
            .quota(Quota::new(1, Duration::from_secs(60)).unwrap())
            .key(tower_ratelimit::key::Header::try_new("x-missing").unwrap())
            .build()
            .unwrap(),
    );
    let res = keyed.oneshot(rest()).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(res.headers()["cache-control"], "no-store");

    let concurrency = post().layer(
        tower_ratelimit::ConcurrencyLimitLayer::builder()
            .limit(1)
            .build()
            .unwrap(),
    );
    let held = concurrency.clone().oneshot(rest()).await.unwrap();
    let res = concurrency.oneshot(rest()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["cache-control"], "no-store");
    drop(held);

    let shed = post().layer(
        tower_ratelimit::LoadShedLayer::builder()
            .capacity(10)
            .build()
            .unwrap(),
    );
    // Normal traffic's room: floor(0.9 × 10) = 9.
    let mut held = Vec::new();
    for _ in 0..9 {
        held.push(shed.clone().oneshot(rest()).await.unwrap());
    }
    let res = shed.oneshot(rest()).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()["cache-control"], "no-store");
    drop(held);
}

/// What a handler reads of its request's charge: each quota's limit and
/// remaining, as the headers report them; nothing for an exempt request.
async fn remaining_seen(req: http::Request<axum::body::Body>) -> String {
    match req.extensions().get::<tower_ratelimit::rate::Status>() {
        Some(s) => s
            .decision
            .statuses()
            .iter()
            .map(|q| format!("{}/{}", q.remaining, q.limit))
            .collect::<Vec<_>>()
            .join(","),
        None => "none".to_owned(),
    }
}

#[tokio::test]
async fn handlers_read_each_quotas_remaining_from_the_request_when_asked_to() {
    let clock = ManualClock::new(T0);
    let policy = Policy::new(Quota::new(5, Duration::from_secs(1)).unwrap())
        .and(Quota::new(20, Duration::from_secs(60)).unwrap())
        .unwrap();
    let build = |async_key: bool, on: bool| {
        let b = RateLimitLayer::builder()
            .quota(policy.clone())
            .clock(clock.clone())
            .status_extension(on);
        let b = if async_key {
            // The key comes later: the decision reaches the handler through
            // the pending path.
            b.key_async(|parts: &Parts| {
                let exempt = parts.uri.path() == "/exempt";
                async move { Ok((!exempt).then(|| Key::new("async"))) }
            })
        } else {
            b.key(Global.exempt_if(|parts: &Parts| parts.uri.path() == "/exempt"))
        };
        let routes = Router::new()
            .route("/", get(remaining_seen))
            .route("/exempt", get(remaining_seen));
        routes.layer(b.build().unwrap())
    };
    for async_key in [false, true] {
        let server = TestServer::start(build(async_key, true)).await;
        let client = HttpClient::new();
        for i in 0..3u64 {
            let r = client.get(&server.url("/")).await;
            assert_eq!(r.status, StatusCode::OK);
            assert_eq!(
                r.body,
                format!("{}/5,{}/20", 4 - i, 19 - i),
                "async key: {async_key}"
            );
            assert_eq!(r.header_u64("x-ratelimit-remaining"), 4 - i);
        }
        let r = client.get(&server.url("/exempt")).await;
        assert_eq!(r.body, "none", "an exempt request was not charged");
        // Off (the default): the handler sees nothing.
        let off = TestServer::start(build(async_key, false)).await;
        assert_eq!(client.get(&off.url("/")).await.body, "none");
    }
}

#[tokio::test]
async fn a_quota_in_content_bytes_spends_each_uploads_size_and_names_its_unit_in_ietf_fields() {
    let clock = ManualClock::new(T0);
    let bytes = Quota::new(1_000, Duration::from_secs(60))
        .unwrap()
        .named("upload")
        .unwrap()
        .with_unit("content-bytes")
        .unwrap()
        // Each upload's size is known up front: it must fit.
        .only_while_the_reservation_fits();
    let layer = RateLimitLayer::builder()
        .quota(bytes)
        .key(Global)
        .clock(clock.clone())
        .headers(HeaderStyle::Ietf)
        .cost(|parts: &Parts| {
            parts
                .headers
                .get("x-upload-bytes")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(0)
        })
        .build()
        .unwrap();
    let server = TestServer::start(app().layer(layer)).await;
    let client = HttpClient::new();
    let url = server.url("/");
    let send = |n: &'static [u8]| {
        let (client, url) = (&client, url.clone());
        async move { client.get_with(&url, &[("x-upload-bytes", n)]).await }
    };
    let r = send(b"300").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.header("ratelimit-policy"),
        Some(r#""upload";q=1000;w=60;qu="content-bytes""#)
    );
    assert_eq!(r.header("ratelimit"), Some(r#""upload";r=700;t=60"#));
    assert_eq!(
        send(b"650").await.header("ratelimit"),
        Some(r#""upload";r=50;t=60"#)
    );
    let r = send(b"51").await;
    assert_eq!(
        r.status,
        StatusCode::TOO_MANY_REQUESTS,
        "51 bytes do not fit in 50"
    );
    assert!(
        r.body.contains(r#""violated-policies":["upload"]"#),
        "{}",
        r.body
    );
}

/// A client that makes every response free (`If-None-Match: *` against an
/// endpoint answering 304) gets, per window, the quota's limit of free
/// responses; past that its 304s are charged, and then refused.
#[tokio::test]
async fn a_client_farming_304s_gets_the_quota_s_limit_free_then_pays_for_them() {
    let layer = RateLimitLayer::builder()
        .quota(Quota::new(5, Duration::from_secs(60)).unwrap())
        .key(Global)
        .build()
        .unwrap();
    let http = TestServer::start(app().layer(layer)).await;
    let c = HttpClient::new();
    let mut seen = Vec::new();
    for _ in 0..15 {
        let r = c
            .get_with(&http.url("/not-modified"), &[("if-none-match", b"*")])
            .await;
        seen.push((r.status.as_u16(), r.header_u64("x-ratelimit-remaining")));
    }
    let free = [(304, 5); 5];
    let charged = [(304, 4), (304, 3), (304, 2), (304, 1), (304, 0)];
    let refused = [(429, 0); 5];
    assert_eq!(seen, [&free[..], &charged[..], &refused[..]].concat());
}
