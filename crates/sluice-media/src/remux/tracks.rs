//! The tracks of a clear init segment as the remuxer needs them: id, timescale, fragment
//! defaults and codec configuration (`avcC`, `hvcC`, `esds`, `dac3`/`dec3`). No I/O.

use super::{RemuxError, MAX_PARAMETER_SET_BYTES};

/// Each parameter set is written after an Annex B start code.
const START_CODE_LEN: usize = 4;
/// Most `trak` (and `trex`) boxes read from an init, carriable or not, as in `cenc`. The PMT
/// limit ([`super::MAX_TRACKS`]) is checked only on the tracks kept, after the walk; this cap
/// stops the walk (and its `trex` lookup per track) before a hostile init of thousands of tiny
/// tracks makes it quadratic.
pub(crate) const MAX_TRAK_BOXES: usize = 64;
use crate::mp4::{boxes, find, FourCC, Hdlr, Mp4Box, Reader, SampleEntry, Stsd, Tkhd, Trex};

/// One track of the init segment that MPEG-TS can carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Track {
    pub track_id: u32,
    /// Ticks per second of the track's media time (`mdhd`).
    pub timescale: u32,
    pub trex: Option<Trex>,
    pub codec: Codec,
}

/// A codec and what the TS output needs from its configuration record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Codec {
    /// H.264; `parameter_sets` are SPS then PPS NAL units (no start codes).
    H264 {
        nal_length_size: u8,
        parameter_sets: Vec<Vec<u8>>,
    },
    /// H.265; `parameter_sets` are VPS, SPS then PPS NAL units (no start codes).
    H265 {
        nal_length_size: u8,
        parameter_sets: Vec<Vec<u8>>,
    },
    /// AAC: the ADTS header fields from the AudioSpecificConfig.
    Aac {
        /// ADTS profile: audio object type minus one (0 Main, 1 LC, 2 SSR, 3 LTP).
        profile: u8,
        frequency_index: u8,
        channel_config: u8,
    },
    Ac3,
    Eac3,
}

impl Codec {
    pub fn is_video(&self) -> bool {
        matches!(self, Codec::H264 { .. } | Codec::H265 { .. })
    }

    /// PMT `stream_type`.
    pub fn stream_type(&self) -> u8 {
        match self {
            Codec::H264 { .. } => 0x1b,
            Codec::H265 { .. } => 0x24,
            Codec::Aac { .. } => 0x0f,
            // ATSC A/52 assignments; the registration descriptor names them for DVB readers.
            Codec::Ac3 => 0x81,
            Codec::Eac3 => 0x87,
        }
    }

    /// PES `stream_id`.
    pub fn stream_id(&self) -> u8 {
        match self {
            Codec::H264 { .. } | Codec::H265 { .. } => 0xe0,
            Codec::Aac { .. } => 0xc0,
            Codec::Ac3 | Codec::Eac3 => 0xbd,
        }
    }

    /// Format identifier for the PMT registration descriptor, where one is customary.
    pub fn registration(&self) -> Option<&'static [u8; 4]> {
        match self {
            Codec::H265 { .. } => Some(b"HEVC"),
            Codec::Ac3 => Some(b"AC-3"),
            Codec::Eac3 => Some(b"EAC3"),
            _ => None,
        }
    }
}

/// Reads every carriable track of the init's `moov`.
pub(crate) fn read(init: &[u8]) -> Result<Vec<Track>, RemuxError> {
    let moov = find(boxes(init), b"moov")?.ok_or(RemuxError::NoMoov)?;
    let mut trexes = Vec::new();
    if let Some(mvex) = moov.child(b"mvex")? {
        for b in mvex.children() {
            let b = b?;
            if b.kind == *b"trex" {
                if trexes.len() >= MAX_TRAK_BOXES {
                    return Err(RemuxError::TooManyBoxes("trex"));
                }
                trexes.push(Trex::parse(&b)?);
            }
        }
    }
    let mut tracks = Vec::new();
    let mut traks = 0usize;
    for trak in moov.children() {
        let trak = trak?;
        if trak.kind != *b"trak" {
            continue;
        }
        traks += 1;
        if traks > MAX_TRAK_BOXES {
            return Err(RemuxError::TooManyBoxes("trak"));
        }
        if let Some(mut track) = read_track(&trak)? {
            track.trex = trexes
                .iter()
                .find(|t| t.track_id == track.track_id)
                .copied();
            tracks.push(track);
        }
    }
    Ok(tracks)
}

