//! Free responses a client cannot farm. A response the refund predicate
//! calls free (a `304 Not Modified` by default) gives its whole charge back,
//! as GitHub does for conditional requests. But a client decides whether
//! its request is conditional (`If-None-Match: *` against an endpoint that
//! computes ETags), and the handler still runs: unbounded, such a client is
//! never limited. So each key gets, per window of its policy's binding
//! quota, at most that quota's limit of free responses in this process;
//! past it, a free response is charged like any other.

use crate::bounded::{self, Bounded};
use crate::key::Key;
use crate::{Policy, Quota};

/// The most keys whose free responses are counted (the least useful are
/// forgotten first: an evicted count starts again at zero).
const MAX_KEYS: usize = 10_000;

/// One key's free responses in one window.
struct Count {
    /// When the window ends (Unix ms): the count means nothing after.
    ends: u64,
    used: u64,
}

impl bounded::Entry for Count {
    type Now = u64;

    fn expired(&self, now: u64) -> bool {
        now >= self.ends
    }

    fn worth(&self, now: u64) -> (f64, u64) {
        (self.ends.saturating_sub(now) as f64, self.used)
    }
}

/// The free responses counted per key and policy.
pub(crate) struct FreeResponses {
    counts: Bounded<(Key, u64), Count>,
}

impl FreeResponses {
    pub(crate) fn new() -> Self {
        Self {
            counts: Bounded::new(MAX_KEYS, 16),
        }
    }

    /// Whether a response of `key` under `policy`, charged at `now_ms`, may
    /// be free: it is counted if so.
    pub(crate) fn take(&self, key: &Key, policy: &Policy, now_ms: u64) -> bool {
        let Some(q) = binding(policy) else {
            return true;
        };
        let window = q.window_ms().max(1);
        let ends = (now_ms / window + 1).saturating_mul(window);
        let (free, _) =
            self.counts
                .update((*key, policy.fingerprint()), now_ms, |count| match count {
                    Some(c) if c.used < q.limit() => {
                        c.used += 1;
                        (true, None)
                    }
                    Some(_) => (false, None),
                    None => (true, Some(Count { ends, used: 1 })),
                });
        free
    }
}

/// The quota that bounds free responses: the lowest rate among those
/// counting requests, else the first.
fn binding(policy: &Policy) -> Option<&Quota> {
    let rate = |q: &&Quota| q.limit() as f64 / q.window_ms().max(1) as f64;
    let quotas = policy.quotas();
    quotas
        .iter()
        .filter(|q| q.counts_requests())
        .min_by(|a, b| rate(a).total_cmp(&rate(b)))
        .or_else(|| quotas.first())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_key_gets_its_binding_quota_s_limit_of_free_responses_per_window() {
        let free = FreeResponses::new();
        // The binding quota is the lowest rate: 3 a minute, not 1,000 an hour.
        let policy = Policy::new(Quota::new(3, Duration::from_secs(60)).unwrap())
            .and(Quota::new(1_000, Duration::from_secs(3600)).unwrap())
            .unwrap();
        let (k, other) = (Key::new("k"), Key::new("other"));
        let t = 120_000;
        let taken: Vec<bool> = (0..5).map(|i| free.take(&k, &policy, t + i)).collect();
        assert_eq!(taken, [true, true, true, false, false]);
        assert!(free.take(&other, &policy, t), "another key counts apart");
        assert!(free.take(&k, &policy, t + 60_000), "a new window");
    }
}
