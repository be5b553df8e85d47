//! The memory tier: slices in a byte-bounded S3-FIFO cache (quick_cache), so a scan of cold objects
//! cannot flush the hot set (see docs/decisions/cache-memory-tier.md).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use quick_cache::sync::Cache;
use quick_cache::{DefaultHashBuilder, Lifecycle, OptionsBuilder, Weighter};

use super::object::SliceKey;
use super::shm::{Backing, FileWriter, FILE_MIN};

/// The bytes of one slice, as the chunks they arrived in (no copy to join them).
#[derive(Debug, Clone)]
pub struct Slice {
    pub chunks: Arc<[Bytes]>,
    pub len: u64,
    /// The shared-memory file the chunks are views of, when they are (`shm.rs`).
    pub file: Option<Backing>,
}

impl Slice {
    pub fn new(chunks: Vec<Bytes>) -> Slice {
        let len = chunks.iter().map(|c| c.len() as u64).sum();
        Slice {
            chunks: chunks.into(),
            len,
            file: None,
        }
    }

    /// The slice as the file its chunks were received into, when `buf` wrote them all.
    pub fn received_in(mut self, buf: &SliceBuf) -> Slice {
        if let Some(w) = &buf.file {
            if w.written() == self.len && !buf.spilled {
                self.file = Some(w.backing());
            }
        }
        self
    }

    /// The same bytes in one piece of exactly `len` bytes, so a hit sends a slice as one frame
    /// (a slice received as views of its `SliceBuf` sent one frame per origin chunk, and hits of
    /// 7 MiB objects were measurably slower). A file-backed slice is already one piece: its
    /// whole file; a short one moves to the heap (`FILE_MIN`).
    pub fn compacted(mut self) -> Slice {
        match self.file.take() {
            Some(b) if b.len() >= FILE_MIN => {
                return Slice {
                    chunks: Arc::from([b.whole()]),
                    len: self.len,
                    file: Some(b),
                };
            }
            Some(_) => return self.copied(),
            None => {}
        }
        if self.chunks.len() <= 1 {
            return self;
        }
        self.copied()
    }

    /// The bytes joined into one heap allocation.
    fn copied(self) -> Slice {
        let mut joined = BytesMut::with_capacity(self.len as usize);
        for c in self.chunks.iter() {
            joined.extend_from_slice(c);
        }
        Slice {
            chunks: Arc::from([joined.freeze()]),
            len: self.len,
            file: None,
        }
    }

    /// The chunks that fall within `from..=to` (offsets inside the slice), trimmed.
    pub fn range(&self, from: u64, to: u64) -> Vec<Bytes> {
        let mut out = Vec::new();
        let mut at = 0u64;
        for c in self.chunks.iter() {
            let (start, end) = (at, at + c.len() as u64);
            at = end;
            if end <= from || start > to {
                continue;
            }
            let lo = from.saturating_sub(start) as usize;
            let hi = (to.saturating_add(1).min(end) - start) as usize;
            out.push(c.slice(lo..hi));
        }
        out
    }
}

/// A slice being received: every chunk is copied on arrival into one allocation of the slice's
/// exact size, and handed out as a view of it. The origin connection's read buffer is then free at
/// once, the readers of a fill and the stored slice share that one allocation, and a slice costs
/// its length, whatever the chunk sizes the origin sent (views into read buffers kept about 1.4×
/// that alive, S4 (d)). With `files` (`cache.sendfile`), from `FILE_MIN` up the allocation is a
/// shared-memory file (`shm.rs`), so the stored slice can be sent with `sendfile`.
pub struct SliceBuf {
    buf: BytesMut,
    file: Option<FileWriter>,
    /// A push did not fit the file and went to the heap: the file no longer holds the slice.
    spilled: bool,
}

impl SliceBuf {
    pub fn new(len: u64, files: bool) -> SliceBuf {
        let file = (files && len >= FILE_MIN)
            .then(|| FileWriter::new(len))
            .flatten();
        SliceBuf {
            buf: BytesMut::with_capacity(if file.is_some() { 0 } else { len as usize }),
            file,
            spilled: false,
        }
    }

    /// Copies `data` in and returns the view of it. Callers never push past the length given
    /// (that would reallocate and break the sharing, not the bytes).
    pub fn push(&mut self, data: &[u8]) -> Bytes {
        if let Some(w) = self.file.as_mut() {
            if let Some(view) = w.push(data) {
                return view;
            }
            self.spilled = true;
        }
        self.buf.extend_from_slice(data);
        self.buf.split().freeze()
    }
}

#[derive(Clone)]
struct ByBytes;

impl Weighter<SliceKey, Slice> for ByBytes {
    fn weight(&self, _key: &SliceKey, val: &Slice) -> u64 {
        // Per-entry bookkeeping counts too, so tiny slices cannot overrun the bound by count.
        val.len + 128
    }
}

/// Counts evictions for the metrics.
#[derive(Clone)]
struct Evictions(Arc<AtomicU64>);

impl Lifecycle<SliceKey, Slice> for Evictions {
    type RequestState = ();

    fn begin_request(&self) -> Self::RequestState {}

