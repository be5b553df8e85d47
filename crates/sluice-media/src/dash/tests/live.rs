//! Dynamic MPDs: the window at two different "now"s and a media sequence that does not jump.

use super::*;

fn live_options(now: f64) -> MediaOptions {
    MediaOptions {
        now,
        ..MediaOptions::default()
    }
}

const NUMBERED: &str = r#"<MPD type="dynamic" availabilityStartTime="2024-01-01T00:00:00Z"
    publishTime="2024-01-01T00:01:00Z" minimumUpdatePeriod="PT2S" timeShiftBufferDepth="PT10S"
    suggestedPresentationDelay="PT6S">
  <Period id="p0" start="PT0S"><AdaptationSet mimeType="video/mp4">
    <SegmentTemplate timescale="1" duration="2" startNumber="1" media="live/$Number$.m4s" initialization="live/init.mp4"/>
    <Representation id="v" bandwidth="100"/></AdaptationSet></Period></MPD>"#;

fn numbered_playlist(first_number: u64, first_start: u64, count: u64) -> String {
    let mut text = vec![
        "#EXTM3U".to_owned(),
        "#EXT-X-VERSION:6".to_owned(),
        "#EXT-X-TARGETDURATION:2".to_owned(),
        format!("#EXT-X-MEDIA-SEQUENCE:{first_number}"),
        "#EXT-X-INDEPENDENT-SEGMENTS".to_owned(),
        "#EXT-X-MAP:URI=\"init https://cdn.example/path/live/init.mp4\"".to_owned(),
    ];
    for i in 0..count {
        text.push(format!(
            "#EXT-X-PROGRAM-DATE-TIME:{}",
            format_datetime(AST + (first_start + 2 * i) as f64)
        ));
        text.push("#EXTINF:2.000,".to_owned());
        text.push(format!(
            "seg https://cdn.example/path/live/{}.m4s",
            first_number + i
        ));
    }
    text.iter().map(|l| format!("{l}\n")).collect()
}

#[test]
fn dynamic_duration_template_window_is_stable() {
    let mpd = parse(NUMBERED);
    assert!(mpd.is_live());
    assert_eq!(mpd.availability_start_time, Some(AST));
    assert_eq!(mpd.publish_time, Some(AST + 60.0));
    assert_eq!(mpd.minimum_update_period, Some(2.0));
    assert_eq!(mpd.suggested_presentation_delay, Some(6.0));
    assert_eq!(mpd.time_shift_depth(), 10.0);

    // Edge at 100.5 s: complete segments end by 100 s, the window reaches back to 90.5 s.
    let first = media(&mpd, "0_v_100", &live_options(AST + 100.5));
    assert_eq!(first, numbered_playlist(46, 90, 5));
    assert!(first.contains("#EXT-X-PROGRAM-DATE-TIME:2024-01-01T00:01:30.000Z\n"));
    // Four seconds later two segments left and two arrived; segment 48 keeps its number.
    let later = media(&mpd, "0_v_100", &live_options(AST + 104.2));
    assert_eq!(later, numbered_playlist(48, 94, 5));

    let depth = MediaOptions {
        live_depth: Some(2),
        ..live_options(AST + 104.2)
    };
    assert_eq!(
        media(&mpd, "0_v_100", &depth),
        numbered_playlist(51, 100, 2)
    );
    // A start offset deeper than the depth keeps enough segments to honour it.
    let deep = MediaOptions {
        live_depth: Some(2),
        start_offset: Some(-5.0),
        ..live_options(AST + 104.2)
    };
    let text = media(&mpd, "0_v_100", &deep);
    assert!(text.contains("#EXT-X-MEDIA-SEQUENCE:49\n#EXT-X-INDEPENDENT-SEGMENTS\n#EXT-X-START:TIME-OFFSET=-5,PRECISE=YES\n"));
}

#[test]
fn dynamic_before_availability_lists_nothing() {
    let mpd = parse(NUMBERED);
    let text = media(&mpd, "0_v_100", &live_options(AST - 50.0));
    assert_eq!(
        text,
        "#EXTM3U\n#EXT-X-VERSION:6\n#EXT-X-TARGETDURATION:1\n#EXT-X-MEDIA-SEQUENCE:0\n#EXT-X-INDEPENDENT-SEGMENTS\n"
    );
}

const TIMED: &str = r#"<MPD type="dynamic" availabilityStartTime="2024-01-01T00:00:00Z" timeShiftBufferDepth="PT6S">
  <Period start="PT0S"><AdaptationSet mimeType="audio/mp4">
    <SegmentTemplate timescale="1000" media="t/$Time$.m4s" initialization="t/init.mp4">
      <SegmentTimeline><S t="0" d="2000" r="-1"/></SegmentTimeline>
    </SegmentTemplate>
    <Representation id="a" bandwidth="1"/></AdaptationSet></Period></MPD>"#;

