//! The limiters' own answers as RFC 9457 problem documents
//! (`application/problem+json`), and as gRPC statuses for gRPC calls.

use crate::grpc;
use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use std::fmt::Write as _;

/// The IETF RateLimit draft's problem type for a request over a quota.
pub(crate) const QUOTA_EXCEEDED: &str =
    "https://iana.org/assignments/http-problem-types#quota-exceeded";
/// The IETF RateLimit draft's problem type for a request refused while the
/// service has less capacity than usual (load shedding).
pub(crate) const TEMPORARY_REDUCED_CAPACITY: &str =
    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity";

/// A problem document: `{"type":…,"title":…,"status":…,"detail":…}`, with
/// the optional members the limiters add.
#[derive(Debug)]
pub(crate) struct Problem<'a> {
    pub(crate) status: StatusCode,
    /// The problem type (`about:blank` unless a registered one applies).
    pub(crate) kind: &'a str,
    pub(crate) detail: &'a str,
    /// `retry_after`, in whole seconds.
    pub(crate) retry_after: Option<u64>,
    /// `violated-policies`: the names of the quotas that refused.
    pub(crate) violated: &'a [&'a str],
}

impl Problem<'_> {
    /// A problem of the given status, with no optional member.
    pub(crate) fn new<'a>(status: StatusCode, detail: &'a str) -> Problem<'a> {
        Problem {
            status,
            kind: "about:blank",
            detail,
            retry_after: None,
            violated: &[],
        }
    }

    pub(crate) fn response(&self) -> Response<Bytes> {
        let mut body = String::with_capacity(160);
        body.push_str("{\"type\":");
        write_json_string(&mut body, self.kind);
        body.push_str(",\"title\":");
        write_json_string(
            &mut body,
            self.status.canonical_reason().unwrap_or_default(),
        );
        let _ = write!(body, ",\"status\":{},\"detail\":", self.status.as_u16());
        write_json_string(&mut body, self.detail);
        if let Some(s) = self.retry_after {
            let _ = write!(body, ",\"retry_after\":{s}");
        }
        if !self.violated.is_empty() {
            body.push_str(",\"violated-policies\":[");
            for (i, name) in self.violated.iter().enumerate() {
                if i > 0 {
                    body.push(',');
                }
                write_json_string(&mut body, name);
            }
            body.push(']');
        }
        body.push('}');
        let mut res = Response::new(Bytes::from(body));
        *res.status_mut() = self.status;
        res.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        res
    }
}

/// The limiter cannot decide (store down and failing closed): 503 with
/// `Retry-After`, or gRPC `UNAVAILABLE` with the same delay.
pub(crate) fn unavailable(grpc: bool, retry_after_secs: u64, detail: &str) -> Response<Bytes> {
    unavailable_as("about:blank", grpc, retry_after_secs, detail)
}

/// [`unavailable`] with the problem type `kind`.
pub(crate) fn unavailable_as(
    kind: &str,
    grpc: bool,
    retry_after_secs: u64,
    detail: &str,
) -> Response<Bytes> {
    let secs = retry_after_secs.max(1);
    if grpc {
        return grpc::error(grpc::UNAVAILABLE, detail, Some(secs * 1000));
    }
    let mut res = Problem {
        kind,
        ..Problem::new(StatusCode::SERVICE_UNAVAILABLE, detail)
    }
    .response();
    crate::headers::retry_after(res.headers_mut(), secs);
    res
}

/// A JSON string literal of `s`: quotes, backslashes and control characters escaped.
pub(crate) fn write_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_escape_quotes_backslashes_and_control_characters() {
        let mut s = String::new();
        write_json_string(&mut s, "a\"b\\c\nd");
        assert_eq!(s, r#""a\"b\\c\u000ad""#);
    }

    #[test]
    fn a_problem_document_has_its_members_in_order() {
        let res = Problem {
            retry_after: Some(3),
            violated: &["1m", "tok\"ens"],
            kind: QUOTA_EXCEEDED,
            ..Problem::new(StatusCode::TOO_MANY_REQUESTS, "slow down")
        }
        .response();
        assert_eq!(res.headers()["content-type"], "application/problem+json");
        assert_eq!(
            res.body(),
            r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429,"detail":"slow down","retry_after":3,"violated-policies":["1m","tok\"ens"]}"#
        );
    }
}
