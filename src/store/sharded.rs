//! Several stores as one: each client key lives on exactly one shard, chosen
//! by rendezvous (highest-random-weight) hashing, so adding a shard moves only
//! about `1/N` of the keys and a dead shard affects only its own keys.
//!
//! ```
//! use tower_ratelimit::key::Key;
//! use tower_ratelimit::store::{MemoryStore, Namespace, ShardedStore};
//!
//! // Usually Redis primaries (see `ShardedStoreBuilder::shard`); any store works.
//! let store = ShardedStore::builder()
//!     .named_shard("a", MemoryStore::new())
//!     .named_shard("b", MemoryStore::new())
//!     .named_shard("c", MemoryStore::new())
//!     .build()
//!     .unwrap();
//! let ns = Namespace::new("api");
//! // Every process configured with the same shard names agrees on this.
//! let shard = store.shard_for(&ns, &Key::new("alice"));
//! assert!(["a", "b", "c"].contains(&shard));
//! ```
//!
//! # The mapping (stable across processes and versions)
//!
//! A fleet must agree on where each key lives, so the mapping depends only on
//! the shard *names* (not their order or number in the list) and is frozen:
//!
//! 1. the key's point `k` is the first 8 bytes, little-endian, of
//!    `SHA-256(namespace name ‖ 0x00 ‖ key bytes)` (the key bytes are
//!    [`Key::as_bytes`], which start with the key's type tag);
//! 2. each shard's seed `s` is the first 8 bytes, little-endian, of
//!    `SHA-256(shard name)`;
//! 3. the shard's score is the SplitMix64 finalizer of `k XOR s`; the highest
//!    score wins (equal scores, which do not happen in practice, go to the
//!    smaller name).
//!
//! Adding a shard takes over exactly the keys for which it now scores highest
//! (about `1/(N+1)` of them), and no key moves between the old shards; removing
//! one moves only its keys. A Redis shard's default name is its primary's
//! `host:port/db` (never its credentials), so rotating a password or listing
//! shards in another order moves nothing; renaming or readdressing a shard
//! moves its keys (give it an explicit name with
//! [`ShardedStoreBuilder::named_shard`] to keep them).
//!
//! # Failures
//!
//! Each shard is its own failure domain
//! ([`Store::failure_domain`]): the layer keeps one circuit breaker per shard,
//! so while one shard is down its keys are answered per the failure policy
//! and every other key is still limited exactly.

use super::backend::Store;
use super::call::{Charge, Namespace, Settle};
use super::future::StoreFuture;
use super::slots::{Acquire, Occupancy, Release};
use crate::decision::Decision;
use crate::error::ConfigErrorKind;
use crate::error::{ConfigError, StoreError};
use crate::key::Key;
use sha2::{Digest, Sha256};
use std::fmt;
use std::sync::Arc;

/// A store spread over several shards (usually Redis primaries, each with its
/// own replicas). Clones share the shards.
#[derive(Clone)]
pub struct ShardedStore {
    inner: Arc<Inner>,
}

struct Inner {
    shards: Box<[Shard]>,
    /// Failure domains before each shard's own (a shard may have several).
    domain_offsets: Box<[usize]>,
    domains: usize,
}

struct Shard {
    name: String,
    seed: u64,
    store: Arc<dyn Store>,
    /// The same store, when it is a Redis one (the coordinated mode syncs
    /// through it).
    #[cfg(feature = "redis")]
    redis: Option<super::redis::RedisStore>,
}

impl Shard {
    fn new(name: String, store: Arc<dyn Store>) -> Self {
        Self {
            seed: digest64(&[name.as_bytes()]),
            name,
            store,
            #[cfg(feature = "redis")]
            redis: None,
        }
    }
}

/// Configures a [`ShardedStore`].
#[must_use]
#[derive(Default)]
pub struct ShardedStoreBuilder {
    shards: Vec<Shard>,
}

