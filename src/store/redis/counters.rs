//! The coordinated mode's counters (see `store::coordinated`): per key and
//! sync interval, a hash of what the whole fleet was offered (`o`) and
//! admitted (`a`), to which every instance adds its own counts (`HINCRBY`)
//! and which each reads (`HMGET`) once all have reported. Each counter
//! outlives its interval by a few more, then expires. One round trip per
//! Redis node per sync, whatever the request rate.

use super::store::RedisStore;
use crate::error::StoreError;
use crate::key::Key;
use crate::store::call::Namespace;
use redis::{Cmd, Value};
use std::time::Duration;

/// One interval of one instance's counts of a key.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Report {
    pub(crate) epoch: u64,
    pub(crate) offered: u64,
    pub(crate) admitted: u64,
}

/// One key's part of a sync: the intervals it reports, and the one it reads.
#[derive(Debug)]
pub(crate) struct CounterSync<'a> {
    pub(crate) key: &'a Key,
    pub(crate) reports: &'a [Report],
    pub(crate) read: u64,
}

/// What a sync did for one key.
#[derive(Debug)]
pub(crate) struct Synced {
    /// Whether its reports landed (a failed `HINCRBY` may have run: never
    /// sent again).
    pub(crate) landed: Result<(), StoreError>,
    /// The fleet's offered and admitted units in the interval read.
    pub(crate) fleet: Result<(u64, u64), StoreError>,
}

impl RedisStore {
    /// The hash of `key`'s counts in interval `epoch`.
    fn counter(&self, namespace: &Namespace, key: &Key, epoch: u64) -> String {
        format!("{}:c:{epoch}", self.redis_key(namespace, key))
    }

    /// Reports and reads the counters of `items` (the keys of limiter
    /// `namespace`), each report kept for `ttl_ms`, within `budget`.
    pub(crate) async fn sync_counters(
        &self,
        namespace: &Namespace,
        items: &[CounterSync<'_>],
        ttl_ms: u64,
        budget: Duration,
    ) -> Vec<Synced> {
        let mut cmds = Vec::new();
        // Per command: the item it serves, and whether it is the item's read.
        let mut owners = Vec::new();
        for (i, item) in items.iter().enumerate() {
            for r in item.reports {
                let counter = self.counter(namespace, item.key, r.epoch);
                for (field, n) in [("o", r.offered), ("a", r.admitted)] {
                    let n = n.min(i64::MAX as u64);
                    cmds.push(take(redis::cmd("HINCRBY").arg(&counter).arg(field).arg(n)));
                    owners.push((i, false));
                }
                cmds.push(take(redis::cmd("PEXPIRE").arg(&counter).arg(ttl_ms)));
                owners.push((i, false));
            }
            let counter = self.counter(namespace, item.key, item.read);
            cmds.push(take(redis::cmd("HMGET").arg(counter).arg("o").arg("a")));
            owners.push((i, true));
        }
        let mut out: Vec<Synced> = items
            .iter()
            .map(|_| Synced {
                landed: Ok(()),
                fleet: Err(StoreError::Protocol("no answer to a counter read".into())),
            })
            .collect();
        let replies = self.spread(cmds, budget).await;
        for (reply, (i, read)) in replies.into_iter().zip(owners) {
            match (reply, read) {
                (reply, true) => out[i].fleet = reply.map(|v| tally(&v)),
                (Err(e), false) => out[i].landed = Err(e),
                (Ok(_), false) => {}
            }
        }
        out
    }
}

fn take(cmd: &mut Cmd) -> Cmd {
    std::mem::take(cmd)
}

/// The offered and admitted units an `HMGET` answered (missing: 0).
fn tally(v: &Value) -> (u64, u64) {
    let Value::Array(fields) = v else {
        return (0, 0);
    };
    let field = |i: usize| fields.get(i).map_or(0, count);
    (field(0), field(1))
}

/// The number a counter field holds (none: 0).
fn count(v: &Value) -> u64 {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        Value::Int(i) => (*i).max(0) as u64,
        _ => 0,
    }
}
