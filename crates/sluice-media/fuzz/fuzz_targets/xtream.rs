//! Fuzzes the XC username and path parsers and the response rewriter: any text, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_media::xtream::rewrite::Rewriter;
use sluice_media::xtream::{parse_path, parse_username};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = parse_username(text);
    if let Some(path) = parse_path(text) {
        let _ = path.upstream_path("alice");
    }
    // The first line names the real user, so the rewriter also sees users that occur in the body.
    let (user, body) = text.split_once('\n').unwrap_or(("alice", text));
    let rewriter = Rewriter {
        upstream_origin: "http://xc.example:8080",
        real_user: user,
        public_origin: "https://proxy.example",
        public_user: "TOKEN",
    };
    let _ = rewriter.rewrite_text(body);
    let _ = rewriter.rewrite_login(body);
});
