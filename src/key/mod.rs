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

mod value;

pub use value::Key;

use http::request::Parts;
use std::borrow::Cow;
use std::fmt;

/// Why an extractor could not produce a key (a misconfiguration or a malformed request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    extractor: Cow<'static, str>,
    reason: Cow<'static, str>,
}

impl KeyError {
    /// A new error from the extractor named `extractor`.
    pub fn new(extractor: impl Into<Cow<'static, str>>, reason: impl Into<Cow<'static, str>>) -> Self {
        Self {
            extractor: extractor.into(),
            reason: reason.into(),
        }
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
        write!(f, "key extractor `{}` found no key: {}", self.extractor, self.reason)
    }
}

impl std::error::Error for KeyError {}

/// Turns a request head into the [`Key`] it is limited under.
///
/// `Ok(None)` means *exempt*: the request is not limited at all. An error is
/// answered with the layer's key-error response (500 by default), never a panic.
///
/// Implemented for closures `Fn(&Parts) -> R` where `R` is a [`Key`],
/// `Option<Key>` (`None` is an error), or `Result<Option<Key>, KeyError>`.
pub trait KeyExtractor: Send + Sync + 'static {
    /// Extracts the key from the request head.
    fn extract(&self, parts: &Parts) -> Result<Option<Key>, KeyError>;
}
