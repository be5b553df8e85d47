//! Gzip (RFC 1952) framing around raw deflate: member headers, CRC-32 and length trailers.
//!
//! The deflate itself is `miniz_oxide`'s. The framing is written here rather than taken from
//! `flate2` because its gzip layer brings `crc32fast`, whose slice-by-16 table alone is 16 KiB of
//! the router build; guide-sized data does not need that speed (docs/decisions/footprint.md).

use miniz_oxide::inflate::stream::{inflate, InflateState};
use miniz_oxide::{DataFormat, MZError, MZFlush, MZStatus};

/// Why gzip data was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GzipError {
    #[error("not gzip data (bad magic or compression method)")]
    NotGzip,
    #[error("gzip header uses reserved flags")]
    ReservedFlags,
    #[error("gzip header checksum mismatch")]
    HeaderChecksum,
    #[error("gzip data is truncated")]
    Truncated,
    #[error("corrupt deflate data")]
    Corrupt,
    #[error("gzip trailer mismatch (CRC-32 or length)")]
    Trailer,
    #[error("decompressed data is larger than {0} bytes")]
    TooLarge(usize),
    #[error("gzip data has more than {0} members")]
    TooManyMembers(usize),
}

/// Members any stream may have, whatever its output (see [`members_allowed`]). Each costs a reset
/// of the inflate state (zeroing its 32 KiB window) and a fresh output buffer whatever its size,
/// so a source of 20-byte empty members would cost a terabyte of memory writes per 256 MiB; a
/// plain guide has one member, or a few when files were concatenated.
pub const MAX_MEMBERS: usize = 1024;

/// Output that earns one more member past [`MAX_MEMBERS`]. `bgzip` (BGZF) writes a member per
/// 64 KiB of output at most, so a bgzipped guide over 64 MiB has more than 1,024 members; a
/// quarter of its block size leaves it room, while a flood of empty members still earns nothing.
pub const OUTPUT_PER_MEMBER: usize = 16 * 1024;

/// Members a stream may have started once it has given `written` bytes of output: at least
/// [`MAX_MEMBERS`], then one per [`OUTPUT_PER_MEMBER`], so the members' fixed cost stays a share
/// of the real output (at most `max / 16 KiB` resets, 512 MiB of window zeroing at 256 MiB).
fn members_allowed(written: usize) -> usize {
    MAX_MEMBERS.max(written / OUTPUT_PER_MEMBER)
}

/// Input [`Inflater::next_chunk`] may work through (a member's start counting as
/// [`MEMBER_WORK`]) before it returns, even with no output: one call, one poll of the body it
/// feeds, stays short.
const WORK_PER_CHUNK: usize = 1024 * 1024;

/// What starting a member counts for against [`WORK_PER_CHUNK`]: its reset and output buffer.
const MEMBER_WORK: usize = 64 * 1024;

const MAGIC: [u8; 3] = [0x1f, 0x8b, 8];
const FHCRC: u8 = 0x02;
const FEXTRA: u8 = 0x04;
const FNAME: u8 = 0x08;
const FCOMMENT: u8 = 0x10;
const RESERVED: u8 = 0xe0;

/// CRC-32 (IEEE, reflected, as gzip and zlib use it), one table lookup per byte.
static CRC_TABLE: [u32; 256] = crc_table();

const fn crc_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
}

