//! One `[[tcp]]` listener's per-address share (`max_connections_per_ip`, `per_ip_exempt`): the
//! connections each client holds, kept as long as the listener so a reload that changes the share
//! or the exemptions counts the connections already open. An IPv6 client is counted by its /64,
//! as on the HTTP listeners (`net::per_ip`), since one host is commonly given a whole /64, and
//! its /48 holds at most [`SHARES_PER_48`] shares over all its /64s.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};

use crate::net::per_ip::{network_of, release, site_of, SHARES_PER_48};

/// The connections held per client network; changed in place by a reload ([`Share::set`]) rather
/// than replaced, which would forget the connections open and let each address hold its share
/// again on top of them.
pub(super) struct Share {
    state: Mutex<State>,
}

struct State {
    /// Connections one network may hold (0 = no limit).
    max: usize,
    /// Client addresses the share does not apply to.
    exempt: Vec<ipnet::IpNet>,
    /// Every open connection, by the client's network (its /64 for IPv6). Exempt ones are kept
    /// too, so a reload that ends their exemption (or turns the share on) counts them.
    held: HashMap<IpAddr, Network>,
    /// Counted (not exempt) connections by IPv6 /48: the sum of `counted` over its networks,
    /// held against [`SHARES_PER_48`] × `max`; an entry leaves at zero.
    by_48: HashMap<Ipv6Addr, usize>,
}

#[derive(Default)]
struct Network {
    /// Open connections by the client's own address, which exemptions are matched against.
    by_address: HashMap<IpAddr, usize>,
    /// Those of them not exempt now: the count held against `max`.
    counted: usize,
}

impl Share {
    /// At most `max` connections per network (0: no limit), except from `exempt` addresses.
    pub(super) fn new(max: usize, exempt: Vec<ipnet::IpNet>) -> Arc<Share> {
        Arc::new(Share {
            state: Mutex::new(State {
                max,
                exempt,
                held: HashMap::new(),
                by_48: HashMap::new(),
            }),
        })
    }

    /// Makes `max` and `exempt` the share for new connections, over the connections already
    /// open: a network holding more than a lowered `max` is refused until it is below it (its
    /// open connections are not cut).
    pub(super) fn set(&self, max: usize, exempt: Vec<ipnet::IpNet>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.exempt != exempt {
            let State { held, by_48, .. } = &mut *state;
            by_48.clear();
            for (key, network) in held.iter_mut() {
                network.counted = network
                    .by_address
                    .iter()
                    .filter(|(ip, _)| !is_exempt(&exempt, **ip))
                    .map(|(_, n)| n)
                    .sum();
                if let (Some(site), 1..) = (site_of(*key), network.counted) {
                    *by_48.entry(site).or_insert(0) += network.counted;
                }
            }
            state.exempt = exempt;
        }
        state.max = max;
    }

    /// Takes a place for a connection from `ip`, or `None` when its network holds its share
    /// (or its IPv6 /48 holds [`SHARES_PER_48`] shares).
    pub(super) fn take(self: &Arc<Self>, ip: IpAddr) -> Option<Place> {
        let ip = ip.to_canonical();
        let key = network_of(ip);
        let site = site_of(ip);
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let State {
            max,
            exempt,
            held,
            by_48,
        } = &mut *state;
        let counted = !is_exempt(exempt, ip);
        if counted && *max != 0 {
            let full = held.get(&key).is_some_and(|n| n.counted >= *max)
                || site.is_some_and(|site| {
                    by_48
                        .get(&site)
                        .is_some_and(|&n| n >= max.saturating_mul(SHARES_PER_48))
                });
            if full {
                return None;
            }
        }
        let network = held.entry(key).or_default();
        *network.by_address.entry(ip).or_insert(0) += 1;
        if counted {
            network.counted += 1;
            if let Some(site) = site {
                *by_48.entry(site).or_insert(0) += 1;
            }
        }
        Some(Place {
            owner: Arc::clone(self),
            key,
            ip,
        })
    }
}

fn is_exempt(exempt: &[ipnet::IpNet], ip: IpAddr) -> bool {
    exempt.iter().any(|net| net.contains(&ip))
}

