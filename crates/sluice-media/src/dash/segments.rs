//! Segment addressing: one Representation in one Period → init segment + segment list, cut to the
//! live window for dynamic MPDs. "Now" is a parameter. No I/O.

use std::collections::HashMap;
use std::hash::Hash;

use url::Url;

use super::mpd::{Mpd, Period, Representation};
use super::segment_info::{
    Addressing, ByteRange, SegmentBase, SegmentList, SegmentTemplate, UrlRange,
};
use super::sidx::SidxFragment;
use super::template::{Template, TemplateVars};
use super::timeline::{self, Bounds, Slot};
use super::{shorten, DashError, MAX_SEGMENTS, MAX_URL_BYTES, MAX_URL_LEN};

/// One media segment.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    /// The `$Number$` value. For live `$Time$`-only timelines, which have no meaningful number, it
    /// is `time / nominal duration` so HLS media sequences stay stable across MPD refreshes.
    pub number: u64,
    /// Media time in timescale units (the `$Time$` value).
    pub time: u64,
    /// Presentation start relative to the Period start.
    pub start_secs: f64,
    pub duration_secs: f64,
    pub url: Url,
    pub byte_range: Option<ByteRange>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InitSegment {
    pub url: Url,
    pub byte_range: Option<ByteRange>,
}

/// Segments of one Representation in one Period.
#[derive(Debug, Clone, PartialEq)]
pub struct SegmentIndex {
    pub init: Option<InitSegment>,
    pub segments: Vec<Segment>,
}

/// A `sidx` box that must be fetched (and given to [`segment_index`]) before a SegmentBase track
/// can be listed: `Range: bytes=range.0-range.1` on `url`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SidxFetch {
    pub url: Url,
    pub range: ByteRange,
}

/// The sidx a Representation needs, if it is addressed by SegmentBase with an `indexRange`.
pub fn sidx_fetch(rep: &Representation) -> Option<SidxFetch> {
    match &rep.addressing {
        Addressing::Base(SegmentBase {
            index_range: Some(range),
            ..
        }) => Some(SidxFetch {
            url: rep.base_url.clone(),
            range: *range,
        }),
        _ => None,
    }
}

/// The time span to list, relative to the Period start, in seconds.
#[derive(Debug, Clone, Copy)]
struct Window {
    /// Live only: segments must end at or before this (the live edge) ...
    edge: Option<f64>,
    /// ... and after this (edge minus timeShiftBufferDepth).
    after: Option<f64>,
    period_end: Option<f64>,
}

impl Window {
    fn new(mpd: &Mpd, period: &Period, now: f64) -> Self {
        let period_end = period.duration;
        match mpd.availability_start_time.filter(|_| mpd.is_live()) {
            Some(ast) => {
                let edge = now - ast - period.start;
                Window {
                    edge: Some(period_end.map_or(edge, |end| edge.min(end))),
                    after: Some(edge - mpd.time_shift_depth()),
                    period_end,
                }
            }
            None => Window {
                edge: None,
                after: None,
                period_end,
            },
        }
    }

    /// Whether a segment ending at `end` is inside the live window (always, when static).
    fn keeps(&self, end: f64) -> bool {
        let past_edge = matches!(self.edge, Some(edge) if end > edge + 1e-9);
        let too_old = matches!(self.after, Some(after) if end <= after);
        !past_edge && !too_old
    }
}

/// Lists the segments of `rep` in `period` available at `now` (unix seconds; ignored for static
/// MPDs). SegmentBase tracks need their parsed sidx (see [`sidx_fetch`]).
pub fn segment_index(
    mpd: &Mpd,
    period: &Period,
    rep: &Representation,
    now: f64,
    sidx: Option<&[SidxFragment]>,
) -> Result<SegmentIndex, DashError> {
    segment_index_within(mpd, period, rep, now, sidx, MAX_SEGMENTS)
}

/// [`segment_index`] refusing ([`DashError::TooManySegments`]) more than `max` segments before
/// it makes them: a playlist over several Periods gives each only the room the Periods before it
/// left, so together they never expand past [`MAX_SEGMENTS`].
pub(crate) fn segment_index_within(
    mpd: &Mpd,
    period: &Period,
    rep: &Representation,
    now: f64,
    sidx: Option<&[SidxFragment]>,
    max: usize,
) -> Result<SegmentIndex, DashError> {
    let window = Window::new(mpd, period, now);
    let mut bytes = UrlBytes::default();
    bytes.add(&rep.base_url)?;
    let index = match &rep.addressing {
        Addressing::Template(t) => template_index(rep, t, &window, max, &mut bytes),
        Addressing::List(list) => list_index(rep, list, &window, max, &mut bytes),
        Addressing::Base(base) => base_index(rep, base, &window, sidx, max, &mut bytes),
        Addressing::Single => Ok(single_index(rep, &window)),
    }?;
    // The expansions above stop at `max` as they go; this also covers the one-file case.
    if index.segments.len() > max {
        return Err(DashError::TooManySegments(MAX_SEGMENTS));
    }
    Ok(index)
}