fn read_track(trak: &Mp4Box<'_>) -> Result<Option<Track>, RemuxError> {
    let tkhd = trak.child(b"tkhd")?.ok_or(RemuxError::MissingBox("tkhd"))?;
    let track_id = Tkhd::parse(&tkhd)?.track_id;
    let mdia = trak.child(b"mdia")?.ok_or(RemuxError::MissingBox("mdia"))?;
    let handler = match mdia.child(b"hdlr")? {
        Some(h) => Hdlr::parse(&h)?.handler_type,
        None => return Err(RemuxError::MissingBox("hdlr")),
    };
    if handler != *b"vide" && handler != *b"soun" {
        return Ok(None);
    }
    let mdhd = mdia.child(b"mdhd")?.ok_or(RemuxError::MissingBox("mdhd"))?;
    let timescale = mdhd_timescale(&mdhd)?;
    if timescale == 0 {
        return Err(RemuxError::ZeroTimescale { track_id });
    }
    let stsd =
        descend(&mdia, &[b"minf", b"stbl", b"stsd"])?.ok_or(RemuxError::MissingBox("stsd"))?;
    let entry = Stsd::parse(&stsd)?
        .entries
        .next()
        .ok_or(RemuxError::MissingBox("sample entry"))??;
    let entry = SampleEntry::parse(&entry, handler)?;
    let codec = read_codec(track_id, &entry)?;
    Ok(Some(Track {
        track_id,
        timescale,
        trex: None,
        codec,
    }))
}

fn mdhd_timescale(mdhd: &Mp4Box<'_>) -> Result<u32, RemuxError> {
    let mut r = mdhd.reader();
    let (version, _) = r.full_box()?;
    r.skip(if version == 1 { 16 } else { 8 })?;
    Ok(r.u32()?)
}

fn descend<'a>(from: &Mp4Box<'a>, path: &[&FourCC]) -> Result<Option<Mp4Box<'a>>, RemuxError> {
    let mut at = *from;
    for kind in path {
        match at.child(kind)? {
            Some(b) => at = b,
            None => return Ok(None),
        }
    }
    Ok(Some(at))
}

fn read_codec(track_id: u32, entry: &SampleEntry<'_>) -> Result<Codec, RemuxError> {
    let bad = |why| RemuxError::BadConfig { track_id, why };
    let child = |kind: &FourCC| -> Result<Mp4Box<'_>, RemuxError> {
        find(entry.children(), kind)?.ok_or(bad("configuration box missing"))
    };
    // Parameter sets are copied before every keyframe: bounded, so an init cannot make each
    // sync sample cost megabytes of output.
    let capped = |(size, sets): (u8, Vec<Vec<u8>>)| {
        let bytes: usize = sets.iter().map(|s| START_CODE_LEN + s.len()).sum();
        if bytes > MAX_PARAMETER_SET_BYTES {
            return Err("parameter sets over 64 KiB");
        }
        Ok((size, sets))
    };
    match &entry.kind {
        b"avc1" | b"avc3" => {
            let (nal_length_size, parameter_sets) =
                avcc(&child(b"avcC")?).and_then(capped).map_err(bad)?;
            Ok(Codec::H264 {
                nal_length_size,
                parameter_sets,
            })
        }
        b"hvc1" | b"hev1" => {
            let (nal_length_size, parameter_sets) =
                hvcc(&child(b"hvcC")?).and_then(capped).map_err(bad)?;
            Ok(Codec::H265 {
                nal_length_size,
                parameter_sets,
            })
        }
        b"mp4a" => {
            let asc = esds_config(&child(b"esds")?).map_err(bad)?;
            aac_config(asc).map_err(bad)
        }
        b"ac-3" => Ok(Codec::Ac3),
        b"ec-3" => Ok(Codec::Eac3),
        b"encv" | b"enca" => Err(RemuxError::Encrypted { track_id }),
        other => Err(RemuxError::unsupported(track_id, *other)),
    }
}

