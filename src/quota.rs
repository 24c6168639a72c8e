//! Quotas (how much, over how long, by which algorithm) and policies (the
//! quotas one request is charged against): [`Quota`], [`Policy`], [`Algorithm`].

mod refusal;
mod text;

#[cfg(feature = "penalty")]
pub use refusal::Penalty;
pub(crate) use refusal::Refusal;
#[cfg(feature = "wait")]
pub use refusal::Wait;

use crate::error::{ConfigError, ConfigErrorKind};
use std::borrow::Cow;
use std::num::NonZeroU32;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The most quotas one policy may hold (each is charged in the same atomic call).
pub(crate) const MAX_QUOTAS: usize = 8;

/// The longest window a quota may have (one year): windows are kept in milliseconds.
pub(crate) const MAX_WINDOW: Duration = Duration::from_secs(366 * 24 * 3600);

/// The largest limit or burst a quota accepts: the largest integer an IETF
/// `RateLimit` header can carry (a structured-field integer has at most 15
/// digits), and well inside what the Redis scripts compute exactly (Lua
/// numbers are doubles, exact up to 2^53).
pub(crate) const MAX_LIMIT: u64 = 999_999_999_999_999;

/// The largest number the decision math handles: every value the Lua scripts
/// compute stays below it, exact in a double.
pub(crate) const EXACT: u64 = 1 << 52;

/// The most bytes in a quota's name.
pub(crate) const MAX_NAME_LEN: usize = 64;

/// The largest limit a [`Algorithm::SlidingLog`] quota accepts: the log keeps
/// one entry per millisecond with a charge, so a key holds at most
/// `min(limit, window in ms)` entries (about 40 bytes each in memory, about
/// 100 in Redis).
pub(crate) const MAX_SLIDING_LOG_LIMIT: u64 = 10_000;

