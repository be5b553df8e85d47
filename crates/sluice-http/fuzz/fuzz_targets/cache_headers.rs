//! Fuzzes the cache header parsers (`Cache-Control`, `Range`, `Content-Range`, conditionals, the
//! storability decision): any bytes as any of those fields, never a panic.
#![no_main]

use std::time::{Duration, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue, Method, StatusCode};
use libfuzzer_sys::fuzz_target;
use sluice_http::{cache_control, conditional, freshness, range};

fuzz_target!(|data: &[u8]| {
    let Some((&len_byte, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let _ = cache_control::parse_str(&text);
    let _ = range::resolve_range(&text, u64::from(len_byte) * 1000);
    let _ = range::parse_content_range(&text);
    let Ok(value) = HeaderValue::from_bytes(rest) else {
        return;
    };
    let mut headers = HeaderMap::new();
    for name in ["cache-control", "cdn-cache-control", "expires", "date", "last-modified", "age",
                 "vary", "etag", "if-none-match", "if-modified-since", "if-range"] {
        headers.insert(name, value.clone());
    }
    let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let policy = freshness::FreshnessPolicy::default();
    if let Ok(f) = freshness::storability(&Method::GET, &headers, StatusCode::OK, &headers, now, &policy) {
        let age = freshness::AgeClock::new(&headers, now, now).current_age(now);
        let _ = freshness::decide_use(&f, age, &cache_control::parse_cache_control(&headers), &policy);
    }
    let _ = conditional::not_modified(&headers, &headers);
    let _ = conditional::if_range_allows(&headers, &headers);
    if let Ok(names) = freshness::vary_names(&headers) {
        let _ = freshness::variant_key(&names, &headers);
    }
});
