//! One table of (time, key, cost) inputs and expected answers, run through
//! every store: the Lua scripts and the Rust math cannot drift apart.
#![allow(dead_code)]

use std::time::Duration;
use tower_ratelimit::key::Key;
use tower_ratelimit::store::{Charge, Namespace, Settle, Store};
use tower_ratelimit::{decision::Decision, Algorithm, Policy, Quota};

/// One step: at `t` ms after the start, `key` asks for `cost`; per quota the
/// expected (remaining, reset offset from start, retry-after ms).
pub struct Row {
    pub t: u64,
    pub key: &'static str,
    pub cost: u64,
    pub allowed: bool,
    pub quotas: &'static [(u64, u64, u64)],
    /// Refund this row's charge right after it (a free response).
    pub refund: bool,
}

const fn row(
    t: u64,
    key: &'static str,
    cost: u64,
    allowed: bool,
    quotas: &'static [(u64, u64, u64)],
) -> Row {
    Row {
        t,
        key,
        cost,
        allowed,
        quotas,
        refund: false,
    }
}

const fn refunded(t: u64, key: &'static str, cost: u64, quotas: &'static [(u64, u64, u64)]) -> Row {
    Row {
        t,
        key,
        cost,
        allowed: true,
        quotas,
        refund: true,
    }
}

/// A named table: the policy and its rows.
pub struct Table {
    pub name: &'static str,
    pub policy: fn() -> Policy,
    pub rows: &'static [Row],
}

fn fixed_3_per_s() -> Policy {
    Policy::new(Quota::new(3, Duration::from_secs(1)).unwrap())
}

fn fixed_2_per_s_and_4_per_10s() -> Policy {
    Policy::new(Quota::new(2, Duration::from_secs(1)).unwrap())
        .and(Quota::new(4, Duration::from_secs(10)).unwrap())
        .unwrap()
}

fn quota(limit: u64, window_ms: u64, algorithm: Algorithm) -> Quota {
    Quota::new(limit, Duration::from_millis(window_ms))
        .unwrap()
        .with_algorithm(algorithm)
        .unwrap()
}

fn token_bucket_4_per_s() -> Policy {
    Policy::new(quota(4, 1_000, Algorithm::TokenBucket))
}

fn gcra_4_per_s() -> Policy {
    Policy::new(quota(4, 1_000, Algorithm::Gcra))
}

fn token_bucket_3_per_s_burst_2() -> Policy {
    Policy::new(quota(3, 1_000, Algorithm::TokenBucket).burst(2).unwrap())
}

fn gcra_3_per_s_burst_2() -> Policy {
    Policy::new(quota(3, 1_000, Algorithm::Gcra).burst(2).unwrap())
}

fn sliding_window_4_per_s() -> Policy {
    Policy::new(quota(4, 1_000, Algorithm::SlidingWindow))
}

fn sliding_log_3_per_s() -> Policy {
    Policy::new(quota(3, 1_000, Algorithm::SlidingLog))
}

fn token_bucket_2_per_s_and_sliding_log_4_per_10s() -> Policy {
    Policy::new(quota(2, 1_000, Algorithm::TokenBucket))
        .and(quota(4, 10_000, Algorithm::SlidingLog))
        .unwrap()
}

fn gcra_2_per_s_and_sliding_window_3_per_10s() -> Policy {
    Policy::new(quota(2, 1_000, Algorithm::Gcra))
        .and(quota(3, 10_000, Algorithm::SlidingWindow))
        .unwrap()
}

/// Token bucket and GCRA admit the same requests: one table serves both.
/// 4/s, burst 4: a token every 250 ms.
const RATE_4_PER_S: &[Row] = &[
    row(0, "a", 1, true, &[(3, 250, 0)]),
    row(0, "a", 3, true, &[(0, 1_000, 0)]),
    // 100 ms refilled 0.4 tokens: 150 ms more for a whole one.
    row(100, "a", 1, false, &[(0, 1_000, 150)]),
    row(250, "a", 1, true, &[(0, 1_250, 0)]),
    // Above the burst: never admitted, no wait helps.
    row(250, "a", 5, false, &[(0, 1_250, 0)]),
    // Idle time fills the bucket: a burst is allowed again.
    row(2_000, "a", 1, true, &[(3, 2_250, 0)]),
    // A refund gives the tokens back (and the earlier reset).
    refunded(2_000, "a", 2, &[(3, 2_250, 0)]),
    row(2_000, "a", 3, true, &[(0, 3_000, 0)]),
    row(2_001, "a", 1, false, &[(0, 3_000, 249)]),
    row(2_001, "b", 4, true, &[(0, 3_001, 0)]),
];

