//! rustls client settings: webpki, system and operator (`upstream.ca_file`) roots, ALPN (`http/1.1`,
//! plus `h2` when HTTP/2 upstreams are on), and a verification opt-out for hosts the operator names.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// The certificates of a PEM CA file; an unreadable file or one without certificates is an error
/// at start, not a TLS failure on the first request.
pub fn load_ca_file(path: &std::path::Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    use anyhow::Context;
    use rustls::pki_types::pem::PemObject;
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("opening upstream.ca_file {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("reading upstream.ca_file {}", path.display()))?;
    anyhow::ensure!(
        !certs.is_empty(),
        "upstream.ca_file {} holds no PEM certificate",
        path.display()
    );
    Ok(certs)
}

/// Bundled webpki roots, the system's roots (so a CA the operator installed system-wide works) and
/// the operator's `extra` CAs.
fn roots(extra: &[CertificateDer<'static>]) -> RootCertStore {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let system = rustls_native_certs::load_native_certs();
    for e in &system.errors {
        tracing::debug!(error = %e, "system root certificates: partly unreadable");
    }
    roots.add_parsable_certificates(system.certs);
    for cert in extra {
        if let Err(e) = roots.add(cert.clone()) {
            tracing::warn!(error = %e, "upstream.ca_file: a certificate is not a usable CA");
        }
    }
    roots
}

/// A client config; `verify = false` accepts any certificate (per-host opt-out only); `http2`
/// offers `h2` before `http/1.1`.
pub fn client_config(
    verify: bool,
    http2: bool,
    extra_roots: &[CertificateDer<'static>],
) -> Arc<ClientConfig> {
    let provider = Arc::new(crate::crypto::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("the provider supports the default protocol versions");
    let mut config = if verify {
        builder
            .with_root_certificates(roots(extra_roots))
            .with_no_client_auth()
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
            .with_no_client_auth()
    };
    config.alpn_protocols = if http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    Arc::new(config)
}

/// Accepts every certificate but still checks handshake signatures.
#[derive(Debug)]
struct AcceptAny(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
