//! Downstream TLS: certificate and key from PEM files, ALPN h2 and http/1.1.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};
use rustls::ServerConfig;

/// Loads a rustls server config from PEM files.
pub fn server_config(cert: &Path, key: &Path) -> anyhow::Result<Arc<ServerConfig>> {
    let certs = rustls_pemfile::certs(&mut std::io::BufReader::new(
        std::fs::File::open(cert).with_context(|| format!("opening {}", cert.display()))?,
    ))
    .collect::<Result<Vec<_>, _>>()
    .with_context(|| format!("reading certificates from {}", cert.display()))?;
    if certs.is_empty() {
        bail!("{} holds no PEM certificate", cert.display());
    }
    let key = rustls_pemfile::private_key(&mut std::io::BufReader::new(
        std::fs::File::open(key).with_context(|| format!("opening {}", key.display()))?,
    ))
    .with_context(|| format!("reading private key from {}", key.display()))?
    .with_context(|| format!("{} holds no PEM private key", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("certificate and key do not match")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