/// 3/s with burst 2: 333⅓ ms per token, kept exactly (no drift).
const RATE_3_PER_S_BURST_2: &[Row] = &[
    row(0, "a", 2, true, &[(0, 667, 0)]),
    row(0, "a", 1, false, &[(0, 667, 334)]),
    row(334, "a", 1, true, &[(0, 1_000, 0)]),
    // Three requests used exactly one second: full again at 1000.
    row(1_000, "a", 2, true, &[(0, 1_667, 0)]),
    row(1_334, "a", 1, true, &[(0, 2_000, 0)]),
    row(1_334, "a", 1, false, &[(0, 2_000, 333)]),
];

pub const TABLES: &[Table] = &[
    Table {
        name: "token bucket 4/s",
        policy: token_bucket_4_per_s,
        rows: RATE_4_PER_S,
    },
    Table {
        name: "gcra 4/s",
        policy: gcra_4_per_s,
        rows: RATE_4_PER_S,
    },
    Table {
        name: "token bucket 3/s burst 2",
        policy: token_bucket_3_per_s_burst_2,
        rows: RATE_3_PER_S_BURST_2,
    },
    Table {
        name: "gcra 3/s burst 2",
        policy: gcra_3_per_s_burst_2,
        rows: RATE_3_PER_S_BURST_2,
    },
    Table {
        name: "sliding window 4/s (windows aligned to the start)",
        policy: sliding_window_4_per_s,
        rows: &[
            row(0, "a", 3, true, &[(1, 2_000, 0)]),
            // 3 + 2 > 4 in this window: next window, once 3 × (1 − e) + 2 ≤ 4.
            row(500, "a", 2, false, &[(1, 2_000, 834)]),
            // Second window, a quarter in: 3 × 0.75 = 2.25 used.
            row(1_250, "a", 1, true, &[(0, 3_000, 0)]),
            // 2.25 + 1 + 1 > 4 until 3 × (1 − e) ≤ 2, at e = 334 ms.
            row(1_250, "a", 1, false, &[(0, 3_000, 84)]),
            refunded(1_500, "a", 1, &[(1, 3_000, 0)]),
            // Third window: only 1 unit of the second weighs, 1 ms before the end.
            row(2_999, "a", 4, false, &[(3, 3_000, 1)]),
            row(3_000, "a", 4, true, &[(0, 5_000, 0)]),
            row(5_000, "a", 5, false, &[(4, 5_000, 0)]),
        ],
    },
    Table {
        name: "sliding log 3/s",
        policy: sliding_log_3_per_s,
        rows: &[
            row(0, "a", 1, true, &[(2, 1_000, 0)]),
            row(400, "a", 2, true, &[(0, 1_400, 0)]),
            // The entry at 0 slides out at 1000.
            row(999, "a", 1, false, &[(0, 1_400, 1)]),
            // At 1000 one unit is free; two need the entry at 400 gone.
            row(1_000, "a", 2, false, &[(1, 1_400, 400)]),
            row(1_000, "a", 1, true, &[(0, 2_000, 0)]),
            refunded(1_400, "a", 1, &[(2, 2_000, 0)]),
            row(1_400, "a", 2, true, &[(0, 2_400, 0)]),
            row(1_400, "a", 4, false, &[(0, 2_400, 0)]),
            row(5_000, "a", 0, true, &[(3, 5_000, 0)]),
            // Two charges in one ms share an entry; refunding one keeps the
            // other (and, in Redis, the log's TTL: regression for a
            // partial refund that re-created the sorted set without one).
            row(6_000, "a", 1, true, &[(2, 7_000, 0)]),
            refunded(6_000, "a", 1, &[(2, 7_000, 0)]),
        ],
    },
    Table {
        name: "token bucket 2/s and sliding log 4/10s, all or nothing",
        policy: token_bucket_2_per_s_and_sliding_log_4_per_10s,
        rows: &[
            row(0, "a", 1, true, &[(1, 500, 0), (3, 10_000, 0)]),
            row(0, "a", 1, true, &[(0, 1_000, 0), (2, 10_000, 0)]),
            // The bucket rejects; the log is not charged.
            row(0, "a", 1, false, &[(0, 1_000, 500), (2, 10_000, 0)]),
            row(1_000, "a", 2, true, &[(0, 2_000, 0), (0, 11_000, 0)]),
            // The log rejects; the bucket keeps its tokens and its reset.
            row(2_000, "a", 1, false, &[(2, 2_000, 0), (0, 11_000, 8_000)]),
            row(10_000, "a", 2, true, &[(0, 11_000, 0), (0, 20_000, 0)]),
            refunded(20_000, "a", 1, &[(2, 20_000, 0), (4, 20_000, 0)]),
        ],
    },
    Table {
        name: "gcra 2/s and sliding window 3/10s, all or nothing",
        policy: gcra_2_per_s_and_sliding_window_3_per_10s,
        rows: &[
            row(0, "a", 2, true, &[(0, 1_000, 0), (1, 20_000, 0)]),
            // The GCRA rejects; the sliding window is not charged.
            row(0, "a", 1, false, &[(0, 1_000, 500), (1, 20_000, 0)]),
            row(1_000, "a", 1, true, &[(1, 1_500, 0), (0, 20_000, 0)]),
            // The sliding window rejects; the GCRA keeps its time.
            // Next window, once 3 × (1 − e) + 1 ≤ 3: 9000 + 3334 ms.
            row(1_000, "a", 1, false, &[(1, 1_500, 0), (0, 20_000, 12_334)]),
        ],
    },
    Table {
        name: "fixed window 3/s",
        policy: fixed_3_per_s,
        rows: &[
            row(0, "a", 1, true, &[(2, 1000, 0)]),
            row(10, "a", 1, true, &[(1, 1000, 0)]),
            row(10, "b", 2, true, &[(1, 1010, 0)]),
            // Does not fit: rejected, not charged.
            row(20, "a", 2, false, &[(1, 1000, 980)]),
            row(30, "a", 1, true, &[(0, 1000, 0)]),
            row(999, "a", 1, false, &[(0, 1000, 1)]),
            // A new window opens at the reset instant.
            row(1000, "a", 1, true, &[(2, 2000, 0)]),
            // Cost above the limit: never admitted, no wait helps.
            row(1000, "a", 4, false, &[(2, 2000, 0)]),
            row(1009, "b", 1, true, &[(0, 1010, 0)]),
            row(1010, "b", 3, true, &[(0, 2010, 0)]),
            // A refund returns the cost to the window it was charged to.
            refunded(1500, "a", 1, &[(2, 2000, 0)]),
            row(1501, "a", 1, true, &[(1, 2000, 0)]),
            // Zero cost: admitted, spends nothing.
            row(1502, "a", 0, true, &[(1, 2000, 0)]),
            row(5000, "a", 3, true, &[(0, 6000, 0)]),
        ],
    },
    Table {
        name: "fixed windows 2/s and 4/10s, all or nothing",
        policy: fixed_2_per_s_and_4_per_10s,
        rows: &[
            row(0, "a", 1, true, &[(1, 1000, 0), (3, 10000, 0)]),
            row(1, "a", 1, true, &[(0, 1000, 0), (2, 10000, 0)]),
            // The per-second quota rejects; the 10 s quota is not charged.
            row(2, "a", 1, false, &[(0, 1000, 998), (2, 10000, 0)]),
            row(1000, "a", 2, true, &[(0, 2000, 0), (0, 10000, 0)]),
            // Now the 10 s quota rejects; the per-second quota keeps its units.
            row(2000, "a", 1, false, &[(2, 3000, 0), (0, 10000, 8000)]),
            row(10000, "a", 2, true, &[(0, 11000, 0), (2, 20000, 0)]),
        ],
    },
];

