//! MPD document → typed model (`Mpd`, `Period`, `AdaptationSet`, `Representation`). No I/O.
//!
//! Everything a Representation inherits (BaseURL, mimeType, segment addressing, ContentProtection)
//! is resolved here, so later stages look at one Representation and nothing else. Inherited
//! lists are shared, not copied, and what all Representations resolve to together is bounded
//! ([`MAX_RESOLVED_ENTRIES`], [`MAX_RESOLVED_BYTES`]).

use std::str::FromStr;
use std::sync::Arc;

use url::Url;

use super::master::first_of_each;
use super::protection::{parse_protection, ContentProtection};
use super::segment_info::{self, Addressing, LevelInfo};
use super::time::{parse_datetime, parse_duration};
use super::track::{channel_count, content_kind, parse_frame_rate};
use super::xml::{parse_tree, Element};
use super::{shorten, DashError, MAX_RESOLVED_BYTES, MAX_RESOLVED_ENTRIES};

/// `static` (on demand) or `dynamic` (live).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PresentationType {
    Static,
    Dynamic,
}

/// A parsed MPD. Times are seconds; wall-clock instants are unix seconds.
#[derive(Debug, Clone)]
pub struct Mpd {
    pub presentation_type: PresentationType,
    pub availability_start_time: Option<f64>,
    pub publish_time: Option<f64>,
    pub media_presentation_duration: Option<f64>,
    pub minimum_update_period: Option<f64>,
    /// As written; [`Mpd::time_shift_depth`] applies the default.
    pub time_shift_buffer_depth: Option<f64>,
    pub suggested_presentation_delay: Option<f64>,
    pub periods: Vec<Period>,
}

/// Live window used when the MPD gives no `timeShiftBufferDepth` (MediaFlow uses the same).
pub const DEFAULT_TIME_SHIFT_DEPTH: f64 = 120.0;

impl Mpd {
    pub fn is_live(&self) -> bool {
        self.presentation_type == PresentationType::Dynamic
    }

    /// Length of the live window in seconds.
    pub fn time_shift_depth(&self) -> f64 {
        self.time_shift_buffer_depth
            .unwrap_or(DEFAULT_TIME_SHIFT_DEPTH)
    }

    /// All Representations with their Period, in document order.
    pub fn representations(
        &self,
    ) -> impl Iterator<Item = (&Period, &AdaptationSet, &Representation)> {
        self.periods.iter().flat_map(|p| {
            p.adaptation_sets
                .iter()
                .flat_map(move |s| s.representations.iter().map(move |r| (p, s, r)))
        })
    }

    /// First Representation with this profile id.
    pub fn find_profile(&self, profile_id: &str) -> Option<&Representation> {
        self.representations()
            .map(|(_, _, r)| r)
            .find(|r| r.profile_id == profile_id)
    }
}

#[derive(Debug, Clone)]
pub struct Period {
    pub id: Option<String>,
    /// Start relative to the presentation (and to `availabilityStartTime` when live).
    pub start: f64,
    /// Explicit, else up to the next Period, else up to `mediaPresentationDuration`.
    pub duration: Option<f64>,
    pub adaptation_sets: Vec<AdaptationSet>,
}

/// What a track carries, from `contentType`, `mimeType`, codecs or dimensions, in that order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentKind {
    Video,
    Audio,
    Text,
    Other,
}

#[derive(Debug, Clone)]
pub struct AdaptationSet {
    pub id: Option<String>,
    pub representations: Vec<Representation>,
}

/// One encoding of a track with everything it inherits resolved.
#[derive(Debug, Clone)]
pub struct Representation {
    pub id: String,
    /// `{AdaptationSet@id}_{Representation@id}_{bandwidth}`; a set without `@id` uses its
    /// position in the Period (0-based). Stable across MPD refreshes, as MediaFlow's.
    pub profile_id: String,
    pub bandwidth: u64,
    pub kind: ContentKind,
    pub mime_type: Option<String>,
    pub codecs: Option<String>,
    pub width: Option<u32>,
    pub height: Option<u32>,
    pub frame_rate: Option<f64>,
    pub sar: Option<String>,
    pub lang: Option<String>,
    pub audio_sampling_rate: Option<u32>,
    /// Channel count decoded from AudioChannelConfiguration.
    pub audio_channels: Option<u32>,
    /// AdaptationSet entries followed by the Representation's own; the set's are shared.
    pub protection: Vec<Arc<ContentProtection>>,
    /// BaseURL chain MPD → Period → AdaptationSet → Representation, resolved against the MPD URL.
    pub base_url: Url,
    pub addressing: Addressing,
}

impl Representation {
    /// Distinct `cenc:default_KID`s (32 lowercase hex digits) this track needs a key for, in
    /// order of first appearance. One hash lookup each: a hostile MPD may list a hundred
    /// thousand, and a scan of the kept ones per KID was quadratic.
    pub fn key_ids(&self) -> Vec<String> {
        let kids = self
            .protection
            .iter()
            .filter_map(|p| p.default_kid.as_deref());
        first_of_each(kids, |kid| *kid)
            .into_iter()
            .map(str::to_owned)
            .collect()
    }

