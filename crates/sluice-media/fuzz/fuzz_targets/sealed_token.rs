//! Fuzzes the sealed token codec two ways: any text given to `open` never panics, and any change
//! to a real token (bytes flipped, cut, or extended, chosen by the input) is refused.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_media::token::sealed::{Grant, SealedKey, NONCE_LEN};
use std::sync::OnceLock;

fn key_and_token() -> &'static (SealedKey, String) {
    static ONCE: OnceLock<(SealedKey, String)> = OnceLock::new();
    ONCE.get_or_init(|| {
        let key = SealedKey::derive("fuzz password");
        let grant = Grant {
            params: vec![
                ("d".into(), "https://cdn.example/v/index.m3u8".into()),
                ("h_referer".into(), "https://site.example/".into()),
            ],
            scope: vec!["/proxy/hls/".into()],
            exp: Some(4_000_000_000),
            ip: Some("203.0.113.7".into()),
        };
        let token = key.seal(&grant, [5; NONCE_LEN]);
        (key, token)
    })
}

fuzz_target!(|data: &[u8]| {
    let (key, token) = key_and_token();
    // 1. Arbitrary text: refused or opened, never a panic.
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = key.open(text);
    }
    // 2. A mutation of the real token: the first byte picks the operation, the rest drive it.
    let Some((&op, rest)) = data.split_first() else {
        return;
    };
    let mut mutated = token.as_bytes().to_vec();
    match op % 4 {
        // XOR a mask into the text from a position.
        0 => {
            if let Some((&at, mask)) = rest.split_first() {
                let start = usize::from(at) % mutated.len();
                for (b, m) in mutated[start..].iter_mut().zip(mask) {
                    *b ^= m;
                }
            }
        }
        // Cut it.
        1 => {
            let keep = rest.first().map_or(0, |&n| usize::from(n)) % mutated.len();
            mutated.truncate(keep);
        }
        // Append bytes.
        2 => mutated.extend_from_slice(rest),
        // Replace one character with any base64url character.
        _ => {
            const ALPHABET: &[u8] =
                b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
            if let [at_hi, at_lo, c, ..] = rest {
                let at = usize::from(u16::from_be_bytes([*at_hi, *at_lo])) % mutated.len();
                mutated[at] = ALPHABET[usize::from(*c) % ALPHABET.len()];
            }
        }
    }
    let Ok(text) = std::str::from_utf8(&mutated) else {
        return;
    };
    if text != token.as_str() {
        assert!(
            key.open(text).is_err(),
            "a mutated token was accepted: {text}"
        );
    } else {
        assert!(key.open(text).is_ok());
    }
});
