//! Combining extractors: composite keys, fallbacks and exemptions.

use super::{Key, KeyError, KeyErrorKind, KeyExtractor};
use http::request::Parts;
use std::fmt;

/// Combinators for every [`KeyExtractor`].
///
/// ```
/// use http::request::Parts;
/// use tower_ratelimit::key::{ApiKey, ClientIp, KeyExtractorExt, Method};
/// let key = ApiKey::bearer()
///     .or(ClientIp::new().trust_private())
///     .and(Method)
///     .exempt_if(|parts: &Parts| parts.uri.path() == "/health");
/// # let _ = key;
/// ```
pub trait KeyExtractorExt: KeyExtractor + Sized {
    /// Keys by both: [`Key::composite`] of this key and `other`'s (exempt if either is).
    ///
    /// Evaluated left to right; the first error or exemption is the result,
    /// and `other` is not consulted.
    ///
    /// ```
    /// use tower_ratelimit::key::{ClientIp, KeyExtractorExt, Path};
    /// let per_client_path = ClientIp::new().and(Path);
    /// # let _ = per_client_path;
    /// ```
    fn and<B: KeyExtractor>(self, other: B) -> And<Self, B> {
        And { a: self, b: other }
    }

    /// Keys by this extractor, or by `other` if this one returns an error.
    ///
    /// An exemption from this extractor stands (it is a decision, not a
    /// failure). If both fail, the error names both. Keys from the two sides
    /// share one key space: if they could coincide (two [`Header`]s), tag
    /// each side with `.and(Constant::new(..))`.
    ///
    /// [`Header`]: super::Header
    ///
    /// ```
    /// use tower_ratelimit::key::{ApiKey, ClientIp, KeyExtractorExt};
    /// // Authenticated clients by token, anonymous ones by IP.
    /// let key = ApiKey::bearer().or(ClientIp::new());
    /// # let _ = key;
    /// ```
    fn or<B: KeyExtractor>(self, other: B) -> Or<Self, B> {
        Or { a: self, b: other }
    }

    /// Exempts requests for which `predicate` is true, before this extractor runs.
    ///
    /// ```
    /// use http::request::Parts;
    /// use tower_ratelimit::key::{KeyExtractorExt, PeerIp};
    /// let key = PeerIp::new().exempt_if(|parts: &Parts| parts.uri.path() == "/health");
    /// # let _ = key;
    /// ```
    fn exempt_if<P>(self, predicate: P) -> ExemptIf<Self, P>
    where
        P: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        ExemptIf {
            inner: self,
            predicate,
        }
    }
}

impl<E: KeyExtractor> KeyExtractorExt for E {}

/// Both keys as one composite key; built by [`KeyExtractorExt::and`].
///
/// ```
/// use tower_ratelimit::key::{And, Constant, KeyExtractorExt, PeerIp};
/// let both: And<Constant, PeerIp> = Constant::new("login").and(PeerIp::new());
/// # let _ = both;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct And<A, B> {
    a: A,
    b: B,
}

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for And<A, B> {
    fn extract(&self, parts: &Parts) -> Result<Option<Key>, KeyError> {
        let Some(a) = self.a.extract(parts)? else {
            return Ok(None);
        };
        let Some(b) = self.b.extract(parts)? else {
            return Ok(None);
        };
        Ok(Some(Key::composite(&[a, b])))
    }
}

/// The first key, or the second if the first fails; built by [`KeyExtractorExt::or`].
///
/// ```
/// use tower_ratelimit::key::{ApiKey, KeyExtractorExt, Or, PeerIp};
/// let key: Or<ApiKey, PeerIp> = ApiKey::bearer().or(PeerIp::new());
/// # let _ = key;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct Or<A, B> {
    a: A,
    b: B,
}

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for Or<A, B> {
    fn extract(&self, parts: &Parts) -> Result<Option<Key>, KeyError> {
        let first = match self.a.extract(parts) {
            Err(err) => err,
            decided => return decided,
        };
        self.b.extract(parts).map_err(|second| {
            // A misconfiguration on either side is the server's: the
            // fallback should have worked.
            let kind = if first.kind() == KeyErrorKind::Server {
                KeyErrorKind::Server
            } else {
                second.kind()
            };
            KeyError::of(
                kind,
                format!("{} or {}", first.extractor(), second.extractor()),
                format!(
                    "{}: {}; {}: {}",
                    first.extractor(),
                    first.reason(),
                    second.extractor(),
                    second.reason()
                ),
            )
        })
    }
}

