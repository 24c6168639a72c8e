//! Concurrent charges travel together in one script call per connection
//! (src/store/redis/batch.rs), against a real `redis-server`.
//!
//! These tests run on tokio's current-thread runtime and create their charge
//! futures before awaiting anything: every charge is queued before any
//! connection's runner task gets to run, so how they are grouped is
//! deterministic, with no sleeps.

use crate::support::redis as redis_support;

use futures_util::future::join_all;
use redis_support::{assert_every_key_has_a_ttl, require_redis, MonitorEntry, RedisServer};
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower_ratelimit::clock::{Clock, SystemClock};
use tower_ratelimit::key::Key;
use tower_ratelimit::store::{Charge, Namespace, RedisStore, Store, StoreFuture};
use tower_ratelimit::{decision::Decision, Algorithm, Policy, Quota, StoreError};

fn fixed(limit: u64) -> Policy {
    Policy::new(Quota::new(limit, Duration::from_secs(60)).unwrap())
}

/// `limit` per `secs` seconds under `alg`.
fn quota(alg: Algorithm, limit: u64, secs: u64) -> Quota {
    Quota::new(limit, Duration::from_secs(secs))
        .unwrap()
        .with_algorithm(alg)
        .unwrap()
}

/// One quota of `alg`, `limit` a minute.
fn lone(alg: Algorithm, limit: u64) -> Policy {
    Policy::new(quota(alg, limit, 60))
}

/// One request of a scripted sequence: (client, policy, ms after the
/// sequence's start, cost).
type Request = (usize, usize, u64, u64);

/// The clients, policies and start of a scripted sequence of requests.
struct Sequence<'a> {
    keys: &'a [Key],
    policies: &'a [Policy],
    now: u64,
}

impl Sequence<'_> {
    /// Charges request `r` of the sequence on `store`, in `ns`.
    fn charge(
        &self,
        ns: &Namespace,
        store: &dyn Store,
        &(k, p, t, cost): &Request,
    ) -> StoreFuture<Result<Decision, StoreError>> {
        store.charge(
            &Charge::new(ns, &self.keys[k], &self.policies[p], self.now + t)
                .with_cost(cost)
                .with_timeout(Duration::from_secs(5)),
        )
    }
}

/// A token bucket (burst 5) and a sliding log (6 a minute): two Redis keys per client.
fn mixed() -> Policy {
    let tb = quota(Algorithm::TokenBucket, 1, 60).burst(5).unwrap();
    Policy::new(tb)
        .and(quota(Algorithm::SlidingLog, 6, 60))
        .unwrap()
}

/// One charge of `cost` for `key` at `now`.
fn charge(
    store: &RedisStore,
    ns: &Namespace,
    key: &Key,
    policy: &Policy,
    now: u64,
) -> StoreFuture<Result<Decision, StoreError>> {
    store.charge(&Charge::new(ns, key, policy, now).with_timeout(Duration::from_secs(5)))
}

/// Client script calls seen by `MONITOR`.
fn script_calls(entries: &[MonitorEntry]) -> Vec<&MonitorEntry> {
    entries
        .iter()
        .filter(|e| !e.is_from_script() && e.command() == "EVALSHA")
        .collect()
}

/// How many requests one `EVALSHA` of the charge script carries (see lua/charge.lua:
/// after the keys, P policies of n quotas × 5 arguments, then J).
fn requests_in(e: &MonitorEntry) -> usize {
    let numkeys: usize = e.args[2].parse().unwrap();
    let argv = &e.args[3 + numkeys..];
    let mut at = 1;
    for _ in 0..argv[0].parse::<usize>().unwrap() {
        let n: usize = argv[at].parse().unwrap();
        at += 1 + 6 * n;
    }
    argv[at].parse().unwrap()
}

/// Commands the scripts ran, by name.
fn script_internal(entries: &[MonitorEntry], name: &str) -> usize {
    entries
        .iter()
        .filter(|e| e.is_from_script() && e.command() == name)
        .count()
}

/// A server and a store with default settings, warmed up, and the time to
/// charge at.
async fn started() -> (RedisServer, RedisStore, u64) {
    let (server, store, now) = cold();
    warm(&store, now).await;
    (server, store, now)
}

/// A server and a store with default settings, not yet used, and the time
/// to charge at.
fn cold() -> (RedisServer, RedisStore, u64) {
    require_redis();
    let server = RedisServer::start();
    let store = RedisStore::new(server.url()).unwrap();
    (server, store, SystemClock.now_ms())
}

/// Warms a store up: its connection open and the script loaded.
async fn warm(store: &RedisStore, now: u64) {
    let ns = Namespace::new("warm");
    let (a, b) = (Key::new("a"), Key::new("b"));
    let p = fixed(10);
    let (ra, rb) = tokio::join!(
        charge(store, &ns, &a, &p, now),
        charge(store, &ns, &b, &p, now)
    );
    ra.unwrap();
    rb.unwrap();
}

