//! MediaFlow-compatible encrypted URL tokens: AES-256-CBC over a JSON object of query params.
//!
//! No I/O and no clock: the caller supplies the IV (randomness) and "now".
//!
//! Wire format, as MediaFlow Proxy writes and reads it:
//! - key: the password's UTF-8 bytes, right-padded with spaces to 32 bytes, or cut at 32 bytes
//!   (even in the middle of a multi-byte character);
//! - plaintext: `json.dumps` of a flat object of query params (`d`, `h_*`, `r_*`, ...) plus the
//!   optional claims `exp` (unix seconds) and `ip`;
//! - token: base64url without `=` padding of `IV (16 bytes) || AES-256-CBC-PKCS7(plaintext)`;
//! - placement: `/_token_<token>/<endpoint>[/<filename>]` in the path, or `?token=<token>`.
//!
//! MediaFlow merges the decrypted params over the request's query and then authorises the request
//! like any other: by the `api_password` param, which `/generate_url` puts inside the token. A
//! token that decrypts but carries no password is refused there (403), so decryption alone is
//! not authentication in MediaFlow.
//!
//! mediaflow-proxy-light writes `{destination, query_params, request_headers, response_headers,
//! exp, ip}` instead; [`decrypt_token`] maps that shape onto the same flat params.

mod claims;
pub(crate) mod python;
pub mod sealed;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::net::IpAddr;

use aes::cipher::block_padding::Pkcs7;
use aes::cipher::{BlockDecryptMut, BlockEncryptMut, InnerIvInit, KeyInit};
use aes::Aes256;
use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;
use serde_json::Value;

pub use claims::TokenClaims;

/// Path prefix that carries a token in front of the endpoint path.
pub const PATH_TOKEN_PREFIX: &str = "/_token_";

const IV_LEN: usize = 16;
const BLOCK_LEN: usize = 16;

/// Why a token was refused. Every variant but [`TokenError::IpMismatch`] maps to 401.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("token is not base64url")]
    Encoding,
    #[error("token is not an IV followed by whole AES blocks")]
    Length,
    /// Wrong password or a corrupted token: the two cannot be told apart without a MAC.
    #[error("token does not decrypt with this password")]
    Padding,
    #[error("token payload is not a UTF-8 JSON object")]
    Json,
    #[error("token claim `{0}` has the wrong type")]
    Claim(&'static str),
    #[error("token has expired")]
    Expired,
    #[error("token is bound to another client address")]
    IpMismatch,
}

impl TokenError {
    /// HTTP status for the refusal: 403 when the token is valid but bound to another address,
    /// 401 otherwise. (MediaFlow answers 401 for both; the distinction is ours.)
    pub fn status(self) -> u16 {
        match self {
            TokenError::IpMismatch => 403,
            _ => 401,
        }
    }
}

/// A password turned into an AES-256 key schedule once, for servers that decrypt per request.
#[derive(Clone)]
pub struct TokenKey {
    cipher: Aes256,
}

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

impl TokenKey {
    pub fn new(password: &str) -> Self {
        let key = derive_key(password);
        TokenKey {
            cipher: Aes256::new(&key.into()),
        }
    }

    /// Encrypts flat params plus optional claims into a token.
    ///
    /// A repeated param name keeps its first position and its last value, and a param named
    /// `exp` or `ip` is replaced by the claim, as a Python dict would. An empty `ip` is no claim.
    pub fn encrypt(
        &self,
        params: &[(String, String)],
        exp: Option<u64>,
        ip: Option<&str>,
        iv: [u8; IV_LEN],
    ) -> String {
        let mut entries = OrderedMap::new();
        for (name, value) in params {
            entries.insert(name, Value::String(value.clone()));
        }
        if let Some(exp) = exp {
            entries.insert("exp", Value::from(exp));
        }
        if let Some(ip) = ip.filter(|ip| !ip.is_empty()) {
            entries.insert("ip", Value::String(ip.to_owned()));
        }
        self.seal(entries.entries(), iv)
    }

    /// Encrypts an already assembled JSON object (keys in order, claims included).
    pub(crate) fn seal(&self, entries: &[(String, Value)], iv: [u8; IV_LEN]) -> String {
        let json = python::dumps_object(entries);
        let mut buf = Vec::with_capacity(IV_LEN + json.len() + BLOCK_LEN);
        buf.extend_from_slice(&iv);
        buf.extend_from_slice(json.as_bytes());
        buf.resize(IV_LEN + (json.len() / BLOCK_LEN + 1) * BLOCK_LEN, 0);
        let encryptor = cbc::Encryptor::<Aes256>::inner_iv_init(self.cipher.clone(), &iv.into());
        let sealed = encryptor.encrypt_padded_mut::<Pkcs7>(&mut buf[IV_LEN..], json.len());
        debug_assert!(sealed.is_ok(), "buffer sized for PKCS7 padding");
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&buf)
    }

    /// Decrypts and parses a token. Claims are returned, not checked: see [`TokenClaims::check`].
    pub fn decrypt(&self, token: &str) -> Result<TokenClaims, TokenError> {
        let mut bytes = decode_base64(token)?;
        if bytes.len() < IV_LEN + BLOCK_LEN || !(bytes.len() - IV_LEN).is_multiple_of(BLOCK_LEN) {
            return Err(TokenError::Length);
        }
        let (iv, body) = bytes.split_at_mut(IV_LEN);
        let iv: [u8; IV_LEN] = (&*iv).try_into().map_err(|_| TokenError::Length)?;
        let decryptor = cbc::Decryptor::<Aes256>::inner_iv_init(self.cipher.clone(), &iv.into());
        let plain = decryptor
            .decrypt_padded_mut::<Pkcs7>(body)
            .map_err(|_| TokenError::Padding)?;
        claims::parse(plain)
    }
}

