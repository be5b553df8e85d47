//! The `[cache.cluster]` section: this node's identity, its peers (a static list or a DNS name),
//! the shared secret that authenticates the hop, and the health, rampup and purge-log knobs.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// `[cache.cluster]`: several sluice nodes that share one cache, each object owned by one node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// This node as its peers reach its HTTP listener (`ip:port`). Empty: the member whose
    /// address is one of this host's own (a pod behind a headless Service needs no config).
    #[serde(rename = "self")]
    pub self_addr: String,
    /// Static members (`"ip:port"` or `{ addr = "ip:port", weight = 2, control = "ip:port" }`);
    /// this node may be listed too. Empty when `dns` is set.
    pub peers: Vec<PeerSpec>,
    /// Members from DNS instead: `name:port` (A/AAAA, every address on that port) or
    /// `_service._proto.name` (SRV: target, port and weight), re-resolved on the answer's TTL.
    pub dns: Option<String>,
    /// The DNS server to ask (`ip:port`); absent: the system's resolvers.
    pub dns_server: Option<SocketAddr>,
    /// Bounds of the re-resolution interval, whatever the TTL says.
    pub dns_min_refresh_secs: u64,
    pub dns_max_refresh_secs: u64,
    /// The shared secret the hop marker and the peer control requests are signed with (at least
    /// 16 characters; the same on every node).
    pub secret: String,
    /// A file holding the secret instead (a mounted Kubernetes Secret); surrounding whitespace
    /// is ignored.
    pub secret_file: Option<std::path::PathBuf>,
    /// Port of every node's cluster control listener (purge fan-out, purge log, health); a static
    /// peer may name its own `control` address instead.
    pub control_port: u16,
    /// Where this node's control listener binds; absent: every address, on `control_port`.
    pub control_listen: Option<SocketAddr>,
    /// Milliseconds between active checks of a peer (which also pull its purge log).
    pub health_interval_ms: u64,
    /// Milliseconds a check, or a connection to a peer, may take.
    pub peer_timeout_ms: u64,
    /// Failed checks or fetches in a row that take a peer out of the ring (until a check passes).
    pub max_fails: u32,
    /// Seconds over which a node that joined (or came back) takes on its share of the keys.
    pub rampup_secs: u64,
    /// Seconds a node keeps its copy of an object another node owns, on routes with
    /// `cache_peer_copy = true` (on top of the object's age; never past its own lifetime).
    pub peer_copy_ttl_secs: u64,
    /// Purges this node remembers for peers that were away when they were sent.
    pub purge_log_entries: usize,
}

/// One static member.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum PeerSpec {
    Addr(String),
    Full {
        addr: String,
        #[serde(default = "one")]
        weight: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        control: Option<String>,
    },
}

fn one() -> u32 {
    1
}

impl PeerSpec {
    pub fn addr(&self) -> &str {
        match self {
            PeerSpec::Addr(a) | PeerSpec::Full { addr: a, .. } => a,
        }
    }

    pub fn weight(&self) -> u32 {
        match self {
            PeerSpec::Addr(_) => 1,
            PeerSpec::Full { weight, .. } => *weight,
        }
    }

    pub fn control(&self) -> Option<&str> {
        match self {
            PeerSpec::Full { control, .. } => control.as_deref(),
            PeerSpec::Addr(_) => None,
        }
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            self_addr: String::new(),
            peers: Vec::new(),
            dns: None,
            dns_server: None,
            dns_min_refresh_secs: 1,
            dns_max_refresh_secs: 30,
            secret: String::new(),
            secret_file: None,
            control_port: 8899,
            control_listen: None,
            health_interval_ms: 1000,
            peer_timeout_ms: 1000,
            max_fails: 2,
            rampup_secs: 10,
            peer_copy_ttl_secs: 10,
            purge_log_entries: 10_000,
        }
    }
}

/// Largest member weight (as for upstream servers).
pub const MAX_WEIGHT: u32 = 100;

