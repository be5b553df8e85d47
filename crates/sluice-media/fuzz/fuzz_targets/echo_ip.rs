//! Fuzzes the echo service answer parser behind `/proxy/ip`: any bytes, any field, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_media::public_ip::parse_answer;

fuzz_target!(|data: &[u8]| {
    let _ = parse_answer(data, None);
    // The first line names the JSON field.
    if let Some(at) = data.iter().position(|&b| b == b'\n') {
        if let Ok(field) = std::str::from_utf8(&data[..at]) {
            let _ = parse_answer(&data[at + 1..], Some(field));
        }
    }
});