/// Encrypts `params` (+ `exp`, `ip`) into a token the way MediaFlow Proxy does, with a given IV.
pub fn encrypt_token(
    params: &[(String, String)],
    exp: Option<u64>,
    ip: Option<&str>,
    password: &str,
    iv: [u8; IV_LEN],
) -> String {
    TokenKey::new(password).encrypt(params, exp, ip, iv)
}

/// Decrypts a MediaFlow Proxy or mediaflow-proxy-light token. Never panics on hostile input.
pub fn decrypt_token(token: &str, password: &str) -> Result<TokenClaims, TokenError> {
    TokenKey::new(password).decrypt(token)
}

/// What a MediaFlow token holding `entries` (a token object, claims included) would be read as,
/// without encrypting it: for a server that puts the same grant in a token of its own.
pub(crate) fn claims_of(entries: &[(String, Value)]) -> Result<TokenClaims, TokenError> {
    claims::parse(python::dumps_object(entries).as_bytes())
}

/// The bytes a MediaFlow token's text stands for. Its decoding is lenient (either alphabet,
/// `=` padding or none, trailing bits ignored), so one token has many spellings; whatever counts
/// per token keys on these bytes, not on the text.
pub fn token_bytes(token: &str) -> Result<Vec<u8>, TokenError> {
    decode_base64(token)
}

/// One form for every token that grants the same: its params sorted, a value that is a URL in
/// the URL's normal form (scheme and host lower-cased), then `exp` and `ip`, each length-prefixed.
/// The format has no MAC, so flipping IV bits rewrites the first plaintext block while it still
/// parses (a space in `": "` becomes a tab, `http` becomes `Http`): neither the token's text nor
/// its bytes name what it grants, and whatever counts per token keys on this.
pub fn canonical_claims(claims: &TokenClaims) -> Vec<u8> {
    let normal = |v: &str| match url::Url::parse(v) {
        Ok(url) => url.to_string(),
        Err(_) => v.to_string(),
    };
    let mut params: Vec<(&str, String)> = claims
        .params
        .iter()
        .map(|(k, v)| (k.as_str(), normal(v)))
        .collect();
    params.sort();
    let mut out = Vec::new();
    let mut field = |b: &[u8]| {
        out.extend_from_slice(&(b.len() as u64).to_be_bytes());
        out.extend_from_slice(b);
    };
    for (k, v) in &params {
        field(k.as_bytes());
        field(v.as_bytes());
    }
    field(
        claims
            .exp
            .map(|e| e.to_string())
            .unwrap_or_default()
            .as_bytes(),
    );
    field(claims.ip.as_deref().unwrap_or("").as_bytes());
    out
}

/// Splits `/_token_<T>/proxy/stream` into (`<T>`, `/proxy/stream`). The rest is empty when
/// nothing follows the token; `None` when the path carries no token.
pub fn split_path_token(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix(PATH_TOKEN_PREFIX)?;
    Some(match rest.find('/') {
        Some(end) => rest.split_at(end),
        None => (rest, ""),
    })
}

/// MediaFlow's rule: UTF-8 bytes, space-padded to 32 or truncated to 32.
fn derive_key(password: &str) -> [u8; 32] {
    let mut key = [b' '; 32];
    let bytes = password.as_bytes();
    let len = bytes.len().min(32);
    key[..len].copy_from_slice(&bytes[..len]);
    key
}

/// Tokens are base64url without padding; the standard alphabet and `=` padding are accepted too
/// because Python's decoder accepts them, and non-zero trailing bits are ignored for the same reason.
fn decode_base64(token: &str) -> Result<Vec<u8>, TokenError> {
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &alphabet::URL_SAFE,
        GeneralPurposeConfig::new()
            .with_decode_padding_mode(DecodePaddingMode::Indifferent)
            .with_decode_allow_trailing_bits(true),
    );
    let normalized: String = token
        .chars()
        .map(|c| match c {
            '+' => '-',
            '/' => '_',
            c => c,
        })
        .collect();
    LENIENT
        .decode(normalized.as_bytes())
        .map_err(|_| TokenError::Encoding)
}

/// Keys in insertion order with Python dict assignment: a repeated key keeps its first position
/// and takes the last value. Indexed, so hostile inputs with many keys stay linear.
#[derive(Debug, Default)]
pub(crate) struct OrderedMap<V> {
    entries: Vec<(String, V)>,
    index: HashMap<String, usize>,
}

impl<V> OrderedMap<V> {
    pub(crate) fn new() -> Self {
        OrderedMap {
            entries: Vec::new(),
            index: HashMap::new(),
        }
    }

    pub(crate) fn insert(&mut self, name: &str, value: V) {
        match self.index.get(name) {
            Some(&at) => self.entries[at].1 = value,
            None => {
                self.index.insert(name.to_owned(), self.entries.len());
                self.entries.push((name.to_owned(), value));
            }
        }
    }

    pub(crate) fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub(crate) fn into_entries(self) -> Vec<(String, V)> {
        self.entries
    }

    pub(crate) fn entries(&self) -> &[(String, V)] {
        &self.entries
    }
}

/// Does a token's `ip` claim name this client? Addresses are compared as addresses, so
/// `::ffff:1.2.3.4` from a dual-stack socket matches `1.2.3.4`; anything unparsable must match
/// the client's text form exactly.
fn ip_matches(claim: &str, client: Option<IpAddr>) -> bool {
    let Some(client) = client else {
        return false;
    };
    match claim.trim().parse::<IpAddr>() {
        Ok(bound) => bound.to_canonical() == client.to_canonical(),
        Err(_) => claim == client.to_string(),
    }
}
