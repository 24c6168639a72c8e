//! The Redis store on a primary that Sentinel names (feature `sentinel`):
//! one primary, one replica and three real `redis-sentinel` processes.

use crate::support::managed;
use crate::support::redis as redis_support;

use axum::{routing::get, Router};
use http::StatusCode;
use managed::{sentinels, wait_for_master, Sentinel, SentinelOptions, MASTER};
use redis_support::{RedisServer, Value};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;
use tower_ratelimit::key::Header;
use tower_ratelimit::store::{RedisStore, RedisStoreBuilder};
use tower_ratelimit::{failure::CircuitBreaker, failure::OnStoreError, Quota, RateLimitLayer};

/// The data nodes' ACL user: the harness keeps the default user open for
/// its own commands, and `CLIENT LIST` shows which user each connection is.
const NODE_USER: (&str, &str) = ("limiter", "node-s3cret");
const SENTINEL_USER: (&str, &str) = ("watcher", "sentinel-s3cret");

fn acl(user: (&str, &str)) -> [String; 7] {
    [
        "--user".into(),
        user.0.into(),
        "on".into(),
        format!(">{}", user.1),
        "~*".into(),
        "&*".into(),
        "+@all".into(),
    ]
}

/// A primary and its replica, both with the store's ACL user.
fn pair() -> (RedisServer, RedisServer) {
    let args = acl(NODE_USER);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let primary = RedisServer::start_with(&args);
    let replica = RedisServer::replica_of_with(&primary, &args);
    replica.wait_for_sync(&primary);
    (primary, replica)
}

fn builder(sentinels: &[Sentinel]) -> RedisStoreBuilder {
    RedisStore::sentinel_builder(MASTER, sentinels.iter().map(|s| s.url(Some(SENTINEL_USER))))
        .node_username(NODE_USER.0)
        .node_password(NODE_USER.1)
}

fn opts() -> SentinelOptions<'static> {
    SentinelOptions {
        node_auth: Some(NODE_USER),
        sentinel_auth: Some(SENTINEL_USER),
        tls: None,
    }
}

fn limited(store: RedisStore, limit: u32) -> RateLimitLayer {
    RateLimitLayer::builder()
        .name("sentinel")
        .quota(Quota::per_hour(NonZeroU32::new(limit).unwrap()))
        .key(Header::try_new("x-client").unwrap())
        .store(store)
        // A store error is a 503: admitted and failed requests are told apart.
        .on_store_error(OnStoreError::FailClosed)
        .circuit_breaker(
            CircuitBreaker::new()
                .failures(3)
                .cooldown(Duration::from_millis(100)),
        )
        .store_timeout(Duration::from_millis(500))
        .build()
        .unwrap()
}

fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

/// Status and `x-ratelimit-used` of one request.
async fn send(app: &Router, client: &str) -> (StatusCode, Option<u64>) {
    let req = http::Request::get("/")
        .header("x-client", client)
        .body(axum::body::Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let used = res
        .headers()
        .get("x-ratelimit-used")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    (res.status(), used)
}

/// Which users the server's clients are authenticated as.
fn users(server: &RedisServer) -> Vec<String> {
    server
        .query::<String>(&["CLIENT", "LIST"])
        .lines()
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("user=")))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn the_primary_is_found_through_sentinel_with_passwords_for_both_and_replicas_serve_status() {
    managed::require("redis-sentinel");
    let (primary, replica) = pair();
    let sentinels = sentinels(primary.port(), &opts());
    let store = builder(&sentinels).build().unwrap();
    let layer = limited(store, 3);
    let app = app(layer.clone());
    for used in 1..=3 {
        assert_eq!(send(&app, "a").await, (StatusCode::OK, Some(used)));
    }
    assert_eq!(send(&app, "a").await.0, StatusCode::TOO_MANY_REQUESTS);
    // Charges went to the primary, authenticated as the store's user.
    assert!(primary.command_calls("evalsha") >= 4);
    assert!(users(&primary).contains(&NODE_USER.0.to_owned()));

    // A status read goes to the replica Sentinel knows.
    replica.wait_for_sync(&primary);
    let before = replica.command_calls("evalsha") + replica.command_calls("script|load");
    let (parts, ()) = http::Request::get("/")
        .header("x-client", "a")
        .body(())
        .unwrap()
        .into_parts();
    let status = layer.status(&parts).await.unwrap().unwrap();
    assert_eq!(status.decision.statuses()[0].remaining, 0);
    assert!(
        replica.command_calls("evalsha") + replica.command_calls("script|load") > before,
        "the replica served the read"
    );

    // The sentinels were asked as their own user.
    assert!(sentinels.iter().any(|s| s
        .query::<String>(&["CLIENT", "LIST"])
        .contains("user=watcher")));

    // A wrong sentinel password is a clear store error (503 here), not a hang.
    let wrong = RedisStore::sentinel_builder(
        MASTER,
        sentinels
            .iter()
            .map(|s| s.url(Some((SENTINEL_USER.0, "nope")))),
    )
    .node_username(NODE_USER.0)
    .node_password(NODE_USER.1)
    .build()
    .unwrap();
    let wrong = self::app(limited(wrong, 3));
    assert_eq!(send(&wrong, "a").await.0, StatusCode::SERVICE_UNAVAILABLE);
}

