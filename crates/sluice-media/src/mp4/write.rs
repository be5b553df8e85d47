//! Rebuilding box trees: children kept, dropped, renamed or replaced, sizes recomputed. No I/O.

use super::{fourcc_str, Boxes, FourCC, Mp4Box, Mp4Error, MAX_DEPTH};

/// What [`rebuild`] does with one box.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    /// Copy the box unchanged.
    Keep,
    /// Leave the box out.
    Drop,
    /// Copy the payload under another type.
    Rename(FourCC),
    /// Copy the first `prefix` payload bytes, then rebuild the children that follow,
    /// optionally under another type.
    Descend {
        prefix: usize,
        rename: Option<FourCC>,
    },
    /// Emit these bytes (a whole box) instead.
    Replace(Vec<u8>),
}

/// Appends a box of type `kind` around `payload`, with a 64-bit size only when needed.
pub fn write_box(out: &mut Vec<u8>, kind: FourCC, payload: &[u8]) {
    let size = payload.len() as u64 + 8;
    if size <= u64::from(u32::MAX) {
        out.extend_from_slice(&(size as u32).to_be_bytes());
        out.extend_from_slice(&kind);
    } else {
        out.extend_from_slice(&1u32.to_be_bytes());
        out.extend_from_slice(&kind);
        out.extend_from_slice(&(size + 8).to_be_bytes());
    }
    out.extend_from_slice(payload);
}

/// Appends a box of type `kind` whose payload `fill` writes straight into `out` (no copy of
/// the payload); the size is patched afterwards. For boxes under 4 GiB, as every box a
/// writer here makes is.
pub fn write_box_with(out: &mut Vec<u8>, kind: FourCC, fill: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&kind);
    fill(out);
    let size = u32::try_from(out.len() - start).unwrap_or(u32::MAX);
    out[start..start + 4].copy_from_slice(&size.to_be_bytes());
}

/// [`write_box_with`] for a full box: version and flags come first in the payload.
pub fn write_full_box_with(
    out: &mut Vec<u8>,
    kind: FourCC,
    version: u8,
    flags: u32,
    fill: impl FnOnce(&mut Vec<u8>),
) {
    write_box_with(out, kind, |out| {
        out.extend_from_slice(&((u32::from(version) << 24) | (flags & 0x00ff_ffff)).to_be_bytes());
        fill(out);
    });
}

/// Rebuilds `children` into `out`, asking `edit` about every box it meets. `edit` receives the
/// types of the enclosing boxes (outermost first) and the box itself.
pub fn rebuild<'a, E, F>(children: Boxes<'a>, out: &mut Vec<u8>, edit: &mut F) -> Result<(), E>
where
    E: From<Mp4Error>,
    F: FnMut(&[FourCC], &Mp4Box<'a>) -> Result<Edit, E>,
{
    let mut path = Vec::with_capacity(8);
    rebuild_level(children, out, &mut path, edit)
}

fn rebuild_level<'a, E, F>(
    children: Boxes<'a>,
    out: &mut Vec<u8>,
    path: &mut Vec<FourCC>,
    edit: &mut F,
) -> Result<(), E>
where
    E: From<Mp4Error>,
    F: FnMut(&[FourCC], &Mp4Box<'a>) -> Result<Edit, E>,
{
    if path.len() > MAX_DEPTH {
        return Err(Mp4Error::TooDeep.into());
    }
    for b in children {
        let b = b?;
        match edit(path, &b)? {
            Edit::Keep => out.extend_from_slice(b.bytes()),
            Edit::Drop => {}
            Edit::Replace(bytes) => out.extend_from_slice(&bytes),
            Edit::Rename(kind) => {
                let start = open_box(out, kind, &b);
                out.extend_from_slice(b.payload());
                close_box(out, start, kind)?;
            }
            Edit::Descend { prefix, rename } => {
                let kind = rename.unwrap_or(b.kind);
                let start = open_box(out, kind, &b);
                let prefix = prefix.min(b.payload().len());
                out.extend_from_slice(&b.payload()[..prefix]);
                path.push(b.kind);
                let result = rebuild_level(b.children_after(prefix), out, path, edit);
                path.pop();
                result?;
                close_box(out, start, kind)?;
            }
        }
    }
    Ok(())
}

/// Writes a header with a placeholder size; returns where the box starts.
fn open_box(out: &mut Vec<u8>, kind: FourCC, original: &Mp4Box<'_>) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&kind);
    if let (b"uuid", Some(user_type)) = (&kind, original.user_type()) {
        out.extend_from_slice(user_type);
    }
    start
}

/// Patches the size of a box opened by [`open_box`]; metadata boxes never need 64 bits.
fn close_box(out: &mut [u8], start: usize, kind: FourCC) -> Result<(), Mp4Error> {
    let size =
        u32::try_from(out.len() - start).map_err(|_| Mp4Error::TooLarge(fourcc_str(kind)))?;
    out[start..start + 4].copy_from_slice(&size.to_be_bytes());
    Ok(())
}
