//! rustls server settings from PEM files, the certificate chosen by SNI (exact name, then the
//! longest `*.domain` wildcard, then the default certificate), ALPN h2 and http/1.1, the
//! server's cipher suite order (`suites`) and session resumption (`resume`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;

use super::CertConfig;

/// Loads a rustls server config with one certificate from PEM files.
pub fn server_config(cert: &Path, key: &Path) -> anyhow::Result<Arc<ServerConfig>> {
    sni_server_config(Some((cert, key)), &[])
}

/// Loads a rustls server config from PEM files: `default` (`server.tls_cert`/`tls_key`) when no
/// SNI name matches, and `by_name` chosen by SNI.
pub fn sni_server_config(
    default: Option<(&Path, &Path)>,
    by_name: &[CertConfig],
) -> anyhow::Result<Arc<ServerConfig>> {
    let provider = Arc::new(super::suites::provider());
    let load = |cert: &Path, key: &Path| -> anyhow::Result<Arc<CertifiedKey>> {
        // PEM read by `rustls-pki-types` (`rustls-pemfile` is unmaintained, RUSTSEC-2025-0134).
        let certs = CertificateDer::pem_file_iter(cert)
            .with_context(|| format!("opening {}", cert.display()))?
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("reading certificates from {}", cert.display()))?;
        if certs.is_empty() {
            bail!("{} holds no PEM certificate", cert.display());
        }
        let key_der = PrivateKeyDer::from_pem_file(key)
            .with_context(|| format!("reading a PEM private key from {}", key.display()))?;
        let signer = provider
            .key_provider
            .load_private_key(key_der)
            .with_context(|| format!("unusable private key in {}", key.display()))?;
        let certified = CertifiedKey::new(certs, signer);
        certified
            .keys_match()
            .with_context(|| format!("{} and {} do not match", cert.display(), key.display()))?;
        Ok(Arc::new(certified))
    };
    let mut resolver = SniResolver::default();
    if let Some((cert, key)) = default {
        resolver.default = Some(load(cert, key)?);
    }
    for entry in by_name {
        let certified = load(&entry.cert, &entry.key)?;
        if entry.names.is_empty() {
            bail!("certificate {} lists no names", entry.cert.display());
        }
        for name in &entry.names {
            let name = name.trim().to_ascii_lowercase();
            match name.strip_prefix("*.") {
                Some(domain) => resolver
                    .wildcard
                    .push((format!(".{domain}"), certified.clone())),
                None => {
                    resolver.exact.insert(name, certified.clone());
                }
            }
        }
    }
    resolver
        .wildcard
        .sort_by_key(|w| std::cmp::Reverse(w.0.len()));
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    config.ignore_client_order = true;
    super::resume::enable(&mut config);
    config.alpn_protocols = if cfg!(feature = "http2") {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    Ok(Arc::new(config))
}

/// Certificates by server name.
#[derive(Debug, Default)]
struct SniResolver {
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// `.domain` suffixes, longest first.
    wildcard: Vec<(String, Arc<CertifiedKey>)>,
    default: Option<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        if let Some(name) = hello.server_name() {
            let name = name.to_ascii_lowercase();
            if let Some(c) = self.exact.get(&name) {
                return Some(c.clone());
            }
            if let Some((_, c)) = self
                .wildcard
                .iter()
                .find(|(s, _)| name.len() > s.len() && name.ends_with(s.as_str()))
            {
                return Some(c.clone());
            }
        }
        self.default.clone()
    }
}
