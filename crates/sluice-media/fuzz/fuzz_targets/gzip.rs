//! Fuzzes the gzip reader the EPG uses on fetched guides: never a panic, never more output than
//! the bound, and whatever it accepts, written again as one member, reads back the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_media::gzip::{compress, decompress};

const MAX: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    if let Ok(out) = decompress(data, MAX) {
        assert!(out.len() <= MAX);
        assert_eq!(decompress(&compress(&out, 1), MAX).unwrap(), out);
    }
});
