//! The disk tier: one checksummed file per slice and one record per object, bounded in bytes
//! (least recently used goes first), written by a background task off the request path, and
//! indexed again from the directory at start.
//!
//! The queue is bounded twice: in bytes, since every queued slice carries its reservation of the
//! cache's byte budget (`budget`), and in slices (`disk_queue`). A writer that finds it full waits
//! for room (backpressure on the fill) rather than dropping the slice: a dropped write is a miss
//! after the next restart. Only a disk too slow to take a slice within `disk_write_timeout_ms`
//! (waiting for room, or waiting in the queue) or a failing / full disk drops entries, counted in
//! `disk_dropped_writes_total`; requests are served either way. [`DiskTier::flush`] lets a
//! graceful shutdown write out what is queued. A file whose length or CRC does not match its
//! header is deleted and reported as a miss, never served.
//!
//! Recency: every write and every verified read moves a slice to the young end of the eviction
//! order, and a read also sets the file's modification time, so the order rebuilt at start (by
//! modification time) is the one the previous run left.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use super::budget::Reservation;
use super::memory::Slice;
use super::object::{ObjectId, ObjectMeta, SliceKey};

const MAGIC: &[u8; 4] = b"SLC1";
const HEADER: u64 = 16;

/// Counters of the disk tier.
#[derive(Default)]
pub struct DiskStats {
    pub written: AtomicU64,
    pub dropped: AtomicU64,
    pub corrupt: AtomicU64,
    pub evictions: AtomicU64,
    pub read_timeouts: AtomicU64,
}

/// The slices between [`DiskTier::write_slice`] and the end of their write (or their drop), each
/// under the number of the call that put it there (a second call for the same slice replaces it,
/// and only its own end takes it out). Their jobs hold the bytes anyway: this shares them.
#[derive(Default)]
struct Queue {
    slices: HashMap<SliceKey, (u64, Slice)>,
    next: u64,
}

/// The queue as the tier and its writer share it.
type Queued = Arc<Mutex<Queue>>;

impl Queue {
    /// Puts `slice` under `key` (in place of any earlier one) and returns its number.
    fn put(&mut self, key: SliceKey, slice: Slice) -> u64 {
        self.next += 1;
        self.slices.insert(key, (self.next, slice));
        self.next
    }

    /// The call numbered `seq` is done with `key`.
    fn done(&mut self, key: &SliceKey, seq: u64) {
        if self.slices.get(key).is_some_and(|(s, _)| *s == seq) {
            self.slices.remove(key);
        }
    }
}

/// Takes a slice out of the queue when its [`DiskTier::write_slice`] ends without a job (no room
/// in time, or the call dropped).
struct Unqueue<'a> {
    queued: &'a Queued,
    key: SliceKey,
    seq: Option<u64>,
}

impl Drop for Unqueue<'_> {
    fn drop(&mut self) {
        if let Some(seq) = self.seq {
            self.queued.lock().expect("disk queue").done(&self.key, seq);
        }
    }
}

/// A slice waiting for the writer, with what it holds of the budget and of the queue.
struct QueuedSlice {
    key: SliceKey,
    /// Its number in [`Queue`].
    seq: u64,
    slice: Slice,
    since: Instant,
    _bytes: Option<Reservation>,
    _slot: OwnedSemaphorePermit,
}

enum Job {
    Slice(QueuedSlice),
    Meta(Arc<ObjectMeta>),
    /// An object's version: its slices of that generation, and its record if it is that one.
    RemoveObject(ObjectId, u64),
}

/// The slices on disk: size and recency of each, the eviction order, bytes used.
#[derive(Default)]
struct Index {
    /// Size on disk and the tick of the last use.
    slices: HashMap<SliceKey, (u64, u64)>,
    /// Last use → slice; the first entry is the least recently used.
    order: BTreeMap<u64, SliceKey>,
    tick: u64,
    bytes: u64,
}

