//! `sidx` (segment index) box → per-fragment byte ranges and durations, for SegmentBase tracks.
//! No I/O: the caller fetches the `indexRange` bytes.

use super::segment_info::ByteRange;
use super::DashError;

/// One referenced fragment of the file.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SidxFragment {
    /// Inclusive absolute byte range in the media file.
    pub range: ByteRange,
    pub duration_secs: f64,
}

/// Parses the first `sidx` box in `bytes`, which start at absolute file offset `offset` (the first
/// byte of the MPD's `indexRange`). Fragment ranges are absolute, ready for a `Range` header.
pub fn parse_sidx(bytes: &[u8], offset: u64) -> Result<Vec<SidxFragment>, DashError> {
    let (body, box_end) = find_sidx(bytes)?;
    let mut r = Cursor { bytes: body, at: 0 };
    let version = r.u8()?;
    r.skip(3)?; // flags
    r.skip(4)?; // reference_ID
    let timescale = r.u32()?;
    if timescale == 0 {
        return Err(DashError::Sidx("timescale is zero"));
    }
    let first_offset = if version == 0 {
        r.skip(4)?; // earliest_presentation_time
        u64::from(r.u32()?)
    } else {
        r.skip(8)?;
        r.u64()?
    };
    r.skip(2)?; // reserved
    let count = r.u16()?;
    // The first fragment starts right after the sidx box, plus first_offset.
    let mut position = offset
        .checked_add(box_end as u64)
        .and_then(|p| p.checked_add(first_offset))
        .ok_or(DashError::Overflow)?;
    let mut fragments = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let reference = r.u32()?;
        let duration = r.u32()?;
        r.skip(4)?; // SAP fields
        if reference & 0x8000_0000 != 0 {
            return Err(DashError::Sidx(
                "hierarchical sidx (reference to another sidx)",
            ));
        }
        let size = u64::from(reference & 0x7fff_ffff);
        if size == 0 {
            return Err(DashError::Sidx("zero-sized reference"));
        }
        let last = position.checked_add(size - 1).ok_or(DashError::Overflow)?;
        fragments.push(SidxFragment {
            range: (position, last),
            duration_secs: f64::from(duration) / f64::from(timescale),
        });
        position = last.checked_add(1).ok_or(DashError::Overflow)?;
    }
    Ok(fragments)
}

/// Walks top-level boxes to the `sidx`; returns its body and the offset just past it.
fn find_sidx(bytes: &[u8]) -> Result<(&[u8], usize), DashError> {
    let mut at = 0usize;
    while bytes.len().saturating_sub(at) >= 8 {
        let size32 = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap_or_default());
        let kind = &bytes[at + 4..at + 8];
        let (header, size) = match size32 {
            1 => {
                let large = bytes
                    .get(at + 8..at + 16)
                    .ok_or(DashError::Sidx("truncated box header"))?;
                (16, u64::from_be_bytes(large.try_into().unwrap_or_default()))
            }
            0 => (8, (bytes.len() - at) as u64), // extends to the end
            n => (8, u64::from(n)),
        };
        let size = usize::try_from(size).map_err(|_| DashError::Overflow)?;
        if size < header {
            return Err(DashError::Sidx("box smaller than its header"));
        }
        let end = at.checked_add(size).ok_or(DashError::Overflow)?;
        if kind == b"sidx" {
            let body = bytes
                .get(at + header..end)
                .ok_or(DashError::Sidx("truncated sidx"))?;
            return Ok((body, end));
        }
        at = end;
    }
    Err(DashError::Sidx("no sidx box"))
}

/// Big-endian reader that fails instead of panicking on short input.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DashError> {
        let end = self.at.checked_add(n).ok_or(DashError::Overflow)?;
        let out = self
            .bytes
            .get(self.at..end)
            .ok_or(DashError::Sidx("truncated sidx"))?;
        self.at = end;
        Ok(out)
    }

    fn skip(&mut self, n: usize) -> Result<(), DashError> {
        self.take(n).map(|_| ())
    }

    fn u8(&mut self) -> Result<u8, DashError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, DashError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, DashError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, DashError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DashError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }
}
