//! Slices kept in shared-memory files (`memfd`): the memory tier's bytes live in a file the
//! kernel can send from, so an HTTP/1.1 hit goes out with `sendfile(2)` (page references, no copy
//! into the socket) while every other reader sees ordinary `Bytes` views of the same pages.
//! Used only with `cache.sendfile`; see `docs/cache.md` "Hits with sendfile".
//!
//! A file is written once, front to back, by the one `SliceBuf` that made it, and never changed
//! afterwards; it is dropped (unmapped, closed) with its last view. Pages the kernel still holds
//! for a socket outlive the file untouched, so an evicted slice can never change bytes in flight.
//! The pages are written through the process's own mapping, so they count in its RSS like the
//! heap they replace.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

/// Slices shorter than this stay on the heap: a file costs a descriptor, a mapping and whole
/// pages, and a short hit gains nothing from `sendfile`.
pub const FILE_MIN: u64 = 64 * 1024;

/// Files alive at once, at most; past it new slices go to the heap (they are served the same,
/// only copied). Each holds a descriptor and a mapping, and `vm.max_map_count` is 65,530 by
/// default.
const MAX_FILES: usize = 16 * 1024;

static LIVE: AtomicUsize = AtomicUsize::new(0);

/// The file limit for this process: `MAX_FILES`, or a quarter of the descriptor limit when that
/// is lower (connections need the rest).
fn max_files() -> usize {
    static MAX: OnceLock<usize> = OnceLock::new();
    *MAX.get_or_init(|| {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `lim` is a valid out-pointer for the call.
        let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
            usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX)
        } else {
            1024
        };
        MAX_FILES.min(soft / 4)
    })
}

/// One slice's shared-memory file and its read-write mapping.
pub struct SliceFile {
    fd: OwnedFd,
    ptr: *mut u8,
    cap: usize,
}

// SAFETY: the mapping is owned by this value; bytes are written only below the writer's cursor
// before any view of them exists (see `SliceBuf`), and views only read.
unsafe impl Send for SliceFile {}
// SAFETY: as above: shared access only ever reads written, never-again-changed bytes.
unsafe impl Sync for SliceFile {}

