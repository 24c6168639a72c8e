//! The sliding window counter's error, measured against the exact sliding
//! log on generated traffic (steady, bursty, end-of-window bunching).
//!
//! The counter decides; every request it admits is also logged in a sliding
//! log used only as an exact counter. Before each request we compare the
//! counter's estimate of the sliding window's usage with the exact usage,
//! and for each admission ask whether the exact log would have rejected it.
//! Run with `--nocapture` to see the numbers the README reports.

use std::time::Duration;
use tower_ratelimit::key::Key;
use tower_ratelimit::store::{Charge, MemoryStore, Namespace, Store};
use tower_ratelimit::{decision::Decision, Algorithm, Policy, Quota};

const LIMIT: u64 = 1_000;
const WINDOW: u64 = 60_000;
const WINDOWS: u64 = 40;

/// A tiny seeded xorshift64* generator: reproducible traffic without new dependencies.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Exponential inter-arrival time (ms) for `per_window` arrivals per window.
    fn gap(&mut self, per_window: f64) -> u64 {
        let mean = WINDOW as f64 / per_window;
        (-(1.0 - self.unit()).ln() * mean) as u64
    }
}

/// Arrival times (ms from an aligned start) for each traffic shape.
fn steady(rng: &mut Rng) -> Vec<u64> {
    // Poisson arrivals at 1.2 × the limit.
    let mut t = 0;
    let mut out = vec![];
    while t < WINDOWS * WINDOW {
        out.push(t);
        t += rng.gap(1.2 * LIMIT as f64);
    }
    out
}

fn bursty(rng: &mut Rng) -> Vec<u64> {
    // Bursts of 100..600 requests within a second, separated by 0..40 s of quiet.
    let mut t = 0;
    let mut out = vec![];
    while t < WINDOWS * WINDOW {
        let n = 100 + rng.next() % 500;
        for _ in 0..n {
            out.push(t + rng.next() % 1_000);
        }
        t += 1_000 + rng.next() % 40_000;
    }
    out.sort_unstable();
    out
}

fn bunched(rng: &mut Rng) -> Vec<u64> {
    // Every other window: a full limit's worth in its last 2 s; the next
    // window: steady traffic at the limit's rate.
    let mut out = vec![];
    for w in 0..WINDOWS {
        let start = w * WINDOW;
        if w % 2 == 0 {
            for _ in 0..LIMIT {
                out.push(start + WINDOW - 2_000 + rng.next() % 2_000);
            }
        } else {
            let mut t = start;
            while t < start + WINDOW {
                out.push(t);
                t += rng.gap(LIMIT as f64);
            }
        }
    }
    out.sort_unstable();
    out
}

#[derive(Debug)]
struct Measured {
    requests: usize,
    admitted: usize,
    /// Mean |estimate − exact| as a share of the limit.
    mean_error: f64,
    /// Admissions the exact sliding log would have rejected, as a share of admissions.
    false_admissions: f64,
    /// The most the exact log counted in any sliding window, as a share of the limit.
    worst_window: f64,
}

fn quota(algorithm: Algorithm, limit: u64) -> Policy {
    Policy::new(
        Quota::new(limit, Duration::from_millis(WINDOW))
            .unwrap()
            .with_algorithm(algorithm)
            .unwrap(),
    )
}

async fn measure(arrivals: &[u64]) -> Measured {
    let store = MemoryStore::new();
    let ns = Namespace::new("error");
    let key = Key::new("client");
    let counter = quota(Algorithm::SlidingWindow, LIMIT);
    // The exact log, as a counter: its limit never binds.
    let exact = quota(Algorithm::SlidingLog, 10_000);
    // Aligned, so the counter's windows start with the traffic.
    let start = 1_000 * WINDOW;
    let call = |policy, now_ms, cost| {
        Charge::new(&ns, &key, policy, now_ms)
            .with_cost(cost)
            .with_timeout(Duration::from_secs(1))
    };
    let (mut admitted, mut false_admissions, mut error_sum, mut worst) = (0, 0, 0.0, 0);
    for &t in arrivals {
        let now = start + t;
        let read = |d: Decision| d.statuses()[0];
        let estimated =
            LIMIT - read(store.status(&call(&counter, now, 0)).await.unwrap()).remaining;
        let used = 10_000 - read(store.status(&call(&exact, now, 0)).await.unwrap()).remaining;
        error_sum += estimated.abs_diff(used) as f64;
        let d = store.charge(&call(&counter, now, 1)).await.unwrap();
        if d.is_allowed() {
            admitted += 1;
            if used + 1 > LIMIT {
                false_admissions += 1;
            }
            store.charge(&call(&exact, now, 1)).await.unwrap();
            worst = worst.max(used + 1);
        }
    }
    Measured {
        requests: arrivals.len(),
        admitted,
        mean_error: error_sum / arrivals.len() as f64 / LIMIT as f64,
        false_admissions: false_admissions as f64 / admitted.max(1) as f64,
        worst_window: worst as f64 / LIMIT as f64,
    }
}

#[tokio::test]
async fn sliding_window_counter_error_against_the_exact_log_on_generated_traffic() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let steady = measure(&steady(&mut rng)).await;
    let bursty = measure(&bursty(&mut rng)).await;
    let bunched = measure(&bunched(&mut rng)).await;
    for (name, m) in [
        ("steady", &steady),
        ("bursty", &bursty),
        ("bunched", &bunched),
    ] {
        println!(
            "{name:>8}: {} requests, {} admitted, mean error {:.2}% of the limit, \
             {:.2}% of admissions over the exact limit, worst window {:.0}% of the limit",
            m.requests,
            m.admitted,
            100.0 * m.mean_error,
            100.0 * m.false_admissions,
            100.0 * m.worst_window
        );
    }
    // Evenly spread traffic is what the weighting assumes: the estimate stays
    // close, and although under overload the counter hovers at the limit (so
    // estimation noise admits some requests the exact log would refuse),
    // no sliding window gets more than a few percent over.
    assert!(steady.mean_error < 0.02, "{steady:?}");
    assert!(steady.worst_window < 1.05, "{steady:?}");
    // Traffic bunched at the end of a window is undercounted in the next one:
    // larger error, more admissions the exact log refuses, and some sliding
    // window well over the limit.
    assert!(
        bunched.mean_error > 5.0 * steady.mean_error,
        "{bunched:?} vs {steady:?}"
    );
    assert!(
        bunched.false_admissions > steady.false_admissions,
        "{bunched:?} vs {steady:?}"
    );
    assert!(bunched.worst_window > 1.5, "{bunched:?}");
    // Whatever the traffic, the counter never lets through twice the limit.
    for m in [&steady, &bursty, &bunched] {
        assert!(m.worst_window < 2.0, "{m:?}");
    }
}
