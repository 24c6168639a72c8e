//! The demo server's contract, exercised on the built example as a black box.

#[path = "support/example.rs"]
mod example;
#[path = "support/http.rs"]
mod http_support;
#[path = "support/redis.rs"]
mod redis_support;

use example::Running;
use http::StatusCode;
use http_support::HttpClient;
use std::process::Command;

#[tokio::test]
async fn demo_serves_its_routes_limits_and_refunds_and_exits_cleanly_on_sigterm() {
    let demo = Running::start(
        "demo",
        &[
            "--listen",
            "127.0.0.1:0",
            "--limit",
            "2",
            "--window",
            "60s",
            "--key",
            "header:x-client",
            "--headers",
            "both",
        ],
    );
    let c = HttpClient::new();
    let a: &[(&str, &[u8])] = &[("x-client", b"a")];
    let r = c.get_with(&demo.url("/"), a).await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "ok"));
    assert_eq!(r.header_u64("x-ratelimit-limit"), 2);
    assert_eq!(r.header("ratelimit-policy"), Some(r#""1m";q=2;w=60"#));
    let r = c.get_with(&demo.url("/not-modified"), a).await;
    assert_eq!(r.status, StatusCode::NOT_MODIFIED);
    assert_eq!(
        r.header_u64("x-ratelimit-remaining"),
        1,
        "a 304 is refunded"
    );
    let r = c.get_with(&demo.url("/status/418"), a).await;
    assert_eq!(r.status.as_u16(), 418);
    let r = c.get_with(&demo.url("/"), a).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(r.header_u64("retry-after") > 0);
    let r = c.get_with(&demo.url("/"), &[("x-client", b"b")]).await;
    assert_eq!(r.status, StatusCode::OK, "another key has its own quota");
    let r = c.get(&demo.url("/")).await;
    assert_eq!(
        r.status,
        StatusCode::BAD_REQUEST,
        "a missing key header is the client's error"
    );
    assert!(r.body.contains("x-client"), "{}", r.body);
    assert!(
        demo.stdout_rest.try_recv().is_err(),
        "exactly one line on stdout"
    );
    assert!(demo.terminate().success());
}

#[tokio::test]
async fn demo_with_store_none_is_an_unlimited_baseline() {
    let demo = Running::start(
        "demo",
        &["--listen", "127.0.0.1:0", "--store", "none", "--limit", "1"],
    );
    let c = HttpClient::new();
    for _ in 0..5 {
        let r = c.get(&demo.url("/")).await;
        assert_eq!(r.status, StatusCode::OK);
        assert!(r.header("x-ratelimit-limit").is_none());
    }
    assert!(demo.terminate().success());
}

#[tokio::test]
async fn demo_keys_by_ip_and_global() {
    for key in ["ip", "global"] {
        let demo = Running::start(
            "demo",
            &[
                "--listen",
                "127.0.0.1:0",
                "--limit",
                "1",
                "--window",
                "1h",
                "--key",
                key,
            ],
        );
        let c = HttpClient::new();
        assert_eq!(
            c.get(&demo.url("/")).await.status,
            StatusCode::OK,
            "key {key}"
        );
        assert_eq!(
            c.get(&demo.url("/")).await.status,
            StatusCode::TOO_MANY_REQUESTS,
            "key {key}"
        );
        assert!(demo.terminate().success());
    }
}

#[tokio::test]
async fn demo_settles_a_token_quota_from_the_responses_header_into_debt_and_then_refuses() {
    let demo = Running::start(
        "demo",
        &[
            "--listen",
            "127.0.0.1:0",
            "--token-quota",
            "1000/60s",
            "--headers",
            "ietf",
        ],
    );
    let c = HttpClient::new();
    for n in 0..3 {
        let r = c.get(&demo.url("/tokens/300")).await;
        assert_eq!(r.status, StatusCode::OK, "request {n}");
    }
    // Nothing reserved and nothing said: the state the three settlements left.
    let r = c.get(&demo.url("/")).await;
    let fields = r.header("ratelimit").unwrap_or_default().to_owned();
    assert!(fields.contains(r#""tokens";r=100;"#), "{fields}");
    assert!(
        r.header("ratelimit-policy")
            .is_some_and(|p| p.contains(r#""tokens";q=1000;w=60;qu="tokens""#)),
        "{:?}",
        r.header("ratelimit-policy")
    );
    // 100 left: admitted, and its 300 go 200 into debt.
    let r = c.get(&demo.url("/tokens/300")).await;
    assert_eq!(r.status, StatusCode::OK, "a fourth while tokens are left");
    let fields = r.header("ratelimit").unwrap_or_default().to_owned();
    assert!(fields.contains(r#""tokens";r=0;"#), "{fields}");
    let r = c.get(&demo.url("/tokens/300")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        r.body.contains(r#""violated-policies":["tokens"]"#),
        "{}",
        r.body
    );
    assert!(demo.terminate().success());
}

#[tokio::test]
async fn demo_accepts_sub_second_windows() {
    let demo = Running::start(
        "demo",
        &[
            "--listen",
            "127.0.0.1:0",
            "--limit",
            "5",
            "--window",
            "500ms",
        ],
    );
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let r = HttpClient::new().get(&demo.url("/")).await;
    let reset = r.header_u64("x-ratelimit-reset");
    assert!(
        reset >= before && reset <= before + 3,
        "a 500ms window resets within a second or two: {reset} vs {before}"
    );
    assert!(demo.terminate().success());
}

#[test]
fn demo_rejects_bad_flags_with_a_message_and_a_failure_status() {
    for args in [
        &["--window", "5 parsecs"][..],
        &["--key", "cookie"],
        &["--limit", "0"],
        // Durations whose seconds overflow a u64 (found by fuzzing).
        &["--window", "5124095576030432h"],
        &["--window", "307445734561825861m"],
    ] {
        let out = Command::new(example::example_path("demo"))
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.is_empty(), "{args:?} gave no message");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(
            out.stdout.is_empty(),
            "{args:?} printed to stdout: no `listening on` line"
        );
    }
}

#[tokio::test]
async fn demo_on_redis_serves_rate_limit_status_from_a_replica_without_charging() {
    if !redis_support::require_redis() {
        return;
    }
    let primary = redis_support::RedisServer::start();
    let replica = redis_support::RedisServer::replica_of(&primary);
    replica.wait_for_sync(&primary);
    let (p, r) = (primary.url(), replica.url());
    let demo = Running::start(
        "demo",
        &[
            "--listen",
            "127.0.0.1:0",
            "--store",
            "redis",
            "--redis-url",
            &p,
            "--replica-url",
            &r,
            "--limit",
            "5",
            "--window",
            "1h",
            "--key",
            "header:x-client",
        ],
    );
    let c = HttpClient::new();
    let a: &[(&str, &[u8])] = &[("x-client", b"a")];
    for _ in 0..2 {
        assert_eq!(c.get_with(&demo.url("/"), a).await.status, StatusCode::OK);
    }
    replica.wait_for_sync(&primary);
    for _ in 0..3 {
        let r = c.get_with(&demo.url("/rate_limit"), a).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.header("content-type"), Some("application/json"));
        assert!(
            r.body.starts_with(r#"{"limit":5,"remaining":3,"reset":"#),
            "{}",
            r.body
        );
        assert!(r.body.ends_with(r#","used":2}"#), "{}", r.body);
    }
    // The status reads were not charged.
    let r = c.get_with(&demo.url("/"), a).await;
    assert_eq!(r.header_u64("x-ratelimit-remaining"), 2);
    assert!(demo.terminate().success());
}

#[tokio::test]
async fn demo_runs_the_coordinated_mode_on_one_redis_and_on_shards_and_refuses_it_without_redis() {
    if !redis_support::require_redis() {
        return;
    }
    let redis = redis_support::RedisServer::start();
    let url = redis.url();
    let demo = Running::start(
        "demo",
        &[
            "--listen",
            "127.0.0.1:0",
            "--store",
            "redis",
            "--redis-url",
            &url,
            "--mode",
            "coordinated",
            "--sync-interval",
            "200ms",
            "--limit",
            "50",
            "--window",
            "1s",
        ],
    );
    let r = HttpClient::new().get(&demo.url("/")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header_u64("x-ratelimit-limit"), 50);
    assert!(demo.terminate().success());

    // Two --redis-url: the counters are sharded over both.
    let other = redis_support::RedisServer::start();
    let other_url = other.url();
    let demo = Running::start(
        "demo",
        &[
            "--listen",
            "127.0.0.1:0",
            "--store",
            "redis",
            "--redis-url",
            &url,
            "--redis-url",
            &other_url,
            "--mode",
            "coordinated",
        ],
    );
    let r = HttpClient::new().get(&demo.url("/")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(demo.terminate().success());

    let out = Command::new(example::example_path("demo"))
        .args(["--listen", "127.0.0.1:0", "--mode", "coordinated"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--store redis"));
}

/// `--adaptive` sheds by `x-priority` with a capacity found from latency: it
/// starts at 20 in flight, so at most 14 `low` requests (70 %) run at once;
/// the rest are shed with a `temporary-reduced-capacity` 503, and `low` is
/// served again once the flood is over.
#[tokio::test]
async fn demo_with_an_adaptive_capacity_sheds_a_flood_of_low_priority_requests() {
    let demo = Running::start(
        "demo",
        &["--listen", "127.0.0.1:0", "--store", "none", "--adaptive"],
    );
    let c = HttpClient::new();
    // Held 2 s: the whole flood arrives while the first are still running.
    let url = demo.url("/slow/2000");
    let flood: Vec<_> = (0..30)
        .map(|_| {
            let (c, url) = (c.clone(), url.clone());
            tokio::spawn(async move { c.get_with(&url, &[("x-priority", b"low")]).await })
        })
        .collect();
    let (mut ok, mut shed) = (0, 0);
    for r in flood {
        let r = r.await.unwrap();
        match r.status {
            StatusCode::OK => ok += 1,
            StatusCode::SERVICE_UNAVAILABLE => {
                shed += 1;
                assert!(r.header("retry-after").is_some());
                assert!(r.body.contains("temporary-reduced-capacity"), "{}", r.body);
            }
            other => panic!("unexpected {other}"),
        }
    }
    assert!((1..=14).contains(&ok), "{ok} low requests ran at once");
    assert_eq!(ok + shed, 30);
    let r = c
        .get_with(&demo.url("/slow/1"), &[("x-priority", b"low")])
        .await;
    assert_eq!(r.status, StatusCode::OK, "served again after the flood");
}
