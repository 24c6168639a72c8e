//! The advisor: each key's usage per window, in bounded memory, and the
//! limits that usage suggests.
//!
//! Each window (aligned to the layer clock's Unix time, so instances
//! agree) counts the usage of the heaviest keys in a Filtered
//! Space-Saving sketch (the `topk` crate): a fixed number of counters
//! whatever the number of distinct keys. When a window closes, its
//! heaviest keys and their counts join a ring of the last windows. A
//! report reads that ring: per heavy key, the peak and a high percentile
//! of its usage per window, and a suggested limit, the percentile times a
//! headroom, rounded up; per tier (the policy a key was limited under),
//! the same over its heavy keys.

use crate::error::{ConfigError, ConfigErrorKind};
use crate::key::Key;
use crate::Policy;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use topk::FilteredSpaceSaving;

/// The most tiers (distinct policies) a report tells apart; keys under
/// more are reported under the tier `"other"`.
pub const MAX_TIERS: usize = 64;

/// Suggests limits from observed usage:
/// [`RateLimitLayerBuilder::advisor`](crate::RateLimitLayerBuilder::advisor)
/// turns it on, [`RateLimitLayer::advice`](crate::RateLimitLayer::advice)
/// reports.
///
/// It costs one uncontended lock and a counter update per request, and
/// memory for `top × 10` counters plus `top` keys per window kept.
///
/// ```
/// use std::time::Duration;
/// use tower_ratelimit::rate::Advisor;
/// let advisor = Advisor::new()
///     .window(Duration::from_secs(60))
///     .windows(7 * 24 * 60)
///     .top(50)
///     .percentile(0.99)
///     .headroom(1.5);
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct Advisor {
    window: Duration,
    windows: usize,
    top: usize,
    percentile: f64,
    headroom: f64,
    #[cfg(feature = "redis")]
    fleet: Option<crate::store::RedisStore>,
}

impl Default for Advisor {
    fn default() -> Self {
        Self::new()
    }
}

impl Advisor {
    /// Windows of one minute, the last 60 kept, the 100 heaviest keys
    /// each, the 99th percentile, and a headroom of 1.5.
    pub const fn new() -> Self {
        Self {
            window: Duration::from_secs(60),
            windows: 60,
            top: 100,
            percentile: 0.99,
            headroom: 1.5,
            #[cfg(feature = "redis")]
            fleet: None,
        }
    }

    /// The window usage is counted over: the window of the suggested
    /// limits (at least 1 ms).
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// How many closed windows a report covers (at least 1).
    pub fn windows(mut self, n: usize) -> Self {
        self.windows = n;
        self
    }

    /// How many of the heaviest keys each window keeps (at least 1).
    pub fn top(mut self, n: usize) -> Self {
        self.top = n;
        self
    }

    /// The percentile of usage per window a suggestion starts from,
    /// above 0 and at most 1 (1: the peak).
    pub fn percentile(mut self, p: f64) -> Self {
        self.percentile = p;
        self
    }

    /// What the percentile is multiplied by (at least 1).
    pub fn headroom(mut self, h: f64) -> Self {
        self.headroom = h;
        self
    }

    /// Merges every instance's windows in `store`'s Redis, for
    /// [`RateLimitLayer::fleet_advice`](crate::RateLimitLayer::fleet_advice):
    /// each instance adds its closed windows' heavy keys to one sorted set
    /// per window (written in the background once a window, a command per
    /// heavy key), kept for the advisor's span. Not with a Redis Cluster.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn fleet(mut self, store: crate::store::RedisStore) -> Self {
        self.fleet = Some(store);
        self
    }

    /// Refuses settings that are wrong.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        #[cfg(feature = "redis")]
        if self.fleet.as_ref().is_some_and(|s| s.is_cluster()) {
            return Err(ConfigError::new(
                ConfigErrorKind::Conflict,
                "the advisor's fleet windows live on one Redis primary: not a Cluster",
            ));
        }
        if self.window < Duration::from_millis(1) {
            return Err(ConfigError::new(
                ConfigErrorKind::Invalid,
                "the advisor's window must be at least 1ms",
            ));
        }
        if self.windows == 0 || self.top == 0 {
            return Err(ConfigError::new(
                ConfigErrorKind::Invalid,
                "the advisor keeps at least one window and one key",
            ));
        }
        if !(self.percentile > 0.0 && self.percentile <= 1.0) {
            return Err(ConfigError::new(
                ConfigErrorKind::Invalid,
                format!(
                    "the advisor's percentile must be above 0 and at most 1, got {}",
                    self.percentile
                ),
            ));
        }
        if !(self.headroom >= 1.0 && self.headroom.is_finite()) {
            return Err(ConfigError::new(
                ConfigErrorKind::Invalid,
                format!(
                    "the advisor's headroom must be at least 1, got {}",
                    self.headroom
                ),
            ));
        }
        Ok(())
    }
}

