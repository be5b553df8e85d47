//! Upstream groups: named sets of servers shared by the reverse and TCP front ends; which server is
//! tried next (balancing) and which servers are usable (health, passive ejection, backups).
//!
//! Readers never lock: a request asks [`Group::plan`] for the order to try servers in, and reports
//! each attempt's outcome on the [`Server`]. Health checks (`health`) only flip flags on servers;
//! the algorithms themselves are pure (`select`).

pub mod health;
pub mod live;
pub mod metrics;
pub mod select;

use std::collections::HashMap;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use health::HealthCheckConfig;
use select::HashRing;

/// One `[[upstreams]]` entry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GroupConfig {
    /// The name routes and TCP listeners refer to.
    pub name: String,
    /// `"host:port"` strings, or tables `{ addr = "host:port", weight = 2, backup = true }`.
    pub servers: Vec<ServerSpec>,
    /// How the next server is chosen.
    #[serde(default)]
    pub balance: Balance,
    /// With `balance = "hash"`: what is hashed (`uri`, `client_ip`, `header:NAME`, `cookie:NAME`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash_key: Option<String>,
    /// Consecutive failures after which a server is ejected for `fail_timeout_secs`; 0 = never.
    #[serde(default = "default_max_fails")]
    pub max_fails: u32,
    /// Seconds an ejected server stays out before it is tried again.
    #[serde(default = "default_fail_timeout")]
    pub fail_timeout_secs: u64,
    /// Active health checks; absent = servers are judged by passive failures only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheckConfig>,
}

fn default_max_fails() -> u32 {
    3
}

fn default_fail_timeout() -> u64 {
    10
}

/// A server in a group: a bare address or a table with weight and backup flag.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum ServerSpec {
    Addr(String),
    Full {
        addr: String,
        #[serde(default = "default_weight")]
        weight: u32,
        #[serde(default)]
        backup: bool,
    },
}

fn default_weight() -> u32 {
    1
}

impl ServerSpec {
    pub fn addr(&self) -> &str {
        match self {
            ServerSpec::Addr(a) | ServerSpec::Full { addr: a, .. } => a,
        }
    }

    pub fn weight(&self) -> u32 {
        match self {
            ServerSpec::Addr(_) => 1,
            ServerSpec::Full { weight, .. } => *weight,
        }
    }

    pub fn backup(&self) -> bool {
        matches!(self, ServerSpec::Full { backup: true, .. })
    }
}

/// Balancing algorithms.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Balance {
    /// Weighted round robin.
    #[default]
    RoundRobin,
    /// The usable server with the fewest requests or connections in flight.
    LeastConn,
    /// Consistent hash of `hash_key`: the same key goes to the same server while it is usable.
    Hash,
}

/// Largest per-server weight: keeps the round-robin cycle and the hash ring small.
pub const MAX_WEIGHT: u32 = 1000;

/// Every group, by name.
#[derive(Debug, Default)]
pub struct Groups {
    by_name: HashMap<String, Arc<Group>>,
}

impl Groups {
    /// Builds the groups; a bad entry is an error naming the group.
    pub fn new(configs: &[GroupConfig]) -> anyhow::Result<Groups> {
        Self::rebuild(configs, None)
    }

    /// Builds the groups for a reloaded config, carrying health and ejection state over for servers
    /// that stay (same group, same address), so a reload neither revives a dead server nor
    /// forgets a live one. The active check's verdict carries over only when the group keeps a
    /// check that probes the same way ([`HealthCheckConfig::probes_like`]).
    pub fn rebuild(configs: &[GroupConfig], previous: Option<&Groups>) -> anyhow::Result<Groups> {
        let mut by_name = HashMap::new();
        for config in configs {
            let old = previous.and_then(|p| p.get(&config.name));
            let group = Group::build(config, old.map(|g| g.as_ref()))?;
            if by_name
                .insert(config.name.clone(), Arc::new(group))
                .is_some()
            {
                anyhow::bail!("upstream group {:?} is defined twice", config.name);
            }
        }
        Ok(Groups { by_name })
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Group>> {
        self.by_name.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Group>> {
        self.by_name.values()
    }

    /// The group names, in no particular order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }
}

/// One group of servers.
#[derive(Debug)]
pub struct Group {
    name: String,
    balance: Balance,
    hash_key: Option<String>,
    health_check: Option<HealthCheckConfig>,
    servers: Vec<Arc<Server>>,
    /// Indexes of primaries and of backups, in config order.
    primaries: Vec<usize>,
    backups: Vec<usize>,
    /// One smooth weighted round-robin cycle over the primaries (indexes into `servers`).
    cycle: Vec<usize>,
    /// Consistent-hash table over the primaries (`balance = "hash"` only).
    ring: Option<HashRing>,
    next: AtomicUsize,
    /// Plans made by the fallback ([`Group::plan`]: nothing usable), since the group was first
    /// built (carried over a reload).
    fallback_plans: AtomicU64,
    /// At most one fallback warning a second for this group.
    fallback_warnings: FallbackWarnings,
}

/// The rate limit of a group's fallback warnings.
struct FallbackWarnings(crate::logging::WarnLimit);

impl std::fmt::Debug for FallbackWarnings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FallbackWarnings")
    }
}

