//! The L4 relay: bytes both ways between two sockets until both sides are done. Plain TCP copies
//! small messages through a stack buffer and moves bulk transfers with `splice(2)` through a pipe
//! (the kernel moves page references; user space never sees the bytes), pipes reused from a pool;
//! anything else (TLS-terminated) takes a buffered copy.
//! A FIN is passed on as `shutdown(Write)` while the other direction keeps flowing; a reset is
//! reported so the caller can reset the other side (SO_LINGER 0) instead of closing it politely.
//! A write that makes no progress for the relay's `stall` time ends it ([`is_stalled`]), whatever
//! the other direction does: a peer that stops reading cannot hold the buffers of what it was sent
//! (the copy buffer, rustls's records, a pipe's pages) by trickling bytes the other way.
//! `feed` moves one HTTP response body of known length the same way, for `/proxy/stream`.

pub mod feed;

use std::cell::Cell;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use socket2::SockRef;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, Interest};
use tokio::net::TcpStream;

/// Which way bytes flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Downstream (client) to upstream (server).
    Up,
    /// Upstream to downstream.
    Down,
}

/// Which socket failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Downstream,
    Upstream,
}

/// Why a relay ended early.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("{0:?} side reset the connection")]
    Reset(Side),
    #[error("{0:?} side: {1}")]
    Io(Side, #[source] io::Error),
}

/// Why a write gave up: it made no progress for the relay's `stall` time (the peer stopped
/// reading). Carried inside the [`RelayError::Io`] of the side written to; see [`is_stalled`].
#[derive(Debug, thiserror::Error)]
#[error("no write progress for {} s: the peer stopped reading", .0.as_secs())]
pub struct Stalled(pub Duration);

/// Whether `e` ended the relay because a write made no progress for its `stall` time.
pub fn is_stalled(e: &RelayError) -> bool {
    matches!(e, RelayError::Io(_, io) if io.get_ref().is_some_and(|inner| inner.is::<Stalled>()))
}

fn stalled(stall: Duration) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, Stalled(stall))
}

/// Waits until `dst` may be writable again, for at most `stall`: called only after a write
/// would have blocked, so a socket that takes its bytes never arms a timer.
async fn writable_within(dst: &TcpStream, stall: Duration) -> io::Result<()> {
    match tokio::time::timeout(stall, dst.writable()).await {
        Ok(r) => r,
        Err(_) => Err(stalled(stall)),
    }
}

/// Bytes moved each way by a finished relay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub up: u64,
    pub down: u64,
}

/// A pipe's default capacity (16 pages).
const SMALL_PIPE: usize = 64 * 1024;
/// Capacity a pipe carrying a bulk transfer is grown to (the default `fs.pipe-max-size`): ten
/// times fewer splice calls per megabyte, which S3 showed roughly doubles streaming throughput.
const BIG_PIPE: usize = 1024 * 1024;
/// How many pipes may be big at once. Pipe pages count against the per-user budget
/// (`fs.pipe-user-pages-soft`, 64 MiB by default; exempt for root), and above it the kernel hands
/// out one-page pipes, so growth stops at half of that budget and later bulk connections keep
/// 64 KiB pipes.
const MAX_BIG_PIPES: usize = 32;
/// Buffer per direction of the buffered copy, held only while bytes flow.
const COPY_BUF: usize = 64 * 1024;
/// The stack buffer a plain TCP direction copies through while its messages are small. A read
/// that fills it marks a bulk transfer, which moves to splice: below this size two copies cost
/// less than the four calls (two splices, their pipe bookkeeping) a spliced chunk takes.
const COPY_CHUNK: usize = 16 * 1024;

/// Empty pipes kept process-wide (two per TCP connection in flight, one per spliced body).
const SHARED_POOL_IDLE: usize = 512;

/// The process's pipe pool: one big-pipe budget for everything that splices (the kernel's
/// per-user pipe quota is one budget too).
pub fn shared_pool() -> &'static PipePool {
    static POOL: std::sync::OnceLock<PipePool> = std::sync::OnceLock::new();
    POOL.get_or_init(|| PipePool::new(SHARED_POOL_IDLE))
}

// === impl PipePool ===

