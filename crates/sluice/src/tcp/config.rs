//! The `[[tcp]]` listener config: listen address, upstream group or SNI routes, timeouts, limits,
//! PROXY protocol both ways, optional TLS termination; validated before anything binds.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::upstream::group::GroupConfig;

/// One `[[tcp]]` listener.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TcpConfig {
    /// Name in metrics and logs; defaults to the listen address. Reload matches listeners by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Address to accept on.
    pub listen: SocketAddr,
    /// The `[[upstreams]]` group connections go to (with `sni`: the group when no route matches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    /// Route TLS connections by the ClientHello's server name, without terminating TLS.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sni: Vec<SniRoute>,
    /// Seconds to connect to one server before trying the next.
    #[serde(default = "default_connect")]
    pub connect_timeout_secs: u64,
    /// Seconds with no byte in either direction before both sides are closed.
    #[serde(default = "default_idle")]
    pub idle_timeout_secs: u64,
    /// Seconds a connection may last at all; 0 = no limit.
    #[serde(default)]
    pub total_timeout_secs: u64,
    /// Seconds a client has to send its PROXY header, ClientHello or TLS handshake.
    #[serde(default = "default_handshake")]
    pub handshake_timeout_secs: u64,
    /// Connections open at once; at the limit the listener stops accepting until one closes.
    /// Not set: derived from the open-file limit ([`default_max_connections`]), as
    /// [`TcpConfig::connection_limit`] gives it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<usize>,
    /// Connections one client IP (an IPv6 one: its /64) may hold open at once (0 = no limit);
    /// past it a new connection from that IP is closed at once, so one client cannot hold every
    /// slot of `max_connections`.
    #[serde(default = "default_max_connections_per_ip")]
    pub max_connections_per_ip: usize,
    /// Peers `max_connections_per_ip` does not apply to; by default loopback, as the HTTP
    /// server's `server.per_ip_exempt`.
    #[serde(default = "default_per_ip_exempt")]
    pub per_ip_exempt: Vec<ipnet::IpNet>,
    /// Send a PROXY protocol header to the upstream carrying the client's address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_proxy: Option<ProxyVersion>,
    /// Expect a PROXY protocol header (v1 or v2) from the peer; peers outside `trusted_proxies`
    /// are refused.
    #[serde(default)]
    pub accept_proxy: bool,
    /// Networks allowed to send a PROXY header (required with `accept_proxy`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// PEM certificate chain: terminate TLS here and relay plain bytes upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for `tls_cert`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
}

/// `{ server_name = "db.example.com", upstream = "db" }`; `*.example.com` matches one or more labels
/// in front of `example.com`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SniRoute {
    pub server_name: String,
    pub upstream: String,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ProxyVersion {
    V1,
    V2,
}

fn default_connect() -> u64 {
    5
}
fn default_idle() -> u64 {
    600
}
fn default_handshake() -> u64 {
    5
}
/// The most `max_connections` defaults to, whatever the open-file limit.
const MAX_DEFAULT_CONNECTIONS: usize = 10_000;

/// Descriptors one relayed connection may hold: its own and the upstream's, plus a pipe (two) for
/// each direction while it splices a burst (both at once on a bulk transfer each way); an idle
/// connection holds its two sockets only (`net::splice`). The pipe pool's idle pipes come on top.
/// It was 3, under what one connection moving bulk bytes both ways holds.
pub const FDS_PER_CONNECTION: u64 = 6;

/// `max_connections` of a listener that does not set it, under an open-file limit of `nofile`: a
/// quarter of what the HTTP side sizes itself to (`server::listener::connections_for_fd_limit`,
/// which counts as if it had the whole table), at most 10,000. Before, every listener took 10,000
/// whatever the limit: under the common 1,024 about 500 held connections ran the process out of
/// descriptors, and the HTTP side's accept paused with them.
pub fn default_max_connections(nofile: u64) -> usize {
    (crate::server::listener::connections_for_fd_limit(nofile) / 4)
        .clamp(1, MAX_DEFAULT_CONNECTIONS)
}

