//! Keys from a secret credential, hashed so it is never stored or shown.

use super::{Key, KeyError, KeyExtractor};
use http::header::{HeaderName, InvalidHeaderName, AUTHORIZATION};
use http::request::Parts;
use std::fmt;
use std::sync::Arc;

/// Keys by an API key or bearer token, as [`Key::secret`] (a digest, never the secret).
///
/// **The client chooses the value** unless it is checked: any string a client
/// sends becomes a key of its own, with a fresh quota (and, in Redis, a key
/// of its own for a window). A client that sends a new random token with
/// each request is never limited. So either put the limiter behind the
/// middleware that rejects unknown credentials, or check them here with
/// [`verify`](ApiKey::verify), and limit what does not verify by something
/// the client cannot choose, such as its address:
///
/// ```
/// use std::collections::HashSet;
/// use std::sync::Arc;
/// use tower_ratelimit::key::{ApiKey, ClientIp, KeyExtractor, KeyExtractorExt};
/// let issued: Arc<HashSet<Vec<u8>>> = Arc::new([b"s3cr3t".to_vec()].into());
/// let key = ApiKey::bearer()
///     .verify(move |token| issued.contains(token))
///     .or(ClientIp::new().trust_private());
/// # let _ = key;
/// ```
///
/// A missing, empty, malformed or unverified credential is a [`KeyError`]
/// of the client's (a 400 without a fallback) whose message names the
/// header but never includes any of its value.
///
/// ```
/// use tower_ratelimit::key::{ApiKey, Key, KeyExtractor};
/// let req = http::Request::builder()
///     .header("authorization", "Bearer s3cr3t")
///     .body(())
///     .unwrap();
/// let (parts, _) = req.into_parts();
/// assert_eq!(ApiKey::bearer().extract(&parts), Ok(Some(Key::secret("s3cr3t"))));
/// ```
#[derive(Clone)]
pub struct ApiKey {
    name: HeaderName,
    bearer: bool,
    verify: Option<Arc<Verify>>,
}

type Verify = dyn Fn(&[u8]) -> bool + Send + Sync;

// The extractor holds a header name and perhaps a check, never a secret.
impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiKey")
            .field("name", &self.name)
            .field("bearer", &self.bearer)
            .field("verify", &self.verify.is_some())
            .finish()
    }
}

impl ApiKey {
    /// The whole value of header `name` (e.g. `x-api-key`), surrounding whitespace trimmed.
    ///
    /// ```
    /// use tower_ratelimit::key::ApiKey;
    /// let api_key = ApiKey::header(http::HeaderName::from_static("x-api-key"));
    /// # let _ = api_key;
    /// ```
    #[must_use]
    pub fn header(name: HeaderName) -> Self {
        Self {
            name,
            bearer: false,
            verify: None,
        }
    }

    /// Like [`ApiKey::header`], with the name checked here instead of panicking.
    ///
    /// # Errors
    ///
    /// http's [`InvalidHeaderName`] for a name that is not a valid header name.
    ///
    /// ```
    /// use tower_ratelimit::key::ApiKey;
    /// let api_key = ApiKey::try_header("X-Api-Key").unwrap();
    /// assert!(ApiKey::try_header("x api key").is_err());
    /// # let _ = api_key;
    /// ```
    pub fn try_header(name: &str) -> Result<Self, InvalidHeaderName> {
        HeaderName::from_bytes(name.as_bytes()).map(Self::header)
    }

    /// The token of `Authorization: Bearer <token>` (scheme case-insensitive, whitespace trimmed).
    ///
    /// ```
    /// use tower_ratelimit::key::ApiKey;
    /// let token = ApiKey::bearer();
    /// # let _ = token;
    /// ```
    #[must_use]
    pub fn bearer() -> Self {
        Self {
            name: AUTHORIZATION,
            bearer: true,
            verify: None,
        }
    }

