//! Fuzzes `transformer=ts_stream`'s stripper: any body, cut anywhere, never panics, gives out a
//! suffix of its input, and gives the same bytes however the body is chunked.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use sluice_media::mpegts::unwrap::{unwrap_whole, TsUnwrap};

fuzz_target!(|data: &[u8]| {
    // The first two bytes choose the window and a chunk size; the rest is the body.
    let [w, c, body @ ..] = data else {
        return;
    };
    let window = usize::from(*w) * 64;
    let chunk = usize::from(*c).max(1);
    let whole = unwrap_whole(Bytes::copy_from_slice(body), window);
    assert!(body.ends_with(&whole));
    let mut unwrap = TsUnwrap::new(window);
    let mut out = Vec::new();
    for piece in body.chunks(chunk) {
        if let Some(b) = unwrap.push(Bytes::copy_from_slice(piece)) {
            out.extend_from_slice(&b);
        }
    }
    if let Some(b) = unwrap.finish() {
        out.extend_from_slice(&b);
    }
    assert_eq!(out, whole.to_vec());
});