impl Index {
    fn contains(&self, key: &SliceKey) -> bool {
        self.slices.contains_key(key)
    }

    /// Lists a slice as the most recently used.
    fn insert(&mut self, key: SliceKey, size: u64) {
        self.remove(&key);
        self.tick += 1;
        self.slices.insert(key, (size, self.tick));
        self.order.insert(self.tick, key);
        self.bytes += size;
    }

    /// Marks a listed slice as just used.
    fn touch(&mut self, key: &SliceKey) {
        if let Some((_, used)) = self.slices.get_mut(key) {
            self.order.remove(used);
            self.tick += 1;
            *used = self.tick;
            self.order.insert(self.tick, *key);
        }
    }

    /// Unlists a slice; returns its size.
    fn remove(&mut self, key: &SliceKey) -> Option<u64> {
        let (size, used) = self.slices.remove(key)?;
        self.order.remove(&used);
        self.bytes -= size;
        Some(size)
    }

    /// Unlists every slice of object `id`'s version `generation`.
    fn remove_object(&mut self, id: ObjectId, generation: u64) {
        let gone: Vec<SliceKey> = self
            .slices
            .keys()
            .filter(|k| k.object == id && k.generation == generation)
            .copied()
            .collect();
        for k in gone {
            self.remove(&k);
        }
    }

    /// Unlists the least recently used slice.
    fn pop_oldest(&mut self) -> Option<SliceKey> {
        let (_, key) = self.order.pop_first()?;
        if let Some((size, _)) = self.slices.remove(&key) {
            self.bytes -= size;
        }
        Some(key)
    }
}

/// The disk tier.
pub struct DiskTier {
    root: PathBuf,
    capacity: u64,
    read_timeout: Duration,
    write_timeout: Duration,
    index: Arc<Mutex<Index>>,
    /// Slices queued and not yet written (or dropped): read from here meanwhile, so a slice the
    /// memory tier lets go before its file exists is not fetched again.
    queued: Queued,
    /// Unbounded as a channel: slices are bounded by `slots` and the budget, object records and
    /// removals are small and one per object stored or dropped.
    jobs: mpsc::UnboundedSender<Job>,
    slots: Arc<Semaphore>,
    /// Jobs queued or being written.
    pending: Arc<AtomicUsize>,
    pub stats: Arc<DiskStats>,
}

/// Timeouts and bounds of the disk tier.
pub struct DiskOptions {
    pub capacity: u64,
    /// Slices queued for the writer at most.
    pub queue: usize,
    pub read_timeout: Duration,
    pub write_timeout: Duration,
}

impl DiskTier {
    /// Opens (creating) the directory, indexes what survives from a previous run, and starts the
    /// writer. Returns the object records found, for the object index.
    pub fn open(root: &Path, opts: DiskOptions) -> std::io::Result<(DiskTier, Vec<ObjectMeta>)> {
        let capacity = opts.capacity;
        std::fs::create_dir_all(root.join("objects"))?;
        std::fs::create_dir_all(root.join("slices"))?;
        let metas = load_metas(root);
        let generations: HashMap<ObjectId, u64> =
            metas.iter().map(|m| (m.id, m.generation)).collect();
        let index = Arc::new(Mutex::new(load_slices(root, &generations, capacity)));
        let stats = Arc::new(DiskStats::default());
        let (tx, rx) = mpsc::unbounded_channel();
        let pending = Arc::new(AtomicUsize::new(0));
        let queued = Queued::default();
        tokio::spawn(write_loop(
            Writer {
                root: root.to_path_buf(),
                capacity,
                write_timeout: opts.write_timeout,
                index: index.clone(),
                queued: queued.clone(),
                stats: stats.clone(),
                pending: pending.clone(),
            },
            rx,
        ));
        Ok((
            DiskTier {
                root: root.to_path_buf(),
                capacity,
                read_timeout: opts.read_timeout,
                write_timeout: opts.write_timeout,
                index,
                queued,
                jobs: tx,
                slots: Arc::new(Semaphore::new(opts.queue)),
                pending,
                stats,
            },
            metas,
        ))
    }

