//! The `[acme]` section: which CA, which names, how challenges are answered, where state lives.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::bail;
use serde::{Deserialize, Serialize};

/// Let's Encrypt's production directory (`directory = "production"`).
pub const PRODUCTION: &str = "https://acme-v02.api.letsencrypt.org/directory";
/// Let's Encrypt's staging directory (`directory = "staging"`): untrusted certificates, high limits.
pub const STAGING: &str = "https://acme-staging-v02.api.letsencrypt.org/directory";

/// The longest duration any `[acme]` setting in seconds may give (a year): far past anything
/// useful, and far from where adding it to the clock overflows.
pub const MAX_SECS: u64 = 365 * 24 * 3600;

/// `[acme]`: automatic HTTPS. Off until it names a host (`names`, `routes = true`) or turns
/// on-demand issuance on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AcmeConfig {
    /// Hostnames to hold certificates for (`example.com`, `*.example.com` with DNS-01 only).
    pub names: Vec<String>,
    /// Also every `host` of a `[[routes]]` entry.
    pub routes: bool,
    /// The CA's directory URL, or `production` / `staging` for Let's Encrypt's.
    pub directory: String,
    /// A PEM root trusted for the directory's own HTTPS (a private or test CA), beside the system's.
    pub directory_ca: Option<PathBuf>,
    /// Account contacts (`mailto:ops@example.com`).
    pub contact: Vec<String>,
    /// Account key, certificates and locks; nodes that share it share certificates. Default:
    /// `$STATE_DIRECTORY/acme` under systemd (`StateDirectory=`), else `/var/lib/sluice/acme`.
    pub state_dir: Option<PathBuf>,
    /// Challenge types to offer, preferred first.
    pub challenges: Vec<Challenge>,
    /// Plain-HTTP listeners that answer HTTP-01 and redirect everything else to `https://`.
    pub http_listen: Vec<SocketAddr>,
    /// Renew when this fraction of a certificate's lifetime is left (when the CA offers no ARI
    /// window, or `ari = false`).
    pub renew_remaining: f64,
    /// Ask the CA when to renew (ACME Renewal Information, RFC 9773) when it offers it.
    pub ari: bool,
    /// How often stored certificates are re-read (another node may have renewed one) and renewal
    /// times checked.
    pub check_secs: u64,
    /// First wait after a failed order; doubles per failure up to `retry_max_secs`.
    pub retry_min_secs: u64,
    pub retry_max_secs: u64,
    /// Orders placed per hour at most, all names together (the CA's limits are per account).
    pub orders_per_hour: u32,
    /// One order's time limit (challenges validated, certificate issued).
    pub order_timeout_secs: u64,
    /// DNS-01 by RFC 2136 dynamic update.
    pub dns: Option<DnsConfig>,
    /// External account binding, for CAs that require one (ZeroSSL, Google Trust Services).
    pub eab: Option<EabConfig>,
    /// Issuance for names first seen in a TLS handshake.
    pub on_demand: OnDemandConfig,
}

impl Default for AcmeConfig {
    fn default() -> Self {
        AcmeConfig {
            names: Vec::new(),
            routes: false,
            directory: "production".into(),
            directory_ca: None,
            contact: Vec::new(),
            state_dir: None,
            challenges: vec![Challenge::TlsAlpn01, Challenge::Http01],
            http_listen: Vec::new(),
            renew_remaining: 1.0 / 3.0,
            ari: true,
            check_secs: 600,
            retry_min_secs: 60,
            retry_max_secs: 86_400,
            orders_per_hour: 30,
            order_timeout_secs: 120,
            dns: None,
            eab: None,
            on_demand: OnDemandConfig::default(),
        }
    }
}

/// A challenge type (RFC 8555 section 8, RFC 8737).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum Challenge {
    #[serde(rename = "http-01")]
    Http01,
    #[serde(rename = "tls-alpn-01")]
    TlsAlpn01,
    #[serde(rename = "dns-01")]
    Dns01,
}

