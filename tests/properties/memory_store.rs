//! The memory store on its own: exactness, reclaiming expired state, and the
//! key cap under a flood of distinct keys.

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use std::collections::BTreeMap;
use std::time::Duration;
use tower_ratelimit::key::Key;
use tower_ratelimit::store::{Charge, MemoryStore, Namespace, Settle, Store};
use tower_ratelimit::{decision::Decision, Policy, Quota};

fn charge(store: &MemoryStore, ns: &Namespace, key: Key, policy: &Policy, now_ms: u64) -> Decision {
    store
        .charge(&Charge::new(ns, &key, policy, now_ms).with_timeout(Duration::from_millis(50)))
        .now_or_never()
        .expect("the memory store answers at once")
        .expect("the memory store never fails")
}

fn key(i: u64) -> Key {
    Key::new(i.to_le_bytes())
}

fn hourly(limit: u64) -> Policy {
    Policy::new(Quota::new(limit, Duration::from_secs(3600)).unwrap())
}

/// `ratelimit_memory_evictions_total` as `f` leaves it, per `limiter`
/// label (`None` for a series without one).
fn evictions(f: impl FnOnce()) -> BTreeMap<Option<String>, u64> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, f);
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, ..)| k.key().name() == "ratelimit_memory_evictions_total")
        .map(|(k, .., v)| {
            let limiter = k
                .key()
                .labels()
                .find(|l| l.key() == "limiter")
                .map(|l| l.value().to_owned());
            match v {
                DebugValue::Counter(n) => (limiter, n),
                other => panic!("{other:?}"),
            }
        })
        .collect()
}

/// Evictions counted for `limiter` alone.
fn only(limiter: &str, n: u64) -> BTreeMap<Option<String>, u64> {
    BTreeMap::from([(Some(limiter.to_owned()), n)])
}

const CAP: usize = 10_000;
const FLOOD: u64 = 2_000_000;

/// A flood of two million distinct keys (one request each) into a store of
/// 10,000: a heavy client present from the start keeps its count and is
/// never reset, a client arriving mid-flood is served within its quota, and
/// memory stays at its cap.
#[test]
fn a_flood_of_distinct_keys_costs_the_flooder_not_the_newcomer_nor_the_heavy_client() {
    let store = MemoryStore::builder().max_keys(CAP).build();
    let ns = Namespace::new("flood");
    let (flood, heavy_quota, newcomer_quota) = (hourly(5), hourly(100), hourly(5));
    let (heavy, newcomer) = (Key::new("heavy"), Key::new("newcomer"));
    let evicted = evictions(|| {
        for _ in 0..60 {
            assert!(charge(&store, &ns, heavy, &heavy_quota, 0).is_allowed());
        }
        let mut heavy_admitted = 60;
        let mut newcomer_admitted = 0;
        for i in 0..FLOOD {
            assert!(charge(&store, &ns, key(i), &flood, 1).is_allowed());
            // The heavy client keeps its pace: one request every 50,000 keys.
            if i % 50_000 == 0 && charge(&store, &ns, heavy, &heavy_quota, 1).is_allowed() {
                heavy_admitted += 1;
            }
            // The newcomer arrives halfway and makes ten requests, ten keys apart.
            if (1_000_000..1_000_100).contains(&i)
                && i % 10 == 0
                && charge(&store, &ns, newcomer, &newcomer_quota, 1).is_allowed()
            {
                newcomer_admitted += 1;
            }
            if i % 250_000 == 0 {
                assert!(store.len() <= CAP, "{} keys held", store.len());
            }
        }
        assert_eq!(newcomer_admitted, 5, "served, within its quota");
        assert_eq!(heavy_admitted, 100, "its count was never reset");
        // Still at its limit after the flood: nothing handed it a fresh window.
        assert!(!charge(&store, &ns, heavy, &heavy_quota, 2).is_allowed());
        assert!(!charge(&store, &ns, newcomer, &newcomer_quota, 2).is_allowed());
    });
    assert!(store.len() <= CAP, "{} keys held", store.len());
    assert!(
        store.len() >= CAP * 9 / 10,
        "the cap is used, not thrown away"
    );
    // Every key past the cap made room for itself by evicting one.
    let extra = FLOOD + 2 - store.len() as u64;
    assert_eq!(evicted, only("flood", extra), "evictions are counted");
}

#[test]
fn expired_state_makes_room_before_any_live_key_is_evicted() {
    // One shard: the cap holds exactly 1,000 keys, whatever their hashes.
    let store = MemoryStore::builder().max_keys(1_000).shards(1).build();
    let ns = Namespace::new("reclaim");
    let policy = Policy::new(Quota::new(1, Duration::from_secs(1)).unwrap());
    let evicted = evictions(|| {
        for i in 0..1_000 {
            charge(&store, &ns, key(i), &policy, 0);
        }
        // Every window ended at 1000 ms: new keys take their place.
        for i in 10_000..11_000 {
            assert!(charge(&store, &ns, key(i), &policy, 1_000).is_allowed());
        }
    });
    assert!(store.len() <= 1_000);
    assert_eq!(evicted, BTreeMap::new(), "only expired state was reclaimed");
}

