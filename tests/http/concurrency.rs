//! The concurrent-requests limiter over real TCP, against real `redis-server`
//! processes and the built demo example: at most N in flight per key across
//! instances, and every slot freed — when the response is sent, when the
//! client disconnects mid-response, when the handler panics or errors, when
//! the request is dropped, and (for a crashed instance) when its lease ends.
//!
//! Handlers wait on a semaphore the test controls, never on a timer.

use crate::support::example;
use crate::support::http as http_support;
use crate::support::poll::eventually;
use crate::support::redis as redis_support;

use axum::{http::StatusCode, response::IntoResponse, routing::get, Router};
use bytes::Bytes;
use http::Request;
use http_body::Frame;
use http_support::{HttpClient, Reply, TestServer};
use redis_support::{assert_every_key_has_a_ttl, require_redis, RedisServer};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tower::ServiceExt;
use tower_ratelimit::clock::{Clock, ManualClock, SystemClock};
use tower_ratelimit::key::{Header, Key};
use tower_ratelimit::store::{Acquire, MemoryStore, Namespace, RedisStore, SlotId, Store};
use tower_ratelimit::ConcurrencyLimitLayer;
use tower_ratelimit::{failure::OnStoreError, headers::HeaderStyle, Quota, RateLimitLayer};

const NAME: &str = "concurrency";

// ---------------------------------------------------------------------------
// A handler the test holds
// ---------------------------------------------------------------------------

/// What the handlers share with the test: an in-flight count with a
/// high-water mark, a signal per request entering, and a gate that holds
/// requests until the test opens it.
#[derive(Clone)]
struct Probe {
    in_flight: Arc<AtomicU64>,
    max: Arc<AtomicU64>,
    entered: mpsc::UnboundedSender<()>,
    gate: Arc<Semaphore>,
    stream: Arc<Mutex<Option<StreamParts>>>,
}

struct StreamParts {
    chunks: mpsc::UnboundedReceiver<Bytes>,
    dropped: oneshot::Sender<()>,
}

impl Probe {
    fn new() -> (Self, mpsc::UnboundedReceiver<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let probe = Probe {
            in_flight: Arc::default(),
            max: Arc::default(),
            entered: tx,
            gate: Arc::new(Semaphore::new(0)),
            stream: Arc::default(),
        };
        (probe, rx)
    }

    /// Counts the request in, waits for the gate, counts it out.
    async fn hold(self) -> &'static str {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        let _ = self.entered.send(());
        self.gate.acquire().await.unwrap().forget();
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        "done"
    }
}

/// A response body whose chunks the test sends, and that reports its drop.
struct TestStream {
    chunks: mpsc::UnboundedReceiver<Bytes>,
    dropped: Option<oneshot::Sender<()>>,
}

impl http_body::Body for TestStream {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.get_mut()
            .chunks
            .poll_recv(cx)
            .map(|c| c.map(|b| Ok(Frame::data(b))))
    }
}

impl Drop for TestStream {
    fn drop(&mut self) {
        if let Some(tx) = self.dropped.take() {
            let _ = tx.send(());
        }
    }
}

fn app(probe: &Probe) -> Router {
    let hold = probe.clone();
    let stream = probe.stream.clone();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/hold", get(move || hold.clone().hold()))
        .route(
            "/stream",
            get(move || {
                let parts = stream.lock().unwrap().take().expect("stream prepared");
                async move {
                    axum::body::Body::new(TestStream {
                        chunks: parts.chunks,
                        dropped: Some(parts.dropped),
                    })
                }
            }),
        )
        .route(
            "/panic",
            get(|| async {
                if true {
                    panic!("handler panics (on purpose, in a test)");
                }
                "unreachable"
            }),
        )
        .route(
            "/error",
            get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "failed").into_response() }),
        )
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

fn redis_layer(url: &str, limit: u32) -> ConcurrencyLimitLayer {
    ConcurrencyLimitLayer::builder()
        .limit(limit)
        .key(Header::try_new("x-client").unwrap())
        .store(RedisStore::new(url).unwrap())
        .headers(HeaderStyle::Both)
        .store_timeout(Duration::from_secs(2))
        .on_store_error(OnStoreError::FailClosed)
        .build()
        .unwrap()
}

fn slots_key(server: &RedisServer, client: &str) -> String {
    RedisStore::new(server.url())
        .unwrap()
        .slots_key(&Namespace::new(NAME), &Key::new(client))
}

