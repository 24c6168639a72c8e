//! The IETF `RateLimit-Policy` and `RateLimit` fields of real responses,
//! for arbitrary quotas, names, costs and times: every value the builders
//! accept gives fields that `sfv` parses back, with one member per quota
//! carrying its name and numbers.
#![no_main]

use arbitrary::Arbitrary;
use futures_util::FutureExt;
use libfuzzer_sys::fuzz_target;
use sfv::{BareItem, ListEntry, Parser};
use std::time::Duration;
use tower::{Layer, Service};
use tower_ratelimit::clock::ManualClock;
use tower_ratelimit::{Algorithm, headers::HeaderStyle, Policy, Quota, RateLimitLayer};

#[derive(Arbitrary, Debug)]
struct Q {
    limit: u64,
    window_ms: u64,
    algorithm: u8,
    burst: Option<u64>,
    name: Option<String>,
}

#[derive(Arbitrary, Debug)]
struct Input {
    quotas: Vec<Q>,
    requests: Vec<(u64, u32)>,
    start_ms: u64,
}

fn quota(q: &Q) -> Option<Quota> {
    let algorithm = Algorithm::ALL[usize::from(q.algorithm) % Algorithm::ALL.len()];
    let mut quota = Quota::new(q.limit, Duration::from_millis(q.window_ms))
        .ok()?
        .with_algorithm(algorithm)
        .ok()?;
    if let Some(b) = q.burst.filter(|_| algorithm.has_burst()) {
        quota = quota.burst(b).ok()?;
    }
    match &q.name {
        Some(n) => quota.named(n.clone()).ok(),
        None => Some(quota),
    }
}

fn members(value: &http::HeaderValue) -> Vec<ListEntry> {
    Parser::new(value.as_bytes())
        .parse::<sfv::List>()
        .unwrap_or_else(|e| panic!("{value:?} does not parse: {e}"))
}

fuzz_target!(|input: Input| {
    let mut quotas = input.quotas.iter().take(4).filter_map(quota);
    let Some(first) = quotas.next() else { return };
    let mut policy = Policy::new(first);
    for q in quotas {
        if let Ok(p) = policy.clone().and(q) {
            policy = p;
        }
    }
    let clock = ManualClock::new(input.start_ms % (1 << 45));
    let Ok(layer) = RateLimitLayer::builder()
        .quota(policy.clone())
        .headers(HeaderStyle::Ietf)
        .clock(clock.clone())
        .cost({
            let costs: Vec<u64> = input.requests.iter().map(|r| r.0).collect();
            let next = std::sync::atomic::AtomicUsize::new(0);
            move |_: &http::request::Parts| {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                costs.get(i).copied().unwrap_or(1)
            }
        })
        .build()
    else {
        return;
    };
    let mut svc = layer.layer(tower::service_fn(|_: http::Request<()>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    }));
    for (_, advance) in input.requests.iter().take(8) {
        clock.advance(Duration::from_millis(u64::from(*advance)));
        let res = svc
            .call(http::Request::new(()))
            .now_or_never()
            .expect("the memory store answers at once")
            .unwrap();
        let (Some(p), Some(s)) = (res.headers().get("ratelimit-policy"), res.headers().get("ratelimit")) else {
            panic!("no IETF fields on {:?}", res.status());
        };
        let (p, s) = (members(p), members(s));
        assert_eq!(p.len(), policy.quotas().len());
        assert_eq!(s.len(), policy.quotas().len());
        for ((q, pm), sm) in policy.quotas().iter().zip(&p).zip(&s) {
            let (ListEntry::Item(pm), ListEntry::Item(sm)) = (pm, sm) else {
                panic!("an inner list");
            };
            let name = BareItem::String(sfv::String::from_string(q.name().into_owned()).unwrap());
            assert_eq!(pm.bare_item, name);
            assert_eq!(sm.bare_item, name);
            let q_param = pm.params.get("q").and_then(BareItem::as_integer).map(i64::from);
            assert_eq!(q_param, Some(q.burst_size() as i64));
            let r = sm.params.get("r").and_then(BareItem::as_integer).map(i64::from).unwrap();
            assert!((0..=q.burst_size() as i64).contains(&r));
        }
    }
});
