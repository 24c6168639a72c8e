//! Metrics through the [`metrics`](https://docs.rs/metrics) facade: no exporter
//! is forced on users; install any recorder (e.g. Prometheus) to collect them.
//!
//! ```
//! # use std::num::NonZeroU32;
//! use tower::{Layer, ServiceExt};
//! use tower_ratelimit::{Quota, RateLimitLayer};
//! let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
//! let layer = RateLimitLayer::builder()
//!     .name("api")
//!     .quota(Quota::per_second(NonZeroU32::new(10).unwrap()))
//!     .build()?;
//! let hello = tower::service_fn(|_: http::Request<()>| async {
//!     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
//! });
//! # tokio::runtime::Runtime::new()?.block_on(async {
//! layer.layer(hello).oneshot(http::Request::new(())).await?;
//! # Ok::<(), Box<dyn std::error::Error>>(()) })?;
//! let text = prometheus.render();
//! assert!(text.contains(r#"ratelimit_decisions_total{limiter="api",outcome="allowed"} 1"#));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Every series carries the label `limiter`, the name of the layer it
//! belongs to (its builder's `name`), so that several limiters in one
//! process, or sharing one store, report apart. The rate limiter's series:
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `ratelimit_decisions_total` | counter | `outcome` = `allowed`, `rejected`, `exempt`, `key_error`, `overloaded` | requests by outcome (`overloaded`: refused with 503 because this instance queued more charges than its store answers) |
//! | `ratelimit_shadow_rejections_total` | counter | | would-be rejections admitted in shadow mode |
//! | `ratelimit_deny_cache_hits_total` | counter | | rejections answered by the local deny cache |
//! | `ratelimit_store_duration_seconds` | histogram | `op` = `charge`, `refund` | store call latency (network stores; `refund`: any settlement) |
//! | `ratelimit_store_errors_total` | counter | `kind` (see [`StoreError::kind`](crate::StoreError::kind)) | store failures |
//! | `ratelimit_store_failure_decisions_total` | counter | `action` = `open`, `closed`, `local` | requests decided by the failure policy |
//! | `ratelimit_breaker_state` | gauge | | 0 closed, 1 open (for any failure domain, e.g. one shard), 2 half-open |
//! | `ratelimit_refunds_total` | counter | `result` = `ok`, `failed` | settlements sent to the store after the response: a free response's refund, or the difference the cost it reported makes |
//! | `ratelimit_memory_evictions_total` | counter | | live keys a full [`MemoryStore`](crate::store::MemoryStore) evicted (the least used of a sample) to make room for a new key of this limiter; when limiters share the store, the key evicted may be another's. A [shadow policy](crate::rate::Limits::shadow)'s keys count under `limiter` = the name followed by `~shadow` |
//! | `ratelimit_store_clock_offset_seconds` | gauge | | the layer's clock minus its store's ([`Store::time`](crate::store::Store::time), Redis `TIME`), measured at connect and every minute (network stores) |
//!
//! Series of the optional features, registered only when the feature is
//! in use:
//!
//! | name | type | labels | feature | meaning |
//! |---|---|---|---|---|
//! | `ratelimit_shadow_policy_rejections_total` | counter | `policy` (its text) | `runtime-limits` | would-be rejections of the policy running in [shadow](crate::rate::Limits::shadow) |
//! | `ratelimit_shadow_policy_errors_total` | counter | | `runtime-limits` | charges of the shadow policy that the store failed |
//! | `ratelimit_shared_limits_poll_failures_total` | counter | | `runtime-limits`, `redis` | failed reads of the [shared limits](crate::rate::SharedLimits) from Redis (the last ones read stay) |
//! | `ratelimit_coordinated_sync_failures_total` | counter | | `coordinated` | [coordinated](crate::store::Coordinated) syncs that failed for some keys |
//! | `ratelimit_advice_peak` | gauge | `tier` (the policy's text) | `advisor` | the [advisor](crate::rate::Advisor)'s report, set as each window closes: the highest usage of one of the tier's heavy keys in one window |
//! | `ratelimit_advice_current_limit` | gauge | `tier` | `advisor` | the tier's limit per advisor window |
//! | `ratelimit_advice_suggested_limit` | gauge | `tier` | `advisor` | the limit the tier's usage suggests (its percentile times the headroom) |
//! | `ratelimit_advice_fleet_failures_total` | counter | | `advisor`, `redis` | sends of closed windows to the fleet's report in Redis that failed (the report lacks them) |
//! | `ratelimit_wait_seconds` | histogram | | `wait` | how long requests the store booked for a later turn [waited](crate::rate::Wait) for it |
//! | `ratelimit_waiting` | gauge | | `wait` | requests this instance holds waiting for their turn (set as a request starts waiting) |
//! | `ratelimit_wait_cancelled_total` | counter | | `wait` | waiting requests whose client went away (or whose layer closed its waiters) before their turn: the turn was given back |
//! | `ratelimit_penalty_blocks_total` | counter | | `penalty` | refusals that put a key in its policy's [penalty box](crate::rate::Penalty), as this instance saw them |
//! | `ratelimit_penalty_blocked_total` | counter | | `penalty` | requests refused because their key was in a penalty box (also counted as `rejected` decisions) |
//!
//! The concurrency limiter and the load shedder report under their own
//! prefixes, `concurrency_` and `load_shed_`, with the same `limiter`
//! label: their series are listed in [`crate::concurrency`](crate::concurrency#metrics)
//! and [`crate::shed`](crate::shed#metrics).