/// Two limiters share a full store: the evictions count under the limiter
/// whose new keys needed the room, labelled with its name.
#[test]
fn evictions_are_counted_for_the_limiter_whose_new_key_needed_the_room() {
    let store = MemoryStore::builder().max_keys(100).shards(1).build();
    let (first, second) = (Namespace::new("first"), Namespace::new("second"));
    let policy = hourly(5);
    let evicted = evictions(|| {
        for i in 0..100 {
            assert!(charge(&store, &first, key(i), &policy, 0).is_allowed());
        }
        for i in 0..10 {
            assert!(charge(&store, &second, key(i), &policy, 0).is_allowed());
        }
    });
    assert_eq!(store.len(), 100);
    assert_eq!(evicted, only("second", 10));
}

/// A settlement can make new state (debt on a bucket that is gone, which
/// is a full one): when the store is full, the room it takes is an
/// eviction like any other, and is counted.
#[test]
fn a_settlement_that_makes_room_in_a_full_store_counts_its_eviction() {
    let store = MemoryStore::builder().max_keys(1).shards(1).build();
    let ns = Namespace::new("settled");
    let bucket = Policy::new(
        Quota::new(10, Duration::from_secs(3600))
            .unwrap()
            .with_algorithm(tower_ratelimit::Algorithm::TokenBucket)
            .unwrap()
            .with_unit("tokens")
            .unwrap(),
    );
    let (debtor, other) = (Key::new("debtor"), Key::new("other"));
    let ask =
        |now_ms| Charge::new(&ns, &debtor, &bucket, now_ms).with_timeout(Duration::from_millis(50));
    let d = store.charge(&ask(0)).now_or_never().unwrap().unwrap();
    assert!(d.is_allowed());
    let by_charge = evictions(|| {
        assert!(charge(&store, &ns, other, &bucket, 1).is_allowed());
    });
    assert_eq!(
        by_charge,
        only("settled", 1),
        "the debtor's bucket made room"
    );
    let by_settlement = evictions(|| {
        // It used five tokens, not one: four more, to a bucket no longer held.
        store
            .settle(&Settle::units(ask(0), &d, 5, 2))
            .now_or_never()
            .unwrap()
            .unwrap();
    });
    assert_eq!(by_settlement, only("settled", 1), "`other` made room");
    assert_eq!(store.len(), 1);
    let d = store.charge(&ask(3)).now_or_never().unwrap().unwrap();
    assert_eq!(d.statuses()[0].remaining, 5, "the debt was kept");
}

#[test]
fn namespaces_sharing_a_store_keep_separate_state() {
    let store = MemoryStore::new();
    let policy = Policy::new(Quota::new(1, Duration::from_secs(60)).unwrap());
    let (a, b) = (Namespace::new("a"), Namespace::new("b"));
    assert!(charge(&store, &a, Key::global(), &policy, 0).is_allowed());
    assert!(charge(&store, &b, Key::global(), &policy, 0).is_allowed());
    assert!(!charge(&store, &a, Key::global(), &policy, 0).is_allowed());
}

#[test]
fn several_quotas_are_charged_all_or_nothing() {
    let store = MemoryStore::new();
    let ns = Namespace::new("multi");
    let policy = Policy::new(Quota::new(2, Duration::from_secs(1)).unwrap())
        .and(Quota::new(3, Duration::from_secs(3600)).unwrap())
        .unwrap();
    let k = Key::new("c");
    assert!(charge(&store, &ns, k, &policy, 0).is_allowed());
    assert!(charge(&store, &ns, k, &policy, 0).is_allowed());
    // The per-second quota rejects: the hourly one is not charged.
    let d = charge(&store, &ns, k, &policy, 0);
    assert!(!d.is_allowed());
    assert_eq!(d.statuses()[1].remaining, 1);
    // Next second: one more fits the hourly quota, then the hourly quota rejects,
    // and the per-second quota keeps what it had.
    assert!(charge(&store, &ns, k, &policy, 1_000).is_allowed());
    let d = charge(&store, &ns, k, &policy, 1_000);
    assert!(!d.is_allowed());
    assert_eq!(
        (d.statuses()[0].remaining, d.statuses()[1].remaining),
        (1, 0)
    );
}

/// A client settled deep into debt (it reserved nothing and then used five
/// times its quota) has used its quota, whatever its charges said: a flood
/// of new keys evicts the flood's own keys, never the debtor, so the debt
/// is never forgiven.
#[test]
fn a_client_settled_into_debt_survives_a_flood_and_keeps_its_debt() {
    let store = MemoryStore::builder().max_keys(CAP).build();
    let ns = Namespace::new("debt");
    let tokens = Policy::new(
        Quota::new(1_000, Duration::from_secs(3600))
            .unwrap()
            .with_unit("tokens")
            .unwrap(),
    );
    let debtor = Key::new("debtor");
    let ask = |now_ms| {
        Charge::new(&ns, &debtor, &tokens, now_ms)
            .with_units(0)
            .with_timeout(Duration::from_millis(50))
    };
    let d = store.charge(&ask(0)).now_or_never().unwrap().unwrap();
    assert!(d.is_allowed());
    store
        .settle(&Settle::units(ask(0), &d, 5_000, 0))
        .now_or_never()
        .unwrap()
        .unwrap();
    let flood = hourly(5);
    evictions(|| {
        for i in 0..200_000 {
            assert!(charge(&store, &ns, key(i), &flood, 1).is_allowed());
        }
    });
    let d = store.charge(&ask(2)).now_or_never().unwrap().unwrap();
    assert!(!d.is_allowed(), "still in debt after the flood");
}
