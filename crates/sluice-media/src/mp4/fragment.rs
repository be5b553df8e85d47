//! Typed views of movie-fragment boxes: `tfhd`, `tfdt`, `trun`, `senc`, `saiz`, `saio`, `sidx`.
//! No I/O; sample tables are iterated in place, never copied.

use super::{FourCC, Mp4Box, Mp4Error, Reader};

/// Track fragment header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tfhd {
    pub flags: u32,
    pub track_id: u32,
    pub base_data_offset: Option<u64>,
    pub sample_description_index: Option<u32>,
    pub default_sample_duration: Option<u32>,
    pub default_sample_size: Option<u32>,
    pub default_sample_flags: Option<u32>,
}

impl Tfhd {
    pub const BASE_DATA_OFFSET: u32 = 0x01;
    pub const DEFAULT_BASE_IS_MOOF: u32 = 0x02_0000;
    /// Payload offset of `base_data_offset` when present.
    pub const BASE_DATA_OFFSET_AT: usize = 8;

    pub fn parse(b: &Mp4Box<'_>) -> Result<Self, Mp4Error> {
        let mut r = b.reader();
        let (_, flags) = r.full_box()?;
        let opt32 = |bit: u32, r: &mut Reader<'_>| -> Result<Option<u32>, Mp4Error> {
            if flags & bit != 0 {
                r.u32().map(Some)
            } else {
                Ok(None)
            }
        };
        let track_id = r.u32()?;
        let base_data_offset = if flags & Self::BASE_DATA_OFFSET != 0 {
            Some(r.u64()?)
        } else {
            None
        };
        Ok(Tfhd {
            flags,
            track_id,
            base_data_offset,
            sample_description_index: opt32(0x02, &mut r)?,
            default_sample_duration: opt32(0x08, &mut r)?,
            default_sample_size: opt32(0x10, &mut r)?,
            default_sample_flags: opt32(0x20, &mut r)?,
        })
    }

    pub fn default_base_is_moof(&self) -> bool {
        self.flags & Self::DEFAULT_BASE_IS_MOOF != 0
    }
}

/// Track fragment decode time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tfdt {
    pub base_media_decode_time: u64,
}

impl Tfdt {
    pub fn parse(b: &Mp4Box<'_>) -> Result<Self, Mp4Error> {
        let mut r = b.reader();
        let (version, _) = r.full_box()?;
        let base_media_decode_time = if version == 1 {
            r.u64()?
        } else {
            r.u32()?.into()
        };
        Ok(Tfdt {
            base_media_decode_time,
        })
    }
}

/// Track run: per-sample fields, each present or not according to the flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trun<'a> {
    pub version: u8,
    pub flags: u32,
    pub sample_count: u32,
    pub data_offset: Option<i32>,
    pub first_sample_flags: Option<u32>,
    entries: &'a [u8],
    entry_len: usize,
}

/// One sample of a track run; `None` where the run defers to `tfhd`/`trex` defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TrunSample {
    pub duration: Option<u32>,
    pub size: Option<u32>,
    pub flags: Option<u32>,
    pub composition_offset: Option<i64>,
}

impl<'a> Trun<'a> {
    pub const DATA_OFFSET: u32 = 0x001;
    const FIRST_SAMPLE_FLAGS: u32 = 0x004;
    const DURATION: u32 = 0x100;
    const SIZE: u32 = 0x200;
    const FLAGS: u32 = 0x400;
    const CTO: u32 = 0x800;
    /// Payload offset of `data_offset` when present.
    pub const DATA_OFFSET_AT: usize = 8;

    pub fn parse(b: &Mp4Box<'a>) -> Result<Self, Mp4Error> {
        let mut r = b.reader();
        let (version, flags) = r.full_box()?;
        let sample_count = r.u32()?;
        let data_offset = if flags & Self::DATA_OFFSET != 0 {
            Some(r.i32()?)
        } else {
            None
        };
        let first_sample_flags = if flags & Self::FIRST_SAMPLE_FLAGS != 0 {
            Some(r.u32()?)
        } else {
            None
        };
        let entry_len = [Self::DURATION, Self::SIZE, Self::FLAGS, Self::CTO]
            .iter()
            .filter(|&&bit| flags & bit != 0)
            .count()
            * 4;
        let entries = r.records("trun sample", sample_count.into(), entry_len)?;
        Ok(Trun {
            version,
            flags,
            sample_count,
            data_offset,
            first_sample_flags,
            entries,
            entry_len,
        })
    }

    /// True when every sample carries its own size.
    pub fn has_sizes(&self) -> bool {
        self.flags & Self::SIZE != 0
    }

