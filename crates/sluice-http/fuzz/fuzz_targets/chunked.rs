//! Feeds arbitrary bytes, in pieces of sizes the input chooses, to the chunked body decoder.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_http::chunked::Decoder;

fuzz_target!(|data: &[u8]| {
    let Some((&step, coded)) = data.split_first() else {
        return;
    };
    let step = usize::from(step).max(1);
    let mut decoder = Decoder::new();
    // The relay's scanner runs beside the decoder and must agree with it on every piece.
    let mut scanner = Decoder::new();
    let mut out = Vec::new();
    let mut at = 0;
    while at < coded.len() && !decoder.is_done() {
        let end = (at + step).min(coded.len());
        let scanned = scanner.skip(&coded[at..end]);
        let decoded = decoder.decode(&coded[at..end], &mut out);
        assert_eq!(scanned, decoded);
        assert_eq!(scanner.is_done(), decoder.is_done());
        match decoded {
            Ok(used) => {
                assert!(used <= end - at);
                // It stops short of its input only at the body's end.
                assert!(used == end - at || decoder.is_done());
                at += used;
            }
            Err(_) => return,
        }
    }
    // Body bytes are never more than the coded bytes read.
    assert!(out.len() <= at);
});
