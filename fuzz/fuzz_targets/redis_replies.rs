//! The Redis store's reply parsers on arbitrary replies: a charge batch's
//! packed numbers and error messages, a status read, a concurrency acquire.
//! Each is a decision or a protocol error, never a panic, and a decision
//! has one status per quota within its limit.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use std::time::Duration;
use tower_ratelimit::store::fuzzing;
use tower_ratelimit::{Algorithm, Policy, Quota};

#[derive(Arbitrary, Debug)]
struct Input {
    packed: Vec<u8>,
    messages: Vec<Vec<u8>>,
    requests: Vec<(u8, Option<u64>, u64)>,
    numbers: Vec<i64>,
    now: Option<u64>,
}

fn policy(i: u8) -> Policy {
    let algorithm = Algorithm::ALL[usize::from(i) % Algorithm::ALL.len()];
    let q = |limit, secs| {
        Quota::new(limit, Duration::from_secs(secs))
            .unwrap()
            .with_algorithm(algorithm)
            .unwrap()
    };
    if i & 0x80 == 0 {
        Policy::new(q(10, 60))
    } else {
        Policy::new(q(10, 1)).and(q(1_000, 3_600)).unwrap()
    }
}

fn check(policy: &Policy, d: &tower_ratelimit::decision::Decision) {
    assert_eq!(d.statuses().len(), policy.quotas().len());
    for s in d.statuses() {
        assert!(s.remaining <= s.limit, "{s:?}");
    }
}

fuzz_target!(|input: Input| {
    let requests: Vec<(Policy, Option<u64>, u64)> = input
        .requests
        .iter()
        .take(8)
        .map(|(p, now, cost)| (policy(*p), *now, *cost))
        .collect();
    if let Ok(answers) = fuzzing::charge_reply(input.packed, input.messages, &requests) {
        assert_eq!(answers.len(), requests.len());
        for ((p, _, _), a) in requests.iter().zip(&answers) {
            if let Ok(d) = a {
                check(p, d);
            }
        }
    }
    for p in [policy(0), policy(0x83)] {
        if let Ok(d) = fuzzing::status_reply(&p, input.now, &input.numbers) {
            check(&p, &d);
        }
    }
    if let Ok(o) = fuzzing::acquire_reply(input.now.unwrap_or(0), &input.numbers) {
        let _ = o.in_flight;
    }
});
