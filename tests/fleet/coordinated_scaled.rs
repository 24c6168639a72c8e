//! Coordinated counters spread over several Redis nodes: a `ShardedStore`
//! of two servers and a three-master Redis Cluster, all real processes. The
//! limits hold on every node's keys, and a node that stops answering fails
//! open only the keys it holds, after the staleness bound.

use crate::fleet;
use crate::support::redis as redis_support;

use fleet::{Balancer, Fleet};
use redis_support::{require_redis, RedisServer};
use std::time::Duration;
use tower_ratelimit::clock::{Clock, ManualClock, SystemClock};
use tower_ratelimit::key::Key;
use tower_ratelimit::store::{
    Coordinated, CoordinatedBuilder, Namespace, RedisStore, ShardedStore,
};

const NAME: &str = "spread";
const INSTANCES: usize = 2;
const KEYS: usize = 12;
/// Per key, per second.
const LIMIT: u64 = 20;
const OFFERED: u64 = 30;

fn fleet(coordinated: impl Fn() -> CoordinatedBuilder) -> Fleet {
    let clock = ManualClock::new(SystemClock.now_ms() / 1000 * 1000);
    let instances = (0..INSTANCES)
        .map(|i| {
            fleet::coordinated(
                NAME,
                LIMIT,
                &clock,
                coordinated()
                    .sync_timeout(Duration::from_millis(200))
                    .seed(i as u64 + 1),
            )
        })
        .collect();
    Fleet::new(
        instances,
        clock,
        Duration::from_secs(1),
        KEYS,
        Balancer::RoundRobin,
    )
}

/// Runs `secs` seconds; returns the admitted count per key of the last one.
async fn settle(fleet: &mut Fleet, secs: usize) -> Vec<u64> {
    for _ in 0..secs {
        fleet.second(OFFERED * KEYS as u64).await;
    }
    fleet.admitted_by_key().to_vec()
}

/// Every key on a node that answers is held within 10% of its limit; every
/// key on `down` (if any) admits all it is offered.
fn check(fleet: &Fleet, admitted: &[u64], down: impl Fn(&str) -> bool) {
    for (key, a) in fleet.keys().iter().zip(admitted) {
        if down(key) {
            assert_eq!(
                *a, OFFERED,
                "{key}, on the node that is down, should fail open"
            );
        } else {
            assert!(
                a.abs_diff(LIMIT) <= LIMIT / 10,
                "{key}: {a} admitted, limit {LIMIT}: {admitted:?}"
            );
        }
    }
}

#[test]
fn a_sharded_store_with_a_shard_that_is_not_redis_is_refused_when_the_coordinated_store_is_built() {
    let sharded = ShardedStore::builder()
        .named_shard("local", tower_ratelimit::store::MemoryStore::new())
        .build()
        .unwrap();
    let err = Coordinated::sharded(sharded).build().unwrap_err();
    assert!(err.to_string().contains("must be a Redis store"), "{err}");
}

#[tokio::test]
async fn sharded_counters_hold_every_shard_s_keys_and_a_dead_shard_fails_open_only_its_own() {
    require_redis();
    let a = RedisServer::start();
    let b = RedisServer::start();
    let sharded = || {
        ShardedStore::builder()
            .shard(RedisStore::new(a.url()).unwrap())
            .shard(RedisStore::new(b.url()).unwrap())
            .build()
            .unwrap()
    };
    let mut fleet = fleet(|| Coordinated::sharded(sharded()));
    let admitted = settle(&mut fleet, 6).await;
    check(&fleet, &admitted, |_| false);

    // Each key's counters live on the shard the sharded store gives it.
    let store = sharded();
    let ns = Namespace::new(NAME);
    let b_name = RedisStore::new(b.url()).unwrap().shard_name().to_owned();
    let on_b = |key: &str| store.shard_for(&ns, &Key::new(key)) == b_name;
    let keys_on_b = fleet.keys().iter().filter(|k| on_b(k)).count();
    assert!(
        keys_on_b > 0 && keys_on_b < KEYS,
        "{keys_on_b} of {KEYS} keys on one shard"
    );
    let redis_key = |key: &str| {
        RedisStore::new(a.url())
            .unwrap()
            .redis_key(&ns, &Key::new(key))
    };
    for (server, here) in [(&a, false), (&b, true)] {
        let counters = counters(server);
        let mut owners: Vec<&String> = fleet
            .keys()
            .iter()
            .filter(|k| counters.iter().any(|c| c.starts_with(&redis_key(k))))
            .collect();
        owners.dedup();
        assert!(!owners.is_empty(), "no counters on one shard");
        for k in owners {
            assert_eq!(on_b(k), here, "{k}'s counters on the wrong shard");
        }
    }

    b.pause();
    // Three intervals of staleness, then b's keys fail open; a's hold.
    let admitted = settle(&mut fleet, 5).await;
    check(&fleet, &admitted, on_b);
    b.resume();
    // The outage's counters are partial (some reports never landed), so
    // shares read from them are off for a few intervals.
    let admitted = settle(&mut fleet, 8).await;
    check(&fleet, &admitted, |_| false);
}

/// The coordinated counters a server holds.
fn counters(server: &RedisServer) -> Vec<String> {
    server.scan_keys(&format!("*{NAME}*:c:*"))
}

#[cfg(feature = "cluster")]
#[tokio::test]
async fn cluster_counters_hold_every_node_s_keys_and_a_dead_master_fails_open_only_its_own() {
    use redis_support::Cluster;
    require_redis();
    // Without full coverage, the other masters keep serving while one is down.
    let mut cluster = Cluster::start_with(3, 0, &["--cluster-require-full-coverage", "no"]);
    let urls = cluster.urls();
    let store = || {
        RedisStore::cluster_builder(urls.iter().cloned())
            .connect_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(2))
            .build()
            .unwrap()
    };
    let mut fleet = fleet(|| Coordinated::builder(store()));
    let admitted = settle(&mut fleet, 6).await;
    check(&fleet, &admitted, |_| false);
    // Every command went to the node serving its key's slot.
    for i in cluster.master_indices() {
        let errors = cluster.node(i).info_section("errorstats");
        assert!(
            !errors
                .keys()
                .any(|e| e.contains("MOVED") || e.contains("CROSSSLOT")),
            "node {i}: {errors:?}"
        );
        assert!(
            cluster.node(i).command_calls("hincrby") > 0,
            "node {i} holds no counters"
        );
    }

    // Stop the master holding the most keys (but not all of them).
    let ns = Namespace::new(NAME);
    let port_of = |key: &str| {
        cluster
            .master_for_key(&store().redis_key(&ns, &Key::new(key)))
            .port()
    };
    let ports: Vec<u16> = fleet.keys().iter().map(|k| port_of(k)).collect();
    let down = cluster
        .master_indices()
        .into_iter()
        .max_by_key(|&i| {
            ports
                .iter()
                .filter(|&&p| p == cluster.node(i).port())
                .count()
        })
        .unwrap();
    let down_port = cluster.node(down).port();
    assert!(
        ports.iter().any(|&p| p != down_port),
        "all keys on one master"
    );
    cluster.node_mut(down).pause();
    let admitted = settle(&mut fleet, 5).await;
    let keys = fleet.keys().to_vec();
    check(&fleet, &admitted, |key| {
        ports[keys.iter().position(|k| k == key).unwrap()] == down_port
    });
    cluster.node_mut(down).resume();
    let admitted = settle(&mut fleet, 8).await;
    check(&fleet, &admitted, |_| false);
}