    /// Keys only credentials that `check` accepts (a token your application
    /// issued: a set or cache of valid keys, a signature check). One it
    /// refuses is not a key but a [`KeyError`] of the client's, so with
    /// [`.or`](super::KeyExtractorExt::or) the request is limited by the
    /// fallback (the caller's address) instead of buying a fresh quota with
    /// an invented token. `check` runs on every request with the raw
    /// credential and must be quick; a check that needs I/O belongs in your
    /// auth middleware, with the limiter keyed by what it verified
    /// ([`extension`](super::extension)).
    ///
    /// ```
    /// use tower_ratelimit::key::{ApiKey, KeyExtractor};
    /// let key = ApiKey::bearer().verify(|token| token.starts_with(b"sk_") && token.len() == 35);
    /// let req = http::Request::builder().header("authorization", "Bearer made-up").body(()).unwrap();
    /// assert!(key.extract(&req.into_parts().0).is_err());
    /// ```
    #[must_use]
    pub fn verify<F>(mut self, check: F) -> Self
    where
        F: Fn(&[u8]) -> bool + Send + Sync + 'static,
    {
        self.verify = Some(Arc::new(check));
        self
    }

    /// The error for a credential that is there but unusable. Fixed texts only:
    /// anything derived from the value could leak (part of) the secret into logs.
    fn error(&self, reason: &'static str) -> KeyError {
        KeyError::client("api_key", format!("header `{}` {reason}", self.name))
    }
}

impl KeyExtractor for ApiKey {
    fn extract(&self, parts: &Parts) -> Result<Option<Key>, KeyError> {
        let value = match parts.headers.get(&self.name) {
            Some(value) => value.as_bytes().trim_ascii(),
            None => return Err(self.error("is missing")),
        };
        let secret = if self.bearer {
            bearer_token(value).map_err(|reason| self.error(reason))?
        } else {
            value
        };
        if secret.is_empty() {
            return Err(self.error("is empty"));
        }
        if self.verify.as_ref().is_some_and(|check| !check(secret)) {
            return Err(self.error("holds a credential that does not verify"));
        }
        Ok(Some(Key::secret(secret)))
    }
}