/// Runs every table through `store`, starting at `start_ms`; panics on the first difference.
pub async fn run_tables(store: &dyn Store, start_ms: u64) {
    // Sliding windows are aligned to the epoch: start on a minute, in the
    // future, so Redis TTLs derived from these times are never in the past.
    let start_ms = (start_ms / 60_000 + 1) * 60_000;
    for (ti, table) in TABLES.iter().enumerate() {
        let ns = Namespace::new(&format!("vectors{ti}"));
        let policy = (table.policy)();
        for (i, r) in table.rows.iter().enumerate() {
            let key = Key::new(r.key);
            let charge = Charge::new(&ns, &key, &policy, start_ms + r.t)
                .with_cost(r.cost)
                .with_timeout(Duration::from_secs(2));
            let d: Decision = store.charge(&charge).await.unwrap();
            let at = format!(
                "table {:?} row {i} (t={}, key={}, cost={})",
                table.name, r.t, r.key, r.cost
            );
            assert_eq!(d.is_allowed(), r.allowed, "{at}: {d:?}");
            let mut d = d;
            if r.refund {
                store.settle(&Settle::free(charge, &d)).await.unwrap();
                let after = store
                    .status(
                        &Charge::new(&ns, &key, &policy, start_ms + r.t)
                            .with_cost(0)
                            .with_timeout(Duration::from_secs(2)),
                    )
                    .await
                    .unwrap();
                d = after;
            }
            assert_eq!(d.statuses().len(), r.quotas.len(), "{at}");
            for (q, (s, want)) in d.statuses().iter().zip(r.quotas).enumerate() {
                let got = (s.remaining, s.reset_ms - start_ms, s.retry_after_ms);
                assert_eq!(got, *want, "{at}, quota {q}: {d:?}");
            }
        }
    }
}

