//! The demo server's contract, exercised on the built example as a black box.

use crate::support::admin;
use crate::support::example;
use crate::support::http as http_support;
use crate::support::redis as redis_support;

use admin::Admin;
use example::Running;
use http::{Method, StatusCode};
use http_support::{HttpClient, Reply};
use std::process::Command;
use std::time::Duration;

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
    redis_support::require_redis();
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
    redis_support::require_redis();
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

// The admin interface: a token and a `Host` check in front of every route.

/// A demo on the memory store with the admin interface on a free port,
/// `args` and `env` added.
fn admin_demo(args: &[&str], env: &[(&str, &str)]) -> Running {
    let mut all = vec![
        "--listen",
        "127.0.0.1:0",
        "--limit",
        "100",
        "--window",
        "1h",
        "--key",
        "header:x-client",
        "--admin-listen",
        "127.0.0.1:0",
    ];
    all.extend_from_slice(args);
    Running::start_with_env("demo", &all, env)
}

/// Every admin change a caller could try, and the reads.
const ADMIN_REQUESTS: [(Method, &str, &str); 8] = [
    (Method::PUT, "/limits/acme", "1000/1s"),
    (Method::PUT, "/limits/mallory", "1000/1s"),
    (Method::DELETE, "/limits/acme", ""),
    (Method::PUT, "/shadow", "1000/1s"),
    (Method::DELETE, "/shadow", ""),
    (Method::POST, "/shadow/promote", ""),
    (Method::GET, "/limits", ""),
    (Method::GET, "/no/such/route", ""),
];

/// The `limit` `GET /rate_limit` reports for `client` (not charged).
async fn enforced_limit(demo: &Running, client: &str) -> String {
    let r = HttpClient::new()
        .get_with(&demo.url("/rate_limit"), &[("x-client", client.as_bytes())])
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    r.body.split(',').next().unwrap_or_default().to_owned()
}

fn no_cors_headers(r: &Reply) -> bool {
    r.headers
        .keys()
        .all(|k| !k.as_str().starts_with("access-control-"))
}