/// A pipe: the kernel buffer one direction of a splice relay goes through.
#[derive(Debug)]
pub struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// Its capacity in bytes.
    capacity: usize,
}

impl Pipe {
    fn new() -> io::Result<Pipe> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: `fds` is a valid two-element array for pipe2 to fill.
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
        unsafe {
            Ok(Pipe {
                read: OwnedFd::from_raw_fd(fds[0]),
                write: OwnedFd::from_raw_fd(fds[1]),
                capacity: SMALL_PIPE,
            })
        }
    }
}

/// Empty pipes kept for the next connection, so a connection costs no pipe2/close syscalls and
/// the fd count stays flat under churn.
#[derive(Debug)]
pub struct PipePool {
    free: Mutex<Free>,
    max_idle: usize,
    /// Pipes grown to `BIG_PIPE` that are still open (in use or pooled).
    big: AtomicUsize,
    /// Pipes taken and not yet given back or closed: what connections and bodies hold now.
    in_use: AtomicUsize,
}

/// The pooled pipes, the big ones apart: they are handed out first, since the budget counts them
/// whether they work or wait here (one left under small ones would keep a bulk transfer small).
#[derive(Debug, Default)]
struct Free {
    small: Vec<Pipe>,
    big: Vec<Pipe>,
}

thread_local! {
    /// Set by [`refuse_pipes_on_this_thread`]: every `take` on this thread fails.
    static REFUSE: Cell<bool> = const { Cell::new(false) };
}

/// For tests: makes every pipe pool refuse pipes to callers on this thread (as under `EMFILE`),
/// so the paths that must do without one can be driven in-process without lowering the
/// descriptor limit of the whole test binary.
#[doc(hidden)]
pub fn refuse_pipes_on_this_thread(refuse: bool) {
    REFUSE.with(|r| r.set(refuse));
}

impl PipePool {
    /// A pool that keeps at most `max_idle` empty pipes.
    pub fn new(max_idle: usize) -> PipePool {
        PipePool {
            free: Mutex::new(Free::default()),
            max_idle,
            big: AtomicUsize::new(0),
            in_use: AtomicUsize::new(0),
        }
    }

    /// An empty pipe: a pooled big one, else a pooled one, else a new one.
    fn take(&self) -> io::Result<Pipe> {
        if REFUSE.with(Cell::get) {
            return Err(io::Error::from_raw_os_error(libc::EMFILE));
        }
        let pooled = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            free.big.pop().or_else(|| free.small.pop())
        };
        let pipe = match pooled {
            Some(p) => p,
            None => Pipe::new()?,
        };
        self.in_use.fetch_add(1, Ordering::Relaxed);
        Ok(pipe)
    }

    /// Returns a pipe known to be empty; a pipe that may still hold bytes is closed instead.
    fn give(&self, pipe: Pipe) {
        self.in_use.fetch_sub(1, Ordering::Relaxed);
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.small.len() + free.big.len() < self.max_idle {
            if pipe.capacity > SMALL_PIPE {
                free.big.push(pipe);
            } else {
                free.small.push(pipe);
            }
        } else {
            drop(free);
            self.close(pipe);
        }
    }

    /// Closes a taken pipe that is not coming back.
    fn forget(&self, pipe: Pipe) {
        self.in_use.fetch_sub(1, Ordering::Relaxed);
        self.close(pipe);
    }

    fn close(&self, pipe: Pipe) {
        if pipe.capacity > SMALL_PIPE {
            self.big.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Grows `pipe` for a bulk transfer if the budget of big pipes allows; a refusal by the kernel
    /// (quota, `pipe-max-size`) leaves it as it was.
    fn grow(&self, pipe: &mut Pipe) {
        if pipe.capacity > SMALL_PIPE {
            return;
        }
        if self
            .big
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < MAX_BIG_PIPES).then_some(n + 1)
            })
            .is_err()
        {
            return;
        }
        // SAFETY: F_SETPIPE_SZ on an open pipe descriptor; on failure the pipe is unchanged.
        let rc = unsafe {
            libc::fcntl(
                pipe.write.as_raw_fd(),
                libc::F_SETPIPE_SZ,
                BIG_PIPE as libc::c_int,
            )
        };
        if rc >= BIG_PIPE as libc::c_int {
            pipe.capacity = BIG_PIPE;
        } else {
            self.big.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Pipes currently grown past the default size.
    #[cfg(test)]
    fn big(&self) -> usize {
        self.big.load(Ordering::Relaxed)
    }

    /// Empty pipes waiting in the pool.
    pub fn idle(&self) -> usize {
        let free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        free.small.len() + free.big.len()
    }

    /// Pipes taken from the pool and not yet back: held by relay directions moving a burst and
    /// by spliced bodies. An idle connection holds none.
    pub fn in_use(&self) -> usize {
        self.in_use.load(Ordering::Relaxed)
    }
}

