//! Quotas (how much, over how long, by which algorithm) and policies (the quotas
//! one request is charged against).
//!
//! ```
//! use std::num::NonZeroU32;
//! use std::time::Duration;
//! use tower_ratelimit::{Policy, Quota};
//! let per_second = Quota::per_second(NonZeroU32::new(10).unwrap());
//! let per_hour = Quota::new(1000, Duration::from_secs(3600)).unwrap();
//! let policy = Policy::new(per_second).and(per_hour).unwrap();
//! assert_eq!(policy.quotas().len(), 2);
//! ```

use crate::error::ConfigError;
use std::borrow::Cow;
use std::fmt::Write as _;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

/// The most quotas one policy may hold (each is charged in the same atomic call).
pub const MAX_QUOTAS: usize = 8;

/// The longest window a quota may have (one year): windows are kept in milliseconds.
pub const MAX_WINDOW: Duration = Duration::from_secs(366 * 24 * 3600);

/// The decision rule a quota is enforced with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Algorithm {
    /// `limit` units per window; the window starts with the key's first request
    /// and its reset time is stored with the count.
    #[default]
    FixedWindow,
}

impl Algorithm {
    /// A short stable code, used in store field names and logs.
    pub const fn code(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fw",
        }
    }
}

/// One limit: `limit` units of cost per `window`, enforced by an [`Algorithm`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: u64,
    window_ms: u64,
    algorithm: Algorithm,
    name: Option<Cow<'static, str>>,
}

impl Quota {
    /// `limit` per second.
    pub const fn per_second(limit: NonZeroU32) -> Self {
        Self::from_parts(limit.get() as u64, 1_000)
    }

    /// `limit` per minute.
    pub const fn per_minute(limit: NonZeroU32) -> Self {
        Self::from_parts(limit.get() as u64, 60_000)
    }

    /// `limit` per hour.
    pub const fn per_hour(limit: NonZeroU32) -> Self {
        Self::from_parts(limit.get() as u64, 3_600_000)
    }

    /// `limit` per `window`; errors if `limit` is 0 or `window` is not within
    /// 1 ms ..= [`MAX_WINDOW`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_ratelimit::Quota;
    /// assert!(Quota::new(0, Duration::from_secs(1)).is_err());
    /// assert!(Quota::new(5, Duration::ZERO).is_err());
    /// assert_eq!(Quota::new(5, Duration::from_secs(2)).unwrap().limit(), 5);
    /// ```
    pub fn new(limit: u64, window: Duration) -> Result<Self, ConfigError> {
        if limit == 0 {
            return Err(ConfigError::new("a quota's limit must be at least 1"));
        }
        if window < Duration::from_millis(1) || window > MAX_WINDOW {
            return Err(ConfigError::new(format!(
                "a quota's window must be between 1ms and 366 days, got {window:?}"
            )));
        }
        Ok(Self::from_parts(limit, window.as_millis() as u64))
    }

    const fn from_parts(limit: u64, window_ms: u64) -> Self {
        Self {
            limit,
            window_ms,
            algorithm: Algorithm::FixedWindow,
            name: None,
        }
    }

    /// Names the quota (the IETF `RateLimit-Policy` name); defaults to its window, e.g. `"60s"`.
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::Quota;
    /// let q = Quota::per_hour(NonZeroU32::new(5000).unwrap()).named("authenticated");
    /// assert_eq!(q.name(), "authenticated");
    /// ```
    #[must_use]
    pub fn named(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Sets the algorithm (default [`Algorithm::FixedWindow`]).
    #[must_use]
    pub fn with_algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// Units of cost allowed per window.
    pub const fn limit(&self) -> u64 {
        self.limit
    }

    /// The window length.
    pub const fn window(&self) -> Duration {
        Duration::from_millis(self.window_ms)
    }

    /// The window length in milliseconds.
    pub const fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// The algorithm.
    pub const fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The quota's name: the configured one, or its window (`"1s"`, `"500ms"`, `"1h"`).
    pub fn name(&self) -> Cow<'_, str> {
        match &self.name {
            Some(n) => Cow::Borrowed(n),
            None => Cow::Owned(format_window(self.window_ms)),
        }
    }

    /// The identity of this quota's state within a key: algorithm and window. Two
    /// quotas with the same slot would share state, so a policy refuses them.
    /// The limit is not part of it, so a changed limit applies to the open window.
    pub(crate) fn slot(&self) -> String {
        format!("{}{}", self.algorithm.code(), self.window_ms)
    }
}

/// Formats a window in the largest whole unit: `1h`, `90s`, `500ms`.
pub(crate) fn format_window(ms: u64) -> String {
    let mut s = String::new();
    let _ = if ms.is_multiple_of(3_600_000) {
        write!(s, "{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) {
        write!(s, "{}m", ms / 60_000)
    } else if ms.is_multiple_of(1_000) {
        write!(s, "{}s", ms / 1_000)
    } else {
        write!(s, "{ms}ms")
    };
    s
}

/// The quotas one request is charged against, all or nothing, in one store call.
///
/// Cheap to clone (one `Arc`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Policy {
    quotas: Arc<[Quota]>,
}

impl Policy {
    /// A policy of one quota.
    pub fn new(quota: Quota) -> Self {
        Self {
            quotas: Arc::from([quota]),
        }
    }

    /// Adds a quota; errors past [`MAX_QUOTAS`] or when two quotas share an
    /// algorithm and window (they would share state).
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{Policy, Quota};
    /// let n = |n| NonZeroU32::new(n).unwrap();
    /// let p = Policy::new(Quota::per_second(n(10)));
    /// assert!(p.clone().and(Quota::per_second(n(20))).is_err());
    /// assert!(p.and(Quota::per_hour(n(1000))).is_ok());
    /// ```
    pub fn and(self, quota: Quota) -> Result<Self, ConfigError> {
        let mut v: Vec<Quota> = self.quotas.iter().cloned().collect();
        if v.len() >= MAX_QUOTAS {
            return Err(ConfigError::new(format!(
                "a policy holds at most {MAX_QUOTAS} quotas"
            )));
        }
        if v.iter().any(|q| q.slot() == quota.slot()) {
            return Err(ConfigError::new(format!(
                "two quotas with the same algorithm and window ({}) would share state; give them different windows",
                format_window(quota.window_ms)
            )));
        }
        v.push(quota);
        Ok(Self { quotas: v.into() })
    }

    /// The quotas, in the order they were added.
    pub fn quotas(&self) -> &[Quota] {
        &self.quotas
    }
}

impl Policy {
    /// The same quotas with each limit multiplied by `fraction` (at least 1):
    /// what one instance admits on its own when the shared store is down.
    pub(crate) fn scaled(&self, fraction: f64) -> Policy {
        let quotas: Vec<Quota> = self
            .quotas
            .iter()
            .map(|q| Quota {
                limit: ((q.limit as f64 * fraction).floor() as u64).max(1),
                ..q.clone()
            })
            .collect();
        Policy {
            quotas: quotas.into(),
        }
    }
}

impl From<Quota> for Policy {
    fn from(q: Quota) -> Self {
        Policy::new(q)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_names_use_the_largest_whole_unit() {
        assert_eq!(format_window(3_600_000), "1h");
        assert_eq!(format_window(90_000), "90s");
        assert_eq!(format_window(120_000), "2m");
        assert_eq!(format_window(500), "500ms");
    }
}
