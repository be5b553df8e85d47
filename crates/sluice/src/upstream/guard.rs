//! The SSRF guard: which resolved upstream addresses a client may make sluice fetch from.

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
    } else if ip.is_broadcast() || ip.is_multicast() {
        Some("broadcast or multicast")
    } else {
        None
    }
}

fn v6_reason(ip: Ipv6Addr) -> Option<&'static str> {
    let first = ip.segments()[0];
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_unspecified() {
        Some("unspecified")
    } else if (first & 0xfe00) == 0xfc00 {
        Some("private")
    } else if (first & 0xffc0) == 0xfe80 {
        Some("link-local")
    } else if ip.is_multicast() {
        Some("broadcast or multicast")
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
            ("::1", Some("loopback")),
            ("::ffff:127.0.0.1", Some("loopback")),
            ("fd00::1", Some("private")),
            ("fe80::1", Some("link-local")),
            ("::", Some("unspecified")),
            ("8.8.8.8", None),
            ("2001:4860::8888", None),
        ] {
            assert_eq!(non_public_reason(ip.parse().unwrap()), want, "{ip}");
        }
    }
}