/// 200 concurrent charges: 10 fixed-window clients (quota 7) and 10 mixed
/// ones (burst 5), 10 requests each, interleaved.
struct Crowd {
    ns: Namespace,
    keys: Vec<Key>,
    policies: Vec<Policy>,
}

impl Crowd {
    fn new(name: &str) -> Self {
        Crowd {
            ns: Namespace::new(name),
            keys: (0..20).map(|i| Key::new(format!("client{i}"))).collect(),
            policies: (0..20)
                .map(|i| if i < 10 { fixed(7) } else { mixed() })
                .collect(),
        }
    }

    /// Every client's requests, all queued before any is sent; (client, decision).
    async fn run(&self, store: &RedisStore, now: u64) -> Vec<(usize, Decision)> {
        let mut calls = Vec::new();
        for _round in 0..10 {
            for c in 0..20 {
                calls.push(charge(
                    store,
                    &self.ns,
                    &self.keys[c],
                    &self.policies[c],
                    now,
                ));
            }
        }
        join_all(calls)
            .await
            .into_iter()
            .enumerate()
            .map(|(i, d)| (i % 20, d.unwrap()))
            .collect()
    }

    /// [`Crowd::run`] with Redis's `MONITOR` on: checks every decision is
    /// exact ([`Crowd::assert_exact`]) and returns what Redis saw.
    async fn run_watched(
        &self,
        server: &RedisServer,
        store: &RedisStore,
        now: u64,
    ) -> Vec<MonitorEntry> {
        let monitor = server.monitor();
        let decisions = self.run(store, now).await;
        let seen = monitor.stop();
        Crowd::assert_exact(&decisions);
        seen
    }

    /// Each client is admitted exactly its quota, and each admitted request
    /// saw its own remaining (limit - 1 down to 0, each once): every decision
    /// came from its own read, in order.
    fn assert_exact(decisions: &[(usize, Decision)]) {
        let mut seen: HashMap<usize, Vec<u64>> = HashMap::new();
        for (c, d) in decisions {
            if d.is_allowed() {
                seen.entry(*c).or_default().push(d.statuses()[0].remaining);
            } else {
                assert_eq!(d.binding_status().unwrap().remaining, 0);
            }
        }
        for c in 0..20 {
            let mut got = seen.remove(&c).unwrap_or_default();
            got.sort_unstable();
            let quota = if c < 10 { 7 } else { 5 };
            let want: Vec<u64> = (0..quota).collect();
            assert_eq!(
                got, want,
                "client {c}: remaining values of its admitted requests"
            );
        }
    }
}

#[tokio::test]
async fn concurrent_charges_travel_together_and_each_gets_its_own_exact_decision() {
    let (server, store, now) = started().await;
    // The script for these algorithms loaded.
    Crowd::new("warm").run(&store, now).await;

    let seen = Crowd::new("crowd").run_watched(&server, &store, now).await;
    // One connection (the default), 200 requests queued on it: batches of
    // 64, 64, 64 and 8, in order.
    let calls = script_calls(&seen);
    let sizes: Vec<usize> = calls.iter().map(|e| requests_in(e)).collect();
    assert_eq!(sizes, vec![64, 64, 64, 8], "requests per script call");
    // Every request was read once inside Redis: one HMGET each.
    assert_eq!(script_internal(&seen, "HMGET"), 200);
    assert_every_key_has_a_ttl(&server);
}

