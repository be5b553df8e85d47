//! Exact-output tests of `rewrite_playlist` and the classification helpers.

use super::*;
use proptest::prelude::*;

const BASE: &str = "https://cdn.example.com/live/chan/index.m3u8?tok=1";

/// Readable stand-in for the front end's URL builder.
fn mark(target: Target, url: &Url) -> String {
    match target {
        Target::Playlist => format!("/m?d={url}"),
        Target::Segment { ext } => format!("/s.{}?d={url}", ext.as_str()),
        Target::Key => format!("/k?d={url}"),
        Target::Map { ext } => format!("/i.{}?d={url}", ext.as_str()),
    }
}

fn rewrite_with(text: &str, opts: &RewriteOptions) -> Result<String, HlsError> {
    rewrite_playlist(text, &Url::parse(BASE).unwrap(), opts, &mut mark)
}

fn rewrite(text: &str) -> String {
    rewrite_with(text, &RewriteOptions::default()).unwrap()
}

const MASTER: &str = r#"#EXTM3U
#EXT-X-VERSION:6
#EXT-X-INDEPENDENT-SEGMENTS
#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID="aud",NAME="English, main",LANGUAGE="en",URI="audio/en.m3u8"
#EXT-X-MEDIA:TYPE=CLOSED-CAPTIONS,GROUP-ID="cc",NAME="CC1",INSTREAM-ID="CC1"
#EXT-X-STREAM-INF:BANDWIDTH=800000,CODECS="avc1.4d401e,mp4a.40.2",RESOLUTION=640x360,AUDIO="aud"
low/index.m3u8
#EXT-X-STREAM-INF:BANDWIDTH=2500000,CODECS="avc1.4d401f,mp4a.40.2",RESOLUTION=1280x720,AUDIO="aud"
/abs/mid?type=video
#EXT-X-STREAM-INF:BANDWIDTH=5000000,CODECS="avc1.640028,mp4a.40.2",RESOLUTION=1920x1080,AUDIO="aud"
https://other.example.net/hi/index.m3u8
#EXT-X-I-FRAME-STREAM-INF:BANDWIDTH=90000,RESOLUTION=640x360,URI="low/iframes.m3u8"
# a comment, kept
#X-VENDOR-TAG:whatever
"#;

#[test]
fn master_routes_variants_media_and_iframes_to_playlists() {
    let want = r#"#EXTM3U
#EXT-X-VERSION:6
#EXT-X-INDEPENDENT-SEGMENTS
#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID="aud",NAME="English, main",LANGUAGE="en",URI="/m?d=https://cdn.example.com/live/chan/audio/en.m3u8"
#EXT-X-MEDIA:TYPE=CLOSED-CAPTIONS,GROUP-ID="cc",NAME="CC1",INSTREAM-ID="CC1"
#EXT-X-STREAM-INF:BANDWIDTH=800000,CODECS="avc1.4d401e,mp4a.40.2",RESOLUTION=640x360,AUDIO="aud"
/m?d=https://cdn.example.com/live/chan/low/index.m3u8
#EXT-X-STREAM-INF:BANDWIDTH=2500000,CODECS="avc1.4d401f,mp4a.40.2",RESOLUTION=1280x720,AUDIO="aud"
/m?d=https://cdn.example.com/abs/mid?type=video
#EXT-X-STREAM-INF:BANDWIDTH=5000000,CODECS="avc1.640028,mp4a.40.2",RESOLUTION=1920x1080,AUDIO="aud"
/m?d=https://other.example.net/hi/index.m3u8
#EXT-X-I-FRAME-STREAM-INF:BANDWIDTH=90000,RESOLUTION=640x360,URI="/m?d=https://cdn.example.com/live/chan/low/iframes.m3u8"
# a comment, kept
#X-VENDOR-TAG:whatever
"#;
    assert_eq!(rewrite(MASTER), want);
}

