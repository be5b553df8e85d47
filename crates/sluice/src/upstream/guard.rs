//! The SSRF guard: which resolved upstream addresses a client may make sluice fetch from.
//!
//! Each refused address falls in a named class; the class (never the address) is what a client is
//! told, so an error cannot be used to map the internal network behind a public name.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

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
    /// Also reads this machine's interface addresses again (a server's start).
    pub fn register(addrs: Vec<std::net::SocketAddr>) -> OwnListeners {
        refresh_own_addresses();
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
/// every loopback address, every address of this machine's interfaces, and its own port):
/// fetching it would make sluice its own origin.
pub fn is_own_listener(target: std::net::SocketAddr) -> bool {
    let ip = canonical(target.ip());
    let wildcard = {
        let own = own_listeners().lock().unwrap_or_else(|e| e.into_inner());
        let mut wildcard = false;
        for l in own.iter().filter(|l| l.port() == target.port()) {
            if l.ip() == ip {
                return true;
            }
            wildcard |= l.ip().is_unspecified();
        }
        wildcard
    };
    wildcard
        && (ip.is_loopback() || ip.is_unspecified() || own_addresses().binary_search(&ip).is_ok())
}

/// The class of an address of one of this machine's own network interfaces (not loopback, which
/// has its own): reached over `lo`, which host firewalls accept, so it leads to services bound to
/// `0.0.0.0` that the firewall hides from the outside, whatever class the address is in.
pub const THIS_HOST: &str = "this-host";

/// Why an address is refused, or `None` if it is public.
pub fn non_public_reason(ip: IpAddr) -> Option<&'static str> {
    let ip = canonical(ip);
    if ip.is_loopback() {
        return Some("loopback");
    }
    reason_among(ip, &own_addresses())
}

/// [`non_public_reason`] with `own` (sorted) as this machine's interface addresses.
fn reason_among(ip: IpAddr, own: &[IpAddr]) -> Option<&'static str> {
    let ip = canonical(ip);
    if !ip.is_loopback() && own.binary_search(&ip).is_ok() {
        return Some(THIS_HOST);
    }
    match ip {
        IpAddr::V4(v4) => v4_reason(v4),
        IpAddr::V6(v6) => v6_reason(v6),
    }
}

/// An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) as its IPv4 address; any other as it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// How long a read of the interface addresses is used before a lookup reads them again: they
/// change under a running process (DHCP, a VPN coming up, a container's network attached).
const OWN_ADDRESSES_MAX_AGE: Duration = Duration::from_secs(30);

/// This machine's interface addresses (sorted) and when they were read.
struct OwnAddresses {
    addrs: Arc<[IpAddr]>,
    read: Option<Instant>,
}

fn own_addresses_state() -> &'static Mutex<OwnAddresses> {
    static STATE: OnceLock<Mutex<OwnAddresses>> = OnceLock::new();
    STATE.get_or_init(|| {
        Mutex::new(OwnAddresses {
            addrs: Arc::from(Vec::new()),
            read: None,
        })
    })
}

/// Reads this machine's interface addresses again now: at a server's start and on a reload (a
/// lookup also reads them when the last read is older than 30 s).
pub fn refresh_own_addresses() {
    if let Some(addrs) = interface_addresses() {
        let mut st = own_addresses_state()
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        st.addrs = addrs.into();
        st.read = Some(Instant::now());
    }
}

/// This machine's interface addresses, sorted; read again when the last read is older than
/// [`OWN_ADDRESSES_MAX_AGE`]. The first read happens under the lock (every caller needs it); a
/// later one by the one caller that finds the list stale, the others going on with the old list
/// meanwhile. A failed read (`getifaddrs` needs a socket: none left under descriptor
/// exhaustion) keeps the old list and is tried again 30 s later.
fn own_addresses() -> Arc<[IpAddr]> {
    let mut st = own_addresses_state()
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    if st
        .read
        .is_some_and(|t| now.duration_since(t) < OWN_ADDRESSES_MAX_AGE)
    {
        return st.addrs.clone();
    }
    let first = st.read.is_none();
    st.read = Some(now);
    if first {
        if let Some(addrs) = interface_addresses() {
            st.addrs = addrs.into();
        }
        return st.addrs.clone();
    }
    let old = st.addrs.clone();
    drop(st);
    match interface_addresses() {
        Some(addrs) => {
            let addrs: Arc<[IpAddr]> = addrs.into();
            own_addresses_state()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .addrs = addrs.clone();
            addrs
        }
        None => old,
    }
}

