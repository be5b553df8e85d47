//! Sealing TLS 1.3 records straight into the record layer's write buffer with the crypto
//! provider's AEAD (aws-lc-rs, or ring in a `ring` build): rustls's own record protection seals
//! into a `Vec` of its own, an allocation and a free per record (`own-record-layer.md`).

#[cfg(feature = "aws-lc")]
use aws_lc_rs::aead;
#[cfg(all(feature = "ring", not(feature = "aws-lc")))]
use ring::aead;

use rustls::crypto::cipher::{AeadKey, Iv, Nonce};
use rustls::{CipherSuite, ContentType, Tls13CipherSuite};

use super::record::{APPLICATION_DATA, HEADER, MAX_PLAINTEXT};

/// The AEAD tag every TLS 1.3 suite appends.
const TAG: usize = 16;

/// One traffic key, ready to seal records.
pub struct Sealer {
    key: aead::LessSafeKey,
    iv: Iv,
    /// The lowest sequence number not used yet: a nonce is never sealed under twice (the
    /// general key keeps no such state of its own, as rustls's TLS 1.3 one did).
    next: u64,
}

/// Why a record could not be sealed.
#[derive(Debug)]
pub struct SealError;

impl Sealer {
    /// The sealer of `suite`'s `key` and `iv`; `None` for a suite this layer does not know (the
    /// connection then stays on rustls's record layer).
    pub fn new(suite: &Tls13CipherSuite, key: &AeadKey, iv: Iv) -> Option<Sealer> {
        let key = aead::UnboundKey::new(algorithm(suite)?, key.as_ref()).ok()?;
        Some(Sealer {
            key: aead::LessSafeKey::new(key),
            iv,
            next: 0,
        })
    }

    /// Whether `suite` is one this layer seals.
    pub fn knows(suite: &Tls13CipherSuite) -> bool {
        algorithm(suite).is_some()
    }

    /// Appends record number `seq` to `out`: `parts` (at most `MAX_PLAINTEXT` bytes together)
    /// and the inner content type `typ`, encrypted in place after the record header, then the
    /// tag. A sequence number below one already used is refused. On an error `out` is as it
    /// was.
    pub fn seal_into(
        &mut self,
        out: &mut Vec<u8>,
        typ: ContentType,
        parts: &[&[u8]],
        seq: u64,
    ) -> Result<(), SealError> {
        let plain: usize = parts.iter().map(|p| p.len()).sum();
        if plain > MAX_PLAINTEXT || seq < self.next {
            return Err(SealError);
        }
        // The inner plaintext (the data, then its type byte) and the tag.
        let len = (plain + 1 + TAG) as u16;
        let [hi, lo] = len.to_be_bytes();
        let header = [APPLICATION_DATA, 3, 3, hi, lo];
        let start = out.len();
        out.reserve(HEADER + usize::from(len));
        out.extend_from_slice(&header);
        for part in parts {
            out.extend_from_slice(part);
        }
        out.push(u8::from(typ));
        let nonce = aead::Nonce::assume_unique_for_key(Nonce::new(&self.iv, seq).0);
        let sealed = self.key.seal_in_place_separate_tag(
            nonce,
            aead::Aad::from(header),
            &mut out[start + HEADER..],
        );
        match sealed {
            Ok(tag) => {
                out.extend_from_slice(tag.as_ref());
                self.next = seq.saturating_add(1);
                Ok(())
            }
            Err(_) => {
                out.truncate(start);
                Err(SealError)
            }
        }
    }
}

