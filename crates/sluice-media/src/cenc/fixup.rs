//! Metadata fix-ups after decryption: `moof` rebuilt without `senc`/`saiz`/`saio`/`pssh`,
//! `trun.data_offset` and `tfhd.base_data_offset` moved by the bytes removed, `sidx` sizes shrunk.
//! No I/O.

use super::CencError;
use crate::mp4::{rebuild, Edit, FourCC, Mp4Box, Senc, Sidx, Tfhd, Trun};

/// How a `traf`'s `trun` offsets must change once the `moof` has shrunk.
#[derive(Clone, Copy)]
pub(super) enum TrafFix {
    /// Offsets count from the `moof` start: subtract the bytes removed from the `moof`.
    MoofRelative,
    /// Offsets count from an absolute `base_data_offset`: the base moves, the offsets stay.
    Absolute,
    /// Offsets count from the previous `traf`'s data, which moves with them.
    Unchanged,
}

/// Boxes that only carry encryption data, dropped wherever they sit in a `moof`.
pub(super) fn is_dropped_in_moof(b: &Mp4Box<'_>) -> bool {
    matches!(&b.kind, b"senc" | b"saiz" | b"saio" | b"pssh") || Senc::is_senc(b)
}

pub(super) fn rebuild_moof(
    moof: &Mp4Box<'_>,
    removed: usize,
    removed_through: usize,
    fixes: &[TrafFix],
) -> Result<Vec<u8>, CencError> {
    let mut out = Vec::with_capacity(moof.len());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(b"moof");
    let mut traf_index = 0usize;
    let mut fix = TrafFix::Unchanged;
    rebuild(
        moof.children(),
        &mut out,
        &mut |path: &[FourCC], b: &Mp4Box<'_>| {
            if is_dropped_in_moof(b) {
                return Ok::<_, CencError>(Edit::Drop);
            }
            Ok(match (&b.kind, path) {
                (b"traf", []) => {
                    fix = fixes.get(traf_index).copied().unwrap_or(TrafFix::Unchanged);
                    traf_index += 1;
                    Edit::Descend {
                        prefix: 0,
                        rename: None,
                    }
                }
                (b"trun", [_]) => match fix {
                    TrafFix::MoofRelative => patch_trun(b, removed)?,
                    _ => Edit::Keep,
                },
                (b"tfhd", [_]) => match fix {
                    TrafFix::Absolute => patch_tfhd(b, removed_through)?,
                    _ => Edit::Keep,
                },
                _ => Edit::Keep,
            })
        },
    )?;
    let size = out.len() as u32;
    out[..4].copy_from_slice(&size.to_be_bytes());
    Ok(out)
}

/// Moves `trun.data_offset` back by the bytes removed from the `moof`.
fn patch_trun(b: &Mp4Box<'_>, removed: usize) -> Result<Edit, CencError> {
    let trun = Trun::parse(b)?;
    let Some(offset) = trun.data_offset else {
        return Ok(Edit::Keep);
    };
    let fixed = i64::from(offset) - removed as i64;
    let fixed = i32::try_from(fixed).map_err(|_| CencError::DataOffset {
        track_id: 0,
        removed: removed as u64,
    })?;
    let mut bytes = b.bytes().to_vec();
    let at = b.header_len + Trun::DATA_OFFSET_AT;
    bytes[at..at + 4].copy_from_slice(&fixed.to_be_bytes());
    Ok(Edit::Replace(bytes))
}

/// Moves an absolute `tfhd.base_data_offset` back by every byte removed up to its data.
fn patch_tfhd(b: &Mp4Box<'_>, removed_through: usize) -> Result<Edit, CencError> {
    let tfhd = Tfhd::parse(b)?;
    let Some(base) = tfhd.base_data_offset else {
        return Ok(Edit::Keep);
    };
    let fixed = base
        .checked_sub(removed_through as u64)
        .ok_or(CencError::DataOffset {
            track_id: tfhd.track_id,
            removed: removed_through as u64,
        })?;
    let mut bytes = b.bytes().to_vec();
    let at = b.header_len + Tfhd::BASE_DATA_OFFSET_AT;
    bytes[at..at + 8].copy_from_slice(&fixed.to_be_bytes());
    Ok(Edit::Replace(bytes))
}

/// The bytes each shrunk top-level box loses, in offset order, with their running sums, so the
/// bytes removed in a range take two binary searches. Built once per segment while it is
/// planned, then shared by every `sidx`: rebuilt for each one, a segment of alternating empty
/// `sidx` and dropped `pssh` boxes cost their product (~10^10 steps in 4 MiB).
pub(super) struct Removals {
    offsets: Vec<usize>,
    /// `prefix[i]` is the bytes removed by the first `i` boxes.
    prefix: Vec<u64>,
}

#[cfg(test)]
thread_local! {
    /// Running sums computed on this thread, for the tests that bound the work.
    pub(super) static SUMS_COMPUTED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl Removals {
    pub(super) fn new() -> Self {
        Removals {
            offsets: Vec::new(),
            prefix: vec![0],
        }
    }

    /// Records `removed` bytes lost by the box at input `offset`, past every one recorded.
    pub(super) fn push(&mut self, offset: usize, removed: usize) {
        #[cfg(test)]
        SUMS_COMPUTED.with(|c| c.set(c.get() + 1));
        let total = self.prefix[self.prefix.len() - 1] + removed as u64;
        self.offsets.push(offset);
        self.prefix.push(total);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }

    /// Bytes removed by boxes starting in `start..start + len`.
    fn removed_in(&self, start: u64, len: u64) -> u64 {
        let index_of = |at: u64| self.offsets.partition_point(|o| (*o as u64) < at);
        let (from, to) = (index_of(start), index_of(start.saturating_add(len)));
        self.prefix[to.max(from)] - self.prefix[from]
    }
}

/// Shrinks each `sidx` reference (and `first_offset`) by the bytes removed inside its range.
/// Binary searches in `removals` keep a hostile `sidx` with 65535 references cheap.
pub(super) fn rewrite_sidx(b: &Mp4Box<'_>, removals: &Removals) -> Result<Vec<u8>, CencError> {
    let sidx = Sidx::parse(b)?;
    let removed_in = |start: u64, len: u64| removals.removed_in(start, len);
    let mut bytes = b.bytes().to_vec();
    let anchor = b.end() as u64;
    let first_offset = sidx
        .first_offset
        .saturating_sub(removed_in(anchor, sidx.first_offset));
    let at = b.header_len + 12;
    if sidx.version == 0 {
        bytes[at..at + 4].copy_from_slice(&(first_offset as u32).to_be_bytes());
    } else {
        bytes[at..at + 8].copy_from_slice(&first_offset.to_be_bytes());
    }
    let mut start = anchor.saturating_add(sidx.first_offset);
    for (i, r) in sidx.references().enumerate() {
        let size = u64::from(r.referenced_size);
        let fixed = size.saturating_sub(removed_in(start, size)) as u32;
        let word = (u32::from(r.is_index) << 31) | (fixed & 0x7fff_ffff);
        let at = b.header_len + sidx.references_at + 12 * i;
        bytes[at..at + 4].copy_from_slice(&word.to_be_bytes());
        start = start.saturating_add(size);
    }
    Ok(bytes)
}