/// `AVCDecoderConfigurationRecord`: NAL length size, SPS and PPS.
fn avcc(b: &Mp4Box<'_>) -> Result<(u8, Vec<Vec<u8>>), &'static str> {
    let mut r = b.reader();
    let head = r.bytes(5).map_err(|_| "avcC truncated")?;
    let nal_length_size = (head[4] & 0x03) + 1;
    if nal_length_size == 3 {
        return Err("3-byte NAL lengths");
    }
    let mut sets = Vec::new();
    let sps = r.u8().map_err(|_| "avcC truncated")? & 0x1f;
    read_sets(&mut r, sps.into(), &mut sets)?;
    let pps = r.u8().map_err(|_| "avcC truncated")?;
    read_sets(&mut r, pps.into(), &mut sets)?;
    Ok((nal_length_size, sets))
}

/// `HEVCDecoderConfigurationRecord`: NAL length size and every parameter-set array, in order.
fn hvcc(b: &Mp4Box<'_>) -> Result<(u8, Vec<Vec<u8>>), &'static str> {
    let mut r = b.reader();
    let head = r.bytes(23).map_err(|_| "hvcC truncated")?;
    let nal_length_size = (head[21] & 0x03) + 1;
    if nal_length_size == 3 {
        return Err("3-byte NAL lengths");
    }
    let arrays = head[22];
    let mut sets = Vec::new();
    for _ in 0..arrays {
        r.u8().map_err(|_| "hvcC truncated")?; // completeness and NAL type
        let count = r.u16().map_err(|_| "hvcC truncated")?;
        read_sets(&mut r, count.into(), &mut sets)?;
    }
    Ok((nal_length_size, sets))
}

fn read_sets(r: &mut Reader<'_>, count: u32, sets: &mut Vec<Vec<u8>>) -> Result<(), &'static str> {
    for _ in 0..count {
        let len = r.u16().map_err(|_| "parameter set truncated")?;
        let nal = r.bytes(len.into()).map_err(|_| "parameter set truncated")?;
        if !nal.is_empty() {
            sets.push(nal.to_vec());
        }
    }
    Ok(())
}

/// The DecoderSpecificInfo (AudioSpecificConfig) inside `esds`'s ES_Descriptor.
fn esds_config<'a>(b: &Mp4Box<'a>) -> Result<&'a [u8], &'static str> {
    let mut r = b.reader();
    r.full_box().map_err(|_| "esds truncated")?;
    let es = descriptor(&mut r, 0x03)?;
    let mut r = Reader::new(es, 0);
    let flags = r.bytes(3).map_err(|_| "ES_Descriptor truncated")?[2];
    if flags & 0x80 != 0 {
        r.skip(2).map_err(|_| "ES_Descriptor truncated")?;
    }
    if flags & 0x40 != 0 {
        let len = r.u8().map_err(|_| "ES_Descriptor truncated")?;
        r.skip(len.into()).map_err(|_| "ES_Descriptor truncated")?;
    }
    if flags & 0x20 != 0 {
        r.skip(2).map_err(|_| "ES_Descriptor truncated")?;
    }
    let dcd = descriptor(&mut r, 0x04)?;
    let mut r = Reader::new(dcd, 0);
    if r.u8().map_err(|_| "DecoderConfigDescriptor truncated")? != 0x40 {
        return Err("not MPEG-4 audio");
    }
    r.skip(12)
        .map_err(|_| "DecoderConfigDescriptor truncated")?;
    descriptor(&mut r, 0x05)
}

/// Reads one descriptor (tag, expandable length) and returns its body; it must carry `tag`.
fn descriptor<'a>(r: &mut Reader<'a>, tag: u8) -> Result<&'a [u8], &'static str> {
    if r.u8().map_err(|_| "descriptor truncated")? != tag {
        return Err("unexpected descriptor");
    }
    let mut len = 0usize;
    for _ in 0..4 {
        let b = r.u8().map_err(|_| "descriptor truncated")?;
        len = (len << 7) | usize::from(b & 0x7f);
        if b & 0x80 == 0 {
            break;
        }
    }
    r.bytes(len).map_err(|_| "descriptor truncated")
}

/// ADTS fields from an AudioSpecificConfig. HE-AAC (v1, v2) signalled explicitly keeps its core
/// AAC-LC layer, which is what ADTS can describe (the SBR/PS layers are found in band).
fn aac_config(asc: &[u8]) -> Result<Codec, &'static str> {
    let mut bits = Bits { data: asc, pos: 0 };
    let mut object_type = object_type_of(&mut bits)?;
    let mut frequency_index = bits.take(4)?;
    if frequency_index == 15 {
        return Err("explicit AAC sampling rate");
    }
    let channel_config = bits.take(4)?;
    if object_type == 5 || object_type == 29 {
        // The core layer runs at the rate just read; skip the extension rate, read the core type.
        let ext = bits.take(4)?;
        if ext == 15 {
            bits.take(24)?;
        }
        object_type = object_type_of(&mut bits)?;
        frequency_index = frequency_index.min(12);
    }
    if !(1..=4).contains(&object_type) {
        return Err("AAC object type has no ADTS profile");
    }
    Ok(Codec::Aac {
        profile: (object_type - 1) as u8,
        frequency_index: frequency_index as u8,
        channel_config: channel_config as u8,
    })
}

