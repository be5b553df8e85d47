//! Feeds arbitrary bytes to the upstream response head parser and its body framing rules, and
//! to the plain-head writers (text and HPACK), which must agree with the parser on every head
//! they pass on.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_http::plain_head::{write_plain, write_plain_hpack};
use sluice_http::response_head::{parse, BodyLength};

fuzz_target!(|data: &[u8]| {
    let general = parse(data);
    if let Ok(Some(head)) = &general {
        assert!(head.len <= data.len());
        let _ = head.body_length(false);
        let _ = head.body_length(true);
    }
    let mut hpack = Vec::new();
    let h2 = write_plain_hpack(data, false, true, &mut hpack);
    let mut out = Vec::new();
    let text = write_plain(data, false, true, &mut out);
    // The two forms pass on the same heads; the HPACK one leaves nothing behind when it does not.
    assert_eq!(h2.map(|p| p.head), text);
    if h2.is_none() {
        assert!(hpack.is_empty());
    }
    if let Some(plain) = text {
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
