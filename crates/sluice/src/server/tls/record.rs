//! The TLS 1.3 record rules sluice's own record layer (`own`) applies once the handshake is over,
//! as pure functions: where the next record ends, what a decrypted record asks for, and the key
//! schedule step of a key update (RFC 8446 sections 5 and 7.2).

use rustls::crypto::cipher::{AeadKey, Iv};
use rustls::crypto::tls13::{HkdfExpander, OkmBlock};
use rustls::Tls13CipherSuite;

/// A record header: content type, legacy version, length.
pub const HEADER: usize = 5;
/// The most plaintext one record may carry (RFC 8446 section 5.1).
pub const MAX_PLAINTEXT: usize = 1 << 14;
/// The most ciphertext one record may carry: the plaintext, its content type and padding, and
/// the AEAD tag within 256 bytes (section 5.2).
pub const MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 256;
/// Records without application data (key updates, empty records, ignored warnings) a peer may
/// send in a row.
pub const MAX_IDLE_RECORDS_IN_A_ROW: u32 = 32;

/// Content types (section 5.1).
pub const CHANGE_CIPHER_SPEC: u8 = 20;
pub const ALERT: u8 = 21;
pub const HANDSHAKE: u8 = 22;
pub const APPLICATION_DATA: u8 = 23;

/// Alert descriptions sluice sends or reads (section 6).
pub mod alert {
    pub const CLOSE_NOTIFY: u8 = 0;
    pub const UNEXPECTED_MESSAGE: u8 = 10;
    pub const BAD_RECORD_MAC: u8 = 20;
    pub const RECORD_OVERFLOW: u8 = 22;
    pub const ILLEGAL_PARAMETER: u8 = 47;
    pub const DECODE_ERROR: u8 = 50;
    pub const USER_CANCELED: u8 = 90;
}

/// Why a connection ends: the alert sluice sends for it (none for `CLOSE_NOTIFY`: the peer's own
/// fatal alert, or a failure on sluice's side), and what its log says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fatal {
    pub alert: u8,
    pub why: &'static str,
}

const fn fatal(alert: u8, why: &'static str) -> Fatal {
    Fatal { alert, why }
}

/// The length of the record at the front of `buf` (header included) once it is all there;
/// `Ok(None)` while it is not.
pub fn next_record(buf: &[u8]) -> Result<Option<usize>, Fatal> {
    if buf.len() < HEADER {
        return Ok(None);
    }
    // Once the handshake is over every record is protected, so its outer type is application
    // data; the legacy version is ignored (section 5.1).
    match buf[0] {
        APPLICATION_DATA => {}
        CHANGE_CIPHER_SPEC => {
            return Err(fatal(
                alert::UNEXPECTED_MESSAGE,
                "change_cipher_spec after the handshake",
            ))
        }
        _ => {
            return Err(fatal(
                alert::UNEXPECTED_MESSAGE,
                "unprotected record after the handshake",
            ))
        }
    }
    let len = u16::from_be_bytes([buf[3], buf[4]]) as usize;
    if len > MAX_CIPHERTEXT {
        return Err(fatal(
            alert::RECORD_OVERFLOW,
            "record longer than 2^14 + 256",
        ));
    }
    Ok((buf.len() >= HEADER + len).then_some(HEADER + len))
}

/// What a decrypted record asks of the connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Inner {
    /// Application data (possibly empty).
    Data,
    /// `close_notify`: the peer sends nothing more.
    Closed,
    /// An alert to pass over (`user_canceled` at warning level, which a `close_notify`
    /// follows).
    Ignore,
    /// A key update: new receive keys from the next record on; `true` when the peer asks for
    /// one of the send keys too.
    KeyUpdate(bool),
}

/// Reads a decrypted record of content type `typ` holding `plain`.
pub fn classify(typ: u8, plain: &[u8]) -> Result<Inner, Fatal> {
    if plain.len() > MAX_PLAINTEXT {
        return Err(fatal(alert::RECORD_OVERFLOW, "plaintext longer than 2^14"));
    }
    match typ {
        APPLICATION_DATA => Ok(Inner::Data),
        ALERT => match plain {
            [_, alert::CLOSE_NOTIFY] => Ok(Inner::Closed),
            [1, alert::USER_CANCELED] => Ok(Inner::Ignore),
            [_, _] => Err(fatal(alert::CLOSE_NOTIFY, "the client sent a fatal alert")),
            [] => Err(fatal(alert::UNEXPECTED_MESSAGE, "empty alert record")),
            _ => Err(fatal(alert::DECODE_ERROR, "malformed alert")),
        },
        // After the handshake a client may send only a key update: sluice asks for no
        // certificate, and tickets go the other way. A key update must end its record (section
        // 5.1) and is five bytes long; one split over records is refused too.
        HANDSHAKE => match plain {
            [24, 0, 0, 1, request] => match request {
                0 => Ok(Inner::KeyUpdate(false)),
                1 => Ok(Inner::KeyUpdate(true)),
                _ => Err(fatal(
                    alert::ILLEGAL_PARAMETER,
                    "key update with a bad request field",
                )),
            },
            [24, 0, 0, 1, _, ..] => Err(fatal(
                alert::UNEXPECTED_MESSAGE,
                "a message after a key update in its record",
            )),
            [24, ..] => Err(fatal(alert::DECODE_ERROR, "malformed key update")),
            _ => Err(fatal(
                alert::UNEXPECTED_MESSAGE,
                "handshake message after the handshake",
            )),
        },
        _ => Err(fatal(alert::UNEXPECTED_MESSAGE, "unknown content type")),
    }
}

/// A key update, one direction: the traffic secret, and the key and IV it gives.
pub struct Keys {
    pub secret: OkmBlock,
    pub key: AeadKey,
    pub iv: Iv,
}