/// What the advisor saw, and the limits it suggests.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Advice {
    /// The window of every number below.
    pub window: Duration,
    /// The closed windows observed (at most [`Advisor::windows`]).
    pub windows: usize,
    /// The heaviest keys, heaviest peak first.
    pub keys: Vec<KeyAdvice>,
    /// Each tier, by its policy's text.
    pub tiers: Vec<TierAdvice>,
}

/// One heavy key's usage per window, and its suggested limit.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyAdvice {
    /// The key.
    pub key: Key,
    /// Its text, when it has one ([`Key::text`]).
    pub text: Option<String>,
    /// The policy it was last limited under, as text.
    pub tier: String,
    /// Its usage in each observed window, oldest first (0 where it was
    /// not among the heaviest).
    pub usage: Vec<u64>,
    /// Its highest usage in one window.
    pub peak: u64,
    /// Its usage at the advisor's percentile.
    pub percentile: u64,
    /// Its limit per window now (see [`current_limit`]).
    pub current: u64,
    /// The percentile times the headroom, rounded up to two significant digits.
    pub suggested: u64,
}

/// One tier's heavy keys together.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TierAdvice {
    /// The policy, as text (`"other"` past [`MAX_TIERS`]).
    pub tier: String,
    /// Its heavy keys.
    pub keys: usize,
    /// The highest usage of any of them in one window.
    pub peak: u64,
    /// The percentile over the windows in which each was active.
    pub percentile: u64,
    /// The tier's limit per window now.
    pub current: u64,
    /// The percentile times the headroom, rounded up to two significant digits.
    pub suggested: u64,
}

/// One closed window: its heaviest keys (with their tier) and counts.
struct Closed {
    top: Vec<((Key, u16), u64)>,
}

struct State {
    /// The open window (`None` before the first request).
    id: Option<u64>,
    sketch: FilteredSpaceSaving<(Key, u16)>,
    ring: VecDeque<Closed>,
    /// The tiers seen, by index; the last is `"other"` once full.
    tiers: Vec<(String, u64)>,
    tier_of: HashMap<Policy, u16>,
    /// Closed windows not yet added to the fleet's (by window id).
    #[cfg(feature = "redis")]
    unsent: Vec<(u64, crate::store::AdviceWindow)>,
}

/// A layer's advisor.
/// The rate limiter's view of a recorder ([`Observe`](super::hooks::Observe)).
pub(crate) struct Hook(pub(crate) Arc<Recorder>);

impl super::hooks::Observe for Hook {
    fn record(&self, key: Key, policy: &Policy, cost: u64, now_ms: u64) {
        self.0.record(key, policy, cost, now_ms);
    }
}

pub(crate) struct Recorder {
    cfg: Advisor,
    #[cfg(feature = "redis")]
    fleet: Option<crate::store::FleetAdvice>,
    /// Held while closed windows go to the fleet's, so a fleet report
    /// waits for a send under way and never misses a window.
    #[cfg(feature = "redis")]
    sending: tokio::sync::Mutex<()>,
    /// The layer's name, for the gauges.
    name: std::sync::Arc<str>,
    window_ms: u64,
    state: Mutex<State>,
}

impl Recorder {
    pub(crate) fn new(cfg: Advisor, namespace: &crate::store::Namespace) -> Self {
        Self {
            #[cfg(feature = "redis")]
            fleet: cfg.fleet.clone().map(|store| {
                let keep = cfg.window * (cfg.windows as u32 + 1);
                crate::store::FleetAdvice::new(store, namespace, keep)
            }),
            #[cfg(feature = "redis")]
            sending: tokio::sync::Mutex::new(()),
            name: namespace.name().into(),
            window_ms: (cfg.window.as_millis() as u64).max(1),
            state: Mutex::new(State {
                id: None,
                sketch: FilteredSpaceSaving::new(cfg.top * 10),
                ring: VecDeque::new(),
                tiers: Vec::new(),
                tier_of: HashMap::new(),
                #[cfg(feature = "redis")]
                unsent: Vec::new(),
            }),
            cfg,
        }
    }

