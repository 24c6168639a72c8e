//! Limits changed while the layer serves: [`Limits`], the handle taken from
//! a built [`RateLimitLayer`](super::RateLimitLayer), and, with the `redis`
//! feature, [`SharedLimits`], which keeps the changes in Redis for the
//! whole fleet.
//!
//! A request's policy is, in order: its key's override, the runtime
//! default, then the layer's configured policy (`quota`,
//! `policy_fn` or `policy_async`). Each change replaces the whole table at
//! once for every clone of the layer, so a request never sees half of one.

use super::hooks::Overrides;
use crate::error::ConfigErrorKind;
use crate::error::{ConfigError, StoreError};
use crate::key::Key;
use crate::store::Store;
use crate::Policy;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

/// The longest key an override names, in bytes.
pub const MAX_OVERRIDE_KEY_LEN: usize = 256;
/// The most overrides one layer keeps.
pub const MAX_OVERRIDES: usize = 100_000;

/// Changes a rate limit layer's policies at runtime, at once for every
/// clone of the layer: a new default, and per-key overrides. Cheap to
/// clone; take it with [`RateLimitLayer::limits`](crate::RateLimitLayer::limits).
///
/// A key is named by its text, the bytes a key extractor such as
/// [`Header`](crate::key::Header) or [`Path`](crate::key::Path) reads
/// (`Key::new(text)`).
///
/// Without [`SharedLimits`] the changes live in this process and are lost
/// when it exits. With it, they are written to Redis first and then
/// applied, every instance reads them within its poll interval, and a
/// restarted instance starts with them.
///
/// ```
/// # use std::num::NonZeroU32;
/// use tower_ratelimit::{Policy, Quota, RateLimitLayer, key::Header};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let layer = RateLimitLayer::builder()
///     .quota(Quota::per_minute(NonZeroU32::new(60).unwrap()))
///     .key(Header::try_new("x-tenant").unwrap())
///     .build()
///     .unwrap();
/// let limits = layer.limits();
/// limits.set("acme", "600/1m".parse().unwrap()).await.unwrap();
/// assert_eq!(limits.get("acme").unwrap().to_string(), "600/1m");
/// assert!(limits.set("", "600/1m".parse().unwrap()).await.is_err());
/// assert!(limits.remove("acme").await.unwrap());
/// # });
/// ```
#[derive(Clone)]
pub struct Limits {
    table: Arc<Table>,
}

/// Why a change was refused. Nothing of a refused change is applied.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LimitsError {
    /// The change itself is wrong (an empty or too long key, a policy this
    /// layer cannot enforce, too many overrides): a client's mistake.
    #[error("{0}")]
    Invalid(#[from] ConfigError),
    /// The change could not be written to the shared store; nothing
    /// changed here either.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What every request reads: the runtime default and the overrides.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub(crate) default: Option<Policy>,
    /// A candidate default, charged beside the enforced policy of keys
    /// without an override, its would-be rejections counted.
    pub(crate) shadow: Option<Policy>,
    /// By key text, in order for listings.
    pub(crate) keys: BTreeMap<String, Policy>,
}

/// A [`Snapshot`] as requests read it: with the overrides by [`Key`].
#[derive(Debug, Default)]
pub(crate) struct Installed {
    pub(crate) snap: Snapshot,
    by_key: HashMap<Key, Policy>,
}

/// One layer's table of runtime limits.
pub(crate) struct Table {
    /// Whether any change was ever made: until then a request reads nothing.
    active: AtomicBool,
    /// Whether a policy runs in shadow: until then a request looks for none.
    shadowing: AtomicBool,
    now: RwLock<Arc<Installed>>,
    /// Held while a change is made here, so two at once never lose one.
    changing: Mutex<()>,
    /// The layer's store, which says what policies it can enforce.
    store: Arc<dyn Store>,
    #[cfg(feature = "redis")]
    pub(crate) shared: Option<shared::Shared>,
}

impl Table {
    pub(crate) fn new(store: Arc<dyn Store>) -> Self {
        Self {
            active: AtomicBool::new(false),
            shadowing: AtomicBool::new(false),
            now: RwLock::default(),
            changing: Mutex::new(()),
            store,
            #[cfg(feature = "redis")]
            shared: None,
        }
    }

    /// The policy a request with `key` gets from the runtime limits, if any.
    #[inline]
    pub(crate) fn policy(&self, key: &Key) -> Option<Policy> {
        if !self.active.load(Ordering::Acquire) {
            return None;
        }
        let t = self.snapshot();
        t.by_key.get(key).or(t.snap.default.as_ref()).cloned()
    }

