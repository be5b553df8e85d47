//! A hub's shared history: payload chunks in arrival order, addressed by absolute index.
//!
//! One writer (the hub) appends; every subscriber is just an index into it. Chunks are
//! reference-counted `Bytes`, so a read clones handles, never payload. What is kept is
//! `history` bytes for new viewers, plus whatever the slowest subscriber has not read yet,
//! never more than `capacity`; a subscriber whose index has been evicted is "lapped" and the
//! hub's slow-subscriber policy decides what happens to it.
//!
//! Both bounds count each chunk as its payload plus `CHUNK_OVERHEAD`, so they bound the
//! number of chunks too: a sender whose every payload lands in a chunk of its own (1-byte
//! RTP payloads sent out of order) would otherwise make millions of chunk handles per channel.

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

/// What one chunk costs in the ring's accounting beyond its payload: its handle in the queue
/// (40 bytes) plus the allocator's share, and the copy of that handle every reader makes.
/// With it, `capacity` also bounds the chunks held (4 MiB: at most 65,536), and a read's
/// `max_bytes` the handles it clones; a chunk of the usual size (one or more 1,316-byte RTP
/// payloads) is charged at most 5% more than before.
pub const CHUNK_OVERHEAD: usize = 64;

#[derive(Debug)]
pub struct Ring {
    /// Each chunk with the stream offset (payload bytes appended before it) it starts at.
    chunks: VecDeque<(u64, Bytes)>,
    /// Absolute index of `chunks[0]`.
    base: u64,
    /// Stream offset of the end: payload bytes ever appended.
    total: u64,
    bytes: usize,
    /// Most bytes held, however far behind a subscriber is, chunks charged `CHUNK_OVERHEAD`.
    capacity: usize,
    /// Bytes always held for new subscribers' instant start, charged like `capacity`.
    history: usize,
}

impl Ring {
    pub fn new(capacity: usize, history: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            chunks: VecDeque::new(),
            base: 0,
            total: 0,
            bytes: 0,
            capacity,
            history: history.min(capacity),
        }
    }

    /// Index of the oldest chunk held.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Index one past the newest chunk.
    pub fn end(&self) -> u64 {
        self.base + self.chunks.len() as u64
    }

    /// Payload bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// What the chunks held are charged against `capacity` and `history`.
    fn charged(&self) -> usize {
        self.bytes + self.chunks.len() * CHUNK_OVERHEAD
    }

    /// Payload bytes between `index` and `end` (a reader's lag), or `None` once evicted.
    /// A reader that has not been placed yet (an index past the end) lags by nothing.
    /// Constant time: the status page asks for every subscriber under the ring lock.
    pub fn lag(&self, index: u64) -> Option<usize> {
        let from = index.checked_sub(self.base)?;
        let start = usize::try_from(from)
            .ok()
            .and_then(|i| self.chunks.get(i))
            .map_or(self.total, |(start, _)| *start);
        Some(usize::try_from(self.total - start).unwrap_or(usize::MAX))
    }

    /// Appends a chunk, evicting the oldest ones beyond capacity.
    pub fn push(&mut self, chunk: Bytes) {
        self.bytes += chunk.len();
        self.chunks.push_back((self.total, chunk));
        self.total = self.chunks.back().map_or(0, |(s, c)| s + c.len() as u64);
        while self.charged() > self.capacity && self.chunks.len() > 1 {
            self.evict();
        }
    }

    /// Evicts chunks every subscriber has read (those before `floor`, the slowest reader's
    /// index) as long as at least `history` of payload stays (what a new viewer's burst looks
    /// back over; `capacity`, charged per chunk, already bounds how many chunks that is).
    pub fn release(&mut self, floor: u64) {
        while self.base < floor {
            match self.chunks.front() {
                Some((_, old)) if self.bytes - old.len() >= self.history => self.evict(),
                _ => break,
            }
        }
    }

    fn evict(&mut self) {
        if let Some((_, old)) = self.chunks.pop_front() {
            self.bytes -= old.len();
            self.base += 1;
        }
    }

    /// Clones chunks from `pos` up to `until` (exclusive), at most `max_bytes` worth (each
    /// charged `CHUNK_OVERHEAD` too, so this bounds the handles cloned under the lock; always
    /// at least one chunk), into `out`; advances `pos`.
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
            let (_, chunk) = &self.chunks[(pos.index - self.base) as usize];
            let part = chunk.slice(pos.offset.min(chunk.len())..);
            taken += part.len() + CHUNK_OVERHEAD;
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
        let from = self.burst_point(until, burst);
        let mut first_sync = None;
        for index in from.index..until {
            let (_, chunk) = &self.chunks[(index - self.base) as usize];
            let skip = if index == from.index {
                aligned(chunk, from.offset)
            } else {
                0
            };
            let Some(sync) = mpegts::find_sync(&chunk[skip..]).map(|s| skip + s) else {
                continue;
            };
            if let Some(rap) = mpegts::find_random_access(&chunk[sync..]) {
                return Position {
                    index,
                    offset: sync + rap,
                };
            }
            first_sync.get_or_insert(Position {
                index,
                offset: sync,
            });
        }
        first_sync.unwrap_or(Position {
            index: if from.offset > 0 {
                from.index + 1
            } else {
                from.index
            },
            offset: 0,
        })
    }

    /// The point `burst` bytes before `until` (or the oldest byte held, if nearer).
    fn burst_point(&self, until: u64, burst: usize) -> Position {
        let mut index = until;
        let mut total = 0;
        while index > self.base {
            let len = self.chunks[(index - 1 - self.base) as usize].1.len();
            if total + len > burst {
                return Position {
                    index: index - 1,
                    offset: len - (burst - total),
                };
            }
            total += len;
            index -= 1;
        }
        Position { index, offset: 0 }
    }
}

/// `offset` moved up to the next TS packet boundary when `chunk` starts on one (payloads are
/// whole packets), so a start point never lands on a stray 0x47 inside a packet.
fn aligned(chunk: &[u8], offset: usize) -> usize {
    if chunk.first() == Some(&mpegts::SYNC_BYTE) {
        offset.next_multiple_of(mpegts::PACKET_LEN).min(chunk.len())
    } else {
        offset
    }
}

#[cfg(test)]
#[path = "ring/tests.rs"]
mod tests;
