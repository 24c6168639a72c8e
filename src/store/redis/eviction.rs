//! Whether Redis may evict limiter keys: checked on every new primary
//! connection ([`EvictionCheck`]).

use crate::error::StoreError;
use redis::aio::ConnectionLike;

/// What to do when Redis may evict limiter keys (`maxmemory-policy` is not `noeviction`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EvictionCheck {
    /// Log a warning when a connection is made (the default). Evicted state
    /// reads as a fresh window: clients get a new quota early.
    #[default]
    Warn,
    /// Refuse to use the connection: every call fails (per the layer's failure
    /// policy) until Redis is configured with `noeviction`.
    Refuse,
}

/// Checks `maxmemory-policy` on a new primary connection (`shown` names it).
pub(super) async fn check_eviction(
    check: EvictionCheck,
    conn: &mut (impl ConnectionLike + Send),
    shown: &str,
) -> Result<(), StoreError> {
    let policy = match eviction_policy(conn).await {
        Ok(p) => p,
        Err(e) => {
            // Managed Redis often disables CONFIG: nothing to check then.
            tracing::debug!(redis = shown, error = %e, "could not read maxmemory-policy");
            return Ok(());
        }
    };
    if policy == "noeviction" {
        return Ok(());
    }
    let msg = format!(
        "redis maxmemory-policy is `{policy}` on {shown}: Redis may evict live rate-limit keys \
         (they all carry a TTL, so volatile-* policies evict them too), handing clients \
         fresh windows; configure `maxmemory-policy noeviction` for the limiter's Redis"
    );
    match check {
        EvictionCheck::Warn => {
            tracing::warn!("{msg}");
            Ok(())
        }
        EvictionCheck::Refuse => {
            tracing::error!("{msg}; refusing to use it");
            Err(StoreError::Unavailable(msg))
        }
    }
}

pub(super) fn eviction_policy_cmd() -> redis::Cmd {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory-policy");
    cmd
}

async fn eviction_policy(conn: &mut (impl ConnectionLike + Send)) -> Result<String, StoreError> {
    let v: Vec<String> = eviction_policy_cmd()
        .query_async(conn)
        .await
        .map_err(super::error::redis_error)?;
    policy_from_reply(&v)
}

pub(super) fn policy_from_reply(v: &[String]) -> Result<String, StoreError> {
    v.get(1)
        .cloned()
        .ok_or_else(|| StoreError::Protocol("CONFIG GET maxmemory-policy returned nothing".into()))
}