/// The descriptors `listeners` may hold at their connection limits ([`FDS_PER_CONNECTION`] per
/// connection), if that is more than `nofile`.
pub fn over_descriptor_budget(listeners: &[TcpConfig], nofile: u64) -> Option<u64> {
    let need = listeners
        .iter()
        .map(|t| t.limit_under(nofile) as u64)
        .fold(0u64, u64::saturating_add)
        .saturating_mul(FDS_PER_CONNECTION);
    (need > nofile).then_some(need)
}
/// No limit unless set: a TCP listener often carries one client's pool (an application server
/// holding hundreds of database connections) or many clients behind one NAT, which a per-address
/// limit chosen for browsers would cut on upgrade. `max_connections` bounds the listener.
fn default_max_connections_per_ip() -> usize {
    0
}
/// As the HTTP server's `server.per_ip_exempt`.
fn default_per_ip_exempt() -> Vec<ipnet::IpNet> {
    vec![
        "127.0.0.0/8".parse().expect("valid net"),
        "::1/128".parse().expect("valid net"),
    ]
}

impl TcpConfig {
    /// The listener's name: `name`, or the listen address.
    pub fn name(&self) -> String {
        self.name.clone().unwrap_or_else(|| self.listen.to_string())
    }

    /// The group for a server name (exact first, then the longest wildcard), else the default.
    /// A fully qualified name's one trailing dot (`db.example.com.`, which rustls passes on
    /// from a TLS client) is dropped first: it names the same host, as for the HTTPS
    /// certificates (`server::tls::sni`).
    pub fn group_for(&self, server_name: Option<&str>) -> Option<&str> {
        if let Some(name) = server_name.map(|n| n.strip_suffix('.').unwrap_or(n)) {
            if let Some(r) = self.sni.iter().find(|r| r.server_name == name) {
                return Some(&r.upstream);
            }
            let wildcard = self
                .sni
                .iter()
                .filter_map(|r| r.server_name.strip_prefix('*').map(|suffix| (suffix, r)))
                .filter(|(suffix, _)| name.len() > suffix.len() && name.ends_with(suffix))
                .max_by_key(|(suffix, _)| suffix.len());
            if let Some((_, r)) = wildcard {
                return Some(&r.upstream);
            }
        }
        self.upstream.as_deref()
    }

    /// `max_connections`, or, not set, its default for the current open-file limit.
    pub fn connection_limit(&self) -> usize {
        self.limit_under(crate::server::listener::nofile_limit())
    }

    /// `max_connections`, or, not set, its default for an open-file limit of `nofile`.
    fn limit_under(&self, nofile: u64) -> usize {
        self.max_connections
            .unwrap_or_else(|| default_max_connections(nofile))
    }

    /// Terminates TLS here.
    pub fn terminates_tls(&self) -> bool {
        self.tls_cert.is_some()
    }
}

