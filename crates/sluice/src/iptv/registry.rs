//! The table of live hubs, subscriber limits, and the subscription guard that keeps counts true.
//!
//! Creating, joining and removing a hub all happen under one lock, so a subscriber can never
//! attach to a hub that has just decided to leave its group.
//!
//! A client's share (`max_subscribers_per_client`, counted per address: `client_of`)
//! covers its subscriptions and the hubs it started that nobody watches yet or any more (a
//! lingering group, an RTSP session still being set up after its viewer left): asking for
//! channels and hanging up at once would otherwise hold `max_channels` for `linger_ms`.
//!
//! A client also starts channels at a bounded rate (`Starts`): at its share, each new channel
//! it asks for releases its oldest lingering one at once, so without a bound a client asking
//! for new groups and hanging up made one IGMP join and one leave per request, as fast as it
//! could ask, and every group left kept flowing for the routers' leave latency. An RTSP
//! channel's start (a session set up on its server, and torn down) is bounded the same way.
//! A start that fails before reaching the network spends none: a multicast join that sent
//! nothing (`sent`), an RTSP session that never connected to a server (`remove_unreached`).
//! Those given back come from a second bucket of the same size and rate (`refunds`): a dead
//! channel retried costs nothing, but a client whose setups all fail at once (a port that
//! refuses, a name that does not resolve) starts at most twice the normal rate, each start a
//! connection or a lookup of the client's choosing.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::hub::{ClientStats, Hub, HubKey, HubSettings};
use super::metrics::{label_value, HubLabels, Metrics};

/// The key one client is counted by: its address (an IPv4-mapped IPv6 one as IPv4). Not the
/// IPv6 /64 other shares use: the gateway's viewers are most often one home network, whose
/// devices all take addresses from one /64, and each is a viewer of its own.
pub(super) fn client_of(ip: std::net::IpAddr) -> std::net::IpAddr {
    ip.to_canonical()
}

/// Limits on subscribers and hubs; 0 means unlimited.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub subscribers: usize,
    pub per_hub: usize,
    pub hubs: usize,
    /// Subscriptions, plus unwatched hubs it started, one client may hold at once
    /// (`iptv.max_subscribers_per_client`).
    pub per_client: usize,
}

/// Why a subscription was refused.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("gateway is at its limit of {0} subscribers")]
    Subscribers(usize),
    #[error("channel is at its limit of {0} subscribers")]
    PerHub(usize),
    #[error("gateway is at its limit of {0} channels")]
    Hubs(usize),
    /// Past one of the client's own bounds: a 429 booked to it (`max_per_client`).
    #[error("{0}")]
    PerClient(ClientLimit),
    #[error("cannot join: {0}")]
    Join(#[from] std::io::Error),
}

impl Refusal {
    /// Seconds after which asking again can succeed, when the refusal knows (`Retry-After`).
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Refusal::PerClient(ClientLimit::Starts { retry_after, .. }) => Some(*retry_after),
            _ => None,
        }
    }
}

/// Which of a client's bounds a request went past.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ClientLimit {
    /// `max_subscribers_per_client`: channels watched, and unwatched ones it started.
    #[error("this client is at its limit of {0} channels at once")]
    Channels(usize),
    /// New channels (multicast joins, RTSP sessions) started faster than `per_window` per
    /// `START_WINDOW`.
    #[error(
        "this client is starting new channels too fast (at most {per_window} every {}s); try again in {retry_after} s",
        START_WINDOW.as_secs()
    )]
    Starts { per_window: usize, retry_after: u64 },
}

/// The window a client's multicast starts are counted over: about the time a router keeps a
/// group flowing after the last leave (IGMPv2's last-member query interval times its
/// robustness, 1 s × 2). A client may start its share (`max_subscribers_per_client`) of new
/// channels per window, so what it makes flow at once stays a few times its share: the groups
/// it holds, those it left within the window, and a burst.
pub const START_WINDOW: Duration = Duration::from_secs(2);