impl fmt::Debug for ShardedStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardedStoreBuilder")
            .field(
                "shards",
                &self.shards.iter().map(|s| &s.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl ShardedStoreBuilder {
    /// Adds a Redis shard (its primary, and the replicas it was built with),
    /// named after its primary's `host:port/db`.
    ///
    /// ```
    /// use tower_ratelimit::store::{RedisStore, ShardedStore};
    /// # fn main() -> Result<(), tower_ratelimit::ConfigError> {
    /// let store = ShardedStore::builder()
    ///     .shard(RedisStore::builder("redis://10.0.0.1").replica("redis://10.0.0.11").build()?)
    ///     .shard(RedisStore::builder("redis://10.0.0.2").replica("redis://10.0.0.12").build()?)
    ///     .build()?;
    /// assert_eq!(store.shard_names().collect::<Vec<_>>(), ["10.0.0.1:6379/0", "10.0.0.2:6379/0"]);
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn shard(mut self, store: super::redis::RedisStore) -> Self {
        let mut shard = Shard::new(store.shard_name().to_owned(), Arc::new(store.clone()));
        shard.redis = Some(store);
        self.shards.push(shard);
        self
    }

    /// Adds any store as a shard under `name`, its identity in the mapping:
    /// every instance of the fleet must use the same names.
    ///
    /// ```
    /// use tower_ratelimit::store::{MemoryStore, ShardedStore};
    /// let store = ShardedStore::builder()
    ///     .named_shard("eu-1", MemoryStore::new())
    ///     .named_shard("eu-2", MemoryStore::new())
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn named_shard(mut self, name: impl Into<String>, store: impl Store) -> Self {
        self.shards.push(Shard::new(name.into(), Arc::new(store)));
        self
    }

    /// Checks the shards (at least one; names non-empty and distinct) and builds the store.
    pub fn build(self) -> Result<ShardedStore, ConfigError> {
        if self.shards.is_empty() {
            return Err(ConfigError::new(
                ConfigErrorKind::Missing,
                "a sharded store needs at least one shard",
            ));
        }
        let mut names: Vec<&str> = self.shards.iter().map(|s| s.name.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(ConfigError::new(
                ConfigErrorKind::Conflict,
                format!(
                    "shard {:?} is configured twice: each shard needs a distinct name",
                    w[0]
                ),
            ));
        }
        if names.first().is_some_and(|n| n.is_empty()) {
            return Err(ConfigError::new(
                ConfigErrorKind::Invalid,
                "a shard name must not be empty",
            ));
        }
        let shards: Box<[Shard]> = self.shards.into();
        let mut domains = 0;
        let domain_offsets = shards
            .iter()
            .map(|s| {
                let offset = domains;
                domains += s.store.failure_domains().max(1);
                offset
            })
            .collect();
        Ok(ShardedStore {
            inner: Arc::new(Inner {
                shards,
                domain_offsets,
                domains,
            }),
        })
    }
}

/// The first 8 bytes, little-endian, of SHA-256 over `parts` concatenated.
fn digest64(parts: &[&[u8]]) -> u64 {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
    }
    let d = h.finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    u64::from_le_bytes(b)
}

/// SplitMix64's finalizer: a fixed bijection with full avalanche.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl ShardedStore {
    /// Starts configuring a sharded store.
    pub fn builder() -> ShardedStoreBuilder {
        ShardedStoreBuilder::default()
    }

    /// A store over the Redis primaries at `urls`, one shard each, with default
    /// settings and no replicas (use [`ShardedStore::builder`] for more).
    ///
    /// ```
    /// use tower_ratelimit::store::ShardedStore;
    /// let store = ShardedStore::from_urls(["redis://10.0.0.1", "redis://10.0.0.2"]).unwrap();
    /// ```
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn from_urls<I>(urls: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        urls.into_iter()
            .try_fold(Self::builder(), |b, url| {
                Ok(b.shard(super::redis::RedisStore::new(url)?))
            })?
            .build()
    }

    /// The shards' names, in the order they were added.
    pub fn shard_names(&self) -> impl Iterator<Item = &str> {
        self.inner.shards.iter().map(|s| s.name.as_str())
    }

    /// The name of the shard holding `key`'s state in `namespace`.
    pub fn shard_for(&self, namespace: &Namespace, key: &Key) -> &str {
        &self.inner.shards[self.index(namespace, key)].name
    }

    /// Each shard's Redis store, in order, when every shard is one.
    #[cfg(feature = "coordinated")]
    pub(crate) fn redis_shards(&self) -> Option<Vec<super::redis::RedisStore>> {
        self.inner.shards.iter().map(|s| s.redis.clone()).collect()
    }

    /// Rendezvous hashing: the shard with the highest score for the key.
    pub(crate) fn index(&self, namespace: &Namespace, key: &Key) -> usize {
        let shards = &self.inner.shards;
        if shards.len() == 1 {
            return 0;
        }
        let point = digest64(&[namespace.name().as_bytes(), &[0], key.as_bytes()]);
        let mut best = 0;
        let mut best_score = mix(point ^ shards[0].seed);
        for (i, s) in shards.iter().enumerate().skip(1) {
            let score = mix(point ^ s.seed);
            if score > best_score || (score == best_score && s.name < shards[best].name) {
                best = i;
                best_score = score;
            }
        }
        best
    }

    fn shard(&self, namespace: &Namespace, key: &Key) -> &dyn Store {
        &*self.inner.shards[self.index(namespace, key)].store
    }
}

