//! A fleet of N instances behind a balancer, offered a load profile, under
//! each limiter mode side by side — the 4 × 100 = 400 problem and how each
//! mode answers it — and, with `--scale`, the coordinated mode's Redis load
//! as instances and request rates grow.
//!
//! ```text
//! cargo run --release -p tower-ratelimit-tools --bin simulate
//! cargo run --release -p tower-ratelimit-tools --bin simulate -- --scale
//! ```
//!
//! Time is simulated (a `ManualClock` moved millisecond by millisecond), so
//! a minute of traffic runs in seconds. Modes: `memory` (one `MemoryStore`
//! per instance: each allows the whole limit), `strict` (every instance
//! charges one shared Redis, one script call per request), `coordinated`
//! (each instance holds each key to its share of the limit, learned from
//! fleet counts synced through Redis once per interval, each instance at
//! its own phase). For each profile it prints offered, limit and admitted
//! per second for each mode, then each mode's mean error after settling,
//! largest overshoot and time to converge; it writes an SVG plot of
//! admitted rate over time. It starts its own `redis-server` (and for
//! `--scale` a three-master Cluster) on free loopback ports, and stops them
//! at the end.
//!
//! `--scale` runs N coordinated instances (10, 100 and 1,000 by default)
//! in one process, against one Redis and against the Cluster, at two
//! request rates, and reports the error and Redis commands and CPU per
//! simulated second.

#[path = "../../../tests/support/fleet.rs"]
mod fleet;
#[path = "../../../tests/support/redis.rs"]
mod redis_support;

use clap::Parser;
use fleet::{Balancer, Fleet, Run};
use plotters::prelude::*;
use redis_support::{Cluster, RedisServer};
use std::time::Duration;
use tower_ratelimit::clock::{Clock, ManualClock, SystemClock};
use tower_ratelimit::rate::DenyCache;
use tower_ratelimit::store::Coordinated;
use tower_ratelimit::store::RedisStore;

#[derive(Parser, Debug)]
#[command(about = "Simulate a fleet under each rate limiter mode")]
struct Args {
    /// Instances behind the balancer.
    #[arg(long, default_value_t = 4)]
    instances: usize,
    /// The fleet-wide limit, requests per second (each instance is configured with it).
    #[arg(long, default_value_t = 200)]
    limit: u64,
    /// Simulated seconds per profile.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// The coordinated mode's sync interval, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    sync_ms: u64,
    /// How the balancer spreads requests: `round-robin` or `random`.
    #[arg(long, default_value = "round-robin")]
    balancer: String,
    /// Where to write the SVG plot.
    #[arg(long, default_value = "simulate.svg")]
    out: String,
    /// Measure the coordinated mode's Redis load instead of the profiles.
    #[arg(long)]
    scale: bool,
    /// `--scale`: the fleet sizes, comma-separated.
    #[arg(long, default_value = "10,100,1000", value_delimiter = ',')]
    scale_instances: Vec<usize>,
    /// `--scale`: distinct client keys.
    #[arg(long, default_value_t = 4)]
    scale_keys: usize,
    /// `--scale`: each key's limit, requests per second (high enough that
    /// every instance sees every key in every interval).
    #[arg(long, default_value_t = 2000)]
    scale_limit: u64,
    /// `--scale`: simulated seconds per run.
    #[arg(long, default_value_t = 8)]
    scale_seconds: u64,
    /// `--scale`: skip the Cluster runs.
    #[arg(long)]
    no_cluster: bool,
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
    /// The limit, then 15× for two fifths of the time, then the limit again.
    Surge,
}

impl Profile {
    fn offered(self, t: u64, total: u64, limit: u64) -> u64 {
        let l = limit as f64;
        let x = match self {
            Profile::Steady => 1.5 * l,
            Profile::Spike if t >= total * 2 / 5 && t < total * 3 / 5 => 5.0 * l,
            Profile::Spike => l,
            Profile::Ramp => l * (0.5 + 1.5 * t as f64 / total.max(1) as f64),
            Profile::Surge if t >= total * 3 / 10 && t < total * 7 / 10 => 15.0 * l,
            Profile::Surge => l,
        };
        x.round() as u64
    }

    fn name(self) -> &'static str {
        match self {
            Profile::Steady => "steady 1.5x",
            Profile::Spike => "spike 5x",
            Profile::Ramp => "ramp 0.5x-2x",
            Profile::Surge => "surge 15x",
        }
    }
}

const MODES: [&str; 3] = ["memory", "strict", "coordinated"];

