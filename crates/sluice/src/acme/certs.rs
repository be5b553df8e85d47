//! The certificates held in memory: issued ones by name (what the SNI resolver serves), the
//! TLS-ALPN-01 challenge certificates, and the HTTP-01 key authorizations by token (both also
//! recorded in the state directory, where other nodes read them).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;

use super::store::Store;

/// The ALPN protocol of TLS-ALPN-01 (RFC 8737 section 6.2).
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// One issued certificate in use.
#[derive(Debug)]
pub struct Held {
    pub key: Arc<CertifiedKey>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    /// The stored file's modification time when this was read (a newer file is re-read).
    pub modified: SystemTime,
}

impl Held {
    /// When a renewal is due without ARI: `remaining` (a fraction) of the lifetime left.
    pub fn renew_at(&self, remaining: f64) -> SystemTime {
        let life = self
            .not_after
            .duration_since(self.not_before)
            .unwrap_or_default();
        self.not_after - life.mul_f64(remaining)
    }
}

/// The live certificates; cheap to read on every handshake.
pub struct Certs {
    provider: Arc<CryptoProvider>,
    /// Names the static certificate files cover (exact names, `.domain` suffixes), so on-demand
    /// issuance leaves them alone.
    static_names: RwLock<(Vec<String>, Vec<String>)>,
    issued: RwLock<HashMap<String, Arc<Held>>>,
    alpn_challenges: Mutex<HashMap<String, Arc<CertifiedKey>>>,
    /// Challenge certificates built from another node's records (digest and certificate), by
    /// name; refreshed or dropped at each validation handshake for the name.
    borrowed_alpn: Mutex<HashMap<String, Borrowed>>,
    http_tokens: Mutex<HashMap<String, String>>,
    /// The state directory challenges are shared through, when there is one.
    store: Option<Store>,
}

impl Default for Certs {
    fn default() -> Self {
        Certs {
            provider: Arc::new(crate::crypto::default_provider()),
            static_names: RwLock::default(),
            issued: RwLock::default(),
            alpn_challenges: Mutex::default(),
            borrowed_alpn: Mutex::default(),
            http_tokens: Mutex::default(),
            store: None,
        }
    }
}

impl Certs {
    /// Certificates whose challenges (HTTP-01 and TLS-ALPN-01) are shared through `store`'s
    /// directory with the other nodes using it.
    pub fn sharing(store: Store) -> Certs {
        Certs {
            store: Some(store),
            ..Certs::default()
        }
    }

    /// The certificate for a TLS server name: the name itself, else `*.` its parent.
    pub fn certificate(&self, server_name: &str) -> Option<Arc<CertifiedKey>> {
        self.issued_for(server_name).map(|h| h.key.clone())
    }

    fn issued_for(&self, server_name: &str) -> Option<Arc<Held>> {
        let issued = self.issued.read().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = issued.get(server_name) {
            return Some(h.clone());
        }
        let (_, parent) = server_name.split_once('.')?;
        issued.get(&format!("*.{parent}")).cloned()
    }

    /// Records what the static certificate files cover (when TLS settings built with them go
    /// live: `tls::Publish`).
    pub fn set_static(&self, exact: Vec<String>, suffixes: Vec<String>) {
        *self.static_names.write().unwrap_or_else(|e| e.into_inner()) = (exact, suffixes);
    }

    /// Whether a certificate covers `server_name` at `now`: a static one, or an issued one not
    /// expired. (An expired one is still served while nothing replaces it: a client then sees
    /// why it fails.)
    pub fn covers(&self, server_name: &str, now: SystemTime) -> bool {
        if self
            .issued_for(server_name)
            .is_some_and(|h| h.not_after > now)
        {
            return true;
        }
        let s = self.static_names.read().unwrap_or_else(|e| e.into_inner());
        s.0.iter().any(|n| n == server_name)
            || s.1
                .iter()
                .any(|d| sluice_http::host::under_wildcard(server_name, d))
    }

    /// The held certificate of a configured name (`*.example.com` for a wildcard).
    pub fn held(&self, name: &str) -> Option<Arc<Held>> {
        let issued = self.issued.read().unwrap_or_else(|e| e.into_inner());
        issued.get(name).cloned()
    }

    /// Every held name with its expiry.
    pub fn expiries(&self) -> Vec<(String, SystemTime)> {
        let issued = self.issued.read().unwrap_or_else(|e| e.into_inner());
        issued
            .iter()
            .map(|(n, h)| (n.clone(), h.not_after))
            .collect()
    }

