//! The series a `DebuggingRecorder` saw, for tests that check every series
//! a limiter registers carries its name in the `limiter` label.
#![allow(dead_code)]

use metrics_util::debugging::{DebugValue, Snapshotter};
use std::collections::BTreeMap;

/// Every series in `snapshotter`, as `name{label=value,...}` (its labels
/// other than `limiter`, in the order given) with its value. Panics on a
/// series whose `limiter` label is missing or names another limiter.
pub fn of(snapshotter: &Snapshotter, limiter: &str) -> BTreeMap<String, DebugValue> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, value)| {
            let key = k.key();
            let theirs: Vec<&str> = key
                .labels()
                .filter(|l| l.key() == "limiter")
                .map(|l| l.value())
                .collect();
            assert_eq!(theirs, [limiter], "the `limiter` label of {key:?}");
            let labels: Vec<String> = key
                .labels()
                .filter(|l| l.key() != "limiter")
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            (format!("{}{{{}}}", key.name(), labels.join(",")), value)
        })
        .collect()
}

/// The names of `series`, each once.
pub fn names(series: &BTreeMap<String, DebugValue>) -> Vec<&str> {
    let mut out: Vec<&str> = series
        .keys()
        .map(|k| k.split('{').next().unwrap_or(k))
        .collect();
    out.dedup();
    out
}
