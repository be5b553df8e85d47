//! Tokens that sluice mints for itself: XChaCha20-Poly1305 over a small JSON grant, key from the
//! password by Argon2id then HKDF.
//!
//! No I/O and no clock: the caller supplies the nonce (randomness) and checks expiry.
//!
//! Wire format (version 1):
//! - key: Argon2id ([`ARGON2_M_KIB`], [`ARGON2_T`], [`ARGON2_P`], salt [`ARGON2_SALT`]) of the
//!   password's UTF-8 bytes, 32 bytes, then HKDF-SHA256 (no salt, info [`KEY_CONTEXT`]), 32 bytes.
//!   Tokens sealed before that under HKDF of the bare password (the legacy key) still open, and
//!   nothing new is sealed under it unless the operator asks for it while nodes of an older
//!   version still share the password ([`SealedKey::sealing_with_legacy`],
//!   docs/decisions/sealed-token-kdf.md);
//! - plaintext: a JSON object `{"p":[[name,value],...],"s":[path prefix,...],"e":exp,"i":ip}`;
//! - token: `s1.` followed by base64url without padding of `nonce (24 bytes) || ciphertext || tag`;
//!   the version prefix `s1.` is bound into the tag as associated data.
//!
//! The `.` never occurs in base64url, so a sealed token is told apart from a MediaFlow token by its
//! prefix alone: no trial decryption. A token whose tag does not verify is refused before a byte of
//! its plaintext is looked at. The extended (24-byte) nonce makes random nonces safe for as many
//! tokens as a server will ever mint under one password.
//!
//! Every token a client holds is a test of a password guess (the tag verifies or not), so the key
//! costs a memory-hard hash to derive: a guess costs an attacker the same, not a microsecond.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use serde::{Deserialize, Serialize};

/// Version prefix of every sealed token.
pub const SEALED_PREFIX: &str = "s1.";

/// HKDF `info`: fixes what the derived key is for, so it is never the same key as anything else
/// derived from the password.
pub const KEY_CONTEXT: &[u8] = b"sluice token v1 xchacha20poly1305";

/// Argon2id salt. Fixed: the key must come out the same on every start and on every server given
/// the password, and there is nowhere else to keep a salt. It keeps this hash apart from any other
/// Argon2id of the password, but a dictionary hashed once under it serves against every sluice
/// (docs/decisions/sealed-token-kdf.md).
pub const ARGON2_SALT: &[u8] = b"sluice sealed-token key v2";

/// Argon2id memory in KiB (19 MiB); with [`ARGON2_T`] and [`ARGON2_P`], OWASP's minimum for
/// Argon2id. Paid once per start or reload, and small enough for the router build's 64 MB.
pub const ARGON2_M_KIB: u32 = 19 * 1024;
/// Argon2id passes over the memory.
pub const ARGON2_T: u32 = 2;
/// Argon2id lanes.
pub const ARGON2_P: u32 = 1;

const ARGON2_PARAMS: argon2::Params =
    match argon2::Params::new(ARGON2_M_KIB, ARGON2_T, ARGON2_P, Some(32)) {
        Ok(params) => params,
        // Evaluated at compile time: bad constants fail the build, never a request.
        Err(_) => panic!("invalid Argon2id parameters"),
    };

/// Bytes of nonce in front of every sealed token.
pub const NONCE_LEN: usize = 24;

const TAG_LEN: usize = 16;

/// Longest token accepted, so a hostile path cannot make the server decode megabytes.
pub const MAX_TOKEN_LEN: usize = 16 * 1024;

/// Why a sealed token was refused. Callers answer every variant the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SealedError {
    #[error("token does not carry the sealed-token prefix")]
    Prefix,
    #[error("token is too long")]
    TooLong,
    #[error("token is not base64url")]
    Encoding,
    #[error("token is shorter than a nonce and a tag")]
    Length,
    #[error("token does not authenticate under this key")]
    Authentication,
    #[error("authenticated token payload is not a grant")]
    Payload,
}

/// What a sealed token grants.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    /// Query params the request is served with, in order.
    #[serde(rename = "p", default)]
    pub params: Vec<(String, String)>,
    /// Path prefixes the token may be used on; a grant with none opens nothing.
    #[serde(rename = "s", default)]
    pub scope: Vec<String>,
    /// Unix seconds after which the token is refused.
    #[serde(rename = "e", default, skip_serializing_if = "Option::is_none")]
    pub exp: Option<u64>,
    /// Client address the token is bound to.
    #[serde(rename = "i", default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
}