fn algorithm(suite: &Tls13CipherSuite) -> Option<&'static aead::Algorithm> {
    match suite.common.suite {
        CipherSuite::TLS13_AES_128_GCM_SHA256 => Some(&aead::AES_128_GCM),
        CipherSuite::TLS13_AES_256_GCM_SHA384 => Some(&aead::AES_256_GCM),
        CipherSuite::TLS13_CHACHA20_POLY1305_SHA256 => Some(&aead::CHACHA20_POLY1305),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::crypto::cipher::InboundOpaqueMessage;
    use rustls::ProtocolVersion;

    fn suites() -> Vec<&'static Tls13CipherSuite> {
        crate::crypto::default_provider()
            .cipher_suites
            .iter()
            .filter_map(|s| match s {
                rustls::SupportedCipherSuite::Tls13(t) => Some(*t),
                _ => None,
            })
            .collect()
    }

    fn key_iv(suite: &Tls13CipherSuite) -> (AeadKey, Iv) {
        let keys = super::super::record::keys_of(
            suite,
            rustls::crypto::tls13::OkmBlock::new(
                &[7u8; 48][..suite.common.hash_provider.output_len()],
            ),
        );
        (keys.key, keys.iv)
    }

    /// What this layer seals, rustls's own record protection opens, for every TLS 1.3 suite,
    /// with the sequence number in the nonce; a wrong sequence number fails.
    #[test]
    fn rustls_opens_what_is_sealed() {
        let all = suites();
        assert_eq!(all.len(), 3, "the provider's TLS 1.3 suites");
        for suite in all {
            let (key, iv) = key_iv(suite);
            let mut sealer = Sealer::new(suite, &key, iv).expect("a known suite");
            let (key, iv) = key_iv(suite);
            let mut open = suite.aead_alg.decrypter(key, iv);
            let mut out = b"before".to_vec();
            let data = vec![0xabu8; 3000];
            sealer
                .seal_into(
                    &mut out,
                    ContentType::ApplicationData,
                    &[&data[..1000], &data[1000..]],
                    5,
                )
                .expect("sealed");
            assert_eq!(&out[..6], b"before");
            let record = &mut out[6..];
            assert_eq!(record.len(), HEADER + 3000 + 1 + TAG);
            assert_eq!(record[..3], [23, 3, 3]);
            let mut body = record[HEADER..].to_vec();
            let wrong = InboundOpaqueMessage::new(
                ContentType::ApplicationData,
                ProtocolVersion::TLSv1_2,
                &mut body,
            );
            assert!(open.decrypt(wrong, 4).is_err(), "{:?}", suite.common.suite);
            let msg = InboundOpaqueMessage::new(
                ContentType::ApplicationData,
                ProtocolVersion::TLSv1_2,
                &mut record[HEADER..],
            );
            let plain = open.decrypt(msg, 5).expect("opened");
            assert_eq!(plain.typ, ContentType::ApplicationData);
            assert_eq!(plain.payload, &data[..]);
        }
    }

    #[test]
    fn refuses_more_than_a_record_and_leaves_the_buffer() {
        let suite = suites()[0];
        let (key, iv) = key_iv(suite);
        let mut sealer = Sealer::new(suite, &key, iv).unwrap();
        let mut out = b"kept".to_vec();
        let big = vec![0u8; MAX_PLAINTEXT + 1];
        assert!(sealer
            .seal_into(&mut out, ContentType::ApplicationData, &[&big], 0)
            .is_err());
        assert_eq!(out, b"kept");
        // A sequence number used already, or below one, is refused too.
        sealer
            .seal_into(&mut out, ContentType::ApplicationData, &[b"x"], 7)
            .unwrap();
        let sealed = out.clone();
        for seq in [7, 6, 0] {
            assert!(sealer
                .seal_into(&mut out, ContentType::ApplicationData, &[b"x"], seq)
                .is_err());
            assert_eq!(out, sealed);
        }
    }

    /// The edges: an empty record, an alert and a handshake message, a record of exactly
    /// `MAX_PLAINTEXT` (the length field's largest value), and a sequence number with every byte
    /// set, each opened by rustls with its type and bytes.
    #[test]
    fn edges_open_with_their_type() {
        let suite = suites()[0];
        let (key, iv) = key_iv(suite);
        let mut sealer = Sealer::new(suite, &key, iv).unwrap();
        let (key, iv) = key_iv(suite);
        let mut open = suite.aead_alg.decrypter(key, iv);
        let full = vec![0x5au8; MAX_PLAINTEXT];
        let cases: [(ContentType, &[u8], u64); 4] = [
            (ContentType::ApplicationData, b"", 1),
            (ContentType::Alert, &[1, 0], 2),
            (ContentType::Handshake, &[24, 0, 0, 1, 0], 3),
            (ContentType::ApplicationData, &full, 0x0102_0304_0506_0708),
        ];
        for (typ, data, seq) in cases {
            let mut out = Vec::new();
            sealer.seal_into(&mut out, typ, &[data], seq).unwrap();
            let len = u16::from_be_bytes([out[3], out[4]]) as usize;
            assert_eq!(len, data.len() + 1 + TAG);
            assert_eq!(out.len(), HEADER + len);
            let msg = InboundOpaqueMessage::new(
                ContentType::ApplicationData,
                ProtocolVersion::TLSv1_2,
                &mut out[HEADER..],
            );
            let plain = open.decrypt(msg, seq).expect("opened");
            assert_eq!(plain.typ, typ);
            assert_eq!(plain.payload, data);
        }
    }
}