#[test]
fn media_with_key_map_byterange_and_crlf() {
    let text =
        "#EXTM3U\r\n#EXT-X-VERSION:7\r\n#EXT-X-TARGETDURATION:6\r\n#EXT-X-MEDIA-SEQUENCE:0\r\n\
#EXT-X-KEY:METHOD=AES-128,URI=\"key.bin?k=1\",IV=0x0000000000000000000000000000000A\r\n\
#EXT-X-MAP:URI=\"init.mp4\",BYTERANGE=\"720@0\"\r\n\
#EXTINF:6.0,\r\n#EXT-X-BYTERANGE:1000@720\r\nmain.m4s\r\n\
#EXTINF:6.0,title, with comma\r\n#EXT-X-BYTERANGE:1000\r\nmain.m4s\r\n\
#EXT-X-KEY:METHOD=NONE\r\n\
#EXTINF:6.0,\r\n/root/seg3.ts\r\n\
#EXTINF:6.0,\r\n//mirror.example.org/seg4.aac\r\n\
#EXTINF:6.0,\r\nhttp://plain.example.org/x/seg5\r\n\
#EXTINF:6.0,\r\n../up/seg6.M4V?x=1&y=2\r\n\
#EXT-X-ENDLIST\r\n";
    let want = "#EXTM3U\r\n#EXT-X-VERSION:7\r\n#EXT-X-TARGETDURATION:6\r\n#EXT-X-MEDIA-SEQUENCE:0\r\n\
#EXT-X-KEY:METHOD=AES-128,URI=\"/k?d=https://cdn.example.com/live/chan/key.bin?k=1\",IV=0x0000000000000000000000000000000A\r\n\
#EXT-X-MAP:URI=\"/i.mp4?d=https://cdn.example.com/live/chan/init.mp4\",BYTERANGE=\"720@0\"\r\n\
#EXTINF:6.0,\r\n#EXT-X-BYTERANGE:1000@720\r\n/s.m4s?d=https://cdn.example.com/live/chan/main.m4s\r\n\
#EXTINF:6.0,title, with comma\r\n#EXT-X-BYTERANGE:1000\r\n/s.m4s?d=https://cdn.example.com/live/chan/main.m4s\r\n\
#EXT-X-KEY:METHOD=NONE\r\n\
#EXTINF:6.0,\r\n/s.ts?d=https://cdn.example.com/root/seg3.ts\r\n\
#EXTINF:6.0,\r\n/s.aac?d=https://mirror.example.org/seg4.aac\r\n\
#EXTINF:6.0,\r\n/s.ts?d=http://plain.example.org/x/seg5\r\n\
#EXTINF:6.0,\r\n/s.m4v?d=https://cdn.example.com/live/up/seg6.M4V?x=1&y=2\r\n\
#EXT-X-ENDLIST\r\n";
    assert_eq!(rewrite(text), want);
}

#[test]
fn mixed_line_endings_are_each_preserved() {
    let text = "#EXTM3U\n#EXTINF:4,\r\na.ts\n#EXTINF:4,\nb.ts";
    let want = "#EXTM3U\n#EXTINF:4,\r\n/s.ts?d=https://cdn.example.com/live/chan/a.ts\n#EXTINF:4,\n/s.ts?d=https://cdn.example.com/live/chan/b.ts";
    assert_eq!(rewrite(text), want);
}

#[test]
fn plain_uri_lines_pointing_at_playlists() {
    let text = "#EXTM3U\nnext.m3u\nlist.M3U_PLUS\nget.php?type=m3u_plus&u=1\nvideo?type=video\n";
    let want = "#EXTM3U\n\
/m?d=https://cdn.example.com/live/chan/next.m3u\n\
/m?d=https://cdn.example.com/live/chan/list.M3U_PLUS\n\
/m?d=https://cdn.example.com/live/chan/get.php?type=m3u_plus&u=1\n\
/s.ts?d=https://cdn.example.com/live/chan/video?type=video\n";
    assert_eq!(rewrite(text), want);
}

#[test]
fn ll_hls_parts_hints_and_reports() {
    let text = r#"#EXTM3U
#EXT-X-TARGETDURATION:4
#EXT-X-SERVER-CONTROL:CAN-BLOCK-RELOAD=YES,PART-HOLD-BACK=1.0
#EXT-X-PART-INF:PART-TARGET=0.33334
#EXT-X-MEDIA-SEQUENCE:266
#EXT-X-MAP:URI="init.mp4"
#EXT-X-PART:DURATION=0.33334,URI="filePart266.0.m4s",INDEPENDENT=YES
#EXT-X-PART:DURATION=0.33334,URI="filePart266.1.m4s"
#EXTINF:4.00008,
fileSequence266.m4s
#EXT-X-PART:DURATION=0.33334,URI="filePart267.0.m4s"
#EXT-X-PRELOAD-HINT:TYPE=PART,URI="filePart267.1.m4s"
#EXT-X-PRELOAD-HINT:TYPE=MAP,URI="init2.mp4"
#EXT-X-RENDITION-REPORT:URI="../1M/waitForMSN.php",LAST-MSN=273,LAST-PART=2
"#;
    let want = r#"#EXTM3U
#EXT-X-TARGETDURATION:4
#EXT-X-SERVER-CONTROL:CAN-BLOCK-RELOAD=YES,PART-HOLD-BACK=1.0
#EXT-X-PART-INF:PART-TARGET=0.33334
#EXT-X-MEDIA-SEQUENCE:266
#EXT-X-MAP:URI="/i.mp4?d=https://cdn.example.com/live/chan/init.mp4"
#EXT-X-PART:DURATION=0.33334,URI="/s.m4s?d=https://cdn.example.com/live/chan/filePart266.0.m4s",INDEPENDENT=YES
#EXT-X-PART:DURATION=0.33334,URI="/s.m4s?d=https://cdn.example.com/live/chan/filePart266.1.m4s"
#EXTINF:4.00008,
/s.m4s?d=https://cdn.example.com/live/chan/fileSequence266.m4s
#EXT-X-PART:DURATION=0.33334,URI="/s.m4s?d=https://cdn.example.com/live/chan/filePart267.0.m4s"
#EXT-X-PRELOAD-HINT:TYPE=PART,URI="/s.m4s?d=https://cdn.example.com/live/chan/filePart267.1.m4s"
#EXT-X-PRELOAD-HINT:TYPE=MAP,URI="/i.mp4?d=https://cdn.example.com/live/chan/init2.mp4"
#EXT-X-RENDITION-REPORT:URI="/m?d=https://cdn.example.com/live/1M/waitForMSN.php",LAST-MSN=273,LAST-PART=2
"#;
    assert_eq!(rewrite(text), want);
}