impl Store for ShardedStore {
    fn charge(&self, call: &Charge<'_>) -> StoreFuture<Result<Decision, StoreError>> {
        self.shard(call.namespace, call.key).charge(call)
    }

    /// Settles on the shard the key maps to now: after a shard was added the
    /// key may have moved, and the settlement then finds no matching window
    /// there and changes nothing (it never reaches a newer window).
    fn charge_shadow(&self, call: &Charge<'_>) -> StoreFuture<Result<Decision, StoreError>> {
        self.shard(call.namespace, call.key).charge_shadow(call)
    }

    fn settle(&self, call: &Settle<'_>) -> StoreFuture<Result<(), StoreError>> {
        self.shard(call.charge.namespace, call.charge.key)
            .settle(call)
    }

    fn status(&self, call: &Charge<'_>) -> StoreFuture<Result<Decision, StoreError>> {
        self.shard(call.namespace, call.key).status(call)
    }

    fn acquire(&self, call: &Acquire<'_>) -> StoreFuture<Result<Occupancy, StoreError>> {
        self.shard(call.namespace, call.key).acquire(call)
    }

    fn release(&self, call: &Release<'_>) -> StoreFuture<Result<(), StoreError>> {
        self.shard(call.namespace, call.key).release(call)
    }

    fn keeps_slots(&self) -> bool {
        self.inner.shards.iter().all(|s| s.store.keeps_slots())
    }

    fn is_local(&self) -> bool {
        self.inner.shards.iter().all(|s| s.store.is_local())
    }

    fn bounds_calls(&self) -> bool {
        self.inner.shards.iter().all(|s| s.store.bounds_calls())
    }

    fn failure_domain(&self, namespace: &Namespace, key: &Key) -> usize {
        let i = self.index(namespace, key);
        let shard = &self.inner.shards[i].store;
        let own = shard.failure_domain(namespace, key) % shard.failure_domains().max(1);
        self.inner.domain_offsets[i] + own
    }

    fn failure_domains(&self) -> usize {
        self.inner.domains
    }

    /// Refused when any shard refuses it.
    fn check_policy(&self, policy: &crate::Policy) -> Result<(), crate::error::ConfigError> {
        self.inner
            .shards
            .iter()
            .try_for_each(|s| s.store.check_policy(policy))
    }

    /// Its shards' identities, when each has one.
    fn identity(&self) -> Option<String> {
        let shards: Option<Vec<String>> = self
            .inner
            .shards
            .iter()
            .map(|s| s.store.identity())
            .collect();
        Some(format!("sharded[{}]", shards?.join(",")))
    }

    /// The first shard's clock that answers with one: each shard's own
    /// offset is what its keys see, and they are usually one fleet's hosts.
    fn time(&self) -> StoreFuture<Result<Option<u64>, StoreError>> {
        let shards: Vec<_> = self.inner.shards.iter().map(|s| s.store.time()).collect();
        StoreFuture::pending(async move {
            let mut first = Ok(None);
            for shard in shards {
                match shard.await {
                    Ok(Some(t)) => return Ok(Some(t)),
                    Ok(None) => {}
                    Err(e) => first = first.and(Err(e)),
                }
            }
            first
        })
    }

