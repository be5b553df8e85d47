//! Hostile and malformed MPDs: typed errors, never a panic, an expansion or an endless loop.

use proptest::prelude::*;

use super::*;

fn parse_err(xml: &str) -> DashError {
    parse_mpd(xml, &mpd_url()).unwrap_err()
}

#[test]
fn entity_bomb_is_not_expanded() {
    let bomb = r#"<?xml version="1.0"?>
<!DOCTYPE MPD [
  <!ENTITY lol "lol">
  <!ENTITY lol1 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
  <!ENTITY lol2 "&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;">
  <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
  <!ENTITY lol9 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
]>
<MPD><BaseURL>&lol9;</BaseURL><Period/></MPD>"#;
    assert!(matches!(parse_err(bomb), DashError::Xml(_)));
    let in_attribute = bomb.replace("<BaseURL>&lol9;</BaseURL>", "<Period id=\"&lol9;\"/>");
    assert!(matches!(parse_err(&in_attribute), DashError::Xml(_)));
}

#[test]
fn external_entity_is_not_resolved() {
    let xxe = r#"<!DOCTYPE MPD [<!ENTITY x SYSTEM "file:///etc/passwd">]><MPD><BaseURL>&x;</BaseURL></MPD>"#;
    assert!(matches!(parse_err(xxe), DashError::Xml(_)));
}

#[test]
fn doctype_alone_is_skipped_and_predefined_entities_work() {
    let xml = r#"<!DOCTYPE MPD><MPD mediaPresentationDuration="PT2S"><Period>
      <AdaptationSet mimeType="video/mp4"><SegmentTemplate duration="2" media="s?a=1&amp;b=$Number$"/>
      <Representation id="v" bandwidth="1"/></AdaptationSet></Period></MPD>"#;
    let mpd = parse(xml);
    let rep = mpd.find_profile("0_v_1").unwrap();
    let index = segment_index(&mpd, &mpd.periods[0], rep, 0.0, None).unwrap();
    assert_eq!(
        index.segments[0].url.as_str(),
        "https://cdn.example/path/s?a=1&b=1"
    );
}

#[test]
fn malformed_xml_is_a_typed_error() {
    for bad in [
        "",
        "not xml at all",
        "<MPD>",
        "<MPD><Period></MPD>",
        "<MPD></Period></MPD>",
        "<MPD attr=\"unterminated></MPD>",
        "<MPD a=\"1\" a=\"2\"/>",
        "<MPD>&bogus;</MPD>",
    ] {
        assert!(
            matches!(parse_err(bad), DashError::Xml(_)),
            "{bad:?} → {:?}",
            parse_err(bad)
        );
    }
    assert_eq!(
        parse_err("<html><body/></html>"),
        DashError::NotMpd("html".into())
    );
}

#[test]
fn deep_nesting_is_refused() {
    let depth = 10_000;
    let xml = format!("<MPD>{}{}</MPD>", "<a>".repeat(depth), "</a>".repeat(depth));
    assert_eq!(parse_err(&xml), DashError::TooDeep(xml::MAX_DEPTH));
}

#[test]
fn too_many_elements_are_refused() {
    let xml = format!("<MPD>{}</MPD>", "<a/>".repeat(xml::MAX_ELEMENTS + 1));
    assert_eq!(
        parse_err(&xml),
        DashError::TooManyElements(xml::MAX_ELEMENTS)
    );
}

/// quick-xml checks each attribute against all before it, so 100,000 on one element cost 5 * 10^9
/// comparisons: more than `MAX_ATTRIBUTES` is refused, before the rest are read.
#[test]
fn too_many_attributes_on_one_element_are_refused() {
    let attrs = |n: usize| (0..n).map(|i| format!(" a{i}=\"{i}\"")).collect::<String>();
    let xml = format!("<MPD{}><Period/></MPD>", attrs(1_000));
    assert_eq!(
        parse_err(&xml),
        DashError::TooManyAttributes(xml::MAX_ATTRIBUTES)
    );
    let deep = format!("<MPD><Period{}/></MPD>", attrs(xml::MAX_ATTRIBUTES + 1));
    assert_eq!(
        parse_err(&deep),
        DashError::TooManyAttributes(xml::MAX_ATTRIBUTES)
    );
    // At the cap, the document parses and its attributes are read.
    let xml = format!(
        r#"<MPD mediaPresentationDuration="PT4S"{}><Period/></MPD>"#,
        attrs(xml::MAX_ATTRIBUTES - 1)
    );
    let mpd = parse(&xml);
    assert_eq!(mpd.media_presentation_duration, Some(4.0));
}

