//! Fuzzes the RTSP client's parsers: a control-connection byte stream (responses, server
//! requests, interleaved frames), SDP, Transport/Session headers, Digest challenges and
//! catch-up ranges. Never a panic, never an item larger than the input, never a stall.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_media::rtsp::{auth, catchup, headers, next_item, sdp, Item, Limits, Next};

fuzz_target!(|data: &[u8]| {
    // The stream as the client reads it: item after item until one is incomplete or bad.
    let limits = Limits {
        max_head: 4096,
        max_body: 8192,
    };
    let mut rest = data;
    loop {
        let (item, used) = match next_item(rest, limits) {
            Ok(Next::Item(item, used)) => (item, used),
            // What it asks for is more than there is: never a wait for bytes already in.
            Ok(Next::NeedMore(need)) => {
                assert!(need > rest.len());
                break;
            }
            Err(_) => break,
        };
        assert!(used > 0 && used <= rest.len());
        if let Item::Message(m) = &item {
            assert!(m.body.len() <= limits.max_body);
            let _ = m.cseq();
            if let Some(t) = m.header("Transport") {
                let _ = headers::transport(t);
            }
            if let Some(s) = m.header("Session") {
                let _ = headers::session(s);
            }
            if let Ok(challenge) = auth::choose(m.headers_named("WWW-Authenticate")) {
                let input = auth::DigestInput {
                    method: "DESCRIBE",
                    uri: "rtsp://h/x",
                    nc: 1,
                    cnonce: "0a4f113b",
                };
                let _ = auth::authorization(&challenge, "u", "p", input);
            }
            if let Ok(media) = sdp::ts_media(&String::from_utf8_lossy(&m.body)) {
                let _ = sdp::control_url("rtsp://h/x/", media.control.as_deref());
            }
        }
        rest = &rest[used..];
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let zone = catchup::user_agent_zone(text).unwrap_or(0);
        if let Ok(seek) = catchup::parse_seek(text, zone) {
            let _ = catchup::clock_range(&seek, -3600);
            let _ = catchup::rewrite(&seek, 3600);
        }
    }
});
