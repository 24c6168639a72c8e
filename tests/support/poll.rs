//! Waiting, in async tests, for what other tasks do.
#![allow(dead_code)]

use std::time::{Duration, Instant};

/// Polls `cond` every 2 ms until it holds; panics after `within`.
pub async fn eventually(within: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
