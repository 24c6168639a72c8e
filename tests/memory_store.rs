//! The memory store on its own: exactness, reclaiming expired state, and the key cap.

use std::time::Duration;
use tower_ratelimit::key::Key;
use tower_ratelimit::store::{Charge, MemoryStore, Namespace, Overflow, Store};
use tower_ratelimit::{Decision, Policy, Quota, StoreError};

fn charge(
    store: &MemoryStore,
    ns: &Namespace,
    key: Key,
    policy: &Policy,
    now_ms: u64,
) -> Result<Decision, StoreError> {
    store
        .charge(&Charge {
            namespace: ns,
            key: &key,
            policy,
            cost: 1,
            now_ms,
            timeout: Duration::from_millis(50),
        })
        .now_or_never()
        .expect("the memory store answers at once")
}

fn key(i: u64) -> Key {
    Key::new(i.to_le_bytes())
}

const CAP: usize = 10_000;
const FLOOD: u64 = 1_000_000;

#[test]
fn reject_new_holds_the_cap_under_a_million_unique_keys_and_keeps_existing_clients_exact() {
    let store = MemoryStore::builder()
        .max_keys(CAP)
        .overflow(Overflow::RejectNew)
        .build();
    let ns = Namespace::new("cap");
    let policy = Policy::new(Quota::new(3, Duration::from_secs(60)).unwrap());
    // A known client uses 2 of 3 before the flood.
    let victim = Key::new("victim");
    charge(&store, &ns, victim, &policy, 0).unwrap();
    charge(&store, &ns, victim, &policy, 0).unwrap();
    let mut refused = 0u64;
    for i in 0..FLOOD {
        match charge(&store, &ns, key(i), &policy, 1) {
            Ok(d) => assert!(d.is_allowed()),
            Err(StoreError::Full {
                max_keys,
                retry_at_ms,
            }) => {
                assert_eq!(max_keys, CAP);
                assert!(retry_at_ms > 1);
                refused += 1;
            }
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert!(store.len() <= CAP, "{} keys held", store.len());
    assert!(refused >= FLOOD - CAP as u64);
    // The flood did not reset the victim's window: one unit left, then rejected.
    assert!(charge(&store, &ns, victim, &policy, 2)
        .unwrap()
        .is_allowed());
    assert!(!charge(&store, &ns, victim, &policy, 2)
        .unwrap()
        .is_allowed());
}

#[test]
fn evict_live_holds_the_cap_under_a_million_unique_keys_and_always_serves_newcomers() {
    let store = MemoryStore::builder()
        .max_keys(CAP)
        .overflow(Overflow::EvictLive)
        .build();
    let ns = Namespace::new("cap");
    let policy = Policy::new(Quota::new(3, Duration::from_secs(60)).unwrap());
    for i in 0..FLOOD {
        let d = charge(&store, &ns, key(i), &policy, 1).unwrap();
        assert!(d.is_allowed());
        if i % 100_000 == 0 {
            assert!(store.len() <= CAP);
        }
    }
    assert!(store.len() <= CAP, "{} keys held", store.len());
    assert!(store.len() >= CAP / 2, "the cap is used, not thrown away");
}

#[test]
fn expired_state_is_reclaimed_so_new_keys_fit_after_the_window() {
    let store = MemoryStore::builder()
        .max_keys(1_000)
        .overflow(Overflow::RejectNew)
        .build();
    let ns = Namespace::new("reclaim");
    let policy = Policy::new(Quota::new(1, Duration::from_secs(1)).unwrap());
    // The cap is enforced per shard, so fill until the store refuses.
    let mut held = 0;
    for i in 0..2_000 {
        if charge(&store, &ns, key(i), &policy, 0).is_ok() {
            held += 1;
        }
    }
    assert!((500..=1_000).contains(&held), "{held}");
    assert!(matches!(
        charge(&store, &ns, key(5_000), &policy, 500),
        Err(StoreError::Full { .. })
    ));
    // Every window ended at 1000 ms: new keys take their place.
    let mut fresh = 0;
    for i in 10_000..12_000 {
        if charge(&store, &ns, key(i), &policy, 1_000).is_ok() {
            fresh += 1;
        }
    }
    assert!(fresh >= held, "{fresh} < {held}");
    assert!(store.len() <= 1_000);
}

#[test]
fn namespaces_sharing_a_store_keep_separate_state() {
    let store = MemoryStore::new();
    let policy = Policy::new(Quota::new(1, Duration::from_secs(60)).unwrap());
    let (a, b) = (Namespace::new("a"), Namespace::new("b"));
    assert!(charge(&store, &a, Key::global(), &policy, 0)
        .unwrap()
        .is_allowed());
    assert!(charge(&store, &b, Key::global(), &policy, 0)
        .unwrap()
        .is_allowed());
    assert!(!charge(&store, &a, Key::global(), &policy, 0)
        .unwrap()
        .is_allowed());
}

#[test]
fn several_quotas_are_charged_all_or_nothing() {
    let store = MemoryStore::new();
    let ns = Namespace::new("multi");
    let policy = Policy::new(Quota::new(2, Duration::from_secs(1)).unwrap())
        .and(Quota::new(3, Duration::from_secs(3600)).unwrap())
        .unwrap();
    let k = Key::new("c");
    assert!(charge(&store, &ns, k, &policy, 0).unwrap().is_allowed());
    assert!(charge(&store, &ns, k, &policy, 0).unwrap().is_allowed());
    // The per-second quota rejects: the hourly one is not charged.
    let d = charge(&store, &ns, k, &policy, 0).unwrap();
    assert!(!d.is_allowed());
    assert_eq!(d.statuses()[1].remaining, 1);
    // Next second: one more fits the hourly quota, then the hourly quota rejects,
    // and the per-second quota keeps what it had.
    assert!(charge(&store, &ns, k, &policy, 1_000).unwrap().is_allowed());
    let d = charge(&store, &ns, k, &policy, 1_000).unwrap();
    assert!(!d.is_allowed());
    assert_eq!(
        (d.statuses()[0].remaining, d.statuses()[1].remaining),
        (1, 0)
    );
}