use crate::error::StoreError;
use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};
use std::sync::Arc;
use std::time::Instant;

/// The names of a store-backed limiter's series: `{prefix}_decisions_total`,
/// `{prefix}_store_duration_seconds` with `op` = `decide` or `off_path`, and
/// `{prefix}_{off_path_total}` for the calls no request waits for.
pub(crate) struct Series {
    prefix: &'static str,
    /// The `op` label of the call that decides (`charge`, `acquire`).
    decide: &'static str,
    /// The `op` label of the call run off the response path (`refund`, `release`).
    off_path: &'static str,
    /// That call's counter, after the prefix (`refunds_total`, `releases_total`).
    off_path_total: &'static str,
    /// Whether the limiter has a deny cache (`{prefix}_deny_cache_hits_total`).
    deny_cache: bool,
    /// Whether it counts requests in flight (`{prefix}_in_flight`, and an
    /// adaptive limit's `{prefix}_limit`).
    in_flight: bool,
    /// Whether its decisions are counted here (`{prefix}_decisions_total`,
    /// `{prefix}_shadow_rejections_total`), rather than by the middleware.
    decisions: bool,
    /// Whether it queues charges that may overflow
    /// (`{prefix}_decisions_total{outcome="overloaded"}`).
    overloads: bool,
}

/// The rate limiter's series.
pub(crate) const RATE_LIMIT: Series = Series {
    prefix: "ratelimit",
    decide: "charge",
    off_path: "refund",
    off_path_total: "refunds_total",
    deny_cache: true,
    in_flight: false,
    decisions: true,
    overloads: true,
};

/// The concurrency limiter's series.
pub(crate) const CONCURRENCY: Series = Series {
    prefix: "concurrency",
    decide: "acquire",
    off_path: "release",
    off_path_total: "releases_total",
    deny_cache: false,
    in_flight: true,
    decisions: true,
    overloads: false,
};

/// The fleet load shedder's store series: its decisions are counted per
/// class by the shedder's own metrics.
pub(crate) const FLEET_SHED: Series = Series {
    prefix: "load_shed_fleet",
    decide: "acquire",
    off_path: "release",
    off_path_total: "releases_total",
    deny_cache: false,
    in_flight: false,
    decisions: false,
    overloads: false,
};

