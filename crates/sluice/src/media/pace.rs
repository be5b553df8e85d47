//! `ratelimit`: per-host pacing of upstream requests for CDNs that ban clients who ask too often.
//!
//! In process, no shared store: each paced host has the instant its next request may start. A
//! request reserves the next free slot, then sleeps until it, so requests to one host start at
//! least one interval apart in the order they arrived. A request whose slot lies further out than
//! `max_wait_secs` is not queued: it gets a 503 with `Retry-After`, as MediaFlow answers during its
//! cooldown (MediaFlow answers every request in the cooldown that way; sluice queues those that
//! fit, so a player's segment fetch is served late rather than failed).
//!
//! Two intervals, kept apart. The operator's `[media.ratelimit] hosts` entry for the destination
//! (always on) paces every client's requests to the hosts it covers: one slot per entry, shared
//! by the domain and all its subdomains (a CDN's `a.` and `b.` hosts are one origin to ban). The
//! request's `ratelimit` parameter (MediaFlow's `vidoza` = 5 s, `aggressive` = 3 s, `none`, or a
//! number of milliseconds) paces only the requests of the client network that asked (an address,
//! an IPv6 one by its /64): one slot per client network and host, which no other client waits
//! for. A client can make its own pacing stricter, never looser than the operator's, and never
//! anyone else's (one `ratelimit=60000` used to move the shared slot a minute out, and every other
//! viewer of the host got a 503). A request paced both ways waits for its own slot, then takes the
//! shared one, the two waits together bounded by `max_wait_secs`.
//!
//! One client network holds at most [`QUEUED_PER_CLIENT`] waiting slots of a shared entry at once;
//! another of its requests is refused with the same 503 as a full queue, so that a few requests
//! from one client (each closed right after it was sent) cannot push every other viewer of the
//! host past `max_wait_secs`. A request cancelled while it waits gives its slot back when no later
//! one was reserved behind it (one in the middle stays taken: the slots after it are promised).
//!
//! The table holds at most `max_hosts` entries; one client network creates at most
//! [`per_client`] of them, and one IPv6 /48 (a site's allocation, 65,536 /64s, free from tunnel
//! brokers) at most [`per_site`] over all its /64s, so a flood of made-up hosts from one client, or
//! from every /64 of one /48, fills its own share only. Idle entries (their instant has passed)
//! carry nothing a missing one does not, and are forgotten as time passes, soonest first; each
//! share keeps its count and its entries' instants beside the table, so a refusal reads them and
//! walks no other client's entries.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;
use std::time::Duration;

use http::StatusCode;
use sluice_media::query::{ProxyParams, Query};
use tokio::time::Instant;

use super::config::ratelimit::{RateLimitConfig, MAX_INTERVAL_MS};
use crate::error::ProxyError;
use crate::net::per_ip::{network_of, site_of, SHARES_PER_48};
use crate::request::RequestContext;

/// Most slots of one shared entry one client network holds at once that are still to come (its
/// requests waiting for their turn). A request that starts at once holds none.
const QUEUED_PER_CLIENT: usize = 2;

/// Most entries one client network may create: a quarter of `max_hosts`, at most 64.
fn per_client(max_hosts: usize) -> usize {
    // At least 2: a request paced both ways holds an own entry and may need a shared one.
    (max_hosts / 4).clamp(2, 64)
}

/// Most entries the /64s of one IPv6 /48 may create together: [`SHARES_PER_48`] clients' shares
/// (as connections are counted), never more than a quarter of `max_hosts` (the 16 shares are that
/// quarter of the default 4096), and never less than one client's share. Counted by /64 alone, a
/// /48 held 65,536 shares and could take every entry of the table.
fn per_site(max_hosts: usize) -> usize {
    let client = per_client(max_hosts);
    client
        .saturating_mul(SHARES_PER_48)
        .min(max_hosts / 4)
        .max(client)
}

/// Whose slot an entry is: the shared one of a host, or one client network's own for a host.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Key {
    Shared(String),
    Own(IpAddr, String),
}

/// One tracked slot: when the next request may start, and the client network that created it
/// (counted against that network's share, and its /48's, until it is forgotten).
#[derive(Debug, Clone, Copy)]
struct Slot {
    next: Instant,
    owner: IpAddr,
}

/// The entries one client network (or one /48) created that are still tracked: how many, and the
/// instant each one frees up, so that a refusal reads its count and its soonest without a walk.
#[derive(Debug, Default)]
struct Share {
    count: usize,
    /// Each entry's `next` (instant → how many entries have it).
    nexts: BTreeMap<Instant, usize>,
}

impl Share {
    fn add(&mut self, at: Instant) {
        self.count += 1;
        *self.nexts.entry(at).or_default() += 1;
    }

    /// Takes one entry at `at` out; `true` when none is left.
    fn remove(&mut self, at: Instant) -> bool {
        self.count = self.count.saturating_sub(1);
        if let Some(n) = self.nexts.get_mut(&at) {
            *n -= 1;
            if *n == 0 {
                self.nexts.remove(&at);
            }
        }
        self.count == 0
    }

    fn soonest(&self) -> Option<Instant> {
        self.nexts.keys().next().copied()
    }
}

