//! Redis key names for arbitrary limiter names, prefixes and client keys:
//! every key of one client (its state hash, its sliding-log sets, its
//! concurrency slots) has one hash tag and lands on one cluster slot, and
//! distinct client keys never share a name.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tower_ratelimit::key::Key;
use tower_ratelimit::store::{Namespace, RedisStore};

/// The cluster slot of a Redis key (CRC16/XMODEM of its hash tag, or of the
/// whole key without one), as Redis computes it.
fn slot(key: &str) -> u16 {
    const CRC: crc::Crc<u16> = crc::Crc::<u16>::new(&crc::CRC_16_XMODEM);
    let b = key.as_bytes();
    let tagged = b.iter().position(|&c| c == b'{').and_then(|open| {
        let close = b[open + 1..].iter().position(|&c| c == b'}')?;
        (close > 0).then(|| &b[open + 1..open + 1 + close])
    });
    CRC.checksum(tagged.unwrap_or(b)) % 16384
}

fuzz_target!(|input: (&str, &str, &[u8], &[u8])| {
    let (name, prefix, a, b) = input;
    // Names and prefixes are configuration: only those the builders accept.
    if tower_ratelimit::RateLimitLayer::builder()
        .name(name)
        .quota(tower_ratelimit::Quota::new(1, std::time::Duration::from_secs(1)).unwrap())
        .build()
        .is_err()
    {
        return;
    }
    let Ok(store) = RedisStore::builder("redis://127.0.0.1:6379").prefix(prefix).build() else {
        return;
    };
    let ns = Namespace::new(name);
    let (ka, kb) = (Key::new(a), Key::new(b));
    let (ra, rb) = (store.redis_key(&ns, &ka), store.redis_key(&ns, &kb));
    for k in [&ra, &rb] {
        assert_eq!(k.matches('{').count(), 1, "{k}");
        assert_eq!(k.matches('}').count(), 1, "{k}");
        assert!(k.ends_with('}'), "{k}");
        assert!(!k.contains(['\n', '\r', ' ']), "{k}");
    }
    assert_eq!(slot(&ra), slot(&store.slots_key(&ns, &ka)), "slots on another slot");
    assert_eq!(slot(&ra), slot(&format!("{ra}:sl60000")), "sliding log on another slot");
    assert_eq!(ra == rb, ka == kb, "two clients, one key: {ra}");
    assert_eq!(ka == kb, a == b, "two inputs, one client key");
});