/// A sealing key derived once from the password.
#[derive(Clone)]
pub struct SealedKey {
    aead: XChaCha20Poly1305,
    /// The legacy key (HKDF of the bare password), to open tokens sealed before Argon2id; it
    /// seals only when `seal_legacy` says so. `None` in a key that is itself the legacy one.
    legacy: Option<XChaCha20Poly1305>,
    /// Seal new tokens under `legacy`, so that nodes that know only the legacy key (an older
    /// version, during a rolling upgrade or after a rollback) open them too.
    seal_legacy: bool,
}

impl std::fmt::Debug for SealedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealedKey(..)")
    }
}

/// `true` when `token` claims to be a sealed token (by prefix only).
pub fn is_sealed(token: &str) -> bool {
    token.starts_with(SEALED_PREFIX)
}

impl SealedKey {
    /// Derives the key from the password: Argon2id, then HKDF-SHA256 with [`KEY_CONTEXT`]. Costs
    /// tens of milliseconds and 19 MiB on purpose: call it once per password, not per request.
    pub fn derive(password: &str) -> Self {
        SealedKey {
            aead: XChaCha20Poly1305::new(&sealing_key(password).into()),
            legacy: Some(XChaCha20Poly1305::new(&legacy_key(password).into())),
            seal_legacy: false,
        }
    }

    /// This key, sealing new tokens under the legacy key when `on` (both keys still open), or
    /// under the Argon2id key when not. No derivation: the keys are the ones already made. For
    /// the length of a rolling upgrade only, since a token sealed so is a fast test of password
    /// guesses again (`auth.seal_with_legacy_key`).
    pub fn sealing_with_legacy(mut self, on: bool) -> Self {
        self.seal_legacy = on;
        self
    }

    /// Whether new tokens are sealed under the legacy key.
    pub fn seals_with_legacy(&self) -> bool {
        self.seal_legacy && self.legacy.is_some()
    }

    /// The legacy key alone: HKDF-SHA256 of the bare password, as tokens were sealed before
    /// Argon2id. Only for tests that need an old token or an attacker's fast guess.
    #[doc(hidden)]
    pub fn legacy(password: &str) -> Self {
        SealedKey {
            aead: XChaCha20Poly1305::new(&legacy_key(password).into()),
            legacy: None,
            seal_legacy: false,
        }
    }

    /// Seals a grant into a token with the given nonce: random, or derived from the grant itself
    /// (never one nonce for two different grants: that would break the cipher).
    pub fn seal(&self, grant: &Grant, nonce: [u8; NONCE_LEN]) -> String {
        // Serialising a struct of strings and integers cannot fail.
        let plain = serde_json::to_vec(grant).unwrap_or_default();
        let aead = match &self.legacy {
            Some(legacy) if self.seal_legacy => legacy,
            _ => &self.aead,
        };
        let sealed = aead
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: &plain,
                    aad: SEALED_PREFIX.as_bytes(),
                },
            )
            .unwrap_or_default();
        let mut bytes = Vec::with_capacity(NONCE_LEN + sealed.len());
        bytes.extend_from_slice(&nonce);
        bytes.extend_from_slice(&sealed);
        format!("{SEALED_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes))
    }

    /// Authenticates, decrypts and parses a token. Expiry and address are the caller's to check.
    pub fn open(&self, token: &str) -> Result<Grant, SealedError> {
        let body = token
            .strip_prefix(SEALED_PREFIX)
            .ok_or(SealedError::Prefix)?;
        if body.len() > MAX_TOKEN_LEN {
            return Err(SealedError::TooLong);
        }
        let bytes = URL_SAFE_NO_PAD
            .decode(body.as_bytes())
            .map_err(|_| SealedError::Encoding)?;
        if bytes.len() < NONCE_LEN + TAG_LEN {
            return Err(SealedError::Length);
        }
        let (nonce, sealed) = bytes.split_at(NONCE_LEN);
        // A token from before Argon2id opens under the legacy key. A forgery is checked against
        // both and refused the same way.
        let plain = decrypt(&self.aead, nonce, sealed)
            .or_else(|| decrypt(self.legacy.as_ref()?, nonce, sealed))
            .ok_or(SealedError::Authentication)?;
        serde_json::from_slice(&plain).map_err(|_| SealedError::Payload)
    }
}

/// The tag-checked plaintext, or `None` when the tag does not verify under `aead`.
fn decrypt(aead: &XChaCha20Poly1305, nonce: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
    aead.decrypt(
        XNonce::from_slice(nonce),
        Payload {
            msg: sealed,
            aad: SEALED_PREFIX.as_bytes(),
        },
    )
    .ok()
}

/// HKDF-SHA256 (no salt, info [`KEY_CONTEXT`]) of `material`, 32 bytes.
fn hkdf_key(material: &[u8]) -> [u8; 32] {
    let hk = hkdf::Hkdf::<sha2::Sha256>::new(None, material);
    let mut key = [0u8; 32];
    // 32 bytes is far below HKDF-SHA256's 8160-byte limit, so expand cannot fail.
    let expanded = hk.expand(KEY_CONTEXT, &mut key);
    debug_assert!(expanded.is_ok());
    key
}

