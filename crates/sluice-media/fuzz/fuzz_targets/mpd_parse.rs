//! Fuzzes MPD parsing and everything a handler runs after it (master, every media playlist).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_media::dash::{parse_mpd, to_hls_master, to_hls_media, MasterOptions, MediaOptions};

fuzz_target!(|data: &[u8]| {
    // The first 8 bytes pick "now", so live windows are explored too.
    let (clock, text) = data.split_at(data.len().min(8));
    let mut now = [0u8; 8];
    now[..clock.len()].copy_from_slice(clock);
    let now = f64::from(u32::from_le_bytes([now[0], now[1], now[2], now[3]])) * 2.0;
    let Ok(xml) = std::str::from_utf8(text) else {
        return;
    };
    let base = url::Url::parse("https://origin.example/live/manifest.mpd").expect("static URL");
    let Ok(mpd) = parse_mpd(xml, &base) else {
        return;
    };
    let _ = to_hls_master(&mpd, &MasterOptions::default(), |r| r.profile_id.clone());
    let profiles: Vec<String> = mpd
        .representations()
        .map(|(_, _, r)| r.profile_id.clone())
        .collect();
    let options = MediaOptions {
        now,
        live_depth: Some(15),
        ..MediaOptions::default()
    };
    for profile in profiles {
        let _ = to_hls_media(&mpd, &profile, &options, |_| String::from("u"));
    }
});