// === splice relay ===

fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    // SAFETY: both descriptors are open for the duration of the call (borrowed from live owners);
    // null offsets mean "use and advance the file position", which sockets and pipes require.
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Relays between two plain TCP sockets until both directions have ended, each direction
/// adapting to its traffic (see `relay_one`). `on_bytes` is called after every chunk (metrics,
/// idle tracking). A write that makes no progress for `stall` ends the relay ([`is_stalled`]).
pub async fn relay_tcp(
    downstream: &TcpStream,
    upstream: &TcpStream,
    pool: &PipePool,
    stall: Duration,
    on_bytes: &(dyn Fn(Direction, usize) + Sync),
) -> Result<Totals, RelayError> {
    let up = relay_one(downstream, upstream, Direction::Up, pool, stall, on_bytes);
    let down = relay_one(upstream, downstream, Direction::Down, pool, stall, on_bytes);
    let (up, down) = tokio::try_join!(up, down)?;
    Ok(Totals { up, down })
}

/// How one direction currently moves its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `read` into a stack buffer, `write` out: two cheap syscalls per message, and a short read
    /// proves the socket drained, so no third call ends in `EAGAIN`.
    Copy,
    /// socket → pipe → socket: no user-space copy, worth it once chunks are large.
    Splice,
}

/// One direction: starts copying, switches to splice when a read fills the whole copy buffer
/// (a bulk transfer), and back to copying when a burst starts with less than that (small
/// messages again, e.g. the next request on a keep-alive connection).
async fn relay_one(
    src: &TcpStream,
    dst: &TcpStream,
    dir: Direction,
    pool: &PipePool,
    stall: Duration,
    on_bytes: &(dyn Fn(Direction, usize) + Sync),
) -> Result<u64, RelayError> {
    let (src_side, dst_side) = sides(dir);
    let mut pipe = Held { pipe: None, pool };
    let mut mode = Mode::Copy;
    // Cleared when the pool cannot make a pipe (descriptor limit): this direction then copies to
    // its end, which costs CPU but keeps the connection.
    let mut may_splice = true;
    // Bytes a write could not take yet; empty (unallocated) unless the destination is slow.
    let mut rest = Vec::new();
    let mut total = 0u64;
    loop {
        let n = match mode {
            Mode::Copy => {
                let n = copy_chunk(src, dst, &mut rest, stall, src_side, dst_side).await?;
                if n == COPY_CHUNK && may_splice {
                    mode = Mode::Splice;
                }
                n
            }
            Mode::Splice => {
                let (n, fresh) =
                    match splice_chunk(src, dst, &mut pipe, stall, src_side, dst_side).await? {
                        Spliced::Moved { n, fresh } => (n, fresh),
                        Spliced::NoPipe(e) => {
                            tracing::debug!(error = %e, "no pipe for a bulk transfer, copying it");
                            may_splice = false;
                            mode = Mode::Copy;
                            continue;
                        }
                    };
                if n == SMALL_PIPE {
                    // A full small pipe: this direction carries a bulk transfer, worth a bigger pipe.
                    pipe.grow();
                } else if fresh && n > 0 && n < COPY_CHUNK {
                    // A burst that starts small: back to copying; the pipe is empty, so pooled.
                    mode = Mode::Copy;
                    pipe.release();
                }
                n
            }
        };
        if n == 0 {
            // FIN from src (nothing is buffered: every chunk is written before the next read):
            // pass it on, keep the other direction going.
            pipe.release();
            let _ = SockRef::from(dst).shutdown(std::net::Shutdown::Write);
            return Ok(total);
        }
        total += n as u64;
        on_bytes(dir, n);
    }
}