/// The decision rule a quota is enforced with. Every algorithm reports the
/// same header meanings: `remaining` is what can be spent now, `reset` when
/// the quota is fully available again, `retry-after` when a rejected request
/// would be admitted.
///
/// | algorithm | state per key and quota | strict | notes |
/// |---|---|---|---|
/// | `FixedWindow` (default) | count + stored reset | yes, per window | up to 2 × limit across a window boundary |
/// | `TokenBucket` | level + time | yes | `burst` (default the limit); a full bucket after idle time allows a burst |
/// | `Gcra` | one timestamp | yes | admits exactly what a token bucket of the same rate and burst admits |
/// | `SlidingWindow` | 2 counts + window start | no (estimate) | constant state, smooth; undercounts traffic bunched at a window's end |
/// | `SlidingLog` | one entry per charged ms | yes, every sliding window | limit capped at [`Quota::MAX_SLIDING_LOG_LIMIT`](crate::Quota::MAX_SLIDING_LOG_LIMIT); memory grows with traffic |
///
/// Every algorithm is integer math on `now`, mirrored line for line by a Lua
/// file for the Redis store, so both stores answer alike. Rates that do not
/// divide their window (3 per second) are kept exactly, in units of
/// `window / gcd(limit, window)`: no drift and no floating point. That needs
/// `limit × window in ms ≤ 2^52` for the sliding window counter and
/// `burst × window / gcd ≤ 2^52` for a token bucket or GCRA, checked when
/// the quota is built.
///
/// A cost above the limit (or burst) is never admitted and gets no
/// `Retry-After`. A refund gives back exactly what its charge took, never
/// more and never to newer state: a fixed window only to the window charged;
/// a sliding window counter to the current or previous window; a sliding log
/// removes the charge from its entry; a token bucket or GCRA gives the time
/// back, capped at full, only while that charge is the bucket's last change
/// (after another charge no stored number says how much of the older one has
/// refilled, and giving it back anyway would hand out tokens twice).
///
/// Fixed window:
///
/// ```text
/// limit 3 per 10 s; the window starts with the key's first request
/// t=0s    o o o      3/3 used        Reset 10s (stored with the count)
/// t=4s    x          rejected        Remaining 0, Retry-After 6s
/// t=10s   o          new window      1/3 used, Reset 20s
/// ```
///
/// Token bucket (GCRA makes the same decisions with one number of state):
///
/// ```text
/// 4 per second, burst 4: one token every 250 ms, at most 4 held
/// t=0ms     o o o o   4 -> 0 tokens     Remaining 0, Reset 1000ms (full again)
/// t=100ms   x         0.4 tokens        Retry-After 150ms
/// t=250ms   o         1 -> 0 tokens     Reset 1250ms
/// idle 2s             refilled to 4     (never above the burst): a burst again
/// ```
///
/// GCRA:
///
/// ```text
/// emission interval T = window / limit = 250 ms; one theoretical arrival time (TAT)
/// admit cost c at t  iff  max(TAT, t) + c*T - t <= burst*T;  then TAT = max(TAT, t) + c*T
/// t=0ms     o o o o   TAT 0 -> 1000     Reset 1000ms (= TAT)
/// t=100ms   x         1000 + 250 - 100 > 1000     Retry-After 150ms
/// ```
///
/// Sliding window counter:
///
/// ```text
/// 4 per 1 s, windows aligned to the epoch
///         |---- previous window: 3 ----|---- current window: 1 ----|
///                                      |<- 250 ms ->|  now
/// estimate = 1 + 3 x (1000 - 250) / 1000 = 3.25      Remaining 0
/// one more fits once 3 x (1 - e) <= 2, e >= 334 ms:  Retry-After 84ms
/// ```
///
/// It assumes the previous window's traffic was spread evenly. Against the
/// exact sliding log (`tests/properties/sliding_window_error.rs`: 1,000 per
/// minute, 40 windows of seeded traffic; `--nocapture` prints the numbers):
///
/// | traffic | mean error of the estimate (share of the limit) | admissions the exact log would have rejected | busiest sliding window |
/// |---|---|---|---|
/// | steady (Poisson, 1.2 × the limit) | 0.46% | 16.4% | 101.5% of the limit |
/// | bursty (100–600 within a second, then 1–41 s quiet) | 12.2% | 15.4% | 140% |
/// | bunched (a full limit in a window's last 2 s, then steady) | 24.4% | 49.3% | 196% |
///
/// Use the sliding log or a token bucket where traffic bunched at a window's
/// end must not pass.
///
/// Sliding log:
///
/// ```text
/// 3 per 1 s; every charge is logged with its time (charges in one ms share an entry)
/// t=0     o (1)      log [0:1]              Remaining 2
/// t=400   o (2)      log [0:1, 400:2]       Remaining 0, Reset 1400 (newest + window)
/// t=999   x          the entry at 0 slides out at 1000       Retry-After 1ms
/// t=1000  x (2)      only 1 unit is free until 1400          Retry-After 400ms
/// ```
///
/// Exact over every sliding window, at a memory cost: up to
/// `min(limit, window in ms)` entries per key, about 16 bytes each in the
/// memory store and 60–100 in Redis (a sorted set), hence the cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Algorithm {
    /// `limit` units per window; the window starts with the key's first request
    /// and its reset time is stored with the count. Strict; allows up to
    /// 2 × `limit` across a window boundary.
    #[default]
    FixedWindow,
    /// A bucket of `burst` tokens (default `limit`) refilled at `limit` per
    /// window, continuously and lazily (computed on each request from the
    /// elapsed time). A full bucket after idle time allows a burst. Strict.
    TokenBucket,
    /// Sliding window counter: the count of the current aligned window plus
    /// the previous window's count weighted by how much of it still overlaps
    /// the sliding window. Constant state per key; approximate (it can admit
    /// a little more than `limit` in a sliding window when the previous
    /// window's traffic was bunched at its end).
    SlidingWindow,
    /// Generic cell rate algorithm: one theoretical arrival time per key,
    /// emission interval `window / limit`, bursts of up to `burst` (default
    /// `limit`). Admits exactly what a token bucket of the same rate and
    /// burst admits, with one timestamp of state. Strict.
    Gcra,
    /// Sliding log: exact over every sliding window of `window`, at the cost
    /// of one entry per millisecond with a charge; `limit` is capped at
    /// [`Quota::MAX_SLIDING_LOG_LIMIT`](crate::Quota::MAX_SLIDING_LOG_LIMIT). Strict.
    SlidingLog,
}

impl Algorithm {
    /// Every algorithm, in declaration order.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::FixedWindow,
        Algorithm::TokenBucket,
        Algorithm::SlidingWindow,
        Algorithm::Gcra,
        Algorithm::SlidingLog,
    ];

    /// A short stable code, used in store field names and logs.
    pub const fn code(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fw",
            Algorithm::TokenBucket => "tb",
            Algorithm::SlidingWindow => "sw",
            Algorithm::Gcra => "gc",
            Algorithm::SlidingLog => "sl",
        }
    }

    /// A small distinct number per algorithm (the memory store's slot id).
    pub(crate) const fn index(self) -> u64 {
        match self {
            Algorithm::FixedWindow => 0,
            Algorithm::TokenBucket => 1,
            Algorithm::SlidingWindow => 2,
            Algorithm::Gcra => 3,
            Algorithm::SlidingLog => 4,
        }
    }

    /// Whether the quota's `burst` applies (token bucket and GCRA).
    pub const fn has_burst(self) -> bool {
        matches!(self, Algorithm::TokenBucket | Algorithm::Gcra)
    }
}

