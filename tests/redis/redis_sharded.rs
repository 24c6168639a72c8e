//! The sharded store over several real `redis-server` primaries started by the
//! tests: how keys spread, how many move when a shard is added, exact limits
//! across instances, and a dead shard that affects only its own keys.

use crate::support::redis as redis_support;

use axum::{http::StatusCode, routing::get, Router};
use redis_support::{assert_every_key_has_a_ttl, require_redis, RedisServer};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;
use tower_ratelimit::clock::{Clock, ManualClock, SystemClock};
use tower_ratelimit::key::{Header, Key};
use tower_ratelimit::store::{Charge, Namespace, RedisStore, ShardedStore, Store};
use tower_ratelimit::{
    failure::CircuitBreaker, failure::OnStoreError, rate::DenyCache, Policy, Quota, RateLimitLayer,
};

/// Generous: a dead shard refuses connections at once, and a loaded test
/// machine must not turn a slow reply into a failure.
const TIMEOUT: Duration = Duration::from_secs(2);

fn sharded(servers: &[&RedisServer]) -> ShardedStore {
    servers
        .iter()
        .fold(ShardedStore::builder(), |b, s| {
            b.shard(
                RedisStore::builder(s.url())
                    .connect_timeout(TIMEOUT)
                    .response_timeout(TIMEOUT)
                    .build()
                    .unwrap(),
            )
        })
        .build()
        .unwrap()
}

fn shard_of(store: &ShardedStore, servers: &[&RedisServer], ns: &Namespace, key: &Key) -> usize {
    let name = store.shard_for(ns, key);
    servers
        .iter()
        .position(|s| name == format!("127.0.0.1:{}/0", s.port()))
        .unwrap_or_else(|| panic!("unknown shard {name}"))
}