#[tokio::test]
async fn demo_admin_refuses_every_route_without_the_token_and_changes_nothing() {
    let demo = admin_demo(&[], &[]);
    let admin = Admin::printed(&demo);
    let token = admin.token.clone();
    assert!(
        token.len() >= 32 && token.chars().all(|c| c.is_ascii_hexdigit()),
        "a generated token carries 128 bits or more, in hex: {token:?}"
    );
    // Something to protect: an override and a policy in shadow.
    let r = admin.send(Method::PUT, "/limits/acme", "5/1h").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let r = admin.send(Method::PUT, "/shadow", "50/1h").await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    let before = admin.get("/limits").await.body;
    assert_eq!(
        before,
        r#"{"default":null,"shadow":"50/1h","overrides":{"acme":"5/1h"}}"#
    );

    // The last character changed: as long as the token, and wrong.
    let last = if token.ends_with('0') { "1" } else { "0" };
    let same_length = format!("{}{last}", &token[..token.len() - 1]);
    let refused = [
        None,
        Some(format!("Bearer {same_length}")),
        Some(format!("Bearer {}", &token[..token.len() - 1])),
        Some(format!("Bearer {token}0")),
        Some("Bearer ".to_owned()),
        Some(format!("Basic {token}")),
        Some(token.clone()),
    ];
    let c = HttpClient::new();
    for auth in &refused {
        let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", &a[..])).collect();
        for (method, path, body) in ADMIN_REQUESTS {
            let r = c
                .send_with(method.clone(), &admin.url(path), &headers, body)
                .await;
            let what = format!("{method} {path} with {auth:?}");
            assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{what}: {}", r.body);
            assert!(
                r.header("www-authenticate")
                    .is_some_and(|v| v.starts_with("Bearer")),
                "{what}: {:?}",
                r.headers
            );
            assert_eq!(r.header("content-type"), Some("application/problem+json"));
            assert!(r.body.contains(r#""status":401"#), "{what}: {}", r.body);
            assert!(!r.body.contains(&token), "{what}: the token leaked");
        }
    }
    assert_eq!(admin.get("/limits").await.body, before, "nothing changed");
    assert_eq!(enforced_limit(&demo, "acme").await, r#"{"limit":5"#);
    assert_eq!(enforced_limit(&demo, "mallory").await, r#"{"limit":100"#);

    // With the token (the scheme in any case), everything works as before.
    let auth = format!("bearer {token}");
    let r = c
        .send_with(
            Method::POST,
            &admin.url("/shadow/promote"),
            &[("authorization", &auth)],
            "",
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    let r = admin.send(Method::DELETE, "/limits/acme", "").await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    assert_eq!(
        admin.get("/limits").await.body,
        r#"{"default":"50/1h","shadow":null,"overrides":{}}"#
    );
    assert_eq!(enforced_limit(&demo, "acme").await, r#"{"limit":50"#);
    assert!(demo.terminate().success());
}

/// DNS rebinding: a page on `evil.example`, whose name now resolves to
/// 127.0.0.1, reaches the interface as same-origin, but with its own name in
/// `Host`. Refused even with the right token, so the Host check holds alone.
#[tokio::test]
async fn demo_admin_refuses_a_host_it_does_not_serve_and_changes_nothing() {
    let token = "correct-horse-battery-staple";
    let demo = admin_demo(
        &[
            "--admin-token",
            token,
            "--admin-host",
            "admin.internal",
            "--admin-host",
            "ops.example:8443",
        ],
        &[],
    );
    let admin = Admin::given(&demo, token);
    assert!(
        demo.stdout_rest
            .recv_timeout(Duration::from_millis(300))
            .is_err(),
        "a token given is not printed"
    );
    let port = admin.addr.port();
    let r = admin.send(Method::PUT, "/limits/acme", "5/1h").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let before = admin.get("/limits").await.body;

    let c = HttpClient::new();
    let auth = admin.bearer();
    let send = |host: String, (method, path, body): (Method, &'static str, &'static str)| {
        let (c, url, auth) = (c.clone(), admin.url(path), auth.clone());
        async move {
            c.send_with(
                method,
                &url,
                &[("host", &host), ("authorization", &auth)],
                body,
            )
            .await
        }
    };
    let other_port = if port == 1 { 2 } else { port - 1 };
    for host in [
        format!("evil.example:{port}"),
        "evil.example".to_owned(),
        format!("admin.internal.evil.example:{port}"),
        format!("localhost:{other_port}"),
        format!("127.0.0.2:{port}"),
        format!("ops.example:{port}"),
        format!("user@localhost:{port}"),
    ] {
        for request in ADMIN_REQUESTS {
            let what = format!("{} {} with Host {host}", request.0, request.1);
            let r = send(host.clone(), request).await;
            assert_eq!(
                r.status,
                StatusCode::MISDIRECTED_REQUEST,
                "{what}: {}",
                r.body
            );
            assert_eq!(r.header("content-type"), Some("application/problem+json"));
        }
    }
    assert_eq!(admin.get("/limits").await.body, before, "nothing changed");
    assert_eq!(enforced_limit(&demo, "acme").await, r#"{"limit":5"#);

    // Its own names, any case; `--admin-host NAME` on any port,
    // `NAME:PORT` on that one.
    for host in [
        format!("{}", admin.addr),
        format!("localhost:{port}"),
        format!("LocalHost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
        format!("admin.internal:{port}"),
        "ADMIN.internal:1234".to_owned(),
        "admin.internal".to_owned(),
        "ops.example:8443".to_owned(),
    ] {
        let r = send(host.clone(), (Method::GET, "/limits", "")).await;
        assert_eq!(
            (r.status, &r.body),
            (StatusCode::OK, &before),
            "Host {host}"
        );
    }
    let r = send(
        "admin.internal".to_owned(),
        (Method::DELETE, "/limits/acme", ""),
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    assert!(demo.terminate().success());
}

/// A page on another site can send a "simple" request without asking: a
/// `text/plain` or form `POST`, with no `Authorization`. It is refused, and a
/// preflight (which any other request needs) is never answered with CORS
/// headers, so a browser sends nothing further.
#[tokio::test]
async fn demo_admin_refuses_a_cross_site_form_post_and_answers_no_preflight() {
    let demo = admin_demo(&[], &[]);
    let admin = Admin::printed(&demo);
    let r = admin.send(Method::PUT, "/shadow", "50/1h").await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    let before = admin.get("/limits").await.body;

    let c = HttpClient::new();
    let origin = ("origin", "http://evil.example");
    for content_type in ["text/plain", "application/x-www-form-urlencoded"] {
        let r = c
            .send_with(
                Method::POST,
                &admin.url("/shadow/promote"),
                &[origin, ("content-type", content_type)],
                "promote=1",
            )
            .await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{content_type}");
        assert!(no_cors_headers(&r), "{:?}", r.headers);
    }
    assert_eq!(admin.get("/limits").await.body, before, "still in shadow");

    for (path, method) in [
        ("/shadow/promote", "POST"),
        ("/limits/acme", "PUT"),
        ("/limits", "GET"),
    ] {
        let preflight = [
            origin,
            ("access-control-request-method", method),
            (
                "access-control-request-headers",
                "authorization, content-type",
            ),
        ];
        let r = c
            .send_with(Method::OPTIONS, &admin.url(path), &preflight, "")
            .await;
        assert!(!r.status.is_success(), "preflight for {method} {path}");
        assert!(no_cors_headers(&r), "{method} {path}: {:?}", r.headers);
    }

    // With the token, from anywhere: no CORS headers either.
    let auth = admin.bearer();
    for (method, path, body) in [
        (Method::OPTIONS, "/limits/acme", ""),
        (Method::GET, "/limits", ""),
        (Method::PUT, "/limits/acme", "5/1h"),
    ] {
        let r = c
            .send_with(
                method.clone(),
                &admin.url(path),
                &[origin, ("authorization", &auth)],
                body,
            )
            .await;
        assert_ne!(r.status, StatusCode::UNAUTHORIZED, "{method} {path}");
        assert!(no_cors_headers(&r), "{method} {path}: {:?}", r.headers);
    }
    assert!(demo.terminate().success());
}

#[tokio::test]
async fn demo_admin_takes_its_token_from_the_environment_and_the_flag_wins() {
    let env = [("TRL_ADMIN_TOKEN", "from-the-environment")];
    let demo = admin_demo(&[], &env);
    let admin = Admin::given(&demo, "from-the-environment");
    assert!(
        demo.stdout_rest
            .recv_timeout(Duration::from_millis(300))
            .is_err(),
        "a token given is not printed"
    );
    assert_eq!(admin.get("/limits").await.status, StatusCode::OK);
    assert!(demo.terminate().success());

    let demo = admin_demo(&["--admin-token", "from-the-flag"], &env);
    let flag = Admin::given(&demo, "from-the-flag");
    let from_env = Admin::at(flag.addr, "from-the-environment");
    assert_eq!(flag.get("/limits").await.status, StatusCode::OK);
    let r = from_env.send(Method::PUT, "/limits/acme", "5/1h").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(demo.terminate().success());
}

#[test]
fn demo_admin_refuses_a_token_it_cannot_check_without_repeating_it() {
    // Starting fails, with a message that does not show the token.
    let refused = |args: &[&str], env: Option<&str>| {
        let mut demo = Command::new(example::example_path("demo"));
        demo.args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env_remove("TRL_ADMIN_TOKEN");
        if let Some(token) = env {
            demo.env("TRL_ADMIN_TOKEN", token);
        }
        let out = demo.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} {env:?} was accepted");
        assert!(!err.is_empty(), "{args:?} {env:?} gave no message");
        assert!(!err.contains("SECRET"), "{args:?} {env:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?} {env:?} printed to stdout");
    };
    let served = ["--admin-listen", "127.0.0.1:0"];
    refused(
        &[&served[..], &["--admin-token", "not a SECRET"]].concat(),
        None,
    );
    refused(&served, Some("SECRET\u{e9}"));
    refused(&served, Some(""));
    // A token for an interface that is not served is a mistake.
    refused(&["--admin-token", "SECRET"], None);
}
