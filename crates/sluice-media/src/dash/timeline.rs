//! SegmentTimeline expansion (`S@t/@d/@r`, including `r=-1`) into segment slots, cut to a window
//! arithmetically so a timeline that starts in 1970 costs no more than one that starts now. No I/O.

use super::segment_info::TimelineEntry;
use super::{DashError, MAX_SEGMENTS};

/// One expanded segment, in timescale units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot {
    /// Position counted from the first `S`, i.e. the offset from `startNumber`.
    pub index: u64,
    pub time: u64,
    pub duration: u64,
}

/// Which slots to keep, in media time (timescale units, presentation time offset included).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Bounds {
    /// Keep slots ending after this (the start of a live window).
    pub ends_after: Option<i128>,
    /// Keep slots ending at or before this (the live edge).
    pub ends_by: Option<i128>,
    /// Where a final `r=-1` stops repeating (Period end or live edge).
    pub repeat_until: Option<i128>,
    /// Live: a repeat stops at the last complete slot. Static: the last slot may run past the end.
    pub complete_only: bool,
}

/// The slots of `entries` inside `bounds`; more than `max` of them is
/// [`DashError::TooManySegments`], found before they are made.
pub(crate) fn expand(
    entries: &[TimelineEntry],
    bounds: &Bounds,
    max: usize,
) -> Result<Vec<Slot>, DashError> {
    let mut slots = Vec::new();
    let mut running: i128 = 0;
    let mut index: i128 = 0;
    for (at, entry) in entries.iter().enumerate() {
        let t0 = entry.t.map_or(running, i128::from);
        let d = i128::from(entry.d);
        let count = repeat_count(entry, t0, entries.get(at + 1), bounds)?;
        let (first, end) = kept_range(t0, d, count, bounds);
        if end > first {
            if (slots.len() as i128) + (end - first) > max as i128 {
                return Err(DashError::TooManySegments(MAX_SEGMENTS));
            }
            for i in first..end {
                let time = i.checked_mul(d).and_then(|x| x.checked_add(t0));
                slots.push(Slot {
                    index: to_u64(index.checked_add(i).ok_or(DashError::Overflow)?)?,
                    time: to_u64(time.ok_or(DashError::Overflow)?)?,
                    duration: entry.d,
                });
            }
        }
        running = t0
            .checked_add(count.checked_mul(d).ok_or(DashError::Overflow)?)
            .ok_or(DashError::Overflow)?;
        index = index.checked_add(count).ok_or(DashError::Overflow)?;
    }
    Ok(slots)
}

/// How many slots an entry stands for: `r + 1`, or for `r=-1` as many as fit before the next
/// entry's `t`, the Period end or the live edge.
fn repeat_count(
    entry: &TimelineEntry,
    t0: i128,
    next: Option<&TimelineEntry>,
    bounds: &Bounds,
) -> Result<i128, DashError> {
    if entry.r >= 0 {
        return Ok(i128::from(entry.r) + 1);
    }
    let d = i128::from(entry.d);
    let (limit, round_up) = match next.and_then(|n| n.t) {
        Some(next_t) => (i128::from(next_t), true),
        None => (
            bounds
                .repeat_until
                .ok_or(DashError::Missing("end of an open-ended S@r=-1"))?,
            !bounds.complete_only,
        ),
    };
    let span = (limit - t0).max(0);
    let count = if round_up {
        (span + d - 1) / d
    } else {
        span / d
    };
    Ok(count)
}

/// Slot indexes `[first, end)` of an entry whose end lies inside the bounds.
fn kept_range(t0: i128, d: i128, count: i128, bounds: &Bounds) -> (i128, i128) {
    // Slot i ends at t0 + (i + 1) d.
    let first = bounds
        .ends_after
        .map_or(0, |lo| (lo - t0).div_euclid(d))
        .clamp(0, count);
    let end = bounds
        .ends_by
        .map_or(count, |hi| (hi - t0).div_euclid(d))
        .clamp(0, count);
    (first, end)
}

fn to_u64(value: i128) -> Result<u64, DashError> {
    u64::try_from(value).map_err(|_| DashError::Overflow)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(t: Option<u64>, d: u64, r: i64) -> TimelineEntry {
        TimelineEntry { t, d, r }
    }

    #[test]
    fn repeats_and_gaps() {
        let slots = expand(
            &[s(Some(10), 2, 2), s(Some(20), 3, 0)],
            &Bounds::default(),
            MAX_SEGMENTS,
        )
        .unwrap();
        let times: Vec<_> = slots
            .iter()
            .map(|s| (s.index, s.time, s.duration))
            .collect();
        assert_eq!(times, [(0, 10, 2), (1, 12, 2), (2, 14, 2), (3, 20, 3)]);
    }

    #[test]
    fn open_repeat_far_in_the_past_is_cut_arithmetically() {
        let bounds = Bounds {
            ends_after: Some(1_000_000_000_000),
            ends_by: Some(1_000_000_000_010),
            repeat_until: Some(1_000_000_000_010),
            complete_only: true,
        };
        let slots = expand(&[s(Some(0), 2, -1)], &bounds, MAX_SEGMENTS).unwrap();
        assert_eq!(slots.len(), 5);
        assert_eq!(slots[0].time, 1_000_000_000_000);
        assert_eq!(slots[0].index, 500_000_000_000);
    }

    #[test]
    fn open_repeat_without_end_is_an_error() {
        assert!(expand(&[s(None, 2, -1)], &Bounds::default(), MAX_SEGMENTS).is_err());
    }

    #[test]
    fn huge_repeat_is_capped() {
        let err = expand(&[s(None, 1, i64::MAX)], &Bounds::default(), MAX_SEGMENTS).unwrap_err();
        assert_eq!(err, DashError::TooManySegments(MAX_SEGMENTS));
    }
}