    /// Counts `cost` for `key` under `policy` at `now_ms`.
    pub(crate) fn record(self: &Arc<Self>, key: Key, policy: &Policy, cost: u64, now_ms: u64) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if self.roll(&mut s, now_ms) {
            // Once a window: the tiers' gauges follow the closed windows,
            // and the fleet gets them.
            self.publish(&self.advice_of(&s));
            #[cfg(feature = "redis")]
            self.send();
        }
        let tier = match s.tier_of.get(policy) {
            Some(&t) => t,
            None => {
                let t = if s.tiers.len() < MAX_TIERS {
                    let limit = current_limit(policy, self.cfg.window);
                    s.tiers.push((policy.to_string(), limit));
                    (s.tiers.len() - 1) as u16
                } else {
                    MAX_TIERS as u16
                };
                if s.tier_of.len() < MAX_TIERS * 4 {
                    s.tier_of.insert(policy.clone(), t);
                }
                t
            }
        };
        s.sketch.insert((key, tier), cost);
    }

    /// Closes the windows `now_ms` is past; whether it closed any.
    fn roll(&self, s: &mut State, now_ms: u64) -> bool {
        let id = now_ms / self.window_ms;
        let Some(open) = s.id else {
            s.id = Some(id);
            return false;
        };
        if id <= open {
            return false;
        }
        let fresh = FilteredSpaceSaving::new(self.cfg.top * 10);
        let mut top: Vec<((Key, u16), u64)> = std::mem::replace(&mut s.sketch, fresh)
            .into_sorted_vec()
            .into_iter()
            .map(|(k, c)| (k, c.estimated_count()))
            .collect();
        top.truncate(self.cfg.top);
        #[cfg(feature = "redis")]
        if self.fleet.is_some() {
            let named = top
                .iter()
                .map(|&((key, t), count)| {
                    let tier = s.tiers.get(t as usize).map_or("other", |(n, _)| n.as_str());
                    (key, tier.to_owned(), count)
                })
                .collect();
            s.unsent.push((open, named));
            // Kept for one span at most while the fleet cannot take them.
            let excess = s.unsent.len().saturating_sub(self.cfg.windows);
            s.unsent.drain(..excess);
        }
        s.ring.push_back(Closed { top });
        // Windows with no traffic at all are windows of zero usage.
        let first_empty = (open + 1).max(id.saturating_sub(self.cfg.windows as u64));
        for _ in first_empty..id {
            s.ring.push_back(Closed { top: Vec::new() });
        }
        while s.ring.len() > self.cfg.windows {
            s.ring.pop_front();
        }
        s.id = Some(id);
        true
    }

    /// The report at `now_ms`: the closed windows only.
    pub(crate) fn advice(&self, now_ms: u64) -> Advice {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if self.roll(&mut s, now_ms) {
            let advice = self.advice_of(&s);
            self.publish(&advice);
            return advice;
        }
        self.advice_of(&s)
    }

    /// Sends the closed windows to the fleet's, in the background.
    #[cfg(feature = "redis")]
    fn send(self: &Arc<Self>) {
        if self.fleet.is_none() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let this = self.clone();
        rt.spawn(async move {
            if let Err(e) = this.flush().await {
                metrics::counter!("ratelimit_advice_fleet_failures_total", "limiter" => this.name.to_string()).increment(1);
                tracing::warn!(limiter = %this.name, error = %e, "the advisor's closed windows did not reach Redis; the fleet's report lacks them");
            }
        });
    }

    /// Adds the closed windows not sent yet to the fleet's.
    #[cfg(feature = "redis")]
    async fn flush(&self) -> Result<(), crate::StoreError> {
        let Some(fleet) = &self.fleet else {
            return Ok(());
        };
        let _one_at_a_time = self.sending.lock().await;
        let unsent = std::mem::take(
            &mut self
                .state
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .unsent,
        );
        fleet.write(unsent).await
    }

    /// The fleet's report at `now_ms`: this instance's closed windows sent
    /// first, then every instance's read back.
    #[cfg(feature = "redis")]
    pub(crate) async fn fleet_advice(&self, now_ms: u64) -> Result<Advice, crate::StoreError> {
        let Some(fleet) = &self.fleet else {
            return Ok(self.advice(now_ms));
        };
        let open = {
            let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            self.roll(&mut s, now_ms);
            now_ms / self.window_ms
        };
        self.flush().await?;
        let first = open.saturating_sub(self.cfg.windows as u64);
        let mut windows = fleet
            .read(first, open.saturating_sub(1), self.cfg.top)
            .await?;
        // Windows before any instance counted are not windows of zero.
        let start = windows
            .iter()
            .position(|w| !w.is_empty())
            .unwrap_or(windows.len());
        windows.drain(..start);
        let mut current: HashMap<&str, u64> = HashMap::new();
        for w in &windows {
            for (_, tier, _) in w {
                current.entry(tier).or_insert_with(|| {
                    tier.parse::<Policy>()
                        .map_or(0, |p| current_limit(&p, self.cfg.window))
                });
            }
        }
        let seen = windows
            .iter()
            .map(|w| {
                w.iter()
                    .map(|(key, tier, count)| Seen {
                        key: *key,
                        tier,
                        current: current[tier.as_str()],
                        count: *count,
                    })
                    .collect()
            })
            .collect();
        Ok(report(&self.cfg, seen))
    }

    /// Sets the tiers' gauges from `advice`.
    fn publish(&self, advice: &Advice) {
        for t in &advice.tiers {
            let (l, tier) = (self.name.to_string(), t.tier.clone());
            metrics::gauge!("ratelimit_advice_peak", "limiter" => l.clone(), "tier" => tier.clone())
                .set(t.peak as f64);
            metrics::gauge!("ratelimit_advice_current_limit", "limiter" => l.clone(), "tier" => tier.clone())
                .set(t.current as f64);
            metrics::gauge!("ratelimit_advice_suggested_limit", "limiter" => l, "tier" => tier)
                .set(t.suggested as f64);
        }
    }

    fn advice_of(&self, s: &State) -> Advice {
        let tier = |t: u16| match s.tiers.get(t as usize) {
            Some((name, limit)) => (name.as_str(), *limit),
            None => ("other", 0),
        };
        let windows = s
            .ring
            .iter()
            .map(|w| {
                w.top
                    .iter()
                    .map(|&((key, t), count)| {
                        let (tier, current) = tier(t);
                        Seen {
                            key,
                            tier,
                            current,
                            count,
                        }
                    })
                    .collect()
            })
            .collect();
        report(&self.cfg, windows)
    }

    /// Counters and kept entries now: what bounds the advisor's memory.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        let s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.ring.iter().map(|w| w.top.len()).sum::<usize>()
            + s.sketch.iter().count()
            + s.tier_of.len()
    }
}