/// The bytes of the URLs an index holds so far, each checked against [`MAX_URL_LEN`] and all
/// against [`MAX_URL_BYTES`], so a long template or BaseURL cannot multiply into gigabytes.
#[derive(Debug, Default)]
pub(crate) struct UrlBytes(usize);

impl UrlBytes {
    pub(crate) fn add(&mut self, url: &Url) -> Result<(), DashError> {
        let len = url.as_str().len();
        if len > MAX_URL_LEN {
            return Err(DashError::UrlTooLong(MAX_URL_LEN));
        }
        self.0 += len;
        if self.0 > MAX_URL_BYTES {
            return Err(DashError::TooManyUrlBytes(MAX_URL_BYTES));
        }
        Ok(())
    }
}

// === SegmentTemplate ===

fn template_index(
    rep: &Representation,
    t: &SegmentTemplate,
    window: &Window,
    max: usize,
    bytes: &mut UrlBytes,
) -> Result<SegmentIndex, DashError> {
    let media = Template::parse(&t.media)?;
    let init = match &t.initialization {
        Some(text) => {
            let vars = vars(rep, t.start_number, 0);
            let url = join(&rep.base_url, &Template::parse(text)?.render(&vars))?;
            bytes.add(&url)?;
            Some(InitSegment {
                url,
                byte_range: None,
            })
        }
        None => None,
    };
    let slots = match &t.timeline {
        Some(entries) => timeline::expand(
            entries,
            &timeline_bounds(t.timescale, t.presentation_time_offset, window)?,
            max,
        )?,
        None => duration_slots(t, window, max)?,
    };
    let live_time_numbers = window.edge.is_some() && t.timeline.is_some() && !media.uses_number();
    // Only live `$Time$` numbering divides by it: everything else skips the count.
    let nominal = if live_time_numbers {
        nominal_duration(t, &slots)
    } else {
        1
    };
    let mut segments = Vec::with_capacity(slots.len());
    for slot in slots {
        let number = t
            .start_number
            .checked_add(slot.index)
            .ok_or(DashError::Overflow)?;
        let url = join(&rep.base_url, &media.render(&vars(rep, number, slot.time)))?;
        bytes.add(&url)?;
        let start_secs =
            (slot.time as f64 - t.presentation_time_offset as f64) / t.timescale as f64;
        let mut duration_secs = slot.duration as f64 / t.timescale as f64;
        if t.timeline.is_none() {
            // A nominal-duration template's last segment stops at the Period end.
            if let Some(end) = window.period_end {
                duration_secs = duration_secs.min(end - start_secs).max(0.0);
            }
        }
        segments.push(Segment {
            number: if live_time_numbers {
                slot.time / nominal
            } else {
                number
            },
            time: slot.time,
            start_secs,
            duration_secs,
            url,
            byte_range: None,
        });
    }
    Ok(SegmentIndex { init, segments })
}

fn vars(rep: &Representation, number: u64, time: u64) -> TemplateVars<'_> {
    TemplateVars {
        representation_id: &rep.id,
        bandwidth: rep.bandwidth,
        number,
        time,
    }
}

/// The most common `S@d` (ties → the longer), or `@duration`: a stable divisor for live numbers.
fn nominal_duration(t: &SegmentTemplate, slots: &[Slot]) -> u64 {
    if let Some(d) = t.duration.filter(|d| *d > 0) {
        return d;
    }
    most_common(slots.iter().map(|s| s.duration)).map_or(1, |d| d.max(1))
}

