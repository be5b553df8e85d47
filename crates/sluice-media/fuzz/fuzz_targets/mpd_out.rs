//! Fuzzes DASH out: an MPD that parses is rewritten (every SegmentBase track given a made-up
//! sidx), and the rewritten MPD must parse again with the same Representations.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use sluice_media::dash::out::{rewrite_mpd, template_path, OutOptions, OutUrl};
use sluice_media::dash::{parse_mpd, sidx_fetch, SidxFragment};

fuzz_target!(|data: &[u8]| {
    // 4 bytes pick "now", 1 byte whether protection is stripped; the rest is the MPD.
    let (head, text) = data.split_at(data.len().min(5));
    let mut clock = [0u8; 5];
    clock[..head.len()].copy_from_slice(head);
    let now = f64::from(u32::from_le_bytes([clock[0], clock[1], clock[2], clock[3]])) * 2.0;
    let Ok(xml) = std::str::from_utf8(text) else {
        return;
    };
    let base = url::Url::parse("https://origin.example/live/manifest.mpd").expect("static URL");
    let Ok(mpd) = parse_mpd(xml, &base) else {
        return;
    };
    let mut sidx = HashMap::new();
    for (_, _, rep) in mpd.representations() {
        if let Some(fetch) = sidx_fetch(rep) {
            let (a, b) = fetch.range;
            let fragments = vec![
                SidxFragment {
                    range: (b.saturating_add(1), b.saturating_add(1000)),
                    duration_secs: 2.0,
                },
                SidxFragment {
                    range: (b.saturating_add(1001), b.saturating_add(1500)),
                    duration_secs: (a % 7) as f64 + 0.5,
                },
            ];
            sidx.insert(fetch, fragments);
        }
    }
    let options = OutOptions {
        now,
        strip_protection: clock[4] & 1 == 1,
        sidx,
    };
    let Ok(out) = rewrite_mpd(xml, &mpd, &options, |target| match target {
        OutUrl::Template { template, .. } => {
            format!("https://proxy.example{}?t=1&amp=2", template_path(template))
        }
        OutUrl::Media(_) => "https://proxy.example/proxy/mpd/segment.mp4?a=\"<&>".to_owned(),
        OutUrl::File { .. } => "https://proxy.example/proxy/stream?d=x".to_owned(),
    }) else {
        return;
    };
    let again = parse_mpd(&out, &base).expect("the rewritten MPD parses");
    assert_eq!(
        again.representations().count(),
        mpd.representations().count(),
        "same Representations"
    );
});
