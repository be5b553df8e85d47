//! Fuzzes the PROXY protocol parser: hostile bytes must never panic, a complete header never claims
//! more bytes than it was given, and an incomplete answer always asks for more than it has.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_http::proxy_protocol::{parse, Parsed};

fuzz_target!(|data: &[u8]| {
    match parse(data) {
        Ok(Parsed::Complete(h)) => assert!(h.len <= data.len()),
        Ok(Parsed::Incomplete { needed }) => assert!(needed > data.len()),
        Err(_) => {}
    }
});