/// One batch whose requests differ in time, cost, policy and algorithm
/// (each request's arguments are parsed again only when they change from the
/// previous request's, lua/charge.lua; a lone quota of any algorithm but the
/// sliding log takes its fast path) decides exactly as the memory store does
/// taking the same requests one by one.
#[tokio::test]
async fn a_batch_of_different_times_costs_and_policies_decides_as_the_memory_store_in_order() {
    let (server, store, now) = started().await;
    let ns = Namespace::new("varied");
    // A key per client and policy: two policies whose quotas share an
    // algorithm and a window share that state, which only the fixed window's
    // plain count survives unchanged (see "Changing a client's policy" in the quota docs).
    let keys: Vec<Key> = (0..24).map(|i| Key::new(format!("k{i}"))).collect();
    let policies = [
        fixed(9),
        mixed(),
        fixed(4),
        lone(Algorithm::TokenBucket, 5),
        lone(Algorithm::Gcra, 5),
        lone(Algorithm::SlidingWindow, 6),
    ];
    // (key, policy, ms after `now`, cost): runs of equal times and costs,
    // changes in each of them alone, a window crossed, costs above a quota.
    let mut requests = Vec::new();
    for i in 0..60u64 {
        let policy = [0, 3, 0, 1, 4, 2, 5][(i % 7) as usize];
        let key = (i % 4) as usize * 6 + policy;
        let t = [0, 0, 0, 5, 5, 61_000, 61_000, 61_003][(i / 8) as usize];
        let cost = [1, 1, 2, 1, 3, 1, 1, 10][(i % 8) as usize];
        requests.push((key, policy, t, cost));
    }
    // A sliding window two windows on: nothing of the old window weighs.
    requests.extend([(5, 5, 181_003, 1), (5, 5, 181_003, 2)]);
    let warm_ns = Namespace::new("varied-warm");
    let seq = Sequence {
        keys: &keys,
        policies: &policies,
        now,
    };
    let charge_in = |ns, store: &dyn Store, r: &Request| seq.charge(ns, store, r);

    let charge_at = |store: &dyn Store, r| charge_in(&ns, store, r);
    // The script for this set of algorithms loaded.
    for r in join_all(requests.iter().map(|r| charge_in(&warm_ns, &store, r))).await {
        r.unwrap();
    }

    let monitor = server.monitor();
    let from_redis: Vec<Decision> = join_all(requests.iter().map(|r| charge_at(&store, r)))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let seen = monitor.stop();
    let sizes: Vec<usize> = script_calls(&seen).iter().map(|e| requests_in(e)).collect();
    assert_eq!(sizes, vec![62], "all 62 requests in one script call");

    let memory = tower_ratelimit::store::MemoryStore::new();
    let mut from_memory = Vec::new();
    for r in &requests {
        from_memory.push(charge_at(&memory, r).await.unwrap());
    }
    for (i, (redis, mem)) in from_redis.iter().zip(&from_memory).enumerate() {
        assert_eq!(redis, mem, "request {i} {:?}", requests[i]);
    }
    let admitted = from_redis.iter().filter(|d| d.is_allowed()).count();
    assert!(
        (1..62).contains(&admitted),
        "some admitted and some rejected: {admitted}"
    );
}

#[tokio::test]
async fn an_idle_service_sends_each_charge_alone_and_at_once() {
    let (server, store, now) = started().await;
    let ns = Namespace::new("idle");
    let key = Key::new("one");
    let p = fixed(100);

    let monitor = server.monitor();
    for i in 0..20u64 {
        // Nothing else is in flight: the charge is sent when it is made.
        let d = charge(&store, &ns, &key, &p, now).await.unwrap();
        assert_eq!(d.statuses()[0].remaining, 99 - i);
    }
    let seen = monitor.stop();
    let calls = script_calls(&seen);
    assert_eq!(calls.len(), 20);
    assert!(calls.iter().all(|e| requests_in(e) == 1));
}

#[tokio::test]
async fn noscript_inside_a_batch_reloads_and_resends_without_charging_twice() {
    let (server, store, now) = started().await;
    server.cmd(&["SCRIPT", "FLUSH"]);

    let seen = Crowd::new("flushed")
        .run_watched(&server, &store, now)
        .await;
    // Every batch sent before the script was back met NOSCRIPT (nothing
    // ran): the script was loaded and the batch sent once more. Yet one
    // HMGET per request: none was charged twice.
    let client = |name: &str| {
        seen.iter()
            .filter(|e| !e.is_from_script() && e.command() == name)
            .count()
    };
    let loads = client("SCRIPT");
    assert!(loads >= 1, "the script was loaded again");
    assert_eq!(
        script_calls(&seen).len(),
        4 + loads,
        "each batch sent once by hash, and once more after its load"
    );
    assert_eq!(script_internal(&seen, "HMGET"), 200);
}

#[tokio::test]
async fn a_charge_cancelled_before_its_batch_leaves_is_never_charged() {
    let (server, store, now) = started().await;
    let ns = Namespace::new("cancel");
    let p = fixed(10);
    let kept: Vec<Key> = (0..10).map(|i| Key::new(format!("kept{i}"))).collect();
    let gone: Vec<Key> = (0..50).map(|i| Key::new(format!("gone{i}"))).collect();

    let mut kept_calls: Vec<_> = kept
        .iter()
        .map(|k| Box::pin(charge(&store, &ns, k, &p, now)))
        .collect();
    let mut gone_calls: Vec<_> = gone
        .iter()
        .map(|k| Box::pin(charge(&store, &ns, k, &p, now)))
        .collect();
    // Poll each once: all are queued, none sent yet (the runners have not run).
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    for f in kept_calls.iter_mut().chain(gone_calls.iter_mut()) {
        assert!(f.as_mut().poll(&mut cx).is_pending());
    }
    // The callers of 50 give up (a timeout, a dropped connection).
    drop(gone_calls);
    for d in join_all(kept_calls).await {
        assert_eq!(d.unwrap().statuses()[0].remaining, 9);
    }
    for k in &kept {
        assert_eq!(
            server.query::<i64>(&["EXISTS", &store.redis_key(&ns, k)]),
            1
        );
    }
    for k in &gone {
        assert_eq!(
            server.query::<i64>(&["EXISTS", &store.redis_key(&ns, k)]),
            0,
            "a cancelled charge was sent"
        );
    }
}