    pub fn samples(&self) -> TrunSamples<'a> {
        TrunSamples {
            trun: *self,
            index: 0,
        }
    }
}

/// Iterator over the samples of a [`Trun`].
#[derive(Debug, Clone)]
pub struct TrunSamples<'a> {
    trun: Trun<'a>,
    index: u32,
}

impl Iterator for TrunSamples<'_> {
    type Item = TrunSample;

    fn next(&mut self) -> Option<TrunSample> {
        let t = &self.trun;
        if self.index >= t.sample_count {
            return None;
        }
        let start = self.index as usize * t.entry_len;
        let mut fields = t.entries[start..start + t.entry_len]
            .chunks_exact(4)
            .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
        let mut take = |bit: u32| (t.flags & bit != 0).then(|| fields.next().unwrap_or(0));
        let duration = take(Trun::DURATION);
        let size = take(Trun::SIZE);
        let mut flags = take(Trun::FLAGS);
        let cto = take(Trun::CTO).map(|v| {
            if t.version == 0 {
                i64::from(v)
            } else {
                i64::from(v as i32)
            }
        });
        if self.index == 0 && t.first_sample_flags.is_some() {
            flags = t.first_sample_flags;
        }
        self.index += 1;
        Some(TrunSample {
            duration,
            size,
            flags,
            composition_offset: cto,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = (self.trun.sample_count - self.index) as usize;
        (left, Some(left))
    }
}

/// Sample encryption box (`senc`, or the PIFF `uuid` box with the same layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Senc<'a> {
    pub flags: u32,
    pub sample_count: u32,
    /// PIFF override of the per-sample IV size (flag 0x1).
    pub iv_size_override: Option<u8>,
    entries: &'a [u8],
    at: usize,
}

/// PIFF's sample encryption user type.
pub const PIFF_SENC_UUID: [u8; 16] = [
    0xa2, 0x39, 0x4f, 0x52, 0x5a, 0x9b, 0x4f, 0x14, 0xa2, 0x44, 0x6c, 0x42, 0x7c, 0x64, 0x8d, 0xf4,
];

/// Per-sample encryption parameters: the IV and the raw 6-byte subsample records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SencEntry<'a> {
    pub iv: &'a [u8],
    subsamples: &'a [u8],
}

/// A run of clear bytes followed by a run of protected bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subsample {
    pub clear: u32,
    pub protected: u32,
}

impl<'a> SencEntry<'a> {
    pub fn has_subsamples(&self) -> bool {
        !self.subsamples.is_empty()
    }

    /// The raw 6-byte subsample records, for code that walks them itself.
    pub fn subsample_bytes(&self) -> &'a [u8] {
        self.subsamples
    }

    pub fn subsamples(&self) -> impl Iterator<Item = Subsample> + 'a {
        self.subsamples.chunks_exact(6).map(|c| Subsample {
            clear: u16::from_be_bytes([c[0], c[1]]).into(),
            protected: u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
        })
    }
}

impl<'a> Senc<'a> {
    pub const SUBSAMPLES: u32 = 0x2;
    const OVERRIDE: u32 = 0x1;

    /// True for `senc` and for PIFF's `uuid` sample encryption box.
    pub fn is_senc(b: &Mp4Box<'_>) -> bool {
        b.kind == *b"senc" || b.user_type() == Some(&PIFF_SENC_UUID[..])
    }

    pub fn parse(b: &Mp4Box<'a>) -> Result<Self, Mp4Error> {
        let mut r = b.reader();
        let (_, flags) = r.full_box()?;
        let iv_size_override = if flags & Self::OVERRIDE != 0 {
            r.skip(3)?; // algorithm id
            let size = r.u8()?;
            r.skip(16)?; // KID
            Some(size)
        } else {
            None
        };
        let sample_count = r.u32()?;
        let at = b.offset + b.header_len + r.position();
        Ok(Senc {
            flags,
            sample_count,
            iv_size_override,
            entries: r.rest(),
            at,
        })
    }

    /// Iterates entries given the per-sample IV size from `tenc` (unless PIFF overrides it).
    pub fn entries(&self, iv_size: u8) -> SencEntries<'a> {
        SencEntries {
            r: Reader::new(self.entries, self.at),
            left: self.sample_count,
            iv_size: self.iv_size_override.unwrap_or(iv_size) as usize,
            subsamples: self.flags & Self::SUBSAMPLES != 0,
        }
    }
}

/// Iterator over [`SencEntry`] values; an entry running past the box is an error.
#[derive(Debug, Clone)]
pub struct SencEntries<'a> {
    r: Reader<'a>,
    left: u32,
    iv_size: usize,
    subsamples: bool,
}