/// One heavy key in one closed window.
struct Seen<'a> {
    key: Key,
    tier: &'a str,
    /// The tier's limit per window.
    current: u64,
    count: u64,
}

/// The report on `windows` (oldest first).
fn report(cfg: &Advisor, windows: Vec<Vec<Seen<'_>>>) -> Advice {
    let n = windows.len();
    let mut series: HashMap<Key, (&str, u64, Vec<u64>)> = HashMap::new();
    for (i, w) in windows.iter().enumerate() {
        for seen in w {
            let e = series
                .entry(seen.key)
                .or_insert_with(|| (seen.tier, seen.current, vec![0; n]));
            // The latest tier a key was seen under is its tier.
            (e.0, e.1) = (seen.tier, seen.current);
            e.2[i] += seen.count;
        }
    }
    let mut keys: Vec<KeyAdvice> = series
        .into_iter()
        .map(|(key, (tier, current, usage))| {
            let peak = usage.iter().copied().max().unwrap_or(0);
            let percentile = percentile(&usage, cfg.percentile);
            KeyAdvice {
                key,
                text: key.text().map(str::to_owned),
                tier: tier.to_owned(),
                usage,
                peak,
                percentile,
                current,
                suggested: suggest(percentile, cfg.headroom),
            }
        })
        .collect();
    keys.sort_by(|a, b| b.peak.cmp(&a.peak).then_with(|| a.key.cmp(&b.key)));
    keys.truncate(cfg.top);
    let mut by_tier: HashMap<&str, (usize, u64, Vec<u64>)> = HashMap::new();
    for k in &keys {
        let e = by_tier.entry(&k.tier).or_insert((0, k.current, Vec::new()));
        e.0 += 1;
        e.2.extend(k.usage.iter().copied().filter(|&u| u > 0));
    }
    let mut tiers: Vec<TierAdvice> = by_tier
        .into_iter()
        .map(|(tier, (n, current, active))| {
            let percentile = percentile(&active, cfg.percentile);
            TierAdvice {
                tier: tier.to_owned(),
                keys: n,
                peak: active.iter().copied().max().unwrap_or(0),
                percentile,
                current,
                suggested: suggest(percentile, cfg.headroom),
            }
        })
        .collect();
    tiers.sort_by(|a, b| a.tier.cmp(&b.tier));
    Advice {
        window: cfg.window,
        windows: n,
        keys,
        tiers,
    }
}

