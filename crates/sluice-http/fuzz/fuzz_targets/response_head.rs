//! Feeds arbitrary bytes to the upstream response head parser and its body framing rules, to
//! the plain-head writers (text and HPACK), which must agree with the parser on every head they
//! pass on, and to a plain-head memo, which must answer as the writers do.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_http::plain_head::{write_plain, write_plain_hpack, Memo};
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
    // A memo that saw the first half (a head of its own, or not), the whole, the whole with the
    // last byte of a `Date` value changed (to any byte), and the whole again; the first byte's
    // low bits choose HEAD and this hop's Via.
    let mut varied = data.to_vec();
    if let Some(i) = varied.windows(6).position(|w| w.eq_ignore_ascii_case(b"date: ")) {
        let v = i + 6;
        if let Some(e) = varied[v..].windows(2).position(|w| w == b"\r\n").filter(|&e| e > 0) {
            let last = v + e - 1;
            varied[last] = varied[last].wrapping_add(data[0] | 1);
        }
    }
    let (head_request, via) = data.first().map_or((false, true), |b| (b & 1 == 1, b & 2 == 0));
    let (mut memo, mut memo_h2) = (Memo::default(), Memo::default());
    for buf in [&data[..data.len() / 2], data, &varied[..], data] {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        assert_eq!(
            memo.write_plain(buf, head_request, via, &mut a),
            write_plain(buf, head_request, via, &mut b)
        );
        assert_eq!(a, b);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        assert_eq!(
            memo_h2.write_plain_hpack(buf, head_request, via, &mut a),
            write_plain_hpack(buf, head_request, via, &mut b)
        );
        assert_eq!(a, b);
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