/// `[acme.dns]`: where TXT records for DNS-01 are written.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DnsConfig {
    /// The primary server that takes RFC 2136 updates (over TCP).
    pub server: SocketAddr,
    /// The zone updated (`example.com`); every DNS-01 name must lie in it.
    pub zone: String,
    /// A `tsig-keygen` key file (`key "name" { algorithm hmac-sha256; secret "..."; };`).
    pub tsig_key_file: PathBuf,
    /// TTL of the TXT records, seconds.
    #[serde(default = "default_ttl")]
    pub ttl: u32,
}

fn default_ttl() -> u32 {
    60
}

/// `[acme.eab]`: the external account binding a CA issued (RFC 8555 §7.3.4), used when the
/// account is created.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EabConfig {
    /// The key id (`kid`) the CA gave.
    pub key_id: String,
    /// A file holding the HMAC key the CA gave with it (base64url), so the key is in no config.
    pub mac_key_file: PathBuf,
}

/// `[acme.on_demand]`: a TLS handshake for a name with no certificate may start an order.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct OnDemandConfig {
    pub enabled: bool,
    /// Asked `GET <ask>?domain=<name>` first; only a 2xx answer lets the order go ahead.
    pub ask: Option<String>,
    /// One name is asked about at most once in this many seconds (an allowed name whose order
    /// `per_minute` put off, or another node was placing, may be asked about again sooner).
    pub per_name_secs: u64,
    /// On-demand orders started per minute at most, all names together (names the ask URL
    /// allowed; asks are not counted).
    pub per_minute: u32,
    /// Names remembered as tried at most; past it, the oldest are forgotten (and may be asked
    /// about again).
    pub max_names: usize,
    /// How long a handshake waits for its certificate before it fails (the handshake timeout,
    /// `server.tls_handshake_timeout_secs`, bounds it too).
    pub wait_secs: u64,
}

impl Default for OnDemandConfig {
    fn default() -> Self {
        OnDemandConfig {
            enabled: false,
            ask: None,
            per_name_secs: 600,
            per_minute: 10,
            max_names: 10_000,
            wait_secs: 8,
        }
    }
}

impl AcmeConfig {
    /// Whether anything asks for automatic HTTPS (`route_hosts`: the `[[routes]]` hosts).
    pub fn active(&self, route_hosts: &[String]) -> bool {
        !self.names.is_empty() || self.on_demand.enabled || (self.routes && !route_hosts.is_empty())
    }

    /// The directory URL, with `production` and `staging` spelled out.
    pub fn directory_url(&self) -> &str {
        match self.directory.as_str() {
            "production" => PRODUCTION,
            "staging" => STAGING,
            url => url,
        }
    }

    /// Where state lives (see [`AcmeConfig::state_dir`]).
    pub fn state_path(&self) -> PathBuf {
        if let Some(dir) = &self.state_dir {
            return dir.clone();
        }
        // systemd may list several directories, separated by ':'; the first is the unit's own.
        let base = std::env::var("STATE_DIRECTORY")
            .ok()
            .and_then(|s| s.split(':').next().map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("/var/lib/sluice"));
        base.join("acme")
    }

    /// Every name to hold a certificate for: `names`, then route hosts (with `routes = true`),
    /// lower-cased, without duplicates. Wildcard route hosts are left out without DNS-01.
    pub fn all_names(&self, route_hosts: &[String]) -> Vec<String> {
        let mut all: Vec<String> = Vec::new();
        let from_routes = route_hosts
            .iter()
            .filter(|_| self.routes)
            .filter(|h| !h.starts_with("*.") || self.challenges.contains(&Challenge::Dns01));
        for name in self.names.iter().chain(from_routes) {
            let name = name.trim().trim_end_matches('.').to_ascii_lowercase();
            if !name.is_empty() && !all.contains(&name) {
                all.push(name);
            }
        }
        all
    }

