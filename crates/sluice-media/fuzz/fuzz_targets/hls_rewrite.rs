//! Fuzzes `hls::rewrite_playlist` (and `sniff`): any bytes, any options, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_media::hls::{rewrite_playlist, sniff, RewriteOptions, Target};
use url::Url;

fuzz_target!(|data: &[u8]| {
    let _ = sniff(data);
    // The first byte picks the options, so one corpus explores every mode.
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let opts = RewriteOptions {
        key_url: (flags & 1 != 0).then(|| Url::parse("http://keys.example").unwrap()),
        key_only_proxy: flags & 2 != 0,
        no_proxy: flags & 4 != 0,
        start_offset: (flags & 8 != 0).then_some(-12.5),
        default_live_start_offset: Some(-18.0),
        skip: if flags & 16 != 0 {
            vec![(4.0, 20.0), (30.0, 31.0)]
        } else {
            Vec::new()
        },
        max_res: flags & 32 != 0,
        resolution: (flags & 64 != 0).then_some(720),
    };
    let base = Url::parse("https://cdn.example.com/a/b/index.m3u8?x=1").unwrap();
    let _ = rewrite_playlist(text, &base, &opts, &mut |target: Target, url: &Url| {
        format!("/p/{target:?}?d={url}").replace('"', "%22")
    });
});