/// The slots of one shared entry still to come, and who holds them: in reservation order (their
/// instants rise), and per client network.
#[derive(Debug, Default)]
struct Queue {
    order: VecDeque<(Instant, IpAddr)>,
    by_network: HashMap<IpAddr, VecDeque<Instant>>,
}

impl Queue {
    /// Lets go of the slots whose turn has come.
    fn expire(&mut self, now: Instant) {
        while let Some(&(_, net)) = self.order.front().filter(|(at, _)| *at <= now) {
            self.order.pop_front();
            if let Some(held) = self.by_network.get_mut(&net) {
                held.pop_front();
                if held.is_empty() {
                    self.by_network.remove(&net);
                }
            }
        }
    }

    fn push(&mut self, at: Instant, net: IpAddr) {
        self.order.push_back((at, net));
        self.by_network.entry(net).or_default().push_back(at);
    }

    /// Takes back the last slot when it is `at`, held by `net`.
    fn pop_last(&mut self, at: Instant, net: IpAddr) {
        if self.order.back() == Some(&(at, net)) {
            self.order.pop_back();
            if let Some(held) = self.by_network.get_mut(&net) {
                held.pop_back();
                if held.is_empty() {
                    self.by_network.remove(&net);
                }
            }
        }
    }
}

#[derive(Debug, Default)]
struct Table {
    slots: HashMap<Key, Slot>,
    /// Per shared entry of `slots`, its slots still to come; it goes with the entry.
    queued: HashMap<Key, Queue>,
    /// Every entry of `slots` by its `next`: the idle ones are at the front.
    by_next: BTreeSet<(Instant, Key)>,
    /// Entries of `slots` per creating client network; a network leaves at zero.
    networks: HashMap<IpAddr, Share>,
    /// The same per IPv6 /48 of the creating network; a /48 leaves at zero.
    sites: HashMap<Ipv6Addr, Share>,
    /// Entries looked at while forgetting (for tests: the work done under the lock).
    #[cfg(test)]
    walked: usize,
}

impl Table {
    /// Forgets every idle entry (its instant is not after `now`), soonest first: each entry is
    /// looked at once, when it goes.
    fn forget_idle(&mut self, now: Instant) {
        while self.by_next.first().is_some_and(|(at, _)| *at <= now) {
            let Some((at, key)) = self.by_next.pop_first() else {
                break;
            };
            #[cfg(test)]
            {
                self.walked += 1;
            }
            self.queued.remove(&key);
            if let Some(slot) = self.slots.remove(&key) {
                self.each_share(slot.owner, |share| share.remove(at));
            }
        }
    }

    /// Applies `f` to the share of `owner` and of its /48, dropping a share `f` leaves empty.
    fn each_share(&mut self, owner: IpAddr, mut f: impl FnMut(&mut Share) -> bool) {
        if let Some(share) = self.networks.get_mut(&owner) {
            if f(share) {
                self.networks.remove(&owner);
            }
        }
        if let Some(site) = site_of(owner) {
            if let Some(share) = self.sites.get_mut(&site) {
                if f(share) {
                    self.sites.remove(&site);
                }
            }
        }
    }

    /// Moves the entry of `key` (tracked, owned by `slot.owner`) to `next`.
    fn reschedule(&mut self, key: Key, slot: Slot, next: Instant) {
        self.by_next.remove(&(slot.next, key.clone()));
        self.each_share(slot.owner, |share| {
            share.remove(slot.next);
            share.add(next);
            false
        });
        self.by_next.insert((next, key.clone()));
        self.slots.insert(
            key,
            Slot {
                next,
                owner: slot.owner,
            },
        );
    }

    /// Tracks a new entry of `key` for `owner`, free again at `next`.
    fn insert(&mut self, key: Key, owner: IpAddr, next: Instant) {
        self.by_next.insert((next, key.clone()));
        self.slots.insert(key, Slot { next, owner });
        self.networks.entry(owner).or_default().add(next);
        if let Some(site) = site_of(owner) {
            self.sites.entry(site).or_default().add(next);
        }
    }
}

/// An operator's rule: its domain and interval.
type Rule<'a> = (&'a str, Duration);

/// Paces requests per upstream host.
#[derive(Debug)]
pub struct Pacer {
    /// Configured domains (lowercase) and their intervals.
    rules: Vec<(String, Duration)>,
    max_wait: Duration,
    max_hosts: usize,
    table: Mutex<Table>,
}

impl Pacer {
    pub fn new(config: &RateLimitConfig) -> Self {
        Pacer {
            rules: config
                .hosts
                .iter()
                .map(|(host, ms)| (host.to_ascii_lowercase(), Duration::from_millis(*ms)))
                .collect(),
            max_wait: Duration::from_secs(config.max_wait_secs),
            max_hosts: config.max_hosts,
            table: Mutex::new(Table::default()),
        }
    }

    /// `true` when requests for this destination are paced (a bad `ratelimit` value counts as
    /// paced: [`Pacer::wait`] refuses it).
    pub fn paces(&self, ctx: &RequestContext, params: &ProxyParams) -> bool {
        !matches!(self.intervals(&ctx.query, params), Ok((None, None)))
    }

