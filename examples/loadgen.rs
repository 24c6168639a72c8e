//! A small open-loop load generator for `scripts/bench.sh`: sends `GET URL` at
//! a fixed rate whatever the server's speed (wrk cannot), and prints one line:
//!
//! ```text
//! sent=… ok=… rejected=… errors=… dropped=… rate=… p50_us=… p99_us=… max_us=…
//! ```
//!
//! ```sh
//! cargo run --release --example loadgen -- --url http://127.0.0.1:3000/ --rate 20000 --secs 10
//! ```
//!
//! Requests are released every `--tick-us` (all those due by then); latency is
//! measured from each request's release to the end of its response body.
//! Percentiles are exact (a sorted `Vec`), not estimated.

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
struct Args {
    /// The URL to GET.
    #[arg(long)]
    url: String,
    /// Requests per second.
    #[arg(long)]
    rate: u64,
    /// How long to send, in seconds.
    #[arg(long, default_value_t = 10)]
    secs: u64,
    /// Seconds sent first and not measured (connections warm up).
    #[arg(long, default_value_t = 1)]
    warmup_secs: u64,
    /// Release interval in microseconds.
    #[arg(long, default_value_t = 200)]
    tick_us: u64,
    /// Requests in flight at most; a request due while this many are
    /// outstanding is not sent and counts as dropped (the server is overloaded).
    #[arg(long, default_value_t = 2048)]
    max_inflight: usize,
    /// Tokio worker threads.
    #[arg(long, default_value_t = 1)]
    workers: usize,
}

#[derive(Default)]
struct Tally {
    latencies_us: Vec<u32>,
    ok: u64,
    rejected: u64,
    dropped: u64,
    errors: u64,
}

fn main() {
    let args = Args::parse();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.workers.max(1))
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(run(args));
}

async fn run(args: Args) {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1024)
        .build_http();
    let uri: http::Uri = args.url.parse().expect("--url");
    let tally = Arc::new(Mutex::new(Tally::default()));
    let inflight = Arc::new(AtomicUsize::new(0));
    let total = args.rate * (args.secs + args.warmup_secs);
    let warmup = args.rate * args.warmup_secs;
    let start = Instant::now();
    let mut sent = 0u64;
    let mut tick = tokio::time::interval(Duration::from_micros(args.tick_us.max(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    while sent < total {
        tick.tick().await;
        let due = ((start.elapsed().as_secs_f64() * args.rate as f64) as u64).min(total);
        while sent < due {
            let measured = sent >= warmup;
            sent += 1;
            if inflight.load(Ordering::Relaxed) >= args.max_inflight {
                if measured {
                    tally.lock().unwrap().dropped += 1;
                }
                continue;
            }
            inflight.fetch_add(1, Ordering::Relaxed);
            let inflight = inflight.clone();
            let (client, uri, tally) = (client.clone(), uri.clone(), tally.clone());
            tokio::spawn(async move {
                let t = Instant::now();
                let res = match client.get(uri).await {
                    Ok(res) => {
                        let status = res.status();
                        match res.into_body().collect().await {
                            Ok(_) => Ok(status),
                            Err(e) => Err(e.to_string()),
                        }
                    }
                    Err(e) => Err(e.to_string()),
                };
                let us = t.elapsed().as_micros().min(u32::MAX as u128) as u32;
                inflight.fetch_sub(1, Ordering::Relaxed);
                if !measured {
                    return;
                }
                let mut t = tally.lock().unwrap();
                match res {
                    Ok(s) if s.is_success() => {
                        t.ok += 1;
                        t.latencies_us.push(us);
                    }
                    Ok(_) => {
                        t.rejected += 1;
                        t.latencies_us.push(us);
                    }
                    Err(_) => t.errors += 1,
                }
            });
        }
    }
    let sent_measured = total - warmup;
    // Wait for stragglers (bounded).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let done = {
            let t = tally.lock().unwrap();
            t.ok + t.rejected + t.errors + t.dropped
        };
        if done >= sent_measured || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = start.elapsed().as_secs_f64() - args.warmup_secs as f64;
    let mut t = tally.lock().unwrap();
    t.latencies_us.sort_unstable();
    let pct = |p: f64| -> u32 {
        let v = &t.latencies_us;
        if v.is_empty() {
            return 0;
        }
        v[(((v.len() as f64) * p).ceil() as usize).clamp(1, v.len()) - 1]
    };
    println!(
        "sent={} ok={} rejected={} errors={} dropped={} rate={:.0} p50_us={} p99_us={} max_us={}",
        sent_measured,
        t.ok,
        t.rejected,
        t.errors,
        t.dropped,
        (t.ok + t.rejected) as f64 / elapsed,
        pct(0.50),
        pct(0.99),
        t.latencies_us.last().copied().unwrap_or(0)
    );
}