    fn on_evict(&self, _state: &mut (), _key: SliceKey, _val: Slice) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// The memory tier.
pub struct MemoryTier {
    cache: Cache<SliceKey, Slice, ByBytes, DefaultHashBuilder, Evictions>,
    evictions: Arc<AtomicU64>,
}

impl MemoryTier {
    pub fn new(capacity: u64, slice_bytes: u64) -> MemoryTier {
        // quick_cache splits the capacity across shards; keep each shard at least 16 slices big so
        // a full slice is always admissible.
        let shards = (capacity / (slice_bytes * 16))
            .clamp(1, 64)
            .next_power_of_two() as usize;
        let shards = if shards as u64 * slice_bytes * 16 > capacity && shards > 1 {
            shards / 2
        } else {
            shards
        };
        let evictions = Arc::new(AtomicU64::new(0));
        let options = OptionsBuilder::new()
            .estimated_items_capacity((capacity / slice_bytes).max(16) as usize)
            .weight_capacity(capacity)
            .shards(shards)
            .build()
            .expect("valid cache options");
        MemoryTier {
            cache: Cache::with_options(
                options,
                ByBytes,
                DefaultHashBuilder::default(),
                Evictions(evictions.clone()),
            ),
            evictions,
        }
    }

    pub fn get(&self, key: &SliceKey) -> Option<Slice> {
        self.cache.get(key)
    }

    pub fn insert(&self, key: SliceKey, slice: Slice) {
        self.cache.insert(key, slice);
    }

    pub fn remove(&self, key: &SliceKey) {
        self.cache.remove(key);
    }

    /// Resizes the tier (the budget gives it what transit does not hold); shrinking evicts.
    pub fn set_capacity(&self, bytes: u64) {
        self.cache.set_capacity(bytes);
    }

    /// Bytes held (including per-entry bookkeeping).
    pub fn weight(&self) -> u64 {
        self.cache.weight()
    }

    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::object::ObjectId;

    fn key(i: u64) -> SliceKey {
        SliceKey {
            object: ObjectId(1),
            generation: 1,
            index: i,
        }
    }

    #[test]
    fn bounded_in_bytes() {
        let slice = 64 * 1024;
        let tier = MemoryTier::new(slice * 32, slice);
        for i in 0..200 {
            tier.insert(
                key(i),
                Slice::new(vec![Bytes::from(vec![0u8; slice as usize])]),
            );
        }
        assert!(tier.weight() <= slice * 32 + 128 * 32, "{}", tier.weight());
        assert!(tier.evictions() > 0);
    }

    #[test]
    fn a_scan_of_cold_slices_does_not_flush_the_hot_set() {
        let slice = 16 * 1024;
        let tier = MemoryTier::new(slice * 64, slice);
        let data = || Slice::new(vec![Bytes::from(vec![0u8; slice as usize])]);
        // A hot set of 16 slices, read several times.
        for i in 0..16 {
            tier.insert(key(i), data());
        }
        for _ in 0..4 {
            for i in 0..16 {
                assert!(tier.get(&key(i)).is_some());
            }
        }
        // One pass over 1000 slices nobody reads again (a crawler, a one-off download).
        for i in 1000..2000 {
            tier.insert(key(i), data());
        }
        let kept = (0..16).filter(|i| tier.get(&key(*i)).is_some()).count();
        assert!(kept >= 14, "only {kept} of 16 hot slices survived the scan");
    }

    #[test]
    fn slice_buf_views_share_one_allocation() {
        let mut buf = SliceBuf::new(6, false);
        let a = buf.push(b"abc");
        let b = buf.push(b"def");
        assert_eq!((&a[..], &b[..]), (&b"abc"[..], &b"def"[..]));
        // Adjacent views of one buffer.
        assert_eq!(a.as_ptr() as usize + 3, b.as_ptr() as usize);
    }

    #[test]
    fn with_files_a_large_slice_is_stored_as_its_file_and_a_short_one_on_the_heap() {
        let data: Vec<u8> = (0..FILE_MIN as usize + 10).map(|i| i as u8).collect();
        let mut buf = SliceBuf::new(data.len() as u64, true);
        let chunks: Vec<Bytes> = data.chunks(7000).map(|c| buf.push(c)).collect();
        let slice = Slice::new(chunks).received_in(&buf).compacted();
        assert!(slice.file.is_some());
        assert_eq!(slice.chunks.len(), 1);
        assert_eq!(&slice.chunks[0][..], &data[..]);
        // A whole-object fill reserves a full slice and may get far less.
        let mut buf = SliceBuf::new(1 << 20, true);
        let chunks = vec![buf.push(b"short"), buf.push(b" body")];
        let slice = Slice::new(chunks).received_in(&buf).compacted();
        assert!(slice.file.is_none());
        assert_eq!(&slice.chunks[0][..], b"short body");
        // Without files, nothing changes.
        let mut buf = SliceBuf::new(data.len() as u64, false);
        let slice = Slice::new(vec![buf.push(&data)]).received_in(&buf);
        assert!(slice.file.is_none());
    }

    #[test]
    fn compacted_joins_chunks_into_one_exact_allocation() {
        let joined =
            Slice::new(vec![Bytes::from_static(b"ab"), Bytes::from_static(b"cde")]).compacted();
        assert_eq!(joined.chunks.len(), 1);
        assert_eq!(joined.len, 5);
        assert_eq!(&joined.chunks[0][..], b"abcde");
    }

    #[test]
    fn range_trims_chunks() {
        let s = Slice::new(vec![
            Bytes::from_static(b"abc"),
            Bytes::from_static(b"defg"),
        ]);
        let join = |v: Vec<Bytes>| v.concat();
        assert_eq!(join(s.range(0, 6)), b"abcdefg");
        assert_eq!(join(s.range(2, 3)), b"cd");
        assert_eq!(join(s.range(4, 4)), b"e");
    }
}
