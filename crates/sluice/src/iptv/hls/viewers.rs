//! The HLS viewers of a channel: client addresses that asked for its playlist or segments
//! lately, counted with the raw-TS viewers against `max_subscribers_per_channel`, each address a viewer
//! (`registry::client_of`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::super::hub::Hub;
use super::super::registry;

/// HLS has no connection to count: a viewer is a client address, there from its first request
/// until it has asked nothing for a while.
#[derive(Debug, Default)]
pub(super) struct Viewers {
    seen: Mutex<HashMap<IpAddr, Instant>>,
}

impl Viewers {
    /// Notes a request from `ip`; false when it is a new viewer and the channel is full.
    pub(super) fn admit(&self, hub: &Hub, ip: IpAddr, limit: usize) -> bool {
        let ip = super::super::registry::client_of(ip);
        let mut seen = registry::lock(&self.seen);
        if let Some(at) = seen.get_mut(&ip) {
            *at = Instant::now();
            return true;
        }
        if limit > 0 && hub.viewers() >= limit {
            return false;
        }
        seen.insert(ip, Instant::now());
        hub.hls_viewers.store(seen.len(), Ordering::Release);
        true
    }

    /// Forgets viewers that have asked nothing for `idle`.
    pub(super) fn prune(&self, hub: &Hub, idle: Duration) {
        let mut seen = registry::lock(&self.seen);
        let before = seen.len();
        seen.retain(|_, at| at.elapsed() < idle);
        if seen.len() != before {
            hub.hls_viewers.store(seen.len(), Ordering::Release);
        }
    }

    /// The channel stopped: none of its viewers counts any more.
    pub(super) fn clear(&self, hub: &Hub) {
        registry::lock(&self.seen).clear();
        hub.hls_viewers.store(0, Ordering::Release);
    }
}
