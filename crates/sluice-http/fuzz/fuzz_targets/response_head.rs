//! Feeds arbitrary bytes to the upstream response head parser and its body framing rules.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some(head)) = sluice_http::response_head::parse(data) {
        assert!(head.len <= data.len());
        let _ = head.body_length(false);
        let _ = head.body_length(true);
    }
});