    /// Waits for this request's turn at its destination host, or refuses it.
    pub async fn wait(&self, ctx: &RequestContext, params: &ProxyParams) -> Result<(), ProxyError> {
        let (asked, configured) = self.intervals(&ctx.query, params)?;
        if asked.is_none() && configured.is_none() {
            return Ok(());
        }
        let client = network_of(ctx.client_ip);
        let arrived = Instant::now();
        // The client's own interval first, when it is stricter than the operator's: it holds up
        // this client alone and takes no shared slot while it waits.
        if let Some(asked) = asked.filter(|a| configured.is_none_or(|(_, c)| *a > c)) {
            let key = Key::Own(client, host_of(params));
            self.take(key, client, asked, arrived).await?;
        }
        if let Some((rule, configured)) = configured {
            // The shared slot is judged against `max_wait` alone: the client's own interval is
            // its choice, and counting it here refused a request that had waited out its slot.
            // It is the rule's, not the host's: every host the rule covers takes turns in it.
            let key = Key::Shared(rule.to_string());
            self.take(key, client, configured, Instant::now()).await?;
        }
        Ok(())
    }

    /// Reserves a slot of `key` and waits for it; cancelled while waiting, gives it back when it
    /// is still the last one reserved.
    async fn take(
        &self,
        key: Key,
        client: IpAddr,
        interval: Duration,
        now: Instant,
    ) -> Result<(), ProxyError> {
        let slot = self.reserve(key.clone(), client, interval, now, Duration::ZERO)?;
        let held = Held {
            pacer: self,
            key: Some(key),
            client,
            slot,
            interval,
        };
        tokio::time::sleep_until(slot).await;
        held.keep();
        Ok(())
    }

    /// The request's own interval (`ratelimit`) and the operator's rule for its host (the rule's
    /// domain and interval).
    fn intervals(
        &self,
        query: &Query,
        params: &ProxyParams,
    ) -> Result<(Option<Duration>, Option<Rule<'_>>), ProxyError> {
        let asked = parse_param(query.get("ratelimit"))?;
        Ok((asked, self.rule_for(&host_of(params))))
    }

    /// The operator's rule covering `host` (the domain or a subdomain of it): of several, the
    /// one with the longest interval (the first of those in the domains' order).
    fn rule_for(&self, host: &str) -> Option<Rule<'_>> {
        let mut best: Option<Rule<'_>> = None;
        for (domain, interval) in &self.rules {
            let covers = host == domain
                || host
                    .strip_suffix(domain.as_str())
                    .is_some_and(|sub| sub.ends_with('.'));
            if covers && best.is_none_or(|(_, b)| *interval > b) {
                best = Some((domain.as_str(), *interval));
            }
        }
        best
    }

    /// Takes the next free start slot of `key` for `client` (a client network), or refuses when it
    /// is further out than what is left of `max_wait` after `waited`, when `client` (or its IPv6
    /// /48) already created its share of entries and each is still busy, or when the table is
    /// full of busy entries.
    fn reserve(
        &self,
        key: Key,
        client: IpAddr,
        interval: Duration,
        now: Instant,
        waited: Duration,
    ) -> Result<Instant, ProxyError> {
        let mut table = self
            .table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // What is left is busy: an entry of `key` is a slot to wait for, no entry a free start.
        table.forget_idle(now);
        let tracked = table.slots.get(&key).copied();
        let slot = tracked.map_or(now, |s| s.next.max(now));
        let wait = slot - now;
        if waited + wait > self.max_wait {
            return Err(busy(wait));
        }
        if let Some(entry) = tracked {
            if matches!(key, Key::Shared(_)) && slot > now {
                // A slot to wait for: within the client's bound of waiting slots of this entry.
                let queue = table.queued.entry(key.clone()).or_default();
                queue.expire(now);
                if let Some(held) = queue
                    .by_network
                    .get(&client)
                    .filter(|held| held.len() >= QUEUED_PER_CLIENT)
                {
                    let soonest = held.front().map_or(wait, |at| *at - now);
                    return Err(busy(soonest));
                }
                queue.push(slot, client);
            }
            table.reschedule(key, entry, slot + interval);
            return Ok(slot);
        }
        // A new entry: within the client's share, its /48's, then the table's. Every entry left
        // is busy, and forgetting one would break its pacing: the refusal names when the soonest
        // of them frees up.
        let full = |share: Option<&Share>, cap: usize| {
            share.filter(|s| s.count >= cap).map(|s| {
                s.soonest()
                    .map_or(interval, |at| at.saturating_duration_since(now))
            })
        };
        if let Some(wait) = full(table.networks.get(&client), per_client(self.max_hosts)) {
            return Err(busy(wait));
        }
        if let Some(site) = site_of(client) {
            if let Some(wait) = full(table.sites.get(&site), per_site(self.max_hosts)) {
                return Err(busy(wait));
            }
        }
        if table.slots.len() >= self.max_hosts {
            let soonest = table.by_next.first().map(|(at, _)| *at);
            return Err(busy(
                soonest.map_or(interval, |at| at.saturating_duration_since(now)),
            ));
        }
        table.insert(key, client, slot + interval);
        Ok(slot)
    }

    /// Gives back the slot at `slot` of `key` (reserved by `client` with `interval`) when it is
    /// still the last one reserved: the entry's next start moves back to it.
    fn give_back(&self, key: Key, client: IpAddr, slot: Instant, interval: Duration) {
        let mut table = self
            .table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(entry) = table.slots.get(&key).copied() else {
            return;
        };
        if entry.next != slot + interval {
            return;
        }
        if let Some(queue) = table.queued.get_mut(&key) {
            queue.pop_last(slot, client);
        }
        table.reschedule(key, entry, slot);
    }

    /// Checks that the shares and the index agree with the entries (each count exact, no share
    /// left at zero) and returns the entries looked at while forgetting so far.
    #[cfg(test)]
    fn audit(&self) -> usize {
        let table = self.table.lock().unwrap();
        let mut networks: HashMap<IpAddr, Vec<Instant>> = HashMap::new();
        let mut sites: HashMap<Ipv6Addr, Vec<Instant>> = HashMap::new();
        for (key, slot) in &table.slots {
            assert!(table.by_next.contains(&(slot.next, key.clone())), "{key:?}");
            networks.entry(slot.owner).or_default().push(slot.next);
            if let Some(site) = site_of(slot.owner) {
                sites.entry(site).or_default().push(slot.next);
            }
        }
        assert_eq!(table.by_next.len(), table.slots.len());
        fn agree<K: std::hash::Hash + Eq + std::fmt::Debug>(
            shares: &HashMap<K, Share>,
            actual: HashMap<K, Vec<Instant>>,
        ) {
            assert_eq!(shares.len(), actual.len());
            for (k, nexts) in actual {
                let share = &shares[&k];
                assert_eq!(share.count, nexts.len(), "{k:?}");
                let mut counted = BTreeMap::new();
                for at in nexts {
                    *counted.entry(at).or_insert(0) += 1;
                }
                assert_eq!(share.nexts, counted, "{k:?}");
            }
        }
        agree(&table.networks, networks);
        agree(&table.sites, sites);
        // Waiting slots: only of tracked shared entries, before their next start, in order, and
        // counted per network as listed.
        for (key, queue) in &table.queued {
            assert!(matches!(key, Key::Shared(_)), "{key:?}");
            let next = table.slots[key].next;
            assert!(queue.order.iter().all(|(at, _)| *at < next), "{key:?}");
            assert!(queue
                .order
                .iter()
                .zip(queue.order.iter().skip(1))
                .all(|(a, b)| a.0 < b.0));
            let mut by_network: HashMap<IpAddr, VecDeque<Instant>> = HashMap::new();
            for (at, net) in &queue.order {
                by_network.entry(*net).or_default().push_back(*at);
            }
            assert_eq!(queue.by_network, by_network, "{key:?}");
            assert!(queue
                .by_network
                .values()
                .all(|held| held.len() <= QUEUED_PER_CLIENT));
        }
        table.walked
    }

    /// Entries tracked now (for tests and the bound).
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.table.lock().map_or(0, |t| t.slots.len())
    }

    /// The next free start of `key`'s entry, when it is tracked.
    #[cfg(test)]
    fn next_of(&self, key: &Key) -> Option<Instant> {
        self.table.lock().unwrap().slots.get(key).map(|s| s.next)
    }
}

