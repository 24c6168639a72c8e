//! Closures and shared trait objects as key extractors.

use super::{Key, KeyError, KeyExtractor};
use http::request::Parts;
use std::sync::Arc;

/// What a closure extractor may return: a [`Key`], an `Option<Key>`, or a full result.
///
/// | return type                       | meaning                                            |
/// |-----------------------------------|----------------------------------------------------|
/// | `Key`                             | always this key                                    |
/// | `Option<Key>`                     | `None` is a [`KeyError`] (not an exemption)        |
/// | `Result<Key, KeyError>`           | a key or an error                                  |
/// | `Result<Option<Key>, KeyError>`   | the [`KeyExtractor`] contract: `Ok(None)` is exempt |
///
/// `None` is an error rather than an exemption because a closure that forgets a
/// case should fail loudly, not silently switch rate limiting off; return
/// `Ok(None)` to exempt on purpose.
///
/// ```
/// use tower_ratelimit::key::{IntoKeyResult, Key};
/// assert_eq!(Key::new("a").into_key_result(), Ok(Some(Key::new("a"))));
/// assert!(None::<Key>.into_key_result().is_err());
/// ```
pub trait IntoKeyResult {
    /// Converts the closure's return value into what [`KeyExtractor::extract`] returns.
    fn into_key_result(self) -> Result<Option<Key>, KeyError>;
}

impl IntoKeyResult for Key {
    fn into_key_result(self) -> Result<Option<Key>, KeyError> {
        Ok(Some(self))
    }
}

impl IntoKeyResult for Option<Key> {
    fn into_key_result(self) -> Result<Option<Key>, KeyError> {
        match self {
            Some(key) => Ok(Some(key)),
            None => Err(KeyError::client("closure", "the closure returned None")),
        }
    }
}

impl IntoKeyResult for Result<Key, KeyError> {
    fn into_key_result(self) -> Result<Option<Key>, KeyError> {
        self.map(Some)
    }
}

impl IntoKeyResult for Result<Option<Key>, KeyError> {
    fn into_key_result(self) -> Result<Option<Key>, KeyError> {
        self
    }
}

/// Any `Fn(&Parts) -> R` closure or function is an extractor.
///
/// Annotate the argument (`|parts: &Parts| ...`): the signature is only known
/// through this impl, so Rust cannot infer it from an unannotated closure.
///
/// ```
/// use http::request::Parts;
/// use tower_ratelimit::key::{Key, KeyError, KeyExtractor};
/// let by_host = |parts: &Parts| parts.uri.host().map(Key::new);
/// let req = http::Request::get("http://example.com/").body(()).unwrap();
/// let (parts, _) = req.into_parts();
/// assert_eq!(by_host.extract(&parts), Ok(Some(Key::new("example.com"))));
///
/// let never_limited = |_: &Parts| -> Result<Option<Key>, KeyError> { Ok(None) };
/// assert_eq!(never_limited.extract(&parts), Ok(None));
/// ```
impl<F, R> KeyExtractor for F
where
    F: Fn(&Parts) -> R + Send + Sync + 'static,
    R: IntoKeyResult,
{
    fn extract(&self, parts: &Parts) -> Result<Option<Key>, KeyError> {
        self(parts).into_key_result()
    }
}

// The layer stores its extractor as `Arc<dyn KeyExtractor>`; these let a shared
// extractor be used (and combined) wherever a concrete one can. `Box` gets only
// the trait-object impl: a generic `impl for Box<E>` would overlap with the
// closure impl, because `Box<F>` is itself `Fn` when `F` is (`Arc` is not).
impl<E: KeyExtractor + ?Sized> KeyExtractor for Arc<E> {
    fn extract(&self, parts: &Parts) -> Result<Option<Key>, KeyError> {
        (**self).extract(parts)
    }
}

impl KeyExtractor for Box<dyn KeyExtractor> {
    fn extract(&self, parts: &Parts) -> Result<Option<Key>, KeyError> {
        (**self).extract(parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::test_util::request;

    #[test]
    fn closure_returning_key_yields_that_key() {
        let e = |_: &Parts| Key::new("k");
        assert_eq!(e.extract(&request().parts()), Ok(Some(Key::new("k"))));
    }

    #[test]
    fn closure_returning_some_yields_the_key() {
        let e = |_: &Parts| Some(Key::new("k"));
        assert_eq!(e.extract(&request().parts()), Ok(Some(Key::new("k"))));
    }

    #[test]
    fn closure_returning_none_is_an_error_named_closure() {
        let e = |_: &Parts| None::<Key>;
        let err = e.extract(&request().parts()).unwrap_err();
        assert_eq!(err.extractor(), "closure");
        assert_eq!(err.reason(), "the closure returned None");
    }

    #[test]
    fn closure_returning_result_of_key_passes_key_and_error_through() {
        let ok = |_: &Parts| -> Result<Key, KeyError> { Ok(Key::new("k")) };
        assert_eq!(ok.extract(&request().parts()), Ok(Some(Key::new("k"))));
        let err = |_: &Parts| -> Result<Key, KeyError> { Err(KeyError::client("mine", "no")) };
        assert_eq!(
            err.extract(&request().parts()),
            Err(KeyError::client("mine", "no"))
        );
    }

    #[test]
    fn closure_returning_full_result_passes_exemption_key_and_error_through() {
        let parts = request().parts();
        let exempt = |_: &Parts| -> Result<Option<Key>, KeyError> { Ok(None) };
        assert_eq!(exempt.extract(&parts), Ok(None));
        let key = |_: &Parts| -> Result<Option<Key>, KeyError> { Ok(Some(Key::new("k"))) };
        assert_eq!(key.extract(&parts), Ok(Some(Key::new("k"))));
        let err = |_: &Parts| -> Result<Option<Key>, KeyError> { Err(KeyError::client("x", "y")) };
        assert_eq!(err.extract(&parts), Err(KeyError::client("x", "y")));
    }

    #[test]
    fn plain_fn_item_is_an_extractor() {
        fn by_path(parts: &Parts) -> Key {
            Key::new(parts.uri.path())
        }
        let parts = request().uri("/p").parts();
        assert_eq!(by_path.extract(&parts), Ok(Some(Key::new("/p"))));
    }

    #[test]
    fn arc_and_box_trait_objects_and_arc_of_concrete_delegate_to_the_inner_extractor() {
        let parts = request().parts();
        let concrete = Arc::new(|_: &Parts| Key::new("c"));
        assert_eq!(concrete.extract(&parts), Ok(Some(Key::new("c"))));
        let arc: Arc<dyn KeyExtractor> = Arc::new(|_: &Parts| Key::new("a"));
        let boxed: Box<dyn KeyExtractor> = Box::new(|_: &Parts| Key::new("b"));
        assert_eq!(arc.extract(&parts), Ok(Some(Key::new("a"))));
        assert_eq!(boxed.extract(&parts), Ok(Some(Key::new("b"))));
    }
}
