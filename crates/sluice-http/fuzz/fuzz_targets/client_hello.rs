//! Fuzzes the ClientHello reader: hostile bytes, raw or behind a valid record header, must never
//! panic, and an incomplete answer always asks for more than it has.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_http::client_hello::{parse, Parsed};

fuzz_target!(|data: &[u8]| {
    if let Ok(Parsed::Incomplete { needed }) = parse(data) {
        assert!(needed > data.len());
    }
    let mut tls = vec![22, 3, 1];
    tls.extend_from_slice(data);
    let _ = parse(&tls);
});
