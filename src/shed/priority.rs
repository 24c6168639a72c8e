//! [`Priority`]: the classes the load shedder sheds, lowest first.

use std::fmt;
use std::str::FromStr;

/// How important a request is to the service. Under load the shedder refuses
/// [`Test`](Priority::Test) traffic first, then [`Low`](Priority::Low), then
/// [`Normal`](Priority::Normal); [`Critical`](Priority::Critical) last.
///
/// ```
/// use tower_ratelimit::shed::Priority;
/// assert_eq!("critical".parse(), Ok(Priority::Critical));
/// assert_eq!(Priority::default(), Priority::Normal);
/// assert_eq!(Priority::Low.as_str(), "low");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Priority {
    /// Traffic the service exists for (e.g. charges, logins): shed only when
    /// the whole capacity is in use.
    Critical,
    /// Ordinary traffic (the default).
    #[default]
    Normal,
    /// Traffic that can wait (e.g. analytics, prefetches).
    Low,
    /// Synthetic traffic (load tests, canaries): shed first.
    Test,
}

impl Priority {
    /// Every class, most important first.
    pub const ALL: [Priority; 4] = [
        Priority::Critical,
        Priority::Normal,
        Priority::Low,
        Priority::Test,
    ];

    /// The lower-case name, as used in metrics labels and parsed by `FromStr`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::Normal => "normal",
            Priority::Low => "low",
            Priority::Test => "test",
        }
    }

    pub(crate) const fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown priority name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown priority {0:?}: use critical, normal, low or test")]
pub struct ParsePriorityError(String);

impl FromStr for Priority {
    type Err = ParsePriorityError;

    /// Parses `critical`, `normal`, `low` or `test` (ASCII case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Priority::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| ParsePriorityError(s.chars().take(32).collect()))
    }
}
