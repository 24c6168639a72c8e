//! Extractors that do not look at the request: one shared key, or no limit.

use super::{Key, KeyError, KeyExtractor};
use http::request::Parts;

/// Every request gets the same named key: one limit shared by all clients.
///
/// In a composite, the name keeps limits apart that share a store:
/// `Constant::new("login").and(ClientIp::new())` never collides with another
/// limiter's per-IP counters, because [`Key::composite`] is unambiguous.
///
/// ```
/// use tower_ratelimit::key::{Constant, Key, KeyExtractor};
/// let search = Constant::new("search");
/// let parts = http::Request::builder().body(()).unwrap().into_parts().0;
/// assert_eq!(search.extract(&parts), Ok(Some(Key::new("search"))));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Constant {
    key: Key,
}

impl Constant {
    /// Keys every request by `name` (as [`Key::new`]).
    ///
    /// ```
    /// use tower_ratelimit::key::Constant;
    /// let uploads = Constant::new("uploads");
    /// # let _ = uploads;
    /// ```
    #[must_use]
    pub fn new(name: impl AsRef<[u8]>) -> Self {
        Self {
            key: Key::new(name),
        }
    }

    /// Keys every request by `key`.
    ///
    /// ```
    /// use tower_ratelimit::key::{Constant, Key};
    /// let fixed = Constant::from_key(Key::global());
    /// # let _ = fixed;
    /// ```
    #[must_use]
    pub fn from_key(key: Key) -> Self {
        Self { key }
    }
}

impl KeyExtractor for Constant {
    fn extract(&self, _: &Parts) -> Result<Option<Key>, KeyError> {
        Ok(Some(self.key))
    }
}

/// Every request gets [`Key::global`]: one limit for the whole service.
///
/// ```
/// use tower_ratelimit::key::{Global, Key, KeyExtractor};
/// let parts = http::Request::builder().body(()).unwrap().into_parts().0;
/// assert_eq!(Global.extract(&parts), Ok(Some(Key::global())));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Global;

impl KeyExtractor for Global {
    fn extract(&self, _: &Parts) -> Result<Option<Key>, KeyError> {
        Ok(Some(Key::global()))
    }
}

/// Every request is exempt: nothing is limited (a switch for tests or a disabled limit).
///
/// ```
/// use tower_ratelimit::key::{Exempt, KeyExtractor};
/// let parts = http::Request::builder().body(()).unwrap().into_parts().0;
/// assert_eq!(Exempt.extract(&parts), Ok(None));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Exempt;

impl KeyExtractor for Exempt {
    fn extract(&self, _: &Parts) -> Result<Option<Key>, KeyError> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::test_util::request;

    #[test]
    fn constant_gives_every_request_the_named_key() {
        let c = Constant::new("login");
        let a = c.extract(&request().peer("192.0.2.1:1").parts());
        let b = c.extract(&request().uri("/other").parts());
        assert_eq!(a, Ok(Some(Key::new("login"))));
        assert_eq!(a, b);
    }

    #[test]
    fn constants_with_different_names_differ() {
        let parts = request().parts();
        assert_ne!(
            Constant::new("a").extract(&parts),
            Constant::new("b").extract(&parts)
        );
    }

    #[test]
    fn global_gives_the_global_key() {
        assert_eq!(Global.extract(&request().parts()), Ok(Some(Key::global())));
    }

    #[test]
    fn exempt_exempts_every_request() {
        assert_eq!(Exempt.extract(&request().parts()), Ok(None));
    }
}
