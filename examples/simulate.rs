//! A fleet of N instances behind a round-robin balancer, offered a load
//! profile, under each limiter mode side by side — the 4 × 100 = 400 problem
//! and how each mode answers it.
//!
//! ```text
//! cargo run --release --features redis --example simulate
//! ```
//!
//! Time is simulated (a `ManualClock` moved in ticks), so a minute of traffic
//! runs in seconds. Modes: `memory` (one `MemoryStore` per instance: each
//! allows the whole limit), `strict` (every instance charges one shared Redis,
//! one script call per request), `coordinated` (local drops from fleet counts
//! synced through Redis once per second). It prints a table per profile
//! (offered, limit and admitted per second for each mode) and writes an SVG
//! plot of admitted rate over time. Without `--redis-url` it starts its own
//! `redis-server` on a free loopback port (and stops it at the end).

use axum::body::Body;
use clap::Parser;
use http::{Request, StatusCode};
use plotters::prelude::*;
use std::convert::Infallible;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_ratelimit::clock::{Clock, ManualClock, SystemClock};
use tower_ratelimit::key::Constant;
use tower_ratelimit::store::RedisStore;
use tower_ratelimit::{Coordinated, DenyCache, Quota, RateLimitLayer};

#[derive(Parser, Debug)]
#[command(about = "Simulate a fleet under each rate limiter mode")]
struct Args {
    /// Instances behind the balancer.
    #[arg(long, default_value_t = 4)]
    instances: usize,
    /// The fleet-wide limit, requests per second (each instance is configured with it).
    #[arg(long, default_value_t = 100)]
    limit: u64,
    /// Simulated seconds per profile.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Redis to use; without it, a redis-server is started on a free port.
    #[arg(long)]
    redis_url: Option<String>,
    /// Where to write the SVG plot.
    #[arg(long, default_value = "simulate.svg")]
    out: String,
}

/// Offered requests per second at second `t` of `total`, for a fleet `limit`.
#[derive(Clone, Copy, Debug)]
enum Profile {
    /// 1.5× the limit throughout.
    Steady,
    /// The limit, then 5× for a fifth of the time, then the limit again: with
    /// four instances the per-process limiter lets 4 × the limit through.
    Spike,
    /// From half the limit to twice the limit.
    Ramp,
}

impl Profile {
    fn offered(self, t: u64, total: u64, limit: u64) -> u64 {
        let l = limit as f64;
        let x = match self {
            Profile::Steady => 1.5 * l,
            Profile::Spike if t >= total * 2 / 5 && t < total * 3 / 5 => 5.0 * l,
            Profile::Spike => l,
            Profile::Ramp => l * (0.5 + 1.5 * t as f64 / total.max(1) as f64),
        };
        x.round() as u64
    }

    fn name(self) -> &'static str {
        match self {
            Profile::Steady => "steady 1.5x",
            Profile::Spike => "spike 5x",
            Profile::Ramp => "ramp 0.5x-2x",
        }
    }
}

const MODES: [&str; 3] = ["memory", "strict", "coordinated"];
const TICKS: u64 = 10;

/// One fleet of `n` layers in one mode, sharing one manual clock.
struct Fleet {
    layers: Vec<RateLimitLayer>,
    clock: ManualClock,
    next: usize,
}

impl Fleet {
    fn new(
        mode: &str,
        n: usize,
        limit: u64,
        redis: Option<&str>,
        start: u64,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let clock = ManualClock::new(start);
        let mut layers = Vec::new();
        for i in 0..n {
            let mut b = RateLimitLayer::builder()
                .name(format!("sim-{mode}-{start}"))
                .quota(Quota::new(limit, Duration::from_secs(1))?)
                .key(Constant::new("api"))
                .clock(clock.clone());
            match (mode, redis) {
                ("strict", Some(url)) => {
                    // Every request goes to Redis: no local deny cache here.
                    b = b
                        .store(RedisStore::new(url)?)
                        .deny_cache(DenyCache::disabled())
                }
                ("coordinated", Some(url)) => {
                    let c = Coordinated::new(RedisStore::new(url)?)
                        .manual_sync()
                        .seed(7 + i as u64);
                    b = b.coordinated(c)
                }
                _ => {}
            }
            layers.push(b.build()?);
        }
        Ok(Self {
            layers,
            clock,
            next: 0,
        })
    }

