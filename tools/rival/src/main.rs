//! `scripts/bench.sh`'s rival: bench_server's axum hello world behind the
//! crate `tower-rate-limiter` (keyed fixed window), with bench_server's
//! command line (`--variant`, `--listen`, `--workers`, `--redis-url`).
//!
//! ```sh
//! cargo +nightly run --release --manifest-path tools/rival/Cargo.toml -- --variant rival --workers 1
//! ```
//!
//! Variants: `rival` (its `MemoryStore`) and `rival-redis` (its `RedisStore`
//! on one multiplexed redis-rs connection, its default atomic pipeline:
//! `MULTI`, `SET NX PX`, `INCR`, `PTTL`, `EXEC` per request). Both key by the
//! peer IP (`IpKeyExtractor`), as bench_server's limiters do, with its default
//! quota (`--limit` per `--window-secs`, high enough that nothing is
//! rejected), and its default rate-limit fields on every response. Prints
//! exactly one line, `listening on ADDR`, once it accepts connections.

use axum::Router;
use axum::routing::get;
use clap::{Parser, ValueEnum};
use std::net::SocketAddr;
use std::time::Duration;
use tower_rate_limiter::{IpKeyExtractor, MemoryStore, RateLimitLayer, RedisStore};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Variant {
    /// tower-rate-limiter with its in-memory store.
    Rival,
    /// tower-rate-limiter with its Redis store.
    RivalRedis,
}

#[derive(Parser, Debug)]
struct Args {
    /// Which limiter guards `GET /`.
    #[arg(long, value_enum, default_value = "rival")]
    variant: Variant,
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// Tokio worker threads (default: one per core).
    #[arg(long)]
    workers: Option<usize>,
    /// Redis for the `rival-redis` variant.
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    /// Requests per window per client.
    #[arg(long, default_value_t = 1_000_000_000)]
    limit: u64,
    /// Window length in seconds.
    #[arg(long, default_value_t = 60)]
    window_secs: u64,
}

fn main() {
    let args = Args::parse();
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = args.workers {
        rt.worker_threads(n.max(1));
    }
    rt.enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(serve(args));
}

async fn serve(args: Args) {
    let app = Router::new().route("/", get(|| async { "Hello, World!" }));
    let builder = RateLimitLayer::builder(IpKeyExtractor::new())
        .policy_name("bench")
        .limit(args.limit)
        .window(Duration::from_secs(args.window_secs));
    let app = match args.variant {
        Variant::Rival => app.layer(
            builder
                .with_store(MemoryStore::new())
                .build()
                .expect("layer"),
        ),
        Variant::RivalRedis => {
            let client = redis::Client::open(args.redis_url.as_str()).expect("redis url");
            let conn = client
                .get_multiplexed_async_connection()
                .await
                .expect("redis connection");
            app.layer(
                builder
                    .with_store(RedisStore::new(conn))
                    .build()
                    .expect("layer"),
            )
        }
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .expect("bind");
    println!(
        "listening on {}",
        listener.local_addr().expect("local addr")
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
    .expect("serve");
}
