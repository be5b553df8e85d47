//! The TLS crypto provider this build uses, for every rustls config sluice makes (listeners,
//! QUIC, upstream TLS, the ACME client): aws-lc-rs with the `aws-lc` feature (the default), ring
//! with `ring` instead (`docs/decisions/tls-cost.md`).

#[cfg(not(any(feature = "aws-lc", feature = "ring")))]
compile_error!(
    "TLS needs a crypto provider: enable the `aws-lc` feature (the default) or `ring` \
     (for example `--no-default-features --features reverse,ring`)"
);

/// The crypto backend itself: aws-lc-rs when the build has it, ring otherwise.
#[cfg(feature = "aws-lc")]
pub use rustls::crypto::aws_lc_rs as backend;
#[cfg(all(feature = "ring", not(feature = "aws-lc")))]
pub use rustls::crypto::ring as backend;

/// The provider with its default suites, key exchange groups and signature checks.
pub fn default_provider() -> rustls::crypto::CryptoProvider {
    backend::default_provider()
}

/// Stateless session tickets under a fresh random key that rotates (rustls' `Ticketer`).
pub fn ticketer() -> Result<std::sync::Arc<dyn rustls::server::ProducesTickets>, rustls::Error> {
    backend::Ticketer::new()
}

/// The HMAC-SHA256 key QUIC's stateless-reset tokens are made with (`server::quic`), on this
/// build's provider (quinn's own implementation follows quinn's crypto features, which another
/// crate in the build may set otherwise).
#[cfg(feature = "http3")]
pub fn quic_reset_key(secret: &[u8]) -> std::sync::Arc<dyn quinn::crypto::HmacKey> {
    std::sync::Arc::new(ResetKey(hmac::Key::new(hmac::HMAC_SHA256, secret)))
}

#[cfg(all(feature = "http3", feature = "aws-lc"))]
use aws_lc_rs::hmac;
#[cfg(all(feature = "http3", feature = "ring", not(feature = "aws-lc")))]
use ring::hmac;

#[cfg(feature = "http3")]
struct ResetKey(hmac::Key);

#[cfg(feature = "http3")]
impl quinn::crypto::HmacKey for ResetKey {
    fn sign(&self, data: &[u8], out: &mut [u8]) {
        out.copy_from_slice(hmac::sign(&self.0, data).as_ref());
    }

    fn signature_len(&self) -> usize {
        32
    }

    fn verify(&self, data: &[u8], signature: &[u8]) -> Result<(), quinn::crypto::CryptoError> {
        hmac::verify(&self.0, data, signature).map_err(|_| quinn::crypto::CryptoError)
    }
}
