//! The advisor, fed a synthetic trace with known peaks through the layer
//! (time moved by a `ManualClock`): its peaks, percentiles and suggested
//! limits per key and per tier are the values the trace was built to give.

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Empty;
use std::convert::Infallible;
use std::time::Duration;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_ratelimit::clock::ManualClock;
use tower_ratelimit::key::Header;
use tower_ratelimit::rate::Advisor;
use tower_ratelimit::{Policy, RateLimitLayer};

const MINUTE: Duration = Duration::from_secs(60);

/// A layer of 100 requests a minute per `x-tenant`, on `clock`, with
/// `advisor` counting per minute (headroom 1.5).
fn tenants_at_100_a_minute(clock: &ManualClock, advisor: Advisor) -> RateLimitLayer {
    RateLimitLayer::builder()
        .quota("100/1m".parse::<Policy>().unwrap())
        .key(Header::try_new("x-tenant").unwrap())
        .clock(clock.clone())
        .advisor(advisor.window(MINUTE).headroom(1.5))
        .build()
        .unwrap()
}

/// `n` requests of `tenant` through `svc`.
async fn send<S>(svc: &mut S, tenant: &str, n: u64)
where
    S: Service<Request<Empty<Bytes>>>,
    S::Error: std::fmt::Debug,
{
    for _ in 0..n {
        let req = Request::builder()
            .header("x-tenant", tenant)
            .body(Empty::new())
            .unwrap();
        svc.ready().await.unwrap().call(req).await.unwrap();
    }
}

#[tokio::test]
async fn suggestions_are_the_percentile_of_usage_per_window_times_the_headroom() {
    let clock = ManualClock::new(1_700_000_040_000); // a minute boundary
    let advisor = Advisor::new().windows(20).percentile(0.95);
    let layer = tenants_at_100_a_minute(&clock, advisor);
    layer
        .limits()
        .set("vip", "1000/1m".parse().unwrap())
        .await
        .unwrap();
    let mut svc = layer
        .clone()
        .layer(service_fn(|_: Request<Empty<Bytes>>| async {
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        }));
    // 20 one-minute windows:
    // - a: 10 a window, 50 in window 7;
    // - b: w + 1 in window w (1 to 20);
    // - vip: 200 a window, 400 in window 3 (its own tier, 1000/1m).
    for w in 0..20u64 {
        let a = if w == 7 { 50 } else { 10 };
        let vip = if w == 3 { 400 } else { 200 };
        for (tenant, n) in [("a", a), ("b", w + 1), ("vip", vip)] {
            send(&mut svc, tenant, n).await;
        }
        clock.advance(MINUTE);
    }
    let advice = layer.advice().unwrap();
    assert_eq!(advice.windows, 20);
    let key = |name: &str| {
        advice
            .keys
            .iter()
            .find(|k| k.text.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("{name} is not reported: {advice:?}"))
    };
    // (peak, p95, current, suggested): p95 is the 19th of 20 windows.
    let got = |name| {
        let k = key(name);
        (
            k.peak,
            k.percentile,
            k.current,
            k.suggested,
            k.tier.as_str(),
        )
    };
    assert_eq!(got("a"), (50, 10, 100, 15, "100/1m"));
    assert_eq!(got("b"), (20, 19, 100, 29, "100/1m"));
    assert_eq!(got("vip"), (400, 200, 1000, 300, "1000/1m"));
    assert_eq!(key("b").usage, (1..=20).collect::<Vec<u64>>());
    assert_eq!(
        advice.keys[0].text.as_deref(),
        Some("vip"),
        "heaviest first"
    );

    // The 100/1m tier: a's and b's 40 windows; the 38th of them is b's 19.
    let tier = |name: &str| advice.tiers.iter().find(|t| t.tier == name).unwrap();
    let t = tier("100/1m");
    assert_eq!(
        (t.keys, t.peak, t.percentile, t.current, t.suggested),
        (2, 50, 19, 100, 29)
    );
    let t = tier("1000/1m");
    assert_eq!(
        (t.keys, t.peak, t.percentile, t.current, t.suggested),
        (1, 400, 200, 1000, 300)
    );

    // The open window is not reported until it closes.
    send(&mut svc, "c", 5).await;
    assert!(layer
        .advice()
        .unwrap()
        .keys
        .iter()
        .all(|k| k.text.as_deref() != Some("c")));
}

use crate::support::example;
use crate::support::http as http_support;

