//! How far a layer's clock is from its store's. Windows are counted by the
//! layer's clock, and every TTL the Redis store sets is relative to it, so
//! an offset deletes nothing; but instances whose clocks disagree disagree
//! on windows, and an offset that grows is worth knowing about. Measured
//! when the layer connects and every minute after, exported as a gauge,
//! and warned about past [`WARN_OFFSET_MS`].

use crate::clock::Clock;
use crate::periodic::Periodic;
use crate::store::Store;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// Past this offset (ms, either way) each measurement logs a warning.
pub(crate) const WARN_OFFSET_MS: u64 = 500;

/// How often the offset is measured while the layer lives.
const EVERY: Duration = Duration::from_secs(60);

/// A layer's clock and store, measured against each other.
pub(crate) struct Skew {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    limiter: String,
    periodic: Periodic,
    /// When it was last measured: the first periodic measurement is
    /// skipped right after [`connect`](crate::RateLimitLayer::connect)'s.
    last: Mutex<Option<Instant>>,
}

impl Skew {
    pub(crate) fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>, limiter: &str) -> Self {
        Self {
            store,
            clock,
            limiter: limiter.to_owned(),
            periodic: Periodic::default(),
            last: Mutex::new(None),
        }
    }

    /// Measures every minute from now on, once a tokio runtime runs here
    /// (at the latest on the first request).
    pub(crate) fn start(self: &Arc<Self>) {
        self.periodic.start(self, EVERY, |this| async move {
            let recent = this.last().is_some_and(|at| at.elapsed() < EVERY / 2);
            if !recent {
                this.measure().await;
            }
        });
    }

    /// The layer's clock minus the store's, in ms, midway through the call
    /// that read the store's (`None`: the store has no clock, or did not
    /// answer). Sets the gauge, and warns past [`WARN_OFFSET_MS`].
    pub(crate) async fn measure(&self) -> Option<i64> {
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        let before = self.clock.now_ms();
        let theirs = match self.store.time().await {
            Ok(Some(t)) => t,
            Ok(None) => return None,
            Err(e) => {
                tracing::debug!(limiter = %self.limiter, error = %e, "could not read the store's clock");
                return None;
            }
        };
        let after = self.clock.now_ms();
        let ours = before / 2 + after / 2 + (before % 2 + after % 2) / 2;
        let offset = i64::try_from(ours)
            .unwrap_or(i64::MAX)
            .saturating_sub(i64::try_from(theirs).unwrap_or(i64::MAX));
        metrics::gauge!("ratelimit_store_clock_offset_seconds", "limiter" => self.limiter.clone())
            .set(offset as f64 / 1e3);
        if offset.unsigned_abs() > WARN_OFFSET_MS {
            let (by, way) = (
                offset.unsigned_abs(),
                if offset > 0 { "ahead of" } else { "behind" },
            );
            tracing::warn!(
                limiter = %self.limiter,
                offset_ms = offset,
                "the rate limiter's clock is {by} ms {way} its store's (Redis TIME): windows are \
                 counted by the application's clock, so instances whose clocks differ disagree \
                 on them; keep every host's clock in sync (NTP), or use TimeSource::Redis"
            );
        }
        Some(offset)
    }

    fn last(&self) -> Option<Instant> {
        *self.last.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
