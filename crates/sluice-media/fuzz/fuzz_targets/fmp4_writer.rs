//! Fuzzes the TS → fMP4 writer's input side: attacker-chosen TS segments fed one after another
//! to one writer (so what a segment leaves unfinished meets the next), never a panic, and
//! whatever comes out is boxes the MP4 reader walks.
//!
//! Framing: the input is cut into segments at each `0xff 0x00 0xff 0x00` marker (at most 8);
//! a segment whose first byte is odd is preceded by a reset (a discontinuity). Each segment is
//! used twice: as given, and with a real PAT and PMT (H.264 on PID 0x100, AAC on 0x101) put in
//! front, so mutations reach the PES, H.264 and ADTS parsers rather than stopping at the tables.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_media::fmp4::Writer;
use sluice_media::mp4::boxes;

/// PAT (program 1 → PMT PID 0x1000) and PMT (H.264 on 0x100, ADTS AAC on 0x101), as ffmpeg
/// writes them.
fn tables() -> Vec<u8> {
    let mut pat = vec![0x47, 0x40, 0x00, 0x10, 0x00];
    pat.extend_from_slice(&[
        0x00, 0xb0, 0x0d, 0x00, 0x01, 0xc1, 0x00, 0x00, 0x00, 0x01, 0xf0, 0x00, 0x2a, 0xb1, 0x04,
        0xb2,
    ]);
    pat.resize(188, 0xff);
    let mut pmt = vec![0x47, 0x50, 0x00, 0x10, 0x00];
    pmt.extend_from_slice(&[
        0x02, 0xb0, 0x17, 0x00, 0x01, 0xc1, 0x00, 0x00, 0xe1, 0x00, 0xf0, 0x00, 0x1b, 0xe1, 0x00,
        0xf0, 0x00, 0x0f, 0xe1, 0x01, 0xf0, 0x00, 0x2f, 0x44, 0xb9, 0x9b,
    ]);
    pmt.resize(188, 0xff);
    pat.extend_from_slice(&pmt);
    pat
}

fuzz_target!(|data: &[u8]| {
    let head = tables();
    let mut writer = Writer::new();
    for (n, segment) in split(data).into_iter().take(8).enumerate() {
        if segment.first().is_some_and(|b| b & 1 == 1) {
            writer.reset();
        }
        let mut framed = head.clone();
        framed.extend_from_slice(segment);
        for input in [segment, &framed[..]] {
            if let Ok(f) = writer.segment(input, n as u32 + 1, Some(u64::from(n as u32) * 3600)) {
                assert!(boxes(&f.media).all(|b| b.is_ok()));
                assert!(boxes(&f.init).all(|b| b.is_ok()));
            }
        }
    }
});

/// The input cut at every `ff 00 ff 00`.
fn split(data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = data;
    while let Some(at) = rest.windows(4).position(|w| w == [0xff, 0, 0xff, 0]) {
        out.push(&rest[..at]);
        rest = &rest[at + 4..];
    }
    out.push(rest);
    out
}