/// One limit: `limit` units of cost per `window`, enforced by an [`Algorithm`].
/// A [`Policy`] holds the quotas one request is charged against.
///
/// ```
/// use std::num::NonZeroU32;
/// use std::time::Duration;
/// use tower_ratelimit::{Policy, Quota};
/// let per_second = Quota::per_second(NonZeroU32::new(10).unwrap());
/// let per_hour = Quota::new(1000, Duration::from_secs(3600)).unwrap();
/// let policy = Policy::new(per_second).and(per_hour).unwrap();
/// assert_eq!(policy.quotas().len(), 2);
/// ```
///
/// Each quota has its own [`Algorithm`]; one policy may mix them:
///
/// ```
/// # use std::num::NonZeroU32;
/// use std::time::Duration;
/// use tower_ratelimit::{Algorithm, Policy, Quota};
/// let bursty = Quota::per_second(NonZeroU32::new(10).unwrap())
///     .with_algorithm(Algorithm::TokenBucket)?
///     .burst(50)?;
/// let hourly = Quota::new(1_000, Duration::from_secs(3600))?.with_algorithm(Algorithm::SlidingLog)?;
/// let policy = Policy::new(bursty).and(hourly)?;
/// # Ok::<(), tower_ratelimit::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: u64,
    window_ms: u64,
    algorithm: Algorithm,
    /// `None`: the limit (token bucket and GCRA only).
    burst: Option<u64>,
    name: Option<Cow<'static, str>>,
    /// `None`: requests.
    unit: Option<Cow<'static, str>>,
    /// A quota in another unit: admit only while the reservation fits
    /// (else while anything is left).
    must_fit: bool,
    /// The token-bucket / GCRA rate, made from the fields above whenever
    /// they change: a charge reads it instead of recomputing a GCD.
    rate: Rate,
}

impl Quota {
    /// The largest limit or burst a quota accepts: the largest integer an
    /// IETF `RateLimit` header can carry (a structured-field integer has at
    /// most 15 digits), and well inside what the Redis scripts compute
    /// exactly (Lua numbers are doubles, exact up to 2^53).
    pub const MAX_LIMIT: u64 = MAX_LIMIT;
    /// The longest window a quota may have (one year): windows are kept in
    /// milliseconds.
    pub const MAX_WINDOW: Duration = MAX_WINDOW;
    /// The most bytes in a quota's name or unit.
    pub const MAX_NAME_LEN: usize = MAX_NAME_LEN;
    /// The largest limit a [`Algorithm::SlidingLog`] quota accepts: the log
    /// keeps one entry per millisecond with a charge, so a key holds at most
    /// `min(limit, window in ms)` entries (about 40 bytes each in memory,
    /// about 100 in Redis).
    pub const MAX_SLIDING_LOG_LIMIT: u64 = MAX_SLIDING_LOG_LIMIT;

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