impl Group {
    pub fn new(config: &GroupConfig) -> anyhow::Result<Group> {
        Self::build(config, None)
    }

    fn build(config: &GroupConfig, previous: Option<&Group>) -> anyhow::Result<Group> {
        let name = &config.name;
        if config.servers.is_empty() {
            anyhow::bail!("upstream group {name:?} has no servers");
        }
        if config.max_fails > 0 && config.fail_timeout_secs == 0 {
            anyhow::bail!("upstream group {name:?}: fail_timeout_secs must be at least 1");
        }
        if let Some(hc) = &config.health_check {
            hc.validate()
                .map_err(|e| anyhow::anyhow!("upstream group {name:?}: health_check: {e}"))?;
        }
        // The active check's verdict carries over only while the same check goes on judging: with
        // the check removed nothing would ever bring a server it took out back, and a changed
        // probe (another path, say) has yet to give its own verdict.
        let keep_verdict = match (&config.health_check, previous.map(|g| &g.health_check)) {
            (Some(new), Some(Some(old))) => new.probes_like(old),
            _ => false,
        };
        let mut servers = Vec::with_capacity(config.servers.len());
        for spec in &config.servers {
            let addr = spec.addr();
            match addr.rsplit_once(':') {
                Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {}
                _ => anyhow::bail!("upstream group {name:?}: server {addr:?} is not host:port"),
            }
            if spec.weight() == 0 || spec.weight() > MAX_WEIGHT {
                anyhow::bail!(
                    "upstream group {name:?}: server {addr:?} weight must be 1..={MAX_WEIGHT}"
                );
            }
            if servers.iter().any(|s: &Arc<Server>| s.addr == addr) {
                anyhow::bail!("upstream group {name:?}: server {addr:?} is listed twice");
            }
            let server = Server::new(config, spec);
            if let Some(old) = previous.and_then(|g| g.servers.iter().find(|s| s.addr == addr)) {
                server.inherit(old, keep_verdict);
            }
            servers.push(Arc::new(server));
        }
        let primaries: Vec<usize> = (0..servers.len()).filter(|&i| !servers[i].backup).collect();
        let backups: Vec<usize> = (0..servers.len()).filter(|&i| servers[i].backup).collect();
        if primaries.is_empty() {
            anyhow::bail!("upstream group {name:?}: every server is a backup");
        }
        let weights: Vec<u32> = primaries.iter().map(|&i| servers[i].weight).collect();
        let cycle = select::smooth_weighted_sequence(&weights)
            .into_iter()
            .map(|p| primaries[p])
            .collect();
        let ring = match config.balance {
            Balance::Hash => {
                let names: Vec<&str> = primaries.iter().map(|&i| servers[i].addr()).collect();
                Some(HashRing::new(&names, &weights))
            }
            _ => None,
        };
        if config.balance == Balance::Hash && config.hash_key.is_none() {
            anyhow::bail!("upstream group {name:?}: balance = \"hash\" needs hash_key");
        }
        Ok(Group {
            name: config.name.clone(),
            balance: config.balance,
            hash_key: config.hash_key.clone(),
            health_check: config.health_check.clone(),
            servers,
            primaries,
            backups,
            cycle,
            ring,
            next: AtomicUsize::new(0),
            fallback_plans: AtomicU64::new(previous.map_or(0, Group::fallback_plans)),
            fallback_warnings: FallbackWarnings(crate::logging::WarnLimit::new(1000)),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn balance(&self) -> Balance {
        self.balance
    }

    /// What `balance = "hash"` hashes, as configured.
    pub fn hash_key(&self) -> Option<&str> {
        self.hash_key.as_deref()
    }

    pub fn health_check(&self) -> Option<&HealthCheckConfig> {
        self.health_check.as_ref()
    }

    pub fn servers(&self) -> &[Arc<Server>] {
        &self.servers
    }

    /// Plans the fallback made: requests or connections sent to a server passive ejection had
    /// taken out, because no server was usable (`sluice_upstream_fallback_plans_total`).
    pub fn fallback_plans(&self) -> u64 {
        self.fallback_plans.load(Ordering::Relaxed)
    }

    /// The order to try servers in for one request or connection: the balanced choice first, then
    /// the other usable primaries; backups only when no primary is usable. When no server at all
    /// is usable, the fallback: passive ejection alone never empties the plan, only the active
    /// check does (`Group::fallback`). `key` is the hash input when the group balances by hash
    /// (without one, round robin).
    ///
    /// A server whose ejection has just expired is let back for one trial: it goes first in exactly
    /// one plan, and its outcome decides whether it stays. A plan dropped before the trial's
    /// verdict (the request cancelled, failed on its client's side, or never sent to it) gives
    /// the trial back: the next plan takes it, rather than the server waiting out another period.
    ///
    /// The plan is the servers' indexes, held inline for up to `INLINE` servers: a request's plan
    /// allocates nothing in a group of that size.
    pub fn plan(&self, key: Option<&[u8]>) -> Plan<'_> {
        // Read once, and only when some server is ejected.
        let mut now = None;
        let mut trial: Option<Trial> = None;
        let mut usable = Marks::new(self.servers.len());
        for (i, s) in self.servers.iter().enumerate() {
            match s.admit(&mut now) {
                Admit::Yes => usable.set(i),
                Admit::Trial { was, next } if trial.is_none() => {
                    usable.set(i);
                    trial = Some(Trial {
                        index: i,
                        was,
                        next,
                    });
                }
                // A second expired server waits for the next plan.
                Admit::Trial { .. } => s
                    .ejected_until
                    .store(now.unwrap_or_else(clock_ms).max(1), Ordering::Relaxed),
                Admit::No => {}
            }
        }
        let live = self.primaries.iter().filter(|&&i| usable.get(i)).count();
        let mut order = Order::default();
        if live > 0 {
            self.order_primaries(key, &usable, live, &mut order);
        } else {
            for &i in self.backups.iter().filter(|&&i| usable.get(i)) {
                order.push(i);
            }
            // The rotation moves only when it had backups to turn: the fallback below takes
            // its own step, and two a plan would have an even cycle lead with the same server
            // every time.
            if order.len() > 0 {
                rotate(
                    order.as_mut_slice(),
                    self.next.fetch_add(1, Ordering::Relaxed),
                );
            }
        }
        if order.len() == 0 {
            self.fallback(key, &mut order);
        }
        if let Some(t) = &trial {
            let order = order.as_mut_slice();
            if let Some(pos) = order.iter().position(|&i| i == t.index) {
                order[..=pos].rotate_right(1);
            }
        }
        Plan {
            servers: &self.servers,
            order,
            trial,
        }
    }

    /// The plan when no server is usable: passive ejection alone never empties a plan (as nginx
    /// forgets its failure counts when every server failed, and Envoy's panic threshold routes
    /// to every host). Failures booked by traffic a client chose (heads an origin drops, say)
    /// could otherwise take out every server and answer 503 to everyone; so the balanced choice
    /// among the primaries the active check still calls up (every one without a check), ejected
    /// or not, is tried, or with none of them, among the backups it calls up. Only the active
    /// check can leave a group with no server.
    ///
    /// One server, not all: with every server truly dead, a request (a `[[tcp]]` connection)
    /// costs one connect timeout, not one per server; and its failure does not push the
    /// server's ejection deadline back ([`Server::report_failure`]), so the recovery trial
    /// still comes when the deadline runs out.
    fn fallback(&self, key: Option<&[u8]>, order: &mut Order) {
        let mut up = Marks::new(self.servers.len());
        let mut live = 0;
        for &i in &self.primaries {
            if self.servers[i].is_healthy() {
                up.set(i);
                live += 1;
            }
        }
        if live > 0 {
            self.order_primaries(key, &up, live, order);
            order.truncate(1);
        } else {
            let healthy = || {
                self.backups
                    .iter()
                    .copied()
                    .filter(|&i| self.servers[i].is_healthy())
            };
            let n = healthy().count();
            if n == 0 {
                return;
            }
            let k = self.next.fetch_add(1, Ordering::Relaxed) % n;
            if let Some(i) = healthy().nth(k) {
                order.push(i);
            }
        }
        let Some(&chosen) = order.as_slice().first() else {
            return;
        };
        self.fallback_plans.fetch_add(1, Ordering::Relaxed);
        if let Some(suppressed) = self.fallback_warnings.0.allow_now() {
            tracing::warn!(
                group = %self.name,
                server = self.servers[chosen].addr(),
                suppressed,
                "upstream group: no usable server, trying one passive ejection took out"
            );
        }
    }

    /// The `live` usable primaries in the order the balancing asks for, into `order`.
    fn order_primaries(&self, key: Option<&[u8]>, usable: &Marks, live: usize, order: &mut Order) {
        let usable_primaries = || self.primaries.iter().copied().filter(|&i| usable.get(i));
        match (self.balance, key, &self.ring) {
            (Balance::Hash, Some(key), Some(ring)) => {
                let first = ring
                    .pick(ring.slot(key), |p| usable.get(self.primaries[p]))
                    .map(|p| self.primaries[p]);
                let pos = first
                    .and_then(|first| usable_primaries().position(|i| i == first))
                    .unwrap_or(0);
                for i in usable_primaries() {
                    order.push(i);
                }
                order.as_mut_slice().rotate_left(pos);
            }
            (Balance::LeastConn, _, _) => {
                let load = |i: usize| {
                    let s = &self.servers[i];
                    (i, s.in_flight() as u64, s.weight)
                };
                // On the stack for a small group, as the plan itself.
                let mut inline = [(0, 0, 0); INLINE];
                let mut heap = Vec::new();
                let loads: &mut [(usize, u64, u32)] = if live <= INLINE {
                    let mut n = 0;
                    for i in usable_primaries() {
                        inline[n] = load(i);
                        n += 1;
                    }
                    &mut inline[..n]
                } else {
                    heap.extend(usable_primaries().map(load));
                    &mut heap
                };
                rotate(loads, self.next.fetch_add(1, Ordering::Relaxed));
                select::order_by_load(loads);
                for &(i, _, _) in loads.iter() {
                    order.push(i);
                }
            }
            _ => {
                // Walk the weighted cycle from the next position; the first usable entry leads,
                // the other usable primaries follow in cycle order.
                let start = self.next.fetch_add(1, Ordering::Relaxed);
                let n = self.cycle.len();
                let mut taken = Marks::new(self.servers.len());
                for k in 0..n {
                    let i = self.cycle[(start + k) % n];
                    if usable.get(i) && !taken.get(i) {
                        taken.set(i);
                        order.push(i);
                        if order.len() == live {
                            break;
                        }
                    }
                }
            }
        }
    }
}

/// How many servers a [`Plan`] holds without allocating.
const INLINE: usize = 8;

/// The order to try a group's servers in, for one request or connection ([`Group::plan`]).
pub struct Plan<'a> {
    servers: &'a [Arc<Server>],
    order: Order,
    /// The recovery trial this plan took, given back on drop if no verdict came.
    trial: Option<Trial>,
}

/// A server's one recovery trial, taken by a plan: it moved the server's `ejected_until` from
/// `was` (expired) to `next`.
struct Trial {
    index: usize,
    was: u64,
    next: u64,
}

impl Drop for Plan<'_> {
    fn drop(&mut self) {
        if let Some(t) = &self.trial {
            if let Some(server) = self.servers.get(t.index) {
                server.give_back_trial(t.was, t.next);
            }
        }
    }
}

