//! Pieces shared by the example servers (flag parsing, shutdown).
#![allow(dead_code)]

use std::time::Duration;
use tower_ratelimit::{Algorithm, ConfigError, Policy, Quota};

/// `--algorithm` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AlgorithmArg {
    FixedWindow,
    TokenBucket,
    SlidingWindow,
    Gcra,
    SlidingLog,
}

impl From<AlgorithmArg> for Algorithm {
    fn from(a: AlgorithmArg) -> Self {
        match a {
            AlgorithmArg::FixedWindow => Algorithm::FixedWindow,
            AlgorithmArg::TokenBucket => Algorithm::TokenBucket,
            AlgorithmArg::SlidingWindow => Algorithm::SlidingWindow,
            AlgorithmArg::Gcra => Algorithm::Gcra,
            AlgorithmArg::SlidingLog => Algorithm::SlidingLog,
        }
    }
}

/// Parses a quota `LIMIT/WINDOW`: `10/1s`, `1000/1h`, `5/500ms`.
pub fn parse_quota(s: &str) -> Result<(u64, Duration), String> {
    let (limit, window) = s
        .split_once('/')
        .ok_or_else(|| format!("`{s}` is not a quota like 10/1s or 1000/1h"))?;
    let limit = limit
        .trim()
        .parse()
        .map_err(|_| format!("`{limit}` in `{s}` is not a whole number of requests"))?;
    Ok((limit, parse_duration(window)?))
}

/// The policy of `quotas` (or the single `fallback` quota when none is
/// given), each with `algorithm` and, where it applies, `burst`.
pub fn policy(
    quotas: &[(u64, Duration)],
    fallback: (u64, Duration),
    algorithm: AlgorithmArg,
    burst: Option<u64>,
) -> Result<Policy, ConfigError> {
    let algorithm = Algorithm::from(algorithm);
    let one = |&(limit, window): &(u64, Duration)| -> Result<Quota, ConfigError> {
        let q = Quota::new(limit, window)?.with_algorithm(algorithm)?;
        match burst {
            Some(b) => q.burst(b),
            None => Ok(q),
        }
    };
    let specs = if quotas.is_empty() {
        std::slice::from_ref(&fallback)
    } else {
        quotas
    };
    let mut policy = Policy::new(one(&specs[0])?);
    for spec in &specs[1..] {
        policy = policy.and(one(spec)?)?;
    }
    Ok(policy)
}

/// Parses `500ms`, `1s`, `60s`, `5m`, `1h` (or a bare number of seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration like 500ms, 1s, 60s, 5m or 1h"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "" | "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        _ => {
            return Err(format!(
                "unknown unit `{unit}` in `{s}` (use ms, s, m or h)"
            ))
        }
    };
    if d.is_zero() {
        return Err("a duration must be above zero".into());
    }
    Ok(d)
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
