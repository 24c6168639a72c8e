//! The shared decision table, through the memory store and a real Redis.

use crate::support::redis as redis_support;
use crate::support::vectors;

use tower_ratelimit::clock::{Clock, SystemClock};
use tower_ratelimit::store::{MemoryStore, RedisStore};

#[tokio::test]
async fn memory_store_answers_the_shared_table() {
    vectors::run_tables(&MemoryStore::new(), SystemClock.now_ms()).await;
}

#[cfg(all(feature = "wait", feature = "penalty"))]
#[tokio::test]
async fn memory_store_books_turns_gives_them_back_and_blocks_as_the_shared_table_says() {
    vectors::refusal::run_tables(&MemoryStore::new(), SystemClock.now_ms()).await;
}

#[cfg(all(feature = "wait", feature = "penalty"))]
#[tokio::test]
async fn redis_store_books_turns_gives_them_back_and_blocks_as_the_shared_table_says() {
    redis_support::require_redis();
    let server = redis_support::RedisServer::start();
    let store = RedisStore::new(server.url()).unwrap();
    vectors::refusal::run_tables(&store, SystemClock.now_ms() + 3_600_000).await;
    redis_support::assert_every_key_has_a_ttl(&server);
}

#[tokio::test]
async fn memory_store_rejections_spend_nothing_and_never_lengthen_the_wait() {
    vectors::rejections_change_nothing(&MemoryStore::new(), SystemClock.now_ms()).await;
}

#[tokio::test]
async fn redis_store_rejections_spend_nothing_and_never_lengthen_the_wait() {
    redis_support::require_redis();
    let server = redis_support::RedisServer::start();
    let store = RedisStore::new(server.url()).unwrap();
    vectors::rejections_change_nothing(&store, SystemClock.now_ms() + 3_600_000).await;
    redis_support::assert_every_key_has_a_ttl(&server);
}

#[tokio::test]
async fn memory_store_settles_below_and_above_the_reservation_in_its_own_window_only() {
    vectors::settlements_follow_the_rules(&MemoryStore::new(), SystemClock.now_ms()).await;
}

#[tokio::test]
async fn redis_store_settles_below_and_above_the_reservation_in_its_own_window_only() {
    redis_support::require_redis();
    let server = redis_support::RedisServer::start();
    let store = RedisStore::new(server.url()).unwrap();
    vectors::settlements_follow_the_rules(&store, SystemClock.now_ms() + 3_600_000).await;
    redis_support::assert_every_key_has_a_ttl(&server);
}

#[tokio::test]
async fn redis_store_answers_the_shared_table() {
    redis_support::require_redis();
    let server = redis_support::RedisServer::start();
    let store = RedisStore::new(server.url()).unwrap();
    // Application time near the real time, so the keys' TTLs are meaningful.
    // An hour ahead: Redis expires keys by its own clock, so simulated time must
    // never fall behind real time, however slow the machine.
    vectors::run_tables(&store, SystemClock.now_ms() + 3_600_000).await;
    redis_support::assert_every_key_has_a_ttl(&server);
}

use crate::support::managed;

/// A Redis that listens only on a Unix socket: the same batched path, the
/// same decisions, under both URL schemes.
#[tokio::test]
async fn redis_store_on_a_unix_socket_only_answers_the_shared_table() {
    redis_support::require_redis();
    let server = managed::UnixRedis::start();
    for scheme in ["unix", "redis+unix"] {
        assert_eq!(server.cmd(&["FLUSHALL"]), redis_support::Value::Okay);
        let store = RedisStore::new(format!("{scheme}://{}", server.socket().display())).unwrap();
        vectors::run_tables(&store, SystemClock.now_ms() + 3_600_000).await;
        assert_eq!(server.keys_without_ttl(), Vec::<String>::new());
    }
}
