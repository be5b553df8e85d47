//! DASH out: an MPD rewritten for DASH players, with every init and media segment addressed back
//! through the proxy. No I/O.
//!
//! The caller parses the MPD with [`parse_mpd`](super::parse_mpd) and hands the same text and the
//! parsed model here. The text is copied event by event, so everything a player reads from it
//! (Periods, AdaptationSets, Representations, roles, labels, event streams, timing) stays as the
//! packager wrote it, except:
//!
//! - every `BaseURL`, `Location` and `PatchLocation` is removed: all addresses become absolute
//!   proxy URLs, and a live MPD is refreshed from the proxy URL the player loaded;
//! - every `SegmentTemplate`, `SegmentList` and `SegmentBase` is removed from every level and each
//!   Representation gets its own, fully inherited one:
//!   - a template stays a template (players keep computing live edges themselves) whose `media`
//!     is a proxy URL with `$Number$` and/or `$Time$` in its path ([`template_path`]) and whose
//!     `initialization` is a proxy init URL;
//!   - a SegmentList, and a SegmentBase expanded from its `sidx`, become a SegmentList with one
//!     proxy URL per segment and a SegmentTimeline;
//!   - a Representation that is one file gets a `BaseURL` through the proxy;
//! - with [`OutOptions::strip_protection`] (the proxy decrypts), every `ContentProtection`.

use std::collections::HashMap;
use std::fmt::Write as _;

use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;
use url::Url;

use super::media::MediaUrl;
use super::mpd::{Mpd, Representation};
use super::proxy::RequestError;
use super::segment_info::{Addressing, SegmentTemplate, TimelineEntry};
use super::segments::{segment_index, sidx_fetch, InitSegment, Segment, SidxFetch};
use super::sidx::SidxFragment;
use super::template::{Template, TemplateVars};
use super::DashError;
use crate::query::{parse_destination, Query};

#[cfg(test)]
mod tests;

/// Endpoint of the rewritten MPD.
pub const MANIFEST_PATH: &str = "/proxy/mpd/manifest.mpd";
/// Prefix of templated segment paths: `/proxy/mpd/out/{number}/{time}/segment.mp4`.
pub const TEMPLATE_PREFIX: &str = "/proxy/mpd/out/";

/// How to rewrite.
#[derive(Debug, Clone, Default)]
pub struct OutOptions {
    /// Unix seconds; cuts SegmentList and SegmentBase tracks of a live MPD to the live window.
    pub now: f64,
    /// Remove every `ContentProtection` element: the proxy serves the content decrypted.
    pub strip_protection: bool,
    /// Parsed `sidx` boxes of SegmentBase tracks (see [`sidx_fetch`]).
    pub sidx: HashMap<SidxFetch, Vec<SidxFragment>>,
}

/// A URL the caller makes.
#[derive(Debug, Clone, Copy)]
pub enum OutUrl<'a> {
    /// A SegmentTemplate's `media`: the URL's path must be [`template_path`] of `template`, so
    /// the player fills in the segment.
    Template {
        rep: &'a Representation,
        template: &'a SegmentTemplate,
        init: Option<&'a InitSegment>,
    },
    /// An init or one listed segment.
    Media(MediaUrl<'a>),
    /// A Representation that is one file, played by byte ranges.
    File {
        rep: &'a Representation,
        url: &'a Url,
    },
}