#[tokio::test]
async fn one_requests_failure_inside_a_batch_leaves_the_others_decided() {
    let (server, store, now) = started().await;
    let ns = Namespace::new("wrongtype");
    let p = fixed(10);
    let keys: Vec<Key> = (0..40).map(|i| Key::new(format!("c{i}"))).collect();
    // Someone else's string sits where client 7's hash would be.
    server.cmd(&[
        "SET",
        &store.redis_key(&ns, &keys[7]),
        "not a hash",
        "EX",
        "60",
    ]);

    let monitor = server.monitor();
    let results = join_all(keys.iter().map(|k| charge(&store, &ns, k, &p, now))).await;
    let seen = monitor.stop();

    assert!(
        script_calls(&seen).iter().any(|e| requests_in(e) > 1),
        "the requests were batched"
    );
    for (i, r) in results.into_iter().enumerate() {
        if i == 7 {
            let e = r.unwrap_err();
            assert_eq!(e.kind(), "response", "{e}");
            assert!(e.to_string().contains("WRONGTYPE"), "{e}");
        } else {
            assert_eq!(r.unwrap().statuses()[0].remaining, 9, "client {i}");
        }
    }
}

#[tokio::test]
async fn charges_past_the_queue_cap_fail_at_once_instead_of_piling_up() {
    // One connection (the default) queues at most 4,096 charges.
    let (server, store, now) = started().await;
    let ns = Namespace::new("cap");
    let p = fixed(1_000_000);
    let key = Key::new("busy");
    let results = join_all((0..4_100).map(|_| charge(&store, &ns, &key, &p, now))).await;
    let refused: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert_eq!(refused.len(), 4);
    assert!(
        refused.iter().all(|e| e.kind() == "backlog"),
        "{:?}",
        refused[0]
    );
    let admitted = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(admitted, 4_096);
    let count: String = server.query(&["HGET", &store.redis_key(&ns, &key), "fw60000c"]);
    assert_eq!(count, "4096");
}