struct Sim<'a> {
    args: &'a Args,
    balancer: Balancer,
}

impl Sim<'_> {
    /// `n` layers in `mode`, one manual clock, on `redis`.
    fn fleet(
        &self,
        mode: &str,
        n: usize,
        (keys, limit): (usize, u64),
        redis: &Backend,
        start: u64,
    ) -> Fleet {
        let clock = ManualClock::new(start);
        let interval = Duration::from_millis(self.args.sync_ms.max(1));
        let layers = (0..n)
            .map(|i| {
                let mut b = fleet::instance(&format!("sim-{mode}-{start}"), limit, &clock);
                let mut coordinated = None;
                match mode {
                    // Every request goes to Redis: no local deny cache here.
                    "strict" => {
                        b = b
                            .store(redis.store())
                            .store_timeout(Duration::from_secs(2))
                            .deny_cache(DenyCache::disabled())
                    }
                    "coordinated" => {
                        let c = Coordinated::builder(redis.store())
                            .sync_interval(interval)
                            .sync_timeout(Duration::from_secs(2))
                            .manual_sync()
                            .clock(clock.clone())
                            .seed(7 + i as u64)
                            .build()
                            .unwrap();
                        b = b.store(c.clone());
                        coordinated = Some(c);
                    }
                    _ => {}
                }
                (b.build().unwrap(), coordinated)
            })
            .collect();
        Fleet::new(layers, clock, interval, keys, self.balancer)
    }
}

/// Where the counters live: one server or a Cluster.
enum Backend {
    One(RedisServer),
    Cluster(Cluster),
}

impl Backend {
    fn name(&self) -> &'static str {
        match self {
            Backend::One(_) => "redis",
            Backend::Cluster(_) => "cluster",
        }
    }

    fn store(&self) -> RedisStore {
        match self {
            Backend::One(s) => RedisStore::new(s.url()).unwrap(),
            Backend::Cluster(c) => RedisStore::cluster_builder(c.urls())
                .connect_timeout(Duration::from_secs(2))
                .response_timeout(Duration::from_secs(2))
                .build()
                .unwrap(),
        }
    }

    fn servers(&self) -> Vec<&RedisServer> {
        match self {
            Backend::One(s) => vec![s],
            Backend::Cluster(c) => c.master_indices().into_iter().map(|i| c.node(i)).collect(),
        }
    }

    /// The coordinated mode's commands so far, and Redis CPU seconds.
    fn load(&self) -> (u64, f64) {
        let mut commands = 0;
        let mut cpu = 0.0;
        for s in self.servers() {
            commands += ["hincrby", "pexpire", "hmget"]
                .iter()
                .map(|c| s.command_calls(c))
                .sum::<u64>();
            let info = s.info_section("cpu");
            cpu += ["used_cpu_sys", "used_cpu_user"]
                .iter()
                .filter_map(|k| info.get(*k)?.parse::<f64>().ok())
                .sum::<f64>();
        }
        (commands, cpu)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let balancer = match args.balancer.as_str() {
        "round-robin" => Balancer::RoundRobin,
        "random" => Balancer::Random(1),
        other => return Err(format!("--balancer {other}: use round-robin or random").into()),
    };
    let sim = Sim {
        args: &args,
        balancer,
    };
    let redis = Backend::One(RedisServer::start());
    if args.scale {
        return scale(&sim, redis).await;
    }
    let profiles = [
        Profile::Steady,
        Profile::Spike,
        Profile::Ramp,
        Profile::Surge,
    ];
    // results[profile][mode][second]
    let mut results = Vec::new();
    for profile in profiles {
        println!(
            "\n## {} — {} instances, fleet limit {}/s, sync every {} ms, {} balancer",
            profile.name(),
            args.instances,
            args.limit,
            args.sync_ms,
            args.balancer
        );
        println!(
            "{:>4} {:>8} {:>6} {:>8} {:>8} {:>12}",
            "t", "offered", "limit", MODES[0], MODES[1], MODES[2]
        );
        let start = SystemClock.now_ms();
        let mut fleets: Vec<Fleet> = MODES
            .iter()
            .map(|mode| sim.fleet(mode, args.instances, (1, args.limit), &redis, start))
            .collect();
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
        summarize(&per_mode, args.limit);
        results.push(per_mode);
    }
    plot(&args, &profiles, &results)?;
    println!("\nwrote {}", args.out);
    Ok(())
}