const KEYED: &str = r#"#EXTM3U
#EXT-X-TARGETDURATION:10
#EXT-X-KEY:METHOD=AES-128,URI="https://keys.example.com:8443/k/1?x=y"
#EXT-X-MAP:URI="https://maps.example.com/init.m4s"
#EXTINF:10,
seg1.ts
#EXT-X-ENDLIST
"#;

#[test]
fn key_url_swaps_only_the_key_origin() {
    let opts = RewriteOptions {
        key_url: Some(Url::parse("http://sneaky.example.org").unwrap()),
        ..Default::default()
    };
    let want = r#"#EXTM3U
#EXT-X-TARGETDURATION:10
#EXT-X-KEY:METHOD=AES-128,URI="/k?d=http://sneaky.example.org/k/1?x=y"
#EXT-X-MAP:URI="/i.m4s?d=https://maps.example.com/init.m4s"
#EXTINF:10,
/s.ts?d=https://cdn.example.com/live/chan/seg1.ts
#EXT-X-ENDLIST
"#;
    assert_eq!(rewrite_with(KEYED, &opts).unwrap(), want);
}

#[test]
fn key_only_proxy_leaves_segments_and_maps_direct() {
    let opts = RewriteOptions {
        key_only_proxy: true,
        ..Default::default()
    };
    let want = r#"#EXTM3U
#EXT-X-TARGETDURATION:10
#EXT-X-KEY:METHOD=AES-128,URI="/k?d=https://keys.example.com:8443/k/1?x=y"
#EXT-X-MAP:URI="https://maps.example.com/init.m4s"
#EXTINF:10,
https://cdn.example.com/live/chan/seg1.ts
#EXT-X-ENDLIST
"#;
    assert_eq!(rewrite_with(KEYED, &opts).unwrap(), want);
    // Playlists still go through the proxy so their own keys get proxied.
    let master = "#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=1\nv.m3u8\n";
    assert_eq!(
        rewrite_with(master, &opts).unwrap(),
        "#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=1\n/m?d=https://cdn.example.com/live/chan/v.m3u8\n"
    );
}

#[test]
fn no_proxy_only_resolves() {
    let opts = RewriteOptions {
        no_proxy: true,
        key_only_proxy: true,
        ..Default::default()
    };
    let want = r#"#EXTM3U
#EXT-X-TARGETDURATION:10
#EXT-X-KEY:METHOD=AES-128,URI="https://keys.example.com:8443/k/1?x=y"
#EXT-X-MAP:URI="https://maps.example.com/init.m4s"
#EXTINF:10,
https://cdn.example.com/live/chan/seg1.ts
#EXT-X-ENDLIST
"#;
    let mut calls = 0;
    let got = rewrite_playlist(KEYED, &Url::parse(BASE).unwrap(), &opts, &mut |t, u| {
        calls += 1;
        mark(t, u)
    });
    assert_eq!(got.unwrap(), want);
    assert_eq!(calls, 0);
}

const LIVE: &str = "#EXTM3U\n#EXT-X-TARGETDURATION:6\n#EXT-X-MEDIA-SEQUENCE:0\n#EXTINF:6,\na.ts\n";
const VOD: &str = "#EXTM3U\n#EXT-X-PLAYLIST-TYPE:VOD\n#EXTINF:6,\na.ts\n#EXT-X-ENDLIST\n";
const START: &str = "#EXT-X-START:TIME-OFFSET=-18.0,PRECISE=YES\n";

fn live_default() -> RewriteOptions {
    RewriteOptions {
        default_live_start_offset: Some(-18.0),
        ..Default::default()
    }
}

#[test]
fn default_start_offset_only_for_live_media() {
    let got = rewrite_with(LIVE, &live_default()).unwrap();
    assert_eq!(
        got,
        format!("#EXTM3U\n{START}#EXT-X-TARGETDURATION:6\n#EXT-X-MEDIA-SEQUENCE:0\n#EXTINF:6,\n/s.ts?d=https://cdn.example.com/live/chan/a.ts\n")
    );
    let vod = rewrite_with(VOD, &live_default()).unwrap();
    assert!(!vod.contains("EXT-X-START"), "{vod}");
    let event_ended = "#EXTM3U\n#EXT-X-PLAYLIST-TYPE:EVENT\n#EXTINF:6,\na.ts\n#EXT-X-ENDLIST\n";
    assert!(!rewrite_with(event_ended, &live_default())
        .unwrap()
        .contains("EXT-X-START"));
    let master = rewrite_with(MASTER, &live_default()).unwrap();
    assert!(!master.contains("EXT-X-START"));
}