impl<'a> Plan<'a> {
    /// The server at `index` (in [`Group::servers`]) failed in a way not booked on it (it gave up
    /// on an upload stalled on its client): when this plan holds its recovery trial, the trial
    /// is spent all the same, neither given back nor decided, so the server stays out until the
    /// deadline the trial set and the next trial waits a full `fail_timeout`.
    pub fn spend_trial(&self, index: usize) {
        if let Some(t) = self.trial.as_ref().filter(|t| t.index == index) {
            if let Some(server) = self.servers.get(index) {
                let _ = server.trial.compare_exchange(t.next, 0, SeqCst, SeqCst);
            }
        }
    }

    /// An attempt this plan made on the server at `index` (in [`Group::servers`]) failed
    /// ([`Server::report_failure`]). It is the verdict of the server's recovery trial only when
    /// this plan holds that trial: another plan's failure while the trial is out (the fallback's,
    /// sent to the server because nothing was usable, or a request begun before the ejection)
    /// leaves the trial to its own attempt.
    pub fn report_failure(&self, index: usize) {
        if let Some(server) = self.servers.get(index) {
            server.failed(self.trial.as_ref().is_some_and(|t| t.index == index));
        }
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.len() == 0
    }

    /// The servers in order.
    pub fn iter(&self) -> impl Iterator<Item = &'a Arc<Server>> + '_ {
        let servers = self.servers;
        self.order.as_slice().iter().map(move |&i| &servers[i])
    }

