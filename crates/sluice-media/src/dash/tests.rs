//! End-to-end DASH tests: MPD text in, exact HLS playlists out.

mod hostile;
mod live;

use std::collections::HashMap;

use url::Url;

use super::*;

const AST: f64 = 1_704_067_200.0; // 2024-01-01T00:00:00Z

fn mpd_url() -> Url {
    Url::parse("https://cdn.example/path/manifest.mpd").unwrap()
}

fn parse(xml: &str) -> Mpd {
    parse_mpd(xml, &mpd_url()).unwrap()
}

fn range_suffix(range: Option<ByteRange>) -> String {
    range.map_or(String::new(), |(a, b)| format!(" [{a}-{b}]"))
}

/// A URL maker that shows exactly what the front end would be given.
fn show(target: MediaUrl<'_>) -> String {
    match target {
        MediaUrl::Init { init, .. } => {
            format!("init {}{}", init.url, range_suffix(init.byte_range))
        }
        MediaUrl::Segment { segment, .. } => {
            format!("seg {}{}", segment.url, range_suffix(segment.byte_range))
        }
    }
}

fn media(mpd: &Mpd, profile: &str, options: &MediaOptions) -> String {
    to_hls_media(mpd, profile, options, show).unwrap()
}

fn lines(text: &[&str]) -> String {
    text.iter().map(|l| format!("{l}\n")).collect()
}

const VOD_HEAD: [&str; 3] = ["#EXTM3U", "#EXT-X-VERSION:6", "#EXT-X-TARGETDURATION:4"];