/// A policy's limit per `window`: the limit of its quota of that window,
/// else its first quota's limit scaled to `window`, rounded down.
pub fn current_limit(policy: &Policy, window: Duration) -> u64 {
    let window_ms = window.as_millis() as u64;
    let quotas = policy.quotas();
    if let Some(q) = quotas.iter().find(|q| q.window_ms() == window_ms) {
        return q.limit();
    }
    quotas.first().map_or(0, |q| {
        (q.limit() as u128 * window_ms as u128 / q.window_ms().max(1) as u128) as u64
    })
}

/// The nearest-rank percentile `p` of `values`.
fn percentile(values: &[u64], p: f64) -> u64 {
    if values.is_empty() {
        return 0;
    }
    let mut v = values.to_vec();
    v.sort_unstable();
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// `usage × headroom`, rounded up to two significant digits (at least 1).
fn suggest(usage: u64, headroom: f64) -> u64 {
    let raw = (usage as f64 * headroom).ceil().max(1.0) as u64;
    let mut step = 1;
    while raw / step >= 100 {
        step *= 10;
    }
    raw.div_ceil(step) * step
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank_and_suggestions_round_up_to_two_digits() {
        let v: Vec<u64> = (1..=20).collect();
        assert_eq!(percentile(&v, 0.95), 19);
        assert_eq!(percentile(&v, 1.0), 20);
        assert_eq!(percentile(&v, 0.01), 1);
        assert_eq!(percentile(&[], 0.5), 0);
        assert_eq!(suggest(19, 1.5), 29);
        assert_eq!(suggest(100, 1.5), 150);
        assert_eq!(suggest(1234, 1.0), 1300);
        assert_eq!(suggest(0, 1.5), 1);
    }

    #[test]
    fn a_million_distinct_keys_keep_the_advisor_within_its_bound() {
        let cfg = Advisor::new()
            .window(Duration::from_secs(1))
            .windows(10)
            .top(20);
        let r = Arc::new(Recorder::new(cfg, &crate::store::Namespace::new("test")));
        let policy = Policy::new(crate::Quota::new(10, Duration::from_secs(1)).unwrap());
        // 1,000,000 keys over 20 windows; one heavy key in each.
        for i in 0..1_000_000u64 {
            let now = i / 50_000 * 1_000;
            r.record(Key::new(i.to_be_bytes()), &policy, 1, now);
            r.record(Key::new("heavy"), &policy, 1, now);
        }
        let bound = 20 * 10 + 20 * 10 + 4 * MAX_TIERS;
        assert!(
            r.held() <= bound,
            "{} entries held, bound {bound}",
            r.held()
        );
        let advice = r.advice(20_000);
        assert_eq!(advice.windows, 10);
        assert_eq!(advice.keys[0].text.as_deref(), Some("heavy"));
        assert_eq!(
            advice.keys[0].usage,
            vec![50_000; 10],
            "the heavy key, counted exactly"
        );
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(Advisor::new().check().is_ok());
        assert!(Advisor::new().top(0).check().is_err());
        assert!(Advisor::new().windows(0).check().is_err());
        assert!(Advisor::new().percentile(0.0).check().is_err());
        assert!(Advisor::new().percentile(1.5).check().is_err());
        assert!(Advisor::new().headroom(0.5).check().is_err());
        assert!(Advisor::new().headroom(f64::NAN).check().is_err());
        assert!(Advisor::new().window(Duration::ZERO).check().is_err());
    }
}
