//! A layer's shared runtime limits in Redis: one hash (a field per entry),
//! a version counter each change bumps, and an epoch, a random id the first
//! change after the keys were lost makes anew. A change is one transaction
//! that writes, bumps the version and reads the whole table back; a read is
//! one transaction too. What the fields mean is the rate limiter's
//! (`rate::limits`); here are only the keys and the commands.

use super::store::RedisStore;
use crate::error::StoreError;
use crate::key::Key;
use crate::store::call::Namespace;
use redis::Value;
use std::sync::LazyLock;
use std::time::Duration;

/// Moves the `shadow` field to `default` inside Redis (`lua/limits_promote.lua`).
static PROMOTE: LazyLock<String> =
    LazyLock::new(|| include_str!("../../../lua/limits_promote.lua").to_owned());

/// Where one layer's table lives.
#[derive(Debug)]
pub(crate) struct Table {
    store: RedisStore,
    hash: String,
    version: String,
    epoch: String,
}

/// A change to one field of the table.
#[derive(Debug)]
pub(crate) enum Write<'a> {
    /// Sets `field` to the text.
    Set(&'a str, String),
    /// Removes `field`.
    Remove(&'a str),
    /// Moves `shadow` to `default` (`field` is `shadow`).
    Promote(&'a str),
}

/// The table as one atomic read saw it.
#[derive(Debug)]
pub(crate) struct Read {
    /// The version counter (0: none yet, nothing was ever changed).
    pub(crate) version: i64,
    /// The epoch (none: no change since the keys were lost).
    pub(crate) epoch: Option<Vec<u8>>,
    /// Every field and its value.
    pub(crate) entries: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Table {
    /// The table of the layer `namespace` in `store`'s Redis: under an
    /// empty composite key's tag, which no client's key makes.
    pub(crate) fn new(store: RedisStore, namespace: &Namespace) -> Self {
        let base = store.redis_key(namespace, &Key::composite(&[]));
        Self {
            store,
            hash: format!("{base}:limits"),
            version: format!("{base}:limits:v"),
            epoch: format!("{base}:limits:e"),
        }
    }

    /// Whether the table can live in this store: one primary (a Redis
    /// Cluster cannot run the transaction over three keys).
    pub(crate) fn supported(store: &RedisStore) -> bool {
        !store.is_cluster()
    }

    /// Writes `change` in one transaction that also bumps the version
    /// (starting an epoch if there is none) and reads the table back;
    /// whether the field was there before.
    pub(crate) async fn write(
        &self,
        change: Write<'_>,
        budget: Duration,
    ) -> Result<(bool, Read), StoreError> {
        let mut pipe = redis::pipe();
        pipe.atomic();
        let field = match &change {
            Write::Set(f, _) | Write::Remove(f) | Write::Promote(f) => *f,
        };
        // Whether it was there: HSET and HDEL would say it differently.
        pipe.cmd("HEXISTS").arg(&self.hash).arg(field);
        match change {
            Write::Set(f, value) => pipe.cmd("HSET").arg(&self.hash).arg(f).arg(value).ignore(),
            Write::Remove(f) => pipe.cmd("HDEL").arg(&self.hash).arg(f).ignore(),
            Write::Promote(_) => pipe
                .cmd("EVAL")
                .arg(PROMOTE.as_str())
                .arg(1)
                .arg(&self.hash)
                .ignore(),
        };
        pipe.cmd("SET")
            .arg(&self.epoch)
            .arg(format!("{:016x}", fastrand::u64(..)))
            .arg("NX")
            .ignore();
        pipe.cmd("INCR").arg(&self.version);
        pipe.cmd("GET").arg(&self.epoch);
        pipe.cmd("HGETALL").arg(&self.hash);
        let mut reply = self.store.query_pipeline(pipe, budget).await?;
        if reply.len() != 4 {
            return Err(protocol(format!("{} replies, not 4", reply.len())));
        }
        let existed = int(reply.remove(0))?.unwrap_or(0) > 0;
        Ok((existed, read(reply)?))
    }

    /// Reads the whole table in one transaction.
    pub(crate) async fn read(&self, budget: Duration) -> Result<Read, StoreError> {
        let mut pipe = redis::pipe();
        pipe.atomic();
        pipe.cmd("GET").arg(&self.version);
        pipe.cmd("GET").arg(&self.epoch);
        pipe.cmd("HGETALL").arg(&self.hash);
        read(self.store.query_pipeline(pipe, budget).await?)
    }

    /// The version and epoch alone (one round trip): what a poll reads.
    pub(crate) async fn version(
        &self,
        budget: Duration,
    ) -> Result<(i64, Option<Vec<u8>>), StoreError> {
        let mut pipe = redis::pipe();
        pipe.cmd("GET").arg(&self.version);
        pipe.cmd("GET").arg(&self.epoch);
        let [version, epoch]: [Value; 2] = self
            .store
            .query_pipeline(pipe, budget)
            .await?
            .try_into()
            .map_err(|r: Vec<Value>| protocol(format!("{} replies, not 2", r.len())))?;
        Ok((int(version)?.unwrap_or(0), bytes(epoch)?))
    }
}

/// `[version, epoch, hash]` as a transaction answers them.
fn read(reply: Vec<Value>) -> Result<Read, StoreError> {
    let [version, epoch, hash]: [Value; 3] = reply
        .try_into()
        .map_err(|r: Vec<Value>| protocol(format!("{} replies, not 3", r.len())))?;
    // HGETALL: a map in RESP3, a flat list in RESP2, nil for no hash.
    let entries =
        redis::from_redis_value(hash).map_err(|e| protocol(format!("HGETALL answered {e}")))?;
    Ok(Read {
        version: int(version)?.unwrap_or(0),
        epoch: bytes(epoch)?,
        entries,
    })
}

fn protocol(what: String) -> StoreError {
    StoreError::Protocol(format!("shared limits: {what}"))
}

/// An integer reply (`GET` of a counter, `INCR`, `HEXISTS`); `None` for nil.
fn int(v: Value) -> Result<Option<i64>, StoreError> {
    redis::from_redis_value(v).map_err(|e| protocol(format!("a count of {e}")))
}

fn bytes(v: Value) -> Result<Option<Vec<u8>>, StoreError> {
    redis::from_redis_value(v).map_err(|e| protocol(format!("an epoch of {e}")))
}
