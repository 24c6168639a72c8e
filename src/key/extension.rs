//! Keys from a value that earlier middleware stored in the request extensions.

use super::{IntoKeyResult, Key, KeyError, KeyExtractor};
use http::request::Parts;
use std::any::type_name;
use std::fmt;
use std::marker::PhantomData;

/// Keys by a `T` that auth middleware put in the request extensions (see [`extension`]).
///
/// A missing `T` is a [`KeyError`]: `request extension `T` is missing (is the
/// auth middleware before the rate limiter?)`.
pub struct FromExtension<T, F> {
    f: F,
    // `fn() -> T`: the extractor never holds a `T`, so it is Send + Sync whatever `T` is.
    _t: PhantomData<fn() -> T>,
}

impl<T, F> FromExtension<T, F> {
    /// Keys by `f(&t)` for the `T` in the request extensions.
    ///
    /// `f` returns anything closures may ([`IntoKeyResult`]): a [`Key`], or
    /// `Result<Option<Key>, KeyError>` to exempt some users with `Ok(None)`.
    ///
    /// ```
    /// use tower_ratelimit::key::{FromExtension, Key};
    /// #[derive(Clone)]
    /// struct User { id: u64 }
    /// let by_user = FromExtension::new(|user: &User| Key::new(user.id.to_be_bytes()));
    /// # let _ = by_user;
    /// ```
    #[must_use]
    pub fn new<R>(f: F) -> Self
    where
        F: Fn(&T) -> R,
        R: IntoKeyResult,
    {
        Self { f, _t: PhantomData }
    }
}

/// Keys by `f(&t)` for the `T` that auth middleware put in the request extensions.
///
/// ```
/// use tower_ratelimit::key::{self, Key, KeyExtractor};
/// #[derive(Clone)]
/// struct User { id: u64 }
/// let by_user = key::extension(|user: &User| Key::new(user.id.to_be_bytes()));
///
/// let req = http::Request::builder().extension(User { id: 7 }).body(()).unwrap();
/// let (parts, _) = req.into_parts();
/// assert_eq!(by_user.extract(&parts), Ok(Some(Key::new(7u64.to_be_bytes()))));
///
/// let anonymous = http::Request::builder().body(()).unwrap().into_parts().0;
/// assert!(by_user.extract(&anonymous).is_err());
/// ```
#[must_use]
pub fn extension<T, F, R>(f: F) -> FromExtension<T, F>
where
    F: Fn(&T) -> R,
    R: IntoKeyResult,
{
    FromExtension::new(f)
}

impl<T, F, R> KeyExtractor for FromExtension<T, F>
where
    T: Send + Sync + 'static,
    F: Fn(&T) -> R + Send + Sync + 'static,
    R: IntoKeyResult,
{
    fn extract(&self, parts: &Parts) -> Result<Option<Key>, KeyError> {
        match parts.extensions.get::<T>() {
            Some(value) => (self.f)(value).into_key_result(),
            None => Err(KeyError::server(
                "extension",
                format!(
                    "request extension `{}` is missing (is the auth middleware before the rate limiter?)",
                    type_name::<T>()
                ),
            )),
        }
    }
}

impl<T, F: Clone> Clone for FromExtension<T, F> {
    fn clone(&self) -> Self {
        Self {
            f: self.f.clone(),
            _t: PhantomData,
        }
    }
}

impl<T, F> fmt::Debug for FromExtension<T, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FromExtension")
            .field("type", &type_name::<T>())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::test_util::request;

    #[derive(Clone)]
    struct User {
        id: u64,
        admin: bool,
    }

    #[test]
    fn present_extension_is_keyed_by_the_closure() {
        let e = extension(|u: &User| Key::new(u.id.to_be_bytes()));
        let parts = request()
            .extension(User {
                id: 7,
                admin: false,
            })
            .parts();
        assert_eq!(e.extract(&parts), Ok(Some(Key::new(7u64.to_be_bytes()))));
    }

    #[test]
    fn missing_extension_error_names_the_type_and_the_likely_fix() {
        let e = extension(|u: &User| Key::new(u.id.to_be_bytes()));
        let err = e.extract(&request().parts()).unwrap_err();
        assert_eq!(err.extractor(), "extension");
        assert_eq!(
            err.reason(),
            format!(
                "request extension `{}` is missing (is the auth middleware before the rate limiter?)",
                type_name::<User>()
            )
        );
        assert!(err.reason().contains("User"));
    }

    #[test]
    fn closure_may_exempt_through_a_full_result() {
        let e = FromExtension::new(|u: &User| -> Result<Option<Key>, KeyError> {
            Ok((!u.admin).then(|| Key::new(u.id.to_be_bytes())))
        });
        let admin = request().extension(User { id: 1, admin: true }).parts();
        assert_eq!(e.extract(&admin), Ok(None));
    }

    #[test]
    fn debug_shows_the_extension_type_name() {
        let e = extension(|u: &User| Key::new(u.id.to_be_bytes()));
        assert!(format!("{e:?}").contains("User"));
    }
}