/// What one read-then-write attempt did.
enum Copied {
    /// The source had nothing (its readiness is cleared).
    Nothing,
    /// End of stream.
    Eof,
    /// Bytes read; all written, or the unwritten tail left in `rest`.
    Moved(usize),
}

/// Waits for the source, reads once and writes it all; returns the bytes moved (0: FIN).
async fn copy_chunk(
    src: &TcpStream,
    dst: &TcpStream,
    rest: &mut Vec<u8>,
    stall: Duration,
    src_side: Side,
    dst_side: Side,
) -> Result<usize, RelayError> {
    let n = loop {
        src.readable().await.map_err(|e| classify(src_side, e))?;
        match copy_now(src, dst, rest) {
            Ok(Copied::Nothing) => continue,
            Ok(Copied::Eof) => return Ok(0),
            Ok(Copied::Moved(n)) => break n,
            Err(Failed::Read(e)) => return Err(classify(src_side, e)),
            Err(Failed::Write(e)) => return Err(classify(dst_side, e)),
        }
    };
    while !rest.is_empty() {
        writable_within(dst, stall)
            .await
            .map_err(|e| classify(dst_side, e))?;
        match dst.try_write(&rest[..]) {
            Ok(m) => {
                rest.drain(..m);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(classify(dst_side, e)),
        }
    }
    // Give the memory back: a slow destination is the exception, not the steady state.
    *rest = Vec::new();
    Ok(n)
}

/// Which half of a read-then-write failed.
enum Failed {
    Read(io::Error),
    Write(io::Error),
}

/// The synchronous part of `copy_chunk`: the bytes live on the stack, so an idle connection
/// holds no copy buffer.
fn copy_now(src: &TcpStream, dst: &TcpStream, rest: &mut Vec<u8>) -> Result<Copied, Failed> {
    let mut buf = [MaybeUninit::<u8>::uninit(); COPY_CHUNK];
    let got = Cell::new(None);
    let read = src.try_io(Interest::READABLE, || {
        // SAFETY: `buf` is a live, writable buffer of `COPY_CHUNK` bytes; read(2) writes at most
        // that many and reports how many it wrote.
        let n = unsafe { libc::read(src.as_raw_fd(), buf.as_mut_ptr().cast(), COPY_CHUNK) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        if n > 0 && n < COPY_CHUNK {
            // A short read from a stream socket means its receive queue is empty now (new data
            // raises a fresh edge), so report "would block" to clear the readiness tokio caches:
            // the next read then waits instead of spending a syscall on EAGAIN. The count
            // travels beside the error. tokio's own `AsyncRead` does the same on epoll.
            got.set(Some(n));
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    });
    let n = match (read, got.get()) {
        (_, Some(n)) => n,
        (Ok(0), None) => return Ok(Copied::Eof),
        (Ok(n), None) => n,
        (Err(e), None) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Copied::Nothing),
        (Err(e), None) => return Err(Failed::Read(e)),
    };
    // SAFETY: read(2) initialised the first `n` bytes.
    let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n) };
    let written = match dst.try_write(bytes) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
        Err(e) => return Err(Failed::Write(e)),
    };
    rest.extend_from_slice(&bytes[written..]);
    Ok(Copied::Moved(n))
}

/// What one `splice_chunk` did.
enum Spliced {
    /// Bytes moved (0: FIN), and whether the fill had to wait for the source first (the start
    /// of a new burst).
    Moved { n: usize, fresh: bool },
    /// The pool could make no pipe (descriptor limit); nothing was read.
    NoPipe(io::Error),
}

