//! Reading forwarding headers right to left, within fixed bounds.

use http::header::{HeaderName, FORWARDED};
use http::HeaderMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Which forwarding header [`ClientIp`](super::ClientIp) honours (only from trusted peers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (several header lines are joined in order).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client;proto=https, for="[2001:db8::1]:4711"`.
    ///
    /// Each element's `for` parameter (any case) is a hop. `for=unknown`, an
    /// obfuscated `for=_name`, an element without `for`, and a quoted string
    /// containing a comma or an escape all make that hop unreadable.
    Forwarded,
    /// `X-Real-IP: client`: one address, set by the proxy in front of you.
    ///
    /// A value with a comma is unreadable. Should several lines arrive, they
    /// are walked right to left like `X-Forwarded-For` hops.
    XRealIp,
}

impl ForwardedHeader {
    /// The header's name.
    ///
    /// ```
    /// use tower_ratelimit::key::ForwardedHeader;
    /// assert_eq!(ForwardedHeader::XRealIp.name(), "x-real-ip");
    /// ```
    pub fn name(self) -> HeaderName {
        match self {
            Self::XForwardedFor => HeaderName::from_static("x-forwarded-for"),
            Self::Forwarded => FORWARDED,
            Self::XRealIp => HeaderName::from_static("x-real-ip"),
        }
    }
}

/// Hops read before giving up: more proxies than this is a forged chain.
pub(crate) const MAX_HOPS: usize = 64;
/// Header bytes read, counted from the right end of the last header line.
pub(crate) const MAX_HEADER_BYTES: usize = 8 * 1024;
/// Longest node (`"[v6%zone]:port"`) worth parsing; anything longer is garbage.
const MAX_NODE_LEN: usize = 96;

/// Walks the forwarding chain from the nearest hop outwards and returns the client.
///
/// `last` is the peer (already known to be trusted). Each readable hop becomes
/// the new `last`; the first untrusted one is returned at once. A hop that
/// cannot be read (garbage, `unknown`, non-UTF-8, too long, past the byte or
/// hop budget) ends the walk with `last`: the trusted hop that forwarded it.
pub(crate) fn client_from_chain(
    headers: &HeaderMap,
    which: ForwardedHeader,
    mut last: IpAddr,
    is_trusted: impl Fn(IpAddr) -> bool,
) -> IpAddr {
    let mut budget = MAX_HEADER_BYTES;
    let mut hops = 0;
    for value in headers.get_all(which.name()).iter().rev() {
        let bytes = value.as_bytes();
        let start = bytes.len().saturating_sub(budget);
        let visible = &bytes[start..];
        budget -= visible.len();
        // X-Real-IP holds one address, so a comma in it is garbage, not a separator.
        let splits = which != ForwardedHeader::XRealIp;
        let mut entries = visible.rsplit(move |b| splits && *b == b',').peekable();
        while let Some(entry) = entries.next() {
            hops += 1;
            // The leftmost entry of a cut value is a fragment: never guess from it.
            let fragment = start > 0 && entries.peek().is_none();
            let hop = if hops > MAX_HOPS || fragment {
                None
            } else {
                parse_entry(entry, which)
            };
            match hop {
                None => return last,
                Some(ip) if !is_trusted(ip) => return ip,
                Some(ip) => last = ip,
            }
        }
    }
    last
}

fn parse_entry(entry: &[u8], which: ForwardedHeader) -> Option<IpAddr> {
    match which {
        ForwardedHeader::Forwarded => parse_node(forwarded_for(entry)?),
        ForwardedHeader::XForwardedFor | ForwardedHeader::XRealIp => parse_node(entry),
    }
}

/// The `for=` value of one RFC 7239 `forwarded-element`, unquoted.
fn forwarded_for(element: &[u8]) -> Option<&[u8]> {
    let mut found = None;
    for pair in element.split(|b| *b == b';') {
        let pair = pair.trim_ascii();
        if pair.is_empty() {
            continue;
        }
        let eq = pair.iter().position(|b| *b == b'=')?;
        if !pair[..eq].trim_ascii().eq_ignore_ascii_case(b"for") {
            continue;
        }
        // RFC 7239 allows each parameter once; two `for`s leave the hop ambiguous.
        if found.is_some() {
            return None;
        }
        found = Some(unquote(pair[eq + 1..].trim_ascii())?);
    }
    found
}

/// The content of a quoted-string, or a bare token as is.
///
/// Escapes never occur in a valid node, so a backslash (like a stray quote,
/// e.g. from a quoted string that contained a comma) makes the value garbage.
fn unquote(value: &[u8]) -> Option<&[u8]> {
    let inner = match value {
        [b'"', inner @ .., b'"'] => inner,
        _ => value,
    };
    if inner.iter().any(|b| *b == b'"' || *b == b'\\') {
        return None;
    }
    Some(inner)
}