/// A shadow policy's charges (no request waits for them) take at most an
/// eighth of a connection's queue: past 512 waiting, one is refused at
/// once, while the charges requests wait for still queue.
#[tokio::test]
async fn shadow_charges_take_an_eighth_of_the_queue_at_most() {
    let (server, store, now) = started().await;
    let (ns, p) = (Namespace::new("shadowed"), fixed(1_000_000));
    let key = Key::new("busy");
    let call = |k| Charge::new(&ns, k, &p, now).with_timeout(Duration::from_secs(10));
    // The connection just used (one idle for a second is checked first).
    store.charge(&call(&key)).await.unwrap();
    server.pause();
    // Four batches of 64 go out; 744 wait, more than an eighth of 4,096.
    let calls: Vec<_> = (0..1_000).map(|_| call(&key)).collect();
    let mut waiting: futures_util::stream::FuturesUnordered<_> =
        calls.iter().map(|c| store.charge(c)).collect();
    // Queue them (a first poll submits each): Redis answers none yet.
    let next = tokio::time::timeout(
        Duration::from_millis(100),
        futures_util::StreamExt::next(&mut waiting),
    );
    assert!(next.await.is_err(), "all queued, none answered");
    let shadow = store.charge_shadow(&call(&key)).await.unwrap_err();
    assert_eq!(shadow.kind(), "backlog", "{shadow}");
    let another = tokio::spawn(store.charge(&call(&key)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!another.is_finished(), "a request's charge still queues");
    server.resume();
    assert!(another.await.unwrap().unwrap().is_allowed());
    while let Some(r) = futures_util::StreamExt::next(&mut waiting).await {
        assert!(r.unwrap().is_allowed());
    }
}

#[test]
fn a_runtime_shut_down_mid_batch_leaves_the_store_usable_from_another() {
    let (server, store, now) = cold();
    let (ns, p) = (Namespace::new("runtimes"), fixed(10));
    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    first.block_on(warm(&store, now));
    // Redis holds every batch: four leave one by one and stay in flight (the
    // most a connection sends at once), and the runner waits with a fifth
    // when the runtime goes.
    server.pause();
    let keys: Vec<Key> = (0..5).map(|i| Key::new(format!("stranded{i}"))).collect();
    let mut stranded = Vec::new();
    for key in &keys {
        stranded.push(first.spawn(charge(&store, &ns, key, &p, now)));
        first.block_on(async {
            for _ in 0..16 {
                tokio::task::yield_now().await;
            }
        });
    }
    assert!(stranded.iter().all(|t| !t.is_finished()));
    drop(first);
    server.resume();

    // Another runtime: a new runner and, after at most one failed call on the
    // connection whose task died with the first runtime, a fresh connection.
    let second = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let other = Key::new("other");
    let decided = second.block_on(async {
        for _ in 0..3 {
            if let Ok(d) = charge(&store, &ns, &other, &p, now).await {
                return Some(d);
            }
        }
        None
    });
    assert_eq!(
        decided.expect("the store recovers").statuses()[0].remaining,
        9
    );
}

/// A charge made where no runtime runs (plain code holding the store) is
/// sent when a runtime first polls it, not before, and decides exactly as
/// one made inside: the path `RedisStore::charge` takes without a runtime.
#[test]
fn a_charge_made_outside_a_runtime_is_sent_when_a_runtime_polls_it() {
    let (server, store, now) = cold();
    let (ns, p, key) = (Namespace::new("outside"), fixed(3), Key::new("k"));
    let pending: Vec<_> = (0..4).map(|_| charge(&store, &ns, &key, &p, now)).collect();
    assert!(
        server.scan_keys("*").is_empty(),
        "nothing is sent before a runtime polls"
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let decided = rt.block_on(async {
        let mut out = Vec::new();
        for fut in pending {
            out.push(fut.await.unwrap());
        }
        out
    });
    let remaining: Vec<u64> = decided.iter().map(|d| d.statuses()[0].remaining).collect();
    assert_eq!(remaining, [2, 1, 0, 0]);
    let allowed: Vec<bool> = decided.iter().map(Decision::is_allowed).collect();
    assert_eq!(allowed, [true, true, true, false]);
    assert_eq!(
        server.scan_keys("*").len(),
        1,
        "one key, charged three times"
    );
}

/// A user, password and database in the URL hold for charges too: redis-rs
/// authenticates and selects the database on the lane's connection.
#[tokio::test]
async fn the_urls_user_password_and_database_hold_for_charges() {
    require_redis();
    // `alice` needs a password; the default user stays open for the harness.
    let server =
        RedisServer::start_with(&["--user", "alice", "on", ">s3cret", "~*", "&*", "+@all"]);
    let now = SystemClock.now_ms();
    let ns = Namespace::new("auth");
    let key = Key::new("k");
    let p = fixed(10);
    let url = format!("redis://alice:s3cret@127.0.0.1:{}/3", server.port());
    let store = RedisStore::new(url).unwrap();
    let monitor = server.monitor();
    for i in 0..3 {
        let d = charge(&store, &ns, &key, &p, now).await.unwrap();
        assert_eq!(d.statuses()[0].remaining, 9 - i);
    }
    let seen = monitor.stop();
    let loads = seen
        .iter()
        .filter(|e| !e.is_from_script() && e.command() == "SCRIPT")
        .count();
    // The first call met NOSCRIPT on the new server: loaded, then sent again.
    assert_eq!((script_calls(&seen).len(), loads), (4, 1));
    // The state is in database 3, not 0.
    let mut conn = server.conn();
    let redis_key = store.redis_key(&ns, &key);
    let mut exists = redis::cmd("EXISTS");
    exists.arg(&redis_key);
    assert_eq!(exists.query::<i64>(&mut conn).unwrap(), 0);
    redis::cmd("SELECT").arg(3).exec(&mut conn).unwrap();
    assert_eq!(exists.query::<i64>(&mut conn).unwrap(), 1);

    // A wrong password is a clear store error, not a hang or a panic.
    let wrong = format!("redis://alice:nope@127.0.0.1:{}/3", server.port());
    let e = charge(&RedisStore::new(wrong).unwrap(), &ns, &key, &p, now)
        .await
        .unwrap_err();
    assert!(e.to_string().to_lowercase().contains("pass"), "{e}");
}

/// A Unix-socket URL takes the same path as TCP: its charges go through
/// redis-rs, batched the same way and decided as exactly.
#[tokio::test]
async fn a_unix_socket_url_batches_charges_through_redis_rs_as_exactly() {
    require_redis();
    let dir = std::env::temp_dir().join(format!("trl-unix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("redis.sock");
    let server = RedisServer::start_with(&[
        "--unixsocket",
        socket.to_str().unwrap(),
        "--unixsocketperm",
        "700",
    ]);
    let store = RedisStore::new(format!("redis+unix://{}", socket.display())).unwrap();
    let now = SystemClock.now_ms();
    // The script for these algorithms loaded.
    Crowd::new("warm").run(&store, now).await;

    let seen = Crowd::new("unix").run_watched(&server, &store, now).await;
    let calls = script_calls(&seen);
    assert!(
        calls.len() < 200,
        "{} script calls for 200 requests",
        calls.len()
    );
    assert_eq!(calls.iter().map(|e| requests_in(e)).sum::<usize>(), 200);
    assert_eq!(script_internal(&seen, "HMGET"), 200);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A connection whose reply is later than the store's response timeout is
/// given up: the batch fails with that timeout (not the caller's longer
/// one), and the next charge connects anew instead of queueing behind it.
#[tokio::test]
async fn a_reply_later_than_the_response_timeout_fails_the_batch_and_drops_the_connection() {
    require_redis();
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .response_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let now = SystemClock.now_ms();
    warm(&store, now).await;
    let connections = || {
        server.info_section("stats")["total_connections_received"]
            .parse::<u64>()
            .unwrap()
    };
    let (ns, key, p) = (Namespace::new("late"), Key::new("k"), fixed(10));
    let before = connections();

    server.pause();
    // The caller would wait 5 s; the connection gives up after 100 ms.
    let e = charge(&store, &ns, &key, &p, now).await.unwrap_err();
    server.resume();
    assert_eq!(e.kind(), "unavailable", "{e}");
    assert!(e.to_string().contains("timed out"), "{e}");

    let d = charge(&store, &ns, &key, &p, now).await.unwrap();
    assert!(d.is_allowed());
    assert!(connections() > before, "the late connection was reused");
}

/// A relay to `upstream` whose replies, once `slow` is set, come one byte
/// every 5 ms: a slow link to a server that answers steadily. The pauses
/// are the link's slowness, not a wait for anything. Its `redis://` URL.
async fn trickling_relay(upstream: SocketAddr, slow: Arc<AtomicBool>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                return;
            };
            let (mut from_client, mut to_client) = client.into_split();
            let (mut from_server, mut to_server) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut from_client, &mut to_server).await;
            });
            let slow = slow.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                while let Ok(n @ 1..) = from_server.read(&mut buf).await {
                    let trickle = slow.load(Ordering::Relaxed);
                    for chunk in buf[..n].chunks(if trickle { 1 } else { n }) {
                        if to_client.write_all(chunk).await.is_err() {
                            return;
                        }
                        if trickle {
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                    }
                }
            });
        }
    });
    format!("redis://{addr}")
}