fn zcard(server: &RedisServer, key: &str) -> i64 {
    server.query::<i64>(&["ZCARD", key])
}

async fn fetch(c: &HttpClient, url: &str, client: &str) -> Reply {
    c.get_with(url, &[("x-client", client.as_bytes())]).await
}

/// Sends a GET over a raw TCP connection (which the test may drop at any point).
async fn raw_get(addr: SocketAddr, path: &str, client: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nhost: test\r\nx-client: {client}\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    s
}

/// Reads until `needle` has arrived or the server closed the connection.
async fn read_until(s: &mut TcpStream, needle: &str) -> String {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if String::from_utf8_lossy(&seen).contains(needle) {
            break;
        }
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&seen).into_owned()
}

fn assert_concurrency_rejection(r: &Reply, limit: u64) {
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
    assert_eq!(
        r.header("ratelimit-policy"),
        Some(format!(r#""{NAME}";q={limit};qu="concurrent-requests""#).as_str())
    );
    assert_eq!(
        r.header("ratelimit"),
        Some(format!(r#""{NAME}";r=0"#).as_str())
    );
    assert_eq!(r.header_u64("x-ratelimit-limit"), limit);
    assert_eq!(r.header_u64("x-ratelimit-remaining"), 0);
    assert_eq!(r.header_u64("retry-after"), 1);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert!(r.body.contains("concurrent"), "{}", r.body);
}

// ---------------------------------------------------------------------------
// Fleet-wide cap
// ---------------------------------------------------------------------------

#[tokio::test]
async fn fifty_simultaneous_slow_requests_across_two_instances_sharing_redis_never_have_more_than_five_in_flight(
) {
    require_redis();
    let redis = RedisServer::start();
    let (probe, mut entered) = Probe::new();
    // Two instances: each its own layer and its own connections to the one Redis.
    let a = TestServer::start(app(&probe).layer(redis_layer(&redis.url(), 5))).await;
    let b = TestServer::start(app(&probe).layer(redis_layer(&redis.url(), 5))).await;
    let key = slots_key(&redis, "k");
    let c = HttpClient::new();

    let mut requests = tokio::task::JoinSet::new();
    for i in 0..50 {
        let url = if i % 2 == 0 {
            a.url("/hold")
        } else {
            b.url("/hold")
        };
        let c = c.clone();
        requests.spawn(async move { fetch(&c, &url, "k").await });
    }
    // The first five hold their slots until the gate opens: every other request is rejected.
    let mut rejected = 0;
    while rejected < 45 {
        let r = requests.join_next().await.unwrap().unwrap();
        assert_concurrency_rejection(&r, 5);
        rejected += 1;
    }
    for _ in 0..5 {
        entered.recv().await.unwrap();
    }
    assert_eq!(probe.in_flight.load(Ordering::SeqCst), 5);
    assert_eq!(zcard(&redis, &key), 5, "five slots held in Redis");
    assert_every_key_has_a_ttl(&redis);

    probe.gate.add_permits(5);
    while let Some(r) = requests.join_next().await {
        let r = r.unwrap();
        assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "done"));
        assert!(
            r.header("ratelimit").is_none(),
            "admitted responses carry no concurrency headers"
        );
    }
    assert_eq!(
        probe.max.load(Ordering::SeqCst),
        5,
        "never more than five in flight"
    );
    eventually(Duration::from_secs(5), "every slot released", || {
        zcard(&redis, &key) == 0
    })
    .await;

    // Freed for real: five new requests are admitted again, on either instance.
    let mut again = tokio::task::JoinSet::new();
    for i in 0..5 {
        let url = if i % 2 == 0 {
            a.url("/hold")
        } else {
            b.url("/hold")
        };
        let c = c.clone();
        again.spawn(async move { fetch(&c, &url, "k").await });
    }
    for _ in 0..5 {
        entered.recv().await.unwrap();
    }
    probe.gate.add_permits(5);
    while let Some(r) = again.join_next().await {
        assert_eq!(r.unwrap().status, StatusCode::OK);
    }
    assert_eq!(probe.max.load(Ordering::SeqCst), 5);
    // Another key was never affected.
    assert_eq!(fetch(&c, &a.url("/"), "other").await.status, StatusCode::OK);
}

// ---------------------------------------------------------------------------
// Every way a request ends frees its slot
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_client_that_disconnects_mid_response_frees_its_slot() {
    require_redis();
    let redis = RedisServer::start();
    let (probe, _entered) = Probe::new();
    let server = TestServer::start(app(&probe).layer(redis_layer(&redis.url(), 1))).await;
    let key = slots_key(&redis, "k");
    let (chunks, rx) = mpsc::unbounded_channel();
    let (dropped_tx, dropped) = oneshot::channel();
    *probe.stream.lock().unwrap() = Some(StreamParts {
        chunks: rx,
        dropped: dropped_tx,
    });
    chunks.send(Bytes::from_static(b"first-chunk")).unwrap();

    let mut conn = raw_get(server.addr, "/stream", "k").await;
    let seen = read_until(&mut conn, "first-chunk").await;
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    assert_eq!(
        zcard(&redis, &key),
        1,
        "the slot is held while the body streams"
    );
    let c = HttpClient::new();
    let r = fetch(&c, &server.url("/"), "k").await;
    assert_concurrency_rejection(&r, 1);

    drop(conn);
    // The server drops the body when it sees the connection closed.
    tokio::time::timeout(Duration::from_secs(10), dropped)
        .await
        .expect("the server dropped the streaming body")
        .unwrap();
    eventually(Duration::from_secs(5), "the slot released", || {
        zcard(&redis, &key) == 0
    })
    .await;
    assert_eq!(
        fetch(&c, &server.url("/"), "k").await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_panicking_handler_and_an_error_response_free_their_slots() {
    require_redis();
    let redis = RedisServer::start();
    let (probe, _entered) = Probe::new();
    let server = TestServer::start(app(&probe).layer(redis_layer(&redis.url(), 1))).await;
    let key = slots_key(&redis, "k");
    let c = HttpClient::new();

    // The panic kills the connection's task: the request future is dropped.
    let mut conn = raw_get(server.addr, "/panic", "k").await;
    let seen = read_until(&mut conn, "\r\n\r\n").await;
    assert!(
        seen.is_empty(),
        "no response to a panicking handler: {seen:?}"
    );
    eventually(
        Duration::from_secs(5),
        "the panicking request's slot released",
        || zcard(&redis, &key) == 0,
    )
    .await;
    assert_eq!(
        fetch(&c, &server.url("/"), "k").await.status,
        StatusCode::OK
    );

    let r = fetch(&c, &server.url("/error"), "k").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    eventually(
        Duration::from_secs(5),
        "the failed request's slot released",
        || zcard(&redis, &key) == 0,
    )
    .await;
    assert_eq!(
        fetch(&c, &server.url("/"), "k").await.status,
        StatusCode::OK
    );
    // The release runs off the response path: it lands shortly after the
    // response does.
    eventually(
        Duration::from_secs(5),
        "the last request's slot released",
        || zcard(&redis, &key) == 0,
    )
    .await;
}

#[tokio::test]
async fn an_inner_service_error_and_a_request_dropped_before_its_response_free_their_slots() {
    require_redis();
    let redis = RedisServer::start();
    let key = slots_key(&redis, "k");
    let layer = redis_layer(&redis.url(), 1);
    let req = || {
        Request::get("/")
            .header("x-client", "k")
            .body(axum::body::Body::empty())
            .unwrap()
    };

    // The inner service fails: its error passes through, the slot is freed.
    let failing = tower::service_fn(|_: Request<axum::body::Body>| async {
        Err::<http::Response<axum::body::Body>, _>(std::io::Error::other("backend down"))
    });
    let err = tower::Layer::layer(&layer, failing)
        .oneshot(req())
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "backend down");
    eventually(
        Duration::from_secs(5),
        "the failed request's slot released",
        || zcard(&redis, &key) == 0,
    )
    .await;

    // The request is abandoned while the handler runs (e.g. a client timeout).
    let (probe, mut entered) = Probe::new();
    let held = tokio::spawn({
        let svc = tower::Layer::layer(&layer, app(&probe));
        async move {
            svc.oneshot(
                Request::get("/hold")
                    .header("x-client", "k")
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
        }
    });
    entered.recv().await.unwrap();
    assert_eq!(zcard(&redis, &key), 1);
    held.abort();
    assert!(held.await.unwrap_err().is_cancelled());
    eventually(
        Duration::from_secs(5),
        "the dropped request's slot released",
        || zcard(&redis, &key) == 0,
    )
    .await;
}

// ---------------------------------------------------------------------------
// Leases, tombstones, failure policy, shadow mode
// ---------------------------------------------------------------------------

fn acquire<'a>(
    id: SlotId,
    key: &'a Key,
    ns: &'a Namespace,
    now_ms: u64,
    lease_ms: u64,
) -> Acquire<'a> {
    Acquire::new(ns, key, id, 1, now_ms)
        .with_lease(Duration::from_millis(lease_ms))
        .with_timeout(Duration::from_secs(2))
}

#[tokio::test]
async fn a_slot_counts_while_its_lease_lasts_by_redis_s_clock_and_a_release_that_overtakes_its_acquire_wins(
) {
    require_redis();
    let redis = RedisServer::start();
    let store = RedisStore::new(redis.url()).unwrap();
    let (ns, k) = (Namespace::new(NAME), Key::new("k"));
    let key = store.slots_key(&ns, &k);
    // The caller's clock is an hour off: leases are Redis's to time.
    let t0 = SystemClock.now_ms() + 3_600_000;

    let first = SlotId::next();
    let before = redis.time_ms();
    let o = store
        .acquire(&acquire(first, &k, &ns, t0, 1_000))
        .await
        .unwrap();
    let after = redis.time_ms();
    assert!(o.acquired && o.in_flight == 1);
    let score: u64 = redis
        .query::<String>(&["ZSCORE", &key, &first.to_string()])
        .parse()
        .unwrap();
    assert!(
        (before + 1_000..=after + 1_000).contains(&score),
        "leased until Redis TIME + 1 s: {score} not in {before}..={after} + 1000"
    );
    let pttl = redis.query::<i64>(&["PTTL", &key]);
    assert!(
        pttl > 0 && pttl <= 2_000,
        "the key expires with its lease: {pttl}"
    );
    // Never released (as if its instance died): it counts while its lease
    // lasts, whatever the caller's clock says…
    let o = store
        .acquire(&acquire(SlotId::next(), &k, &ns, t0 + 3_600_000, 1_000))
        .await
        .unwrap();
    assert!(!o.acquired && o.in_flight == 1);
    // …and not once it has ended by Redis's clock (the lease moved a whole
    // lease earlier: Redis's clock a lease later, for these slots).
    redis.shift_scores(&key, -1_000);
    let second = SlotId::next();
    let o = store
        .acquire(&acquire(second, &k, &ns, t0, 1_000))
        .await
        .unwrap();
    assert!(
        o.acquired && o.in_flight == 1,
        "the expired slot was dropped"
    );
    let members = redis.query::<Vec<String>>(&["ZRANGE", &key, "0", "-1"]);
    assert_eq!(members, [second.to_string()]);

    // A release that reaches Redis before its acquire (an abandoned or timed-out
    // acquire on another connection) makes that late acquire fail.
    let late = SlotId::next();
    let a = acquire(late, &k, &ns, t0 + 1_001, 1_000);
    store.release(&a.release(t0 + 1_001)).await.unwrap();
    let r = acquire(second, &k, &ns, t0 + 1_001, 1_000).release(t0 + 1_001);
    store.release(&r).await.unwrap();
    assert_eq!(zcard(&redis, &key), 0);
    let o = store.acquire(&a).await.unwrap();
    assert!(!o.acquired, "a late acquire of a released slot is refused");
    assert_eq!(zcard(&redis, &key), 0, "and takes nothing");
    assert_every_key_has_a_ttl(&redis);
}

#[tokio::test]
async fn store_failures_follow_the_failure_policy_and_shadow_mode_never_rejects() {
    // No Redis needed for the failure side: nothing listens on the port.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("redis://{}", l.local_addr().unwrap())
    };
    let fast = Duration::from_millis(200);
    let layer = |policy| {
        ConcurrencyLimitLayer::builder()
            .limit(2)
            .key(Header::try_new("x-client").unwrap())
            .store(
                RedisStore::builder(dead.clone())
                    .connect_timeout(fast)
                    .response_timeout(fast)
                    .build()
                    .unwrap(),
            )
            .store_timeout(fast)
            .on_store_error(policy)
            .build()
            .unwrap()
    };
    let (probe, mut entered) = Probe::new();
    let c = HttpClient::new();

    let closed = TestServer::start(app(&probe).layer(layer(OnStoreError::FailClosed))).await;
    let r = fetch(&c, &closed.url("/"), "k").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.header_u64("retry-after"), 1);

    let open = TestServer::start(app(&probe).layer(layer(OnStoreError::FailOpen))).await;
    assert_eq!(fetch(&c, &open.url("/"), "k").await.status, StatusCode::OK);

    // Local: half of the limit (1) in this process's memory until Redis answers.
    let local =
        TestServer::start(app(&probe).layer(layer(OnStoreError::Local { fraction: 0.5 }))).await;
    let held = tokio::spawn({
        let (c, url) = (c.clone(), local.url("/hold"));
        async move { fetch(&c, &url, "k").await }
    });
    entered.recv().await.unwrap();
    let r = fetch(&c, &local.url("/"), "k").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
    assert_eq!(r.header_u64("x-ratelimit-limit"), 1);
    probe.gate.add_permits(1);
    assert_eq!(held.await.unwrap().status, StatusCode::OK);
    eventually(Duration::from_secs(5), "the local slot released", || {
        probe.in_flight.load(Ordering::SeqCst) == 0
    })
    .await;
    assert_eq!(fetch(&c, &local.url("/"), "k").await.status, StatusCode::OK);

    // Shadow mode (memory store): the would-be rejection is admitted and holds no slot.
    let slots = MemoryStore::new();
    let shadow = ConcurrencyLimitLayer::builder()
        .limit(1)
        .key(Header::try_new("x-client").unwrap())
        .store(slots.clone())
        .shadow(true)
        .build()
        .unwrap();
    let server = TestServer::start(app(&probe).layer(shadow)).await;
    let mut held = tokio::task::JoinSet::new();
    for _ in 0..2 {
        let (c, url) = (c.clone(), server.url("/hold"));
        held.spawn(async move { fetch(&c, &url, "k").await });
    }
    for _ in 0..2 {
        entered.recv().await.unwrap();
    }
    assert_eq!(slots.in_flight(&Namespace::new(NAME), &Key::new("k")), 1);
    probe.gate.add_permits(2);
    while let Some(r) = held.join_next().await {
        assert_eq!(r.unwrap().status, StatusCode::OK);
    }
    eventually(Duration::from_secs(5), "memory slots released", || {
        slots.in_flight(&Namespace::new(NAME), &Key::new("k")) == 0
    })
    .await;
}