/// The key every token is sealed with: Argon2id of the password, then HKDF.
fn sealing_key(password: &str) -> [u8; 32] {
    let argon = argon2::Argon2::new(
        argon2::Algorithm::Argon2id,
        argon2::Version::V0x13,
        ARGON2_PARAMS,
    );
    let mut stretched = [0u8; 32];
    match argon.hash_password_into(password.as_bytes(), ARGON2_SALT, &mut stretched) {
        Ok(()) => hkdf_key(&stretched),
        // Only a password over 4 GiB fails (the salt and output length are fixed and valid): the
        // legacy key is then the best left, and still depends on the password.
        Err(_) => legacy_key(password),
    }
}

/// The legacy key: HKDF straight from the password, a microsecond per guess.
fn legacy_key(password: &str) -> [u8; 32] {
    hkdf_key(password.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> Grant {
        Grant {
            params: vec![
                ("d".into(), "https://cdn.example/a b.ts".into()),
                ("h_referer".into(), "https://site.example/".into()),
            ],
            scope: vec!["/proxy/hls/".into()],
            exp: Some(4_000_000_000),
            ip: Some("1.2.3.4".into()),
        }
    }

    #[test]
    fn round_trip() {
        let key = SealedKey::derive("pw");
        let token = key.seal(&grant(), [7; NONCE_LEN]);
        assert!(is_sealed(&token));
        assert!(token[SEALED_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert_eq!(key.open(&token), Ok(grant()));
    }

    /// Sealed by the version-1 code (HKDF of the password alone) for "pw", before Argon2id: a
    /// token of that kind may sit in a player for as long as its grant lets it.
    const LEGACY_PW_TOKEN: &str =
        "s1.QkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJC4ZwIRSigZjd19hqHwbtaaYxDbBUiYYEKmB\
        VQTtNQXyE3VfR3atOLXBCl-ikJ7P9Wap3tkZMNHPRGt23ZUqPB2nzpiZvuB3OR-4gY78sRRV4h4nJKYdHJ6_cJGUT0";

    fn legacy_grant() -> Grant {
        Grant {
            params: vec![("d".into(), "https://cdn.example/a b.ts".into())],
            scope: vec!["/proxy/hls/".into()],
            exp: Some(4_000_000_000),
            ip: None,
        }
    }

    #[test]
    fn the_sealing_key_is_argon2id_then_hkdf() {
        // Computed outside Rust: libargon2 (the reference C code) `argon2id_hash_raw(t=2,
        // m=19456, p=1, "pw", ARGON2_SALT)`, then HKDF-SHA256 (no salt, info KEY_CONTEXT) in
        // Python. Any change here would lock every holder of a token out at once.
        assert_eq!(
            hex::encode(sealing_key("pw")),
            "13bac5faf7636d8fd9e3354bca36d949f5a2e90ffdf685cdbdcaec0193c50993"
        );
        assert_eq!(
            hex::encode(legacy_key("pw")),
            "df3d3fda27c353d5bc1f6ddf2323de99abfef5c7180368d8e6207bd67f40f0f6"
        );
        assert_ne!(sealing_key("pw"), legacy_key("pw"));
        assert_ne!(sealing_key("pw"), sealing_key("pw2"));
    }

    #[test]
    fn a_new_token_does_not_open_under_the_fast_legacy_key() {
        // The attack: take any token a player holds and test guesses at HKDF speed.
        let token = SealedKey::derive("pw").seal(&grant(), [4; NONCE_LEN]);
        assert_eq!(SealedKey::derive("pw").open(&token), Ok(grant()));
        assert_eq!(
            SealedKey::legacy("pw").open(&token),
            Err(SealedError::Authentication)
        );
    }

    #[test]
    fn a_legacy_token_still_opens_and_only_with_its_password() {
        let key = SealedKey::derive("pw");
        assert_eq!(key.open(LEGACY_PW_TOKEN), Ok(legacy_grant()));
        assert_eq!(
            SealedKey::legacy("pw").open(LEGACY_PW_TOKEN),
            Ok(legacy_grant())
        );
        assert_eq!(
            SealedKey::derive("pw2").open(LEGACY_PW_TOKEN),
            Err(SealedError::Authentication)
        );
        // A legacy token under another password: neither key of this one opens it.
        let other = SealedKey::legacy("pw2").seal(&grant(), [6; NONCE_LEN]);
        assert_eq!(key.open(&other), Err(SealedError::Authentication));
        // Sealing never uses the legacy key, even for a grant a legacy token carries.
        let resealed = key.seal(&legacy_grant(), [0x42; NONCE_LEN]);
        assert_ne!(resealed, LEGACY_PW_TOKEN);
        assert_eq!(
            SealedKey::legacy("pw").open(&resealed),
            Err(SealedError::Authentication)
        );
    }

    #[test]
    fn sealing_with_legacy_makes_tokens_an_older_node_opens() {
        // A rolling upgrade: a node of an older version knows only the legacy key.
        let old_node = SealedKey::legacy("pw");
        let switched = SealedKey::derive("pw").sealing_with_legacy(true);
        assert!(switched.seals_with_legacy());
        let token = switched.seal(&grant(), [5; NONCE_LEN]);
        assert_eq!(old_node.open(&token), Ok(grant()));
        // Both keys still open on the switched node and on an upgraded node without the switch.
        assert_eq!(switched.open(&token), Ok(grant()));
        assert_eq!(SealedKey::derive("pw").open(&token), Ok(grant()));
        let strong = SealedKey::derive("pw").seal(&grant(), [5; NONCE_LEN]);
        assert_eq!(switched.open(&strong), Ok(grant()));
        // Turned off again, the same derived key seals under Argon2id only.
        let off = switched.sealing_with_legacy(false);
        assert!(!off.seals_with_legacy());
        let token = off.seal(&grant(), [5; NONCE_LEN]);
        assert_eq!(old_node.open(&token), Err(SealedError::Authentication));
        assert_eq!(off.open(&token), Ok(grant()));
        // A legacy-only key has nothing else to seal with.
        assert!(!SealedKey::legacy("pw")
            .sealing_with_legacy(true)
            .seals_with_legacy());
    }

    #[test]
    fn another_password_cannot_open() {
        let token = SealedKey::derive("pw").seal(&grant(), [1; NONCE_LEN]);
        assert_eq!(
            SealedKey::derive("pw2").open(&token),
            Err(SealedError::Authentication)
        );
    }

    #[test]
    fn every_bit_flip_fails_authentication() {
        let key = SealedKey::derive("pw");
        let token = key.seal(&grant(), [3; NONCE_LEN]);
        let raw = URL_SAFE_NO_PAD
            .decode(&token[SEALED_PREFIX.len()..])
            .unwrap();
        for i in 0..raw.len() {
            for bit in 0..8 {
                let mut flipped = raw.clone();
                flipped[i] ^= 1 << bit;
                let t = format!("{SEALED_PREFIX}{}", URL_SAFE_NO_PAD.encode(&flipped));
                assert_eq!(key.open(&t), Err(SealedError::Authentication), "{i}/{bit}");
            }
        }
    }

    #[test]
    fn the_prefix_is_authenticated_and_malformed_input_is_refused() {
        let key = SealedKey::derive("pw");
        let token = key.seal(&grant(), [3; NONCE_LEN]);
        let other_version = token.replacen("s1.", "s2.", 1);
        assert_eq!(key.open(&other_version), Err(SealedError::Prefix));
        assert_eq!(key.open("s1."), Err(SealedError::Length));
        assert_eq!(key.open("s1.!!"), Err(SealedError::Encoding));
        assert_eq!(
            key.open(&format!("s1.{}", "A".repeat(MAX_TOKEN_LEN + 1))),
            Err(SealedError::TooLong)
        );
        // Authentic bytes that are not a grant (sealed by hand) are refused after authentication.
        let aead = key.aead.clone();
        let ct = aead
            .encrypt(
                XNonce::from_slice(&[0; NONCE_LEN]),
                Payload {
                    msg: b"[1,2]",
                    aad: SEALED_PREFIX.as_bytes(),
                },
            )
            .unwrap();
        let mut raw = vec![0; NONCE_LEN];
        raw.extend(ct);
        let t = format!("s1.{}", URL_SAFE_NO_PAD.encode(raw));
        assert_eq!(key.open(&t), Err(SealedError::Payload));
    }

    #[test]
    fn key_is_derived_not_the_password() {
        // The MediaFlow key schedule (space-padded password) must not open sealed tokens.
        let spaced = *b"pw                              ";
        let raw_key = XChaCha20Poly1305::new(&spaced.into());
        let token = SealedKey::derive("pw").seal(&grant(), [9; NONCE_LEN]);
        let raw = URL_SAFE_NO_PAD
            .decode(&token[SEALED_PREFIX.len()..])
            .unwrap();
        let (n, c) = raw.split_at(NONCE_LEN);
        assert!(raw_key
            .decrypt(
                XNonce::from_slice(n),
                Payload {
                    msg: c,
                    aad: SEALED_PREFIX.as_bytes()
                }
            )
            .is_err());
    }
}
