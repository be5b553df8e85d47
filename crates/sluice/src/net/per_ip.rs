//! Connections held per client address, with a place per connection that gives itself back when
//! dropped: `server.max_connections_per_ip` on the listeners, and the ACME HTTP-01 listener's own
//! share.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

/// How many per-client shares one IPv6 /48 holds at most over all its /64s: a /48 (a site's
/// allocation, free from tunnel brokers) has 65,536 /64s, so counted by /64 alone it held
/// 65,536 shares, far more than `max_connections`. 16 lets a site run 16 busy hosts (or NATs)
/// while one /48 holds at most 16 × 256 = 4,096 connections under the default share.
pub const SHARES_PER_48: usize = 16;

/// Connections held per client IP (at most `max` each).
#[derive(Debug, Default)]
pub struct PerIp {
    max: usize,
    exempt: Vec<ipnet::IpNet>,
    /// IPv6 peers counted by their /64 (a host is commonly given a whole /64), and by their /48
    /// against [`SHARES_PER_48`] shares.
    by_64: bool,
    held: std::sync::Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    /// By client key (an address, or an IPv6 /64 when counted by network).
    by_key: HashMap<IpAddr, usize>,
    /// By IPv6 /48, when counted by network; an entry leaves at zero.
    by_48: HashMap<Ipv6Addr, usize>,
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

    /// Takes a place for `ip`, or `None` when it holds `max` already (or, counted by network,
    /// when its IPv6 /48 holds [`SHARES_PER_48`] × `max`).
    pub fn take(self: &Arc<Self>, ip: IpAddr) -> Option<Option<IpPlace>> {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        if self.max == 0 || self.exempt.iter().any(|n| n.contains(&ip)) {
            return Some(None);
        }
        let (ip, site) = if self.by_64 {
            (network_of(ip), site_of(ip))
        } else {
            (ip, None)
        };
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let Held { by_key, by_48 } = &mut *held;
        if by_key.get(&ip).is_some_and(|&n| n >= self.max) {
            return None;
        }
        if let Some(site) = site {
            let n = by_48.entry(site).or_insert(0);
            if *n >= self.max.saturating_mul(SHARES_PER_48) {
                return None;
            }
            *n += 1;
        }
        *by_key.entry(ip).or_insert(0) += 1;
        Some(Some(IpPlace {
            owner: self.clone(),
            ip,
            site,
        }))
    }
}

/// The IPv6 /48 an address belongs to (`None` for IPv4 and IPv4-mapped addresses): a site's
/// allocation, counted against [`SHARES_PER_48`] shares next to its /64's one.
pub fn site_of(ip: IpAddr) -> Option<Ipv6Addr> {
    match ip {
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_none() => {
            Some((u128::from(v6) & !((1u128 << 80) - 1)).into())
        }
        _ => None,
    }
}

/// The key one client is counted by: an IPv4 address (an IPv4-mapped IPv6 one as IPv4), or
/// an IPv6 address's /64, since a host is commonly given a whole /64.
pub fn network_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
        v4 => v4,
    }
}

/// Gives back one count of `key` in `map`, removing the entry at zero.
pub(crate) fn release<K: std::hash::Hash + Eq>(map: &mut HashMap<K, usize>, key: &K) {
    if let Some(n) = map.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            map.remove(key);
        }
    }
}

/// One connection's place in its IP's count (and its /48's).
#[derive(Debug)]
pub struct IpPlace {
    owner: Arc<PerIp>,
    ip: IpAddr,
    site: Option<Ipv6Addr>,
}

impl Drop for IpPlace {
    fn drop(&mut self) {
        let mut held = self.owner.held.lock().unwrap_or_else(|e| e.into_inner());
        release(&mut held.by_key, &self.ip);
        if let Some(site) = &self.site {
            release(&mut held.by_48, site);
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
        let held = networks.held.lock().unwrap();
        assert!(held.by_key.is_empty() && held.by_48.is_empty());
    }

    /// One IPv6 /48 holds at most `SHARES_PER_48` shares over all its /64s, however many /64s it
    /// spreads its connections over; another /48, IPv4 and exempt peers are not held back, and
    /// every place is given back on drop. Before, each of a /48's 65,536 /64s held a full share.
    #[test]
    fn one_48_holds_at_most_its_shares_over_all_its_64s() {
        let networks = PerIp::by_network(2, vec!["2001:db8:7::/48".parse().unwrap()]);
        let in_64 = |site: u16, net: u16, host: u16| -> IpAddr {
            Ipv6Addr::new(0x2001, 0xdb8, site, net, 0, 0, 0, host).into()
        };
        // The attack: each /64 of 2001:db8:1::/48 opens its full share of 2.
        let mut held = Vec::new();
        let mut refused = 0;
        for net in 0..1000 {
            for host in 1..=2 {
                match networks.take(in_64(1, net, host)) {
                    Some(place) => held.push(place.unwrap()),
                    None => refused += 1,
                }
            }
        }
        assert_eq!(held.len(), 2 * SHARES_PER_48, "{refused} refused");
        // Another /48, an IPv4 peer and an exempt /48 are still served.
        let other = networks.take(in_64(2, 0, 1)).unwrap().unwrap();
        let v4 = networks
            .take("192.0.2.1".parse().unwrap())
            .unwrap()
            .unwrap();
        for net in 0..100 {
            assert!(matches!(networks.take(in_64(7, net, 1)), Some(None)));
        }
        // One place given back lets exactly one more in, from any /64 of the /48.
        held.pop();
        let again = networks.take(in_64(1, 999, 1)).unwrap().unwrap();
        assert!(networks.take(in_64(1, 998, 1)).is_none());
        // Counting address by address (`new`), no /48 is kept.
        let exact = PerIp::new(1, Vec::new());
        let exact_held: Vec<_> = (0..100).map(|net| exact.take(in_64(1, net, 1))).collect();
        assert!(exact_held.iter().all(|p| matches!(p, Some(Some(_)))));
        assert!(exact.held.lock().unwrap().by_48.is_empty());
        drop((held, other, v4, again, exact_held));
        let held = networks.held.lock().unwrap();
        assert!(held.by_key.is_empty() && held.by_48.is_empty());
    }
}
