//! The demo admin interface's door: a bearer token and a `Host` check in
//! front of every admin route.
//!
//! Without them any web page a browser on the same machine opens could
//! change limits: a cross-site `POST /shadow/promote` needs no preflight
//! (CSRF), and a name the attacker rebinds to 127.0.0.1 reaches
//! `PUT /limits/{key}` as a same-origin request (DNS rebinding). A page
//! cannot send `Authorization` cross-site without a CORS preflight, which
//! this interface never answers positively (it sends no CORS headers), and
//! a rebound name arrives in `Host`, which must be one the interface serves.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::uri::Authority;
use http::{header, HeaderMap, StatusCode};
use std::net::SocketAddr;
use std::sync::Arc;

/// The environment variable the token is read from when `--admin-token` is
/// not given: an environment stays out of `ps`, a command line does not.
pub const TOKEN_ENV: &str = "TRL_ADMIN_TOKEN";

/// The admin token. Its `Debug` hides it, so that printing the arguments
/// never shows it.
#[derive(Clone)]
pub struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

/// Never fails: a bad token is refused later by [`Token::resolve`], whose
/// message does not repeat it (clap's would).
impl std::str::FromStr for Token {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Token(s.to_owned()))
    }
}

impl Token {
    /// The token from `--admin-token` (`flag`), else from `TRL_ADMIN_TOKEN`,
    /// else a new random one; and whether it is new (the demo prints only
    /// that one: the caller knows the others).
    pub fn resolve(flag: Option<Token>) -> Result<(Token, bool), Box<dyn std::error::Error>> {
        let given = match flag {
            Some(token) => Some(token),
            None => match std::env::var_os(TOKEN_ENV) {
                Some(v) => Some(Token(
                    v.into_string()
                        .map_err(|_| format!("{TOKEN_ENV} is not UTF-8"))?,
                )),
                None => None,
            },
        };
        match given {
            Some(token) => {
                token.check()?;
                Ok((token, false))
            }
            None => Ok((Token::random()?, true)),
        }
    }

    /// 128 bits from the operating system, hex-encoded. Not `fastrand`: its
    /// state is one `u64` seeded from the time, so a token drawn from it
    /// would have far fewer than 128 unguessable bits.
    fn random() -> Result<Token, Box<dyn std::error::Error>> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)
            .map_err(|e| format!("cannot draw a random admin token: {e}"))?;
        Ok(Token(bytes.iter().map(|b| format!("{b:02x}")).collect()))
    }

    /// A token a client can send as `Authorization: Bearer TOKEN` (RFC 6750's
    /// `b64token`); the message names the rule, never the token.
    fn check(&self) -> Result<(), String> {
        let body = self.0.trim_end_matches('=');
        let allowed = |c: char| c.is_ascii_alphanumeric() || "-._~+/".contains(c);
        if body.is_empty() || !body.chars().all(allowed) {
            return Err(format!(
                "the admin token (--admin-token or {TOKEN_ENV}) must be letters, digits and \
                 - . _ ~ + / (then any =), and not empty"
            ));
        }
        Ok(())
    }

    /// The token itself, for the one line that prints a generated token.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// A `Host` the interface answers to: a name (lower case) and its port, or
/// any port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowedHost {
    name: String,
    port: Option<u16>,
}

/// `--admin-host NAME[:PORT]`: `NAME` on any port, `NAME:PORT` on that one.
pub fn parse_host(s: &str) -> Result<AllowedHost, String> {
    match host_and_port(s) {
        Some((name, port)) => Ok(AllowedHost { name, port }),
        None => Err(format!(
            "`{s}` is not NAME or NAME:PORT (an IPv6 address in brackets)"
        )),
    }
}

/// `host[:port]` as its lower-case host and its port; `None` when it is not
/// that (userinfo, a path, a port that is not a number).
fn host_and_port(text: &str) -> Option<(String, Option<u16>)> {
    let authority: Authority = text.parse().ok()?;
    let all = authority.as_str();
    let host = authority.host();
    // `user@host` is no Host; with it ruled out, the text starts with the host.
    if all.contains('@') || host.is_empty() {
        return None;
    }
    let port = match &all[host.len()..] {
        "" => None,
        rest => Some(rest.strip_prefix(':')?.parse().ok()?),
    };
    Some((host.to_ascii_lowercase(), port))
}

/// What every admin request must bring: the token, and a `Host` the
/// interface serves.
#[derive(Debug)]
pub struct Guard {
    token: Token,
    hosts: Vec<AllowedHost>,
}

