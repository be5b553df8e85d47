//! TLS to the proxy under test: a rustls client that trusts one CA file, and how each connection
//! handshakes (kept alive, a full handshake per request, or a resumed one per request).

use anyhow::{bail, Context, Result};
use rustls::client::Resumption;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use std::path::Path;
use std::sync::Arc;

/// How often a connection handshakes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Handshake {
    /// One handshake, then keep-alive: the steady cost of encrypted requests.
    Keep,
    /// A new connection and a full handshake for every request (`Connection: close`, no
    /// resumption offered).
    Full,
    /// A new connection for every request, resuming the previous one's session (TLS 1.3 PSK
    /// from a ticket or a session ID, whichever the server issued).
    Resume,
}

/// What every TLS connection of a run shares.
#[derive(Debug)]
pub struct TlsClient {
    base: ClientConfig,
    shared: Arc<ClientConfig>,
    pub server_name: ServerName<'static>,
    pub handshake: Handshake,
}

impl TlsClient {
    /// Trusts the PEM certificates in `ca` and no other; offers `alpn` (`h2`, `http/1.1` or
    /// `h3`).
    pub fn new(ca: &Path, host: &str, handshake: Handshake, alpn: &[u8]) -> Result<Self> {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca)
            .with_context(|| format!("opening {}", ca.display()))?
        {
            roots.add(cert.with_context(|| format!("reading {}", ca.display()))?)?;
        }
        if roots.is_empty() {
            bail!("{} holds no certificate", ca.display());
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut base = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        base.alpn_protocols = vec![alpn.to_vec()];
        if handshake == Handshake::Full {
            base.resumption = Resumption::disabled();
        }
        let server_name = ServerName::try_from(host.to_string())
            .with_context(|| format!("bad TLS server name {host}"))?;
        Ok(TlsClient {
            shared: Arc::new(base.clone()),
            base,
            server_name,
            handshake,
        })
    }

    /// The config one connection uses. With `Resume` each connection keeps its own session
    /// store, so the ticket it got last time is there for its next handshake whatever the
    /// other connections took.
    pub fn config_for_connection(&self) -> Arc<ClientConfig> {
        if self.handshake == Handshake::Resume {
            let mut own = self.base.clone();
            own.resumption = Resumption::in_memory_sessions(4);
            Arc::new(own)
        } else {
            self.shared.clone()
        }
    }
}
