//! The SSRF guard: which resolved upstream addresses a client may make sluice fetch from.
//!
//! Each refused address falls in a named class; the class (never the address) is what a client is
//! told, so an error cannot be used to map the internal network behind a public name.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

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
    } else {
        None
    }
}

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
            ("64:ff9b:2::1", None),
            ("2002:7f00:1::1", Some("6to4")),
            ("::7f00:1", Some("IPv4-compatible")),
            ("::a00:1", Some("IPv4-compatible")),
            ("8.8.8.8", None),
            ("1.1.1.1", None),
            ("2001:4860::8888", None),
            ("2a00:1450::1", None),
        ] {
            assert_eq!(non_public_reason(ip.parse().unwrap()), want, "{ip}");
        }
    }
}