impl ClusterConfig {
    /// Checks what types alone cannot.
    pub fn validate(&self) -> Result<(), String> {
        if !self.self_addr.is_empty() && self.self_addr.parse::<SocketAddr>().is_err() {
            return Err(format!(
                "self = {:?} must be this node's ip:port as its peers reach it",
                self.self_addr
            ));
        }
        self.usable_secret()?;
        match (&self.dns, self.peers.is_empty()) {
            (Some(_), false) => return Err("set peers or dns, not both".into()),
            (None, true) => return Err("needs peers or dns".into()),
            (Some(name), true) => {
                if !cfg!(feature = "dns") {
                    return Err("dns membership needs sluice built with the dns feature".into());
                }
                if !name.starts_with('_')
                    && name
                        .rsplit_once(':')
                        .is_none_or(|(_, p)| p.parse::<u16>().is_err())
                {
                    return Err(format!(
                        "dns = {name:?} must be name:port (A/AAAA) or _service._proto.name (SRV)"
                    ));
                }
            }
            (None, false) => {}
        }
        for p in &self.peers {
            if p.addr().parse::<SocketAddr>().is_err() {
                return Err(format!("peer {:?} is not ip:port", p.addr()));
            }
            if let Some(c) = p.control() {
                if c.parse::<SocketAddr>().is_err() {
                    return Err(format!("peer control {c:?} is not ip:port"));
                }
            }
            if p.weight() == 0 || p.weight() > MAX_WEIGHT {
                return Err(format!(
                    "peer {:?} weight must be 1..={MAX_WEIGHT}",
                    p.addr()
                ));
            }
        }
        if self.dns_min_refresh_secs == 0 || self.dns_max_refresh_secs < self.dns_min_refresh_secs {
            return Err(
                "dns_min_refresh_secs must be at least 1 and at most dns_max_refresh_secs".into(),
            );
        }
        for (name, v) in [
            ("health_interval_ms", self.health_interval_ms),
            ("peer_timeout_ms", self.peer_timeout_ms),
            ("max_fails", u64::from(self.max_fails)),
            ("purge_log_entries", self.purge_log_entries as u64),
            ("peer_copy_ttl_secs", self.peer_copy_ttl_secs),
        ] {
            if v == 0 {
                return Err(format!("{name} must be at least 1"));
            }
        }
        Ok(())
    }

    /// The secret as [`ClusterConfig::secret`] reads it, refused when too short to sign with.
    pub fn usable_secret(&self) -> Result<String, String> {
        let secret = self.secret()?;
        if secret.chars().count() < 16 {
            return Err("secret must be at least 16 characters, the same on every node".into());
        }
        Ok(secret)
    }

    /// The secret, from `secret` or `secret_file` (not both).
    pub fn secret(&self) -> Result<String, String> {
        match (&self.secret_file, self.secret.is_empty()) {
            (None, _) => Ok(self.secret.clone()),
            (Some(_), false) => Err("set secret or secret_file, not both".into()),
            (Some(path), true) => std::fs::read_to_string(path)
                .map(|s| s.trim().to_string())
                .map_err(|e| format!("secret_file {}: {e}", path.display())),
        }
    }

    /// Where the control listener binds.
    pub fn control_bind(&self) -> SocketAddr {
        self.control_listen.unwrap_or_else(|| {
            SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), self.control_port)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_validates() {
        let c: ClusterConfig = toml::from_str(
            "self = \"10.0.0.1:8888\"\nsecret = \"0123456789abcdef\"\npeers = [\"10.0.0.1:8888\", { addr = \"10.0.0.2:8888\", weight = 2 }]",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.peers[1].weight(), 2);
        let short = ClusterConfig {
            secret: "short".into(),
            ..c.clone()
        };
        assert!(short.validate().unwrap_err().contains("secret"));
        let both = ClusterConfig {
            dns: Some("sluice.test:8888".into()),
            ..c.clone()
        };
        assert!(both.validate().is_err());
        let no_port = ClusterConfig {
            dns: Some("sluice.test".into()),
            peers: vec![],
            ..c
        };
        assert!(no_port.validate().is_err());
        assert!(toml::from_str::<ClusterConfig>("nope = 1").is_err());
    }
}