    /// The servers in order, each with its index in [`Group::servers`].
    pub fn indexed(&self) -> impl Iterator<Item = (usize, &'a Arc<Server>)> + '_ {
        let servers = self.servers;
        self.order.as_slice().iter().map(move |&i| (i, &servers[i]))
    }
}

impl std::ops::Index<usize> for Plan<'_> {
    type Output = Arc<Server>;

    fn index(&self, k: usize) -> &Arc<Server> {
        &self.servers[self.order.as_slice()[k]]
    }
}

impl<'a> IntoIterator for Plan<'a> {
    type Item = &'a Arc<Server>;
    type IntoIter = PlanIter<'a>;

    fn into_iter(self) -> PlanIter<'a> {
        PlanIter { plan: self, at: 0 }
    }
}

/// A [`Plan`]'s servers, by value.
pub struct PlanIter<'a> {
    plan: Plan<'a>,
    at: usize,
}

impl<'a> Iterator for PlanIter<'a> {
    type Item = &'a Arc<Server>;

    fn next(&mut self) -> Option<&'a Arc<Server>> {
        let i = *self.plan.order.as_slice().get(self.at)?;
        self.at += 1;
        Some(&self.plan.servers[i])
    }
}

/// Server indexes: up to `INLINE` in place, more in a vector (which then holds them all).
#[derive(Default)]
struct Order {
    len: usize,
    inline: [usize; INLINE],
    heap: Vec<usize>,
}

