//! What a limiter does when its store fails: the failure policy
//! ([`OnStoreError`]), a circuit breaker in front of the store
//! ([`CircuitBreaker`]), and log lines kept to one a second per kind. The
//! rate limiter and the concurrency limiter share all of it.
//!
//! ```
//! # use std::num::NonZeroU32;
//! use std::time::Duration;
//! use tower_ratelimit::{failure::CircuitBreaker, failure::OnStoreError, Quota, RateLimitLayer};
//! let layer = RateLimitLayer::builder()
//!     .quota(Quota::per_second(NonZeroU32::new(100).unwrap()))
//!     .on_store_error(OnStoreError::Local { fraction: 0.25 })
//!     .circuit_breaker(CircuitBreaker::new().failures(3).cooldown(Duration::from_millis(500)))
//!     .build()
//!     .unwrap();
//! ```

use crate::clock::Clock;
use crate::error::StoreError;
use crate::metrics::StoreMetrics;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// What the layer does when the store cannot answer (error, timeout, open breaker).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub enum OnStoreError {
    /// Admit the request, without rate-limit headers (the default: the limiter
    /// is never less available than what it protects).
    #[default]
    FailOpen,
    /// Answer 503 with `Retry-After` without calling the inner service.
    FailClosed,
    /// Limit locally, in this process's memory, to `fraction` of each quota
    /// (e.g. `1.0 / expected_instances`) until the store answers again.
    Local {
        /// Share of each quota's limit this instance admits on its own (0 < fraction ≤ 1).
        fraction: f64,
    },
}

impl OnStoreError {
    /// The `action` label of the decisions this policy makes.
    pub(crate) fn label(self) -> &'static str {
        match self {
            OnStoreError::FailOpen => "open",
            OnStoreError::FailClosed => "closed",
            OnStoreError::Local { .. } => "local",
        }
    }

    /// Checks `Local`'s fraction.
    pub(crate) fn check(self) -> Result<Self, crate::ConfigError> {
        match self {
            OnStoreError::Local { fraction } if !(fraction > 0.0 && fraction <= 1.0) => {
                Err(crate::ConfigError::new(
                    crate::ConfigErrorKind::Invalid,
                    format!("OnStoreError::Local needs a fraction in (0, 1], got {fraction}"),
                ))
            }
            ok => Ok(ok),
        }
    }
}

/// Circuit breaker settings: after repeated store failures, stop calling
/// the store for a cool-down and answer per the failure policy at once, so a
/// dead Redis does not add the store timeout to every request.
///
/// The breaker counts failed store **calls**, not requests: the requests
/// that shared one failed call (a Redis batch carries dozens under load),
/// or that were on their way to the store together when it failed, are
/// one failure. A failure counts only for a call that started after the
/// last counted failure was seen. So one slow moment (a fork, an fsync, a
/// network blip) is one failure however busy the instance is, while a dead
/// store, whose every new call fails, opens the breaker after
/// [`failures`](CircuitBreaker::failures) calls in a row.
///
/// ```
/// use std::time::Duration;
/// use tower_ratelimit::failure::CircuitBreaker;
/// let breaker = CircuitBreaker::new().failures(3).cooldown(Duration::from_millis(500));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct CircuitBreaker {
    threshold: u32,
    cooldown: Duration,
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        Self::new()
    }
}

impl CircuitBreaker {
    /// Opens after 5 consecutive store failures; probes again after 1 s.
    pub const fn new() -> Self {
        Self {
            threshold: 5,
            cooldown: Duration::from_secs(1),
        }
    }

    /// Never opens: every request calls the store (and may wait for its timeout).
    pub const fn disabled() -> Self {
        Self {
            threshold: u32::MAX,
            cooldown: Duration::ZERO,
        }
    }

    /// Consecutive failed calls that open the breaker (at least 1).
    pub const fn failures(mut self, n: u32) -> Self {
        self.threshold = if n == 0 { 1 } else { n };
        self
    }

    /// How long the breaker stays open before one probe call is let through
    /// (measured on the monotonic clock: a step of the wall clock changes nothing).
    /// Only the probe's success closes it; a probe that never answers (its
    /// request was dropped) is replaced by another after one more cool-down.
    pub const fn cooldown(mut self, cooldown: Duration) -> Self {
        self.cooldown = cooldown;
        self
    }
}