    /// Puts a certificate (PEM chain then key, as stored) in use for `name`; new handshakes get it.
    pub fn install(&self, name: &str, pem: &[u8], modified: SystemTime) -> anyhow::Result<()> {
        let held = parse_bundle(pem, &self.provider, modified)?;
        let mut issued = self.issued.write().unwrap_or_else(|e| e.into_inner());
        issued.insert(name.to_string(), Arc::new(held));
        Ok(())
    }

    /// Puts a stored certificate (another node's, or one left from before) in use for `name`
    /// if it is one for `name`: the leaf names it. An expired one replaces none held (one held
    /// is newer or still good); with none held it is served until an order replaces it, as
    /// any expired certificate is.
    pub fn install_stored(
        &self,
        name: &str,
        pem: &[u8],
        modified: SystemTime,
        now: SystemTime,
    ) -> anyhow::Result<()> {
        let stored = parse_bundle(pem, &self.provider, modified)?;
        names(&stored, name)?;
        let mut issued = self.issued.write().unwrap_or_else(|e| e.into_inner());
        if stored.not_after <= now && issued.contains_key(name) {
            bail!("the certificate has expired; the one held is kept");
        }
        issued.insert(name.to_string(), Arc::new(stored));
        Ok(())
    }

    /// Checks a bundle the CA issued for `name` before it is stored: the chain and key parse and
    /// match, and the leaf names `name` and has not expired at `now`.
    pub fn check_issued(&self, name: &str, pem: &[u8], now: SystemTime) -> anyhow::Result<()> {
        let held = parse_bundle(pem, &self.provider, now)?;
        if held.not_after <= now {
            bail!("the certificate has expired");
        }
        names(&held, name)
    }

    /// The TLS-ALPN-01 certificate for `server_name`, while its challenge is open here or
    /// (borrowed) on another node sharing the state directory.
    pub fn alpn_challenge(&self, server_name: &str) -> Option<Arc<CertifiedKey>> {
        let own = self
            .alpn_challenges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(server_name)
            .cloned();
        own.or_else(|| {
            let borrowed = self.borrowed_alpn.lock().unwrap_or_else(|e| e.into_inner());
            borrowed.get(server_name).map(|(_, c, _)| c.clone())
        })
    }

    /// Whether this process has a TLS-ALPN-01 challenge open for `name`.
    pub fn has_own_alpn_challenge(&self, name: &str) -> bool {
        self.alpn_challenges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(name)
    }