/// A reserved slot being waited for: dropped before [`Held::keep`] (the request was cancelled),
/// it is given back.
struct Held<'a> {
    pacer: &'a Pacer,
    key: Option<Key>,
    client: IpAddr,
    slot: Instant,
    interval: Duration,
}

impl Held<'_> {
    /// The slot's turn came: it is used.
    fn keep(mut self) {
        self.key = None;
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.pacer
                .give_back(key, self.client, self.slot, self.interval);
        }
    }
}

/// MediaFlow's profiles, `none`, or milliseconds.
fn parse_param(raw: Option<&str>) -> Result<Option<Duration>, ProxyError> {
    let ms = match raw.map(|r| r.trim().to_ascii_lowercase()).as_deref() {
        None | Some("") | Some("none") => return Ok(None),
        Some("vidoza") => 5_000,
        Some("aggressive") => 3_000,
        Some(other) => match other.parse::<u64>() {
            Ok(ms) if (1..=MAX_INTERVAL_MS).contains(&ms) => ms,
            _ => {
                return Err(ProxyError::downstream(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    format!(
                        "`ratelimit` must be vidoza, aggressive, none or milliseconds \
                         between requests (1..={MAX_INTERVAL_MS}), not `{other}`"
                    ),
                ))
            }
        },
    };
    Ok(Some(Duration::from_millis(ms)))
}

fn host_of(params: &ProxyParams) -> String {
    params
        .destination
        .host_str()
        .unwrap_or_default()
        .trim_end_matches('.')
        .to_ascii_lowercase()
}

