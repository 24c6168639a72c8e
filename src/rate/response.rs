//! The rate limiter's own answer: a 429 built from the decision's one read.

use crate::decision::{Decision, RejectReason};
use crate::headers::ceil_secs;
use crate::problem::{Problem, QUOTA_EXCEEDED};
use crate::Policy;
use bytes::Bytes;
use http::{Response, StatusCode};
use std::borrow::Cow;

/// What a rejection knows, for a custom rejection response.
#[derive(Debug)]
#[non_exhaustive]
pub struct Rejection<'a> {
    /// The decision, from the same store read as the headers.
    pub decision: &'a Decision,
    /// The name of the binding quota.
    pub policy_name: &'a str,
    /// The policy the request was charged against (its quotas in the
    /// order of `decision`'s statuses).
    pub policy: &'a Policy,
}

impl Rejection<'_> {
    /// Whole seconds until the request would be admitted (at least 1), or `None`
    /// when it can never be (its cost exceeds the limit).
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self.decision.reject_reason() {
            Some(RejectReason::CostExceedsLimit) => None,
            _ => Some(ceil_secs(self.decision.retry_after_ms()).max(1)),
        }
    }

    /// The names of the quotas that refused the request, in policy order:
    /// the problem document's `violated-policies`.
    pub fn violated_policies(&self) -> Vec<Cow<'_, str>> {
        self.policy
            .quotas()
            .iter()
            .zip(self.decision.statuses())
            .filter(|(_, s)| !s.allowed)
            .map(|(q, _)| q.name())
            .collect()
    }

    /// A one-line explanation for bodies and `grpc-message`.
    pub fn detail(&self) -> String {
        if let Some(until) = self.decision.blocked_until_ms() {
            return format!(
                "refused too often: blocked by rate limit \"{}\" until {} (retry in {} s)",
                self.policy_name,
                utc(until),
                self.retry_after_secs().unwrap_or(1)
            );
        }
        match self.retry_after_secs() {
            Some(s) => format!("rate limit \"{}\" exceeded; retry in {s} s", self.policy_name),
            None => format!(
                "the request's cost exceeds the limit of rate limit \"{}\"; it can never be admitted",
                self.policy_name
            ),
        }
    }
}

/// `ms` (Unix) as an RFC 3339 UTC time to the second, e.g.
/// `2026-12-04T23:59:07Z`.
fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3_600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The default 429: an `application/problem+json` document (RFC 9457) of
/// the IETF RateLimit draft's `quota-exceeded` type, whose
/// `violated-policies` names the quotas that refused the request.
///
/// ```
/// # use std::num::NonZeroU32;
/// use tower_ratelimit::{rate::default_rejection, Quota, RateLimitLayer};
/// let layer = RateLimitLayer::builder()
///     .quota(Quota::per_second(NonZeroU32::new(1).unwrap()))
///     .on_rejection(default_rejection)
///     .build()
///     .unwrap();
/// ```
pub fn default_rejection(r: &Rejection<'_>) -> Response<Bytes> {
    let names = r.violated_policies();
    let violated: Vec<&str> = names.iter().map(|n| n.as_ref()).collect();
    Problem {
        kind: QUOTA_EXCEEDED,
        retry_after: r.retry_after_secs(),
        violated: &violated,
        ..Problem::new(StatusCode::TOO_MANY_REQUESTS, &r.detail())
    }
    .response()
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_writes_unix_milliseconds_as_an_rfc_3339_time() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_796_428_799_999), "2026-12-04T23:59:59Z");
    }

    use super::*;
    use crate::decision::QuotaStatus;
    use crate::Quota;
    use std::time::Duration;

    fn quota(limit: u64, secs: u64, name: &'static str) -> Quota {
        Quota::new(limit, Duration::from_secs(secs))
            .unwrap()
            .named(name)
            .unwrap()
    }

    #[test]
    fn the_default_rejection_is_quota_exceeded_naming_every_refusing_quota_in_policy_order() {
        let policy = Policy::new(quota(10, 1, "second"))
            .and(quota(100, 60, "minute"))
            .unwrap()
            .and(quota(1_000, 3_600, "hour"))
            .unwrap();
        let refuses = |limit| QuotaStatus {
            limit,
            retry_after_ms: 2_000,
            ..QuotaStatus::default()
        };
        let admits = QuotaStatus {
            limit: 100,
            remaining: 40,
            allowed: true,
            ..QuotaStatus::default()
        };
        let decision = Decision::from_statuses([refuses(10), admits, refuses(1_000)], 1);
        let r = Rejection {
            decision: &decision,
            policy_name: "hour",
            policy: &policy,
        };
        assert_eq!(r.violated_policies(), ["second", "hour"]);
        let res = default_rejection(&r);
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        let body = std::str::from_utf8(res.body()).unwrap();
        assert!(
            body.starts_with(
                r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","#
            ),
            "{body}"
        );
        assert!(
            body.ends_with(r#""retry_after":2,"violated-policies":["second","hour"]}"#),
            "{body}"
        );
    }
}
