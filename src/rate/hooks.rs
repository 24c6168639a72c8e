//! The rate limiter's seams for what a team adds at the edge: policies
//! changed while the layer serves ([`Overrides`], the runtime limits) and a
//! record of what each key was charged ([`Observe`], the advisor). The core
//! calls each through its trait and knows nothing else of them; a build
//! without their features has none.

use crate::key::Key;
use crate::Policy;

/// Policies that replace the configured one while the layer serves.
pub(crate) trait Overrides: Send + Sync {
    /// The policy `key` gets instead of the configured one, if any.
    fn policy(&self, key: &Key) -> Option<Policy>;

    /// A candidate policy `key` is also charged against, in shadow (its
    /// would-be rejections counted, nothing refused), if any.
    fn shadow(&self, key: &Key) -> Option<Policy>;

    /// Called on each request: starts what runs in the background (a poll
    /// of shared limits), once, when a tokio runtime runs.
    fn start(&self);
}

/// Something told of every charge the limiter makes (offered load,
/// rejections included).
pub(crate) trait Observe: Send + Sync {
    /// `key` was charged `cost` under `policy` at `now_ms`.
    fn record(&self, key: Key, policy: &Policy, cost: u64, now_ms: u64);
}
