//! Keys from a secret credential, hashed so it is never stored or shown.

use super::{Key, KeyError, KeyExtractor};
use http::header::{HeaderName, InvalidHeaderName, AUTHORIZATION};
use http::request::Parts;

/// Keys by an API key or bearer token, as [`Key::secret`] (a digest, never the secret).
///
/// A missing, empty or malformed credential is a [`KeyError`] whose message
/// names the header but never includes any of its value. Combine with
/// [`.or`](super::KeyExtractorExt::or) to limit anonymous requests by IP.
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
// Debug is derived: the extractor holds only a header name, never a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKey {
    name: HeaderName,
    bearer: bool,
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
        }
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
