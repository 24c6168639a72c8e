//! A gRPC server behind the rate limiter, serving the standard health service
//! (`grpc.health.v1.Health`), so any gRPC client can try it without our protos:
//!
//! ```text
//! cargo run --features redis,grpc --example tonic -- --limit 2 --window 10s --key method
//! grpcurl -plaintext 127.0.0.1:50051 grpc.health.v1.Health/Check   # 3rd call: RESOURCE_EXHAUSTED
//! ```
//!
//! Takes the demo's `--listen`, `--store`, `--redis-url`, `--limit`, `--window`
//! and `--key` flags (`--key` also accepts `method` and `metadata:NAME`) and
//! prints one line `listening on ADDR` once it accepts connections.

#[path = "common/mod.rs"]
mod common;

use clap::{Parser, ValueEnum};
use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;
use tonic::transport::server::TcpIncoming;
use tower_ratelimit::store::RedisStore;
use tower_ratelimit::{Quota, RateLimitLayer};

#[derive(Parser, Debug)]
#[command(about = "tower-ratelimit gRPC demo server (grpc.health.v1)")]
struct Args {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    /// Where limiter state lives; `none` runs without a limiter.
    #[arg(long, value_enum, default_value_t = StoreKind::Memory)]
    store: StoreKind,
    /// The Redis primary (with `--store redis`).
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    /// Calls allowed per window.
    #[arg(long, default_value_t = 10)]
    limit: u64,
    /// Window length: 500ms, 1s, 60s, 1h.
    #[arg(long, default_value = "60s", value_parser = common::parse_duration)]
    window: Duration,
    /// `ip`, `global`, `method`, `header:NAME` or `metadata:NAME`.
    #[arg(long, default_value = "ip", value_parser = common::parse_key)]
    key: common::KeyKind,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum StoreKind {
    Memory,
    Redis,
    None,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();

    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;

    let limiter = match args.store {
        StoreKind::None => None,
        store => {
            let mut b = RateLimitLayer::builder()
                .quota(Quota::new(args.limit, args.window)?)
                .key(common::key_extractor(&args.key)?);
            if let StoreKind::Redis = store {
                b = b.store(RedisStore::new(&args.redis_url)?);
            }
            Some(b.build()?)
        }
    };

    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "listening on {}", listener.local_addr()?)?;
    out.flush()?;
    drop(out);

    let incoming = TcpIncoming::from(listener);
    // Open HTTP/2 connections get five seconds to finish after SIGTERM.
    let grace = Duration::from_secs(5);
    match limiter {
        Some(layer) => {
            let server = tonic::transport::Server::builder()
                .layer(layer)
                .add_service(health);
            common::with_grace(
                |stop| server.serve_with_incoming_shutdown(incoming, stop),
                grace,
            )
            .await?
        }
        None => {
            let server = tonic::transport::Server::builder().add_service(health);
            common::with_grace(
                |stop| server.serve_with_incoming_shutdown(incoming, stop),
                grace,
            )
            .await?
        }
    }
    Ok(())
}