/// A flood of rejected requests spends nothing and never lengthens the wait
/// (the lockout a rejected request that still drains tokens causes): for
/// every algorithm, alone and beside a second quota, `FLOOD` rejections
/// leave every quota's status as it was, and the request sent when the
/// first rejection said to retry is admitted.
pub async fn rejections_change_nothing(store: &dyn Store, start_ms: u64) {
    const FLOOD: usize = 50;
    let start_ms = (start_ms / 60_000 + 1) * 60_000;
    let algorithms = [
        Algorithm::FixedWindow,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ];
    for (i, alg) in algorithms.into_iter().enumerate() {
        let alone = Policy::new(quota(3, 1_000, alg));
        // The second quota admits throughout: the flood must not spend it either.
        let beside = Policy::new(quota(3, 1_000, alg))
            .and(quota(1_000, 60_000, Algorithm::FixedWindow))
            .unwrap();
        for (j, policy) in [alone, beside].iter().enumerate() {
            let ns = Namespace::new(&format!("rejections{i}-{j}"));
            let key = Key::new("flooder");
            let at = |now_ms, cost| {
                Charge::new(&ns, &key, policy, now_ms)
                    .with_cost(cost)
                    .with_timeout(Duration::from_secs(2))
            };
            let now = start_ms + 100;
            for _ in 0..3 {
                assert!(store.charge(&at(now, 1)).await.unwrap().is_allowed());
            }
            let before = store.status(&at(now, 0)).await.unwrap();
            let first = store.charge(&at(now, 1)).await.unwrap();
            assert!(!first.is_allowed(), "{alg:?} policy {j}: the 4th of 3");
            for _ in 0..FLOOD {
                assert!(!store.charge(&at(now, 1)).await.unwrap().is_allowed());
            }
            let after = store.status(&at(now, 0)).await.unwrap();
            assert_eq!(
                after.statuses(),
                before.statuses(),
                "{alg:?} policy {j}: {FLOOD} rejections spent something"
            );
            let retry = first.retry_after_ms();
            assert!(retry > 0, "{alg:?} policy {j}: {first:?}");
            let later = store.charge(&at(now + retry, 1)).await.unwrap();
            assert!(
                later.is_allowed(),
                "{alg:?} policy {j}: not admitted {retry} ms later, when the first rejection said: {later:?}"
            );
        }
    }
}

