//! The client's IP address behind trusted reverse proxies.

use super::forwarded::{client_from_chain, ForwardedHeader};
use super::ip::{ip_key, peer_addr, DEFAULT_IPV6_PREFIX, NO_PEER};
use super::{Key, KeyError, KeyExtractor};
use http::request::Parts;
use ipnet::IpNet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Keys by the client's IP address, believing forwarding headers only from trusted proxies.
///
/// The peer address is found like [`PeerIp`](super::PeerIp) finds it. If the
/// peer is not in a trusted CIDR, it *is* the client and every forwarding
/// header is ignored, so a client cannot choose its own key by sending one.
/// Otherwise the chosen header is read from the right (the hop nearest to
/// you) leftwards, skipping trusted addresses; the first untrusted address is
/// the client. If every hop is trusted, the leftmost one is the client (so a
/// trusted peer that sends no such header is itself the client).
///
/// **Unreadable hops.** If a hop that has to be read cannot be parsed (garbage,
/// `unknown` or an obfuscated `_name`, not UTF-8, longer than an address can
/// be), the walk stops and the key is the last address that *was* parsed: the
/// trusted proxy that forwarded the garbage. A client can thereby only ever
/// lump itself in with its proxy, never pick another client's key.
///
/// **Bounded work.** At most the last 8 KiB of header bytes and 64 hops are
/// read; a hop beyond either bound counts as unreadable (as above). A 64 KiB
/// header costs the same as an 8 KiB one.
///
/// The result is normalised like [`PeerIp`](super::PeerIp)'s: IPv4-mapped IPv6
/// is IPv4, IPv6 is grouped by [`ClientIp::ipv6_prefix`] (default /64), zone
/// ids are dropped.
///
/// ```
/// use std::net::SocketAddr;
/// use tower_ratelimit::key::{ClientIp, Key, KeyExtractor};
/// let client_ip = ClientIp::new().trust_private();
/// let peer: SocketAddr = "10.0.0.2:40000".parse().unwrap();
/// let req = http::Request::builder()
///     .header("x-forwarded-for", "198.51.100.7, 10.0.0.1")
///     .extension(peer)
///     .body(())
///     .unwrap();
/// let (parts, _) = req.into_parts();
/// let key = client_ip.extract(&parts).unwrap();
/// assert_eq!(key, Some(Key::ip("198.51.100.7".parse().unwrap())));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIp {
    trusted: Vec<IpNet>,
    header: ForwardedHeader,
    v6_prefix: u8,
}

impl ClientIp {
    /// Trusts no proxy (so keys by the peer IP) and reads `X-Forwarded-For` once one is trusted.
    ///
    /// ```
    /// use tower_ratelimit::key::ClientIp;
    /// let client_ip = ClientIp::new().trust_cidr("10.0.0.0/8".parse().unwrap());
    /// # let _ = client_ip;
    /// ```
    #[must_use]
    pub fn new() -> Self {
        Self {
            trusted: Vec::new(),
            header: ForwardedHeader::default(),
            v6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Trusts the proxies in one network.
    ///
    /// ```
    /// use tower_ratelimit::key::ClientIp;
    /// let client_ip = ClientIp::new().trust_cidr("2001:db8:ffff::/48".parse().unwrap());
    /// # let _ = client_ip;
    /// ```
    #[must_use]
    pub fn trust_cidr(mut self, net: IpNet) -> Self {
        self.trusted.push(net);
        self
    }

    /// Trusts the proxies in several networks.
    ///
    /// ```
    /// use ipnet::IpNet;
    /// use tower_ratelimit::key::ClientIp;
    /// let nets: Vec<IpNet> = ["10.1.0.0/16", "10.2.0.0/16"]
    ///     .iter()
    ///     .map(|s| s.parse().unwrap())
    ///     .collect();
    /// let client_ip = ClientIp::new().trust_cidrs(nets);
    /// # let _ = client_ip;
    /// ```
    #[must_use]
    pub fn trust_cidrs(mut self, nets: impl IntoIterator<Item = IpNet>) -> Self {
        self.trusted.extend(nets);
        self
    }

    /// Trusts loopback proxies (`127.0.0.0/8`, `::1`): a proxy on the same host.
    ///
    /// ```
    /// use tower_ratelimit::key::ClientIp;
    /// let client_ip = ClientIp::new().trust_loopback();
    /// # let _ = client_ip;
    /// ```
    #[must_use]
    pub fn trust_loopback(self) -> Self {
        self.trust_cidrs(nets(&[
            (IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0)), 8),
            (IpAddr::V6(Ipv6Addr::LOCALHOST), 128),
        ]))
    }

