//! `ClientIp` behind trusted proxies, on arbitrary `Forwarded`,
//! `X-Forwarded-For` and `X-Real-IP` headers: it never panics, a key is at
//! most 48 bytes, the same request always gives the same answer, and a peer
//! that is not trusted is keyed by its own address whatever the headers say.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use tower_ratelimit::key::{ClientIp, ForwardedHeader, KeyExtractor, PeerIp};

#[derive(Arbitrary, Debug)]
struct Input {
    peer_v4: Option<[u8; 4]>,
    peer_v6: [u8; 16],
    header: u8,
    values: Vec<(u8, Vec<u8>)>,
    ipv6_prefix: u8,
}

fuzz_target!(|input: Input| {
    let peer: IpAddr = match input.peer_v4 {
        Some(b) => Ipv4Addr::from(b).into(),
        None => Ipv6Addr::from(input.peer_v6).into(),
    };
    let mut req = http::Request::new(());
    for (which, value) in input.values.iter().take(16) {
        let name = match which % 3 {
            0 => "forwarded",
            1 => "x-forwarded-for",
            _ => "x-real-ip",
        };
        if let Ok(v) = http::HeaderValue::from_bytes(value) {
            req.headers_mut().append(name, v);
        }
    }
    req.extensions_mut().insert(SocketAddr::new(peer, 443));
    let (parts, ()) = req.into_parts();
    let header = match input.header % 3 {
        0 => ForwardedHeader::Forwarded,
        1 => ForwardedHeader::XForwardedFor,
        _ => ForwardedHeader::XRealIp,
    };
    let prefix = input.ipv6_prefix % 129;
    let trusting = ClientIp::new()
        .trust_private()
        .trust_loopback()
        .header(header)
        .ipv6_prefix(prefix);
    let first = trusting.extract(&parts);
    let again = trusting.extract(&parts);
    assert_eq!(format!("{first:?}"), format!("{again:?}"), "the same request, another answer");
    if let Ok(Some(key)) = &first {
        assert!(key.as_bytes().len() <= 48);
    }
    // Trusting no proxy: the headers are never read.
    let alone = ClientIp::new().header(header).ipv6_prefix(prefix).extract(&parts);
    let peer_key = PeerIp::new().ipv6_prefix(prefix).extract(&parts);
    assert_eq!(format!("{alone:?}"), format!("{peer_key:?}"), "an untrusted peer's headers were read");
});
