//! A task that runs every interval on the application's tokio runtime for
//! as long as its owner lives: the coordinated mode's sync and the shared
//! limits' poll.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Started at most once; started only where a tokio runtime runs, so a
/// layer built outside one starts it on its first request.
#[derive(Debug, Default)]
pub(crate) struct Periodic {
    started: AtomicBool,
}

impl Periodic {
    /// Runs `tick(owner)` every `period`, the first at once, until `owner`
    /// is dropped. Does nothing when started already or when no tokio
    /// runtime runs here (a later call may start it).
    pub(crate) fn start<T, F, Fut>(&self, owner: &Arc<T>, period: Duration, tick: F)
    where
        T: Send + Sync + 'static,
        F: Fn(Arc<T>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send,
    {
        if self.started.load(Ordering::Relaxed) || self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.started.store(false, Ordering::Release);
            return;
        };
        let weak: Weak<T> = Arc::downgrade(owner);
        rt.spawn(async move {
            let mut every = tokio::time::interval(period);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                // The owner is gone: stop.
                let Some(owner) = weak.upgrade() else { return };
                tick(owner).await;
            }
        });
    }
}
