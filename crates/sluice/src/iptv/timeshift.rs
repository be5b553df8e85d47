//! Timeshift: the last minutes of a channel's HLS segments kept on disk, so players can pause
//! and seek back, and `playseek` catch-up inside that window is answered without the operator.
//!
//! Opt-in per channel (`[iptv.timeshift] channels`): each listed channel is segmented from
//! start-up on, watched or not, and every finished segment is written to `dir/<channel>/<n>.ts`
//! with its wall-clock start. Files older than `minutes` (or beyond `max_bytes` per channel, or
//! past the segments `minutes` needs, [`max_segments`]) are deleted as new ones arrive; the
//! index of what is on disk lives in memory, and a restart starts an empty window (leftover
//! files are removed).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Mutex;

use futures_util::StreamExt;
use sluice_media::segmenter::{Segment, CLOCK};
use tokio::io::AsyncReadExt;
use tokio_util::io::ReaderStream;

use super::registry;
use crate::body::{self, Body};

/// `[iptv.timeshift]` in the config file.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TimeshiftConfig {
    /// Directory for the recorded segments (one subdirectory per channel). Required when
    /// `channels` lists any.
    pub dir: Option<String>,
    /// How far back a viewer can go.
    pub minutes: u64,
    /// Most bytes kept per channel, whatever `minutes` says.
    pub max_bytes: u64,
    /// Channels to keep, as their gateway paths with the query they need
    /// (`/rtp/239.1.1.1:5000?iface=eth0`).
    pub channels: Vec<String>,
}

crate::section::config_section!(TimeshiftConfig {
    dir,
    minutes,
    max_bytes,
    channels,
});

impl Default for TimeshiftConfig {
    fn default() -> Self {
        Self {
            dir: None,
            minutes: 30,
            max_bytes: 2 << 30,
            channels: Vec::new(),
        }
    }
}

impl TimeshiftConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.channels.is_empty() {
            return Ok(());
        }
        if self.dir.as_deref().is_none_or(str::is_empty) {
            return Err("dir is required when channels are listed".into());
        }
        if !(1..=24 * 60).contains(&self.minutes) {
            return Err("minutes must be 1 to 1440".into());
        }
        if self.max_bytes < 1 << 20 {
            return Err("max_bytes must be at least 1 MiB".into());
        }
        for c in &self.channels {
            let (path, query) = c.split_once('?').unwrap_or((c, ""));
            super::url::parse_channel(path, Some(query))
                .map_err(|e| format!("channels: {c:?}: {e}"))?;
        }
        Ok(())
    }

    /// Whether a window of `minutes` fits in [`MAX_SEGMENTS`] at `target` seconds a segment
    /// (`[iptv.hls] target_duration_secs`); past it, the window keeps less than `minutes`.
    pub fn check_segments(&self, target: u64) -> Result<(), String> {
        let needed = segments_needed(self.minutes, target);
        if self.channels.is_empty() || needed <= MAX_SEGMENTS {
            return Ok(());
        }
        Err(format!(
            "minutes = {} needs {needed} segments of hls.target_duration_secs = {target}; a \
             window keeps at most {MAX_SEGMENTS} (raise target_duration_secs or lower minutes)",
            self.minutes
        ))
    }
}

/// Most segments any channel's window keeps, whatever `minutes` and `max_bytes` allow: 24 hours
/// of 3-second segments. A sender jumping its timestamps at every picture gets a segment of a
/// few hundred bytes each time: 2 GiB of them was millions of files, and an index (and a
/// playlist listing it) of as many entries. With the longest query on each line, a playlist of
/// them all is still one an answer may send (checked where it is written, in `hls`).
pub const MAX_SEGMENTS: usize = 30_000;

/// Segments of `target` seconds a window of `minutes` holds.
pub fn segments_needed(minutes: u64, target: u64) -> usize {
    usize::try_from((minutes * 60).div_ceil(target.max(1))).unwrap_or(usize::MAX)
}

