//! Bounds-checked big-endian cursor over a box payload. No I/O.

use super::Mp4Error;

/// Big-endian reader; every read past the end is a [`Mp4Error::Truncated`].
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
    /// Absolute offset of `data[0]`, so errors point into the original buffer.
    base: usize,
}

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8], base: usize) -> Self {
        Reader { data, pos: 0, base }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    /// Current position relative to the start of the payload.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// The unread bytes, without consuming them.
    pub fn rest(&self) -> &'a [u8] {
        &self.data[self.pos..]
    }

    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], Mp4Error> {
        if n > self.remaining() {
            return Err(Mp4Error::Truncated {
                what: "box field",
                at: self.base + self.pos,
                need: n as u64,
                have: self.remaining(),
            });
        }
        let out = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    pub fn skip(&mut self, n: usize) -> Result<(), Mp4Error> {
        self.bytes(n).map(|_| ())
    }

    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], Mp4Error> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }

    pub fn u8(&mut self) -> Result<u8, Mp4Error> {
        Ok(self.bytes(1)?[0])
    }

    pub fn u16(&mut self) -> Result<u16, Mp4Error> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    pub fn u24(&mut self) -> Result<u32, Mp4Error> {
        let b: [u8; 3] = self.array()?;
        Ok(u32::from_be_bytes([0, b[0], b[1], b[2]]))
    }

    pub fn u32(&mut self) -> Result<u32, Mp4Error> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    pub fn i32(&mut self) -> Result<i32, Mp4Error> {
        Ok(i32::from_be_bytes(self.array()?))
    }

    pub fn u64(&mut self) -> Result<u64, Mp4Error> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    /// Version and flags of a full box.
    pub fn full_box(&mut self) -> Result<(u8, u32), Mp4Error> {
        let v = self.u32()?;
        Ok(((v >> 24) as u8, v & 0x00ff_ffff))
    }

    /// `count` records of `size` bytes each, checked against what is left before slicing.
    pub fn records(
        &mut self,
        what: &'static str,
        count: u64,
        size: usize,
    ) -> Result<&'a [u8], Mp4Error> {
        let total = count
            .checked_mul(size as u64)
            .filter(|&t| t <= self.remaining() as u64)
            .ok_or(Mp4Error::CountOverflow { what, count })?;
        self.bytes(total as usize)
    }
}