/// Charges each key once, 16 calls at a time.
async fn charge_all(store: &ShardedStore, keys: &[Key]) {
    let ns = Namespace::new("default");
    let policy = Policy::new(Quota::new(10, Duration::from_secs(60)).unwrap());
    let now = SystemClock.now_ms();
    let keys = Arc::new(keys.to_vec());
    let mut tasks = vec![];
    for t in 0..16 {
        let (store, keys, ns, policy) = (store.clone(), keys.clone(), ns.clone(), policy.clone());
        tasks.push(tokio::spawn(async move {
            for key in keys.iter().skip(t).step_by(16) {
                let call = Charge::new(&ns, key, &policy, now).with_timeout(Duration::from_secs(5));
                let d = store.charge(&call).await.expect("charge");
                assert!(d.is_allowed());
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

fn dbsize(s: &RedisServer) -> usize {
    s.query::<i64>(&["DBSIZE"]) as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_keys_spread_within_ten_percent_over_three_primaries_and_a_fourth_takes_a_quarter(
) {
    require_redis();
    let servers: Vec<RedisServer> = (0..4).map(|_| RedisServer::start()).collect();
    let refs: Vec<&RedisServer> = servers.iter().collect();
    let keys: Vec<Key> = (0..10_000)
        .map(|i| Key::new(format!("198.51.{}.{}", i / 256, i % 256)))
        .collect();

    // Three shards: count the keys each real server ends up holding.
    let three = sharded(&refs[..3]);
    charge_all(&three, &keys).await;
    let held: Vec<usize> = refs[..3].iter().map(|s| dbsize(s)).collect();
    assert_eq!(held.iter().sum::<usize>(), 10_000, "{held:?}");
    for (i, n) in held.iter().enumerate() {
        let off = (*n as f64 - 10_000.0 / 3.0).abs() / (10_000.0 / 3.0);
        assert!(off <= 0.10, "shard {i} holds {n} of 10000 ({held:?})");
    }
    eprintln!("3 shards hold {held:?}");

    // A fourth shard: only keys it now wins move, all to it.
    let four = sharded(&refs);
    let ns = Namespace::new("default");
    let moved = keys
        .iter()
        .filter(|k| {
            let (before, after) = (
                shard_of(&three, &refs, &ns, k),
                shard_of(&four, &refs, &ns, k),
            );
            assert!(
                before == after || after == 3,
                "a key moved between old shards"
            );
            before != after
        })
        .count();
    charge_all(&four, &keys).await;
    // Keys that stayed were charged again on their old shard (no new key
    // there); the fourth server holds exactly the ones that moved.
    assert_eq!(dbsize(&servers[3]), moved);
    assert_eq!(
        refs[..3].iter().map(|s| dbsize(s)).collect::<Vec<_>>(),
        held,
        "no new key on the old shards"
    );
    eprintln!("adding a fourth shard moved {moved} of 10000 keys");
    assert!((2_000..=3_000).contains(&moved), "{moved} of 10000 moved");
}

fn layer(
    store: ShardedStore,
    limit: u64,
    clock: &ManualClock,
    on_error: OnStoreError,
) -> RateLimitLayer {
    RateLimitLayer::builder()
        .quota(Quota::new(limit, Duration::from_secs(3600)).unwrap())
        .key(Header::try_new("x-client").unwrap())
        .store(store)
        .clock(clock.clone())
        .store_timeout(TIMEOUT)
        .on_store_error(on_error)
        .circuit_breaker(
            CircuitBreaker::new()
                .failures(3)
                .cooldown(Duration::from_secs(60)),
        )
        .deny_cache(DenyCache::disabled())
        .build()
        .unwrap()
}

fn app(calls: Arc<AtomicUsize>, layer: RateLimitLayer) -> Router {
    Router::new()
        .route(
            "/",
            get(move || {
                calls.fetch_add(1, Ordering::SeqCst);
                async { "ok" }
            }),
        )
        .layer(layer)
}

async fn send(app: &Router, client: &str) -> (StatusCode, bool) {
    let req = http::Request::get("/")
        .header("x-client", client)
        .body(axum::body::Body::empty())
        .unwrap();
    let res = tokio::time::timeout(Duration::from_secs(5), app.clone().oneshot(req))
        .await
        .expect("request hung")
        .unwrap();
    let limited = res.headers().contains_key("x-ratelimit-remaining");
    (res.status(), limited)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_keys_limit_is_exact_under_concurrency_across_two_layers_with_their_own_sharded_stores(
) {
    require_redis();
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let refs: Vec<&RedisServer> = servers.iter().collect();
    let clock = ManualClock::new(SystemClock.now_ms());
    let quota = 40;
    let calls = Arc::new(AtomicUsize::new(0));
    // Two instances, each with its own store, listing the shards in another order.
    let reversed: Vec<&RedisServer> = refs.iter().rev().copied().collect();
    let apps = [
        app(
            calls.clone(),
            layer(sharded(&refs), quota, &clock, OnStoreError::FailClosed),
        ),
        app(
            calls.clone(),
            layer(sharded(&reversed), quota, &clock, OnStoreError::FailClosed),
        ),
    ];
    let clients: Vec<String> = (0..12).map(|i| format!("client-{i}")).collect();
    let admitted: Arc<Vec<AtomicUsize>> =
        Arc::new(clients.iter().map(|_| AtomicUsize::new(0)).collect());
    let mut tasks = vec![];
    for t in 0..48 {
        let (app, clients, admitted) = (apps[t % 2].clone(), clients.clone(), admitted.clone());
        tasks.push(tokio::spawn(async move {
            // Each task hits every client 5 times: 48 × 5 = 240 tries per client.
            for round in 0..5 {
                for (i, c) in clients
                    .iter()
                    .enumerate()
                    .skip((t + round) % 12)
                    .chain(clients.iter().enumerate().take((t + round) % 12))
                {
                    match send(&app, c).await {
                        (StatusCode::OK, true) => {
                            admitted[i].fetch_add(1, Ordering::SeqCst);
                        }
                        (StatusCode::TOO_MANY_REQUESTS, true) => {}
                        other => panic!("unexpected {other:?}"),
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let got: Vec<usize> = admitted.iter().map(|a| a.load(Ordering::SeqCst)).collect();
    assert_eq!(
        got,
        vec![quota as usize; clients.len()],
        "admitted per client"
    );
    assert_eq!(calls.load(Ordering::SeqCst), quota as usize * clients.len());
    // Each client's state lives on exactly one server, the one the mapping names.
    let store = sharded(&refs);
    let ns = Namespace::new("default");
    let mut per_server = HashMap::new();
    for c in &clients {
        let key = Key::new(c.as_bytes());
        let home = shard_of(&store, &refs, &ns, &key);
        let redis_key = RedisStore::new(servers[home].url())
            .unwrap()
            .redis_key(&ns, &key);
        for (i, s) in servers.iter().enumerate() {
            let exists = s.query::<i64>(&["EXISTS", &redis_key]) == 1;
            assert_eq!(exists, i == home, "{c} on server {i}");
        }
        *per_server.entry(home).or_insert(0) += 1;
    }
    assert!(
        per_server.len() > 1,
        "the clients were spread: {per_server:?}"
    );
    for s in &servers {
        assert_every_key_has_a_ttl(s);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_shard_affects_only_its_keys_per_the_failure_policy_and_its_breaker_only() {
    require_redis();
    let mut servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let ports: Vec<u16> = servers.iter().map(RedisServer::port).collect();
    let store = {
        let refs: Vec<&RedisServer> = servers.iter().collect();
        sharded(&refs)
    };
    let ns = Namespace::new("default");
    let home = |c: &str| {
        let name = store.shard_for(&ns, &Key::new(c.as_bytes()));
        ports
            .iter()
            .position(|p| name == format!("127.0.0.1:{p}/0"))
            .unwrap()
    };
    // Four clients on each shard.
    let mut on: Vec<Vec<String>> = vec![vec![]; 3];
    for i in 0.. {
        let c = format!("c{i}");
        let h = home(&c);
        if on[h].len() < 4 {
            on[h].push(c);
        }
        if on.iter().all(|v| v.len() == 4) {
            break;
        }
    }
    let clock = ManualClock::new(SystemClock.now_ms());
    let quota = 5;
    for (policy, dead_status) in [
        (OnStoreError::FailClosed, StatusCode::SERVICE_UNAVAILABLE),
        (OnStoreError::FailOpen, StatusCode::OK),
    ] {
        for s in &servers {
            s.flushall();
        }
        let calls = Arc::new(AtomicUsize::new(0));
        let app = app(calls.clone(), layer(store.clone(), quota, &clock, policy));
        // Open every connection while all shards are up.
        for v in &on {
            assert_eq!(send(&app, &v[0]).await, (StatusCode::OK, true));
        }
        servers[1].kill();
        // The dead shard's clients: answered per policy, without headers, well
        // past the breaker's threshold (3), so its breaker is open.
        for _ in 0..10 {
            for c in &on[1] {
                assert_eq!(send(&app, c).await, (dead_status, false), "{policy:?}");
            }
        }
        // Every other client is still limited exactly: its breaker is closed.
        for c in on[0].iter().chain(&on[2]) {
            let already = usize::from(on[0][0] == *c || on[2][0] == *c);
            for n in already..quota as usize {
                assert_eq!(
                    send(&app, c).await,
                    (StatusCode::OK, true),
                    "{c} #{n} {policy:?}"
                );
            }
            assert_eq!(
                send(&app, c).await,
                (StatusCode::TOO_MANY_REQUESTS, true),
                "{c} {policy:?}"
            );
        }
        servers[1].restart();
        // After the cool-down one probe closes the dead shard's breaker again.
        clock.advance(Duration::from_secs(61));
        let mut recovered = false;
        for _ in 0..50 {
            if send(&app, &on[1][1]).await == (StatusCode::OK, true) {
                recovered = true;
                break;
            }
            clock.advance(Duration::from_secs(61));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(recovered, "the restarted shard's keys are limited again");
    }
}