impl Order {
    fn push(&mut self, i: usize) {
        if self.heap.is_empty() && self.len < INLINE {
            self.inline[self.len] = i;
        } else {
            if self.heap.is_empty() {
                self.heap.extend_from_slice(&self.inline);
            }
            self.heap.push(i);
        }
        self.len += 1;
    }

    fn len(&self) -> usize {
        self.len
    }

    /// Keeps the first `n` indexes.
    fn truncate(&mut self, n: usize) {
        if n < self.len {
            self.heap.truncate(n);
            self.len = n;
        }
    }

    fn as_slice(&self) -> &[usize] {
        if self.heap.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.heap
        }
    }

    fn as_mut_slice(&mut self) -> &mut [usize] {
        if self.heap.is_empty() {
            &mut self.inline[..self.len]
        } else {
            &mut self.heap
        }
    }
}

/// A set of server indices: bits in a word for a group of up to 64 servers (no allocation), a
/// vector beyond.
enum Marks {
    Word(u64),
    Many(Vec<bool>),
}

impl Marks {
    fn new(n: usize) -> Marks {
        if n <= 64 {
            Marks::Word(0)
        } else {
            Marks::Many(vec![false; n])
        }
    }

    fn set(&mut self, i: usize) {
        match self {
            Marks::Word(w) => *w |= 1 << i,
            Marks::Many(v) => v[i] = true,
        }
    }

    fn get(&self, i: usize) -> bool {
        match self {
            Marks::Word(w) => i < 64 && *w & (1 << i) != 0,
            Marks::Many(v) => v.get(i).copied().unwrap_or(false),
        }
    }
}

