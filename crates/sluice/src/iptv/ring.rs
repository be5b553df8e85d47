//! A hub's shared history: payload chunks in arrival order, addressed by absolute index.
//!
//! One writer (the hub) appends; every subscriber is just an index into it. Chunks are
//! reference-counted `Bytes`, so a read clones handles, never payload. The ring is bounded in
//! bytes; a subscriber whose index has been evicted is "lapped" and the hub's slow-subscriber
//! policy decides what happens to it.

use std::collections::VecDeque;

use bytes::Bytes;
use sluice_media::mpegts;

/// Where a reader starts: chunk index plus a byte offset into that chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub index: u64,
    pub offset: usize,
}

/// Result of a read.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// This many chunks were appended to the output.
    Chunks(usize),
    /// The reader's position was evicted; it lost data.
    Lapped,
}

#[derive(Debug)]
pub struct Ring {
    chunks: VecDeque<Bytes>,
    /// Absolute index of `chunks[0]`.
    base: u64,
    bytes: usize,
    capacity: usize,
}

impl Ring {
    pub fn new(capacity: usize) -> Self {
        Self {
            chunks: VecDeque::new(),
            base: 0,
            bytes: 0,
            capacity: capacity.max(1),
        }
    }

    /// Index one past the newest chunk.
    pub fn end(&self) -> u64 {
        self.base + self.chunks.len() as u64
    }

    /// Payload bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes between `index` and `end` (a reader's lag), or `None` once evicted.
    pub fn lag(&self, index: u64) -> Option<usize> {
        let from = index.checked_sub(self.base)?;
        Some(self.chunks.range(from as usize..).map(Bytes::len).sum())
    }

    /// Appends a chunk, evicting the oldest ones beyond capacity.
    pub fn push(&mut self, chunk: Bytes) {
        self.bytes += chunk.len();
        self.chunks.push_back(chunk);
        while self.bytes > self.capacity && self.chunks.len() > 1 {
            if let Some(old) = self.chunks.pop_front() {
                self.bytes -= old.len();
                self.base += 1;
            }
        }
    }

    /// Clones chunks from `pos` up to `until` (exclusive), at most `max_bytes` worth (always at
    /// least one chunk), into `out`; advances `pos`.
    pub fn read(
        &self,
        pos: &mut Position,
        until: u64,
        max_bytes: usize,
        out: &mut VecDeque<Bytes>,
    ) -> Read {
        if pos.index < self.base {
            return Read::Lapped;
        }
        let mut taken = 0;
        let mut n = 0;
        while pos.index < until.min(self.end()) && (n == 0 || taken < max_bytes) {
            let chunk = &self.chunks[(pos.index - self.base) as usize];
            let part = chunk.slice(pos.offset.min(chunk.len())..);
            taken += part.len();
            out.push_back(part);
            pos.index += 1;
            pos.offset = 0;
            n += 1;
        }
        Read::Chunks(n)
    }

    /// Where a new (or skipped-ahead) reader starts: about `burst` bytes back from `until`,
    /// on a TS random-access point if one is in that span, else on the first TS packet
    /// boundary, else on a chunk boundary (non-TS payloads).
    pub fn start(&self, until: u64, burst: usize) -> Position {
        let until = until.clamp(self.base, self.end());
        let first = self.burst_start(until, burst);
        let span = (first - self.base) as usize..(until - self.base) as usize;
        let found = self
            .chunks
            .range(span.clone())
            .enumerate()
            .find_map(|(i, c)| mpegts::find_random_access(c).map(|off| (i, off)));
        let found = found.or_else(|| {
            self.chunks
                .range(span)
                .enumerate()
                .find_map(|(i, c)| mpegts::find_sync(c).map(|off| (i, off)))
        });
        match found {
            Some((i, offset)) => Position {
                index: first + i as u64,
                offset,
            },
            None => Position {
                index: first,
                offset: 0,
            },
        }
    }

    /// The earliest index such that the chunks from it to `until` hold at most `burst` bytes.
    fn burst_start(&self, until: u64, burst: usize) -> u64 {
        let mut index = until;
        let mut total = 0;
        while index > self.base {
            let len = self.chunks[(index - 1 - self.base) as usize].len();
            if total + len > burst {
                break;
            }
            total += len;
            index -= 1;
        }
        index
    }
}

#[cfg(test)]
#[path = "ring/tests.rs"]
mod tests;
