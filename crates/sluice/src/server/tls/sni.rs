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
    sni_server_config_with(default, by_name, None)
}

/// [`sni_server_config`], plus the certificates ACME keeps (`acme`): after an exact static
/// name, before a static wildcard; and the TLS-ALPN-01 challenge certificates.
pub fn sni_server_config_with(
    default: Option<(&Path, &Path)>,
    by_name: &[CertConfig],
    acme: Option<Managed>,
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
    #[cfg(feature = "acme")]
    if let Some(certs) = &acme {
        certs.set_static(
            resolver.exact.keys().cloned().collect(),
            resolver.wildcard.iter().map(|w| w.0.clone()).collect(),
        );
    }
    let acme_on = acme.is_some();
    resolver.acme = acme;
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
    // Offered by the CA's validation only (RFC 8737); no browser asks for it.
    #[cfg(feature = "acme")]
    if acme_on {
        config
            .alpn_protocols
            .push(crate::acme::ACME_TLS_ALPN.to_vec());
    }
    #[cfg(not(feature = "acme"))]
    let _ = acme_on;
    Ok(Arc::new(config))
}

/// The certificates ACME keeps, when the build has it.
#[cfg(feature = "acme")]
pub type Managed = Arc<crate::acme::Certs>;
#[cfg(not(feature = "acme"))]
pub type Managed = std::convert::Infallible;

/// Certificates by server name.
#[derive(Default)]
struct SniResolver {
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// `.domain` suffixes, longest first.
    wildcard: Vec<(String, Arc<CertifiedKey>)>,
    default: Option<Arc<CertifiedKey>>,
    #[cfg_attr(not(feature = "acme"), allow(dead_code))]
    acme: Option<Managed>,
}

impl std::fmt::Debug for SniResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SniResolver")
            .field("exact", &self.exact.keys())
            .field("acme", &self.acme.is_some())
            .finish()
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        if let Some(name) = hello.server_name() {
            let name = name.to_ascii_lowercase();
            #[cfg(feature = "acme")]
            if let Some(acme) = &self.acme {
                // A TLS-ALPN-01 validation gets the challenge certificate or nothing.
                let challenge = hello.alpn().is_some_and(|mut protocols| {
                    protocols.any(|p| p == crate::acme::ACME_TLS_ALPN)
                });
                if challenge {
                    return acme.alpn_challenge(&name);
                }
            }
            if let Some(c) = self.exact.get(&name) {
                return Some(c.clone());
            }
            #[cfg(feature = "acme")]
            if let Some(c) = self.acme.as_ref().and_then(|a| a.certificate(&name)) {
                return Some(c);
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
