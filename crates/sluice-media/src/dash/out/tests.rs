//! DASH out: the rewritten MPD, parsed again, must address exactly the origin's segments through
//! the proxy, and keep nothing that points at the origin.

use std::collections::HashMap;

use url::Url;

use super::*;
use crate::dash::{parse_mpd, proxy, segment_index, SidxFragment};
use crate::query::Query;

const PROXY: &str = "https://proxy.example";

fn origin() -> Url {
    Url::parse("https://cdn.example/path/manifest.mpd").unwrap()
}

/// The URLs the front end would make without a password: plain query URLs.
fn maker(target: OutUrl<'_>) -> String {
    let (path, params) = match target {
        OutUrl::Template {
            rep,
            template,
            init,
        } => (
            template_path(template),
            template_params(rep, template, init, false),
        ),
        OutUrl::Media(m) => {
            let (endpoint, p) = proxy::media_params(m, false);
            (endpoint.to_owned(), p)
        }
        OutUrl::File { url, .. } => (
            "/proxy/stream".to_owned(),
            vec![("d".into(), url.to_string())],
        ),
    };
    format!("{PROXY}{path}?{}", Query::from_pairs(params).encode())
}

/// Every (init, segment) upstream URL of every Representation, as the origin's MPD lists them.
fn upstream(xml: &str, sidx: &HashMap<SidxFetch, Vec<SidxFragment>>) -> Vec<(String, String)> {
    let mpd = parse_mpd(xml, &origin()).unwrap();
    let mut out = Vec::new();
    for period in &mpd.periods {
        for set in &period.adaptation_sets {
            for rep in &set.representations {
                let s = sidx_fetch(rep)
                    .and_then(|f| sidx.get(&f))
                    .map(Vec::as_slice);
                let index = segment_index(&mpd, period, rep, 0.0, s).unwrap();
                let init = index.init.map(|i| i.url.to_string()).unwrap_or_default();
                for seg in index.segments {
                    let range = seg.byte_range.map(|(a, b)| format!(" {a}-{b}"));
                    out.push((
                        init.clone(),
                        format!("{}{}", seg.url, range.unwrap_or_default()),
                    ));
                }
            }
        }
    }
    out
}

/// The same, read back from the rewritten MPD through the proxy's own parameter handling.
fn through_proxy(rewritten: &str) -> Vec<(String, String)> {
    let mpd = parse_mpd(
        rewritten,
        &Url::parse(&format!("{PROXY}/proxy/mpd/manifest.mpd")).unwrap(),
    )
    .unwrap();
    let mut out = Vec::new();
    for period in &mpd.periods {
        for set in &period.adaptation_sets {
            for rep in &set.representations {
                let index = segment_index(&mpd, period, rep, 0.0, None).unwrap();
                let init = index
                    .init
                    .map(|i| {
                        let q = Query::parse(i.url.query().unwrap_or(""));
                        assert!(i.url.path().starts_with("/proxy/mpd/init.mp4"));
                        q.get("init_url").unwrap().to_owned()
                    })
                    .unwrap_or_default();
                for seg in index.segments {
                    assert!(seg.url.as_str().starts_with(PROXY), "{}", seg.url);
                    let q = Query::parse(seg.url.query().unwrap_or(""));
                    let path = seg.url.path();
                    let upstream = match path.strip_prefix(TEMPLATE_PREFIX) {
                        Some(rest) => template_segment_url(rest, &q).unwrap().to_string(),
                        None => {
                            assert_eq!(path, "/proxy/mpd/segment.mp4");
                            let range = q.get("segment_range").map(|r| format!(" {r}"));
                            format!(
                                "{}{}",
                                q.get("segment_url").unwrap(),
                                range.unwrap_or_default()
                            )
                        }
                    };
                    out.push((init.clone(), upstream));
                }
            }
        }
    }
    out
}

fn rewrite(xml: &str, strip: bool, sidx: HashMap<SidxFetch, Vec<SidxFragment>>) -> String {
    let mpd = parse_mpd(xml, &origin()).unwrap();
    let options = OutOptions {
        now: 0.0,
        strip_protection: strip,
        sidx,
    };
    rewrite_mpd(xml, &mpd, &options, maker).unwrap()
}

