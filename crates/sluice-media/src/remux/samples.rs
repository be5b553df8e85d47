//! Every sample of a media segment: track, bytes, decode time, composition offset, sync flag.
//! No I/O; samples are located, never copied.

use super::{output_limit, RemuxError, Track};
use crate::mp4::{boxes, Mp4Box, Tfdt, Tfhd, Trun};
use crate::mpegts::PACKET_LEN;

/// `sample_is_non_sync_sample` in the ISO-BMFF sample flags.
const NON_SYNC: u32 = 0x0001_0000;

/// One sample of one track, located in the segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Index into the remuxer's tracks.
    pub track: usize,
    pub offset: usize,
    pub size: usize,
    /// Decode time in the track's timescale.
    pub dts: i128,
    /// Composition offset in the track's timescale.
    pub composition_offset: i64,
    pub sync: bool,
    /// Decode duration in the track's timescale.
    pub duration: u32,
}

impl Sample {
    /// Presentation time in the track's timescale.
    pub fn pts(&self) -> i128 {
        self.dts + i128::from(self.composition_offset)
    }
}

/// Every sample of every known track, in the order the segment stores them (tracks of other
/// handlers are skipped). Each `traf` without `tfdt` continues from the previous fragment's end.
pub(crate) fn read(segment: &[u8], tracks: &[Track]) -> Result<Vec<Sample>, RemuxError> {
    let mut samples = Vec::new();
    // Decode time reached per track, for fragments that carry no `tfdt`.
    let mut next_dts: Vec<i128> = vec![0; tracks.len()];
    // Samples of one track never overlap, nor do two tracks' samples, and all lie in the segment:
    // their sizes add up to at most its length, and (empty samples aside, which real files do
    // not repeat by the million) so does their count. Counted across every `trun`, `traf` and
    // `moof`: per `trun`, a data offset pointing back at the same bytes lists them again and
    // again, K runs making K times the samples.
    let limit = output_limit(segment.len());
    let mut budget = Budget {
        segment: segment.len() as u64,
        samples: 0,
        bytes: 0,
        listed: 0,
        output_limit: limit,
        max_listed: (limit / PACKET_LEN) as u64,
    };
    for top in boxes(segment) {
        let top = top?;
        if top.kind != *b"moof" {
            continue;
        }
        for traf in top.children() {
            let traf = traf?;
            if traf.kind == *b"traf" {
                let at = (&top, &traf);
                read_traf(at, tracks, &mut next_dts, &mut budget, &mut samples)?;
            }
        }
    }
    Ok(samples)
}

/// Samples (and their bytes) listed so far in one segment.
struct Budget {
    segment: u64,
    samples: u64,
    bytes: u64,
    /// Samples with bytes, the ones kept in the list.
    listed: u64,
    output_limit: usize,
    /// Every listed sample becomes a PES of at least one TS packet, so past this many the
    /// output is sure to pass `output_limit`.
    max_listed: u64,
}