/// The token of a `Bearer` credential, or why there is none.
fn bearer_token(value: &[u8]) -> Result<&[u8], &'static str> {
    let split = value
        .iter()
        .position(|b| matches!(b, b' ' | b'\t'))
        .unwrap_or(value.len());
    let (scheme, rest) = value.split_at(split);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return Err("does not use the Bearer scheme");
    }
    let token = rest.trim_ascii();
    if token.is_empty() {
        return Err("has no bearer token");
    }
    // RFC 6750 tokens contain no whitespace; extra words mean a broken client.
    if token.iter().any(|b| matches!(b, b' ' | b'\t')) {
        return Err("has a malformed bearer token");
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::test_util::request;

    const SECRET: &str = "sk_live_TOPSECRET";

    fn bearer(value: impl AsRef<[u8]>) -> Result<Option<Key>, KeyError> {
        ApiKey::bearer().extract(&request().header("authorization", value).parts())
    }

    fn x_api_key(value: impl AsRef<[u8]>) -> Result<Option<Key>, KeyError> {
        ApiKey::try_header("x-api-key")
            .unwrap()
            .extract(&request().header("x-api-key", value).parts())
    }

    fn assert_no_secret(err: &KeyError) {
        for shown in [err.to_string(), format!("{err:?}"), format!("{err:#?}")] {
            assert!(!shown.contains("TOPSECRET"), "{shown}");
            assert!(!shown.contains("sk_live"), "{shown}");
        }
    }

    #[test]
    fn bearer_token_is_keyed_as_secret() {
        assert_eq!(
            bearer(format!("Bearer {SECRET}")),
            Ok(Some(Key::secret(SECRET)))
        );
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        for scheme in ["bearer", "BEARER", "bEaReR"] {
            assert_eq!(
                bearer(format!("{scheme} {SECRET}")),
                Ok(Some(Key::secret(SECRET)))
            );
        }
    }

    #[test]
    fn bearer_surrounding_whitespace_is_trimmed() {
        assert_eq!(
            bearer(format!(" \tBearer  \t{SECRET} \t")),
            Ok(Some(Key::secret(SECRET)))
        );
    }

    #[test]
    fn bearer_without_token_is_an_error() {
        for value in ["Bearer", "Bearer ", "Bearer \t "] {
            let err = bearer(value).unwrap_err();
            assert_eq!(err.reason(), "header `authorization` has no bearer token");
        }
    }

    #[test]
    fn wrong_scheme_is_an_error_without_the_secret() {
        for value in [
            format!("Basic {SECRET}"),
            format!("Bearer{SECRET}"),
            SECRET.to_string(),
        ] {
            let err = bearer(value).unwrap_err();
            assert_eq!(err.extractor(), "api_key");
            assert_eq!(
                err.reason(),
                "header `authorization` does not use the Bearer scheme"
            );
            assert_no_secret(&err);
        }
    }

    #[test]
    fn token_with_inner_whitespace_is_an_error_without_the_secret() {
        let err = bearer(format!("Bearer {SECRET} {SECRET}")).unwrap_err();
        assert_eq!(
            err.reason(),
            "header `authorization` has a malformed bearer token"
        );
        assert_no_secret(&err);
    }

    #[test]
    fn a_credential_that_does_not_verify_is_a_client_error_without_the_secret() {
        let key = ApiKey::bearer().verify(|t| t == SECRET.as_bytes());
        let parts = |v: &str| request().header("authorization", v).parts();
        assert_eq!(
            key.extract(&parts(&format!("Bearer {SECRET}"))),
            Ok(Some(Key::secret(SECRET)))
        );
        let err = key
            .extract(&parts("Bearer sk_live_TOPSECRET_made_up"))
            .unwrap_err();
        assert_eq!(err.kind(), crate::key::KeyErrorKind::Client);
        assert_eq!(
            err.reason(),
            "header `authorization` holds a credential that does not verify"
        );
        assert_no_secret(&err);
        assert!(format!("{key:?}").contains("verify: true"));
    }

    #[test]
    fn missing_authorization_is_an_error() {
        let err = ApiKey::bearer().extract(&request().parts()).unwrap_err();
        assert_eq!(err.reason(), "header `authorization` is missing");
    }

    #[test]
    fn header_api_key_is_keyed_as_secret_and_trimmed() {
        assert_eq!(
            x_api_key(format!("  {SECRET}\t")),
            Ok(Some(Key::secret(SECRET)))
        );
    }

    #[test]
    fn header_api_key_empty_or_missing_is_an_error() {
        assert_eq!(
            x_api_key("  ").unwrap_err().reason(),
            "header `x-api-key` is empty"
        );
        let err = ApiKey::try_header("x-api-key")
            .unwrap()
            .extract(&request().parts())
            .unwrap_err();
        assert_eq!(err.reason(), "header `x-api-key` is missing");
    }

    #[test]
    fn secret_key_differs_from_plain_key_of_same_bytes() {
        assert_ne!(x_api_key(SECRET), Ok(Some(Key::new(SECRET))));
    }

    #[test]
    fn key_debug_never_shows_the_secret() {
        let key = x_api_key(SECRET).unwrap().unwrap();
        assert!(!format!("{key:?}").contains("TOPSECRET"));
        assert!(!format!("{:?}", ApiKey::bearer()).contains("TOPSECRET"));
    }

    #[test]
    fn non_utf8_credentials_are_keyed_by_their_raw_bytes() {
        assert_eq!(x_api_key(b"\xff\xfe"), Ok(Some(Key::secret(b"\xff\xfe"))));
        assert_eq!(
            bearer(b"Bearer \xff\xfe"),
            Ok(Some(Key::secret(b"\xff\xfe")))
        );
        let err = bearer(b"\xffearer tok").unwrap_err();
        assert_eq!(
            err.reason(),
            "header `authorization` does not use the Bearer scheme"
        );
    }

    #[test]
    fn credentials_of_8_and_64_kib_are_keyed_as_bounded_secrets() {
        for len in [8 * 1024, 64 * 1024] {
            let token = vec![b't'; len];
            let mut value = b"Bearer ".to_vec();
            value.extend_from_slice(&token);
            let key = bearer(&value).unwrap().unwrap();
            assert_eq!(key, Key::secret(&token));
            assert!(key.as_bytes().len() <= 48);
            assert_eq!(x_api_key(&token), Ok(Some(Key::secret(&token))));
        }
    }
}
