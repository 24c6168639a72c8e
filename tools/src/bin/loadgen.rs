//! A small open-loop load generator for `scripts/bench.sh`: sends `GET URL` at
//! a fixed rate whatever the server's speed (wrk cannot), and prints one line:
//!
//! ```text
//! sent=… ok=… rejected=… errors=… dropped=… rate=… p50_us=… p99_us=… max_us=…
//! ```
//!
//! ```sh
//! cargo run --release -p tower-ratelimit-tools --bin loadgen -- --url http://127.0.0.1:3000/ --rate 20000 --secs 10
//! ```
//!
//! Request `i` is due at `start + i / rate`. `--connections` keep-alive
//! connections each take the next due request, wait until it is due, write a
//! hand-made `GET`, and read the response (status line, `Content-Length`
//! body): no HTTP client library, so the generator costs little CPU next to
//! the server it measures. Latency runs from the write to the end of the
//! response (the generator's own timer lateness, up to a millisecond or two,
//! is not the server's); a request already overdue when a connection got to
//! it, because every connection was busy, is measured from when it was due,
//! so a slow server cannot hide its queue (no coordinated omission). A
//! request still unsent a second after it was due is dropped.
//! Percentiles are exact (a sorted `Vec`), not estimated.

use clap::Parser;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Parser, Debug)]
struct Args {
    /// The URL to GET (`http://HOST:PORT/PATH`).
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
    /// Keep-alive connections (the most requests in flight).
    #[arg(long, default_value_t = 128)]
    connections: usize,
}

#[derive(Default)]
struct Tally {
    latencies_us: Vec<u32>,
    ok: u64,
    rejected: u64,
    dropped: u64,
    errors: u64,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.latencies_us.extend(other.latencies_us);
        self.ok += other.ok;
        self.rejected += other.rejected;
        self.dropped += other.dropped;
        self.errors += other.errors;
    }
}

/// One schedule shared by every connection.
struct Plan {
    next: AtomicU64,
    total: u64,
    warmup: u64,
    rate: u64,
    start: Instant,
}

impl Plan {
    fn due(&self, i: u64) -> Instant {
        self.start
            + Duration::from_nanos((u128::from(i) * 1_000_000_000 / u128::from(self.rate)) as u64)
    }
}

fn main() {
    let args = Args::parse();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(run(args));
}

async fn run(args: Args) {
    let rest = args
        .url
        .strip_prefix("http://")
        .expect("--url must start with http://");
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let request: Arc<[u8]> = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\n\r\n")
        .into_bytes()
        .into();
    let rate = args.rate.max(1);
    let plan = Arc::new(Plan {
        next: AtomicU64::new(0),
        total: rate * (args.secs + args.warmup_secs),
        warmup: rate * args.warmup_secs,
        rate,
        // Time to open the connections before the first request is due.
        start: Instant::now() + Duration::from_millis(200),
    });
    let mut tasks = Vec::new();
    for _ in 0..args.connections.max(1) {
        let (plan, request, authority) = (plan.clone(), request.clone(), authority.to_owned());
        tasks.push(tokio::spawn(async move {
            connection(&plan, &request, &authority).await
        }));
    }
    let mut tally = Tally::default();
    for t in tasks {
        tally.merge(t.await.expect("connection task"));
    }
    let sent_measured = plan.total - plan.warmup;
    let elapsed = args.secs as f64;
    tally.latencies_us.sort_unstable();
    let v = &tally.latencies_us;
    let pct = |p: f64| -> u32 {
        if v.is_empty() {
            return 0;
        }
        v[(((v.len() as f64) * p).ceil() as usize).clamp(1, v.len()) - 1]
    };
    println!(
        "sent={} ok={} rejected={} errors={} dropped={} rate={:.0} p50_us={} p99_us={} max_us={}",
        sent_measured,
        tally.ok,
        tally.rejected,
        tally.errors,
        tally.dropped,
        (tally.ok + tally.rejected) as f64 / elapsed,
        pct(0.50),
        pct(0.99),
        v.last().copied().unwrap_or(0)
    );
}

/// One keep-alive connection taking due requests until the plan is done.
async fn connection(plan: &Plan, request: &[u8], authority: &str) -> Tally {
    let mut tally = Tally::default();
    let mut conn: Option<TcpStream> = None;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let i = plan.next.fetch_add(1, Ordering::Relaxed);
        if i >= plan.total {
            return tally;
        }
        let measured = i >= plan.warmup;
        let due = plan.due(i);
        // Overdue when a connection got to it: every connection was busy.
        let overdue = Instant::now() > due;
        tokio::time::sleep_until(due.into()).await;
        let sent = Instant::now();
        if sent > due + Duration::from_secs(1) {
            if measured {
                tally.dropped += 1;
            }
            continue;
        }
        if conn.is_none() {
            conn = TcpStream::connect(authority).await.ok();
            if let Some(c) = &conn {
                let _ = c.set_nodelay(true);
            }
        }
        let status = match conn.as_mut() {
            Some(c) => exchange(c, request, &mut buf).await,
            None => None,
        };
        let done = Instant::now();
        let from = if overdue { due } else { sent };
        let us = (done - from).as_micros().min(u128::from(u32::MAX)) as u32;
        match status {
            Some(s) if measured => {
                if (200..300).contains(&s) {
                    tally.ok += 1;
                } else {
                    tally.rejected += 1;
                }
                tally.latencies_us.push(us);
            }
            Some(_) => {}
            None => {
                // Reconnect for the next request.
                conn = None;
                if measured {
                    tally.errors += 1;
                }
            }
        }
    }
}

/// Writes one request and reads its response; returns the status code.
async fn exchange(conn: &mut TcpStream, request: &[u8], buf: &mut [u8]) -> Option<u16> {
    conn.write_all(request).await.ok()?;
    let mut len = 0;
    loop {
        let n = conn.read(&mut buf[len..]).await.ok()?;
        if n == 0 {
            return None;
        }
        len += n;
        let Some(end) = find(&buf[..len], b"\r\n\r\n") else {
            if len == buf.len() {
                return None;
            }
            continue;
        };
        let head = &buf[..end];
        let status: u16 = std::str::from_utf8(head.get(9..12)?).ok()?.parse().ok()?;
        let body = content_length(head)?;
        let mut have = len - (end + 4);
        while have < body {
            let n = conn.read(buf).await.ok()?;
            if n == 0 {
                return None;
            }
            have += n;
        }
        return Some(status);
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The `Content-Length` of a response head (0 when absent).
fn content_length(head: &[u8]) -> Option<usize> {
    for line in head.split(|b| *b == b'\n') {
        let line = std::str::from_utf8(line).ok()?.trim_end();
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                return value.trim().parse().ok();
            }
        }
    }
    Some(0)
}
