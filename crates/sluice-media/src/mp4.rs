//! ISO-BMFF box walking over byte slices and rebuilding with children dropped or renamed. No I/O.
//!
//! Every parser here takes `&[u8]`, returns typed values, and reports hostile input (truncated
//! boxes, sizes past the end, counts that overflow their box) as [`Mp4Error`], never a panic.

mod fragment;
mod movie;
mod reader;
mod write;

pub use fragment::{
    Saio, Saiz, Senc, SencEntries, SencEntry, Sidx, SidxReference, Subsample, Tfdt, Tfhd, Trun,
    TrunSample, TrunSamples,
};
pub use movie::{Frma, Hdlr, Pssh, SampleEntry, Schm, Stsd, Tenc, Tkhd, Trex};
pub use reader::Reader;
pub use write::{rebuild, write_box, write_box_with, write_full_box_with, Edit};

/// A four-character box type such as `*b"moof"`.
pub type FourCC = [u8; 4];

/// Deepest box nesting accepted; real files stay under 10, hostile ones could recurse forever.
pub const MAX_DEPTH: usize = 32;

/// What went wrong while reading boxes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mp4Error {
    #[error("truncated {what} at byte {at}: needs {need} bytes, {have} left")]
    Truncated {
        what: &'static str,
        at: usize,
        need: u64,
        have: usize,
    },
    #[error(
        "box '{kind}' at byte {at} declares size {size}, smaller than its {header}-byte header"
    )]
    SizeTooSmall {
        kind: String,
        at: usize,
        size: u64,
        header: usize,
    },
    #[error("box '{kind}' at byte {at} declares size {size}, but only {left} bytes are left")]
    SizePastEnd {
        kind: String,
        at: usize,
        size: u64,
        left: usize,
    },
    #[error("{what} count {count} does not fit in its box")]
    CountOverflow { what: &'static str, count: u64 },
    #[error("unsupported {what} version {version}")]
    UnsupportedVersion { what: &'static str, version: u8 },
    #[error("boxes nested deeper than {MAX_DEPTH}")]
    TooDeep,
    #[error("box '{0}' is too large to rewrite")]
    TooLarge(String),
}

/// Renders a box type for messages; non-ASCII bytes become `?`.
pub fn fourcc_str(kind: FourCC) -> String {
    kind.iter()
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                b as char
            } else {
                '?'
            }
        })
        .collect()
}

/// One box: its type, where it starts in the walked slice, and its bytes (header included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mp4Box<'a> {
    pub kind: FourCC,
    /// Offset of the box's first byte from the start of the outermost slice walked.
    pub offset: usize,
    /// Header length: 8, 16 with a 64-bit `largesize`, plus 16 for a `uuid` user type.
    pub header_len: usize,
    bytes: &'a [u8],
}

impl<'a> Mp4Box<'a> {
    /// The whole box, header included.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The box after its header.
    pub fn payload(&self) -> &'a [u8] {
        &self.bytes[self.header_len..]
    }

    /// Total size in bytes, header included.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Always false: a box has at least its header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Offset just past the box, in the same frame as [`Mp4Box::offset`].
    pub fn end(&self) -> usize {
        self.offset + self.bytes.len()
    }

    /// The 16-byte user type of a `uuid` box.
    pub fn user_type(&self) -> Option<&'a [u8]> {
        (self.kind == *b"uuid").then(|| &self.bytes[self.header_len - 16..self.header_len])
    }

    /// Child boxes of a pure container (`moov`, `trak`, `moof`, `traf`, ...).
    pub fn children(&self) -> Boxes<'a> {
        self.children_after(0)
    }

    /// Child boxes that start `skip` bytes into the payload (sample entries, `stsd`).
    /// A `skip` past the payload yields a truncation error from the iterator.
    pub fn children_after(&self, skip: usize) -> Boxes<'a> {
        let payload = self.payload();
        let base = self.offset + self.header_len;
        if skip > payload.len() {
            return Boxes::failed(Mp4Error::Truncated {
                what: "box payload",
                at: base,
                need: skip as u64,
                have: payload.len(),
            });
        }
        Boxes::at(&payload[skip..], base + skip)
    }

    /// The first child of type `kind`, if any.
    pub fn child(&self, kind: &FourCC) -> Result<Option<Mp4Box<'a>>, Mp4Error> {
        find(self.children(), kind)
    }

    /// A reader over the payload, for leaf boxes.
    pub fn reader(&self) -> Reader<'a> {
        Reader::new(self.payload(), self.offset + self.header_len)
    }
}

/// Iterator over consecutive boxes; stops after the first error.
#[derive(Debug, Clone)]
pub struct Boxes<'a> {
    data: &'a [u8],
    pos: usize,
    base: usize,
    pending: Option<Mp4Error>,
}

/// Walks the top-level boxes of `data`.
pub fn boxes(data: &[u8]) -> Boxes<'_> {
    Boxes::at(data, 0)
}

/// The first box of type `kind` among `iter`, if any.
pub fn find<'a>(iter: Boxes<'a>, kind: &FourCC) -> Result<Option<Mp4Box<'a>>, Mp4Error> {
    for b in iter {
        let b = b?;
        if &b.kind == kind {
            return Ok(Some(b));
        }
    }
    Ok(None)
}

impl<'a> Boxes<'a> {
    fn at(data: &'a [u8], base: usize) -> Self {
        Boxes {
            data,
            pos: 0,
            base,
            pending: None,
        }
    }

    fn failed(err: Mp4Error) -> Self {
        Boxes {
            data: &[],
            pos: 0,
            base: 0,
            pending: Some(err),
        }
    }

    fn next_box(&mut self) -> Result<Mp4Box<'a>, Mp4Error> {
        let rest = &self.data[self.pos..];
        let at = self.base + self.pos;
        let mut r = Reader::new(rest, at);
        let size32 = r.u32().map_err(|_| truncated_header(at, rest.len()))?;
        let kind: FourCC = r.array().map_err(|_| truncated_header(at, rest.len()))?;
        let (size, mut header_len) = match size32 {
            0 => (rest.len() as u64, 8),
            1 => (r.u64().map_err(|_| truncated_header(at, rest.len()))?, 16),
            n => (u64::from(n), 8),
        };
        if kind == *b"uuid" {
            r.skip(16).map_err(|_| truncated_header(at, rest.len()))?;
            header_len += 16;
        }
        if size < header_len as u64 {
            return Err(Mp4Error::SizeTooSmall {
                kind: fourcc_str(kind),
                at,
                size,
                header: header_len,
            });
        }
        if size > rest.len() as u64 {
            return Err(Mp4Error::SizePastEnd {
                kind: fourcc_str(kind),
                at,
                size,
                left: rest.len(),
            });
        }
        let size = size as usize;
        self.pos += size;
        Ok(Mp4Box {
            kind,
            offset: at,
            header_len,
            bytes: &rest[..size],
        })
    }
}

fn truncated_header(at: usize, have: usize) -> Mp4Error {
    Mp4Error::Truncated {
        what: "box header",
        at,
        need: 8,
        have,
    }
}

impl<'a> Iterator for Boxes<'a> {
    type Item = Result<Mp4Box<'a>, Mp4Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(err) = self.pending.take() {
            self.pos = self.data.len();
            return Some(Err(err));
        }
        if self.pos >= self.data.len() {
            return None;
        }
        let item = self.next_box();
        if item.is_err() {
            self.pos = self.data.len();
        }
        Some(item)
    }
}

#[cfg(test)]
pub(crate) mod tests;
