//! The [`Key`] value: a bounded, unambiguous identity for one rate-limited client.

use sha2::{Digest, Sha256};
use std::fmt;
use std::net::IpAddr;

/// Encoded bytes a key keeps inline; longer encodings are replaced by a digest.
const CAPACITY: usize = 47;
/// Bytes of SHA-256 kept when a key is hashed (192 bits: collisions are not a concern).
const DIGEST_LEN: usize = 24;

// First byte of every encoding: it says how the rest was built, so keys of
// different kinds can never be equal by accident.
const TAG_BYTES: u8 = 0x01;
const TAG_SECRET: u8 = 0x02;
const TAG_IPV4: u8 = 0x04;
const TAG_IPV6: u8 = 0x06;
const TAG_COMPOSITE: u8 = 0x10;
const TAG_DIGEST: u8 = 0xff;

/// The identity a request is limited under (a client IP, an API key, a user, a route, …).
///
/// A `Key` is at most 48 bytes and `Copy`: whatever the input (a 64 KiB header,
/// a long path), it is encoded with a tag that says what it is and, when longer
/// than fits, replaced by a SHA-256 digest. Distinct inputs of distinct kinds
/// never produce equal keys, and [`Key::composite`] length-prefixes its parts so
/// `("a", "b:c")` and `("a:b", "c")` differ.
///
/// ```
/// use tower_ratelimit::key::Key;
/// let a = Key::composite(&[Key::new("a"), Key::new("b:c")]);
/// let b = Key::composite(&[Key::new("a:b"), Key::new("c")]);
/// assert_ne!(a, b);
/// assert!(Key::new(vec![b'x'; 65536]).as_bytes().len() <= 48);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    len: u8,
    bytes: [u8; CAPACITY],
}

impl Key {
    /// A key from arbitrary bytes (a header value, a user id, a route name).
    pub fn new(value: impl AsRef<[u8]>) -> Self {
        Self::tagged(TAG_BYTES, value.as_ref())
    }

    /// A key from a secret (API key, bearer token): always stored as a digest,
    /// so the secret itself never sits in memory, Redis or logs.
    pub fn secret(value: impl AsRef<[u8]>) -> Self {
        let mut h = Sha256::new();
        h.update([TAG_SECRET]);
        h.update(value.as_ref());
        Self::digest(TAG_SECRET, h)
    }

    /// A key for an IP address. Callers normalise first (see [`crate::key::ClientIp`]);
    /// this only encodes.
    pub fn ip(addr: IpAddr) -> Self {
        match addr {
            IpAddr::V4(v4) => Self::tagged(TAG_IPV4, &v4.octets()),
            IpAddr::V6(v6) => Self::tagged(TAG_IPV6, &v6.octets()),
        }
    }

    /// The one key every request shares (a global limit).
    pub fn global() -> Self {
        Self::tagged(TAG_BYTES, b"")
    }

    /// Combines keys unambiguously: each part is length-prefixed.
    pub fn composite(parts: &[Key]) -> Self {
        let mut buf = [0u8; 1 + 4 * (CAPACITY + 2)];
        let needed: usize = 1 + parts.iter().map(|p| 1 + p.len as usize).sum::<usize>();
        if needed <= buf.len() {
            let mut at = 0;
            buf[at] = TAG_COMPOSITE;
            at += 1;
            for p in parts {
                buf[at] = p.len;
                at += 1;
                buf[at..at + p.len as usize].copy_from_slice(p.as_bytes());
                at += p.len as usize;
            }
            Self::encoded(&buf[..at])
        } else {
            let mut v = Vec::with_capacity(needed);
            v.push(TAG_COMPOSITE);
            for p in parts {
                v.push(p.len);
                v.extend_from_slice(p.as_bytes());
            }
            Self::encoded(&v)
        }
    }

    /// The encoded bytes (tag, then payload or digest). Stable across processes
    /// and versions of the same major release: stores derive their keys from it.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// The text the key was made from with [`Key::new`], when it was kept
    /// whole (under 47 bytes) and is UTF-8: for reports an operator reads.
    /// Secrets, addresses, composites and long keys have none.
    ///
    /// ```
    /// use tower_ratelimit::key::Key;
    /// assert_eq!(Key::new("acme").text(), Some("acme"));
    /// assert_eq!(Key::secret("sk_live_1").text(), None);
    /// assert_eq!(Key::new("x".repeat(100)).text(), None);
    /// ```
    pub fn text(&self) -> Option<&str> {
        match self.as_bytes().split_first() {
            Some((&TAG_BYTES, rest)) => std::str::from_utf8(rest).ok(),
            _ => None,
        }
    }