/// Fills the pipe from `src` once and drains it into `dst`. While the source has nothing the
/// pipe, empty then, goes back to the pool, and one is taken again when bytes come: a connection
/// that went quiet after a bulk transfer holds no pipe (two descriptors, and a share of the
/// big-pipe budget that other bulk transfers would otherwise go without) until it is busy again.
async fn splice_chunk(
    src: &TcpStream,
    dst: &TcpStream,
    held: &mut Held<'_>,
    stall: Duration,
    src_side: Side,
    dst_side: Side,
) -> Result<Spliced, RelayError> {
    let mut fresh = false;
    // Fill: socket → pipe. The pipe is empty here, so EAGAIN can only mean the socket has
    // nothing, and clearing its read readiness is right. A short splice proves nothing (the
    // pipe may have run out of slots), so unlike a read it does not clear readiness. The wait
    // is immediate while readiness is cached, and is also where a direction that always has
    // bytes gives up its turn (the runtime's cooperative budget): `try_io` alone never would.
    let n = loop {
        if fresh {
            held.release();
        }
        src.readable().await.map_err(|e| classify(src_side, e))?;
        let p = match held.get_or_take() {
            Ok(p) => p,
            Err(e) => return Ok(Spliced::NoPipe(e)),
        };
        match src.try_io(Interest::READABLE, || {
            splice(src.as_raw_fd(), p.write.as_raw_fd(), p.capacity)
        }) {
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => fresh = true,
            Err(e) => return Err(classify(src_side, e)),
        }
    };
    let p = held.pipe.as_ref().expect("held for the fill");
    // Drain: pipe → socket, all of it before reading again (so EAGAIN is the socket's). Tried
    // first (`try_io` makes no call while the socket is known not writable), waited for, within
    // `stall`, only when it would block.
    let mut in_pipe = n;
    while in_pipe > 0 {
        match dst.try_io(Interest::WRITABLE, || {
            splice(p.read.as_raw_fd(), dst.as_raw_fd(), in_pipe)
        }) {
            Ok(m) => in_pipe -= m,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => writable_within(dst, stall)
                .await
                .map_err(|e| classify(dst_side, e))?,
            Err(e) => return Err(classify(dst_side, e)),
        }
    }
    Ok(Spliced::Moved { n, fresh })
}

/// A pipe taken from the pool while a direction splices a burst: returned by `release` once known
/// empty (at the burst's end, or while the source has nothing), otherwise closed (and its share
/// of the big-pipe budget given back) when dropped.
struct Held<'a> {
    pipe: Option<Pipe>,
    pool: &'a PipePool,
}

impl Held<'_> {
    /// The held pipe, taken from the pool on first use.
    fn get_or_take(&mut self) -> io::Result<&Pipe> {
        if self.pipe.is_none() {
            self.pipe = Some(self.pool.take()?);
        }
        Ok(self.pipe.as_ref().expect("just taken"))
    }

    /// Grows the held pipe for a bulk transfer (within the pool's budget).
    fn grow(&mut self) {
        if let Some(pipe) = self.pipe.as_mut() {
            self.pool.grow(pipe);
        }
    }

    fn release(&mut self) {
        if let Some(pipe) = self.pipe.take() {
            self.pool.give(pipe);
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Some(pipe) = self.pipe.take() {
            self.pool.forget(pipe);
        }
    }
}

fn sides(dir: Direction) -> (Side, Side) {
    match dir {
        Direction::Up => (Side::Downstream, Side::Upstream),
        Direction::Down => (Side::Upstream, Side::Downstream),
    }
}

fn classify(side: Side, e: io::Error) -> RelayError {
    match e.kind() {
        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe => RelayError::Reset(side),
        _ => RelayError::Io(side, e),
    }
}

// === buffered relay ===

/// Relays between any two byte streams with one buffer per direction (TLS-terminated listeners,
/// where the bytes must pass through user space to be decrypted anyway). A write that makes no
/// progress for `stall` ends the relay ([`is_stalled`]).
pub async fn copy_both<D, U>(
    downstream: D,
    upstream: U,
    stall: Duration,
    on_bytes: &(dyn Fn(Direction, usize) + Sync),
) -> Result<Totals, RelayError>
where
    D: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let (mut dr, mut dw) = tokio::io::split(downstream);
    let (mut ur, mut uw) = tokio::io::split(upstream);
    let up = copy_one(&mut dr, &mut uw, Direction::Up, stall, on_bytes);
    let down = copy_one(&mut ur, &mut dw, Direction::Down, stall, on_bytes);
    let (up, down) = tokio::try_join!(up, down)?;
    Ok(Totals { up, down })
}

