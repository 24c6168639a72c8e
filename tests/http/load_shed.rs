//! The load shedder over real TCP under generated overload: critical requests
//! are shed only when the whole capacity is in use, and classes are shed in
//! the order test → low → normal → critical. Handlers wait on a semaphore the
//! test controls, never on a timer.

use crate::support::example;
use crate::support::http as http_support;
use crate::support::shed as shed_support;

use crate::support::poll::eventually;
use crate::support::recorder;
use axum::{http::StatusCode, routing::get, Router};
use http::Request;
use http_support::{HttpClient, Reply, TestServer};
use metrics_util::debugging::DebugValue;
use shed_support::{assert_shed, by_header, send};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use tower::ServiceExt;
use tower_ratelimit::{shed::Priority, LoadShedLayer};

/// A handler that signals when it starts and waits for the test's permit.
fn app(entered: mpsc::UnboundedSender<()>, gate: Arc<Semaphore>) -> Router {
    Router::new()
        .route(
            "/",
            get(move || {
                let (entered, gate) = (entered.clone(), gate.clone());
                async move {
                    let _ = entered.send(());
                    gate.acquire().await.unwrap().forget();
                    "done"
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
}

fn layer(name: &str, capacity: u64) -> LoadShedLayer {
    LoadShedLayer::builder()
        .name(name)
        .capacity(capacity)
        .classify(by_header)
        .build()
        .unwrap()
}

/// A small deterministic generator (xorshift64*): the same overload every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn class(&mut self) -> Priority {
        Priority::ALL[(self.next() % 4) as usize]
    }
}

/// `load_shed_decisions_total` of `limiter` by (class, outcome).
fn decisions(limiter: &str) -> HashMap<(String, String), u64> {
    let mut out = HashMap::new();
    for (k, v) in recorder::take(limiter) {
        let key = k.key();
        let label = |name: &str| {
            key.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_owned())
        };
        if key.name() != "load_shed_decisions_total" || label("limiter").as_deref() != Some(limiter)
        {
            continue;
        }
        if let DebugValue::Counter(n) = v {
            *out.entry((label("class").unwrap(), label("outcome").unwrap()))
                .or_default() += n;
        }
    }
    out
}

#[tokio::test]
async fn under_a_rising_mixed_overload_each_class_is_shed_exactly_above_its_share_test_first_critical_last(
) {
    recorder::install();
    // Capacity 10: test may have 5 in flight, low 7, normal 9, critical 10.
    let limits = HashMap::from([
        (Priority::Test, 5),
        (Priority::Low, 7),
        (Priority::Normal, 9),
        (Priority::Critical, 10),
    ]);
    let (tx, mut entered) = mpsc::unbounded_channel();
    let gate = Arc::new(Semaphore::new(0));
    let shed = layer("ramp", 10);
    let server = TestServer::start(app(tx, gate.clone()).layer(shed.clone())).await;
    let c = HttpClient::new();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut held = JoinSet::new();
    let mut outcomes: HashMap<(Priority, bool), u64> = HashMap::new();
    // The lowest load (requests in flight) at which each class was shed.
    let mut first_shed_at: HashMap<Priority, u64> = HashMap::new();

    for step in 0..600 {
        // Two arrivals for each departure on average: load climbs to capacity and stays there.
        if rng.next().is_multiple_of(3) && !held.is_empty() {
            gate.add_permits(1);
            let r: Reply = held.join_next().await.unwrap().unwrap();
            assert_eq!(r.status, StatusCode::OK);
            let expected = held.len() as u64;
            eventually(Duration::from_secs(5), "the admission released", || {
                shed.in_flight() == expected
            })
            .await;
            continue;
        }
        let class = rng.class();
        let in_flight = held.len() as u64;
        assert_eq!(shed.in_flight(), in_flight);
        let (c2, url) = (c.clone(), server.url("/"));
        let mut req = tokio::spawn(async move { send(&c2, &url, class).await });
        let admitted = tokio::select! {
            _ = entered.recv() => true,
            r = &mut req => {
                assert_shed(&r.unwrap(), class);
                false
            }
        };
        assert_eq!(
            admitted,
            in_flight < limits[&class],
            "step {step}: a {class} request with {in_flight} in flight"
        );
        if admitted {
            held.spawn(async move { req.await.unwrap() });
        } else {
            let at = first_shed_at.entry(class).or_insert(in_flight);
            *at = (*at).min(in_flight);
        }
        *outcomes.entry((class, admitted)).or_default() += 1;
    }
    gate.add_permits(held.len());
    while let Some(r) = held.join_next().await {
        assert_eq!(r.unwrap().status, StatusCode::OK);
    }
    eventually(Duration::from_secs(5), "every admission released", || {
        shed.in_flight() == 0
    })
    .await;

    // The shedding order: each class starts being shed at a higher load than
    // the one before it, and critical only when the whole capacity is in use.
    assert_eq!(first_shed_at[&Priority::Test], 5, "{first_shed_at:?}");
    assert_eq!(first_shed_at[&Priority::Low], 7, "{first_shed_at:?}");
    assert_eq!(first_shed_at[&Priority::Normal], 9, "{first_shed_at:?}");
    assert_eq!(first_shed_at[&Priority::Critical], 10, "{first_shed_at:?}");
    // The overload was real for every class, and each lost a larger share the
    // lower its priority.
    let share_shed = |p: Priority| {
        let shed = outcomes.get(&(p, false)).copied().unwrap_or(0) as f64;
        let ok = outcomes.get(&(p, true)).copied().unwrap_or(0) as f64;
        shed / (shed + ok)
    };
    let shares: Vec<f64> = Priority::ALL.iter().map(|p| share_shed(*p)).collect();
    assert!(
        shares.windows(2).all(|w| w[0] < w[1]),
        "shed share by class (critical..test): {shares:?}, outcomes {outcomes:?}"
    );
    // The per-class metrics count the same outcomes.
    let metrics = decisions("ramp");
    for p in Priority::ALL {
        for (admitted, outcome) in [(true, "admitted"), (false, "shed")] {
            assert_eq!(
                metrics
                    .get(&(p.as_str().to_owned(), outcome.to_owned()))
                    .copied()
                    .unwrap_or(0),
                outcomes.get(&(p, admitted)).copied().unwrap_or(0),
                "{p} {outcome}"
            );
        }
    }
}

#[tokio::test]
async fn a_simultaneous_burst_never_exceeds_any_class_share_and_always_leaves_the_reserve_to_critical(
) {
    // Capacity 20: test 10, low 14, normal 18, critical 20.
    let (tx, mut entered) = mpsc::unbounded_channel();
    let gate = Arc::new(Semaphore::new(0));
    let shed = layer("burst", 20);
    let server = TestServer::start(app(tx, gate.clone()).layer(shed.clone())).await;
    let c = HttpClient::new();
    let mut rng = Rng(42);
    // 50 of each class, in a shuffled order, all at once.
    let mut classes: Vec<Priority> = Priority::ALL.iter().flat_map(|p| [*p; 50]).collect();
    for i in (1..classes.len()).rev() {
        classes.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    let mut requests = JoinSet::new();
    for class in classes {
        let (c, url) = (c.clone(), server.url("/"));
        requests.spawn(async move { (class, send(&c, &url, class).await) });
    }
    let mut shed_count: HashMap<Priority, u64> = HashMap::new();
    for _ in 0..180 {
        let (class, r) = requests.join_next().await.unwrap().unwrap();
        assert_shed(&r, class);
        *shed_count.entry(class).or_default() += 1;
    }
    for _ in 0..20 {
        entered.recv().await.unwrap();
    }
    assert_eq!(shed.in_flight(), 20, "the whole capacity is in use");
    let admitted = |p: Priority| 50 - shed_count.get(&p).copied().unwrap_or(0);
    let (t, l, n, cr) = (
        admitted(Priority::Test),
        admitted(Priority::Low),
        admitted(Priority::Normal),
        admitted(Priority::Critical),
    );
    assert!(t <= 10, "test used at most half: {t}");
    assert!(t + l <= 14, "test and low used at most 70 %: {t} + {l}");
    assert!(
        t + l + n <= 18,
        "only critical used the last 10 %: {t} + {l} + {n}"
    );
    assert!(cr >= 2, "critical traffic got at least its reserve: {cr}");
    gate.add_permits(20);
    while let Some(r) = requests.join_next().await {
        assert_eq!(r.unwrap().1.status, StatusCode::OK);
    }
    eventually(Duration::from_secs(5), "every admission released", || {
        shed.in_flight() == 0
    })
    .await;
}

#[tokio::test]
async fn a_utilisation_signal_sheds_classes_above_their_share_and_a_nan_signal_sheds_nothing() {
    let load = Arc::new(AtomicU64::new(0));
    let signal = load.clone();
    let shed = LoadShedLayer::builder()
        .utilisation(move || f64::from_bits(signal.load(Ordering::SeqCst)))
        .classify(by_header)
        .build()
        .unwrap();
    let svc = tower::Layer::layer(
        &shed,
        app(mpsc::unbounded_channel().0, Arc::new(Semaphore::new(1_000))),
    );
    for (u, admitted) in [
        (0.5, [true, true, true, true]),
        (0.6, [true, true, true, false]),
        (0.8, [true, true, false, false]),
        (0.95, [true, false, false, false]),
        (1.0, [true, false, false, false]),
        (f64::NAN, [true, true, true, true]),
    ] {
        load.store(f64::to_bits(u), Ordering::SeqCst);
        for (p, expected) in Priority::ALL.iter().zip(admitted) {
            let req = Request::get("/")
                .header("x-priority", p.as_str())
                .body(axum::body::Body::empty())
                .unwrap();
            let res = svc.clone().oneshot(req).await.unwrap();
            let ok = res.status() == StatusCode::OK;
            assert_eq!(ok, expected, "{p} at utilisation {u}");
        }
    }
    assert_eq!(shed.in_flight(), 0);
}

#[tokio::test]
async fn admissions_are_released_when_a_handler_panics_and_shadow_mode_sheds_nothing() {
    let shed = layer("panics", 10);
    let (tx, mut entered) = mpsc::unbounded_channel();
    let gate = Arc::new(Semaphore::new(0));
    let svc = tower::Layer::layer(&shed, app(tx.clone(), gate.clone()));
    let req = |path: &str| Request::get(path).body(axum::body::Body::empty()).unwrap();
    let panicked = tokio::spawn(svc.clone().oneshot(req("/panic")));
    assert!(panicked.await.unwrap_err().is_panic());
    assert_eq!(
        shed.in_flight(),
        0,
        "the panicking request's admission was released"
    );

    // A request abandoned while the handler runs.
    let abandoned = tokio::spawn(svc.clone().oneshot(req("/")));
    entered.recv().await.unwrap();
    assert_eq!(shed.in_flight(), 1);
    abandoned.abort();
    assert!(abandoned.await.unwrap_err().is_cancelled());
    assert_eq!(shed.in_flight(), 0);

    // Shadow mode: capacity 2 allows one normal request, but three all run.
    let shadow = LoadShedLayer::builder()
        .capacity(2)
        .shadow(true)
        .build()
        .unwrap();
    let server = TestServer::start(app(tx, gate.clone()).layer(shadow.clone())).await;
    let c = HttpClient::new();
    let mut held = JoinSet::new();
    for _ in 0..3 {
        let (c, url) = (c.clone(), server.url("/"));
        held.spawn(async move { c.get(&url).await });
    }
    for _ in 0..3 {
        entered.recv().await.unwrap();
    }
    assert_eq!(shadow.in_flight(), 3);
    gate.add_permits(3);
    while let Some(r) = held.join_next().await {
        assert_eq!(r.unwrap().status, StatusCode::OK);
    }
}

/// The Prometheus text line of `name{labels}`, parsed.
fn gauge(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

#[tokio::test]
async fn the_demo_sheds_by_x_priority_and_caps_each_keys_requests_in_flight() {
    let metrics_addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let demo = example::Running::start(
        "demo",
        &[
            "--listen",
            "127.0.0.1:0",
            "--limit",
            "1000",
            "--key",
            "header:x-client",
            "--concurrency",
            "1",
            "--shed-capacity",
            "2",
            "--headers",
            "ietf",
            "--metrics-listen",
            &metrics_addr,
        ],
    );
    let c = HttpClient::new();
    let get = |path: &str, client: &'static str, priority: &'static str| {
        let (c, url) = (c.clone(), demo.url(path));
        async move {
            c.get_with(
                &url,
                &[
                    ("x-client", client.as_bytes()),
                    ("x-priority", priority.as_bytes()),
                ],
            )
            .await
        }
    };
    // One slow request is in flight (capacity 2: normal, low and test may use 1 of it).
    let slow = tokio::spawn(get("/slow/600000", "a", "normal"));
    let metrics_url = format!("http://{metrics_addr}/metrics");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = c.get(&metrics_url).await.body;
        if gauge(&text, "load_shed_in_flight{limiter=\"load_shed\"}") == Some(1.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slow request never started: {text}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for class in ["normal", "low", "test"] {
        let r = get("/", "b", class).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{class}");
        assert_eq!(r.header_u64("retry-after"), 1);
    }
    assert_eq!(get("/", "b", "critical").await.status, StatusCode::OK);
    // Past the shedder, the same client's second request meets its concurrency cap.
    let r = get("/", "a", "critical").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        r.header("ratelimit-policy")
            .is_some_and(|p| p.starts_with(r#""concurrency";q=1;qu="concurrent-requests""#)),
        "{r:?}"
    );
    let text = c.get(&metrics_url).await.body;
    assert!(
        text.contains(
            "load_shed_decisions_total{limiter=\"load_shed\",class=\"test\",outcome=\"shed\"} 1"
        ),
        "{text}"
    );
    slow.abort();
    drop(demo); // killed: graceful shutdown would wait for the slow request
}