/// The refusal names no host: the holder of a token for `/proxy/stream` may not learn its hidden
/// destination, and a client that gave the destination itself knows it. (Marking the host as the
/// error's `upstream` instead would log a warning per refusal for token holders, at their rate.)
fn busy(wait: Duration) -> ProxyError {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    ProxyError::downstream(
        StatusCode::SERVICE_UNAVAILABLE,
        "rate_limited",
        format!("requests to this destination are paced; retry in {secs} s"),
    )
    .with_retry_after(secs.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn pacer(hosts: &[(&str, u64)], max_wait: u64, max_hosts: usize) -> Pacer {
        Pacer::new(&RateLimitConfig {
            hosts: hosts
                .iter()
                .map(|(h, ms)| (h.to_string(), *ms))
                .collect::<BTreeMap<_, _>>(),
            max_wait_secs: max_wait,
            max_hosts,
        })
    }

    fn params(url: &str) -> ProxyParams {
        ProxyParams::from_query(&Query::parse(&format!("d={url}"))).unwrap()
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, 2));

    /// Client network `n` of 203.0.113.0/24, neither A nor B.
    fn other(n: u8) -> IpAddr {
        IpAddr::V4(std::net::Ipv4Addr::new(203, 0, 113, n))
    }

    fn shared(host: &str) -> Key {
        Key::Shared(host.to_string())
    }

    fn own(client: IpAddr, host: &str) -> Key {
        Key::Own(client, host.to_string())
    }

    #[test]
    fn intervals_are_the_request_s_and_the_operator_s() {
        let p = pacer(&[("cdn.example", 2_000)], 30, 10);
        let q = |s: &str| Query::parse(s);
        let sec = |n| Some(Duration::from_secs(n));
        let at = |query: &str, url: &str| {
            let (asked, rule) = p.intervals(&q(query), &params(url)).unwrap();
            (asked, rule.map(|(_, d)| d))
        };
        assert_eq!(at("", "http://cdn.example/a"), (None, sec(2)));
        assert_eq!(at("", "http://edge3.CDN.example./a"), (None, sec(2)));
        assert_eq!(at("", "http://notcdn.example/a"), (None, None));
        assert_eq!(at("ratelimit=none", "http://cdn.example/a"), (None, sec(2)));
        assert_eq!(
            at("ratelimit=vidoza", "http://cdn.example/a"),
            (sec(5), sec(2))
        );
        assert_eq!(at("ratelimit=Aggressive", "http://other/a"), (sec(3), None));
        assert_eq!(
            at("ratelimit=250", "http://other/a"),
            (Some(Duration::from_millis(250)), None)
        );
        for bad in ["fast", "0", "60001", "-5"] {
            let e = p
                .intervals(&q(&format!("ratelimit={bad}")), &params("http://x/"))
                .unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
        }
    }

    #[test]
    fn slots_are_spaced_and_a_slot_too_far_out_is_refused() {
        let p = pacer(&[], 2, 10);
        let t0 = Instant::now();
        let i = Duration::from_millis(900);
        let zero = Duration::ZERO;
        assert_eq!(p.reserve(shared("h"), A, i, t0, zero).unwrap(), t0);
        assert_eq!(p.reserve(shared("h"), B, i, t0, zero).unwrap(), t0 + i);
        assert_eq!(p.reserve(shared("h"), A, i, t0, zero).unwrap(), t0 + i * 2);
        let e = p.reserve(shared("h"), A, i, t0, zero).unwrap_err();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.retry_after, Some(3));
        // Time already spent waiting counts against max_wait.
        let e = p
            .reserve(shared("g"), A, i, t0, Duration::from_millis(2_100))
            .unwrap_err();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        // Another host is not held up, and the first one frees up as time passes.
        assert_eq!(p.reserve(shared("g"), A, i, t0, zero).unwrap(), t0);
        let later = t0 + Duration::from_secs(10);
        assert_eq!(p.reserve(shared("h"), A, i, later, zero).unwrap(), later);
    }

    #[test]
    fn a_client_s_own_interval_holds_up_that_client_alone() {
        let p = pacer(&[], 30, 64);
        let t0 = Instant::now();
        let minute = Duration::from_secs(60);
        let zero = Duration::ZERO;
        assert_eq!(p.reserve(own(A, "h"), A, minute, t0, zero).unwrap(), t0);
        // A's next is a minute out, past max_wait; B's own slot and the shared one are free.
        let e = p.reserve(own(A, "h"), A, minute, t0, zero).unwrap_err();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        let i = Duration::from_millis(100);
        assert_eq!(p.reserve(own(B, "h"), B, i, t0, zero).unwrap(), t0);
        assert_eq!(p.reserve(shared("h"), B, i, t0, zero).unwrap(), t0);
    }

    #[test]
    fn one_client_fills_its_share_not_the_table() {
        let p = pacer(&[], 30, 16);
        let t0 = Instant::now();
        let minute = Duration::from_secs(60);
        let zero = Duration::ZERO;
        let share = per_client(16);
        assert_eq!(share, 4);
        for n in 0..100 {
            let r = p.reserve(own(A, &format!("h{n}.example")), A, minute, t0, zero);
            assert_eq!(r.is_ok(), n < share, "{n}");
        }
        assert_eq!(p.tracked(), share);
        // Shared slots A creates count against the same share.
        assert!(p.reserve(shared("s.example"), A, minute, t0, zero).is_err());
        // B still has room, in its own slots and the shared ones.
        assert_eq!(
            p.reserve(own(B, "h0.example"), B, minute, t0, zero)
                .unwrap(),
            t0
        );
        assert_eq!(
            p.reserve(shared("s.example"), B, minute, t0, zero).unwrap(),
            t0
        );
        // Once A's entries are idle, A may make new ones again.
        let later = t0 + Duration::from_secs(61);
        assert!(p
            .reserve(own(A, "new.example"), A, minute, later, zero)
            .is_ok());
        assert!(p.tracked() <= share + 2);
        assert_eq!(per_client(4096), 64);
        assert_eq!(per_client(1), 2);
        p.audit();
    }

    #[test]
    fn the_table_is_bounded_idle_hosts_go_first() {
        let p = pacer(&[], 30, 2);
        let t0 = Instant::now();
        let i = Duration::from_secs(1);
        let zero = Duration::ZERO;
        p.reserve(shared("a"), A, i, t0, zero).unwrap();
        p.reserve(shared("b"), B, i, t0, zero).unwrap();
        // Both busy until t0 + 1 s: a third host is refused, not let through unpaced.
        let c = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 3));
        let e = p.reserve(shared("c"), c, i, t0, zero).unwrap_err();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(p.tracked(), 2);
        // Once they are idle, they are forgotten to make room.
        let later = t0 + Duration::from_secs(2);
        assert_eq!(p.reserve(shared("c"), c, i, later, zero).unwrap(), later);
        assert_eq!(p.tracked(), 1);
        p.audit();
    }

    fn ctx(client: &str, query: &str) -> RequestContext {
        RequestContext {
            peer: "127.0.0.1:5000".parse().unwrap(),
            client_ip: client.parse().unwrap(),
            query: Query::parse(query),
            path: "/proxy/stream".into(),
            host: None,
            secure: false,
            token: None,
        }
    }

    /// The /64 network of `2001:db8:<site>:<net>::/64`, as `wait` keys a client.
    fn in_64(site: u16, net: u16) -> IpAddr {
        network_of(Ipv6Addr::new(0x2001, 0xdb8, site, net, 0, 0, 0, 1).into())
    }

    /// The attack on the share: one IPv6 /48 (65,536 /64s, free from a tunnel broker) spreads
    /// its made-up hosts over its /64s, each within its own share. Before, it took every entry
    /// of the table, and every other client's next paced host got a 503.
    #[test]
    fn one_48_fills_its_share_not_the_table() {
        let max = 4096;
        let p = pacer(&[], 30, max);
        let t0 = Instant::now();
        let minute = Duration::from_secs(60);
        let zero = Duration::ZERO;
        let mut taken = 0;
        for net in 0..200 {
            let c = in_64(1, net);
            for n in 0..per_client(max) {
                let key = own(c, &format!("h{n}.example"));
                taken += usize::from(p.reserve(key, c, minute, t0, zero).is_ok());
            }
        }
        assert_eq!(taken, per_site(max));
        assert_eq!(per_site(max), 16 * 64);
        assert_eq!(p.tracked(), taken);
        // A fresh /64 of that /48 is refused until the /48's soonest entry frees up.
        let fresh = in_64(1, 999);
        let e = p
            .reserve(own(fresh, "more.example"), fresh, minute, t0, zero)
            .unwrap_err();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.retry_after, Some(60));
        // Another /48 and an IPv4 client still have their whole shares.
        for c in [in_64(2, 0), A] {
            for n in 0..per_client(max) {
                let key = own(c, &format!("h{n}.example"));
                assert!(p.reserve(key, c, minute, t0, zero).is_ok(), "{c} {n}");
            }
        }
        p.audit();
        // Once the /48's entries are idle, its /64s may make new ones again.
        let later = t0 + Duration::from_secs(61);
        assert_eq!(
            p.reserve(own(fresh, "more.example"), fresh, minute, later, zero)
                .unwrap(),
            later
        );
        assert_eq!(p.tracked(), 1);
        p.audit();
        // A /48 never holds more than a quarter of a smaller table, nor less than one share.
        assert_eq!(per_site(1 << 20), 16 * 64);
        assert_eq!(per_site(256), 64);
        assert_eq!(per_site(16), 4);
        assert_eq!(per_site(1), 2);
    }

    /// A client at its share is refused from its share's count and soonest instant, kept beside
    /// the table: before, each refusal walked the whole table under the lock (every other
    /// client's entries, twice) to forget its idle entries and find its soonest one. The counts
    /// stay exact as entries are used again, go idle and are forgotten.
    #[test]
    fn a_client_at_its_share_is_refused_without_walking_the_table() {
        let p = pacer(&[], 30, 4096);
        let t0 = Instant::now();
        let minute = Duration::from_secs(60);
        let zero = Duration::ZERO;
        // 2,000 other clients hold one busy entry each (192.0.0.0 and up).
        for n in 0..2_000u32 {
            let c = IpAddr::V4((0xC000_0000 | n).into());
            p.reserve(own(c, "h.example"), c, minute, t0, zero).unwrap();
        }
        let share = per_client(4096);
        for n in 0..share {
            p.reserve(own(A, &format!("a{n}")), A, minute, t0, zero)
                .unwrap();
        }
        let walked = p.audit();
        let t1 = t0 + Duration::from_secs(1);
        for n in 0..1_000 {
            let e = p
                .reserve(own(A, &format!("x{n}")), A, minute, t1, zero)
                .unwrap_err();
            assert_eq!(e.retry_after, Some(59));
        }
        assert_eq!(p.audit() - walked, 0, "entries walked for 1,000 refusals");
        // A uses one entry again (its next moves to +120 s); at +61 s every other entry is idle
        // and goes, each looked at once.
        let t30 = t0 + Duration::from_secs(30);
        assert_eq!(
            p.reserve(own(A, "a0"), A, minute, t30, zero).unwrap(),
            t0 + minute
        );
        let t61 = t0 + Duration::from_secs(61);
        assert_eq!(p.reserve(shared("s"), B, minute, t61, zero).unwrap(), t61);
        assert_eq!(p.audit() - walked, 2_000 + share - 1);
        assert_eq!(p.tracked(), 2);
        // A counts one entry: it may make share - 1 more, then is refused until +120 s.
        for n in 1..share {
            let key = own(A, &format!("y{n}"));
            assert!(p.reserve(key, A, minute, t61, zero).is_ok(), "{n}");
        }
        let e = p.reserve(own(A, "z"), A, minute, t61, zero).unwrap_err();
        assert_eq!(e.retry_after, Some(59));
        p.audit();
    }

    /// A request paced both ways waits out its own stricter slot, then takes the host's shared
    /// one judged against `max_wait` alone. Counting the time spent on its own slot refused it
    /// with a 503 after it had waited, though the shared slot was within `max_wait`.
    #[tokio::test(start_paused = true)]
    async fn the_shared_slot_is_judged_against_max_wait_alone() {
        let p = pacer(&[("cdn.example", 10_000)], 30, 64);
        let a = ctx("198.51.100.1", "d=http://cdn.example/a.ts&ratelimit=20000");
        let params = ProxyParams::from_query(&a.query).unwrap();
        let t0 = Instant::now();
        // A's own slot and the shared one are free: next at +20 s and +10 s.
        p.wait(&a, &params).await.unwrap();
        assert_eq!(Instant::now(), t0);
        // Other clients' requests take the shared slots at +10, +20 and +30 s.
        let ten = Duration::from_secs(10);
        for n in 1..=3 {
            let slot = p.reserve(shared("cdn.example"), other(n), ten, t0, Duration::ZERO);
            assert_eq!(slot.unwrap(), t0 + ten * u32::from(n));
        }
        // A's next request: its own slot at +20 s, then the shared one at +40 s, 20 s later.
        p.wait(&a, &params).await.unwrap();
        assert!(Instant::now() >= t0 + ten * 4);
        // The shared slot is still held to max_wait: with others' at +50, +60 and +70 s, A's
        // own slot (+40 s) is free and the shared one (+80 s) is 40 s out.
        let t40 = Instant::now();
        for n in 1..=3 {
            assert!(p
                .reserve(shared("cdn.example"), other(n), ten, t40, Duration::ZERO)
                .is_ok());
        }
        let e = p.wait(&a, &params).await.unwrap_err();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(Instant::now(), t40);
    }

    /// A request paced both ways holds two entries (its own and the host's shared one): a table
    /// of fewer than 8 entries still gives each network (and each /48) a share of 2. With a
    /// share of 1 there, every such request got a 503.
    #[tokio::test(start_paused = true)]
    async fn a_request_paced_both_ways_fits_the_smallest_share() {
        for max_hosts in 2..8 {
            for client in ["198.51.100.1", "2001:db8:1:2::5"] {
                let p = pacer(&[("cdn.example", 1_000)], 30, max_hosts);
                let c = ctx(client, "d=http://cdn.example/a.ts&ratelimit=5000");
                let params = ProxyParams::from_query(&c.query).unwrap();
                let r = p.wait(&c, &params).await;
                assert!(r.is_ok(), "max_hosts {max_hosts}, {client}: {r:?}");
                assert_eq!(p.tracked(), 2);
                p.audit();
            }
        }
    }

    /// Polls `f` once: `None` while it waits.
    async fn poll_once<F: std::future::Future>(f: std::pin::Pin<&mut F>) -> Option<F::Output> {
        let mut f = Some(f);
        std::future::poll_fn(|cx| {
            let f = f.take().expect("polled once");
            std::task::Poll::Ready(match f.poll(cx) {
                std::task::Poll::Ready(out) => Some(out),
                std::task::Poll::Pending => None,
            })
        })
        .await
    }

    /// The attack on an operator-paced host: one network sent 7 requests for it (each may be
    /// closed once sent) and took its shared slots to +30 s, so every other viewer of the host
    /// got a 503. One network now holds at most `QUEUED_PER_CLIENT` waiting slots of it; its next
    /// request is refused, and another network's request still gets a turn.
    #[tokio::test(start_paused = true)]
    async fn one_network_holds_at_most_its_bound_of_a_shared_host_s_turns() {
        let p = pacer(&[("vidoza.net", 5_000)], 30, 4096);
        let t0 = Instant::now();
        let a = ctx("198.51.100.1", "d=http://vidoza.net/x");
        let params = ProxyParams::from_query(&a.query).unwrap();
        let mut waiting = Vec::new();
        let mut refused = 0;
        for _ in 0..7 {
            let mut f = Box::pin(p.wait(&a, &params));
            match poll_once(f.as_mut()).await {
                Some(Err(e)) => {
                    assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
                    assert_eq!(e.kind, "rate_limited");
                    refused += 1;
                }
                _ => waiting.push(f),
            }
        }
        // One starts at once, QUEUED_PER_CLIENT wait (+5 and +10 s); the other 4 are refused.
        assert_eq!((waiting.len(), refused), (1 + QUEUED_PER_CLIENT, 4));
        p.audit();
        // Another network's request (A's still waiting) gets the +15 s turn, not a 503.
        let b = ctx("203.0.113.9", "d=http://vidoza.net/y");
        let r = p.wait(&b, &params).await;
        assert!(r.is_ok(), "{r:?}");
        // Directly: A is refused until its soonest waiting slot starts; C is not.
        let five = Duration::from_secs(5);
        let e = p
            .reserve(shared("vidoza.net"), A, five, t0, Duration::ZERO)
            .unwrap_err();
        assert_eq!(e.retry_after, Some(5));
        let c = other(3);
        let slot = p.reserve(shared("vidoza.net"), c, five, t0, Duration::ZERO);
        assert_eq!(slot.unwrap(), t0 + five * 4);
        // Once A's +5 s turn has come, it holds one waiting slot and may take another.
        let t5 = t0 + five;
        let slot = p.reserve(shared("vidoza.net"), A, five, t5, Duration::ZERO);
        assert_eq!(slot.unwrap(), t0 + five * 5);
        p.audit();
        drop(waiting);
    }

    /// A request cancelled while it waits (its client closed) gave nothing back: each one sent
    /// and closed at once moved the host's next turn one interval out. The last one reserved now
    /// gives its slot back; one with a later one behind it keeps it (those after it are promised).
    #[tokio::test(start_paused = true)]
    async fn a_cancelled_waiter_gives_its_slot_back_when_it_is_the_last() {
        let p = pacer(&[("cdn.example", 5_000)], 30, 4096);
        let key = shared("cdn.example");
        let five = Duration::from_secs(5);
        let t0 = Instant::now();
        // B's request starts at once; the next turn is at +5 s.
        assert_eq!(
            p.reserve(key.clone(), B, five, t0, Duration::ZERO).unwrap(),
            t0
        );
        let a = ctx("198.51.100.1", "d=http://cdn.example/a.ts");
        let params = ProxyParams::from_query(&a.query).unwrap();
        // 20 requests from A (and 20 from other networks), each closed once sent.
        for n in 0..40u8 {
            let c = if n % 2 == 0 {
                ctx("198.51.100.1", "d=http://cdn.example/a.ts")
            } else {
                ctx(&format!("203.0.113.{n}"), "d=http://cdn.example/a.ts")
            };
            let mut f = Box::pin(p.wait(&c, &params));
            assert!(poll_once(f.as_mut()).await.is_none(), "{n}");
            assert_eq!(p.next_of(&key), Some(t0 + five * 2), "{n}");
            drop(f);
            assert_eq!(p.next_of(&key), Some(t0 + five), "{n}");
        }
        p.audit();
        // One in the middle keeps its slot; the last one's comes back.
        let mut first = Box::pin(p.wait(&a, &params));
        assert!(poll_once(first.as_mut()).await.is_none());
        let b = ctx("198.51.100.2", "d=http://cdn.example/b.ts");
        let mut second = Box::pin(p.wait(&b, &params));
        assert!(poll_once(second.as_mut()).await.is_none());
        assert_eq!(p.next_of(&key), Some(t0 + five * 3));
        drop(first);
        assert_eq!(p.next_of(&key), Some(t0 + five * 3));
        drop(second);
        assert_eq!(p.next_of(&key), Some(t0 + five * 2));
        p.audit();
        // A later request takes the given-back turn, at +10 s, not +20 s.
        let slot = p.reserve(key.clone(), other(1), five, t0, Duration::ZERO);
        assert_eq!(slot.unwrap(), t0 + five * 2);
        // A request that got its turn keeps it.
        p.wait(&a, &params).await.unwrap();
        assert_eq!(p.next_of(&key), Some(t0 + five * 4));
        p.audit();
    }

    /// An operator's rule paces the hosts it covers as one: before, `a.` and `b.` of a paced
    /// domain each had a shared slot of their own, N subdomains N times the rate at the CDN.
    #[tokio::test(start_paused = true)]
    async fn a_rule_paces_every_host_it_covers_in_one_slot() {
        let p = pacer(
            &[("vidoza.net", 5_000), ("cdn.vidoza.net", 8_000)],
            30,
            4096,
        );
        assert_eq!(
            p.rule_for("a.vidoza.net"),
            Some(("vidoza.net", Duration::from_secs(5)))
        );
        assert_eq!(
            p.rule_for("x.cdn.vidoza.net"),
            Some(("cdn.vidoza.net", Duration::from_secs(8)))
        );
        assert_eq!(p.rule_for("notvidoza.net"), None);
        let t0 = Instant::now();
        let a = ctx("198.51.100.1", "d=http://a.vidoza.net/1.ts");
        let pa = ProxyParams::from_query(&a.query).unwrap();
        p.wait(&a, &pa).await.unwrap();
        // B's request for another subdomain takes the rule's next turn, +5 s.
        let b = ctx("198.51.100.2", "d=http://B.Vidoza.NET./2.ts");
        let pb = ProxyParams::from_query(&b.query).unwrap();
        let mut f = Box::pin(p.wait(&b, &pb));
        assert!(poll_once(f.as_mut()).await.is_none());
        let key = shared("vidoza.net");
        assert_eq!(p.next_of(&key), Some(t0 + Duration::from_secs(10)));
        assert_eq!(p.tracked(), 1);
        f.await.unwrap();
        p.audit();
    }
}