/// Settlement, the same in every store and for every algorithm: a policy of
/// 10 requests and 1,000 tokens a minute, where each request reserves
/// tokens at its start and settles what it really used.
pub async fn settlements_follow_the_rules(store: &dyn Store, start_ms: u64) {
    const W: u64 = 60_000;
    let start_ms = (start_ms / W + 1) * W;
    let algorithms = [
        Algorithm::FixedWindow,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ];
    for (i, alg) in algorithms.into_iter().enumerate() {
        let tokens = quota(1_000, W, alg)
            .named("tokens")
            .unwrap()
            .with_unit("tokens")
            .unwrap();
        let policy = Policy::new(quota(10, W, Algorithm::FixedWindow))
            .and(tokens)
            .unwrap();
        let ns = Namespace::new(&format!("settle{i}"));
        static DEBT: std::sync::LazyLock<Key> = std::sync::LazyLock::new(|| Key::new("debt"));
        let now = start_ms + 100;
        let call = |key: &'static Key, now_ms, units| {
            Charge::new(&ns, key, &policy, now_ms)
                .with_units(units)
                .with_timeout(Duration::from_secs(2))
        };
        // Settles a charge of 100 (0 for DEBT) to `units`.
        let settle = |key: &'static Key, d: &Decision, charged_at, units, now_ms| {
            let reserved = if std::ptr::eq(key, &*DEBT) { 0 } else { 100 };
            let charge = call(key, charged_at, reserved);
            let s = Settle::units(charge, d, units, now_ms);
            let fut = store.settle(&s);
            async move { fut.await.unwrap() }
        };
        let left = |d: Decision| {
            let s = d.statuses();
            (s[0].remaining, s[1].remaining)
        };
        let status = |key: &'static Key, now_ms| {
            let fut = store.status(&call(key, now_ms, 0));
            async move { left(fut.await.unwrap()) }
        };

        // Reserves 100, settles 10: 90 come back; the request quota keeps its 1.
        static BELOW: std::sync::LazyLock<Key> = std::sync::LazyLock::new(|| Key::new("below"));
        let d = store.charge(&call(&BELOW, now, 100)).await.unwrap();
        assert_eq!(left(d.clone()), (9, 900), "{alg:?}: the reservation");
        settle(&BELOW, &d, now, 10, now).await;
        assert_eq!(
            status(&BELOW, now).await,
            (9, 990),
            "{alg:?}: settled to 10"
        );

        // Reserves 100, settles 300: 200 more are charged to the same window or bucket.
        static ABOVE: std::sync::LazyLock<Key> = std::sync::LazyLock::new(|| Key::new("above"));
        let d = store.charge(&call(&ABOVE, now, 100)).await.unwrap();
        settle(&ABOVE, &d, now, 300, now).await;
        assert_eq!(
            status(&ABOVE, now).await,
            (9, 700),
            "{alg:?}: settled to 300"
        );

        // A settlement after its window ended (two windows on: every
        // algorithm's charge has stopped weighing) touches nothing.
        static LATE: std::sync::LazyLock<Key> = std::sync::LazyLock::new(|| Key::new("late"));
        let d = store.charge(&call(&LATE, now, 100)).await.unwrap();
        let later = now + 2 * W + 1;
        let before = status(&LATE, later).await;
        settle(&LATE, &d, now, 300, later).await;
        settle(&LATE, &d, now, 10, later).await;
        assert_eq!(
            status(&LATE, later).await,
            before,
            "{alg:?}: a late settlement"
        );

        // Reserving nothing, admitted while anything is left: three of 300
        // leave 100, a fourth is still admitted and its 300 go 200 into
        // debt, so a fifth is refused by the tokens quota alone and charges
        // nothing anywhere.
        for n in 0..4 {
            let d = store.charge(&call(&DEBT, now, 0)).await.unwrap();
            assert!(d.is_allowed(), "{alg:?}: request {n} with tokens left");
            settle(&DEBT, &d, now, 300, now).await;
        }
        assert_eq!(status(&DEBT, now).await, (6, 0), "{alg:?}: in debt");
        let refused = store.charge(&call(&DEBT, now, 0)).await.unwrap();
        assert!(!refused.is_allowed(), "{alg:?}: {refused:?}");
        assert!(!refused.statuses()[1].allowed && refused.statuses()[0].allowed);
        assert!(refused.retry_after_ms() > 0, "{alg:?}: {refused:?}");
        assert_eq!(
            status(&DEBT, now).await,
            (6, 0),
            "{alg:?}: the refusal spent nothing"
        );
    }
}

/// Tables for the policies that wait for a request's turn or keep a
/// penalty box: bookings, cancellations in several orders, blocks.
#[cfg(all(feature = "wait", feature = "penalty"))]
pub mod refusal {
    use super::quota;
    use std::time::Duration;
    use tower_ratelimit::decision::{Decision, RejectReason};
    use tower_ratelimit::key::Key;
    use tower_ratelimit::rate::{Penalty, Wait};
    use tower_ratelimit::store::{Charge, Namespace, Settle, Store};
    use tower_ratelimit::{Algorithm, Policy, Quota};