/// Starts a client may make at once, whatever its share: a viewer paging through a few
/// channels is not slowed (its share is also the burst when it is larger).
pub const START_BURST: usize = 8;

/// Clients' start buckets are looked over for full ones (forgotten) past this many.
const STARTS_KEPT: usize = 256;

/// One client's multicast starts: a token bucket of `per_client.max(START_BURST)` starts,
/// refilled at `per_client` per `START_WINDOW`. A full bucket is the same as none, so full
/// ones are dropped.
#[derive(Debug, Clone, Copy)]
struct Starts {
    /// Starts left, in thousandths.
    milli: u64,
    at: Instant,
}

impl Starts {
    /// The bucket at `now`, refilled; `capacity` and `per_window` in starts.
    fn at(self, now: Instant, capacity: u64, per_window: u64) -> Starts {
        let elapsed = now.saturating_duration_since(self.at).as_millis() as u64;
        let refill = elapsed.saturating_mul(per_window).saturating_mul(1000)
            / (START_WINDOW.as_millis() as u64);
        Starts {
            milli: self.milli.saturating_add(refill).min(capacity * 1000),
            at: now,
        }
    }
}

#[derive(Debug)]
pub struct Registry {
    hubs: Mutex<HashMap<HubKey, Arc<Hub>>>,
    total: AtomicUsize,
    /// Subscriptions held per client address (`client_of`; entries leave at zero).
    clients: Mutex<HashMap<IpAddr, usize>>,
    /// Channel starts left per client address (`client_of`; full buckets are forgotten).
    starts: Mutex<HashMap<IpAddr, Starts>>,
    /// RTSP hubs in the table (by address, `hub_addr`) that took a start, and the client whose
    /// start it was: given back by `remove_unreached` when the session never reached a server.
    /// Entries are made and leave (`unlink`) under the table lock.
    rtsp_starts: Mutex<HashMap<usize, IpAddr>>,
    /// Starts each client address may still be given back (`give_back_unreached`): a bucket
    /// of the start bucket's size and rate (full buckets are forgotten). Without it, a setup
    /// that failed before connecting cost nothing, at any rate: a client had the gateway try
    /// connections to addresses and ports of its choosing (a port scanner), or resolve names
    /// of its choosing (a DNS flood through the operator's resolver), as fast as they failed
    /// (~800 a second from 8 requests at once refused in ~10 ms), each failure kept a minute.
    refunds: Mutex<HashMap<IpAddr, Starts>>,
    next_id: AtomicU64,
    pub metrics: Metrics,
    pub settings: HubSettings,
    pub limits: Limits,
}

