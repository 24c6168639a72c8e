//! The advisor's windows merged across the fleet in Redis: each instance
//! adds its closed windows' heavy keys into one sorted set per window
//! (`ZINCRBY`, so counts from every instance sum), kept for the advisor's
//! span; a fleet report reads the heaviest of each.

use super::store::RedisStore;
use crate::error::StoreError;
use crate::key::Key;
use crate::store::call::Namespace;
use redis::Value;
use std::time::Duration;

/// One closed window's heavy keys, with their tier's text and counts.
pub(crate) type Window = Vec<(Key, String, u64)>;

/// Where a layer's windows live in Redis.
pub(crate) struct FleetAdvice {
    store: RedisStore,
    base: String,
    /// How long a window's set is kept: the advisor's span.
    keep_ms: u64,
}

/// Each Redis call's budget.
const TIMEOUT: Duration = Duration::from_secs(1);

impl FleetAdvice {
    pub(crate) fn new(store: RedisStore, namespace: &Namespace, keep: Duration) -> Self {
        // The same empty-composite tag as the shared limits: no client key makes it.
        let base = store.redis_key(namespace, &Key::composite(&[]));
        Self {
            store,
            base: format!("{base}:advice"),
            keep_ms: keep.as_millis() as u64,
        }
    }

    fn key(&self, id: u64) -> String {
        format!("{}:{id}", self.base)
    }

    /// Adds closed windows (by window id) to the fleet's.
    pub(crate) async fn write(&self, windows: Vec<(u64, Window)>) -> Result<(), StoreError> {
        if windows.iter().all(|(_, w)| w.is_empty()) {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for (id, entries) in &windows {
            if entries.is_empty() {
                continue;
            }
            let key = self.key(*id);
            for (k, tier, count) in entries {
                pipe.cmd("ZINCRBY")
                    .arg(&key)
                    .arg(*count)
                    .arg(member(k, tier))
                    .ignore();
            }
            pipe.cmd("PEXPIRE").arg(&key).arg(self.keep_ms).ignore();
        }
        self.store.query_pipeline(pipe, TIMEOUT).await.map(drop)
    }

    /// The `top` heaviest keys of each window from `first` to `last`.
    pub(crate) async fn read(
        &self,
        first: u64,
        last: u64,
        top: usize,
    ) -> Result<Vec<Window>, StoreError> {
        let mut pipe = redis::pipe();
        for id in first..=last {
            pipe.cmd("ZREVRANGE")
                .arg(self.key(id))
                .arg(0)
                .arg(top.saturating_sub(1))
                .arg("WITHSCORES");
        }
        let replies = self.store.query_pipeline(pipe, TIMEOUT).await?;
        Ok(replies.into_iter().map(window).collect())
    }
}

/// A sorted-set member: the key's length, its bytes, then the tier's text.
fn member(key: &Key, tier: &str) -> Vec<u8> {
    let k = key.as_bytes();
    let mut m = Vec::with_capacity(1 + k.len() + tier.len());
    m.push(k.len() as u8);
    m.extend_from_slice(k);
    m.extend_from_slice(tier.as_bytes());
    m
}

/// One window from `ZREVRANGE … WITHSCORES` (redis-rs reads RESP2's flat
/// list and RESP3's pairs alike); members that do not decode are left out,
/// and so is a reply of another shape.
fn window(reply: Value) -> Window {
    let pairs: Vec<(Vec<u8>, f64)> = redis::from_redis_value(reply).unwrap_or_default();
    pairs
        .into_iter()
        .filter_map(|(m, score)| {
            let (&len, rest) = m.split_first()?;
            let (k, tier) = rest.split_at_checked(len as usize)?;
            Some((
                Key::decode(k)?,
                String::from_utf8(tier.to_vec()).ok()?,
                score as u64,
            ))
        })
        .collect()
}
