//! The text form of quotas and policies: what configuration files, admin
//! interfaces and a `RedisStore`'s runtime overrides carry.
//!
//! See the parent module for the grammar.

use super::{format_window, Algorithm, Policy, Quota};
use crate::error::{ConfigError, ConfigErrorKind};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

impl Algorithm {
    /// The algorithm's name in the text form of a quota: `fixed-window`,
    /// `token-bucket`, `sliding-window`, `gcra` or `sliding-log`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed-window",
            Algorithm::TokenBucket => "token-bucket",
            Algorithm::SlidingWindow => "sliding-window",
            Algorithm::Gcra => "gcra",
            Algorithm::SlidingLog => "sliding-log",
        }
    }
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.limit, format_window(self.window_ms))?;
        if self.algorithm != Algorithm::FixedWindow {
            write!(f, " {}", self.algorithm.as_str())?;
        }
        if let Some(b) = self.burst {
            write!(f, " burst={b}")?;
        }
        if let Some(u) = &self.unit {
            write!(f, " unit={}", Quoted(u))?;
        }
        if let Some(n) = &self.name {
            write!(f, " name={}", Quoted(n))?;
        }
        if self.must_fit {
            f.write_str(" must-fit")?;
        }
        Ok(())
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, q) in self.quotas().iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{q}")?;
        }
        Ok(())
    }
}

/// A name or unit, quoted when it would not read back as one word.
struct Quoted<'a>(&'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.0.is_empty() && !self.0.contains([' ', ',', '=', '"', '\\']) {
            return f.write_str(self.0);
        }
        f.write_str("\"")?;
        for c in self.0.chars() {
            if c == '"' || c == '\\' {
                f.write_str("\\")?;
            }
            write!(f, "{c}")?;
        }
        f.write_str("\"")
    }
}

impl FromStr for Quota {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let mut words = Words::new(s);
        let first = words.next()?.ok_or_else(|| {
            ConfigError::new(
                ConfigErrorKind::Syntax,
                "an empty quota: write one like 10/1s or 1000/1h",
            )
        })?;
        let (limit, window) = first.split_once('/').ok_or_else(|| {
            ConfigError::new(
                ConfigErrorKind::Syntax,
                format!("`{first}` is not a quota like 10/1s or 1000/1h"),
            )
        })?;
        let limit: u64 = limit.parse().map_err(|_| {
            ConfigError::new(
                ConfigErrorKind::Syntax,
                format!("`{limit}` in `{first}` is not a whole number"),
            )
        })?;
        let mut q = Quota::new(limit, duration(window)?)?;
        let (mut burst, mut must_fit) = (None, false);
        while let Some(word) = words.next()? {
            match word.split_once('=') {
                None if word == "must-fit" => must_fit = true,
                None => {
                    let a = Algorithm::ALL
                        .into_iter()
                        .find(|a| a.as_str() == word)
                        .ok_or_else(|| {
                            ConfigError::new(
                                ConfigErrorKind::Syntax,
                                format!(
                                    "`{word}` is not an algorithm (fixed-window, token-bucket, \
                                 sliding-window, gcra, sliding-log) nor burst=, unit=, name= \
                                 or must-fit"
                                ),
                            )
                        })?;
                    q = q.with_algorithm(a)?;
                }
                Some(("burst", n)) => {
                    burst = Some(n.parse::<u64>().map_err(|_| {
                        ConfigError::new(
                            ConfigErrorKind::Syntax,
                            format!("`{n}` is not a whole number of burst"),
                        )
                    })?);
                }
                Some(("unit", _)) => q = q.with_unit(words.value())?,
                Some(("name", _)) => q = q.named(words.value())?,
                Some((other, _)) => {
                    return Err(ConfigError::new(
                        ConfigErrorKind::Syntax,
                        format!("`{other}=` is not a quota setting (burst=, unit=, name=)"),
                    ))
                }
            }
        }
        // The burst last: it needs its algorithm.
        if let Some(b) = burst {
            q = q.burst(b)?;
        }
        if must_fit {
            q = q.only_while_the_reservation_fits();
        }
        Ok(q)
    }
}

impl FromStr for Policy {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let mut quotas = split_quotas(s)?.into_iter();
        let first = quotas.next().ok_or_else(|| {
            ConfigError::new(
                ConfigErrorKind::Syntax,
                "an empty policy: write one like 10/1s, 1000/1h",
            )
        })?;
        quotas.try_fold(Policy::new(first.parse()?), |p, q| p.and(q.parse()?))
    }
}

/// A window: a whole number of `ms`, `s`, `m`, `h` or `d`.
fn duration(s: &str) -> Result<Duration, ConfigError> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let bad = || {
        ConfigError::new(
            ConfigErrorKind::Syntax,
            format!("`{s}` is not a window like 500ms, 1s, 5m, 1h or 1d"),
        )
    };
    let n: u64 = n.parse().map_err(|_| bad())?;
    let ms = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    n.checked_mul(ms).map(Duration::from_millis).ok_or_else(bad)
}