/// Most segments a window of `minutes` keeps at `target` seconds each: what it needs, and a
/// quarter more (segments are cut at keyframes and at breaks, often shorter than the target),
/// within [`MAX_SEGMENTS`].
pub fn max_segments(minutes: u64, target: u64) -> usize {
    let needed = segments_needed(minutes, target);
    needed
        .saturating_add(needed / 4)
        .saturating_add(64)
        .min(MAX_SEGMENTS)
}

/// One segment on disk.
#[derive(Debug, Clone, Copy)]
pub struct Recorded {
    pub sequence: u64,
    /// Wall-clock start, Unix milliseconds.
    pub wall_ms: i64,
    /// 90 kHz ticks.
    pub duration: u64,
    pub discontinuity: bool,
    pub len: u64,
}

impl Recorded {
    pub fn end_ms(&self) -> i64 {
        self.wall_ms + (self.duration * 1000 / CLOCK) as i64
    }
}

/// What is on disk for one channel.
#[derive(Debug, Default)]
struct Index {
    segments: VecDeque<Recorded>,
    bytes: u64,
    /// Sequence number of the next segment (carried across restarts of the channel).
    next: u64,
    /// Discontinuities that have left the window.
    discontinuities_gone: u64,
}

/// The disk window of one channel.
#[derive(Debug)]
pub struct Recorder {
    dir: PathBuf,
    keep_ms: i64,
    max_bytes: u64,
    /// [`max_segments`] of its configuration.
    max_segments: usize,
    index: Mutex<Index>,
}

impl Recorder {
    /// Prepares (and empties) the channel's directory, for a window of `minutes` of segments
    /// of `target` seconds.
    pub fn open(
        dir: PathBuf,
        minutes: u64,
        max_bytes: u64,
        target: u64,
    ) -> std::io::Result<Recorder> {
        std::fs::create_dir_all(&dir)?;
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "ts") {
                std::fs::remove_file(path)?;
            }
        }
        Ok(Recorder {
            dir,
            keep_ms: (minutes * 60_000) as i64,
            max_bytes,
            max_segments: max_segments(minutes, target),
            index: Mutex::new(Index::default()),
        })
    }

    /// Where a (re)started channel's sequence numbers go on.
    pub fn next_sequence(&self) -> u64 {
        registry::lock(&self.index).next
    }

    /// Whether anything was recorded before (a restarted channel follows a break).
    pub fn has_history(&self) -> bool {
        !registry::lock(&self.index).segments.is_empty()
    }

    /// Writes one segment and drops what fell out of the window.
    pub async fn keep(&self, sequence: u64, segment: &Segment, wall_ms: i64) {
        let path = self.dir.join(format!("{sequence}.ts"));
        if let Err(e) = tokio::fs::write(&path, &segment.data).await {
            tracing::warn!(path = %path.display(), error = %e, "timeshift: segment not written");
            return;
        }
        let gone = {
            let mut index = registry::lock(&self.index);
            // Its wall clock is estimated from its timestamps and when they arrived: jitter
            // may put it before the previous segment's end, and the window's clock would go
            // back (a `PROGRAM-DATE-TIME` earlier than the one before it, an instant two
            // segments hold, a seek landing in the older). It begins where that one ends.
            let wall_ms = index
                .segments
                .back()
                .map_or(wall_ms, |last| wall_ms.max(last.end_ms()));
            index.next = index.next.max(sequence + 1);
            index.bytes += segment.data.len() as u64;
            index.segments.push_back(Recorded {
                sequence,
                wall_ms,
                duration: segment.duration,
                discontinuity: segment.discontinuity,
                len: segment.data.len() as u64,
            });
            let mut gone = Vec::new();
            while let Some(old) = index.segments.front().copied() {
                let too_old = wall_ms - old.wall_ms > self.keep_ms;
                let too_many = index.segments.len() > self.max_segments;
                if !too_old && !too_many && index.bytes <= self.max_bytes
                    || index.segments.len() == 1
                {
                    break;
                }
                index.segments.pop_front();
                index.bytes -= old.len;
                index.discontinuities_gone += u64::from(old.discontinuity);
                gone.push(old.sequence);
            }
            gone
        };
        for n in gone {
            let _ = tokio::fs::remove_file(self.dir.join(format!("{n}.ts"))).await;
        }
    }

    /// Every segment on disk, oldest first, and the discontinuities already dropped.
    pub fn segments(&self) -> (Vec<Recorded>, u64) {
        let index = registry::lock(&self.index);
        (
            index.segments.iter().copied().collect(),
            index.discontinuities_gone,
        )
    }

    /// The window's first and newest sequence and the discontinuities gone before it (what
    /// its whole-window playlist depends on); `None` while it is empty.
    pub fn version(&self) -> Option<(u64, u64, u64)> {
        let index = registry::lock(&self.index);
        let (first, last) = (index.segments.front()?, index.segments.back()?);
        Some((first.sequence, last.sequence, index.discontinuities_gone))
    }

    /// Segment `n` as a body read from its file as it is sent, and its length, when it is still
    /// on disk: each viewer holds one chunk of it, not a copy of the whole segment.
    pub async fn read(&self, n: u64) -> Option<(Body, u64)> {
        // By binary search (sequences ascend): the window holds up to `MAX_SEGMENTS`, and the
        // segmenter storing the next one waits on this lock.
        let held = registry::lock(&self.index)
            .segments
            .binary_search_by(|r| {
                #[cfg(test)]
                tests::PROBES.with(|p| p.set(p.get() + 1));
                r.sequence.cmp(&n)
            })
            .is_ok();
        if !held {
            return None;
        }
        // Once open, the file stays readable even if the window drops it meanwhile.
        let file = tokio::fs::File::open(self.dir.join(format!("{n}.ts")))
            .await
            .ok()?;
        let len = file.metadata().await.ok()?.len();
        Some((streamed(file, len), len))
    }
}