/// Each mode's mean error after settling (seconds over the limit, two
/// seconds after the load last changed), largest overshoot, and how long
/// it took to come within 10% of the limit after the load first rose above it.
fn summarize(per_mode: &[Vec<(u64, u64)>], limit: u64) {
    println!(
        "{:<12} {:>14} {:>20} {:>16}",
        "mode", "settled error", "largest overshoot", "converged after"
    );
    for (m, seconds) in per_mode.iter().enumerate() {
        let run = Run {
            seconds: seconds.clone(),
            limit,
        };
        let changed: Vec<usize> = (0..seconds.len())
            .filter(|&t| t == 0 || seconds[t].0 != seconds[t - 1].0)
            .collect();
        let settled: Vec<usize> = (0..seconds.len())
            .filter(|&t| {
                let last = changed
                    .iter()
                    .rev()
                    .find(|&&c| c <= t)
                    .copied()
                    .unwrap_or(0);
                seconds[t].0 > limit && t >= last + 2
            })
            .collect();
        let error = if settled.is_empty() {
            "-".to_owned()
        } else {
            let mean =
                settled.iter().map(|&t| seconds[t].1 as f64).sum::<f64>() / settled.len() as f64;
            format!("{:+.1}%", 100.0 * (mean / limit as f64 - 1.0))
        };
        let (worst, secs) = run.overshoot();
        let over = format!("{:+.0}% ({secs} s > +10%)", 100.0 * worst);
        let rise = (0..seconds.len()).find(|&t| seconds[t].0 > limit);
        let converged = rise.map(|from| {
            let to = changed
                .iter()
                .copied()
                .find(|&c| c > from)
                .unwrap_or(seconds.len());
            run.converged_after(from, to)
        });
        let converged = match converged {
            Some(Some(s)) => format!("{s} s"),
            Some(None) => "never".to_owned(),
            None => "-".to_owned(),
        };
        println!("{:<12} {error:>14} {over:>20} {converged:>16}", MODES[m]);
    }
}

/// The coordinated mode at several fleet sizes and two request rates,
/// against one Redis and against a Cluster.
async fn scale(sim: &Sim<'_>, redis: Backend) -> Result<(), Box<dyn std::error::Error>> {
    let args = sim.args;
    let keys = args.scale_keys.max(1);
    let mut backends = vec![redis];
    if !args.no_cluster {
        backends.push(Backend::Cluster(Cluster::start(3, 0)));
    }
    println!(
        "\n## scale — coordinated, {keys} keys at {}/s each, sync every {} ms, {} simulated s per run",
        args.scale_limit, args.sync_ms, args.scale_seconds
    );
    println!(
        "{:<8} {:>9} {:>10} {:>10} {:>8} {:>14} {:>14}",
        "backend", "instances", "offered/s", "admitted/s", "error", "redis cmds/s", "redis cpu %"
    );
    for backend in &backends {
        for &n in &args.scale_instances {
            for factor in [1.5, 3.0] {
                let limit = args.scale_limit * keys as u64;
                let offered = (factor * limit as f64) as u64;
                let start = SystemClock.now_ms() + n as u64;
                let mut fleet =
                    sim.fleet("coordinated", n, (keys, args.scale_limit), backend, start);
                // Shares are learned from the interval two back, and a
                // thousand instances take a few real seconds to connect
                // (their keys run open until then): measure after that.
                let warmup = 3 * args.sync_ms.div_ceil(1000).max(1) + 4;
                for _ in 0..warmup {
                    fleet.second(offered).await;
                }
                let (c0, cpu0) = backend.load();
                let mut admitted = 0;
                for _ in 0..args.scale_seconds {
                    admitted += fleet.second(offered).await;
                }
                let (c1, cpu1) = backend.load();
                let secs = args.scale_seconds.max(1) as f64;
                let rate = admitted as f64 / secs;
                println!(
                    "{:<8} {n:>9} {offered:>10} {rate:>10.0} {:>+7.1}% {:>14.0} {:>14.2}",
                    backend.name(),
                    100.0 * (rate / limit as f64 - 1.0),
                    (c1 - c0) as f64 / secs,
                    100.0 * (cpu1 - cpu0) / secs,
                );
            }
        }
    }
    println!(
        "\nRedis figures are per simulated second: what a real fleet of that size would send."
    );
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
    let colors = [RED, BLUE, GREEN];
    for ((panel, profile), per_mode) in panels.iter().zip(profiles).zip(results) {
        // Each panel on its own scale: the surge would flatten the others.
        let y_max = per_mode
            .iter()
            .flat_map(|m| m.iter().map(|(o, a)| (*o).max(*a)))
            .max()
            .unwrap_or(1) as f64
            * 1.1;
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
