//! Resolves arbitrary `Location` values against a fixed URI: never a panic, and whatever
//! resolves is an absolute http(s) URI with a host.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(location) = std::str::from_utf8(data) else {
        return;
    };
    let base: http::Uri = "http://a.example:8080/b/c/d?q".parse().unwrap();
    if let Ok(uri) = sluice_http::location::resolve(&base, location) {
        assert!(matches!(uri.scheme_str(), Some("http" | "https")));
        assert!(uri.host().is_some_and(|h| !h.is_empty()));
        assert!(uri.path().starts_with('/'));
    }
});