fn rotate<T>(v: &mut [T], by: usize) {
    if !v.is_empty() {
        let n = v.len();
        v.rotate_left(by % n);
    }
}

/// Milliseconds since the first call, never 0 (0 means "not ejected").
fn clock_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

enum Admit {
    Yes,
    No,
    /// Ejection expired: this caller may give the server one trial; it moved the deadline from
    /// `was` to `next`.
    Trial {
        was: u64,
        next: u64,
    },
}

/// One server of a group and its live state.
#[derive(Debug)]
pub struct Server {
    addr: String,
    weight: u32,
    backup: bool,
    max_fails: u32,
    fail_timeout: Duration,
    healthy: AtomicBool,
    failures: AtomicU32,
    /// `clock_ms` until which the server is ejected; 0 = not ejected.
    ejected_until: AtomicU64,
    /// The `ejected_until` the outstanding trial set; 0 = no trial out, or its verdict came.
    trial: AtomicU64,
    ejections: AtomicU64,
    in_flight: AtomicUsize,
}

impl Server {
    fn new(config: &GroupConfig, spec: &ServerSpec) -> Server {
        Server {
            addr: spec.addr().to_string(),
            weight: spec.weight().max(1),
            backup: spec.backup(),
            max_fails: config.max_fails,
            fail_timeout: Duration::from_secs(config.fail_timeout_secs),
            healthy: AtomicBool::new(true),
            failures: AtomicU32::new(0),
            ejected_until: AtomicU64::new(0),
            trial: AtomicU64::new(0),
            ejections: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
        }
    }

