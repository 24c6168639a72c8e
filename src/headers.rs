//! Rate-limit response headers, built only from the decision's own read.
//!
//! Two styles: GitHub's `X-RateLimit-*` (the most restrictive quota) and the
//! IETF draft's structured fields, one list member per quota:
//! `RateLimit-Policy: "1m";q=60;w=60` and `RateLimit: "1m";r=42;t=17`,
//! written with the [`sfv`] crate (the integers, always within its range,
//! directly). Rejections carry `Retry-After`.
//!
//! ```
//! # use std::num::NonZeroU32;
//! use tower::{Layer, ServiceExt};
//! use tower_ratelimit::{headers::HeaderStyle, Quota, RateLimitLayer};
//! let layer = RateLimitLayer::builder()
//!     .quota(Quota::per_minute(NonZeroU32::new(60).unwrap()))
//!     .headers(HeaderStyle::Ietf)
//!     .build()?;
//! let hello = tower::service_fn(|_: http::Request<()>| async {
//!     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
//! });
//! # tokio::runtime::Runtime::new()?.block_on(async {
//! let res = layer.layer(hello).oneshot(http::Request::new(())).await?;
//! assert_eq!(res.headers()["ratelimit-policy"], r#""1m";q=60;w=60"#);
//! assert_eq!(res.headers()["ratelimit"], r#""1m";r=59;t=60"#);
//! # Ok::<(), Box<dyn std::error::Error>>(()) })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The meanings are the same for every algorithm:
//!
//! - **remaining** is what can be spent now, within `0..=limit` (clamped if
//!   the limit was lowered mid-window); for a token bucket or GCRA the
//!   limit reported is the burst;
//! - **reset** is when the quota is fully available again: for a fixed
//!   window its stored reset, so every response of one window carries the
//!   same value; for the others when the bucket is full or the last counted
//!   unit stops weighing (now, if it already is);
//! - **`Retry-After`** is when the rejected request, with its cost, would be
//!   admitted if nothing else were charged meanwhile. A request whose cost
//!   exceeds the limit gets none: waiting never helps.
//!
//! GitHub-style headers report the most restrictive quota; the IETF fields
//! list every quota by name (a quota's name defaults to its window: `"1s"`,
//! `"1m"`, `"1h"`). A refunded response shows the refunded remaining.
//! Stacked limiters (a rate limit around a concurrency limit) describe one
//! limit with the GitHub headers, so the most restrictive report wins; the
//! IETF lists carry every limiter's policies.

use crate::decision::Decision;
use crate::{Policy, Quota};
use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use sfv::{key_ref, string_ref, Integer, ItemSerializer, ListSerializer, StringRef};
use std::cell::RefCell;

