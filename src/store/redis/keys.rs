//! Redis key names: `prefix + "{" + tag + "}"`, where the tag is a digest of
//! the namespace and client key, never the raw key. Client input therefore
//! cannot inject braces (moving the hash slot), newlines or unbounded length.

use crate::key::Key;
use crate::store::Namespace;
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
    let mut h = Sha256::new();
    h.update(namespace.name().as_bytes());
    h.update([0]);
    h.update(key.as_bytes());
    let d = h.finalize();
    // `:{`, 32 hex digits and `}`, then copied in one piece.
    let mut tag = [0u8; 35];
    tag[..2].copy_from_slice(b":{");
    for (pair, b) in tag[2..34].chunks_exact_mut(2).zip(&d[..16]) {
        pair[0] = HEX[(b >> 4) as usize];
        pair[1] = HEX[(b & 15) as usize];
    }
    tag[34] = b'}';
    let mut s = HashKey::new();
    s.extend_from_slice(prefix.as_bytes());
    s.extend_from_slice(namespace.name().as_bytes());
    s.extend_from_slice(&tag);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
