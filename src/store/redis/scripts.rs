//! Every Lua script, loaded once from `lua/` and run with `EVALSHA` (reloaded
//! transparently after `NOSCRIPT`: a restarted or `SCRIPT FLUSH`ed Redis).
//!
//! Each script is assembled from the shared prelude, one file per algorithm
//! (each the twin of its `src/algorithm/*.rs`) and the script's own file, so
//! a policy mixing algorithms is still charged in one call. The charge script
//! carries only the algorithms its batch uses ([`charge`]): Redis runs a
//! script's whole top level (every function definition) on each call, so a
//! fixed-window batch does not pay for the other four algorithms, nor a
//! batch of plain policies for waiting and the penalty box
//! (`lua/refusal.lua`).

use crate::Algorithm;
use redis::Script;
use std::sync::{LazyLock, OnceLock};

const PRELUDE: &str = include_str!("../../../lua/prelude.lua");
const RATE: &str = include_str!("../../../lua/rate.lua");
const POLICY: &str = include_str!("../../../lua/policy.lua");
const CHARGE_OWN: &str = include_str!("../../../lua/charge.lua");
const REFUSAL: &str = include_str!("../../../lua/refusal.lua");
/// Each algorithm's file, in registration order, with the bit [`charge`] keys it by.
const ALGORITHMS: [(Algorithm, &str); 5] = [
    (
        Algorithm::FixedWindow,
        include_str!("../../../lua/fixed_window.lua"),
    ),
    (
        Algorithm::TokenBucket,
        include_str!("../../../lua/token_bucket.lua"),
    ),
    (
        Algorithm::SlidingWindow,
        include_str!("../../../lua/sliding_window.lua"),
    ),
    (Algorithm::Gcra, include_str!("../../../lua/gcra.lua")),
    (
        Algorithm::SlidingLog,
        include_str!("../../../lua/sliding_log.lua"),
    ),
];

/// The bit of a batch with a policy that waits or keeps a penalty box, in
/// a set of algorithms (see [`charge`]).
pub(crate) const REFUSING: usize = 1 << ALGORITHMS.len();

/// The bit of `algorithm` in a set of algorithms (see [`charge`]).
pub(crate) fn bit(algorithm: Algorithm) -> usize {
    1 << ALGORITHMS
        .iter()
        .position(|(a, _)| *a == algorithm)
        .expect("every algorithm has a file")
}

/// The charge script's source for the algorithms in the set `algorithms`
/// (and `lua/refusal.lua` with [`REFUSING`]).
pub(crate) fn charge_source(algorithms: usize) -> String {
    let mut src = String::from(PRELUDE);
    if algorithms & (bit(Algorithm::TokenBucket) | bit(Algorithm::Gcra)) != 0 {
        src.push_str(RATE);
    }
    for (a, file) in ALGORITHMS {
        if algorithms & bit(a) != 0 {
            src.push_str(file);
        }
    }
    src.push_str(POLICY);
    if algorithms & REFUSING != 0 {
        src.push_str(REFUSAL);
    }
    src.push_str(CHARGE_OWN);
    src
}

/// Charges a batch of requests (`lua/charge.lua`) whose policies use only the
/// algorithms in the set `algorithms` (bits from [`bit`], and [`REFUSING`]
/// when a policy waits or keeps a penalty box).
pub(crate) fn charge(algorithms: usize) -> &'static Script {
    // Each set's script is hashed when first used: hashing all of them
    // up front held up a process's first charges.
    static SCRIPTS: [OnceLock<Script>; REFUSING << 1] = [const { OnceLock::new() }; REFUSING << 1];
    let set = algorithms & ((REFUSING << 1) - 1);
    SCRIPTS[set].get_or_init(|| Script::new(&charge_source(set)))
}

macro_rules! script {
    ($own:literal) => {
        concat!(
            include_str!("../../../lua/prelude.lua"),
            include_str!("../../../lua/rate.lua"),
            include_str!("../../../lua/fixed_window.lua"),
            include_str!("../../../lua/token_bucket.lua"),
            include_str!("../../../lua/sliding_window.lua"),
            include_str!("../../../lua/gcra.lua"),
            include_str!("../../../lua/sliding_log.lua"),
            include_str!("../../../lua/policy.lua"),
            include_str!("../../../lua/refusal.lua"),
            include_str!($own),
        )
    };
}

/// Settles a charge against the states it was charged to (`lua/settle.lua`).
pub(crate) static SETTLE: LazyLock<Script> =
    LazyLock::new(|| Script::new(script!("../../../lua/settle.lua")));

/// Reads every quota's state without writing (`lua/status.lua`); replicas can run it.
pub(crate) static STATUS: LazyLock<Script> =
    LazyLock::new(|| Script::new(script!("../../../lua/status.lua")));

/// Takes an in-flight slot (`lua/concurrency_acquire.lua`); standalone, no algorithm prelude.
pub(crate) static CONCURRENCY_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/concurrency_acquire.lua")));

/// Gives an in-flight slot back (`lua/concurrency_release.lua`).
pub(crate) static CONCURRENCY_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/concurrency_release.lua")));