#[test]
fn explicit_start_offset_always_unless_present() {
    let opts = RewriteOptions {
        start_offset: Some(12.5),
        default_live_start_offset: Some(-18.0),
        ..Default::default()
    };
    assert_eq!(
        rewrite_with(VOD, &opts).unwrap(),
        "#EXTM3U\n#EXT-X-START:TIME-OFFSET=12.5,PRECISE=YES\n#EXT-X-PLAYLIST-TYPE:VOD\n#EXTINF:6,\n/s.ts?d=https://cdn.example.com/live/chan/a.ts\n#EXT-X-ENDLIST\n"
    );
    let own = "#EXTM3U\r\n#EXT-X-START:TIME-OFFSET=3\r\n#EXTINF:6,\r\na.ts\r\n";
    assert_eq!(
        rewrite_with(own, &opts).unwrap(),
        "#EXTM3U\r\n#EXT-X-START:TIME-OFFSET=3\r\n#EXTINF:6,\r\n/s.ts?d=https://cdn.example.com/live/chan/a.ts\r\n"
    );
    // Injected lines follow the playlist's own line ending.
    let crlf = "#EXTM3U\r\n#EXTINF:6,\r\na.ts\r\n";
    assert!(rewrite_with(crlf, &opts)
        .unwrap()
        .starts_with("#EXTM3U\r\n#EXT-X-START:TIME-OFFSET=12.5,PRECISE=YES\r\n#EXTINF"));
    let nan = RewriteOptions {
        start_offset: Some(f64::NAN),
        ..Default::default()
    };
    assert_eq!(rewrite_with(VOD, &nan), Err(HlsError::InvalidStartOffset));
}

fn skip(ranges: &[(f64, f64)]) -> RewriteOptions {
    RewriteOptions {
        skip: ranges.to_vec(),
        ..Default::default()
    }
}

const TEN_SEGMENTS: &str = "#EXTM3U
#EXT-X-TARGETDURATION:10
#EXT-X-PLAYLIST-TYPE:VOD
#EXTINF:10,
s0.ts
#EXTINF:10,
s1.ts
#EXT-X-PROGRAM-DATE-TIME:2026-01-01T00:00:20Z
#EXTINF:10,
s2.ts
#EXT-X-DISCONTINUITY
#EXT-X-KEY:METHOD=AES-128,URI=\"k2\"
#EXTINF:10,
s3.ts
#EXTINF:10,
s4.ts
#EXT-X-ENDLIST
";

/// Output with the `/s.ts?d=<base dir>` prefix abbreviated, to keep expectations legible.
fn short(text: &str) -> String {
    text.replace("/s.ts?d=https://cdn.example.com/live/chan/", "")
        .replace("/k?d=https://cdn.example.com/live/chan/", "")
}

#[test]
fn skip_keeps_first_segment_and_marks_the_cut() {
    let got = short(&rewrite_with(TEN_SEGMENTS, &skip(&[(12.0, 25.0)])).unwrap());
    let want = "#EXTM3U
#EXT-X-TARGETDURATION:10
#EXT-X-PLAYLIST-TYPE:VOD
#EXTINF:10,
s0.ts
#EXT-X-DISCONTINUITY
#EXT-X-KEY:METHOD=AES-128,URI=\"k2\"
#EXTINF:10,
s3.ts
#EXTINF:10,
s4.ts
#EXT-X-ENDLIST
";
    assert_eq!(got, want);
}

#[test]
fn skip_two_ranges_and_keys_survive_removed_segments() {
    let got = short(&rewrite_with(TEN_SEGMENTS, &skip(&[(10.0, 20.0), (30.0, 40.0)])).unwrap());
    let want = "#EXTM3U
#EXT-X-TARGETDURATION:10
#EXT-X-PLAYLIST-TYPE:VOD
#EXTINF:10,
s0.ts
#EXT-X-DISCONTINUITY
#EXT-X-PROGRAM-DATE-TIME:2026-01-01T00:00:20Z
#EXTINF:10,
s2.ts
#EXT-X-KEY:METHOD=AES-128,URI=\"k2\"
#EXT-X-DISCONTINUITY
#EXTINF:10,
s4.ts
#EXT-X-ENDLIST
";
    assert_eq!(got, want);
}

#[test]
fn skip_at_the_start_needs_no_discontinuity() {
    let got = short(&rewrite_with(TEN_SEGMENTS, &skip(&[(0.0, 15.0)])).unwrap());
    let want = "#EXTM3U
#EXT-X-TARGETDURATION:10
#EXT-X-PLAYLIST-TYPE:VOD
#EXT-X-PROGRAM-DATE-TIME:2026-01-01T00:00:20Z
#EXTINF:10,
s2.ts
#EXT-X-DISCONTINUITY
#EXT-X-KEY:METHOD=AES-128,URI=\"k2\"
#EXTINF:10,
s3.ts
#EXTINF:10,
s4.ts
#EXT-X-ENDLIST
";
    assert_eq!(got, want);
}

#[test]
fn skip_outside_the_playlist_changes_nothing() {
    let plain = rewrite(TEN_SEGMENTS);
    assert_eq!(
        rewrite_with(TEN_SEGMENTS, &skip(&[(500.0, 600.0)])).unwrap(),
        plain
    );
    // Touching ranges end where a segment starts: that segment stays.
    let got = short(&rewrite_with(TEN_SEGMENTS, &skip(&[(40.0, 50.0)])).unwrap());
    assert!(got.contains("s3.ts\n#EXT-X-ENDLIST"), "{got}");
}

