//! Typed views of the `moov` boxes decryption needs: `tkhd`, `hdlr`, `trex`, `stsd` sample entries,
//! the `sinf` protection boxes (`frma`, `schm`, `tenc`) and `pssh`. No I/O.

use super::{Boxes, FourCC, Mp4Box, Mp4Error};

/// Track header: only the track id matters here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tkhd {
    pub track_id: u32,
}

impl Tkhd {
    pub fn parse(b: &Mp4Box<'_>) -> Result<Self, Mp4Error> {
        let mut r = b.reader();
        let (version, _) = r.full_box()?;
        // creation and modification times are 32 bits in version 0, 64 in version 1.
        r.skip(if version == 1 { 16 } else { 8 })?;
        Ok(Tkhd { track_id: r.u32()? })
    }
}

/// Handler reference: `vide`, `soun`, `text`, ...
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hdlr {
    pub handler_type: FourCC,
}

impl Hdlr {
    pub fn parse(b: &Mp4Box<'_>) -> Result<Self, Mp4Error> {
        let mut r = b.reader();
        r.full_box()?;
        r.skip(4)?; // pre_defined
        Ok(Hdlr {
            handler_type: r.array()?,
        })
    }
}

/// Per-track defaults for movie fragments (`mvex/trex`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Trex {
    pub track_id: u32,
    pub default_sample_description_index: u32,
    pub default_sample_duration: u32,
    pub default_sample_size: u32,
    pub default_sample_flags: u32,
}

impl Trex {
    pub fn parse(b: &Mp4Box<'_>) -> Result<Self, Mp4Error> {
        let mut r = b.reader();
        r.full_box()?;
        Ok(Trex {
            track_id: r.u32()?,
            default_sample_description_index: r.u32()?,
            default_sample_duration: r.u32()?,
            default_sample_size: r.u32()?,
            default_sample_flags: r.u32()?,
        })
    }
}

/// Sample description box: a full box header, an entry count, then the sample entries.
#[derive(Debug, Clone)]
pub struct Stsd<'a> {
    pub entry_count: u32,
    pub entries: Boxes<'a>,
}

impl<'a> Stsd<'a> {
    /// Bytes of `stsd` payload before the first sample entry.
    pub const PREFIX: usize = 8;

    pub fn parse(b: &Mp4Box<'a>) -> Result<Self, Mp4Error> {
        let mut r = b.reader();
        r.full_box()?;
        Ok(Stsd {
            entry_count: r.u32()?,
            entries: b.children_after(Self::PREFIX),
        })
    }
}

/// A sample entry (`avc1`, `mp4a`, `encv`, `enca`, ...) and where its child boxes start.
#[derive(Debug, Clone, Copy)]
pub struct SampleEntry<'a> {
    pub kind: FourCC,
    /// Bytes of fixed fields before the child boxes.
    pub prefix: usize,
    pub entry: Mp4Box<'a>,
}

impl<'a> SampleEntry<'a> {
    /// Reads the fixed-field length from the entry type, else from the track's handler.
    pub fn parse(entry: &Mp4Box<'a>, handler: FourCC) -> Result<Self, Mp4Error> {
        let prefix = match (&entry.kind, &handler) {
            (b"encv", _) | (_, b"vide") => 78,
            (b"enca", _) | (_, b"soun") => audio_prefix(entry)?,
            // Any other entry: 6 reserved bytes and a data reference index.
            _ => 8,
        };
        if prefix > entry.payload().len() {
            return Err(Mp4Error::Truncated {
                what: "sample entry",
                at: entry.offset,
                need: prefix as u64,
                have: entry.payload().len(),
            });
        }
        Ok(SampleEntry {
            kind: entry.kind,
            prefix,
            entry: *entry,
        })
    }

    pub fn children(&self) -> Boxes<'a> {
        self.entry.children_after(self.prefix)
    }
}

/// Audio entries grow by 16 or 36 bytes in the QuickTime version 1 and 2 layouts.
fn audio_prefix(entry: &Mp4Box<'_>) -> Result<usize, Mp4Error> {
    let mut r = entry.reader();
    r.skip(8)?;
    Ok(match r.u16()? {
        1 => 28 + 16,
        2 => 28 + 36,
        _ => 28,
    })
}

/// Original format of a protected sample entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frma {
    pub data_format: FourCC,
}

impl Frma {
    pub fn parse(b: &Mp4Box<'_>) -> Result<Self, Mp4Error> {
        Ok(Frma {
            data_format: b.reader().array()?,
        })
    }
}

/// Protection scheme type and version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schm {
    pub scheme_type: FourCC,
    pub scheme_version: u32,
}

impl Schm {
    pub fn parse(b: &Mp4Box<'_>) -> Result<Self, Mp4Error> {
        let mut r = b.reader();
        r.full_box()?;
        Ok(Schm {
            scheme_type: r.array()?,
            scheme_version: r.u32()?,
        })
    }
}

/// Track encryption defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tenc {
    pub version: u8,
    /// Pattern: encrypted 16-byte blocks, then clear ones (version 1 only; 0 otherwise).
    pub crypt_byte_block: u8,
    pub skip_byte_block: u8,
    pub is_protected: bool,
    pub per_sample_iv_size: u8,
    pub default_kid: [u8; 16],
    pub constant_iv_size: u8,
    /// Left-aligned; only `constant_iv_size` bytes are meaningful.
    pub constant_iv: [u8; 16],
}

impl Tenc {
    pub fn parse(b: &Mp4Box<'_>) -> Result<Self, Mp4Error> {
        let mut r = b.reader();
        let (version, _) = r.full_box()?;
        r.skip(1)?;
        let pattern = r.u8()?;
        let (crypt_byte_block, skip_byte_block) = if version >= 1 {
            (pattern >> 4, pattern & 0x0f)
        } else {
            (0, 0)
        };
        let is_protected = r.u8()? != 0;
        let per_sample_iv_size = r.u8()?;
        let default_kid = r.array()?;
        let mut constant_iv = [0u8; 16];
        let mut constant_iv_size = 0;
        if is_protected && per_sample_iv_size == 0 {
            constant_iv_size = r.u8()?;
            if constant_iv_size as usize > 16 {
                return Err(Mp4Error::CountOverflow {
                    what: "tenc constant IV",
                    count: constant_iv_size.into(),
                });
            }
            let iv = r.bytes(constant_iv_size as usize)?;
            constant_iv[..iv.len()].copy_from_slice(iv);
        }
        Ok(Tenc {
            version,
            crypt_byte_block,
            skip_byte_block,
            is_protected,
            per_sample_iv_size,
            default_kid,
            constant_iv_size,
            constant_iv,
        })
    }
}

/// Protection system specific header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pssh<'a> {
    pub system_id: [u8; 16],
    /// Concatenated 16-byte KIDs (version 1 only).
    pub kids: &'a [u8],
    pub data: &'a [u8],
}

impl<'a> Pssh<'a> {
    pub fn parse(b: &Mp4Box<'a>) -> Result<Self, Mp4Error> {
        let mut r = b.reader();
        let (version, _) = r.full_box()?;
        let system_id = r.array()?;
        let kids = if version > 0 {
            let count = r.u32()?;
            r.records("pssh KID", count.into(), 16)?
        } else {
            &[]
        };
        let size = r.u32()?;
        let data = r.records("pssh data", size.into(), 1)?;
        Ok(Pssh {
            system_id,
            kids,
            data,
        })
    }
}
