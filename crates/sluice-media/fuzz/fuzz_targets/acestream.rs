//! Fuzzes the Acestream engine answer parsers and the content id check: any bytes, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_media::acestream::{parse_session, parse_stat, Content};

fuzz_target!(|data: &[u8]| {
    let _ = parse_session(data);
    let _ = parse_stat(data);
    if let Ok(text) = std::str::from_utf8(data) {
        let (a, b) = text.split_once('&').unwrap_or((text, ""));
        let _ = Content::from_params(Some(a), None);
        let _ = Content::from_params(None, Some(a));
        let _ = Content::from_params(Some(a), Some(b));
    }
});