#[test]
fn static_template_with_printf_width() {
    let mpd = parse(
        r#"<?xml version="1.0"?>
        <MPD xmlns="urn:mpeg:dash:schema:mpd:2011" type="static" mediaPresentationDuration="PT9S">
          <Period>
            <AdaptationSet id="1" mimeType="video/mp4">
              <SegmentTemplate timescale="1000" duration="4000" startNumber="3"
                  media="$RepresentationID$/seg-$Number%05d$.m4s" initialization="$RepresentationID$/init.mp4"/>
              <Representation id="v1" bandwidth="500000" codecs="avc1.4d401f" width="640" height="360"/>
            </AdaptationSet>
          </Period>
        </MPD>"#,
    );
    let expected = lines(&[
        VOD_HEAD[0],
        VOD_HEAD[1],
        VOD_HEAD[2],
        "#EXT-X-MEDIA-SEQUENCE:3",
        "#EXT-X-PLAYLIST-TYPE:VOD",
        "#EXT-X-INDEPENDENT-SEGMENTS",
        "#EXT-X-MAP:URI=\"init https://cdn.example/path/v1/init.mp4\"",
        "#EXTINF:4.000,",
        "seg https://cdn.example/path/v1/seg-00003.m4s",
        "#EXTINF:4.000,",
        "seg https://cdn.example/path/v1/seg-00004.m4s",
        "#EXTINF:1.000,",
        "seg https://cdn.example/path/v1/seg-00005.m4s",
        "#EXT-X-ENDLIST",
    ]);
    assert_eq!(
        media(&mpd, "1_v1_500000", &MediaOptions::default()),
        expected
    );
    // Without EXT-X-MAP the segment endpoint is expected to prepend the init itself.
    let no_map = MediaOptions {
        no_map: true,
        ..MediaOptions::default()
    };
    let without_map: String = expected
        .lines()
        .filter(|l| !l.starts_with("#EXT-X-MAP"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(media(&mpd, "1_v1_500000", &no_map), without_map);

    // skip drops the overlapping segment and marks the jump; start_offset becomes EXT-X-START.
    let options = MediaOptions {
        skip: vec![(4.5, 5.0)],
        start_offset: Some(-18.0),
        ..MediaOptions::default()
    };
    let expected = lines(&[
        VOD_HEAD[0],
        VOD_HEAD[1],
        VOD_HEAD[2],
        "#EXT-X-MEDIA-SEQUENCE:3",
        "#EXT-X-PLAYLIST-TYPE:VOD",
        "#EXT-X-INDEPENDENT-SEGMENTS",
        "#EXT-X-START:TIME-OFFSET=-18,PRECISE=YES",
        "#EXT-X-MAP:URI=\"init https://cdn.example/path/v1/init.mp4\"",
        "#EXTINF:4.000,",
        "seg https://cdn.example/path/v1/seg-00003.m4s",
        "#EXT-X-DISCONTINUITY",
        "#EXTINF:1.000,",
        "seg https://cdn.example/path/v1/seg-00005.m4s",
        "#EXT-X-ENDLIST",
    ]);
    assert_eq!(media(&mpd, "1_v1_500000", &options), expected);
}

#[test]
fn timeline_with_time_and_repeats() {
    let mpd = parse(
        r#"<MPD type="static" mediaPresentationDuration="PT7S"><Period>
          <AdaptationSet mimeType="audio/mp4" lang="en">
            <SegmentTemplate timescale="90000" presentationTimeOffset="90000"
                media="a/$Bandwidth$/$Time$.m4s" initialization="a/init.m4s">
              <SegmentTimeline><S t="90000" d="180000" r="2"/><S d="90000"/></SegmentTimeline>
            </SegmentTemplate>
            <Representation id="a" bandwidth="64000" codecs="mp4a.40.2"/>
          </AdaptationSet></Period></MPD>"#,
    );
    let expected = lines(&[
        "#EXTM3U",
        "#EXT-X-VERSION:6",
        "#EXT-X-TARGETDURATION:2",
        "#EXT-X-MEDIA-SEQUENCE:1",
        "#EXT-X-PLAYLIST-TYPE:VOD",
        "#EXT-X-INDEPENDENT-SEGMENTS",
        "#EXT-X-MAP:URI=\"init https://cdn.example/path/a/init.m4s\"",
        "#EXTINF:2.000,",
        "seg https://cdn.example/path/a/64000/90000.m4s",
        "#EXTINF:2.000,",
        "seg https://cdn.example/path/a/64000/270000.m4s",
        "#EXTINF:2.000,",
        "seg https://cdn.example/path/a/64000/450000.m4s",
        "#EXTINF:1.000,",
        "seg https://cdn.example/path/a/64000/630000.m4s",
        "#EXT-X-ENDLIST",
    ]);
    assert_eq!(media(&mpd, "0_a_64000", &MediaOptions::default()), expected);
    let rep = mpd.find_profile("0_a_64000").unwrap();
    let index = segment_index(&mpd, &mpd.periods[0], rep, 0.0, None).unwrap();
    let starts: Vec<f64> = index.segments.iter().map(|s| s.start_secs).collect();
    assert_eq!(starts, [0.0, 2.0, 4.0, 6.0]);
}

/// Representations under one AdaptationSet timeline share it (one list, not a copy each) and
/// each still lists its own segments.
#[test]
fn inherited_timeline_is_shared_and_gives_each_representation_its_segments() {
    let mpd = parse(
        r#"<MPD type="static" mediaPresentationDuration="PT5S"><Period>
          <AdaptationSet mimeType="video/mp4">
            <ContentProtection schemeIdUri="urn:mpeg:dash:mp4protection:2011" value="cenc"/>
            <SegmentTemplate timescale="1000" media="$RepresentationID$/$Time$.m4s">
              <SegmentTimeline><S t="0" d="2000" r="1"/><S d="1000"/></SegmentTimeline>
            </SegmentTemplate>
            <Representation id="lo" bandwidth="1"/>
            <Representation id="hi" bandwidth="2"/>
          </AdaptationSet></Period></MPD>"#,
    );
    let lo = mpd.find_profile("0_lo_1").unwrap();
    let hi = mpd.find_profile("0_hi_2").unwrap();
    for (rep, id) in [(lo, "lo"), (hi, "hi")] {
        let index = segment_index(&mpd, &mpd.periods[0], rep, 0.0, None).unwrap();
        let urls: Vec<String> = index.segments.iter().map(|s| s.url.to_string()).collect();
        assert_eq!(
            urls,
            [0, 2000, 4000].map(|t| format!("https://cdn.example/path/{id}/{t}.m4s"))
        );
    }
    let timeline = |rep: &Representation| match &rep.addressing {
        Addressing::Template(t) => t.timeline.clone().unwrap(),
        other => panic!("not a template: {other:?}"),
    };
    assert_eq!(timeline(lo).len(), 2);
    assert!(std::sync::Arc::ptr_eq(&timeline(lo), &timeline(hi)));
    assert!(std::sync::Arc::ptr_eq(&lo.protection[0], &hi.protection[0]));
}

#[test]
fn segment_list_with_ranges() {
    let mpd = parse(
        r#"<MPD mediaPresentationDuration="PT25S"><Period><AdaptationSet mimeType="video/mp4">
          <Representation id="v" bandwidth="1000" height="720" width="1280">
            <BaseURL>media/</BaseURL>
            <SegmentList timescale="10" duration="100">
              <Initialization sourceURL="init.mp4" range="0-799"/>
              <SegmentURL media="one.mp4"/>
              <SegmentURL media="all.mp4" mediaRange="800-1999"/>
              <SegmentURL media="all.mp4" mediaRange="2000-2999"/>
            </SegmentList>
          </Representation></AdaptationSet></Period></MPD>"#,
    );
    let expected = lines(&[
        "#EXTM3U",
        "#EXT-X-VERSION:6",
        "#EXT-X-TARGETDURATION:10",
        "#EXT-X-MEDIA-SEQUENCE:1",
        "#EXT-X-PLAYLIST-TYPE:VOD",
        "#EXT-X-INDEPENDENT-SEGMENTS",
        "#EXT-X-MAP:URI=\"init https://cdn.example/path/media/init.mp4 [0-799]\"",
        "#EXTINF:10.000,",
        "seg https://cdn.example/path/media/one.mp4",
        "#EXTINF:10.000,",
        "seg https://cdn.example/path/media/all.mp4 [800-1999]",
        "#EXTINF:10.000,",
        "seg https://cdn.example/path/media/all.mp4 [2000-2999]",
        "#EXT-X-ENDLIST",
    ]);
    assert_eq!(media(&mpd, "0_v_1000", &MediaOptions::default()), expected);
}

/// A version-0 sidx box with `first_offset` and (size, duration) references.
fn sidx_box(timescale: u32, first_offset: u32, refs: &[(u32, u32)]) -> Vec<u8> {
    let mut body = vec![0, 0, 0, 0]; // version 0, flags
    body.extend(1u32.to_be_bytes()); // reference_ID
    body.extend(timescale.to_be_bytes());
    body.extend(0u32.to_be_bytes()); // earliest_presentation_time
    body.extend(first_offset.to_be_bytes());
    body.extend([0, 0]);
    body.extend((refs.len() as u16).to_be_bytes());
    for &(size, duration) in refs {
        body.extend(size.to_be_bytes());
        body.extend(duration.to_be_bytes());
        body.extend(0x9000_0000u32.to_be_bytes()); // starts with SAP type 1
    }
    let mut boxed = ((body.len() + 8) as u32).to_be_bytes().to_vec();
    boxed.extend(b"sidx");
    boxed.extend(body);
    boxed
}

#[test]
fn segment_base_with_sidx() {
    let mpd = parse(
        r#"<MPD mediaPresentationDuration="PT5.5S"><Period><AdaptationSet contentType="video">
          <Representation id="v" bandwidth="2000000" height="1080" width="1920">
            <BaseURL>https://files.example/movie.mp4</BaseURL>
            <SegmentBase indexRange="1000-1067"><Initialization range="0-999"/></SegmentBase>
          </Representation></AdaptationSet></Period></MPD>"#,
    );
    let rep = mpd.find_profile("0_v_2000000").unwrap();
    let fetch = sidx_fetch(rep).unwrap();
    assert_eq!(fetch.url.as_str(), "https://files.example/movie.mp4");
    assert_eq!(fetch.range, (1000, 1067));
    let err = to_hls_media(&mpd, "0_v_2000000", &MediaOptions::default(), show).unwrap_err();
    assert!(matches!(
        err,
        DashError::SidxMissing {
            range: (1000, 1067),
            ..
        }
    ));

    let bytes = sidx_box(1000, 0, &[(5000, 2000), (6000, 2000), (7000, 1500)]);
    assert_eq!(bytes.len(), 68);
    let fragments = parse_sidx(&bytes, fetch.range.0).unwrap();
    let options = MediaOptions {
        sidx: HashMap::from([(fetch, fragments)]),
        ..MediaOptions::default()
    };
    let expected = lines(&[
        "#EXTM3U",
        "#EXT-X-VERSION:6",
        "#EXT-X-TARGETDURATION:2",
        "#EXT-X-MEDIA-SEQUENCE:1",
        "#EXT-X-PLAYLIST-TYPE:VOD",
        "#EXT-X-INDEPENDENT-SEGMENTS",
        "#EXT-X-MAP:URI=\"init https://files.example/movie.mp4 [0-999]\"",
        "#EXTINF:2.000,",
        "seg https://files.example/movie.mp4 [1068-6067]",
        "#EXTINF:2.000,",
        "seg https://files.example/movie.mp4 [6068-12067]",
        "#EXTINF:1.500,",
        "seg https://files.example/movie.mp4 [12068-19067]",
        "#EXT-X-ENDLIST",
    ]);
    assert_eq!(media(&mpd, "0_v_2000000", &options), expected);
}

#[test]
fn sidx_first_offset_and_errors() {
    let bytes = sidx_box(90_000, 100, &[(10, 180_000)]);
    // 44-byte box at 500, then 100 bytes of first_offset.
    let fragments = parse_sidx(&bytes, 500).unwrap();
    assert_eq!(
        fragments,
        [SidxFragment {
            range: (644, 653),
            duration_secs: 2.0
        }]
    );
    assert!(parse_sidx(&bytes[..40], 0).is_err());
    assert!(parse_sidx(b"\0\0\0\x08free", 0).is_err());
    assert!(parse_sidx(&sidx_box(0, 0, &[(1, 1)]), 0).is_err());
    assert!(parse_sidx(&sidx_box(1, 0, &[(0x8000_0010, 1)]), 0).is_err());
}

#[test]
fn multi_period_discontinuity_and_new_map() {
    let mpd = parse(
        r#"<MPD mediaPresentationDuration="PT7S">
          <Period id="main" duration="PT4S"><AdaptationSet id="v" mimeType="video/mp4">
            <SegmentTemplate timescale="1" duration="2" media="main/$Number$.m4s" initialization="main/init.mp4"/>
            <Representation id="hd" bandwidth="3000"/></AdaptationSet></Period>
          <Period id="ad"><AdaptationSet id="v" mimeType="video/mp4">
            <SegmentTemplate timescale="1" duration="2" media="ad/$Number$.m4s" initialization="ad/init.mp4"/>
            <Representation id="hd" bandwidth="3000"/></AdaptationSet></Period>
        </MPD>"#,
    );
    assert_eq!(mpd.periods[1].start, 4.0);
    assert_eq!(mpd.periods[1].duration, Some(3.0));
    let expected = lines(&[
        "#EXTM3U",
        "#EXT-X-VERSION:6",
        "#EXT-X-TARGETDURATION:2",
        "#EXT-X-MEDIA-SEQUENCE:1",
        "#EXT-X-PLAYLIST-TYPE:VOD",
        "#EXT-X-INDEPENDENT-SEGMENTS",
        "#EXT-X-MAP:URI=\"init https://cdn.example/path/main/init.mp4\"",
        "#EXTINF:2.000,",
        "seg https://cdn.example/path/main/1.m4s",
        "#EXTINF:2.000,",
        "seg https://cdn.example/path/main/2.m4s",
        "#EXT-X-DISCONTINUITY",
        "#EXT-X-MAP:URI=\"init https://cdn.example/path/ad/init.mp4\"",
        "#EXTINF:2.000,",
        "seg https://cdn.example/path/ad/1.m4s",
        "#EXTINF:1.000,",
        "seg https://cdn.example/path/ad/2.m4s",
        "#EXT-X-ENDLIST",
    ]);
    assert_eq!(media(&mpd, "v_hd_3000", &MediaOptions::default()), expected);
}

#[test]
fn base_url_at_every_level() {
    let mpd = parse(
        r#"<MPD mediaPresentationDuration="PT2S"><BaseURL>https://cdn2.example/root/</BaseURL>
          <Period><BaseURL>p1/</BaseURL>
            <AdaptationSet mimeType="video/mp4"><BaseURL>video/</BaseURL>
              <SegmentTemplate duration="2" media="seg-$Number$.m4s"/>
              <Representation id="hd" bandwidth="1"><BaseURL>hd/</BaseURL></Representation>
              <Representation id="abs" bandwidth="2"><BaseURL>https://other.example/x/</BaseURL></Representation>
              <Representation id="root" bandwidth="3"><BaseURL>/top/</BaseURL></Representation>
              <Representation id="none" bandwidth="4"/>
            </AdaptationSet></Period></MPD>"#,
    );
    let first_url = |profile: &str| {
        let rep = mpd.find_profile(profile).unwrap();
        let index = segment_index(&mpd, &mpd.periods[0], rep, 0.0, None).unwrap();
        index.segments[0].url.to_string()
    };
    assert_eq!(
        first_url("0_hd_1"),
        "https://cdn2.example/root/p1/video/hd/seg-1.m4s"
    );
    assert_eq!(first_url("0_abs_2"), "https://other.example/x/seg-1.m4s");
    assert_eq!(first_url("0_root_3"), "https://cdn2.example/top/seg-1.m4s");
    assert_eq!(
        first_url("0_none_4"),
        "https://cdn2.example/root/p1/video/seg-1.m4s"
    );
}

#[test]
fn template_inherited_and_merged_attribute_wise() {
    let mpd = parse(
        r#"<MPD mediaPresentationDuration="PT4S"><Period>
          <SegmentTemplate timescale="1000" startNumber="10" media="p/$Number$.m4s"/>
          <AdaptationSet mimeType="video/mp4">
            <SegmentTemplate duration="2000" initialization="$RepresentationID$-init.mp4"/>
            <Representation id="r" bandwidth="1"><SegmentTemplate media="r/$Number$.m4s"/></Representation>
          </AdaptationSet></Period></MPD>"#,
    );
    let rep = mpd.find_profile("0_r_1").unwrap();
    let index = segment_index(&mpd, &mpd.periods[0], rep, 0.0, None).unwrap();
    assert_eq!(
        index.init.unwrap().url.as_str(),
        "https://cdn.example/path/r-init.mp4"
    );
    let urls: Vec<String> = index.segments.iter().map(|s| s.url.to_string()).collect();
    assert_eq!(
        urls,
        [
            "https://cdn.example/path/r/10.m4s",
            "https://cdn.example/path/r/11.m4s"
        ]
    );
}

const LADDER: &str = r#"<MPD mediaPresentationDuration="PT10S"><Period>
  <AdaptationSet id="v" mimeType="video/mp4" frameRate="30000/1001">
    <SegmentTemplate duration="2" media="$RepresentationID$/$Number$.m4s"/>
    <Representation id="1080" bandwidth="5000000" codecs="avc1.640028" width="1920" height="1080"/>
    <Representation id="720a" bandwidth="2500000" codecs="avc1.4d401f" width="1280" height="720"/>
    <Representation id="720b" bandwidth="3000000" codecs="avc1.4d401f" width="1280" height="720"/>
    <Representation id="480" bandwidth="1000000" codecs="avc1.4d401e" width="854" height="480"/>
  </AdaptationSet>
  <AdaptationSet id="de" mimeType="audio/mp4" lang="de" codecs="mp4a.40.2">
    <AudioChannelConfiguration schemeIdUri="urn:mpeg:dash:23003:3:audio_channel_configuration:2011" value="2"/>
    <SegmentTemplate duration="2" media="$RepresentationID$/$Number$.m4s"/>
    <Representation id="de" bandwidth="192000"/>
  </AdaptationSet>
  <AdaptationSet id="en" mimeType="audio/mp4" lang="en">
    <SegmentTemplate duration="2" media="$RepresentationID$/$Number$.m4s"/>
    <Representation id="en96" bandwidth="96000" codecs="mp4a.40.2"/>
    <Representation id="en128" bandwidth="128000" codecs="ec-3">
      <AudioChannelConfiguration schemeIdUri="tag:dolby.com,2014:dash:audio_channel_configuration:2011" value="F801"/>
    </Representation>
  </AdaptationSet>
</Period></MPD>"#;

fn playlist_url(rep: &Representation) -> String {
    format!("/proxy/mpd/playlist.m3u8?profile_id={}", rep.profile_id)
}

#[test]
fn master_audio_per_language_and_variant_per_height() {
    let mpd = parse(LADDER);
    let master = to_hls_master(&mpd, &MasterOptions::default(), playlist_url).unwrap();
    let codecs = "mp4a.40.2,ec-3";
    let expected = lines(&[
        "#EXTM3U",
        "#EXT-X-VERSION:6",
        "#EXT-X-INDEPENDENT-SEGMENTS",
        "#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"audio\",NAME=\"de\",LANGUAGE=\"de\",DEFAULT=NO,AUTOSELECT=YES,CHANNELS=\"2\",URI=\"/proxy/mpd/playlist.m3u8?profile_id=de_de_192000\"",
        "#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"audio\",NAME=\"en\",LANGUAGE=\"en\",DEFAULT=YES,AUTOSELECT=YES,CHANNELS=\"6\",URI=\"/proxy/mpd/playlist.m3u8?profile_id=en_en128_128000\"",
        &format!("#EXT-X-STREAM-INF:BANDWIDTH=5192000,RESOLUTION=1920x1080,FRAME-RATE=29.970,CODECS=\"avc1.640028,{codecs}\",AUDIO=\"audio\""),
        "/proxy/mpd/playlist.m3u8?profile_id=v_1080_5000000",
        &format!("#EXT-X-STREAM-INF:BANDWIDTH=3192000,RESOLUTION=1280x720,FRAME-RATE=29.970,CODECS=\"avc1.4d401f,{codecs}\",AUDIO=\"audio\""),
        "/proxy/mpd/playlist.m3u8?profile_id=v_720b_3000000",
        &format!("#EXT-X-STREAM-INF:BANDWIDTH=1192000,RESOLUTION=854x480,FRAME-RATE=29.970,CODECS=\"avc1.4d401e,{codecs}\",AUDIO=\"audio\""),
        "/proxy/mpd/playlist.m3u8?profile_id=v_480_1000000",
    ]);
    assert_eq!(master, expected);

    let variants = |options: MasterOptions| {
        let text = to_hls_master(&mpd, &options, playlist_url).unwrap();
        text.lines()
            .filter(|l| l.starts_with("/proxy/mpd/playlist.m3u8?profile_id=v_"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let one = |id: &str| vec![format!("/proxy/mpd/playlist.m3u8?profile_id={id}")];
    assert_eq!(
        variants(MasterOptions {
            resolution: Some(700),
            max_res: false
        }),
        one("v_480_1000000")
    );
    assert_eq!(
        variants(MasterOptions {
            resolution: Some(720),
            max_res: false
        }),
        one("v_720b_3000000")
    );
    assert_eq!(
        variants(MasterOptions {
            resolution: Some(100),
            max_res: false
        }),
        one("v_480_1000000")
    );
    assert_eq!(
        variants(MasterOptions {
            resolution: None,
            max_res: true
        }),
        one("v_1080_5000000")
    );
}

#[test]
fn audio_only_master_and_default_without_english() {
    let mpd = parse(
        r#"<MPD mediaPresentationDuration="PT2S"><Period>
          <AdaptationSet mimeType="audio/mp4" lang="fr"><SegmentTemplate duration="2" media="$Number$"/>
            <Representation id="fr" bandwidth="64000" codecs="opus"/></AdaptationSet>
          <AdaptationSet mimeType="audio/mp4" lang="it"><SegmentTemplate duration="2" media="$Number$"/>
            <Representation id="it" bandwidth="96000" codecs="opus"/></AdaptationSet>
        </Period></MPD>"#,
    );
    let master = to_hls_master(&mpd, &MasterOptions::default(), playlist_url).unwrap();
    let expected = lines(&[
        "#EXTM3U",
        "#EXT-X-VERSION:6",
        "#EXT-X-INDEPENDENT-SEGMENTS",
        "#EXT-X-STREAM-INF:BANDWIDTH=64000,CODECS=\"opus\"",
        "/proxy/mpd/playlist.m3u8?profile_id=0_fr_64000",
        "#EXT-X-STREAM-INF:BANDWIDTH=96000,CODECS=\"opus\"",
        "/proxy/mpd/playlist.m3u8?profile_id=1_it_96000",
    ]);
    assert_eq!(master, expected);
    let audio: Vec<&Representation> = mpd.representations().map(|(_, _, r)| r).collect();
    assert_eq!(master::default_audio(&audio), 1);
}

/// Two identical Periods of 2,500 video heights and 2,500 audio languages, two Representations
/// each: 20,000 Representations, 10,000 distinct profile ids. The lower video bandwidth comes
/// first (the best replaces it), the higher audio one first (it stays).
fn many_representations() -> Mpd {
    let mut period = String::from(
        r#"<Period duration="PT5S"><AdaptationSet id="v" mimeType="video/mp4" codecs="avc1.640028">
        <SegmentTemplate duration="2" media="$RepresentationID$/$Number$.m4s"/>"#,
    );
    for h in 1..=2500 {
        let bw = h * 1000;
        period.push_str(&format!(
            r#"<Representation id="h{h}lo" bandwidth="{bw}" width="16" height="{h}"/><Representation id="h{h}" bandwidth="{}" width="16" height="{h}"/>"#,
            bw + 500
        ));
    }
    period.push_str(
        r#"</AdaptationSet><AdaptationSet id="a" mimeType="audio/mp4" codecs="mp4a.40.2">
        <SegmentTemplate duration="2" media="$RepresentationID$/$Number$.m4s"/>"#,
    );
    for i in 1..=2500 {
        let bw = i * 10;
        period.push_str(&format!(
            r#"<Representation id="a{i}" lang="l{i}" bandwidth="{bw}"/><Representation id="a{i}lo" lang="l{i}" bandwidth="{}"/>"#,
            bw - 1
        ));
    }
    period.push_str("</AdaptationSet></Period>");
    let mpd = parse(&format!(
        r#"<MPD mediaPresentationDuration="PT10S">{period}{period}</MPD>"#
    ));
    assert_eq!(mpd.representations().count(), 20_000);
    mpd
}

#[test]
fn master_of_many_representations_is_exact() {
    let mpd = many_representations();
    let master = to_hls_master(&mpd, &MasterOptions::default(), playlist_url).unwrap();
    let mut want = vec![
        "#EXTM3U".to_owned(),
        "#EXT-X-VERSION:6".to_owned(),
        "#EXT-X-INDEPENDENT-SEGMENTS".to_owned(),
    ];
    // The first four languages; no English, so the highest bandwidth is the default.
    for i in 1..=4 {
        let default = if i == 4 { "YES" } else { "NO" };
        want.push(format!(
            "#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"audio\",NAME=\"l{i}\",LANGUAGE=\"l{i}\",DEFAULT={default},AUTOSELECT=YES,URI=\"/proxy/mpd/playlist.m3u8?profile_id=a_a{i}_{}\"",
            i * 10
        ));
    }
    // The five highest heights, each at its higher bandwidth, plus the widest audio (40).
    for h in (2496..=2500).rev() {
        let bw = h * 1000 + 500;
        want.push(format!(
            "#EXT-X-STREAM-INF:BANDWIDTH={},RESOLUTION=16x{h},CODECS=\"avc1.640028,mp4a.40.2\",AUDIO=\"audio\"",
            bw + 40
        ));
        want.push(format!("/proxy/mpd/playlist.m3u8?profile_id=v_h{h}_{bw}"));
    }
    let want: Vec<&str> = want.iter().map(String::as_str).collect();
    assert_eq!(master, lines(&want));
}

/// A key that counts how often it is compared.
struct Counted<'c, K>(K, &'c std::cell::Cell<u64>);

impl<K: PartialEq> PartialEq for Counted<'_, K> {
    fn eq(&self, other: &Self) -> bool {
        self.1.set(self.1.get() + 1);
        self.0 == other.0
    }
}

impl<K: Eq> Eq for Counted<'_, K> {}

impl<K: std::hash::Hash> std::hash::Hash for Counted<'_, K> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

/// The master's track dedup compares each Representation's key about once, not once per track
/// kept before it (quadratic: ~5 * 10^7 comparisons here).
#[test]
fn master_track_dedup_compares_each_key_about_once() {
    let compared = std::cell::Cell::new(0);
    let firsts = master::first_of_each(0..20_000u32, |&i| Counted(i % 10_000, &compared));
    assert_eq!(firsts, (0..10_000).collect::<Vec<_>>());
    assert!(compared.get() <= 40_000, "{} comparisons", compared.get());

    let mpd = many_representations();
    let compared = std::cell::Cell::new(0);
    let reps = mpd.representations().map(|(_, _, r)| r);
    let best = master::best_of_each(reps, |r| Counted(r.height, &compared));
    // 2,500 heights at their higher bandwidth, then every audio track under "no height".
    assert_eq!(best.len(), 2501);
    assert_eq!(best[0].profile_id, "v_h1_1500");
    assert_eq!(best[2499].profile_id, "v_h2500_2500500");
    assert_eq!(best[2500].profile_id, "a_a2500_25000");
    assert!(compared.get() <= 40_000, "{} comparisons", compared.get());
}

#[test]
fn protected_set_reports_kid_and_licence() {
    let mpd = parse(
        r#"<MPD xmlns:cenc="urn:mpeg:cenc:2013" xmlns:clearkey="http://dashif.org/guidelines/clearKey"
             mediaPresentationDuration="PT2S"><Period>
          <AdaptationSet mimeType="video/mp4">
            <ContentProtection schemeIdUri="urn:mpeg:dash:mp4protection:2011" value="cenc"
                cenc:default_KID="9EB4050D-E44B-4802-932E-27D75083E266"/>
            <ContentProtection schemeIdUri="urn:uuid:e2719d58-a985-b3c9-781a-b030af78d30e">
              <clearkey:Laurl Lic_type="EME-1.0">https://lic.example/ck</clearkey:Laurl>
            </ContentProtection>
            <ContentProtection schemeIdUri="urn:uuid:EDEF8BA9-79D6-4ACE-A3C8-27DCD51D21ED"><cenc:pssh>AAAA</cenc:pssh></ContentProtection>
            <SegmentTemplate duration="2" media="$Number$.m4s"/>
            <Representation id="v" bandwidth="1"/>
          </AdaptationSet>
          <AdaptationSet mimeType="audio/mp4"><SegmentTemplate duration="2" media="$Number$.m4s"/>
            <Representation id="a" bandwidth="1"/></AdaptationSet>
        </Period></MPD>"#,
    );
    let video = mpd.find_profile("0_v_1").unwrap();
    assert!(video.is_protected());
    assert_eq!(video.key_ids(), ["9eb4050de44b4802932e27d75083e266"]);
    let systems: Vec<DrmSystem> = video.protection.iter().map(|p| p.system).collect();
    assert_eq!(
        systems,
        [DrmSystem::Cenc, DrmSystem::ClearKey, DrmSystem::Widevine]
    );
    assert_eq!(video.protection[0].value.as_deref(), Some("cenc"));
    assert_eq!(
        video.protection[1].license_url.as_deref(),
        Some("https://lic.example/ck")
    );
    assert_eq!(video.protection[2].pssh.as_deref(), Some("AAAA"));
    let audio = mpd.find_profile("1_a_1").unwrap();
    assert!(!audio.is_protected());
    assert!(audio.key_ids().is_empty());
}

/// An MPD naming many KIDs and one long licence URL over and over: the keys-needed message
/// names each at most once and at most 16 of them (it goes back to the client), and each value
/// is looked up once. The URL is compared as it is named (shortened): it was compared whole,
/// so a long one was listed once per Representation.
#[test]
fn keys_needed_names_distinct_values_and_a_few_of_them() {
    let url = format!("https://lic.example/{}", "k".repeat(300));
    let mut sets = String::new();
    for i in 0..200 {
        sets.push_str(&format!(
            r#"<AdaptationSet mimeType="video/mp4">
            <ContentProtection schemeIdUri="urn:mpeg:dash:mp4protection:2011" value="cenc"
                cenc:default_KID="00000000-0000-0000-0000-{i:012}"/>
            <ContentProtection schemeIdUri="urn:uuid:e2719d58-a985-b3c9-781a-b030af78d30e">
              <clearkey:Laurl Lic_type="EME-1.0">{url}</clearkey:Laurl>
            </ContentProtection>
            <SegmentTemplate duration="2" media="$Number$.m4s"/>
            <Representation id="v{i}" bandwidth="{i}"/></AdaptationSet>"#
        ));
    }
    let mpd = parse(&format!(
        r#"<MPD xmlns:cenc="urn:mpeg:cenc:2013" xmlns:clearkey="http://dashif.org/guidelines/clearKey"
             mediaPresentationDuration="PT2S"><Period>{sets}</Period></MPD>"#
    ));
    let needed = proxy::keys_needed(&mpd, None).unwrap();
    assert_eq!(needed.kids.len(), 16);
    assert_eq!(needed.kids[0], "00000000000000000000000000000000");
    assert_eq!(needed.kids[15], "00000000000000000000000000000015");
    assert_eq!(needed.license_urls.len(), 1);
    assert!(needed.license_urls[0].ends_with('…'));
}

/// `key_ids` over 20,000 distinct KIDs, each listed twice: one hash lookup per entry, where a
/// scan of the kept ones per entry was ~6 * 10^8 comparisons (seconds; 120,000 were minutes).
#[test]
fn key_ids_of_many_kids_are_distinct_and_in_order() {
    let mpd = parse(
        r#"<MPD mediaPresentationDuration="PT2S"><Period><AdaptationSet mimeType="video/mp4">
          <SegmentTemplate duration="2" media="$Number$.m4s"/>
          <Representation id="v" bandwidth="1"/></AdaptationSet></Period></MPD>"#,
    );
    let mut rep = mpd.find_profile("0_v_1").unwrap().clone();
    let kid = |i: usize| format!("{i:032x}");
    let listed = |i: usize| {
        std::sync::Arc::new(ContentProtection {
            system: DrmSystem::Cenc,
            scheme_id_uri: "urn:mpeg:dash:mp4protection:2011".into(),
            value: Some("cenc".into()),
            default_kid: Some(kid(i)),
            license_url: None,
            pssh: None,
        })
    };
    let n = 20_000;
    rep.protection = (0..n).chain((0..n).rev()).map(listed).collect();
    // Deduplicated by hash (`master::first_of_each`), not by a search of those kept: the cost
    // is the benchmarks' to show, not a timed test's.
    let kids = rep.key_ids();
    assert_eq!(kids, (0..n).map(kid).collect::<Vec<_>>());
}

#[test]
fn representation_attributes_inherit_from_the_set() {
    let mpd = parse(
        r#"<MPD mediaPresentationDuration="PT2S"><Period>
          <AdaptationSet id="7" mimeType="video/mp4" codecs="hvc1.1.6.L93.B0" sar="1:1" frameRate="25" height="540">
            <SegmentTemplate duration="2" media="$Number$.m4s"/>
            <Representation id="a" bandwidth="10" width="960"/>
            <Representation id="b" bandwidth="20" mimeType="audio/mp4" audioSamplingRate="48000" lang="es"/>
          </AdaptationSet></Period></MPD>"#,
    );
    let a = mpd.find_profile("7_a_10").unwrap();
    assert_eq!(
        (a.kind, a.width, a.height, a.frame_rate),
        (ContentKind::Video, Some(960), Some(540), Some(25.0))
    );
    assert_eq!(
        (a.codecs.as_deref(), a.sar.as_deref()),
        (Some("hvc1.1.6.L93.B0"), Some("1:1"))
    );
    let b = mpd.find_profile("7_b_20").unwrap();
    assert_eq!(
        (b.kind, b.audio_sampling_rate, b.lang.as_deref()),
        (ContentKind::Audio, Some(48000), Some("es"))
    );
}
