//! gRPC answers: a gRPC call (HTTP/2 with `content-type: application/grpc*`)
//! is rejected with a gRPC status, not an HTTP status, so gRPC clients can
//! read it. A request of another HTTP version gets the plain HTTP answer,
//! whatever its content type: a REST route's 429 is never turned into a
//! `200` a client could take for content. Every limiter answer, in either
//! form, carries `Cache-Control: no-store`.
//!
//! A rejection is HTTP 200 with `grpc-status: 8` (`RESOURCE_EXHAUSTED`), a
//! `grpc-message`, the rate-limit headers as response metadata, and the retry
//! delay twice: as `grpc-retry-pushback-ms` and as a `google.rpc.RetryInfo` in
//! `grpc-status-details-bin` (read it with `tonic_types::StatusExt`). A
//! fail-closed store error is `UNAVAILABLE`; a key the call lacks is
//! `INVALID_ARGUMENT`, one a misconfiguration prevents `INTERNAL`.
//!
//! Refund predicates see the response head: a handler's error status arrives
//! there (a trailers-only response), so "do not charge `NOT_FOUND`" is
//!
//! ```
//! use tower_ratelimit::grpc;
//! # use std::num::NonZeroU32;
//! # use tower_ratelimit::{rate::Settlement, Quota, RateLimitLayer};
//! let layer = RateLimitLayer::builder()
//!     .quota(Quota::per_second(NonZeroU32::new(10).unwrap()))
//!     .settlement(Settlement::new().refund_if(|status, headers| {
//!         status == 304 || grpc::status_code(headers) == Some(grpc::NOT_FOUND)
//!     }))
//!     .build()
//!     .unwrap();
//! ```

use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use http::request::Parts;
use http::{Response, StatusCode};

/// `grpc-status` of a successful call.
pub const OK: i32 = 0;
/// `grpc-status` `INVALID_ARGUMENT`: the call lacks what its key is made of.
pub const INVALID_ARGUMENT: i32 = 3;
/// `grpc-status` `NOT_FOUND`.
pub const NOT_FOUND: i32 = 5;
/// `grpc-status` `RESOURCE_EXHAUSTED`: a rate-limit rejection.
pub const RESOURCE_EXHAUSTED: i32 = 8;
/// `grpc-status` `INTERNAL`: the key could not be extracted (a misconfiguration).
pub const INTERNAL: i32 = 13;
/// `grpc-status` `UNAVAILABLE`: the limiter's store failed and the layer fails closed.
pub const UNAVAILABLE: i32 = 14;

/// Whether the request is a gRPC call: HTTP/2 (gRPC runs on nothing else)
/// with `content-type: application/grpc` (or `+proto`, …).
///
/// ```
/// use tower_ratelimit::grpc;
/// let call = |version| {
///     let req = http::Request::builder().version(version).header("content-type", "application/grpc");
///     req.body(()).unwrap().into_parts().0
/// };
/// assert!(grpc::is_grpc(&call(http::Version::HTTP_2)));
/// assert!(!grpc::is_grpc(&call(http::Version::HTTP_11)));
/// ```
pub fn is_grpc(parts: &Parts) -> bool {
    parts.version == http::Version::HTTP_2
        && parts
            .headers
            .get(CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// A call's deadline from its `grpc-timeout` header, in whole ms (rounded
/// down), when it carries a valid one: up to 8 digits and a unit (`H`, `M`,
/// `S`, `m`, `u` or `n`). Anything else is no deadline.
pub(crate) fn timeout_ms(parts: &Parts) -> Option<u64> {
    let v = parts.headers.get("grpc-timeout")?.as_bytes();
    let (&unit, digits) = v.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => n * 3_600_000,
        b'M' => n * 60_000,
        b'S' => n * 1_000,
        b'm' => n,
        b'u' => n / 1_000,
        b'n' => n / 1_000_000,
        _ => return None,
    })
}

/// The `grpc-status` in a response head (trailers-only responses carry it there).
pub fn status_code(headers: &HeaderMap) -> Option<i32> {
    headers.get("grpc-status")?.to_str().ok()?.parse().ok()
}