    /// Trusts private and loopback proxies: RFC 1918, `fc00::/7` and loopback.
    ///
    /// Right when the only way in is through your own load balancer; wrong if
    /// clients can reach the service from a private network directly (they
    /// could then forge `X-Forwarded-For`).
    ///
    /// ```
    /// use tower_ratelimit::key::ClientIp;
    /// let client_ip = ClientIp::new().trust_private();
    /// # let _ = client_ip;
    /// ```
    #[must_use]
    pub fn trust_private(self) -> Self {
        self.trust_loopback().trust_cidrs(nets(&[
            (IpAddr::V4(Ipv4Addr::new(10, 0, 0, 0)), 8),
            (IpAddr::V4(Ipv4Addr::new(172, 16, 0, 0)), 12),
            (IpAddr::V4(Ipv4Addr::new(192, 168, 0, 0)), 16),
            (IpAddr::V6(Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0)), 7),
        ]))
    }

    /// Which forwarding header to honour (default `X-Forwarded-For`); the others are ignored.
    ///
    /// ```
    /// use tower_ratelimit::key::{ClientIp, ForwardedHeader};
    /// let client_ip = ClientIp::new()
    ///     .trust_loopback()
    ///     .header(ForwardedHeader::Forwarded);
    /// # let _ = client_ip;
    /// ```
    #[must_use]
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Leading bits of a client's IPv6 address that form the key (default 64, at most 128).
    ///
    /// Values above 128 are clamped to 128 rather than rejected, so the builder
    /// stays infallible; `128` keys every address separately.
    ///
    /// ```
    /// use tower_ratelimit::key::ClientIp;
    /// let per_site = ClientIp::new().trust_private().ipv6_prefix(48);
    /// # let _ = per_site;
    /// ```
    #[must_use]
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.v6_prefix = bits.min(128);
        self
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The client address before normalisation, or `None` without a peer address.
    fn client(&self, parts: &Parts) -> Option<IpAddr> {
        // Trust lists are written in IPv4 even when a dual-stack socket reports
        // the peer as `::ffff:a.b.c.d`.
        let peer = peer_addr(parts)?.to_canonical();
        if !self.is_trusted(peer) {
            return Some(peer);
        }
        Some(client_from_chain(&parts.headers, self.header, peer, |ip| {
            self.is_trusted(ip)
        }))
    }
}

/// Well-known networks; every entry is a valid prefix, so none is dropped.
fn nets(list: &[(IpAddr, u8)]) -> impl Iterator<Item = IpNet> + '_ {
    list.iter()
        .filter_map(|&(addr, len)| IpNet::new(addr, len).ok())
}

impl Default for ClientIp {
    fn default() -> Self {
        Self::new()
    }
}

