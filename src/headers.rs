//! Rate-limit response headers, built only from the decision's own read.
//!
//! ```
//! use tower_ratelimit::HeaderStyle;
//! assert_eq!(HeaderStyle::default(), HeaderStyle::GitHub);
//! ```

use crate::decision::{Decision, QuotaStatus};
use crate::quota::Policy;
use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use smallvec::SmallVec;

/// `X-RateLimit-Limit`: the binding quota's limit.
pub static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`: units that can be spent now.
pub static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`: Unix seconds at which the quota is fully available again.
pub static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `X-RateLimit-Used`: units spent in the current window.
pub static X_RATELIMIT_USED: HeaderName = HeaderName::from_static("x-ratelimit-used");
/// IETF draft `RateLimit-Policy`: every quota, by name.
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// IETF draft `RateLimit`: every quota's remaining and seconds to reset.
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Which rate-limit headers responses carry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HeaderStyle {
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset` (Unix seconds), `-Used`,
    /// and `Retry-After` on rejections. Reports the most restrictive quota.
    #[default]
    GitHub,
    /// The IETF draft: `RateLimit-Policy: "name";q=100;w=60` and
    /// `RateLimit: "name";r=42;t=17`, one list member per quota, plus
    /// `Retry-After` on rejections.
    Ietf,
    /// Both of the above.
    Both,
    /// No rate-limit headers (rejections still carry `Retry-After`).
    None,
}

impl HeaderStyle {
    fn github(self) -> bool {
        matches!(self, HeaderStyle::GitHub | HeaderStyle::Both)
    }

    fn ietf(self) -> bool {
        matches!(self, HeaderStyle::Ietf | HeaderStyle::Both)
    }
}

/// Whole seconds, rounded up: a client that waits this long is never early.
pub(crate) fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// Writes the headers for `decision` (from one store read) at `now_ms`.
pub(crate) fn apply(
    style: HeaderStyle,
    policy: &Policy,
    decision: &Decision,
    now_ms: u64,
    headers: &mut HeaderMap,
) {
    if style.github() {
        if let Some(s) = decision.binding_status() {
            github(s, headers);
        }
    }
    if style.ietf() {
        ietf(policy, decision.statuses(), now_ms, headers);
    }
    if !decision.is_allowed() {
        let wait = decision.retry_after_ms();
        if wait > 0 {
            headers.insert(RETRY_AFTER, number(ceil_secs(wait).max(1)));
        }
    }
}

fn github(s: &QuotaStatus, headers: &mut HeaderMap) {
    let [limit, remaining, reset, used] = github_values(s);
    headers.reserve(4);
    let earlier_limit = headers.insert(X_RATELIMIT_LIMIT.clone(), limit);
    // Stacked limiters (a rate limit around a concurrency limit, a global one
    // around a per-route one): these headers describe one limit, so the most
    // restrictive wins, and an inner limiter's rejection keeps its own numbers.
    // Each insert returns what was there: one lookup a header, not two.
    if let Some(earlier) = headers.insert(X_RATELIMIT_REMAINING.clone(), remaining) {
        if reported_remaining(&earlier).is_some_and(|r| r <= s.remaining) {
            headers.insert(X_RATELIMIT_REMAINING.clone(), earlier);
            match earlier_limit {
                Some(l) => headers.insert(X_RATELIMIT_LIMIT.clone(), l),
                None => headers.remove(&X_RATELIMIT_LIMIT),
            };
            return;
        }
    }
    headers.insert(X_RATELIMIT_RESET.clone(), reset);
    headers.insert(X_RATELIMIT_USED.clone(), used);
}

/// The last limit and reset (whole seconds) this thread sent, with their
/// header values: both repeat from one response to the next (a quota's
/// limit; a window's reset, the same for every request in it).
struct Recent {
    limit: Option<(u64, HeaderValue)>,
    reset: Option<(u64, HeaderValue)>,
}

/// Limit, remaining, reset and used as header values. A limit or reset equal
/// to the last one this thread sent is a clone of it (a reference count);
/// whatever else is large is formatted into one shared buffer, as ever, and
/// a new limit or reset is remembered from it. So a response costs at most
/// one allocation, and none when the numbers repeat or are small.
fn github_values(s: &QuotaStatus) -> [HeaderValue; 4] {
    use std::cell::RefCell;
    thread_local! {
        static RECENT: RefCell<Recent> = const {
            RefCell::new(Recent { limit: None, reset: None })
        };
    }
    // Rounded up: the stored reset (ms) maps to one value for the whole window.
    let reset = ceil_secs(s.reset_ms);
    RECENT.with_borrow_mut(|recent| {
        // A number already at hand is not formatted again.
        match (&recent.limit, &recent.reset) {
            (Some((l, limit)), Some((r, reset_value))) if *l == s.limit && *r == reset => {
                let [remaining, used] = numbers([s.remaining, s.used()]);
                [limit.clone(), remaining, reset_value.clone(), used]
            }
            (Some((l, limit)), _) if *l == s.limit => {
                let limit = limit.clone();
                let [remaining, r, used] = numbers([s.remaining, reset, s.used()]);
                remember(&mut recent.reset, reset, &r);
                [limit, remaining, r, used]
            }
            (_, Some((r, reset_value))) if *r == reset => {
                let r = reset_value.clone();
                let [limit, remaining, used] = numbers([s.limit, s.remaining, s.used()]);
                remember(&mut recent.limit, s.limit, &limit);
                [limit, remaining, r, used]
            }
            _ => {
                let values = numbers([s.limit, s.remaining, reset, s.used()]);
                remember(&mut recent.limit, s.limit, &values[0]);
                remember(&mut recent.reset, reset, &values[2]);
                values
            }
        }
    })
}

/// Keeps `value` for `n` in `slot` (a clone is a reference count: large
/// numbers share a buffer). Small numbers come from the static table anyway.
fn remember(slot: &mut Option<(u64, HeaderValue)>, n: u64, value: &HeaderValue) {
    if n >= SMALL {
        *slot = Some((n, value.clone()));
    }
}

fn ietf(policy: &Policy, statuses: &[QuotaStatus], now_ms: u64, headers: &mut HeaderMap) {
    use std::cell::RefCell;
    thread_local! {
        static LAST: RefCell<Option<PolicyValue>> = const { RefCell::new(None) };
    }
    let mut rl = String::with_capacity(32 * statuses.len());
    let pol = LAST.with_borrow_mut(|last| {
        let last = match last {
            Some(l) if l.describes(policy, statuses) => l,
            _ => last.insert(PolicyValue::new(policy, statuses)),
        };
        for (i, (name, s)) in last.names().zip(statuses).enumerate() {
            if i > 0 {
                rl.push_str(", ");
            }
            rl.push_str(name);
            rl.push_str(";r=");
            push_number(&mut rl, s.remaining);
            rl.push_str(";t=");
            push_number(&mut rl, ceil_secs(s.reset_ms.saturating_sub(now_ms)));
        }
        last.value.clone()
    });
    append_value(headers, &RATELIMIT_POLICY, pol);
    append_list(headers, &RATELIMIT, rl);
}

/// A `RateLimit-Policy` value and what it describes. Each thread keeps the
/// last one it sent: a policy and its limits change rarely, so most
/// responses clone it (a reference count) instead of writing it again.
struct PolicyValue {
    /// Held, and compared by content: what the value says is exactly this.
    policy: Policy,
    limits: SmallVec<[u64; 2]>,
    value: HeaderValue,
    /// Each member's name (`"1m"`, `"hourly"`) in `value`, for `RateLimit`.
    names: SmallVec<[(usize, usize); 2]>,
}

impl PolicyValue {
    fn new(policy: &Policy, statuses: &[QuotaStatus]) -> Self {
        let mut pol = String::with_capacity(32 * statuses.len());
        let mut names = SmallVec::new();
        for (q, s) in policy.quotas().iter().zip(statuses) {
            if !pol.is_empty() {
                pol.push_str(", ");
            }
            let at = pol.len();
            match q.configured_name() {
                Some(name) => write_sf_string(&mut pol, name),
                // A window name (`"1s"`, `"500ms"`) needs no escaping: written in place.
                None => {
                    pol.push('"');
                    crate::quota::write_window(&mut pol, q.window_ms());
                    pol.push('"');
                }
            }
            names.push((at, pol.len()));
            pol.push_str(";q=");
            push_number(&mut pol, s.limit);
            pol.push_str(";w=");
            push_number(&mut pol, ceil_secs(q.window_ms()));
        }
        PolicyValue {
            policy: policy.clone(),
            limits: statuses.iter().map(|s| s.limit).collect(),
            // Shared from the start: the clones kept and sent are reference counts.
            value: HeaderValue::from_maybe_shared(Bytes::from_owner(pol))
                .expect("sf-strings, windows and digits are a valid header value"),
            names,
        }
    }

    fn describes(&self, policy: &Policy, statuses: &[QuotaStatus]) -> bool {
        self.policy == *policy && self.limits.iter().eq(statuses.iter().map(|s| &s.limit))
    }

    fn names(&self) -> impl Iterator<Item = &str> {
        let text = self.value.as_bytes();
        self.names
            .iter()
            .map(move |&(at, end)| std::str::from_utf8(&text[at..end]).unwrap_or_default())
    }
}

/// Numbers below this are rendered from a static table: no allocation, no formatting.
const SMALL: u64 = 10_000;

/// The decimal digits of 0, 1, 2, …, `SMALL - 1`, back to back.
static SMALL_NUMBERS: &str = match std::str::from_utf8(&small_numbers()) {
    Ok(s) => s,
    Err(_) => panic!("digits are ASCII"),
};

const SMALL_NUMBERS_LEN: usize = 10 + 90 * 2 + 900 * 3 + 9_000 * 4;

const fn small_numbers() -> [u8; SMALL_NUMBERS_LEN] {
    let mut out = [0u8; SMALL_NUMBERS_LEN];
    let (mut n, mut at) = (0u64, 0usize);
    while n < SMALL {
        let (_, width) = small_span(n);
        let (mut v, mut i) = (n, width);
        while i > 0 {
            i -= 1;
            out[at + i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
        at += width;
        n += 1;
    }
    out
}

/// Where `n < SMALL` starts in [`SMALL_NUMBERS`], and its number of digits.
const fn small_span(n: u64) -> (usize, usize) {
    let n = n as usize;
    match n {
        0..=9 => (n, 1),
        10..=99 => (10 + (n - 10) * 2, 2),
        100..=999 => (190 + (n - 100) * 3, 3),
        _ => (2_890 + (n - 1_000) * 4, 4),
    }
}

/// `n` in decimal, as a header value: from a static table below [`SMALL`]
/// (no allocation), else formatted on the stack and copied once.
pub(crate) fn number(n: u64) -> HeaderValue {
    if n < SMALL {
        let (at, width) = small_span(n);
        return HeaderValue::from_static(&SMALL_NUMBERS[at..at + width]);
    }
    let mut buf = itoa::Buffer::new();
    // One exact-size allocation (`HeaderValue::from(u64)` makes two: a
    // 20-byte buffer, then a shared header when it is frozen short of full).
    HeaderValue::from_maybe_shared(Bytes::copy_from_slice(buf.format(n).as_bytes()))
        .expect("decimal digits are a valid header value")
}

/// Several numbers as header values: small ones from the static table, the
/// others formatted into one buffer that their values share (one allocation
/// for all of them, none when all are small). A shared value's clone is a
/// reference count, never a copy.
fn numbers<const N: usize>(ns: [u64; N]) -> [HeaderValue; N] {
    const { assert!(N <= 4, "the buffer holds four u64s") };
    if ns.iter().all(|&n| n < SMALL) {
        return ns.map(number);
    }
    let mut digits = Digits {
        buf: [0; 4 * 20],
        len: 0,
    };
    let mut spans = [(0, 0); N];
    for (span, &n) in spans.iter_mut().zip(&ns) {
        if n >= SMALL {
            let mut d = itoa::Buffer::new();
            let d = d.format(n).as_bytes();
            let at = digits.len;
            digits.buf[at..at + d.len()].copy_from_slice(d);
            digits.len += d.len();
            *span = (at, digits.len);
        }
    }
    let shared = (digits.len > 0).then(|| Bytes::from_owner(digits));
    let mut i = 0;
    ns.map(|n| {
        let (at, end) = spans[i];
        i += 1;
        match &shared {
            Some(b) if n >= SMALL => HeaderValue::from_maybe_shared(b.slice(at..end))
                .expect("decimal digits are a valid header value"),
            _ => number(n),
        }
    })
}

/// Digits of several numbers, back to back.
struct Digits {
    buf: [u8; 4 * 20],
    len: usize,
}

impl AsRef<[u8]> for Digits {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// Appends `n` in decimal.
pub(crate) fn push_number(out: &mut String, n: u64) {
    if n < SMALL {
        let (at, width) = small_span(n);
        out.push_str(&SMALL_NUMBERS[at..at + width]);
    } else {
        out.push_str(itoa::Buffer::new().format(n));
    }
}

fn reported_remaining(value: &HeaderValue) -> Option<u64> {
    value.to_str().ok()?.parse().ok()
}

/// Adds members to a structured-field list header: a response can report
/// several policies (e.g. an inner concurrency limit and this rate limit).
pub(crate) fn append_list(headers: &mut HeaderMap, name: &HeaderName, members: String) {
    // The string's buffer becomes the value's: no copy.
    if let Ok(ours) = HeaderValue::from_maybe_shared(Bytes::from(members)) {
        append_value(headers, name, ours);
    }
}

/// [`append_list`] for members already made into a header value.
fn append_value(headers: &mut HeaderMap, name: &HeaderName, ours: HeaderValue) {
    // One lookup in the usual case: the insert returns what was there.
    let Some(earlier) = headers.insert(name.clone(), ours) else {
        return;
    };
    if let (Ok(earlier), Some(ours)) = (earlier.to_str(), headers[name].to_str().ok()) {
        if !earlier.is_empty() {
            let both = format!("{earlier}, {ours}");
            if let Ok(v) = HeaderValue::from_maybe_shared(Bytes::from(both)) {
                headers.insert(name.clone(), v);
            }
        }
    }
}

/// An RFC 8941 sf-string: printable ASCII, with `"` and `\` escaped; other
/// characters are dropped so a configured name can never break the header.
pub(crate) fn write_sf_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => {}
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Quota;
    use std::time::Duration;

    fn status(limit: u64, remaining: u64, reset_ms: u64, allowed: bool, retry: u64) -> QuotaStatus {
        QuotaStatus {
            limit,
            remaining,
            reset_ms,
            retry_after_ms: retry,
            allowed,
            window_id: reset_ms,
            ..QuotaStatus::default()
        }
    }

    /// `quota` and a second quota of 1000 an hour named `name`.
    fn and_hourly(quota: Quota, name: &'static str) -> Policy {
        Policy::new(quota)
            .and(
                Quota::new(1000, Duration::from_secs(3600))
                    .unwrap()
                    .named(name),
            )
            .unwrap()
    }

    #[test]
    fn numbers_render_as_decimal_from_the_table_and_beyond_it() {
        for n in (0..SMALL + 20).chain([99_999, 100_000, 1 << 40, u64::MAX / 10, u64::MAX]) {
            assert_eq!(number(n), n.to_string().as_str(), "{n}");
            let mut s = String::from("x");
            push_number(&mut s, n);
            assert_eq!(s, format!("x{n}"));
        }
    }

    #[test]
    fn several_numbers_share_one_buffer_and_keep_their_own_digits() {
        let ns = [1 << 40, 7, 1_799_999_999, u64::MAX];
        let vs = numbers(ns);
        for (v, n) in vs.iter().zip(ns) {
            assert_eq!(v, n.to_string().as_str());
        }
        let [a, b] = numbers([0, 9_999]);
        assert_eq!((a.as_bytes(), b.as_bytes()), (&b"0"[..], &b"9999"[..]));
    }

    #[test]
    fn ietf_lists_every_policy_by_name_in_structured_field_syntax() {
        let policy = and_hourly(Quota::new(10, Duration::from_secs(1)).unwrap(), "hour\"ly");
        let d = Decision::from_statuses(
            [
                status(10, 4, 1_500, true, 0),
                status(1000, 990, 3_000_000, true, 0),
            ],
            1,
        );
        let mut h = HeaderMap::new();
        apply(HeaderStyle::Ietf, &policy, &d, 1_000, &mut h);
        assert_eq!(
            h[&RATELIMIT_POLICY],
            r#""1s";q=10;w=1, "hour\"ly";q=1000;w=3600"#
        );
        assert_eq!(h[&RATELIMIT], r#""1s";r=4;t=1, "hour\"ly";r=990;t=2999"#);
        assert!(h.get(&X_RATELIMIT_LIMIT).is_none());
    }

    #[test]
    fn stacked_limiters_keep_the_most_restrictive_github_numbers_and_list_every_ietf_policy() {
        // What an inner concurrency limiter wrote on its 429.
        let mut h = HeaderMap::new();
        h.insert(&X_RATELIMIT_LIMIT, HeaderValue::from(5));
        h.insert(&X_RATELIMIT_REMAINING, HeaderValue::from(0));
        h.insert(
            &RATELIMIT_POLICY,
            HeaderValue::from_static(r#""concurrency";q=5;qu="concurrent-requests""#),
        );
        h.insert(&RATELIMIT, HeaderValue::from_static(r#""concurrency";r=0"#));
        let policy = Policy::new(Quota::new(60, Duration::from_secs(60)).unwrap());
        let d = Decision::from_statuses([status(60, 42, 61_000, true, 0)], 1);
        apply(HeaderStyle::Both, &policy, &d, 1_000, &mut h);
        assert_eq!(
            h[&X_RATELIMIT_LIMIT], "5",
            "the rejecting limit is reported"
        );
        assert_eq!(h[&X_RATELIMIT_REMAINING], "0");
        assert!(h.get(&X_RATELIMIT_RESET).is_none());
        assert_eq!(
            h[&RATELIMIT_POLICY],
            r#""concurrency";q=5;qu="concurrent-requests", "1m";q=60;w=60"#
        );
        assert_eq!(h[&RATELIMIT], r#""concurrency";r=0, "1m";r=42;t=60"#);
        // An inner report of remaining alone keeps it alone.
        let mut h = HeaderMap::new();
        h.insert(&X_RATELIMIT_REMAINING, HeaderValue::from(3));
        apply(HeaderStyle::GitHub, &policy, &d, 1_000, &mut h);
        assert_eq!(h[&X_RATELIMIT_REMAINING], "3");
        assert_eq!(h.len(), 1, "{h:?}");
        // A less restrictive inner report is replaced by this one.
        let mut h = HeaderMap::new();
        h.insert(&X_RATELIMIT_REMAINING, HeaderValue::from(50));
        apply(HeaderStyle::GitHub, &policy, &d, 1_000, &mut h);
        assert_eq!(h[&X_RATELIMIT_REMAINING], "42");
        assert_eq!(h[&X_RATELIMIT_LIMIT], "60");
    }

    #[test]
    fn a_repeated_limit_and_reset_are_shared_and_the_rest_share_one_buffer() {
        let ptr = |v: &HeaderValue| v.as_bytes().as_ptr() as usize;
        let text = |vs: &[HeaderValue; 4]| vs.clone().map(|v| v.to_str().unwrap().to_owned());
        // Fresh thread: nothing sent yet.
        std::thread::spawn(move || {
            let big = status(1_000_000_000, 999_000_000, 1_796_044_500_000, true, 0);
            let first = github_values(&big);
            assert_eq!(
                text(&first),
                ["1000000000", "999000000", "1796044500", "1000000"]
            );
            // Four large numbers, one buffer (at most one allocation a response).
            let at = first.iter().map(ptr).min().unwrap();
            assert!(first.iter().all(|v| ptr(v) - at < 80), "{first:?}");

            let next = status(1_000_000_000, 998_999_999, 1_796_044_500_000, true, 0);
            let second = github_values(&next);
            assert_eq!(text(&second)[1..], ["998999999", "1796044500", "1000001"]);
            assert_eq!(ptr(&second[0]), ptr(&first[0]), "the limit is shared");
            assert_eq!(ptr(&second[2]), ptr(&first[2]), "the reset is shared");
            assert_ne!(
                ptr(&second[1]),
                ptr(&first[1]),
                "remaining is this response's"
            );

            // A new window: a new reset, remembered from then on; the limit stays.
            let later = status(1_000_000_000, 999_999_999, 1_796_044_560_000, true, 0);
            let third = github_values(&later);
            assert_eq!(text(&third)[2], "1796044560");
            assert_ne!(ptr(&third[2]), ptr(&first[2]));
            assert_eq!(ptr(&third[0]), ptr(&first[0]));
            assert_eq!(ptr(&github_values(&later)[2]), ptr(&third[2]));

            // Small numbers come from the table and do not displace the large ones.
            let small = status(60, 42, 1_796_044_560_000, true, 0);
            assert_eq!(
                text(&github_values(&small)),
                ["60", "42", "1796044560", "18"]
            );
            assert_eq!(ptr(&github_values(&later)[0]), ptr(&first[0]));
            first
        })
        .join()
        .map(|first| {
            // Another thread has its own.
            let big = status(1_000_000_000, 999_000_000, 1_796_044_500_000, true, 0);
            let here = github_values(&big);
            assert_eq!(here, first);
            assert_ne!(ptr(&here[0]), ptr(&first[0]));
        })
        .unwrap();
    }

    #[test]
    fn an_unchanged_ietf_policy_is_shared_and_a_changed_one_written_again() {
        let ptr = |h: &HeaderMap| h[&RATELIMIT_POLICY].as_bytes().as_ptr();
        let send = |policy: &Policy, statuses: &[QuotaStatus], now: u64| {
            let d = Decision::from_statuses(statuses.iter().copied(), 1);
            let mut h = HeaderMap::new();
            apply(HeaderStyle::Ietf, policy, &d, now, &mut h);
            h
        };
        let policy = and_hourly(Quota::new(100, Duration::from_secs(60)).unwrap(), "hourly");
        let at = |r1, r2| {
            [
                status(100, r1, 61_000, true, 0),
                status(1000, r2, 3_601_000, true, 0),
            ]
        };
        let first = send(&policy, &at(99, 999), 1_000);
        let second = send(&policy, &at(98, 998), 2_000);
        for h in [&first, &second] {
            assert_eq!(
                h[&RATELIMIT_POLICY],
                r#""1m";q=100;w=60, "hourly";q=1000;w=3600"#
            );
        }
        assert_eq!(
            first[&RATELIMIT],
            r#""1m";r=99;t=60, "hourly";r=999;t=3600"#
        );
        assert_eq!(
            second[&RATELIMIT],
            r#""1m";r=98;t=59, "hourly";r=998;t=3599"#
        );
        assert_eq!(
            ptr(&first),
            ptr(&second),
            "the unchanged policy is one buffer"
        );

        // An equal policy built again is the same text, shared.
        let again = and_hourly(Quota::new(100, Duration::from_secs(60)).unwrap(), "hourly");
        assert_eq!(ptr(&send(&again, &at(97, 997), 3_000)), ptr(&first));

        // A limit the store reports differently is written again.
        let lowered = [
            status(50, 10, 61_000, true, 0),
            status(1000, 996, 3_601_000, true, 0),
        ];
        let h = send(&policy, &lowered, 4_000);
        assert_eq!(
            h[&RATELIMIT_POLICY],
            r#""1m";q=50;w=60, "hourly";q=1000;w=3600"#
        );
        assert_eq!(h[&RATELIMIT], r#""1m";r=10;t=57, "hourly";r=996;t=3597"#);
        assert_ne!(ptr(&h), ptr(&first));

        // Another policy is its own text, and names are escaped as ever.
        let other = Policy::new(
            Quota::new(5, Duration::from_secs(1))
                .unwrap()
                .named("b\"u\"rst"),
        );
        let h = send(&other, &[status(5, 4, 5_000, true, 0)], 4_500);
        assert_eq!(h[&RATELIMIT_POLICY], r#""b\"u\"rst";q=5;w=1"#);
        assert_eq!(h[&RATELIMIT], r#""b\"u\"rst";r=4;t=1"#);
    }

    #[test]
    fn github_headers_keep_their_order_limit_remaining_reset_used() {
        let policy = Policy::new(Quota::new(100_000, Duration::from_secs(60)).unwrap());
        let d = Decision::from_statuses([status(100_000, 99_990, 61_000, true, 0)], 1);
        let mut h = HeaderMap::new();
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain"),
        );
        apply(HeaderStyle::GitHub, &policy, &d, 1_000, &mut h);
        let names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "content-type",
                "x-ratelimit-limit",
                "x-ratelimit-remaining",
                "x-ratelimit-reset",
                "x-ratelimit-used"
            ]
        );
        let values: Vec<&[u8]> = h.values().map(|v| v.as_bytes()).collect();
        assert_eq!(values[1..], [&b"100000"[..], b"99990", b"61", b"10"]);
    }

    #[test]
    fn github_reports_the_most_restrictive_quota_and_retry_after_on_rejection() {
        let policy = Policy::new(Quota::new(10, Duration::from_secs(1)).unwrap())
            .and(Quota::new(1000, Duration::from_secs(3600)).unwrap())
            .unwrap();
        let d = Decision::from_statuses(
            [
                status(10, 3, 2_000, true, 0),
                status(1000, 0, 3_601_000, false, 3_599_500),
            ],
            1,
        );
        let mut h = HeaderMap::new();
        apply(HeaderStyle::GitHub, &policy, &d, 1_500, &mut h);
        assert_eq!(h[&X_RATELIMIT_LIMIT], "1000");
        assert_eq!(h[&X_RATELIMIT_REMAINING], "0");
        assert_eq!(h[&X_RATELIMIT_RESET], "3601");
        assert_eq!(h[&X_RATELIMIT_USED], "1000");
        assert_eq!(h[&RETRY_AFTER], "3600");
    }
}