const TEMPLATE_MPD: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<!-- packaged for a test -->
<MPD xmlns="urn:mpeg:dash:schema:mpd:2011" xmlns:cenc="urn:mpeg:cenc:2013" type="static" mediaPresentationDuration="PT9S" minBufferTime="PT2S">
  <BaseURL>media/</BaseURL>
  <Period id="p0">
    <AdaptationSet id="1" mimeType="video/mp4" contentType="video">
      <ContentProtection schemeIdUri="urn:mpeg:dash:mp4protection:2011" value="cenc" cenc:default_KID="00112233-4455-6677-8899-aabbccddeeff"/>
      <ContentProtection schemeIdUri="urn:uuid:e2719d58-a985-b3c9-781a-b030af78d30e"><cenc:pssh>AAAA</cenc:pssh></ContentProtection>
      <Role schemeIdUri="urn:mpeg:dash:role:2011" value="main"/>
      <SegmentTemplate timescale="1000" duration="4000" startNumber="3"
          media="$RepresentationID$/seg-$Number%05d$.m4s?a=1&amp;b=$Bandwidth$" initialization="$RepresentationID$/init.mp4"/>
      <Representation id="v1" bandwidth="500000" codecs="avc1.4d401f" width="640" height="360"/>
      <Representation id="v2" bandwidth="900000" codecs="avc1.4d401f" width="1280" height="720">
        <BaseURL>hd/</BaseURL>
      </Representation>
    </AdaptationSet>
    <AdaptationSet id="2" mimeType="audio/mp4" lang="en">
      <Representation id="a1" bandwidth="128000" codecs="mp4a.40.2">
        <SegmentTemplate timescale="48000" initialization="a/init.mp4" media="a/$Time$.m4s">
          <SegmentTimeline><S t="0" d="192000" r="1"/><S d="48000"/></SegmentTimeline>
        </SegmentTemplate>
      </Representation>
    </AdaptationSet>
  </Period>
</MPD>"#;

