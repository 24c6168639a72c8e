//! What a store call says: the limiter it belongs to ([`Namespace`]), a
//! charge ([`Charge`]) and a settlement ([`Settle`]).

use crate::algorithm::{self, Settled};
use crate::decision::Decision;
use crate::key::Key;
use crate::{Policy, Quota};
use std::time::Duration;

/// The default store timeout, of every layer
/// ([`store_timeout`](crate::builder::Builder::store_timeout)) and of a
/// [`Charge`] or [`Acquire`](super::Acquire) made with `new`: far above a
/// healthy Redis round trip (well under a millisecond on a LAN, a few at
/// p99.9), and small next to the request budgets of the services it
/// protects.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// The limiter a call belongs to: one store can serve several layers, each in
/// its own namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Namespace {
    name: String,
    id: u64,
}

impl Namespace {
    /// A namespace; `name` is validated by the layer builder (`[A-Za-z0-9_.-]`, 1..=64 bytes).
    pub fn new(name: &str) -> Self {
        use sha2::{Digest, Sha256};
        let d = Sha256::digest(name.as_bytes());
        let mut id = [0u8; 8];
        id.copy_from_slice(&d[..8]);
        Self {
            name: name.to_owned(),
            id: u64::from_le_bytes(id),
        }
    }

    /// The limiter's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A stable 64-bit id derived from the name.
    pub fn id(&self) -> u64 {
        self.id
    }
}

/// One charge: apply `policy` to `key` at `now_ms` with `cost`, all quotas or none.
///
/// ```
/// use std::num::NonZeroU32;
/// use tower_ratelimit::key::Key;
/// use tower_ratelimit::store::{Charge, Namespace};
/// use tower_ratelimit::{Policy, Quota};
/// let (ns, key) = (Namespace::new("api"), Key::new("client-1"));
/// let policy = Policy::new(Quota::per_second(NonZeroU32::new(10).unwrap()));
/// let charge = Charge::new(&ns, &key, &policy, 1_700_000_000_000).with_cost(3);
/// assert_eq!((charge.cost, charge.units), (3, 3));
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct Charge<'a> {
    /// The limiter.
    pub namespace: &'a Namespace,
    /// The client.
    pub key: &'a Key,
    /// The quotas to charge, all or nothing.
    pub policy: &'a Policy,
    /// What the request costs each quota that counts requests.
    pub cost: u64,
    /// What it reserves in each quota of another unit (see
    /// [`Quota::counts_requests`]): charged whole, and admitted while that
    /// quota has anything left (or, when it says so, while the reservation
    /// fits).
    pub units: u64,
    /// The application's time, Unix ms.
    pub now_ms: u64,
    /// How far ahead the request may be booked, in ms, when it does not fit
    /// now (0: not at all). Only for a policy that waits
    /// ([`Policy::wait`](crate::Policy::wait), feature `wait`): a store
    /// that books it admits the request for its turn, at most this far
    /// ahead, and says how long it waits
    /// ([`Decision::with_wait`](crate::decision::Decision::with_wait)).
    pub wait_ms: u64,
    /// How long the store may take to answer. Network stores count the time
    /// the call waits for the store (queued behind calls the store fails to
    /// answer, connecting, and the call itself), never the time it waits for
    /// the application's own runtime or behind calls the store answers; the
    /// layer bounds the whole wait too (see [`Store`](crate::store::Store)).
    pub timeout: Duration,
}

impl<'a> Charge<'a> {
    /// A charge of one request (cost 1, one unit reserved) at `now_ms`,
    /// with the default store timeout
    /// ([`DEFAULT_TIMEOUT`](crate::store::DEFAULT_TIMEOUT)).
    pub fn new(namespace: &'a Namespace, key: &'a Key, policy: &'a Policy, now_ms: u64) -> Self {
        Self {
            namespace,
            key,
            policy,
            cost: 1,
            units: 1,
            now_ms,
            wait_ms: 0,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// This charge with cost `cost`, reserving as many units.
    pub fn with_cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self.units = cost;
        self
    }

    /// This charge reserving `units` in each quota of another unit.
    pub fn with_units(mut self, units: u64) -> Self {
        self.units = units;
        self
    }

    /// This charge, booked at most `wait_ms` ahead when it does not fit now.
    pub fn with_wait(mut self, wait_ms: u64) -> Self {
        self.wait_ms = wait_ms;
        self
    }

    /// This charge with the store timeout `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// What this charge asks of `quota`: the units that must be left for it
    /// to be admitted, and the units it is charged when it is.
    pub fn ask(&self, quota: &Quota) -> (u64, u64) {
        let a = algorithm::ask(quota, self.cost, self.units);
        (a.fit, a.charge)
    }
}

/// One settlement: what an admitted request really cost, given to the
/// states its charge went to. Below what was charged the rest comes back;
/// above it the excess is charged to the same window or bucket (debt). It
/// never reaches a newer window, nor a state that is gone.
#[derive(Debug)]
#[non_exhaustive]
pub struct Settle<'a> {
    /// The original charge's fields, as charged.
    pub charge: Charge<'a>,
    /// The decision the charge returned (it identifies the states charged).
    pub decision: &'a Decision,
    /// What the request really cost each quota, in policy order. A quota
    /// without an entry keeps its charge.
    pub actual: Vec<u64>,
    /// When it is settled (Unix ms).
    pub now_ms: u64,
}

impl<'a> Settle<'a> {
    /// Everything `charge` took given back (a free response), settled at
    /// the charge's own time.
    pub fn free(charge: Charge<'a>, decision: &'a Decision) -> Self {
        let now_ms = charge.now_ms;
        let actual = vec![0; charge.policy.quotas().len()];
        Self {
            charge,
            decision,
            actual,
            now_ms,
        }
    }

    /// Quotas counting requests keep the charge's cost; every quota of
    /// another unit is settled to `units`, at `now_ms`.
    pub fn units(charge: Charge<'a>, decision: &'a Decision, units: u64, now_ms: u64) -> Self {
        let actual = charge
            .policy
            .quotas()
            .iter()
            .map(|q| {
                if q.counts_requests() {
                    charge.cost
                } else {
                    units
                }
            })
            .collect();
        Self {
            charge,
            decision,
            actual,
            now_ms,
        }
    }

    /// Each quota with its settlement, in policy order.
    pub(crate) fn each(&self) -> impl Iterator<Item = (&Quota, Settled)> + '_ {
        let quotas = self.charge.policy.quotas();
        quotas
            .iter()
            .zip(self.decision.statuses())
            .enumerate()
            .map(|(i, (q, st))| {
                let reserved = self.charge.ask(q).1;
                let settled = Settled {
                    window_id: st.window_id,
                    charged_at: self.charge.now_ms,
                    reserved,
                    actual: self.actual.get(i).copied().unwrap_or(reserved),
                };
                (q, settled)
            })
    }

    /// Whether it changes anything: some quota is owed other than it was charged.
    pub fn changes_anything(&self) -> bool {
        self.each().any(|(_, s)| s.reserved != s.actual)
    }
}
