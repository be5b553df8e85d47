//! `[media.public_ip]`: the echo services `/proxy/ip` asks for the server's public address
//! (`media::public_ip` asks them).

use serde::{Deserialize, Serialize};

/// One echo service: a URL answering with the caller's address.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct EchoService {
    /// `http(s)://` URL fetched with GET.
    pub url: String,
    /// Top-level JSON field that holds the address; empty when the body is the address as text.
    #[serde(default)]
    pub field: String,
}

/// `[media.public_ip]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct PublicIpConfig {
    /// Asked in order until one answers with an address.
    pub services: Vec<EchoService>,
    /// Seconds a found address is served from memory before the services are asked again.
    pub cache_secs: u64,
    /// Seconds one service gets to answer before the next is tried.
    pub timeout_secs: u64,
}

impl Default for PublicIpConfig {
    fn default() -> Self {
        let service = |url: &str, field: &str| EchoService {
            url: url.into(),
            field: field.into(),
        };
        PublicIpConfig {
            // The services MediaFlow asks, in its order.
            services: vec![
                service("https://api.ipify.org", ""),
                service("https://ipinfo.io/json", "ip"),
                service("https://httpbin.org/ip", "origin"),
            ],
            cache_secs: 300,
            timeout_secs: 5,
        }
    }
}

impl PublicIpConfig {
    /// Checks the values before anything binds.
    pub fn validate(&self) -> anyhow::Result<()> {
        for (i, s) in self.services.iter().enumerate() {
            let url = url::Url::parse(&s.url)
                .map_err(|e| anyhow::anyhow!("media.public_ip.services[{i}].url: {e}"))?;
            if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
                anyhow::bail!(
                    "media.public_ip.services[{i}].url must be an http(s) URL with a host"
                );
            }
        }
        if self.timeout_secs == 0 {
            anyhow::bail!("media.public_ip.timeout_secs must be at least 1");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_must_be_http_urls() {
        assert!(PublicIpConfig::default().validate().is_ok());
        let mut c = PublicIpConfig::default();
        c.services[1].url = "ftp://ip.example/".into();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("services[1]"), "{e}");
        let parsed: PublicIpConfig =
            toml::from_str("services = [{ url = \"http://127.0.0.1:1/ip\", field = \"ip\" }]")
                .unwrap();
        assert_eq!(parsed.services[0].field, "ip");
        assert_eq!(parsed.cache_secs, 300);
        assert!(
            toml::from_str::<PublicIpConfig>("services = [{ url = \"x\", json = 1 }]").is_err()
        );
    }
}
