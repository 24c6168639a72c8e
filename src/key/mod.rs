//! Key extractors: which client a request counts against.
//!
//! ```
//! use tower_ratelimit::key::{ClientIp, KeyExtractor};
//! let ip = ClientIp::new().trust_cidr("10.0.0.0/8".parse().unwrap());
//! let req = http::Request::builder().body(()).unwrap();
//! let (parts, _) = req.into_parts();
//! // No peer address recorded: a clear error, never a panic.
//! assert!(ip.extract(&parts).is_err());
//! ```
//!
//! | extractor | keys by |
//! |---|---|
//! | [`PeerIp`] | the TCP peer's IP |
//! | [`ClientIp`] | the client's IP behind trusted proxies (`X-Forwarded-For`, `Forwarded`, `X-Real-IP`) |
//! | [`ApiKey`] | an API key header or bearer token, hashed |
//! | [`Header`] | a header's raw value |
//! | [`extension`] / [`FromExtension`] | a value auth middleware stored in the request extensions |
//! | [`Method`], [`Path`], `MatchedRoute` (feature `axum`) | what the request asks for |
//! | [`Constant`], [`Global`] | one key for every request |
//! | [`Exempt`] | nothing: every request is exempt |
//! | a closure `Fn(&Parts) -> R` | anything (see [`IntoKeyResult`]) |
//!
//! [`KeyExtractorExt`] combines them: `.and` (composite key), `.or`
//! (fallback), `.exempt_if` (skip some requests). Tuples `(A, B)` and
//! `(A, B, C)` key like `.and`.
//!
//! IP keys are normalised the same way everywhere: IPv4-mapped IPv6 becomes
//! IPv4, IPv6 is grouped by its /64 (configurable), zone ids are dropped.

mod api_key;
mod client_ip;
mod combinators;
mod constant;
mod extension;
mod fn_impl;
mod forwarded;
mod header;
mod ip;
mod request;
#[cfg(test)]
mod test_util;
mod value;

pub use api_key::ApiKey;
pub use client_ip::ClientIp;
pub use combinators::{And, ExemptIf, KeyExtractorExt, Or};
pub use constant::{Constant, Exempt, Global};
pub use extension::{extension, FromExtension};
pub use fn_impl::IntoKeyResult;
pub use forwarded::ForwardedHeader;
pub use header::Header;
pub use ip::PeerIp;
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use request::MatchedRoute;
pub use request::{GrpcMethod, Method, Path};
pub use value::Key;

use http::request::Parts;
use std::borrow::Cow;
use std::fmt;

/// Why an extractor could not produce a key, and whose fault that is
/// ([`KeyErrorKind`]).
///
/// ```
/// use tower_ratelimit::key::{KeyError, KeyErrorKind};
/// let e = KeyError::client("api_key", "header `x-api-key` is missing");
/// assert_eq!(e.kind(), KeyErrorKind::Client);
/// assert_eq!(e.to_string(), "key extractor `api_key` found no key: header `x-api-key` is missing");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    extractor: Cow<'static, str>,
    reason: Cow<'static, str>,
    kind: KeyErrorKind,
}

/// Whose fault a missing key is: what the default answer says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyErrorKind {
    /// The request lacks what its key is made of, or carries it malformed (no
    /// API key, a header that does not parse, absent metadata): answered `400
    /// Bad Request` (gRPC `INVALID_ARGUMENT`) by default. Logged at debug
    /// level: a client can send these at will.
    Client,
    /// The server is misconfigured (no `ConnectInfo`, an extension the
    /// application should have inserted, a layer outside the router):
    /// answered `500` (gRPC `INTERNAL`) by default, and logged as an error.
    Server,
}

impl KeyError {
    /// The request did not carry what the key is made of (a client error).
    pub fn client(
        extractor: impl Into<Cow<'static, str>>,
        reason: impl Into<Cow<'static, str>>,
    ) -> Self {
        Self::of(KeyErrorKind::Client, extractor, reason)
    }

    /// The application is misconfigured (a server error).
    pub fn server(
        extractor: impl Into<Cow<'static, str>>,
        reason: impl Into<Cow<'static, str>>,
    ) -> Self {
        Self::of(KeyErrorKind::Server, extractor, reason)
    }

    fn of(
        kind: KeyErrorKind,
        extractor: impl Into<Cow<'static, str>>,
        reason: impl Into<Cow<'static, str>>,
    ) -> Self {
        Self {
            extractor: extractor.into(),
            reason: reason.into(),
            kind,
        }
    }

    /// Whose fault it is.
    pub fn kind(&self) -> KeyErrorKind {
        self.kind
    }

    /// The name of the extractor that failed.
    pub fn extractor(&self) -> &str {
        &self.extractor
    }

    /// What was missing or wrong.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "key extractor `{}` found no key: {}",
            self.extractor, self.reason
        )
    }
}

impl std::error::Error for KeyError {}

/// Turns a request head into the [`Key`] it is limited under.
///
/// `Ok(None)` means *exempt*: the request is not limited at all. An error is
/// answered with the layer's key-error response (400 for a
/// [client](KeyErrorKind::Client) error, 500 for a [server](KeyErrorKind::Server)
/// one, by default), never a panic.
///
/// Implemented for closures `Fn(&Parts) -> R` where `R` is a [`Key`],
/// `Option<Key>` (`None` is an error), or `Result<Option<Key>, KeyError>`
/// (see [`IntoKeyResult`]), and for `Arc<E>` and `Box<dyn KeyExtractor>`.
pub trait KeyExtractor: Send + Sync + 'static {
    /// Extracts the key from the request head.
    fn extract(&self, parts: &Parts) -> Result<Option<Key>, KeyError>;
}

/// The default answer to a request whose key could not be extracted, as a
/// problem document naming what is missing: `400 Bad Request` when the
/// request lacks it ([`KeyErrorKind::Client`]), `500` when the application is
/// misconfigured ([`KeyErrorKind::Server`]).
///
/// ```
/// use tower_ratelimit::key::{default_key_error, KeyError};
/// let res = default_key_error(&KeyError::client("api_key", "header `x-api-key` is missing"));
/// assert_eq!(res.status(), 400);
/// let res = default_key_error(&KeyError::server("peer_ip", "no ConnectInfo in the request"));
/// assert_eq!(res.status(), 500);
/// ```
pub fn default_key_error(err: &KeyError) -> http::Response<bytes::Bytes> {
    let status = match err.kind() {
        KeyErrorKind::Client => http::StatusCode::BAD_REQUEST,
        _ => http::StatusCode::INTERNAL_SERVER_ERROR,
    };
    crate::problem::Problem::new(status, &err.to_string()).response()
}
