//! HLS media and discontinuity sequence numbers for a live DASH track across MPD updates. No I/O.
//!
//! A live MPD that adds a Period usually restarts `$Number$` in it (1, 2, ... again). HLS needs a
//! media sequence that never goes back: a player matches segments across reloads by it. So each
//! Period gets a base: the first Period seen keeps its own numbers; a new Period continues one
//! past the last segment before it. The caller keeps a [`LiveSequence`] per track between
//! reloads, so the bases outlive the Periods that leave the MPD's window. Each new Period also
//! advances the discontinuity sequence by one (one `#EXT-X-DISCONTINUITY` at its start).

/// Periods remembered per track; older ones are forgotten (they left the window long ago).
const MAX_PERIODS: usize = 64;

/// The sequence state of one live track, kept by the caller from one MPD update to the next.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LiveSequence {
    periods: Vec<PeriodBase>,
    /// One past the highest media sequence number handed out.
    next: u64,
    /// One past the highest discontinuity sequence number handed out.
    next_discontinuity: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct PeriodBase {
    key: String,
    /// The `$Number$` that `base` stands for.
    first_number: u64,
    base: u64,
    discontinuity: u64,
}

/// Where one segment sits in HLS terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    pub media_sequence: u64,
    /// Discontinuities before it since the stream began (its Period's).
    pub discontinuity_sequence: u64,
}

