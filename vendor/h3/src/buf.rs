use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::{Buf, BufMut, Bytes};

#[derive(Debug)]
pub(crate) struct BufList<T> {
    bufs: VecDeque<T>,
    /// The bytes held, kept as they change: summed at every call, a frame arriving a byte per
    /// packet cost time quadratic in its length.
    len: usize,
    /// How many of the last pieces are small (copied in, under `SMALL`).
    small_tail: usize,
}

/// A received piece smaller than this is copied rather than kept as a view of the datagram it
/// came in (which it would keep whole).
const SMALL: usize = 1024;
/// Small pieces held apart at most at the end of the list: past it they are joined into one (a
/// frame arriving a byte per packet would otherwise cost a list entry per byte). Only the small
/// ones are joined, so a byte is copied a bounded number of times.
const MAX_PIECES: usize = 64;

impl<T: Buf> BufList<T> {
    pub(crate) fn new() -> BufList<T> {
        BufList {
            bufs: VecDeque::new(),
            len: 0,
            small_tail: 0,
        }
    }

    #[inline]
    #[allow(dead_code)]
    pub(crate) fn push(&mut self, buf: T) {
        debug_assert!(buf.has_remaining());
        self.len += buf.remaining();
        self.small_tail = 0;
        self.bufs.push_back(buf);
    }

    pub fn cursor(&self) -> Cursor<T> {
        Cursor {
            buf: self,
            pos_total: 0,
            index: 0,
            pos_front: 0,
        }
    }
}

impl BufList<Bytes> {
    pub fn take_first_chunk(&mut self) -> Option<Bytes> {
        let chunk = self.bufs.pop_front();
        if let Some(c) = &chunk {
            self.len -= c.len();
        }
        self.small_tail = self.small_tail.min(self.bufs.len());
        chunk
    }

    pub fn take_chunk(&mut self, max_len: usize) -> Option<Bytes> {
        let chunk = self
            .bufs
            .front_mut()
            .map(|chunk| chunk.split_to(usize::min(max_len, chunk.remaining())));
        if let Some(c) = &chunk {
            self.len -= c.len();
        }

        if let Some(front) = self.bufs.front() {
            if front.remaining() == 0 {
                let _ = self.bufs.pop_front();
            }
        }
        self.small_tail = self.small_tail.min(self.bufs.len());
        chunk
    }

    pub fn push_bytes<T>(&mut self, buf: &mut T)
    where
        T: Buf,
    {
        debug_assert!(buf.has_remaining());
        let n = buf.remaining();
        let piece = if n < SMALL {
            let mut owned = bytes::BytesMut::with_capacity(n);
            owned.put(buf);
            owned.freeze()
        } else {
            buf.copy_to_bytes(n)
        };
        self.len += n;
        self.bufs.push_back(piece);
        if n >= SMALL {
            self.small_tail = 0;
            return;
        }
        self.small_tail += 1;
        if self.small_tail > MAX_PIECES {
            let from = self.bufs.len() - self.small_tail;
            let size = self.bufs.iter().skip(from).map(|p| p.len()).sum();
            let mut joined = bytes::BytesMut::with_capacity(size);
            for piece in self.bufs.drain(from..) {
                joined.extend_from_slice(&piece);
            }
            // Joined, it counts as small only while it is.
            self.small_tail = usize::from(size < SMALL);
            self.bufs.push_back(joined.freeze());
        }
    }
}

#[cfg(test)]
impl<T: Buf> From<T> for BufList<T> {
    fn from(b: T) -> Self {
        let mut buf = Self::new();
        buf.push(b);
        buf
    }
}

impl<T: Buf> Buf for BufList<T> {
    #[inline]
    fn remaining(&self) -> usize {
        self.len
    }

    #[inline]
    fn chunk(&self) -> &[u8] {
        self.bufs.front().map(Buf::chunk).unwrap_or_default()
    }

    #[inline]
    fn advance(&mut self, mut cnt: usize) {
        self.len -= cnt;
        while cnt > 0 {
            {
                let front = &mut self.bufs[0];
                let rem = front.remaining();
                if rem > cnt {
                    front.advance(cnt);
                    return;
                } else {
                    front.advance(rem);
                    cnt -= rem;
                }
            }
            self.bufs.pop_front();
            self.small_tail = self.small_tail.min(self.bufs.len());
        }
    }

    #[inline]
    fn chunks_vectored<'t>(&'t self, dst: &mut [IoSlice<'t>]) -> usize {
        if dst.is_empty() {
            return 0;
        }
        let mut vecs = 0;
        for buf in &self.bufs {
            vecs += buf.chunks_vectored(&mut dst[vecs..]);
            if vecs == dst.len() {
                break;
            }
        }
        vecs
    }
}

pub struct Cursor<'a, B> {
    buf: &'a BufList<B>,
    pos_total: usize, // position amongst all bytes
    pos_front: usize, // position in the current front buffer
    index: usize,     // current front buffer index
}

impl<'a, B: Buf> Cursor<'a, B> {
    pub fn position(&self) -> usize {
        self.pos_total
    }
}

impl<'a, B: Buf> Buf for Cursor<'a, B> {
    #[inline]
    fn remaining(&self) -> usize {
        self.buf.remaining() - self.pos_total
    }

    #[inline]
    fn chunk(&self) -> &[u8] {
        &self.buf.bufs[self.index].chunk()[self.pos_front..]
    }

    #[inline]
    fn advance(&mut self, mut cnt: usize) {
        assert!(cnt <= self.buf.remaining() - self.pos_total);
        while cnt > 0 {
            {
                let front = &self.buf.bufs[self.index];
                let rem = front.remaining() - self.pos_front;
                if rem > cnt {
                    self.pos_total += cnt;
                    self.pos_front += cnt;
                    return;
                } else {
                    self.pos_total += rem;
                    self.pos_front = 0;
                    cnt -= rem;
                }
            }
            self.index += 1;
        }
    }

    #[inline]
    fn chunks_vectored<'t>(&'t self, dst: &mut [IoSlice<'t>]) -> usize {
        self.buf.chunks_vectored(dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn cursor_advance() {
        let buf = BufList::from(Bytes::from_static(&[1u8, 2, 3, 4]));
        let mut cur = buf.cursor();
        cur.advance(2);
        assert_eq!(cur.remaining(), 2);
        cur.advance(2);
        assert_eq!(cur.remaining(), 0);
    }
}