    /// Checks the section before anything binds.
    pub fn validate(&self, route_hosts: &[String]) -> anyhow::Result<()> {
        if !self.active(route_hosts) {
            return Ok(());
        }
        let url = self.directory_url();
        if !url.starts_with("https://") {
            bail!("acme.directory {url:?}: give an https:// URL, \"production\" or \"staging\"");
        }
        if self.challenges.is_empty() {
            bail!("acme.challenges is empty: give at least one of \"tls-alpn-01\", \"http-01\", \"dns-01\"");
        }
        if self.challenges.contains(&Challenge::Http01) && self.http_listen.is_empty() {
            bail!("acme.challenges has \"http-01\" but acme.http_listen is empty: give the plain listener (e.g. \"0.0.0.0:80\")");
        }
        if self.challenges.contains(&Challenge::Dns01) && self.dns.is_none() {
            bail!("acme.challenges has \"dns-01\" but [acme.dns] is missing");
        }
        for name in self.all_names(route_hosts) {
            check_name(&name)?;
            if name.starts_with("*.") && !self.challenges.contains(&Challenge::Dns01) {
                bail!("acme.names {name:?}: a wildcard needs the \"dns-01\" challenge");
            }
            if let Some(dns) = &self.dns {
                let zone = dns.zone.trim_end_matches('.').to_ascii_lowercase();
                let bare = name.trim_start_matches("*.");
                let inside = bare == zone || bare.ends_with(&format!(".{zone}"));
                if self.challenges == [Challenge::Dns01] && !inside {
                    bail!("acme.names {name:?} is outside acme.dns.zone {zone:?}");
                }
            }
        }
        if self
            .eab
            .as_ref()
            .is_some_and(|e| e.key_id.trim().is_empty())
        {
            bail!("acme.eab.key_id is empty: give the key id the CA issued with the HMAC key");
        }
        if !(0.0..1.0).contains(&self.renew_remaining) || self.renew_remaining == 0.0 {
            bail!("acme.renew_remaining must lie between 0 and 1 (a fraction of the lifetime)");
        }
        if self.retry_min_secs == 0 || self.retry_max_secs < self.retry_min_secs {
            bail!("acme.retry_min_secs must be at least 1 and at most acme.retry_max_secs");
        }
        if self.check_secs == 0 || self.order_timeout_secs == 0 || self.orders_per_hour == 0 {
            bail!("acme.check_secs, acme.order_timeout_secs and acme.orders_per_hour must be at least 1");
        }
        let od = &self.on_demand;
        for (key, secs) in [
            ("check_secs", self.check_secs),
            ("retry_min_secs", self.retry_min_secs),
            ("retry_max_secs", self.retry_max_secs),
            ("order_timeout_secs", self.order_timeout_secs),
            ("on_demand.per_name_secs", od.per_name_secs),
            ("on_demand.wait_secs", od.wait_secs),
        ] {
            if secs > MAX_SECS {
                bail!("acme.{key} = {secs} is too long: at most {MAX_SECS} (a year)");
            }
        }
        if od.enabled {
            match &od.ask {
                Some(ask) if ask.starts_with("http://") || ask.starts_with("https://") => {
                    // `?domain=` is added after it: in a fragment it would never be sent, and
                    // an ask endpoint answering 2xx to no name would allow every name.
                    if ask.contains('#') || ask.parse::<http::Uri>().is_err() {
                        // The URL is not quoted: its query may hold a key (`check-config`
                        // masks it), and this message reaches logs and `/admin/reload`.
                        bail!("acme.on_demand.ask must be a URL without a fragment (#): the name is added as ?domain=");
                    }
                }
                _ => bail!("acme.on_demand.ask must be an http(s) URL: on-demand issuance without an ask check would let anyone spend the CA's limits"),
            }
            if od.per_minute == 0 || od.max_names == 0 || od.wait_secs == 0 {
                bail!("acme.on_demand.per_minute, max_names and wait_secs must be at least 1");
            }
            if self.orders_per_hour < 2 {
                bail!("acme.orders_per_hour must be at least 2 with on-demand issuance: on-demand orders use at most half of it, the rest is kept for the configured names and renewals");
            }
        }
        Ok(())
    }
}

