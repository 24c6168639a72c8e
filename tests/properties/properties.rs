//! Property tests: for random arrival sequences, costs and refunds, the strict
//! algorithms never admit more than their definition allows over any
//! interval — through the memory store (many cases) and a real Redis (fewer
//! cases, one server per test) — and both stores answer identically.

use crate::support::redis as redis_support;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tower_ratelimit::clock::{Clock, SystemClock};
use tower_ratelimit::key::Key;
use tower_ratelimit::store::{Charge, MemoryStore, Namespace, RedisStore, Settle, Store};
use tower_ratelimit::{decision::Decision, decision::QuotaStatus, Algorithm, Policy, Quota};

/// One request: `gap` ms after the previous one, asking for `cost`; settled
/// if `refund` is set, that many steps later (0: at once). With no `actual`
/// it is a free response (a 304), given back at the charge's own time as
/// the layer does; with one, quotas in units are settled to it when the
/// settlement arrives (debt above the charge, and nothing once the window
/// has passed).
#[derive(Clone, Debug)]
struct Step {
    gap: u64,
    cost: u64,
    refund: Option<usize>,
    actual: Option<u64>,
}

/// What a store answered for one step.
#[derive(Clone, Debug, PartialEq)]
struct Outcome {
    t: u64,
    cost: u64,
    allowed: bool,
    refunded: bool,
    statuses: Vec<QuotaStatus>,
}

#[derive(Clone, Debug)]
struct Case {
    algorithm: Algorithm,
    limit: u64,
    window_ms: u64,
    burst: u64,
    steps: Vec<Step>,
}

impl Case {
    fn quota(&self) -> Quota {
        let q = Quota::new(self.limit, Duration::from_millis(self.window_ms))
            .unwrap()
            .with_algorithm(self.algorithm)
            .unwrap();
        if self.algorithm.has_burst() {
            q.burst(self.burst).unwrap()
        } else {
            q
        }
    }
}

const STRICT: [Algorithm; 4] = [
    Algorithm::FixedWindow,
    Algorithm::TokenBucket,
    Algorithm::Gcra,
    Algorithm::SlidingLog,
];

fn steps(
    window_ms: u64,
    max_cost: u64,
    refunds: bool,
    settles: bool,
) -> impl Strategy<Value = Vec<Step>> {
    // Gaps are mostly short (bursts) with some idle periods up to two windows.
    let gap = prop_oneof![
        4 => 0..=window_ms / 8,
        1 => 0..=2 * window_ms,
    ];
    let refund = if refunds {
        prop::option::weighted(0.25, 0..4usize).boxed()
    } else {
        Just(None).boxed()
    };
    let actual = if settles {
        prop::option::weighted(0.8, 0..=2 * max_cost).boxed()
    } else {
        Just(None).boxed()
    };
    prop::collection::vec(
        (gap, 0..=max_cost, refund, actual).prop_map(|(gap, cost, refund, actual)| Step {
            gap,
            cost,
            refund,
            actual,
        }),
        1..120,
    )
}

fn case(
    algorithms: &'static [Algorithm],
    refunds: bool,
    settles: bool,
) -> impl Strategy<Value = Case> {
    (
        prop::sample::select(algorithms),
        1..=12u64,
        prop::sample::select(&[100u64, 300, 1_000, 1_500][..]),
        1..=16u64,
    )
        .prop_flat_map(move |(algorithm, limit, window_ms, burst)| {
            let most = if algorithm.has_burst() { burst } else { limit };
            steps(window_ms, most + 1, refunds, settles).prop_map(move |steps| Case {
                algorithm,
                limit,
                window_ms,
                burst,
                steps,
            })
        })
}

static NEXT_KEY: AtomicU64 = AtomicU64::new(0);

