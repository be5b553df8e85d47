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
    sni_server_config_with(default, by_name, None).map(|(config, _)| config)
}

/// What a new set of settings tells ACME once it is put in use: the names its static
/// certificates cover (on-demand issuance leaves those alone). Called when the settings go live,
/// not when they are built, so a reload refused later changes nothing.
pub type Publish = Box<dyn FnOnce() + Send>;

/// [`sni_server_config`], plus the certificates ACME keeps (`acme`): after an exact static
/// name, before a static wildcard; and the TLS-ALPN-01 challenge certificates.
pub fn sni_server_config_with(
    default: Option<(&Path, &Path)>,
    by_name: &[CertConfig],
    acme: Option<Managed>,
) -> anyhow::Result<(Arc<ServerConfig>, Publish)> {
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
    let publish: Publish = match &acme {
        Some(certs) => {
            let (certs, exact, wildcards) = (
                certs.clone(),
                resolver.exact.keys().cloned().collect(),
                resolver.wildcard.iter().map(|w| w.0.clone()).collect(),
            );
            Box::new(move || certs.set_static(exact, wildcards))
        }
        None => Box::new(|| {}),
    };
    #[cfg(not(feature = "acme"))]
    let publish: Publish = Box::new(|| {});
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
    Ok((Arc::new(config), publish))
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
        let name = hello.server_name().map(str::to_ascii_lowercase);
        let challenge = hello
            .alpn()
            .is_some_and(|mut protocols| protocols.any(is_acme_alpn));
        self.pick(name.as_deref(), challenge)
    }
}

impl SniResolver {
    /// The certificate for server name `name` (lowercase): a static one for exactly that name,
    /// else one ACME holds for it, else the longest static `*.domain`, else the default. A
    /// TLS-ALPN-01 validation (`challenge`) gets the challenge certificate or nothing.
    /// A fully qualified name's one trailing dot (`a.example.com.`) is dropped first: it names
    /// the same host.
    fn pick(&self, name: Option<&str>, challenge: bool) -> Option<Arc<CertifiedKey>> {
        if let Some(name) = name.map(|n| n.strip_suffix('.').unwrap_or(n)) {
            #[cfg(feature = "acme")]
            if let Some(acme) = &self.acme {
                if challenge {
                    return acme.alpn_challenge(name);
                }
            }
            if let Some(c) = self.exact.get(name) {
                return Some(c.clone());
            }
            #[cfg(feature = "acme")]
            if let Some(c) = self.acme.as_ref().and_then(|a| a.certificate(name)) {
                return Some(c);
            }
            if let Some((_, c)) = self
                .wildcard
                .iter()
                .find(|(s, _)| sluice_http::host::under_wildcard(name, s))
            {
                return Some(c.clone());
            }
        }
        let _ = challenge;
        self.default.clone()
    }
}

