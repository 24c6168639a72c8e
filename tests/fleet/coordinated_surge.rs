//! Coordinated mode under changing load: a 15-fold surge, low rates with a
//! short interval, and the Redis load as instances and request rates grow.
//! Simulated fleets (`tests/support/fleet.rs`) on a `ManualClock`,
//! against a real `redis-server`.

use crate::fleet;
use crate::support::redis as redis_support;

use fleet::{Balancer, Fleet, Run};
use redis_support::{require_redis, RedisServer};
use std::time::Duration;
use tower_ratelimit::clock::{Clock, ManualClock, SystemClock};
use tower_ratelimit::store::{Coordinated, RedisStore};

/// `n` coordinated instances on `server`, limit `limit`/s per key.
fn fleet(
    server: &RedisServer,
    n: usize,
    limit: u64,
    interval: Duration,
    keys: usize,
    balancer: Balancer,
    start_ms: u64,
) -> Fleet {
    let clock = ManualClock::new(start_ms);
    let name = format!("surge-{start_ms}");
    let instances = (0..n)
        .map(|i| {
            fleet::coordinated(
                &name,
                limit,
                &clock,
                Coordinated::builder(RedisStore::new(server.url()).unwrap())
                    .sync_interval(interval)
                    .sync_timeout(Duration::from_secs(1))
                    .seed(i as u64 + 1),
            )
        })
        .collect();
    Fleet::new(instances, clock, interval, keys, balancer)
}

/// The surge profile, limit 200/s on 4 instances (1 s sync): 6 s at the
/// limit, 10 s at 15 times it, 6 s at the limit again.
const LIMIT: u64 = 200;
const SURGE: [(usize, u64); 3] = [(6, LIMIT), (10, 15 * LIMIT), (6, LIMIT)];

/// Runs the surge profile behind `balancer`, from wall time `start`.
async fn surge(server: &RedisServer, balancer: Balancer, start: u64) -> (Run, Vec<u64>) {
    let mut fleet = fleet(server, 4, LIMIT, Duration::from_secs(1), 1, balancer, start);
    let run = run(&mut fleet, LIMIT, &SURGE).await;
    let admitted = run.seconds.iter().map(|(_, a)| *a).collect();
    (run, admitted)
}

async fn run(fleet: &mut Fleet, limit: u64, profile: &[(usize, u64)]) -> Run {
    let mut seconds = Vec::new();
    for &(secs, offered) in profile {
        for _ in 0..secs {
            seconds.push((offered, fleet.second(offered).await));
        }
    }
    Run { seconds, limit }
}

#[tokio::test]
async fn a_15x_surge_on_4_instances_is_held_near_the_limit_from_its_first_second_and_released_at_once(
) {
    require_redis();
    let server = RedisServer::start();
    let limit = LIMIT;
    // A balancer spreading requests evenly (round robin). At random, each
    // instance's load wobbles around its share and one with less than its
    // share cannot give the rest to another: see the random-balancer test.
    let (run, admitted) = surge(&server, Balancer::RoundRobin, SystemClock.now_ms()).await;
    println!("admitted per second: {admitted:?}");

    let first_two: u64 = admitted[6..8].iter().sum();
    assert!(
        first_two as f64 <= 1.5 * 2.0 * limit as f64,
        "{first_two} admitted over the surge's first 2 s (limit {limit}/s)"
    );
    let settled = 8..16;
    assert!(
        run.within(settled.clone(), 0.10) >= 0.9,
        "fewer than 90% of the settled seconds within 10%: {:?}",
        &admitted[settled.clone()]
    );
    let mean = run.mean_error(settled.clone());
    assert!(mean.abs() <= 0.05, "mean error after settling {mean:+.3}");
    for (t, a) in admitted.iter().enumerate().skip(16) {
        assert!(
            *a as f64 >= 0.9 * limit as f64,
            "second {t}, {} after the surge: {a} admitted of {limit} offered",
            t - 16
        );
    }
}

/// The same surge with instances picked at random: each instance's load
/// wobbles by about ±12% a second around its share, and an instance under
/// its share cannot lend the rest to one over it. The limit still holds
/// during the surge; at the limit, some of the wobble is dropped.
#[tokio::test]
async fn a_15x_surge_behind_a_random_balancer_holds_the_limit_and_drops_little_at_the_limit() {
    require_redis();
    let server = RedisServer::start();
    let limit = LIMIT;
    for seed in 1..=3 {
        let start = SystemClock.now_ms() / 1000 * 1000 + seed * 211;
        let (run, admitted) = surge(&server, Balancer::Random(seed), start).await;
        println!("seed {seed}, admitted per second: {admitted:?}");
        let first_two: u64 = admitted[6..8].iter().sum();
        assert!(first_two as f64 <= 1.5 * 2.0 * limit as f64, "{first_two}");
        let mean = run.mean_error(8..16);
        assert!(mean.abs() <= 0.05, "mean error during the surge {mean:+.3}");
        let after = run.mean_error(16..22);
        assert!(after >= -0.15, "mean error after the surge {after:+.3}");
    }
}

