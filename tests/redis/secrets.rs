//! No Redis password appears in any output of the crate: `Debug` and
//! `Display` of every public type and error that can hold a Redis URL, and
//! the log lines of a failing connection.

use crate::support::logs;
use crate::support::redis as redis_support;

use std::num::NonZeroU32;
use std::time::Duration;
use tower_ratelimit::clock::{Clock, SystemClock};
use tower_ratelimit::key::Key;
use tower_ratelimit::store::{Charge, Coordinated, Namespace, RedisStore, ShardedStore, Store};
use tower_ratelimit::ConcurrencyLimitLayer;
use tower_ratelimit::{Policy, Quota, RateLimitLayer};

const SECRET: &str = "pa55-w0rd-xyz";

/// Every way a password sits in a URL.
fn urls(port: u16) -> Vec<String> {
    vec![
        format!("redis://user:{SECRET}@127.0.0.1:{port}/1"),
        format!("redis://:{SECRET}@127.0.0.1:{port}"),
        format!("rediss://user:{SECRET}@127.0.0.1:{port}"),
        format!("unix:///tmp/no-such.sock?db=1&pass={SECRET}"),
        format!("redis+unix:///tmp/no-such.sock?pass={SECRET}"),
    ]
}

/// URLs with a password that do not parse.
fn bad_urls() -> Vec<String> {
    vec![
        format!("redis://user:{SECRET}@[bad"),
        format!("redis://user:{SECRET}@host:99999"),
        format!("redis://user:{SECRET}@host/notadb"),
        format!("ftp://user:{SECRET}@host"),
        format!("rediss://user:{SECRET}@host#insecure"),
    ]
}

#[track_caller]
fn clean(what: &str, text: String) {
    assert!(!text.contains(SECRET), "{what} shows the password: {text}");
}

fn both<T: std::fmt::Debug + std::fmt::Display>(what: &str, v: &T) {
    clean(what, format!("{v:?}"));
    clean(what, format!("{v}"));
}

#[test]
fn no_type_or_error_that_holds_a_redis_url_shows_its_password() {
    let port = redis_support::pick_free_port();
    let quota = Quota::per_second(NonZeroU32::new(5).unwrap());
    for url in urls(port) {
        let builder = RedisStore::builder(&url).replica(&url);
        clean("RedisStoreBuilder", format!("{builder:?}"));
        let store = match builder.build() {
            Ok(store) => store,
            // Without the `tls` feature a rediss:// URL is a clear error.
            Err(e) => {
                both("ConfigError", &e);
                continue;
            }
        };
        clean("RedisStore", format!("{store:?}"));
        clean("shard_name", store.shard_name().to_owned());
        let sharded = ShardedStore::builder().shard(store.clone());
        clean("ShardedStoreBuilder", format!("{sharded:?}"));
        clean("ShardedStore", format!("{:?}", sharded.build().unwrap()));
        let coordinated = Coordinated::builder(store.clone()).manual_sync();
        clean("CoordinatedBuilder", format!("{coordinated:?}"));
        clean("Coordinated", format!("{:?}", coordinated.build().unwrap()));
        let layer = RateLimitLayer::builder()
            .quota(quota.clone())
            .store(store.clone())
            .build()
            .unwrap();
        clean("RateLimitLayer", format!("{layer:?}"));
        let concurrency = ConcurrencyLimitLayer::builder()
            .limit(2)
            .store(store.clone())
            .build()
            .unwrap();
        clean("ConcurrencyLimitLayer", format!("{concurrency:?}"));
    }
    for url in bad_urls() {
        let e = RedisStore::new(&url).unwrap_err();
        both("ConfigError", &e);
        let e = RedisStore::builder("redis://127.0.0.1")
            .replica(&url)
            .build()
            .unwrap_err();
        both("ConfigError (replica)", &e);
        let e = ShardedStore::from_urls([url.as_str()]).unwrap_err();
        both("ConfigError (shard)", &e);
    }
    #[cfg(feature = "cluster")]
    for url in urls(port).into_iter().chain(bad_urls()) {
        let b = RedisStore::cluster_builder([url.as_str()]);
        clean("RedisStoreBuilder (cluster)", format!("{b:?}"));
        match b.build() {
            Ok(store) => clean("RedisStore (cluster)", format!("{store:?}")),
            Err(e) => both("ConfigError (cluster)", &e),
        }
    }
    #[cfg(feature = "sentinel")]
    for url in urls(port).into_iter().chain(bad_urls()) {
        let b = RedisStore::sentinel_builder("mymaster", [url.as_str()]).node_password(SECRET);
        clean("RedisStoreBuilder (sentinel)", format!("{b:?}"));
        match b.build() {
            Ok(store) => clean("RedisStore (sentinel)", format!("{store:?}")),
            Err(e) => both("ConfigError (sentinel)", &e),
        }
    }
}

async fn charge(store: &RedisStore) -> tower_ratelimit::StoreError {
    store
        .charge(
            &Charge::new(
                &Namespace::new("secrets"),
                &Key::new("k"),
                &Policy::new(Quota::per_second(NonZeroU32::new(5).unwrap())),
                SystemClock.now_ms(),
            )
            .with_timeout(Duration::from_secs(2)),
        )
        .await
        .unwrap_err()
}

#[tokio::test]
async fn the_errors_and_log_lines_of_failing_connections_show_no_password() {
    let (captured, _guard) = logs::capture();
    // Nothing listens on the port; a Unix socket that does not exist.
    let port = redis_support::pick_free_port();
    for url in urls(port) {
        let Ok(store) = RedisStore::new(&url) else {
            continue;
        };
        both("StoreError", &charge(&store).await);
        // Through a layer, which logs the failure.
        let layer = RateLimitLayer::builder()
            .quota(Quota::per_second(NonZeroU32::new(5).unwrap()))
            .store(store)
            .build()
            .unwrap();
        let (parts, ()) = http::Request::new(()).into_parts();
        let _ = layer.status(&parts).await;
        use tower::{Service, ServiceExt};
        let mut svc = tower::ServiceBuilder::new()
            .layer(layer)
            .service_fn(|_req| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
            });
        let _ = svc
            .ready()
            .await
            .unwrap()
            .call(http::Request::new(()))
            .await;
    }
    // Nodes found through Sentinel or a cluster's seeds, nothing listening.
    let mut found: Vec<RedisStore> = Vec::new();
    #[cfg(feature = "sentinel")]
    for url in urls(port) {
        let b = RedisStore::sentinel_builder("mymaster", [url.as_str()]).node_password(SECRET);
        found.extend(b.build());
    }
    #[cfg(feature = "cluster")]
    for url in urls(port) {
        found.extend(RedisStore::cluster_builder([url.as_str()]).build());
    }
    for store in &found {
        both("StoreError (sentinel, cluster)", &charge(store).await);
    }
    // A server that refuses the password, with a log line about it.
    redis_support::require_redis();
    let server = redis_support::RedisServer::start_with(&[
        "--user", "user", "on", ">other", "~*", "&*", "+@all",
    ]);
    let store =
        RedisStore::new(format!("redis://user:{SECRET}@127.0.0.1:{}", server.port())).unwrap();
    let e = charge(&store).await;
    both("StoreError (AUTH refused)", &e);
    assert!(e.to_string().to_lowercase().contains("pass"), "{e}");
    let lines = captured.text();
    assert!(
        lines.contains("rate limit store failed"),
        "the failures were logged: {lines}"
    );
    clean("log lines", lines);
}