/// Parses a node: `v4`, `v6`, `v4:port`, `[v6]:port`, each v6 with an optional zone id.
///
/// Returns the canonical address (IPv4-mapped IPv6 as IPv4) so trust checks
/// against IPv4 CIDRs see what a dual-stack proxy meant.
pub(crate) fn parse_node(raw: &[u8]) -> Option<IpAddr> {
    let raw = raw.trim_ascii();
    if raw.len() > MAX_NODE_LEN {
        return None;
    }
    let s = std::str::from_utf8(raw).ok()?;
    let ip = if let Some(rest) = s.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        if !after.is_empty() && !after.strip_prefix(':').is_some_and(is_port) {
            return None;
        }
        IpAddr::V6(parse_v6_zoned(inside)?)
    } else if s.contains('%') {
        IpAddr::V6(parse_v6_zoned(s)?)
    } else if let Ok(ip) = s.parse::<IpAddr>() {
        ip
    } else {
        let (host, port) = s.split_once(':')?;
        if !is_port(port) {
            return None;
        }
        IpAddr::V4(host.parse::<Ipv4Addr>().ok()?)
    };
    Some(ip.to_canonical())
}

/// An IPv6 address with its zone id (`fe80::1%eth0`) dropped: zones are host-local.
fn parse_v6_zoned(s: &str) -> Option<Ipv6Addr> {
    let addr = match s.split_once('%') {
        Some((addr, zone)) if !zone.is_empty() => addr,
        Some(_) => return None,
        None => s,
    };
    addr.parse().ok()
}

/// A decimal port, or an RFC 7239 obfuscated port (`_abc`).
fn is_port(s: &str) -> bool {
    match s.strip_prefix('_') {
        Some(obf) => {
            !obf.is_empty()
                && obf
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        }
        None => !s.is_empty() && s.len() <= 5 && s.parse::<u16>().is_ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn parse_node_accepts_bare_and_ported_forms_of_both_families() {
        assert_eq!(parse_node(b"192.0.2.60"), Some(ip("192.0.2.60")));
        assert_eq!(parse_node(b" 192.0.2.60:8080\t"), Some(ip("192.0.2.60")));
        assert_eq!(parse_node(b"2001:db8::1"), Some(ip("2001:db8::1")));
        assert_eq!(parse_node(b"[2001:db8::1]"), Some(ip("2001:db8::1")));
        assert_eq!(parse_node(b"[2001:db8::1]:4711"), Some(ip("2001:db8::1")));
        assert_eq!(parse_node(b"[2001:db8::1]:_obf"), Some(ip("2001:db8::1")));
    }

    #[test]
    fn parse_node_strips_zone_ids() {
        assert_eq!(parse_node(b"fe80::1%eth0"), Some(ip("fe80::1")));
        assert_eq!(parse_node(b"[fe80::1%25eth0]:80"), Some(ip("fe80::1")));
        assert_eq!(parse_node(b"fe80::1%"), None);
    }

    #[test]
    fn parse_node_returns_ipv4_mapped_ipv6_as_ipv4() {
        assert_eq!(parse_node(b"::ffff:192.0.2.1"), Some(ip("192.0.2.1")));
        assert_eq!(parse_node(b"[::ffff:192.0.2.1]:1"), Some(ip("192.0.2.1")));
    }

    #[test]
    fn parse_node_rejects_garbage_unknown_obfuscated_bad_ports_and_overlong_input() {
        for bad in [
            &b""[..],
            b"unknown",
            b"_hidden",
            b"not an ip",
            b"192.0.2.1:",
            b"192.0.2.1:99999",
            b"192.0.2.1:80:80",
            b"[2001:db8::1",
            b"[2001:db8::1]x",
            b"[192.0.2.1]",
            b"\xff\xfe",
            b"1.2.3.4\xff",
        ] {
            assert_eq!(parse_node(bad), None, "{bad:?}");
        }
        let mut long = b"1.2.3.4".to_vec();
        long.resize(MAX_NODE_LEN + 1, b' ');
        long.push(b'x');
        assert_eq!(parse_node(&long), None);
    }

    #[test]
    fn forwarded_for_finds_the_for_param_case_insensitively_and_unquotes_it() {
        assert_eq!(
            forwarded_for(b"proto=https; For=\"[2001:db8::1]:4711\";by=x"),
            Some(&b"[2001:db8::1]:4711"[..])
        );
        assert_eq!(forwarded_for(b"FOR=192.0.2.60"), Some(&b"192.0.2.60"[..]));
        assert_eq!(forwarded_for(b"for=unknown;"), Some(&b"unknown"[..]));
    }

    #[test]
    fn forwarded_for_rejects_missing_duplicate_and_broken_params() {
        assert_eq!(forwarded_for(b"proto=https;by=1.2.3.4"), None);
        assert_eq!(forwarded_for(b"for=1.2.3.4;for=5.6.7.8"), None);
        assert_eq!(forwarded_for(b"for=\"1.2.3.4"), None);
        assert_eq!(forwarded_for(b"for=\"1.2\\.3.4\""), None);
        assert_eq!(forwarded_for(b"junk;for=1.2.3.4"), None);
    }
}
