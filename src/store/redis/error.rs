//! redis-rs's errors as the store's: which ones break a connection, and
//! what each is called.

use crate::error::StoreError;
use redis::RedisError;

/// Whether a connection that produced `err` must not be used again.
pub(crate) fn breaks_connection(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_timeout()
        || err.is_unrecoverable_error()
        || err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
}

/// The store error for a redis-rs error.
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