/// Handles shared by the store-backed limiters (the rate limiter and the
/// concurrency limiter), registered on first use (after the application has
/// installed its recorder).
pub(crate) struct StoreMetrics {
    prefix: &'static str,
    name: Arc<str>,
    pub(crate) allowed: Counter,
    pub(crate) rejected: Counter,
    pub(crate) exempt: Counter,
    pub(crate) key_error: Counter,
    /// Requests refused because this instance queued more for its store
    /// than the store answers (never admitted without limit).
    pub(crate) overloaded: Counter,
    pub(crate) shadow_rejected: Counter,
    pub(crate) decide_duration: Histogram,
    off_path_duration: Histogram,
    pub(crate) fail_open: Counter,
    pub(crate) fail_closed: Counter,
    pub(crate) fail_local: Counter,
    pub(crate) breaker_state: Gauge,
    off_path_ok: Counter,
    pub(crate) off_path_failed: Counter,
    /// Rejections answered by the deny cache (a no-op handle without one).
    pub(crate) deny_cache_hits: Counter,
    /// Requests in flight (a no-op handle for a limiter that does not count them).
    pub(crate) in_flight: Gauge,
    /// Where an adaptive limit stands (registered with `in_flight`).
    pub(crate) limit: Gauge,
}

impl StoreMetrics {
    pub(crate) fn new(series: &Series, name: &str) -> Self {
        let p = series.prefix;
        let l = name.to_owned();
        let decision = |outcome: &'static str| {
            if series.decisions {
                counter!(format!("{p}_decisions_total"), "limiter" => l.clone(), "outcome" => outcome)
            } else {
                Counter::noop()
            }
        };
        let failure = |action: &'static str| counter!(format!("{p}_store_failure_decisions_total"), "limiter" => l.clone(), "action" => action);
        let duration = |op: &'static str| histogram!(format!("{p}_store_duration_seconds"), "limiter" => l.clone(), "op" => op);
        let off_path = |result: &'static str| counter!(format!("{p}_{}", series.off_path_total), "limiter" => l.clone(), "result" => result);
        Self {
            prefix: p,
            name: Arc::from(name),
            allowed: decision("allowed"),
            rejected: decision("rejected"),
            exempt: decision("exempt"),
            key_error: decision("key_error"),
            overloaded: if series.overloads {
                decision("overloaded")
            } else {
                Counter::noop()
            },
            shadow_rejected: if series.decisions {
                counter!(format!("{p}_shadow_rejections_total"), "limiter" => l.clone())
            } else {
                Counter::noop()
            },
            decide_duration: duration(series.decide),
            off_path_duration: duration(series.off_path),
            fail_open: failure("open"),
            fail_closed: failure("closed"),
            fail_local: failure("local"),
            breaker_state: gauge!(format!("{p}_breaker_state"), "limiter" => l.clone()),
            off_path_ok: off_path("ok"),
            off_path_failed: off_path("failed"),
            deny_cache_hits: if series.deny_cache {
                counter!(format!("{p}_deny_cache_hits_total"), "limiter" => l.clone())
            } else {
                Counter::noop()
            },
            in_flight: if series.in_flight {
                gauge!(format!("{p}_in_flight"), "limiter" => l.clone())
            } else {
                Gauge::noop()
            },
            limit: if series.in_flight {
                gauge!(format!("{p}_limit"), "limiter" => l.clone())
            } else {
                Gauge::noop()
            },
        }
    }

    /// Store errors are rare: their `kind` label is registered when they happen.
    pub(crate) fn store_error(&self, kind: &'static str) {
        counter!(format!("{}_store_errors_total", self.prefix), "limiter" => self.name.to_string(), "kind" => kind).increment(1);
    }

    /// Records how an off-path call (a refund, a slot release) ended; returns
    /// its error, for the caller to log in its own words.
    pub(crate) fn off_path_done(
        &self,
        result: Result<(), StoreError>,
        started: Option<Instant>,
    ) -> Result<(), StoreError> {
        if let Some(t) = started {
            self.off_path_duration.record(t.elapsed().as_secs_f64());
        }
        match &result {
            Ok(()) => self.off_path_ok.increment(1),
            Err(err) => {
                self.off_path_failed.increment(1);
                self.store_error(err.kind());
            }
        }
        result
    }
}