    /// Offers `offered` requests over one simulated second; returns the admitted count.
    async fn second(&mut self, offered: u64) -> u64 {
        let mut admitted = 0;
        for tick in 0..TICKS {
            let share = offered * (tick + 1) / TICKS - offered * tick / TICKS;
            for _ in 0..share {
                let layer = &self.layers[self.next % self.layers.len()];
                self.next += 1;
                let mut svc = layer.layer(service_fn(|_r: Request<Body>| async {
                    Ok::<_, Infallible>(http::Response::new(Body::empty()))
                }));
                let res = svc
                    .ready()
                    .await
                    .unwrap()
                    .call(Request::new(Body::empty()))
                    .await
                    .unwrap();
                admitted += u64::from(res.status() == StatusCode::OK);
            }
            self.clock.advance(Duration::from_millis(1000 / TICKS));
        }
        for l in &self.layers {
            let _ = l.sync_now().await;
        }
        admitted
    }
}

/// A redis-server on a free loopback port, stopped on drop.
struct OwnRedis(Child, String);

impl OwnRedis {
    fn start() -> Option<Self> {
        let port = TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .spawn()
            .ok()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(OwnRedis(child, format!("redis://127.0.0.1:{port}")))
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let own = if args.redis_url.is_none() {
        OwnRedis::start()
    } else {
        None
    };
    let redis = args
        .redis_url
        .clone()
        .or_else(|| own.as_ref().map(|o| o.1.clone()));
    if redis.is_none() {
        eprintln!("no redis-server found: the strict and coordinated modes run without Redis (per process)");
    }
    let profiles = [Profile::Steady, Profile::Spike, Profile::Ramp];
    // results[profile][mode][second]
    let mut results = Vec::new();
    for profile in profiles {
        println!(
            "\n## {} — {} instances, fleet limit {}/s",
            profile.name(),
            args.instances,
            args.limit
        );
        println!(
            "{:>4} {:>8} {:>6} {:>8} {:>8} {:>12}",
            "t", "offered", "limit", MODES[0], MODES[1], MODES[2]
        );
        let start = SystemClock.now_ms();
        let mut fleets = Vec::new();
        for mode in MODES {
            fleets.push(Fleet::new(
                mode,
                args.instances,
                args.limit,
                redis.as_deref(),
                start,
            )?);
        }
        let mut per_mode = vec![Vec::new(); MODES.len()];
        for t in 0..args.seconds {
            let offered = profile.offered(t, args.seconds, args.limit);
            let mut row = Vec::new();
            for (m, fleet) in fleets.iter_mut().enumerate() {
                let a = fleet.second(offered).await;
                per_mode[m].push((offered, a));
                row.push(a);
            }
            println!(
                "{t:>4} {offered:>8} {:>6} {:>8} {:>8} {:>12}",
                args.limit, row[0], row[1], row[2]
            );
        }
        let totals: Vec<u64> = per_mode
            .iter()
            .map(|v| v.iter().map(|(_, a)| a).sum())
            .collect();
        let offered: u64 = per_mode[0].iter().map(|(o, _)| o).sum();
        println!(
            "sum  {offered:>8} {:>6} {:>8} {:>8} {:>12}",
            args.limit * args.seconds,
            totals[0],
            totals[1],
            totals[2]
        );
        results.push(per_mode);
    }
    plot(&args, &profiles, &results)?;
    println!("\nwrote {}", args.out);
    Ok(())
}

fn plot(
    args: &Args,
    profiles: &[Profile],
    results: &[Vec<Vec<(u64, u64)>>],
) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(&args.out, (900, 300 * profiles.len() as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((profiles.len(), 1));
    let y_max = results
        .iter()
        .flat_map(|p| p.iter().flat_map(|m| m.iter().map(|(o, a)| (*o).max(*a))))
        .max()
        .unwrap_or(1) as f64
        * 1.1;
    let colors = [RED, BLUE, GREEN];
    for ((panel, profile), per_mode) in panels.iter().zip(profiles).zip(results) {
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!("{} — admitted requests/s by mode", profile.name()),
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..args.seconds as f64, 0f64..y_max)?;
        chart
            .configure_mesh()
            .x_desc("simulated seconds")
            .y_desc("req/s")
            .draw()?;
        let limit = [
            (0.0, args.limit as f64),
            (args.seconds as f64, args.limit as f64),
        ];
        chart
            .draw_series(LineSeries::new(limit, BLACK.stroke_width(2)))?
            .label("fleet limit")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.stroke_width(2)));
        for (m, series) in per_mode.iter().enumerate() {
            let points = series
                .iter()
                .enumerate()
                .map(|(t, (_, a))| (t as f64, *a as f64));
            let color = colors[m];
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))?
                .label(MODES[m])
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        let offered = per_mode[0]
            .iter()
            .enumerate()
            .map(|(t, (o, _))| (t as f64, *o as f64));
        chart
            .draw_series(LineSeries::new(offered, BLACK.mix(0.5)))?
            .label("offered")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.mix(0.5)));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .draw()?;
    }
    root.present()?;
    Ok(())
}
