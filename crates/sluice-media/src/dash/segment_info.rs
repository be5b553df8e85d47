//! SegmentTemplate / SegmentList / SegmentBase elements, merged down the Period → AdaptationSet →
//! Representation chain attribute by attribute. No I/O.
//!
//! Timelines and segment URL lists are shared (`Arc`), never copied: every Representation under
//! an AdaptationSet's SegmentTimeline points at the one list, so a long inherited list costs its
//! size once, not once per Representation.

use std::sync::Arc;

use super::mpd::{invalid, number, parse_number};
use super::xml::Element;
use super::DashError;

/// Inclusive byte range `(first, last)`, as in `mediaRange="0-999"` and HTTP `Range`.
pub type ByteRange = (u64, u64);

/// How a Representation's segments are addressed.
#[derive(Debug, Clone, PartialEq)]
pub enum Addressing {
    Template(SegmentTemplate),
    List(SegmentList),
    /// One file; segments come from its `sidx`, which must be fetched first.
    Base(SegmentBase),
    /// No segment information: the BaseURL is one self-contained file.
    Single,
}

impl Addressing {
    /// Timeline entries and segment URLs this Representation resolves to, shared ones included.
    pub(crate) fn entries(&self) -> usize {
        let timeline = |t: &Option<Arc<[TimelineEntry]>>| t.as_ref().map_or(0, |t| t.len());
        match self {
            Addressing::Template(t) => timeline(&t.timeline),
            Addressing::List(l) => timeline(&l.timeline) + l.segment_urls.len(),
            Addressing::Base(_) | Addressing::Single => 0,
        }
    }

