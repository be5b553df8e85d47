//! Fuzzes the request parameter parsers the hardening changed: the query string, the shared proxy
//! params (`d`, `h_*`, `r_*`, `rp_*`, `x_headers`) and the destination decoder. Never a panic, and
//! whatever is accepted keeps the rules: no framing or hop-by-hop header, no CR/LF/NUL in a value,
//! an http(s) destination with a host, and a query that survives re-encoding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_media::query::{is_forbidden_header, parse_destination, ProxyParams, Query};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let query = Query::parse(text);
    assert_eq!(Query::parse(&query.encode()), query, "re-encoding changed the query");
    if let Ok(params) = ProxyParams::from_query(&query) {
        assert!(matches!(params.destination.scheme(), "http" | "https"));
        assert!(params.destination.host_str().is_some_and(|h| !h.is_empty()));
        for (name, value) in params
            .request_headers
            .iter()
            .chain(&params.response_headers)
            .chain(&params.propagate_headers)
        {
            assert!(!is_forbidden_header(name), "forbidden header {name} accepted");
            assert!(!name.is_empty());
            assert!(
                !value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0),
                "header value with a line break accepted"
            );
            assert!(http::HeaderName::from_bytes(name.as_bytes()).is_ok(), "{name}");
        }
    }
    if let Ok(url) = parse_destination(text) {
        assert!(matches!(url.scheme(), "http" | "https"));
    }
});
