//! The TCP peer's address, and the IP normalisation every IP key goes through.

use super::{Key, KeyError, KeyExtractor};
use http::request::Parts;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// The IPv6 prefix length that groups addresses into one key unless configured.
pub(crate) const DEFAULT_IPV6_PREFIX: u8 = 64;

/// Tells the user where the peer address comes from, per enabled integration.
#[cfg(feature = "axum")]
pub(crate) const NO_PEER: &str = "no peer address in the request extensions: serve the axum app \
     with `into_make_service_with_connect_info::<SocketAddr>()`, or insert a `SocketAddr` or \
     `IpAddr` request extension before the rate limiter";
#[cfg(not(feature = "axum"))]
pub(crate) const NO_PEER: &str = "no peer address in the request extensions: insert a \
     `SocketAddr` or `IpAddr` request extension before the rate limiter (axum: enable the \
     `axum` feature and serve with `into_make_service_with_connect_info::<SocketAddr>()`)";

/// The connection's remote address, from whichever server integration recorded it.
pub(crate) fn peer_addr(parts: &Parts) -> Option<IpAddr> {
    let ext = &parts.extensions;
    if let Some(addr) = ext.get::<SocketAddr>() {
        return Some(addr.ip());
    }
    if let Some(ip) = ext.get::<IpAddr>() {
        return Some(*ip);
    }
    #[cfg(feature = "axum")]
    if let Some(info) = ext.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(info.0.ip());
    }
    #[cfg(feature = "grpc")]
    if let Some(addr) = ext
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(|i| i.remote_addr())
    {
        return Some(addr.ip());
    }
    // What axum's own `ConnectInfo` extractor falls back to in tests.
    #[cfg(feature = "axum")]
    if let Some(mock) = ext.get::<axum::extract::connect_info::MockConnectInfo<SocketAddr>>() {
        return Some(mock.0.ip());
    }
    None
}

/// Makes equivalent client addresses equal.
///
/// IPv4-mapped IPv6 (a dual-stack socket's view of an IPv4 client) becomes the
/// IPv4 address. Other IPv6 addresses are masked to `v6_prefix` bits, because
/// one subscriber usually holds a whole /64 and could otherwise rotate through
/// 2^64 keys. IPv4 is kept whole.
pub(crate) fn normalise(ip: IpAddr, v6_prefix: u8) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => {
            let prefix = u32::from(v6_prefix.min(128));
            let mask = u128::MAX.checked_shl(128 - prefix).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
        }
    }
}

/// The key for a client address: normalised, then encoded.
pub(crate) fn ip_key(ip: IpAddr, v6_prefix: u8) -> Key {
    Key::ip(normalise(ip, v6_prefix))
}

/// Keys by the TCP peer's IP address (use [`ClientIp`](super::ClientIp) behind a proxy).
///
/// The address is read from the request extensions: a [`SocketAddr`], else an
/// [`IpAddr`], else (feature `axum`) axum's `ConnectInfo<SocketAddr>`. Without
/// one the extractor returns a [`KeyError`] that says how to provide it.
///
/// IPv4-mapped IPv6 addresses count as IPv4, and IPv6 addresses are grouped by
/// their /64 (see [`PeerIp::ipv6_prefix`]).
///
/// ```
/// use std::net::SocketAddr;
/// use tower_ratelimit::key::{Key, KeyExtractor, PeerIp};
/// let peer: SocketAddr = "192.0.2.7:50000".parse().unwrap();
/// let req = http::Request::builder().extension(peer).body(()).unwrap();
/// let (parts, _) = req.into_parts();
/// let key = PeerIp::new().extract(&parts).unwrap();
/// assert_eq!(key, Some(Key::ip("192.0.2.7".parse().unwrap())));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerIp {
    v6_prefix: u8,
}