    /// Bytes of the strings this Representation holds a copy of (template URLs, init URLs).
    pub(crate) fn text_bytes(&self) -> usize {
        let init = |i: &Option<UrlRange>| {
            i.as_ref()
                .and_then(|i| i.source_url.as_ref())
                .map_or(0, String::len)
        };
        match self {
            Addressing::Template(t) => {
                t.media.len() + t.initialization.as_ref().map_or(0, String::len)
            }
            Addressing::List(l) => init(&l.initialization),
            Addressing::Base(b) => init(&b.initialization),
            Addressing::Single => 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SegmentTemplate {
    pub media: String,
    pub initialization: Option<String>,
    pub timescale: u64,
    /// Nominal segment duration in timescale units (`@duration`).
    pub duration: Option<u64>,
    pub start_number: u64,
    pub end_number: Option<u64>,
    pub presentation_time_offset: u64,
    /// Shared with every Representation that inherits the same SegmentTimeline.
    pub timeline: Option<Arc<[TimelineEntry]>>,
}

/// One `<S t d r>`; `r = -1` repeats until the next entry, the Period end or the live edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimelineEntry {
    pub t: Option<u64>,
    pub d: u64,
    pub r: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SegmentList {
    pub timescale: u64,
    pub duration: Option<u64>,
    pub start_number: u64,
    pub presentation_time_offset: u64,
    pub timeline: Option<Arc<[TimelineEntry]>>,
    pub initialization: Option<UrlRange>,
    /// Shared with every Representation that inherits the same SegmentList.
    pub segment_urls: Arc<[SegmentUrl]>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SegmentBase {
    pub timescale: u64,
    pub presentation_time_offset: u64,
    /// Where the `sidx` lives in the file.
    pub index_range: Option<ByteRange>,
    pub initialization: Option<UrlRange>,
}

/// An `Initialization` element: optional URL (else the BaseURL) and optional range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlRange {
    pub source_url: Option<String>,
    pub range: Option<ByteRange>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentUrl {
    pub media: Option<String>,
    pub media_range: Option<ByteRange>,
}

/// Attributes of one segment-information element, each optional so a child can override a parent
/// one attribute at a time. Text and lists are `Arc`s: every Representation's level holds a
/// copy of these, and a long hostile attribute must not be copied once per Representation.
#[derive(Debug, Clone, Default)]
struct Fields {
    timescale: Option<u64>,
    duration: Option<u64>,
    start_number: Option<u64>,
    end_number: Option<u64>,
    presentation_time_offset: Option<u64>,
    index_range: Option<ByteRange>,
    media: Option<Arc<str>>,
    initialization: Option<Arc<str>>,
    init: Option<Arc<UrlRange>>,
    timeline: Option<Arc<[TimelineEntry]>>,
    segment_urls: Option<Arc<[SegmentUrl]>>,
}

impl Fields {
    fn parse(el: &Element) -> Result<Self, DashError> {
        Ok(Fields {
            timescale: number(el, "timescale")?,
            duration: number(el, "duration")?,
            start_number: number(el, "startNumber")?,
            end_number: number(el, "endNumber")?,
            presentation_time_offset: number(el, "presentationTimeOffset")?,
            index_range: el
                .attr("indexRange")
                .map(|r| parse_range("indexRange", r))
                .transpose()?,
            media: el.attr("media").map(Arc::from),
            initialization: el.attr("initialization").map(Arc::from),
            init: el
                .child("Initialization")
                .map(|i| parse_url_range(i).map(Arc::new))
                .transpose()?,
            timeline: el
                .child("SegmentTimeline")
                .map(parse_timeline)
                .transpose()?,
            segment_urls: parse_segment_urls(el)?,
        })
    }

    fn inherit(self, parent: &Fields) -> Fields {
        Fields {
            timescale: self.timescale.or(parent.timescale),
            duration: self.duration.or(parent.duration),
            start_number: self.start_number.or(parent.start_number),
            end_number: self.end_number.or(parent.end_number),
            presentation_time_offset: self
                .presentation_time_offset
                .or(parent.presentation_time_offset),
            index_range: self.index_range.or(parent.index_range),
            media: self.media.or_else(|| parent.media.clone()),
            initialization: self
                .initialization
                .or_else(|| parent.initialization.clone()),
            init: self.init.or_else(|| parent.init.clone()),
            timeline: self.timeline.or_else(|| parent.timeline.clone()),
            segment_urls: self.segment_urls.or_else(|| parent.segment_urls.clone()),
        }
    }

    fn timescale(&self) -> Result<u64, DashError> {
        match self.timescale.unwrap_or(1) {
            0 => Err(invalid("timescale", "0")),
            t => Ok(t),
        }
    }
}

/// Segment information in effect at one level, after inheriting from the level above.
#[derive(Debug, Clone, Default)]
pub(crate) struct LevelInfo {
    template: Option<Fields>,
    list: Option<Fields>,
    base: Option<Fields>,
}

impl LevelInfo {
    pub fn parse(el: &Element, parent: Option<&LevelInfo>) -> Result<Self, DashError> {
        let empty = LevelInfo::default();
        let parent = parent.unwrap_or(&empty);
        let merge = |name: &str, inherited: &Option<Fields>| -> Result<Option<Fields>, DashError> {
            let own = el.child(name).map(Fields::parse).transpose()?;
            Ok(match (own, inherited) {
                (Some(own), Some(up)) => Some(own.inherit(up)),
                (own, up) => own.or_else(|| up.clone()),
            })
        };
        Ok(LevelInfo {
            template: merge("SegmentTemplate", &parent.template)?,
            list: merge("SegmentList", &parent.list)?,
            base: merge("SegmentBase", &parent.base)?,
        })
    }
}

/// Picks the addressing mode of a Representation: template, else list, else base, else one file.
pub(crate) fn resolve(info: &LevelInfo) -> Result<Addressing, DashError> {
    if let Some(f) = &info.template {
        let media = f
            .media
            .as_deref()
            .ok_or(DashError::Missing("SegmentTemplate@media"))?
            .to_owned();
        check_nominal(f)?;
        return Ok(Addressing::Template(SegmentTemplate {
            media,
            initialization: f.initialization.as_deref().map(str::to_owned),
            timescale: f.timescale()?,
            duration: f.duration,
            start_number: f.start_number.unwrap_or(1),
            end_number: f.end_number,
            presentation_time_offset: f.presentation_time_offset.unwrap_or(0),
            timeline: f.timeline.clone(),
        }));
    }
    if let Some(f) = &info.list {
        let segment_urls = f.segment_urls.clone().unwrap_or_else(|| Arc::from([]));
        if segment_urls.len() > 1 {
            check_nominal(f)?;
        }
        return Ok(Addressing::List(SegmentList {
            timescale: f.timescale()?,
            duration: f.duration.filter(|d| *d > 0),
            start_number: f.start_number.unwrap_or(1),
            presentation_time_offset: f.presentation_time_offset.unwrap_or(0),
            timeline: f.timeline.clone(),
            initialization: f.init.as_deref().cloned(),
            segment_urls,
        }));
    }
    if let Some(f) = &info.base {
        return Ok(Addressing::Base(SegmentBase {
            timescale: f.timescale()?,
            presentation_time_offset: f.presentation_time_offset.unwrap_or(0),
            index_range: f.index_range,
            initialization: f.init.as_deref().cloned(),
        }));
    }
    Ok(Addressing::Single)
}

/// Several segments need either a nominal duration or a timeline; a zero duration would loop.
fn check_nominal(f: &Fields) -> Result<(), DashError> {
    match (f.duration, &f.timeline) {
        (Some(0), None) => Err(invalid("duration", "0")),
        (None, None) => Err(DashError::Missing("@duration or SegmentTimeline")),
        _ => Ok(()),
    }
}

fn parse_timeline(el: &Element) -> Result<Arc<[TimelineEntry]>, DashError> {
    el.children("S")
        .map(|s| {
            let d: u64 = number(s, "d")?.ok_or(DashError::Missing("S@d"))?;
            let r: i64 = number(s, "r")?.unwrap_or(0);
            if d == 0 {
                return Err(invalid("S@d", "0"));
            }
            if r < -1 {
                return Err(invalid("S@r", &r.to_string()));
            }
            Ok(TimelineEntry {
                t: number(s, "t")?,
                d,
                r,
            })
        })
        .collect()
}

fn parse_segment_urls(el: &Element) -> Result<Option<Arc<[SegmentUrl]>>, DashError> {
    let urls = el
        .children("SegmentURL")
        .map(|u| {
            Ok(SegmentUrl {
                media: u.attr("media").map(str::to_owned),
                media_range: u
                    .attr("mediaRange")
                    .map(|r| parse_range("mediaRange", r))
                    .transpose()?,
            })
        })
        .collect::<Result<Vec<_>, DashError>>()?;
    Ok((!urls.is_empty()).then(|| Arc::from(urls)))
}

fn parse_url_range(el: &Element) -> Result<UrlRange, DashError> {
    Ok(UrlRange {
        source_url: el.attr("sourceURL").map(str::to_owned),
        range: el
            .attr("range")
            .map(|r| parse_range("range", r))
            .transpose()?,
    })
}

/// `"100-199"` → `(100, 199)`; a reversed range is malformed.
pub(crate) fn parse_range(name: &'static str, text: &str) -> Result<ByteRange, DashError> {
    let (first, last) = text.split_once('-').ok_or_else(|| invalid(name, text))?;
    let first: u64 = parse_number(name, first)?;
    let last: u64 = parse_number(name, last)?;
    if first > last {
        return Err(invalid(name, text));
    }
    Ok((first, last))
}