#[test]
fn skip_makes_implicit_byteranges_explicit() {
    let text = "#EXTM3U
#EXTINF:5,
#EXT-X-BYTERANGE:100@0
all.ts
#EXTINF:5,
#EXT-X-BYTERANGE:100
all.ts
#EXTINF:5,
#EXT-X-BYTERANGE:100
all.ts
#EXT-X-ENDLIST
";
    let got = rewrite_with(text, &skip(&[(5.0, 10.0)]))
        .unwrap()
        .replace("/s.ts?d=https://cdn.example.com/live/chan/", "");
    let want = "#EXTM3U
#EXTINF:5,
#EXT-X-BYTERANGE:100@0
all.ts
#EXT-X-DISCONTINUITY
#EXTINF:5,
#EXT-X-BYTERANGE:100@200
all.ts
#EXT-X-ENDLIST
";
    assert_eq!(got, want);
}

#[test]
fn skip_with_broken_extinf_is_an_error_only_when_it_matters() {
    let text = "#EXTM3U\n#EXTINF:abc,\na.ts\n";
    assert_eq!(
        rewrite_with(text, &skip(&[(0.0, 1.0)])),
        Err(HlsError::InvalidDuration { line: 2 })
    );
    assert!(rewrite_with(text, &RewriteOptions::default()).is_ok());
    let absurd = "#EXTM3U\n#EXTINF:1e400,\na.ts\n";
    assert_eq!(
        rewrite_with(absurd, &skip(&[(0.0, 1.0)])),
        Err(HlsError::InvalidDuration { line: 2 })
    );
}

#[test]
fn skip_is_ignored_in_master_playlists() {
    assert_eq!(
        rewrite_with(MASTER, &skip(&[(0.0, 100.0)])).unwrap(),
        rewrite(MASTER)
    );
}

