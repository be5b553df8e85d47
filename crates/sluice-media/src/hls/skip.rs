//! `skip` time ranges: parsing, and the per-segment keep/drop decisions of a media playlist.

use super::{snippet, HlsError};

/// Parses `"0-90,1750-1800"` into `[(0.0, 90.0), (1750.0, 1800.0)]` (seconds, start < end).
/// An empty string means no ranges. Ranges may overlap or come in any order.
pub fn parse_skip(input: &str) -> Result<Vec<(f64, f64)>, HlsError> {
    if input.trim().is_empty() {
        return Ok(Vec::new());
    }
    input
        .split(',')
        .map(|item| parse_range(item).map_err(|reason| invalid(input, reason)))
        .collect()
}

fn invalid(input: &str, reason: &'static str) -> HlsError {
    HlsError::InvalidSkip {
        input: snippet(input),
        reason,
    }
}

fn parse_range(item: &str) -> Result<(f64, f64), &'static str> {
    let item = item.trim();
    if item.is_empty() {
        return Err("empty range");
    }
    // Split at the first '-' after the first character, so "-5-10" is read as a
    // negative start (and rejected as such) rather than as an empty start.
    let dash = item
        .char_indices()
        .skip(1)
        .find(|&(_, c)| c == '-')
        .map(|(i, _)| i)
        .ok_or("range must be START-END")?;
    let start = parse_seconds(&item[..dash])?;
    let end = parse_seconds(&item[dash + 1..])?;
    if end <= start {
        return Err("range end must be after its start");
    }
    Ok((start, end))
}

fn parse_seconds(s: &str) -> Result<f64, &'static str> {
    let s = s.trim();
    // f64::from_str also accepts "inf", "NaN" and exponents; a time should be plain digits.
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err("times must be non-negative numbers of seconds");
    }
    s.parse::<f64>()
        .ok()
        .filter(|t| t.is_finite())
        .ok_or("times must be non-negative numbers of seconds")
}

/// What to do with one segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    Drop,
    /// `discontinuity`: kept segments were cut between the previous kept one and this one.
    /// `explicit_offset`: the segment just before it was dropped, so an implicit
    /// `EXT-X-BYTERANGE` offset ("right after the previous segment") would now be wrong.
    Keep {
        discontinuity: bool,
        explicit_offset: bool,
    },
}

/// Walks segments in playlist order with a running clock. Ranges are sorted and merged once,
/// then consumed with a cursor, so the walk is linear in segments + ranges.
pub(crate) struct Cutter {
    ranges: Vec<(f64, f64)>,
    next: usize,
    clock: f64,
    kept_any: bool,
    cut_since_kept: bool,
    prev_dropped: bool,
    byte_end: Option<u64>,
}

impl Cutter {
    pub fn new(ranges: &[(f64, f64)]) -> Cutter {
        let mut sorted: Vec<(f64, f64)> = ranges
            .iter()
            .copied()
            .filter(|(a, b)| a.is_finite() && b.is_finite() && a < b)
            .collect();
        sorted.sort_by(|x, y| x.0.total_cmp(&y.0));
        let mut merged: Vec<(f64, f64)> = Vec::with_capacity(sorted.len());
        for (a, b) in sorted {
            match merged.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        Cutter {
            ranges: merged,
            next: 0,
            clock: 0.0,
            kept_any: false,
            cut_since_kept: false,
            prev_dropped: false,
            byte_end: None,
        }
    }

    /// Decides the fate of the next segment, lasting `duration` seconds, and advances the clock.
    pub fn decide(&mut self, duration: f64) -> Decision {
        let start = self.clock;
        let end = start + duration;
        self.clock = end;
        while self.next < self.ranges.len() && self.ranges[self.next].1 <= start {
            self.next += 1;
        }
        let overlaps = self
            .ranges
            .get(self.next)
            .is_some_and(|&(a, _)| a < end || (duration == 0.0 && a <= start));
        let explicit_offset = self.prev_dropped;
        self.prev_dropped = overlaps;
        if overlaps {
            // A cut before the first kept segment is just a later start: no discontinuity.
            self.cut_since_kept |= self.kept_any;
            return Decision::Drop;
        }
        let discontinuity = std::mem::take(&mut self.cut_since_kept);
        self.kept_any = true;
        Decision::Keep {
            discontinuity,
            explicit_offset,
        }
    }

    /// Accounts for a segment's `EXT-X-BYTERANGE:<n>[@<o>]` value and returns `(n, offset)`
    /// when the offset is known (given, or implied by the previous segment's range).
    pub fn byterange(&mut self, value: &str) -> Option<(u64, u64)> {
        let (len, offset) = match value.trim().split_once('@') {
            Some((n, o)) => (n.parse::<u64>().ok(), o.parse::<u64>().ok()),
            None => (value.trim().parse::<u64>().ok(), self.byte_end),
        };
        let (len, offset) = (len?, offset);
        self.byte_end = offset.and_then(|o| o.checked_add(len));
        Some((len, offset?))
    }

    /// The segment had no byte range: an implicit offset on the next one means nothing.
    pub fn no_byterange(&mut self) {
        self.byte_end = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ranges() {
        assert_eq!(
            parse_skip("0-90,1750-1800"),
            Ok(vec![(0.0, 90.0), (1750.0, 1800.0)])
        );
        assert_eq!(parse_skip(" 1.5 - 3 "), Ok(vec![(1.5, 3.0)]));
        assert_eq!(parse_skip(""), Ok(vec![]));
    }

    #[test]
    fn rejects_bad_ranges() {
        for bad in [
            "90", "é-5", "90-10", "5-5", "-5-10", "a-b", "1-inf", "0-90,", "1e3-2e3", "0--9",
        ] {
            assert!(
                matches!(parse_skip(bad), Err(HlsError::InvalidSkip { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn decisions_follow_the_clock() {
        let mut c = Cutter::new(&[(25.0, 35.0), (10.0, 15.0)]);
        let keep = |d, o| Decision::Keep {
            discontinuity: d,
            explicit_offset: o,
        };
        assert_eq!(c.decide(10.0), keep(false, false)); // 0-10
        assert_eq!(c.decide(10.0), Decision::Drop); // 10-20
        assert_eq!(c.decide(10.0), Decision::Drop); // 20-30
        assert_eq!(c.decide(5.0), Decision::Drop); // 30-35
        assert_eq!(c.decide(10.0), keep(true, true)); // 35-45
        assert_eq!(c.decide(10.0), keep(false, false)); // 45-55
    }

    #[test]
    fn leading_cut_is_not_a_discontinuity() {
        let mut c = Cutter::new(&[(0.0, 10.0)]);
        assert_eq!(c.decide(10.0), Decision::Drop);
        assert_eq!(
            c.decide(10.0),
            Decision::Keep {
                discontinuity: false,
                explicit_offset: true
            }
        );
    }

    #[test]
    fn byteranges_chain() {
        let mut c = Cutter::new(&[]);
        assert_eq!(c.byterange("100@0"), Some((100, 0)));
        assert_eq!(c.byterange("50"), Some((50, 100)));
        c.no_byterange();
        assert_eq!(c.byterange("50"), None);
        assert_eq!(c.byterange("x@1"), None);
        assert_eq!(c.byterange(&format!("1@{}", u64::MAX)), Some((1, u64::MAX)));
        assert_eq!(c.byterange("1"), None);
    }
}
