//! Every Lua script, loaded once from `lua/` and run with `EVALSHA` (reloaded
//! transparently after `NOSCRIPT`: a restarted or `SCRIPT FLUSH`ed Redis).

use deadpool_redis::redis::Script;
use std::sync::LazyLock;

pub(crate) static FIXED_WINDOW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/fixed_window.lua")));

pub(crate) static REFUND_FIXED_WINDOW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/refund_fixed_window.lua")));

pub(crate) static CONCURRENCY_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/concurrency_acquire.lua")));

pub(crate) static CONCURRENCY_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/concurrency_release.lua")));
