//! The concurrency limiter's metrics, in the style of [`crate::metrics`]:
//! every series carries the label `limiter` (the layer's name).

use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};
use std::sync::Arc;

/// Handles for one concurrency limiter, registered on first use.
pub(crate) struct Metrics {
    name: Arc<str>,
    pub(crate) allowed: Counter,
    pub(crate) rejected: Counter,
    pub(crate) exempt: Counter,
    pub(crate) key_error: Counter,
    pub(crate) shadow_rejected: Counter,
    pub(crate) in_flight: Gauge,
    pub(crate) acquire_duration: Histogram,
    pub(crate) release_duration: Histogram,
    pub(crate) fail_open: Counter,
    pub(crate) fail_closed: Counter,
    pub(crate) fail_local: Counter,
    pub(crate) breaker_state: Gauge,
    pub(crate) releases_ok: Counter,
    pub(crate) releases_failed: Counter,
}

impl Metrics {
    pub(crate) fn new(name: &str) -> Self {
        let l = name.to_owned();
        let decision = |outcome: &'static str| counter!("concurrency_decisions_total", "limiter" => l.clone(), "outcome" => outcome);
        let failure = |action: &'static str| counter!("concurrency_store_failure_decisions_total", "limiter" => l.clone(), "action" => action);
        Self {
            name: Arc::from(name),
            allowed: decision("allowed"),
            rejected: decision("rejected"),
            exempt: decision("exempt"),
            key_error: decision("key_error"),
            shadow_rejected: counter!("concurrency_shadow_rejections_total", "limiter" => l.clone()),
            in_flight: gauge!("concurrency_in_flight", "limiter" => l.clone()),
            acquire_duration: histogram!("concurrency_store_duration_seconds", "limiter" => l.clone(), "op" => "acquire"),
            release_duration: histogram!("concurrency_store_duration_seconds", "limiter" => l.clone(), "op" => "release"),
            fail_open: failure("open"),
            fail_closed: failure("closed"),
            fail_local: failure("local"),
            breaker_state: gauge!("concurrency_breaker_state", "limiter" => l.clone()),
            releases_ok: counter!("concurrency_releases_total", "limiter" => l.clone(), "result" => "ok"),
            releases_failed: counter!("concurrency_releases_total", "limiter" => l, "result" => "failed"),
        }
    }

    /// Store errors are rare: their `kind` label is registered when they happen.
    pub(crate) fn store_error(&self, kind: &'static str) {
        counter!("concurrency_store_errors_total", "limiter" => self.name.to_string(), "kind" => kind).increment(1);
    }
}