    pub fn is_protected(&self) -> bool {
        !self.protection.is_empty()
    }
}

/// Parses an MPD. `mpd_url` is the final URL it was fetched from (after redirects), against
/// which relative BaseURLs and segment URLs resolve.
pub fn parse_mpd(xml: &str, mpd_url: &Url) -> Result<Mpd, DashError> {
    let root = parse_tree(xml)?;
    if root.name != "MPD" {
        return Err(DashError::NotMpd(root.name));
    }
    let presentation_type = match root.attr("type").unwrap_or("static") {
        "static" => PresentationType::Static,
        "dynamic" => PresentationType::Dynamic,
        other => return Err(invalid("MPD@type", other)),
    };
    let mut mpd = Mpd {
        presentation_type,
        availability_start_time: datetime_attr(&root, "availabilityStartTime")?,
        publish_time: datetime_attr(&root, "publishTime")?,
        media_presentation_duration: duration_attr(&root, "mediaPresentationDuration")?,
        minimum_update_period: duration_attr(&root, "minimumUpdatePeriod")?,
        time_shift_buffer_depth: duration_attr(&root, "timeShiftBufferDepth")?,
        suggested_presentation_delay: duration_attr(&root, "suggestedPresentationDelay")?,
        periods: Vec::new(),
    };
    if mpd.is_live() && mpd.availability_start_time.is_none() {
        return Err(DashError::Missing("MPD@availabilityStartTime"));
    }
    let base = resolve_base(mpd_url, &root)?;
    let period_elements: Vec<&Element> = root.children("Period").collect();
    let timing = period_timing(&mpd, &period_elements)?;
    let mut budget = Budget::default();
    for (el, (start, duration)) in period_elements.into_iter().zip(timing) {
        mpd.periods
            .push(parse_period(el, &base, start, duration, &mut budget)?);
    }
    Ok(mpd)
}

/// What the Representations parsed so far resolve to, against [`MAX_RESOLVED_ENTRIES`] and
/// [`MAX_RESOLVED_BYTES`]. Checked after each Representation, so a hostile document stops one
/// Representation past the bound.
#[derive(Debug, Default)]
struct Budget {
    entries: usize,
    bytes: usize,
}

impl Budget {
    fn add(&mut self, rep: &Representation) -> Result<(), DashError> {
        self.entries = self
            .entries
            .saturating_add(rep.addressing.entries())
            .saturating_add(rep.protection.len());
        if self.entries > MAX_RESOLVED_ENTRIES {
            return Err(DashError::TooMuchResolved {
                what: "timeline, segment URL and ContentProtection entries",
                limit: MAX_RESOLVED_ENTRIES,
            });
        }
        let text = [&rep.mime_type, &rep.codecs, &rep.sar, &rep.lang]
            .iter()
            .map(|t| t.as_ref().map_or(0, String::len))
            .sum::<usize>();
        self.bytes = self
            .bytes
            .saturating_add(text)
            .saturating_add(rep.id.len() + rep.profile_id.len())
            .saturating_add(rep.base_url.as_str().len())
            .saturating_add(rep.addressing.text_bytes());
        if self.bytes > MAX_RESOLVED_BYTES {
            return Err(DashError::TooMuchResolved {
                what: "bytes of text",
                limit: MAX_RESOLVED_BYTES,
            });
        }
        Ok(())
    }
}

/// Start and duration of every Period, filling gaps from neighbours as the standard describes.
fn period_timing(mpd: &Mpd, periods: &[&Element]) -> Result<Vec<(f64, Option<f64>)>, DashError> {
    let mut timing: Vec<(f64, Option<f64>)> = Vec::with_capacity(periods.len());
    for (i, el) in periods.iter().enumerate() {
        let duration = duration_attr(el, "duration")?;
        let start = match (duration_attr(el, "start")?, timing.last()) {
            (Some(start), _) => start,
            (None, None) => 0.0,
            (None, Some((prev_start, Some(prev_duration)))) => prev_start + prev_duration,
            (None, Some((_, None))) => return Err(DashError::Missing("Period@start")),
        };
        if i > 0 {
            // The previous Period ends where this one starts, unless it said otherwise.
            if let Some(prev) = timing.last_mut() {
                prev.1 = prev.1.or(Some((start - prev.0).max(0.0)));
            }
        }
        timing.push((start, duration));
    }
    if let (Some(last), Some(total)) = (timing.last_mut(), mpd.media_presentation_duration) {
        last.1 = last.1.or(Some((total - last.0).max(0.0)));
    }
    Ok(timing)
}