impl Registry {
    pub fn new(metrics: Metrics, settings: HubSettings, limits: Limits) -> Self {
        Self {
            hubs: Mutex::new(HashMap::new()),
            total: AtomicUsize::new(0),
            clients: Mutex::new(HashMap::new()),
            starts: Mutex::new(HashMap::new()),
            rtsp_starts: Mutex::new(HashMap::new()),
            refunds: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            metrics,
            settings,
            limits,
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<HubKey, Arc<Hub>>> {
        self.hubs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Attaches a subscriber to the hub for `key`, creating (and joining) it if needed.
    pub fn subscribe(
        self: &Arc<Self>,
        key: HubKey,
        fcc: Option<super::fcc::FccTarget>,
        peer: Option<std::net::SocketAddr>,
    ) -> Result<Subscription, Refusal> {
        let mut table = self.table();
        let client = peer.map(|p| client_of(p.ip()));
        let starts = self.check_limits(&table, &key, client)?;
        if let Some(client) = client {
            self.make_room(&mut table, client, &key)?;
        }
        let hub = match table.get(&key) {
            Some(hub) => hub.clone(),
            None => {
                if over(self.limits.hubs, table.len()) {
                    return Err(Refusal::Hubs(self.limits.hubs));
                }
                // Both can come from the request (the RTSP path, `?iface=`): escaped so one
                // request cannot break the scrape, and short (an RTSP path is cut and hashed by
                // `RtspKey::label`, a name has 15 bytes at most) so one cannot swell it.
                let labels = HubLabels {
                    channel: label_value(&key.channel()),
                    interface: label_value(&key.group.interface),
                };
                // Whether the start put something on the network before it failed (the FCC
                // request, the media join: an FEC socket is opened after both): such a failure
                // (a 502) came after traffic and still spends a start.
                let mut sent = false;
                // FCC only matters to a hub that is starting: an existing one already has
                // the stream (and its history) for the new subscriber.
                let started = Hub::start(
                    key.clone(),
                    fcc,
                    self.metrics.hub(labels.clone()),
                    &self.settings,
                    self.clone(),
                    &mut sent,
                );
                let hub = match started {
                    Ok(hub) => hub,
                    Err(e) => {
                        if let (Some(client), true, true) = (client, starts, sent) {
                            self.spend_start(client, Instant::now());
                        }
                        // No hub owns the series just made, and `unlink` never runs for it:
                        // each refused start (the RTSP session limit, a failed join) would
                        // leave its series, named by the client's path, for good.
                        self.drop_series(&table, &labels);
                        return Err(e.into());
                    }
                };
                // Spent once the join is made: a failed one (no such interface, a join
                // error) joined nothing, and must not bring the client nearer a 429 (but for
                // `sent`, above). Checked
                // and spent under this one table lock, so no other start comes between.
                if let (Some(client), true) = (client, starts) {
                    self.spend_start(client, Instant::now());
                    // An RTSP session connects later, in its task: the start is given back
                    // there if it never reaches a server (`remove_unreached`).
                    if hub.key.rtsp.is_some() && self.start_bucket().is_some() {
                        lock(&self.rtsp_starts).insert(hub_addr(&hub), client);
                    }
                }
                self.metrics.hubs.inc();
                *lock(&hub.starter) = client;
                table.insert(key, hub.clone());
                hub
            }
        };
        if over(self.limits.per_hub, hub.viewers()) {
            return Err(Refusal::PerHub(self.limits.per_hub));
        }
        Ok(self.attach(hub, peer))
    }

    /// The refusals `subscribe` gives before any work, in its order: the gateway's
    /// subscribers, then the client's share and, for a channel `table` does not hold (one this
    /// request would start), its start rate. Returns whether the request would start `key`.
    fn check_limits(
        &self,
        table: &HashMap<HubKey, Arc<Hub>>,
        key: &HubKey,
        client: Option<IpAddr>,
    ) -> Result<bool, Refusal> {
        let total = self.total.load(Ordering::Acquire);
        if over(self.limits.subscribers, total) {
            return Err(Refusal::Subscribers(self.limits.subscribers));
        }
        // A channel this request would start: bounded per client in rate too. A multicast
        // group's join, or an RTSP session (a connection, DESCRIBE, SETUP and PLAY to its
        // server, and a TEARDOWN when released): before, RTSP starts were left out, and a
        // client zapping through `/rtsp/` paths made one session per request, as fast as it
        // could ask (each released at once at its share).
        let starts = !table.contains_key(key);
        // Checked before a hub is started: one client must not make the gateway join groups
        // (or exhaust `max_channels`) beyond its share.
        if let Some(client) = client {
            self.check_share(client)?;
            if starts {
                self.check_starts(client, Instant::now())?;
            }
        }
        Ok(starts)
    }

    /// What `subscribe` would refuse `key` for now, before it starts anything, and, when the
    /// request would start `key`, its client's start taken at once (the client returned): for
    /// work a start needs before it subscribes (an RTSP server's name resolved for the address
    /// guard), which a request the client's bounds refuse must not cause. The start stays
    /// spent when that work refuses the request (`guard_refusal`'s 403: before, a refusal
    /// spent nothing, so a client had names of its choosing resolved at any rate); otherwise
    /// it is handed back (`return_start`) for `subscribe` to check and spend again. Taken
    /// before the work rather than after, so requests in flight at once cannot all pass on
    /// one start left.
    pub fn reserve_start(
        &self,
        key: &HubKey,
        peer: Option<std::net::SocketAddr>,
    ) -> Result<Option<IpAddr>, Refusal> {
        let table = self.table();
        let client = peer.map(|p| client_of(p.ip()));
        let starts = self.check_limits(&table, key, client)?;
        match client {
            Some(client) if starts && self.start_bucket().is_some() => {
                self.spend_start(client, Instant::now());
                Ok(Some(client))
            }
            _ => Ok(None),
        }
    }

    /// Hands back the start `reserve_start` took from `client`, once the work it was taken for
    /// let the request through.
    pub fn return_start(&self, client: IpAddr) {
        self.give_back_start(client, Instant::now());
    }

    /// Refuses a client that watches its whole share already (nothing to release for it).
    fn check_share(&self, client: IpAddr) -> Result<(), Refusal> {
        let limit = self.limits.per_client;
        if over(limit, self.watching(client)) {
            return Err(Refusal::PerClient(ClientLimit::Channels(limit)));
        }
        Ok(())
    }

    fn watching(&self, client: IpAddr) -> usize {
        lock(&self.clients).get(&client).copied().unwrap_or(0)
    }

    /// The start bucket's size and refill per `START_WINDOW`; `None` when unbounded
    /// (`max_subscribers_per_client = 0`: lingering groups are then bounded by
    /// `max_channels` and `linger_ms`, none is released early).
    fn start_bucket(&self) -> Option<(u64, u64)> {
        let share = self.limits.per_client as u64;
        (share > 0).then(|| (share.max(START_BURST as u64), share))
    }

    /// Refuses a client that started its bucket's worth of multicast channels lately.
    fn check_starts(&self, client: IpAddr, now: Instant) -> Result<(), Refusal> {
        let Some((capacity, per_window)) = self.start_bucket() else {
            return Ok(());
        };
        let Some(bucket) = lock(&self.starts).get(&client).copied() else {
            return Ok(());
        };
        let bucket = bucket.at(now, capacity, per_window);
        if bucket.milli >= 1000 {
            return Ok(());
        }
        // The wait for the next whole start, rounded up to a second (at least one).
        let window = START_WINDOW.as_millis() as u64;
        let wait_ms = ((1000 - bucket.milli) * window).div_ceil(1000 * per_window);
        Err(Refusal::PerClient(ClientLimit::Starts {
            per_window: per_window as usize,
            retry_after: wait_ms.div_ceil(1000).max(1),
        }))
    }

    /// Takes one start from `client`'s bucket (checked by `check_starts` under the same lock).
    fn spend_start(&self, client: IpAddr, now: Instant) {
        let Some((capacity, per_window)) = self.start_bucket() else {
            return;
        };
        let mut starts = lock(&self.starts);
        let bucket = bucket_of(&mut starts, client, now, capacity, per_window);
        bucket.milli = bucket.milli.saturating_sub(1000);
    }

    /// Gives `client` back one start `spend_start` took (a bucket no longer kept was full).
    fn give_back_start(&self, client: IpAddr, now: Instant) {
        let Some((capacity, per_window)) = self.start_bucket() else {
            return;
        };
        if let Some(bucket) = lock(&self.starts).get_mut(&client) {
            *bucket = bucket.at(now, capacity, per_window);
            bucket.milli = bucket.milli.saturating_add(1000).min(capacity * 1000);
        }
    }

    /// Gives `client` back one start of a setup that reached no server, if its refund bucket
    /// (`refunds`) has one whole: a player retrying a dead channel every few seconds never
    /// empties it, a client failing setups as fast as it can starts at most twice its rate.
    /// True if given back; a start bucket already full (or forgotten: full) takes no refund.
    fn give_back_unreached(&self, client: IpAddr, now: Instant) -> bool {
        let Some((capacity, per_window)) = self.start_bucket() else {
            return false;
        };
        let mut starts = lock(&self.starts);
        let Some(bucket) = starts.get_mut(&client) else {
            return false;
        };
        *bucket = bucket.at(now, capacity, per_window);
        if bucket.milli >= capacity * 1000 {
            return false;
        }
        {
            let mut refunds = lock(&self.refunds);
            let refund = bucket_of(&mut refunds, client, now, capacity, per_window);
            if refund.milli < 1000 {
                return false;
            }
            refund.milli -= 1000;
        }
        bucket.milli = bucket.milli.saturating_add(1000).min(capacity * 1000);
        true
    }

    /// Frees a place in `client`'s share for the channel `key`, or refuses. Its unwatched
    /// hubs count (the one for `key` would be watched again); when its subscriptions alone
    /// leave room, the oldest of them is released at once rather than refusing, so a viewer
    /// zapping quickly keeps zapping (at the rate `check_starts` allows) and merely loses the
    /// linger of the channels it left.
    fn make_room(
        &self,
        table: &mut HashMap<HubKey, Arc<Hub>>,
        client: IpAddr,
        key: &HubKey,
    ) -> Result<(), Refusal> {
        let limit = self.limits.per_client;
        if limit == 0 {
            return Ok(());
        }
        let watching = self.watching(client);
        loop {
            let mut unwatched: Vec<Arc<Hub>> = table
                .values()
                .filter(|h| h.key != *key && unwatched_by(h, client))
                .cloned()
                .collect();
            if !over(limit, watching + unwatched.len()) {
                return Ok(());
            }
            if over(limit, watching) || unwatched.is_empty() {
                return Err(Refusal::PerClient(ClientLimit::Channels(limit)));
            }
            unwatched.sort_by_key(|h| h.created);
            let oldest = &unwatched[0];
            // Per request of a zapping client: not for the info log.
            tracing::debug!(channel = %oldest.key.channel(), "released early: its client needs the place");
            self.unlink(table, oldest);
            oldest.wake.notify_one();
        }
    }

    fn attach(self: &Arc<Self>, hub: Arc<Hub>, peer: Option<std::net::SocketAddr>) -> Subscription {
        self.total.fetch_add(1, Ordering::AcqRel);
        let client = peer.map(|p| client_of(p.ip()));
        if let Some(ip) = client {
            *lock(&self.clients).entry(ip).or_insert(0) += 1;
        }
        {
            // Watched by someone else: the hub is no longer its starter's to answer for.
            let mut starter = lock(&hub.starter);
            if starter.is_some() && *starter != client {
                *starter = None;
            }
        }
        hub.subscribers.fetch_add(1, Ordering::AcqRel);
        self.metrics.subscribers.inc();
        hub.metrics.subscribers.inc();
        let client = Arc::new(ClientStats {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            peer,
            started: Instant::now(),
            bytes_out: AtomicU64::new(0),
            skips: AtomicU64::new(0),
            // Not reading yet: the new-viewer start point lies in the history kept anyway,
            // so a subscriber waiting for its first data must not hold anything older.
            position: AtomicU64::new(super::hub::NOT_READING),
        });
        lock(&hub.clients).insert(client.id, client.clone());
        Subscription {
            registry: self.clone(),
            hub,
            client,
        }
    }

    /// Removes the hub if nobody subscribed since it went idle; true if removed.
    pub fn remove_if_idle(&self, hub: &Arc<Hub>) -> bool {
        let mut table = self.table();
        if hub.subscribers.load(Ordering::Acquire) > 0 {
            return false;
        }
        self.unlink(&mut table, hub);
        true
    }

    /// Removes the hub unconditionally (no data, socket error); its readers end.
    pub fn remove(&self, hub: &Arc<Hub>) {
        let mut table = self.table();
        self.unlink(&mut table, hub);
    }

    /// Removes an RTSP hub whose session failed before it connected to any server (a name
    /// that does not resolve, an address the guard refuses, a port that refuses or never
    /// answers), and gives its client back the start it took, as a multicast start that
    /// failed before sending anything spends none (`sent`): before, a player retrying a dead
    /// `/rtsp/` channel drained its client's bucket, and the household's next channel was a
    /// 429. Given back before the hub is closed, so the viewer told of the failure finds it
    /// back. A hub released before (`make_room`) gives nothing back: `unlink` forgot it. Given
    /// back only while the client's refund bucket lasts (`give_back_unreached`).
    pub fn remove_unreached(&self, hub: &Arc<Hub>) {
        let mut table = self.table();
        let spent = lock(&self.rtsp_starts).remove(&hub_addr(hub));
        if let Some(client) = spent {
            if !self.give_back_unreached(client, Instant::now()) {
                tracing::debug!(%client, "RTSP setup reached no server: start not given back");
            }
        }
        self.unlink(&mut table, hub);
    }

    fn unlink(&self, table: &mut HashMap<HubKey, Arc<Hub>>, hub: &Arc<Hub>) {
        if hub.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        if hub.key.rtsp.is_some() {
            lock(&self.rtsp_starts).remove(&hub_addr(hub));
        }
        if table.get(&hub.key).is_some_and(|h| Arc::ptr_eq(h, hub)) {
            table.remove(&hub.key);
        }
        self.metrics.hubs.dec();
        self.drop_series(table, &hub.metrics.labels);
        hub.publish_closed();
    }

    /// Removes the series of `labels` unless a hub in `table` still uses them: labels leave
    /// out the RTSP query, so two live keys can share them.
    fn drop_series(&self, table: &HashMap<HubKey, Arc<Hub>>, labels: &HubLabels) {
        if !table.values().any(|h| h.metrics.labels == *labels) {
            self.metrics.remove_hub(labels);
        }
    }

    /// Live hubs, for the status page.
    pub fn hubs(&self) -> Vec<Arc<Hub>> {
        self.table().values().cloned().collect()
    }

    /// Subscribers across all hubs.
    pub fn total(&self) -> usize {
        self.total.load(Ordering::Acquire)
    }
}

/// `client`'s bucket in `buckets` (`Registry::starts`, `Registry::refunds`) refilled to `now`,
/// made full if it had none. Past `STARTS_KEPT` buckets, full ones are forgotten first: a full
/// bucket is no bucket (one is full again a window after its client's last take, so only
/// recent takers are kept).
fn bucket_of(
    buckets: &mut HashMap<IpAddr, Starts>,
    client: IpAddr,
    now: Instant,
    capacity: u64,
    per_window: u64,
) -> &mut Starts {
    if buckets.len() >= STARTS_KEPT {
        buckets.retain(|_, b| b.at(now, capacity, per_window).milli < capacity * 1000);
    }
    let full = Starts {
        milli: capacity * 1000,
        at: now,
    };
    let bucket = buckets.entry(client).or_insert(full);
    *bucket = bucket.at(now, capacity, per_window);
    bucket
}

/// A hub's key in `Registry::rtsp_starts`: its address, unique while it is in the table.
fn hub_addr(hub: &Arc<Hub>) -> usize {
    Arc::as_ptr(hub) as usize
}

/// Started by `client`, and nobody subscribed now (hub not yet removed).
fn unwatched_by(hub: &Hub, client: IpAddr) -> bool {
    hub.subscribers.load(Ordering::Acquire) == 0
        && !hub.closed.load(Ordering::Acquire)
        && *lock(&hub.starter) == Some(client)
}

fn over(limit: usize, current: usize) -> bool {
    limit > 0 && current >= limit
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A subscriber's hold on a hub; dropping it (client gone) releases every count.
#[derive(Debug)]
pub struct Subscription {
    registry: Arc<Registry>,
    pub hub: Arc<Hub>,
    pub client: Arc<ClientStats>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        lock(&self.hub.clients).remove(&self.client.id);
        self.registry.total.fetch_sub(1, Ordering::AcqRel);
        if let Some(ip) = self.client.peer.map(|p| client_of(p.ip())) {
            let mut clients = lock(&self.registry.clients);
            if let Some(n) = clients.get_mut(&ip) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    clients.remove(&ip);
                }
            }
        }
        self.registry.metrics.subscribers.dec();
        self.hub.metrics.subscribers.dec();
        // The last subscriber's leave and its hand-off are one step under the hubs' table
        // lock, where `attach` counts and clears, `make_room` reads the starter, and
        // `remove_if_idle` reads the count: apart, a client attaching and leaving between
        // the two had its own store overwritten by the earlier leaver's (who then answered
        // for a linger it did not leave last), and `make_room` saw an unwatched hub on no
        // one's share in between.
        let last = {
            let _table = self.registry.table();
            let last = self.hub.subscribers.fetch_sub(1, Ordering::AcqRel) == 1;
            if last {
                // Nobody watches it now: the client leaving last answers for its linger, on
                // its share. Cleared when another client started watching it, the hub would
                // otherwise linger on nobody's (A starts it, B watches it too, both hang up).
                *lock(&self.hub.starter) = self.client.peer.map(|p| client_of(p.ip()));
            }
            last
        };
        if last {
            self.hub.wake.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iptv::hub::HubSettings;
    use crate::iptv::url::Mode;
    use crate::net::multicast::Group;

    fn registry() -> Arc<Registry> {
        let settings = HubSettings {
            ring_bytes: 64 * 1024,
            history: 16 * 1024,
            write_batch: 64 * 1024,
            flush_interval: Duration::from_millis(50),
            linger: Duration::from_secs(1),
            stall_timeout: Duration::from_secs(1),
            no_data_timeout: Duration::from_secs(1),
            refresh: None,
            reorder_window: 64,
            recv_buffer: 1 << 20,
            max_datagram: 2048,
            rtsp: None,
            fcc_ports: None,
        };
        let limits = Limits {
            subscribers: 0,
            per_hub: 0,
            hubs: 0,
            per_client: 1,
        };
        Arc::new(Registry::new(Metrics::default(), settings, limits))
    }

    /// A hub in the table with no source, as a started one is.
    fn hub(registry: &Registry) -> Arc<Hub> {
        let key = HubKey {
            mode: Mode::Rtp,
            group: Group {
                group: std::net::Ipv4Addr::new(239, 1, 2, 3).into(),
                port: 5000,
                source: None,
                interface: "lo".into(),
            },
            extras: None,
            rtsp: None,
        };
        let labels = HubLabels {
            channel: key.channel(),
            interface: "lo".into(),
        };
        let hub = Hub::new(
            key.clone(),
            registry.metrics.hub(labels),
            &registry.settings,
        );
        registry.table().insert(key, hub.clone());
        hub
    }

    /// The last subscriber's leave and its hand-off of the hub (the starter record: who
    /// answers for the linger) are one step under the hubs' table lock. The dropping thread is
    /// stopped at the hand-off (the test holds the hub's starter lock) once the count is 0:
    /// the table must still be held then. Free, a client could attach under it and leave
    /// between the two, its own hand-off then overwritten by the earlier leaver's (who answered
    /// for a linger it did not leave last), and `make_room` saw an unwatched hub on no one's
    /// share.
    #[test]
    fn the_last_leave_hands_its_hub_over_under_the_table_lock() {
        let registry = registry();
        let hub = hub(&registry);
        let b: std::net::SocketAddr = "192.0.2.2:40000".parse().unwrap();
        let sub = registry.attach(hub.clone(), Some(b));
        let starter = lock(&hub.starter);
        let leaving = std::thread::spawn(move || drop(sub));
        let mut looks = 0;
        while hub.subscribers.load(Ordering::Acquire) > 0 {
            looks += 1;
            assert!(looks < 100_000, "the subscription never left");
            std::thread::sleep(Duration::from_micros(100));
        }
        let table_free = registry.hubs.try_lock().is_ok();
        drop(starter);
        leaving.join().unwrap();
        assert!(
            !table_free,
            "the hubs' table was free between the last leave and its hand-off"
        );
        assert_eq!(*lock(&hub.starter), Some(b.ip()));
        assert!(unwatched_by(&hub, b.ip()));
    }
}
