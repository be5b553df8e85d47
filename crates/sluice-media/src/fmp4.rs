//! MPEG-TS media segments rewritten as fragmented MP4: an init segment and one `moof`/`mdat`
//! per segment, for HLS players that want fMP4. No I/O.
//!
//! [`Writer::segment`] takes one TS segment as the segmenter cut it (PAT, PMT, then the
//! streams) and returns one movie fragment holding the program's first H.264 stream and its
//! first AAC stream: H.264 access units with their Annex B start codes turned into 4-byte
//! lengths (delimiters dropped, parameter sets kept in band), AAC frames without their ADTS
//! headers. Timestamps are the TS ones: video on the 90 kHz clock (decoding times in `tfdt` and
//! the sample durations, presentation times as composition offsets), audio on its sampling
//! rate; the 33-bit TS clock is unwrapped, so a channel that runs for days keeps counting up.
//! Other streams (MPEG-2 or H.265 video, MPEG-1 audio, AC-3, subtitles) are left out.
//!
//! The init segment (`ftyp` and `moov`, with `avcC` from the stream's SPS and PPS and `esds`
//! from its ADTS headers) is rebuilt from what each segment carries and numbered: the number
//! changes only when the bytes do (new PIDs, a new SPS), which is where a playlist needs a new
//! `EXT-X-MAP`.
//!
//! The writer carries what a segment ends with unfinished (an audio PES or ADTS frame that the
//! segment boundary cut) into the next one, so each frame lands in exactly one fragment;
//! [`Writer::reset`] (a discontinuity) drops it.
//!
//! # Layout
//! - `demux`: TS packets to PES packets per stream, with what a segment leaves unfinished.
//! - `h264`: Annex B to length-prefixed NAL units, the SPS fields an `avc1` entry needs.
//! - `aac`: ADTS frames, the AudioSpecificConfig they describe.
//! - `boxes`: the init segment and the `moof`/`mdat` pair.

mod aac;
mod boxes;
mod demux;
mod h264;

use bytes::Bytes;

use crate::segmenter::CLOCK;

/// TS timestamps wrap at 2^33.
const WRAP: u64 = 1 << 33;
/// A video sample lasting longer than this (a hole, a bad stamp) is shortened to the one before.
const MAX_SAMPLE: u64 = 10 * CLOCK;

/// Why a segment has no fMP4 form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Fmp4Error {
    #[error("no PAT and PMT in the segment")]
    NoProgram,
    #[error("the program has no H.264 or AAC stream")]
    NoTracks,
    #[error("no H.264 parameter sets or AAC header seen yet, so no init segment")]
    NoConfig,
    #[error("the segment holds no complete picture or audio frame")]
    NoSamples,
}

/// One segment as fMP4.
#[derive(Debug, Clone)]
pub struct Fragment {
    /// `moof` and `mdat`.
    pub media: Bytes,
    /// The init segment it needs, and that init's number (the same bytes keep their number).
    pub init: Bytes,
    pub init_id: u64,
}

/// What a track is, as the init segment describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Config {
    Avc(h264::AvcConfig),
    Aac(aac::AacConfig),
}

/// One sample of a fragment: its place in the track's data and its timing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    pub size: u32,
    /// In the track's timescale.
    pub duration: u32,
    /// Presentation minus decoding time, in the track's timescale.
    pub composition: i32,
    pub sync: bool,
}

/// A track of one fragment: its samples back to back in `data`.
#[derive(Debug, Clone)]
pub(crate) struct Run {
    pub track_id: u32,
    pub config: Config,
    /// Decoding time of the first sample, in the track's timescale.
    pub start: u64,
    pub samples: Vec<Sample>,
    pub data: Vec<u8>,
}

impl Config {
    pub(crate) fn timescale(&self) -> u32 {
        match self {
            Config::Avc(_) => CLOCK as u32,
            Config::Aac(a) => a.rate,
        }
    }
}

/// The per-channel TS to fMP4 writer: feed it the channel's segments in order.
#[derive(Debug, Default)]
pub struct Writer {
    demux: demux::Demuxer,
    /// An ADTS frame the last segment ended in the middle of.
    carry: aac::Carry,
    /// The last configuration of each track (a segment without an SPS keeps the last one).
    video: Option<h264::AvcConfig>,
    audio: Option<aac::AacConfig>,
    /// The TS clock unwrapped: the first decoding time of the last segment.
    last: Option<u64>,
    /// The current init segment and its number.
    init: Option<(Bytes, u64)>,
    inits: u64,
}

impl Writer {
    pub fn new() -> Writer {
        Writer::default()
    }

    /// The next segment does not follow on from the last one (a discontinuity): what the last
    /// one left unfinished is dropped, and the clock may start anywhere.
    pub fn reset(&mut self) {
        self.demux.reset();
        self.carry.clear();
        self.last = None;
    }