    /// `limit` per `window`; errors if `limit` is not within 1 ..= [`Quota::MAX_LIMIT`](crate::Quota::MAX_LIMIT)
    /// or `window` is not within 1 ms ..= [`Quota::MAX_WINDOW`](crate::Quota::MAX_WINDOW).
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
            return Err(ConfigError::new(
                ConfigErrorKind::Quota,
                "a quota's limit must be at least 1",
            ));
        }
        if limit > MAX_LIMIT {
            return Err(ConfigError::new(
                ConfigErrorKind::Quota,
                format!("a quota's limit must be at most {MAX_LIMIT}, got {limit}"),
            ));
        }
        if window < Duration::from_millis(1) || window > MAX_WINDOW {
            return Err(ConfigError::new(
                ConfigErrorKind::Quota,
                format!("a quota's window must be between 1ms and 366 days, got {window:?}"),
            ));
        }
        Ok(Self::from_parts(limit, window.as_millis() as u64))
    }

    const fn from_parts(limit: u64, window_ms: u64) -> Self {
        Self {
            limit,
            window_ms,
            algorithm: Algorithm::FixedWindow,
            burst: None,
            name: None,
            unit: None,
            must_fit: false,
            // The burst is the limit until one is set (`rated` then).
            rate: Rate::capped(limit, window_ms, limit),
        }
    }

    /// Names the quota (the IETF `RateLimit-Policy` name); defaults to its
    /// window, e.g. `"60s"`. Errors unless the name is 1 to [`Quota::MAX_NAME_LEN`](crate::Quota::MAX_NAME_LEN)
    /// printable ASCII characters, which a structured-field string can carry.
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::Quota;
    /// let q = Quota::per_hour(NonZeroU32::new(5000).unwrap()).named("authenticated")?;
    /// assert_eq!(q.name(), "authenticated");
    /// assert!(Quota::per_hour(NonZeroU32::new(5).unwrap()).named("café").is_err());
    /// # Ok::<(), tower_ratelimit::ConfigError>(())
    /// ```
    pub fn named(mut self, name: impl Into<Cow<'static, str>>) -> Result<Self, ConfigError> {
        self.name = Some(sf_string("name", name.into())?);
        Ok(self)
    }

    /// What the quota counts, as the IETF `RateLimit-Policy` field's `qu`
    /// parameter reports it: `"requests"` (the default, left out of the
    /// field), `"content-bytes"`, or a unit of the application's
    /// (`"tokens"`). A request spends its [`cost`](crate::RateLimitLayerBuilder::cost)
    /// in this unit. The same rule as [`named`](Self::named) applies.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_ratelimit::Quota;
    /// let upload = Quota::new(10_000_000, Duration::from_secs(60))?.with_unit("content-bytes")?;
    /// assert_eq!(upload.unit(), "content-bytes");
    /// assert_eq!(Quota::new(5, Duration::from_secs(1))?.unit(), "requests");
    /// # Ok::<(), tower_ratelimit::ConfigError>(())
    /// ```
    pub fn with_unit(mut self, unit: impl Into<Cow<'static, str>>) -> Result<Self, ConfigError> {
        let unit = sf_string("unit", unit.into())?;
        self.unit = (unit != "requests").then_some(unit);
        Ok(self)
    }

    /// What the quota counts (see [`with_unit`](Self::with_unit)).
    pub fn unit(&self) -> &str {
        self.unit.as_deref().unwrap_or("requests")
    }

    /// The unit when it is not requests: what the IETF field's `qu` says.
    pub(crate) fn unit_param(&self) -> Option<&str> {
        self.unit.as_deref()
    }

    /// Whether the quota counts requests, charged the request's
    /// [`cost`](crate::RateLimitLayerBuilder::cost) at its start. A quota in
    /// any other unit is charged the request's
    /// [`reservation`](crate::rate::Settlement::reserve) instead, and
    /// settled to what the request really cost once that is known
    /// ([`Settlement`](crate::rate::Settlement)).
    pub fn counts_requests(&self) -> bool {
        self.unit.is_none()
    }

    /// For a quota in another unit than requests: admit a request only while
    /// its whole reservation (and at least one unit) fits. By default such a
    /// quota admits while it has anything left and charges the whole
    /// reservation, past the limit if need be: what a request really costs
    /// is known only at its end, so the quota is a budget that may be
    /// overdrawn by the requests in flight when it runs out, and pays the
    /// debt back before admitting again. Has no effect on a request quota.
    ///
    /// ```
    /// # use std::time::Duration;
    /// use tower_ratelimit::Quota;
    /// let upload = Quota::new(10_000_000, Duration::from_secs(60))?
    ///     .with_unit("content-bytes")?
    ///     .only_while_the_reservation_fits();
    /// assert!(upload.reservation_must_fit());
    /// # Ok::<(), tower_ratelimit::ConfigError>(())
    /// ```
    pub fn only_while_the_reservation_fits(mut self) -> Self {
        self.must_fit = true;
        self
    }

    /// Whether the quota admits only while the reservation fits (see
    /// [`only_while_the_reservation_fits`](Self::only_while_the_reservation_fits)).
    pub fn reservation_must_fit(&self) -> bool {
        self.must_fit
    }

    /// Sets the algorithm (default [`Algorithm::FixedWindow`]). Errors when the
    /// quota does not suit it: a sliding log above [`Quota::MAX_SLIDING_LOG_LIMIT`](crate::Quota::MAX_SLIDING_LOG_LIMIT),
    /// a burst set on an algorithm without one, or a limit × window too large
    /// for exact arithmetic (see [`Quota::burst`]).
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// use tower_ratelimit::{Algorithm, Quota};
    /// let q = Quota::per_second(NonZeroU32::new(10).unwrap()).with_algorithm(Algorithm::Gcra)?;
    /// assert_eq!(q.algorithm(), Algorithm::Gcra);
    /// let big = Quota::new(50_000, Duration::from_secs(3600))?;
    /// assert!(big.with_algorithm(Algorithm::SlidingLog).is_err());
    /// # Ok::<(), tower_ratelimit::ConfigError>(())
    /// ```
    pub fn with_algorithm(mut self, algorithm: Algorithm) -> Result<Self, ConfigError> {
        self.algorithm = algorithm;
        self.check()?;
        Ok(self)
    }

    /// Sets the burst of a [`Algorithm::TokenBucket`] (its capacity) or
    /// [`Algorithm::Gcra`] quota: the most units admitted at once after idle
    /// time (default: the limit). The rate stays `limit` per window. Errors on
    /// 0, on other algorithms (set the algorithm first), and when burst ×
    /// window (ms) ÷ gcd(limit, window) exceeds 2^52 (e.g. a burst above
    /// 142,000 with a one-year window and a prime limit).
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{Algorithm, Quota};
    /// let q = Quota::per_second(NonZeroU32::new(10).unwrap())
    ///     .with_algorithm(Algorithm::TokenBucket)?
    ///     .burst(50)?;
    /// assert_eq!(q.burst_size(), 50);
    /// assert!(Quota::per_second(NonZeroU32::new(10).unwrap()).burst(50).is_err(), "fixed window has no burst");
    /// # Ok::<(), tower_ratelimit::ConfigError>(())
    /// ```
    pub fn burst(mut self, burst: u64) -> Result<Self, ConfigError> {
        if burst == 0 {
            return Err(ConfigError::new(
                ConfigErrorKind::Quota,
                "a quota's burst must be at least 1",
            ));
        }
        self.burst = Some(burst);
        self.check()?;
        Ok(self.rated())
    }

    /// The quota with its rate made again from its limit, window and burst
    /// (after any of them changed).
    fn rated(mut self) -> Self {
        self.rate = Rate::capped(self.limit, self.window_ms, self.burst_size());
        self
    }

    /// Checks the combination of limit, window, algorithm and burst.
    fn check(&self) -> Result<(), ConfigError> {
        let a = self.algorithm;
        if self.burst.is_some() && !a.has_burst() {
            return Err(ConfigError::new(ConfigErrorKind::Quota, format!(
                "a burst applies to token bucket and GCRA quotas, not {a:?}; call .with_algorithm() before .burst()"
            )));
        }
        match a {
            Algorithm::FixedWindow => Ok(()),
            Algorithm::TokenBucket | Algorithm::Gcra => {
                let burst = self.burst_size();
                if burst > MAX_LIMIT || Rate::of(self.limit, self.window_ms, burst).is_none() {
                    return Err(ConfigError::new(ConfigErrorKind::Quota, format!(
                        "a {a:?} quota of {} per {} with burst {burst} is too large for exact arithmetic (burst x window ms / gcd(limit, window ms) must be at most 2^52); lower the burst or the window",
                        self.limit,
                        format_window(self.window_ms)
                    )));
                }
                Ok(())
            }
            Algorithm::SlidingWindow => {
                if self.limit.saturating_mul(self.window_ms) > EXACT {
                    return Err(ConfigError::new(ConfigErrorKind::Quota, format!(
                        "a sliding window quota needs limit x window ms <= 2^52 for exact arithmetic; {} per {} is too large",
                        self.limit,
                        format_window(self.window_ms)
                    )));
                }
                Ok(())
            }
            Algorithm::SlidingLog => {
                if self.limit > MAX_SLIDING_LOG_LIMIT {
                    return Err(ConfigError::new(ConfigErrorKind::Quota, format!(
                        "a sliding log keeps one entry per charged millisecond, so its limit is capped at {MAX_SLIDING_LOG_LIMIT}; got {} (use the sliding window counter or a token bucket for larger limits)",
                        self.limit
                    )));
                }
                Ok(())
            }
        }
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

    /// The most units admitted at once: the burst of a token bucket or GCRA
    /// quota (default the limit), the limit for every other algorithm. This
    /// is the `limit` its statuses and headers report.
    pub const fn burst_size(&self) -> u64 {
        match self.burst {
            Some(b) => b,
            None => self.limit,
        }
    }

    /// The quota's name: the configured one, or its window (`"1s"`, `"500ms"`, `"1h"`).
    pub fn name(&self) -> Cow<'_, str> {
        match &self.name {
            Some(n) => Cow::Borrowed(n),
            None => Cow::Owned(format_window(self.window_ms)),
        }
    }

    /// The identity of this quota's state within a key: algorithm, window
    /// and unit. Two
    /// quotas with the same slot would share state, so a policy refuses them.
    /// The limit is not part of it, so a changed limit applies to the open window.
    pub(crate) fn slot(&self) -> String {
        match &self.unit {
            None => format!("{}{}", self.algorithm.code(), self.window_ms),
            // Another unit is another count: `fw60000/tokens/`.
            Some(unit) => format!("{}{}/{unit}/", self.algorithm.code(), self.window_ms),
        }
    }

    /// The token-bucket / GCRA rate of the quota in exact fine units.
    pub(crate) fn rate(&self) -> Rate {
        self.rate
    }
}

