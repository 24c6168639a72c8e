//! Redis key names: `prefix + "{" + tag + "}"`, where the tag is a digest of
//! the namespace and client key, never the raw key. Client input therefore
//! cannot inject braces (moving the hash slot), newlines or unbounded length.

use crate::key::Key;
use crate::store::call::Namespace;
use sha2::{Digest, Sha256};
use smallvec::SmallVec;

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The Redis key holding `key`'s state in `namespace`, e.g. `trl:api:{9f86d081884c7d65}`.
///
/// `prefix` and the namespace are validated configuration (no braces); the
/// tag is 128 bits of SHA-256, so two clients never share state by accident.
pub(crate) fn redis_key(prefix: &str, namespace: &Namespace, key: &Key) -> String {
    String::from_utf8(hash_key(prefix, namespace, key).to_vec())
        .expect("prefix and namespace are validated ASCII, the tag is hex")
}

/// A Redis key as bytes, inline up to 80 bytes (no allocation per request
/// for usual prefixes and namespaces).
pub(crate) type HashKey = SmallVec<[u8; 80]>;

/// [`redis_key`] as bytes.
pub(crate) fn hash_key(prefix: &str, namespace: &Namespace, key: &Key) -> HashKey {
    let mut s = HashKey::new();
    s.extend_from_slice(prefix.as_bytes());
    s.extend_from_slice(namespace.name().as_bytes());
    push_tag(&mut s, namespace, key);
    s
}

/// `:{`, 32 hex digits of SHA-256 over the namespace and the key, and `}`.
type Tag = [u8; 35];

/// Appends the [`Tag`] of `key` in `namespace` to `s`. Each thread keeps the
/// last one it made: a global limit or a busy client (the same key request
/// after request) pays for SHA-256 once, not on every request. Without it
/// a hot key's charge through the Redis store exceeds its instruction
/// budget (`redis-bare` in `benches/instructions.budget`). The kept tag is
/// read in place, not copied out first.
fn push_tag(s: &mut HashKey, namespace: &Namespace, key: &Key) {
    use std::cell::RefCell;
    thread_local! {
        static LAST: RefCell<Option<(u64, Key, Tag)>> = const { RefCell::new(None) };
    }
    let id = namespace.id();
    let kept = LAST.with_borrow(|last| match last {
        // A namespace's id is its identity throughout the crate (a digest of its name).
        Some((last_id, last_key, tag)) if *last_id == id && last_key == key => {
            s.extend_from_slice(tag);
            true
        }
        _ => false,
    });
    if !kept {
        let tag = digest_tag(namespace, key);
        s.extend_from_slice(&tag);
        LAST.set(Some((id, *key, tag)));
    }
}

fn digest_tag(namespace: &Namespace, key: &Key) -> Tag {
    #[cfg(test)]
    tests::DIGESTS.set(tests::DIGESTS.get() + 1);
    let mut h = Sha256::new();
    h.update(namespace.name().as_bytes());
    h.update([0]);
    h.update(key.as_bytes());
    let d = h.finalize();
    let mut tag = [0u8; 35];
    tag[..2].copy_from_slice(b":{");
    for (pair, b) in tag[2..34].chunks_exact_mut(2).zip(&d[..16]) {
        pair[0] = HEX[(b >> 4) as usize];
        pair[1] = HEX[(b & 15) as usize];
    }
    tag[34] = b'}';
    tag
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        /// SHA-256 digests this thread has made.
        pub(super) static DIGESTS: Cell<u32> = const { Cell::new(0) };
    }

    fn tag(k: &str) -> &str {
        let open = k.find('{').unwrap();
        &k[open + 1..k.len() - 1]
    }

    #[test]
    fn hostile_client_keys_cannot_move_the_slot_or_grow_the_key() {
        let ns = Namespace::new("api");
        for raw in ["}x", "", "{evil}", "a\r\nFLUSHALL\r\n", &"z".repeat(65536)] {
            let k = redis_key("trl:", &ns, &Key::new(raw));
            assert!(k.starts_with("trl:api:{"));
            assert_eq!(k.matches('{').count(), 1, "{k}");
            assert_eq!(k.matches('}').count(), 1, "{k}");
            assert_eq!(tag(&k).len(), 32);
            assert!(tag(&k).bytes().all(|b| b.is_ascii_hexdigit()));
            assert!(!k.contains('\n'));
        }
    }

    #[test]
    fn namespaces_and_keys_give_distinct_redis_keys() {
        let (a, b) = (Namespace::new("a"), Namespace::new("b"));
        assert_ne!(
            redis_key("p:", &a, &Key::new("x")),
            redis_key("p:", &b, &Key::new("x"))
        );
        assert_ne!(
            redis_key("p:", &a, &Key::new("x")),
            redis_key("p:", &a, &Key::new("y"))
        );
        assert_eq!(
            redis_key("p:", &a, &Key::new("x")),
            redis_key("p:", &a, &Key::new("x"))
        );
    }

    #[test]
    fn the_last_tag_a_thread_made_is_reused_only_for_the_same_namespace_and_key() {
        let (a, b) = (Namespace::new("a"), Namespace::new("b"));
        let (x, y) = (Key::new("x"), Key::new("y"));
        // Alternating and repeating: every answer is the digest's own, and
        // only a repeat of the previous namespace and key skips the digest.
        let mut previous = None;
        for (ns, key) in [
            (&a, &x),
            (&a, &x),
            (&b, &x),
            (&a, &x),
            (&a, &y),
            (&a, &y),
            (&b, &y),
        ] {
            let before = DIGESTS.get();
            let made = hash_key("p:", ns, key);
            let digests = DIGESTS.get() - before;
            let repeat = previous == Some((ns.id(), *key));
            assert_eq!(digests, u32::from(!repeat), "{} {:?}", ns.name(), key);
            assert_eq!(
                &made[..],
                [b"p:", ns.name().as_bytes(), &digest_tag(ns, key)[..]].concat()
            );
            previous = Some((ns.id(), *key));
        }
        assert_ne!(digest_tag(&a, &x), digest_tag(&b, &x));
        assert_ne!(digest_tag(&a, &x), digest_tag(&a, &y));
    }
}