/// Exempts requests matching a predicate; built by [`KeyExtractorExt::exempt_if`].
///
/// ```
/// use http::request::Parts;
/// use tower_ratelimit::key::{ExemptIf, KeyExtractorExt, PeerIp};
/// fn is_health(parts: &Parts) -> bool {
///     parts.uri.path() == "/health"
/// }
/// let key: ExemptIf<PeerIp, fn(&Parts) -> bool> = PeerIp::new().exempt_if(is_health);
/// # let _ = key;
/// ```
#[derive(Clone, Copy)]
#[must_use]
pub struct ExemptIf<E, P> {
    inner: E,
    predicate: P,
}

impl<E, P> KeyExtractor for ExemptIf<E, P>
where
    E: KeyExtractor,
    P: Fn(&Parts) -> bool + Send + Sync + 'static,
{
    fn extract(&self, parts: &Parts) -> Result<Option<Key>, KeyError> {
        // The predicate goes first so exempt requests (health checks from a
        // load balancer without a peer address, say) cannot fail extraction.
        if (self.predicate)(parts) {
            return Ok(None);
        }
        self.inner.extract(parts)
    }
}

impl<E: fmt::Debug, P> fmt::Debug for ExemptIf<E, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExemptIf")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// `(a, b)` keys like `a.and(b)`: a composite key, exempt if either is.
impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for (A, B) {
    fn extract(&self, parts: &Parts) -> Result<Option<Key>, KeyError> {
        let Some(a) = self.0.extract(parts)? else {
            return Ok(None);
        };
        let Some(b) = self.1.extract(parts)? else {
            return Ok(None);
        };
        Ok(Some(Key::composite(&[a, b])))
    }
}