/// `value` if it can be a structured-field string of at most
/// [`Quota::MAX_NAME_LEN`](crate::Quota::MAX_NAME_LEN) characters: what a quota's `what` (its name, its unit)
/// must be for the IETF fields to carry it.
fn sf_string(what: &str, value: Cow<'static, str>) -> Result<Cow<'static, str>, ConfigError> {
    if value.is_empty()
        || value.len() > MAX_NAME_LEN
        || !value.bytes().all(|b| (b' '..=b'~').contains(&b))
    {
        return Err(ConfigError::new(
            ConfigErrorKind::Quota,
            format!(
                "a quota's {what} must be 1 to {MAX_NAME_LEN} printable ASCII characters \
             (a structured-field string), got {value:?}"
            ),
        ));
    }
    Ok(value)
}

/// Formats a window in the largest whole unit: `1h`, `90s`, `500ms`.
pub(crate) fn format_window(ms: u64) -> String {
    let (n, unit) = if ms.is_multiple_of(3_600_000) {
        (ms / 3_600_000, "h")
    } else if ms.is_multiple_of(60_000) {
        (ms / 60_000, "m")
    } else if ms.is_multiple_of(1_000) {
        (ms / 1_000, "s")
    } else {
        (ms, "ms")
    };
    format!("{n}{unit}")
}

/// A rate of `limit` tokens per window in exact integers, as the token
/// bucket and GCRA compute it (see `algorithm::rate`): with
/// `g = gcd(limit, window_ms)`, one token is `unit = window_ms / g` fine
/// units and `per_ms = limit / g` fine units refill every millisecond, so
/// nothing is ever rounded. A full bucket is `capacity = burst * unit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Rate {
    /// Fine units per token.
    pub(crate) unit: u64,
    /// Fine units refilled per millisecond.
    pub(crate) per_ms: u64,
    /// The most tokens held (the burst).
    pub(crate) burst: u64,
    /// `burst * unit`: a full bucket in fine units.
    pub(crate) capacity: u64,
}

const fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Rate {
    /// `limit` tokens per `window_ms`, at most `burst` held; `None` when the
    /// capacity in fine units would exceed 2^52 (the quota refuses it).
    pub(crate) const fn of(limit: u64, window_ms: u64, burst: u64) -> Option<Rate> {
        let g = gcd(limit, window_ms);
        let unit = window_ms / g;
        let per_ms = limit / g;
        match burst.checked_mul(unit) {
            Some(capacity) if capacity <= EXACT => Some(Rate {
                unit,
                per_ms,
                burst,
                capacity,
            }),
            _ => None,
        }
    }

    /// As [`Rate::of`], holding at most as many tokens as fit 2^52 fine units
    /// (only reachable for quotas scaled down internally, never as configured).
    const fn capped(limit: u64, window_ms: u64, burst: u64) -> Rate {
        let g = gcd(limit, window_ms);
        let unit = window_ms / g;
        let most = EXACT / unit;
        let burst = if burst > most { most } else { burst };
        let burst = if burst == 0 { 1 } else { burst };
        match Rate::of(limit, window_ms, burst) {
            Some(r) => r,
            None => Rate {
                unit,
                per_ms: limit / g,
                burst: 1,
                capacity: unit,
            },
        }
    }
}

/// The quotas one request is charged against, all or nothing, in one store call.
///
/// Cheap to clone (one `Arc`).
///
/// # Changing a client's policy
///
/// State is kept per client key, algorithm and window, not per policy: a
/// client moved to a quota of the same algorithm and window keeps what it
/// has spent. That is exact for the fixed window, sliding window and sliding
/// log. A token bucket or GCRA stores its level in units of its own rate, so
/// after a rate change the level is approximate until the bucket refills.
///
/// # Text form
///
/// Quotas and policies parse from text (`FromStr`) and print back to it
/// (`Display`), for configuration files, admin interfaces and runtime
/// overrides.
///
/// A quota is `LIMIT/WINDOW`, then any of: its algorithm
/// (`fixed-window`, `token-bucket`, `sliding-window`, `gcra`,
/// `sliding-log`), `burst=N`, `unit=U`, `name=N` and `must-fit`, separated
/// by spaces. A window is a whole number of `ms`, `s`, `m`, `h` or `d`. A
/// name or unit with a space, comma, `=` or quote is written as a quoted
/// string (`name="free tier"`, with `\"` and `\\` inside). A policy is its
/// quotas separated by commas.
///
/// ```
/// use tower_ratelimit::{Algorithm, Policy, Quota};
/// let q: Quota = "10/1s gcra burst=50".parse()?;
/// assert_eq!((q.limit(), q.window_ms(), q.algorithm(), q.burst_size()), (10, 1_000, Algorithm::Gcra, 50));
/// let p: Policy = "10/1s, 1000/1h sliding-log".parse()?;
/// assert_eq!(p.to_string(), "10/1s, 1000/1h sliding-log");
/// assert!("10 per second".parse::<Quota>().is_err());
/// # Ok::<(), tower_ratelimit::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Policy {
    inner: Arc<Quotas>,
}

#[derive(Debug)]
struct Quotas {
    quotas: Box<[Quota]>,
    /// Each quota's [`name`](Quota::name), made once: headers name every
    /// quota on every response.
    names: Box<[Cow<'static, str>]>,
    /// Each quota's `X-RateLimit-Limit` value (its [`burst_size`](Quota::burst_size)),
    /// made once for the same reason.
    limits: Box<[http::HeaderValue]>,
    /// What the IETF headers write of the policy, made on first use: the
    /// `RateLimit-Policy` field and each quota's name as a structured-field
    /// string (see `headers::ietf_parts`).
    ietf: OnceLock<(http::HeaderValue, Box<[String]>)>,
    /// What it does instead of a plain refusal: wait, block.
    refusal: Refusal,
    /// A digest of the quotas and the refusal settings, made once: what
    /// caches key a policy by.
    fingerprint: u64,
}

// A policy is its quotas and its refusal settings: the rest is made from them.
impl PartialEq for Quotas {
    fn eq(&self, other: &Self) -> bool {
        self.quotas == other.quotas && self.refusal == other.refusal
    }
}

impl Eq for Quotas {}

impl std::hash::Hash for Quotas {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.fingerprint);
    }
}

impl Policy {
    /// The most quotas one policy may hold (each is charged in the same
    /// atomic call).
    pub const MAX_QUOTAS: usize = MAX_QUOTAS;

    /// A policy of one quota.
    pub fn new(quota: Quota) -> Self {
        Self::of(vec![quota])
    }

    fn of(quotas: Vec<Quota>) -> Self {
        Self::with(quotas, Refusal::default())
    }

