//! gRPC: real tonic clients against real tonic (and axum + tonic) servers on 127.0.0.1.

use crate::support::example;
use crate::support::http as http_support;

use axum::{routing::get, Router};
use http_support::HttpClient;
use std::net::SocketAddr;
use std::time::Duration;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{Code, Request};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_types::StatusExt;
use tower_ratelimit::clock::ManualClock;
use tower_ratelimit::key::{ApiKey, GrpcMethod, Header, KeyExtractorExt, PeerIp};
use tower_ratelimit::rate::Settlement;
use tower_ratelimit::store::RedisStore;
use tower_ratelimit::{failure::OnStoreError, grpc, Policy, Quota, RateLimitLayer};

const T0: u64 = 1_800_000_000_000;

/// The health service with "" and "known" serving.
async fn health(
) -> tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health> {
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    reporter
        .set_service_status("known", tonic_health::ServingStatus::Serving)
        .await;
    service
}

async fn serve(layer: RateLimitLayer) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let svc = health().await;
    tokio::spawn(async move {
        Server::builder()
            .layer(layer)
            .add_service(svc)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    addr
}

async fn client(addr: SocketAddr) -> HealthClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

fn check(service: &str) -> Request<HealthCheckRequest> {
    Request::new(HealthCheckRequest {
        service: service.into(),
    })
}

fn with_key(service: &str, key: &'static str) -> Request<HealthCheckRequest> {
    let mut r = check(service);
    r.metadata_mut().insert("x-api-key", key.parse().unwrap());
    r
}

fn layer(limit: u64) -> tower_ratelimit::RateLimitLayerBuilder {
    RateLimitLayer::builder()
        .quota(Quota::new(limit, Duration::from_secs(60)).unwrap())
        .clock(ManualClock::new(T0))
}

#[tokio::test]
async fn calls_beyond_the_quota_get_resource_exhausted_with_metadata_and_a_readable_retry_delay() {
    let addr = serve(layer(2).key(GrpcMethod).build().unwrap()).await;
    let mut c = client(addr).await;
    for remaining in ["1", "0"] {
        let res = c.check(check("")).await.unwrap();
        let md = res.metadata();
        assert_eq!(md.get("x-ratelimit-limit").unwrap(), "2");
        assert_eq!(md.get("x-ratelimit-remaining").unwrap(), remaining);
        assert!(md.get("x-ratelimit-reset").is_some());
    }
    let status = c.check(check("")).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(
        status.message().contains("retry in 60 s"),
        "{}",
        status.message()
    );
    let md = status.metadata();
    assert_eq!(md.get("x-ratelimit-remaining").unwrap(), "0");
    assert_eq!(md.get("retry-after").unwrap(), "60");
    assert_eq!(md.get("grpc-retry-pushback-ms").unwrap(), "60000");
    let retry = status
        .get_details_retry_info()
        .expect("a google.rpc.RetryInfo detail");
    assert_eq!(retry.retry_delay, Some(Duration::from_secs(60)));
}

#[tokio::test]
async fn one_layer_serves_an_axum_route_and_a_grpc_service_on_one_port_with_the_right_answer_for_each(
) {
    let limit = layer(2).build().unwrap();
    let grpc_routes = tonic::service::Routes::new(health().await).into_axum_router();
    let app = Router::new()
        .route("/hello", get(|| async { "hi" }))
        .merge(grpc_routes)
        .layer(limit);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    let http = HttpClient::new();
    let url = format!("http://{addr}/hello");
    let mut grpc_client = client(addr).await;
    assert_eq!(http.get(&url).await.status, 200);
    assert!(grpc_client.check(check("")).await.is_ok());
    // The shared quota is spent: HTTP gets an HTTP 429, gRPC a gRPC status.
    let r = http.get(&url).await;
    assert_eq!(r.status, 429);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert!(r.header("grpc-status").is_none());
    let status = grpc_client.check(check("")).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
}

#[tokio::test]
async fn per_method_quotas_give_an_expensive_method_its_own_limit() {
    let cheap = Policy::new(Quota::new(3, Duration::from_secs(60)).unwrap());
    let expensive = Policy::new(
        Quota::new(1, Duration::from_secs(60))
            .unwrap()
            .named("watch")
            .unwrap(),
    );
    let l = RateLimitLayer::builder()
        .key(GrpcMethod)
        .policy_fn(move |parts, _| {
            if parts.uri.path().ends_with("/Watch") {
                expensive.clone()
            } else {
                cheap.clone()
            }
        })
        .clock(ManualClock::new(T0))
        .build()
        .unwrap();
    let mut c = client(serve(l).await).await;
    // The streaming method: one call opens, the next is refused at the start.
    let stream = c.watch(check("")).await.unwrap();
    assert_eq!(stream.metadata().get("x-ratelimit-limit").unwrap(), "1");
    assert_eq!(
        c.watch(check("")).await.unwrap_err().code(),
        Code::ResourceExhausted
    );
    // The cheap method keeps its own three calls.
    for _ in 0..3 {
        assert!(c.check(check("")).await.is_ok());
    }
    assert_eq!(
        c.check(check("")).await.unwrap_err().code(),
        Code::ResourceExhausted
    );
}

#[tokio::test]
async fn metadata_keys_limit_each_api_key_separately() {
    let l = layer(2)
        .key(Header::try_new("x-api-key").unwrap())
        .build()
        .unwrap();
    let mut c = client(serve(l).await).await;
    assert!(c.check(with_key("", "alice")).await.is_ok());
    assert!(c.check(with_key("", "alice")).await.is_ok());
    assert_eq!(
        c.check(with_key("", "alice")).await.unwrap_err().code(),
        Code::ResourceExhausted
    );
    assert!(
        c.check(with_key("", "bob")).await.is_ok(),
        "another key has its own quota"
    );
    // Missing metadata is the caller's: INVALID_ARGUMENT naming it, not an HTTP 400.
    let status = c.check(check("")).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("x-api-key"),
        "{}",
        status.message()
    );
}