/// A live MPD whose Period id is long: the key naming the Period across updates is its hash,
/// made once for the Period, so neither the playlist build (one key per segment before) nor the
/// caller's kept state holds a copy of the id per segment. A 200 KB id over 100,000 segments
/// was 20 GB.
#[test]
fn a_long_period_id_is_kept_as_a_short_key() {
    let live = |id: &str| {
        parse(&format!(
            r#"<MPD type="dynamic" availabilityStartTime="1970-01-01T00:00:00Z" timeShiftBufferDepth="PT1000S">
              <Period id="{id}" start="PT0S"><AdaptationSet mimeType="video/mp4">
                <SegmentTemplate media="$Number$" timescale="1" duration="1"/>
                <Representation id="v" bandwidth="1"/></AdaptationSet></Period></MPD>"#
        ))
    };
    let long = "p".repeat(20_000);
    let mpd = live(&long);
    let key = media::period_key(&mpd.periods[0]);
    assert_eq!(key.len(), "id sha256:".len() + 64);
    assert!(key.starts_with("id sha256:"));
    // A short id keeps the key it always had, so kept state still matches it.
    assert_eq!(media::period_key(&live("p1").periods[0]), "id p1");
    assert_eq!(
        media::period_key(&live(&"q".repeat(64)).periods[0]),
        format!("id {}", "q".repeat(64))
    );
    assert_ne!(media::period_key(&live(&"p".repeat(65)).periods[0]), key);

    let mut sequence = LiveSequence::default();
    let options = MediaOptions {
        now: 100_000.0,
        ..MediaOptions::default()
    };
    let playlist =
        to_hls_media_live(&mpd, "0_v_1", &options, &mut sequence, |_| "s".into()).unwrap();
    // The whole 1,000 s window, numbered on from the segment the window starts at.
    assert_eq!(playlist.matches("#EXTINF:1.000,").count(), 1_000);
    assert!(playlist.contains("#EXT-X-MEDIA-SEQUENCE:99001\n"));
    // The state kept between updates holds the short key, not the id.
    let kept = format!("{sequence:?}");
    assert!(kept.len() < 500, "{} bytes kept", kept.len());
    let again = to_hls_media_live(&mpd, "0_v_1", &options, &mut sequence, |_| "s".into()).unwrap();
    assert_eq!(again, playlist);
}

/// `period` at Period level, then one AdaptationSet with `set` and `reps` bare Representations.
fn inherited_by(period: &str, set_attrs: &str, set: &str, reps: usize) -> String {
    format!(
        r#"<MPD mediaPresentationDuration="PT10S"><Period>{period}<AdaptationSet mimeType="video/mp4" {set_attrs}>{set}{}</AdaptationSet></Period></MPD>"#,
        r#"<Representation id="r" bandwidth="1"/>"#.repeat(reps)
    )
}

fn too_many_entries() -> DashError {
    DashError::TooMuchResolved {
        what: "timeline, segment URL and ContentProtection entries",
        limit: MAX_RESOLVED_ENTRIES,
    }
}

/// One N-entry list inherited by M Representations is N x M entries: a document of a few
/// thousand elements must not ask for gigabytes (or later write them out M times).
#[test]
fn inherited_lists_times_representations_are_refused() {
    let timeline = format!(
        r#"<SegmentTemplate media="$Number$.m4s"><SegmentTimeline>{}</SegmentTimeline></SegmentTemplate>"#,
        r#"<S d="1"/>"#.repeat(5_000)
    );
    // 5,000 x 200 is exactly the bound; one more Representation is over it.
    let mpd = parse_mpd(&inherited_by("", "", &timeline, 200), &mpd_url()).unwrap();
    assert_eq!(mpd.representations().count(), 200);
    assert_eq!(
        parse_err(&inherited_by("", "", &timeline, 201)),
        too_many_entries()
    );
    assert_eq!(
        parse_err(&inherited_by(&timeline, "", "", 250)),
        too_many_entries()
    );

    let list = format!(
        r#"<SegmentList duration="1">{}</SegmentList>"#,
        r#"<SegmentURL media="s.m4s"/>"#.repeat(5_000)
    );
    assert_eq!(
        parse_err(&inherited_by("", "", &list, 250)),
        too_many_entries()
    );

    let protection = format!(
        r#"{}<SegmentTemplate duration="1" media="$Number$.m4s"/>"#,
        r#"<ContentProtection schemeIdUri="urn:mpeg:dash:mp4protection:2011" value="cenc"/>"#
            .repeat(1_000)
    );
    assert_eq!(
        parse_err(&inherited_by("", "", &protection, 1_001)),
        too_many_entries()
    );
}