/// Checks every `[[tcp]]` entry against itself and the groups.
pub fn validate(listeners: &[TcpConfig], groups: &[GroupConfig]) -> Result<(), String> {
    let mut names = HashSet::new();
    let known: HashSet<&str> = groups.iter().map(|g| g.name.as_str()).collect();
    for t in listeners {
        let name = t.name();
        let at = |msg: String| format!("[[tcp]] {name:?}: {msg}");
        if !names.insert(name.clone()) {
            return Err(at("two listeners have this name (set `name`)".into()));
        }
        if t.upstream.is_none() && t.sni.is_empty() {
            return Err(at("give `upstream` (or `sni` routes)".into()));
        }
        for group in t.upstream.iter().chain(t.sni.iter().map(|r| &r.upstream)) {
            if !known.contains(group.as_str()) {
                return Err(at(format!("no [[upstreams]] group named {group:?}")));
            }
        }
        for r in &t.sni {
            let host = r.server_name.strip_prefix("*.").unwrap_or(&r.server_name);
            let ok = !host.is_empty()
                && host == host.to_ascii_lowercase()
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
            if !ok {
                return Err(at(format!(
                    "sni server_name {:?} must be a lowercase host name or *.suffix",
                    r.server_name
                )));
            }
        }
        for (key, v) in [
            ("connect_timeout_secs", t.connect_timeout_secs),
            ("idle_timeout_secs", t.idle_timeout_secs),
            ("handshake_timeout_secs", t.handshake_timeout_secs),
        ] {
            if v == 0 {
                return Err(at(format!("{key} must be at least 1")));
            }
        }
        if t.max_connections == Some(0) {
            return Err(at("max_connections must be at least 1".into()));
        }
        if t.accept_proxy && t.trusted_proxies.is_empty() {
            return Err(at(
                "accept_proxy needs trusted_proxies (the networks of your load balancers)".into(),
            ));
        }
        if t.tls_cert.is_some() != t.tls_key.is_some() {
            return Err(at("tls_cert and tls_key must be given together".into()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(text: &str) -> TcpConfig {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn sni_exact_then_longest_wildcard_then_default() {
        let t = tcp(r#"listen = "127.0.0.1:1"
            upstream = "dflt"
            sni = [
              { server_name = "*.example.com", upstream = "wide" },
              { server_name = "*.db.example.com", upstream = "dbs" },
              { server_name = "pg.db.example.com", upstream = "pg" },
            ]"#);
        assert_eq!(t.group_for(Some("pg.db.example.com")), Some("pg"));
        assert_eq!(t.group_for(Some("x.db.example.com")), Some("dbs"));
        assert_eq!(t.group_for(Some("www.example.com")), Some("wide"));
        assert_eq!(t.group_for(Some("example.com")), Some("dflt"));
        assert_eq!(t.group_for(Some("evilexample.com")), Some("dflt"));
        assert_eq!(t.group_for(None), Some("dflt"));
        // A trailing dot (a TLS-terminating listener gets the name as the client sent it)
        // names the same host.
        assert_eq!(t.group_for(Some("pg.db.example.com.")), Some("pg"));
        assert_eq!(t.group_for(Some("x.db.example.com.")), Some("dbs"));
    }

    #[test]
    fn validation_names_the_problem() {
        let groups: Vec<GroupConfig> =
            vec![toml::from_str("name = \"db\"\nservers = [\"127.0.0.1:5432\"]").unwrap()];
        for (text, why) in [
            ("listen = \"127.0.0.1:1\"", "give `upstream`"),
            (
                "listen = \"127.0.0.1:1\"\nupstream = \"nope\"",
                "no [[upstreams]] group",
            ),
            (
                "listen = \"127.0.0.1:1\"\nupstream = \"db\"\naccept_proxy = true",
                "trusted_proxies",
            ),
            (
                "listen = \"127.0.0.1:1\"\nupstream = \"db\"\nmax_connections = 0",
                "max_connections",
            ),
            (
                "listen = \"127.0.0.1:1\"\nupstream = \"db\"\ntls_cert = \"a.pem\"",
                "together",
            ),
            (
                "listen = \"127.0.0.1:1\"\nsni = [{ server_name = \"A.com\", upstream = \"db\" }]",
                "lowercase",
            ),
        ] {
            let err = validate(&[tcp(text)], &groups).unwrap_err();
            assert!(err.contains(why), "{text}: {err}");
        }
        let one = tcp("listen = \"127.0.0.1:1\"\nupstream = \"db\"");
        assert!(validate(std::slice::from_ref(&one), &groups).is_ok());
        assert!(validate(&[one.clone(), one], &groups)
            .unwrap_err()
            .contains("name"));
        assert!(toml::from_str::<TcpConfig>("listen = \"127.0.0.1:1\"\nbogus = 1").is_err());
        assert!(
            toml::from_str::<TcpConfig>("listen = \"127.0.0.1:1\"\nsend_proxy = \"v3\"").is_err()
        );
    }

    /// Not set, `max_connections` follows the open-file limit: a quarter of what the HTTP side
    /// takes, at most 10,000; a value the operator set is kept. Before, it was 10,000 under any
    /// limit: 30,000 descriptors' worth under a limit of 1,024.
    #[test]
    fn max_connections_defaults_from_the_descriptor_limit() {
        let unset = tcp("listen = \"127.0.0.1:1\"\nupstream = \"db\"");
        assert_eq!(unset.max_connections, None);
        // (1024 - 64) / 2 / 4.
        assert_eq!(unset.limit_under(1024), 120);
        assert_eq!(default_max_connections(1024), 120);
        assert_eq!(unset.limit_under(1_048_576), 10_000);
        assert_eq!(unset.limit_under(0), 1);
        // One listener at its default stays within a small limit (720 descriptors of 1,024, six
        // a connection: two sockets and a pipe each way); two, or one set past it, do not.
        assert_eq!(
            over_descriptor_budget(std::slice::from_ref(&unset), 1024),
            None
        );
        assert_eq!(
            over_descriptor_budget(&[unset.clone(), unset.clone()], 1024),
            Some(2 * 120 * 6)
        );
        let set = tcp("listen = \"127.0.0.1:1\"\nupstream = \"db\"\nmax_connections = 5000");
        assert_eq!(set.limit_under(1024), 5000);
        assert_eq!(set.limit_under(1_048_576), 5000);
        assert_eq!(
            over_descriptor_budget(&[unset.clone(), set], 1024),
            Some((120 + 5000) * 6)
        );
        // The default is not written back out: a config printed and loaded again keeps following
        // the limit.
        let printed = toml::to_string(&unset).unwrap();
        assert!(!printed.contains("max_connections ="), "{printed}");
    }
}
