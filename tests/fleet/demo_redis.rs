//! The demo server's Redis flags, exercised on the built example as a black
//! box against `redis-server` processes started by the tests: one
//! `--redis-url`, several (sharded), `--redis-cluster`, a TLS Redis with
//! `--redis-ca`, `--redis-cert` and `--redis-key`, and `--redis-sentinel`.

use crate::support::example;
use crate::support::http as http_support;
use crate::support::managed;
use crate::support::redis as redis_support;

use example::Running;
use http::StatusCode;
use http_support::HttpClient;
use redis_support::{require_redis, Cluster, RedisServer};
use std::process::Command;

fn demo(store_args: &[&str]) -> Running {
    let mut args = vec![
        "--listen",
        "127.0.0.1:0",
        "--limit",
        "2",
        "--window",
        "1h",
        "--key",
        "header:x-client",
        "--on-store-error",
        "closed",
        // These tests check where the state lands, not how fast: six demos
        // start at once on a small machine, debug builds, and a first call
        // there can take longer than the default 50 ms budget.
        "--store-timeout",
        "2s",
        "--store",
        "redis",
    ];
    args.extend_from_slice(store_args);
    Running::start("demo", &args)
}

/// Every client gets exactly 2 requests, then 429s.
async fn limits_clients(demo: &Running, clients: usize) {
    let c = HttpClient::new();
    for i in 0..clients {
        let client = format!("client-{i}");
        let h: &[(&str, &[u8])] = &[("x-client", client.as_bytes())];
        for want in [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
        ] {
            let r = c.get_with(&demo.url("/"), h).await;
            assert_eq!(r.status, want, "client-{i}");
            assert!(r.header("x-ratelimit-remaining").is_some());
        }
    }
}

fn dbsize(s: &RedisServer) -> i64 {
    s.query::<i64>(&["DBSIZE"])
}

#[tokio::test]
async fn one_redis_url_keeps_every_key_on_that_primary() {
    require_redis();
    let server = RedisServer::start();
    let demo = demo(&["--redis-url", &server.url()]);
    limits_clients(&demo, 4).await;
    assert_eq!(dbsize(&server), 4);
    assert!(demo.terminate().success());
}

#[tokio::test]
async fn repeated_redis_urls_shard_clients_over_the_primaries() {
    require_redis();
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let demo = demo(&[
        "--redis-url",
        &urls[0],
        "--redis-url",
        &urls[1],
        "--redis-url",
        &urls[2],
    ]);
    limits_clients(&demo, 30).await;
    let held: Vec<i64> = servers.iter().map(dbsize).collect();
    assert_eq!(
        held.iter().sum::<i64>(),
        30,
        "each client on one shard: {held:?}"
    );
    assert!(
        held.iter().all(|n| *n > 0),
        "every shard holds clients: {held:?}"
    );
    assert!(demo.terminate().success());
}

#[tokio::test]
async fn redis_cluster_keeps_state_on_the_cluster() {
    require_redis();
    let cluster = Cluster::start(3, 0);
    let demo = demo(&["--redis-cluster", &cluster.urls().join(",")]);
    limits_clients(&demo, 12).await;
    let held: Vec<i64> = cluster
        .master_indices()
        .into_iter()
        .map(|i| dbsize(cluster.node(i)))
        .collect();
    assert_eq!(held.iter().sum::<i64>(), 12, "{held:?}");
    assert!(demo.terminate().success());
}

#[test]
fn contradictory_redis_flags_are_refused_with_a_message() {
    for args in [
        &[
            "--store",
            "redis",
            "--redis-cluster",
            "redis://127.0.0.1:7000",
            "--redis-url",
            "redis://127.0.0.1:6379",
        ][..],
        &[
            "--store",
            "redis",
            "--redis-url",
            "redis://127.0.0.1:1",
            "--redis-url",
            "redis://127.0.0.1:2",
            "--replica-url",
            "redis://127.0.0.1:3",
        ],
        &["--redis-url", "redis://127.0.0.1:1"],
    ] {
        let out = Command::new(example::example_path("demo"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(!out.stderr.is_empty(), "{args:?} gave no message");
        assert!(out.stdout.is_empty(), "{args:?} printed `listening on`");
    }
}

#[cfg(feature = "tls")]
#[tokio::test]
async fn a_tls_redis_asking_for_client_certificates_is_reached_with_the_tls_flags() {
    managed::require("openssl");
    let certs = managed::Certs::make();
    let server = managed::TlsRedis::start(&certs, true, &[]);
    let demo = demo(&[
        "--redis-url",
        &server.url(),
        "--redis-ca",
        &certs.path("ca.pem"),
        "--redis-cert",
        &certs.path("client.pem"),
        "--redis-key",
        &certs.path("client.key"),
    ]);
    limits_clients(&demo, 2).await;
    assert_eq!(dbsize(&server.server), 2);
    assert!(demo.terminate().success());
}

#[cfg(feature = "sentinel")]
#[tokio::test]
async fn the_primary_sentinel_names_holds_the_demos_state() {
    managed::require("redis-sentinel");
    let primary = RedisServer::start();
    let replica = RedisServer::replica_of(&primary);
    replica.wait_for_sync(&primary);
    let sentinels = managed::sentinels(primary.port(), &managed::SentinelOptions::default());
    let urls: Vec<String> = sentinels.iter().map(|s| s.url(None)).collect();
    let demo = demo(&[
        "--redis-sentinel",
        &urls.join(","),
        "--sentinel-master",
        managed::MASTER,
    ]);
    limits_clients(&demo, 2).await;
    assert_eq!(dbsize(&primary), 2);
    assert!(demo.terminate().success());
}
