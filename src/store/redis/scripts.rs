//! Every Lua script, loaded once from `lua/` and run with `EVALSHA` (reloaded
//! transparently after `NOSCRIPT`: a restarted or `SCRIPT FLUSH`ed Redis).
//!
//! Each script is assembled at compile time from the shared prelude, one file
//! per algorithm (each the twin of its `src/algorithm/*.rs`) and the script's
//! own file, so a policy mixing algorithms is still charged in one call.

use deadpool_redis::redis::Script;
use std::sync::LazyLock;

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
            include_str!($own),
        )
    };
}

/// Charges every quota of a policy, all or nothing (`lua/charge.lua`).
pub(crate) static CHARGE: LazyLock<Script> =
    LazyLock::new(|| Script::new(script!("../../../lua/charge.lua")));

/// Refunds a charge to the state it was charged to (`lua/refund.lua`).
pub(crate) static REFUND: LazyLock<Script> =
    LazyLock::new(|| Script::new(script!("../../../lua/refund.lua")));

/// Reads every quota's state without writing (`lua/status.lua`); replicas can run it.
pub(crate) static STATUS: LazyLock<Script> =
    LazyLock::new(|| Script::new(script!("../../../lua/status.lua")));