/// Every series the metrics built by `build` register, as
/// `name{label=value,...}` without the `limiter` label, sorted (for tests).
/// Panics on a series whose `limiter` label is not `limiter`.
#[cfg(test)]
pub(crate) fn registered(limiter: &str, build: impl FnOnce()) -> Vec<String> {
    let mut out: Vec<String> = recorded(build)
        .into_iter()
        .map(|(_, k)| {
            let theirs: Vec<&str> = k
                .labels()
                .filter(|l| l.key() == "limiter")
                .map(|l| l.value())
                .collect();
            assert_eq!(theirs, [limiter], "the `limiter` label of {k:?}");
            let labels: Vec<String> = k
                .labels()
                .filter(|l| l.key() != "limiter")
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            format!("{}{{{}}}", k.name(), labels.join(","))
        })
        .collect();
    out.sort();
    out
}

/// Every series the metrics built by `build` register: its type and key.
#[cfg(test)]
fn recorded(build: impl FnOnce()) -> Vec<(&'static str, metrics::Key)> {
    use metrics_util::MetricKind;
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, build);
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, ..)| {
            let kind = match k.kind() {
                MetricKind::Counter => "counter",
                MetricKind::Gauge => "gauge",
                MetricKind::Histogram => "histogram",
            };
            (kind, k.key().clone())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    fn series(s: &Series) -> Vec<String> {
        registered("api", || StoreMetrics::new(s, "api").store_error("timeout"))
    }

    #[test]
    fn each_store_backed_limiter_registers_the_documented_series() {
        assert_eq!(
            series(&RATE_LIMIT),
            [
                "ratelimit_breaker_state{}",
                "ratelimit_decisions_total{outcome=allowed}",
                "ratelimit_decisions_total{outcome=exempt}",
                "ratelimit_decisions_total{outcome=key_error}",
                "ratelimit_decisions_total{outcome=overloaded}",
                "ratelimit_decisions_total{outcome=rejected}",
                "ratelimit_deny_cache_hits_total{}",
                "ratelimit_refunds_total{result=failed}",
                "ratelimit_refunds_total{result=ok}",
                "ratelimit_shadow_rejections_total{}",
                "ratelimit_store_duration_seconds{op=charge}",
                "ratelimit_store_duration_seconds{op=refund}",
                "ratelimit_store_errors_total{kind=timeout}",
                "ratelimit_store_failure_decisions_total{action=closed}",
                "ratelimit_store_failure_decisions_total{action=local}",
                "ratelimit_store_failure_decisions_total{action=open}",
            ]
        );
        assert_eq!(
            series(&CONCURRENCY),
            [
                "concurrency_breaker_state{}",
                "concurrency_decisions_total{outcome=allowed}",
                "concurrency_decisions_total{outcome=exempt}",
                "concurrency_decisions_total{outcome=key_error}",
                "concurrency_decisions_total{outcome=rejected}",
                "concurrency_in_flight{}",
                "concurrency_limit{}",
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

    /// The store-backed limiters' series, whose names are built here from
    /// each one's prefix.
    const SERIES: [&Series; 3] = [&RATE_LIMIT, &CONCURRENCY, &FLEET_SHED];

    fn src() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
    }

    /// Every `.rs` file under `dir`, with its text.
    fn sources(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                out.push((path, text));
            }
        }
    }

    /// A macro call's arguments: `text` from just after its `(` up to the
    /// matching `)`.
    fn arguments(text: &str) -> &str {
        let (mut depth, mut quoted, mut escaped) = (1, false, false);
        for (i, c) in text.char_indices() {
            match c {
                '\\' if quoted => escaped = !escaped,
                '"' if !escaped => quoted = !quoted,
                '(' if !quoted => depth += 1,
                ')' if !quoted => {
                    depth -= 1;
                    if depth == 0 {
                        return &text[..i];
                    }
                }
                _ => {}
            }
            if c != '\\' {
                escaped = false;
            }
        }
        panic!("a macro call that never closes: {text}")
    }

    /// Every series the crate emits, as (name, type): the names written
    /// out in the `counter!`, `gauge!` and `histogram!` calls under `src/`,
    /// and those the store-backed limiters build here. Panics on a call
    /// without the `limiter` label, or whose name this cannot read.
    fn emitted() -> BTreeSet<(String, &'static str)> {
        let mut files = Vec::new();
        sources(&src(), &mut files);
        assert!(files.len() > 50, "{} files under src/", files.len());
        let mut out = BTreeSet::new();
        for (path, text) in &files {
            for kind in ["counter", "gauge", "histogram"] {
                let call = format!("{kind}!(");
                for (at, _) in text.match_indices(&call) {
                    let line = text[..at].lines().count();
                    let starts = text[..at].rfind('\n').map_or(0, |i| i + 1);
                    if text[starts..at].trim_start().starts_with("//") {
                        continue;
                    }
                    let args = arguments(&text[at + call.len()..]).trim_start();
                    let place = format!("{}:{line}", path.display());
                    assert!(
                        args.contains("\"limiter\""),
                        "{place}: a series without the `limiter` label: {kind}!({args})"
                    );
                    match args.strip_prefix('"') {
                        Some(name) => {
                            out.insert((name[..name.find('"').unwrap()].to_owned(), kind));
                        }
                        None => assert!(
                            path.ends_with("src/metrics.rs") && args.starts_with("format!("),
                            "{place}: a series named by `{args}`: write its name out"
                        ),
                    }
                }
            }
        }
        let here = std::fs::read_to_string(src().join("metrics.rs")).unwrap();
        assert_eq!(
            here.matches(concat!(": Series = ", "Series {")).count(),
            SERIES.len(),
            "a `Series` this test does not build"
        );
        for s in SERIES {
            let built = recorded(|| StoreMetrics::new(s, "api").store_error("timeout"));
            out.extend(
                built
                    .into_iter()
                    .map(|(kind, k)| (k.name().to_owned(), kind)),
            );
        }
        out
    }

    /// The series a table in `file`'s module docs lists, as (name, type).
    fn documented(file: &str) -> BTreeSet<(String, String)> {
        let text = std::fs::read_to_string(src().join(file)).unwrap();
        text.lines()
            .filter_map(|l| l.strip_prefix("//! | `"))
            .map(|row| {
                let cells: Vec<&str> = row.split(" | ").collect();
                (
                    cells[0].trim_end_matches('`').to_owned(),
                    cells[1].to_owned(),
                )
            })
            .collect()
    }

    /// A series added without a line in its table, or a line left for a
    /// series that is gone, fails here.
    #[test]
    fn the_tables_in_the_docs_list_every_series_the_crate_emits_and_no_other() {
        let emitted = emitted();
        let tables = [
            ("ratelimit_", "metrics.rs"),
            ("concurrency_", "concurrency/mod.rs"),
            ("load_shed_", "shed/mod.rs"),
        ];
        for (name, _) in &emitted {
            assert!(
                tables.iter().any(|(prefix, _)| name.starts_with(prefix)),
                "{name}: a series without a table"
            );
        }
        for (prefix, file) in tables {
            let ours: BTreeSet<(String, String)> = emitted
                .iter()
                .filter(|(name, _)| name.starts_with(prefix))
                .map(|(name, kind)| (name.clone(), kind.to_string()))
                .collect();
            let listed = documented(file);
            assert_eq!(
                listed.difference(&ours).collect::<Vec<_>>(),
                Vec::<&(String, String)>::new(),
                "listed in src/{file}, not emitted (or of another type)"
            );
            assert_eq!(
                ours.difference(&listed).collect::<Vec<_>>(),
                Vec::<&(String, String)>::new(),
                "emitted, not listed in src/{file} (or of another type)"
            );
        }
    }
}