fn read_traf(
    (moof, traf): (&Mp4Box<'_>, &Mp4Box<'_>),
    tracks: &[Track],
    next_dts: &mut [i128],
    budget: &mut Budget,
    out: &mut Vec<Sample>,
) -> Result<(), RemuxError> {
    let tfhd = traf.child(b"tfhd")?.ok_or(RemuxError::MissingBox("tfhd"))?;
    let tfhd = Tfhd::parse(&tfhd)?;
    let Some(index) = tracks.iter().position(|t| t.track_id == tfhd.track_id) else {
        return Ok(());
    };
    let track = &tracks[index];
    let trex = track.trex.unwrap_or_default();
    if let Some(tfdt) = traf.child(b"tfdt")? {
        next_dts[index] = i128::from(Tfdt::parse(&tfdt)?.base_media_decode_time);
    }
    // Offsets count from `base_data_offset` when given, else from the `moof` (the only base
    // fragmented files use in practice, and the one `default-base-is-moof` names).
    let base = tfhd.base_data_offset.unwrap_or(moof.offset as u64);
    let mut data_at = base;
    for trun in traf.children() {
        let trun = trun?;
        if trun.kind != *b"trun" {
            continue;
        }
        let trun = Trun::parse(&trun)?;
        // A run whose samples carry no fields costs no bytes per sample; without this bound a
        // hostile count would make billions of them.
        budget.samples += u64::from(trun.sample_count);
        if budget.samples > budget.segment {
            return Err(RemuxError::TooManySamples {
                track_id: track.track_id,
                count: budget.samples,
            });
        }
        if let Some(offset) = trun.data_offset {
            // A hostile `base_data_offset` sits anywhere in 64 bits: a sum past either end is
            // no place in the segment, where a wrap (`u64::MAX` + 1) would read from byte 0.
            data_at = base
                .checked_add_signed(offset.into())
                .ok_or(RemuxError::SampleOutside {
                    track_id: track.track_id,
                    offset: base,
                    size: 0,
                })?;
        }
        for s in trun.samples() {
            let size = s
                .size
                .or(tfhd.default_sample_size)
                .unwrap_or(trex.default_sample_size);
            let duration = s
                .duration
                .or(tfhd.default_sample_duration)
                .unwrap_or(trex.default_sample_duration);
            let flags = s
                .flags
                .or(tfhd.default_sample_flags)
                .unwrap_or(trex.default_sample_flags);
            let end = data_at.checked_add(size.into());
            let inside = end.is_some_and(|e| e <= budget.segment);
            if !inside {
                return Err(RemuxError::SampleOutside {
                    track_id: track.track_id,
                    offset: data_at,
                    size: size.into(),
                });
            }
            budget.bytes += u64::from(size);
            if budget.bytes > budget.segment {
                return Err(RemuxError::SamplesPastSegment {
                    track_id: track.track_id,
                    offset: data_at,
                    segment: budget.segment,
                });
            }
            // An empty sample has nothing to present; it still advances the clock.
            if size > 0 {
                // Refused here, not once the output passes its limit: a list of one-byte samples
                // (64 bytes each) would first grow to 64 times the segment's size.
                budget.listed += 1;
                if budget.listed > budget.max_listed {
                    return Err(RemuxError::OutputTooLarge {
                        input: budget.segment as usize,
                        limit: budget.output_limit,
                    });
                }
                out.push(Sample {
                    track: index,
                    offset: data_at as usize,
                    size: size as usize,
                    dts: next_dts[index],
                    composition_offset: s.composition_offset.unwrap_or(0),
                    sync: flags & NON_SYNC == 0,
                    duration,
                });
            }
            data_at += u64::from(size);
            next_dts[index] += i128::from(duration);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mp4::tests::bx;
    use crate::remux::Codec;

    /// A `moof` of track 1 with an absolute `base`, one 8-byte sample at data offset
    /// `offset`, then a 16-byte `mdat`.
    fn segment(base: u64, offset: i32) -> Vec<u8> {
        let mut tfhd = Tfhd::BASE_DATA_OFFSET.to_be_bytes().to_vec();
        tfhd.extend_from_slice(&1u32.to_be_bytes());
        tfhd.extend_from_slice(&base.to_be_bytes());
        // Flags: data offset and per-sample sizes.
        let mut trun = 0x201u32.to_be_bytes().to_vec();
        trun.extend_from_slice(&1u32.to_be_bytes());
        trun.extend_from_slice(&offset.to_be_bytes());
        trun.extend_from_slice(&8u32.to_be_bytes());
        let traf = bx(b"traf", &[bx(b"tfhd", &tfhd), bx(b"trun", &trun)].concat());
        [bx(b"moof", &traf), bx(b"mdat", &[0x11; 16])].concat()
    }

    fn tracks() -> Vec<Track> {
        vec![Track {
            track_id: 1,
            timescale: 1000,
            trex: None,
            codec: Codec::Ac3,
        }]
    }

    #[test]
    fn a_data_offset_past_either_end_of_64_bits_is_an_error() {
        let mdat = segment(0, 0).len() - 16;
        let read_at = |base, offset| read(&segment(base, offset), &tracks());
        assert_eq!(read_at(mdat as u64 - 4, 4).unwrap()[0].offset, mdat);
        // `u64::MAX` + 1 wrapped to byte 0, inside the segment: its first 8 bytes were a sample.
        assert_eq!(
            read_at(u64::MAX, 1),
            Err(RemuxError::SampleOutside {
                track_id: 1,
                offset: u64::MAX,
                size: 0,
            })
        );
        assert_eq!(
            read_at(3, -4),
            Err(RemuxError::SampleOutside {
                track_id: 1,
                offset: 3,
                size: 0,
            })
        );
    }
}