/// Whether a request may call the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Closed: call the store.
    Call,
    /// The cool-down has passed: this one call probes the store.
    Probe,
    /// Open: do not call the store.
    Reject,
}

/// One breaker.
pub(crate) struct Breaker {
    cfg: CircuitBreaker,
    closed: AtomicBool,
    failures: AtomicU32,
    open: Mutex<Open>,
}

struct Open {
    /// When the last failure that counted was seen: a failed call that
    /// started before it failed with it (one event), and does not count.
    counted: Option<Instant>,
    /// Calls are refused until then.
    until: Option<Instant>,
    /// When the probe went out: everyone else waits for its answer, for at
    /// most one more cool-down (a probe whose request was dropped never
    /// answers; another goes out then).
    probing: Option<Instant>,
}

impl Breaker {
    pub(crate) fn new(cfg: CircuitBreaker) -> Self {
        Self {
            cfg,
            closed: AtomicBool::new(true),
            failures: AtomicU32::new(0),
            open: Mutex::new(Open {
                counted: None,
                until: None,
                probing: None,
            }),
        }
    }

    /// Whether a call may go to the store; `now` is read only when the
    /// breaker is open (a closed breaker costs one atomic load).
    pub(crate) fn admit(&self, now: impl FnOnce() -> Instant) -> Admit {
        if self.closed.load(Ordering::Acquire) {
            return Admit::Call;
        }
        let now = now();
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if self.closed.load(Ordering::Acquire) {
            return Admit::Call;
        }
        let probe_lost = open
            .probing
            .is_none_or(|sent| now >= sent + self.cfg.cooldown);
        match open.until {
            Some(until) if now >= until && probe_lost => {
                open.probing = Some(now);
                Admit::Probe
            }
            _ => Admit::Reject,
        }
    }

    /// Records a successful call; returns true if it closed the breaker,
    /// which only the probe's success does (a late answer to a call made
    /// before the breaker opened says nothing of the store now).
    pub(crate) fn success(&self, probe: bool) -> bool {
        if probe {
            let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
            open.probing = None;
            open.until = None;
            self.failures.store(0, Ordering::Relaxed);
            self.closed.store(true, Ordering::Release);
            return true;
        }
        if self.failures.load(Ordering::Relaxed) != 0 && self.closed.load(Ordering::Acquire) {
            self.failures.store(0, Ordering::Relaxed);
        }
        false
    }

    /// Records a failed call that started at `started`, seen at `now`;
    /// returns true if it opened the breaker. A call that started before
    /// the last counted failure was seen failed with it: not counted.
    pub(crate) fn failure(&self, probe: bool, started: Instant, now: Instant) -> bool {
        if self.cfg.threshold == u32::MAX {
            return false;
        }
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let reopen = |open: &mut Open| {
            open.until = Some(now + self.cfg.cooldown);
            open.probing = None;
        };
        if probe {
            reopen(&mut open);
            return false;
        }
        if open.counted.is_some_and(|seen| started < seen) {
            return false;
        }
        open.counted = Some(now);
        let n = self
            .failures
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        if n < self.cfg.threshold || !self.closed.swap(false, Ordering::AcqRel) {
            return false;
        }
        reopen(&mut open);
        true
    }

    fn is_open(&self) -> bool {
        !self.closed.load(Ordering::Acquire)
    }
}

/// Most breakers a layer keeps; stores with more failure domains share them.
const MAX_DOMAINS: usize = 1024;

/// One breaker per failure domain of the store (see
/// [`Store::failure_domain`](crate::store::Store::failure_domain)): one for a
/// single Redis, one per shard for a sharded store, so repeated failures of one
/// dead shard open only that shard's breaker and the others keep calling.
pub(crate) struct Breakers(Box<[Breaker]>);

impl Breakers {
    pub(crate) fn new(cfg: CircuitBreaker, domains: usize) -> Self {
        Self(
            (0..domains.clamp(1, MAX_DOMAINS))
                .map(|_| Breaker::new(cfg))
                .collect(),
        )
    }

    /// The breaker of failure domain `domain`.
    pub(crate) fn get(&self, domain: usize) -> &Breaker {
        &self.0[domain % self.0.len()]
    }

    /// Whether any domain's breaker is open (the `*_breaker_state` gauge).
    pub(crate) fn any_open(&self) -> bool {
        self.0.iter().any(Breaker::is_open)
    }
}

