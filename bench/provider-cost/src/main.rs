//! What a TLS 1.3 server's handshake costs in each crypto provider, primitive by primitive: an
//! X25519 key share plus agreement (the server's part of the key exchange), an ECDSA P-256 and
//! an RSA-2048 (PSS) signature (its CertificateVerify).
//!
//! `provider-cost <ring|aws-lc> <x25519|p256|rsa> N` runs N of one primitive, so callgrind can
//! count each alone; it prints the wall time per operation too (noisy on a shared machine).

use std::time::Instant;

const MSG: [u8; 130] = [7; 130];

mod with_ring {
    use ring::{agreement, rand, signature};

    pub fn x25519(peer_public: &[u8]) {
        let rng = rand::SystemRandom::new();
        let mine = agreement::EphemeralPrivateKey::generate(&agreement::X25519, &rng).unwrap();
        let _share = mine.compute_public_key().unwrap();
        let peer = agreement::UnparsedPublicKey::new(&agreement::X25519, peer_public);
        agreement::agree_ephemeral(mine, &peer, |k| k.len()).unwrap();
    }

    pub fn p256(pkcs8: &[u8]) -> impl Fn() {
        let rng = rand::SystemRandom::new();
        let key = signature::EcdsaKeyPair::from_pkcs8(
            &signature::ECDSA_P256_SHA256_ASN1_SIGNING,
            pkcs8,
            &rng,
        )
        .unwrap();
        move || {
            key.sign(&rng, &super::MSG).unwrap();
        }
    }

    pub fn rsa(pkcs8: &[u8]) -> impl Fn() {
        let rng = rand::SystemRandom::new();
        let key = ring::rsa::KeyPair::from_pkcs8(pkcs8).unwrap();
        move || {
            let mut sig = vec![0; key.public().modulus_len()];
            key.sign(&signature::RSA_PSS_SHA256, &rng, &super::MSG, &mut sig)
                .unwrap();
        }
    }
}

mod with_aws_lc {
    use aws_lc_rs::{agreement, error, rand, signature};

    pub fn x25519(peer_public: &[u8]) {
        let rng = rand::SystemRandom::new();
        let mine = agreement::EphemeralPrivateKey::generate(&agreement::X25519, &rng).unwrap();
        let _share = mine.compute_public_key().unwrap();
        let peer = agreement::UnparsedPublicKey::new(&agreement::X25519, peer_public);
        agreement::agree_ephemeral(mine, &peer, error::Unspecified, |k| Ok(k.len())).unwrap();
    }

    pub fn p256(pkcs8: &[u8]) -> impl Fn() {
        let rng = rand::SystemRandom::new();
        let key =
            signature::EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8)
                .unwrap();
        move || {
            key.sign(&rng, &super::MSG).unwrap();
        }
    }

    pub fn rsa(pkcs8: &[u8]) -> impl Fn() {
        let rng = rand::SystemRandom::new();
        let key = aws_lc_rs::rsa::KeyPair::from_pkcs8(pkcs8).unwrap();
        move || {
            let mut sig = vec![0; key.public_modulus_len()];
            key.sign(&signature::RSA_PSS_SHA256, &rng, &super::MSG, &mut sig)
                .unwrap();
        }
    }
}

fn key(var: &str) -> Vec<u8> {
    let path = std::env::var(var).unwrap_or_else(|_| panic!("{var}: a PKCS#8 DER key file"));
    std::fs::read(path).unwrap()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (provider, op) = (args[0].as_str(), args[1].as_str());
    let n: u32 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(1000);
    // Any valid X25519 public key stands for the client's share.
    let peer = [9u8; 32];
    let run: Box<dyn Fn()> = match (provider, op) {
        ("ring", "x25519") => Box::new(move || with_ring::x25519(&peer)),
        ("ring", "p256") => Box::new(with_ring::p256(&key("EC_PKCS8"))),
        ("ring", "rsa") => Box::new(with_ring::rsa(&key("RSA_PKCS8"))),
        ("aws-lc", "x25519") => Box::new(move || with_aws_lc::x25519(&peer)),
        ("aws-lc", "p256") => Box::new(with_aws_lc::p256(&key("EC_PKCS8"))),
        ("aws-lc", "rsa") => Box::new(with_aws_lc::rsa(&key("RSA_PKCS8"))),
        _ => panic!("usage: provider-cost <ring|aws-lc> <x25519|p256|rsa> N"),
    };
    let start = Instant::now();
    for _ in 0..n {
        run();
    }
    println!(
        "{provider} {op}: {:.1} µs per operation",
        start.elapsed().as_secs_f64() * 1e6 / f64::from(n)
    );
}