impl SliceFile {
    /// A file of `cap` bytes (zero pages, none resident yet), or `None` past the file limit or
    /// when the kernel refuses one.
    pub fn create(cap: usize) -> Option<SliceFile> {
        if cap == 0 {
            return None;
        }
        if LIVE.fetch_add(1, Ordering::Relaxed) >= max_files() {
            LIVE.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        match Self::open(cap) {
            Ok(f) => Some(f),
            Err(e) => {
                LIVE.fetch_sub(1, Ordering::Relaxed);
                tracing::debug!(error = %e, "no shared-memory file for a slice; kept on the heap");
                None
            }
        }
    }

    fn open(cap: usize) -> io::Result<SliceFile> {
        // SAFETY: a valid NUL-terminated name and flags; the result is checked.
        let raw = unsafe { libc::memfd_create(c"sluice-slice".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a descriptor just returned to us and owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain syscall on our descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), cap as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh shared mapping of the whole file; checked for MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                cap,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(SliceFile {
            fd,
            ptr: ptr.cast(),
            cap,
        })
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// A view of bytes `start..start + len`, which must be written already.
    fn view(self: &Arc<Self>, start: usize, len: usize) -> Bytes {
        assert!(start + len <= self.cap, "view past the file");
        Bytes::from_owner(View {
            file: self.clone(),
            start,
            len,
        })
    }
}

impl Drop for SliceFile {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, unmapped once; no view outlives `self`.
        unsafe { libc::munmap(self.ptr.cast(), self.cap) };
        LIVE.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Written bytes of a file, as a `Bytes` owner.
struct View {
    file: Arc<SliceFile>,
    start: usize,
    len: usize,
}

impl AsRef<[u8]> for View {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: inside the mapping (checked in `view`), written before the view was made and
        // never written again; the mapping lives as long as `file`.
        unsafe { std::slice::from_raw_parts(self.file.ptr.add(self.start), self.len) }
    }
}

/// A slice being received into a file: bytes are appended, each append handed out as a view.
pub struct FileWriter {
    file: Arc<SliceFile>,
    at: usize,
}

impl FileWriter {
    pub fn new(cap: u64) -> Option<FileWriter> {
        let file = SliceFile::create(usize::try_from(cap).ok()?)?;
        Some(FileWriter {
            file: Arc::new(file),
            at: 0,
        })
    }

    /// Appends `data` and returns its view; `None` (nothing written) when it does not fit.
    pub fn push(&mut self, data: &[u8]) -> Option<Bytes> {
        if data.len() > self.file.cap - self.at {
            return None;
        }
        // SAFETY: `at..at + len` is inside the mapping, past every byte any view covers (views
        // are only made of bytes below `at`), and this writer is the file's only writer.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.file.ptr.add(self.at), data.len());
        }
        let view = self.file.view(self.at, data.len());
        self.at += data.len();
        Some(view)
    }

    /// How many bytes are written.
    pub fn written(&self) -> u64 {
        self.at as u64
    }

    /// What is written so far, as a slice's backing. Later pushes land past it, so it never
    /// covers a byte still being written.
    pub fn backing(&self) -> Backing {
        Backing {
            file: self.file.clone(),
            len: self.at as u64,
        }
    }
}

/// Written bytes of a file as a slice's backing: the whole slice as one view, and its file for
/// `sendfile`. Only a `FileWriter` makes one.
#[derive(Clone)]
pub struct Backing {
    file: Arc<SliceFile>,
    len: u64,
}

impl Backing {
    pub fn whole(&self) -> Bytes {
        self.file.view(0, self.len as usize)
    }

    pub fn file(&self) -> &Arc<SliceFile> {
        &self.file
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Backing(fd {}, {} bytes)", self.file.raw_fd(), self.len)
    }
}

/// A response body as pieces the fast path sends: bytes it writes, and ranges of slice files it
/// hands to `sendfile`. Rides in a cached response's extensions beside the ordinary body (which
/// has the same bytes, for any other writer).
#[derive(Clone, Default)]
pub struct FileBody {
    pub pieces: Vec<Piece>,
}

#[derive(Clone)]
pub enum Piece {
    Bytes(Bytes),
    File {
        file: Arc<SliceFile>,
        offset: u64,
        len: u64,
    },
}

impl Piece {
    pub fn bytes(&self) -> u64 {
        match self {
            Piece::Bytes(b) => b.len() as u64,
            Piece::File { len, .. } => *len,
        }
    }
}

impl FileBody {
    /// Whether any piece is a file range (else the body is no better than its bytes).
    pub fn has_files(&self) -> bool {
        self.pieces.iter().any(|p| matches!(p, Piece::File { .. }))
    }

    /// Bytes in all pieces.
    pub fn total(&self) -> u64 {
        self.pieces.iter().map(Piece::bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_read_what_was_written_and_keep_the_file_alive() {
        let mut w = FileWriter::new(1 << 20).expect("memfd");
        let a = w.push(b"hello ").unwrap();
        let b = w.push(b"world").unwrap();
        let backing = w.backing();
        assert_eq!(backing.len(), 11);
        drop(w);
        let whole = backing.whole();
        drop(backing);
        assert_eq!(&a[..], b"hello ");
        assert_eq!(&b[..], b"world");
        assert_eq!(&whole[..], b"hello world");
        assert_eq!(&whole.slice(3..8)[..], b"lo wo");
    }

    #[test]
    fn a_push_past_the_end_writes_nothing() {
        let mut w = FileWriter::new(8).expect("memfd");
        assert!(w.push(b"12345").is_some());
        assert!(w.push(b"6789").is_none());
        assert_eq!(w.written(), 5);
        assert_eq!(&w.push(b"678").unwrap()[..], b"678");
    }

    #[test]
    fn the_file_holds_the_bytes_for_the_kernel() {
        let mut w = FileWriter::new(4096).expect("memfd");
        w.push(b"abcdef").unwrap();
        let file = w.backing().file().clone();
        let mut buf = [0u8; 6];
        // SAFETY: a valid buffer and descriptor.
        let n = unsafe { libc::pread(file.raw_fd(), buf.as_mut_ptr().cast(), 6, 0) };
        assert_eq!(n, 6);
        assert_eq!(&buf, b"abcdef");
    }
}
