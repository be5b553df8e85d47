//! Fuzzes `/playlist/playlist`'s pure half: the first line is `d` (source definitions), the rest
//! is every source's body. Any input: no panic, exactly one `#EXTM3U` header out.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_media::m3u::{self, Fetched};
use sluice_media::query::Query;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (d, body) = text.split_once('\n').unwrap_or((&text, ""));
    let sources = match m3u::parse_sources(d) {
        Ok(s) => s,
        Err(_) => m3u::parse_sources("http://a/1.m3u;sort:http://b/2.m3u;no_proxy:http://c/3")
            .expect("the fallback sources parse"),
    };
    // Alternate failures in, so both kinds of source meet in one merge.
    let fetched: Vec<Fetched> = (0..sources.len())
        .map(|i| match i % 3 {
            2 => Fetched::Failed(body.chars().take(40).collect()),
            _ => Fetched::Text(body.to_string()),
        })
        .collect();
    // A low entry bound, so both outcomes are reached; over it is an error, never a panic.
    let limits = m3u::Limits::new(64, &fetched);
    let Ok(out) = m3u::merge(&sources, &fetched, limits, &mut |t| {
        format!(
            "http://p{}?{}",
            t.endpoint.path(),
            Query::from_pairs(t.params.clone()).encode()
        )
    }) else {
        return;
    };
    assert!(out.starts_with("#EXTM3U"));
    assert_eq!(out.lines().filter(|l| l.starts_with("#EXTM3U")).count(), 1);
});
