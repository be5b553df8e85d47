//! Downstream TLS: certificates and keys from PEM files, chosen by SNI (exact name, then the longest
//! `*.domain` wildcard, then the default certificate), ALPN h2 and http/1.1, session resumption
//! (rotating tickets and a session-ID cache) on by default.
//!
//! The config type is always built, so one config file serves every build; the rustls part
//! (`sni`) only with the `tls` feature.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[cfg(feature = "tls")]
mod capture;
#[cfg(feature = "tls")]
mod framed;
#[cfg(feature = "tls")]
mod own;
#[cfg(feature = "tls")]
mod record;
#[cfg(feature = "tls")]
pub(crate) mod resume;
#[cfg(feature = "tls")]
mod seal;
#[cfg(feature = "tls")]
mod sni;
#[cfg(feature = "tls")]
mod stream;
#[cfg(feature = "tls")]
mod suites;
#[cfg(feature = "tls")]
pub use capture::capture;
#[cfg(feature = "tls")]
pub use framed::Framed;
#[cfg(feature = "tls")]
pub use sni::{server_config, sni_server_config, sni_server_config_with, Managed, Publish};
#[cfg(feature = "tls")]
pub use stream::ServerTls;

/// Lets the listeners' TLS connections continue on sluice's own record layer after a TLS 1.3
/// handshake (`own`): rustls keeps the traffic keys for the takeover, and the key log passes the
/// traffic secrets to the handshake being polled (`capture`), never to a file.
#[cfg(feature = "tls")]
pub fn own_record_layer(config: &mut rustls::ServerConfig) {
    config.enable_secret_extraction = true;
    config.key_log = std::sync::Arc::new(capture::KeepTrafficSecrets);
}

/// One `[[server.certificates]]` entry: a certificate served for the names listed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CertConfig {
    /// Server names (`example.com` or `*.example.com`) this certificate is chosen for.
    pub names: Vec<String>,
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
}
