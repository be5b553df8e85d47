//! The SSRF guard: which resolved upstream addresses a client may make sluice fetch from.
//!
//! Each refused address falls in a named class; the class (never the address) is what a client is
//! told, so an error cannot be used to map the internal network behind a public name.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;

/// The header every upstream request of the media front end and the gateway carries, with this
/// process's [`loop_mark`]: a request that arrives with it came from this sluice itself (an
/// origin redirected it back here), and is refused rather than fetched again.
pub const LOOP_HEADER: &str = "x-sluice-loop";

/// This process's random loop mark (another sluice in a chain has its own, so chains work).
pub fn loop_mark() -> &'static http::HeaderValue {
    static MARK: OnceLock<http::HeaderValue> = OnceLock::new();
    MARK.get_or_init(|| {
        let mut b = [0u8; 8];
        let _ = getrandom::getrandom(&mut b);
        let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
        http::HeaderValue::from_str(&hex).unwrap_or(http::HeaderValue::from_static("sluice"))
    })
}

/// Whether `headers` carry this process's loop mark.
pub fn is_own_loop(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(LOOP_HEADER)
        .iter()
        .any(|v| v == loop_mark())
}

/// The addresses this process's HTTP servers listen on, while they run.
fn own_listeners() -> &'static std::sync::Mutex<Vec<std::net::SocketAddr>> {
    static OWN: OnceLock<std::sync::Mutex<Vec<std::net::SocketAddr>>> = OnceLock::new();
    OWN.get_or_init(Default::default)
}

/// A running server's listening addresses, known to [`is_own_listener`] until dropped.
pub struct OwnListeners(Vec<std::net::SocketAddr>);

impl OwnListeners {
    pub fn register(addrs: Vec<std::net::SocketAddr>) -> OwnListeners {
        let mut own = own_listeners().lock().unwrap_or_else(|e| e.into_inner());
        own.extend(addrs.iter().copied());
        OwnListeners(addrs)
    }
}

impl Drop for OwnListeners {
    fn drop(&mut self) {
        let mut own = own_listeners().lock().unwrap_or_else(|e| e.into_inner());
        for addr in &self.0 {
            if let Some(i) = own.iter().position(|a| a == addr) {
                own.swap_remove(i);
            }
        }
    }
}

/// Whether `target` is one of this process's own listeners (a wildcard listener counts for
/// every loopback address and its own port): fetching it would make sluice its own origin.
pub fn is_own_listener(target: std::net::SocketAddr) -> bool {
    let ip = match target.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(target.ip(), IpAddr::V4),
        v4 => v4,
    };
    let own = own_listeners().lock().unwrap_or_else(|e| e.into_inner());
    own.iter().any(|l| {
        l.port() == target.port()
            && (l.ip() == ip
                || (l.ip().is_unspecified() && (ip.is_loopback() || ip.is_unspecified())))
    })
}

/// Why an address is refused, or `None` if it is public.
pub fn non_public_reason(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_reason(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4_reason(v4),
            None => v6_reason(v6),
        },
    }
}

fn v4_reason(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_private() || (o[0] == 100 && (o[1] & 0xc0) == 64) {
        Some("private")
    } else if ip.is_link_local() {
        Some("link-local")
    } else if ip.is_unspecified() || o[0] == 0 {
        Some("unspecified")
    } else if ip.is_broadcast() {
        Some("broadcast")
    } else if ip.is_multicast() {
        Some("multicast")
    } else if o[0] == 198 && (o[1] & 0xfe) == 18 {
        // 198.18.0.0/15: benchmarking networks, often routed to lab gear inside a site.
        Some("benchmarking")
    } else if o[0] >= 240 {
        Some("reserved")
    } else if o[0] == 192 && o[1] == 0 && o[2] == 0 {
        // 192.0.0.0/24: protocol assignments (DS-Lite, NAT64 discovery); never a CDN.
        Some("reserved")
    } else if matches!(
        (o[0], o[1], o[2]),
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113)
    ) {
        // TEST-NET-1/2/3: documentation only, yet often routed to lab gear.
        Some("documentation")
    } else if (o[0], o[1], o[2]) == (192, 88, 99) {
        // The deprecated 6to4 relay anycast prefix: a relay reaches what the packet embeds.
        Some("6to4")
    } else {
        None
    }
}

