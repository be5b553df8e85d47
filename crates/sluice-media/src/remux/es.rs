//! One sample as elementary-stream bytes: H.264/H.265 length-prefixed NAL units to Annex B (an
//! access unit delimiter first, parameter sets before each keyframe), AAC framed in ADTS, AC-3
//! and E-AC-3 as they are (their frames are self-delimiting). No I/O.

use super::{Codec, RemuxError, Sample, Track};

const START_CODE: [u8; 4] = [0, 0, 0, 1];
/// H.264 access unit delimiter, `primary_pic_type` 7 (any slice type).
const AUD_H264: [u8; 2] = [0x09, 0xf0];
/// H.265 access unit delimiter (type 35, layer 0, tid 1), `pic_type` 2 (any).
const AUD_H265: [u8; 3] = [0x46, 0x01, 0x50];
/// ADTS frames carry a 13-bit length, header included.
const ADTS_MAX: usize = 0x1fff;

/// Appends the elementary-stream form of `bytes` (the sample's data) to `out`.
pub(crate) fn write(
    track: &Track,
    sample: &Sample,
    bytes: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), RemuxError> {
    match &track.codec {
        Codec::H264 {
            nal_length_size,
            parameter_sets,
        } => annex_b(
            track,
            sample,
            bytes,
            *nal_length_size,
            parameter_sets,
            false,
            out,
        ),
        Codec::H265 {
            nal_length_size,
            parameter_sets,
        } => annex_b(
            track,
            sample,
            bytes,
            *nal_length_size,
            parameter_sets,
            true,
            out,
        ),
        Codec::Aac {
            profile,
            frequency_index,
            channel_config,
        } => {
            let len = bytes.len() + 7;
            if len > ADTS_MAX {
                return Err(RemuxError::FrameTooLarge {
                    track_id: track.track_id,
                    size: bytes.len(),
                });
            }
            out.extend_from_slice(&adts_header(
                *profile,
                *frequency_index,
                *channel_config,
                len,
            ));
            out.extend_from_slice(bytes);
            Ok(())
        }
        Codec::Ac3 | Codec::Eac3 => {
            out.extend_from_slice(bytes);
            Ok(())
        }
    }
}

/// The 7-byte ADTS header (MPEG-4, no CRC, one raw data block) for a frame of `len` bytes.
pub(crate) fn adts_header(
    profile: u8,
    frequency_index: u8,
    channel_config: u8,
    len: usize,
) -> [u8; 7] {
    let len = len as u32;
    [
        0xff,
        0xf1,
        (profile << 6) | ((frequency_index & 0x0f) << 2) | ((channel_config >> 2) & 0x01),
        ((channel_config & 0x03) << 6) | ((len >> 11) & 0x03) as u8,
        ((len >> 3) & 0xff) as u8,
        (((len & 0x07) << 5) as u8) | 0x1f,
        0xfc,
    ]
}

/// NAL unit type of the first header byte.
fn nal_type(first: u8, hevc: bool) -> u8 {
    if hevc {
        (first >> 1) & 0x3f
    } else {
        first & 0x1f
    }
}

fn is_aud(t: u8, hevc: bool) -> bool {
    t == if hevc { 35 } else { 9 }
}

/// Key pictures by NAL type: IDR for H.264, IRAP (BLA, IDR, CRA) for H.265.
fn is_key(t: u8, hevc: bool) -> bool {
    if hevc {
        (16..=23).contains(&t)
    } else {
        t == 5
    }
}

fn annex_b(
    track: &Track,
    sample: &Sample,
    bytes: &[u8],
    length_size: u8,
    parameter_sets: &[Vec<u8>],
    hevc: bool,
    out: &mut Vec<u8>,
) -> Result<(), RemuxError> {
    // Walked twice rather than collected: a list of one-byte NAL units costs 16 bytes each,
    // eight times a sample made of them. The first walk checks every length and finds keys.
    let length_size = usize::from(length_size);
    let mut key = sample.sync;
    for nal in split_nals(bytes, length_size) {
        let nal = nal.map_err(|()| RemuxError::BadNal {
            track_id: track.track_id,
        })?;
        key |= is_key(nal_type(nal[0], hevc), hevc);
    }
    out.extend_from_slice(&START_CODE);
    out.extend_from_slice(if hevc { &AUD_H265 } else { &AUD_H264 });
    // A keyframe must be decodable on its own: a player tuning in or seeking starts here.
    if key {
        for set in parameter_sets {
            out.extend_from_slice(&START_CODE);
            out.extend_from_slice(set);
        }
    }
    // Every length was checked above, so the second walk meets no error.
    for nal in split_nals(bytes, length_size).flatten() {
        let t = nal_type(nal[0], hevc);
        // The sample's own delimiter would make two. Its own parameter sets are kept: they come
        // after the init's, so in-band updates still win.
        if is_aud(t, hevc) {
            continue;
        }
        out.extend_from_slice(&START_CODE);
        out.extend_from_slice(nal);
    }
    Ok(())
}

/// The NAL units of a length-prefixed sample; empty units are skipped, a length past the end is
/// an error.
fn split_nals(bytes: &[u8], length_size: usize) -> impl Iterator<Item = Result<&[u8], ()>> {
    let mut rest = bytes;
    std::iter::from_fn(move || loop {
        if rest.is_empty() {
            return None;
        }
        if rest.len() < length_size {
            rest = &[];
            return Some(Err(()));
        }
        let (len, tail) = rest.split_at(length_size);
        let len = len
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        if len > tail.len() {
            rest = &[];
            return Some(Err(()));
        }
        let (nal, tail) = tail.split_at(len);
        rest = tail;
        if !nal.is_empty() {
            return Some(Ok(nal));
        }
    })
}
