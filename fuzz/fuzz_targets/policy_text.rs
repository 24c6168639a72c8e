//! The text form of policies (what runtime overrides and the admin
//! interface take from operators and Redis) on arbitrary strings: an error
//! or a policy, never a panic, and every policy it reads prints back to
//! text that reads as the same policy.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tower_ratelimit::{Policy, Quota};

fuzz_target!(|s: &str| {
    if let Ok(p) = s.parse::<Policy>() {
        let text = p.to_string();
        let again: Policy = text
            .parse()
            .unwrap_or_else(|e| panic!("{s:?} read as {text:?}, which does not read back: {e}"));
        assert_eq!(again, p, "{s:?} → {text:?}");
    }
    if let Ok(q) = s.parse::<Quota>() {
        assert_eq!(q.to_string().parse::<Quota>().ok(), Some(q));
    }
});