impl<'a> SencEntries<'a> {
    fn read(&mut self) -> Result<SencEntry<'a>, Mp4Error> {
        let iv = self.r.bytes(self.iv_size)?;
        let subsamples = if self.subsamples {
            let count = self.r.u16()?;
            self.r.records("senc subsample", count.into(), 6)?
        } else {
            &[]
        };
        Ok(SencEntry { iv, subsamples })
    }
}

impl<'a> Iterator for SencEntries<'a> {
    type Item = Result<SencEntry<'a>, Mp4Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        let item = self.read();
        self.left = if item.is_ok() { self.left - 1 } else { 0 };
        Some(item)
    }
}

/// Sample auxiliary information sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Saiz<'a> {
    pub aux_info_type: Option<FourCC>,
    pub default_sample_info_size: u8,
    pub sample_count: u32,
    /// One byte per sample when `default_sample_info_size` is 0.
    pub sizes: &'a [u8],
}

impl<'a> Saiz<'a> {
    pub fn parse(b: &Mp4Box<'a>) -> Result<Self, Mp4Error> {
        let mut r = b.reader();
        let (_, flags) = r.full_box()?;
        let aux_info_type = aux_type(&mut r, flags)?;
        let default_sample_info_size = r.u8()?;
        let sample_count = r.u32()?;
        let sizes = if default_sample_info_size == 0 {
            r.records("saiz sample", sample_count.into(), 1)?
        } else {
            &[]
        };
        Ok(Saiz {
            aux_info_type,
            default_sample_info_size,
            sample_count,
            sizes,
        })
    }
}

/// Sample auxiliary information offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Saio<'a> {
    pub aux_info_type: Option<FourCC>,
    pub version: u8,
    pub entry_count: u32,
    offsets: &'a [u8],
}

impl<'a> Saio<'a> {
    pub fn parse(b: &Mp4Box<'a>) -> Result<Self, Mp4Error> {
        let mut r = b.reader();
        let (version, flags) = r.full_box()?;
        let aux_info_type = aux_type(&mut r, flags)?;
        let entry_count = r.u32()?;
        let width = if version == 0 { 4 } else { 8 };
        let offsets = r.records("saio offset", entry_count.into(), width)?;
        Ok(Saio {
            aux_info_type,
            version,
            entry_count,
            offsets,
        })
    }

    pub fn offsets(&self) -> impl Iterator<Item = u64> + 'a {
        let width = if self.version == 0 { 4 } else { 8 };
        self.offsets.chunks_exact(width).map(|c| {
            c.iter()
                .fold(0u64, |acc, &byte| (acc << 8) | u64::from(byte))
        })
    }
}

fn aux_type(r: &mut Reader<'_>, flags: u32) -> Result<Option<FourCC>, Mp4Error> {
    if flags & 1 == 0 {
        return Ok(None);
    }
    let kind = r.array()?;
    r.skip(4)?; // aux_info_type_parameter
    Ok(Some(kind))
}

/// Segment index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sidx<'a> {
    pub version: u8,
    pub reference_id: u32,
    pub timescale: u32,
    pub earliest_presentation_time: u64,
    pub first_offset: u64,
    /// Payload offset of the first reference record, for rewriting sizes in place.
    pub references_at: usize,
    references: &'a [u8],
}

/// One `sidx` reference: a sub-segment (or a nested `sidx` when `is_index`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidxReference {
    pub is_index: bool,
    pub referenced_size: u32,
    pub subsegment_duration: u32,
    pub sap: u32,
}

impl<'a> Sidx<'a> {
    pub fn parse(b: &Mp4Box<'a>) -> Result<Self, Mp4Error> {
        let mut r = b.reader();
        let (version, _) = r.full_box()?;
        let reference_id = r.u32()?;
        let timescale = r.u32()?;
        let (earliest_presentation_time, first_offset) = if version == 0 {
            (r.u32()?.into(), r.u32()?.into())
        } else {
            (r.u64()?, r.u64()?)
        };
        r.skip(2)?; // reserved
        let count = r.u16()?;
        let references_at = r.position();
        let references = r.records("sidx reference", count.into(), 12)?;
        Ok(Sidx {
            version,
            reference_id,
            timescale,
            earliest_presentation_time,
            first_offset,
            references_at,
            references,
        })
    }

    pub fn references(&self) -> impl Iterator<Item = SidxReference> + 'a {
        self.references.chunks_exact(12).map(|c| {
            let word = |i: usize| u32::from_be_bytes([c[i], c[i + 1], c[i + 2], c[i + 3]]);
            SidxReference {
                is_index: word(0) >> 31 == 1,
                referenced_size: word(0) & 0x7fff_ffff,
                subsegment_duration: word(4),
                sap: word(8),
            }
        })
    }
}
