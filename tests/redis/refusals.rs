//! Waiting for a turn and the penalty box, through layers in this process on
//! real `redis-server` processes: turns given back by clients that go away,
//! a bounded number of waiters, waiters answered when the layer closes them,
//! and a key blocked through one instance refused by every instance, at no
//! store call while it is blocked.

use crate::support::logs;
use crate::support::recorder;
use crate::support::redis as redis_support;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use metrics_util::debugging::DebugValue;
use redis_support::{assert_every_key_has_a_ttl, require_redis, RedisServer};
use std::convert::Infallible;
use std::time::{Duration, Instant};
use tower::{service_fn, Layer, ServiceExt};
use tower_ratelimit::clock::{Clock, ManualClock};
use tower_ratelimit::key::Header;
use tower_ratelimit::rate::{Penalty, Status, Wait};
use tower_ratelimit::store::RedisStore;
use tower_ratelimit::{Algorithm, Policy, Quota, RateLimitLayer};

/// GCRA, `limit` per second (burst `limit`).
fn gcra(limit: u64) -> Quota {
    Quota::new(limit, Duration::from_secs(1))
        .unwrap()
        .with_algorithm(Algorithm::Gcra)
        .unwrap()
}

/// An instance on `server` keyed by `x-client`, on `clock`.
fn instance(
    server: &RedisServer,
    name: &str,
    policy: Policy,
    clock: &ManualClock,
) -> RateLimitLayer {
    RateLimitLayer::builder()
        .name(name)
        .quota(policy)
        .key(Header::try_new("x-client").unwrap())
        .store(RedisStore::new(server.url()).unwrap())
        .store_timeout(Duration::from_secs(2))
        .clock(clock.clone())
        .status_extension(true)
        .build()
        .unwrap()
}

fn request(client: &str) -> Request<Body> {
    Request::get("/")
        .header("x-client", client)
        .body(Body::empty())
        .unwrap()
}

/// One request of `client` through `layer`, answered by a handler that
/// says how long its request waited for its turn (`x-waited-ms`).
async fn send(layer: RateLimitLayer, client: &str) -> Response<Body> {
    let handler = service_fn(|req: Request<Body>| async move {
        let waited = req
            .extensions()
            .get::<Status>()
            .map_or(0, |s| s.decision.wait_ms());
        Ok::<_, Infallible>(
            Response::builder()
                .header("x-waited-ms", waited)
                .body(Body::empty())
                .unwrap(),
        )
    });
    let res = layer.layer(handler).oneshot(request(client)).await.unwrap();
    res.map(Body::new)
}

