//! The thread where the store runs what redis-rs connects and drives itself.
//!
//! A standalone primary's and its replicas' calls are made on the
//! application's runtime, by the lanes' runners (see [`super::runner`]).
//! Two things run instead on one small tokio runtime of the crate's own
//! (thread `tower-ratelimit-redis`, started on first use and shared by
//! every store in the process):
//!
//! - a Redis Cluster store's calls: redis-rs's cluster client spawns the
//!   tasks that read its connections, and a spawned reader whose replies
//!   wait for a saturated runtime to poll it would turn a healthy cluster's
//!   late-polled replies into timeouts. On this thread they are read as
//!   they arrive and timed against Redis alone;
//! - asking Sentinel where the primary is: its connections to the
//!   sentinels live here between failovers, whatever runtime asks.
//!
//! A caller waits for the answer on a channel, from whatever runtime it
//! runs on.

use crate::error::StoreError;
use std::future::Future;
use std::sync::OnceLock;
use tokio::runtime::{Builder, Handle};

/// The runtime's handle, made on first use; `None` if its thread could not
/// be made (calls then run on the caller's runtime, as tasks of their own).
static IO: OnceLock<Option<Handle>> = OnceLock::new();

fn runtime() -> Option<&'static Handle> {
    IO.get_or_init(|| {
        let start = || -> std::io::Result<Handle> {
            let rt = Builder::new_current_thread().enable_all().build()?;
            let handle = rt.handle().clone();
            // The thread drives the runtime, and every task spawned on it,
            // for the life of the process.
            std::thread::Builder::new()
                .name("tower-ratelimit-redis".into())
                .spawn(move || rt.block_on(std::future::pending::<()>()))?;
            Ok(handle)
        };
        start()
            .map_err(|e| tracing::warn!(error = %e, "cannot start the redis I/O thread; redis calls share the application's runtime"))
            .ok()
    })
    .as_ref()
}

/// Spawns `fut` on the Redis I/O runtime.
fn spawn<F>(fut: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    use tracing::instrument::WithSubscriber;
    // Its log lines go where the caller's would.
    let fut = fut.with_current_subscriber();
    match runtime() {
        Some(rt) => rt.spawn(fut),
        None => tokio::spawn(fut),
    }
}

/// A store call run on the Redis I/O runtime, as the store's answer: the
/// caller waits for it from its own runtime.
#[cfg(feature = "cluster")]
pub(crate) fn store_future<T, F>(fut: F) -> crate::store::future::StoreFuture<Result<T, StoreError>>
where
    F: Future<Output = Result<T, StoreError>> + Send + 'static,
    T: Send + 'static,
{
    crate::store::future::StoreFuture::pending(call(fut))
}

/// Runs a store call on the Redis I/O runtime; the caller waits for its
/// result from its own runtime.
pub(crate) async fn call<T, F>(fut: F) -> Result<T, StoreError>
where
    F: Future<Output = Result<T, StoreError>> + Send + 'static,
    T: Send + 'static,
{
    spawn(fut).await.unwrap_or_else(|e| {
        Err(StoreError::Unavailable(format!(
            "the redis call's task ended without an answer: {e}"
        )))
    })
}