    fn tagged(tag: u8, payload: &[u8]) -> Self {
        if payload.len() < CAPACITY {
            let mut bytes = [0u8; CAPACITY];
            bytes[0] = tag;
            bytes[1..1 + payload.len()].copy_from_slice(payload);
            Key {
                len: (1 + payload.len()) as u8,
                bytes,
            }
        } else {
            let mut h = Sha256::new();
            h.update([tag]);
            h.update(payload);
            Self::digest(TAG_DIGEST, h)
        }
    }

    /// The key whose [`as_bytes`](Self::as_bytes) is `enc`, when it can be
    /// one (as a store gives back what it was given).
    #[cfg(all(feature = "advisor", feature = "redis"))]
    pub(crate) fn decode(enc: &[u8]) -> Option<Self> {
        (!enc.is_empty() && enc.len() <= CAPACITY).then(|| Self::encoded(enc))
    }

    /// Keeps an already tagged encoding, hashing it when too long.
    fn encoded(enc: &[u8]) -> Self {
        if enc.len() <= CAPACITY {
            let mut bytes = [0u8; CAPACITY];
            bytes[..enc.len()].copy_from_slice(enc);
            Key {
                len: enc.len() as u8,
                bytes,
            }
        } else {
            let mut h = Sha256::new();
            h.update(enc);
            Self::digest(TAG_DIGEST, h)
        }
    }

    /// A key of `tag` and the first bytes of `h`'s digest.
    fn digest(tag: u8, h: Sha256) -> Self {
        let digest = h.finalize();
        let mut bytes = [0u8; CAPACITY];
        bytes[0] = tag;
        bytes[1..1 + DIGEST_LEN].copy_from_slice(&digest[..DIGEST_LEN]);
        Key {
            len: (1 + DIGEST_LEN) as u8,
            bytes,
        }
    }
}

impl fmt::Debug for Key {
    // Hex only: a key may hold a header value, and logs should not echo client input.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(")?;
        for b in self.as_bytes() {
            write!(f, "{b:02x}")?;
        }
        f.write_str(")")
    }
}

impl From<IpAddr> for Key {
    fn from(addr: IpAddr) -> Self {
        Key::ip(addr)
    }
}

impl From<&str> for Key {
    fn from(s: &str) -> Self {
        Key::new(s)
    }
}

impl From<String> for Key {
    fn from(s: String) -> Self {
        Key::new(s)
    }
}

/// Hashes the encoded bytes only (the rest of the buffer is always zero):
/// consistent with `Eq`, and a third of the work for a short key.
impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_never_collide() {
        assert_ne!(
            Key::new([127, 0, 0, 1]),
            Key::ip("127.0.0.1".parse().unwrap())
        );
        assert_ne!(Key::new("abc"), Key::secret("abc"));
        assert_ne!(Key::global(), Key::composite(&[]));
    }

    #[test]
    fn composite_is_unambiguous() {
        let a = Key::composite(&[Key::new("a"), Key::new("b:c")]);
        let b = Key::composite(&[Key::new("a:b"), Key::new("c")]);
        assert_ne!(a, b);
        let long = Key::composite(&[Key::new([1u8; 40]), Key::new([2u8; 40])]);
        let long2 = Key::composite(&[Key::new([1u8; 41]), Key::new([2u8; 39])]);
        assert_ne!(long, long2);
    }

    #[test]
    fn long_inputs_are_bounded_and_distinct() {
        let a = Key::new(vec![b'a'; 64 * 1024]);
        let mut v = vec![b'a'; 64 * 1024];
        v[1000] = b'b';
        let b = Key::new(v);
        assert!(a.as_bytes().len() <= 48);
        assert_ne!(a, b);
        assert_eq!(a, Key::new(vec![b'a'; 64 * 1024]));
    }

    #[test]
    fn boundary_lengths() {
        let fits = Key::new([7u8; CAPACITY - 1]);
        assert_eq!(fits.as_bytes()[0], TAG_BYTES);
        let hashed = Key::new([7u8; CAPACITY]);
        assert_eq!(hashed.as_bytes()[0], TAG_DIGEST);
    }
}