fn waited(res: &Response<Body>) -> u64 {
    res.headers()["x-waited-ms"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// Whether the store comes to hold `want` as `client`'s full-again time
/// (what other tasks book or give back), within 5 s.
async fn comes_to(layer: &RateLimitLayer, client: &str, want: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if full_again_at(layer, client).await == want {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    false
}

/// The GCRA quota's state as the store holds it for `client`: when it is
/// full again (its theoretical arrival time), read without charging.
async fn full_again_at(layer: &RateLimitLayer, client: &str) -> u64 {
    let (parts, _) = request(client).into_parts();
    let status = layer.status(&parts).await.unwrap().unwrap();
    status.decision.statuses()[0].reset_ms
}

#[tokio::test]
async fn ten_waiting_clients_that_go_away_give_their_turns_back_and_the_next_waits_as_if_they_never_came(
) {
    require_redis();
    let server = RedisServer::start();
    let clock = ManualClock::new(server.time_ms());
    let policy = Policy::new(gcra(5))
        .wait(Wait::up_to(Duration::from_secs(10)))
        .unwrap();
    let layer = instance(&server, "turns", policy, &clock);
    // The burst goes at once.
    for _ in 0..5 {
        let res = send(layer.clone(), "a").await;
        assert_eq!((res.status(), waited(&res)), (StatusCode::OK, 0));
    }
    let before = full_again_at(&layer, "a").await;
    assert_eq!(before, clock.now_ms() + 1_000, "five turns of 200 ms taken");
    // Ten more are booked, one turn (200 ms) apart, and wait.
    let waiting: Vec<_> = (0..10)
        .map(|_| tokio::spawn(send(layer.clone(), "a")))
        .collect();
    assert!(
        comes_to(&layer, "a", before + 2_000).await,
        "ten turns booked"
    );
    // They go away, in an order no store could foresee: odd ones first.
    for (_, h) in waiting.iter().enumerate().filter(|(i, _)| i % 2 == 1) {
        h.abort();
    }
    for h in waiting.iter().rev() {
        h.abort();
    }
    for h in waiting {
        assert!(h.await.unwrap_err().is_cancelled());
    }
    // Every turn comes back: the store holds what it held before them.
    assert!(
        comes_to(&layer, "a", before).await,
        "the turns were given back"
    );
    // The next request waits one turn, as if the ten had never come.
    let res = send(layer.clone(), "a").await;
    assert_eq!((res.status(), waited(&res)), (StatusCode::OK, 200));
    assert_every_key_has_a_ttl(&server);
}

#[tokio::test]
async fn with_room_for_ten_waiters_fifty_requests_are_five_at_once_ten_waiting_and_thirty_five_refused_at_once(
) {
    require_redis();
    let server = RedisServer::start();
    let clock = ManualClock::new(server.time_ms());
    let policy = Policy::new(gcra(5))
        .wait(Wait::up_to(Duration::from_secs(10)).max_waiting(10))
        .unwrap();
    let layer = instance(&server, "bounded", policy, &clock);
    let sent = Instant::now();
    let answers: Vec<_> = (0..50)
        .map(|_| {
            let layer = layer.clone();
            tokio::spawn(async move {
                let res = send(layer, "a").await;
                (
                    res.status(),
                    res.headers()
                        .get("x-waited-ms")
                        .is_some()
                        .then(|| waited(&res)),
                    sent.elapsed(),
                )
            })
        })
        .collect();
    let (mut at_once, mut waited_turns, mut refused) = (0, Vec::new(), Vec::new());
    for a in answers {
        match a.await.unwrap() {
            (StatusCode::OK, Some(0), _) => at_once += 1,
            (StatusCode::OK, Some(w), _) => waited_turns.push(w),
            (StatusCode::TOO_MANY_REQUESTS, None, took) => refused.push(took),
            other => panic!("unexpected answer {other:?}"),
        }
    }
    waited_turns.sort_unstable();
    assert_eq!(at_once, 5);
    assert_eq!(
        waited_turns,
        (1..=10).map(|i| i * 200).collect::<Vec<u64>>(),
        "ten waiters, one turn each"
    );
    assert_eq!(refused.len(), 35);
    // Refused at once: before the first waiter's turn came.
    let slowest = refused.iter().max().unwrap();
    assert!(
        *slowest < Duration::from_millis(200),
        "a refusal took {slowest:?}"
    );
    // Turns booked for requests that found no seat went back: the store
    // holds the burst and the ten waiters' turns, no more.
    assert!(
        comes_to(&layer, "a", clock.now_ms() + 3_000).await,
        "the refused requests' turns were given back"
    );
}

#[tokio::test]
async fn closing_the_waiters_answers_them_at_once_gives_their_turns_back_and_lets_none_wait_after()
{
    require_redis();
    let server = RedisServer::start();
    let clock = ManualClock::new(server.time_ms());
    let one_a_second = Quota::new(1, Duration::from_secs(1))
        .unwrap()
        .with_algorithm(Algorithm::Gcra)
        .unwrap();
    let policy = Policy::new(one_a_second)
        .wait(Wait::up_to(Duration::from_secs(30)))
        .unwrap();
    let layer = instance(&server, "closing", policy, &clock);
    assert_eq!(send(layer.clone(), "a").await.status(), StatusCode::OK);
    let before = full_again_at(&layer, "a").await;
    let waiting: Vec<_> = (0..3)
        .map(|_| tokio::spawn(send(layer.clone(), "a")))
        .collect();
    assert!(
        comes_to(&layer, "a", before + 3_000).await,
        "three turns booked, 1 s apart"
    );
    let closed = Instant::now();
    layer.close_waiters();
    for w in waiting {
        let res = w.await.unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    assert!(
        closed.elapsed() < Duration::from_secs(1),
        "answered at once"
    );
    assert!(
        comes_to(&layer, "a", before).await,
        "their turns were given back"
    );
    // From now on a request that does not fit is refused, never held.
    assert_eq!(
        send(layer.clone(), "a").await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// Five requests per 10 s; three refusals within that window block the key
/// for 30 s.
fn login() -> Policy {
    Policy::new(Quota::new(5, Duration::from_secs(10)).unwrap())
        .penalty(Penalty::after(3).block_for(Duration::from_secs(30)))
        .unwrap()
}

#[tokio::test]
async fn a_client_blocked_through_one_instance_is_refused_by_both_past_its_window_until_the_block_ends(
) {
    require_redis();
    recorder::install();
    let (logs, _logging) = logs::capture();
    let server = RedisServer::start();
    let clock = ManualClock::new(server.time_ms());
    let instances = [
        instance(&server, "login", login(), &clock),
        instance(&server, "login", login(), &clock),
    ];
    // Twenty requests within the first second, through both instances.
    let mut answers = Vec::new();
    for i in 0..20 {
        let res = send(instances[i % 2].clone(), "mallory").await;
        answers.push((res.status(), res.headers().get("retry-after").cloned()));
        clock.advance(Duration::from_millis(50));
    }
    let statuses: Vec<_> = answers.iter().map(|(s, _)| s.as_u16()).collect();
    assert_eq!(&statuses[..5], [200; 5], "{statuses:?}");
    assert!(statuses[5..].iter().all(|s| *s == 429), "{statuses:?}");
    // The third refusal (request 8, at 350 ms) started a block of 30 s.
    let blocked_at = 7 * 50;
    let (_, retry) = &answers[7];
    assert_eq!(retry.as_ref().unwrap(), "30");
    // 15 s later the window has reset, but the key is still blocked, on both.
    clock.advance(Duration::from_millis(15_000 - 1_000));
    for layer in &instances {
        let (parts, _) = request("mallory").into_parts();
        let res = send(layer.clone(), "mallory").await;
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        let body = axum::body::to_bytes(res.into_body(), 4096).await.unwrap();
        let body = String::from_utf8_lossy(&body);
        assert!(body.contains("blocked"), "{body}");
        let status = layer.status(&parts).await.unwrap().unwrap();
        assert!(
            status.decision.blocked_until_ms().is_some(),
            "the state shows the block"
        );
    }
    // Its state in Redis lives until the block ends (15.35 s from now),
    // though the quota's own window reset long ago: Redis would otherwise
    // forget the block. A second of slack for the test's own real time.
    let keys: Vec<String> = server.query(&["KEYS", "*"]);
    assert!(!keys.is_empty());
    for key in &keys {
        let ttl: i64 = server.query(&["PTTL", key.as_str()]);
        assert!(
            ttl >= 15_350 - 1_000,
            "{key} expires in {ttl} ms, before the block ends in 15350 ms"
        );
    }
    // The block ends 30 s after the third refusal: admitted again, on both.
    let start = clock.now_ms() - 15_000;
    clock.advance(Duration::from_millis(
        start + blocked_at + 30_000 - clock.now_ms(),
    ));
    for layer in &instances {
        assert_eq!(
            send(layer.clone(), "mallory").await.status(),
            StatusCode::OK
        );
    }
    // One block, seen by the instance that made it; the log names the
    // limiter and never the client.
    let series = recorder::take("login");
    let count = |name: &str| {
        series
            .iter()
            .filter(|(k, _)| k.key().name() == name)
            .map(|(_, v)| match v {
                DebugValue::Counter(n) => *n,
                _ => 0,
            })
            .sum::<u64>()
    };
    assert_eq!(count("ratelimit_penalty_blocks_total"), 1);
    assert!(count("ratelimit_penalty_blocked_total") >= 12);
    let text = logs.text();
    assert!(
        text.contains("penalty box") && text.contains("limiter=login"),
        "{text}"
    );
    assert!(!text.contains("mallory"), "the key is in the log: {text}");
    assert_every_key_has_a_ttl(&server);
}

#[tokio::test]
async fn a_blocked_key_costs_each_instance_at_most_one_store_call_while_it_is_blocked() {
    require_redis();
    let server = RedisServer::start();
    let clock = ManualClock::new(server.time_ms());
    let instances = [
        instance(&server, "cheap", login(), &clock),
        instance(&server, "cheap", login(), &clock),
    ];
    // Blocked through the first instance: 5 admitted, 3 refused.
    for _ in 0..8 {
        send(instances[0].clone(), "mallory").await;
    }
    server.config_resetstat();
    for _ in 0..50 {
        for layer in &instances {
            assert_eq!(
                send(layer.clone(), "mallory").await.status(),
                StatusCode::TOO_MANY_REQUESTS
            );
        }
        clock.advance(Duration::from_millis(100));
    }
    let calls = server.command_calls("evalsha");
    assert!(
        calls <= 2,
        "{calls} store calls for 100 blocked requests on two instances"
    );
}

#[cfg(feature = "coordinated")]
#[test]
fn the_coordinated_mode_refuses_a_policy_that_waits_or_keeps_a_penalty_box_when_the_layer_is_built()
{
    use tower_ratelimit::store::Coordinated;
    use tower_ratelimit::ConfigErrorKind;
    require_redis();
    let server = RedisServer::start();
    let waits = Policy::new(gcra(5))
        .wait(Wait::up_to(Duration::from_secs(1)))
        .unwrap();
    for (policy, why) in [(waits, "waits"), (login(), "penalty box")] {
        let coordinated = Coordinated::builder(RedisStore::new(server.url()).unwrap())
            .build()
            .unwrap();
        let err = RateLimitLayer::builder()
            .quota(policy.clone())
            .store(coordinated)
            .build()
            .unwrap_err();
        assert_eq!(err.kind(), ConfigErrorKind::Conflict);
        assert!(err.to_string().contains(why), "{err}");
        // The Redis store itself books turns and keeps penalty boxes.
        RateLimitLayer::builder()
            .quota(policy)
            .store(RedisStore::new(server.url()).unwrap())
            .build()
            .unwrap();
    }
}
