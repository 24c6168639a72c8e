//! The limiter's own answers: rejections (429), key errors (500), store failures (503).

use crate::decision::{Decision, RejectReason};
use crate::headers::ceil_secs;
use crate::key::KeyError;
use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use std::fmt::Write as _;

/// What a rejection knows, for a custom rejection response.
#[derive(Debug)]
pub struct Rejection<'a> {
    /// The decision, from the same store read as the headers.
    pub decision: &'a Decision,
    /// The name of the binding quota.
    pub policy_name: &'a str,
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
}

impl Rejection<'_> {
    /// A one-line explanation for bodies and `grpc-message`.
    pub fn detail(&self) -> String {
        match self.retry_after_secs() {
            Some(s) => format!("rate limit \"{}\" exceeded; retry in {s} s", self.policy_name),
            None => format!(
                "the request's cost exceeds the limit of rate limit \"{}\"; it can never be admitted",
                self.policy_name
            ),
        }
    }
}

/// The default 429: an `application/problem+json` document (RFC 9457).
pub fn default_rejection(r: &Rejection<'_>) -> Response<Bytes> {
    let detail = r.detail();
    let mut body = String::with_capacity(160);
    body.push_str(r#"{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"#);
    write_json_string(&mut body, &detail);
    if let Some(s) = r.retry_after_secs() {
        let _ = write!(body, r#","retry_after":{s}"#);
    }
    body.push('}');
    problem(StatusCode::TOO_MANY_REQUESTS, body)
}

/// The default answer to a request whose key could not be extracted: 500, a
/// misconfiguration named in the body.
pub fn default_key_error(err: &KeyError) -> Response<Bytes> {
    let mut body = String::new();
    body.push_str(
        r#"{"type":"about:blank","title":"Internal Server Error","status":500,"detail":"#,
    );
    write_json_string(&mut body, &err.to_string());
    body.push('}');
    problem(StatusCode::INTERNAL_SERVER_ERROR, body)
}

/// The limiter cannot decide (store down and failing closed, key cap reached):
/// 503 with `Retry-After`, or gRPC `UNAVAILABLE` with the same delay.
pub(crate) fn unavailable(grpc: bool, retry_after_secs: u64, detail: &str) -> Response<Bytes> {
    if grpc {
        return crate::grpc::error(
            crate::grpc::UNAVAILABLE,
            detail,
            Some(retry_after_secs.max(1) * 1000),
        );
    }
    let mut body = String::new();
    body.push_str(r#"{"type":"about:blank","title":"Service Unavailable","status":503,"detail":"#);
    write_json_string(&mut body, detail);
    body.push('}');
    let mut res = problem(StatusCode::SERVICE_UNAVAILABLE, body);
    res.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from(retry_after_secs.max(1)),
    );
    res
}

fn problem(status: StatusCode, body: String) -> Response<Bytes> {
    let mut res = Response::new(Bytes::from(body));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    res
}

fn write_json_string(out: &mut String, s: &str) {
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
}
