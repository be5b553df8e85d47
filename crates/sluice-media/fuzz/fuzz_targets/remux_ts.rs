//! Fuzzes the fMP4 → MPEG-TS remuxer: an attacker-chosen init and media segment, never a panic,
//! and whatever comes out is whole TS packets, at most a few times the segment's size.
//!
//! Framing: a two-byte little-endian init length, the init, then the segment. An init the
//! remuxer refuses falls back to one of the real fixture inits (picked by the length's low bit),
//! so segment mutations always reach the sample walk and the packetiser.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sluice_media::cenc::rewrite_init;
use sluice_media::remux::{RemuxState, Remuxer, OUTPUT_ALLOWANCE, OUTPUT_PER_INPUT};

const INITS: [&[u8]; 2] = [
    include_bytes!("../../tests/fixtures/drm/cenc/video/init.mp4"),
    include_bytes!("../../tests/fixtures/drm/cenc/audio/init.mp4"),
];

fn fixtures() -> &'static [Remuxer; 2] {
    static REMUXERS: OnceLock<[Remuxer; 2]> = OnceLock::new();
    REMUXERS.get_or_init(|| {
        INITS.map(|init| {
            let (clear, _) = rewrite_init(init).expect("fixture init");
            Remuxer::new(&clear).expect("fixture remuxer")
        })
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((len, rest)) = data.split_first_chunk::<2>() else {
        return;
    };
    let len = u16::from_le_bytes(*len);
    let (init, segment) = rest.split_at(usize::from(len).min(rest.len()));
    let own = Remuxer::new(init).ok();
    let remuxer = own
        .as_ref()
        .unwrap_or(&fixtures()[usize::from(len & 1)]);
    let mut state = RemuxState::default();
    if let Ok(ts) = remuxer.segment(segment, &mut state) {
        assert_eq!(ts.len() % 188, 0);
        assert!(ts.chunks(188).all(|p| p[0] == 0x47));
        assert!(ts.len() <= segment.len() * OUTPUT_PER_INPUT + OUTPUT_ALLOWANCE);
    }
});