/// Keeps log lines to one per second per kind, so a flood is one line, not millions.
#[derive(Default)]
pub(crate) struct LogThrottle {
    base: std::sync::OnceLock<Instant>,
    last: [AtomicU64; 4],
}

/// The kinds of log line a limiter throttles.
#[derive(Clone, Copy)]
pub(crate) enum Log {
    Rejected = 0,
    KeyError = 1,
    StoreError = 2,
    Blocked = 3,
}

impl LogThrottle {
    /// Runs `log` unless a line of this kind was logged in the last second.
    pub(crate) fn event(&self, kind: Log, log: impl FnOnce()) {
        let base = *self.base.get_or_init(Instant::now);
        // Milliseconds since the throttle's first use, plus one: 0 means never.
        let now = base.elapsed().as_millis() as u64 + 1;
        let last = &self.last[kind as usize];
        let prev = last.load(Ordering::Relaxed);
        if (prev == 0 || now >= prev + 1_000)
            && last
                .compare_exchange(prev, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            log();
        }
    }
}

/// A store call the breaker let through: which breaker it counts for,
/// whether it is the probe, and when it started.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Permit {
    domain: usize,
    probe: bool,
    started: Instant,
}

/// The failure handling of one store-backed limiter: its breakers, its
/// policy, its throttled log lines and the metrics of its store calls.
pub(crate) struct Guard {
    pub(crate) policy: OnStoreError,
    breakers: Breakers,
    pub(crate) log: LogThrottle,
    /// The limiter's name, for log lines.
    name: String,
    /// What the limiter is called in log lines: "rate limit", "concurrency".
    what: &'static str,
    /// The limiter's clock: cool-downs run on its monotonic instant.
    clock: Arc<dyn Clock>,
}

impl Guard {
    pub(crate) fn new(
        name: &str,
        what: &'static str,
        policy: OnStoreError,
        breaker: CircuitBreaker,
        domains: usize,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            policy,
            breakers: Breakers::new(breaker, domains),
            log: LogThrottle::default(),
            name: name.to_owned(),
            what,
            clock,
        }
    }

    /// Whether a call to failure domain `domain` may be made.
    pub(crate) fn admit(&self, domain: usize, m: &StoreMetrics) -> Result<Permit, StoreError> {
        let started = self.clock.monotonic();
        match self.breakers.get(domain).admit(|| started) {
            Admit::Call => Ok(Permit {
                domain,
                probe: false,
                started,
            }),
            Admit::Probe => {
                m.breaker_state.set(2.0);
                Ok(Permit {
                    domain,
                    probe: true,
                    started,
                })
            }
            Admit::Reject => Err(StoreError::CircuitOpen),
        }
    }

    /// Records how a call the breaker let through ended.
    pub(crate) fn record<T>(
        &self,
        permit: Permit,
        result: &Result<T, StoreError>,
        m: &StoreMetrics,
    ) {
        let breaker = self.breakers.get(permit.domain);
        match result {
            Ok(_) => {
                if breaker.success(permit.probe) {
                    if !self.breakers.any_open() {
                        m.breaker_state.set(0.0);
                    }
                    tracing::info!(
                        limiter = %self.name,
                        domain = permit.domain,
                        "{} store answers again; circuit closed",
                        self.what
                    );
                }
            }
            // Not faults of the store: it refuses new keys by design, or
            // this instance queued more than it answers.
            Err(StoreError::Full { .. } | StoreError::Backlog { .. }) => {}
            Err(_) => {
                if breaker.failure(permit.probe, permit.started, self.clock.monotonic()) {
                    m.breaker_state.set(1.0);
                    tracing::warn!(
                        limiter = %self.name,
                        domain = permit.domain,
                        "{} store keeps failing; circuit opened",
                        self.what
                    );
                }
            }
        }
    }

    /// Counts and logs a request whose key could not be found, and answers
    /// it: in gRPC by whose fault it is, else with the layer's `on_key_error`.
    pub(crate) fn key_error(
        &self,
        err: &crate::key::KeyError,
        grpc: bool,
        on_key_error: &(dyn Fn(&crate::key::KeyError) -> http::Response<bytes::Bytes>
              + Send
              + Sync),
        m: &StoreMetrics,
    ) -> http::Response<bytes::Bytes> {
        use crate::key::KeyErrorKind;
        m.key_error.increment(1);
        let server = err.kind() == KeyErrorKind::Server;
        if server {
            self.log.event(Log::KeyError, || {
                tracing::error!(limiter = %self.name, error = %err, "{} key extraction failed: a misconfiguration", self.what);
            });
        } else {
            tracing::debug!(limiter = %self.name, error = %err, "{} key missing from the request", self.what);
        }
        if grpc {
            let code = if server {
                crate::grpc::INTERNAL
            } else {
                crate::grpc::INVALID_ARGUMENT
            };
            return crate::grpc::error(code, &err.to_string(), None);
        }
        on_key_error(err)
    }

    /// Counts and logs a failed call, and says what the policy does.
    pub(crate) fn failed(&self, err: &StoreError, m: &StoreMetrics) -> OnStoreError {
        m.store_error(err.kind());
        let policy = self.policy;
        self.log.event(Log::StoreError, || {
            tracing::error!(
                limiter = %self.name,
                error = %err,
                kind = err.kind(),
                on_store_error = policy.label(),
                "{} store failed",
                self.what
            );
        });
        match policy {
            OnStoreError::FailOpen => m.fail_open.increment(1),
            OnStoreError::FailClosed => m.fail_closed.increment(1),
            OnStoreError::Local { .. } => m.fail_local.increment(1),
        }
        policy
    }
}

