//! The demo server's algorithm flags (`--algorithm`, `--burst`, repeatable
//! `--quota`), exercised on the built example as a black box.

use crate::support::example;
use crate::support::http as http_support;

use example::Running;
use http::StatusCode;
use http_support::HttpClient;
use std::process::Command;

const CLIENT: &[(&str, &[u8])] = &[("x-client", b"a")];

fn demo(extra: &[&str]) -> Running {
    let mut args = vec![
        "--listen",
        "127.0.0.1:0",
        "--key",
        "header:x-client",
        "--headers",
        "both",
    ];
    args.extend_from_slice(extra);
    Running::start("demo", &args)
}

#[tokio::test]
async fn every_algorithm_admits_its_limit_and_then_rejects_with_a_retry_after() {
    for algorithm in [
        "fixed-window",
        "token-bucket",
        "sliding-window",
        "gcra",
        "sliding-log",
    ] {
        let demo = demo(&["--algorithm", algorithm, "--limit", "2", "--window", "1h"]);
        let c = HttpClient::new();
        for i in 0..2 {
            let r = c.get_with(&demo.url("/"), CLIENT).await;
            assert_eq!(r.status, StatusCode::OK, "{algorithm} request {i}");
            assert_eq!(r.header_u64("x-ratelimit-limit"), 2, "{algorithm}");
        }
        let r = c.get_with(&demo.url("/"), CLIENT).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{algorithm}");
        assert_eq!(r.header_u64("x-ratelimit-remaining"), 0, "{algorithm}");
        let wait = r.header_u64("retry-after");
        assert!(
            (1..=7_200).contains(&wait),
            "{algorithm}: retry-after {wait}"
        );
        assert!(demo.terminate().success());
    }
}

#[tokio::test]
async fn burst_lets_a_token_bucket_admit_more_than_its_rate_at_once() {
    let demo = demo(&[
        "--algorithm",
        "token-bucket",
        "--burst",
        "3",
        "--quota",
        "1/1h",
    ]);
    let c = HttpClient::new();
    for i in 0..3 {
        let r = c.get_with(&demo.url("/"), CLIENT).await;
        assert_eq!(r.status, StatusCode::OK, "request {i} fits the burst");
        assert_eq!(r.header_u64("x-ratelimit-remaining"), 2 - i);
    }
    let r = c.get_with(&demo.url("/"), CLIENT).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // One token per hour refills.
    let wait = r.header_u64("retry-after");
    assert!((3_590..=3_600).contains(&wait), "retry-after {wait}");
    assert!(demo.terminate().success());
}

#[tokio::test]
async fn repeated_quota_flags_are_charged_together_and_a_rejection_spends_none() {
    let demo = demo(&[
        "--algorithm",
        "sliding-log",
        "--quota",
        "2/1m",
        "--quota",
        "3/1h",
    ]);
    let c = HttpClient::new();
    let r = c.get_with(&demo.url("/"), CLIENT).await;
    assert_eq!(
        r.header("ratelimit-policy"),
        Some(r#""1m";q=2;w=60, "1h";q=3;w=3600"#)
    );
    assert_eq!(
        c.get_with(&demo.url("/"), CLIENT).await.status,
        StatusCode::OK
    );
    for _ in 0..3 {
        let r = c.get_with(&demo.url("/"), CLIENT).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        let rl = r.header("ratelimit").unwrap();
        assert!(rl.starts_with(r#""1m";r=0;"#), "{rl}");
        assert!(
            rl.contains(r#""1h";r=1;"#),
            "the hourly quota keeps its unit: {rl}"
        );
    }
    assert!(demo.terminate().success());
}

#[test]
fn demo_rejects_bad_algorithm_flags_with_a_message() {
    for args in [
        &["--algorithm", "leaky-bucket"][..],
        &["--quota", "10"],
        &["--quota", "ten/1s"],
        &["--quota", "10/1parsec"],
        &["--algorithm", "fixed-window", "--burst", "5"],
        &["--algorithm", "token-bucket", "--burst", "0"],
        &["--algorithm", "sliding-log", "--quota", "20000/1h"],
        &["--quota", "10/1s", "--quota", "20/1s"],
    ] {
        let out = Command::new(example::example_path("demo"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.trim().is_empty(), "{args:?} gave no message");
        assert!(out.stdout.is_empty(), "{args:?} printed to stdout");
    }
}
