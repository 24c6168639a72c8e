//! The concurrency limiter's metrics, in the style of [`crate::metrics`]:
//! every series carries the label `limiter` (the layer's name).

use crate::metrics::{Series, StoreMetrics};
use metrics::{gauge, Gauge};
use std::ops::Deref;

/// The concurrency limiter's series.
const CONCURRENCY: Series = Series {
    prefix: "concurrency",
    decide: "acquire",
    off_path: "release",
    off_path_total: "releases_total",
};

/// Handles for one concurrency limiter: the ones every store-backed limiter
/// has, and the in-flight gauge.
pub(crate) struct Metrics {
    store: StoreMetrics,
    pub(crate) in_flight: Gauge,
}

impl Metrics {
    pub(crate) fn new(name: &str) -> Self {
        Self {
            store: StoreMetrics::new(&CONCURRENCY, name),
            in_flight: gauge!("concurrency_in_flight", "limiter" => name.to_owned()),
        }
    }
}

impl Deref for Metrics {
    type Target = StoreMetrics;

    fn deref(&self) -> &StoreMetrics {
        &self.store
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::registered;

    #[test]
    fn the_concurrency_limiter_registers_the_documented_series() {
        let got = registered(|| {
            let m = Metrics::new("api");
            m.store_error("timeout");
        });
        assert_eq!(
            got,
            [
                "concurrency_breaker_state{}",
                "concurrency_decisions_total{outcome=allowed}",
                "concurrency_decisions_total{outcome=exempt}",
                "concurrency_decisions_total{outcome=key_error}",
                "concurrency_decisions_total{outcome=rejected}",
                "concurrency_in_flight{}",
                "concurrency_releases_total{result=failed}",
                "concurrency_releases_total{result=ok}",
                "concurrency_shadow_rejections_total{}",
                "concurrency_store_duration_seconds{op=acquire}",
                "concurrency_store_duration_seconds{op=release}",
                "concurrency_store_errors_total{kind=timeout}",
                "concurrency_store_failure_decisions_total{action=closed}",
                "concurrency_store_failure_decisions_total{action=local}",
                "concurrency_store_failure_decisions_total{action=open}",
            ]
        );
    }
}