/// How long the layer itself lets a store call run: `None` when the store
/// bounds its own calls ([`Store::bounds_calls`](crate::store::Store::bounds_calls)),
/// else the store timeout, so that no request waits on a store that never answers.
pub(crate) fn backstop(store: &dyn crate::store::Store, timeout: Duration) -> Option<Duration> {
    (!store.bounds_calls()).then_some(timeout)
}

/// `call`'s answer, or [`StoreError::Timeout`] once `backstop` (if any) has passed.
pub(crate) async fn within<T>(
    backstop: Option<Duration>,
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match backstop {
        Some(t) => tokio::time::timeout(t, call)
            .await
            .unwrap_or(Err(StoreError::Timeout(t))),
        None => call.await,
    }
}

/// Runs a store call no request waits for (a refund, a slot release): at
/// once when the store answered synchronously, else spawned on the tokio
/// runtime, off the response path, bounded by `backstop` (and safe while
/// unwinding from a panic). `done` gets the result and, when the call had to
/// wait, when it started. Returns `false` (and drops `done` uncalled) when
/// there is no runtime to run it on.
pub(crate) fn off_path(
    mut call: crate::store::StoreFuture<Result<(), StoreError>>,
    backstop: Option<Duration>,
    done: impl FnOnce(Result<(), StoreError>, Option<std::time::Instant>) + Send + 'static,
) -> bool {
    if let Some(result) = call.now_or_never() {
        done(result, None);
        return true;
    }
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return false;
    };
    let started = std::time::Instant::now();
    rt.spawn(async move { done(within(backstop, call).await, Some(started)) });
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker(n: u32) -> Breaker {
        Breaker::new(
            CircuitBreaker::new()
                .failures(n)
                .cooldown(Duration::from_millis(100)),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn opens_after_the_threshold_rejects_during_cooldown_and_lets_one_probe_through() {
        let b = breaker(3);
        assert_eq!(b.admit(Instant::now), Admit::Call);
        assert!(!b.failure(false, Instant::now(), Instant::now()));
        assert!(!b.failure(false, Instant::now(), Instant::now()));
        assert!(
            b.failure(false, Instant::now(), Instant::now()),
            "the third failure opens it"
        );
        assert_eq!(b.admit(Instant::now), Admit::Reject);
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(b.admit(Instant::now), Admit::Probe);
        assert_eq!(b.admit(Instant::now), Admit::Reject, "one probe at a time");
        // The probe fails: open for another cool-down.
        assert!(!b.failure(true, Instant::now(), Instant::now()));
        assert_eq!(b.admit(Instant::now), Admit::Reject);
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(b.admit(Instant::now), Admit::Probe);
        assert!(b.success(true), "a successful probe closes it");
        assert_eq!(b.admit(Instant::now), Admit::Call);
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_probe_closes_it_never_a_late_answer_to_an_earlier_call() {
        let b = breaker(1);
        assert!(b.failure(false, Instant::now(), Instant::now()));
        assert!(
            !b.success(false),
            "a call from before the opening answered late"
        );
        assert_eq!(b.admit(Instant::now), Admit::Reject);
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(b.admit(Instant::now), Admit::Probe);
        assert!(!b.success(false), "nor while the probe is out");
        assert_eq!(b.admit(Instant::now), Admit::Reject);
        assert!(b.success(true));
        assert_eq!(b.admit(Instant::now), Admit::Call);
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_that_never_answers_is_replaced_after_a_cooldown() {
        // A probe whose request was dropped (the client went away) records
        // nothing; the breaker must not wait for it forever.
        let b = breaker(1);
        assert!(b.failure(false, Instant::now(), Instant::now()));
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(b.admit(Instant::now), Admit::Probe);
        tokio::time::advance(Duration::from_millis(99)).await;
        assert_eq!(b.admit(Instant::now), Admit::Reject, "still out");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(b.admit(Instant::now), Admit::Probe, "presumed lost");
        assert!(b.success(true));
        assert_eq!(b.admit(Instant::now), Admit::Call);
    }

    #[tokio::test(start_paused = true)]
    async fn the_cooldown_runs_on_the_monotonic_clock() {
        // The wall clock (SystemTime, or a layer's Clock) plays no part: only
        // tokio's monotonic time, which a test moves, ends the cool-down.
        let b = breaker(1);
        assert!(b.failure(false, Instant::now(), Instant::now()));
        tokio::time::advance(Duration::from_millis(99)).await;
        assert_eq!(b.admit(Instant::now), Admit::Reject);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(b.admit(Instant::now), Admit::Probe);
    }

    #[tokio::test(start_paused = true)]
    async fn the_calls_of_one_failure_count_once_and_a_dead_store_s_new_calls_open_it() {
        let b = breaker(5);
        // A batch of 64 requests (or several calls in flight at once) that
        // all fail at one moment: one failure.
        let started = Instant::now();
        tokio::time::advance(Duration::from_millis(50)).await;
        for _ in 0..64 {
            assert!(!b.failure(false, started, Instant::now()));
        }
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(
            !b.failure(false, started, Instant::now()),
            "started before it was seen"
        );
        assert_eq!(b.admit(Instant::now), Admit::Call);
        // Each call made after the last failure was seen fails again: four
        // more open it (five calls in a row).
        for i in 2..=5 {
            let started = Instant::now();
            tokio::time::advance(Duration::from_millis(50)).await;
            assert_eq!(
                b.failure(false, started, Instant::now()),
                i == 5,
                "call {i}"
            );
        }
        assert_eq!(b.admit(Instant::now), Admit::Reject);
    }

    #[test]
    fn a_success_resets_the_count_of_consecutive_failures_and_disabled_never_opens() {
        let b = breaker(2);
        b.failure(false, Instant::now(), Instant::now());
        b.success(false);
        assert!(!b.failure(false, Instant::now(), Instant::now()));
        assert_eq!(b.admit(Instant::now), Admit::Call);
        let b = Breaker::new(CircuitBreaker::disabled());
        for _ in 0..1000 {
            assert!(!b.failure(false, Instant::now(), Instant::now()));
        }
        assert_eq!(b.admit(Instant::now), Admit::Call);
    }

    #[test]
    fn each_failure_domain_has_its_own_breaker() {
        let b = Breakers::new(CircuitBreaker::new().failures(2), 3);
        assert!(!b.get(1).failure(false, Instant::now(), Instant::now()));
        assert!(
            b.get(1).failure(false, Instant::now(), Instant::now()),
            "domain 1 opens"
        );
        assert!(b.any_open());
        assert_eq!(b.get(1).admit(Instant::now), Admit::Reject);
        assert_eq!(
            b.get(0).admit(Instant::now),
            Admit::Call,
            "domain 0 still calls"
        );
        assert_eq!(
            b.get(4).admit(Instant::now),
            Admit::Reject,
            "domains wrap around"
        );
        assert!(
            Breakers::new(CircuitBreaker::new(), 0)
                .get(7)
                .admit(Instant::now)
                == Admit::Call
        );
    }

    #[test]
    fn a_local_fraction_outside_zero_to_one_is_refused() {
        for bad in [0.0, -1.0, 1.5, f64::NAN] {
            assert!(OnStoreError::Local { fraction: bad }.check().is_err());
        }
        assert!(OnStoreError::Local { fraction: 1.0 }.check().is_ok());
    }
}
