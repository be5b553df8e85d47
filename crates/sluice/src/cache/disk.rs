//! The disk tier: one checksummed file per slice and one record per object, bounded in bytes
//! (oldest written goes first), written by a background task off the request path, and indexed
//! again from the directory at start.
//!
//! A write that finds the queue full is dropped (the slice stays in memory or is fetched again),
//! so a slow or full disk never stalls a request. A file whose length or CRC does not match its
//! header is deleted and reported as a miss, never served.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

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

enum Job {
    Slice(SliceKey, Slice),
    Meta(Arc<ObjectMeta>),
    RemoveObject(ObjectId),
}

#[derive(Default)]
struct Index {
    slices: HashMap<SliceKey, u64>,
    order: VecDeque<SliceKey>,
    bytes: u64,
}

/// The disk tier.
pub struct DiskTier {
    root: PathBuf,
    capacity: u64,
    read_timeout: Duration,
    index: Arc<Mutex<Index>>,
    jobs: mpsc::Sender<Job>,
    pub stats: Arc<DiskStats>,
}

impl DiskTier {
    /// Opens (creating) the directory, indexes what survives from a previous run, and starts the
    /// writer. Returns the object records found, for the object index.
    pub fn open(
        root: &Path,
        capacity: u64,
        queue: usize,
        read_timeout: Duration,
    ) -> std::io::Result<(DiskTier, Vec<ObjectMeta>)> {
        std::fs::create_dir_all(root.join("objects"))?;
        std::fs::create_dir_all(root.join("slices"))?;
        let metas = load_metas(root);
        let generations: HashMap<ObjectId, u64> =
            metas.iter().map(|m| (m.id, m.generation)).collect();
        let index = Arc::new(Mutex::new(load_slices(root, &generations, capacity)));
        let stats = Arc::new(DiskStats::default());
        let (tx, rx) = mpsc::channel(queue);
        tokio::spawn(write_loop(
            root.to_path_buf(),
            capacity,
            index.clone(),
            stats.clone(),
            rx,
        ));
        Ok((
            DiskTier {
                root: root.to_path_buf(),
                capacity,
                read_timeout,
                index,
                jobs: tx,
                stats,
            },
            metas,
        ))
    }

    /// Queues a slice for writing; dropped when the queue is full.
    pub fn write_slice(&self, key: SliceKey, slice: Slice) {
        if slice.len + HEADER > self.capacity {
            return;
        }
        self.submit(Job::Slice(key, slice));
    }

    /// Queues an object record for writing.
    pub fn write_meta(&self, meta: Arc<ObjectMeta>) {
        self.submit(Job::Meta(meta));
    }

    /// Queues removal of an object's record and slices.
    pub fn remove_object(&self, id: ObjectId) {
        // Forget the slices now, so nothing reads them while the files are being deleted.
        {
            let mut idx = self.index.lock().expect("disk index");
            let gone: Vec<SliceKey> = idx
                .slices
                .keys()
                .filter(|k| k.object == id)
                .copied()
                .collect();
            for k in gone {
                if let Some(len) = idx.slices.remove(&k) {
                    idx.bytes -= len;
                }
            }
        }
        // Removal must not be lost to a full queue: fall back to a detached send.
        if let Err(mpsc::error::TrySendError::Full(job)) = self.jobs.try_send(Job::RemoveObject(id))
        {
            let tx = self.jobs.clone();
            tokio::spawn(async move {
                let _ = tx.send(job).await;
            });
        }
    }

    fn submit(&self, job: Job) {
        if self.jobs.try_send(job).is_err() {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Reads and verifies a slice; a corrupt file is deleted and reads as `None`, a read slower than
    /// the timeout reads as `None` too.
    pub async fn read(&self, key: SliceKey) -> Option<Slice> {
        if !self
            .index
            .lock()
            .expect("disk index")
            .slices
            .contains_key(&key)
        {
            return None;
        }
        let path = slice_path(&self.root, &key);
        let read = tokio::task::spawn_blocking(move || read_slice(&path));
        match tokio::time::timeout(self.read_timeout, read).await {
            Ok(Ok(Ok(bytes))) => Some(Slice::new(vec![bytes])),
            Ok(Ok(Err(_))) => {
                self.stats.corrupt.fetch_add(1, Ordering::Relaxed);
                {
                    let mut idx = self.index.lock().expect("disk index");
                    if let Some(len) = idx.slices.remove(&key) {
                        idx.bytes -= len;
                    }
                }
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

    /// Whether the slice is on disk (as far as the index knows).
    pub fn contains(&self, key: &SliceKey) -> bool {
        self.index
            .lock()
            .expect("disk index")
            .slices
            .contains_key(key)
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

async fn write_loop(
    root: PathBuf,
    capacity: u64,
    index: Arc<Mutex<Index>>,
    stats: Arc<DiskStats>,
    mut rx: mpsc::Receiver<Job>,
) {
    while let Some(job) = rx.recv().await {
        let (root, index, stats) = (root.clone(), index.clone(), stats.clone());
        let _ = tokio::task::spawn_blocking(move || run_job(&root, capacity, &index, &stats, job))
            .await;
    }
}

fn run_job(root: &Path, capacity: u64, index: &Mutex<Index>, stats: &DiskStats, job: Job) {
    match job {
        Job::Meta(meta) => {
            if write_file_atomically(&meta_path(root, meta.id), &[&meta.to_bytes()]).is_err() {
                stats.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        Job::RemoveObject(id) => {
            let _ = std::fs::remove_file(meta_path(root, id));
            let prefix = format!("{}-", id.hex());
            if let Ok(dir) = std::fs::read_dir(root.join("slices")) {
                for e in dir.flatten() {
                    if e.file_name().to_string_lossy().starts_with(&prefix) {
                        let _ = std::fs::remove_file(e.path());
                    }
                }
            }
        }
        Job::Slice(key, slice) => {
            let size = slice.len + HEADER;
            // Make room first (oldest written goes), then write; the index only lists whole files.
            let evicted = {
                let mut idx = index.lock().expect("disk index");
                if idx.slices.contains_key(&key) {
                    return;
                }
                let mut evicted = Vec::new();
                while idx.bytes + size > capacity {
                    let Some(old) = idx.order.pop_front() else {
                        break;
                    };
                    if let Some(len) = idx.slices.remove(&old) {
                        idx.bytes -= len;
                        evicted.push(old);
                    }
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
                    let mut idx = index.lock().expect("disk index");
                    idx.slices.insert(key, size);
                    idx.order.push_back(key);
                    idx.bytes += size;
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
/// rest. Oldest files come first in the eviction order.
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
    found.sort_by_key(|(_, _, t)| *t);
    let mut idx = Index::default();
    for (key, size, _) in found {
        if idx.bytes + size > capacity {
            let _ = std::fs::remove_file(slice_path(root, &key));
            continue;
        }
        idx.slices.insert(key, size);
        idx.order.push_back(key);
        idx.bytes += size;
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
