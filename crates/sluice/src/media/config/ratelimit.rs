//! `[media.ratelimit]`: per-host pacing of upstream requests for fragile CDNs (`media::pace`
//! applies it).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Longest interval a client may ask for with `ratelimit=<ms>`, and an operator may configure.
pub const MAX_INTERVAL_MS: u64 = 60_000;

/// `[media.ratelimit]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitConfig {
    /// Hosts always paced, whatever the request says: a domain (it and its subdomains) →
    /// milliseconds between the starts of two requests to one host.
    pub hosts: BTreeMap<String, u64>,
    /// Longest a request waits for its turn; past it the answer is 503 with `Retry-After`.
    pub max_wait_secs: u64,
    /// Hosts whose pacing state is kept at once. Idle hosts are forgotten first; when every
    /// entry is busy, a request to yet another paced host gets a 503.
    pub max_hosts: usize,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        RateLimitConfig {
            // MediaFlow paces this hoster without being asked; so does sluice.
            hosts: BTreeMap::from([("vidoza.net".to_string(), 5_000)]),
            max_wait_secs: 30,
            max_hosts: 4096,
        }
    }
}

impl RateLimitConfig {
    /// Checks the values before anything binds.
    pub fn validate(&self) -> anyhow::Result<()> {
        for (host, ms) in &self.hosts {
            let plain = !host.is_empty()
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
            if !plain || host.starts_with('.') || host.ends_with('.') {
                anyhow::bail!(
                    "media.ratelimit.hosts: `{host}` is not a host name (write `cdn.example`, \
                     no scheme, port or wildcard; subdomains are included)"
                );
            }
            if *ms == 0 || *ms > MAX_INTERVAL_MS {
                anyhow::bail!(
                    "media.ratelimit.hosts.\"{host}\": {ms} ms is out of range 1..={MAX_INTERVAL_MS}"
                );
            }
        }
        // At least 2: a request paced both ways holds its own entry and the host's. At most
        // 65,536: idle entries are forgotten under the table's lock, and each costs about a
        // kilobyte with its indexes.
        if !(2..=MAX_HOSTS).contains(&self.max_hosts) {
            anyhow::bail!("media.ratelimit.max_hosts must be in 2..={MAX_HOSTS}");
        }
        if self.max_wait_secs > 600 {
            anyhow::bail!("media.ratelimit.max_wait_secs must be at most 600");
        }
        Ok(())
    }
}

/// The most pacing entries a config may ask for.
const MAX_HOSTS: usize = 65_536;

#[cfg(test)]
mod tests {
    use super::*;

    /// One entry cannot pace a request both ways (its own and the host's), and a table of
    /// millions would be swept under its lock.
    #[test]
    fn max_hosts_is_in_range() {
        for (n, ok) in [
            (0, false),
            (1, false),
            (2, true),
            (65_536, true),
            (65_537, false),
        ] {
            let c = RateLimitConfig {
                max_hosts: n,
                ..Default::default()
            };
            assert_eq!(c.validate().is_ok(), ok, "max_hosts = {n}");
        }
    }

    fn with(host: &str, ms: u64) -> RateLimitConfig {
        RateLimitConfig {
            hosts: BTreeMap::from([(host.to_string(), ms)]),
            ..Default::default()
        }
    }

    #[test]
    fn hosts_are_plain_names_with_sane_intervals() {
        assert!(RateLimitConfig::default().validate().is_ok());
        assert!(with("cdn-3.example", 250).validate().is_ok());
        for bad in [
            "https://cdn.example",
            "cdn.example:443",
            "*.cdn.example",
            ".cdn",
            "",
        ] {
            let e = with(bad, 250).validate().unwrap_err().to_string();
            assert!(e.contains("is not a host name"), "{bad}: {e}");
        }
        assert!(with("cdn.example", 0).validate().is_err());
        assert!(with("cdn.example", MAX_INTERVAL_MS + 1).validate().is_err());
        let toml = "hosts = { \"a.example\" = 100 }\nmax_wait_secs = 5\nbogus = 1\n";
        assert!(toml::from_str::<RateLimitConfig>(toml).is_err());
    }
}