    /// Rewrites one TS segment as movie fragment number `sequence`. `end` is where the next
    /// segment begins (a 90 kHz decoding time), which gives the last picture its duration;
    /// without it the last picture lasts as long as the one before.
    pub fn segment(
        &mut self,
        ts: &[u8],
        sequence: u32,
        end: Option<u64>,
    ) -> Result<Fragment, Fmp4Error> {
        let streams = self.demux.segment(ts)?;
        let mut runs = Vec::with_capacity(2);
        let mut track_id = 1;
        let layout_changed = streams.layout_changed;
        if layout_changed {
            self.video = None;
            self.audio = None;
            self.carry.clear();
        }
        if let Some(video) = &streams.video {
            let (data, pictures, config) = h264::samples(video);
            if config.is_some() {
                self.video = config;
            }
            if let (Some(config), false) = (&self.video, pictures.is_empty()) {
                let start = self.unwrap(pictures[0].dts);
                self.last = Some(start);
                let samples = video_samples(&pictures, end);
                runs.push(Run {
                    track_id,
                    config: Config::Avc(config.clone()),
                    start,
                    samples,
                    data,
                });
            }
            track_id += 1;
        }
        if let Some(audio) = &streams.audio {
            let (data, frames, config, first_pts) = aac::samples(audio, &mut self.carry);
            if config.is_some() {
                self.audio = config;
            }
            if let (Some(config), Some(pts)) = (&self.audio, first_pts) {
                let rate = u64::from(config.rate);
                let at = self.unwrap(pts);
                if runs.is_empty() {
                    // No video: the audio keeps the clock.
                    self.last = Some(at);
                }
                let start = at * rate / CLOCK;
                let samples = frames
                    .iter()
                    .map(|&size| Sample {
                        size,
                        duration: aac::FRAME_SAMPLES,
                        composition: 0,
                        sync: true,
                    })
                    .collect();
                runs.push(Run {
                    track_id,
                    config: Config::Aac(*config),
                    start,
                    samples,
                    data,
                });
            }
        }
        if streams.video.is_none() && streams.audio.is_none() {
            return Err(Fmp4Error::NoTracks);
        }
        if runs.is_empty() {
            return Err(if self.video.is_none() && self.audio.is_none() {
                Fmp4Error::NoConfig
            } else {
                Fmp4Error::NoSamples
            });
        }
        // The init describes every track the program has a configuration for.
        let mut configs = Vec::with_capacity(2);
        if streams.video.is_some() {
            if let Some(v) = &self.video {
                configs.push((1, Config::Avc(v.clone())));
            }
        }
        if streams.audio.is_some() {
            if let Some(a) = &self.audio {
                let id = if streams.video.is_some() { 2 } else { 1 };
                configs.push((id, Config::Aac(*a)));
            }
        }
        let init = boxes::init(&configs);
        let (init, init_id) = match &self.init {
            Some((bytes, id)) if bytes[..] == init[..] => (bytes.clone(), *id),
            _ => {
                self.inits += 1;
                let bytes = Bytes::from(init);
                self.init = Some((bytes.clone(), self.inits));
                (bytes, self.inits)
            }
        };
        Ok(Fragment {
            media: Bytes::from(boxes::fragment(sequence, &runs)),
            init,
            init_id,
        })
    }

    /// A 33-bit time on the unwrapped clock: the nearest to the last one seen (within half
    /// the range either way), so the 26.5-hour wrap of the TS clock counts on. After a reset
    /// the clock starts again from the stamp itself.
    fn unwrap(&self, stamp: u64) -> u64 {
        let stamp = stamp & (WRAP - 1);
        let Some(last) = self.last else {
            return stamp;
        };
        let ahead = stamp.wrapping_sub(last) & (WRAP - 1);
        if ahead < WRAP / 2 {
            last + ahead
        } else {
            last.saturating_sub(WRAP - ahead)
        }
    }
}

/// Durations and composition offsets of a run of pictures (90 kHz, wrapping stamps).
fn video_samples(pictures: &[h264::Picture], end: Option<u64>) -> Vec<Sample> {
    let mut out: Vec<Sample> = Vec::with_capacity(pictures.len());
    let mut last_duration = CLOCK / 25;
    for (i, p) in pictures.iter().enumerate() {
        let next = pictures.get(i + 1).map(|n| n.dts).or(end);
        let step = next.map(|n| n.wrapping_sub(p.dts) & (WRAP - 1));
        let duration = match step {
            Some(d) if d > 0 && d <= MAX_SAMPLE => d,
            _ => last_duration,
        };
        last_duration = duration;
        let offset = p.pts.wrapping_sub(p.dts) & (WRAP - 1);
        // Within ±2^31 ticks (6.6 hours); anything else is a bad stamp.
        let composition = if offset >= WRAP / 2 {
            i32::try_from(offset as i64 - WRAP as i64).unwrap_or(0)
        } else {
            i32::try_from(offset).unwrap_or(0)
        };
        out.push(Sample {
            size: p.size,
            duration: duration as u32,
            composition,
            sync: p.sync,
        });
    }
    out
}

#[cfg(test)]
mod tests;
