//! Fuzzes the MP4 box walker, init rewriting and segment decryption: no input may panic, and
//! what decryption returns is never much larger than its input (it only removes boxes; samples
//! listed many times over must be refused, not decrypted again and again).
//!
//! The first byte picks the case: rewrite the input as an init segment, decrypt it as a media
//! segment against one of the real fixture inits (each scheme), or split it into an init and a
//! segment that are both attacker-controlled
//! (mode byte, a two-byte little-endian init length, the init, then the segment).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_media::cenc::{decrypt_segment, rewrite_init};
use sluice_media::keys::KeyRing;
use sluice_media::mp4::boxes;

const INITS: [&[u8]; 4] = [
    include_bytes!("../../tests/fixtures/drm/cenc/video/init.mp4"),
    include_bytes!("../../tests/fixtures/drm/cens/video/init.mp4"),
    include_bytes!("../../tests/fixtures/drm/cbc1/audio/init.mp4"),
    include_bytes!("../../tests/fixtures/drm/cbcs/video/init.mp4"),
];

fn keys() -> KeyRing {
    KeyRing::parse(
        Some("6d76f25cb17f5e16b8eaef6bbf582d8e,1fba7ed02bb85aa8b8c0dbf0d1ac2e7a"),
        "ce1b07f0b4c5f1b8c2a9f6ba2a8c7e41,4c2d8a6e3e5b9a7c1d0f2e4b6a8c9d1e",
    )
    .expect("fixture keys parse")
}

/// Decryption keeps or removes bytes; twice the input plus a little is already a bug.
fn assert_bounded(out: &[u8], input: &[u8]) {
    assert!(
        out.len() <= 2 * input.len() + 1024,
        "{} bytes out of {}",
        out.len(),
        input.len()
    );
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 6 {
        0 => {
            for b in boxes(rest).flatten() {
                b.children().for_each(drop);
            }
            let _ = rewrite_init(rest);
        }
        n @ 1..=4 => {
            let (_, info) = rewrite_init(INITS[n as usize - 1]).expect("fixture init");
            if let Ok(out) = decrypt_segment(rest, &info, &keys()) {
                assert_bounded(&out, rest);
            }
        }
        _ => {
            // Two length bytes (little-endian) frame the init; they are consumed here, so the
            // init's own first box header starts right after them and both halves are real input.
            let Some((len, rest)) = rest.split_first_chunk::<2>() else {
                return;
            };
            let split = usize::from(u16::from_le_bytes(*len)).min(rest.len());
            let (init, segment) = rest.split_at(split);
            if let Ok((_, info)) = rewrite_init(init) {
                if let Ok(out) = decrypt_segment(segment, &info, &keys()) {
                    assert_bounded(&out, segment);
                }
            }
        }
    }
});
