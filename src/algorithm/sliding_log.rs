//! Sliding log: every charge is logged with its time; a request is admitted
//! iff the costs logged within the last `window` plus its own fit the limit.
//! Exact over every sliding window, at a memory cost: one entry per
//! millisecond in which something was charged (charges in the same ms are
//! merged), so at most `min(limit, window in ms)` entries per key — hence
//! the cap [`Quota::MAX_SLIDING_LOG_LIMIT`](crate::Quota::MAX_SLIDING_LOG_LIMIT).
//!
//! The decision needs only the live total, the newest entry (for the reset)
//! and, on a rejection, when the oldest entries will have slid out far
//! enough to make room (for the retry): found by walking at most
//! [`MAX_WALK`] of them, oldest first, and past that taken as when the
//! newest slides out (later than the truth, never earlier), so no rejection
//! costs more than a bounded walk. `lua/sliding_log.lua` computes the same
//! three numbers in Redis, and both stores decide on them ([`decide`]).

use super::{add_capped, Ask};
use crate::decision::QuotaStatus;
use std::collections::VecDeque;
use std::num::NonZeroU64;

/// A key's log: `(time ms, cost)` entries sorted by time, one per ms, and their total.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Log {
    entries: VecDeque<(u64, u64)>,
    total: u64,
}

impl Log {
    /// Drops entries no longer within the window ending at `now` (time `t`
    /// counts while `t > now - window`).
    pub(crate) fn prune(&mut self, window_ms: u64, now: u64) {
        while let Some(&(t, c)) = self.entries.front() {
            if t + window_ms > now {
                break;
            }
            self.entries.pop_front();
            self.total -= c;
        }
    }

    /// Logs `cost` at `now`, merged with an entry of the same ms (the total
    /// stays exact: cost past 2^53 in all is dropped).
    pub(crate) fn record(&mut self, now: u64, cost: u64) {
        let cost = add_capped(self.total, cost) - self.total;
        if cost == 0 {
            return;
        }
        self.total += cost;
        // Usually the newest; a clock behind another instance's inserts earlier.
        let at = self.entries.partition_point(|&(t, _)| t < now);
        match self.entries.get_mut(at) {
            Some((t, c)) if *t == now => *c += cost,
            _ => self.entries.insert(at, (now, cost)),
        }
    }

    /// Takes up to `cost` back from the entry logged at `at`, if it is still there.
    pub(crate) fn refund(&mut self, at: u64, cost: u64) -> bool {
        let Ok(i) = self.entries.binary_search_by_key(&at, |&(t, _)| t) else {
            return false;
        };
        let give = cost.min(self.entries[i].1);
        self.entries[i].1 -= give;
        self.total -= give;
        if self.entries[i].1 == 0 {
            self.entries.remove(i);
        }
        give > 0
    }

    /// Charges `extra` more to the entry at `at` (a settlement above the
    /// reservation), while that time is still within the window at `now`.
    pub(crate) fn debit(&mut self, window_ms: u64, at: u64, now: u64, extra: u64) -> bool {
        if at + window_ms <= now || extra == 0 {
            return false;
        }
        self.record(at, extra);
        true
    }

    /// The live total and entries at `now`, without pruning.
    pub(crate) fn live(
        &self,
        window_ms: u64,
        now: u64,
    ) -> (u64, impl Iterator<Item = (u64, u64)> + '_) {
        let first = self.entries.partition_point(|&(t, _)| t + window_ms <= now);
        let expired: u64 = self.entries.range(..first).map(|&(_, c)| c).sum();
        (self.total - expired, self.entries.range(first..).copied())
    }

    /// The newest entry's time.
    pub(crate) fn newest(&self) -> Option<u64> {
        self.entries.back().map(|&(t, _)| t)
    }

