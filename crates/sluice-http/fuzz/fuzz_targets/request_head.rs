//! Feeds arbitrary paths, hosts and framing headers to the reverse proxy's pure request checks.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_http::route::{HostPattern, RouteTable};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(4, '\n');
    let path = parts.next().unwrap_or("");
    let host = parts.next().unwrap_or("");
    let cl = parts.next().unwrap_or("");
    let te = parts.next().unwrap_or("");
    if let Ok(normal) = sluice_http::path::normalize_path(path) {
        assert!(normal.starts_with('/'));
        let table = RouteTable::build([
            (HostPattern::Any, "/".to_string(), 0u8),
            (HostPattern::Wildcard(".example.com".into()), "/api".to_string(), 1u8),
        ])
        .unwrap();
        assert!(table.lookup(Some(host), &normal).is_some());
    }
    let _ = HostPattern::parse(host);
    let mut headers = http::HeaderMap::new();
    if let Ok(v) = http::HeaderValue::from_str(cl) {
        headers.insert(http::header::CONTENT_LENGTH, v);
    }
    if let Ok(v) = http::HeaderValue::from_str(te) {
        headers.append(http::header::TRANSFER_ENCODING, v);
    }
    let _ = sluice_http::framing::check_request(&headers, true);
    sluice_http::hop::strip_hop_by_hop(&mut headers, true);
});