fn parse_period(
    el: &Element,
    parent_base: &Url,
    start: f64,
    duration: Option<f64>,
    budget: &mut Budget,
) -> Result<Period, DashError> {
    let base = resolve_base(parent_base, el)?;
    let info = LevelInfo::parse(el, None)?;
    let mut adaptation_sets = Vec::new();
    for (index, set) in el.children("AdaptationSet").enumerate() {
        adaptation_sets.push(parse_adaptation_set(set, index, &base, &info, budget)?);
    }
    Ok(Period {
        id: el.attr("id").map(str::to_owned),
        start,
        duration,
        adaptation_sets,
    })
}

fn parse_adaptation_set(
    el: &Element,
    index: usize,
    parent_base: &Url,
    period_info: &LevelInfo,
    budget: &mut Budget,
) -> Result<AdaptationSet, DashError> {
    let base = resolve_base(parent_base, el)?;
    let info = LevelInfo::parse(el, Some(period_info))?;
    let protection = el
        .children("ContentProtection")
        .map(|p| Arc::new(parse_protection(p)))
        .collect::<Vec<_>>();
    let set_key = el
        .attr("id")
        .map_or_else(|| index.to_string(), str::to_owned);
    let mut representations = Vec::new();
    for rep in el.children("Representation") {
        let mut rep = parse_representation(rep, el, &base, &info)?;
        rep.profile_id = format!("{set_key}_{}_{}", rep.id, rep.bandwidth);
        let own = std::mem::take(&mut rep.protection);
        rep.protection = protection.iter().cloned().chain(own).collect();
        budget.add(&rep)?;
        representations.push(rep);
    }
    Ok(AdaptationSet {
        id: el.attr("id").map(str::to_owned),
        representations,
    })
}

/// Reads a Representation, falling back to its AdaptationSet for every shared attribute.
fn parse_representation(
    el: &Element,
    set: &Element,
    parent_base: &Url,
    set_info: &LevelInfo,
) -> Result<Representation, DashError> {
    let inherited = |name: &str| el.attr(name).or_else(|| set.attr(name)).map(str::to_owned);
    let base_url = resolve_base(parent_base, el)?;
    let info = LevelInfo::parse(el, Some(set_info))?;
    let id = el
        .attr("id")
        .ok_or(DashError::Missing("Representation@id"))?
        .to_owned();
    let bandwidth =
        number(el, "bandwidth")?.ok_or(DashError::Missing("Representation@bandwidth"))?;
    let mime_type = inherited("mimeType");
    let codecs = inherited("codecs");
    let width = number(el, "width")?.or(number(set, "width")?);
    let height = number(el, "height")?.or(number(set, "height")?);
    let kind = content_kind(
        set.attr("contentType"),
        mime_type.as_deref(),
        codecs.as_deref(),
        height,
    );
    let frame_rate = inherited("frameRate")
        .map(|f| parse_frame_rate(&f))
        .transpose()?;
    let audio_sampling_rate = match inherited("audioSamplingRate") {
        // "48000" or a "min max" pair; the first value is the rate.
        Some(text) => Some(parse_number(
            "audioSamplingRate",
            text.split_whitespace().next().unwrap_or(""),
        )?),
        None => None,
    };
    let channels = el
        .child("AudioChannelConfiguration")
        .or_else(|| set.child("AudioChannelConfiguration"))
        .and_then(channel_count);
    Ok(Representation {
        addressing: segment_info::resolve(&info)?,
        id,
        profile_id: String::new(),
        bandwidth,
        kind,
        mime_type,
        codecs,
        width,
        height,
        frame_rate,
        sar: inherited("sar"),
        lang: inherited("lang"),
        audio_sampling_rate,
        audio_channels: channels,
        protection: el
            .children("ContentProtection")
            .map(|p| Arc::new(parse_protection(p)))
            .collect(),
        base_url,
    })
}

/// Joins the first BaseURL child (if any) onto the parent's base.
pub(crate) fn resolve_base(parent: &Url, el: &Element) -> Result<Url, DashError> {
    match el
        .child("BaseURL")
        .map(|b| b.text.trim())
        .filter(|t| !t.is_empty())
    {
        Some(text) => parent.join(text).map_err(|_| invalid("BaseURL", text)),
        None => Ok(parent.clone()),
    }
}

pub(crate) fn number<T: FromStr>(el: &Element, name: &'static str) -> Result<Option<T>, DashError> {
    el.attr(name).map(|v| parse_number(name, v)).transpose()
}

pub(crate) fn parse_number<T: FromStr>(name: &'static str, text: &str) -> Result<T, DashError> {
    text.trim().parse().map_err(|_| invalid(name, text))
}

fn duration_attr(el: &Element, name: &'static str) -> Result<Option<f64>, DashError> {
    el.attr(name)
        .map(|v| parse_duration(v).ok_or_else(|| invalid(name, v)))
        .transpose()
}

fn datetime_attr(el: &Element, name: &'static str) -> Result<Option<f64>, DashError> {
    el.attr(name)
        .map(|v| parse_datetime(v).ok_or_else(|| invalid(name, v)))
        .transpose()
}

pub(crate) fn invalid(name: &'static str, value: &str) -> DashError {
    DashError::InvalidAttribute {
        name,
        value: shorten(value),
    }
}
