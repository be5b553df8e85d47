//! H.264 access units from Annex B (start codes) to ISO-BMFF samples (4-byte lengths), and
//! the SPS fields an `avc1` sample entry and its `avcC` need. No I/O.

use super::demux::Pes;

/// NAL unit types.
const SPS: u8 = 7;
const PPS: u8 = 8;
const AUD: u8 = 9;
const IDR: u8 = 5;

/// Distinct parameter sets kept for the `avcC` (real streams have one or two).
const MAX_SETS: usize = 8;

/// What the init segment says about an H.264 track.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AvcConfig {
    /// SPS and PPS NAL units, without start codes.
    pub sps: Vec<Vec<u8>>,
    pub pps: Vec<Vec<u8>>,
    pub width: u16,
    pub height: u16,
    /// `chroma_format_idc` and the bit depths (minus 8), for the High profiles' `avcC` tail.
    pub chroma: Option<(u8, u8, u8)>,
}

/// One access unit: where its sample bytes are and its timing (90 kHz, as stamped).
#[derive(Debug, Clone, Copy)]
pub(super) struct Picture {
    pub dts: u64,
    pub pts: u64,
    pub size: u32,
    pub sync: bool,
}

/// The pictures of a segment's video PES packets as samples (back to back in the returned
/// bytes), and the configuration its parameter sets give (`None` without an SPS and a PPS).
pub(super) fn samples(pes: &[Pes]) -> (Vec<u8>, Vec<Picture>, Option<AvcConfig>) {
    let total: usize = pes.iter().map(|p| p.es.len()).sum();
    let mut data = Vec::with_capacity(total + total / 64);
    let mut pictures: Vec<Picture> = Vec::with_capacity(pes.len());
    let (mut sps, mut pps) = (Vec::new(), Vec::new());
    for p in pes {
        let from = data.len();
        let mut sync = false;
        for nal in nal_units(&p.es) {
            let kind = nal[0] & 0x1f;
            match kind {
                AUD => continue,
                // The avcC copies profile, compatibility and level from the SPS's first bytes.
                SPS if nal.len() >= 4 => remember(&mut sps, nal),
                PPS => remember(&mut pps, nal),
                IDR => sync = true,
                _ => {}
            }
            data.extend_from_slice(&(nal.len() as u32).to_be_bytes());
            data.extend_from_slice(nal);
        }
        let size = (data.len() - from) as u32;
        match (p.dts, p.pts, pictures.last_mut()) {
            (Some(dts), Some(pts), _) if size > 0 => pictures.push(Picture {
                dts,
                pts,
                size,
                sync,
            }),
            // A PES without a timestamp continues the picture before it.
            (None, _, Some(last)) => {
                last.size += size;
                last.sync |= sync;
            }
            _ => data.truncate(from),
        }
    }
    let config = match (sps.first(), pps.is_empty()) {
        (Some(first), false) => {
            let fields = parse_sps(first);
            Some(AvcConfig {
                width: fields.map_or(0, |f| f.width),
                height: fields.map_or(0, |f| f.height),
                chroma: fields.and_then(|f| f.chroma),
                sps,
                pps,
            })
        }
        _ => None,
    };
    (data, pictures, config)
}

fn remember(sets: &mut Vec<Vec<u8>>, nal: &[u8]) {
    if sets.len() < MAX_SETS && nal.len() <= usize::from(u16::MAX) && !sets.iter().any(|s| s == nal)
    {
        sets.push(nal.to_vec());
    }
}

/// The NAL units of an Annex B byte stream, without start codes or trailing zero bytes.
pub(super) fn nal_units(es: &[u8]) -> impl Iterator<Item = &[u8]> {
    let finder = memchr::memmem::Finder::new(&[0, 0, 1]);
    let mut at = finder.find(es).map(|i| i + 3);
    std::iter::from_fn(move || loop {
        let start = at?;
        let rest = &es[start..];
        let (unit, next) = match finder.find(rest) {
            Some(i) => (&rest[..i], Some(start + i + 3)),
            None => (rest, None),
        };
        at = next;
        let end = unit.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        if end > 0 {
            return Some(&unit[..end]);
        }
    })
}

/// What an SPS says that the sample entry repeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SpsFields {
    pub width: u16,
    pub height: u16,
    pub chroma: Option<(u8, u8, u8)>,
}

/// Profiles whose SPS carries `chroma_format_idc` and bit depths.
fn high_profile(profile: u8) -> bool {
    matches!(
        profile,
        100 | 110 | 122 | 244 | 44 | 83 | 86 | 118 | 128 | 138 | 139 | 134 | 135
    )
}