impl PeerIp {
    /// Keys by the peer IP, grouping IPv6 peers by /64.
    ///
    /// ```
    /// use tower_ratelimit::key::PeerIp;
    /// let by_peer = PeerIp::new();
    /// # let _ = by_peer;
    /// ```
    #[must_use]
    pub fn new() -> Self {
        Self {
            v6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Leading bits of a peer's IPv6 address that form the key (default 64, at most 128).
    ///
    /// Values above 128 are clamped to 128 rather than rejected, so the builder
    /// stays infallible. `128` keys every IPv6 address separately; `48` lumps a
    /// whole site together.
    ///
    /// ```
    /// use tower_ratelimit::key::PeerIp;
    /// let per_site = PeerIp::new().ipv6_prefix(48);
    /// # let _ = per_site;
    /// ```
    #[must_use]
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.v6_prefix = bits.min(128);
        self
    }
}

impl Default for PeerIp {
    fn default() -> Self {
        Self::new()
    }
}

impl KeyExtractor for PeerIp {
    fn extract(&self, parts: &Parts) -> Result<Option<Key>, KeyError> {
        match peer_addr(parts) {
            Some(ip) => Ok(Some(ip_key(ip, self.v6_prefix))),
            None => Err(KeyError::server("peer_ip", NO_PEER)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::test_util::request;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn peer_key(peer: &str) -> Key {
        PeerIp::new()
            .extract(&request().peer(peer).parts())
            .unwrap()
            .unwrap()
    }

    #[test]
    fn ipv6_addresses_in_one_64_share_a_key() {
        assert_eq!(
            peer_key("[2001:db8:1:2:aaaa::1]:1"),
            peer_key("[2001:db8:1:2:bbbb:cccc:dddd:eeee]:2")
        );
    }

    #[test]
    fn ipv6_addresses_in_different_64s_have_different_keys() {
        assert_ne!(
            peer_key("[2001:db8:1:2::1]:1"),
            peer_key("[2001:db8:1:3::1]:1")
        );
    }

    #[test]
    fn prefix_48_groups_different_64s_of_one_48_but_not_different_48s() {
        let e = PeerIp::new().ipv6_prefix(48);
        let key = |peer: &str| e.extract(&request().peer(peer).parts()).unwrap();
        assert_eq!(key("[2001:db8:1:2::1]:1"), key("[2001:db8:1:ffff::9]:1"));
        assert_ne!(key("[2001:db8:1::1]:1"), key("[2001:db8:2::1]:1"));
    }

    #[test]
    fn ipv4_mapped_ipv6_peer_has_the_plain_ipv4_key() {
        assert_eq!(peer_key("[::ffff:192.0.2.1]:1"), peer_key("192.0.2.1:1"));
        assert_eq!(peer_key("192.0.2.1:1"), Key::ip(ip("192.0.2.1")));
    }

    #[test]
    fn ipv4_peers_are_kept_whole() {
        assert_ne!(peer_key("192.0.2.1:1"), peer_key("192.0.2.2:1"));
    }

    #[test]
    fn normalise_masks_ipv6_to_the_prefix_and_keeps_ipv4() {
        assert_eq!(normalise(ip("2001:db8::1:2:3:4"), 64), ip("2001:db8::"));
        assert_eq!(normalise(ip("2001:db8::1"), 128), ip("2001:db8::1"));
        assert_eq!(normalise(ip("2001:db8::1"), 0), ip("::"));
        assert_eq!(normalise(ip("2001:db8::1"), 255), ip("2001:db8::1"));
        assert_eq!(normalise(ip("10.1.2.3"), 0), ip("10.1.2.3"));
        assert_eq!(normalise(ip("::ffff:10.1.2.3"), 64), ip("10.1.2.3"));
    }

    #[test]
    fn ipv6_prefix_above_128_is_clamped_to_128() {
        assert_eq!(
            PeerIp::new().ipv6_prefix(200),
            PeerIp::new().ipv6_prefix(128)
        );
    }

    #[test]
    fn ip_addr_extension_is_used_when_no_socket_addr() {
        let parts = request().extension(ip("192.0.2.9")).parts();
        assert_eq!(
            PeerIp::new().extract(&parts),
            Ok(Some(Key::ip(ip("192.0.2.9"))))
        );
    }

    #[test]
    fn socket_addr_extension_wins_over_ip_addr_extension() {
        let parts = request()
            .peer("192.0.2.1:1")
            .extension(ip("192.0.2.2"))
            .parts();
        assert_eq!(
            PeerIp::new().extract(&parts),
            Ok(Some(Key::ip(ip("192.0.2.1"))))
        );
    }

    #[cfg(feature = "axum")]
    #[test]
    fn axum_connect_info_extension_is_used() {
        let addr: SocketAddr = "192.0.2.3:4".parse().unwrap();
        let parts = request()
            .extension(axum::extract::ConnectInfo(addr))
            .parts();
        assert_eq!(
            PeerIp::new().extract(&parts),
            Ok(Some(Key::ip(ip("192.0.2.3"))))
        );
    }

    #[test]
    fn missing_peer_is_an_error_naming_peer_ip_and_the_fix() {
        let err = PeerIp::new().extract(&request().parts()).unwrap_err();
        assert_eq!(err.extractor(), "peer_ip");
        assert!(err
            .reason()
            .contains("into_make_service_with_connect_info::<SocketAddr>()"));
    }
}
