//! The demo's duration, quota and key flags on arbitrary strings: an error
//! or a value, never a panic, and every value is usable.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../examples/common/mod.rs"]
mod common;

fuzz_target!(|s: &str| {
    if let Ok(d) = common::parse_duration(s) {
        assert!(!d.is_zero());
    }
    if let Ok((limit, window)) = common::parse_quota(s) {
        assert!(!window.is_zero());
        // A quota the flags accept is a policy or a clear configuration error.
        let _ = common::policy(&[(limit, window)], (limit, window), common::AlgorithmArg::FixedWindow, None);
    }
    if let Ok(kind) = common::parse_key(s) {
        assert!(common::key_extractor(&kind).is_ok(), "{s:?} parsed but gives no extractor");
    }
});