impl LiveSequence {
    /// Places segments given in playlist order as (Period key, `$Number$`); the key names a
    /// Period across updates (its `id`, else its start).
    pub fn place<'a>(&mut self, segments: impl IntoIterator<Item = (&'a str, u64)>) -> Vec<Placed> {
        let mut out = Vec::new();
        let mut previous: Option<(usize, Placed)> = None;
        for (key, number) in segments {
            let at = match self.periods.iter().position(|p| p.key == key) {
                Some(at) => at,
                None => self.add(key, number, previous.map(|(_, placed)| placed)),
            };
            let p = &self.periods[at];
            let offset = i128::from(number) - i128::from(p.first_number);
            let media_sequence = u64::try_from((i128::from(p.base) + offset).max(0)).unwrap_or(0);
            let placed = Placed {
                media_sequence,
                discontinuity_sequence: p.discontinuity,
            };
            self.next = self.next.max(media_sequence.saturating_add(1));
            out.push(placed);
            previous = Some((at, placed));
        }
        out
    }

    /// Takes in what `other` learned that this state does not know: the bases of Periods it
    /// placed that this state never saw, and how far it numbered. Two builds that began from one
    /// state and ran at once are merged so: a Period only one of them saw keeps the base it was
    /// served with. A Period both placed (from MPDs that listed different segments before it)
    /// keeps the higher of the two numberings: the client served the lower one then sees its
    /// media sequence jump forward, which a player takes as a gap, never back.
    pub fn merge(&mut self, other: &LiveSequence) {
        for p in &other.periods {
            match self.periods.iter_mut().find(|q| q.key == p.key) {
                Some(q) => {
                    let offset = |b: &PeriodBase| i128::from(b.base) - i128::from(b.first_number);
                    if offset(p) > offset(q) {
                        *q = p.clone();
                    }
                }
                None => {
                    if self.periods.len() == MAX_PERIODS {
                        self.periods.remove(0);
                    }
                    self.periods.push(p.clone());
                }
            }
        }
        self.next = self.next.max(other.next);
        self.next_discontinuity = self.next_discontinuity.max(other.next_discontinuity);
    }

    /// A Period seen for the first time, starting at `number`; `before` is the segment right
    /// before it in this update, if any.
    fn add(&mut self, key: &str, number: u64, before: Option<Placed>) -> usize {
        let (base, discontinuity) = match before {
            None if self.periods.is_empty() => (number, 0),
            None => (self.next, self.next_discontinuity),
            Some(b) => (
                b.media_sequence.saturating_add(1).max(self.next),
                (b.discontinuity_sequence + 1).max(self.next_discontinuity),
            ),
        };
        self.next_discontinuity = self.next_discontinuity.max(discontinuity + 1);
        if self.periods.len() == MAX_PERIODS {
            self.periods.remove(0);
        }
        self.periods.push(PeriodBase {
            key: key.to_owned(),
            first_number: number,
            base,
            discontinuity,
        });
        self.periods.len() - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seqs(state: &mut LiveSequence, segments: &[(&str, u64)]) -> Vec<(u64, u64)> {
        state
            .place(segments.iter().copied())
            .into_iter()
            .map(|p| (p.media_sequence, p.discontinuity_sequence))
            .collect()
    }

    #[test]
    fn one_period_keeps_its_numbers() {
        let mut s = LiveSequence::default();
        assert_eq!(
            seqs(&mut s, &[("a", 100), ("a", 101)]),
            [(100, 0), (101, 0)]
        );
        assert_eq!(
            seqs(&mut s, &[("a", 101), ("a", 102)]),
            [(101, 0), (102, 0)]
        );
    }

    #[test]
    fn a_new_period_that_restarts_numbers_continues_the_sequence() {
        let mut s = LiveSequence::default();
        assert_eq!(seqs(&mut s, &[("a", 98), ("a", 99)]), [(98, 0), (99, 0)]);
        // The update adds Period b, numbered from 1 again.
        assert_eq!(
            seqs(&mut s, &[("a", 99), ("a", 100), ("b", 1), ("b", 2)]),
            [(99, 0), (100, 0), (101, 1), (102, 1)]
        );
        // Period a leaves the window: b keeps the numbers it was given.
        assert_eq!(seqs(&mut s, &[("b", 2), ("b", 3)]), [(102, 1), (103, 1)]);
        // Another Period, first seen when nothing before it is listed any more.
        assert_eq!(seqs(&mut s, &[("c", 1)]), [(104, 2)]);
    }

    #[test]
    fn a_fresh_state_still_numbers_one_update_consecutively() {
        let mut s = LiveSequence::default();
        assert_eq!(
            seqs(&mut s, &[("a", 7), ("b", 1), ("b", 2)]),
            [(7, 0), (8, 1), (9, 1)]
        );
    }

    /// Two builds from one state: the one on the newer MPD placed Period "b"; merged into the
    /// one on the older MPD (kept first), "b" keeps its base once "a" has left the window.
    #[test]
    fn a_merge_keeps_the_periods_only_the_other_build_saw() {
        let mut start = LiveSequence::default();
        seqs(&mut start, &[("a", 1), ("a", 2), ("a", 3)]);
        let mut older = start.clone();
        seqs(&mut older, &[("a", 2), ("a", 3), ("a", 4)]);
        let mut newer = start.clone();
        assert_eq!(
            seqs(&mut newer, &[("a", 3), ("a", 4), ("b", 1), ("b", 2)]),
            [(3, 0), (4, 0), (5, 1), (6, 1)]
        );
        older.merge(&newer);
        assert_eq!(seqs(&mut older, &[("b", 2), ("b", 3)]), [(6, 1), (7, 1)]);
        // Merged the other way, the same.
        let mut both = newer.clone();
        both.merge(&start);
        assert_eq!(both, newer);
        // Both placed "b", from MPDs listing different segments before it: the higher
        // numbering is kept, whichever was kept first.
        let mut gone = start.clone();
        assert_eq!(seqs(&mut gone, &[("b", 1), ("b", 2)]), [(4, 1), (5, 1)]);
        let mut kept = gone.clone();
        kept.merge(&newer);
        assert_eq!(seqs(&mut kept, &[("b", 2)]), [(6, 1)]);
        let mut kept = newer.clone();
        kept.merge(&gone);
        assert_eq!(seqs(&mut kept, &[("b", 2)]), [(6, 1)]);
        // Unmerged, "b" seen alone would have been numbered from `next`, back from 6 to 5.
        let mut alone = start.clone();
        seqs(&mut alone, &[("a", 4)]);
        assert_eq!(seqs(&mut alone, &[("b", 2)]), [(5, 1)]);
    }

    #[test]
    fn the_state_is_bounded() {
        let mut s = LiveSequence::default();
        for i in 0..(MAX_PERIODS as u64 * 3) {
            let key = format!("p{i}");
            s.place([(key.as_str(), 1)]);
        }
        assert_eq!(s.periods.len(), MAX_PERIODS);
        assert_eq!(s.next, MAX_PERIODS as u64 * 3 + 1);
    }
}