/// `X-RateLimit-Limit`: the binding quota's limit.
pub static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`: units that can be spent now (on a rejection, less
/// than the request's cost: 0 for a cost of 1).
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
    pub(crate) fn github(self) -> bool {
        matches!(self, HeaderStyle::GitHub | HeaderStyle::Both)
    }

    pub(crate) fn ietf(self) -> bool {
        matches!(self, HeaderStyle::Ietf | HeaderStyle::Both)
    }
}

/// Whole seconds, rounded up: a client that waits this long is never early.
pub(crate) fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// Writes the headers of a rate limit decision (from one store read) at `now_ms`.
pub(crate) fn apply(
    style: HeaderStyle,
    policy: &Policy,
    decision: &Decision,
    now_ms: u64,
    headers: &mut HeaderMap,
) {
    if style.github() {
        let i = decision.binding();
        if let Some(s) = decision.statuses().get(i) {
            // The policy's own value, unless the status reports another limit.
            let limit = policy
                .limit_header(i)
                .filter(|_| policy.quotas().get(i).map(Quota::burst_size) == Some(s.limit))
                .cloned()
                .unwrap_or_else(|| HeaderValue::from(s.limit));
            github(
                headers,
                limit,
                s.remaining,
                Some((ceil_secs(s.reset_ms), s.used())),
            );
        }
    }
    if style.ietf() {
        let (policy_field, names) = policy.ietf_parts().get_or_init(|| made_once(policy));
        let statuses = decision.statuses();
        let own_limits = policy
            .quotas()
            .iter()
            .zip(statuses)
            .all(|(q, s)| q.burst_size() == s.limit);
        let policy_field = if own_limits {
            policy_field.clone()
        } else {
            list_value(policy_list(
                policy
                    .quotas()
                    .iter()
                    .zip(statuses)
                    .zip(policy.names())
                    .map(|((q, s), name)| member(q, name, s.limit)),
            ))
        };
        append(headers, &RATELIMIT_POLICY, policy_field);
        let mut state = String::with_capacity(32 * names.len());
        for (s, name) in statuses.iter().zip(names.iter()) {
            let reset = ceil_secs(s.reset_ms.saturating_sub(now_ms));
            state_member(&mut state, name, s.remaining, Some(reset));
        }
        append(headers, &RATELIMIT, list_value(state));
    }
    if !decision.is_allowed() {
        let wait = decision.retry_after_ms();
        if wait > 0 {
            retry_after(headers, ceil_secs(wait).max(1));
        }
    }
}

/// What the IETF headers write of `policy` the same way on every response:
/// its `RateLimit-Policy` field, and each quota's name as a structured-field
/// string.
fn made_once(policy: &Policy) -> (HeaderValue, Box<[String]>) {
    let quotas = policy.quotas().iter().zip(policy.names());
    let field = policy_list(
        quotas
            .clone()
            .map(|(q, name)| member(q, name, q.burst_size())),
    );
    let names = quotas.map(|(_, name)| sf_string(name)).collect();
    (list_value(field), names)
}

fn member<'a>(q: &'a Quota, name: &'a str, limit: u64) -> Member<'a> {
    Member {
        name,
        quota: limit,
        window_secs: Some(ceil_secs(q.window_ms())),
        unit: q.unit_param(),
        remaining: 0,
        reset_secs: None,
    }
}

/// `Retry-After: secs`.
pub(crate) fn retry_after(headers: &mut HeaderMap, secs: u64) {
    headers.insert(RETRY_AFTER, HeaderValue::from(secs));
}

/// The GitHub-style headers of one limit. Stacked limiters (a rate limit
/// around a concurrency limit, a global one around a per-route one) describe
/// one limit with these headers, so the most restrictive wins: an inner
/// report of as little or less remaining keeps its own numbers.
pub(crate) fn github(
    headers: &mut HeaderMap,
    limit: HeaderValue,
    remaining: u64,
    reset_and_used: Option<(u64, u64)>,
) {
    let earlier = headers
        .get(&X_RATELIMIT_REMAINING)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if earlier.is_some_and(|r| r <= remaining) {
        return;
    }
    headers.insert(&X_RATELIMIT_LIMIT, limit);
    match reset_and_used {
        Some((reset, used)) => {
            let [remaining, used] = integers([remaining, used]);
            headers.insert(&X_RATELIMIT_REMAINING, remaining);
            headers.insert(&X_RATELIMIT_RESET, reset_value(reset));
            headers.insert(&X_RATELIMIT_USED, used);
        }
        None => {
            headers.insert(&X_RATELIMIT_REMAINING, HeaderValue::from(remaining));
            headers.remove(&X_RATELIMIT_RESET);
            headers.remove(&X_RATELIMIT_USED);
        }
    }
}

/// The `X-RateLimit-Reset` value of `secs` (a Unix time). Every response
/// of a fixed window, and of one second for the other algorithms, carries
/// the same reset, so each thread keeps the last value it made and clones
/// it: no digits to write, nothing to validate, a smaller shared buffer for
/// the other numbers. Without it a request with GitHub headers exceeds its
/// instruction budget (`memory-headers` in `benches/instructions.budget`).
/// A thread's own copy, so that threads never contend for it.
fn reset_value(secs: u64) -> HeaderValue {
    thread_local! {
        static LAST: RefCell<Option<(u64, HeaderValue)>> = const { RefCell::new(None) };
    }
    let made = || HeaderValue::from(secs);
    LAST.try_with(|last| {
        let mut last = last.borrow_mut();
        match &*last {
            Some((at, value)) if *at == secs => value.clone(),
            _ => last.insert((secs, made())).1.clone(),
        }
    })
    .unwrap_or_else(|_| made())
}

/// Up to three numbers' digits, in one buffer.
struct Digits {
    buf: [u8; 3 * 20],
    len: usize,
}

impl AsRef<[u8]> for Digits {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// Header values of up to three numbers, sharing one allocation: the
/// GitHub headers of a response write several, and each allocation (with
/// its free) costs about as much as inserting a header. Without it a
/// request with GitHub headers exceeds its instruction budget
/// (`memory-headers` in `benches/instructions.budget`).
fn integers<const N: usize>(numbers: [u64; N]) -> [HeaderValue; N] {
    const { assert!(N <= 3, "a u64 has at most 20 digits") };
    let mut digits = Digits {
        buf: [0; 60],
        len: 0,
    };
    let mut ends = [0; N];
    for (n, end) in numbers.iter().zip(&mut ends) {
        let mut itoa = itoa::Buffer::new();
        let text = itoa.format(*n).as_bytes();
        digits.buf[digits.len..digits.len + text.len()].copy_from_slice(text);
        digits.len += text.len();
        *end = digits.len;
    }
    let shared = bytes::Bytes::from_owner(digits);
    let mut start = 0;
    let mut i = 0;
    ends.map(|end| {
        let value = HeaderValue::from_maybe_shared(shared.slice(start..end))
            .unwrap_or_else(|_| HeaderValue::from(numbers[i]));
        (start, i) = (end, i + 1);
        value
    })
}

/// One quota as the IETF fields describe it.
#[derive(Clone, Copy)]
pub(crate) struct Member<'a> {
    /// The policy's name (an sf-string: validated when the quota was named).
    pub(crate) name: &'a str,
    /// `q`: the quota.
    pub(crate) quota: u64,
    /// `w`: the window in seconds, when there is one.
    pub(crate) window_secs: Option<u64>,
    /// `qu`: the unit, when it is not `requests`.
    pub(crate) unit: Option<&'a str>,
    /// `r`: what is left.
    pub(crate) remaining: u64,
    /// `t`: seconds until more quota is available, when known.
    pub(crate) reset_secs: Option<u64>,
}

/// The IETF fields of `members`, appended to what an inner limiter wrote:
/// a response can report several policies.
pub(crate) fn ietf(headers: &mut HeaderMap, members: &[Member<'_>]) {
    append(
        headers,
        &RATELIMIT_POLICY,
        list_value(policy_list(members.iter().copied())),
    );
    let mut state = String::new();
    for m in members {
        state_member(&mut state, &sf_string(m.name), m.remaining, m.reset_secs);
    }
    append(headers, &RATELIMIT, list_value(state));
}

/// `RateLimit-Policy` members (`"name";q=100;w=60`), written by [`sfv`].
fn policy_list<'a>(members: impl Iterator<Item = Member<'a>>) -> String {
    let mut buf = String::with_capacity(64);
    let mut list = ListSerializer::with_buffer(&mut buf);
    for m in members {
        // Names are validated when a quota is named; a window name always fits.
        let name = StringRef::from_str(m.name).unwrap_or(string_ref("quota"));
        let mut p = list.bare_item(name).parameter(key_ref("q"), int(m.quota));
        if let Some(w) = m.window_secs {
            p = p.parameter(key_ref("w"), int(w));
        }
        if let Some(unit) = m.unit.and_then(|u| StringRef::from_str(u).ok()) {
            // The parameters are written as they are added; the serializer is done.
            let _ = p.parameter(key_ref("qu"), unit);
        }
    }
    let _ = list.finish();
    buf
}

/// `name` as a structured-field string (quoted, escaped), written by [`sfv`].
fn sf_string(name: &str) -> String {
    let name = StringRef::from_str(name).unwrap_or(string_ref("quota"));
    ItemSerializer::new().bare_item(name).finish()
}

/// Appends one `RateLimit` member, `"name";r=42;t=17`, to `list`. Its name
/// comes serialized ([`sf_string`]), and its integers are within the range
/// of a structured-field integer ([`int`]); nothing else in it varies, so
/// the integers are written here directly, at a fraction of the cost of
/// going through `core::fmt`.
fn state_member(list: &mut String, sf_name: &str, remaining: u64, reset_secs: Option<u64>) {
    if !list.is_empty() {
        list.push_str(", ");
    }
    let mut itoa = itoa::Buffer::new();
    list.push_str(sf_name);
    list.push_str(";r=");
    list.push_str(itoa.format(i64::from(int(remaining))));
    if let Some(t) = reset_secs {
        list.push_str(";t=");
        list.push_str(itoa.format(i64::from(int(t))));
    }
}

/// Sets a structured-field list header to `value`, after what an inner
/// limiter already wrote in it (a response can report several policies).
fn append(headers: &mut HeaderMap, name: &'static HeaderName, value: HeaderValue) {
    let value = match headers.get(name) {
        Some(earlier) if !earlier.is_empty() && !value.is_empty() => {
            let mut both = Vec::with_capacity(earlier.len() + 2 + value.len());
            both.extend_from_slice(earlier.as_bytes());
            both.extend_from_slice(b", ");
            both.extend_from_slice(value.as_bytes());
            match HeaderValue::from_maybe_shared(bytes::Bytes::from(both)) {
                Ok(v) => v,
                Err(_) => return,
            }
        }
        Some(_) if value.is_empty() => return,
        _ => value,
    };
    headers.insert(name, value);
}

/// A structured-field integer; every number written here is within range
/// (limits are at most [`Quota::MAX_LIMIT`](crate::Quota::MAX_LIMIT)).
fn int(n: u64) -> Integer {
    Integer::try_from(n).unwrap_or(Integer::MAX)
}

/// A list's text as a header value (its bytes are moved, not copied).
fn list_value(list: String) -> HeaderValue {
    HeaderValue::from_maybe_shared(bytes::Bytes::from(list))
        .unwrap_or_else(|_| HeaderValue::from_static(""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::QuotaStatus;
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
                    .named(name)
                    .unwrap(),
            )
            .unwrap()
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
    fn a_quota_in_another_unit_says_so_in_qu_and_requests_say_nothing() {
        let bytes = Quota::new(10_000, Duration::from_secs(60))
            .unwrap()
            .named("upload")
            .unwrap()
            .with_unit("content-bytes")
            .unwrap();
        let policy = Policy::new(Quota::new(10, Duration::from_secs(1)).unwrap())
            .and(bytes)
            .unwrap();
        let d = Decision::from_statuses(
            [
                status(10, 9, 2_000, true, 0),
                status(10_000, 7_500, 61_000, true, 0),
            ],
            2_500,
        );
        let mut h = HeaderMap::new();
        apply(HeaderStyle::Ietf, &policy, &d, 1_000, &mut h);
        assert_eq!(
            h[&RATELIMIT_POLICY],
            r#""1s";q=10;w=1, "upload";q=10000;w=60;qu="content-bytes""#
        );
        assert_eq!(h[&RATELIMIT], r#""1s";r=9;t=1, "upload";r=7500;t=60"#);
    }

    #[test]
    fn the_largest_limit_is_a_valid_structured_field_integer() {
        let max = crate::Quota::MAX_LIMIT;
        let policy = Policy::new(Quota::new(max, Duration::from_secs(60)).unwrap());
        let d = Decision::from_statuses([status(max, max - 1, 61_000, true, 0)], 1);
        let mut h = HeaderMap::new();
        apply(HeaderStyle::Ietf, &policy, &d, 1_000, &mut h);
        assert_eq!(
            h[&RATELIMIT_POLICY],
            format!(r#""1m";q={max};w=60"#).as_str()
        );
        let parsed = sfv::Parser::new(h[&RATELIMIT].to_str().unwrap())
            .parse::<sfv::List>()
            .unwrap();
        assert_eq!(parsed.len(), 1);
    }

    #[test]
    fn a_repeated_reset_shares_its_value_and_a_new_one_is_written_anew() {
        let first = reset_value(1_764_000_000);
        let again = reset_value(1_764_000_000);
        assert_eq!(again, "1764000000");
        assert_eq!(
            first.as_bytes().as_ptr(),
            again.as_bytes().as_ptr(),
            "the same allocation"
        );
        let next = reset_value(1_764_000_001);
        assert_eq!(next, "1764000001");
        assert_eq!(reset_value(1_764_000_000), "1764000000");
    }

    #[test]
    fn numbers_sharing_one_buffer_each_read_as_written() {
        let [a, b, c] = integers([0, u64::MAX, 1_764_000_000]);
        assert_eq!(a, "0");
        assert_eq!(b, "18446744073709551615");
        assert_eq!(c, "1764000000");
        let [one] = integers([42]);
        assert_eq!(one, "42");
    }

    #[test]
    fn ietf_fields_parse_as_structured_field_lists_whatever_the_names_and_numbers() {
        let max = crate::Quota::MAX_LIMIT;
        let policy = and_hourly(
            Quota::new(max, Duration::from_secs(1))
                .unwrap()
                .named(r#"a\b"c"#)
                .unwrap(),
            "~ { }",
        );
        let d = Decision::from_statuses(
            [
                status(max, max, u64::MAX, true, 0),
                status(1000, 0, 3_000_000, false, 2_999_000),
            ],
            1,
        );
        let mut h = HeaderMap::new();
        // An inner limiter's report comes first.
        h.insert(&RATELIMIT, HeaderValue::from_static(r#""inner";r=1"#));
        apply(HeaderStyle::Ietf, &policy, &d, 1_000, &mut h);
        for (field, members) in [(&RATELIMIT_POLICY, 2), (&RATELIMIT, 3)] {
            let text = h[field].to_str().unwrap();
            let list = sfv::Parser::new(text).parse::<sfv::List>().unwrap();
            assert_eq!(list.len(), members, "{text}");
        }
        assert_eq!(
            h[&RATELIMIT],
            format!(r#""inner";r=1, "a\\b\"c";r={max};t=999999999999999, "~ {{ }}";r=0;t=2999"#)
                .as_str()
        );
    }

    #[test]
    fn a_status_that_reports_another_limit_than_its_quota_is_listed_with_it() {
        let policy = Policy::new(Quota::new(10, Duration::from_secs(60)).unwrap());
        let own = Decision::from_statuses([status(10, 9, 61_000, true, 0)], 1);
        let lowered = Decision::from_statuses([status(4, 3, 61_000, true, 0)], 1);
        for (d, field) in [
            (&own, r#""1m";q=10;w=60"#),
            (&lowered, r#""1m";q=4;w=60"#),
            (&own, r#""1m";q=10;w=60"#),
        ] {
            let mut h = HeaderMap::new();
            apply(HeaderStyle::Ietf, &policy, d, 1_000, &mut h);
            assert_eq!(h[&RATELIMIT_POLICY], field);
        }
    }

    #[test]
    fn stacked_limiters_keep_the_most_restrictive_github_numbers_and_list_every_ietf_policy() {
        // What an inner concurrency limiter wrote on its 429.
        let mut h = HeaderMap::new();
        github(&mut h, HeaderValue::from(5), 0, None);
        ietf(
            &mut h,
            &[Member {
                name: "concurrency",
                quota: 5,
                window_secs: None,
                unit: Some("concurrent-requests"),
                remaining: 0,
                reset_secs: None,
            }],
        );
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
        // A less restrictive inner report is replaced by this one.
        let mut h = HeaderMap::new();
        h.insert(&X_RATELIMIT_REMAINING, HeaderValue::from(50));
        apply(HeaderStyle::GitHub, &policy, &d, 1_000, &mut h);
        assert_eq!(h[&X_RATELIMIT_REMAINING], "42");
        assert_eq!(h[&X_RATELIMIT_LIMIT], "60");
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
