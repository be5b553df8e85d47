//! The downstream cipher suite order: AES-128-GCM first, chosen by the server whatever order the
//! client lists (`docs/decisions/tls-cost.md`).
//!
//! A TLS 1.3 handshake under `TLS_AES_256_GCM_SHA384` runs its key schedule on SHA-384, whose
//! blocks cost about half again as much as SHA-256's, and every record after it pays 14 AES rounds
//! instead of 10; AES-128 is as safe for a web server (it is what browsers list first anyway).
//! Clients that list AES-256 first (OpenSSL's default, curl, most HTTP libraries) would otherwise
//! get the dearer suite.

use crate::crypto::backend::cipher_suite as suite;
use rustls::crypto::CryptoProvider;
use rustls::SupportedCipherSuite;

/// Every suite the provider offers by default, cheapest first within each protocol version.
const ORDER: &[SupportedCipherSuite] = &[
    suite::TLS13_AES_128_GCM_SHA256,
    suite::TLS13_AES_256_GCM_SHA384,
    suite::TLS13_CHACHA20_POLY1305_SHA256,
    suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    suite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    suite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    suite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    suite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
];

/// The build's provider (`crate::crypto`) with the suites in the server's order (set
/// `ignore_client_order` on the config that uses it).
pub fn provider() -> CryptoProvider {
    CryptoProvider {
        cipher_suites: ORDER.to_vec(),
        ..crate::crypto::default_provider()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reordering neither drops nor adds a suite.
    #[test]
    fn same_suites_as_the_provider() {
        let mut ours: Vec<_> = ORDER.iter().map(|s| s.suite()).collect();
        let mut theirs: Vec<_> = crate::crypto::backend::DEFAULT_CIPHER_SUITES
            .iter()
            .map(|s| s.suite())
            .collect();
        ours.sort_by_key(|s| u16::from(*s));
        theirs.sort_by_key(|s| u16::from(*s));
        assert_eq!(ours, theirs);
    }
}