/// One connection's place in its network's count; given back on drop.
pub(super) struct Place {
    owner: Arc<Share>,
    key: IpAddr,
    ip: IpAddr,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut state = self.owner.state.lock().unwrap_or_else(|e| e.into_inner());
        let State {
            exempt,
            held,
            by_48,
            ..
        } = &mut *state;
        let Some(network) = held.get_mut(&self.key) else {
            return;
        };
        if network.by_address.contains_key(&self.ip) {
            release(&mut network.by_address, &self.ip);
            // Counted now exactly when not exempt now: `set` recounts when exemptions change.
            if !is_exempt(exempt, self.ip) {
                network.counted -= 1;
                if let Some(site) = site_of(self.key) {
                    release(by_48, &site);
                }
            }
        }
        if network.by_address.is_empty() {
            held.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Two addresses in one /64 share a count; addresses in different /64s (or IPv4 addresses)
    /// do not; an exemption matches the client's own address, not its /64. Before, `[[tcp]]`
    /// counted each IPv6 address apart, so a host with a /64 had a share per address.
    #[test]
    fn ipv6_clients_are_counted_by_their_64() {
        let share = Share::new(2, vec!["2001:db8:0:1::99/128".parse().unwrap()]);
        let held = ["2001:db8:0:1::1", "2001:db8:0:1:ffff::9"].map(|a| share.take(ip(a)).unwrap());
        assert!(share.take(ip("2001:db8:0:1::77")).is_none());
        assert!(share.take(ip("2001:db8:0:1::1")).is_none());
        // The exempt address of that /64 is served, and does not count against the others.
        let exempt = share.take(ip("2001:db8:0:1::99")).unwrap();
        let other = [
            "2001:db8:0:2::1",
            "2001:db8:0:2::2",
            "192.0.2.1",
            "::ffff:192.0.2.1",
        ]
        .map(|a| share.take(ip(a)).unwrap());
        assert!(share.take(ip("2001:db8:0:2::3")).is_none());
        assert!(share.take(ip("192.0.2.1")).is_none());
        assert!(share.take(ip("192.0.2.2")).is_some());
        drop(held);
        let back = share.take(ip("2001:db8:0:1::77")).unwrap();
        drop((back, exempt, other));
        assert!(share.state.lock().unwrap().held.is_empty());
    }

    /// A change of share or exemptions applies to the connections already open: nothing is
    /// forgotten, a lowered share refuses until the network is below it, and an ended exemption
    /// counts the connections opened under it.
    #[test]
    fn a_changed_share_counts_the_connections_open() {
        let share = Share::new(2, Vec::new());
        let held = [(); 2].map(|_| share.take(ip("198.51.100.1")).unwrap());
        share.set(3, Vec::new());
        let third = share.take(ip("198.51.100.1")).unwrap();
        assert!(share.take(ip("198.51.100.1")).is_none());
        share.set(1, Vec::new());
        drop(held);
        assert!(share.take(ip("198.51.100.1")).is_none());
        drop(third);
        let one = share.take(ip("198.51.100.1")).unwrap();

        share.set(1, vec!["198.51.100.0/24".parse().unwrap()]);
        let exempt = [(); 3].map(|_| share.take(ip("198.51.100.1")).unwrap());
        share.set(1, Vec::new());
        assert_eq!(
            share.state.lock().unwrap().held[&ip("198.51.100.1")].counted,
            4
        );
        assert!(share.take(ip("198.51.100.1")).is_none());
        drop((one, exempt));
        assert!(share.state.lock().unwrap().held.is_empty());
        // Off (0), connections are still counted, so turning the share on counts them.
        share.set(0, Vec::new());
        let off = [(); 2].map(|_| share.take(ip("198.51.100.1")).unwrap());
        share.set(2, Vec::new());
        assert!(share.take(ip("198.51.100.1")).is_none());
        drop(off);
    }

    /// One IPv6 /48 holds at most `SHARES_PER_48` shares over all its /64s; exempt addresses in
    /// it are served and not counted, and a change of exemptions recounts the /48 too. Before,
    /// each of a /48's 65,536 /64s held a full share: one /48 (a /57 at a share of 100) filled
    /// every slot of a 10,000-connection listener.
    #[test]
    fn one_48_holds_at_most_its_shares_over_all_its_64s() {
        let share = Share::new(1, vec!["2001:db8:1:ffff::/64".parse().unwrap()]);
        let in_64 = |site: u16, net: u16| -> IpAddr {
            std::net::Ipv6Addr::new(0x2001, 0xdb8, site, net, 0, 0, 0, 1).into()
        };
        let held: Vec<Place> = (0..1000)
            .filter_map(|net| share.take(in_64(1, net)))
            .collect();
        assert_eq!(held.len(), SHARES_PER_48);
        let other = share.take(in_64(2, 0)).unwrap();
        let exempt: Vec<Place> = (0..3)
            .map(|_| share.take(in_64(1, 0xffff)).unwrap())
            .collect();
        assert_eq!(
            share.state.lock().unwrap().by_48[&site_of(in_64(1, 0)).unwrap()],
            16
        );
        // The exemption ends: its 3 count, so the /48 is over its shares until 3 + 1 leave.
        share.set(1, Vec::new());
        let mut held = held;
        held.truncate(SHARES_PER_48 - 3);
        assert!(share.take(in_64(1, 999)).is_none());
        held.pop();
        let again = share.take(in_64(1, 999)).unwrap();
        drop((held, other, exempt, again));
        let state = share.state.lock().unwrap();
        assert!(state.held.is_empty() && state.by_48.is_empty());
    }
}