fn timed_playlist(first_index: u64) -> String {
    let mut text = lines(&[
        "#EXTM3U",
        "#EXT-X-VERSION:6",
        "#EXT-X-TARGETDURATION:2",
        &format!("#EXT-X-MEDIA-SEQUENCE:{first_index}"),
        "#EXT-X-INDEPENDENT-SEGMENTS",
        "#EXT-X-MAP:URI=\"init https://cdn.example/path/t/init.mp4\"",
    ]);
    for i in first_index..first_index + 3 {
        text.push_str(&lines(&[
            &format!(
                "#EXT-X-PROGRAM-DATE-TIME:{}",
                format_datetime(AST + 2.0 * i as f64)
            ),
            "#EXTINF:2.000,",
            &format!("seg https://cdn.example/path/t/{}.m4s", i * 2000),
        ]));
    }
    text
}

#[test]
fn dynamic_time_timeline_sequence_comes_from_time() {
    let mpd = parse(TIMED);
    assert_eq!(
        media(&mpd, "0_a_1", &live_options(AST + 61.0)),
        timed_playlist(27)
    );
    assert_eq!(
        media(&mpd, "0_a_1", &live_options(AST + 65.0)),
        timed_playlist(29)
    );
    // Years of `r=-1` history cost nothing: only the window is expanded.
    let text = media(&mpd, "0_a_1", &live_options(AST + 86_400.0 * 365.0));
    assert_eq!(text.matches("#EXTINF").count(), 3);
}

#[test]
fn dynamic_numbered_timeline_uses_start_number() {
    let mpd = parse(
        r#"<MPD type="dynamic" availabilityStartTime="2024-01-01T00:00:00Z" timeShiftBufferDepth="PT4S">
          <Period start="PT10S"><AdaptationSet mimeType="video/mp4">
            <SegmentTemplate timescale="10" startNumber="700" presentationTimeOffset="1000" media="$Number$-$Time$.m4s">
              <SegmentTimeline><S t="1000" d="20" r="9"/></SegmentTimeline>
            </SegmentTemplate>
            <Representation id="v" bandwidth="1"/></AdaptationSet></Period></MPD>"#,
    );
    // Period starts 10 s after AST; at now = AST + 20 the edge is 10 s into the Period.
    let rep = mpd.find_profile("0_v_1").unwrap();
    let index = segment_index(&mpd, &mpd.periods[0], rep, AST + 20.0, None).unwrap();
    let got: Vec<(u64, u64, f64)> = index
        .segments
        .iter()
        .map(|s| (s.number, s.time, s.start_secs))
        .collect();
    assert_eq!(got, [(703, 1060, 6.0), (704, 1080, 8.0)]);
    assert_eq!(
        index.segments[0].url.as_str(),
        "https://cdn.example/path/703-1060.m4s"
    );
}

#[test]
fn dynamic_requires_availability_start() {
    let err = parse_mpd(r#"<MPD type="dynamic"><Period/></MPD>"#, &mpd_url()).unwrap_err();
    assert_eq!(err, DashError::Missing("MPD@availabilityStartTime"));
}

/// A live `$Time$` timeline of 100,000 distinct `S@d` (about 1.5 MB of MPD): every one listed,
/// numbered by the longest (all tie at one each), without a quadratic count on the way.
#[test]
fn dynamic_time_timeline_of_distinct_durations_is_numbered_by_the_longest() {
    let n = MAX_SEGMENTS as u64;
    let timeline: String = (0..n).map(|i| format!("<S d=\"{}\"/>", 1000 + i)).collect();
    let mpd = parse(&format!(
        r#"<MPD type="dynamic" availabilityStartTime="2024-01-01T00:00:00Z" timeShiftBufferDepth="P1000D">
          <Period start="PT0S"><AdaptationSet mimeType="video/mp4">
            <SegmentTemplate timescale="1000" media="$Time$.m4s">
              <SegmentTimeline>{timeline}</SegmentTimeline>
            </SegmentTemplate>
            <Representation id="v" bandwidth="1"/></AdaptationSet></Period></MPD>"#
    ));
    let rep = mpd.find_profile("0_v_1").unwrap();
    // Past the end of the timeline: every segment is complete and inside the window.
    let index = segment_index(&mpd, &mpd.periods[0], rep, AST + 1e7, None).unwrap();
    assert_eq!(index.segments.len(), MAX_SEGMENTS);
    let longest = 1000 + n - 1;
    for segment in [
        &index.segments[0],
        &index.segments[1],
        &index.segments[99_999],
    ] {
        assert_eq!(segment.number, segment.time / longest);
    }
    let last = &index.segments[99_999];
    // The sum of 1000 .. 1000 + n - 1, less the last one.
    assert_eq!(last.time, (1000 + longest) * n / 2 - longest);
    assert_eq!(last.number, last.time / longest);
    assert_eq!(
        last.url.as_str(),
        format!("https://cdn.example/path/{}.m4s", last.time)
    );
}