    /// What a step does, `t` ms after the start, on the key "a".
    pub enum Act {
        /// Charges `cost`, booked at most `wait` ms ahead.
        Charge { cost: u64, wait: u64 },
        /// Gives back the charge of row `n` in full, as the layer does for
        /// a client that went away, then reads the status.
        Cancel(usize),
        /// Reads the status.
        Status,
    }

    /// What the step's decision says.
    #[derive(Clone, Copy, Debug, PartialEq)]
    pub enum Want {
        /// Admitted now.
        Admit,
        /// Admitted for its turn this many ms ahead.
        Wait(u64),
        /// Refused, as any policy refuses.
        Refuse,
        /// Refused, and this refusal blocks the key until this offset.
        Blocks(u64),
        /// Refused because the key is blocked until this offset (a status
        /// read says so too).
        Blocked(u64),
        /// A status read of a key that is not blocked.
        Read,
    }

    /// One step and, per quota, the expected (remaining, reset offset,
    /// retry-after ms).
    pub struct Step {
        pub t: u64,
        pub act: Act,
        pub want: Want,
        pub quotas: &'static [(u64, u64, u64)],
    }

    const fn ch(
        t: u64,
        cost: u64,
        wait: u64,
        want: Want,
        quotas: &'static [(u64, u64, u64)],
    ) -> Step {
        Step {
            t,
            act: Act::Charge { cost, wait },
            want,
            quotas,
        }
    }

    const fn cancel(t: u64, row: usize, quotas: &'static [(u64, u64, u64)]) -> Step {
        Step {
            t,
            act: Act::Cancel(row),
            want: Want::Read,
            quotas,
        }
    }

    const fn status(t: u64, want: Want, quotas: &'static [(u64, u64, u64)]) -> Step {
        Step {
            t,
            act: Act::Status,
            want,
            quotas,
        }
    }

    /// A named table: the policy and its steps.
    pub struct Table {
        pub name: &'static str,
        pub policy: fn() -> Policy,
        pub steps: &'static [Step],
    }

    fn gcra(limit: u64, window_ms: u64, burst: u64) -> Quota {
        quota(limit, window_ms, Algorithm::Gcra)
            .burst(burst)
            .unwrap()
    }

    fn waits(policy: Policy, ms: u64) -> Policy {
        policy.wait(Wait::up_to(Duration::from_millis(ms))).unwrap()
    }

    use Want::*;

