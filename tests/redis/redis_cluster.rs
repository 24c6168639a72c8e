//! The Redis store on a real Redis Cluster created by the tests (three masters,
//! `redis-server --cluster-enabled yes` + `redis-cli --cluster create`): exact
//! limits, multi-quota policies in one slot, `ASK`/`MOVED` during a slot
//! migration, and a master replaced by its replica (`CLUSTER FAILOVER`).

use crate::support::redis as redis_support;

use axum::{http::StatusCode, routing::get, Router};
use redis_support::{require_redis, Cluster, RedisServer, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;
use tower_ratelimit::clock::{Clock, ManualClock, SystemClock};
use tower_ratelimit::key::{Header, Key};
use tower_ratelimit::store::{Namespace, RedisStore};
use tower_ratelimit::{
    failure::OnStoreError, rate::DenyCache, Algorithm, Policy, Quota, RateLimitLayer,
};

fn store(urls: &[String]) -> RedisStore {
    RedisStore::cluster_builder(urls.iter().cloned())
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

fn app(store: RedisStore, policy: Policy, clock: &ManualClock, calls: Arc<AtomicUsize>) -> Router {
    with_layer(limit(store, policy, clock), calls)
}

fn limit(store: RedisStore, policy: Policy, clock: &ManualClock) -> RateLimitLayer {
    RateLimitLayer::builder()
        .quota(policy)
        .key(Header::try_new("x-client").unwrap())
        .store(store)
        .clock(clock.clone())
        .store_timeout(Duration::from_secs(2))
        // Any store error (CROSSSLOT, MOVED not followed, …) would be a 503.
        .on_store_error(OnStoreError::FailClosed)
        .deny_cache(DenyCache::disabled())
        .build()
        .unwrap()
}

fn with_layer(layer: RateLimitLayer, calls: Arc<AtomicUsize>) -> Router {
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

async fn send(app: &Router, client: &str) -> (StatusCode, Option<u64>) {
    let req = http::Request::get("/")
        .header("x-client", client)
        .body(axum::body::Body::empty())
        .unwrap();
    let res = tokio::time::timeout(Duration::from_secs(10), app.clone().oneshot(req))
        .await
        .expect("request hung")
        .unwrap();
    let remaining = res
        .headers()
        .get("x-ratelimit-remaining")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    (res.status(), remaining)
}

fn redis_key(client: &str) -> String {
    RedisStore::new("redis://127.0.0.1")
        .unwrap()
        .redis_key(&Namespace::new("default"), &Key::new(client.as_bytes()))
}

fn script_calls(cluster: &Cluster) -> u64 {
    cluster.command_calls("evalsha") + cluster.command_calls("eval")
}

/// `EVALSHA` over all nodes: (ran without error, ran with an error such as
/// NOSCRIPT, rejected before running such as MOVED).
fn evalsha_stats(cluster: &Cluster) -> (u64, u64, u64) {
    cluster
        .nodes()
        .iter()
        .filter_map(|n| n.command_stats("evalsha"))
        .fold((0, 0, 0), |(ok, failed, rejected), s| {
            (
                ok + s.calls - s.failed_calls,
                failed + s.failed_calls,
                rejected + s.rejected_calls,
            )
        })
}

fn per_hour(n: u64) -> Quota {
    Quota::new(n, Duration::from_secs(3600)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_exact_across_two_instances_and_multi_quota_policies_stay_in_one_slot() {
    require_redis();
    let cluster = Cluster::start(3, 1);
    let clock = ManualClock::new(SystemClock.now_ms());
    let urls = cluster.urls();
    // A multi-quota policy: a per-second token bucket and an hourly sliding
    // log, charged all or nothing in one script call on two keys (the hash and
    // the log's sorted set) that share the client's hash tag, so one slot.
    let policy = Policy::new(
        Quota::per_second(std::num::NonZeroU32::new(1000).unwrap())
            .with_algorithm(Algorithm::TokenBucket)
            .unwrap(),
    )
    .and(per_hour(30).with_algorithm(Algorithm::SlidingLog).unwrap())
    .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let apps = [
        // One instance knows one seed node, the other all of them.
        app(store(&urls[..1]), policy.clone(), &clock, calls.clone()),
        app(store(&urls), policy, &clock, calls.clone()),
    ];
    let clients: Vec<String> = (0..9).map(|i| format!("client-{i}")).collect();
    let masters: std::collections::HashSet<u16> = clients
        .iter()
        .map(|c| cluster.master_for_key(&redis_key(c)).port())
        .collect();
    assert!(masters.len() > 1, "the clients live on several masters");
    // Warm up: connect and load the script on every master.
    for c in &clients {
        for a in &apps {
            assert_eq!(send(a, c).await.0, StatusCode::OK);
        }
    }
    cluster.config_resetstat();
    let admitted: Arc<Vec<AtomicUsize>> =
        Arc::new(clients.iter().map(|_| AtomicUsize::new(2)).collect());
    let mut tasks = vec![];
    for t in 0..32 {
        let (app, clients, admitted) = (apps[t % 2].clone(), clients.clone(), admitted.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..5 {
                let n = clients.len();
                for i in (0..n).map(|i| (i + t + round) % n) {
                    match send(&app, &clients[i]).await {
                        (StatusCode::OK, Some(_)) => {
                            admitted[i].fetch_add(1, Ordering::SeqCst);
                        }
                        (StatusCode::TOO_MANY_REQUESTS, Some(_)) => {}
                        other => panic!("unexpected {other:?} (a store error?)"),
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let got: Vec<usize> = admitted.iter().map(|a| a.load(Ordering::SeqCst)).collect();
    assert_eq!(got, vec![30; clients.len()], "admitted per client");
    assert_eq!(calls.load(Ordering::SeqCst), 30 * clients.len());
    // One script call per request, never re-sent.
    assert_eq!(script_calls(&cluster), 32 * 5 * clients.len() as u64);
    for n in cluster.master_indices() {
        let node = cluster.node(n);
        let errors = node.info_section("errorstats");
        assert!(
            errors.keys().all(|k| !k.contains("CROSSSLOT")),
            "{}: {errors:?}",
            node.port()
        );
    }
}

/// The node (index into `nodes()`) replicating the master on `port`.
fn replica_of(cluster: &Cluster, port: u16) -> usize {
    cluster
        .replica_indices()
        .into_iter()
        .find(|&i| {
            cluster
                .node(i)
                .info_section("replication")
                .get("master_port")
                == Some(&port.to_string())
        })
        .unwrap_or_else(|| panic!("no replica of {port}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limiting_continues_with_the_count_preserved_after_a_master_is_replaced_by_its_replica() {
    require_redis();
    let cluster = Cluster::start(3, 1);
    let clock = ManualClock::new(SystemClock.now_ms());
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(
        store(&cluster.urls()),
        Policy::new(per_hour(10)),
        &clock,
        calls,
    );
    let client = "failover-client";
    for remaining in (6..10).rev() {
        assert_eq!(send(&app, client).await, (StatusCode::OK, Some(remaining)));
    }
    let old = cluster.master_for_key(&redis_key(client)).port();
    let promoted = replica_of(&cluster, old);
    // A manual failover waits for the replica to catch up: nothing is lost.
    cluster.failover_node(promoted);
    assert_eq!(
        cluster.master_for_key(&redis_key(client)).port(),
        cluster.node(promoted).port()
    );
    cluster.config_resetstat();
    // The first call meets MOVED at the old master, follows it to the new one,
    // which answers NOSCRIPT (SCRIPT LOAD is not replicated) and gets the script.
    for remaining in (0..6).rev() {
        assert_eq!(send(&app, client).await, (StatusCode::OK, Some(remaining)));
    }
    assert_eq!(
        send(&app, client).await,
        (StatusCode::TOO_MANY_REQUESTS, Some(0))
    );
    let node = cluster.node(promoted);
    assert_eq!(
        node.command_calls("script|load"),
        1,
        "loaded once, on the promoted node"
    );
    // 7 requests, 7 charges: plus one MOVED and one NOSCRIPT, neither of which ran.
    assert_eq!(evalsha_stats(&cluster), (7, 1, 1));
    // A client whose slot did not move is unaffected.
    assert_eq!(send(&app, "bystander").await, (StatusCode::OK, Some(9)));
}

/// Moves `key`'s slot from its master to `to`, answering `ASK` while the key
/// has left and the slot is still migrating; returns the slot.
fn migrate_key(cluster: &Cluster, key: &str, to: &RedisServer) -> String {
    let from = cluster.master_for_key(key);
    let slot = from.query::<i64>(&["CLUSTER", "KEYSLOT", key]).to_string();
    let from_id = from.query::<String>(&["CLUSTER", "MYID"]);
    let to_id = to.query::<String>(&["CLUSTER", "MYID"]);
    assert_eq!(
        to.cmd(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]),
        Value::Okay
    );
    assert_eq!(
        from.cmd(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]),
        Value::Okay
    );
    let port = to.port().to_string();
    let r = from.cmd(&["MIGRATE", "127.0.0.1", &port, key, "0", "5000"]);
    assert_eq!(r, Value::Okay, "MIGRATE");
    slot
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migration_is_followed_through_ask_and_then_moved_with_the_count_preserved() {
    require_redis();
    let cluster = Cluster::start(3, 0);
    let clock = ManualClock::new(SystemClock.now_ms());
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(
        store(&cluster.urls()),
        Policy::new(per_hour(10)),
        &clock,
        calls,
    );
    let client = "migrating-client";
    let key = redis_key(client);
    for remaining in (7..10).rev() {
        assert_eq!(send(&app, client).await, (StatusCode::OK, Some(remaining)));
    }
    let from = cluster.master_for_key(&key).port();
    let to = cluster
        .master_indices()
        .into_iter()
        .map(|i| cluster.node(i))
        .find(|n| n.port() != from)
        .unwrap();
    let slot = migrate_key(&cluster, &key, to);
    cluster.config_resetstat();
    // The old owner answers ASK: the call goes to the importing node behind ASKING.
    // The importing node has no script yet: ASKING + NOSCRIPT, ASKING + SCRIPT LOAD, ASKING + run.
    assert_eq!(send(&app, client).await, (StatusCode::OK, Some(6)));
    assert_eq!(to.command_calls("asking"), 3);
    assert_eq!(send(&app, client).await, (StatusCode::OK, Some(5)));
    assert_eq!(to.command_calls("asking"), 4);
    // The migration ends: every master learns the slot's new owner, the old one answers MOVED.
    let to_id = to.query::<String>(&["CLUSTER", "MYID"]);
    for i in cluster.master_indices() {
        assert_eq!(
            cluster
                .node(i)
                .cmd(&["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]),
            Value::Okay
        );
    }
    for remaining in (0..5).rev() {
        assert_eq!(send(&app, client).await, (StatusCode::OK, Some(remaining)));
    }
    assert_eq!(
        send(&app, client).await,
        (StatusCode::TOO_MANY_REQUESTS, Some(0))
    );
    assert_eq!(
        to.command_calls("asking"),
        4,
        "no ASKING once the slot is owned"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_under_concurrent_load_charges_every_admitted_request_exactly_once() {
    require_redis();
    let cluster = Arc::new(Cluster::start(3, 1));
    let clock = ManualClock::new(SystemClock.now_ms());
    let calls = Arc::new(AtomicUsize::new(0));
    // Larger than the load below can use: every request is a charge.
    let quota = 1_000_000;
    let layer = limit(store(&cluster.urls()), Policy::new(per_hour(quota)), &clock);
    let app = with_layer(layer.clone(), calls);
    let client = "busy-client";
    assert_eq!(send(&app, client).await.0, StatusCode::OK);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (admitted, failed) = (Arc::new(AtomicUsize::new(1)), Arc::new(AtomicUsize::new(0)));
    let mut tasks = vec![];
    for _ in 0..8 {
        let (app, stop, admitted, failed) =
            (app.clone(), stop.clone(), admitted.clone(), failed.clone());
        tasks.push(tokio::spawn(async move {
            // Until the failover is done, bounded: at most 20,000 requests per task.
            for _ in 0..20_000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                match send(&app, client).await {
                    (StatusCode::OK, Some(_)) => admitted.fetch_add(1, Ordering::SeqCst),
                    (StatusCode::SERVICE_UNAVAILABLE, None) => {
                        failed.fetch_add(1, Ordering::SeqCst)
                    }
                    other => panic!("unexpected {other:?}"),
                };
            }
        }));
    }
    let old = cluster.master_for_key(&redis_key(client)).port();
    let promoted = replica_of(&cluster, old);
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.failover_node(promoted))
        .await
        .unwrap();
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    let (parts, ()) = http::Request::get("/")
        .header("x-client", client)
        .body(())
        .unwrap()
        .into_parts();
    let status = layer.status(&parts).await.unwrap().unwrap();
    let used = status.decision.statuses()[0].used() as usize;
    let (admitted, failed) = (
        admitted.load(Ordering::SeqCst),
        failed.load(Ordering::SeqCst),
    );
    eprintln!("failover under load: {admitted} admitted, {failed} answered 503, {used} charged");
    // Every admitted request was charged once; a failed call may have been
    // charged (it timed out after running), never twice.
    assert!(
        admitted <= used && used <= admitted + failed,
        "{admitted} admitted, {failed} failed, {used} charged"
    );
    assert!(admitted > 8, "requests kept flowing");
}