/// Regression: the response timeout counted whole replies, so a reply
/// still coming in, steadily, past it (a large one, 100k shared-limit
/// overrides read by a debug build; a slow link) was taken for a frozen
/// server: the call failed and its connection was dropped. Anything read
/// from the connection shows the server answers.
#[tokio::test]
async fn a_reply_still_coming_in_past_the_response_timeout_is_not_taken_for_a_frozen_server() {
    require_redis();
    let server = RedisServer::start();
    let slow = Arc::new(AtomicBool::new(false));
    let url = trickling_relay(server.addr(), slow.clone()).await;
    let limit = Duration::from_millis(150);
    let store = RedisStore::builder(url)
        .response_timeout(limit)
        .build()
        .unwrap();
    let now = SystemClock.now_ms();
    warm(&store, now).await;
    let connections = || {
        server.info_section("stats")["total_connections_received"]
            .parse::<u64>()
            .unwrap()
    };
    // Asking counts a connection of its own too.
    let (asked, before) = (connections(), connections());
    let per_ask = before - asked;

    slow.store(true, Ordering::Relaxed);
    let started = std::time::Instant::now();
    let (ns, key) = (Namespace::new("trickle"), Key::new("k"));
    let d = charge(&store, &ns, &key, &mixed(), now).await;
    let took = started.elapsed();
    slow.store(false, Ordering::Relaxed);
    assert!(
        took > limit,
        "the test needs a reply slower than the response timeout: it took {took:?}"
    );
    assert!(d.expect("answered, not timed out").is_allowed());
    assert_eq!(
        connections() - before,
        per_ask,
        "the store's connection was kept"
    );
}

