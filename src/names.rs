//! One name, one limiter: a limiter's name keeps its state apart from other
//! limiters' in a store they share, so two different limiters must never
//! carry the same name on the same store. Each layer claims its name on its
//! store's [identity](crate::store::Store::identity) when it is built, and
//! gives it back when its last clone is dropped.
//!
//! A second claim succeeds only for the same limiter: the same kind and the
//! same fixed configuration (several instances of one fleet simulated in one
//! process, or the same layer built twice on purpose). A limiter whose policy
//! is chosen per request is different from every other: clone its layer
//! instead of building it twice.

use crate::error::{ConfigError, ConfigErrorKind};
use crate::store::Store;
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// A name on a store: (store identity, name).
type Slot = (String, String);

/// The claims alive in this process: each slot's limiter, as described, and
/// how many hold it.
static CLAIMS: Mutex<Option<HashMap<Slot, (String, usize)>>> = Mutex::new(None);

/// A limiter's hold on its name; dropped with the limiter.
#[derive(Debug)]
pub(crate) struct Claim(Option<Slot>);

/// Claims `name` on `store` for the limiter `what` (its kind and
/// configuration, as an error message shows it); a `unique` one equals no
/// other, not even one described alike (a policy chosen per request).
pub(crate) fn claim(
    store: &dyn Store,
    name: &str,
    what: String,
    unique: bool,
) -> Result<Claim, ConfigError> {
    let Some(identity) = store.identity() else {
        return Ok(Claim(None));
    };
    let slot = (identity, name.to_owned());
    let mut claims = CLAIMS.lock().unwrap_or_else(PoisonError::into_inner);
    let claims = claims.get_or_insert_with(HashMap::new);
    match claims.get_mut(&slot) {
        Some((held, n)) if *held == what && !unique => *n += 1,
        Some((held, _)) => {
            return Err(ConfigError::new(
                ConfigErrorKind::Conflict,
                format!(
                "the limiter name `{name}` is taken on this store by another limiter ({held}); \
                 this one ({what}) would share its state: give each limiter its own name with \
                 .name(..), or clone one layer to use it in several places"
            ),
            ))
        }
        None => {
            claims.insert(slot.clone(), (what, 1));
        }
    }
    Ok(Claim(Some(slot)))
}

impl Drop for Claim {
    fn drop(&mut self) {
        let Some(slot) = self.0.take() else { return };
        let mut claims = CLAIMS.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(claims) = claims.as_mut() {
            if let Some((_, n)) = claims.get_mut(&slot) {
                *n -= 1;
                if *n == 0 {
                    claims.remove(&slot);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    #[test]
    fn the_same_limiter_may_claim_twice_a_different_one_is_refused_until_the_first_is_gone() {
        let store = MemoryStore::new();
        let a = claim(&store, "api", "rate limit 5/1m".into(), false).unwrap();
        let again = claim(&store, "api", "rate limit 5/1m".into(), false).unwrap();
        let err = claim(&store, "api", "rate limit 1000/1m".into(), false).unwrap_err();
        assert!(err.to_string().contains("`api`"), "{err}");
        assert!(err.to_string().contains("5/1m"), "{err}");
        // Another store, or another name, is free.
        claim(
            &MemoryStore::new(),
            "api",
            "rate limit 1000/1m".into(),
            false,
        )
        .unwrap();
        claim(&store, "login", "rate limit 1000/1m".into(), false).unwrap();
        drop((a, again));
        claim(&store, "api", "rate limit 1000/1m".into(), false).unwrap();
    }

    #[test]
    fn a_unique_limiter_equals_no_other() {
        let store = MemoryStore::new();
        let _a = claim(
            &store,
            "api",
            "rate limit (a policy per request)".into(),
            true,
        )
        .unwrap();
        assert!(claim(
            &store,
            "api",
            "rate limit (a policy per request)".into(),
            true
        )
        .is_err());
    }
}