/// 40/s on 4 instances with a 500 ms sync, offered 60/s: each instance
/// sees about 7 requests an interval. Behind a random balancer its load
/// wobbles around its share from one interval to the next, and one under
/// its share cannot lend the rest to one over it; the fleet's admitted
/// count shows the shortfall, and the allowances are raised to make it up.
///
/// Six paced clients (10/s each) that send to the instances in turn are
/// how four real demo processes were measured: started together, each
/// round of six requests lands on one instance at once, so each instance
/// gets a burst of six every 400 ms. A burst of six meets a local budget
/// that holds five (its floor), and the refill over the 400 ms gap is
/// more than the budget holds, so an instance spends only part of its
/// allowance. Without the correction the real processes admitted 34 to 36
/// a second and this simulation 35 to 36, where the same load spread
/// evenly over each second showed no shortfall.
#[tokio::test]
async fn low_rates_with_a_500ms_interval_admit_the_limit_within_5_percent_behind_either_balancer_and_from_paced_clients_in_each_of_10_runs(
) {
    require_redis();
    let server = RedisServer::start();
    let limit = 40;
    // Each run starts at another phase of the wall clock, and is another
    // limiter (its name comes from its start).
    let base = SystemClock.now_ms() / 1000 * 1000;
    let mut failed = Vec::new();
    let patterns = [
        "round robin",
        "random",
        "6 paced clients in step",
        "6 paced clients at random phases",
    ];
    for (b, name) in patterns.into_iter().enumerate() {
        let mut means = Vec::new();
        for seed in 0..10u64 {
            let balancer = match b {
                0 => Balancer::RoundRobin,
                1 => Balancer::Random(seed),
                2 => Balancer::Paced {
                    clients: 6,
                    phases: None,
                },
                _ => Balancer::Paced {
                    clients: 6,
                    phases: Some(seed),
                },
            };
            let start = base + 2000 * b as u64 + seed * 137;
            let interval = Duration::from_millis(500);
            let mut fleet = fleet(&server, 4, limit, interval, 1, balancer, start);
            let run = run(&mut fleet, limit, &[(15, 60)]).await;
            means.push(run.mean_error(3..15));
        }
        println!("{name}: mean error after settling, per run: {means:+.3?}");
        for (seed, m) in means.iter().enumerate() {
            if m.abs() > 0.05 {
                failed.push(format!("{name}, run {seed}: {m:+.3}"));
            }
        }
    }
    assert!(failed.is_empty(), "mean error beyond 5%: {failed:?}");
}

/// Commands Redis ran over a 6-second run of `n` instances, 4 keys, at
/// `offered` requests per second.
async fn commands(server: &RedisServer, n: usize, offered: u64) -> u64 {
    let start = SystemClock.now_ms() / 1000 * 1000 + 1000 * n as u64 + offered;
    let mut fleet = fleet(
        server,
        n,
        1_000,
        Duration::from_secs(1),
        4,
        Balancer::RoundRobin,
        start,
    );
    fleet.second(offered).await; // every key seen, connections open
    server.config_resetstat();
    for _ in 0..6 {
        fleet.second(offered).await;
    }
    ["hincrby", "pexpire", "hmget"]
        .iter()
        .map(|c| server.command_calls(c))
        .sum()
}

#[tokio::test]
async fn redis_load_does_not_depend_on_the_request_rate_and_grows_linearly_with_instances() {
    require_redis();
    let server = RedisServer::start();
    let four_slow = commands(&server, 4, 400).await;
    let four_fast = commands(&server, 4, 4_000).await;
    let eight_slow = commands(&server, 8, 400).await;
    println!("4 instances: {four_slow} at 400/s, {four_fast} at 4000/s; 8 instances: {eight_slow}");
    // 4 commands per instance, key and sync (two HINCRBY and a PEXPIRE
    // into the interval's counts, an HMGET of the interval read): 4 × 4 × 6 × 4.
    assert_eq!(four_slow, 4 * 4 * 6 * 4);
    assert_eq!(four_fast, four_slow);
    assert_eq!(eight_slow, 2 * four_slow);
}
