//! A self-signed certificate and its key in temp files, for tests that serve or trust TLS.
#![allow(dead_code)]

use std::io::Write;

/// The certificate (PEM file and DER bytes) and key (PEM file); the files live as long as this.
pub struct SelfSigned {
    pub der: Vec<u8>,
    pub cert: tempfile::NamedTempFile,
    pub key: tempfile::NamedTempFile,
}

impl SelfSigned {
    /// A certificate for `names` (DNS names or IP addresses).
    pub fn new(names: &[&str]) -> SelfSigned {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let ck = rcgen::generate_simple_self_signed(names).unwrap();
        let mut cert = tempfile::NamedTempFile::new().unwrap();
        cert.write_all(ck.cert.pem().as_bytes()).unwrap();
        let mut key = tempfile::NamedTempFile::new().unwrap();
        key.write_all(ck.signing_key.serialize_pem().as_bytes())
            .unwrap();
        SelfSigned {
            der: ck.cert.der().to_vec(),
            cert,
            key,
        }
    }
}
