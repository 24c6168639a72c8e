//! One table of (time, key, cost) inputs and expected answers, run through
//! every store: the Lua scripts and the Rust math cannot drift apart.
#![allow(dead_code)]

use std::time::Duration;
use tower_ratelimit::key::Key;
use tower_ratelimit::store::{Charge, Namespace, Refund, Store};
use tower_ratelimit::{Decision, Policy, Quota};

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

pub const TABLES: &[Table] = &[
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
    for (ti, table) in TABLES.iter().enumerate() {
        let ns = Namespace::new(&format!("vectors{ti}"));
        let policy = (table.policy)();
        for (i, r) in table.rows.iter().enumerate() {
            let key = Key::new(r.key);
            let charge = Charge {
                namespace: &ns,
                key: &key,
                policy: &policy,
                cost: r.cost,
                now_ms: start_ms + r.t,
                timeout: Duration::from_secs(2),
            };
            let d: Decision = store.charge(&charge).await.unwrap();
            let at = format!(
                "table {:?} row {i} (t={}, key={}, cost={})",
                table.name, r.t, r.key, r.cost
            );
            assert_eq!(d.is_allowed(), r.allowed, "{at}: {d:?}");
            let mut d = d;
            if r.refund {
                store
                    .refund(&Refund {
                        charge,
                        decision: &d,
                    })
                    .await
                    .unwrap();
                let after = store
                    .status(&Charge {
                        namespace: &ns,
                        key: &key,
                        policy: &policy,
                        cost: 0,
                        now_ms: start_ms + r.t,
                        timeout: Duration::from_secs(2),
                    })
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
