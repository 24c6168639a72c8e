//! The Redis store alone: decisions per second at concurrency 1, 16 and 64
//! against a `redis-server` this bench starts on a free loopback port, then a
//! table with Redis CPU and round trips per decision and raw `redis-benchmark`
//! figures for the same script beside ours.
//!
//! ```sh
//! cargo bench --features redis --bench redis
//! ```
//!
//! Needs `redis-server`, `redis-cli` and `redis-benchmark` on `PATH`.

use criterion::{BenchmarkId, Criterion, Throughput};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower_ratelimit::key::Key;
use tower_ratelimit::store::{Charge, Namespace, RedisStore, Store};
use tower_ratelimit::{Algorithm, Policy, Quota};

const KEYS: u64 = 10_000;
const WINDOW_MS: u64 = 3_600_000;
const LIMIT: u64 = 1 << 40;
const CONCURRENCY: [usize; 3] = [1, 16, 64];

/// A `redis-server` on a free port, killed by its PID on drop.
struct Redis {
    child: Child,
    port: u16,
}

impl Redis {
    fn start() -> Redis {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server on PATH");
        let r = Redis { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while r.cli(&["PING"]).trim() != "PONG" {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        r
    }

    fn cli(&self, args: &[&str]) -> String {
        Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// (`used_cpu_user + used_cpu_sys` in seconds, `EVALSHA` calls so far).
    fn counters(&self) -> (f64, u64) {
        let cpu = self.cli(&["INFO", "cpu"]);
        let field = |name: &str| -> f64 {
            cpu.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}:")))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0.0)
        };
        let stats = self.cli(&["INFO", "commandstats"]);
        let calls = stats
            .lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| {
                l.split(['=', ','])
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
            })
            .sum();
        (field("used_cpu_user") + field("used_cpu_sys"), calls)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Bench {
    store: RedisStore,
    ns: Namespace,
    policy: Policy,
    keys: Vec<Key>,
}

impl Bench {
    async fn charge(&self, i: usize, now_ms: u64) {
        let call = Charge::new(
            &self.ns,
            &self.keys[i % self.keys.len()],
            &self.policy,
            now_ms,
        )
        .with_timeout(Duration::from_secs(1));
        let d = self.store.charge(&call).await.expect("redis answers");
        assert!(d.is_allowed());
    }
}

/// `total` charges over `concurrency` tasks, each sending one after the other.
async fn run(b: &Arc<Bench>, total: u64, concurrency: usize) -> Duration {
    let now = now_ms();
    let per_task = total.div_ceil(concurrency as u64);
    let start = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|t| {
            let b = b.clone();
            tokio::spawn(async move {
                for i in 0..per_task {
                    b.charge(t * 7919 + i as usize * 31, now).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    start.elapsed()
}

/// A script call's keys and arguments.
type KeysAndArgs = (Vec<String>, Vec<String>);

/// This process's CPU time (user + system), in seconds, from `/proc/self/stat`.
fn own_cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command (in parentheses): utime and stime are the 12th and 13th.
    let rest = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<f64> = rest
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // CLK_TCK is 100 on Linux.
    f.get(10)
        .zip(f.get(11))
        .map_or(0.0, |(u, s)| (u + s) / 100.0)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn main() {
    let redis = Redis::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let store = RedisStore::builder(format!("redis://127.0.0.1:{}", redis.port))
        .build()
        .unwrap();
    let b = Arc::new(Bench {
        store,
        ns: Namespace::new("bench"),
        policy: Policy::new(Quota::new(LIMIT, Duration::from_millis(WINDOW_MS)).unwrap()),
        keys: (0..KEYS).map(|i| Key::new(i.to_le_bytes())).collect(),
    });
    rt.block_on(run(&b, 1_000, 16)); // connect and load the script

    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
        .configure_from_args();
    {
        let mut g = c.benchmark_group("redis store");
        g.throughput(Throughput::Elements(1));
        for conc in CONCURRENCY {
            g.bench_with_input(BenchmarkId::new("concurrency", conc), &conc, |bn, &conc| {
                bn.iter_custom(|iters| rt.block_on(run(&b, iters.max(conc as u64), conc)))
            });
        }
        g.finish();
    }
    c.final_summary();

    // The table: ours at each concurrency, then redis-benchmark on the same script.
    println!();
    println!(
        "| client | decisions/s | Redis CPU µs/decision | script calls/decision | client CPU µs/decision |"
    );
    println!("|---|---:|---:|---:|---:|");
    let row = |label: String, b: &Arc<Bench>, conc: usize| {
        let n = 20_000 * conc.min(4) as u64;
        let (cpu0, calls0) = redis.counters();
        let own0 = own_cpu_secs();
        let took = rt.block_on(run(b, n, conc));
        let own1 = own_cpu_secs();
        let (cpu1, calls1) = redis.counters();
        let n = n.div_ceil(conc as u64) * conc as u64;
        println!(
            "| {label} | {:.0} | {:.1} | {:.2} | {:.1} |",
            n as f64 / took.as_secs_f64(),
            (cpu1 - cpu0) * 1e6 / n as f64,
            (calls1 - calls0) as f64 / n as f64,
            (own1 - own0) * 1e6 / n as f64
        );
    };
    for conc in CONCURRENCY {
        row(format!("RedisStore, concurrency {conc}"), &b, conc);
    }
    // Every algorithm through the store at concurrency 64 (batched calls).
    for alg in [
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ] {
        // Within each algorithm's exact-arithmetic bounds (the sliding log's
        // limit is capped at 10,000), and never reached here.
        let limit = if alg == Algorithm::SlidingLog {
            10_000
        } else {
            1 << 30
        };
        let quota = Quota::new(limit, Duration::from_millis(WINDOW_MS))
            .and_then(|q| q.with_algorithm(alg))
            .unwrap();
        let ab = Arc::new(Bench {
            store: b.store.clone(),
            ns: Namespace::new(&format!("bench-{alg:?}")),
            policy: Policy::new(quota),
            keys: b.keys.clone(),
        });
        rt.block_on(run(&ab, 1_000, 16)); // load this algorithm's script
        row(format!("RedisStore, concurrency 64, {alg:?}"), &ab, 64);
    }
    // The store's own charge script as src/store/redis/scripts.rs assembles
    // it for fixed-window policies, and the standalone fixed-window script the
    // performance targets' reference figures are for.
    let charge = concat!(
        include_str!("../lua/prelude.lua"),
        include_str!("../lua/fixed_window.lua"),
        include_str!("../lua/policy.lua"),
        include_str!("../lua/charge.lua"),
    );
    let port = redis.port.to_string();
    let now = now_ms().to_string();
    let limit = LIMIT.to_string();
    let window = WINDOW_MS.to_string();
    // lua/charge.lua takes a batch: one policy (one fixed-window quota), then
    // per request its policy index, time, cost and reservation; one key per
    // request. The quota counts requests (mode 0).
    let batch = |requests: usize| -> (Vec<String>, Vec<String>) {
        let keys = vec!["rb:{__rand_int__}".to_owned(); requests];
        let mut argv: Vec<String> = ["1", "1", "fw", "fw3600000", &limit, &window, "0", "0"]
            .map(str::to_owned)
            .to_vec();
        argv.push(requests.to_string());
        for _ in 0..requests {
            argv.extend(["1".to_owned(), now.clone(), "1".to_owned(), "1".to_owned()]);
        }
        (keys, argv)
    };
    let standalone = (
        vec!["rb:{__rand_int__}".to_owned()],
        ["now", "1", "1", "fw3600000", "L", "W"]
            .map(|a| match a {
                "now" => now.clone(),
                "L" => limit.clone(),
                "W" => window.clone(),
                other => other.to_owned(),
            })
            .to_vec(),
    );
    // (name, body, requests per call, (keys, arguments))
    let scripts: [(&str, &str, usize, KeysAndArgs); 3] = [
        ("charge.lua, 1 request per call", charge, 1, batch(1)),
        ("charge.lua, 32 requests per call", charge, 32, batch(32)),
        (
            "fixed_window_standalone.lua",
            include_str!("fixed_window_standalone.lua"),
            1,
            standalone,
        ),
    ];
    for (name, body, per_call, (keys, argv)) in &scripts {
        let sha = redis.cli(&["SCRIPT", "LOAD", body]).trim().to_owned();
        for (clients, pipeline) in [(1, 1), (16, 1), (1, 16), (64, 1)] {
            let n = 100_000u64 / *per_call as u64;
            let (cpu0, _) = redis.counters();
            let out = Command::new("redis-benchmark")
                .args([
                    "-p",
                    &port,
                    "-q",
                    "-n",
                    &n.to_string(),
                    "-r",
                    &KEYS.to_string(),
                ])
                .args(["-c", &clients.to_string(), "-P", &pipeline.to_string()])
                .args(["EVALSHA", &sha, &keys.len().to_string()])
                .args(keys)
                .args(argv)
                .output()
                .expect("redis-benchmark on PATH");
            let (cpu1, _) = redis.counters();
            let text = String::from_utf8_lossy(&out.stdout);
            // `-q` prints "…: 56818.18 requests per second, p50=… msec" after \r progress lines.
            let calls_per_s = text
                .rsplit('\r')
                .next()
                .and_then(|l| l.split(": ").nth(1))
                .and_then(|l| l.split_whitespace().next())
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(f64::NAN);
            let decisions = n * *per_call as u64;
            println!(
                "| redis-benchmark -c {clients} -P {pipeline}, {name} | {:.0} | {:.1} | {:.2} | - |",
                calls_per_s * *per_call as f64,
                (cpu1 - cpu0) * 1e6 / decisions as f64,
                1.0 / *per_call as f64
            );
        }
    }
}
