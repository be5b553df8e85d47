//! Connections held per client address, with a place per connection that gives itself back when
//! dropped: `server.max_connections_per_ip` on the listeners, and the ACME HTTP-01 listener's own
//! share.

use std::sync::Arc;

/// Connections held per client IP (at most `max` each).
#[derive(Debug, Default)]
pub struct PerIp {
    max: usize,
    exempt: Vec<ipnet::IpNet>,
    held: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
}

impl PerIp {
    /// At most `max` connections per IP (0: no limit), except from `exempt` peers.
    pub fn new(max: usize, exempt: Vec<ipnet::IpNet>) -> Arc<PerIp> {
        Arc::new(PerIp {
            max,
            exempt,
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
