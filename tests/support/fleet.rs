//! A simulated fleet: N rate limit layers in one process, one shared
//! `ManualClock`, a balancer spreading each second's requests over the
//! instances millisecond by millisecond (or paced clients, each sending
//! to the instances in turn, as a simple load generator does), and each
//! instance syncing at its own phase of the interval's middle half, as
//! the mode's background task does. `tools/src/bin/simulate.rs` and the
//! coordinated-mode tests run it.
#![allow(dead_code)]

use axum::body::Body;
use http::{Request, StatusCode};
use std::convert::Infallible;
use std::time::Duration;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_ratelimit::clock::ManualClock;
use tower_ratelimit::key::Header;
use tower_ratelimit::store::{Coordinated, CoordinatedBuilder};
use tower_ratelimit::{Quota, RateLimitLayer, RateLimitLayerBuilder};

/// How the balancer picks an instance for each request.
#[derive(Clone, Copy, Debug)]
pub enum Balancer {
    /// In turn.
    RoundRobin,
    /// Uniformly at random, from this seed.
    Random(u64),
    /// `clients` paced clients, each sending its part of the offered load
    /// at a fixed period and to the instances in turn, starting with the
    /// first, as a simple load generator does: with `phases: None` all
    /// start at the same moment (so each round of requests lands on one
    /// instance at once), else at phases drawn from this seed.
    Paced { clients: usize, phases: Option<u64> },
}

/// The header the simulated clients' keys travel in.
pub const KEY_HEADER: &str = "x-sim-key";

/// One instance of a simulated fleet, still to be given its mode: `limit`
/// requests a second for each key (read from [`KEY_HEADER`]), on `clock`.
pub fn instance(name: &str, limit: u64, clock: &ManualClock) -> RateLimitLayerBuilder {
    RateLimitLayer::builder()
        .name(name)
        .quota(Quota::new(limit, Duration::from_secs(1)).unwrap())
        .key(Header::try_new(KEY_HEADER).unwrap())
        .clock(clock.clone())
}

/// An [`instance`] whose store is the coordinated one `coordinated` builds,
/// on `clock` and synced by hand: a layer and its store, for [`Fleet::new`].
#[allow(dead_code)]
pub fn coordinated(
    name: &str,
    limit: u64,
    clock: &ManualClock,
    coordinated: CoordinatedBuilder,
) -> (RateLimitLayer, Option<Coordinated>) {
    let store = coordinated
        .clock(clock.clone())
        .manual_sync()
        .build()
        .unwrap();
    let layer = instance(name, limit, clock)
        .store(store.clone())
        .build()
        .unwrap();
    (layer, Some(store))
}

pub struct Fleet {
    layers: Vec<RateLimitLayer>,
    /// Each instance's coordinated store, synced by hand at its phase.
    coordinated: Vec<Option<Coordinated>>,
    clock: ManualClock,
    /// The instances that sync at each millisecond of the interval.
    syncs: Vec<Vec<usize>>,
    keys: Vec<String>,
    balancer: Balancer,
    rng: fastrand::Rng,
    next: usize,
    next_key: usize,
    /// Admitted per key in the last second.
    by_key: Vec<u64>,
    /// Milliseconds since the fleet started.
    elapsed: u64,
    /// Paced clients: when each one's next request is due (ms since the
    /// start) and how many it sent.
    clients: Vec<(f64, u64)>,
}

impl Fleet {
    /// A fleet of `instances` (a layer, and its coordinated store if it
    /// has one) on `clock`, syncing every `interval` at phases
    /// spread evenly over its middle half, with requests spread over `keys`
    /// in turn.
    pub fn new(
        instances: Vec<(RateLimitLayer, Option<Coordinated>)>,
        clock: ManualClock,
        interval: Duration,
        keys: usize,
        balancer: Balancer,
    ) -> Self {
        let interval_ms = (interval.as_millis() as usize).max(1);
        let mut syncs = vec![Vec::new(); interval_ms];
        let (layers, coordinated): (Vec<_>, Vec<_>) = instances.into_iter().unzip();
        let n = layers.len();
        for i in 0..n {
            syncs[interval_ms / 4 + i * interval_ms / (2 * n.max(1))].push(i);
        }
        let seed = match balancer {
            Balancer::Random(seed)
            | Balancer::Paced {
                phases: Some(seed), ..
            } => seed,
            Balancer::RoundRobin | Balancer::Paced { phases: None, .. } => 0,
        };
        let clients = match balancer {
            Balancer::Paced { clients, .. } => clients.max(1),
            _ => 0,
        };
        Self {
            layers,
            coordinated,
            clock,
            syncs,
            keys: (0..keys.max(1)).map(|k| format!("client-{k}")).collect(),
            balancer,
            rng: fastrand::Rng::with_seed(seed),
            next: 0,
            next_key: 0,
            by_key: vec![0; keys.max(1)],
            elapsed: 0,
            clients: vec![(0.0, 0); clients],
        }
    }

    pub fn clock(&self) -> &ManualClock {
        &self.clock
    }

    /// The keys' names (`client-0`, `client-1`, …), as sent in [`KEY_HEADER`].
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// Admitted per key in the last [`Fleet::second`].
    pub fn admitted_by_key(&self) -> &[u64] {
        &self.by_key
    }

