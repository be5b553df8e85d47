//! fMP4 segments of an HLS channel (`?container=fmp4`, or `iptv.hls.container = "fmp4"`): the
//! channel's TS segments rewritten once each by `sluice_media::fmp4`, shared by every fMP4
//! viewer, from the channel's first fMP4 request on (a channel nobody asks fMP4 of pays nothing).

use std::collections::VecDeque;
use std::sync::Mutex;

use bytes::Bytes;
use sluice_media::fmp4::{Fragment, Writer};
use sluice_media::segmenter::Segment;

use super::super::registry;

/// The segments a playlist lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Container {
    /// MPEG-TS, as the channel carries it.
    #[default]
    Ts,
    /// Fragmented MP4 (H.264 and AAC), with an init segment.
    Fmp4,
}

/// The query without `container=` (which is the player's choice, not part of the channel), and
/// the container it asks for (`default` when it names none); `Err` names a bad value.
pub(super) fn container(query: &str, default: Container) -> Result<(String, Container), String> {
    let mut kept = Vec::new();
    let mut chosen = default;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=').unwrap_or((pair, "")) {
            ("container", "ts") => chosen = Container::Ts,
            ("container", "fmp4") => chosen = Container::Fmp4,
            ("container", other) => {
                let other: String = other.chars().take(24).collect();
                return Err(format!("container={other}: ts or fmp4"));
            }
            _ => kept.push(pair),
        }
    }
    Ok((kept.join("&"), chosen))
}

/// One channel's fMP4 segments.
#[derive(Debug, Default)]
pub(super) struct Converted {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Some viewer asked for fMP4: every new segment is rewritten as it comes.
    wanted: bool,
    writer: Writer,
    /// Media sequence number of the last segment given to the writer.
    last: Option<u64>,
    /// By media sequence number (ascending); `None` for a segment that could not be written.
    fragments: VecDeque<(u64, Option<Fragment>)>,
    /// Bytes of the fragments held (their init segments are shared, and small).
    bytes: u64,
    /// Why the last segment that could not be written could not.
    error: Option<String>,
}

impl State {
    /// Rewrites the segments after the last one done, oldest first, and forgets fragments
    /// older than `oldest` (gone from the window).
    fn add(&mut self, segments: &[(u64, Segment)], oldest: u64) {
        for (seq, seg) in segments {
            if self.last.is_some_and(|l| *seq <= l) {
                continue;
            }
            if seg.discontinuity || self.last.is_none_or(|l| *seq != l + 1) {
                self.writer.reset();
            }
            self.last = Some(*seq);
            let end = seg.start + seg.duration;
            let fragment = match self.writer.segment(&seg.data, (*seq + 1) as u32, Some(end)) {
                Ok(f) => Some(f),
                Err(e) => {
                    tracing::debug!(sequence = seq, error = %e, "segment not written as fMP4");
                    self.error = Some(e.to_string());
                    None
                }
            };
            self.bytes += fragment.as_ref().map_or(0, |f| f.media.len() as u64);
            self.fragments.push_back((*seq, fragment));
        }
        while self.fragments.front().is_some_and(|(s, _)| *s < oldest) {
            if let Some((_, Some(gone))) = self.fragments.pop_front() {
                self.bytes -= gone.media.len() as u64;
            }
        }
    }

    /// Fragment of segment `sequence`, when held (`Some(None)`: it has no fMP4 form).
    fn find(&self, sequence: u64) -> Option<&Option<Fragment>> {
        let i = self
            .fragments
            .binary_search_by_key(&sequence, |(s, _)| *s)
            .ok()?;
        self.fragments.get(i).map(|(_, f)| f)
    }
}

impl Converted {
    /// New segments of the channel (`oldest`: the first one its window still holds).
    pub(super) fn add(&self, segments: &[(u64, Segment)], oldest: u64) {
        let mut state = registry::lock(&self.state);
        if state.wanted {
            state.add(segments, oldest);
        }
    }