/// A trailers-only gRPC error response: status, message and, when given, the retry delay.
pub(crate) fn error(code: i32, message: &str, retry_after_ms: Option<u64>) -> Response<Bytes> {
    let mut res = Response::new(Bytes::new());
    *res.status_mut() = StatusCode::OK;
    let h = res.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert("grpc-status", HeaderValue::from(code));
    if let Ok(v) = HeaderValue::from_str(&percent_encode(message)) {
        h.insert("grpc-message", v);
    }
    if let Some(ms) = retry_after_ms {
        h.insert("grpc-retry-pushback-ms", HeaderValue::from(ms));
        let details = status_details(code, message, ms);
        if let Ok(v) = HeaderValue::from_str(&base64(&details)) {
            h.insert("grpc-status-details-bin", v);
        }
    }
    res
}

/// gRPC's `grpc-message` encoding: percent-encode everything outside printable ASCII and `%`.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `google.rpc.Status { code, message, details: [Any(google.rpc.RetryInfo { retry_delay })] }`,
/// protobuf-encoded by hand: five fixed fields do not justify a protobuf dependency.
fn status_details(code: i32, message: &str, retry_after_ms: u64) -> Vec<u8> {
    // google.protobuf.Duration { seconds = 1, nanos = 2 }
    let mut duration = Vec::new();
    let (secs, nanos) = (retry_after_ms / 1000, (retry_after_ms % 1000) * 1_000_000);
    if secs > 0 {
        field_varint(&mut duration, 1, secs);
    }
    if nanos > 0 {
        field_varint(&mut duration, 2, nanos);
    }
    // google.rpc.RetryInfo { retry_delay = 1 }
    let mut retry_info = Vec::new();
    field_bytes(&mut retry_info, 1, &duration);
    // google.protobuf.Any { type_url = 1, value = 2 }
    let mut any = Vec::new();
    field_bytes(&mut any, 1, b"type.googleapis.com/google.rpc.RetryInfo");
    field_bytes(&mut any, 2, &retry_info);
    // google.rpc.Status { code = 1, message = 2, details = 3 }
    let mut status = Vec::new();
    field_varint(&mut status, 1, code as u64);
    field_bytes(&mut status, 2, message.as_bytes());
    field_bytes(&mut status, 3, &any);
    status
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn field_varint(out: &mut Vec<u8>, field: u64, v: u64) {
    varint(out, field << 3);
    varint(out, v);
}

fn field_bytes(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    varint(out, (field << 3) | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Standard base64 without padding, as gRPC binary metadata is sent.
fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_grpc_timeout_reads_as_whole_milliseconds_and_anything_malformed_as_none() {
        let parts = |v: &str| {
            http::Request::builder()
                .header("grpc-timeout", v)
                .body(())
                .unwrap()
                .into_parts()
                .0
        };
        assert_eq!(timeout_ms(&parts("1S")), Some(1_000));
        assert_eq!(timeout_ms(&parts("250m")), Some(250));
        assert_eq!(timeout_ms(&parts("2H")), Some(7_200_000));
        assert_eq!(timeout_ms(&parts("1500u")), Some(1));
        assert_eq!(timeout_ms(&parts("99999999n")), Some(99));
        for bad in ["", "S", "123456789S", "1x", "-1S", "1.5S", "１S"] {
            assert_eq!(timeout_ms(&parts(bad)), None, "{bad:?}");
        }
    }

    use super::*;

    #[test]
    fn base64_matches_the_standard_alphabet_without_padding() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg");
        assert_eq!(base64(b"fo"), "Zm8");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar?"), "Zm9vYmFyPw");
    }

    #[test]
    fn varints_use_seven_bits_per_byte() {
        let mut v = vec![];
        varint(&mut v, 300);
        assert_eq!(v, [0xac, 0x02]);
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(percent_encode("a b%c\né"), "a b%25c%0A%C3%A9");
    }

    #[test]
    fn grpc_is_recognised_by_content_type_over_http_2() {
        let (p, ()) = http::Request::builder()
            .version(http::Version::HTTP_2)
            .header("content-type", "application/grpc+proto")
            .body(())
            .unwrap()
            .into_parts();
        assert!(is_grpc(&p));
        let (p, ()) = http::Request::builder()
            .version(http::Version::HTTP_2)
            .header("content-type", "application/json")
            .body(())
            .unwrap()
            .into_parts();
        assert!(!is_grpc(&p));
        let (p, ()) = http::Request::builder()
            .header("content-type", "application/grpc")
            .body(())
            .unwrap()
            .into_parts();
        assert!(!is_grpc(&p), "HTTP/1.1 carries no gRPC");
    }
}