/// One direction of the buffered relay. Its copy buffer exists only while bytes flow (see
/// `poll_fill`), so a TLS connection that sits idle holds none, as a plain one holds no pipe.
async fn copy_one<R, W>(
    src: &mut R,
    dst: &mut W,
    dir: Direction,
    stall: Duration,
    on_bytes: &(dyn Fn(Direction, usize) + Sync),
) -> Result<u64, RelayError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (src_side, dst_side) = sides(dir);
    let mut buf = CopyBuf::default();
    let mut total = 0u64;
    loop {
        let n = match std::future::poll_fn(|cx| poll_fill(src, &mut buf, cx)).await {
            Ok(n) => n,
            // A TLS client that closes its TCP stream without close_notify (rustls: UnexpectedEof)
            // has ended its stream, as most TLS stacks (and HAProxy) take it: passed on as a FIN,
            // so the upstream's answer still flows back, not as a reset that loses it.
            Err(e) if src_side == Side::Downstream && e.kind() == io::ErrorKind::UnexpectedEof => 0,
            Err(e) => return Err(classify(src_side, e)),
        };
        if n == 0 {
            buf.free();
            // Ignore a failed shutdown: the peer may already be gone, which the other direction sees.
            let _ = dst.shutdown().await;
            return Ok(total);
        }
        write_within(dst, buf.bytes(), stall)
            .await
            .map_err(|e| classify(dst_side, e))?;
        total += n as u64;
        on_bytes(dir, n);
    }
}

