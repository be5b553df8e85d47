//! Fragmented MP4 (a clear init segment plus a clear media segment) remuxed to MPEG-TS. No I/O.
//!
//! [`Remuxer::new`] reads the init once: each track's timescale and codec configuration.
//! [`Remuxer::segment`] then turns one media segment (any number of `moof`/`mdat` pairs) into
//! whole 188-byte TS packets: PAT and PMT first, then one PES per sample, H.264/H.265 rewritten
//! to Annex B with the parameter sets before every keyframe, AAC wrapped in ADTS, AC-3 and E-AC-3
//! passed through. Timestamps come from `tfdt` and the sample durations and composition offsets,
//! so consecutive segments of one stream line up; the continuity counters live in [`RemuxState`],
//! which the caller carries from one segment to the next when it can.
//!
//! # Layout
//! - `tracks`: the init segment's tracks and codec configurations (`avcC`, `hvcC`, `esds`).
//! - `samples`: every sample of a media segment with its timing, flags and bytes.
//! - `es`: one sample as elementary-stream bytes (Annex B, ADTS, AC-3 as is).
//! - `ts`: PAT, PMT, PES and TS packetisation, CRC-32/MPEG-2.

mod es;
mod samples;
mod tracks;
mod ts;

pub use samples::Sample;
pub use tracks::{Codec, Track};
pub use ts::PCR_LEAD;

use crate::mp4::{fourcc_str, FourCC, Mp4Error};

/// MPEG-TS timestamps count at 90 kHz.
pub const TS_CLOCK: u64 = 90_000;
/// Added to every timestamp so composition offsets and the PCR lead never go below zero (1 s).
pub const TIMESTAMP_OFFSET: u64 = TS_CLOCK;
/// PID of the program map table.
pub const PMT_PID: u16 = 0x1000;
/// PID of the first track; the next tracks take the following PIDs, in init order.
pub const FIRST_ES_PID: u16 = 0x100;
/// Most tracks one init may carry into a TS program (the PMT must fit one packet, which also
/// refuses fewer tracks whose descriptors make it longer).
pub const MAX_TRACKS: usize = 16;
/// Most bytes of parameter sets (with their start codes) one track repeats before each keyframe.
/// Real SPS/PPS (and VPS) take tens to hundreds of bytes, a few KiB with an encoder's SEI in
/// `hvcC`; a larger set would be copied before every sync sample, so the init is refused.
pub const MAX_PARAMETER_SET_BYTES: usize = 64 << 10;
/// TS output may exceed its segment at most [`OUTPUT_PER_INPUT`] times plus this many bytes.
///
/// Real content stays far below: packetisation adds about 2% and one PES header per sample,
/// parameter sets come before keyframes that are larger than they are, and an ADTS header adds 7
/// bytes to an AAC frame. What the ratio does not cover is small audio frames: every sample costs
/// at least one 188-byte packet, and a silent AAC frame can be 4 to 6 bytes. This allowance is
/// 5,577 packets, two minutes of 48 kHz AAC, longer than any segment; a hostile segment of
/// one-byte samples (188 bytes out each) is still held to a few times its size.
pub const OUTPUT_ALLOWANCE: usize = 1 << 20;
/// See [`OUTPUT_ALLOWANCE`].
pub const OUTPUT_PER_INPUT: usize = 4;