    pub const TABLES: &[Table] = &[
        Table {
            name: "gcra 5/s burst 2, waiting up to 1 s",
            policy: || waits(Policy::new(gcra(5, 1_000, 2)), 1_000),
            // A turn every 200 ms once the burst is spent.
            steps: &[
                ch(0, 1, 1_000, Admit, &[(1, 200, 0)]),
                ch(0, 1, 1_000, Admit, &[(0, 400, 0)]),
                ch(0, 1, 1_000, Wait(200), &[(0, 600, 0)]),
                ch(0, 1, 1_000, Wait(400), &[(0, 800, 0)]),
                // Its turn (600 ms) is past what this charge may wait.
                ch(0, 1, 300, Refuse, &[(0, 800, 600)]),
                ch(0, 1, 0, Refuse, &[(0, 800, 600)]),
                // The first booking goes (a hole), then the last: both
                // come back, as if they had never been booked.
                cancel(0, 2, &[(0, 800, 0)]),
                cancel(0, 3, &[(0, 400, 0)]),
                ch(100, 1, 1_000, Wait(100), &[(0, 600, 0)]),
                ch(100, 1, 1_000, Wait(300), &[(0, 800, 0)]),
                ch(100, 1, 1_000, Wait(500), &[(0, 1_000, 0)]),
                // First in, last in, then the middle one.
                cancel(150, 8, &[(0, 1_000, 0)]),
                cancel(150, 10, &[(0, 800, 0)]),
                cancel(150, 9, &[(0, 400, 0)]),
                ch(150, 1, 1_000, Wait(50), &[(0, 600, 0)]),
                ch(700, 1, 0, Admit, &[(1, 900, 0)]),
                status(700, Read, &[(1, 900, 0)]),
            ],
        },
        Table {
            name: "gcra 3/s burst 1, waiting up to 1 s (turns rounded up to whole ms)",
            policy: || waits(Policy::new(gcra(3, 1_000, 1)), 1_000),
            steps: &[
                ch(0, 1, 1_000, Admit, &[(0, 334, 0)]),
                // 333⅓ ms a turn: each booked from the next whole ms.
                ch(0, 1, 1_000, Wait(334), &[(0, 668, 0)]),
                ch(0, 1, 1_000, Wait(668), &[(0, 1_002, 0)]),
                cancel(0, 1, &[(0, 1_002, 0)]),
                cancel(0, 2, &[(0, 334, 0)]),
                ch(0, 1, 1_000, Wait(334), &[(0, 668, 0)]),
            ],
        },
        Table {
            name: "gcra 10/s burst 1 and gcra 4/2s burst 2, waiting up to 2 s",
            policy: || {
                waits(
                    Policy::new(gcra(10, 1_000, 1))
                        .and(gcra(4, 2_000, 2))
                        .unwrap(),
                    2_000,
                )
            },
            // Both quotas are booked for the later of their turns.
            steps: &[
                ch(0, 1, 2_000, Admit, &[(0, 100, 0), (1, 500, 0)]),
                ch(0, 1, 2_000, Wait(100), &[(0, 200, 0), (0, 1_000, 0)]),
                ch(0, 1, 2_000, Wait(500), &[(0, 600, 0), (0, 1_500, 0)]),
                ch(0, 1, 2_000, Wait(1_000), &[(0, 1_100, 0), (0, 2_000, 0)]),
                ch(0, 1, 800, Refuse, &[(0, 1_100, 1_100), (0, 2_000, 1_500)]),
                cancel(10, 1, &[(0, 1_100, 0), (0, 2_000, 0)]),
                cancel(10, 3, &[(0, 600, 0), (0, 1_500, 0)]),
                cancel(10, 2, &[(0, 100, 0), (1, 500, 0)]),
                ch(10, 1, 2_000, Wait(90), &[(0, 200, 0), (0, 1_000, 0)]),
            ],
        },
        Table {
            name: "fixed window 2/s, blocked 5 s after 3 refusals",
            policy: || {
                Policy::new(Quota::new(2, Duration::from_secs(1)).unwrap())
                    .penalty(Penalty::after(3).block_for(Duration::from_secs(5)))
                    .unwrap()
            },
            steps: &[
                ch(0, 1, 0, Admit, &[(1, 1_000, 0)]),
                ch(0, 1, 0, Admit, &[(0, 1_000, 0)]),
                ch(10, 1, 0, Refuse, &[(0, 1_000, 990)]),
                ch(20, 1, 0, Refuse, &[(0, 1_000, 980)]),
                ch(30, 1, 0, Blocks(5_030), &[(0, 1_000, 5_000)]),
                ch(40, 1, 0, Blocked(5_030), &[(0, 1_000, 4_990)]),
                // A new window has room, but the key stays blocked, and a
                // blocked request charges nothing.
                status(1_500, Blocked(5_030), &[(2, 2_500, 3_530)]),
                ch(1_500, 1, 0, Blocked(5_030), &[(2, 2_500, 3_530)]),
                status(1_500, Blocked(5_030), &[(2, 2_500, 3_530)]),
                ch(5_030, 1, 0, Admit, &[(1, 6_030, 0)]),
                // A count starts, and starts again once its second has passed.
                ch(5_031, 2, 0, Refuse, &[(1, 6_030, 999)]),
                ch(6_100, 3, 0, Refuse, &[(2, 7_100, 0)]),
                ch(6_200, 3, 0, Refuse, &[(2, 7_200, 0)]),
                ch(6_300, 3, 0, Blocks(11_300), &[(2, 7_300, 5_000)]),
                ch(11_300, 1, 0, Admit, &[(1, 12_300, 0)]),
            ],
        },
        Table {
            name:
                "gcra 2/s burst 2, blocked 1 s after 2 refusals in 2 s, blocked requests extend it",
            policy: || {
                Policy::new(gcra(2, 1_000, 2))
                    .penalty(
                        Penalty::after(2)
                            .within(Duration::from_secs(2))
                            .block_for(Duration::from_secs(1))
                            .extended_by_blocked(true),
                    )
                    .unwrap()
            },
            steps: &[
                ch(0, 1, 0, Admit, &[(1, 500, 0)]),
                ch(0, 1, 0, Admit, &[(0, 1_000, 0)]),
                ch(0, 1, 0, Refuse, &[(0, 1_000, 500)]),
                ch(100, 1, 0, Blocks(1_100), &[(0, 1_000, 1_000)]),
                ch(600, 1, 0, Blocked(1_600), &[(1, 1_000, 1_000)]),
                // A status read extends nothing.
                status(1_500, Blocked(1_600), &[(2, 1_500, 100)]),
                ch(1_500, 1, 0, Blocked(2_500), &[(2, 1_500, 1_000)]),
                ch(2_500, 1, 0, Admit, &[(1, 3_000, 0)]),
                status(2_500, Read, &[(1, 3_000, 0)]),
            ],
        },
        Table {
            name: "gcra 5/s burst 1, waiting up to 500 ms, blocked 3 s after 2 refusals",
            policy: || {
                waits(Policy::new(gcra(5, 1_000, 1)), 500)
                    .penalty(
                        Penalty::after(2)
                            .within(Duration::from_secs(10))
                            .block_for(Duration::from_secs(3)),
                    )
                    .unwrap()
            },
            // A booking is no refusal; a refusal past the wait is.
            steps: &[
                ch(0, 1, 500, Admit, &[(0, 200, 0)]),
                ch(0, 1, 500, Wait(200), &[(0, 400, 0)]),
                ch(0, 1, 500, Wait(400), &[(0, 600, 0)]),
                ch(0, 1, 500, Refuse, &[(0, 600, 600)]),
                ch(0, 1, 500, Blocks(3_000), &[(0, 600, 3_000)]),
                ch(100, 1, 500, Blocked(3_000), &[(0, 600, 2_900)]),
                ch(3_000, 1, 500, Admit, &[(0, 3_200, 0)]),
            ],
        },
    ];

