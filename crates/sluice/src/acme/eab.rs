//! External account binding (RFC 8555 §7.3.4): the key id and HMAC key a CA such as ZeroSSL or
//! Google Trust Services hands out, bound to the ACME account when it is created.

use std::path::Path;

use anyhow::{bail, Context};
use base64::Engine;

use super::config::EabConfig;

/// The binding, read from `[acme.eab]`. The key never reaches a log or an error.
pub struct Eab {
    pub key_id: String,
    pub key: Vec<u8>,
}

impl std::fmt::Debug for Eab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Eab")
            .field("key_id", &self.key_id)
            .field("key", &"<hidden>")
            .finish()
    }
}

impl Eab {
    /// Reads `mac_key_file`; a file that does not hold a key is an error naming the file only.
    pub fn load(config: &EabConfig) -> anyhow::Result<Eab> {
        let path: &Path = &config.mac_key_file;
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading acme.eab.mac_key_file {}", path.display()))?;
        let key = parse_mac_key(&text)
            .with_context(|| format!("acme.eab.mac_key_file {}", path.display()))?;
        Ok(Eab {
            key_id: config.key_id.trim().to_string(),
            key,
        })
    }

    /// The binding as the ACME client takes it.
    pub fn key(&self) -> instant_acme::ExternalAccountKey {
        instant_acme::ExternalAccountKey::new(self.key_id.clone(), &self.key)
    }
}

/// The HMAC key as CAs give it: base64url (RFC 4648 §5), padded or not, surrounding whitespace
/// ignored. The standard alphabet is taken too (some CA pages show it).
pub fn parse_mac_key(text: &str) -> anyhow::Result<Vec<u8>> {
    use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
    let text = text.trim().trim_end_matches('=');
    if text.is_empty() {
        bail!("empty: give the HMAC key the CA issued with the key id");
    }
    let key = URL_SAFE_NO_PAD
        .decode(text)
        .or_else(|_| STANDARD_NO_PAD.decode(text))
        .map_err(|_| anyhow::anyhow!("not a base64url HMAC key"))?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_in_either_alphabet_with_or_without_padding() {
        let raw: Vec<u8> = (0u8..48).map(|b| b.wrapping_mul(37)).collect();
        use base64::engine::general_purpose::{STANDARD, URL_SAFE, URL_SAFE_NO_PAD};
        for text in [
            URL_SAFE_NO_PAD.encode(&raw),
            URL_SAFE.encode(&raw[..47]),
            format!("  {}\n", STANDARD.encode(&raw)),
        ] {
            let got = parse_mac_key(&text).unwrap();
            assert!(got == raw || got == raw[..47], "{text}");
        }
    }

    #[test]
    fn refusals_never_echo_the_text() {
        for text in ["", "  \n", "not*base64!", "a-b_c+d/"] {
            let e = parse_mac_key(text).unwrap_err().to_string();
            let t = text.trim();
            assert!(t.is_empty() || !e.contains(t), "{e}");
        }
        let hidden = format!(
            "{:?}",
            Eab {
                key_id: "kid".into(),
                key: b"secret-key-bytes".to_vec()
            }
        );
        assert!(!hidden.contains("secret"), "{hidden}");
    }
}