/// Classes from the IANA IPv6 special-purpose registry, in order; only global unicast
/// (`2000::/3`) outside the ranges named here is public.
fn v6_reason(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_unspecified() {
        Some("unspecified")
    } else if (s[0] & 0xfe00) == 0xfc00 {
        Some("private")
    } else if (s[0] & 0xffc0) == 0xfe80 {
        Some("link-local")
    } else if ip.is_multicast() {
        Some("multicast")
    } else if s[0] == 0x0064 && s[1] == 0xff9b && (s[2..6] == [0; 4] || s[2] == 1) {
        // 64:ff9b::/96 (well-known NAT64) and 64:ff9b:1::/48 (local-use NAT64): the gateway
        // translates to an IPv4 address of its choosing, internal ones included.
        Some("NAT64")
    } else if s[0] == 0x2002 {
        // 6to4 embeds an IPv4 address that a relay will reach on the client's behalf.
        Some("6to4")
    } else if s[0..6] == [0; 6] {
        // ::/96, deprecated IPv4-compatible addresses (::a.b.c.d); some stacks still route them
        // to the embedded IPv4 address.
        Some("IPv4-compatible")
    } else if s[0..4] == [0; 4] && s[4] == 0xffff && s[5] == 0 {
        // ::ffff:0:0:0/96, IPv4-translated (SIIT): a translator reaches the embedded address.
        Some("IPv4-translated")
    } else if s[0] == 0x0100 && s[1..3] == [0, 0] && s[3] <= 1 {
        // 100::/64 discard-only and 100:0:0:1::/64 dummy prefix.
        Some("discard")
    } else if (s[0] & 0xffc0) == 0xfec0 {
        // fec0::/10, deprecated site-local: still private where it is used.
        Some("site-local")
    } else if s[0] == 0x2001 && s[1] < 0x0200 {
        // 2001::/23, IETF protocol assignments: Teredo (2001::/32, embeds an IPv4 address a
        // relay will reach), benchmarking (2001:2::/48), ORCHID and the like.
        Some("protocol-assignment")
    } else if s[0] == 0x2001 && s[1] == 0x0db8 || (s[0] & 0xfff0) == 0x3ff0 {
        // 2001:db8::/32 and 3fff::/20: documentation.
        Some("documentation")
    } else if (s[0] & 0xe000) != 0x2000 {
        // Outside global unicast: unassigned, SRv6 SIDs (5f00::/16) and the like.
        Some("reserved")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies() {
        for (ip, want) in [
            ("127.0.0.1", Some("loopback")),
            ("10.1.2.3", Some("private")),
            ("192.168.0.1", Some("private")),
            ("172.16.0.1", Some("private")),
            ("100.64.0.1", Some("private")),
            ("169.254.169.254", Some("link-local")),
            ("0.0.0.0", Some("unspecified")),
            ("255.255.255.255", Some("broadcast")),
            ("224.0.0.1", Some("multicast")),
            ("239.1.1.1", Some("multicast")),
            ("198.18.0.1", Some("benchmarking")),
            ("198.19.255.254", Some("benchmarking")),
            ("198.20.0.1", None),
            ("240.0.0.1", Some("reserved")),
            ("250.1.2.3", Some("reserved")),
            ("192.0.0.170", Some("reserved")),
            ("::1", Some("loopback")),
            ("::ffff:127.0.0.1", Some("loopback")),
            ("::ffff:198.18.3.4", Some("benchmarking")),
            ("fd00::1", Some("private")),
            ("fe80::1", Some("link-local")),
            ("ff02::1", Some("multicast")),
            ("::", Some("unspecified")),
            ("64:ff9b::7f00:1", Some("NAT64")),
            ("64:ff9b::808:808", Some("NAT64")),
            ("64:ff9b:1::a00:1", Some("NAT64")),
            ("64:ff9b:1:ffff::1", Some("NAT64")),
            ("64:ff9b:2::1", Some("reserved")),
            ("2002:7f00:1::1", Some("6to4")),
            ("::7f00:1", Some("IPv4-compatible")),
            ("::a00:1", Some("IPv4-compatible")),
            ("::ffff:0:7f00:1", Some("IPv4-translated")),
            ("::ffff:0:808:808", Some("IPv4-translated")),
            ("::ffff:8.8.8.8", None),
            ("100::1", Some("discard")),
            ("100:0:0:1::1", Some("discard")),
            ("fec0::1", Some("site-local")),
            ("feff::1", Some("site-local")),
            ("2001::1", Some("protocol-assignment")),
            (
                "2001:0:4136:e378:8000:63bf:3fff:fdd2",
                Some("protocol-assignment"),
            ),
            ("2001:2::1", Some("protocol-assignment")),
            ("2001:1ff::1", Some("protocol-assignment")),
            ("2001:db8::1", Some("documentation")),
            ("3fff::1", Some("documentation")),
            ("5f00::1", Some("reserved")),
            ("4000::1", Some("reserved")),
            ("192.0.2.1", Some("documentation")),
            ("198.51.100.7", Some("documentation")),
            ("203.0.113.9", Some("documentation")),
            ("192.88.99.1", Some("6to4")),
            ("2001:200::1", None),
            ("2600::1", None),
            ("8.8.8.8", None),
            ("1.1.1.1", None),
            ("2001:4860::8888", None),
            ("2a00:1450::1", None),
        ] {
            assert_eq!(non_public_reason(ip.parse().unwrap()), want, "{ip}");
        }
    }
}
