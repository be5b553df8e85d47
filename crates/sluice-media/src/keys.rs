//! ClearKey key lists as MediaFlow accepts them (`key_id` + `key`, or `key=kid:key,...`), parsed
//! into a KID → key ring. No I/O.
//!
//! Each value is 32 hex digits (dashes allowed, any case) or base64url / base64 of 16 bytes,
//! padded or not. Comma lists pair by position. Error messages never echo a key.

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::{alphabet, Engine};

/// 16-byte key id.
pub type Kid = [u8; 16];
/// 16-byte AES-128 content key.
pub type Key = [u8; 16];

/// Why a key list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("{field} #{index} is neither 32 hex digits nor base64 of 16 bytes")]
    BadEncoding { field: &'static str, index: usize },
    #[error("{field} #{index} decodes to {len} bytes; a key and a key id are 16 bytes")]
    BadLength {
        field: &'static str,
        index: usize,
        len: usize,
    },
    #[error("{key_ids} key_id values but {keys} key values; they pair by position")]
    CountMismatch { key_ids: usize, keys: usize },
    #[error("key #{index} has no key id: give key_id, or key as kid:key")]
    MissingKid { index: usize },
    #[error("no key given")]
    Empty,
}

/// Content keys by KID. Small (a handful of entries), so a vector beats a map.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct KeyRing {
    pairs: Vec<(Kid, Key)>,
}

impl std::fmt::Debug for KeyRing {
    // Keys are secrets: only the KIDs are shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.pairs.iter().map(|(kid, _)| to_hex(kid)))
            .finish()
    }
}

impl KeyRing {
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses the `key_id` and `key` query values the way MediaFlow does.
    pub fn parse(key_id: Option<&str>, key: &str) -> Result<Self, KeyError> {
        let keys = split_list(key);
        if keys.is_empty() {
            return Err(KeyError::Empty);
        }
        let mut ring = KeyRing::new();
        match key_id.map(split_list).filter(|ids| !ids.is_empty()) {
            Some(ids) => {
                if ids.len() != keys.len() {
                    return Err(KeyError::CountMismatch {
                        key_ids: ids.len(),
                        keys: keys.len(),
                    });
                }
                for (index, (id, key)) in ids.iter().zip(&keys).enumerate() {
                    ring.insert(
                        parse_bytes(id, "key_id", index)?,
                        parse_bytes(key, "key", index)?,
                    );
                }
            }
            None => {
                for (index, pair) in keys.iter().enumerate() {
                    let (id, key) = pair.split_once(':').ok_or(KeyError::MissingKid { index })?;
                    ring.insert(
                        parse_bytes(id, "key_id", index)?,
                        parse_bytes(key, "key", index)?,
                    );
                }
            }
        }
        Ok(ring)
    }

    /// Adds or replaces the key for `kid`.
    pub fn insert(&mut self, kid: Kid, key: Key) {
        match self.pairs.iter_mut().find(|(k, _)| *k == kid) {
            Some(slot) => slot.1 = key,
            None => self.pairs.push((kid, key)),
        }
    }

    /// The key for `kid`, also trying the PlayReady little-endian GUID layout of the same KID.
    pub fn get(&self, kid: &Kid) -> Option<&Key> {
        let swapped = swap_guid(kid);
        self.exact(kid).or_else(|| self.exact(&swapped))
    }

    fn exact(&self, kid: &Kid) -> Option<&Key> {
        self.pairs.iter().find(|(k, _)| k == kid).map(|(_, v)| v)
    }

    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// KIDs and keys in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = (&Kid, &Key)> {
        self.pairs.iter().map(|(k, v)| (k, v))
    }
}

/// Lowercase hex, for messages and logs.
pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    bytes
        .iter()
        .flat_map(|b| {
            [
                DIGITS[(b >> 4) as usize] as char,
                DIGITS[(b & 15) as usize] as char,
            ]
        })
        .collect()
}

/// PlayReady writes GUIDs with the first three fields little-endian.
fn swap_guid(kid: &Kid) -> Kid {
    let mut out = *kid;
    out[0..4].reverse();
    out[4..6].reverse();
    out[6..8].reverse();
    out
}

fn split_list(value: &str) -> Vec<&str> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

/// Decodes one 16-byte value: 32 hex digits (dashes ignored) first, base64 otherwise.
fn parse_bytes(value: &str, field: &'static str, index: usize) -> Result<[u8; 16], KeyError> {
    let value = value.trim();
    let hex: String = value.chars().filter(|&c| c != '-').collect();
    if hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        let mut out = [0u8; 16];
        for (i, pair) in hex.as_bytes().chunks_exact(2).enumerate() {
            out[i] = (hex_digit(pair[0]) << 4) | hex_digit(pair[1]);
        }
        return Ok(out);
    }
    let decoded = decode_base64(value).ok_or(KeyError::BadEncoding { field, index })?;
    <[u8; 16]>::try_from(decoded.as_slice()).map_err(|_| KeyError::BadLength {
        field,
        index,
        len: decoded.len(),
    })
}

