//! Metrics through the [`metrics`](https://docs.rs/metrics) facade: no exporter
//! is forced on users; install any recorder (e.g. Prometheus) to collect them.
//!
//! Every series carries the label `limiter` (the layer's name):
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `ratelimit_decisions_total` | counter | `outcome` = `allowed`, `rejected`, `exempt`, `key_error` | requests by outcome |
//! | `ratelimit_shadow_rejections_total` | counter | | would-be rejections admitted in shadow mode |
//! | `ratelimit_deny_cache_hits_total` | counter | | rejections answered by the local deny cache |
//! | `ratelimit_store_duration_seconds` | histogram | `op` = `charge`, `refund` | store call latency (network stores) |
//! | `ratelimit_store_errors_total` | counter | `kind` (see [`StoreError::kind`](crate::StoreError::kind)) | store failures |
//! | `ratelimit_store_failure_decisions_total` | counter | `action` = `open`, `closed`, `local` | requests decided by the failure policy |
//! | `ratelimit_breaker_state` | gauge | | 0 closed, 1 open (for any failure domain, e.g. one shard), 2 half-open |
//! | `ratelimit_refunds_total` | counter | `result` = `ok`, `failed` | refunds of free responses |

use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};
use std::sync::Arc;

/// Handles for one limiter, registered on first use (after the application
/// has installed its recorder).
pub(crate) struct Metrics {
    name: Arc<str>,
    pub(crate) allowed: Counter,
    pub(crate) rejected: Counter,
    pub(crate) exempt: Counter,
    pub(crate) key_error: Counter,
    pub(crate) shadow_rejected: Counter,
    pub(crate) deny_cache_hits: Counter,
    pub(crate) charge_duration: Histogram,
    pub(crate) refund_duration: Histogram,
    pub(crate) fail_open: Counter,
    pub(crate) fail_closed: Counter,
    pub(crate) fail_local: Counter,
    pub(crate) breaker_state: Gauge,
    pub(crate) refunds_ok: Counter,
    pub(crate) refunds_failed: Counter,
}

impl Metrics {
    pub(crate) fn new(name: &str) -> Self {
        let l = name.to_owned();
        let decision = |outcome: &'static str| counter!("ratelimit_decisions_total", "limiter" => l.clone(), "outcome" => outcome);
        let failure = |action: &'static str| counter!("ratelimit_store_failure_decisions_total", "limiter" => l.clone(), "action" => action);
        Self {
            name: Arc::from(name),
            allowed: decision("allowed"),
            rejected: decision("rejected"),
            exempt: decision("exempt"),
            key_error: decision("key_error"),
            shadow_rejected: counter!("ratelimit_shadow_rejections_total", "limiter" => l.clone()),
            deny_cache_hits: counter!("ratelimit_deny_cache_hits_total", "limiter" => l.clone()),
            charge_duration: histogram!("ratelimit_store_duration_seconds", "limiter" => l.clone(), "op" => "charge"),
            refund_duration: histogram!("ratelimit_store_duration_seconds", "limiter" => l.clone(), "op" => "refund"),
            fail_open: failure("open"),
            fail_closed: failure("closed"),
            fail_local: failure("local"),
            breaker_state: gauge!("ratelimit_breaker_state", "limiter" => l.clone()),
            refunds_ok: counter!("ratelimit_refunds_total", "limiter" => l.clone(), "result" => "ok"),
            refunds_failed: counter!("ratelimit_refunds_total", "limiter" => l, "result" => "failed"),
        }
    }

    /// Store errors are rare: their `kind` label is registered when they happen.
    pub(crate) fn store_error(&self, kind: &'static str) {
        counter!("ratelimit_store_errors_total", "limiter" => self.name.to_string(), "kind" => kind).increment(1);
    }
}