/// The CRC-32 of `data` continued from `crc` (0 to start).
pub fn crc32(crc: u32, data: &[u8]) -> u32 {
    let mut c = !crc;
    for &b in data {
        c = CRC_TABLE[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

/// `data` as one gzip member, deflated at `level` (0–10, 6 is zlib's default).
pub fn compress(data: &[u8], level: u8) -> Vec<u8> {
    let body = miniz_oxide::deflate::compress_to_vec(data, level);
    let mut out = Vec::with_capacity(body.len() + 18);
    // No name, no modification time, unknown OS: the same bytes for the same input.
    out.extend_from_slice(&[MAGIC[0], MAGIC[1], MAGIC[2], 0, 0, 0, 0, 0, 0, 0xff]);
    out.extend_from_slice(&body);
    out.extend_from_slice(&crc32(0, data).to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out
}

/// Every member of `data` decompressed and concatenated (as `gzip -d` does), refusing more
/// than `max` bytes of output or a member past [`members_allowed`] for the output before it.
/// Each member's CRC-32 and length are checked.
pub fn decompress(data: &[u8], max: usize) -> Result<Vec<u8>, GzipError> {
    let mut out = Vec::new();
    let mut rest = data;
    let mut state = InflateState::new_boxed(DataFormat::Raw);
    let mut members = 0;
    loop {
        let allowed = members_allowed(out.len());
        if members >= allowed {
            return Err(GzipError::TooManyMembers(allowed));
        }
        members += 1;
        let body = member_body(rest)?;
        state.reset(DataFormat::Raw);
        let start = out.len();
        let used = inflate_member(&mut state, body, &mut out, max)?;
        let trailer = body.get(used..used + 8).ok_or(GzipError::Truncated)?;
        let crc = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
        let len = u32::from_le_bytes([trailer[4], trailer[5], trailer[6], trailer[7]]);
        let member = &out[start..];
        if crc != crc32(0, member) || len != member.len() as u32 {
            return Err(GzipError::Trailer);
        }
        rest = &body[used + 8..];
        if rest.is_empty() {
            return Ok(out);
        }
    }
}

/// Decompresses gzip data a chunk at a time, every member in turn, with the same checks as
/// [`decompress`]: what it holds is the inflate state (its 32 KiB window and tables) and the
/// chunk asked for, whatever the size of the whole.
pub struct Inflater<D> {
    data: D,
    /// Where the input not yet inflated starts.
    pos: usize,
    state: Box<InflateState>,
    /// Inside a member's deflate data (its header read), and the CRC-32 and length so far.
    member: Option<(u32, u32)>,
    /// Members started so far.
    members: usize,
    written: usize,
    max: usize,
    /// The last member ended, or an error was returned: nothing follows.
    done: bool,
}

impl<D: AsRef<[u8]>> Inflater<D> {
    /// Decompresses `data`, refusing more than `max` bytes of output.
    pub fn new(data: D, max: usize) -> Self {
        Inflater {
            data,
            pos: 0,
            state: InflateState::new_boxed(DataFormat::Raw),
            member: None,
            members: 0,
            written: 0,
            max,
            done: false,
        }
    }

    /// The next at most `chunk` (at least 1) bytes of output; `None` after the last member. A
    /// chunk may be empty when about 1 MiB of input (empty members included) gave no output: the
    /// call returns rather than work through the whole input at once.
    pub fn next_chunk(&mut self, chunk: usize) -> Option<Result<Vec<u8>, GzipError>> {
        if self.done {
            return None;
        }
        // One byte past the limit, so that reaching it exactly is told apart from exceeding it.
        let room = (self.max + 1)
            .saturating_sub(self.written)
            .min(chunk.max(1));
        if room == 0 {
            return Some(Err(self.fail(GzipError::TooLarge(self.max))));
        }
        // One buffer per call, not per member: an empty member costs no fresh 64 KiB.
        let mut out = vec![0; room];
        let mut work = 0;
        loop {
            let data = self.data.as_ref();
            if self.member.is_none() {
                let allowed = members_allowed(self.written);
                if self.members >= allowed {
                    return Some(Err(self.fail(GzipError::TooManyMembers(allowed))));
                }
                let body = match member_body(&data[self.pos..]) {
                    Ok(body) => body,
                    Err(e) => return Some(Err(self.fail(e))),
                };
                work += data.len() - self.pos - body.len() + MEMBER_WORK;
                self.pos = data.len() - body.len();
                self.state.reset(DataFormat::Raw);
                self.member = Some((0, 0));
                self.members += 1;
            }
            let end = data.len().min(self.pos + WORK_PER_CHUNK);
            let r = inflate(
                &mut self.state,
                &data[self.pos..end],
                &mut out,
                MZFlush::None,
            );
            self.pos += r.bytes_consumed;
            work += r.bytes_consumed;
            let wrote = &out[..r.bytes_written];
            self.written += wrote.len();
            if self.written > self.max {
                return Some(Err(self.fail(GzipError::TooLarge(self.max))));
            }
            let (crc, len) = self.member.unwrap_or_default();
            let (crc, len) = (crc32(crc, wrote), len.wrapping_add(wrote.len() as u32));
            self.member = Some((crc, len));
            match r.status {
                Ok(MZStatus::StreamEnd) => {
                    let Some(trailer) = data.get(self.pos..self.pos + 8) else {
                        return Some(Err(self.fail(GzipError::Truncated)));
                    };
                    let want = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
                    let want_len =
                        u32::from_le_bytes([trailer[4], trailer[5], trailer[6], trailer[7]]);
                    if want != crc || want_len != len {
                        return Some(Err(self.fail(GzipError::Trailer)));
                    }
                    self.pos += 8;
                    work += 8;
                    self.member = None;
                    self.done = self.pos == data.len();
                }
                Ok(_) | Err(MZError::Buf) if r.bytes_consumed > 0 || r.bytes_written > 0 => {}
                Ok(_) | Err(MZError::Buf) => return Some(Err(self.fail(GzipError::Truncated))),
                Err(_) => return Some(Err(self.fail(GzipError::Corrupt))),
            }
            if r.bytes_written > 0 || work >= WORK_PER_CHUNK {
                out.truncate(r.bytes_written);
                return Some(Ok(out));
            }
            if self.done {
                return None;
            }
        }
    }

    /// Ends the stream with `e`: nothing follows an error.
    fn fail(&mut self, e: GzipError) -> GzipError {
        self.done = true;
        e
    }
}

impl<D: AsRef<[u8]>> Iterator for Inflater<D> {
    type Item = Result<Vec<u8>, GzipError>;

    /// 64 KiB at a time.
    fn next(&mut self) -> Option<Self::Item> {
        self.next_chunk(64 * 1024)
    }
}

/// The bytes after a member's header: its deflate data, trailer and whatever follows.
fn member_body(data: &[u8]) -> Result<&[u8], GzipError> {
    if data.len() < 10 {
        return Err(if MAGIC.starts_with(data) {
            GzipError::Truncated
        } else {
            GzipError::NotGzip
        });
    }
    if data[..3] != MAGIC {
        return Err(GzipError::NotGzip);
    }
    let flags = data[3];
    if flags & RESERVED != 0 {
        return Err(GzipError::ReservedFlags);
    }
    let mut pos = 10;
    if flags & FEXTRA != 0 {
        let len = data.get(pos..pos + 2).ok_or(GzipError::Truncated)?;
        pos += 2 + usize::from(u16::from_le_bytes([len[0], len[1]]));
    }
    for flag in [FNAME, FCOMMENT] {
        if flags & flag != 0 {
            let end = data
                .get(pos..)
                .and_then(|s| s.iter().position(|&b| b == 0))
                .ok_or(GzipError::Truncated)?;
            pos += end + 1;
        }
    }
    if flags & FHCRC != 0 {
        let sum = data.get(pos..pos + 2).ok_or(GzipError::Truncated)?;
        if u16::from_le_bytes([sum[0], sum[1]]) != crc32(0, &data[..pos]) as u16 {
            return Err(GzipError::HeaderChecksum);
        }
        pos += 2;
    }
    data.get(pos..).ok_or(GzipError::Truncated)
}

/// Inflates one member's deflate stream onto `out`; returns the input bytes it took.
fn inflate_member(
    state: &mut InflateState,
    input: &[u8],
    out: &mut Vec<u8>,
    max: usize,
) -> Result<usize, GzipError> {
    const CHUNK: usize = 64 * 1024;
    let mut used = 0;
    loop {
        let start = out.len();
        // One byte past the limit, so that reaching it exactly is told apart from exceeding it.
        let room = (max + 1).saturating_sub(start).min(CHUNK);
        if room == 0 {
            return Err(GzipError::TooLarge(max));
        }
        out.resize(start + room, 0);
        let r = inflate(state, &input[used..], &mut out[start..], MZFlush::None);
        used += r.bytes_consumed;
        out.truncate(start + r.bytes_written);
        if out.len() > max {
            return Err(GzipError::TooLarge(max));
        }
        match r.status {
            Ok(MZStatus::StreamEnd) => return Ok(used),
            Ok(_) => {}
            // No progress possible: the input ran out before the stream's end.
            Err(MZError::Buf) if r.bytes_consumed == 0 && r.bytes_written == 0 => {
                return Err(GzipError::Truncated)
            }
            Err(MZError::Buf) => {}
            Err(_) => return Err(GzipError::Corrupt),
        }
        if r.bytes_consumed == 0 && r.bytes_written == 0 {
            return Err(GzipError::Truncated);
        }
    }
}

#[cfg(test)]
mod tests;
