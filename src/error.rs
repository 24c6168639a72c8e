//! Errors: configuration problems (at build time) and store failures (per request).

use std::borrow::Cow;
use std::time::Duration;

/// A configuration problem, reported when a layer, store or quota is built
/// (or a runtime limit is set): what is wrong, in words, and its
/// [`kind`](Self::kind) for a program to match.
///
/// ```
/// use tower_ratelimit::{ConfigErrorKind, Quota};
/// let err = Quota::new(0, std::time::Duration::from_secs(1)).unwrap_err();
/// assert_eq!(err.kind(), ConfigErrorKind::Quota);
/// assert!(err.to_string().contains("at least 1"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid rate limit configuration: {message}")]
pub struct ConfigError {
    kind: ConfigErrorKind,
    message: Cow<'static, str>,
}

/// What kind of problem a [`ConfigError`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConfigErrorKind {
    /// A required setting is missing: no quota, no limit, no shard, no
    /// seed node.
    Missing,
    /// A setting's value is outside what it accepts: a zero timeout, a
    /// fraction above 1, a malformed name, one override too many.
    Invalid,
    /// A quota or policy cannot be built as given: its limit, window,
    /// burst, name or unit, or too many quotas.
    Quota,
    /// The text form of a quota or policy could not be read.
    Syntax,
    /// Settings that do not go together, or a setting the store cannot
    /// serve: a fixed and an adaptive limit, a limiter name taken by another
    /// limiter, a quota in tokens on the coordinated store, a store that
    /// keeps no slots under a concurrency limit.
    Conflict,
    /// A store's address or credentials cannot be used: a bad Redis URL,
    /// TLS or Sentinel setting.
    Store,
}

impl ConfigError {
    pub(crate) fn new(kind: ConfigErrorKind, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// What kind of problem this is.
    pub fn kind(&self) -> ConfigErrorKind {
        self.kind
    }
}

/// Why a store call failed. The layer answers per its failure policy and never panics.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The call did not finish within the store timeout.
    #[error("rate limit store did not answer within {0:?}")]
    Timeout(Duration),
    /// No connection could be had (refused, pool exhausted, circuit open).
    #[error("rate limit store unavailable: {0}")]
    Unavailable(String),
    /// The store answered with an error (e.g. Redis `OOM`, `BUSY`, `READONLY`).
    #[error("rate limit store answered an error: {message}")]
    Response {
        /// The error code (`OOM`, `BUSY`, `READONLY`, …), if the store sent one.
        code: Option<String>,
        /// The whole error.
        message: String,
    },
    /// The circuit breaker is open: the store was not called.
    #[error("rate limit store circuit is open after repeated failures")]
    CircuitOpen,
    /// The store's answer did not have the expected shape.
    #[error("rate limit store answered something unexpected: {0}")]
    Protocol(String),
    /// A store that refuses new keys at its cap did (a custom store; the
    /// memory store makes room instead).
    #[error("rate limit store is tracking its maximum of {max_keys} keys and refuses new ones")]
    Full {
        /// The configured cap.
        max_keys: usize,
        /// When the earliest tracked state expires, freeing room (Unix ms).
        retry_at_ms: u64,
    },
    /// So many charges already wait for the store's connection that this one
    /// was not queued: the instance asks more of the store than it answers.
    /// Not a fault of the store (the breaker does not count it), so not the
    /// failure policy's either: the rate limiter answers it `503` with
    /// `Retry-After` (the `temporary-reduced-capacity` problem, gRPC
    /// `UNAVAILABLE`), never admitting without limit, and counts it as the
    /// decision `overloaded`. Keeping an instance out of that state is the
    /// load shedder's job ([`LoadShedLayer`](crate::LoadShedLayer)).
    #[error("{queued} rate limit charges already wait for the store's connection")]
    Backlog {
        /// The charges waiting.
        queued: usize,
    },
}

impl StoreError {
    /// A short, stable label for logs and metrics: `timeout`, `unavailable`,
    /// `circuit_open`, `oom`, `busy`, `readonly`, `loading`, `response` (other
    /// error replies), `protocol`, `full` or `backlog`.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Timeout(_) => "timeout",
            StoreError::Unavailable(_) => "unavailable",
            StoreError::CircuitOpen => "circuit_open",
            StoreError::Response { code, .. } => match code.as_deref() {
                Some("OOM") => "oom",
                Some("BUSY") => "busy",
                Some("READONLY") => "readonly",
                Some("LOADING") => "loading",
                _ => "response",
            },
            StoreError::Protocol(_) => "protocol",
            StoreError::Full { .. } => "full",
            StoreError::Backlog { .. } => "backlog",
        }
    }
}