/// Bytes read from a segment file at a time.
const CHUNK: usize = 64 << 10;

/// The first `len` bytes of `file`, in chunks of at most [`CHUNK`] (no more than the length
/// the answer announces).
fn streamed(file: tokio::fs::File, len: u64) -> Body {
    let chunks = ReaderStream::with_capacity(file.take(len), CHUNK)
        .map(|chunk| chunk.map(http_body::Frame::data));
    body::boxed(http_body_util::StreamBody::new(chunks))
}

/// The segments covering `[begin, end)` (Unix milliseconds) and the offset of `begin` in the
/// first; `None` when `begin` is not inside the window.
pub fn range(segments: &[Recorded], begin: i64, end: Option<i64>) -> Option<(Vec<Recorded>, u64)> {
    let first = segments
        .iter()
        .position(|r| r.wall_ms <= begin && begin < r.end_ms())
        .or_else(|| {
            // In a gap between two recordings: from the next one on.
            segments
                .iter()
                .position(|r| r.wall_ms > begin)
                .filter(|&i| i > 0)
        })?;
    let picked: Vec<Recorded> = segments[first..]
        .iter()
        .take_while(|r| end.is_none_or(|e| r.wall_ms < e))
        .copied()
        .collect();
    let offset = (begin - picked.first()?.wall_ms).max(0) as u64;
    Some((picked, offset))
}

