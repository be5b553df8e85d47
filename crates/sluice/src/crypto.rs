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

/// The HMAC-SHA256 key QUIC's stateless-reset tokens are made with (`server::quic`).
#[cfg(feature = "http3")]
pub fn quic_reset_key(secret: &[u8]) -> std::sync::Arc<dyn quinn::crypto::HmacKey> {
    #[cfg(feature = "aws-lc")]
    use aws_lc_rs::hmac;
    #[cfg(all(feature = "ring", not(feature = "aws-lc")))]
    use ring::hmac;
    std::sync::Arc::new(hmac::Key::new(hmac::HMAC_SHA256, secret))
}