impl Guard {
    /// Accepts `token` and, on `listening`'s port, its own address,
    /// `localhost`, `127.0.0.1` and `[::1]`, plus `extra`.
    pub fn new(token: Token, listening: SocketAddr, extra: &[AllowedHost]) -> Arc<Guard> {
        let port = listening.port();
        let own = [
            listening.to_string(),
            format!("localhost:{port}"),
            format!("127.0.0.1:{port}"),
            format!("[::1]:{port}"),
        ];
        let mut hosts: Vec<AllowedHost> = own
            .iter()
            // An address with an IPv6 zone is no URL host: nobody can name it.
            .filter_map(|h| parse_host(h).ok())
            .collect();
        hosts.extend_from_slice(extra);
        Arc::new(Guard { token, hosts })
    }

    /// Whether the request names a host this interface serves: its `Host`
    /// and, when the target is absolute (HTTP/2, a proxy-style request
    /// line), the target's authority too. A request naming none is refused.
    fn host_allowed(&self, req: &Request) -> bool {
        let mut named = Vec::with_capacity(2);
        if let Some(authority) = req.uri().authority() {
            named.push(Some(authority.as_str()));
        }
        let mut host_headers = req.headers().get_all(header::HOST).iter();
        match (host_headers.next(), host_headers.next()) {
            (Some(h), None) => named.push(h.to_str().ok()),
            (None, None) => {}
            // Two Host headers: ambiguous, so refused.
            _ => return false,
        }
        !named.is_empty() && named.into_iter().all(|h| h.is_some_and(|h| self.serves(h)))
    }

    fn serves(&self, host: &str) -> bool {
        let Some((name, port)) = host_and_port(host) else {
            return false;
        };
        // The interface speaks plain HTTP: a Host without a port means 80.
        let port = port.unwrap_or(80);
        self.hosts
            .iter()
            .any(|h| h.name == name && h.port.is_none_or(|p| p == port))
    }

    /// Whether the request carries `Authorization: Bearer TOKEN` with the
    /// token; `None` when it carries no bearer token at all.
    fn authorized(&self, headers: &HeaderMap) -> Option<bool> {
        let value = headers.get(header::AUTHORIZATION)?.as_bytes();
        let (scheme, given) = value.split_at(value.iter().position(|&b| b == b' ')?);
        if !scheme.eq_ignore_ascii_case(b"bearer") {
            return None;
        }
        Some(same_token(given.trim_ascii(), self.token.0.as_bytes()))
    }
}

/// Whether `given` is `token`, in a time that depends on the lengths only:
/// a comparison that stops at the first differing byte tells a caller who
/// times it how much of a guess is right. (The length is no secret: a
/// generated token always has 32 characters.)
fn same_token(given: &[u8], token: &[u8]) -> bool {
    if given.len() != token.len() {
        return false;
    }
    let mut diff = 0u8;
    for (a, b) in given.iter().zip(token) {
        // black_box: the optimiser may not turn the loop back into an early exit.
        diff = std::hint::black_box(diff | (a ^ b));
    }
    diff == 0
}

/// The middleware in front of every admin route (and the fallback): a
/// `Host` the interface does not serve gets 421, a missing or wrong token
/// 401; neither reaches a handler, so neither changes anything.
pub async fn check(State(guard): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    if !guard.host_allowed(&req) {
        return problem(
            StatusCode::MISDIRECTED_REQUEST,
            "this admin interface does not serve that Host: use its address, localhost \
             or a name given with --admin-host",
        );
    }
    let challenge = match guard.authorized(req.headers()) {
        Some(true) => return next.run(req).await,
        None => r#"Bearer realm="admin""#,
        Some(false) => r#"Bearer realm="admin", error="invalid_token""#,
    };
    let mut refused = problem(
        StatusCode::UNAUTHORIZED,
        "send the admin token as Authorization: Bearer TOKEN",
    );
    refused.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        http::HeaderValue::from_static(challenge),
    );
    refused
}

/// An RFC 9457 problem document; `detail` is a fixed text with nothing to
/// escape.
fn problem(status: StatusCode, detail: &'static str) -> Response {
    let body = format!(
        r#"{{"type":"about:blank","title":"{}","status":{},"detail":"{detail}"}}"#,
        status.canonical_reason().unwrap_or_default(),
        status.as_u16()
    );
    (
        status,
        [(header::CONTENT_TYPE, "application/problem+json")],
        body,
    )
        .into_response()
}