fn object_type_of(bits: &mut Bits<'_>) -> Result<u32, &'static str> {
    let t = bits.take(5)?;
    Ok(if t == 31 { 32 + bits.take(6)? } else { t })
}

/// MSB-first bit reader over a short configuration record.
struct Bits<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Bits<'_> {
    fn take(&mut self, n: usize) -> Result<u32, &'static str> {
        let mut v = 0u32;
        for _ in 0..n {
            let byte = *self
                .data
                .get(self.pos / 8)
                .ok_or("AudioSpecificConfig truncated")?;
            v = (v << 1) | u32::from((byte >> (7 - self.pos % 8)) & 1);
            self.pos += 1;
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mp4::tests::bx;

    /// A timed-text track: read, then left out as MPEG-TS cannot carry it.
    fn text_trak(track_id: u32) -> Vec<u8> {
        let mut tkhd = vec![0u8; 12];
        tkhd.extend_from_slice(&track_id.to_be_bytes());
        let mut hdlr = vec![0u8; 8];
        hdlr.extend_from_slice(b"text");
        let mdia = bx(b"mdia", &bx(b"hdlr", &hdlr));
        bx(b"trak", &[bx(b"tkhd", &tkhd), mdia].concat())
    }

    fn init(traks: u32, trexes: u32) -> Vec<u8> {
        let mut moov = Vec::new();
        if trexes > 0 {
            let mvex: Vec<u8> = (0..trexes)
                .flat_map(|i| {
                    let mut p = vec![0u8; 4];
                    p.extend_from_slice(&(1_000_000 + i).to_be_bytes());
                    p.extend_from_slice(&[0u8; 16]);
                    bx(b"trex", &p)
                })
                .collect();
            moov.extend(bx(b"mvex", &mvex));
        }
        for id in 1..=traks {
            moov.extend(text_trak(id));
        }
        bx(b"moov", &moov)
    }

    #[test]
    fn thousands_of_tracks_are_refused_while_walking() {
        let too_many = |kind| Err(RemuxError::TooManyBoxes(kind));
        assert_eq!(read(&init(10_000, 0)), too_many("trak"));
        assert_eq!(read(&init(1, 10_000)), too_many("trex"));
        let max = MAX_TRAK_BOXES as u32;
        assert_eq!(read(&init(max, max)), Ok(Vec::new()));
        assert_eq!(read(&init(max + 1, 0)), too_many("trak"));
        // Not the PMT's limit of 16 tracks: the walk's own, naming the box.
        let refused = read(&init(max + 1, 0)).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "the init segment has more than 64 'trak' boxes"
        );
        assert_eq!(
            read(&init(0, max + 1)).unwrap_err().to_string(),
            "the init segment has more than 64 'trex' boxes"
        );
    }
}