impl KeyExtractor for ClientIp {
    fn extract(&self, parts: &Parts) -> Result<Option<Key>, KeyError> {
        match self.client(parts) {
            Some(ip) => Ok(Some(ip_key(ip, self.v6_prefix))),
            None => Err(KeyError::server("client_ip", NO_PEER)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::forwarded::{MAX_HEADER_BYTES, MAX_HOPS};
    use crate::key::test_util::{request, Req};

    fn ip_key(s: &str) -> Key {
        Key::ip(s.parse().unwrap())
    }

    fn key(e: &ClientIp, req: Req) -> Key {
        e.extract(&req.parts()).unwrap().unwrap()
    }

    fn private() -> ClientIp {
        ClientIp::new().trust_private()
    }

    #[test]
    fn spoofed_x_forwarded_for_from_untrusted_peer_keeps_the_peer_key() {
        let k = key(
            &private(),
            request()
                .peer("203.0.113.9:5000")
                .header("x-forwarded-for", "198.51.100.1, 10.0.0.1"),
        );
        assert_eq!(k, ip_key("203.0.113.9"));
    }

    #[test]
    fn spoofed_headers_of_every_kind_from_untrusted_peer_keep_the_peer_key() {
        for header in [
            ForwardedHeader::XForwardedFor,
            ForwardedHeader::Forwarded,
            ForwardedHeader::XRealIp,
        ] {
            let k = key(
                &private().header(header),
                request()
                    .peer("203.0.113.9:5000")
                    .header("x-forwarded-for", "198.51.100.1")
                    .header("forwarded", "for=198.51.100.1")
                    .header("x-real-ip", "198.51.100.1"),
            );
            assert_eq!(k, ip_key("203.0.113.9"), "{header:?}");
        }
    }

    #[test]
    fn new_trusts_nobody_so_keys_by_peer_even_from_loopback() {
        let k = key(
            &ClientIp::new(),
            request()
                .peer("127.0.0.1:1")
                .header("x-forwarded-for", "198.51.100.1"),
        );
        assert_eq!(k, ip_key("127.0.0.1"));
    }

    #[test]
    fn trusted_peer_rightmost_untrusted_hop_is_the_client() {
        let k = key(
            &private(),
            request().peer("10.0.0.1:1").header(
                "x-forwarded-for",
                "1.1.1.1, 198.51.100.2, 10.0.0.3, 192.168.1.1",
            ),
        );
        assert_eq!(k, ip_key("198.51.100.2"));
    }

    #[test]
    fn all_trusted_chain_keys_by_leftmost_hop() {
        let k = key(
            &private(),
            request()
                .peer("10.0.0.1:1")
                .header("x-forwarded-for", "10.9.9.9, 10.0.0.3, 192.168.1.1"),
        );
        assert_eq!(k, ip_key("10.9.9.9"));
    }

    #[test]
    fn trusted_peer_without_header_keys_by_peer() {
        let k = key(&private(), request().peer("10.0.0.1:1"));
        assert_eq!(k, ip_key("10.0.0.1"));
    }

    #[test]
    fn garbage_hop_keys_by_last_parsed_hop() {
        let k = key(
            &private(),
            request()
                .peer("10.0.0.1:1")
                .header("x-forwarded-for", "198.51.100.1, garbage, 10.0.0.2"),
        );
        assert_eq!(k, ip_key("10.0.0.2"));
    }

    #[test]
    fn garbage_nearest_hop_keys_by_peer() {
        let k = key(
            &private(),
            request()
                .peer("10.0.0.1:1")
                .header("x-forwarded-for", "198.51.100.1, unknown"),
        );
        assert_eq!(k, ip_key("10.0.0.1"));
    }

    #[test]
    fn garbage_left_of_the_client_is_never_read() {
        let k = key(
            &private(),
            request()
                .peer("10.0.0.1:1")
                .header("x-forwarded-for", "garbage, [::1, 198.51.100.1, 10.0.0.2"),
        );
        assert_eq!(k, ip_key("198.51.100.1"));
    }

    #[test]
    fn multiple_x_forwarded_for_headers_are_concatenated_in_order() {
        let e = private();
        let k = key(
            &e,
            request()
                .peer("10.0.0.1:1")
                .header("x-forwarded-for", "198.51.100.1, 10.0.0.5")
                .header("x-forwarded-for", "10.0.0.4"),
        );
        assert_eq!(k, ip_key("198.51.100.1"));
        let k = key(
            &e,
            request()
                .peer("10.0.0.1:1")
                .header("x-forwarded-for", "198.51.100.1")
                .header("x-forwarded-for", "198.51.100.2, 10.0.0.4"),
        );
        assert_eq!(k, ip_key("198.51.100.2"));
    }

    #[test]
    fn forwarded_header_quoted_ipv6_with_port_is_parsed() {
        let k = key(
            &private().header(ForwardedHeader::Forwarded),
            request()
                .peer("10.0.0.1:1")
                .header("forwarded", "for=\"[2001:db8:cafe::17]:4711\";proto=https"),
        );
        assert_eq!(k, ip_key("2001:db8:cafe::"));
    }

    #[test]
    fn forwarded_header_ipv4_with_port_and_case_insensitive_param_is_parsed() {
        let k = key(
            &private().header(ForwardedHeader::Forwarded),
            request()
                .peer("10.0.0.1:1")
                .header("forwarded", "For=192.0.2.60:8080, for=\"10.0.0.7:80\""),
        );
        assert_eq!(k, ip_key("192.0.2.60"));
    }

    #[test]
    fn forwarded_header_unknown_keys_by_last_parsed_hop() {
        let k = key(
            &private().header(ForwardedHeader::Forwarded),
            request()
                .peer("10.0.0.1:1")
                .header("forwarded", "for=198.51.100.1, for=unknown, for=10.0.0.2"),
        );
        assert_eq!(k, ip_key("10.0.0.2"));
    }

    #[test]
    fn forwarded_header_obfuscated_identifier_keys_by_last_parsed_hop() {
        let k = key(
            &private().header(ForwardedHeader::Forwarded),
            request()
                .peer("10.0.0.1:1")
                .header("forwarded", "for=_hidden;by=10.0.0.1"),
        );
        assert_eq!(k, ip_key("10.0.0.1"));
    }

    #[test]
    fn forwarded_header_all_trusted_keys_by_leftmost() {
        let k = key(
            &private().header(ForwardedHeader::Forwarded),
            request()
                .peer("10.0.0.1:1")
                .header("forwarded", "for=10.0.0.9;proto=http")
                .header("forwarded", "for=\"[fd00::1]:1\""),
        );
        assert_eq!(k, ip_key("10.0.0.9"));
    }

    #[test]
    fn forwarded_header_is_ignored_when_x_forwarded_for_is_configured() {
        let k = key(
            &private(),
            request()
                .peer("10.0.0.1:1")
                .header("forwarded", "for=198.51.100.1"),
        );
        assert_eq!(k, ip_key("10.0.0.1"));
    }

    #[test]
    fn x_real_ip_from_trusted_peer_is_the_client() {
        let k = key(
            &private().header(ForwardedHeader::XRealIp),
            request()
                .peer("10.0.0.1:1")
                .header("x-real-ip", "198.51.100.3"),
        );
        assert_eq!(k, ip_key("198.51.100.3"));
    }

    #[test]
    fn x_real_ip_from_untrusted_peer_is_ignored() {
        let k = key(
            &private().header(ForwardedHeader::XRealIp),
            request()
                .peer("203.0.113.1:1")
                .header("x-real-ip", "198.51.100.3"),
        );
        assert_eq!(k, ip_key("203.0.113.1"));
    }

    #[test]
    fn x_real_ip_with_a_list_is_unparseable_and_keys_by_peer() {
        let k = key(
            &private().header(ForwardedHeader::XRealIp),
            request()
                .peer("10.0.0.1:1")
                .header("x-real-ip", "198.51.100.3, 198.51.100.4"),
        );
        assert_eq!(k, ip_key("10.0.0.1"));
    }

    #[test]
    fn ipv4_mapped_trusted_peer_matches_ipv4_trust_list() {
        let k = key(
            &private(),
            request()
                .peer("[::ffff:10.0.0.1]:1")
                .header("x-forwarded-for", "198.51.100.1"),
        );
        assert_eq!(k, ip_key("198.51.100.1"));
    }

    #[test]
    fn ipv4_mapped_client_hop_keys_as_plain_ipv4() {
        let k = key(
            &private(),
            request()
                .peer("10.0.0.1:1")
                .header("x-forwarded-for", "::ffff:198.51.100.1"),
        );
        assert_eq!(k, ip_key("198.51.100.1"));
    }

    #[test]
    fn client_ipv6_in_one_64_share_a_key_and_other_64_differs() {
        let e = private();
        let client = |xff: &str| {
            key(
                &e,
                request().peer("10.0.0.1:1").header("x-forwarded-for", xff),
            )
        };
        assert_eq!(client("2001:db8:0:1::1"), client("2001:db8:0:1:ffff::2"));
        assert_ne!(client("2001:db8:0:1::1"), client("2001:db8:0:2::1"));
    }

    #[test]
    fn custom_prefix_48_groups_client_64s_of_one_48() {
        let e = private().ipv6_prefix(48);
        let client = |xff: &str| {
            key(
                &e,
                request().peer("10.0.0.1:1").header("x-forwarded-for", xff),
            )
        };
        assert_eq!(client("2001:db8:0:1::1"), client("2001:db8:0:2::1"));
        assert_ne!(client("2001:db8:0:1::1"), client("2001:db8:1:1::1"));
    }

    #[test]
    fn zone_id_in_hop_is_stripped() {
        let e = private().ipv6_prefix(128);
        let k = key(
            &e,
            request()
                .peer("10.0.0.1:1")
                .header("x-forwarded-for", "2001:db8::1%eth0"),
        );
        assert_eq!(k, ip_key("2001:db8::1"));
    }

    #[test]
    fn non_utf8_hop_keys_by_last_parsed_hop() {
        let k = key(
            &private(),
            request()
                .peer("10.0.0.1:1")
                .header("x-forwarded-for", b"198.51.100.1, \xff\xfe, 10.0.0.2"),
        );
        assert_eq!(k, ip_key("10.0.0.2"));
    }

    #[test]
    fn non_utf8_left_of_the_client_is_never_read() {
        let k = key(
            &private(),
            request()
                .peer("10.0.0.1:1")
                .header("x-forwarded-for", b"\xff\xfe, 198.51.100.1"),
        );
        assert_eq!(k, ip_key("198.51.100.1"));
    }

    #[test]
    fn x_forwarded_for_of_64_kib_without_commas_keys_by_peer() {
        let k = key(
            &private(),
            request()
                .peer("10.0.0.1:1")
                .header("x-forwarded-for", vec![b'a'; 64 * 1024]),
        );
        assert_eq!(k, ip_key("10.0.0.1"));
    }

    #[test]
    fn x_forwarded_for_of_64_kib_stops_at_the_8_kib_window_and_keys_by_last_parsed_hop() {
        // Trusted hops padded to 64 KiB: the client at the far left is outside
        // the window, so the key is the proxy hop read last, never a guess.
        let hop = format!("10.0.0.5{},", " ".repeat(200));
        let mut value = String::from("198.51.100.1,");
        while value.len() < 64 * 1024 {
            value.push_str(&hop);
        }
        value.push_str("10.0.0.6");
        // The byte window, not the hop budget, is what ends this walk.
        assert!(MAX_HEADER_BYTES / hop.len() < MAX_HOPS);
        let k = key(
            &private(),
            request()
                .peer("10.0.0.1:1")
                .header("x-forwarded-for", value),
        );
        assert_eq!(k, ip_key("10.0.0.5"));
    }

    #[test]
    fn x_forwarded_for_of_8_kib_keys_by_the_client_right_of_the_padding() {
        let mut value = vec![b'x'; 8 * 1024];
        value.extend_from_slice(b", 198.51.100.1, 10.0.0.2");
        let k = key(
            &private(),
            request()
                .peer("10.0.0.1:1")
                .header("x-forwarded-for", value),
        );
        assert_eq!(k, ip_key("198.51.100.1"));
    }

    #[test]
    fn address_cut_by_the_8_kib_window_is_not_read_as_its_tail() {
        // The window starts inside "2001:db8::1", at "db8::1": a valid but
        // different address, which must not become the key.
        let tail = format!("db8::1{}, 10.0.0.2", " ".repeat(MAX_HEADER_BYTES - 16));
        assert_eq!(tail.len(), MAX_HEADER_BYTES);
        let k = key(
            &private(),
            request()
                .peer("10.0.0.1:1")
                .header("x-forwarded-for", format!("2001:{tail}")),
        );
        assert_eq!(k, ip_key("10.0.0.2"));
    }

    #[test]
    fn more_than_64_trusted_hops_keys_by_the_64th_hop() {
        let mut hops: Vec<String> = vec!["198.51.100.1".into()];
        hops.extend((0..=MAX_HOPS).map(|i| format!("10.0.{}.{}", i / 250, i % 250)));
        let k = key(
            &private(),
            request()
                .peer("10.0.0.1:1")
                .header("x-forwarded-for", hops.join(",")),
        );
        // Hops are read right to left: the 64th read is index len - 64.
        assert_eq!(k, ip_key(&hops[hops.len() - MAX_HOPS]));
    }

    #[test]
    fn many_short_header_lines_are_bounded_by_the_hop_budget() {
        let mut req = request()
            .peer("10.0.0.1:1")
            .header("x-forwarded-for", "198.51.100.1");
        for _ in 0..1000 {
            req = req.header("x-forwarded-for", "10.0.0.3");
        }
        assert_eq!(key(&private(), req), ip_key("10.0.0.3"));
    }

    #[test]
    fn huge_and_non_utf8_headers_of_every_kind_never_panic_and_key_by_peer() {
        for header in [
            ForwardedHeader::XForwardedFor,
            ForwardedHeader::Forwarded,
            ForwardedHeader::XRealIp,
        ] {
            for value in [
                vec![b'9'; 64 * 1024],
                vec![0xff; 8 * 1024],
                vec![b','; 64 * 1024],
            ] {
                let k = key(
                    &private().header(header),
                    request()
                        .peer("10.0.0.1:1")
                        .header(header.name().as_str(), value),
                );
                assert_eq!(k, ip_key("10.0.0.1"), "{header:?}");
            }
        }
    }

    #[test]
    fn missing_peer_is_an_error_naming_client_ip() {
        let err = private()
            .extract(&request().header("x-forwarded-for", "198.51.100.1").parts())
            .unwrap_err();
        assert_eq!(err.extractor(), "client_ip");
        assert!(err.reason().contains("SocketAddr"));
    }

    #[test]
    fn trust_private_covers_rfc1918_ula_and_loopback_but_not_public() {
        let e = private();
        for trusted in [
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.0.1",
            "fd12::1",
            "fc00::1",
            "127.0.0.1",
            "::1",
        ] {
            assert!(e.is_trusted(trusted.parse().unwrap()), "{trusted}");
        }
        for public in ["172.32.0.1", "8.8.8.8", "2001:db8::1", "fe80::1"] {
            assert!(!e.is_trusted(public.parse().unwrap()), "{public}");
        }
        assert_eq!(e.trusted.len(), 6);
    }

    #[test]
    fn trust_cidr_trusts_exactly_that_network() {
        let e = ClientIp::new().trust_cidr("203.0.113.0/24".parse().unwrap());
        let via = |peer: &str| {
            key(
                &e,
                request()
                    .peer(peer)
                    .header("x-forwarded-for", "198.51.100.1"),
            )
        };
        assert_eq!(via("203.0.113.200:1"), ip_key("198.51.100.1"));
        assert_eq!(via("203.0.114.1:1"), ip_key("203.0.114.1"));
    }
}