fn variants_kept(opts: &RewriteOptions) -> Vec<String> {
    let out = rewrite_with(MASTER, opts).unwrap();
    assert!(out.contains("#EXT-X-MEDIA:TYPE=AUDIO"), "renditions stay");
    assert!(
        out.contains("#EXT-X-I-FRAME-STREAM-INF"),
        "i-frame streams stay"
    );
    out.lines()
        .filter(|l| l.starts_with("/m?d=") || l.starts_with("#EXT-X-STREAM-INF"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn max_res_keeps_the_highest_variant_with_its_uri() {
    let opts = RewriteOptions {
        max_res: true,
        ..Default::default()
    };
    assert_eq!(
        variants_kept(&opts),
        [
            r#"#EXT-X-STREAM-INF:BANDWIDTH=5000000,CODECS="avc1.640028,mp4a.40.2",RESOLUTION=1920x1080,AUDIO="aud""#,
            "/m?d=https://other.example.net/hi/index.m3u8",
        ]
    );
}

#[test]
fn resolution_exact_lower_or_lowest() {
    let pick = |h| {
        let opts = RewriteOptions {
            resolution: Some(h),
            ..Default::default()
        };
        variants_kept(&opts)[1].clone()
    };
    assert_eq!(pick(720), "/m?d=https://cdn.example.com/abs/mid?type=video");
    assert_eq!(
        pick(1000),
        "/m?d=https://cdn.example.com/abs/mid?type=video"
    );
    assert_eq!(pick(2160), "/m?d=https://other.example.net/hi/index.m3u8");
    assert_eq!(
        pick(240),
        "/m?d=https://cdn.example.com/live/chan/low/index.m3u8"
    );
    assert_eq!(
        variants_kept(&RewriteOptions {
            resolution: Some(240),
            ..Default::default()
        })
        .len(),
        2
    );
}

#[test]
fn skip_in_crlf_playlists_inserts_crlf_lines() {
    let text = "#EXTM3U\r\n#EXTINF:5,\r\na.ts\r\n#EXTINF:5,\r\nb.ts\r\n#EXTINF:5,\r\nc.ts\r\n";
    let got = short(&rewrite_with(text, &skip(&[(6.0, 7.0)])).unwrap());
    assert_eq!(
        got,
        "#EXTM3U\r\n#EXTINF:5,\r\na.ts\r\n#EXT-X-DISCONTINUITY\r\n#EXTINF:5,\r\nc.ts\r\n"
    );
}

#[test]
fn equal_heights_are_all_kept_and_unsized_variants_dropped() {
    let text = "#EXTM3U
#EXT-X-STREAM-INF:BANDWIDTH=64000,CODECS=\"mp4a.40.2\"
audio-only.m3u8
#EXT-X-STREAM-INF:BANDWIDTH=3000000,RESOLUTION=1280x720,CODECS=\"hvc1.1.6.L93.B0\"
hevc.m3u8
#EXT-X-STREAM-INF:BANDWIDTH=4000000,RESOLUTION=1280x720,CODECS=\"avc1.640020\"
avc.m3u8
";
    let opts = RewriteOptions {
        max_res: true,
        ..Default::default()
    };
    let want = "#EXTM3U
#EXT-X-STREAM-INF:BANDWIDTH=3000000,RESOLUTION=1280x720,CODECS=\"hvc1.1.6.L93.B0\"
/m?d=https://cdn.example.com/live/chan/hevc.m3u8
#EXT-X-STREAM-INF:BANDWIDTH=4000000,RESOLUTION=1280x720,CODECS=\"avc1.640020\"
/m?d=https://cdn.example.com/live/chan/avc.m3u8
";
    assert_eq!(rewrite_with(text, &opts).unwrap(), want);
}

#[test]
fn kept_as_is_when_malformed_or_foreign() {
    let text = concat!(
        "#EXTM3U\n",
        "#EXT-X-KEY:METHOD=AES-128,URI=\"unterminated\n",
        "#EXT-X-KEY:METHOD=SAMPLE-AES,URI=\"skd://fairplay-id\",KEYFORMAT=\"com.apple.streamingkeydelivery\"\n",
        "#EXT-X-KEY:METHOD=SAMPLE-AES-CTR,URI=\"data:text/plain;base64,AAAA\"\n",
        "#EXT-X-MAP:URI=unquoted.mp4\n",
        "#EXTINF:5,\n",
        "http://[::1\n",
        "#EXTINF:5,\n",
        "rtmp://live.example.com/app\n",
    );
    assert_eq!(rewrite(text), text);
}

#[test]
fn session_data_is_made_absolute_not_proxied() {
    let text = "#EXTM3U\n#EXT-X-SESSION-DATA:DATA-ID=\"com.example.t\",URI=\"t.json\"\n";
    assert_eq!(
        rewrite(text),
        "#EXTM3U\n#EXT-X-SESSION-DATA:DATA-ID=\"com.example.t\",URI=\"https://cdn.example.com/live/chan/t.json\"\n"
    );
}

#[test]
fn preamble_is_dropped_and_non_playlists_refused() {
    let text = "\u{feff}\r\n  #EXTM3U\nseg.ts";
    assert_eq!(
        rewrite(text),
        "#EXTM3U\n/s.ts?d=https://cdn.example.com/live/chan/seg.ts"
    );
    assert_eq!(rewrite("#EXTM3U"), "#EXTM3U\n");
    for bad in ["", "   ", "<html>", "#EXTINF:1,\n#EXTM3U\n", "EXTM3U"] {
        assert_eq!(
            rewrite_with(bad, &RewriteOptions::default()),
            Err(HlsError::NotAPlaylist),
            "{bad:?}"
        );
    }
    assert_eq!(ensure_playlist(" #EXTM3U\n"), Ok("#EXTM3U\n"));
}

#[test]
fn huge_lines_are_refused() {
    let text = format!("#EXTM3U\n#X:{}\n", "a".repeat(MAX_LINE_LEN));
    assert_eq!(
        rewrite_with(&text, &RewriteOptions::default()),
        Err(HlsError::LineTooLong {
            line: 2,
            max: MAX_LINE_LEN
        })
    );
}

#[test]
fn proxy_urls_that_would_break_the_playlist_are_refused() {
    let got = rewrite_playlist(
        "#EXTM3U\n#EXTINF:1,\na.ts\n",
        &Url::parse(BASE).unwrap(),
        &RewriteOptions::default(),
        &mut |_, _| "/x\"y".to_owned(),
    );
    assert_eq!(got, Err(HlsError::InvalidProxyUrl { line: 3 }));
}

#[test]
fn sniffs_html_and_playlists() {
    assert_eq!(sniff(b"\xEF\xBB\xBF\n  <!DOCTYPE html><html>"), Sniff::Html);
    assert_eq!(sniff(b"\t<html lang=en>"), Sniff::Html);
    assert_eq!(sniff(b"<HEAD>"), Sniff::Html);
    assert_eq!(sniff(b"\r\n#EXTM3U\n"), Sniff::Playlist);
    assert_eq!(sniff(b"<?xml version=\"1.0\"?><MPD>"), Sniff::Other);
    assert_eq!(sniff(b"\x47\x40\x00\x10"), Sniff::Other);
    assert_eq!(sniff(b"<htm"), Sniff::Other);
    assert_eq!(sniff(b""), Sniff::Other);
}

#[test]
fn graceful_end_is_a_finished_playlist() {
    let text = graceful_end_playlist();
    assert_eq!(sniff(text.as_bytes()), Sniff::Playlist);
    assert!(text.ends_with("#EXT-X-ENDLIST\n"));
    assert_eq!(rewrite(text), text);
}

#[test]
fn playlist_urls() {
    let yes = [
        "http://a/x.m3u8",
        "http://a/X.M3U",
        "http://a/get.m3u_plus?u=1",
        "http://a/get.php?username=u&type=m3u_plus",
        "http://a/p?type=M3U8",
    ];
    let no = [
        "http://a/x.ts",
        "http://a/x.m3u8.ts",
        "http://a/p?type=video",
        "http://a/p?kind=m3u8",
        "http://a/m3u8/seg",
    ];
    for u in yes {
        assert!(is_playlist_url(&Url::parse(u).unwrap()), "{u}");
    }
    for u in no {
        assert!(!is_playlist_url(&Url::parse(u).unwrap()), "{u}");
    }
}

#[test]
fn segment_extensions() {
    let ext = |u: &str| SegmentExt::from_url(&Url::parse(u).unwrap());
    assert_eq!(ext("http://a/b/c.M4S?x=.ts"), Some(SegmentExt::M4s));
    assert_eq!(ext("http://a/b.mp4/c"), None);
    assert_eq!(ext("http://a/c.aac"), Some(SegmentExt::Aac));
    assert_eq!(ext("http://a/c.png"), None);
}

/// Lines that look like playlist content, to reach deeper states than random bytes do.
fn playlist_line() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("#EXTM3U".to_owned()),
        "#EXTINF:[-0-9.e]{0,6},[a-z ,]{0,5}",
        "#EXT-X-BYTERANGE:[0-9@]{0,8}",
        "#EXT-X-(KEY|MAP|MEDIA|PART|PRELOAD-HINT|SESSION-KEY|I-FRAME-STREAM-INF|RENDITION-REPORT):[A-Z=\",/.:a-z0-9 ]{0,40}",
        "#EXT-X-STREAM-INF:(BANDWIDTH=1,)?RESOLUTION=[0-9x]{0,10}",
        "#EXT-X-(ENDLIST|DISCONTINUITY|PLAYLIST-TYPE:VOD|START:TIME-OFFSET=1|GAP)",
        "[a-z0-9./:?=&%\\[\\]-]{0,30}",
        ".{0,20}",
    ]
}

fn any_options() -> impl Strategy<Value = RewriteOptions> {
    (
        any::<(bool, bool, bool, bool)>(),
        proptest::option::of(-100.0f64..100.0),
        proptest::collection::vec((0.0f64..100.0, 0.0f64..100.0), 0..3),
        proptest::option::of(1u32..3000),
    )
        .prop_map(
            |((key_only, no_proxy, max_res, key_url), start, skip, resolution)| RewriteOptions {
                key_url: key_url.then(|| Url::parse("http://k.example").unwrap()),
                key_only_proxy: key_only,
                no_proxy,
                start_offset: start,
                default_live_start_offset: Some(-18.0),
                skip,
                max_res,
                resolution,
            },
        )
}

proptest! {
    #[test]
    fn arbitrary_text_never_panics(text in ".{0,300}", opts in any_options()) {
        let _ = rewrite_with(&text, &opts);
        let _ = sniff(text.as_bytes());
    }

    #[test]
    fn option_parsers_never_panic(text in ".{0,40}") {
        let _ = parse_skip(&text);
        let _ = parse_resolution(&text);
        let _ = ensure_playlist(&text);
    }

    #[test]
    fn playlist_shaped_text_never_panics(
        lines in proptest::collection::vec(playlist_line(), 0..40),
        crlf in any::<bool>(),
        opts in any_options(),
    ) {
        let eol = if crlf { "\r\n" } else { "\n" };
        let text = format!("#EXTM3U{eol}{}", lines.join(eol));
        if let Ok(out) = rewrite_with(&text, &opts) {
            prop_assert!(out.starts_with("#EXTM3U"));
        }
    }
}

#[test]
fn skip_holds_a_long_block_as_its_own_bytes() {
    // 8 MiB of blank lines and no URI: every line waits for a segment that never comes. Held as
    // `Line`s (over 70 bytes each) that was over 600 MB; as text it is the input's size.
    let text = format!("#EXTM3U\n#EXTINF:1,\n{}", "\n".repeat(8 << 20));
    let opts = skip(&[(0.0, 0.5)]);
    let base = Url::parse(BASE).unwrap();
    let summary = scan::scan(&text, &opts).unwrap();
    let mut make = mark;
    let mut writer = rewrite::Writer::new(&base, &opts, &mut make, &summary, "\n", text.len());
    for line in lines::lines(&text).skip(1) {
        writer.line(line).unwrap();
    }
    let held = writer.pending_capacity();
    assert!(
        held <= 2 * text.len(),
        "{held} bytes held for {} of input",
        text.len()
    );
    assert_eq!(writer.finish().unwrap().len(), text.len() - 8);
    // Through the public entry point: nothing cut, every byte kept.
    assert_eq!(rewrite_with(&text, &opts).unwrap(), text);
}

#[test]
fn skip_keeps_comments_blanks_and_line_numbers_inside_blocks() {
    let text = "#EXTM3U\r\n#EXT-X-TARGETDURATION:4\r\n\r\n# ad break\r\n#EXTINF:4,\r\n\r\na.ts\r\n\
                #EXTINF:4,\r\n# cut with its segment? no: comments stay\r\n\r\nb.ts\r\n\
                #EXTINF:4,\r\nc.ts\r\n#EXT-X-ENDLIST\r\n";
    let got = short(&rewrite_with(text, &skip(&[(5.0, 6.0)])).unwrap());
    assert_eq!(
        got,
        "#EXTM3U\r\n#EXT-X-TARGETDURATION:4\r\n\r\n# ad break\r\n#EXTINF:4,\r\n\r\na.ts\r\n\
         # cut with its segment? no: comments stay\r\n\r\n\
         #EXT-X-DISCONTINUITY\r\n#EXTINF:4,\r\nc.ts\r\n#EXT-X-ENDLIST\r\n"
    );
    // A broken duration deep in a block is reported at its own line.
    let broken = "#EXTM3U\n#EXTINF:4,\na.ts\n\n# x\n#EXTINF:abc,\nb.ts\n";
    assert_eq!(
        rewrite_with(broken, &skip(&[(0.0, 1.0)])),
        Err(HlsError::InvalidDuration { line: 6 })
    );
}

#[test]
fn content_steering_is_dropped_unless_nothing_is_proxied() {
    let text = "#EXTM3U\n\
                #EXT-X-CONTENT-STEERING:SERVER-URI=\"/steer?v=1\",PATHWAY-ID=\"CDN-A\"\n\
                #EXT-X-STREAM-INF:BANDWIDTH=1,PATHWAY-ID=\"CDN-A\"\nv.m3u8\n";
    assert_eq!(
        rewrite(text),
        "#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=1,PATHWAY-ID=\"CDN-A\"\n\
         /m?d=https://cdn.example.com/live/chan/v.m3u8\n"
    );
    let opts = RewriteOptions {
        no_proxy: true,
        ..Default::default()
    };
    assert_eq!(
        rewrite_with(text, &opts).unwrap(),
        "#EXTM3U\n\
         #EXT-X-CONTENT-STEERING:SERVER-URI=\"https://cdn.example.com/steer?v=1\",PATHWAY-ID=\"CDN-A\"\n\
         #EXT-X-STREAM-INF:BANDWIDTH=1,PATHWAY-ID=\"CDN-A\"\n\
         https://cdn.example.com/live/chan/v.m3u8\n"
    );
    assert_eq!(count_entries(text), 2);
}

#[test]
fn interstitial_assets_are_proxied_and_asset_lists_removed() {
    let text = "#EXTM3U\n#EXT-X-TARGETDURATION:4\n\
                #EXT-X-DATERANGE:ID=\"ad1\",CLASS=\"com.apple.hls.interstitial\",\
                START-DATE=\"2026-01-01T00:00:00Z\",X-ASSET-URI=\"ads/a.m3u8\",X-RESUME-OFFSET=0\n\
                #EXT-X-DATERANGE:ID=\"ad2\",CLASS=\"com.apple.hls.interstitial\",\
                START-DATE=\"2026-01-01T00:00:08Z\",X-ASSET-LIST=\"https://ads.example/l.json\"\n\
                #EXT-X-DATERANGE:X-ASSET-LIST=\"l.json\", ID=\"ad3\",START-DATE=\"2026-01-01T00:00:09Z\"\n\
                #EXT-X-DATERANGE:ID=\"ad4\",X-ASSET-URI=\"a.m3u8\",X-ASSET-URI=\"https://o.example/b.m3u8\",\
                X-ASSET-URI=unquoted\n\
                #EXT-X-DATERANGE:ID=\"s\",START-DATE=\"2026-01-01T00:00:00Z\",SCTE35-OUT=0xFC30\n\
                #EXT-X-DATERANGE:ID=\"bad,X-ASSET-URI=\"x.m3u8\"\n\
                #EXTINF:4,\ns.ts\n";
    assert_eq!(
        rewrite(text),
        "#EXTM3U\n#EXT-X-TARGETDURATION:4\n\
         #EXT-X-DATERANGE:ID=\"ad1\",CLASS=\"com.apple.hls.interstitial\",\
         START-DATE=\"2026-01-01T00:00:00Z\",\
         X-ASSET-URI=\"/m?d=https://cdn.example.com/live/chan/ads/a.m3u8\",X-RESUME-OFFSET=0\n\
         #EXT-X-DATERANGE:ID=\"ad2\",CLASS=\"com.apple.hls.interstitial\",\
         START-DATE=\"2026-01-01T00:00:08Z\"\n\
         #EXT-X-DATERANGE:ID=\"ad3\",START-DATE=\"2026-01-01T00:00:09Z\"\n\
         #EXT-X-DATERANGE:ID=\"ad4\",X-ASSET-URI=\"/m?d=https://cdn.example.com/live/chan/a.m3u8\"\n\
         #EXT-X-DATERANGE:ID=\"s\",START-DATE=\"2026-01-01T00:00:00Z\",SCTE35-OUT=0xFC30\n\
         #EXT-X-DATERANGE:ID=\"bad,X-ASSET-URI=\"x.m3u8\"\n\
         #EXTINF:4,\n/s.ts?d=https://cdn.example.com/live/chan/s.ts\n"
    );
    let opts = RewriteOptions {
        no_proxy: true,
        ..Default::default()
    };
    let list = "#EXTM3U\n#EXT-X-DATERANGE:ID=\"ad\",X-ASSET-LIST=\"l.json\"\n";
    assert_eq!(
        rewrite_with(list, &opts).unwrap(),
        "#EXTM3U\n#EXT-X-DATERANGE:ID=\"ad\",X-ASSET-LIST=\"https://cdn.example.com/live/chan/l.json\"\n"
    );
    // Each date range with an asset counts toward the entry limit; the SCTE-35 one does not.
    assert_eq!(count_entries(text), 6);
}