/// Requests in a row for one key under one policy (a hot client, a global
/// limit) are charged in one run inside the script: one HMGET and one HSET
/// for the run (lua/charge.lua, `charge_run`). Every decision is still the
/// memory store's for the same requests one by one, rejections and a window
/// crossed mid-run included, and the stored state (fields and expiry) is
/// exactly what charging them one call each leaves.
#[tokio::test]
async fn runs_of_one_key_in_a_batch_decide_and_store_as_charging_them_one_by_one() {
    let (server, store, now) = started().await;
    let two = fixed(6)
        .and(quota(Algorithm::TokenBucket, 2, 1).burst(4).unwrap())
        .unwrap();
    // Two quotas without a log read and write through the generic path
    // (each algorithm's read/fits/reply/write), one quota through its step.
    // GCRA second: its fields start after the sliding window's.
    let gcra_and_sliding = lone(Algorithm::SlidingWindow, 7)
        .and(quota(Algorithm::Gcra, 3, 1).burst(4).unwrap())
        .unwrap();
    let policies = [
        fixed(5),
        lone(Algorithm::TokenBucket, 5),
        lone(Algorithm::Gcra, 5),
        lone(Algorithm::SlidingWindow, 5),
        two,
        mixed(),
        gcra_and_sliding,
    ];
    // (client, policy, ms after `now`, cost): runs of 1 to 9 requests for one
    // key, past its quota, with times and costs changing mid-run and a
    // window crossed mid-run; the sliding-log policy is never run together.
    let mut requests = Vec::new();
    let mut t = 0;
    for (i, len) in [9, 1, 4, 7, 2, 9, 3, 8, 5, 9, 6, 1].into_iter().enumerate() {
        let policy = i % policies.len();
        let client = i % 3;
        for r in 0..len as u64 {
            if r == 4 {
                t += 61_000;
            }
            let cost = [1, 1, 2, 1, 9, 1, 3, 1, 1][r as usize];
            requests.push((client * 10 + policy, policy, t, cost));
        }
        t += 7;
    }
    let keys: Vec<Key> = (0..30).map(|i| Key::new(format!("c{i}"))).collect();
    let seq = Sequence {
        keys: &keys,
        policies: &policies,
        now,
    };
    let charge_in = |ns, store: &dyn Store, r: &Request| seq.charge(ns, store, r);
    let (batched, single) = (Namespace::new("runs"), Namespace::new("one-by-one"));
    // The script for this set of algorithms loaded.
    let warm = Namespace::new("runs-warm");
    for r in join_all(requests.iter().map(|r| charge_in(&warm, &store, r))).await {
        r.unwrap();
    }

    let monitor = server.monitor();
    let batched_at = server.time_ms();
    let from_redis: Vec<Decision> =
        join_all(requests.iter().map(|r| charge_in(&batched, &store, r)))
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
    let batched_at = batched_at..=server.time_ms();
    let seen = monitor.stop();
    assert_eq!(script_calls(&seen).len(), 1, "one script call");
    // Runs 0..12 take policy i % 7: the sliding log (5) only run 5, of 9 requests.
    let runs_without_logs = 11;
    let log_requests = 9;
    assert_eq!(
        script_internal(&seen, "HMGET"),
        runs_without_logs + log_requests,
        "one HMGET per run"
    );

    let memory = tower_ratelimit::store::MemoryStore::new();
    let mut one_call_each = Vec::new();
    let single_at = server.time_ms();
    for r in &requests {
        let mem = charge_in(&batched, &memory, r).await.unwrap();
        one_call_each.push(charge_in(&single, &store, r).await.unwrap());
        assert_eq!(from_redis[one_call_each.len() - 1], mem, "request {r:?}");
    }
    let single_at = single_at..=server.time_ms();
    assert_eq!(from_redis, one_call_each);
    let admitted = from_redis.iter().filter(|d| d.is_allowed()).count();
    assert!(
        (10..requests.len()).contains(&admitted),
        "{admitted} admitted"
    );

    let mut conn = server.conn();
    for (k, key) in keys.iter().enumerate() {
        let (a, b) = (
            store.redis_key(&batched, key),
            store.redis_key(&single, key),
        );
        let mut fields = |name: &str| {
            let mut f: Vec<String> = redis::cmd("HGETALL").arg(name).query(&mut conn).unwrap();
            f.sort();
            f
        };
        assert_eq!(fields(&a), fields(&b), "client {k}'s fields");
        // TTLs are relative to the time a request was charged at (never an
        // absolute time judged by Redis's clock), so each key expires that
        // long after Redis ran its script: the TTL each set is bounded by
        // when its calls ran, and the two ways set the same TTLs.
        let mut expiry = |name: &str| {
            redis::cmd("PEXPIRETIME")
                .arg(name)
                .query::<i64>(&mut conn)
                .unwrap()
        };
        let (ea, eb) = (expiry(&a), expiry(&b));
        if ea < 0 || eb < 0 {
            assert_eq!(
                ea, eb,
                "client {k}: no key (-2), or no TTL (-1), in both ways"
            );
            continue;
        }
        let ttl_of = |e: i64, at: &std::ops::RangeInclusive<u64>| {
            let e = e as u64;
            e - at.end()..=e - at.start()
        };
        let (ttl_a, ttl_b) = (ttl_of(ea, &batched_at), ttl_of(eb, &single_at));
        assert!(
            ttl_a.start() <= ttl_b.end() && ttl_b.start() <= ttl_a.end(),
            "client {k}'s TTLs: {ttl_a:?} batched, {ttl_b:?} one by one"
        );
        // A lone quota's key expires one second after the state its last
        // admitted charge left expires, as the algorithm in src/algorithm/
        // computes it (the status's window id: a fixed window's reset, a
        // bucket's or GCRA's "full again", a sliding window's start),
        // counted from the time that charge was made at.
        let last = requests
            .iter()
            .zip(&from_redis)
            .rfind(|((c, ..), d)| *c == k && d.is_allowed());
        if let Some(((_, policy @ 0..=3, at, _), d)) = last {
            let id = d.statuses()[0].window_id;
            let state_expiry = if *policy == 3 { id + 2 * 60_000 } else { id };
            let ttl = state_expiry + 1000 - (now + at);
            assert!(
                ttl_a.contains(&ttl),
                "client {k}'s TTL {ttl_a:?} against its state's, {ttl} ms"
            );
        }
    }
}

