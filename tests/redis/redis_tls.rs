//! The Redis store over TLS (feature `tls`), against real `redis-server`s
//! listening with `--tls-port` and a CA made by the test.

use crate::support::logs;
use crate::support::managed;
use crate::support::redis as redis_support;

use axum::{routing::get, Router};
use http::StatusCode;
use managed::{Certs, TlsRedis};
use redis_support::assert_every_key_has_a_ttl;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;
use tower_ratelimit::clock::{Clock, SystemClock};
use tower_ratelimit::key::{Header, Key};
use tower_ratelimit::store::{Charge, Namespace, RedisStore, RedisStoreBuilder, Store};
use tower_ratelimit::{
    failure::CircuitBreaker, failure::OnStoreError, Policy, Quota, RateLimitLayer, StoreError,
};

fn hourly(limit: u32) -> Policy {
    Policy::new(Quota::per_hour(NonZeroU32::new(limit).unwrap()))
}

fn layer(store: RedisStore, limit: u32, on_error: OnStoreError) -> RateLimitLayer {
    RateLimitLayer::builder()
        .name("tls")
        .quota(hourly(limit))
        .key(Header::try_new("x-client").unwrap())
        .store(store)
        .on_store_error(on_error)
        .circuit_breaker(CircuitBreaker::disabled())
        .store_timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

fn app(layer: RateLimitLayer, calls: Arc<AtomicUsize>) -> Router {
    Router::new()
        .route(
            "/",
            get(move || {
                calls.fetch_add(1, Ordering::SeqCst);
                async { "ok" }
            }),
        )
        .layer(layer)
}

async fn send(app: &Router, client: &str) -> StatusCode {
    let req = http::Request::get("/")
        .header("x-client", client)
        .body(axum::body::Body::empty())
        .unwrap();
    app.clone().oneshot(req).await.unwrap().status()
}

/// One charge straight on the store.
async fn charge(store: &RedisStore) -> Result<tower_ratelimit::decision::Decision, StoreError> {
    store
        .charge(
            &Charge::new(
                &Namespace::new("tls"),
                &Key::new("direct"),
                &hourly(10),
                SystemClock.now_ms(),
            )
            .with_timeout(Duration::from_secs(2)),
        )
        .await
}

fn trusting(server: &TlsRedis, certs: &Certs) -> RedisStoreBuilder {
    RedisStore::builder(server.url()).tls_ca_pem(certs.ca_pem())
}

#[test]
fn two_layers_sharing_a_tls_redis_admit_exactly_the_quota_under_concurrency() {
    managed::require("openssl");
    let certs = Certs::make();
    let server = TlsRedis::start(&certs, false, &[]);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let quota = 300;
        let calls = Arc::new(AtomicUsize::new(0));
        // Two instances: each layer has its own store and its own connection.
        let apps: Vec<Router> = (0..2)
            .map(|_| {
                let store = trusting(&server, &certs).build().unwrap();
                app(layer(store, quota, OnStoreError::FailClosed), calls.clone())
            })
            .collect();
        let admitted = Arc::new(AtomicUsize::new(0));
        let mut tasks = vec![];
        for t in 0..64 {
            let (app, admitted) = (apps[t % 2].clone(), admitted.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..10 {
                    match send(&app, "shared").await {
                        StatusCode::OK => {
                            admitted.fetch_add(1, Ordering::SeqCst);
                        }
                        StatusCode::TOO_MANY_REQUESTS => {}
                        other => panic!("unexpected {other}"),
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
    // Everything went over TLS: the server's TLS port carried the traffic.
    assert_every_key_has_a_ttl(&server.server);
}

#[tokio::test]
async fn a_certificate_from_an_unknown_ca_is_a_store_error_naming_tls_answered_per_the_policy() {
    managed::require("openssl");
    let certs = Certs::make();
    let server = TlsRedis::start(&certs, false, &[]);
    // The system's roots (the default) do not know the test's CA, nor does
    // another CA made for the purpose.
    let other = Certs::make();
    for store in [
        RedisStore::new(server.url()).unwrap(),
        RedisStore::builder(server.url())
            .tls_ca_pem(other.ca_pem())
            .build()
            .unwrap(),
    ] {
        let e = charge(&store).await.unwrap_err();
        assert_eq!(e.kind(), "unavailable", "{e}");
        let text = e.to_string();
        assert!(text.contains("TLS"), "{text}");
        assert!(text.to_lowercase().contains("certificate"), "{text}");
    }

    // Through a layer: fail-open admits without headers, fail-closed answers
    // 503, and the log line names TLS.
    let (captured, _guard) = logs::capture();
    let calls = Arc::new(AtomicUsize::new(0));
    let store = || RedisStore::new(server.url()).unwrap();
    let open = app(layer(store(), 5, OnStoreError::FailOpen), calls.clone());
    let res = open
        .clone()
        .oneshot(
            http::Request::get("/")
                .header("x-client", "c")
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers().get("x-ratelimit-remaining").is_none());
    let closed = app(layer(store(), 5, OnStoreError::FailClosed), calls.clone());
    assert_eq!(send(&closed, "c").await, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let lines = captured.text();
    assert!(
        lines.contains("rate limit store failed") && lines.contains("TLS"),
        "{lines}"
    );
}

#[tokio::test]
async fn with_tls_auth_clients_the_client_certificate_is_needed_and_enough() {
    managed::require("openssl");
    let certs = Certs::make();
    let server = TlsRedis::start(&certs, true, &[]);
    let (cert, key) = certs.client_pem();
    let with_cert = trusting(&server, &certs)
        .tls_client_cert_pem(cert, key)
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let limited = app(
        layer(with_cert.clone(), 2, OnStoreError::FailClosed),
        calls.clone(),
    );
    assert_eq!(send(&limited, "m").await, StatusCode::OK);
    assert_eq!(send(&limited, "m").await, StatusCode::OK);
    assert_eq!(send(&limited, "m").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(charge(&with_cert).await.unwrap().statuses()[0].remaining, 9);

    // The same CA, no client certificate: the server refuses the handshake.
    let without = trusting(&server, &certs).build().unwrap();
    let e = charge(&without).await.unwrap_err();
    assert_eq!(e.kind(), "unavailable", "{e}");
    assert!(e.to_string().contains("TLS"), "{e}");
    let open = app(
        layer(without.clone(), 2, OnStoreError::FailOpen),
        calls.clone(),
    );
    assert_eq!(send(&open, "m").await, StatusCode::OK, "fail-open admits");
    let closed = app(layer(without, 2, OnStoreError::FailClosed), calls.clone());
    assert_eq!(send(&closed, "m").await, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn skipping_verification_must_be_asked_for_by_name() {
    managed::require("openssl");
    let certs = Certs::make();
    let server = TlsRedis::start(&certs, false, &[]);
    // `#insecure` in the URL is refused when the store is built.
    let e = RedisStore::new(format!("{}#insecure", server.url())).unwrap_err();
    assert!(
        e.to_string().contains("danger_accept_invalid_certificates"),
        "{e}"
    );
    // Asked for by name, an unknown CA is accepted.
    let store = RedisStore::builder(server.url())
        .danger_accept_invalid_certificates()
        .build()
        .unwrap();
    assert!(charge(&store).await.unwrap().is_allowed());
}

#[tokio::test]
async fn connect_opens_every_connection_before_the_first_request_and_reports_a_tls_failure() {
    managed::require("openssl");
    let certs = Certs::make();
    let server = TlsRedis::start(&certs, false, &[]);
    // Connections the server accepted before this read (each read is one of its own).
    let received = || {
        let n: u64 = server.server.info_section("stats")["total_connections_received"]
            .parse()
            .unwrap();
        n - 1
    };
    let store = trusting(&server, &certs).connections(3).build().unwrap();
    let l = layer(store, 5, OnStoreError::FailClosed);
    let before = received() + 1;
    l.connect().await.unwrap();
    let opened = received();
    assert_eq!(opened - before, 3, "one connection per lane");
    // Requests now ride the open connections: none is made on their path.
    let limited = app(l, Arc::new(AtomicUsize::new(0)));
    for _ in 0..5 {
        assert_eq!(send(&limited, "c").await, StatusCode::OK);
    }
    assert_eq!(send(&limited, "c").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        received(),
        opened + 1,
        "only the last read's own connection"
    );

    // A CA that does not know the server: connect says so, and the layer
    // still answers per its policy.
    let other = Certs::make();
    let untrusted = RedisStore::builder(server.url())
        .tls_ca_pem(other.ca_pem())
        .build()
        .unwrap();
    let l = layer(untrusted, 5, OnStoreError::FailOpen);
    let e = l.connect().await.unwrap_err();
    assert!(e.to_string().contains("TLS"), "{e}");
    let open = app(l, Arc::new(AtomicUsize::new(0)));
    assert_eq!(send(&open, "c").await, StatusCode::OK);
}