#[tokio::test]
async fn a_key_a_misconfiguration_prevents_is_internal() {
    #[derive(Clone)]
    struct Tenant(u64);
    let l = layer(2)
        .key(tower_ratelimit::key::extension(|t: &Tenant| {
            tower_ratelimit::key::Key::new(t.0.to_le_bytes())
        }))
        .build()
        .unwrap();
    let mut c = client(serve(l).await).await;
    let status = c.check(check("")).await.unwrap_err();
    assert_eq!(status.code(), Code::Internal);
    assert!(status.message().contains("Tenant"), "{}", status.message());
}

#[tokio::test]
async fn secret_metadata_and_the_peer_address_combine_into_one_key() {
    // tonic records the peer as TcpConnectInfo; the API key is hashed.
    let l = layer(1)
        .key(ApiKey::try_header("x-api-key").unwrap().and(PeerIp::new()))
        .build()
        .unwrap();
    let mut c = client(serve(l).await).await;
    assert!(c.check(with_key("", "k1")).await.is_ok());
    assert_eq!(
        c.check(with_key("", "k1")).await.unwrap_err().code(),
        Code::ResourceExhausted
    );
    assert!(c.check(with_key("", "k2")).await.is_ok());
}

#[tokio::test]
async fn a_fail_closed_store_error_is_unavailable_with_a_pushback() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let store = RedisStore::new(format!("redis://127.0.0.1:{port}")).unwrap();
    let l = layer(5)
        .store(store)
        .on_store_error(OnStoreError::FailClosed)
        .build()
        .unwrap();
    let mut c = client(serve(l).await).await;
    let status = c.check(check("")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert!(status.metadata().get("grpc-retry-pushback-ms").is_some());
}

#[tokio::test]
async fn a_refund_predicate_over_grpc_statuses_makes_not_found_free() {
    let l = layer(2)
        .settlement(Settlement::new().refund_if(|status, headers| {
            status == 304 || grpc::status_code(headers) == Some(grpc::NOT_FOUND)
        }))
        .build()
        .unwrap();
    let mut c = client(serve(l).await).await;
    // Free, as many as the quota's limit in a window (free responses are
    // bounded: a client could make every call one).
    for _ in 0..2 {
        assert_eq!(
            c.check(check("unknown")).await.unwrap_err().code(),
            Code::NotFound,
            "not charged"
        );
    }
    assert!(c.check(check("known")).await.is_ok());
    assert!(c.check(check("known")).await.is_ok());
    assert_eq!(
        c.check(check("known")).await.unwrap_err().code(),
        Code::ResourceExhausted
    );
}

/// A unary gRPC answer ends with trailers (`grpc-status`): a unit quota
/// reserves 30 per call and settles from them, 5 for a call that
/// succeeded. A trailers-only answer (an error) is its head: settled there,
/// to nothing the trailers say, so its reservation stands.
#[tokio::test]
async fn a_calls_trailers_settle_its_unit_quota_when_its_stream_ends() {
    let units = Quota::new(100, Duration::from_secs(60))
        .unwrap()
        .named("units")
        .unwrap()
        .with_unit("units")
        .unwrap();
    let l = RateLimitLayer::builder()
        .quota(units)
        .clock(ManualClock::new(T0))
        .settlement(
            Settlement::new()
                .reserve(|_| 30)
                .from_trailers(|t| (grpc::status_code(t) == Some(grpc::OK)).then_some(5)),
        )
        .build()
        .unwrap();
    let mut c = client(serve(l.clone()).await).await;
    let left = || {
        let (parts, ()) = http::Request::new(()).into_parts();
        let status = l.status(&parts);
        async move { status.await.unwrap().unwrap().decision.statuses()[0].remaining }
    };
    c.check(check("known")).await.unwrap();
    assert_eq!(left().await, 95, "reserved 30, settled to 5");
    c.check(check("known")).await.unwrap();
    assert_eq!(left().await, 90);
    assert_eq!(
        c.check(check("unknown")).await.unwrap_err().code(),
        Code::NotFound
    );
    assert_eq!(left().await, 60, "no trailers: the reservation stands");
}

#[tokio::test]
async fn the_tonic_example_serves_health_behind_the_limiter() {
    let server = example::Running::start(
        "tonic",
        &[
            "--listen",
            "127.0.0.1:0",
            "--limit",
            "1",
            "--window",
            "1h",
            "--key",
            "method",
        ],
    );
    let mut c = client(server.addr).await;
    assert!(c.check(check("")).await.is_ok());
    assert_eq!(
        c.check(check("")).await.unwrap_err().code(),
        Code::ResourceExhausted
    );
    drop(c);
    assert!(server.terminate().success());
}