    /// Starts polling the shared limits, once, when there are any and a
    /// tokio runtime runs: at build, or at the first request.
    pub(crate) fn start(self: &Arc<Self>) {
        #[cfg(feature = "redis")]
        if let Some(shared) = &self.shared {
            shared.start(self);
        }
    }

    /// The candidate policy a request with `key` is also charged against
    /// in shadow, if any: keys with an override have none.
    #[inline]
    pub(crate) fn shadow(&self, key: &Key) -> Option<Policy> {
        if !self.shadowing.load(Ordering::Acquire) {
            return None;
        }
        let t = self.snapshot();
        match t.by_key.contains_key(key) {
            true => None,
            false => t.snap.shadow.clone(),
        }
    }

    pub(crate) fn snapshot(&self) -> Arc<Installed> {
        self.now
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Replaces the whole table at once.
    pub(crate) fn install(&self, next: Snapshot) {
        if self.snapshot().snap == next {
            return;
        }
        let by_key = next
            .keys
            .iter()
            .map(|(k, p)| (Key::new(k), p.clone()))
            .collect();
        let shadowing = next.shadow.is_some();
        let next = Arc::new(Installed { snap: next, by_key });
        *self.now.write().unwrap_or_else(PoisonError::into_inner) = next;
        self.shadowing.store(shadowing, Ordering::Release);
        self.active.store(true, Ordering::Release);
    }

    /// Why `policy` cannot be this layer's, if it cannot: its store says.
    pub(crate) fn check_policy(&self, policy: &Policy) -> Result<(), ConfigError> {
        self.store.check_policy(policy)
    }

    /// Why `change` cannot be made to `snap`, if it cannot.
    fn check(&self, change: &Change, snap: &Snapshot) -> Result<(), ConfigError> {
        match change {
            Change::Default(p) | Change::Shadow(p) => {
                p.iter().try_for_each(|p| self.check_policy(p))
            }
            Change::Promote => Ok(()),
            Change::Key(key, p) => {
                check_key(key)?;
                let Some(p) = p else { return Ok(()) };
                self.check_policy(p)?;
                if !snap.keys.contains_key(key) && snap.keys.len() >= MAX_OVERRIDES {
                    return Err(ConfigError::new(
                        ConfigErrorKind::Invalid,
                        format!(
                            "this layer already has {MAX_OVERRIDES} overrides; remove some first"
                        ),
                    ));
                }
                Ok(())
            }
        }
    }

    /// The table with `change` made, and whether what it changes was
    /// there before; or why it cannot be made.
    fn changed(&self, change: &Change) -> Result<(Snapshot, bool), ConfigError> {
        let mut next = self.snapshot().snap.clone();
        self.check(change, &next)?;
        let existed = match change {
            Change::Default(p) => std::mem::replace(&mut next.default, p.clone()).is_some(),
            Change::Shadow(p) => std::mem::replace(&mut next.shadow, p.clone()).is_some(),
            // Whether a shadow policy was there to promote.
            Change::Promote => next.shadow.take().map(|p| next.default = Some(p)).is_some(),
            Change::Key(key, Some(p)) => next.keys.insert(key.clone(), p.clone()).is_some(),
            Change::Key(key, None) => next.keys.remove(key).is_some(),
        };
        Ok((next, existed))
    }
}

/// Why `key` cannot name an override, if it cannot.
fn check_key(key: &str) -> Result<(), ConfigError> {
    if key.is_empty() || key.len() > MAX_OVERRIDE_KEY_LEN {
        return Err(ConfigError::new(
            ConfigErrorKind::Invalid,
            format!(
                "an override's key must be 1 to {MAX_OVERRIDE_KEY_LEN} bytes, got {}",
                key.len()
            ),
        ));
    }
    Ok(())
}

/// One change to the table: `None` removes.
pub(crate) enum Change {
    Default(Option<Policy>),
    Shadow(Option<Policy>),
    /// The shadow policy becomes the default.
    Promote,
    Key(String, Option<Policy>),
}

impl Limits {
    pub(crate) fn new(table: Arc<Table>) -> Self {
        Self { table }
    }

    /// Sets `key`'s policy, replacing any override it had.
    pub async fn set(&self, key: &str, policy: Policy) -> Result<(), LimitsError> {
        self.apply(Change::Key(key.to_owned(), Some(policy)))
            .await
            .map(drop)
    }