/// One long attribute on an AdaptationSet is copied into each of its Representations.
#[test]
fn inherited_text_times_representations_is_refused() {
    let template = r#"<SegmentTemplate duration="1" media="$Number$.m4s"/>"#;
    let codecs = format!(r#"codecs="{}""#, "a".repeat(1 << 20));
    // 60 MiB of copies passes, 65 MiB does not.
    let mpd = parse_mpd(&inherited_by("", &codecs, template, 60), &mpd_url()).unwrap();
    assert_eq!(mpd.representations().count(), 60);
    assert_eq!(
        parse_err(&inherited_by("", &codecs, template, 65)),
        DashError::TooMuchResolved {
            what: "bytes of text",
            limit: MAX_RESOLVED_BYTES,
        }
    );
}

fn one_template(template: &str, mpd_attrs: &str) -> String {
    format!(
        r#"<MPD {mpd_attrs}><Period><AdaptationSet mimeType="video/mp4">{template}
        <Representation id="v" bandwidth="1"/></AdaptationSet></Period></MPD>"#
    )
}

fn media_err(template: &str, mpd_attrs: &str) -> DashError {
    match parse_mpd(&one_template(template, mpd_attrs), &mpd_url()) {
        Ok(mpd) => to_hls_media(&mpd, "0_v_1", &MediaOptions::default(), show).unwrap_err(),
        Err(e) => e,
    }
}

#[test]
fn hostile_numbers_are_typed_errors() {
    let vod = r#"mediaPresentationDuration="PT10S""#;
    let huge = r#"<MPD><Period><AdaptationSet><Representation id="v" bandwidth="99999999999999999999999"/></AdaptationSet></Period></MPD>"#;
    assert!(matches!(
        parse_err(huge),
        DashError::InvalidAttribute {
            name: "bandwidth",
            ..
        }
    ));
    assert!(matches!(
        parse_err(&one_template(
            r#"<SegmentTemplate timescale="0" duration="1" media="$Number$"/>"#,
            vod
        )),
        DashError::InvalidAttribute {
            name: "timescale",
            ..
        }
    ));
    assert!(matches!(
        parse_err(&one_template(
            r#"<SegmentTemplate duration="0" media="$Number$"/>"#,
            vod
        )),
        DashError::InvalidAttribute {
            name: "duration",
            ..
        }
    ));
    assert!(matches!(
        parse_err(&one_template(
            r#"<SegmentTemplate media="x"><SegmentTimeline><S d="0"/></SegmentTimeline></SegmentTemplate>"#,
            vod
        )),
        DashError::InvalidAttribute { name: "S@d", .. }
    ));
    assert!(matches!(
        parse_err(&one_template(
            r#"<SegmentTemplate media="x"><SegmentTimeline><S d="1" r="-2"/></SegmentTimeline></SegmentTemplate>"#,
            vod
        )),
        DashError::InvalidAttribute { name: "S@r", .. }
    ));
    assert!(matches!(
        parse_err(&one_template("", r#"mediaPresentationDuration="PT1H1H""#)),
        DashError::InvalidAttribute { .. }
    ));
    assert!(matches!(
        parse_err(&one_template(
            "",
            r#"type="dynamic" availabilityStartTime="soon""#
        )),
        DashError::InvalidAttribute { .. }
    ));
    // A 100-year presentation of 1 ms segments would be billions of segments.
    let long = r#"mediaPresentationDuration="P100Y""#;
    assert_eq!(
        media_err(
            r#"<SegmentTemplate timescale="1000" duration="1" media="$Number$"/>"#,
            long
        ),
        DashError::TooManySegments(MAX_SEGMENTS)
    );
    assert_eq!(
        media_err(
            r#"<SegmentTemplate media="$Time$"><SegmentTimeline><S d="1" r="9223372036854775807"/></SegmentTimeline></SegmentTemplate>"#,
            vod
        ),
        DashError::TooManySegments(MAX_SEGMENTS)
    );
    // An open-ended repeat in a presentation without an end cannot be expanded.
    assert!(matches!(
        media_err(
            r#"<SegmentTemplate media="$Time$"><SegmentTimeline><S d="1" r="-1"/></SegmentTimeline></SegmentTemplate>"#,
            ""
        ),
        DashError::Missing(_)
    ));
    assert!(matches!(
        media_err(r#"<SegmentTemplate duration="2" media="$Number$"/>"#, ""),
        DashError::Missing(_)
    ));
    assert!(matches!(
        media_err(r#"<SegmentTemplate duration="2" media="$Nope$"/>"#, vod),
        DashError::Template { .. }
    ));
    assert!(matches!(
        media_err(
            r#"<SegmentTemplate media="$Time$"><SegmentTimeline><S t="18446744073709551615" d="18446744073709551615" r="3"/></SegmentTimeline></SegmentTemplate>"#,
            vod
        ),
        DashError::Overflow
    ));
}

#[test]
fn long_templates_cannot_multiply_into_huge_playlists() {
    // One URL over MAX_URL_LEN: refused, however few segments.
    let vod = r#"mediaPresentationDuration="PT10S""#;
    let long = format!(
        r#"<SegmentTemplate duration="1" media="{}$Number$"/>"#,
        "a".repeat(MAX_URL_LEN)
    );
    assert_eq!(media_err(&long, vod), DashError::UrlTooLong(MAX_URL_LEN));
    let long_init = format!(
        r#"<SegmentTemplate duration="1" media="$Number$" initialization="{}"/>"#,
        "i".repeat(MAX_URL_LEN)
    );
    assert_eq!(
        media_err(&long_init, vod),
        DashError::UrlTooLong(MAX_URL_LEN)
    );
    // 8,000 URLs of 5 KiB: each allowed, together over MAX_URL_BYTES.
    let wide = format!(
        r#"<SegmentTemplate duration="1" media="{}$Number$"/>"#,
        "w".repeat(5 * 1024)
    );
    let many = r#"mediaPresentationDuration="PT8000S""#;
    assert_eq!(
        media_err(&wide, many),
        DashError::TooManyUrlBytes(MAX_URL_BYTES)
    );
    // A 4 KiB init named by each of 10,000 short segments: the same total.
    let init = format!(
        r#"<SegmentTemplate duration="1" media="$Number$" initialization="{}"/>"#,
        "i".repeat(4 * 1024)
    );
    let more = r#"mediaPresentationDuration="PT10000S""#;
    let mpd = parse_mpd(&one_template(&init, more), &mpd_url()).unwrap();
    let rep = &mpd.periods[0].adaptation_sets[0].representations[0];
    let index = segment_index(&mpd, &mpd.periods[0], rep, 0.0, None).unwrap();
    assert_eq!(index.segments.len(), 10_000);
    assert_eq!(
        to_hls_media(&mpd, "0_v_1", &MediaOptions::default(), show).err(),
        Some(DashError::TooManyUrlBytes(MAX_URL_BYTES))
    );
    // 2,000 such segments fit.
    let fewer = r#"mediaPresentationDuration="PT2000S""#;
    let mpd = parse_mpd(&one_template(&wide, fewer), &mpd_url()).unwrap();
    assert!(to_hls_media(&mpd, "0_v_1", &MediaOptions::default(), show).is_ok());
}

#[test]
fn open_repeat_in_static_mpd_runs_to_the_period_end() {
    let xml = one_template(
        r#"<SegmentTemplate timescale="10" media="$Time$"><SegmentTimeline><S t="0" d="40" r="-1"/></SegmentTimeline></SegmentTemplate>"#,
        r#"mediaPresentationDuration="PT10S""#,
    );
    let mpd = parse(&xml);
    let rep = mpd.find_profile("0_v_1").unwrap();
    let index = segment_index(&mpd, &mpd.periods[0], rep, 0.0, None).unwrap();
    let times: Vec<u64> = index.segments.iter().map(|s| s.time).collect();
    assert_eq!(times, [0, 40, 80]);
}

#[test]
fn unknown_profile_and_empty_mpd() {
    let mpd = parse(r#"<MPD mediaPresentationDuration="PT1S"><Period/></MPD>"#);
    assert_eq!(
        to_hls_master(&mpd, &MasterOptions::default(), playlist_url),
        Err(DashError::NoTracks)
    );
    let err = to_hls_media(&mpd, "nope", &MediaOptions::default(), show).unwrap_err();
    assert_eq!(err, DashError::UnknownProfile("nope".into()));
}

/// Runs everything downstream of parsing, as a handler would.
fn exercise(xml: &str, now: f64) {
    let Ok(mpd) = parse_mpd(xml, &mpd_url()) else {
        return;
    };
    let _ = to_hls_master(&mpd, &MasterOptions::default(), playlist_url);
    let profiles: Vec<String> = mpd
        .representations()
        .map(|(_, _, r)| r.profile_id.clone())
        .collect();
    for profile in profiles {
        let options = MediaOptions {
            now,
            live_depth: Some(5),
            skip: vec![(1.0, 3.0)],
            ..MediaOptions::default()
        };
        let _ = to_hls_media(&mpd, &profile, &options, show);
    }
}

fn number_text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0".to_owned()),
        Just("-1".to_owned()),
        Just("18446744073709551615".to_owned()),
        Just("99999999999999999999".to_owned()),
        (0u64..5000).prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(text in ".{0,400}") {
        exercise(&text, AST);
    }

    #[test]
    fn arbitrary_sidx_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200), offset in any::<u64>()) {
        let _ = parse_sidx(&bytes, offset);
    }

    #[test]
    fn arbitrary_numbers_never_panic(
        timescale in number_text(), duration in number_text(), start in number_text(),
        t in number_text(), d in number_text(), r in number_text(), pto in number_text(),
        live in any::<bool>(), now_offset in -1.0e10f64..1.0e10,
    ) {
        let kind = if live {
            r#"type="dynamic" availabilityStartTime="2024-01-01T00:00:00Z" timeShiftBufferDepth="PT30S""#
        } else {
            r#"mediaPresentationDuration="PT1M""#
        };
        let with_duration = format!(r#"<SegmentTemplate timescale="{timescale}" duration="{duration}" startNumber="{start}" presentationTimeOffset="{pto}" media="$Number%05d$-$Time$"/>"#);
        let with_timeline = format!(r#"<SegmentTemplate timescale="{timescale}" startNumber="{start}" presentationTimeOffset="{pto}" media="$Number$-$Time$"><SegmentTimeline><S t="{t}" d="{d}" r="{r}"/><S d="{duration}"/></SegmentTimeline></SegmentTemplate>"#);
        exercise(&one_template(&with_duration, kind), AST + now_offset);
        exercise(&one_template(&with_timeline, kind), AST + now_offset);
    }
}

/// Two Periods of `first` and `second` one-second `$Number$` segments, the second Period's
/// template starting with `prefix`.
fn two_periods(first: u64, second: u64, prefix: &str) -> Mpd {
    let period = |start: u64, count: u64, media: &str| {
        format!(
            r#"<Period start="PT{start}S" duration="PT{count}S"><AdaptationSet mimeType="video/mp4">
            <SegmentTemplate timescale="1" media="{media}$Number$"><SegmentTimeline>
            <S t="0" d="1" r="{}"/></SegmentTimeline></SegmentTemplate>
            <Representation id="v" bandwidth="1"/></AdaptationSet></Period>"#,
            count - 1
        )
    };
    parse(&format!(
        r#"<MPD mediaPresentationDuration="PT{}S">{}{}</MPD>"#,
        first + second,
        period(0, first, "a"),
        period(first, second, prefix)
    ))
}

#[test]
fn later_periods_get_only_the_segments_the_earlier_ones_left() {
    // Exactly MAX_SEGMENTS over two Periods is a playlist.
    let mpd = two_periods(MAX_SEGMENTS as u64 - 1, 1, "b");
    let text = to_hls_media(&mpd, "0_v_1", &MediaOptions::default(), show).unwrap();
    assert_eq!(text.matches("#EXTINF").count(), MAX_SEGMENTS);
    assert!(text.ends_with("#EXTINF:1.000,\nseg https://cdn.example/path/b1\n#EXT-X-ENDLIST\n"));
    // One more is refused, and a full first Period leaves the second no room: it is refused
    // before any of its segments is made (its first URL, too long, is never rendered).
    let one_over = two_periods(MAX_SEGMENTS as u64 - 1, 2, "b");
    let no_room = two_periods(MAX_SEGMENTS as u64, 1, &"l".repeat(MAX_URL_LEN));
    for mpd in [one_over, no_room] {
        assert_eq!(
            to_hls_media(&mpd, "0_v_1", &MediaOptions::default(), show),
            Err(DashError::TooManySegments(MAX_SEGMENTS))
        );
    }
}