/// The demo's `GET /rate_limit/advice`, on the built example: a client's
/// usage shows once its window closed; without `--advise`, a 404.
#[tokio::test]
async fn the_demo_serves_the_advice_as_json() {
    let demo = example::Running::start(
        "demo",
        &[
            "--listen",
            "127.0.0.1:0",
            "--limit",
            "50",
            "--window",
            "1s",
            "--key",
            "header:x-client",
            "--advise",
        ],
    );
    let c = http_support::HttpClient::new();
    for _ in 0..7 {
        c.get_with(&demo.url("/"), &[("x-client", b"alice")]).await;
    }
    // The windows of those requests (one, or two if they straddled a
    // second) close within two seconds of wall time.
    let start = std::time::Instant::now();
    let body = loop {
        let r = c.get(&demo.url("/rate_limit/advice")).await;
        assert_eq!(r.status, http::StatusCode::OK, "{}", r.body);
        if usage_of_alice(&r.body).iter().sum::<u64>() == 7 {
            break r.body;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{}", r.body);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(body.starts_with(r#"{"window_ms":1000,"#), "{body}");
    assert!(
        body.contains(r#""key":"alice","tier":"50/1s","usage":["#),
        "{body}"
    );
    assert!(demo.terminate().success());

    let plain = example::Running::start("demo", &["--listen", "127.0.0.1:0"]);
    let r = c.get(&plain.url("/rate_limit/advice")).await;
    assert_eq!(r.status, http::StatusCode::NOT_FOUND);
    assert!(plain.terminate().success());
}

/// Alice's usage per window in the demo's advice JSON.
fn usage_of_alice(body: &str) -> Vec<u64> {
    let Some(at) = body.find(r#""key":"alice","tier":"50/1s","usage":["#) else {
        return Vec::new();
    };
    let rest = &body[at..];
    let list = &rest[rest.find('[').unwrap() + 1..rest.find(']').unwrap()];
    list.split(',').filter_map(|n| n.parse().ok()).collect()
}

#[cfg(feature = "redis")]
use crate::support::redis as redis_support;

/// Two instances on one Redis, each seeing part of each tenant's traffic:
/// the fleet's report sums them, window by window, while each instance's
/// own report shows its share.
#[cfg(feature = "redis")]
#[tokio::test]
async fn the_fleet_report_sums_every_instances_windows_in_redis() {
    use tower_ratelimit::store::RedisStore;
    redis_support::require_redis();
    let redis = redis_support::RedisServer::start();
    let clock = ManualClock::new(1_700_000_040_000);
    let instance = || {
        let advisor = Advisor::new().windows(5).percentile(1.0);
        tenants_at_100_a_minute(&clock, advisor.fleet(RedisStore::new(redis.url()).unwrap()))
    };
    let (a, b) = (instance(), instance());
    let serve = |layer: &RateLimitLayer| {
        layer
            .clone()
            .layer(service_fn(|_: Request<Empty<Bytes>>| async {
                Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
            }))
    };
    let (mut sa, mut sb) = (serve(&a), serve(&b));
    // Window w: "x" sends w + 1 through a and 10 through b; "y" 3 through a.
    for w in 0..5u64 {
        for (on_a, tenant, n) in [(true, "x", w + 1), (false, "x", 10), (true, "y", 3)] {
            send(if on_a { &mut sa } else { &mut sb }, tenant, n).await;
        }
        clock.advance(MINUTE);
    }
    let usage = |advice: &tower_ratelimit::rate::Advice, name: &str| {
        advice
            .keys
            .iter()
            .find(|k| k.text.as_deref() == Some(name))
            .map(|k| k.usage.clone())
            .unwrap_or_default()
    };
    // Each instance sends its closed windows in the background, and before
    // its own fleet report: once both have reported, Redis has them all.
    b.fleet_advice().await.unwrap().unwrap();
    let fleet = a.fleet_advice().await.unwrap().unwrap();
    assert_eq!(fleet.windows, 5);
    assert_eq!(usage(&fleet, "x"), vec![11, 12, 13, 14, 15]);
    assert_eq!(usage(&fleet, "y"), vec![3; 5]);
    let x = fleet
        .keys
        .iter()
        .find(|k| k.text.as_deref() == Some("x"))
        .unwrap();
    assert_eq!(
        (x.peak, x.current, x.suggested, x.tier.as_str()),
        (15, 100, 23, "100/1m")
    );
    assert_eq!(
        usage(&a.advice().unwrap(), "x"),
        vec![1, 2, 3, 4, 5],
        "a's own share"
    );
    assert_eq!(
        b.fleet_advice().await.unwrap().unwrap(),
        fleet,
        "the same from either"
    );
}
