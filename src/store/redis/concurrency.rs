//! Fleet-wide concurrency slots on [`RedisStore`]: one `EVALSHA` per
//! acquire and per release (`lua/concurrency_*.lua`).

use super::store::{invoke, RedisStore};
use super::{keys, scripts};
use crate::error::StoreError;
use crate::key::Key;
use crate::store::call::Namespace;
use crate::store::future::StoreFuture;
use crate::store::slots::{Acquire, Occupancy, Release};

impl RedisStore {
    /// The Redis key holding `key`'s concurrency slots for the limiter
    /// `namespace`: a sorted set of slot ids scored by lease expiry (Unix ms
    /// by Redis's clock, which times every lease),
    /// e.g. `trl:concurrency:{9f86d081884c7d65…}:slots`.
    ///
    /// ```
    /// use tower_ratelimit::{key::Key, store::{Namespace, RedisStore}};
    /// let store = RedisStore::new("redis://127.0.0.1").unwrap();
    /// let k = store.slots_key(&Namespace::new("concurrency"), &Key::new("tenant-1"));
    /// assert!(k.starts_with("trl:concurrency:{") && k.ends_with("}:slots"));
    /// ```
    pub fn slots_key(&self, namespace: &Namespace, key: &Key) -> String {
        format!("{}{SLOTS}", self.redis_key(namespace, key))
    }

    /// An `EVALSHA` of `script` on `key`'s slots and tombstones, with the
    /// caller's time (echoed back; leases are timed by Redis `TIME`) and
    /// the lease. Both keys are the rate limiter's key for the same client
    /// with a suffix, so they share one hash slot and never collide.
    fn slot_cmd(
        &self,
        script: &redis::Script,
        namespace: &Namespace,
        key: &Key,
        now: u64,
        lease: std::time::Duration,
    ) -> redis::Cmd {
        let base = keys::hash_key(&self.inner.prefix, namespace, key);
        let with = |suffix: &str| {
            let mut k = base.clone();
            k.extend_from_slice(suffix.as_bytes());
            k
        };
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash())
            .arg(2)
            .arg(&with(SLOTS)[..])
            .arg(&with(RELEASED)[..])
            .arg(now)
            .arg(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX));
        cmd
    }
}

/// The suffixes of a client's slots and tombstones keys.
const SLOTS: &str = ":slots";
const RELEASED: &str = ":released";

/// An acquire's reply, `{acquired, in_flight, the time sent}`.
pub(super) fn decode(sent: u64, reply: &[i64]) -> Result<Occupancy, StoreError> {
    match *reply {
        [acquired @ (0 | 1), in_flight, echo] if in_flight >= 0 => {
            if u64::try_from(echo).ok() != Some(sent) {
                // A reply to another call (a desynchronised connection) is caught, never used.
                return Err(StoreError::Protocol(format!(
                    "reply for time {echo} does not belong to an acquire sent at {sent}"
                )));
            }
            Ok(Occupancy {
                acquired: acquired == 1,
                in_flight: in_flight as u64,
            })
        }
        _ => Err(StoreError::Protocol(format!(
            "concurrency acquire script returned {}",
            super::reply::shown(&reply)
        ))),
    }
}

impl RedisStore {
    /// [`Store::acquire`](crate::store::Store::acquire).
    pub(super) fn acquire_slot(
        &self,
        call: &Acquire<'_>,
    ) -> StoreFuture<Result<Occupancy, StoreError>> {
        let sent = call.now_ms;
        let script = &*scripts::CONCURRENCY_ACQUIRE;
        let mut cmd = self.slot_cmd(script, call.namespace, call.key, sent, call.lease);
        cmd.arg(call.limit).arg(call.id.to_string());
        let budget = call.timeout;
        self.call(|inner| async move {
            let reply: Vec<i64> = invoke(&inner.primary, script, cmd, budget).await?;
            decode(sent, &reply)
        })
    }

    /// [`Store::release`](crate::store::Store::release).
    pub(super) fn release_slot(&self, call: &Release<'_>) -> StoreFuture<Result<(), StoreError>> {
        let script = &*scripts::CONCURRENCY_RELEASE;
        let mut cmd = self.slot_cmd(script, call.namespace, call.key, call.now_ms, call.lease);
        cmd.arg(call.id.to_string());
        let budget = call.timeout;
        self.call(|inner| async move {
            let _released: i64 = invoke(&inner.primary, script, cmd, budget).await?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_that_do_not_belong_to_the_call_are_protocol_errors() {
        assert_eq!(
            decode(5, &[1, 3, 5]).unwrap(),
            Occupancy {
                acquired: true,
                in_flight: 3
            }
        );
        assert!(decode(9, &[0, 2, 9]).is_ok());
        assert!(decode(5, &[1, 3, 6]).is_err(), "another call's time");
        assert!(decode(5, &[2, 3, 5]).is_err());
        assert!(decode(5, &[1, -1, 5]).is_err());
        assert!(decode(5, &[1, 3]).is_err());
        assert!(decode(5, &[1, 3, -5]).is_err());
    }
}