    /// A self-signed certificate for `name` carrying the `acmeIdentifier` extension with the
    /// key authorization's SHA-256 (RFC 8737 section 3).
    fn alpn_certificate(&self, name: &str, digest: &[u8]) -> anyhow::Result<Arc<CertifiedKey>> {
        let mut params = rcgen::CertificateParams::new(vec![name.to_string()])?;
        params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(digest)];
        let key = rcgen::KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signer = self.provider.key_provider.load_private_key(der)?;
        Ok(Arc::new(CertifiedKey::new(
            vec![cert.der().clone()],
            signer,
        )))
    }

    /// Opens a TLS-ALPN-01 challenge for `name`; with a state directory, records it there for
    /// the other nodes (a file write: call it off the runtime's threads).
    pub fn open_alpn_challenge(&self, name: &str, digest: &[u8]) -> anyhow::Result<()> {
        let certified = self.alpn_certificate(name, digest)?;
        self.alpn_challenges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), certified);
        if let Some(store) = &self.store {
            if let Err(e) = store.write_alpn_digest(name, digest) {
                // This node still answers; others behind the same address do not.
                tracing::warn!(%name, error = %e, "acme: TLS-ALPN-01 challenge not shared in the state directory");
            }
        }
        Ok(())
    }

    /// Closes a TLS-ALPN-01 challenge (a file removal with a state directory: call it off the
    /// runtime's threads).
    pub fn close_alpn_challenge(&self, name: &str) {
        self.alpn_challenges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        if let Some(store) = &self.store {
            store.remove_alpn_digest(name);
        }
    }

    /// Takes up (or lets go of) another node's open TLS-ALPN-01 challenge for `name` from the
    /// state directory, before a validation handshake for it is answered. Reads a file: call it
    /// off the runtime's threads. At most `MAX_BORROWED` names are held at once: past it, the
    /// one taken up longest ago goes (a CA validates a name within minutes, then not again
    /// until its renewal, so an entry left behind is never looked at again).
    pub fn borrow_alpn_challenge(&self, name: &str) {
        let Some(store) = &self.store else {
            return;
        };
        let Some(digest) = store.read_alpn_digest(name) else {
            self.borrowed_alpn
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(name);
            return;
        };
        let current = {
            let borrowed = self.borrowed_alpn.lock().unwrap_or_else(|e| e.into_inner());
            borrowed.get(name).is_some_and(|(d, _, _)| *d == digest)
        };
        if current {
            return;
        }
        match self.alpn_certificate(name, &digest) {
            Ok(certified) => {
                let mut borrowed = self.borrowed_alpn.lock().unwrap_or_else(|e| e.into_inner());
                if borrowed.len() >= MAX_BORROWED && !borrowed.contains_key(name) {
                    let oldest = borrowed
                        .iter()
                        .min_by_key(|(_, (_, _, at))| *at)
                        .map(|(n, _)| n.clone());
                    if let Some(oldest) = oldest {
                        borrowed.remove(&oldest);
                    }
                }
                let now = std::time::Instant::now();
                borrowed.insert(name.to_string(), (digest, certified, now));
            }
            Err(e) => tracing::warn!(%name, error = %e, "acme: TLS-ALPN-01 certificate not built"),
        }
    }

    /// The HTTP-01 answer for `token`, while this process's challenge is open.
    pub fn http_token(&self, token: &str) -> Option<String> {
        let open = self.http_tokens.lock().unwrap_or_else(|e| e.into_inner());
        open.get(token).cloned()
    }

    /// Whether answers other nodes placed can be looked up ([`Certs::shared_http_token`]).
    pub fn shares_http_tokens(&self) -> bool {
        self.store.is_some()
    }

    /// The HTTP-01 answer another node sharing the state directory (or the process before a
    /// binary upgrade) recorded for `token`. Reads a file: call it off the runtime's threads.
    pub fn shared_http_token(&self, token: &str) -> Option<String> {
        self.store.as_ref()?.read_http_token(token)
    }

    /// Opens an HTTP-01 challenge; with a state directory, writes a file there: call it off
    /// the runtime's threads.
    pub fn open_http_token(&self, token: &str, key_authorization: &str) {
        self.http_tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(token.to_string(), key_authorization.to_string());
        if let Some(store) = &self.store {
            if let Err(e) = store.write_http_token(token, key_authorization) {
                // This node still answers; others behind the same address do not.
                tracing::warn!(error = %e, "acme: HTTP-01 answer not shared in the state directory");
            }
        }
    }

    /// Closes an HTTP-01 challenge; with a state directory, removes its file: call it off the
    /// runtime's threads.
    pub fn close_http_token(&self, token: &str) {
        self.http_tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(token);
        if let Some(store) = &self.store {
            store.remove_http_token(token);
        }
    }
}

/// Another node's TLS-ALPN-01 challenge: the recorded digest, the certificate built from it,
/// and when it was taken up.
type Borrowed = (Vec<u8>, Arc<CertifiedKey>, std::time::Instant);

/// Challenge certificates borrowed from other nodes held at once; a further name takes the
/// place of the one taken up longest ago.
const MAX_BORROWED: usize = 256;

/// Whether `held`'s leaf names `name` (a DNS name among its subject alternative names).
fn names(held: &Held, name: &str) -> anyhow::Result<()> {
    let leaf = held.key.cert.first().context("no certificate")?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref())
        .map_err(|e| anyhow::anyhow!("unreadable certificate: {e}"))?;
    let names = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|g| match g {
                    x509_parser::extensions::GeneralName::DNSName(n) => Some(*n),
                    _ => None,
                })
                .any(|n| n.eq_ignore_ascii_case(name))
        })
        .unwrap_or(false);
    if !names {
        bail!("the certificate does not name {name}");
    }
    Ok(())
}

/// Reads a stored bundle: the certificate chain, then the private key.
fn parse_bundle(
    pem: &[u8],
    provider: &CryptoProvider,
    modified: SystemTime,
) -> anyhow::Result<Held> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .context("reading the certificate chain")?;
    let Some(leaf) = chain.first() else {
        bail!("no certificate in the file");
    };
    let (not_before, not_after) = validity(leaf)?;
    let key = PrivateKeyDer::from_pem_slice(pem).context("reading the private key")?;
    let signer = provider
        .key_provider
        .load_private_key(key)
        .context("unusable private key")?;
    let certified = CertifiedKey::new(chain, signer);
    certified
        .keys_match()
        .context("the key does not match the certificate")?;
    Ok(Held {
        key: Arc::new(certified),
        not_before,
        not_after,
        modified,
    })
}