    /// Offers `offered` requests over one simulated second, spread evenly
    /// over its milliseconds (paced clients: each client's part at its own
    /// period and phase); returns how many were admitted.
    pub async fn second(&mut self, offered: u64) -> u64 {
        let mut admitted = 0;
        self.by_key.iter_mut().for_each(|n| *n = 0);
        if self.elapsed == 0 {
            self.place_clients(offered);
        }
        for ms in 0..1000u64 {
            if self.clients.is_empty() {
                let now = offered * (ms + 1) / 1000 - offered * ms / 1000;
                for _ in 0..now {
                    let i = match self.balancer {
                        Balancer::Random(_) => self.rng.usize(..self.layers.len()),
                        _ => self.next % self.layers.len(),
                    };
                    self.next += 1;
                    admitted += u64::from(self.request(i).await);
                }
            } else {
                // Each client sends its part of the load at its own pace,
                // its k-th request to instance k.
                let period = 1000.0 * self.clients.len() as f64 / offered.max(1) as f64;
                for c in 0..self.clients.len() {
                    if offered == 0 {
                        self.clients[c].0 = self.clients[c].0.max(self.elapsed as f64);
                        continue;
                    }
                    while self.clients[c].0 <= self.elapsed as f64 {
                        let sent = self.clients[c].1;
                        self.clients[c] = (self.clients[c].0 + period, sent + 1);
                        let i = (sent % self.layers.len() as u64) as usize;
                        admitted += u64::from(self.request(i).await);
                    }
                }
            }
            self.clock.advance(Duration::from_millis(1));
            self.elapsed += 1;
            self.sync_due().await;
        }
        admitted
    }

    /// The paced clients' first requests, within one period of the first
    /// second's pace: all at once, or at drawn phases.
    fn place_clients(&mut self, offered: u64) {
        let Balancer::Paced { phases, .. } = self.balancer else {
            return;
        };
        let period = 1000 * self.clients.len() as u64 / offered.max(1);
        for c in &mut self.clients {
            c.0 = phases.map_or(0, |_| self.rng.u64(0..period.max(1))) as f64;
        }
    }

    async fn request(&mut self, i: usize) -> bool {
        // Keys in turn per round of instances, so every instance sees every key.
        let k = (self.next_key / self.layers.len()) % self.keys.len();
        let key = &self.keys[k];
        self.next_key += 1;
        let mut svc = self.layers[i].layer(service_fn(|_r: Request<Body>| async {
            Ok::<_, Infallible>(http::Response::new(Body::empty()))
        }));
        let req = Request::builder()
            .header(KEY_HEADER, key.as_str())
            .body(Body::empty())
            .unwrap();
        let res = svc.ready().await.unwrap().call(req).await.unwrap();
        let ok = res.status() == StatusCode::OK;
        self.by_key[k] += u64::from(ok);
        ok
    }

    async fn sync_due(&mut self) {
        use tower_ratelimit::clock::Clock;
        let phase = (self.clock.now_ms() % self.syncs.len() as u64) as usize;
        let now = self.clock.now_ms();
        for &i in &self.syncs[phase] {
            // A failed sync is the mode's business (its keys go stale).
            if let Some(c) = &self.coordinated[i] {
                let _ = c.sync_now(now).await;
            }
        }
    }
}

/// What a run did, second by second, against a limit.
pub struct Run {
    /// (offered, admitted) per second.
    pub seconds: Vec<(u64, u64)>,
    pub limit: u64,
}

impl Run {
    /// The mean admitted rate over `range` of seconds, relative to the
    /// limit, minus one (0.03 is 3% over).
    pub fn mean_error(&self, range: std::ops::Range<usize>) -> f64 {
        let s = &self.seconds[range];
        let mean = s.iter().map(|(_, a)| *a as f64).sum::<f64>() / s.len().max(1) as f64;
        mean / self.limit as f64 - 1.0
    }

    /// The share of seconds in `range` admitting within `tolerance` of the limit.
    pub fn within(&self, range: std::ops::Range<usize>, tolerance: f64) -> f64 {
        let s = &self.seconds[range];
        let limit = self.limit as f64;
        let ok = s
            .iter()
            .filter(|(_, a)| (*a as f64 - limit).abs() <= tolerance * limit)
            .count();
        ok as f64 / s.len().max(1) as f64
    }

    /// The largest overshoot (admitted over the limit, relative) and the
    /// longest run of seconds more than 10% over the limit.
    pub fn overshoot(&self) -> (f64, usize) {
        let limit = self.limit as f64;
        let worst = self
            .seconds
            .iter()
            .map(|(_, a)| *a as f64 / limit - 1.0)
            .fold(0.0, f64::max);
        let (mut longest, mut run) = (0, 0);
        for (_, a) in &self.seconds {
            run = if *a as f64 > 1.1 * limit { run + 1 } else { 0 };
            longest = longest.max(run);
        }
        (worst, longest)
    }

    /// Seconds from `from` until admissions stay within 10% of what they
    /// should be (the offered load or the limit, whichever is lower) up to
    /// `to`; `None` if they never do.
    pub fn converged_after(&self, from: usize, to: usize) -> Option<usize> {
        let ok = |(o, a): &(u64, u64)| {
            let target = (*o).min(self.limit) as f64;
            (*a as f64 - target).abs() <= 0.1 * target
        };
        (from..to)
            .find(|&t| self.seconds[t..to].iter().all(ok))
            .map(|t| t - from)
    }
}