    /// A viewer asks for fMP4: from now on every segment is rewritten, starting with those the
    /// window holds (`window` takes them; it is called under this lock, so a segment stored
    /// meanwhile is either in it or rewritten by the next [`Converted::add`]).
    pub(super) fn want(&self, window: impl FnOnce() -> (Vec<(u64, Segment)>, u64)) {
        let mut state = registry::lock(&self.state);
        if !state.wanted {
            state.wanted = true;
            let (segments, oldest) = window();
            state.add(&segments, oldest);
        }
    }

    /// Whether a viewer has asked for fMP4 (every segment is rewritten).
    pub(super) fn wanted(&self) -> bool {
        registry::lock(&self.state).wanted
    }

    /// Bytes of the fMP4 fragments held.
    pub(super) fn bytes(&self) -> u64 {
        registry::lock(&self.state).bytes
    }

    /// Segment `sequence` as fMP4: `None` when it is not held, `Some(None)` when it has no
    /// fMP4 form.
    pub(super) fn fragment(&self, sequence: u64) -> Option<Option<Fragment>> {
        registry::lock(&self.state).find(sequence).cloned()
    }

    /// Sequence of the last segment rewritten so far (the fMP4 playlist lists none after it).
    pub(super) fn done(&self) -> Option<u64> {
        registry::lock(&self.state).last
    }

    /// Stands fragments of `sequences` in for rewritten segments (for tests: an fMP4 playlist
    /// without H.264 to rewrite).
    #[cfg(test)]
    pub(super) fn fake(&self, sequences: std::ops::Range<u64>) {
        let mut state = registry::lock(&self.state);
        state.wanted = true;
        for seq in sequences {
            let fragment = Fragment {
                media: Bytes::from_static(b"moof"),
                init: Bytes::from_static(b"moov"),
                init_id: 0,
            };
            state.last = Some(seq);
            state.fragments.push_back((seq, Some(fragment)));
        }
    }

    /// Why the last segment that could not be written as fMP4 could not.
    pub(super) fn error(&self) -> Option<String> {
        registry::lock(&self.state).error.clone()
    }

    /// Init segment number `id`, while a held fragment needs it.
    pub(super) fn init(&self, id: u64) -> Option<Bytes> {
        let state = registry::lock(&self.state);
        state.fragments.iter().find_map(|(_, f)| {
            f.as_ref()
                .filter(|f| f.init_id == id)
                .map(|f| f.init.clone())
        })
    }

    /// The init number of each of `sequences` that a playlist lists: from the first after the
    /// last one that could not be written, up to the last one written so far (a segment just
    /// stored may not be yet). Returns how many were left off the front, and the numbers.
    pub(super) fn listing(&self, sequences: &[u64]) -> (usize, Vec<u64>) {
        let state = registry::lock(&self.state);
        let mut inits = Vec::with_capacity(sequences.len());
        let mut skipped = 0;
        for (i, seq) in sequences.iter().enumerate() {
            if state.last.is_none_or(|last| *seq > last) {
                break;
            }
            // By binary search: a catch-up playlist lists thousands of segments.
            let id = state.find(*seq).and_then(|f| f.as_ref().map(|f| f.init_id));
            match id {
                Some(id) => inits.push(id),
                None => {
                    inits.clear();
                    skipped = i + 1;
                }
            }
        }
        (skipped, inits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_leaves_the_channel_query() {
        assert_eq!(
            container("iface=lo&container=fmp4", Container::Ts).unwrap(),
            ("iface=lo".into(), Container::Fmp4)
        );
        assert_eq!(
            container("container=ts&fec=5002", Container::Fmp4).unwrap(),
            ("fec=5002".into(), Container::Ts)
        );
        assert_eq!(
            container("iface=lo", Container::Fmp4).unwrap(),
            ("iface=lo".into(), Container::Fmp4)
        );
        assert!(container("container=mkv", Container::Ts).is_err());
    }
}
