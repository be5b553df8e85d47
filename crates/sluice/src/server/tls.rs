//! Downstream TLS: certificate and key from PEM files, ALPN h2 and http/1.1.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;

/// Loads a rustls server config from PEM files (read by `rustls-pki-types`; `rustls-pemfile` is
/// unmaintained, RUSTSEC-2025-0134).
pub fn server_config(cert: &Path, key: &Path) -> anyhow::Result<Arc<ServerConfig>> {
    let certs = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("opening {}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("reading certificates from {}", cert.display()))?;
    if certs.is_empty() {
        bail!("{} holds no PEM certificate", cert.display());
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("reading a PEM private key from {}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("certificate and key do not match")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
