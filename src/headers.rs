//! Rate-limit response headers, built only from the decision's own read.
//!
//! Two styles: GitHub's `X-RateLimit-*` (the most restrictive quota) and the
//! IETF draft's structured fields, one list member per quota:
//! `RateLimit-Policy: "1m";q=60;w=60` and `RateLimit: "1m";r=42;t=17`,
//! written with the [`sfv`] crate. Rejections carry `Retry-After`.
//!
//! ```
//! # use std::num::NonZeroU32;
//! use tower::{Layer, ServiceExt};
//! use tower_ratelimit::{HeaderStyle, Quota, RateLimitLayer};
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

use crate::decision::{Decision, QuotaStatus};
use crate::quota::{Policy, Quota};
use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use sfv::{key_ref, string_ref, Integer, ListSerializer, StringRef};

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

/// One quota as the IETF fields describe it.
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
        let members = policy
            .quotas()
            .iter()
            .zip(decision.statuses())
            .zip(policy.names())
            .map(|((q, s), name)| member(q, name, s, now_ms));
        ietf(headers, members);
    }
    if !decision.is_allowed() {
        let wait = decision.retry_after_ms();
        if wait > 0 {
            retry_after(headers, ceil_secs(wait).max(1));
        }
    }
}

fn member<'a>(q: &'a Quota, name: &'a str, s: &QuotaStatus, now_ms: u64) -> Member<'a> {
    Member {
        name,
        quota: s.limit,
        window_secs: Some(ceil_secs(q.window_ms())),
        unit: q.unit_param(),
        remaining: s.remaining,
        reset_secs: Some(ceil_secs(s.reset_ms.saturating_sub(now_ms))),
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
    headers.insert(X_RATELIMIT_LIMIT.clone(), limit);
    headers.insert(X_RATELIMIT_REMAINING.clone(), HeaderValue::from(remaining));
    match reset_and_used {
        Some((reset, used)) => {
            headers.insert(X_RATELIMIT_RESET.clone(), HeaderValue::from(reset));
            headers.insert(X_RATELIMIT_USED.clone(), HeaderValue::from(used));
        }
        None => {
            headers.remove(&X_RATELIMIT_RESET);
            headers.remove(&X_RATELIMIT_USED);
        }
    }
}

/// The IETF fields of `members`, appended to what an inner limiter wrote:
/// a response can report several policies.
pub(crate) fn ietf<'a>(headers: &mut HeaderMap, members: impl IntoIterator<Item = Member<'a>>) {
    let mut policy_buf = earlier_members(headers, &RATELIMIT_POLICY);
    let mut state_buf = earlier_members(headers, &RATELIMIT);
    let mut policy = ListSerializer::with_buffer(&mut policy_buf);
    let mut state = ListSerializer::with_buffer(&mut state_buf);
    for m in members {
        // Names are validated when a quota is named; a window name always fits.
        let name = StringRef::from_str(m.name).unwrap_or(string_ref("quota"));
        let mut p = policy.bare_item(name).parameter(key_ref("q"), int(m.quota));
        if let Some(w) = m.window_secs {
            p = p.parameter(key_ref("w"), int(w));
        }
        if let Some(unit) = m.unit.and_then(|u| StringRef::from_str(u).ok()) {
            // The parameters are written as they are added; the serializer is done.
            let _ = p.parameter(key_ref("qu"), unit);
        }
        let r = state
            .bare_item(name)
            .parameter(key_ref("r"), int(m.remaining));
        if let Some(t) = m.reset_secs {
            let _ = r.parameter(key_ref("t"), int(t));
        }
    }
    if let (Some(_), Some(_)) = (policy.finish(), state.finish()) {
        set_list(headers, &RATELIMIT_POLICY, policy_buf);
        set_list(headers, &RATELIMIT, state_buf);
    }
}

/// What an inner limiter already wrote in a list header, followed by the
/// separator for the members to come (a response can report several
/// policies); empty if nothing was.
fn earlier_members(headers: &HeaderMap, name: &HeaderName) -> String {
    let mut buf = String::with_capacity(64);
    if let Some(earlier) = headers.get(name).and_then(|v| v.to_str().ok()) {
        if !earlier.is_empty() {
            buf.push_str(earlier);
            buf.push_str(", ");
        }
    }
    buf
}

/// A structured-field integer; every number written here is within range
/// (limits are at most [`MAX_LIMIT`](crate::quota::MAX_LIMIT)).
fn int(n: u64) -> Integer {
    Integer::try_from(n).unwrap_or(Integer::MAX)
}

/// Sets a structured-field list header to `list` (its bytes are moved, not copied).
fn set_list(headers: &mut HeaderMap, name: &HeaderName, list: String) {
    if let Ok(v) = HeaderValue::from_maybe_shared(bytes::Bytes::from(list)) {
        headers.insert(name.clone(), v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let max = crate::quota::MAX_LIMIT;
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
    fn stacked_limiters_keep_the_most_restrictive_github_numbers_and_list_every_ietf_policy() {
        // What an inner concurrency limiter wrote on its 429.
        let mut h = HeaderMap::new();
        github(&mut h, HeaderValue::from(5), 0, None);
        ietf(
            &mut h,
            [Member {
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