    /// Number of entries held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// The most live entries a rejection walks to find its retry (twin of
/// `SL_MAX_WALK` in `lua/sliding_log.lua`).
pub(crate) const MAX_WALK: usize = 256;

/// When `need` more units fit: when enough of the live entries (oldest
/// first) have slid out of the window, looking at [`MAX_WALK`] of them at
/// most; else when the newest has (at `now` without one).
pub(crate) fn retry_at(
    need: u64,
    newest: Option<u64>,
    oldest_first: impl IntoIterator<Item = (u64, u64)>,
    window_ms: u64,
    now: u64,
) -> u64 {
    let mut freed = 0;
    for (t, c) in oldest_first.into_iter().take(MAX_WALK) {
        freed += c;
        if freed >= need {
            return t + window_ms;
        }
    }
    newest.map_or(now, |t| t + window_ms)
}

/// Decides `ask.fit` on a log read at `now`: `total` of the live entries,
/// `newest` entry time, and live entries oldest first (for the retry when
/// rejected, see [`retry_at`]). Returns the status; the caller records
/// `ask.charge` at `now` if the whole policy admits it.
pub(crate) fn charge(
    total: u64,
    newest: Option<u64>,
    oldest_first: impl IntoIterator<Item = (u64, u64)>,
    limit: u64,
    window_ms: u64,
    now: u64,
    ask: Ask,
) -> QuotaStatus {
    let retry = |need| retry_at(need, newest, oldest_first, window_ms, now);
    decide(total, newest, retry, limit, window_ms, now, ask)
}

/// [`charge`] with the retry found by `retry_at(need)` (the Redis script's
/// answer, or a walk of the log here).
pub(crate) fn decide(
    total: u64,
    newest: Option<u64>,
    retry_at: impl FnOnce(u64) -> u64,
    limit: u64,
    window_ms: u64,
    now: u64,
    ask: Ask,
) -> QuotaStatus {
    let cost = ask.fit;
    let allowed = cost <= limit && total + cost <= limit;
    let (after, newest_after) = if allowed && ask.charge > 0 {
        (
            add_capped(total, ask.charge),
            Some(newest.map_or(now, |t| t.max(now))),
        )
    } else {
        (total, newest)
    };
    let reset = |newest: Option<u64>| newest.map_or(now, |t| t + window_ms);
    let retry_after_ms = if allowed || cost > limit {
        0
    } else {
        // Wait until enough of the oldest entries have slid out.
        retry_at(total + cost - limit).saturating_sub(now)
    };
    QuotaStatus {
        limit,
        remaining: limit.saturating_sub(after),
        reset_ms: reset(newest_after),
        retry_after_ms,
        allowed,
        // The entry this charge is logged in.
        window_id: now,
        uncharged_reset_ms: NonZeroU64::new(reset(newest)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: u64 = 1_000;

    fn charge_log(log: &mut Log, limit: u64, now: u64, cost: u64) -> QuotaStatus {
        log.prune(W, now);
        let (total, live) = log.live(W, now);
        let st = charge(total, log.newest(), live, limit, W, now, Ask::of(cost));
        if st.allowed {
            log.record(now, cost);
        }
        st
    }

    #[test]
    fn exact_over_every_sliding_window() {
        let mut log = Log::default();
        assert!(charge_log(&mut log, 3, 0, 1).allowed);
        assert!(charge_log(&mut log, 3, 400, 2).allowed);
        let st = charge_log(&mut log, 3, 999, 1);
        assert!(!st.allowed);
        assert_eq!(st.retry_after_ms, 1, "the entry at 0 slides out at 1000");
        let st = charge_log(&mut log, 3, 1_000, 2);
        assert!(!st.allowed, "only one unit slid out");
        assert_eq!(st.retry_after_ms, 400);
        assert!(charge_log(&mut log, 3, 1_000, 1).allowed);
        assert_eq!(log.len(), 2);
    }

    #[test]
    fn charges_in_one_millisecond_share_an_entry_and_refunds_take_from_it() {
        let mut log = Log::default();
        let st = charge_log(&mut log, 10, 5, 2);
        charge_log(&mut log, 10, 5, 3);
        assert_eq!(log.len(), 1);
        assert!(log.refund(st.window_id, 2));
        assert_eq!(log.live(W, 5).0, 3);
        assert!(log.refund(5, 9));
        assert_eq!((log.len(), log.live(W, 5).0), (0, 0));
        assert!(!log.refund(5, 1), "nothing left to give back");
    }

    #[test]
    fn reset_is_when_the_newest_entry_slides_out() {
        let mut log = Log::default();
        let st = charge_log(&mut log, 10, 0, 0);
        assert_eq!(st.reset_ms, 0, "an empty log is fully available now");
        charge_log(&mut log, 10, 100, 1);
        let st = charge_log(&mut log, 10, 300, 1);
        assert_eq!((st.remaining, st.reset_ms), (8, 1_300));
    }

    #[test]
    fn an_entry_from_a_clock_behind_is_kept_in_time_order() {
        let mut log = Log::default();
        log.record(500, 1);
        log.record(200, 1);
        log.record(500, 1);
        assert_eq!(log.entries, VecDeque::from([(200, 1), (500, 2)]));
    }
}