/// The subdirectory name of a channel: its label with anything but letters, digits, dots and
/// dashes made `_`.
pub fn dir_name(label: &str) -> String {
    label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// Index entries `Recorder::read` looked at, on this thread.
        pub(super) static PROBES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

    /// A segment of `len` bytes, each `n as u8`.
    fn small(n: u64, len: usize) -> Segment {
        Segment {
            data: vec![n as u8; len].into(),
            duration: CLOCK / 25,
            keyframe: true,
            discontinuity: false,
            start: n * CLOCK / 25,
            number: n,
        }
    }

    /// A sender jumping its timestamps at every picture makes a tiny segment of each: the
    /// window stops at what `minutes` needs (a quarter more, and 64), whatever `minutes` and
    /// `max_bytes` allow, the oldest going with their files.
    #[tokio::test]
    async fn the_window_keeps_at_most_max_segments() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ch");
        // One minute of 1-second segments: 60, and 15 + 64 more.
        let recorder = Recorder::open(path.clone(), 1, 2 << 30, 1).unwrap();
        let most = 60 + 15 + 64;
        assert_eq!(max_segments(1, 1), most);
        let extra = 5;
        for n in 0..(most + extra) as u64 {
            recorder.keep(n, &small(n, 1), 1_000 + n as i64).await;
        }
        let (segments, _) = recorder.segments();
        assert_eq!(segments.len(), most);
        assert_eq!(segments[0].sequence, extra as u64, "the oldest went");
        assert_eq!(segments.last().unwrap().sequence, (most + extra - 1) as u64);
        let files = std::fs::read_dir(&path).unwrap().count();
        assert_eq!(files, most, "their files went too");
        for n in 0..extra as u64 {
            assert!(!path.join(format!("{n}.ts")).exists(), "{n}.ts left");
            assert!(recorder.read(n).await.is_none());
        }
        assert!(path.join(format!("{extra}.ts")).exists());
    }

    /// A segment whose estimated wall clock falls before the previous one's end begins where
    /// that one ends: the window's clock never goes back, and an instant is in one segment.
    #[tokio::test]
    async fn a_segment_begins_no_earlier_than_the_one_before_ends() {
        let dir = tempfile::tempdir().unwrap();
        let recorder = Recorder::open(dir.path().join("ch"), 60, 2 << 30, 4).unwrap();
        let four = |n: u64| Segment {
            duration: 4 * CLOCK,
            ..small(n, 1)
        };
        recorder.keep(0, &four(0), 10_000).await;
        recorder.keep(1, &four(1), 12_500).await;
        recorder.keep(2, &four(2), 19_000).await;
        let (segments, _) = recorder.segments();
        let walls: Vec<i64> = segments.iter().map(|r| r.wall_ms).collect();
        assert_eq!(walls, [10_000, 14_000, 19_000]);
        let (picked, offset) = range(&segments, 13_000, None).unwrap();
        assert_eq!((picked[0].sequence, offset), (0, 3_000));
    }

    /// A valid configuration keeps its whole window: 24 hours of 4-second segments are 21,600
    /// (a fixed bound of 20,000 cut the last two hours away); past [`MAX_SEGMENTS`] the
    /// configuration is told what it loses.
    #[tokio::test]
    async fn a_day_of_four_second_segments_is_kept_whole() {
        assert_eq!(segments_needed(24 * 60, 4), 21_600);
        assert_eq!(max_segments(24 * 60, 4), 21_600 + 5_400 + 64);
        assert_eq!(max_segments(24 * 60, 1), MAX_SEGMENTS);
        let config = |minutes| TimeshiftConfig {
            dir: Some("/tmp/ts".into()),
            minutes,
            channels: vec!["/rtp/239.1.1.1:5000".into()],
            ..TimeshiftConfig::default()
        };
        assert!(config(24 * 60).check_segments(3).is_ok());
        let err = config(24 * 60).check_segments(2).unwrap_err();
        assert!(err.contains("needs 43200 segments"), "{err}");
        assert!(err.contains(&format!("at most {MAX_SEGMENTS}")), "{err}");

        let dir = tempfile::tempdir().unwrap();
        let recorder = Recorder::open(dir.path().join("ch"), 24 * 60, 2 << 30, 4).unwrap();
        let day = 21_600u64;
        for n in 0..day {
            recorder.keep(n, &small(n, 1), n as i64 * 4_000).await;
        }
        let (segments, _) = recorder.segments();
        assert_eq!(segments.len(), day as usize);
        assert_eq!(segments[0].sequence, 0);
        assert!(recorder.read(0).await.is_some());
    }

    /// `read` finds a segment in a few looks at a full index (it was a walk of all of it, under
    /// the lock the segmenter waits on), and the right one.
    #[tokio::test]
    async fn a_segment_is_read_after_a_few_looks() {
        use http_body_util::BodyExt;
        let dir = tempfile::tempdir().unwrap();
        let recorder = Recorder::open(dir.path().join("ch"), 24 * 60, 2 << 30, 4).unwrap();
        let count = 20_000u64;
        for n in 0..count {
            // A varying length tells the segments apart by more than their byte.
            recorder
                .keep(n, &small(n, 1 + (n % 7) as usize), 1_000 + n as i64)
                .await;
        }
        // Some looks, and few: a walk (which counts none) or a search of all would fail.
        let looks = 1..=16;
        for n in [0, 1, 7_777, count - 1] {
            PROBES.with(|p| p.set(0));
            let (body, len) = recorder.read(n).await.unwrap();
            let probes = PROBES.with(std::cell::Cell::get);
            assert!(looks.contains(&probes), "{probes} looks for segment {n}");
            let data = body.collect().await.unwrap().to_bytes();
            assert_eq!(len, 1 + n % 7);
            assert_eq!(&data[..], &vec![n as u8; 1 + (n % 7) as usize][..]);
        }
        PROBES.with(|p| p.set(0));
        assert!(recorder.read(count).await.is_none());
        assert!(looks.contains(&PROBES.with(std::cell::Cell::get)));
    }

    fn rec(sequence: u64, wall_ms: i64) -> Recorded {
        Recorded {
            sequence,
            wall_ms,
            duration: 2 * CLOCK,
            discontinuity: false,
            len: 1,
        }
    }

    #[test]
    fn a_range_starts_in_the_segment_holding_its_begin() {
        let segs = [
            rec(5, 10_000),
            rec(6, 12_000),
            rec(7, 14_000),
            rec(8, 30_000),
        ];
        let (picked, offset) = range(&segs, 12_500, Some(15_000)).unwrap();
        assert_eq!(
            picked.iter().map(|r| r.sequence).collect::<Vec<_>>(),
            [6, 7]
        );
        assert_eq!(offset, 500);
        // Open-ended: to the live edge.
        assert_eq!(range(&segs, 14_000, None).unwrap().0.len(), 2);
        // In the gap before the last recording: from it, at its start.
        let (picked, offset) = range(&segs, 20_000, None).unwrap();
        assert_eq!((picked[0].sequence, offset), (8, 0));
        // Before the window, or after its end.
        assert!(range(&segs, 9_999, None).is_none());
        assert!(range(&segs, 40_000, None).is_none());
    }

    /// A recorded segment is served from its file a chunk at a time, byte for byte and to the
    /// length announced, even when the window drops it while it is being sent.
    #[tokio::test]
    async fn a_recorded_segment_is_streamed_in_bounded_chunks() {
        use http_body_util::BodyExt;
        let dir = tempfile::tempdir().unwrap();
        let recorder = Recorder::open(dir.path().join("ch"), 30, 300_000, 4).unwrap();
        let segment = |n: u64| Segment {
            data: (0..200_000u32)
                .map(|i| (i.wrapping_mul(7) ^ n as u32) as u8)
                .collect(),
            duration: 2 * CLOCK,
            keyframe: true,
            discontinuity: false,
            start: n * 2 * CLOCK,
            number: n,
        };
        let five = segment(5);
        recorder.keep(5, &five, 10_000).await;
        assert!(recorder.read(4).await.is_none());
        let (mut body, len) = recorder.read(5).await.unwrap();
        assert_eq!(len, 200_000);
        // Segment 6 pushes 5 out of the window (300,000 bytes) and off the disk.
        recorder.keep(6, &segment(6), 12_000).await;
        assert!(recorder.read(5).await.is_none());
        let mut got = Vec::new();
        let mut frames = 0;
        while let Some(frame) = body.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            assert!(data.len() <= CHUNK, "{} bytes at once", data.len());
            got.extend_from_slice(&data);
            frames += 1;
        }
        assert_eq!(got, five.data);
        assert!(frames > 200_000 / CHUNK, "{frames} chunks");
    }

    #[test]
    fn channel_directories_are_plain_names() {
        assert_eq!(
            dir_name("rtp://239.1.1.1:5000?fec=5002"),
            "rtp___239.1.1.1_5000_fec_5002"
        );
    }
}
