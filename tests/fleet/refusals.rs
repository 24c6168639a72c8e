//! Waiting and the penalty box across a fleet: demo instances, built as
//! they ship, sharing one real `redis-server`, driven over TCP in real time.

use crate::support::example;
use crate::support::http as http_support;
use crate::support::redis as redis_support;

use example::Running;
use http::StatusCode;
use http_support::HttpClient;
use redis_support::{require_redis, RedisServer};
use std::time::{Duration, Instant};

/// `n` demo instances on `server`, keyed by `x-client`, with `args`.
fn fleet(server: &RedisServer, n: usize, args: &[&str]) -> Vec<Running> {
    let url = server.url();
    (0..n)
        .map(|_| {
            let mut all = vec![
                "--listen",
                "127.0.0.1:0",
                "--store",
                "redis",
                "--redis-url",
                &url,
                "--key",
                "header:x-client",
                // Debug builds on a small machine, started together: the
                // first calls may take longer than the default budget.
                "--store-timeout",
                "2s",
            ];
            all.extend_from_slice(args);
            Running::start("demo", &all)
        })
        .collect()
}

/// `count` concurrent `GET /now` for one client, spread over the fleet in
/// turn: each answer's status, its body (the time its handler ran, Unix ms,
/// when it ran) and how long it took.
async fn burst(fleet: &[Running], count: usize) -> Vec<(StatusCode, Option<u64>, Duration)> {
    let client = HttpClient::new();
    let sent = Instant::now();
    let calls: Vec<_> = (0..count)
        .map(|i| {
            let (client, url) = (client.clone(), fleet[i % fleet.len()].url("/now"));
            tokio::spawn(async move {
                let r = client.get_with(&url, &[("x-client", b"one")]).await;
                let ran = (r.status == StatusCode::OK).then(|| r.body.parse().unwrap());
                (r.status, ran, sent.elapsed())
            })
        })
        .collect();
    let mut out = Vec::new();
    for c in calls {
        out.push(c.await.unwrap());
    }
    out
}

#[tokio::test]
async fn forty_requests_for_one_key_over_four_instances_all_pass_one_turn_each_200_ms_apart() {
    require_redis();
    let server = RedisServer::start();
    let fleet = fleet(
        &server,
        4,
        &[
            "--algorithm",
            "gcra",
            "--limit",
            "5",
            "--window",
            "1s",
            "--wait-up-to",
            "10s",
        ],
    );
    let answers = burst(&fleet, 40).await;
    assert!(
        answers.iter().all(|(s, _, _)| *s == StatusCode::OK),
        "{answers:?}"
    );
    let slowest = answers.iter().map(|(_, _, t)| *t).max().unwrap();
    assert!(
        slowest < Duration::from_millis(8_500),
        "the last took {slowest:?}"
    );
    let mut ran: Vec<u64> = answers.iter().map(|(_, t, _)| t.unwrap()).collect();
    ran.sort_unstable();
    // After the burst of five, one turn every 200 ms, whichever instance:
    // never two in one turn, never more than five in a second. (Handlers
    // start at their turn or a little after, never before: a window a few
    // ms short of a second leaves room for that delay only.)
    let after = &ran[5..];
    for pair in after.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(gap >= 150, "two turns {gap} ms apart: {after:?}");
    }
    for (i, &t) in after.iter().enumerate() {
        let within = after[i..].iter().take_while(|&&u| u < t + 960).count();
        assert!(
            within <= 5,
            "{within} handlers within a second from {t}: {after:?}"
        );
    }
    for demo in fleet {
        assert!(demo.terminate().success());
    }
}

#[tokio::test]
async fn a_turn_further_away_than_the_wait_is_refused_at_once() {
    require_redis();
    let server = RedisServer::start();
    let fleet = fleet(
        &server,
        4,
        &[
            "--algorithm",
            "gcra",
            "--limit",
            "5",
            "--window",
            "1s",
            "--wait-up-to",
            "300ms",
        ],
    );
    let answers = burst(&fleet, 40).await;
    // Five at once, then the turns within 300 ms of each request's
    // arrival: the one at 200 ms (and the one at 400 ms, for a request
    // that arrived 100 ms late).
    let admitted = answers
        .iter()
        .filter(|(s, _, _)| *s == StatusCode::OK)
        .count();
    assert!(
        (6..=7).contains(&admitted),
        "{admitted} admitted: {answers:?}"
    );
    for (status, _, took) in &answers {
        match *status {
            StatusCode::TOO_MANY_REQUESTS => {
                assert!(*took < Duration::from_millis(50), "a refusal took {took:?}")
            }
            StatusCode::OK => {
                assert!(
                    *took < Duration::from_millis(450),
                    "an admission took {took:?}"
                )
            }
            other => panic!("unexpected {other}"),
        }
    }
    for demo in fleet {
        assert!(demo.terminate().success());
    }
}

#[tokio::test]
async fn a_client_refused_three_times_through_two_instances_is_blocked_on_both_past_its_window() {
    require_redis();
    let server = RedisServer::start();
    // Real seconds, kept short: 5 per 2 s; blocked 4 s after 3 refusals.
    let fleet = fleet(
        &server,
        2,
        &[
            "--limit",
            "5",
            "--window",
            "2s",
            "--penalty-after",
            "3",
            "--penalty-for",
            "4s",
        ],
    );
    let client = HttpClient::new();
    let get = |i: usize| {
        let (client, url) = (client.clone(), fleet[i % 2].url("/"));
        async move { client.get_with(&url, &[("x-client", b"mallory")]).await }
    };
    let started = Instant::now();
    let mut statuses = Vec::new();
    let mut third = None;
    for i in 0..20 {
        let r = get(i).await;
        let refusals = statuses.iter().filter(|s| **s == 429).count();
        if r.status == StatusCode::TOO_MANY_REQUESTS && refusals == 2 {
            third = Some(Instant::now());
        }
        statuses.push(r.status.as_u16());
    }
    let third = third.expect("three refusals");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "twenty requests took {:?}",
        started.elapsed()
    );
    assert_eq!(&statuses[..5], [200; 5], "{statuses:?}");
    assert!(statuses[5..].iter().all(|s| *s == 429), "{statuses:?}");
    // Past the window (2 s), still blocked on both, and told so.
    tokio::time::sleep_until((third + Duration::from_millis(2_500)).into()).await;
    for i in 0..2 {
        let r = get(i).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(r.body.contains("blocked"), "{}", r.body);
    }
    // Admitted again once the block (4 s from the third refusal) is over.
    tokio::time::sleep_until((third + Duration::from_millis(4_300)).into()).await;
    for i in 0..2 {
        assert_eq!(get(i).await.status, StatusCode::OK);
    }
    for demo in fleet {
        assert!(demo.terminate().success());
    }
}