    fn with(quotas: Vec<Quota>, refusal: Refusal) -> Self {
        let names = quotas
            .iter()
            .map(|q| match &q.name {
                Some(n) => n.clone(),
                None => Cow::Owned(format_window(q.window_ms)),
            })
            .collect();
        let limits = quotas
            .iter()
            .map(|q| http::HeaderValue::from(q.burst_size()))
            .collect();
        let fingerprint = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            quotas.hash(&mut h);
            refusal.hash(&mut h);
            h.finish()
        };
        Self {
            inner: Arc::new(Quotas {
                quotas: quotas.into(),
                names,
                limits,
                ietf: OnceLock::new(),
                refusal,
                fingerprint,
            }),
        }
    }

    /// A digest of the quotas: equal policies have equal fingerprints.
    pub(crate) fn fingerprint(&self) -> u64 {
        self.inner.fingerprint
    }

    /// Adds a quota; errors past [`Policy::MAX_QUOTAS`](crate::Policy::MAX_QUOTAS) or when two quotas share an
    /// algorithm, window and unit (they would share state). Quotas of
    /// different algorithms or units mix freely and are still charged in
    /// one atomic call.
    ///
    /// ```
    /// # use std::num::NonZeroU32;
    /// use tower_ratelimit::{Policy, Quota};
    /// let n = |n| NonZeroU32::new(n).unwrap();
    /// let p = Policy::new(Quota::per_second(n(10)));
    /// assert!(p.clone().and(Quota::per_second(n(20))).is_err());
    /// assert!(p.clone().and(Quota::per_hour(n(1000))).is_ok());
    /// assert!(p.and(Quota::per_second(n(500)).with_unit("tokens")?).is_ok());
    /// # Ok::<(), tower_ratelimit::ConfigError>(())
    /// ```
    pub fn and(self, quota: Quota) -> Result<Self, ConfigError> {
        let mut v: Vec<Quota> = self.quotas().to_vec();
        if v.len() >= MAX_QUOTAS {
            return Err(ConfigError::new(
                ConfigErrorKind::Quota,
                format!("a policy holds at most {MAX_QUOTAS} quotas"),
            ));
        }
        if v.iter().any(|q| q.slot() == quota.slot()) {
            return Err(ConfigError::new(ConfigErrorKind::Quota, format!(
                "two quotas with the same algorithm, window ({}) and unit ({}) would share state; give them different windows",
                format_window(quota.window_ms),
                quota.unit()
            )));
        }
        v.push(quota);
        Ok(Self::with(v, self.refusal()))
    }

    /// The quotas, in the order they were added.
    pub fn quotas(&self) -> &[Quota] {
        &self.inner.quotas
    }

    /// Its waiting and penalty settings.
    pub(crate) fn refusal(&self) -> Refusal {
        self.inner.refusal
    }

    /// The same quotas with `refusal`.
    #[cfg(any(feature = "wait", feature = "penalty"))]
    pub(crate) fn with_refusal(&self, refusal: Refusal) -> Policy {
        Self::with(self.quotas().to_vec(), refusal)
    }

    /// The quotas' names, in the same order.
    pub(crate) fn names(&self) -> &[Cow<'static, str>] {
        &self.inner.names
    }

    /// Quota `i`'s `X-RateLimit-Limit` value.
    pub(crate) fn limit_header(&self, i: usize) -> Option<&http::HeaderValue> {
        self.inner.limits.get(i)
    }

    /// Where the IETF headers keep what they make of this policy once.
    pub(crate) fn ietf_parts(&self) -> &OnceLock<(http::HeaderValue, Box<[String]>)> {
        &self.inner.ietf
    }
}