/// Runs `steps` from `start` through `store` on a fresh key.
async fn run(store: &dyn Store, policy: &Policy, start: u64, steps: &[Step]) -> Vec<Outcome> {
    let ns = Namespace::new("properties");
    let key = Key::new(NEXT_KEY.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    let mut t = start;
    let mut out: Vec<Outcome> = Vec::with_capacity(steps.len());
    let mut decisions: Vec<Decision> = Vec::with_capacity(steps.len());
    // (due at step, index of the charge to refund)
    let mut due: Vec<(usize, usize)> = vec![];
    for (j, s) in steps.iter().enumerate().chain([(
        steps.len(),
        &Step {
            gap: 0,
            cost: 0,
            refund: None,
            actual: None,
        },
    )]) {
        for &(_, i) in due.iter().filter(|(at, _)| *at <= j) {
            let charge = Charge::new(&ns, &key, policy, out[i].t)
                .with_cost(out[i].cost)
                .with_timeout(Duration::from_secs(5));
            let settle = match steps[i].actual {
                None => Settle::free(charge, &decisions[i]),
                Some(n) => Settle::units(charge, &decisions[i], n, t),
            };
            store.settle(&settle).await.unwrap();
        }
        due.retain(|(at, _)| *at > j);
        if j == steps.len() {
            break;
        }
        t += s.gap;
        let charge = Charge::new(&ns, &key, policy, t)
            .with_cost(s.cost)
            .with_timeout(Duration::from_secs(5));
        let d: Decision = store.charge(&charge).await.unwrap();
        let refunded = s.refund.is_some() && d.is_allowed();
        if let (Some(after), true) = (s.refund, refunded) {
            if after == 0 {
                let settle = match s.actual {
                    None => Settle::free(charge, &d),
                    Some(n) => Settle::units(charge, &d, n, t),
                };
                store.settle(&settle).await.unwrap();
            } else {
                due.push((j + after, j));
            }
        }
        out.push(Outcome {
            t,
            cost: s.cost,
            allowed: d.is_allowed(),
            refunded,
            statuses: d.statuses().to_vec(),
        });
        decisions.push(d);
    }
    out
}

/// Admitted, not refunded: what the quota really let through (a refunded
/// request counts as free even if its refund came too late to apply, so
/// the checks hold the stores to the strictest reading).
fn spent(o: &Outcome) -> u64 {
    if o.allowed && !o.refunded {
        o.cost
    } else {
        0
    }
}

/// Checks that quota `qi` of the policy never admitted more than its definition allows.
fn check_strict(q: &Quota, qi: usize, out: &[Outcome]) -> Result<(), TestCaseError> {
    let (limit, w) = (q.limit(), q.window_ms());
    match q.algorithm() {
        Algorithm::FixedWindow => {
            // Admitted units sit in windows [reset - W, reset) that never
            // overlap, at most `limit` each.
            let mut windows: Vec<(u64, u64)> = vec![];
            for o in out.iter().filter(|o| o.allowed) {
                let reset = o.statuses[qi].window_id;
                prop_assert!(reset - w <= o.t && o.t < reset, "{o:?} outside its window");
                match windows.last_mut() {
                    Some((r, sum)) if *r == reset => *sum += spent(o),
                    Some((r, _)) => {
                        prop_assert!(reset - w >= *r, "windows overlap: {r} then {reset}");
                        windows.push((reset, spent(o)));
                    }
                    None => windows.push((reset, spent(o))),
                }
            }
            for (reset, sum) in windows {
                prop_assert!(sum <= limit, "{sum} admitted in the window ending {reset}");
            }
        }
        Algorithm::TokenBucket | Algorithm::Gcra => {
            // Over any closed interval [a, b]: at most burst + (b − a) × limit / W.
            let burst = q.burst_size();
            for (i, a) in out.iter().enumerate() {
                let mut sum = 0;
                for b in &out[i..] {
                    sum += spent(b);
                    // Everything admitted at a.t counts, including before `a` in the list.
                    let same_t: u64 = out[..i].iter().filter(|o| o.t == a.t).map(spent).sum();
                    prop_assert!(
                        (sum + same_t) * w <= burst * w + (b.t - a.t) * limit,
                        "{} admitted in [{}, {}] with burst {burst} and {limit} per {w} ms",
                        sum + same_t,
                        a.t,
                        b.t
                    );
                }
            }
        }
        Algorithm::SlidingLog => {
            // Over every sliding window (t − W, t]: at most `limit`.
            for o in out {
                let sum: u64 = out
                    .iter()
                    .filter(|p| p.t + w > o.t && p.t <= o.t)
                    .map(spent)
                    .sum();
                prop_assert!(
                    sum <= limit,
                    "{sum} admitted in ({}, {}]",
                    o.t.saturating_sub(w),
                    o.t
                );
            }
        }
        other => panic!("{other:?} is not strict"),
    }
    // Whatever the algorithm: a rejection admits nothing, and a status never
    // reports more than can be spent; a rejection reports what can still be
    // spent, which is below its cost (0 for a cost of 1).
    for o in out {
        let s = &o.statuses[qi];
        prop_assert!(s.remaining <= s.limit);
        if !s.allowed {
            prop_assert!(
                s.remaining < o.cost,
                "a rejection's remaining is below its cost: {o:?}"
            );
        }
        if !s.allowed && o.cost <= s.limit {
            prop_assert!(
                s.retry_after_ms > 0,
                "a rejection that can pass has a wait: {o:?}"
            );
        }
    }
    Ok(())
}

/// Under `CI=true` the cases come from a fixed seed, so a landing is
/// reproducible; elsewhere every run explores new cases (that is how the
/// zero-cost sliding-log refund bug was found).
fn memory_runner(cases: u32) -> TestRunner {
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    if std::env::var("CI").as_deref() == Ok("true") {
        TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha))
    } else {
        TestRunner::new(config)
    }
}

fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn strict_property(store: &dyn Store, cases: u32, refunds: bool, start: impl Fn() -> u64) {
    let rt = current_thread_runtime();
    memory_runner(cases)
        .run(&case(&STRICT, refunds, false), |c| {
            let q = c.quota();
            let out = rt.block_on(run(store, &Policy::new(q.clone()), start(), &c.steps));
            check_strict(&q, 0, &out)
        })
        .unwrap();
}

#[test]
fn strict_algorithms_never_admit_more_than_their_definition_in_the_memory_store() {
    strict_property(&MemoryStore::new(), 2_000, false, || 1_000_000);
}

#[test]
fn refunds_never_let_strict_algorithms_admit_more_than_their_definition_in_the_memory_store() {
    strict_property(&MemoryStore::new(), 2_000, true, || 1_000_000);
}

#[test]
fn a_mixed_policy_holds_every_quota_to_its_definition_in_the_memory_store() {
    let rt = current_thread_runtime();
    let store = MemoryStore::new();
    let strategy = (1..=8u64, 1..=6u64, steps(300, 5, true, false));
    memory_runner(500)
        .run(&strategy, |(per_s, per_2s, steps)| {
            let quotas = [
                Quota::new(per_s, Duration::from_secs(1))
                    .unwrap()
                    .with_algorithm(Algorithm::Gcra)
                    .unwrap(),
                Quota::new(per_2s, Duration::from_secs(2))
                    .unwrap()
                    .with_algorithm(Algorithm::SlidingLog)
                    .unwrap(),
                Quota::new(per_s * 2, Duration::from_millis(1_500))
                    .unwrap()
                    .with_algorithm(Algorithm::TokenBucket)
                    .unwrap(),
            ];
            let policy = Policy::new(quotas[0].clone())
                .and(quotas[1].clone())
                .unwrap()
                .and(quotas[2].clone())
                .unwrap();
            let out = rt.block_on(run(&store, &policy, 1_000_000, &steps));
            for (i, q) in quotas.iter().enumerate() {
                check_strict(q, i, &out)?;
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn token_bucket_and_gcra_of_the_same_rate_and_burst_answer_identically_refunds_included() {
    let rt = current_thread_runtime();
    let store = MemoryStore::new();
    let strategy = case(&[Algorithm::TokenBucket], true, false);
    memory_runner(1_000)
        .run(&strategy, |c| {
            let tb = Policy::new(c.quota());
            let gcra = Policy::new(
                Case {
                    algorithm: Algorithm::Gcra,
                    ..c.clone()
                }
                .quota(),
            );
            let a = rt.block_on(run(&store, &tb, 1_000_000, &c.steps));
            let b = rt.block_on(run(&store, &gcra, 1_000_000, &c.steps));
            prop_assert_eq!(a, b);
            Ok(())
        })
        .unwrap();
}

/// An hour ahead of real time. Redis expires keys at `PEXPIREAT` (the
/// application's reset + 1 s) by its own clock, so simulated time must never
/// fall behind real time while a case runs — which it could on a loaded
/// machine if it started at "now" (a key then vanished mid-case: a flaky
/// mismatch with the memory store).
fn redis_start() -> u64 {
    SystemClock.now_ms() + 3_600_000
}

#[test]
fn strict_algorithms_never_admit_more_than_their_definition_in_redis() {
    redis_support::require_redis();
    let server = redis_support::RedisServer::start();
    let store = RedisStore::new(server.url()).unwrap();
    strict_property(&store, 48, true, redis_start);
    redis_support::assert_every_key_has_a_ttl(&server);
}

/// Runs the same random cases through the memory store and a real Redis,
/// under the policy `policy` makes of each, and holds them to one answer.
fn stores_agree(settles: bool, policy: impl Fn(&Case) -> Policy) {
    redis_support::require_redis();
    let server = redis_support::RedisServer::start();
    let redis = RedisStore::new(server.url()).unwrap();
    let memory = MemoryStore::new();
    let rt = current_thread_runtime();
    memory_runner(64)
        .run(&case(&Algorithm::ALL, true, settles), |c| {
            let policy = policy(&c);
            // Both start on the same instant: sliding windows are aligned to the epoch.
            let start = redis_start();
            let a = rt.block_on(run(&memory, &policy, start, &c.steps));
            let b = rt.block_on(run(&redis, &policy, start, &c.steps));
            prop_assert_eq!(a, b);
            Ok(())
        })
        .unwrap();
    redis_support::assert_every_key_has_a_ttl(&server);
}

#[test]
fn memory_and_redis_answer_every_algorithm_identically() {
    stores_agree(false, |c| Policy::new(c.quota()));
}

/// Settlements below and above the reservation, on time and late, leave
/// both stores in the same state: a policy of a request quota and a quota
/// in tokens of the same algorithm, the tokens admitted while anything is
/// left or (even limits) only while the reservation fits.
#[test]
fn memory_and_redis_settle_every_algorithm_identically() {
    stores_agree(true, |c| {
        let mut tokens = c
            .quota()
            .named("tokens")
            .unwrap()
            .with_unit("tokens")
            .unwrap();
        if c.limit % 2 == 0 {
            tokens = tokens.only_while_the_reservation_fits();
        }
        Policy::new(c.quota()).and(tokens).unwrap()
    });
}

/// Regression: refunding a zero-cost charge to a sliding log in Redis re-added
/// the same member and then removed it, deleting the earlier charge logged in
/// that millisecond (found by the property test above).
#[test]
fn a_zero_cost_refund_never_deletes_a_sliding_log_entry() {
    let rt = current_thread_runtime();
    let policy = Policy::new(
        Quota::new(7, Duration::from_secs(1))
            .unwrap()
            .with_algorithm(Algorithm::SlidingLog)
            .unwrap(),
    );
    let steps = [
        Step {
            gap: 0,
            cost: 6,
            refund: None,
            actual: None,
        },
        Step {
            gap: 0,
            cost: 0,
            refund: Some(0),
            actual: None,
        },
        Step {
            gap: 0,
            cost: 2,
            refund: None,
            actual: None,
        },
    ];
    let memory = rt.block_on(run(&MemoryStore::new(), &policy, 1_000_000, &steps));
    assert!(!memory[2].allowed, "memory: 6 + 2 exceeds 7");
    redis_support::require_redis();
    let server = redis_support::RedisServer::start();
    let redis = RedisStore::new(server.url()).unwrap();
    let out = rt.block_on(run(&redis, &policy, redis_start(), &steps));
    assert!(
        !out[2].allowed,
        "redis: the zero-cost refund deleted the 6-unit entry"
    );
}

/// Waiting for a turn and the penalty box: exact across instances, and the
/// same in memory and in Redis.
#[cfg(all(feature = "wait", feature = "penalty"))]
mod refusal {
    use super::*;
    use tower_ratelimit::decision::RejectReason;
    use tower_ratelimit::rate::{Penalty, Wait};

    /// One request: `gap` ms after the previous one, sent through instance
    /// `instance`, allowed to wait `wait` ms (a share of the policy's most,
    /// in thousandths: the layer sends less when its waiting cap is full or
    /// a deadline is near), and cancelled `cancel` steps later (0: at once)
    /// by a client that went away, at the charge's own time as the layer
    /// does, or at the time of cancelling.
    #[derive(Clone, Debug)]
    struct Step {
        gap: u64,
        instance: usize,
        cost: u64,
        wait: u64,
        cancel: Option<(usize, bool)>,
    }

    #[derive(Clone, Debug)]
    struct Case {
        quotas: Vec<(u64, u64, u64)>,
        max_wait: u64,
        penalty: Option<(u64, u64, u64, bool)>,
        steps: Vec<Step>,
    }

    impl Case {
        fn quotas(&self) -> Vec<Quota> {
            self.quotas
                .iter()
                .map(|&(limit, window, burst)| {
                    Quota::new(limit, Duration::from_millis(window))
                        .unwrap()
                        .with_algorithm(Algorithm::Gcra)
                        .unwrap()
                        .burst(burst)
                        .unwrap()
                })
                .collect()
        }

        fn policy(&self) -> Policy {
            let q = self.quotas();
            let mut p = Policy::new(q[0].clone());
            for q in &q[1..] {
                p = p.and(q.clone()).unwrap();
            }
            p = p
                .wait(Wait::up_to(Duration::from_millis(self.max_wait)))
                .unwrap();
            match self.penalty {
                None => p,
                Some(box_) => p.penalty(penalty(box_)).unwrap(),
            }
        }
    }

    /// A penalty box: blocked `block` ms after `after` refusals within
    /// `within` ms, extended by blocked requests or not.
    fn penalty((after, within, block, extend): (u64, u64, u64, bool)) -> Penalty {
        Penalty::after(after)
            .within(Duration::from_millis(within))
            .block_for(Duration::from_millis(block))
            .extended_by_blocked(extend)
    }

    /// A Redis server of its own, a store on it, a memory store, and a
    /// runtime to drive both.
    fn both_stores() -> (
        redis_support::RedisServer,
        RedisStore,
        MemoryStore,
        tokio::runtime::Runtime,
    ) {
        redis_support::require_redis();
        let server = redis_support::RedisServer::start();
        let redis = RedisStore::new(server.url()).unwrap();
        (server, redis, MemoryStore::new(), current_thread_runtime())
    }

    fn case(penalties: bool) -> impl Strategy<Value = Case> {
        // Turns at least 1 ms apart (limit <= window ms); a second quota of
        // another window, so the two never share state.
        let first = (
            1..=12u64,
            prop::sample::select(&[100u64, 300, 1_000][..]),
            1..=4u64,
        );
        let second = prop::option::of((
            1..=8u64,
            prop::sample::select(&[2_000u64, 5_000][..]),
            1..=4u64,
        ));
        let penalty = if penalties {
            prop::option::of((1..=4u64, 1..=3_000u64, 1..=3_000u64, any::<bool>())).boxed()
        } else {
            Just(None).boxed()
        };
        (first, second, 1..=2_000u64, penalty).prop_flat_map(
            |(first, second, max_wait, penalty)| {
                let window = first.1;
                let step = (
                    prop_oneof![4 => 0..=window / 4, 1 => 0..=2 * window],
                    0..2usize,
                    prop_oneof![1 => Just(1u64), 1 => 0..=2u64],
                    prop_oneof![2 => Just(1_000u64), 1 => Just(0u64), 2 => 0..=1_000u64],
                    prop::option::weighted(0.3, (0..6usize, any::<bool>())),
                )
                    .prop_map(move |(gap, instance, cost, share, cancel)| Step {
                        gap,
                        instance,
                        cost,
                        wait: max_wait * share / 1_000,
                        cancel,
                    });
                prop::collection::vec(step, 1..120).prop_map(move |steps| Case {
                    quotas: std::iter::once(first).chain(second).collect(),
                    max_wait,
                    penalty,
                    steps,
                })
            },
        )
    }

    /// What a store answered for one step.
    #[derive(Clone, Debug, PartialEq)]
    struct Answer {
        t: u64,
        allowed: bool,
        wait: u64,
        blocked: Option<u64>,
        reason: Option<RejectReason>,
        cancelled: bool,
        statuses: Vec<QuotaStatus>,
    }

    /// Runs the case's steps from `start` on a fresh key, each through the
    /// instance it names (`instances`: stores sharing one state).
    async fn run(instances: &[&dyn Store], c: &Case, start: u64) -> Vec<Answer> {
        let policy = c.policy();
        let ns = Namespace::new("properties-refusal");
        let key = Key::new(NEXT_KEY.fetch_add(1, Ordering::Relaxed).to_le_bytes());
        let charge = |t: u64, cost: u64| {
            Charge::new(&ns, &key, &policy, t)
                .with_cost(cost)
                .with_timeout(Duration::from_secs(5))
        };
        let mut t = start;
        let mut out: Vec<Answer> = vec![];
        let mut decisions: Vec<Decision> = vec![];
        // (due at step, index of the charge, at the charge's time)
        let mut due: Vec<(usize, usize, bool)> = vec![];
        for j in 0..=c.steps.len() {
            for &(_, i, own_time) in due.iter().filter(|d| d.0 <= j) {
                let s = &c.steps[i];
                let mut settle =
                    Settle::free(charge(out[i].t - out[i].wait, s.cost), &decisions[i]);
                if !own_time {
                    settle.now_ms = t;
                }
                instances[s.instance].settle(&settle).await.unwrap();
            }
            due.retain(|d| d.0 > j);
            let Some(s) = c.steps.get(j) else { break };
            t += s.gap;
            let d = instances[s.instance]
                .charge(&charge(t, s.cost).with_wait(s.wait))
                .await
                .unwrap();
            assert!(d.wait_ms() <= s.wait, "waits at most what it may: {d:?}");
            let cancelled = s.cancel.is_some() && d.is_allowed();
            if let (Some((after, own_time)), true) = (s.cancel, cancelled) {
                due.push((j + after, j, own_time));
            }
            out.push(Answer {
                t: t + d.wait_ms(),
                allowed: d.is_allowed(),
                wait: d.wait_ms(),
                blocked: d.blocked_until_ms(),
                reason: d.reject_reason(),
                cancelled,
                statuses: d.statuses().to_vec(),
            });
            decisions.push(d);
        }
        out
    }

    /// Every quota holds its definition over the requests as they really
    /// go, each at its turn (`check_strict` on the admission times), and a
    /// block refuses, with every quota's retry-after at least the time
    /// left. Two refusals are left out of `check_strict`'s rule that a
    /// refusal has less remaining than its cost (neither admits anything,
    /// so the counting is the same): a blocked key's, which is refused
    /// whatever its quotas hold, and a free request's refused behind
    /// turns booked past the wait it may have, which has nothing left.
    fn check(c: &Case, answers: &[Answer]) -> Result<(), TestCaseError> {
        let mut gone: Vec<Outcome> = vec![];
        for (a, s) in answers.iter().zip(&c.steps) {
            if a.blocked.is_some() {
                prop_assert!(!a.allowed, "a block refuses: {a:?}");
            }
            if a.reason == Some(RejectReason::Blocked) {
                let left = a.blocked.unwrap() - a.t;
                for st in &a.statuses {
                    prop_assert!(!st.allowed && st.retry_after_ms == left, "{a:?}");
                }
                continue;
            }
            if !a.allowed && s.cost == 0 {
                for st in a.statuses.iter().filter(|st| !st.allowed) {
                    prop_assert!(st.remaining == 0 && st.retry_after_ms > 0, "{a:?}");
                }
                continue;
            }
            gone.push(Outcome {
                t: a.t,
                cost: s.cost,
                allowed: a.allowed,
                refunded: a.cancelled,
                statuses: a.statuses.clone(),
            });
        }
        gone.sort_by_key(|o| o.t);
        for (qi, q) in c.quotas().iter().enumerate() {
            check_strict(q, qi, &gone)?;
        }
        Ok(())
    }

    #[test]
    fn waiting_never_lets_two_instances_admit_more_than_gcra_allows_in_the_memory_store() {
        let rt = current_thread_runtime();
        let store = MemoryStore::new();
        memory_runner(1_000)
            .run(&case(true), |c| {
                let answers = rt.block_on(run(&[&store, &store.clone()], &c, 1_000_000));
                check(&c, &answers)
            })
            .unwrap();
    }

    #[test]
    fn waiting_never_lets_two_instances_admit_more_than_gcra_allows_in_redis() {
        redis_support::require_redis();
        let server = redis_support::RedisServer::start();
        let a = RedisStore::new(server.url()).unwrap();
        let b = RedisStore::new(server.url()).unwrap();
        let rt = current_thread_runtime();
        memory_runner(32)
            .run(&case(true), |c| {
                let answers = rt.block_on(run(&[&a, &b], &c, redis_start()));
                check(&c, &answers)
            })
            .unwrap();
        redis_support::assert_every_key_has_a_ttl(&server);
    }

    #[test]
    fn memory_and_redis_book_cancel_and_block_identically() {
        let (server, redis, memory, rt) = both_stores();
        memory_runner(64)
            .run(&case(true), |c| {
                let start = redis_start();
                let a = rt.block_on(run(&[&memory, &memory], &c, start));
                let b = rt.block_on(run(&[&redis, &redis], &c, start));
                prop_assert_eq!(a, b);
                Ok(())
            })
            .unwrap();
        redis_support::assert_every_key_has_a_ttl(&server);
    }

    /// The penalty box on every algorithm, without waiting: the same in
    /// memory and in Redis.
    #[test]
    fn memory_and_redis_keep_penalty_boxes_identically_for_every_algorithm() {
        let (server, redis, memory, rt) = both_stores();
        let strategy = (
            super::case(&Algorithm::ALL, true, false),
            (1..=4u64, 1..=3_000u64, 1..=3_000u64, any::<bool>()),
        );
        memory_runner(64)
            .run(&strategy, |(c, box_)| {
                let policy = Policy::new(c.quota()).penalty(penalty(box_)).unwrap();
                let start = redis_start();
                let a = rt.block_on(super::run(&memory, &policy, start, &c.steps));
                let b = rt.block_on(super::run(&redis, &policy, start, &c.steps));
                prop_assert_eq!(a, b);
                Ok(())
            })
            .unwrap();
        redis_support::assert_every_key_has_a_ttl(&server);
    }
}
