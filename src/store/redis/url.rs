//! Redis URLs as they may be shown: in `Debug` output, error messages and
//! log lines a password never appears.

use std::fmt;

/// A Redis URL with its secrets replaced by `***`: the password of the
/// user-info part (`redis://user:***@host:6379`) and a Unix-socket URL's
/// `pass=` (and `password=`) query value.
///
/// Works on the text, not on a parsed URL, so that a URL that does not
/// parse (which is what error messages show) is redacted too: everything
/// between the first `:` after the scheme and the last `@` is hidden.
pub(crate) struct Redacted<'a>(pub(crate) &'a str);

impl fmt::Display for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact(self.0))
    }
}

impl fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", redact(self.0))
    }
}

/// `url` with its password and `pass=` values replaced by `***`.
pub(crate) fn redact(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    // The user info ends at the last `@`: a password may hold any character,
    // including `/`, `?`, `#` and `@` when it was not percent-encoded.
    let (userinfo, rest) = match rest.rfind('@') {
        Some(i) => (Some(&rest[..i]), &rest[i..]),
        None => (None, rest),
    };
    let mut out = String::with_capacity(url.len());
    out.push_str(scheme);
    if let Some(userinfo) = userinfo {
        match userinfo.find(':') {
            Some(i) => {
                out.push_str(&userinfo[..i]);
                out.push_str(":***");
            }
            // No colon: a user name alone, which Redis does not treat as a secret.
            None => out.push_str(userinfo),
        }
    }
    match rest.find('?') {
        Some(q) => {
            out.push_str(&rest[..=q]);
            for (i, pair) in rest[q + 1..].split('&').enumerate() {
                if i > 0 {
                    out.push('&');
                }
                match pair.split_once('=') {
                    Some((k, _)) if is_secret(k) => {
                        out.push_str(k);
                        out.push_str("=***");
                    }
                    _ => out.push_str(pair),
                }
            }
        }
        None => out.push_str(rest),
    }
    out
}

fn is_secret(key: &str) -> bool {
    key.eq_ignore_ascii_case("pass") || key.eq_ignore_ascii_case("password")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_is_replaced_and_the_rest_kept() {
        for (url, shown) in [
            (
                "redis://user:s3cret@10.0.0.1:6380/2",
                "redis://user:***@10.0.0.1:6380/2",
            ),
            ("rediss://:s3cret@host", "rediss://:***@host"),
            ("redis://10.0.0.1:6379", "redis://10.0.0.1:6379"),
            ("redis://user@host", "redis://user@host"),
            (
                "unix:///run/redis.sock?db=1&pass=s3cret",
                "unix:///run/redis.sock?db=1&pass=***",
            ),
            (
                "redis+unix:///tmp/r.sock?user=u&PASSWORD=s3cret",
                "redis+unix:///tmp/r.sock?user=u&PASSWORD=***",
            ),
        ] {
            assert_eq!(redact(url), shown);
        }
    }

    #[test]
    fn urls_that_do_not_parse_are_redacted_too() {
        for url in [
            "redis://user:s3cret@[bad",
            "redis://user:s3c/ret@host",
            "redis://user:s3c@ret@host",
            "redis://user:s3c#ret@host",
            "redis://user:s3c?ret@host",
            "user:s3cret@host",
            "redis://:s3cret@",
        ] {
            let shown = redact(url);
            assert!(!shown.contains("s3c"), "{url} -> {shown}");
            assert!(shown.contains("***"), "{url} -> {shown}");
        }
        assert_eq!(format!("{}", Redacted("redis://u:p@h")), "redis://u:***@h");
        assert_eq!(
            format!("{:?}", Redacted("redis://u:p@h")),
            "\"redis://u:***@h\""
        );
    }
}
