//! Rate-limit response headers, built only from the decision's own read.
//!
//! ```
//! use tower_ratelimit::HeaderStyle;
//! assert_eq!(HeaderStyle::default(), HeaderStyle::GitHub);
//! ```

use crate::decision::{Decision, QuotaStatus};
use crate::quota::Policy;
use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use std::fmt::Write as _;

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
    if let Some(s) = decision.binding_status() {
        if style.github() {
            github(s, headers);
        }
    }
    if style.ietf() {
        ietf(policy, decision.statuses(), now_ms, headers);
    }
    if !decision.is_allowed() {
        let wait = decision.retry_after_ms();
        if wait > 0 {
            headers.insert(RETRY_AFTER, HeaderValue::from(ceil_secs(wait).max(1)));
        }
    }
}

fn github(s: &QuotaStatus, headers: &mut HeaderMap) {
    headers.insert(X_RATELIMIT_LIMIT.clone(), HeaderValue::from(s.limit));
    headers.insert(
        X_RATELIMIT_REMAINING.clone(),
        HeaderValue::from(s.remaining),
    );
    // Rounded up: the stored reset (ms) maps to one value for the whole window.
    headers.insert(
        X_RATELIMIT_RESET.clone(),
        HeaderValue::from(ceil_secs(s.reset_ms)),
    );
    headers.insert(X_RATELIMIT_USED.clone(), HeaderValue::from(s.used()));
}

fn ietf(policy: &Policy, statuses: &[QuotaStatus], now_ms: u64, headers: &mut HeaderMap) {
    let mut pol = String::new();
    let mut rl = String::new();
    for (q, s) in policy.quotas().iter().zip(statuses) {
        let name = q.name();
        let sep = if pol.is_empty() { "" } else { ", " };
        let _ = write!(pol, "{sep}");
        write_sf_string(&mut pol, &name);
        let _ = write!(pol, ";q={};w={}", s.limit, ceil_secs(q.window_ms()));
        let _ = write!(rl, "{sep}");
        write_sf_string(&mut rl, &name);
        let _ = write!(
            rl,
            ";r={};t={}",
            s.remaining,
            ceil_secs(s.reset_ms.saturating_sub(now_ms))
        );
    }
    if let Ok(v) = HeaderValue::from_str(&pol) {
        headers.insert(RATELIMIT_POLICY.clone(), v);
    }
    if let Ok(v) = HeaderValue::from_str(&rl) {
        headers.insert(RATELIMIT.clone(), v);
    }
}

/// An RFC 8941 sf-string: printable ASCII, with `"` and `\` escaped; other
/// characters are dropped so a configured name can never break the header.
fn write_sf_string(out: &mut String, s: &str) {
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

    #[test]
    fn ietf_lists_every_policy_by_name_in_structured_field_syntax() {
        let policy = Policy::new(Quota::new(10, Duration::from_secs(1)).unwrap())
            .and(
                Quota::new(1000, Duration::from_secs(3600))
                    .unwrap()
                    .named("hour\"ly"),
            )
            .unwrap();
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
