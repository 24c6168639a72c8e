//! Why the fleet load shedder counts requests in flight with leased slots
//! and not with coordinated counts: a model of both, in integer
//! milliseconds, of the flood the fleet shedder's acceptance runs (a share
//! of 7 requests in flight for `low`, requests of 200 ms, every instance
//! offered one a millisecond).
//!
//! - **Leased slots** (what `LoadShedLayerBuilder::fleet_capacity` does):
//!   one atomic acquire in Redis per request that passes this instance's
//!   checks and one release when it ends, against the fleet's one count.
//! - **Coordinated counts** (the coordinated rate limit's way, applied to
//!   requests in flight): each instance knows its own count exactly and the
//!   others' as of the last sync, one Redis round trip per instance per
//!   interval, none per request.
//!
//! The test prints, per instances and interval, the most requests the
//! fleet ran at once and the Redis calls a second each way, and holds the
//! leased count to the share and the coordinated one to what the model
//! says it is: over the share whenever the fleet has more than one
//! instance, because between two syncs each instance fills the room it saw.
//! The real leased shedder is held to the share in `tests/fleet_shed.rs`.

const SHARE: u64 = 7;
const HOLD_MS: u64 = 200;
const RUN_MS: u64 = 5_000;

/// What a run of the model saw.
#[derive(Debug, Clone, Copy)]
struct Seen {
    /// The most requests in flight across the fleet at once.
    max_in_flight: u64,
    /// Redis calls per second.
    calls_per_s: f64,
}

/// Requests in flight of one instance: the times each one ends.
#[derive(Default, Clone)]
struct Instance {
    ends: Vec<u64>,
    /// What the others had in flight at the last sync (coordinated).
    others_at_sync: u64,
}

impl Instance {
    fn expire(&mut self, now: u64) {
        self.ends.retain(|&end| end > now);
    }
}

fn leased(instances: usize) -> Seen {
    let mut fleet: Vec<Instance> = vec![Instance::default(); instances];
    let (mut calls, mut max) = (0u64, 0u64);
    for now in 0..RUN_MS {
        for i in &mut fleet {
            i.expire(now);
        }
        for i in 0..instances {
            // One acquire against the fleet's count, exact and atomic.
            calls += 1;
            let in_flight: u64 = fleet.iter().map(|f| f.ends.len() as u64).sum();
            if in_flight < SHARE {
                fleet[i].ends.push(now + HOLD_MS);
                calls += 1; // its release
            }
        }
        max = max.max(fleet.iter().map(|f| f.ends.len() as u64).sum());
    }
    Seen {
        max_in_flight: max,
        calls_per_s: calls as f64 * 1_000.0 / RUN_MS as f64,
    }
}

fn coordinated(instances: usize, interval_ms: u64) -> Seen {
    let mut fleet: Vec<Instance> = vec![Instance::default(); instances];
    let (mut calls, mut max) = (0u64, 0u64);
    for now in 0..RUN_MS {
        for i in &mut fleet {
            i.expire(now);
        }
        if now % interval_ms == 0 {
            // Every instance reports its count and reads the others'.
            let counts: Vec<u64> = fleet.iter().map(|f| f.ends.len() as u64).collect();
            let total: u64 = counts.iter().sum();
            for (f, own) in fleet.iter_mut().zip(counts) {
                f.others_at_sync = total - own;
                calls += 1;
            }
        }
        for f in &mut fleet {
            if f.others_at_sync + (f.ends.len() as u64) < SHARE {
                f.ends.push(now + HOLD_MS);
            }
        }
        max = max.max(fleet.iter().map(|f| f.ends.len() as u64).sum());
    }
    Seen {
        max_in_flight: max,
        calls_per_s: calls as f64 * 1_000.0 / RUN_MS as f64,
    }
}

#[test]
fn leased_slots_hold_the_share_where_coordinated_counts_of_requests_in_flight_overshoot_it() {
    println!("| instances | counting | most in flight (share {SHARE}) | Redis calls/s |");
    println!("|---:|---|---:|---:|");
    for instances in [2, 4, 10] {
        let l = leased(instances);
        println!(
            "| {instances} | leased slots | {} | {:.0} |",
            l.max_in_flight, l.calls_per_s
        );
        assert_eq!(
            l.max_in_flight, SHARE,
            "leased slots fill the share, never more"
        );
        for interval in [10, 100, 1_000] {
            let c = coordinated(instances, interval);
            println!(
                "| {instances} | coordinated, {interval} ms | {} | {:.0} |",
                c.max_in_flight, c.calls_per_s
            );
            // Each instance fills what it saw free: up to the share each.
            assert!(
                c.max_in_flight > SHARE && c.max_in_flight <= SHARE * instances as u64,
                "{instances} instances, {interval} ms: {}",
                c.max_in_flight
            );
        }
    }
}