/// The addresses of this machine's network interfaces (`getifaddrs(3)`), IPv4-mapped ones as
/// IPv4, sorted and without repeats; `None` if the call fails. An IPv6 address's scope (a
/// link-local one's interface) is not part of it: the address alone names this host.
///
/// Written on `libc` (already a dependency) because nothing in the tree wraps `getifaddrs`
/// (rustix does not), and a crate for this one call would be more code to trust than these
/// lines.
fn interface_addresses() -> Option<Vec<IpAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: on success getifaddrs stores the head of a list it allocated in `head`; the list is
    // freed once, below, after the last read of it.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        tracing::warn!(
            error = %std::io::Error::last_os_error(),
            "cannot read this machine's interface addresses; the upstream guard keeps the last ones"
        );
        return None;
    }
    let mut out = Vec::new();
    let mut node = head;
    while !node.is_null() {
        // SAFETY: `node` is a node of the list getifaddrs returned, which is not freed yet.
        let ifa = unsafe { &*node };
        let sa = ifa.ifa_addr;
        if !sa.is_null() {
            // SAFETY: a non-null `ifa_addr` points at a socket address whose family field says
            // which `sockaddr_*` it is; it is read without assuming its alignment.
            let family = i32::from(unsafe { (*sa).sa_family });
            if family == libc::AF_INET {
                let sin = unsafe { std::ptr::read_unaligned(sa.cast::<libc::sockaddr_in>()) };
                out.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                    sin.sin_addr.s_addr,
                ))));
            } else if family == libc::AF_INET6 {
                let sin6 = unsafe { std::ptr::read_unaligned(sa.cast::<libc::sockaddr_in6>()) };
                out.push(canonical(IpAddr::V6(Ipv6Addr::from(
                    sin6.sin6_addr.s6_addr,
                ))));
            }
        }
        node = ifa.ifa_next;
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed this once.
    unsafe { libc::freeifaddrs(head) };
    out.sort_unstable();
    out.dedup();
    Some(out)
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

    #[test]
    fn this_machines_own_addresses_are_this_host() {
        // A VPS's public address on its own interface: reached over `lo`, past the firewall.
        let mut own: Vec<IpAddr> = ["8.8.4.4", "2a00:1450::5", "fe80::fc:ff:fe00:1", "10.0.0.5"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        own.sort_unstable();
        for (ip, want) in [
            ("8.8.4.4", Some(THIS_HOST)),
            ("::ffff:8.8.4.4", Some(THIS_HOST)),
            ("2a00:1450::5", Some(THIS_HOST)),
            ("fe80::fc:ff:fe00:1", Some(THIS_HOST)),
            ("10.0.0.5", Some(THIS_HOST)),
            // Other addresses keep their class; loopback stays loopback.
            ("8.8.8.8", None),
            ("2a00:1450::6", None),
            ("10.0.0.6", Some("private")),
            ("127.0.0.1", Some("loopback")),
        ] {
            assert_eq!(reason_among(ip.parse().unwrap(), &own), want, "{ip}");
        }
        // A scoped link-local target (`fe80::...%eth0`) is judged by its address alone.
        let scoped: std::net::SocketAddrV6 = "[fe80::fc:ff:fe00:1%2]:80".parse().unwrap();
        assert_eq!(
            reason_among(IpAddr::V6(*scoped.ip()), &own),
            Some(THIS_HOST)
        );
    }

    #[test]
    fn the_interface_addresses_are_read() {
        let addrs = interface_addresses().expect("getifaddrs");
        assert!(addrs.windows(2).all(|w| w[0] < w[1]), "{addrs:?}");
        // Every machine the tests run on has a loopback interface.
        assert!(addrs.iter().any(|a| a.is_loopback()), "{addrs:?}");
        for a in addrs.iter().filter(|a| !a.is_loopback()) {
            assert_eq!(non_public_reason(*a), Some(THIS_HOST), "{a}");
        }
    }
}
