//! Connections held per client address, with a place per connection that gives itself back when
//! dropped: `server.max_connections_per_ip` on the listeners, and the ACME HTTP-01 listener's own
//! share.

use std::sync::Arc;

/// Connections held per client IP (at most `max` each).
#[derive(Debug, Default)]
pub struct PerIp {
    max: usize,
    exempt: Vec<ipnet::IpNet>,
    /// IPv6 peers counted by their /64 (a host is commonly given a whole /64).
    by_64: bool,
    held: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
}

impl PerIp {
    /// At most `max` connections per IP (0: no limit), except from `exempt` peers.
    pub fn new(max: usize, exempt: Vec<ipnet::IpNet>) -> Arc<PerIp> {
        Arc::new(PerIp {
            max,
            exempt,
            by_64: false,
            held: Default::default(),
        })
    }

    /// As [`PerIp::new`], with IPv6 peers counted by their /64: one host may hold a whole /64,
    /// so counting its addresses one by one would multiply its share.
    pub fn by_network(max: usize, exempt: Vec<ipnet::IpNet>) -> Arc<PerIp> {
        Arc::new(PerIp {
            max,
            exempt,
            by_64: true,
            held: Default::default(),
        })
    }

    /// Takes a place for `ip`, or `None` when it holds `max` already.
    pub fn take(self: &Arc<Self>, ip: std::net::IpAddr) -> Option<Option<IpPlace>> {
        let ip = match ip {
            std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, std::net::IpAddr::V4),
            v4 => v4,
        };
        if self.max == 0 || self.exempt.iter().any(|n| n.contains(&ip)) {
            return Some(None);
        }
        let ip = if self.by_64 { network_of(ip) } else { ip };
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let n = held.entry(ip).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(Some(IpPlace {
            owner: self.clone(),
            ip,
        }))
    }
}

/// The key one client is counted by: an IPv4 address (an IPv4-mapped IPv6 one as IPv4), or
/// an IPv6 address's /64, since a host is commonly given a whole /64.
pub fn network_of(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => std::net::IpAddr::V4(v4),
            None => std::net::IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
        v4 => v4,
    }
}

/// One connection's place in its IP's count.
#[derive(Debug)]
pub struct IpPlace {
    owner: Arc<PerIp>,
    ip: std::net::IpAddr,
}

impl Drop for IpPlace {
    fn drop(&mut self) {
        let mut held = self.owner.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = held.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_counted_one_by_one_or_ipv6_by_its_64() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let exact = PerIp::new(1, vec!["10.0.0.0/8".parse().unwrap()]);
        let a = exact.take(ip("2001:db8::1")).unwrap();
        assert!(exact.take(ip("2001:db8::1")).is_none());
        assert!(exact.take(ip("2001:db8::2")).is_some());
        // The IPv4-mapped form is the IPv4 address; exempt peers are not counted.
        let v4 = exact.take(ip("192.0.2.1")).unwrap();
        assert!(exact.take(ip("::ffff:192.0.2.1")).is_none());
        assert!(matches!(exact.take(ip("10.1.2.3")), Some(None)));
        drop((a, v4));
        assert!(exact.take(ip("2001:db8::1")).is_some());

        let networks = PerIp::by_network(2, Vec::new());
        let held =
            ["2001:db8:0:1::1", "2001:db8:0:1:ffff::9"].map(|a| networks.take(ip(a)).unwrap());
        assert!(networks.take(ip("2001:db8:0:1::77")).is_none());
        assert!(networks.take(ip("2001:db8:0:2::1")).is_some());
        assert!(networks.take(ip("192.0.2.1")).is_some());
        drop(held);
        assert!(networks.take(ip("2001:db8:0:1::77")).is_some());
        assert!(networks.held.lock().unwrap().is_empty());
    }
}