/// Writes all of `bytes`, each write given `stall` to make progress. Before, a plain `write_all`
/// waited for good on a peer that stopped reading, holding the copy buffer and the TLS
/// library's records for it, while bytes the other way kept the idle timer from firing.
async fn write_within<W: AsyncWrite + Unpin>(
    dst: &mut W,
    mut bytes: &[u8],
    stall: Duration,
) -> io::Result<()> {
    while !bytes.is_empty() {
        match tokio::time::timeout(stall, dst.write(bytes)).await {
            Ok(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(Ok(n)) => bytes = &bytes[n..],
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(stalled(stall)),
        }
    }
    Ok(())
}

/// Copy buffers of the buffered relay allocated now, process-wide (two per TLS connection at
/// most, none for one that is idle).
static COPY_BUFFERS: AtomicUsize = AtomicUsize::new(0);

/// How many buffered-relay copy buffers (`COPY_BUF` each) are allocated now.
pub fn copy_buffers() -> usize {
    COPY_BUFFERS.load(Ordering::Relaxed)
}

/// A buffered direction's copy buffer: unallocated while the direction is idle.
#[derive(Default)]
struct CopyBuf {
    bytes: Vec<u8>,
}

impl CopyBuf {
    /// The bytes of the last read.
    fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The buffer, emptied, allocated if it was not.
    fn hold(&mut self) -> &mut Vec<u8> {
        if self.bytes.capacity() == 0 {
            self.bytes = Vec::with_capacity(COPY_BUF);
            COPY_BUFFERS.fetch_add(1, Ordering::Relaxed);
        }
        self.bytes.clear();
        &mut self.bytes
    }

    fn free(&mut self) {
        if self.bytes.capacity() != 0 {
            self.bytes = Vec::new();
            COPY_BUFFERS.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for CopyBuf {
    fn drop(&mut self) {
        self.free();
    }
}

/// Reads once from `src` into `buf`. While bytes keep coming they are read straight into the
/// held buffer; once `src` has nothing the buffer is freed, and the wait for the next bytes
/// polls with a stack buffer that lives only for that poll (a future holding it across the
/// await would keep it as long as the connection), the heap buffer allocated again only when
/// bytes arrive.
fn poll_fill<R: AsyncRead + Unpin>(
    src: &mut R,
    buf: &mut CopyBuf,
    cx: &mut std::task::Context<'_>,
) -> std::task::Poll<io::Result<usize>> {
    use std::task::Poll;
    if buf.bytes.capacity() != 0 {
        let held = buf.hold();
        let polled = tokio_util::io::poll_read_buf(std::pin::Pin::new(&mut *src), cx, held);
        if polled.is_pending() {
            // Drained: give the memory back until the source has bytes again.
            buf.free();
        }
        return polled;
    }
    let mut stack = [MaybeUninit::<u8>::uninit(); COPY_CHUNK];
    let mut read = tokio::io::ReadBuf::uninit(&mut stack);
    match std::pin::Pin::new(&mut *src).poll_read(cx, &mut read) {
        Poll::Ready(Ok(())) => {
            let got = read.filled();
            if !got.is_empty() {
                buf.hold().extend_from_slice(got);
            }
            Poll::Ready(Ok(got.len()))
        }
        other => other.map_ok(|()| 0),
    }
}

/// Makes the next close of `stream` send a RST instead of a FIN (SO_LINGER with a zero timeout).
pub fn reset_on_close(stream: &TcpStream) {
    let _ = SockRef::from(stream).set_linger(Some(std::time::Duration::ZERO));
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[test]
    fn pool_reuses_and_caps() {
        let pool = PipePool::new(2);
        let a = pool.take().unwrap();
        let b = pool.take().unwrap();
        let c = pool.take().unwrap();
        let a_fd = a.read.as_raw_fd();
        pool.give(a);
        pool.give(b);
        pool.give(c);
        assert_eq!(pool.idle(), 2);
        // Last in, first out: the most recently returned pipe comes back.
        let again = pool.take().unwrap();
        assert_ne!(again.read.as_raw_fd(), a_fd);
        assert_eq!(pool.idle(), 1);
    }

    #[test]
    fn big_pipes_stay_within_budget() {
        let pool = PipePool::new(MAX_BIG_PIPES + 4);
        let mut pipes: Vec<Pipe> = (0..MAX_BIG_PIPES + 2)
            .map(|_| pool.take().unwrap())
            .collect();
        for p in &mut pipes {
            pool.grow(p);
        }
        let grown = pipes.iter().filter(|p| p.capacity == BIG_PIPE).count();
        // The kernel may refuse (pipe-max-size, quota); it must never exceed the budget.
        assert!(grown <= MAX_BIG_PIPES);
        assert_eq!(pool.big(), grown);
        // Pooled big pipes keep their share; closed ones give it back.
        let first = pipes.remove(0);
        let was_big = first.capacity == BIG_PIPE;
        pool.forget(first);
        assert_eq!(pool.big(), grown - usize::from(was_big));
        assert_eq!(pool.in_use(), MAX_BIG_PIPES + 1);
        for p in pipes {
            pool.give(p);
        }
        assert_eq!(pool.big(), grown - usize::from(was_big));
        assert_eq!(pool.in_use(), 0);
        // A pooled big pipe is handed out before the small ones returned after it.
        let small = Pipe::new().unwrap();
        pool.in_use.fetch_add(1, Ordering::Relaxed);
        pool.give(small);
        let next = pool.take().unwrap();
        assert_eq!(next.capacity == BIG_PIPE, grown - usize::from(was_big) > 0);
        pool.give(next);
    }

    /// Two connected sockets on loopback: (the side a test drives, the side the relay owns).
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (outer, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (outer.unwrap(), accepted.unwrap().0)
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[tokio::test]
    async fn small_bulk_small_on_one_connection_keeps_every_byte() {
        let (mut client, down) = pair().await;
        let (up, mut server) = pair().await;
        // The server echoes until the client's FIN, then closes its side.
        let echo = tokio::spawn(async move {
            let (mut r, mut w) = server.split();
            tokio::io::copy(&mut r, &mut w).await.unwrap();
            w.shutdown().await.unwrap();
        });
        let pool = PipePool::new(4);
        let relay = tokio::spawn(async move {
            let pool = pool;
            let totals = relay_tcp(&down, &up, &pool, Duration::from_secs(60), &|_, _| {})
                .await
                .unwrap();
            (totals, pool.idle())
        });
        // Copy mode, then a bulk message (splice, the pipe grows), then small ones again on the
        // same connection, as a keep-alive client would send them.
        let sizes = [13usize, 3 * 1024 * 1024 + 7, 100, COPY_CHUNK, 65_536, 5, 1];
        let mut sent = 0u64;
        let (mut cr, mut cw) = client.split();
        for (k, &n) in sizes.iter().enumerate() {
            let msg = pattern(n, k as u8);
            let mut back = vec![0u8; n];
            let (w, r) = tokio::join!(cw.write_all(&msg), cr.read_exact(&mut back));
            w.unwrap();
            r.unwrap();
            assert!(back == msg, "message {k} ({n} bytes) came back different");
            sent += n as u64;
        }
        cw.shutdown().await.unwrap();
        let mut tail = Vec::new();
        cr.read_to_end(&mut tail).await.unwrap();
        assert!(tail.is_empty());
        echo.await.unwrap();
        let (totals, idle) = relay.await.unwrap();
        assert_eq!(
            totals,
            Totals {
                up: sent,
                down: sent
            }
        );
        // The bulk message was spliced, and every pipe came back to the pool empty.
        assert!((1..=2).contains(&idle), "{idle} pipes pooled");
    }

    /// A plain relay that moved bulk bytes both ways and then went quiet holds no pipe: each
    /// direction gives its (empty) pipe back while it waits for its source, and takes one again
    /// when bytes come. Before, each direction kept its pipe until FIN or until a burst started
    /// small: six descriptors per idle connection, and 32 of them held every big pipe.
    #[tokio::test]
    async fn a_connection_quiet_after_a_bulk_transfer_holds_no_pipe() {
        let (mut client, down) = pair().await;
        let (up, mut server) = pair().await;
        let pool = std::sync::Arc::new(PipePool::new(8));
        let relay_pool = pool.clone();
        let relay = tokio::spawn(async move {
            relay_tcp(&down, &up, &relay_pool, Duration::from_secs(60), &|_, _| {})
                .await
                .unwrap()
        });
        let mut sent = 0u64;
        for round in 0..2u8 {
            // More than a pipe's default capacity each way at once: both directions splice.
            let n = 3 * SMALL_PIPE + 11;
            let (to_server, to_client) = (pattern(n, round), pattern(n, round + 100));
            let (mut got_server, mut got_client) = (vec![0u8; n], vec![0u8; n]);
            let ((mut cr, mut cw), (mut sr, mut sw)) = (client.split(), server.split());
            let (a, b, c, d) = tokio::join!(
                cw.write_all(&to_server),
                sw.write_all(&to_client),
                sr.read_exact(&mut got_server),
                cr.read_exact(&mut got_client),
            );
            a.unwrap();
            b.unwrap();
            c.unwrap();
            d.unwrap();
            assert!(
                got_server == to_server && got_client == to_client,
                "round {round}"
            );
            sent += n as u64;
            // Silence: both directions wait for their sources. Bounded by turns, not time.
            let mut held = pool.in_use();
            for _ in 0..200 {
                if held == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                held = pool.in_use();
            }
            assert_eq!(
                held, 0,
                "round {round}: {held} pipes held by an idle connection"
            );
            assert!(pool.idle() >= 1, "round {round}: the relay never spliced");
        }
        client.shutdown().await.unwrap();
        server.shutdown().await.unwrap();
        let totals = relay.await.unwrap();
        assert_eq!(
            totals,
            Totals {
                up: sent,
                down: sent
            }
        );
        assert_eq!(pool.in_use(), 0);
    }

    #[tokio::test]
    async fn copy_keeps_what_a_full_destination_cannot_take_yet() {
        let (mut client, src) = pair().await;
        let (dst, mut sink) = pair().await;
        // Fill the destination until the kernel refuses more.
        let filler = vec![0xAAu8; 64 * 1024];
        let mut queued = 0usize;
        loop {
            match dst.try_write(&filler) {
                Ok(n) => queued += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        let msg = pattern(1000, 7);
        client.write_all(&msg).await.unwrap();
        // The sink starts reading only later, so the copy must hold the 1000 bytes meanwhile.
        let drain = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            let mut got = vec![0u8; queued + 1000];
            sink.read_exact(&mut got).await.unwrap();
            got
        });
        let mut rest = Vec::new();
        let n = copy_chunk(
            &src,
            &dst,
            &mut rest,
            Duration::from_secs(60),
            Side::Downstream,
            Side::Upstream,
        )
        .await
        .unwrap();
        assert_eq!(n, 1000);
        assert!(rest.is_empty() && rest.capacity() == 0);
        let got = drain.await.unwrap();
        assert!(got[..queued].iter().all(|&b| b == 0xAA));
        assert_eq!(&got[queued..], &msg[..]);
    }
}
