//! Low-latency HLS of a channel: the partial segments it holds, the wall clock of its segments,
//! and the blocking reload a player asks for with `_HLS_msn` and `_HLS_part`.

use std::collections::VecDeque;

use bytes::Bytes;
use sluice_media::segmenter::playlist::PartEntry;
use sluice_media::segmenter::Part;

/// Complete segments whose parts stay listed (RFC 8216bis: at least the last three target
/// durations' worth).
const KEEP_DONE: usize = 3;

/// What a low-latency channel holds besides its segments.
#[derive(Debug, Default)]
pub(super) struct Held {
    /// Parts of the newest complete segments, by media sequence number.
    done: VecDeque<(u64, Vec<Part>)>,
    /// Parts of the segment being built.
    building: Vec<Part>,
    /// Wall-clock start (Unix ms) of the segments held, by media sequence number (ascending).
    walls: VecDeque<(u64, i64)>,
}

impl Held {
    /// Takes the parts the segmenter finished (before the segments that close them).
    pub(super) fn add(&mut self, parts: Vec<Part>) {
        self.building.extend(parts);
    }

    /// Segment `number` of the segmenter was stored as `sequence`: its parts are complete.
    /// Parts of an earlier number belonged to a segment that was dropped (it had no length).
    pub(super) fn complete(&mut self, number: u64, sequence: u64, wall_ms: i64, keep: usize) {
        let mut mine = Vec::new();
        self.building.retain_mut(|p| {
            if p.number == number {
                mine.push(p.clone());
            }
            p.number > number
        });
        self.done.push_back((sequence, mine));
        while self.done.len() > KEEP_DONE {
            self.done.pop_front();
        }
        self.walls.push_back((sequence, wall_ms));
        while self.walls.len() > keep {
            self.walls.pop_front();
        }
    }

    /// Forgets what it holds of segments before `oldest` (gone from the window).
    pub(super) fn forget_before(&mut self, oldest: u64) {
        while self.walls.front().is_some_and(|(s, _)| *s < oldest) {
            self.walls.pop_front();
        }
        while self.done.front().is_some_and(|(s, _)| *s < oldest) {
            self.done.pop_front();
        }
    }

    pub(super) fn wall_ms(&self, sequence: u64) -> Option<i64> {
        let i = self
            .walls
            .binary_search_by_key(&sequence, |(s, _)| *s)
            .ok()?;
        self.walls.get(i).map(|(_, w)| *w)
    }

    /// Segments whose wall clock it holds.
    #[cfg(test)]
    pub(super) fn walls(&self) -> usize {
        self.walls.len()
    }

    /// Parts to list: those of the last complete segments, then those of the segment being
    /// built, which will be `next`.
    pub(super) fn entries(&self, next: u64) -> Vec<PartEntry> {
        let done = self
            .done
            .iter()
            .flat_map(|(seq, parts)| parts.iter().map(move |p| entry(*seq, p)));
        let building = self.building.iter().map(|p| entry(next, p));
        done.chain(building).collect()
    }

    /// Parts of segment `next` (the one being built) finished so far.
    pub(super) fn building(&self) -> usize {
        self.building.len()
    }

    /// Part `index` of segment `sequence`, when held.
    pub(super) fn get(&self, sequence: u64, index: u32, next: u64) -> Option<Bytes> {
        let parts = if sequence == next {
            &self.building[..]
        } else {
            &self.done.iter().find(|(s, _)| *s == sequence)?.1[..]
        };
        parts
            .iter()
            .find(|p| p.index == index)
            .map(|p| p.data.clone())
    }
}

fn entry(sequence: u64, p: &Part) -> PartEntry {
    PartEntry {
        sequence,
        index: p.index,
        duration: p.duration,
        independent: p.independent,
    }
}

/// A blocking playlist reload: answer once segment `msn` (or its part `part`) is listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Block {
    pub msn: u64,
    pub part: Option<u32>,
}

impl Block {
    /// Whether a playlist with segments up to `next - 1` complete and `building` parts of
    /// segment `next` satisfies it.
    pub(super) fn ready(self, next: u64, building: usize) -> bool {
        match self.part {
            None => next > self.msn,
            Some(p) => next > self.msn || (next == self.msn && building > p as usize),
        }
    }

    /// RFC 8216bis §6.2.5.2: a sequence more than two past the last segment is a bad request.
    pub(super) fn too_far(self, next: u64) -> bool {
        self.msn > next + 1
    }
}

/// The query without the delivery directives (`_HLS_msn`, `_HLS_part`, `_HLS_skip`), which
/// are not part of the channel, and the blocking reload they ask for; `Err` names a bad one.
pub(super) fn directives(query: &str) -> Result<(String, Option<Block>), String> {
    let mut kept = Vec::new();
    let (mut msn, mut part) = (None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "_HLS_msn" => msn = Some(value.parse::<u64>().map_err(|_| bad(name, value))?),
            "_HLS_part" => part = Some(value.parse::<u32>().map_err(|_| bad(name, value))?),
            "_HLS_skip" => {}
            _ => kept.push(pair),
        }
    }
    let block = match (msn, part) {
        (Some(msn), part) => Some(Block { msn, part }),
        (None, Some(_)) => return Err("_HLS_part without _HLS_msn".into()),
        (None, None) => None,
    };
    Ok((kept.join("&"), block))
}

fn bad(name: &str, value: &str) -> String {
    let value: String = value.chars().take(24).collect();
    format!("{name}={value} is not a number")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directives_leave_the_channel_query() {
        assert_eq!(
            directives("iface=lo&_HLS_msn=12&_HLS_part=3").unwrap(),
            (
                "iface=lo".into(),
                Some(Block {
                    msn: 12,
                    part: Some(3)
                })
            )
        );
        assert_eq!(
            directives("_HLS_skip=YES&a=b").unwrap(),
            ("a=b".into(), None)
        );
        assert!(directives("_HLS_part=1").is_err());
        assert!(directives("_HLS_msn=x").is_err());
    }

    #[test]
    fn a_block_waits_for_the_segment_or_its_part() {
        let b = Block {
            msn: 5,
            part: Some(1),
        };
        assert!(!b.ready(5, 1));
        assert!(b.ready(5, 2));
        assert!(b.ready(6, 0));
        let whole = Block { msn: 5, part: None };
        assert!(!whole.ready(5, 9));
        assert!(whole.ready(6, 0));
        assert!(!whole.too_far(4));
        assert!(whole.too_far(3));
    }
}