#[test]
fn template_tracks_address_the_same_segments_through_the_proxy() {
    let out = rewrite(TEMPLATE_MPD, true, HashMap::new());
    for gone in [
        "BaseURL",
        "ContentProtection",
        "pssh",
        "cdn.example/path/media",
    ] {
        assert!(!out.contains(gone), "{gone} left in:\n{out}");
    }
    // What players read is kept as written.
    assert!(out.contains(r#"<Role schemeIdUri="urn:mpeg:dash:role:2011" value="main"/>"#));
    assert!(out.contains("<!-- packaged for a test -->"));
    assert!(out.contains(r#"minBufferTime="PT2S""#));
    assert!(out.contains("/proxy/mpd/out/$Number$/-/segment.mp4?"));
    assert!(out.contains("/proxy/mpd/out/-/$Time$/segment.mp4?"));
    let want = upstream(TEMPLATE_MPD, &HashMap::new());
    assert_eq!(want.len(), 3 + 3 + 3);
    assert_eq!(
        want[0],
        (
            "https://cdn.example/path/media/v1/init.mp4".into(),
            "https://cdn.example/path/media/v1/seg-00003.m4s?a=1&b=500000".into()
        )
    );
    assert_eq!(
        want[3].1,
        "https://cdn.example/path/media/hd/v2/seg-00003.m4s?a=1&b=900000"
    );
    assert_eq!(want[8].1, "https://cdn.example/path/media/a/384000.m4s");
    assert_eq!(through_proxy(&out), want);
}

#[test]
fn protection_stays_when_the_proxy_does_not_decrypt() {
    let out = rewrite(TEMPLATE_MPD, false, HashMap::new());
    assert_eq!(out.matches("<ContentProtection").count(), 2);
    assert!(out.contains("<cenc:pssh>AAAA</cenc:pssh>"));
    assert!(!out.contains("BaseURL"));
}

const LIST_MPD: &str = r#"<MPD xmlns="urn:mpeg:dash:schema:mpd:2011" type="static" mediaPresentationDuration="PT6S">
  <Period>
    <AdaptationSet mimeType="video/mp4">
      <Representation id="v" bandwidth="1000" codecs="avc1.4d401f">
        <BaseURL>https://other.example/v/</BaseURL>
        <SegmentList timescale="10" duration="20">
          <Initialization sourceURL="init.mp4" range="0-99"/>
          <SegmentURL media="s1.m4s"/><SegmentURL media="s2.m4s"/><SegmentURL media="all.m4s" mediaRange="100-199"/>
        </SegmentList>
      </Representation>
      <Representation id="b" bandwidth="2000" codecs="avc1.4d401f">
        <BaseURL>single.mp4</BaseURL>
        <SegmentBase indexRange="800-899" timescale="90000"><Initialization range="0-799"/></SegmentBase>
      </Representation>
    </AdaptationSet>
  </Period>
</MPD>"#;

#[test]
fn lists_and_indexed_files_become_segment_lists() {
    let fetch = SidxFetch {
        url: Url::parse("https://cdn.example/path/single.mp4").unwrap(),
        range: (800, 899),
    };
    let fragments = vec![
        SidxFragment {
            range: (900, 1999),
            duration_secs: 2.0,
        },
        SidxFragment {
            range: (2000, 2999),
            duration_secs: 2.0,
        },
        SidxFragment {
            range: (3000, 3499),
            duration_secs: 1.5,
        },
    ];
    let sidx: HashMap<_, _> = [(fetch.clone(), fragments)].into();
    let mpd = parse_mpd(LIST_MPD, &origin()).unwrap();
    let missing = rewrite_mpd(LIST_MPD, &mpd, &OutOptions::default(), maker);
    assert!(matches!(missing, Err(DashError::SidxMissing { .. })));
    let out = rewrite(LIST_MPD, true, sidx.clone());
    assert!(
        !out.contains("SegmentBase") && !out.contains("BaseURL"),
        "{out}"
    );
    assert_eq!(out.matches("<SegmentList ").count(), 2);
    assert!(out.contains(r#"<S t="0" d="20" r="2"/>"#), "{out}");
    assert!(
        out.contains(r#"<S t="0" d="180000" r="1"/><S t="360000" d="135000"/>"#),
        "{out}"
    );
    let want = upstream(LIST_MPD, &sidx);
    assert_eq!(want.len(), 6);
    assert_eq!(want[2].1, "https://other.example/v/all.m4s 100-199");
    assert_eq!(want[3].1, "https://cdn.example/path/single.mp4 900-1999");
    assert_eq!(through_proxy(&out), want);
}

/// Representations sharing one SegmentBase (and so one sidx) each list all its fragments: the
/// total over the document is bounded, not each Representation alone.
#[test]
fn segments_listed_over_all_representations_are_bounded() {
    let reps = r#"<Representation id="r" bandwidth="1"/>"#.repeat(5);
    let xml = format!(
        r#"<MPD type="static" mediaPresentationDuration="PT400S"><Period><AdaptationSet mimeType="video/mp4"><BaseURL>file.mp4</BaseURL><SegmentBase indexRange="800-899"/>{reps}</AdaptationSet></Period></MPD>"#
    );
    let fetch = SidxFetch {
        url: Url::parse("https://cdn.example/path/file.mp4").unwrap(),
        range: (800, 899),
    };
    let fragments: Vec<SidxFragment> = (0..200u64)
        .map(|i| SidxFragment {
            range: (900 + i * 10, 909 + i * 10),
            duration_secs: 2.0,
        })
        .collect();
    let options = OutOptions {
        sidx: [(fetch, fragments)].into(),
        ..OutOptions::default()
    };
    let mpd = parse_mpd(&xml, &origin()).unwrap();
    // 5 x 200 = 1,000 segments: exactly the bound passes, one fewer allowed fails.
    let out = rewrite_within(&xml, &mpd, &options, 1_000, maker).unwrap();
    assert_eq!(out.matches("<SegmentURL ").count(), 1_000);
    let err = rewrite_within(&xml, &mpd, &options, 999, maker).unwrap_err();
    assert_eq!(
        err,
        DashError::TooMuchResolved {
            what: "listed segments",
            limit: 999
        }
    );
}

#[test]
fn self_closing_representations_and_prefixed_names() {
    let xml = r#"<dash:MPD xmlns:dash="urn:mpeg:dash:schema:mpd:2011" type="static" mediaPresentationDuration="PT4S"><dash:Location>https://cdn.example/m.mpd</dash:Location><dash:Period><dash:AdaptationSet mimeType="audio/mp4"><dash:SegmentTemplate media="$Number$.m4s" duration="2" timescale="1"/><dash:Representation id="x" bandwidth="1"/></dash:AdaptationSet></dash:Period></dash:MPD>"#;
    let out = rewrite(xml, true, HashMap::new());
    assert!(!out.contains("Location"), "{out}");
    assert!(out.contains(r#"<dash:Representation id="x" bandwidth="1"><SegmentTemplate timescale="1" startNumber="1" duration="2" media=""#), "{out}");
    assert!(out.ends_with("</dash:Representation></dash:AdaptationSet></dash:Period></dash:MPD>"));
}

#[test]
fn template_requests_are_checked() {
    let q = |t: &str| {
        Query::from_pairs(vec![
            ("seg_base".into(), "https://cdn.example/a/".into()),
            ("seg_template".into(), t.into()),
            ("rep_id".into(), "v".into()),
            ("bandwidth".into(), "5".into()),
        ])
    };
    let ok = template_segment_url("7/-/segment.mp4", &q("$RepresentationID$/$Number%03d$.m4s"));
    assert_eq!(ok.unwrap().as_str(), "https://cdn.example/a/v/007.m4s");
    for (rest, t) in [
        ("-/-/segment.mp4", "$Number$.m4s"),
        ("7/x/segment.mp4", "$Time$.m4s"),
        ("7/1/segment.mp4/more", "$Number$.m4s"),
        ("7/1/other.mp4", "$Number$.m4s"),
        ("7/1/segment.mp4", "$Nope$.m4s"),
        ("7/1/segment.mp4", "//evil.example:99999/x"),
    ] {
        assert!(template_segment_url(rest, &q(t)).is_err(), "{rest} {t}");
    }
    let no_template = Query::from_pairs(vec![("seg_base".into(), "https://cdn.example/".into())]);
    assert!(template_segment_url("1/-/segment.mp4", &no_template).is_err());
}
