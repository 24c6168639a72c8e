//! An LLM gateway's completion endpoint: each API key gets 60 requests and
//! 2,000 tokens a minute. A request reserves an estimate from its prompt
//! (its size, and the most tokens it asks for), streams the completion
//! token by token, and is settled to the tokens it really used when the
//! stream ends: unused reservation comes back, and a completion longer than
//! the estimate is charged in full, into debt if need be.
//!
//! ```text
//! cargo run --example llm_gateway --features axum
//! curl -N -H 'x-api-key: alice' -H 'x-max-tokens: 50' -d 'tell me about rate limits' \
//!      http://127.0.0.1:3000/v1/completions
//! curl -H 'x-api-key: alice' http://127.0.0.1:3000/v1/usage
//! ```
//!
//! The stand-in model answers with the prompt's words, reversed, repeated up
//! to the tokens asked for (`x-max-tokens`, default 64, at most 4,096). One
//! token is one word. Prints one line `listening on ADDR` once it serves.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use clap::Parser;
use futures_util::StreamExt;
use http::header::HeaderName;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;
use tower_ratelimit::headers::HeaderStyle;
use tower_ratelimit::key::ApiKey;
use tower_ratelimit::rate::{Settlement, Usage};
use tower_ratelimit::{Policy, Quota, RateLimitLayer};

#[derive(Parser, Debug)]
struct Args {
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:3000")]
    addr: SocketAddr,
    /// Tokens each API key may use a minute.
    #[arg(long, default_value_t = 2_000)]
    tokens_per_minute: u64,
}

/// The most tokens a request may ask for.
const MAX_TOKENS: u64 = 4_096;

/// The tokens a request asks for at most (`x-max-tokens`, default 64).
fn max_tokens(headers: &HeaderMap) -> u64 {
    headers
        .get("x-max-tokens")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(64)
        .min(MAX_TOKENS)
}

/// The reservation: about one token per 4 bytes of prompt, plus what the
/// completion may use.
fn estimate(headers: &HeaderMap) -> u64 {
    let prompt_bytes: u64 = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    prompt_bytes.div_ceil(4) + max_tokens(headers)
}

/// Streams a completion of `prompt`, counting every token on `usage` as it
/// is sent: the prompt's tokens first, then one per word of the answer.
async fn complete(usage: Usage, headers: HeaderMap, prompt: String) -> Response {
    let words: Vec<String> = prompt.split_whitespace().rev().map(str::to_owned).collect();
    if words.is_empty() {
        return (StatusCode::BAD_REQUEST, "the prompt is empty\n").into_response();
    }
    usage.add(words.len() as u64);
    let n = max_tokens(&headers).min(2 * words.len() as u64);
    let tokens = futures_util::stream::iter(0..n).map(move |i| {
        usage.add(1);
        let word = &words[i as usize % words.len()];
        Ok::<_, Infallible>(format!("{word} "))
    });
    Body::from_stream(tokens).into_response()
}

/// The caller's state in every quota, without spending anything.
async fn usage_of(State(layer): State<RateLimitLayer>, req: Request<Body>) -> Response {
    let (parts, _) = req.into_parts();
    match layer.status(&parts).await {
        Ok(Some(status)) => {
            let mut out = String::new();
            for (q, s) in status
                .policy
                .quotas()
                .iter()
                .zip(status.decision.statuses())
            {
                out.push_str(&format!(
                    "{}: {} of {} {} left\n",
                    q.name(),
                    s.remaining,
                    s.limit,
                    q.unit()
                ));
            }
            out.into_response()
        }
        Ok(None) => "not limited\n".into_response(),
        Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let policy = Policy::new(Quota::new(60, Duration::from_secs(60))?.named("requests")?).and(
        Quota::new(args.tokens_per_minute, Duration::from_secs(60))?
            .named("tokens")?
            .with_unit("tokens")?,
    )?;
    let limit = RateLimitLayer::builder()
        .quota(policy)
        // Hashed: the key itself is never stored nor logged.
        .key(ApiKey::header(HeaderName::from_static("x-api-key")))
        .headers(HeaderStyle::Ietf)
        .settlement(
            Settlement::new()
                .reserve(|parts| estimate(&parts.headers))
                .from_usage(),
        )
        .build()?;

    let app = Router::new()
        .route("/v1/completions", post(complete).layer(limit.clone()))
        .route("/v1/usage", get(usage_of))
        .with_state(limit);

    let listener = tokio::net::TcpListener::bind(args.addr).await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
