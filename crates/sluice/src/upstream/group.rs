//! Upstream groups: named sets of servers shared by the reverse and TCP front ends; which server is
//! tried next (balancing) and which servers are usable (health, passive ejection, backups).
//!
//! Readers never lock: a request asks [`Group::plan`] for the order to try servers in, and reports
//! each attempt's outcome on the [`Server`]. Health checks only flip flags on servers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

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

/// Every group, by name.
#[derive(Debug, Default)]
pub struct Groups {
    by_name: HashMap<String, Arc<Group>>,
}

impl Groups {
    /// Builds the groups; a bad entry is an error naming the group.
    pub fn new(configs: &[GroupConfig]) -> anyhow::Result<Groups> {
        let mut by_name = HashMap::new();
        for config in configs {
            let group = Group::new(config)?;
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
}

/// One group of servers.
#[derive(Debug)]
pub struct Group {
    name: String,
    balance: Balance,
    hash_key: Option<String>,
    servers: Vec<Arc<Server>>,
    next: AtomicUsize,
}

impl Group {
    pub fn new(config: &GroupConfig) -> anyhow::Result<Group> {
        if config.servers.is_empty() {
            anyhow::bail!("upstream group {:?} has no servers", config.name);
        }
        let servers = config
            .servers
            .iter()
            .map(|spec| {
                if spec.addr().rsplit_once(':').is_none() {
                    anyhow::bail!(
                        "upstream group {:?}: server {:?} is not host:port",
                        config.name,
                        spec.addr()
                    );
                }
                Ok(Arc::new(Server {
                    addr: spec.addr().to_string(),
                    weight: spec.weight().max(1),
                    backup: spec.backup(),
                    healthy: AtomicBool::new(true),
                    failures: AtomicU32::new(0),
                    in_flight: AtomicUsize::new(0),
                }))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Group {
            name: config.name.clone(),
            balance: config.balance,
            hash_key: config.hash_key.clone(),
            servers,
            next: AtomicUsize::new(0),
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

    pub fn servers(&self) -> &[Arc<Server>] {
        &self.servers
    }

    /// The order to try servers in for one request or connection: the balanced choice first, then
    /// the other usable primaries; backups only when no primary is usable. Empty when nothing is
    /// usable. `key` is the hash input when the group balances by hash.
    pub fn plan(&self, _key: Option<&[u8]>) -> Vec<Arc<Server>> {
        let usable = |backup: bool| -> Vec<Arc<Server>> {
            self.servers
                .iter()
                .filter(|s| s.backup == backup && s.is_usable())
                .cloned()
                .collect()
        };
        let mut plan = usable(false);
        if plan.is_empty() {
            plan = usable(true);
        }
        if !plan.is_empty() {
            let start = self.next.fetch_add(1, Ordering::Relaxed) % plan.len();
            plan.rotate_left(start);
        }
        plan
    }
}

/// One server of a group and its live state.
#[derive(Debug)]
pub struct Server {
    addr: String,
    weight: u32,
    backup: bool,
    healthy: AtomicBool,
    failures: AtomicU32,
    in_flight: AtomicUsize,
}

impl Server {
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
        self.healthy.load(Ordering::Relaxed)
    }

    /// Set by the active health checker.
    pub fn set_healthy(&self, up: bool) {
        self.healthy.store(up, Ordering::Relaxed);
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

    /// An attempt on this server succeeded.
    pub fn report_success(&self) {
        self.failures.store(0, Ordering::Relaxed);
    }

    /// An attempt on this server failed (refused, timed out, reset before a response).
    pub fn report_failure(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
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
