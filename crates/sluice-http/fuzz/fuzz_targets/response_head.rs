//! Feeds arbitrary bytes to the upstream response head parser and its body framing rules, and
//! to the plain-head writer, which must agree with the parser on every head it passes on.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_http::plain_head::write_plain;
use sluice_http::response_head::{parse, BodyLength};

fuzz_target!(|data: &[u8]| {
    let general = parse(data);
    if let Ok(Some(head)) = &general {
        assert!(head.len <= data.len());
        let _ = head.body_length(false);
        let _ = head.body_length(true);
    }
    let mut out = Vec::new();
    if let Some(plain) = write_plain(data, false, true, &mut out) {
        let head = general
            .expect("a plain head parses")
            .expect("a plain head is complete");
        assert_eq!((head.status, head.len), (plain.status, plain.len));
        assert_eq!(head.body_length(false), Ok(plain.length));
        assert!(!matches!(plain.length, BodyLength::Empty));
        // What it wrote is a head again, with no hop-by-hop field left.
        out.extend_from_slice(b"\r\n");
        let again = parse(&out).expect("written head parses").expect("complete");
        assert_eq!(again.status, plain.status);
        for hop in ["connection", "keep-alive", "transfer-encoding", "te", "upgrade", "via"] {
            assert!(!again.headers.contains_key(hop), "{hop}");
        }
    }
});