// ---------------------------------------------------------------------------
// Stacked with the rate limit
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_concurrency_rejection_keeps_its_own_headers_through_the_rate_limit_around_it() {
    let (probe, mut entered) = Probe::new();
    let app = app(&probe)
        .layer(
            ConcurrencyLimitLayer::builder()
                .limit(1)
                .key(Header::try_new("x-client").unwrap())
                .headers(HeaderStyle::Both)
                .build()
                .unwrap(),
        )
        .layer(
            RateLimitLayer::builder()
                .quota(Quota::new(100, Duration::from_secs(60)).unwrap())
                .key(Header::try_new("x-client").unwrap())
                .headers(HeaderStyle::Both)
                .clock(ManualClock::new(1_700_000_000_000))
                .build()
                .unwrap(),
        );
    let server = TestServer::start(app).await;
    let c = HttpClient::new();
    let held = tokio::spawn({
        let (c, url) = (c.clone(), server.url("/hold"));
        async move { fetch(&c, &url, "k").await }
    });
    entered.recv().await.unwrap();
    let r = fetch(&c, &server.url("/"), "k").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // The numbers that explain the 429, not the rate limit's 98 remaining.
    assert_eq!(r.header_u64("x-ratelimit-limit"), 1);
    assert_eq!(r.header_u64("x-ratelimit-remaining"), 0);
    assert_eq!(
        r.header("ratelimit-policy"),
        Some(r#""concurrency";q=1;qu="concurrent-requests", "1m";q=100;w=60"#)
    );
    assert_eq!(
        r.header("ratelimit"),
        Some(r#""concurrency";r=0, "1m";r=98;t=60"#)
    );
    probe.gate.add_permits(1);
    let ok = held.await.unwrap();
    assert_eq!(ok.status, StatusCode::OK);
    assert_eq!(ok.header_u64("x-ratelimit-remaining"), 99);
}

// ---------------------------------------------------------------------------
// A crashed instance
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_killed_instance_holding_slots_frees_them_when_their_lease_ends_and_not_before() {
    require_redis();
    let redis = RedisServer::start();
    let url = redis.url();
    let lease_ms = 10_000;
    let mut demo = example::Running::start(
        "demo",
        &[
            "--listen",
            "127.0.0.1:0",
            "--store",
            "redis",
            "--redis-url",
            &url,
            "--key",
            "header:x-client",
            "--limit",
            "1000",
            "--concurrency",
            "2",
            "--lease",
            "10s",
        ],
    );
    let key = slots_key(&redis, "k");
    let c = HttpClient::new();
    // Two slow requests take both slots; the third is turned away.
    let sent_at = redis.time_ms();
    let mut slow = Vec::new();
    for _ in 0..2 {
        let (c, u) = (c.clone(), demo.url("/slow/600000"));
        slow.push(tokio::spawn(async move {
            c.get_with(&u, &[("x-client", b"k")]).await
        }));
    }
    eventually(
        Duration::from_secs(10),
        "two slots held by the demo",
        || zcard(&redis, &key) == 2,
    )
    .await;
    let r = fetch(&c, &demo.url("/"), "k").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    let scores: Vec<u64> = redis
        .query::<Vec<String>>(&["ZRANGE", &key, "0", "-1", "WITHSCORES"])
        .chunks(2)
        .map(|m| m[1].parse().unwrap())
        .collect();

    // kill -9: no destructor, no release.
    demo.child.kill().unwrap();
    demo.child.wait().unwrap();
    for t in slow {
        let _ = t.await; // the client side fails with the connection
    }
    assert_eq!(
        zcard(&redis, &key),
        2,
        "the dead instance's slots are still counted"
    );
    // Each slot expires one lease after it was taken, by Redis's clock, and
    // the key one second after the last lease: nothing outlives it even if
    // no one ever comes back.
    let killed_at = redis.time_ms();
    for s in &scores {
        assert!(
            (sent_at + lease_ms..=killed_at + lease_ms).contains(s),
            "{s}"
        );
    }
    let expire_at = redis.query::<i64>(&["PEXPIRETIME", &key]) as u64;
    let last = scores.iter().max().unwrap() + 1_000;
    assert!(
        (last..=last + 2).contains(&expire_at),
        "the key expires at {expire_at}, a second after the last lease ({last})"
    );

    // Another instance, whose clock runs an hour ahead: the slots are
    // still held, because Redis's clock times leases.
    let clock = ManualClock::new(SystemClock.now_ms() + 3_600_000);
    let layer = ConcurrencyLimitLayer::builder()
        .limit(2)
        .key(Header::try_new("x-client").unwrap())
        .store(RedisStore::new(&url).unwrap())
        .clock(clock.clone())
        .store_timeout(Duration::from_secs(2))
        .on_store_error(OnStoreError::FailClosed)
        .build()
        .unwrap();
    let (probe, _) = Probe::new();
    let server = TestServer::start(app(&probe).layer(layer)).await;
    let r = fetch(&c, &server.url("/"), "k").await;
    assert_eq!(
        r.status,
        StatusCode::TOO_MANY_REQUESTS,
        "still held before the lease ends"
    );
    // Redis's clock a lease later, for these slots.
    redis.shift_scores(&key, -(lease_ms as i64));
    let r = fetch(&c, &server.url("/"), "k").await;
    assert_eq!(r.status, StatusCode::OK, "free once the lease has ended");
    eventually(
        Duration::from_secs(5),
        "the dead slots cleaned and the new one released",
        || zcard(&redis, &key) == 0,
    )
    .await;
}

// ---------------------------------------------------------------------------
// gRPC
// ---------------------------------------------------------------------------

#[tokio::test]
async fn grpc_calls_are_answered_with_grpc_statuses_and_a_streaming_call_holds_its_slot_until_it_ends(
) {
    use tonic::transport::server::TcpIncoming;
    use tonic::transport::{Channel, Server};
    use tonic::Code;
    use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
    use tonic_types::StatusExt;
    use tower_ratelimit::{shed::Priority, LoadShedLayer};

    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    // Capacity 2: normal calls may use one of it, critical ones both.
    let shed = LoadShedLayer::builder()
        .capacity(2)
        .classify(|parts| {
            parts
                .headers
                .get("x-priority")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(Priority::Normal)
        })
        .build()
        .unwrap();
    let concurrency = ConcurrencyLimitLayer::builder().limit(1).build().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        Server::builder()
            .layer(tower::ServiceBuilder::new().layer(shed).layer(concurrency))
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = HealthClient::new(channel);
    let check = |priority: &'static str| {
        let mut r = tonic::Request::new(HealthCheckRequest {
            service: String::new(),
        });
        r.metadata_mut()
            .insert("x-priority", priority.parse().unwrap());
        r
    };

    // A server-streaming call: its slot and admission are held while the stream is open.
    let stream = c.watch(check("critical")).await.unwrap();
    let status = c.check(check("normal")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "shed: {status:?}");
    assert_eq!(
        status.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "1000"
    );
    let status = c.check(check("critical")).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("concurrent"),
        "{}",
        status.message()
    );
    assert_eq!(status.metadata().get("x-ratelimit-limit").unwrap(), "1");
    assert_eq!(
        status.get_details_retry_info().unwrap().retry_delay,
        Some(Duration::from_secs(1))
    );

    // The client cancels the stream: the server drops its body and frees the slot.
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match c.check(check("normal")).await {
            Ok(_) => break,
            Err(s) => assert!(
                Instant::now() < deadline,
                "the cancelled stream's slot was never freed: {s:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

// ---------------------------------------------------------------------------
// Redis Cluster
// ---------------------------------------------------------------------------

#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_cluster_slots_and_tombstones_share_one_hash_slot() {
    require_redis();
    let cluster = redis_support::Cluster::start(3, 0);
    let store = RedisStore::cluster_builder(cluster.urls())
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let (ns, k) = (Namespace::new(NAME), Key::new("k"));
    let key = store.slots_key(&ns, &k);
    let node = cluster.master_for_key(&key);
    let now = SystemClock.now_ms();
    let call = |id| {
        Acquire::new(&ns, &k, id, 2, now)
            .with_lease(Duration::from_secs(30))
            .with_timeout(Duration::from_secs(2))
    };
    let (a, b) = (SlotId::next(), SlotId::next());
    // Two keys per script (slots and tombstones): any CROSSSLOT would be an error here.
    assert!(store.acquire(&call(a)).await.unwrap().acquired);
    assert!(store.acquire(&call(b)).await.unwrap().acquired);
    assert!(!store.acquire(&call(SlotId::next())).await.unwrap().acquired);
    assert_eq!(node.query::<i64>(&["ZCARD", &key]), 2);
    let release = |id| call(id).release(now);
    store.release(&release(a)).await.unwrap();
    // A release ahead of its acquire leaves a tombstone beside the slots.
    let late = SlotId::next();
    store.release(&release(late)).await.unwrap();
    assert!(!store.acquire(&call(late)).await.unwrap().acquired);
    store.release(&release(b)).await.unwrap();
    assert_eq!(node.query::<i64>(&["ZCARD", &key]), 0);
}

/// A store that counts requests and keeps no slots: a custom store that
/// implements only the charge.
#[derive(Debug)]
struct CountsOnly;

impl Store for CountsOnly {
    fn charge(
        &self,
        call: &tower_ratelimit::store::Charge<'_>,
    ) -> tower_ratelimit::store::StoreFuture<
        Result<tower_ratelimit::decision::Decision, tower_ratelimit::StoreError>,
    > {
        MemoryStore::new().charge(call)
    }

    fn settle(
        &self,
        _: &tower_ratelimit::store::Settle<'_>,
    ) -> tower_ratelimit::store::StoreFuture<Result<(), tower_ratelimit::StoreError>> {
        tower_ratelimit::store::StoreFuture::ready(Ok(()))
    }

    fn status(
        &self,
        call: &tower_ratelimit::store::Charge<'_>,
    ) -> tower_ratelimit::store::StoreFuture<
        Result<tower_ratelimit::decision::Decision, tower_ratelimit::StoreError>,
    > {
        MemoryStore::new().status(call)
    }
}

#[test]
fn a_store_that_keeps_no_slots_is_refused_when_the_layer_is_built_naming_the_stores_that_do() {
    let err = ConcurrencyLimitLayer::builder()
        .limit(2)
        .store(CountsOnly)
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), tower_ratelimit::ConfigErrorKind::Conflict);
    assert!(err.to_string().contains("keeps no slots"), "{err}");
    assert!(err.to_string().contains("MemoryStore"), "{err}");
    let shed = tower_ratelimit::LoadShedLayer::builder()
        .fleet_capacity(4)
        .store(CountsOnly)
        .build()
        .unwrap_err();
    assert_eq!(shed.kind(), tower_ratelimit::ConfigErrorKind::Conflict);
}