    /// Connects every shard; the first failure is returned once all have tried.
    fn connect(&self) -> StoreFuture<Result<(), StoreError>> {
        let shards: Vec<_> = self
            .inner
            .shards
            .iter()
            .map(|s| s.store.connect())
            .collect();
        StoreFuture::pending(async move {
            let mut first = Ok(());
            for shard in shards {
                let result = shard.await;
                first = first.and(result);
            }
            first
        })
    }
}

impl fmt::Debug for ShardedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardedStore")
            .field("shards", &self.shard_names().collect::<Vec<_>>())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    fn store(names: &[&str]) -> ShardedStore {
        names
            .iter()
            .fold(ShardedStore::builder(), |b, n| {
                b.named_shard(*n, MemoryStore::new())
            })
            .build()
            .unwrap()
    }

    fn keys(n: usize) -> Vec<Key> {
        (0..n).map(|i| Key::new(format!("client-{i}"))).collect()
    }

    #[test]
    fn the_mapping_is_frozen() {
        // Golden values: a change here moves every fleet's keys on upgrade.
        assert_eq!(digest64(&[b"a"]), 0xcabd_1bca_1281_97ca);
        assert_eq!(mix(0), 0);
        assert_eq!(mix(1), 0x5692_161d_100b_05e5);
        let s = store(&["a", "b", "c"]);
        let ns = Namespace::new("api");
        let got: Vec<&str> = ["alice", "bob", "carol", "dave", "erin"]
            .iter()
            .map(|k| s.shard_for(&ns, &Key::new(*k)))
            .collect();
        assert_eq!(got, GOLDEN);
    }

    const GOLDEN: [&str; 5] = ["c", "b", "c", "b", "c"];

    #[test]
    fn order_of_shards_does_not_matter() {
        let (a, b) = (store(&["a", "b", "c"]), store(&["c", "a", "b"]));
        let ns = Namespace::new("x");
        for k in keys(1000) {
            assert_eq!(a.shard_for(&ns, &k), b.shard_for(&ns, &k));
        }
    }

    #[test]
    fn keys_spread_evenly_and_a_fourth_shard_takes_a_quarter_from_every_shard() {
        let three = store(&["r1:6379/0", "r2:6379/0", "r3:6379/0"]);
        let four = store(&["r1:6379/0", "r2:6379/0", "r3:6379/0", "r4:6379/0"]);
        let ns = Namespace::new("default");
        let ks = keys(10_000);
        let mut counts = std::collections::HashMap::new();
        let mut moved = 0;
        for k in &ks {
            let before = three.shard_for(&ns, k);
            let after = four.shard_for(&ns, k);
            *counts.entry(before).or_insert(0) += 1;
            if before != after {
                assert_eq!(after, "r4:6379/0", "keys only move to the new shard");
                moved += 1;
            }
        }
        for (name, n) in counts {
            assert!((3_000..=3_667).contains(&n), "{name}: {n} of 10000");
        }
        assert!((2_000..=3_000).contains(&moved), "{moved} of 10000 moved");
    }

    #[test]
    fn each_shard_is_its_own_failure_domain() {
        let s = store(&["a", "b", "c"]);
        assert_eq!(s.failure_domains(), 3);
        let ns = Namespace::new("x");
        for k in keys(100) {
            let name = s.shard_for(&ns, &k);
            let i = s.shard_names().position(|n| n == name).unwrap();
            assert_eq!(s.failure_domain(&ns, &k), i);
        }
        assert!(s.is_local());
    }

    #[test]
    fn duplicate_empty_or_no_shards_are_configuration_errors() {
        assert!(ShardedStore::builder().build().is_err());
        assert!(ShardedStore::builder()
            .named_shard("a", MemoryStore::new())
            .named_shard("a", MemoryStore::new())
            .build()
            .is_err());
        assert!(ShardedStore::builder()
            .named_shard("", MemoryStore::new())
            .build()
            .is_err());
    }
}