/// A certificate's `notBefore` and `notAfter`.
pub fn validity(leaf: &CertificateDer<'_>) -> anyhow::Result<(SystemTime, SystemTime)> {
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref())
        .map_err(|e| anyhow::anyhow!("unreadable certificate: {e}"))?;
    let at = |t: x509_parser::time::ASN1Time| {
        let secs = t.timestamp().max(0) as u64;
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    };
    Ok((
        at(cert.validity().not_before),
        at(cert.validity().not_after),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_then_wildcard_and_challenges() {
        let certs = Certs::default();
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["*.w.test".to_string()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        let pem = format!("{}{}", cert.pem(), key.serialize_pem());
        certs
            .install("*.w.test", pem.as_bytes(), SystemTime::now())
            .unwrap();
        assert!(certs.certificate("a.w.test").is_some());
        assert!(certs.certificate("a.b.w.test").is_none());
        assert!(certs.certificate("w.test").is_none());
        let held = certs.held("*.w.test").unwrap();
        assert!(held.not_after > held.not_before);
        assert!(held.renew_at(0.25) < held.not_after);
        assert!(certs.install("x", b"junk", SystemTime::now()).is_err());

        certs.open_alpn_challenge("c.test", &[7; 32]).unwrap();
        assert!(certs.alpn_challenge("c.test").is_some());
        certs.close_alpn_challenge("c.test");
        assert!(certs.alpn_challenge("c.test").is_none());
        certs.open_http_token("tok", "tok.thumb");
        assert_eq!(certs.http_token("tok").unwrap(), "tok.thumb");
        certs.close_http_token("tok");
        assert!(certs.http_token("tok").is_none());
    }

    /// An issued certificate covers its name until it expires; it is still served after (until
    /// something replaces it), and static names always cover.
    #[test]
    fn an_expired_certificate_covers_nothing_but_is_still_served() {
        let certs = Certs::default();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["old.test".to_string()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2020, 4, 1);
        let cert = params.self_signed(&key).unwrap();
        let pem = format!("{}{}", cert.pem(), key.serialize_pem());
        certs
            .install("old.test", pem.as_bytes(), SystemTime::now())
            .unwrap();
        let expiry = certs.held("old.test").unwrap().not_after;
        assert!(certs.covers("old.test", expiry - Duration::from_secs(1)));
        assert!(!certs.covers("old.test", expiry));
        assert!(!certs.covers("old.test", SystemTime::now()));
        assert!(certs.certificate("old.test").is_some());
        certs.set_static(vec!["s.test".into()], vec![".d.test".into()]);
        assert!(certs.covers("s.test", SystemTime::now()));
        assert!(certs.covers("a.d.test", SystemTime::now()));
        assert!(!certs.covers("d.test", SystemTime::now()));
        assert!(!certs.covers("a.b.d.test", SystemTime::now()));
    }

    /// Another node's challenges, through one state directory: taken up while recorded, own
    /// ones first, let go with the record, and at most `MAX_BORROWED` held (the oldest goes).
    #[test]
    fn borrowed_challenges_follow_the_records_and_stay_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let (ours, theirs) = (
            Certs::sharing(Store::open(dir.path()).unwrap()),
            Certs::sharing(Store::open(dir.path()).unwrap()),
        );
        theirs.open_alpn_challenge("b.test", &[1; 32]).unwrap();
        ours.borrow_alpn_challenge("b.test");
        let borrowed = ours.alpn_challenge("b.test").unwrap();
        ours.borrow_alpn_challenge("b.test");
        assert!(Arc::ptr_eq(
            &borrowed,
            &ours.alpn_challenge("b.test").unwrap()
        ));
        // An own challenge for the name is served before the borrowed one.
        ours.open_alpn_challenge("b.test", &[2; 32]).unwrap();
        assert!(!Arc::ptr_eq(
            &borrowed,
            &ours.alpn_challenge("b.test").unwrap()
        ));
        ours.close_alpn_challenge("b.test");
        theirs.close_alpn_challenge("b.test");
        ours.borrow_alpn_challenge("b.test");
        assert!(ours.alpn_challenge("b.test").is_none());
        // The bound.
        for i in 0..=MAX_BORROWED {
            let name = format!("n{i}.test");
            theirs.open_alpn_challenge(&name, &[3; 32]).unwrap();
            ours.borrow_alpn_challenge(&name);
        }
        assert_eq!(ours.borrowed_alpn.lock().unwrap().len(), MAX_BORROWED);
        assert!(ours.alpn_challenge("n0.test").is_none());
        assert!(ours
            .alpn_challenge(&format!("n{MAX_BORROWED}.test"))
            .is_some());
    }
}