impl Policy {
    /// The same quotas with each limit (and burst) multiplied by `fraction`
    /// (at least 1): what one instance admits on its own when the shared store
    /// is down.
    pub(crate) fn scaled(&self, fraction: f64) -> Policy {
        let scale = |n: u64| ((n as f64 * fraction).floor() as u64).max(1);
        let quotas: Vec<Quota> = self
            .quotas()
            .iter()
            .map(|q| {
                Quota {
                    limit: scale(q.limit),
                    burst: q.burst.map(scale),
                    ..q.clone()
                }
                .rated()
            })
            .collect();
        Policy::with(quotas, self.refusal())
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

    fn n(v: u32) -> NonZeroU32 {
        NonZeroU32::new(v).unwrap()
    }

    #[test]
    fn every_algorithm_has_a_distinct_code_and_index_so_slots_stay_unique() {
        let codes: std::collections::HashSet<_> = Algorithm::ALL.iter().map(|a| a.code()).collect();
        let idx: std::collections::HashSet<_> = Algorithm::ALL.iter().map(|a| a.index()).collect();
        assert_eq!((codes.len(), idx.len()), (5, 5));
        assert!(Algorithm::ALL.iter().all(|a| a.index() < 8));
        let slots: std::collections::HashSet<_> = Algorithm::ALL
            .iter()
            .map(|a| Quota::per_second(n(5)).with_algorithm(*a).unwrap().slot())
            .collect();
        assert_eq!(slots.len(), 5);
    }

    #[test]
    fn a_policy_mixes_algorithms_but_refuses_two_quotas_sharing_a_slot() {
        let tb = Quota::per_second(n(10))
            .with_algorithm(Algorithm::TokenBucket)
            .unwrap();
        let p = Policy::new(tb.clone())
            .and(Quota::per_second(n(10)))
            .unwrap();
        assert!(
            p.and(tb.burst(20).unwrap()).is_err(),
            "same algorithm and window"
        );
    }

    #[test]
    fn invalid_algorithm_settings_are_refused_when_the_quota_is_built() {
        let day = Duration::from_secs(86_400);
        assert!(Quota::new(10_000, day)
            .unwrap()
            .with_algorithm(Algorithm::SlidingLog)
            .is_ok());
        let e = Quota::new(10_001, day)
            .unwrap()
            .with_algorithm(Algorithm::SlidingLog)
            .unwrap_err();
        assert!(e.to_string().contains("10000"), "{e}");
        assert!(
            Quota::per_second(n(1)).burst(2).is_err(),
            "fixed window has no burst"
        );
        let tb = Quota::per_second(n(1))
            .with_algorithm(Algorithm::TokenBucket)
            .unwrap();
        assert!(tb.clone().burst(0).is_err());
        let bursty = tb.burst(5).unwrap();
        assert!(
            bursty.with_algorithm(Algorithm::FixedWindow).is_err(),
            "a burst left on a fixed window"
        );
        // 2^52 / 1 year in ms is about 142,000: a prime limit cannot be reduced.
        let year = Duration::from_secs(365 * 86_400);
        assert!(Quota::new(1_000_003, year)
            .unwrap()
            .with_algorithm(Algorithm::Gcra)
            .is_err());
        // A limit sharing factors with the window reduces: 1,000,000 per year is fine.
        assert!(Quota::new(1_000_000, year)
            .unwrap()
            .with_algorithm(Algorithm::Gcra)
            .is_ok());
        assert!(Quota::new(1_000_000, year)
            .unwrap()
            .with_algorithm(Algorithm::SlidingWindow)
            .is_err());
        assert!(Quota::new(MAX_LIMIT + 1, Duration::from_secs(1)).is_err());
    }

    #[test]
    fn burst_size_defaults_to_the_limit() {
        let q = Quota::per_minute(n(7))
            .with_algorithm(Algorithm::Gcra)
            .unwrap();
        assert_eq!(q.burst_size(), 7);
        assert_eq!(q.burst(9).unwrap().burst_size(), 9);
    }

    #[test]
    fn a_rate_that_does_not_divide_its_window_is_exact_in_fine_units() {
        // 3 per second: one token is 1000 units, 3 units refill per ms.
        let r = Rate::of(3, 1_000, 3).unwrap();
        assert_eq!((r.unit, r.per_ms, r.capacity), (1_000, 3, 3_000));
        // 1000 per hour reduces by gcd 1000.
        let r = Rate::of(1_000, 3_600_000, 1_000).unwrap();
        assert_eq!((r.unit, r.per_ms), (3_600, 1));
        assert!(
            Rate::of(7, 1 << 40, 1 << 20).is_none(),
            "past 2^52 fine units"
        );
        assert!(Rate::of(7, 1 << 20, 1 << 20).is_some());
    }

    #[test]
    fn a_name_must_be_a_structured_field_string() {
        let q = Quota::per_second(n(1));
        assert!(
            q.clone().named("tier \"gold\"").is_ok(),
            "quotes are escaped"
        );
        for bad in ["", "caf\u{e9}", "tab\there", "new\nline"] {
            assert!(q.clone().named(bad).is_err(), "{bad:?}");
        }
        assert!(q.clone().named("x".repeat(MAX_NAME_LEN)).is_ok());
        assert!(q.named("x".repeat(MAX_NAME_LEN + 1)).is_err());
    }

    #[test]
    fn a_unit_follows_the_name_rule_and_requests_is_the_default() {
        let q = Quota::per_second(n(1));
        assert_eq!(q.unit(), "requests");
        let bytes = q.clone().with_unit("content-bytes").unwrap();
        assert_eq!(
            (bytes.unit(), bytes.unit_param()),
            ("content-bytes", Some("content-bytes"))
        );
        let requests = bytes.with_unit("requests").unwrap();
        assert_eq!(
            requests.unit_param(),
            None,
            "the default is left out of the field"
        );
        assert_eq!(requests, q);
        for bad in ["", "tok\u{e9}ns", "x".repeat(MAX_NAME_LEN + 1).as_str()] {
            assert!(q.clone().with_unit(bad.to_owned()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_largest_limit_fits_a_structured_field_integer() {
        assert!(Quota::new(MAX_LIMIT, Duration::from_secs(1)).is_ok());
        assert!(Quota::new(MAX_LIMIT + 1, Duration::from_secs(1)).is_err());
        assert_eq!(MAX_LIMIT.to_string().len(), 15);
    }

    #[test]
    fn window_names_use_the_largest_whole_unit() {
        assert_eq!(format_window(3_600_000), "1h");
        assert_eq!(format_window(90_000), "90s");
        assert_eq!(format_window(120_000), "2m");
        assert_eq!(format_window(500), "500ms");
    }
}
