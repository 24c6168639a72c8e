//! The smallest useful setup: an axum app limited to 5 requests per 10 seconds
//! per client IP, on the embedded memory store.
//!
//! ```text
//! cargo run --example quickstart
//! curl -i http://127.0.0.1:3000/      # X-RateLimit-* headers; the 6th call gets 429
//! ```

use axum::{routing::get, Router};
use std::net::SocketAddr;
use std::time::Duration;
use tower_ratelimit::{key::PeerIp, Quota, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let limit = RateLimitLayer::builder()
        .quota(Quota::new(5, Duration::from_secs(10))?)
        .key(PeerIp::new())
        .build()?
        .inner_body(); // answer in axum's own body type: no second box per response

    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(limit);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    println!("try: for i in $(seq 7); do curl -si http://127.0.0.1:3000/ | head -1; done");
    // The peer address is what `PeerIp` keys by.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