/// A hostname an ACME CA can issue for: LDH labels, at most one leading `*.`.
pub fn check_name(name: &str) -> anyhow::Result<()> {
    let bare = name.strip_prefix("*.").unwrap_or(name);
    let ok = !bare.is_empty()
        && bare.len() <= 253
        && bare.contains('.')
        && bare.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    if !ok {
        bail!("{name:?} is not a hostname a CA issues for");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_past_a_year_are_refused_by_name() {
        let base = AcmeConfig {
            names: vec!["a.example.com".into()],
            challenges: vec![Challenge::TlsAlpn01],
            ..AcmeConfig::default()
        };
        base.validate(&[]).unwrap();
        type Set = fn(&mut AcmeConfig);
        let cases: [(&str, Set); 6] = [
            ("acme.check_secs", |c| c.check_secs = u64::MAX),
            ("acme.retry_min_secs", |c| c.retry_min_secs = MAX_SECS + 1),
            ("acme.retry_max_secs", |c| c.retry_max_secs = u64::MAX),
            ("acme.order_timeout_secs", |c| {
                c.order_timeout_secs = u64::MAX
            }),
            ("acme.on_demand.per_name_secs", |c| {
                c.on_demand.per_name_secs = u64::MAX
            }),
            ("acme.on_demand.wait_secs", |c| {
                c.on_demand.wait_secs = u64::MAX
            }),
        ];
        for (key, set) in cases {
            let mut c = base.clone();
            set(&mut c);
            if key == "acme.retry_min_secs" {
                c.retry_max_secs = u64::MAX;
            }
            let err = c.validate(&[]).unwrap_err().to_string();
            assert!(
                err.contains(key) && err.contains("at most 31536000"),
                "{key}: {err}"
            );
        }
        let mut c = base.clone();
        c.retry_max_secs = MAX_SECS;
        c.validate(&[]).unwrap();
    }

    #[test]
    fn names_and_checks() {
        let mut c = AcmeConfig {
            names: vec!["A.example.com".into(), "a.example.com".into()],
            challenges: vec![Challenge::TlsAlpn01],
            ..AcmeConfig::default()
        };
        assert_eq!(c.all_names(&[]), ["a.example.com"]);
        c.validate(&[]).unwrap();
        c.names.push("*.example.com".into());
        assert!(c.validate(&[]).unwrap_err().to_string().contains("dns-01"));
        c.names.pop();
        c.challenges.push(Challenge::Http01);
        assert!(c
            .validate(&[])
            .unwrap_err()
            .to_string()
            .contains("http_listen"));
        assert!(check_name("bad_name.example.com").is_err());
        assert!(check_name("localhost").is_err());
        assert!(check_name("*.x.example").is_ok());
        c.on_demand.enabled = true;
        c.challenges = vec![Challenge::TlsAlpn01];
        assert!(c.validate(&[]).unwrap_err().to_string().contains("ask"));
        c.on_demand.ask = Some("http://127.0.0.1:9/allowed?key=s3cret#x".into());
        let refused = c.validate(&[]).unwrap_err().to_string();
        assert!(refused.contains("fragment"), "{refused}");
        assert!(!refused.contains("s3cret"), "{refused}");
        c.on_demand.ask = Some("http://127.0.0.1:9/allowed?key=1".into());
        c.validate(&[]).unwrap();
        c.on_demand.enabled = false;
        c.routes = true;
        assert_eq!(
            c.all_names(&["r.example.com".into(), "*.w.example.com".into()]),
            ["a.example.com", "r.example.com"]
        );
    }
}