    /// Takes over `old`'s passive record and, with `verdict`, what its active check decided
    /// (otherwise the server starts healthy, as a new one does).
    fn inherit(&self, old: &Server, verdict: bool) {
        if verdict {
            self.healthy
                .store(old.healthy.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        self.failures
            .store(old.failures.load(Ordering::Relaxed), Ordering::Relaxed);
        // A recovery trial out on the old server (its marker still the deadline it set) belongs
        // to a plan of the old group, whose give-back or verdict reaches only the old server:
        // the new one would wait out the whole period the trial set. Its deadline is taken as
        // run out instead (1: in the past of `clock_ms`), so its next plan takes the trial.
        let until = old.ejected_until.load(SeqCst);
        let trial = old.trial.load(SeqCst);
        let until = if trial != 0 && trial == until {
            1
        } else {
            until
        };
        self.ejected_until.store(until, SeqCst);
        self.ejections
            .store(old.ejections.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// `host:port`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn weight(&self) -> u32 {
        self.weight
    }

    pub fn is_backup(&self) -> bool {
        self.backup
    }

    /// Healthy by the active check and not ejected by passive failures.
    pub fn is_usable(&self) -> bool {
        self.is_healthy() && !self.is_ejected()
    }

    /// What the active health check last decided (true when there is no check).
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Ejected by passive failures and its fail timeout not yet over.
    pub fn is_ejected(&self) -> bool {
        let until = self.ejected_until.load(Ordering::Relaxed);
        until != 0 && clock_ms() < until
    }

    /// `now`: [`clock_ms`], read here the first time a caller's servers need it.
    fn admit(&self, now: &mut Option<u64>) -> Admit {
        if !self.is_healthy() {
            return Admit::No;
        }
        let until = self.ejected_until.load(Ordering::Relaxed);
        if until == 0 {
            return Admit::Yes;
        }
        let now = *now.get_or_insert_with(clock_ms);
        if now < until {
            return Admit::No;
        }
        // Expired: whoever moves the deadline forward owns the single trial. Its marker is set
        // first: set after, a failure reported in between (ejecting to the same millisecond)
        // would be taken for the trial's deadline and undone by its give-back. A failure's
        // ejection clears the marker after its own store (`report_failure`), so whatever the
        // interleaving, the marker never survives on a deadline the trial did not set.
        let next = now + self.fail_timeout.as_millis() as u64;
        let before = self.trial.swap(next, SeqCst);
        match self
            .ejected_until
            .compare_exchange(until, next, SeqCst, SeqCst)
        {
            Ok(_) => Admit::Trial { was: until, next },
            Err(_) => {
                // Lost the race: the marker goes back to what it was (the winner's, which a
                // plan clocked in another millisecond would otherwise wipe, leaving the
                // winner's trial impossible to give back), unless something changed it since.
                let _ = self.trial.compare_exchange(next, before, SeqCst, SeqCst);
                Admit::No
            }
        }
    }

    /// The plan holding this server's trial ended: with no verdict reported since (the trial
    /// still `next`), the deadline goes back to `was`, already past, so the next plan takes the
    /// trial at once. A verdict, a health change or a newer trial leaves everything as it is.
    fn give_back_trial(&self, was: u64, next: u64) {
        if self.trial.compare_exchange(next, 0, SeqCst, SeqCst).is_ok()
            && self
                .ejected_until
                .compare_exchange(next, was, SeqCst, SeqCst)
                .is_ok()
        {
            tracing::debug!(server = %self.addr, "recovery trial ended without a verdict: given back");
        }
    }

    /// Set by the active health checker.
    pub fn set_healthy(&self, up: bool) {
        let was = self.healthy.swap(up, Ordering::Relaxed);
        if was != up {
            tracing::warn!(server = %self.addr, up, "upstream server health changed");
        }
        if up && !was {
            // A server the checker just brought back starts with a clean passive record.
            self.failures.store(0, Ordering::Relaxed);
            self.ejected_until.store(0, Ordering::Relaxed);
        }
    }

    /// Marks one request or connection in flight until the guard drops (least-conn counts these).
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight {
            server: Arc::clone(self),
        }
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Consecutive failures since the last success.
    pub fn failures(&self) -> u32 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Times this server was ejected by passive failures.
    pub fn ejections(&self) -> u64 {
        self.ejections.load(Ordering::Relaxed)
    }

    /// An attempt on this server succeeded.
    pub fn report_success(&self) {
        self.trial.store(0, SeqCst);
        self.failures.store(0, Ordering::Relaxed);
        self.ejected_until.store(0, Ordering::Relaxed);
    }

    /// An attempt on this server failed (refused, timed out, reset before a response). After
    /// `max_fails` in a row the server is ejected for `fail_timeout_secs`.
    ///
    /// A server already out, whose failure is not its recovery trial's (a request begun before
    /// the ejection, or one the fallback sent it: [`Group::plan`]), keeps its deadline: pushed
    /// back on each such failure, a group of dead servers with traffic would never reach the
    /// trial that brings one back. Its trial's failure starts the timeout over.
    ///
    /// Taken as the verdict of a trial out, whichever attempt failed: an attempt made through a
    /// plan is reported through it ([`Plan::report_failure`]), which knows whether it was the
    /// trial's.
    pub fn report_failure(&self) {
        self.failed(true);
    }

    /// [`Server::report_failure`]; `verdict`: the failure may decide a trial out (false: the
    /// attempt was not the trial's, so the trial's marker and deadline stay).
    fn failed(&self, verdict: bool) {
        // A verdict: a trial out is decided, not to be given back.
        let trial = match verdict {
            true => self.trial.swap(0, SeqCst),
            false => 0,
        };
        let n = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if self.max_fails == 0 || n < self.max_fails {
            return;
        }
        let now = clock_ms();
        let until = self.ejected_until.load(SeqCst);
        if until > now && trial != until {
            tracing::debug!(server = %self.addr, "ejected upstream server failed again");
            return;
        }
        let until = self
            .ejected_until
            .swap(now + self.fail_timeout.as_millis() as u64, SeqCst);
        // Cleared again after the new deadline is in: a trial taken meanwhile (its marker set
        // before its deadline, `admit`) may have the same millisecond's deadline as this
        // ejection, and its give-back must not take this ejection for its own.
        self.trial.store(0, SeqCst);
        if until != 0 && until > now {
            // Its one trial failed: the timeout starts over.
            tracing::debug!(server = %self.addr, "recovery trial failed");
            return;
        }
        self.ejections.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            server = %self.addr,
            failures = n,
            secs = self.fail_timeout.as_secs(),
            "upstream server ejected after consecutive failures"
        );
    }
}

/// One request or connection in flight on a server.
#[derive(Debug)]
pub struct InFlight {
    server: Arc<Server>,
}

impl InFlight {
    pub fn server(&self) -> &Arc<Server> {
        &self.server
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.server.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests;