    /// Removes `key`'s override; `Ok(false)` when it had none. The key is
    /// limited by the default again.
    pub async fn remove(&self, key: &str) -> Result<bool, LimitsError> {
        self.apply(Change::Key(key.to_owned(), None)).await
    }

    /// Sets the default: the policy of every key without an override,
    /// in place of the layer's configured policy.
    pub async fn set_default(&self, policy: Policy) -> Result<(), LimitsError> {
        self.apply(Change::Default(Some(policy))).await.map(drop)
    }

    /// Goes back to the layer's configured policy for keys without an override.
    pub async fn reset_default(&self) -> Result<(), LimitsError> {
        self.apply(Change::Default(None)).await.map(drop)
    }

    /// Runs `policy` in shadow beside the default: every request of a key
    /// without an override is also charged against it, in state of its
    /// own, and would-be rejections are counted
    /// (`ratelimit_shadow_policy_rejections_total`, labelled with the
    /// policy's text); nothing is rejected by it. Replaces any shadow
    /// policy. A second store call per request, off the response path,
    /// while it runs; not in the coordinated mode.
    pub async fn shadow(&self, policy: Policy) -> Result<(), LimitsError> {
        self.apply(Change::Shadow(Some(policy))).await.map(drop)
    }

    /// Stops the shadow policy; `Ok(false)` when none ran.
    pub async fn stop_shadow(&self) -> Result<bool, LimitsError> {
        self.apply(Change::Shadow(None)).await
    }

    /// Makes the shadow policy the default, in one change; `Ok(false)`
    /// (and nothing changes) when none runs.
    pub async fn promote(&self) -> Result<bool, LimitsError> {
        self.apply(Change::Promote).await
    }

    /// The policy running in shadow, if one does.
    pub fn shadow_policy(&self) -> Option<Policy> {
        self.table.snapshot().snap.shadow.clone()
    }

    /// `key`'s override, if it has one.
    pub fn get(&self, key: &str) -> Option<Policy> {
        self.table.snapshot().snap.keys.get(key).cloned()
    }

    /// The runtime default, if one was set.
    pub fn default_policy(&self) -> Option<Policy> {
        self.table.snapshot().snap.default.clone()
    }

    /// Every override, by key.
    pub fn overrides(&self) -> Vec<(String, Policy)> {
        self.table
            .snapshot()
            .snap
            .keys
            .iter()
            .map(|(k, p)| (k.clone(), p.clone()))
            .collect()
    }

    /// Reads the shared limits from Redis now (a restarted instance does
    /// this before its first request through
    /// [`RateLimitLayer::connect`](crate::RateLimitLayer::connect)). Without
    /// [`SharedLimits`] it does nothing.
    pub async fn refresh(&self) -> Result<(), StoreError> {
        #[cfg(feature = "redis")]
        if let Some(shared) = &self.table.shared {
            return shared.refresh(&self.table).await;
        }
        Ok(())
    }

    /// Makes `change`; whether what it changes was there before.
    async fn apply(&self, change: Change) -> Result<bool, LimitsError> {
        #[cfg(feature = "redis")]
        if let Some(shared) = &self.table.shared {
            // Checked here, then written to Redis in one transaction that
            // reads the whole table back.
            self.table.check(&change, &self.table.snapshot().snap)?;
            return Ok(shared.write(&self.table, &change).await?);
        }
        let _one_at_a_time = self
            .table
            .changing
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (next, existed) = self.table.changed(&change)?;
        self.table.install(next);
        Ok(existed)
    }
}

impl fmt::Debug for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.table.snapshot();
        let snap = &t.snap;
        f.debug_struct("Limits")
            .field("default", &snap.default.as_ref().map(|p| p.to_string()))
            .field("shadow", &snap.shadow.as_ref().map(|p| p.to_string()))
            .field("overrides", &snap.keys.len())
            .finish_non_exhaustive()
    }
}

/// The rate limiter's view of a layer's table ([`Overrides`]).
pub(crate) struct Hook(pub(crate) Arc<Table>);

impl Overrides for Hook {
    #[inline]
    fn policy(&self, key: &Key) -> Option<Policy> {
        self.0.policy(key)
    }

    #[inline]
    fn shadow(&self, key: &Key) -> Option<Policy> {
        self.0.shadow(key)
    }

    fn start(&self) {
        self.0.start();
    }
}

#[cfg(feature = "redis")]
pub(crate) use shared::Shared;
#[cfg(feature = "redis")]
pub use shared::SharedLimits;

#[cfg(feature = "redis")]
mod shared;