    /// Runs every table through `store`, starting at `start_ms`; panics on
    /// the first difference.
    pub async fn run_tables(store: &dyn Store, start_ms: u64) {
        let start_ms = (start_ms / 60_000 + 1) * 60_000;
        let key = Key::new("a");
        for (ti, table) in TABLES.iter().enumerate() {
            let ns = Namespace::new(&format!("refusal{ti}"));
            let policy = (table.policy)();
            let at = |t: u64, cost: u64| {
                Charge::new(&ns, &key, &policy, start_ms + t)
                    .with_cost(cost)
                    .with_timeout(Duration::from_secs(2))
            };
            let mut charged: Vec<Option<(u64, u64, Decision)>> = vec![];
            for (i, s) in table.steps.iter().enumerate() {
                let here = format!("table {:?} step {i} (t={})", table.name, s.t);
                let d = match s.act {
                    Act::Charge { cost, wait } => {
                        let d = store.charge(&at(s.t, cost).with_wait(wait)).await.unwrap();
                        charged.push(Some((s.t, cost, d.clone())));
                        d
                    }
                    Act::Cancel(n) => {
                        let (t, cost, d) = charged[n].clone().expect("a charge to cancel");
                        let mut settle = Settle::free(at(t, cost), &d);
                        settle.now_ms = start_ms + s.t;
                        store.settle(&settle).await.unwrap();
                        charged.push(None);
                        store.status(&at(s.t, 0)).await.unwrap()
                    }
                    Act::Status => {
                        charged.push(None);
                        store.status(&at(s.t, 0)).await.unwrap()
                    }
                };
                let offset = |ms: u64| ms - start_ms;
                let got = match (d.is_allowed(), d.wait_ms(), d.blocked_until_ms()) {
                    (true, 0, None) if matches!(s.act, Act::Charge { .. }) => Admit,
                    (true, 0, None) => Read,
                    (true, w, None) => Wait(w),
                    (false, _, None) => Refuse,
                    (false, _, Some(u)) if d.reject_reason() == Some(RejectReason::Blocked) => {
                        Blocked(offset(u))
                    }
                    (false, _, Some(u)) => Blocks(offset(u)),
                    other => panic!("{here}: an impossible decision {other:?}: {d:?}"),
                };
                assert_eq!(got, s.want, "{here}: {d:?}");
                assert_eq!(d.statuses().len(), s.quotas.len(), "{here}");
                for (q, (st, want)) in d.statuses().iter().zip(s.quotas).enumerate() {
                    let got = (st.remaining, offset(st.reset_ms), st.retry_after_ms);
                    assert_eq!(got, *want, "{here}, quota {q}: {d:?}");
                }
            }
        }
    }
}