/// The quotas of a policy's text: split at the commas outside quotes.
fn split_quotas(s: &str) -> Result<Vec<&str>, ConfigError> {
    let (mut parts, mut start, mut quoted, mut escaped) = (Vec::new(), 0, false, false);
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ',' if !quoted => {
                parts.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    if quoted {
        return Err(ConfigError::new(
            ConfigErrorKind::Syntax,
            format!("an unterminated quote in `{s}`"),
        ));
    }
    let last = s[start..].trim();
    if !last.is_empty() || !parts.is_empty() {
        parts.push(last);
    }
    match parts.iter().any(|p| p.is_empty()) {
        true => Err(ConfigError::new(
            ConfigErrorKind::Syntax,
            format!("an empty quota in `{s}`"),
        )),
        false => Ok(parts),
    }
}

/// The words of one quota's text, a quoted value read as one.
struct Words<'a> {
    rest: &'a str,
    /// The value of the last `key=` word, unquoted.
    value: String,
}

impl<'a> Words<'a> {
    fn new(s: &'a str) -> Self {
        Self {
            rest: s.trim(),
            value: String::new(),
        }
    }

    /// The next word; for `key=value`, the value (quoted or not) is kept
    /// for [`value`](Self::value).
    fn next(&mut self) -> Result<Option<&'a str>, ConfigError> {
        let s = self.rest.trim_start();
        if s.is_empty() {
            return Ok(None);
        }
        let Some(eq) = s.find('=').filter(|&eq| !s[..eq].contains(' ')) else {
            let end = s.find(' ').unwrap_or(s.len());
            self.rest = &s[end..];
            return Ok(Some(&s[..end]));
        };
        let after = &s[eq + 1..];
        self.value.clear();
        let used = if let Some(quoted) = after.strip_prefix('"') {
            let mut chars = quoted.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => match chars.next() {
                        Some((_, c)) => self.value.push(c),
                        None => break,
                    },
                    '"' => {
                        end = Some(i + 1);
                        break;
                    }
                    c => self.value.push(c),
                }
            }
            let end = end.ok_or_else(|| {
                ConfigError::new(
                    ConfigErrorKind::Syntax,
                    format!("an unterminated quote in `{}`", self.rest),
                )
            })?;
            1 + end
        } else {
            let end = after.find(' ').unwrap_or(after.len());
            self.value.push_str(&after[..end]);
            end
        };
        let word_end = eq + 1 + used;
        self.rest = &s[word_end..];
        if !self.rest.is_empty() && !self.rest.starts_with(' ') {
            return Err(ConfigError::new(
                ConfigErrorKind::Syntax,
                format!("a space is missing after `{}`", &s[..word_end]),
            ));
        }
        Ok(Some(&s[..word_end]))
    }

    /// The value of the last `key=value` word.
    fn value(&mut self) -> String {
        std::mem::take(&mut self.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_quota_reads_back_as_it_was_written() {
        let texts = [
            "10/1s",
            "1000/1h sliding-log",
            "10/1s gcra burst=50",
            "5/500ms token-bucket",
            "100/24h sliding-window",
            "1000000/1m unit=tokens name=\"free tier\" must-fit",
            "3/1m name=\"a \\\"quoted\\\" \\\\ name\"",
        ];
        for text in texts {
            let q: Quota = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(q.to_string(), text);
            assert_eq!(q.to_string().parse::<Quota>().unwrap(), q);
        }
        let p: Policy = "10/1s gcra burst=20, 1000/1h, 50000/1d unit=tokens"
            .parse()
            .unwrap();
        assert_eq!(p.quotas().len(), 3);
        assert_eq!(p.to_string().parse::<Policy>().unwrap(), p);
        let named: Policy = "10/1s name=\"a, b\", 5/1m".parse().unwrap();
        assert_eq!(named.quotas()[0].name(), "a, b");
    }

    #[test]
    fn bad_text_is_refused_with_what_is_wrong() {
        for (text, says) in [
            ("", "empty"),
            ("10", "not a quota"),
            ("x/1s", "not a whole number"),
            ("10/1", "not a window"),
            ("10/1w", "not a window"),
            ("0/1s", "at least 1"),
            ("10/0s", "window"),
            ("10/99999999999999999d", "not a window"),
            ("10/1s fast", "not an algorithm"),
            ("10/1s burst=5", "burst"),
            ("10/1s gcra burst=x", "not a whole number"),
            ("10/1s colour=red", "not a quota setting"),
            ("10/1s name=\"open", "unterminated"),
            ("10/1s name=\"a\"b", "space is missing"),
            ("10/1s,", "empty quota"),
            ("10/1s, 20/1s", "share state"),
            ("10/1s name=café", "printable ASCII"),
        ] {
            let err = text.parse::<Policy>().expect_err(text).to_string();
            assert!(err.contains(says), "{text:?}: {err}");
        }
    }
}
