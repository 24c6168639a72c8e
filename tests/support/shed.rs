//! What the load shedder's tests share: classing by `x-priority`, sending a
//! request of a class, and checking a shed answer.
#![allow(dead_code)]

use super::http::{HttpClient, Reply};
use axum::http::StatusCode;
use tower_ratelimit::shed::Priority;

/// The class a request's `x-priority` header names (normal without one).
pub fn by_header(parts: &http::request::Parts) -> Priority {
    parts
        .headers
        .get("x-priority")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or_default()
}

/// A GET of `url` in `class`.
pub async fn send(c: &HttpClient, url: &str, class: Priority) -> Reply {
    c.get_with(url, &[("x-priority", class.as_str().as_bytes())])
        .await
}

/// `r` is the shedder's default 503 for a request of `class`.
pub fn assert_shed(r: &Reply, class: Priority) {
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{r:?}");
    assert_eq!(r.header_u64("retry-after"), 1);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert!(
        r.body.contains(
            r#""type":"https://iana.org/assignments/http-problem-types#temporary-reduced-capacity""#
        ),
        "{}",
        r.body
    );
    assert!(r.body.contains(class.as_str()), "{}", r.body);
}