/// Why a segment could not be remuxed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemuxError {
    #[error(transparent)]
    Mp4(#[from] Mp4Error),
    #[error("no 'moov' box in the init segment")]
    NoMoov,
    #[error("'{0}' box missing")]
    MissingBox(&'static str),
    #[error("track {track_id}: codec '{codec}' cannot be carried in MPEG-TS here")]
    UnsupportedCodec { track_id: u32, codec: String },
    #[error("track {track_id}: bad codec configuration: {why}")]
    BadConfig { track_id: u32, why: &'static str },
    #[error("the init segment has no track that MPEG-TS can carry")]
    NoTracks,
    #[error("the init segment has more tracks than one PMT can list (at most {MAX_TRACKS})")]
    TooManyTracks,
    /// More `trak` (or `trex`) boxes than the init's walk reads, carriable or not.
    #[error("the init segment has more than {max} '{0}' boxes", max = tracks::MAX_TRAK_BOXES)]
    TooManyBoxes(&'static str),
    #[error("track {track_id}: timescale 0")]
    ZeroTimescale { track_id: u32 },
    #[error("track {track_id}: sample at byte {offset} ({size} bytes) is outside the segment")]
    SampleOutside {
        track_id: u32,
        offset: u64,
        size: u64,
    },
    #[error("track {track_id}: {count} samples in a smaller segment")]
    TooManySamples { track_id: u32, count: u64 },
    /// The samples listed so far add up to more bytes than the segment holds, so some are
    /// listed twice (a data offset pointing back at bytes already used).
    #[error("track {track_id}: the sample at byte {offset} takes the samples past the segment's {segment} bytes")]
    SamplesPastSegment {
        track_id: u32,
        offset: u64,
        segment: u64,
    },
    #[error("a {input}-byte segment would make more than {limit} bytes of MPEG-TS")]
    OutputTooLarge { input: usize, limit: usize },
    #[error("track {track_id}: a NAL unit length runs past its sample")]
    BadNal { track_id: u32 },
    #[error("track {track_id}: a {size}-byte audio frame does not fit an ADTS header")]
    FrameTooLarge { track_id: u32, size: usize },
    #[error("track {track_id}: segment still encrypted (decrypt it first)")]
    Encrypted { track_id: u32 },
}

impl RemuxError {
    pub(crate) fn unsupported(track_id: u32, codec: FourCC) -> Self {
        RemuxError::UnsupportedCodec {
            track_id,
            codec: fourcc_str(codec),
        }
    }
}

/// What continues from one segment of a stream to the next: each PID's continuity counter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RemuxState {
    /// Next counter per PID, for PAT (0), PMT and each track, in that order.
    counters: Vec<(u16, u8)>,
}

impl RemuxState {
    /// The next counter of `pid`, advancing it.
    pub(crate) fn next(&mut self, pid: u16) -> u8 {
        match self.counters.iter_mut().find(|(p, _)| *p == pid) {
            Some((_, cc)) => {
                let now = *cc;
                *cc = (now + 1) & 0x0f;
                now
            }
            None => {
                self.counters.push((pid, 1));
                0
            }
        }
    }

    /// The counter the next packet of `pid` will carry.
    pub fn counter(&self, pid: u16) -> u8 {
        self.counters
            .iter()
            .find(|(p, _)| *p == pid)
            .map_or(0, |(_, cc)| *cc)
    }
}

/// A segment's place on its track's decode timeline; see [`Remuxer::span`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Span {
    pub start: i128,
    pub end: i128,
}

/// A parsed init segment, ready to remux its media segments.
#[derive(Debug, Clone)]
pub struct Remuxer {
    tracks: Vec<Track>,
}

impl Remuxer {
    /// Reads the tracks of a clear init segment (decrypt, i.e. `cenc::rewrite_init`, first).
    /// Tracks MPEG-TS cannot carry (subtitles, timed metadata) are left out; an init with none
    /// left is an error.
    pub fn new(init: &[u8]) -> Result<Self, RemuxError> {
        let tracks = tracks::read(init)?;
        if tracks.is_empty() {
            return Err(RemuxError::NoTracks);
        }
        if tracks.len() > MAX_TRACKS || !ts::pmt_fits(&tracks) {
            return Err(RemuxError::TooManyTracks);
        }
        Ok(Remuxer { tracks })
    }

    pub fn tracks(&self) -> &[Track] {
        &self.tracks
    }

    /// The PID of the track with index `i` in [`Remuxer::tracks`].
    pub fn pid(i: usize) -> u16 {
        FIRST_ES_PID + i as u16
    }

    /// The PID that carries the PCR: the first video track's, else the first track's.
    pub fn pcr_pid(&self) -> u16 {
        let i = self
            .tracks
            .iter()
            .position(|t| t.codec.is_video())
            .unwrap_or(0);
        Self::pid(i)
    }

    /// Where a segment sits on the timeline of the PCR track (decode times in that track's
    /// timescale): its first sample's decode time and the end of its last sample. One segment's
    /// `end` is the next one's `start`, which lets a caller find the [`RemuxState`] the previous
    /// segment of the same stream ended with. `None` when the segment has no sample of that track.
    pub fn span(&self, segment: &[u8]) -> Result<Option<Span>, RemuxError> {
        let pcr_track = usize::from(self.pcr_pid() - FIRST_ES_PID);
        let samples = samples::read(segment, &self.tracks)?;
        let mut ours = samples.iter().filter(|s| s.track == pcr_track);
        let Some(first) = ours.next() else {
            return Ok(None);
        };
        let last = ours.next_back().unwrap_or(first);
        Ok(Some(Span {
            start: first.dts,
            end: last.dts + i128::from(last.duration),
        }))
    }

    /// Remuxes one clear media segment into TS packets, continuing the counters in `state`.
    pub fn segment(&self, segment: &[u8], state: &mut RemuxState) -> Result<Vec<u8>, RemuxError> {
        let mut out = Vec::with_capacity(segment.len() + segment.len() / 16 + 2 * 188);
        self.segment_into(segment, state, &mut out)?;
        Ok(out)
    }

    /// Like [`Remuxer::segment`], appending to `out`. On error `state` is left as it was.
    pub fn segment_into(
        &self,
        segment: &[u8],
        state: &mut RemuxState,
        out: &mut Vec<u8>,
    ) -> Result<(), RemuxError> {
        let samples = samples::read(segment, &self.tracks)?;
        let mut next = state.clone();
        let start = out.len();
        let limit = output_limit(segment.len());
        ts::write_tables(self, &mut next, out);
        let pcr_pid = self.pcr_pid();
        let mut es = Vec::new();
        for sample in &samples {
            let track = &self.tracks[sample.track];
            let bytes = &segment[sample.offset..sample.offset + sample.size];
            es.clear();
            if let Err(e) = es::write(track, sample, bytes, &mut es) {
                out.truncate(start);
                return Err(e);
            }
            let pid = Self::pid(sample.track);
            let pes = ts::Pes {
                pid,
                stream_id: track.codec.stream_id(),
                pts: to_90k(sample.pts(), track.timescale),
                dts: to_90k(sample.dts, track.timescale),
                pcr: pid == pcr_pid,
                random_access: sample.sync && track.codec.is_video(),
                bounded: !track.codec.is_video(),
            };
            ts::write_pes(&pes, &es, &mut next, out);
            // Checked as it grows, so a refused segment never holds more than the limit and one
            // sample's packets.
            if out.len() - start > limit {
                out.truncate(start);
                return Err(RemuxError::OutputTooLarge {
                    input: segment.len(),
                    limit,
                });
            }
        }
        *state = next;
        Ok(())
    }
}

/// The most TS bytes a segment of `len` bytes may make: see [`OUTPUT_ALLOWANCE`].
pub(crate) fn output_limit(len: usize) -> usize {
    len.saturating_mul(OUTPUT_PER_INPUT)
        .saturating_add(OUTPUT_ALLOWANCE)
}

/// A track time converted to the 90 kHz clock, offset by [`TIMESTAMP_OFFSET`], wrapped to 33 bits.
fn to_90k(t: i128, timescale: u32) -> u64 {
    let scaled = t * i128::from(TS_CLOCK) / i128::from(timescale.max(1));
    ((scaled + i128::from(TIMESTAMP_OFFSET)) & 0x1_ffff_ffff) as u64
}

#[cfg(test)]
mod tests;
