//! Pieces shared by the example servers (flag parsing, shutdown).
#![allow(dead_code)]

use std::time::Duration;
use tower_ratelimit::key::{ClientIp, Constant, GrpcMethod, Header, KeyExtractor};
use tower_ratelimit::{Algorithm, ConfigError, Policy, Quota};

/// What a client is, as given by `--key`.
#[derive(Clone, Debug)]
pub enum KeyKind {
    /// The client IP (the TCP peer; no proxies trusted).
    Ip,
    /// One key for everyone.
    Global,
    /// A header's value (`header:NAME`), or gRPC metadata (`metadata:NAME`).
    Header(String),
    /// The gRPC method (`/package.Service/Method`).
    Method,
}

/// Parses `ip`, `global`, `header:NAME`, `metadata:NAME` or `method`.
pub fn parse_key(s: &str) -> Result<KeyKind, String> {
    match s {
        "ip" => Ok(KeyKind::Ip),
        "global" => Ok(KeyKind::Global),
        "method" => Ok(KeyKind::Method),
        _ => match s
            .strip_prefix("header:")
            .or_else(|| s.strip_prefix("metadata:"))
        {
            Some(name) if !name.is_empty() => {
                http::HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| format!("`{name}` is not a valid header name"))?;
                Ok(KeyKind::Header(name.to_owned()))
            }
            _ => Err(format!(
                "unknown key `{s}`: use ip, global, method, header:NAME or metadata:NAME"
            )),
        },
    }
}

/// The extractor for a `--key` value.
pub fn key_extractor(kind: &KeyKind) -> Result<Box<dyn KeyExtractor>, Box<dyn std::error::Error>> {
    Ok(match kind {
        KeyKind::Ip => Box::new(ClientIp::new()),
        KeyKind::Global => Box::new(Constant::new("global")),
        KeyKind::Header(name) => Box::new(Header::try_new(name.as_str())?),
        KeyKind::Method => Box::new(GrpcMethod),
    })
}

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
    let secs = |per: u64| {
        n.checked_mul(per)
            .map(Duration::from_secs)
            .ok_or_else(|| format!("`{s}` is too long a duration"))
    };
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "" | "s" => secs(1)?,
        "m" => secs(60)?,
        "h" => secs(3600)?,
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

/// Runs `serve` (a server future that shuts down gracefully on `signal`) but
/// gives open connections at most `grace` after the signal, then returns.
pub async fn with_grace<F, E>(
    serve: impl FnOnce(tokio::sync::futures::Notified<'static>) -> F,
    grace: Duration,
) -> Result<(), E>
where
    F: std::future::Future<Output = Result<(), E>>,
{
    static SIGNALLED: std::sync::OnceLock<tokio::sync::Notify> = std::sync::OnceLock::new();
    let notify = SIGNALLED.get_or_init(tokio::sync::Notify::new);
    let server = serve(notify.notified());
    tokio::pin!(server);
    tokio::select! {
        r = &mut server => return r,
        _ = shutdown_signal() => notify.notify_waiters(),
    }
    tokio::select! {
        r = &mut server => r,
        _ = tokio::time::sleep(grace) => Ok(()),
    }
}