/// `SENTINEL FAILOVER` under concurrent load. The operator's pre-step for a
/// failover that loses nothing, as Redis's own `FAILOVER` command does it:
/// writes on the old primary are paused until the replica has caught up.
/// Every admitted request is charged exactly once (a failed one at most
/// once), and limiting continues on the promoted replica with the counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_under_load_moves_charges_to_the_promoted_replica_each_charged_once() {
    managed::require("redis-sentinel");
    let (primary, replica) = pair();
    let sentinels = sentinels(primary.port(), &opts());
    let store = builder(&sentinels).build().unwrap();
    let app = app(limited(store, 1_000_000));
    let client = "busy";
    assert_eq!(send(&app, client).await.0, StatusCode::OK);
    let stop = Arc::new(AtomicBool::new(false));
    let (admitted, failed) = (Arc::new(AtomicUsize::new(1)), Arc::new(AtomicUsize::new(0)));
    let mut tasks = vec![];
    for _ in 0..8 {
        let (app, stop, admitted, failed) =
            (app.clone(), stop.clone(), admitted.clone(), failed.clone());
        tasks.push(tokio::spawn(async move {
            // Until the failover is done, bounded: at most two minutes and
            // 500,000 requests a task (an open breaker answers fast).
            let until = tokio::time::Instant::now() + Duration::from_secs(120);
            for _ in 0..500_000 {
                if stop.load(Ordering::SeqCst) || tokio::time::Instant::now() > until {
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
    let primary = Arc::new(primary);
    let replica = Arc::new(replica);
    let sentinels = Arc::new(sentinels);
    let progress = |n: usize| {
        let admitted = admitted.clone();
        async move {
            let from = admitted.load(Ordering::SeqCst);
            while admitted.load(Ordering::SeqCst) < from + n {
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), progress(200))
        .await
        .expect("traffic flows before the failover");
    let before = admitted.load(Ordering::SeqCst);
    let (p, r, s) = (primary.clone(), replica.clone(), sentinels.clone());
    tokio::task::spawn_blocking(move || {
        // Writes wait on the old primary until the pause ends; Sentinel's
        // reconfiguration of it (a transaction) runs then too.
        assert_eq!(p.cmd(&["CLIENT", "PAUSE", "4000", "WRITE"]), Value::Okay);
        r.wait_for_sync(&p);
        assert_eq!(s[0].cmd(&["SENTINEL", "FAILOVER", MASTER]), Value::Okay);
        wait_for_master(&s, r.port());
        p.wait_for_role("replica");
    })
    .await
    .unwrap();
    // Limiting continues on the new primary.
    tokio::time::timeout(Duration::from_secs(30), progress(200))
        .await
        .expect("traffic flows after the failover");
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    let (admitted, failed) = (
        admitted.load(Ordering::SeqCst),
        failed.load(Ordering::SeqCst),
    );
    // One more request reads the count the new primary holds.
    let (status, used) = send(&app, client).await;
    assert_eq!(status, StatusCode::OK);
    let used = used.unwrap() as usize - 1;
    eprintln!(
        "sentinel failover under load: {admitted} admitted ({before} before it), \
         {failed} answered 503, {used} charged"
    );
    assert!(
        admitted <= used && used <= admitted + failed,
        "{admitted} admitted, {failed} failed, {used} charged"
    );
    assert!(replica.command_calls("evalsha") > 0, "charges moved");
    assert_eq!(replica.role().as_deref(), Some("master"));
}

/// Sentinels and data nodes all speaking TLS (their certificates from the
/// test's CA), with passwords for both.
#[cfg(feature = "tls")]
#[tokio::test]
async fn tls_and_passwords_hold_for_the_sentinels_and_the_data_nodes_alike() {
    managed::require("redis-sentinel");
    managed::require("openssl");
    let certs = managed::Certs::make();
    let tls = |port: u16| {
        let mut args = certs.server_args(port, false);
        args.extend(["--tls-replication".into(), "yes".into()]);
        args.extend(acl(NODE_USER));
        args
    };
    let (t1, t2) = (
        redis_support::pick_free_port(),
        redis_support::pick_free_port(),
    );
    let args = tls(t1);
    let primary = RedisServer::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let mut args = tls(t2);
    args.extend(["--replicaof".into(), "127.0.0.1".into(), t1.to_string()]);
    let replica = RedisServer::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>());
    replica.wait_for_sync(&primary);
    let opts = SentinelOptions {
        tls: Some(&certs),
        ..opts()
    };
    let sentinels = sentinels(t1, &opts);
    assert!(sentinels[0].url(None).starts_with("rediss://"));
    let store = builder(&sentinels)
        .node_tls()
        .tls_ca_pem(certs.ca_pem())
        .build()
        .unwrap();
    let app = app(limited(store, 2));
    assert_eq!(send(&app, "t").await, (StatusCode::OK, Some(1)));
    assert_eq!(send(&app, "t").await, (StatusCode::OK, Some(2)));
    assert_eq!(send(&app, "t").await.0, StatusCode::TOO_MANY_REQUESTS);
    assert!(users(&primary).contains(&NODE_USER.0.to_owned()));

    // Without the CA, the TLS handshakes fail: a store error, never a charge.
    let untrusting = builder(&sentinels).node_tls().build().unwrap();
    let app = self::app(limited(untrusting, 2));
    assert_eq!(send(&app, "u").await.0, StatusCode::SERVICE_UNAVAILABLE);
}
