//! Arbitrary `Host` values: never a panic, and whatever passes holds only the characters of the
//! narrowed RFC 3986 grammar, with no empty label.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(hp) = sluice_http::host::parse_host(data) {
        assert!(data
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~:[]".contains(b)));
        assert!(!hp.host.is_empty());
        assert!(!hp.host.contains(".."));
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let mut headers = http::HeaderMap::new();
        if let Ok(v) = http::HeaderValue::from_str(text) {
            headers.insert(http::header::HOST, v);
        }
        let _ = sluice_http::host::check_request_host(http::Version::HTTP_2, &headers, Some(text));
    }
});