fn hex_digit(b: u8) -> u8 {
    match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        _ => b - b'A' + 10,
    }
}

/// Accepts the URL-safe and the standard alphabet, with or without padding. A space is read as
/// `+`: an unescaped `+` in a query string arrives as a space after form decoding.
fn decode_base64(value: &str) -> Option<Vec<u8>> {
    let value = value.replace(' ', "+");
    let config =
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    let url = GeneralPurpose::new(&alphabet::URL_SAFE, config);
    let standard = GeneralPurpose::new(&alphabet::STANDARD, config);
    url.decode(&value).or_else(|_| standard.decode(&value)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KID: &str = "9eb4050de44b4802932e27d75083e266";
    const KEY: &str = "166634c675823c235a4a9446fad52e4d";

    fn bytes(hex: &str) -> [u8; 16] {
        parse_bytes(hex, "test", 0).unwrap()
    }

    #[test]
    fn base64url_pair_from_the_mediaflow_docs() {
        let ring =
            KeyRing::parse(Some("nrQFDeRLSAKTLifXUIPiZg"), "FmY0xnWCPCNaSpRG-tUuTQ").unwrap();
        assert_eq!(ring.get(&bytes(KID)), Some(&bytes(KEY)));
    }

    #[test]
    fn hex_with_dashes_and_upper_case() {
        let ring = KeyRing::parse(
            Some("9EB4050D-E44B-4802-932E-27D75083E266"),
            "166634C6-7582-3C23-5A4A-9446FAD52E4D",
        )
        .unwrap();
        assert_eq!(ring.get(&bytes(KID)), Some(&bytes(KEY)));
    }

    #[test]
    fn comma_lists_pair_by_position() {
        let other_kid = "00112233445566778899aabbccddeeff";
        let other_key = "ffeeddccbbaa99887766554433221100";
        let ring = KeyRing::parse(
            Some(&format!("{KID}, {other_kid}")),
            &format!("{KEY},{other_key}"),
        )
        .unwrap();
        assert_eq!(ring.len(), 2);
        assert_eq!(ring.get(&bytes(other_kid)), Some(&bytes(other_key)));
    }

    #[test]
    fn kid_colon_key_list_without_key_id() {
        let ring =
            KeyRing::parse(None, &format!("{KID}:{KEY},nrQFDeRLSAKTLifXUIPiZg:{KEY}")).unwrap();
        assert_eq!(ring.len(), 1, "same KID twice collapses");
        assert_eq!(ring.get(&bytes(KID)), Some(&bytes(KEY)));
    }

    #[test]
    fn standard_base64_with_a_form_decoded_plus() {
        // "FmY0xnWCPCNaSpRG+tUuTQ" with its '+' turned into a space by form decoding.
        let ring = KeyRing::parse(Some(KID), "FmY0xnWCPCNaSpRG tUuTQ==").unwrap();
        assert_eq!(ring.get(&bytes(KID)), Some(&bytes(KEY)));
    }

    #[test]
    fn playready_byte_order_is_found() {
        let ring = KeyRing::parse(Some(KID), KEY).unwrap();
        let swapped = swap_guid(&bytes(KID));
        assert_eq!(ring.get(&swapped), Some(&bytes(KEY)));
    }

    #[test]
    fn clear_errors() {
        assert_eq!(
            KeyRing::parse(Some(KID), "abcd"),
            Err(KeyError::BadLength {
                field: "key",
                index: 0,
                len: 3
            })
        );
        assert_eq!(
            KeyRing::parse(Some(KID), "not base64 !!"),
            Err(KeyError::BadEncoding {
                field: "key",
                index: 0
            })
        );
        assert_eq!(
            KeyRing::parse(Some(&format!("{KID},{KID}")), KEY),
            Err(KeyError::CountMismatch {
                key_ids: 2,
                keys: 1
            })
        );
        assert_eq!(
            KeyRing::parse(None, KEY),
            Err(KeyError::MissingKid { index: 0 })
        );
        assert_eq!(KeyRing::parse(Some(KID), " , "), Err(KeyError::Empty));
    }

    #[test]
    fn debug_hides_keys() {
        let ring = KeyRing::parse(Some(KID), KEY).unwrap();
        let shown = format!("{ring:?}");
        assert!(shown.contains(KID) && !shown.contains(KEY));
    }
}
