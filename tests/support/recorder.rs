//! The one metrics recorder of a test binary: a process has one global
//! recorder, and every module of the binary shares it. Tests tell their
//! series apart by the `limiter` label, so each test gives its limiters
//! names no other test in the binary uses.
//!
//! [`take`] reads and resets only the series of the limiter it names: a
//! test that reads its counters never drains another test's, whichever
//! test runs beside it.
#![allow(dead_code)]

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_util::debugging::DebugValue;
use metrics_util::registry::{AtomicStorage, Registry};
use metrics_util::{CompositeKey, MetricKind};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

type Series = Registry<Key, AtomicStorage>;

/// The global recorder: every series in one registry.
struct Shared(Arc<Series>);

impl Recorder for Shared {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.0
            .get_or_create_counter(key, |c| Counter::from_arc(c.clone()))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.0
            .get_or_create_gauge(key, |g| Gauge::from_arc(g.clone()))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.0
            .get_or_create_histogram(key, |h| Histogram::from_arc(h.clone()))
    }
}

fn series() -> &'static Series {
    static SERIES: OnceLock<Arc<Series>> = OnceLock::new();
    SERIES.get_or_init(|| {
        let series = Arc::new(Registry::atomic());
        metrics::set_global_recorder(Shared(Arc::clone(&series)))
            .expect("the test binary installs no other global recorder");
        series
    })
}

/// Installs the recorder (once per binary). Call it before building the
/// limiters whose metrics a test reads: a limiter built earlier may keep
/// handles to the no-op recorder.
pub fn install() {
    series();
}

fn of(key: &Key, limiter: &str) -> bool {
    key.labels()
        .any(|l| l.key() == "limiter" && l.value() == limiter)
}

/// Every series of `limiter`: counters and histograms since the last
/// `take` of that limiter (they are reset), gauges as last set.
pub fn take(limiter: &str) -> Vec<(CompositeKey, DebugValue)> {
    let series = series();
    let mut out = Vec::new();
    series.visit_counters(|key, counter| {
        if of(key, limiter) {
            let n = counter.swap(0, Ordering::SeqCst);
            out.push((
                CompositeKey::new(MetricKind::Counter, key.clone()),
                DebugValue::Counter(n),
            ));
        }
    });
    series.visit_gauges(|key, gauge| {
        if of(key, limiter) {
            let value = f64::from_bits(gauge.load(Ordering::SeqCst));
            out.push((
                CompositeKey::new(MetricKind::Gauge, key.clone()),
                DebugValue::Gauge(value.into()),
            ));
        }
    });
    series.visit_histograms(|key, histogram| {
        if of(key, limiter) {
            let mut values = Vec::new();
            histogram.clear_with(|xs| values.extend_from_slice(xs));
            out.push((
                CompositeKey::new(MetricKind::Histogram, key.clone()),
                DebugValue::Histogram(values.into_iter().map(Into::into).collect()),
            ));
        }
    });
    out
}
