//! Time as the limiter sees it, from an injectable [`Clock`]: Unix
//! milliseconds for windows, and a monotonic instant for cool-downs and
//! expiries (the circuit breaker, the deny cache, the coordinated mode's
//! staleness), which a step of the wall clock must not stretch or cut.
//!
//! ```
//! use std::time::Duration;
//! use tower_ratelimit::clock::{Clock, ManualClock};
//! let clock = ManualClock::new(1_000);
//! clock.advance(Duration::from_millis(500));
//! assert_eq!(clock.now_ms(), 1_500);
//! ```

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// A source of wall-clock time in Unix milliseconds.
///
/// The application, not the store, owns time: the layer reads the clock once
/// per request and passes `now` to the store, so every decision and header of a
/// request agree, and tests move time instead of sleeping.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch: windows are counted in them.
    fn now_ms(&self) -> u64;

    /// A monotonic instant: cool-downs and expiries are counted in them. The
    /// default is tokio's clock, which paused time in tests moves too.
    fn monotonic(&self) -> Instant {
        Instant::now()
    }
}

/// The system's wall clock (the default).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }
}

/// A clock that only moves when told to; clones share one time.
///
/// [`advance`](Self::advance) moves both its wall time and its monotonic
/// instant, so it ends cool-downs as well as windows;
/// [`set`](Self::set) moves only the wall time, as a wall-clock step would.
///
/// ```
/// use std::time::Duration;
/// use tower_ratelimit::clock::{Clock, ManualClock};
/// let clock = ManualClock::new(10_000);
/// let before = clock.monotonic();
/// clock.set(0); // the wall clock steps back
/// clock.advance(Duration::from_secs(1));
/// assert_eq!(clock.now_ms(), 1_000);
/// assert_eq!(clock.monotonic() - before, Duration::from_secs(1));
/// ```
#[derive(Clone)]
pub struct ManualClock(Arc<Manual>);

struct Manual {
    now_ms: AtomicU64,
    /// Milliseconds advanced since `start`.
    advanced_ms: AtomicU64,
    start: Instant,
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new(0)
    }
}

impl ManualClock {
    /// A clock standing at `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        Self(Arc::new(Manual {
            now_ms: AtomicU64::new(now_ms),
            advanced_ms: AtomicU64::new(0),
            start: Instant::now(),
        }))
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.0.now_ms.fetch_add(ms, Ordering::SeqCst);
        self.0.advanced_ms.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the clock to `now_ms` (forwards or backwards: a wall-clock step).
    pub fn set(&self, now_ms: u64) {
        self.0.now_ms.store(now_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.now_ms.load(Ordering::SeqCst)
    }

    fn monotonic(&self) -> Instant {
        self.0.start + Duration::from_millis(self.0.advanced_ms.load(Ordering::SeqCst))
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ManualClock").field(&self.now_ms()).finish()
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now_ms(&self) -> u64 {
        (**self).now_ms()
    }

    fn monotonic(&self) -> Instant {
        (**self).monotonic()
    }
}
