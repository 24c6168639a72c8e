//! Shared multiplexed connections ("lanes") taken from a deadpool pool.
//!
//! Checking a connection out of `deadpool_redis` per request costs a recycle
//! round trip (`UNWATCH` + `PING`). Instead each lane keeps one
//! `MultiplexedConnection`: clones share its socket, concurrent commands are
//! pipelined on it, and each reply is matched to its own command even when
//! the caller's future was dropped mid-call (the late reply is discarded). A
//! lane whose connection failed is emptied and refilled from the pool, so a
//! broken or demoted (`READONLY`) connection is never reused.

use crate::error::StoreError;
use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::{self, RedisError};
use deadpool_redis::{Connection, Pool};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Checks a freshly made connection before it serves traffic.
pub(crate) type Vet = dyn Fn(MultiplexedConnection) -> crate::limiter::BoxFuture<Result<(), StoreError>>
    + Send
    + Sync;

pub(crate) struct Lanes {
    pool: Pool,
    lanes: Box<[Mutex<Option<MultiplexedConnection>>]>,
    next: AtomicUsize,
    vet: Option<Arc<Vet>>,
}

impl Lanes {
    pub(crate) fn new(pool: Pool, n: usize, vet: Option<Arc<Vet>>) -> Self {
        Self {
            pool,
            lanes: (0..n.max(1)).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
            vet,
        }
    }

    /// A connection to send one command on, and the lane it came from.
    pub(crate) async fn get(&self) -> Result<(usize, MultiplexedConnection), StoreError> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.lanes.len();
        if let Some(c) = self.lanes[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        {
            return Ok((i, c));
        }
        let conn = self.pool.get().await.map_err(pool_error)?;
        // Out of the pool for good: the lane owns it and drops it when it breaks.
        let conn = Connection::take(conn);
        if let Some(vet) = &self.vet {
            vet(conn.clone()).await?;
        }
        *self.lanes[i].lock().unwrap_or_else(PoisonError::into_inner) = Some(conn.clone());
        Ok((i, conn))
    }

    /// Sends `pipe` in one round trip within `budget` (used by the coordinated
    /// mode's periodic sync; never on a request's path).
    pub(crate) async fn query_pipeline(
        &self,
        pipe: &redis::Pipeline,
        budget: std::time::Duration,
    ) -> Result<Vec<redis::Value>, StoreError> {
        let call = async {
            let (i, mut conn) = self.get().await?;
            pipe.query_async::<Vec<redis::Value>>(&mut conn)
                .await
                .map_err(|e| {
                    if breaks_connection(&e) {
                        self.discard(i);
                    }
                    redis_error(e)
                })
        };
        tokio::time::timeout(budget, call)
            .await
            .map_err(|_| StoreError::Timeout(budget))?
    }

    /// Drops lane `i`'s connection after an error that may have broken it.
    pub(crate) fn discard(&self, i: usize) {
        self.lanes[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }
}

/// Whether a connection that produced `err` must not be used again.
pub(crate) fn breaks_connection(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_timeout()
        || err.is_unrecoverable_error()
        || err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
}

pub(crate) fn redis_error(err: RedisError) -> StoreError {
    if err.is_timeout() {
        StoreError::Unavailable(format!("redis timed out: {err}"))
    } else if err.is_io_error() || err.is_connection_dropped() || err.is_connection_refusal() {
        StoreError::Unavailable(format!("redis connection failed: {err}"))
    } else {
        StoreError::Response {
            code: err.code().map(str::to_owned),
            message: err.to_string(),
        }
    }
}

fn pool_error(err: deadpool_redis::PoolError) -> StoreError {
    match err {
        deadpool_redis::PoolError::Backend(e) => redis_error(e),
        other => StoreError::Unavailable(format!("redis pool: {other}")),
    }
}