/// Reads an SPS (ITU-T H.264 §7.3.2.1.1) as far as the frame size; `None` when it is cut short
/// or out of range.
pub(super) fn parse_sps(nal: &[u8]) -> Option<SpsFields> {
    let rbsp = unescape(nal.get(1..)?);
    let mut b = Bits::new(&rbsp);
    let profile = b.bits(8)? as u8;
    b.bits(16)?; // constraint flags, level
    b.ue()?; // seq_parameter_set_id
    let mut chroma_format = 1;
    let mut separate_planes = false;
    let mut chroma = None;
    if high_profile(profile) {
        chroma_format = b.ue()?;
        if chroma_format > 3 {
            return None;
        }
        if chroma_format == 3 {
            separate_planes = b.bit()?;
        }
        let luma = b.ue()?;
        let chroma_depth = b.ue()?;
        if luma > 6 || chroma_depth > 6 {
            return None;
        }
        chroma = Some((chroma_format as u8, luma as u8, chroma_depth as u8));
        b.bit()?; // qpprime_y_zero_transform_bypass_flag
        if b.bit()? {
            let lists = if chroma_format == 3 { 12 } else { 8 };
            for i in 0..lists {
                if b.bit()? {
                    skip_scaling_list(&mut b, if i < 6 { 16 } else { 64 })?;
                }
            }
        }
    }
    b.ue()?; // log2_max_frame_num_minus4
    match b.ue()? {
        0 => {
            b.ue()?;
        }
        1 => {
            b.bit()?;
            b.se()?;
            b.se()?;
            let cycle = b.ue()?;
            if cycle > 255 {
                return None;
            }
            for _ in 0..cycle {
                b.se()?;
            }
        }
        2 => {}
        _ => return None,
    }
    b.ue()?; // max_num_ref_frames
    b.bit()?; // gaps_in_frame_num_value_allowed_flag
    let width_mbs = u64::from(b.ue()?) + 1;
    let height_units = u64::from(b.ue()?) + 1;
    let frame_mbs_only = b.bit()?;
    if !frame_mbs_only {
        b.bit()?; // mb_adaptive_frame_field_flag
    }
    b.bit()?; // direct_8x8_inference_flag
    let fields = if frame_mbs_only { 1 } else { 2 };
    let (mut crop_x, mut crop_y) = (0, 0);
    if b.bit()? {
        let (left, right, top, bottom) = (b.ue()?, b.ue()?, b.ue()?, b.ue()?);
        let array_type = if separate_planes { 0 } else { chroma_format };
        let (unit_x, unit_y) = match array_type {
            1 => (2, 2 * fields),
            2 => (2, fields),
            _ => (1, fields),
        };
        crop_x = unit_x * (u64::from(left) + u64::from(right));
        crop_y = unit_y * (u64::from(top) + u64::from(bottom));
    }
    let width = (width_mbs * 16).checked_sub(crop_x)?;
    let height = (fields * height_units * 16).checked_sub(crop_y)?;
    Some(SpsFields {
        width: u16::try_from(width).ok()?,
        height: u16::try_from(height).ok()?,
        chroma,
    })
}

fn skip_scaling_list(b: &mut Bits<'_>, size: usize) -> Option<()> {
    let (mut last, mut next) = (8i64, 8i64);
    for _ in 0..size {
        if next != 0 {
            next = (last + i64::from(b.se()?) + 256).rem_euclid(256);
        }
        if next != 0 {
            last = next;
        }
    }
    Some(())
}

/// The NAL payload without emulation-prevention bytes (`00 00 03` → `00 00`).
fn unescape(nal: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(nal.len());
    let mut zeros = 0;
    for &byte in nal {
        if zeros >= 2 && byte == 3 {
            zeros = 0;
            continue;
        }
        zeros = if byte == 0 { zeros + 1 } else { 0 };
        out.push(byte);
    }
    out
}

/// MSB-first bit reader with Exp-Golomb codes.
struct Bits<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Bits<'a> {
    fn new(data: &'a [u8]) -> Self {
        Bits { data, pos: 0 }
    }

    fn bit(&mut self) -> Option<bool> {
        let byte = *self.data.get(self.pos / 8)?;
        let bit = (byte >> (7 - self.pos % 8)) & 1;
        self.pos += 1;
        Some(bit == 1)
    }

    fn bits(&mut self, n: u32) -> Option<u32> {
        let mut v = 0;
        for _ in 0..n {
            v = (v << 1) | u32::from(self.bit()?);
        }
        Some(v)
    }

    fn ue(&mut self) -> Option<u32> {
        let mut zeros = 0;
        while !self.bit()? {
            zeros += 1;
            if zeros > 31 {
                return None;
            }
        }
        let rest = self.bits(zeros)?;
        Some(((1u64 << zeros) - 1 + u64::from(rest)).min(u64::from(u32::MAX)) as u32)
    }

    fn se(&mut self) -> Option<i32> {
        let k = i64::from(self.ue()?);
        let v = if k % 2 == 1 { (k + 1) / 2 } else { -(k / 2) };
        i32::try_from(v).ok()
    }
}