/// `(a, b, c)` keys by the composite of all three, exempt if any is.
impl<A: KeyExtractor, B: KeyExtractor, C: KeyExtractor> KeyExtractor for (A, B, C) {
    fn extract(&self, parts: &Parts) -> Result<Option<Key>, KeyError> {
        let Some(a) = self.0.extract(parts)? else {
            return Ok(None);
        };
        let Some(b) = self.1.extract(parts)? else {
            return Ok(None);
        };
        let Some(c) = self.2.extract(parts)? else {
            return Ok(None);
        };
        Ok(Some(Key::composite(&[a, b, c])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::test_util::request;
    use crate::key::{ApiKey, ClientIp, Constant, Exempt, Global, Header};

    fn fail(name: &'static str) -> impl KeyExtractor {
        move |_: &Parts| -> Result<Option<Key>, KeyError> { Err(KeyError::client(name, "nope")) }
    }

    fn key(e: &impl KeyExtractor) -> Result<Option<Key>, KeyError> {
        e.extract(&request().parts())
    }

    #[test]
    fn and_of_a_and_b_colon_c_differs_from_a_colon_b_and_c() {
        let left = Constant::new("a").and(Constant::new("b:c"));
        let right = Constant::new("a:b").and(Constant::new("c"));
        assert_ne!(key(&left), key(&right));
    }

    #[test]
    fn and_is_the_composite_of_both_keys() {
        let e = Constant::new("a").and(Constant::new("b"));
        assert_eq!(
            key(&e),
            Ok(Some(Key::composite(&[Key::new("a"), Key::new("b")])))
        );
    }

    #[test]
    fn and_with_global_still_separates_the_other_side() {
        let a = Global.and(Constant::new("x"));
        let b = Global.and(Constant::new("y"));
        assert_ne!(key(&a), key(&b));
        assert_ne!(key(&a), Ok(Some(Key::global())));
    }

    #[test]
    fn and_is_exempt_if_either_side_is_exempt() {
        assert_eq!(key(&Exempt.and(Global)), Ok(None));
        assert_eq!(key(&Global.and(Exempt)), Ok(None));
    }

    #[test]
    fn and_returns_an_error_from_either_side() {
        assert_eq!(key(&fail("l").and(Global)).unwrap_err().extractor(), "l");
        assert_eq!(key(&Global.and(fail("r"))).unwrap_err().extractor(), "r");
    }

    #[test]
    fn and_stops_at_the_first_exemption_or_error_from_the_left() {
        assert_eq!(key(&Exempt.and(fail("r"))), Ok(None));
        assert_eq!(key(&fail("l").and(Exempt)).unwrap_err().extractor(), "l");
    }

    #[test]
    fn or_uses_the_first_key_when_present() {
        let e = Constant::new("a").or(Constant::new("b"));
        assert_eq!(key(&e), Ok(Some(Key::new("a"))));
    }

    #[test]
    fn or_falls_back_to_client_ip_without_api_key() {
        let e = ApiKey::bearer().or(ClientIp::new());
        let anonymous = request().peer("192.0.2.1:1").parts();
        assert_eq!(
            e.extract(&anonymous),
            Ok(Some(Key::ip("192.0.2.1".parse().unwrap())))
        );
        let authed = request()
            .peer("192.0.2.1:1")
            .header("authorization", "Bearer t")
            .parts();
        assert_eq!(e.extract(&authed), Ok(Some(Key::secret("t"))));
    }

    #[test]
    fn or_keeps_an_exemption_from_the_first_side() {
        assert_eq!(key(&Exempt.or(Global)), Ok(None));
    }

    #[test]
    fn or_with_both_failing_names_both_extractors() {
        let err = key(&fail("first").or(fail("second"))).unwrap_err();
        assert_eq!(err.extractor(), "first or second");
        assert_eq!(err.reason(), "first: nope; second: nope");
    }

    #[test]
    fn or_error_with_missing_bearer_never_contains_anything_from_the_request() {
        let e = ApiKey::bearer().or(Header::try_new("x-tenant").unwrap());
        let parts = request().header("authorization", "Basic TOPSECRET").parts();
        let err = e.extract(&parts).unwrap_err();
        assert!(!err.to_string().contains("TOPSECRET"));
        assert!(!format!("{err:?}").contains("TOPSECRET"));
    }

    #[test]
    fn exempt_if_exempts_matching_requests_and_keys_the_rest() {
        let e = Global.exempt_if(|parts: &Parts| parts.uri.path() == "/health");
        assert_eq!(e.extract(&request().uri("/health").parts()), Ok(None));
        assert_eq!(
            e.extract(&request().uri("/api").parts()),
            Ok(Some(Key::global()))
        );
    }

    #[test]
    fn exempt_if_runs_before_the_inner_extractor_so_its_errors_are_skipped() {
        let e = fail("inner").exempt_if(|_: &Parts| true);
        assert_eq!(key(&e), Ok(None));
        let e = fail("inner").exempt_if(|_: &Parts| false);
        assert_eq!(key(&e).unwrap_err().extractor(), "inner");
    }

    #[test]
    fn pair_keys_like_and() {
        let pair = (Constant::new("a"), Constant::new("b"));
        let and = Constant::new("a").and(Constant::new("b"));
        assert_eq!(key(&pair), key(&and));
        assert_eq!(key(&(Global, Exempt)), Ok(None));
    }

    #[test]
    fn triple_is_the_composite_of_all_three() {
        let t = (Constant::new("a"), Constant::new("b"), Constant::new("c"));
        assert_eq!(
            key(&t),
            Ok(Some(Key::composite(&[
                Key::new("a"),
                Key::new("b"),
                Key::new("c")
            ])))
        );
        assert_eq!(key(&(Global, Global, Exempt)), Ok(None));
        assert_eq!(
            key(&(Global, fail("mid"), Global)).unwrap_err().extractor(),
            "mid"
        );
    }

    #[test]
    fn combinators_work_on_closures_and_shared_trait_objects() {
        let shared: std::sync::Arc<dyn KeyExtractor> = std::sync::Arc::new(Global);
        let e = (|_: &Parts| Key::new("c")).and(shared);
        assert_eq!(
            key(&e),
            Ok(Some(Key::composite(&[Key::new("c"), Key::global()])))
        );
    }
}