/// Rewrites `xml` (whose parsed form is `mpd`); `url` makes each proxy URL. A SegmentBase track
/// whose `sidx` is not in `options.sidx` gives [`DashError::SidxMissing`].
pub fn rewrite_mpd(
    xml: &str,
    mpd: &Mpd,
    options: &OutOptions,
    url: impl FnMut(OutUrl<'_>) -> String,
) -> Result<String, DashError> {
    rewrite_within(xml, mpd, options, super::MAX_RESOLVED_ENTRIES, url)
}

/// [`rewrite_mpd`] listing at most `max_listed` segments over all Representations.
fn rewrite_within(
    xml: &str,
    mpd: &Mpd,
    options: &OutOptions,
    max_listed: usize,
    mut url: impl FnMut(OutUrl<'_>) -> String,
) -> Result<String, DashError> {
    // Each Representation's new segment information, by (period, set, representation).
    let mut blocks: Vec<Vec<Vec<String>>> = Vec::with_capacity(mpd.periods.len());
    // Segments written over all Representations: a timeline's entries are already bounded by
    // parse_mpd, but SegmentBase Representations sharing one sidx each list all its fragments.
    let mut listed = Listed {
        count: 0,
        max: max_listed,
    };
    for period in &mpd.periods {
        let mut sets = Vec::with_capacity(period.adaptation_sets.len());
        for set in &period.adaptation_sets {
            let mut reps = Vec::with_capacity(set.representations.len());
            for rep in &set.representations {
                reps.push(segment_block(
                    mpd,
                    period,
                    rep,
                    options,
                    &mut listed,
                    &mut url,
                )?);
            }
            sets.push(reps);
        }
        blocks.push(sets);
    }
    copy_events(xml, options, &blocks)
}

/// What the handler of a templated segment needs, sealed in its URL.
pub fn template_params(
    rep: &Representation,
    template: &SegmentTemplate,
    init: Option<&InitSegment>,
    is_live: bool,
) -> Vec<(String, String)> {
    let mut params = vec![
        ("seg_base".to_owned(), rep.base_url.to_string()),
        ("seg_template".to_owned(), template.media.clone()),
        ("rep_id".to_owned(), rep.id.clone()),
        ("bandwidth".to_owned(), rep.bandwidth.to_string()),
    ];
    if let Some(init) = init {
        params.push(("init_url".to_owned(), init.url.to_string()));
        if let Some((a, b)) = init.byte_range {
            params.push(("init_range".to_owned(), format!("{a}-{b}")));
        }
    }
    params.push(("use_map".to_owned(), "true".to_owned()));
    params.push(("mime_type".to_owned(), mime_type(rep)));
    params.push(("is_live".to_owned(), is_live.to_string()));
    params
}

/// The path of a templated segment: `$Number$` and `$Time$` where the origin's template uses
/// them, `-` where it does not.
pub fn template_path(template: &SegmentTemplate) -> String {
    let number = if uses(&template.media, "Number") {
        "$Number$"
    } else {
        "-"
    };
    let time = if uses(&template.media, "Time") {
        "$Time$"
    } else {
        "-"
    };
    format!("{TEMPLATE_PREFIX}{number}/{time}/segment.mp4")
}

/// The upstream URL of a templated segment request: `rest` is the path after
/// [`TEMPLATE_PREFIX`], `query` the (sealed) parameters from [`template_params`].
pub fn template_segment_url(rest: &str, query: &Query) -> Result<Url, RequestError> {
    let bad = |why: &str| RequestError::Invalid {
        name: "path",
        why: why.to_owned(),
    };
    let mut parts = rest.split('/');
    let (Some(number), Some(time), Some("segment.mp4"), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("expected {number}/{time}/segment.mp4"));
    };
    let value = |text: &str| -> Result<Option<u64>, RequestError> {
        match text {
            "-" => Ok(None),
            n => n
                .parse()
                .map(Some)
                .map_err(|_| bad("segment number and time are decimal numbers")),
        }
    };
    let (number, time) = (value(number)?, value(time)?);
    let get = |name: &'static str| query.get(name).ok_or(RequestError::Missing(name));
    let base = parse_destination(get("seg_base")?).map_err(|e| RequestError::Invalid {
        name: "seg_base",
        why: e.to_string(),
    })?;
    let text = get("seg_template")?;
    let invalid = |name: &'static str, why: String| RequestError::Invalid { name, why };
    let template = Template::parse(text).map_err(|e| invalid("seg_template", e.to_string()))?;
    if (uses(text, "Number") && number.is_none()) || (uses(text, "Time") && time.is_none()) {
        return Err(bad("the template needs a segment number and time"));
    }
    let bandwidth = get("bandwidth")?
        .parse()
        .map_err(|_| invalid("bandwidth", "not a number".into()))?;
    let vars = TemplateVars {
        representation_id: get("rep_id")?,
        bandwidth,
        number: number.unwrap_or(0),
        time: time.unwrap_or(0),
    };
    let url = base
        .join(&template.render(&vars))
        .map_err(|e| invalid("seg_template", e.to_string()))?;
    // The same checks as any destination: http(s), a host, no credentials smuggled in.
    parse_destination(url.as_str()).map_err(|e| invalid("seg_template", e.to_string()))
}

fn uses(template: &str, name: &str) -> bool {
    template.contains(&format!("${name}$")) || template.contains(&format!("${name}%"))
}

fn mime_type(rep: &Representation) -> String {
    rep.mime_type.clone().unwrap_or_else(|| match rep.kind {
        super::ContentKind::Audio => "audio/mp4".into(),
        _ => "video/mp4".into(),
    })
}

// === one Representation's segment information ===

fn segment_block(
    mpd: &Mpd,
    period: &super::Period,
    rep: &Representation,
    options: &OutOptions,
    listed: &mut Listed,
    url: &mut impl FnMut(OutUrl<'_>) -> String,
) -> Result<String, DashError> {
    let mut out = String::new();
    match &rep.addressing {
        Addressing::Template(t) => {
            // The init and the first segment; the index is not needed beyond its init.
            let index = template_init(rep, t)?;
            let media = url(OutUrl::Template {
                rep,
                template: t,
                init: index.as_ref(),
            });
            let _ = write!(
                out,
                "<SegmentTemplate timescale=\"{}\" startNumber=\"{}\"",
                t.timescale, t.start_number
            );
            if let Some(end) = t.end_number {
                let _ = write!(out, " endNumber=\"{end}\"");
            }
            if let Some(d) = t.duration {
                let _ = write!(out, " duration=\"{d}\"");
            }
            if t.presentation_time_offset != 0 {
                let _ = write!(
                    out,
                    " presentationTimeOffset=\"{}\"",
                    t.presentation_time_offset
                );
            }
            if let Some(init) = &index {
                let init_url = url(OutUrl::Media(MediaUrl::Init { rep, init }));
                let _ = write!(out, " initialization=\"{}\"", attr(&init_url));
            }
            let _ = write!(out, " media=\"{}\"", attr(&media));
            match &t.timeline {
                Some(entries) => {
                    out.push('>');
                    write_timeline(&mut out, entries);
                    out.push_str("</SegmentTemplate>");
                }
                None => out.push_str("/>"),
            }
        }
        Addressing::Single => {
            let _ = write!(
                out,
                "<BaseURL>{}</BaseURL>",
                text(&url(OutUrl::File {
                    rep,
                    url: &rep.base_url
                }))
            );
        }
        Addressing::List(_) | Addressing::Base(_) => {
            let sidx = sidx_fetch(rep).and_then(|f| options.sidx.get(&f));
            let index = segment_index(mpd, period, rep, options.now, sidx.map(Vec::as_slice))?;
            listed.add(index.segments.len())?;
            let (timescale, pto) = match &rep.addressing {
                Addressing::List(l) => (l.timescale, l.presentation_time_offset),
                Addressing::Base(b) => (b.timescale, b.presentation_time_offset),
                _ => unreachable!("matched above"),
            };
            write_list(&mut out, rep, &index, timescale.max(1), pto, url);
        }
    }
    Ok(out)
}

/// Segments listed so far over all Representations, and the most allowed.
struct Listed {
    count: usize,
    max: usize,
}

impl Listed {
    fn add(&mut self, segments: usize) -> Result<(), DashError> {
        self.count = self.count.saturating_add(segments);
        if self.count > self.max {
            return Err(DashError::TooMuchResolved {
                what: "listed segments",
                limit: self.max,
            });
        }
        Ok(())
    }
}

/// The init segment of a template track (rendered with the Representation's values).
fn template_init(
    rep: &Representation,
    t: &SegmentTemplate,
) -> Result<Option<InitSegment>, DashError> {
    let Some(text) = &t.initialization else {
        return Ok(None);
    };
    let vars = TemplateVars {
        representation_id: &rep.id,
        bandwidth: rep.bandwidth,
        number: t.start_number,
        time: 0,
    };
    let rendered = Template::parse(text)?.render(&vars);
    let url = rep
        .base_url
        .join(&rendered)
        .map_err(|_| DashError::InvalidUrl(super::shorten(&rendered)))?;
    Ok(Some(InitSegment {
        url,
        byte_range: None,
    }))
}

fn write_list(
    out: &mut String,
    rep: &Representation,
    index: &super::SegmentIndex,
    timescale: u64,
    pto: u64,
    url: &mut impl FnMut(OutUrl<'_>) -> String,
) {
    let start_number = index.segments.first().map_or(1, |s| s.number);
    let _ = write!(
        out,
        "<SegmentList timescale=\"{timescale}\" startNumber=\"{start_number}\""
    );
    if pto != 0 {
        let _ = write!(out, " presentationTimeOffset=\"{pto}\"");
    }
    out.push('>');
    if let Some(init) = &index.init {
        let u = url(OutUrl::Media(MediaUrl::Init { rep, init }));
        let _ = write!(out, "<Initialization sourceURL=\"{}\"/>", attr(&u));
    }
    let ticks = |secs: f64| (secs * timescale as f64).round().max(0.0) as u64;
    let entries: Vec<TimelineEntry> = index
        .segments
        .iter()
        .map(|s: &Segment| TimelineEntry {
            t: Some(pto.saturating_add(ticks(s.start_secs))),
            d: ticks(s.duration_secs).max(1),
            r: 0,
        })
        .collect();
    write_timeline(out, &compact(&entries));
    for segment in &index.segments {
        let target = MediaUrl::Segment {
            rep,
            init: index.init.as_ref(),
            segment,
        };
        let u = url(OutUrl::Media(target));
        let _ = write!(out, "<SegmentURL media=\"{}\"/>", attr(&u));
    }
    out.push_str("</SegmentList>");
}

/// Runs of back-to-back entries of one duration as one `<S r>`.
fn compact(entries: &[TimelineEntry]) -> Vec<TimelineEntry> {
    let mut out: Vec<TimelineEntry> = Vec::new();
    let mut next_t = None;
    for e in entries {
        if let Some(last) = out.last_mut() {
            if last.d == e.d && e.t == next_t && last.r >= 0 {
                last.r += 1;
                next_t = e.t.map(|t| t.saturating_add(e.d));
                continue;
            }
        }
        out.push(*e);
        next_t = e.t.map(|t| t.saturating_add(e.d));
    }
    out
}

fn write_timeline(out: &mut String, entries: &[TimelineEntry]) {
    out.push_str("<SegmentTimeline>");
    for e in entries {
        out.push_str("<S");
        if let Some(t) = e.t {
            let _ = write!(out, " t=\"{t}\"");
        }
        let _ = write!(out, " d=\"{}\"", e.d);
        if e.r != 0 {
            let _ = write!(out, " r=\"{}\"", e.r);
        }
        out.push_str("/>");
    }
    out.push_str("</SegmentTimeline>");
}

fn attr(value: &str) -> std::borrow::Cow<'_, str> {
    quick_xml::escape::escape(value)
}

fn text(value: &str) -> std::borrow::Cow<'_, str> {
    quick_xml::escape::escape(value)
}

// === the event copy ===

/// Elements removed wherever they are.
fn dropped(local: &[u8], options: &OutOptions) -> bool {
    matches!(
        local,
        b"BaseURL"
            | b"Location"
            | b"PatchLocation"
            | b"SegmentTemplate"
            | b"SegmentList"
            | b"SegmentBase"
    ) || (options.strip_protection && local == b"ContentProtection")
}

fn copy_events(
    xml: &str,
    options: &OutOptions,
    blocks: &[Vec<Vec<String>>],
) -> Result<String, DashError> {
    let mut reader = Reader::from_str(xml);
    let mut out = String::with_capacity(xml.len() + xml.len() / 2);
    // Local names of the open elements; the counters follow the model's order.
    let mut stack: Vec<Vec<u8>> = Vec::new();
    let (mut period, mut set, mut rep) = (None::<usize>, None::<usize>, None::<usize>);
    let mut skipping = 0usize;
    loop {
        let event = reader
            .read_event()
            .map_err(|e| DashError::Xml(super::shorten(&e.to_string())))?;
        if skipping > 0 {
            match event {
                Event::Start(_) => skipping += 1,
                Event::End(_) => skipping -= 1,
                Event::Eof => return Err(DashError::Xml("unexpected end".into())),
                _ => {}
            }
            continue;
        }
        match event {
            Event::Start(start) if dropped(start.local_name().as_ref(), options) => skipping = 1,
            Event::Empty(start) if dropped(start.local_name().as_ref(), options) => {}
            Event::Start(start) => {
                let local = start.local_name().as_ref().to_vec();
                count(&stack, &local, &mut period, &mut set, &mut rep);
                write_start(&mut out, &start, false);
                stack.push(local);
            }
            Event::Empty(start) => {
                let local = start.local_name().as_ref().to_vec();
                count(&stack, &local, &mut period, &mut set, &mut rep);
                if local == b"Representation" && stack.len() == 3 {
                    // `<Representation .../>`: open it to give it segment information.
                    write_start(&mut out, &start, false);
                    out.push_str(block(blocks, period, set, rep)?);
                    let _ = write!(out, "</{}>", String::from_utf8_lossy(start.name().as_ref()));
                } else {
                    write_start(&mut out, &start, true);
                }
            }
            Event::End(end) => {
                let local = stack.pop().unwrap_or_default();
                if local == b"Representation" && stack.len() == 3 {
                    out.push_str(block(blocks, period, set, rep)?);
                }
                let _ = write!(out, "</{}>", String::from_utf8_lossy(end.name().as_ref()));
            }
            Event::Text(t) => out.push_str(&String::from_utf8_lossy(&t)),
            Event::CData(c) => {
                let _ = write!(out, "<![CDATA[{}]]>", String::from_utf8_lossy(&c));
            }
            Event::Comment(c) => {
                let _ = write!(out, "<!--{}-->", String::from_utf8_lossy(&c));
            }
            Event::Decl(d) => {
                let _ = write!(out, "<?{}?>", String::from_utf8_lossy(&d));
            }
            Event::PI(p) => {
                let _ = write!(out, "<?{}?>", String::from_utf8_lossy(&p));
            }
            // A DOCTYPE has nothing a player needs (and parse_mpd refused its entities).
            Event::DocType(_) => {}
            Event::Eof => break,
        }
    }
    Ok(out)
}

/// Advances the Period / AdaptationSet / Representation counters for an element opening under
/// `stack`, exactly as `parse_mpd` walks `children(...)`.
fn count(
    stack: &[Vec<u8>],
    local: &[u8],
    period: &mut Option<usize>,
    set: &mut Option<usize>,
    rep: &mut Option<usize>,
) {
    let parent = stack.last().map(Vec::as_slice);
    match (stack.len(), local, parent) {
        (1, b"Period", Some(b"MPD")) => {
            *period = Some(period.map_or(0, |p| p + 1));
            *set = None;
        }
        (2, b"AdaptationSet", Some(b"Period")) => {
            *set = Some(set.map_or(0, |s| s + 1));
            *rep = None;
        }
        (3, b"Representation", Some(b"AdaptationSet")) => {
            *rep = Some(rep.map_or(0, |r| r + 1));
        }
        _ => {}
    }
}

fn block(
    blocks: &[Vec<Vec<String>>],
    period: Option<usize>,
    set: Option<usize>,
    rep: Option<usize>,
) -> Result<&str, DashError> {
    period
        .zip(set)
        .zip(rep)
        .and_then(|((p, s), r)| blocks.get(p)?.get(s)?.get(r))
        .map(String::as_str)
        .ok_or_else(|| DashError::Xml("document and model disagree".into()))
}

/// Writes a start tag as read (name and attributes verbatim).
fn write_start(out: &mut String, start: &BytesStart<'_>, empty: bool) {
    out.push('<');
    out.push_str(&String::from_utf8_lossy(start));
    out.push_str(if empty { "/>" } else { ">" });
}
