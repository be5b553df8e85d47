//! Tokens that sluice mints for itself: XChaCha20-Poly1305 over a small JSON grant, key from HKDF.
//!
//! No I/O and no clock: the caller supplies the nonce (randomness) and checks expiry.
//!
//! Wire format (version 1):
//! - key: HKDF-SHA256 (no salt, info [`KEY_CONTEXT`]) of the password's UTF-8 bytes, 32 bytes;
//! - plaintext: a JSON object `{"p":[[name,value],...],"s":[path prefix,...],"e":exp,"i":ip}`;
//! - token: `s1.` followed by base64url without padding of `nonce (24 bytes) || ciphertext || tag`;
//!   the version prefix `s1.` is bound into the tag as associated data.
//!
//! The `.` never occurs in base64url, so a sealed token is told apart from a MediaFlow token by its
//! prefix alone: no trial decryption. A token whose tag does not verify is refused before a byte of
//! its plaintext is looked at. The extended (24-byte) nonce makes random nonces safe for as many
//! tokens as a server will ever mint under one password.

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

impl Grant {
    /// `true` when `path` lies under one of the grant's prefixes.
    pub fn allows_path(&self, path: &str) -> bool {
        self.scope.iter().any(|prefix| path.starts_with(prefix))
    }
}

/// A sealing key derived once from the password.
#[derive(Clone)]
pub struct SealedKey {
    aead: XChaCha20Poly1305,
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
    /// Derives the key from the password with HKDF-SHA256 and the fixed [`KEY_CONTEXT`].
    pub fn derive(password: &str) -> Self {
        let hk = hkdf::Hkdf::<sha2::Sha256>::new(None, password.as_bytes());
        let mut key = [0u8; 32];
        // 32 bytes is far below HKDF-SHA256's 8160-byte limit, so expand cannot fail.
        let expanded = hk.expand(KEY_CONTEXT, &mut key);
        debug_assert!(expanded.is_ok());
        SealedKey {
            aead: XChaCha20Poly1305::new(&key.into()),
        }
    }

    /// Seals a grant into a token with the given (random, never reused) nonce.
    pub fn seal(&self, grant: &Grant, nonce: [u8; NONCE_LEN]) -> String {
        // Serialising a struct of strings and integers cannot fail.
        let plain = serde_json::to_vec(grant).unwrap_or_default();
        let sealed = self
            .aead
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
        let plain = self
            .aead
            .decrypt(
                XNonce::from_slice(nonce),
                Payload {
                    msg: sealed,
                    aad: SEALED_PREFIX.as_bytes(),
                },
            )
            .map_err(|_| SealedError::Authentication)?;
        serde_json::from_slice(&plain).map_err(|_| SealedError::Payload)
    }
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
        assert!(grant().allows_path("/proxy/hls/segment.ts"));
        assert!(!grant().allows_path("/proxy/stream"));
        assert!(!Grant::default().allows_path("/"));
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
    fn key_is_hkdf_not_the_password() {
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
