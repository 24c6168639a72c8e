//! Rate-limit metrics in Prometheus text format: the layer records through the
//! `metrics` facade, and this example installs the Prometheus exporter.
//!
//! ```text
//! cargo run --example prometheus
//! for i in $(seq 5); do curl -s -o /dev/null http://127.0.0.1:3000/; done
//! curl -s http://127.0.0.1:3000/metrics | grep ratelimit_
//! ```

use axum::{routing::get, Router};
use metrics_exporter_prometheus::PrometheusBuilder;
use std::net::SocketAddr;
use std::time::Duration;
use tower_ratelimit::{key::PeerIp, Quota, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Install the recorder first: the layer's series register on first use.
    let metrics = PrometheusBuilder::new().install_recorder()?;

    let limit = RateLimitLayer::builder()
        .name("api")
        .quota(Quota::new(3, Duration::from_secs(10))?)
        .key(PeerIp::new())
        .build()?;
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(limit)
        // Not limited: added after the layer.
        .route(
            "/metrics",
            get(move || std::future::ready(metrics.render())),
        );

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!(
        "listening on http://{}; metrics at /metrics",
        listener.local_addr()?
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