/// Whether an ALPN protocol is TLS-ALPN-01's (`acme-tls/1`).
fn is_acme_alpn(protocol: &[u8]) -> bool {
    #[cfg(feature = "acme")]
    return protocol == crate::acme::ACME_TLS_ALPN;
    #[cfg(not(feature = "acme"))]
    {
        let _ = protocol;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::PrivatePkcs8KeyDer;

    /// A self-signed certificate for `name`, and its PEM bundle (chain then key, as ACME stores).
    fn cert(name: &str) -> (Arc<CertifiedKey>, Vec<u8>) {
        let made = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
        let provider = super::super::suites::provider();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(made.signing_key.serialize_der()));
        let signer = provider.key_provider.load_private_key(key).unwrap();
        let certified = CertifiedKey::new(vec![made.cert.der().clone()], signer);
        let pem = format!("{}{}", made.cert.pem(), made.signing_key.serialize_pem());
        (Arc::new(certified), pem.into_bytes())
    }

    fn is(got: Option<Arc<CertifiedKey>>, want: &Arc<CertifiedKey>) -> bool {
        got.is_some_and(|g| g.cert[0] == want.cert[0])
    }

    #[test]
    fn static_names_then_the_longest_wildcard_then_the_default() {
        let (default, _) = cert("default.test");
        let (exact, _) = cert("a.example.com");
        let (wide, _) = cert("*.example.com");
        let (narrow, _) = cert("*.deep.example.com");
        let mut r = SniResolver {
            default: Some(default.clone()),
            ..SniResolver::default()
        };
        r.exact.insert("a.example.com".into(), exact.clone());
        r.wildcard = vec![
            (".deep.example.com".into(), narrow.clone()),
            (".example.com".into(), wide.clone()),
        ];
        assert!(is(r.pick(Some("a.example.com"), false), &exact));
        assert!(is(r.pick(Some("b.example.com"), false), &wide));
        assert!(is(r.pick(Some("x.deep.example.com"), false), &narrow));
        // A wildcard covers one label.
        assert!(is(r.pick(Some("x.y.example.com"), false), &default));
        assert!(is(r.pick(Some("x.y.deep.example.com"), false), &default));
        // The bare domain is not under its own wildcard.
        assert!(is(r.pick(Some("example.com"), false), &default));
        assert!(is(r.pick(Some("other.test"), false), &default));
        assert!(is(r.pick(None, false), &default));
        let none = SniResolver::default();
        assert!(none.pick(Some("a.example.com"), false).is_none());
    }

    #[test]
    fn a_fully_qualified_name_with_its_trailing_dot_finds_the_same_certificate() {
        let (default, _) = cert("default.test");
        let (exact, _) = cert("a.example.com");
        let (wide, _) = cert("*.example.com");
        let mut r = SniResolver {
            default: Some(default.clone()),
            ..SniResolver::default()
        };
        r.exact.insert("a.example.com".into(), exact.clone());
        r.wildcard = vec![(".example.com".into(), wide.clone())];
        assert!(is(r.pick(Some("a.example.com."), false), &exact));
        assert!(is(r.pick(Some("b.example.com."), false), &wide));
        // One dot only: an empty last label is no name.
        assert!(is(r.pick(Some("a.example.com.."), false), &default));
        #[cfg(feature = "acme")]
        {
            let (issued, issued_pem) = cert("c.acme.test");
            let certs = Arc::new(crate::acme::Certs::default());
            let now = std::time::SystemTime::now();
            certs.install("c.acme.test", &issued_pem, now).unwrap();
            r.acme = Some(certs);
            assert!(is(r.pick(Some("c.acme.test."), false), &issued));
        }
    }

    #[cfg(feature = "acme")]
    #[test]
    fn acme_certificates_sit_between_exact_static_names_and_static_wildcards() {
        let (default, _) = cert("default.test");
        let (exact, _) = cert("a.example.com");
        let (wide, _) = cert("*.example.com");
        let (_, issued_a) = cert("a.example.com");
        let (issued_b, issued_b_pem) = cert("b.example.com");
        let (issued_star, issued_star_pem) = cert("*.acme.test");
        let certs = Arc::new(crate::acme::Certs::default());
        let now = std::time::SystemTime::now();
        certs.install("a.example.com", &issued_a, now).unwrap();
        certs.install("b.example.com", &issued_b_pem, now).unwrap();
        certs.install("*.acme.test", &issued_star_pem, now).unwrap();
        let mut r = SniResolver {
            default: Some(default.clone()),
            acme: Some(certs.clone()),
            ..SniResolver::default()
        };
        r.exact.insert("a.example.com".into(), exact.clone());
        r.wildcard = vec![(".example.com".into(), wide.clone())];
        // An exact static file wins over an issued certificate for the same name.
        assert!(is(r.pick(Some("a.example.com"), false), &exact));
        // An issued certificate wins over a static wildcard.
        assert!(is(r.pick(Some("b.example.com"), false), &issued_b));
        // An issued wildcard covers one label.
        assert!(is(r.pick(Some("x.acme.test"), false), &issued_star));
        assert!(is(r.pick(Some("x.y.acme.test"), false), &default));
        // A TLS-ALPN-01 validation gets the challenge certificate, never a served one.
        assert!(r.pick(Some("a.example.com"), true).is_none());
        certs
            .open_alpn_challenge("a.example.com", &[0u8; 32])
            .unwrap();
        let challenge = r.pick(Some("a.example.com"), true).unwrap();
        assert!(challenge.cert[0] != exact.cert[0]);
        assert!(challenge.cert[0] != issued_b.cert[0]);
    }
}
