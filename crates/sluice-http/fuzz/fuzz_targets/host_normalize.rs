//! Any text through `route::normalize_host`, which promises a lowercase name without port or
//! trailing dot, borrowed when nothing needed lowering. For any text: no ASCII upper case, no
//! trailing dot, a piece of the input unless upper case was lowered, deterministic. For a
//! host `host::parse_host` accepts (the only kind routing sees): the host part as written,
//! lowercased, without brackets or trailing dot, and normalising a name again changes nothing;
//! the exact route pattern of that name matches the host.
#![no_main]

use std::borrow::Cow;

use libfuzzer_sys::fuzz_target;
use sluice_http::host::parse_host_text;
use sluice_http::route::{normalize_host, HostPattern};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let n = normalize_host(text);
    assert_eq!(n, normalize_host(text));
    assert!(
        !n.bytes().any(|b| b.is_ascii_uppercase()),
        "{text:?} -> {n:?}"
    );
    assert!(!n.ends_with('.'), "{text:?} -> {n:?}");
    // Borrowed: a piece of the input; a copy only when there was upper case to lower.
    match &n {
        Cow::Borrowed(b) => {
            let (start, end) = (text.as_ptr() as usize, text.as_ptr() as usize + text.len());
            let at = b.as_ptr() as usize;
            assert!(at >= start && at + b.len() <= end);
        }
        Cow::Owned(_) => assert!(text.bytes().any(|b| b.is_ascii_uppercase()), "{text:?}"),
    }
    let Ok(hp) = parse_host_text(text) else {
        return;
    };
    let host = hp.host.trim_end_matches('.');
    match host.strip_prefix('[') {
        Some(literal) => {
            let literal = literal.strip_suffix(']').expect("a bracketed literal");
            assert_eq!(*n, literal.to_ascii_lowercase(), "{text:?}");
            assert!(n.parse::<std::net::Ipv6Addr>().is_ok(), "{text:?} -> {n:?}");
        }
        None => {
            assert_eq!(*n, host.to_ascii_lowercase(), "{text:?}");
            assert!(!n.contains(':'), "{text:?} -> {n:?}");
            // Idempotent, and the name is itself a valid host.
            assert_eq!(normalize_host(&n), n, "{text:?}");
            assert!(parse_host_text(&n).is_ok(), "{text:?} -> {n:?}");
            // A route naming this host serves it (`~` is a host character routes cannot name).
            if let Ok(pattern) = HostPattern::parse(&n) {
                assert_eq!(pattern, HostPattern::Exact(n.to_string()));
                assert!(pattern.matches(hp.host), "{text:?}");
            }
        }
    }
});
