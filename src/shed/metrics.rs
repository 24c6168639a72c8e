//! The load shedder's metrics, in the style of [`crate::metrics`]: every
//! series carries the label `limiter` (the layer's name), and decisions the
//! label `class`.

use super::priority::Priority;
use metrics::{counter, gauge, Counter, Gauge};

/// Handles for one shedder, registered on first use.
pub(crate) struct Metrics {
    /// Per class (by [`Priority::index`]).
    pub(crate) admitted: [Counter; 4],
    pub(crate) shed: [Counter; 4],
    pub(crate) shadow_shed: [Counter; 4],
    pub(crate) in_flight: Gauge,
    pub(crate) utilisation: Gauge,
    /// An adaptive capacity's value.
    pub(crate) capacity: Gauge,
}

impl Metrics {
    pub(crate) fn new(name: &str) -> Self {
        let l = name.to_owned();
        let decision = |outcome: &'static str| {
            Priority::ALL.map(|p| counter!("load_shed_decisions_total", "limiter" => l.clone(), "class" => p.as_str(), "outcome" => outcome))
        };
        Self {
            admitted: decision("admitted"),
            shed: decision("shed"),
            shadow_shed: Priority::ALL.map(|p| counter!("load_shed_shadow_total", "limiter" => l.clone(), "class" => p.as_str())),
            in_flight: gauge!("load_shed_in_flight", "limiter" => l.clone()),
            utilisation: gauge!("load_shed_utilisation", "limiter" => l.clone()),
            capacity: gauge!("load_shed_capacity", "limiter" => l),
        }
    }
}