/// The next traffic secret and its key and IV: `HKDF-Expand-Label(secret, "traffic upd", "",
/// Hash.length)` (section 7.2), then "key" and "iv" from it (section 7.3).
pub fn next_keys(suite: &Tls13CipherSuite, secret: &OkmBlock) -> Keys {
    let expander = suite.hkdf_provider.expander_for_okm(secret);
    let secret = expand_label(expander.as_ref(), b"traffic upd");
    keys_of(suite, secret)
}

/// The key and IV of traffic secret `secret`.
pub fn keys_of(suite: &Tls13CipherSuite, secret: OkmBlock) -> Keys {
    let expander = suite.hkdf_provider.expander_for_okm(&secret);
    Keys {
        key: rustls::internal::derive_traffic_key(expander.as_ref(), suite.aead_alg),
        iv: rustls::internal::derive_traffic_iv(expander.as_ref()),
        secret,
    }
}

/// The IV of traffic secret `secret` alone (half the work of `keys_of`).
pub fn iv_of(suite: &Tls13CipherSuite, secret: &OkmBlock) -> Iv {
    let expander = suite.hkdf_provider.expander_for_okm(secret);
    rustls::internal::derive_traffic_iv(expander.as_ref())
}

/// `HKDF-Expand-Label` with an empty context, as long as the hash.
fn expand_label(expander: &dyn HkdfExpander, label: &[u8]) -> OkmBlock {
    let len = (expander.hash_len() as u16).to_be_bytes();
    let label_len = [(b"tls13 ".len() + label.len()) as u8];
    expander.expand_block(&[&len, &label_len, b"tls13 ", label, &[0]])
}

/// A `KeyUpdate` handshake message (section 4.6.3).
pub fn key_update(request: bool) -> [u8; 5] {
    [24, 0, 0, 1, request as u8]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_boundaries() {
        assert_eq!(next_record(&[23, 3, 3, 0]), Ok(None));
        assert_eq!(next_record(&[23, 3, 3, 0, 2, 9]), Ok(None));
        assert_eq!(next_record(&[23, 3, 3, 0, 2, 9, 9, 1]), Ok(Some(7)));
        assert_eq!(next_record(&[23, 9, 9, 0, 0]), Ok(Some(5)));
        let long = (MAX_CIPHERTEXT as u16 + 1).to_be_bytes();
        assert_eq!(
            next_record(&[23, 3, 3, long[0], long[1]])
                .unwrap_err()
                .alert,
            alert::RECORD_OVERFLOW
        );
        for typ in [20, 21, 22, 0, 255] {
            assert_eq!(
                next_record(&[typ, 3, 3, 0, 1, 1]).unwrap_err().alert,
                alert::UNEXPECTED_MESSAGE
            );
        }
    }

    #[test]
    fn inner_records() {
        assert_eq!(classify(23, b""), Ok(Inner::Data));
        assert_eq!(classify(21, &[1, 0]), Ok(Inner::Closed));
        assert_eq!(classify(21, &[1, 90]), Ok(Inner::Ignore));
        assert!(classify(21, &[2, 90]).is_err());
        assert!(classify(21, &[2, 40]).is_err());
        assert_eq!(
            classify(21, &[]).unwrap_err().alert,
            alert::UNEXPECTED_MESSAGE
        );
        assert!(classify(21, &[1]).is_err());
        assert_eq!(classify(22, &[24, 0, 0, 1, 0]), Ok(Inner::KeyUpdate(false)));
        assert_eq!(classify(22, &[24, 0, 0, 1, 1]), Ok(Inner::KeyUpdate(true)));
        assert_eq!(
            classify(22, &[24, 0, 0, 1, 2]).unwrap_err().alert,
            alert::ILLEGAL_PARAMETER
        );
        assert_eq!(
            classify(22, &[24, 0, 0, 1, 0, 24, 0, 0, 1, 0])
                .unwrap_err()
                .alert,
            alert::UNEXPECTED_MESSAGE
        );
        // Two key updates in one record, a split one, and a ticket from the client.
        assert!(classify(22, &[24, 0, 0, 1, 0, 24, 0, 0, 1, 0]).is_err());
        assert!(classify(22, &[24, 0, 0]).is_err());
        assert!(classify(22, &[4, 0, 0, 1, 0]).is_err());
        assert!(classify(20, &[1]).is_err());
        assert!(classify(23, &vec![0; MAX_PLAINTEXT + 1]).is_err());
    }

    /// The key schedule step against RFC 8448's simple 1-RTT trace: the client's application
    /// traffic secret, its key and IV.
    #[test]
    fn traffic_keys_match_rfc_8448() {
        let suite = match crate::server::tls::suites::provider()
            .cipher_suites
            .into_iter()
            .find(|s| s.suite() == rustls::CipherSuite::TLS13_AES_128_GCM_SHA256)
        {
            Some(rustls::SupportedCipherSuite::Tls13(s)) => s,
            _ => unreachable!(),
        };
        let secret = hex("9e40646ce79a7f9dc05af8889bce6552875afa0b06df0087f792ebb7c17504a5");
        let keys = keys_of(suite, OkmBlock::new(&secret));
        assert_eq!(
            keys.key.as_ref(),
            &hex("17422dda596ed5d9acd890e3c63f5051")[..]
        );
        assert_eq!(keys.iv.as_ref(), &hex("5b78923dee08579033e523d9")[..]);
        // The update step is the same expansion under another label; it must give a new key.
        let next = next_keys(suite, &keys.secret);
        assert_ne!(next.key.as_ref(), keys.key.as_ref());
        assert_eq!(next.secret.as_ref().len(), 32);
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }
}