/// The most frequent value (ties → the largest), counted in a hash map: a timeline of 100,000
/// distinct durations is 100,000 look-ups, where a list searched for each one is 5e9 comparisons
/// on the request's thread.
fn most_common<T: Copy + Eq + Hash + Ord>(values: impl IntoIterator<Item = T>) -> Option<T> {
    let mut counts: HashMap<T, usize> = HashMap::new();
    for value in values {
        *counts.entry(value).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by_key(|&(value, n)| (n, value))
        .map(|(value, _)| value)
}

/// Converts the window to media time for timeline expansion.
fn timeline_bounds(timescale: u64, pto: u64, window: &Window) -> Result<Bounds, DashError> {
    let to_media = |secs: f64| media_time(secs, timescale, pto);
    let ends_by = window.edge.map(to_media).transpose()?;
    let repeat_until = match ends_by {
        Some(edge) => Some(edge),
        None => window.period_end.map(to_media).transpose()?,
    };
    Ok(Bounds {
        ends_after: window.after.map(to_media).transpose()?,
        ends_by,
        repeat_until,
        complete_only: window.edge.is_some(),
    })
}

fn media_time(secs: f64, timescale: u64, pto: u64) -> Result<i128, DashError> {
    let ticks = (secs * timescale as f64).floor();
    if !ticks.is_finite() || ticks.abs() > 1e30 {
        return Err(DashError::Overflow);
    }
    Ok(ticks as i128 + i128::from(pto))
}

/// Slots of an `@duration` template: the whole Period when static, the live window when dynamic.
fn duration_slots(
    t: &SegmentTemplate,
    window: &Window,
    max: usize,
) -> Result<Vec<Slot>, DashError> {
    let d = t
        .duration
        .filter(|d| *d > 0)
        .ok_or(DashError::Missing("SegmentTemplate@duration"))?;
    let per_sec = t.timescale as f64 / d as f64;
    let (first, end) = match window.edge {
        Some(edge) => {
            let first = window.after.map_or(0.0, |a| (a * per_sec).floor()).max(0.0);
            (first, (edge * per_sec).floor())
        }
        None => {
            let end = window
                .period_end
                .ok_or(DashError::Missing("Period duration"))?;
            // Rounding guard: 10 s of 2 s segments must be 5 segments, not 6.
            (0.0, (end * per_sec - 1e-9).ceil())
        }
    };
    let mut end = end;
    if let Some(last) = t.end_number {
        end = end.min(last.saturating_sub(t.start_number) as f64 + 1.0);
    }
    if !(first.is_finite() && end.is_finite()) || end - first > max as f64 {
        return Err(DashError::TooManySegments(MAX_SEGMENTS));
    }
    let (first, end) = (first as u64, end.max(0.0) as u64);
    (first..end)
        .map(|i| {
            let time = i
                .checked_mul(d)
                .and_then(|x| x.checked_add(t.presentation_time_offset))
                .ok_or(DashError::Overflow)?;
            Ok(Slot {
                index: i,
                time,
                duration: d,
            })
        })
        .collect()
}

// === SegmentList, SegmentBase, single file ===

fn list_index(
    rep: &Representation,
    list: &SegmentList,
    window: &Window,
    max: usize,
    bytes: &mut UrlBytes,
) -> Result<SegmentIndex, DashError> {
    let ts = list.timescale as f64;
    let slots: Vec<Slot> = match (&list.timeline, list.duration) {
        (Some(entries), _) => timeline::expand(entries, &Bounds::default(), max)?,
        (None, Some(d)) => (0..list.segment_urls.len() as u64)
            .map(|i| {
                let time = i
                    .checked_mul(d)
                    .and_then(|x| x.checked_add(list.presentation_time_offset))
                    .ok_or(DashError::Overflow)?;
                Ok(Slot {
                    index: i,
                    time,
                    duration: d,
                })
            })
            .collect::<Result<_, DashError>>()?,
        // One SegmentURL without a duration spans the whole Period.
        (None, None) => vec![Slot {
            index: 0,
            time: list.presentation_time_offset,
            duration: (window.period_end.unwrap_or(0.0) * ts) as u64,
        }],
    };
    let mut segments = Vec::new();
    for (entry, slot) in list.segment_urls.iter().zip(slots) {
        let start_secs = (slot.time as f64 - list.presentation_time_offset as f64) / ts;
        let duration_secs = slot.duration as f64 / ts;
        if !window.keeps(start_secs + duration_secs) {
            continue;
        }
        if segments.len() == max {
            return Err(DashError::TooManySegments(MAX_SEGMENTS));
        }
        let url = join_opt(&rep.base_url, entry.media.as_deref())?;
        bytes.add(&url)?;
        segments.push(Segment {
            number: list.start_number.saturating_add(slot.index),
            time: slot.time,
            start_secs,
            duration_secs,
            url,
            byte_range: entry.media_range,
        });
    }
    Ok(SegmentIndex {
        init: init_segment(&rep.base_url, list.initialization.as_ref())?,
        segments,
    })
}

fn base_index(
    rep: &Representation,
    base: &SegmentBase,
    window: &Window,
    sidx: Option<&[SidxFragment]>,
    max: usize,
    bytes: &mut UrlBytes,
) -> Result<SegmentIndex, DashError> {
    let mut init = init_segment(&rep.base_url, base.initialization.as_ref())?;
    // Without an Initialization element the init is everything before the index.
    if let (None, Some((index_start, _))) = (&init, base.index_range) {
        if index_start > 0 {
            init = Some(InitSegment {
                url: rep.base_url.clone(),
                byte_range: Some((0, index_start - 1)),
            });
        }
    }
    let fragments = match (base.index_range, sidx) {
        (Some(_), Some(fragments)) => fragments,
        (Some(range), None) => {
            return Err(DashError::SidxMissing {
                url: rep.base_url.to_string(),
                range,
            });
        }
        (None, _) => {
            return Ok(SegmentIndex {
                init,
                segments: single_index(rep, window).segments,
            })
        }
    };
    let mut segments = Vec::new();
    let mut start_secs = 0.0;
    for (i, fragment) in fragments.iter().enumerate() {
        let end = start_secs + fragment.duration_secs;
        if window.keeps(end) {
            if segments.len() == max {
                return Err(DashError::TooManySegments(MAX_SEGMENTS));
            }
            bytes.add(&rep.base_url)?;
            segments.push(Segment {
                number: i as u64 + 1,
                time: (start_secs * base.timescale as f64) as u64,
                start_secs,
                duration_secs: fragment.duration_secs,
                url: rep.base_url.clone(),
                byte_range: Some(fragment.range),
            });
        }
        start_secs = end;
    }
    Ok(SegmentIndex { init, segments })
}

/// A Representation that is one file: one segment as long as the Period.
fn single_index(rep: &Representation, window: &Window) -> SegmentIndex {
    SegmentIndex {
        init: None,
        segments: vec![Segment {
            number: 1,
            time: 0,
            start_secs: 0.0,
            duration_secs: window.period_end.unwrap_or(0.0),
            url: rep.base_url.clone(),
            byte_range: None,
        }],
    }
}

fn init_segment(base: &Url, init: Option<&UrlRange>) -> Result<Option<InitSegment>, DashError> {
    init.map(|i| {
        Ok(InitSegment {
            url: join_opt(base, i.source_url.as_deref())?,
            byte_range: i.range,
        })
    })
    .transpose()
}

fn join_opt(base: &Url, relative: Option<&str>) -> Result<Url, DashError> {
    match relative.filter(|r| !r.is_empty()) {
        Some(r) => join(base, r),
        None => Ok(base.clone()),
    }
}

fn join(base: &Url, relative: &str) -> Result<Url, DashError> {
    base.join(relative)
        .map_err(|_| DashError::InvalidUrl(shorten(relative)))
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::hash::Hasher;

    use super::*;

    thread_local! {
        /// Equality comparisons of [`Counted`] values made so far on this thread.
        static COMPARED: Cell<usize> = const { Cell::new(0) };
    }

    /// Comparisons allowed before [`Counted`] gives up: a hash map needs about one per value.
    const COMPARE_BUDGET: usize = 10 * MAX_SEGMENTS;

    /// A duration that counts its equality comparisons and stops the test once they pass
    /// [`COMPARE_BUDGET`] (a quadratic count would make 5e9 of them).
    #[derive(Debug, Clone, Copy, PartialOrd, Ord)]
    struct Counted(u64);

    impl PartialEq for Counted {
        fn eq(&self, other: &Self) -> bool {
            let compared = COMPARED.with(|c| {
                c.set(c.get() + 1);
                c.get()
            });
            assert!(
                compared <= COMPARE_BUDGET,
                "more than {COMPARE_BUDGET} comparisons: the count is not linear"
            );
            self.0 == other.0
        }
    }

    impl Eq for Counted {}

    impl Hash for Counted {
        fn hash<H: Hasher>(&self, state: &mut H) {
            self.0.hash(state);
        }
    }

    /// 100,000 distinct durations (a hostile timeline's worth) and one repeated: the repeated
    /// one wins, in about one comparison per value.
    #[test]
    fn most_common_counts_distinct_durations_in_linear_work() {
        COMPARED.with(|c| c.set(0));
        let distinct = (1..=MAX_SEGMENTS as u64).map(Counted);
        let repeated = [Counted(42), Counted(42)];
        let found = most_common(distinct.chain(repeated));
        assert_eq!(found.map(|c| c.0), Some(42));
        let compared = COMPARED.with(Cell::get);
        assert!(compared <= 2 * MAX_SEGMENTS, "{compared} comparisons");
        // Ties go to the longest; nothing gives nothing.
        assert_eq!(most_common([3u64, 9, 5, 9, 3]), Some(9));
        assert_eq!(most_common(std::iter::empty::<u64>()), None);
    }
}