/// A lane's connection that the server closed while it was idle (its
/// `timeout`, a proxy's, a `CLIENT KILL`) is found closed before the next
/// batch is sent on it: that batch goes out on a new connection instead of
/// failing.
#[tokio::test]
async fn an_idle_connection_the_server_closed_is_replaced_before_the_next_charge() {
    let (server, store, now) = started().await;
    let (ns, key, p) = (Namespace::new("idle"), Key::new("k"), fixed(10));
    assert!(charge(&store, &ns, &key, &p, now)
        .await
        .unwrap()
        .is_allowed());
    // The server drops connections idle for a second.
    server.config_set("timeout", "1");
    server.wait_for_no_other_clients();
    for remaining in [8, 7] {
        let d = charge(&store, &ns, &key, &p, now).await.unwrap();
        assert_eq!(d.statuses()[0].remaining, remaining);
    }
}

#[tokio::test]
async fn a_charge_that_timed_out_is_never_sent_again() {
    let (server, store, now) = started().await;
    let ns = Namespace::new("timed-out");
    let key = Key::new("once");
    let p = fixed(10);
    server.config_resetstat();
    // Redis holds every command for 500 ms; the charge gives up after 100.
    server.cmd(&["CLIENT", "PAUSE", "500", "ALL"]);
    let r = store
        .charge(&Charge::new(&ns, &key, &p, now).with_timeout(Duration::from_millis(100)))
        .await;
    assert_eq!(r.unwrap_err().kind(), "timeout");
    // The call was written before it timed out: Redis runs it once the
    // pause ends, and nothing sends it again.
    let hash = store.redis_key(&ns, &key);
    redis_support::wait_until(
        Duration::from_secs(5),
        "the paused call to run",
        || (server.query::<i64>(&["EXISTS", &hash]) == 1).then_some(()),
        String::new,
    );
    let later = charge(&store, &ns, &Key::new("other"), &p, now).await;
    assert!(later.unwrap().is_allowed(), "the store works on");
    assert_eq!(
        server.query::<String>(&["HGET", &hash, "fw60000c"]),
        "1",
        "charged once"
    );
    assert_eq!(
        server.command_calls("evalsha"),
        2,
        "one call each, never re-sent"
    );
}

#[tokio::test]
async fn a_batch_whose_callers_all_gave_up_leaves_the_next_charges_served() {
    let (_server, store, now) = started().await;
    let ns = Namespace::new("abandoned");
    let (key, p) = (Key::new("k"), fixed(10));
    // Charges queued, then given up before their batch leaves: the runner,
    // once it runs, finds only abandoned requests.
    let mut gone: Vec<_> = (0..3).map(|_| charge(&store, &ns, &key, &p, now)).collect();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    for f in &mut gone {
        assert!(std::pin::Pin::new(f).poll(&mut cx).is_pending());
    }
    drop(gone);
    // Turns for the runner (each yield lets every ready task run once).
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    // A charge after them is sent and answered, not left waiting for a
    // whole batch to queue.
    let next = tokio::time::timeout(Duration::from_secs(5), charge(&store, &ns, &key, &p, now))
        .await
        .expect("the charge after an abandoned batch was never sent");
    assert_eq!(
        next.unwrap().statuses()[0].remaining,
        9,
        "only it was charged"
    );
}

#[tokio::test]
async fn a_resp3_connection_batches_and_decides_as_exactly() {
    require_redis();
    let server = RedisServer::start();
    let store = RedisStore::new(format!("{}?protocol=resp3", server.url())).unwrap();
    let ns = Namespace::new("resp3");
    let (key, p) = (Key::new("k"), fixed(30));
    let now = SystemClock.now_ms();
    let monitor = server.monitor();
    let results = join_all((0..50).map(|_| charge(&store, &ns, &key, &p, now))).await;
    let seen = monitor.stop();
    assert!(
        seen.iter().any(|e| e.command() == "HELLO"),
        "the connection speaks RESP3"
    );
    let mut remaining: Vec<u64> = results
        .iter()
        .map(|r| r.as_ref().unwrap())
        .filter(|d| d.is_allowed())
        .map(|d| d.statuses()[0].remaining)
        .collect();
    remaining.sort_unstable();
    assert_eq!(
        remaining,
        (0..30).collect::<Vec<_>>(),
        "each admitted once, exactly"
    );
    assert!(script_calls(&seen).len() < 50, "batched");
}