    /// Queues a slice for writing, waiting for room in the queue (at most the write timeout, then
    /// the slice is dropped). `bytes` is the slice's share of the budget, given back once written.
    /// From the call on until the write ends, [`DiskTier::read`] answers from the queue.
    pub async fn write_slice(&self, key: SliceKey, slice: Slice, bytes: Option<Reservation>) {
        if slice.len + HEADER > self.capacity {
            return;
        }
        let seq = self
            .queued
            .lock()
            .expect("disk queue")
            .put(key, slice.clone());
        let mut unqueue = Unqueue {
            queued: &self.queued,
            key,
            seq: Some(seq),
        };
        let slot = match tokio::time::timeout(
            self.write_timeout,
            self.slots.clone().acquire_owned(),
        )
        .await
        {
            Ok(Ok(slot)) => slot,
            _ => {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        // From here the job takes it out (`write_loop`, or `submit` when there is no writer).
        unqueue.seq = None;
        self.submit(Job::Slice(QueuedSlice {
            key,
            seq,
            slice,
            since: Instant::now(),
            _bytes: bytes,
            _slot: slot,
        }));
    }

    /// Waits until every queued job is written (or dropped), at most `grace`; returns whether
    /// the queue is empty. For a graceful shutdown: what is queued is a hit after the restart.
    pub async fn flush(&self, grace: Duration) -> bool {
        let deadline = Instant::now() + grace;
        while self.pending.load(Ordering::Acquire) > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    /// Jobs queued or being written.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Queues an object record for writing.
    pub fn write_meta(&self, meta: Arc<ObjectMeta>) {
        self.submit(Job::Meta(meta));
    }

    /// Queues removal of one version of an object: its slices, and its record unless a newer
    /// version's has replaced it (an object's versions share its id and record file, and a
    /// version dropped late must not take a newer one's files with it).
    pub fn remove_object(&self, id: ObjectId, generation: u64) {
        // Forget the slices now, so nothing reads them while the files are being deleted.
        self.queued
            .lock()
            .expect("disk queue")
            .slices
            .retain(|k, _| k.object != id || k.generation != generation);
        self.index
            .lock()
            .expect("disk index")
            .remove_object(id, generation);
        self.submit(Job::RemoveObject(id, generation));
    }

    fn submit(&self, job: Job) {
        self.pending.fetch_add(1, Ordering::AcqRel);
        if let Err(mpsc::error::SendError(job)) = self.jobs.send(job) {
            // The writer is gone (the runtime is shutting down).
            if let Job::Slice(q) = job {
                self.queued.lock().expect("disk queue").done(&q.key, q.seq);
            }
            self.pending.fetch_sub(1, Ordering::AcqRel);
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Reads and verifies a slice; a corrupt file is deleted and reads as `None`, a read slower than
    /// the timeout reads as `None` too. A slice still queued for writing is answered from the
    /// queue, as it was stored (no file to verify or mark as used yet).
    pub async fn read(&self, key: SliceKey) -> Option<Slice> {
        let queued = self
            .queued
            .lock()
            .expect("disk queue")
            .slices
            .get(&key)
            .map(|(_, s)| s.clone());
        if queued.is_some() {
            return queued;
        }
        if !self.index.lock().expect("disk index").contains(&key) {
            return None;
        }
        let path = slice_path(&self.root, &key);
        let read = tokio::task::spawn_blocking(move || read_slice(&path));
        match tokio::time::timeout(self.read_timeout, read).await {
            Ok(Ok(Ok(bytes))) => {
                self.index.lock().expect("disk index").touch(&key);
                Some(Slice::new(vec![bytes]))
            }
            Ok(Ok(Err(_))) => {
                self.stats.corrupt.fetch_add(1, Ordering::Relaxed);
                self.index.lock().expect("disk index").remove(&key);
                let _ = std::fs::remove_file(slice_path(&self.root, &key));
                None
            }
            Ok(Err(_)) => None,
            Err(_) => {
                self.stats.read_timeouts.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Whether the slice is on disk (as far as the index knows) or queued to be.
    pub fn contains(&self, key: &SliceKey) -> bool {
        let queued = self
            .queued
            .lock()
            .expect("disk queue")
            .slices
            .contains_key(key);
        queued || self.written(key)
    }

    /// Whether the slice's file is written and indexed.
    fn written(&self, key: &SliceKey) -> bool {
        self.index.lock().expect("disk index").contains(key)
    }

    /// Bytes on disk (slice files with their headers).
    pub fn bytes(&self) -> u64 {
        self.index.lock().expect("disk index").bytes
    }
}

fn slice_path(root: &Path, key: &SliceKey) -> PathBuf {
    root.join("slices").join(format!(
        "{}-{:x}-{}",
        key.object.hex(),
        key.generation,
        key.index
    ))
}

fn meta_path(root: &Path, id: ObjectId) -> PathBuf {
    root.join("objects").join(format!("{}.meta", id.hex()))
}

#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("bad header")]
    Header,
    #[error("length mismatch")]
    Length,
    #[error("checksum mismatch")]
    Checksum,
}

fn read_slice(path: &Path) -> Result<Bytes, ReadError> {
    let mut file = std::fs::File::open(path)?;
    let mut head = [0u8; HEADER as usize];
    file.read_exact(&mut head).map_err(|_| ReadError::Header)?;
    if &head[..4] != MAGIC {
        return Err(ReadError::Header);
    }
    let crc = u32::from_le_bytes(head[4..8].try_into().expect("4 bytes"));
    let len = u64::from_le_bytes(head[8..16].try_into().expect("8 bytes"));
    let mut data = Vec::with_capacity(len.min(64 << 20) as usize);
    file.read_to_end(&mut data)?;
    if data.len() as u64 != len {
        return Err(ReadError::Length);
    }
    if crc32fast::hash(&data) != crc {
        return Err(ReadError::Checksum);
    }
    // The recency a restart rebuilds the eviction order from; a failure only costs that.
    let _ = file.set_modified(std::time::SystemTime::now());
    Ok(Bytes::from(data))
}

fn write_file_atomically(path: &Path, parts: &[&[u8]]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        for p in parts {
            f.write_all(p)?;
        }
        // No fsync: a file torn by a crash fails its length or CRC check and is dropped, so
        // durability costs nothing on the write path.
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// What the background writer needs.
#[derive(Clone)]
struct Writer {
    root: PathBuf,
    capacity: u64,
    write_timeout: Duration,
    index: Arc<Mutex<Index>>,
    queued: Queued,
    stats: Arc<DiskStats>,
    pending: Arc<AtomicUsize>,
}

async fn write_loop(w: Writer, mut rx: mpsc::UnboundedReceiver<Job>) {
    while let Some(job) = rx.recv().await {
        let slice = match &job {
            Job::Slice(q) => Some((q.key, q.seq)),
            _ => None,
        };
        let stale = matches!(&job, Job::Slice(q) if q.since.elapsed() > w.write_timeout);
        if stale {
            // The disk is slower than slices arrive: drop rather than hold budget for ever.
            w.stats.dropped.fetch_add(1, Ordering::Relaxed);
        } else {
            let w2 = w.clone();
            let _ = tokio::task::spawn_blocking(move || {
                run_job(&w2.root, w2.capacity, &w2.index, &w2.stats, job)
            })
            .await;
        }
        // Written and indexed, or dropped: either way no longer read from the queue.
        if let Some((key, seq)) = slice {
            w.queued.lock().expect("disk queue").done(&key, seq);
        }
        w.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

fn run_job(root: &Path, capacity: u64, index: &Mutex<Index>, stats: &DiskStats, job: Job) {
    match job {
        Job::Meta(meta) => {
            if write_file_atomically(&meta_path(root, meta.id), &[&meta.to_bytes()]).is_err() {
                stats.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        Job::RemoveObject(id, generation) => {
            // Slices of the version queued before the removal were written and indexed since
            // `remove_object` unlisted the others: unlisted too, before their files go.
            index
                .lock()
                .expect("disk index")
                .remove_object(id, generation);
            // The record goes only if it is this version's (records are replaced by rename, so
            // one that cannot be read is not half a newer one).
            let path = meta_path(root, id);
            let newer = std::fs::read(&path)
                .ok()
                .and_then(|b| ObjectMeta::from_bytes(&b))
                .is_some_and(|m| m.generation != generation);
            if !newer {
                let _ = std::fs::remove_file(path);
            }
            let prefix = format!("{}-{:x}-", id.hex(), generation);
            if let Ok(dir) = std::fs::read_dir(root.join("slices")) {
                for e in dir.flatten() {
                    if e.file_name().to_string_lossy().starts_with(&prefix) {
                        let _ = std::fs::remove_file(e.path());
                    }
                }
            }
        }
        Job::Slice(q) => {
            let (key, slice) = (q.key, &q.slice);
            let size = slice.len + HEADER;
            // Make room first (least recently used goes), then write; the index only lists
            // whole files.
            let evicted = {
                let mut idx = index.lock().expect("disk index");
                if idx.contains(&key) {
                    return;
                }
                let mut evicted = Vec::new();
                while idx.bytes + size > capacity {
                    let Some(old) = idx.pop_oldest() else {
                        break;
                    };
                    evicted.push(old);
                }
                evicted
            };
            for old in evicted {
                stats.evictions.fetch_add(1, Ordering::Relaxed);
                let _ = std::fs::remove_file(slice_path(root, &old));
            }
            let mut hasher = crc32fast::Hasher::new();
            for c in slice.chunks.iter() {
                hasher.update(c);
            }
            let mut head = Vec::with_capacity(HEADER as usize);
            head.extend_from_slice(MAGIC);
            head.extend_from_slice(&hasher.finalize().to_le_bytes());
            head.extend_from_slice(&slice.len.to_le_bytes());
            let mut parts: Vec<&[u8]> = vec![&head];
            parts.extend(slice.chunks.iter().map(|c| c.as_ref()));
            match write_file_atomically(&slice_path(root, &key), &parts) {
                Ok(()) => {
                    index.lock().expect("disk index").insert(key, size);
                    stats.written.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {
                    // Disk full or failing: the entry is dropped, requests go on.
                    stats.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

fn load_metas(root: &Path) -> Vec<ObjectMeta> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir(root.join("objects")) else {
        return out;
    };
    for e in dir.flatten() {
        let path = e.path();
        let meta = std::fs::read(&path)
            .ok()
            .and_then(|b| ObjectMeta::from_bytes(&b));
        match meta {
            Some(m) if path.file_name() == meta_path(root, m.id).file_name() => out.push(m),
            _ => {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    out
}

/// Lists slice files whose name, object version and size agree with their header; deletes the
/// rest. The least recently used (oldest modification time) come first in the eviction order.
fn load_slices(root: &Path, generations: &HashMap<ObjectId, u64>, capacity: u64) -> Index {
    let mut found = Vec::new();
    if let Ok(dir) = std::fs::read_dir(root.join("slices")) {
        for e in dir.flatten() {
            let path = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            let ok = parse_slice_name(&name)
                .filter(|k| generations.get(&k.object) == Some(&k.generation))
                .and_then(|k| {
                    let md = e.metadata().ok()?;
                    let len = header_len(&path)?;
                    (md.len() == len + HEADER).then(|| (k, md.len(), md.modified().ok()))
                });
            match ok {
                Some(entry) => found.push(entry),
                None => {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
    }
    // Newest first: over the capacity (a smaller disk_bytes than last run), the least recently
    // used go.
    found.sort_by_key(|(_, _, t)| std::cmp::Reverse(*t));
    let mut kept = Vec::new();
    let mut bytes = 0;
    for (key, size, _) in found {
        if bytes + size > capacity {
            let _ = std::fs::remove_file(slice_path(root, &key));
            continue;
        }
        bytes += size;
        kept.push((key, size));
    }
    let mut idx = Index::default();
    for (key, size) in kept.into_iter().rev() {
        idx.insert(key, size);
    }
    idx
}

fn header_len(path: &Path) -> Option<u64> {
    let mut head = [0u8; HEADER as usize];
    std::fs::File::open(path).ok()?.read_exact(&mut head).ok()?;
    (&head[..4] == MAGIC).then(|| u64::from_le_bytes(head[8..16].try_into().expect("8 bytes")))
}

fn parse_slice_name(name: &str) -> Option<SliceKey> {
    let mut parts = name.split('-');
    let object = u128::from_str_radix(parts.next()?, 16).ok()?;
    let generation = u64::from_str_radix(parts.next()?, 16).ok()?;
    let index = parts.next()?.parse().ok()?;
    if parts.next().is_some() {
        return None;
    }
    Some(SliceKey {
        object: ObjectId(object),
        generation,
        index,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_names_round_trip() {
        let k = SliceKey {
            object: ObjectId(0xabc),
            generation: 0xdead,
            index: 42,
        };
        let p = slice_path(Path::new("/x"), &k);
        assert_eq!(
            parse_slice_name(p.file_name().unwrap().to_str().unwrap()),
            Some(k)
        );
        assert_eq!(parse_slice_name("zz-1-1"), None);
        assert_eq!(parse_slice_name("1-1-1.tmp"), None);
    }

    fn key(index: u64) -> SliceKey {
        SliceKey {
            object: ObjectId(7),
            generation: 1,
            index,
        }
    }

    #[test]
    fn index_evicts_the_least_recently_used() {
        let mut idx = Index::default();
        for i in 0..3 {
            idx.insert(key(i), 10);
        }
        assert_eq!(idx.bytes, 30);
        // Slice 0 is read again: 1 is now the least recently used, then 2, then 0.
        idx.touch(&key(0));
        assert_eq!(idx.pop_oldest(), Some(key(1)));
        assert_eq!(idx.pop_oldest(), Some(key(2)));
        idx.insert(key(3), 5);
        assert_eq!(idx.remove(&key(0)), Some(10));
        assert_eq!(idx.bytes, 5);
        assert_eq!(idx.pop_oldest(), Some(key(3)));
        assert_eq!(idx.pop_oldest(), None);
        assert_eq!(idx.bytes, 0);
    }

    #[tokio::test]
    async fn reads_keep_slices_and_restart_keeps_the_order() {
        let dir = tempfile::tempdir().unwrap();
        let slice = |b: u8| Slice::new(vec![Bytes::from(vec![b; 100])]);
        let meta_gen: HashMap<ObjectId, u64> = [(ObjectId(7), 1)].into();
        // Room for three slices of 100 bytes (plus headers), not four.
        let cap = 3 * (100 + HEADER);
        let (tier, _) = DiskTier::open(dir.path(), opts(cap)).unwrap();
        for i in 0..3 {
            tier.write_slice(key(i), slice(i as u8), None).await;
            wait_for(&tier, key(i)).await;
            // Distinct modification times for the order a restart rebuilds.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Slice 0 was written first but read last: slice 1 is the one to go.
        assert_eq!(tier.read(key(0)).await.unwrap().len, 100);
        tier.write_slice(key(3), slice(3), None).await;
        wait_for(&tier, key(3)).await;
        assert!(tier.contains(&key(0)) && !tier.contains(&key(1)));
        assert!(tier.contains(&key(2)) && tier.contains(&key(3)));
        assert!(!slice_path(dir.path(), &key(1)).exists());
        drop(tier);
        // A restart with room for two keeps the two most recently used: 3 (written) and 0 (read
        // after 2 was written).
        tokio::time::sleep(Duration::from_millis(20)).await;
        let idx = load_slices(dir.path(), &meta_gen, 2 * (100 + HEADER));
        assert!(idx.contains(&key(0)) && idx.contains(&key(3)));
        assert!(!idx.contains(&key(2)));
        assert!(!slice_path(dir.path(), &key(2)).exists());
    }

    fn opts(capacity: u64) -> DiskOptions {
        DiskOptions {
            capacity,
            queue: 16,
            read_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(5),
        }
    }

    #[tokio::test]
    async fn a_full_queue_waits_instead_of_dropping_and_flush_writes_it_out() {
        let dir = tempfile::tempdir().unwrap();
        let (tier, _) = DiskTier::open(
            dir.path(),
            DiskOptions {
                queue: 2,
                ..opts(1 << 30)
            },
        )
        .unwrap();
        // Far more slices than the queue holds, submitted as fast as the queue lets them in.
        for i in 0..64 {
            tier.write_slice(
                key(i),
                Slice::new(vec![Bytes::from(vec![i as u8; 4096])]),
                None,
            )
            .await;
        }
        assert!(tier.flush(Duration::from_secs(10)).await);
        assert_eq!(tier.pending(), 0);
        assert_eq!(tier.stats.dropped.load(Ordering::Relaxed), 0);
        for i in 0..64 {
            assert!(tier.contains(&key(i)), "slice {i} was not written");
            assert_eq!(tier.read(key(i)).await.unwrap().len, 4096);
        }
    }

    /// A slice is read from the queue until its file is written, so a slice the memory tier
    /// lets go meanwhile is still a hit (it was fetched a second time); a removal forgets it.
    #[tokio::test]
    async fn a_queued_slice_is_read_before_its_file_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let (tier, _) = DiskTier::open(dir.path(), opts(1 << 20)).unwrap();
        let slice = Slice::new(vec![Bytes::from(vec![9u8; 100])]);
        // The writer is a task on this (current-thread) runtime: it has not run yet.
        tier.write_slice(key(0), slice.clone(), None).await;
        assert!(!tier.written(&key(0)));
        assert!(tier.contains(&key(0)));
        let read = tier.read(key(0)).await.expect("read from the queue");
        assert_eq!(read.chunks[0], slice.chunks[0]);
        assert!(!tier.written(&key(0)));
        // Once written it is read from its file, and the queue holds nothing. (The writer lists
        // the file, then takes the slice out of the queue: `flush` waits for both, where
        // `written` alone would look between the two.)
        assert!(tier.flush(Duration::from_secs(10)).await);
        assert!(tier.written(&key(0)));
        assert!(tier.queued.lock().unwrap().slices.is_empty());
        assert_eq!(tier.read(key(0)).await.unwrap().chunks[0], slice.chunks[0]);
        // An object removed while its slice is queued is not read from the queue.
        tier.write_slice(key(1), slice.clone(), None).await;
        tier.remove_object(key(1).object, key(1).generation);
        assert!(!tier.contains(&key(1)) && tier.read(key(1)).await.is_none());
        assert!(tier.flush(Duration::from_secs(5)).await);
        assert!(tier.queued.lock().unwrap().slices.is_empty());
        // Its job, ahead of the removal's, wrote it; the removal unlisted it with its file.
        assert!(!tier.contains(&key(1)) && !slice_path(dir.path(), &key(1)).exists());
        // A slice waiting for room in a full queue is read from the queue meanwhile; one that
        // never got room is not.
        let (tier, _) = DiskTier::open(
            dir.path(),
            DiskOptions {
                queue: 1,
                write_timeout: Duration::from_millis(300),
                ..opts(1 << 20)
            },
        )
        .unwrap();
        let full = tier.slots.clone().acquire_owned().await.unwrap();
        let waiting = tier.write_slice(key(2), slice.clone(), None);
        let mut waiting = std::pin::pin!(waiting);
        assert!(
            futures_util::FutureExt::now_or_never(waiting.as_mut()).is_none(),
            "it waits for room"
        );
        assert!(tier.contains(&key(2)));
        assert!(tier.read(key(2)).await.is_some());
        waiting.await;
        assert!(!tier.contains(&key(2)) && tier.read(key(2)).await.is_none());
        assert_eq!(tier.stats.dropped.load(Ordering::Relaxed), 1);
        // Two calls for one slice: the first one's end leaves the second's entry.
        drop(full);
        let mut q = Queue::default();
        let first = q.put(key(3), slice.clone());
        let second = q.put(key(3), slice.clone());
        q.done(&key(3), first);
        assert!(q.slices.contains_key(&key(3)));
        q.done(&key(3), second);
        assert!(q.slices.is_empty());
    }

    /// Two versions of one object share its id and record file: dropping the older one (late,
    /// after the newer was stored) takes only its own slices, and leaves the newer's record and
    /// slices on disk, where a restart finds them.
    #[tokio::test]
    async fn removing_an_old_version_leaves_the_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let (tier, _) = DiskTier::open(dir.path(), opts(1 << 20)).unwrap();
        let old = crate::cache::index::tests::meta("k", vec![], "", 1);
        let new = crate::cache::index::tests::meta("k", vec![], "", 3);
        let at = |m: &ObjectMeta, index| SliceKey {
            object: m.id,
            generation: m.generation,
            index,
        };
        let slice = |b: u8| Slice::new(vec![Bytes::from(vec![b; 100])]);
        tier.write_meta(old.clone());
        tier.write_slice(at(&old, 0), slice(1), None).await;
        tier.write_meta(new.clone());
        tier.write_slice(at(&new, 0), slice(3), None).await;
        tier.remove_object(old.id, old.generation);
        assert!(tier.flush(Duration::from_secs(10)).await);
        assert!(!tier.contains(&at(&old, 0)));
        assert!(!slice_path(dir.path(), &at(&old, 0)).exists());
        assert_eq!(tier.read(at(&new, 0)).await.unwrap().chunks[0][0], 3);
        drop(tier);
        let (tier, metas) = DiskTier::open(dir.path(), opts(1 << 20)).unwrap();
        assert_eq!(metas.len(), 1);
        assert_eq!(metas[0].generation, 3);
        assert!(tier.contains(&at(&new, 0)));
        // The new version's own removal takes its record too.
        tier.remove_object(new.id, new.generation);
        assert!(tier.flush(Duration::from_secs(10)).await);
        assert!(!meta_path(dir.path(), new.id).exists());
        assert!(!slice_path(dir.path(), &at(&new, 0)).exists());
    }

    /// Until the slice's file is written and indexed: at most 10 s (a write on a loaded machine
    /// can take a second).
    async fn wait_for(tier: &DiskTier, k: SliceKey) {
        for _ in 0..2000 {
            if tier.written(&k) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("slice {k:?} never written");
    }

    #[test]
    fn corrupt_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let data = b"hello slice";
        let mut head = Vec::new();
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
        head.extend_from_slice(&(data.len() as u64).to_le_bytes());
        write_file_atomically(&path, &[&head, data]).unwrap();
        assert_eq!(read_slice(&path).unwrap(), Bytes::from_static(data));
        // Flip one byte of the body.
        let mut raw = std::fs::read(&path).unwrap();
        let last = raw.len() - 1;
        raw[last] ^= 1;
        std::fs::write(&path, &raw).unwrap();
        assert!(matches!(read_slice(&path), Err(ReadError::Checksum)));
        // Truncate it.
        std::fs::write(&path, &raw[..raw.len() - 3]).unwrap();
        assert!(matches!(read_slice(&path), Err(ReadError::Length)));
    }
}
