//! Keys from a request header's value.

use super::{Key, KeyError, KeyExtractor};
use http::header::{HeaderName, InvalidHeaderName};
use http::request::Parts;

/// Keys by the raw bytes of one request header (a tenant id, a device id, …).
///
/// The value is used byte for byte: it need not be UTF-8, and a long value is
/// hashed by [`Key`] itself, so any value gives a defined, bounded key. With
/// several lines of the header, the first is used. A missing header is a
/// [`KeyError`] (`header `NAME` is missing`); combine with
/// [`.or`](super::KeyExtractorExt::or) to fall back to another key.
///
/// **The client chooses the value**: every value it invents is a key of its
/// own, with a fresh quota. Use it only for identities your own gateway sets
/// (and strips from what clients send), or combine it with a key the client
/// cannot choose (`ClientIp::new().and(header)`). For API keys and tokens use
/// [`ApiKey`](super::ApiKey), which hashes the secret and can
/// [verify](super::ApiKey::verify) it.
///
/// ```
/// use tower_ratelimit::key::{Header, Key, KeyExtractor};
/// let tenant = Header::new(http::HeaderName::from_static("x-tenant"));
/// let req = http::Request::builder().header("x-tenant", "acme").body(()).unwrap();
/// let (parts, _) = req.into_parts();
/// assert_eq!(tenant.extract(&parts), Ok(Some(Key::new("acme"))));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    name: HeaderName,
}

impl Header {
    /// Keys by the header `name`.
    ///
    /// ```
    /// use tower_ratelimit::key::Header;
    /// let by_device = Header::new(http::HeaderName::from_static("x-device-id"));
    /// # let _ = by_device;
    /// ```
    #[must_use]
    pub fn new(name: HeaderName) -> Self {
        Self { name }
    }

    /// Keys by the header named by a string, which is checked here (case-insensitive).
    ///
    /// # Errors
    ///
    /// http's [`InvalidHeaderName`] for a name that is not a valid header
    /// name; never a panic, so the name may come from configuration.
    ///
    /// ```
    /// use tower_ratelimit::key::Header;
    /// let by_tenant = Header::try_new("X-Tenant").unwrap();
    /// assert_eq!(by_tenant.name(), "x-tenant");
    /// assert!(Header::try_new("not a header").is_err());
    /// ```
    pub fn try_new(name: &str) -> Result<Self, InvalidHeaderName> {
        HeaderName::from_bytes(name.as_bytes()).map(Self::new)
    }

    /// The header this extractor reads.
    ///
    /// ```
    /// use tower_ratelimit::key::Header;
    /// assert_eq!(Header::try_new("x-a").unwrap().name(), "x-a");
    /// ```
    pub fn name(&self) -> &HeaderName {
        &self.name
    }
}

impl KeyExtractor for Header {
    fn extract(&self, parts: &Parts) -> Result<Option<Key>, KeyError> {
        match parts.headers.get(&self.name) {
            Some(value) => Ok(Some(Key::new(value.as_bytes()))),
            None => Err(KeyError::client(
                "header",
                format!("header `{}` is missing", self.name),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::test_util::request;

    fn tenant() -> Header {
        Header::try_new("x-tenant").unwrap()
    }

    #[test]
    fn value_bytes_are_the_key() {
        let parts = request().header("x-tenant", "acme").parts();
        assert_eq!(tenant().extract(&parts), Ok(Some(Key::new("acme"))));
    }

    #[test]
    fn different_values_give_different_keys() {
        let a = tenant().extract(&request().header("x-tenant", "a").parts());
        let b = tenant().extract(&request().header("x-tenant", "b").parts());
        assert_ne!(a, b);
    }

    #[test]
    fn first_of_several_lines_is_used() {
        let parts = request()
            .header("x-tenant", "first")
            .header("x-tenant", "second")
            .parts();
        assert_eq!(tenant().extract(&parts), Ok(Some(Key::new("first"))));
    }

    #[test]
    fn missing_header_is_an_error_naming_the_header() {
        let err = tenant().extract(&request().parts()).unwrap_err();
        assert_eq!(err.extractor(), "header");
        assert_eq!(err.reason(), "header `x-tenant` is missing");
    }

    #[test]
    fn non_utf8_value_is_keyed_by_its_raw_bytes() {
        let parts = request().header("x-tenant", b"\xff\xfe").parts();
        assert_eq!(tenant().extract(&parts), Ok(Some(Key::new(b"\xff\xfe"))));
    }

    #[test]
    fn values_of_8_and_64_kib_give_bounded_distinct_keys() {
        let k8 = tenant()
            .extract(&request().header("x-tenant", vec![b'a'; 8 * 1024]).parts())
            .unwrap()
            .unwrap();
        let k64 = tenant()
            .extract(&request().header("x-tenant", vec![b'a'; 64 * 1024]).parts())
            .unwrap()
            .unwrap();
        assert_eq!(k8, Key::new(vec![b'a'; 8 * 1024]));
        assert_eq!(k64, Key::new(vec![b'a'; 64 * 1024]));
        assert!(k64.as_bytes().len() <= 48);
        assert_ne!(k8, k64);
    }

    #[test]
    fn try_new_lowercases_valid_names_and_rejects_invalid_ones() {
        assert_eq!(Header::try_new("X-Tenant").unwrap().name(), "x-tenant");
        assert!(Header::try_new("").is_err());
        assert!(Header::try_new("bad name").is_err());
        assert!(Header::try_new("é").is_err());
    }
}
