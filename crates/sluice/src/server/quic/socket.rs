//! The UDP socket under a QUIC endpoint as quinn sees it, with what a binary upgrade needs:
//! connection IDs that begin with this process's tag; in the new process, datagrams whose
//! connection ID carries the previous process's tag passed on to it over a Unix datagram
//! channel; in the old process, once handed over, datagrams read from that channel instead of
//! the shared socket (replies still leave through the shared socket, so clients see the same
//! address and port throughout).

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixDatagram;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, ConnectionId, ConnectionIdGenerator, UdpPoller};

use crate::atomic::Counter;

/// Length of the connection IDs this process issues: the 2-byte tag, then 6 random bytes.
pub const CID_LEN: usize = 8;

/// Bytes before a passed-on datagram: source IP (16, IPv4 mapped), source port (2), source is
/// IPv4 (1), destination IP kind (1: 0 none, 4, 6), destination IP (16).
const HEADER: usize = 36;

/// The largest UDP payload.
const MAX_DATAGRAM: usize = 65_535;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

// === tags ===

/// Tags of previous processes (from the handover), which this process's tag must differ from.
static AVOID: Mutex<Vec<[u8; 2]>> = Mutex::new(Vec::new());
static TAG: OnceLock<[u8; 2]> = OnceLock::new();

/// Notes a previous process's tag; call before the first [`tag`].
pub fn avoid_tag(tag: [u8; 2]) {
    lock(&AVOID).push(tag);
}

/// This process's tag: the first two bytes of every connection ID it issues.
pub fn tag() -> [u8; 2] {
    *TAG.get_or_init(|| {
        let avoid = lock(&AVOID).clone();
        loop {
            let mut t = [0u8; 2];
            getrandom::getrandom(&mut t).expect("the system random source");
            if !avoid.contains(&t) {
                return t;
            }
        }
    })
}

/// Issues this process's connection IDs: the tag, then random bytes.
pub struct TaggedCids;

impl ConnectionIdGenerator for TaggedCids {
    fn generate_cid(&mut self) -> ConnectionId {
        let mut cid = [0u8; CID_LEN];
        cid[..2].copy_from_slice(&tag());
        getrandom::getrandom(&mut cid[2..]).expect("the system random source");
        ConnectionId::new(&cid)
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

/// The destination connection ID's first two bytes, if the datagram has them. A long header's
/// DCID counts only at this server's length (`CID_LEN`): a client's first Initial carries an ID
/// of its own choosing, often longer, which would reach a previous process by chance (1 in 65,536
/// with the tag's two bytes) and go unanswered there.
fn dcid_prefix(datagram: &[u8]) -> Option<[u8; 2]> {
    let first = *datagram.first()?;
    let at = if first & 0x80 != 0 {
        // Long header: flags, version (4), DCID length, DCID.
        if usize::from(*datagram.get(5)?) != CID_LEN {
            return None;
        }
        6
    } else {
        1
    };
    Some([*datagram.get(at)?, *datagram.get(at + 1)?])
}

// === the stateless-reset secret ===

/// Length of the secret stateless-reset tokens are derived from.
pub const RESET_SECRET_LEN: usize = 32;

static RESET_SECRET: OnceLock<[u8; RESET_SECRET_LEN]> = OnceLock::new();

/// Takes the previous process's stateless-reset secret (a binary upgrade); call before the
/// first [`reset_secret`].
pub fn inherit_reset_secret(secret: [u8; RESET_SECRET_LEN]) {
    let _ = RESET_SECRET.set(secret);
}

/// The secret this process's stateless-reset tokens are made with: the previous process's
/// after an upgrade, so that once it is gone a reset this process sends for one of its
/// connections carries the token that connection's client was given (and ends it at once
/// instead of at its idle timeout); otherwise a fresh one. Every process of an upgrade chain
/// issues connection IDs under its own tag, so no two connections share a token.
pub fn reset_secret() -> [u8; RESET_SECRET_LEN] {
    *RESET_SECRET.get_or_init(|| {
        let mut s = [0u8; RESET_SECRET_LEN];
        getrandom::getrandom(&mut s).expect("the system random source");
        s
    })
}

// === the socket ===

/// Where a new process passes on the previous process's datagrams.
struct Previous {
    tag: [u8; 2],
    channel: UnixDatagram,
    /// False once the previous process is gone: its connections' datagrams are then this
    /// process's to answer (a stateless reset tells their clients).
    open: AtomicBool,
    /// Datagrams not passed on: the channel was full (the previous process behind, or a flood
    /// of datagrams carrying its tag) or refused one for a passing reason.
    dropped: Counter,
}

/// A QUIC endpoint's socket (see the module text).
pub struct QuicSocket {
    udp: Arc<dyn AsyncUdpSocket>,
    /// The UDP socket itself, duplicated, to hand over.
    fd: OwnedFd,
    previous: Option<Previous>,
    /// Set once this process has handed the socket over: datagrams come from the new process.
    handed: AtomicBool,
    from_next: Mutex<Option<Arc<tokio::net::UnixDatagram>>>,
    /// The endpoint driver's waker, to move it to the channel when the socket is handed over.
    waker: Mutex<Option<Waker>>,
    scratch: Mutex<Vec<u8>>,
}

impl fmt::Debug for QuicSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuicSocket")
            .field("handed", &self.handed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Every live QUIC socket of this process, for a handover.
static OPEN: Mutex<Vec<Weak<QuicSocket>>> = Mutex::new(Vec::new());

impl QuicSocket {
    /// Wraps a bound UDP socket; `previous` (after an upgrade) is the previous process's tag and
    /// channel, and `dropped` counts that process's datagrams not passed on. Must run on the
    /// runtime that will drive the endpoint.
    pub fn new(
        socket: std::net::UdpSocket,
        previous: Option<([u8; 2], UnixDatagram)>,
        dropped: Counter,
    ) -> io::Result<Arc<QuicSocket>> {
        let fd = OwnedFd::from(socket.try_clone()?);
        let udp = quinn::Runtime::wrap_udp_socket(&quinn::TokioRuntime, socket)?;
        let previous = match previous {
            Some((tag, channel)) => {
                channel.set_nonblocking(true)?;
                Some(Previous {
                    tag,
                    channel,
                    open: AtomicBool::new(true),
                    dropped,
                })
            }
            None => None,
        };
        let s = Arc::new(QuicSocket {
            udp,
            fd,
            previous,
            handed: AtomicBool::new(false),
            from_next: Mutex::new(None),
            waker: Mutex::new(None),
            scratch: Mutex::new(Vec::new()),
        });
        let mut open = lock(&OPEN);
        open.retain(|w| w.strong_count() > 0);
        open.push(Arc::downgrade(&s));
        Ok(s)
    }

    fn wake(&self) {
        if let Some(w) = lock(&self.waker).clone() {
            w.wake();
        }
    }

    /// Passes on the previous process's datagrams among `n` received; compacts the rest to
    /// the front and returns how many remain.
    fn pass_on(
        &self,
        prev: &Previous,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> usize {
        let mut kept = 0;
        for i in 0..meta.len() {
            let m = meta[i];
            let data = &bufs[i][..m.len];
            if prev.open.load(Ordering::Relaxed) && dcid_prefix(data) == Some(prev.tag) {
                // Coalesced segments come from one client socket: one connection's datagrams.
                for segment in data.chunks(m.stride.max(1)) {
                    prev.send(m.addr, m.dst_ip, segment);
                }
                continue;
            }
            if kept != i {
                let (front, back) = bufs.split_at_mut(i);
                front[kept][..m.len].copy_from_slice(&back[0][..m.len]);
                meta[kept] = m;
            }
            kept += 1;
        }
        kept
    }

    /// One datagram from the new process (this process has handed the socket over).
    fn poll_from_next(
        &self,
        rx: &tokio::net::UnixDatagram,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let mut scratch = lock(&self.scratch);
        scratch.resize(HEADER + MAX_DATAGRAM, 0);
        loop {
            let mut buf = tokio::io::ReadBuf::new(&mut scratch);
            match ready!(rx.poll_recv(cx, &mut buf)) {
                Ok(()) => {}
                // The new process is gone (it failed after all, or exited): nothing more comes.
                Err(_) => return Poll::Pending,
            }
            let got = buf.filled();
            let Some((addr, dst_ip)) = decode_header(got) else {
                if got.is_empty() {
                    return Poll::Pending;
                }
                continue;
            };
            let payload = &got[HEADER..];
            let Some(first) = bufs.first_mut() else {
                return Poll::Ready(Ok(0));
            };
            let len = payload.len().min(first.len());
            first[..len].copy_from_slice(&payload[..len]);
            meta[0] = RecvMeta {
                addr,
                len,
                stride: len,
                ecn: None,
                dst_ip,
            };
            return Poll::Ready(Ok(1));
        }
    }
}

impl Previous {
    fn send(&self, from: SocketAddr, dst_ip: Option<IpAddr>, datagram: &[u8]) {
        let mut msg = Vec::with_capacity(HEADER + datagram.len());
        msg.extend_from_slice(&encode_header(from, dst_ip));
        msg.extend_from_slice(datagram);
        match self.channel.send(&msg) {
            Ok(_) => {}
            // Only the channel's far end closed means the previous process is gone: from then on
            // this process answers its connections' datagrams with a stateless reset, which must
            // not happen to a connection still alive there.
            Err(e) if previous_gone(&e) => {
                tracing::info!(error = %e, "the previous process is gone: its QUIC connections end here");
                self.open.store(false, Ordering::Relaxed);
            }
            // The previous process is behind (a full channel), or the kernel is short of memory
            // for a moment: the datagram is lost, as on a full socket, and counted.
            Err(_) => {
                self.dropped.inc();
            }
        }
    }
}

/// Whether a send on the channel failed because its far end is closed.
fn previous_gone(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ECONNREFUSED | libc::ENOTCONN | libc::EPIPE | libc::ECONNRESET)
    )
}

fn v6(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

fn encode_header(from: SocketAddr, dst_ip: Option<IpAddr>) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..16].copy_from_slice(&v6(from.ip()));
    h[16..18].copy_from_slice(&from.port().to_be_bytes());
    h[18] = u8::from(from.is_ipv4());
    h[19] = match dst_ip {
        None => 0,
        Some(IpAddr::V4(_)) => 4,
        Some(IpAddr::V6(_)) => 6,
    };
    if let Some(ip) = dst_ip {
        h[20..36].copy_from_slice(&v6(ip));
    }
    h
}

fn decode_header(msg: &[u8]) -> Option<(SocketAddr, Option<IpAddr>)> {
    if msg.len() < HEADER {
        return None;
    }
    let ip = |b: &[u8], v4: bool| -> IpAddr {
        let raw: [u8; 16] = b.try_into().unwrap_or([0; 16]);
        let v6 = Ipv6Addr::from(raw);
        match (v4, v6.to_ipv4_mapped()) {
            (true, Some(v4)) => IpAddr::V4(v4),
            (true, None) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            (false, _) => IpAddr::V6(v6),
        }
    };
    let port = u16::from_be_bytes([msg[16], msg[17]]);
    let from = SocketAddr::new(ip(&msg[..16], msg[18] == 1), port);
    let dst = match msg[19] {
        4 => Some(ip(&msg[20..36], true)),
        6 => Some(ip(&msg[20..36], false)),
        _ => None,
    };
    Some((from, dst))
}

impl AsyncUdpSocket for QuicSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.udp.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        self.udp.try_send(transmit)
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        {
            let mut w = lock(&self.waker);
            if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *w = Some(cx.waker().clone());
            }
        }
        if self.handed.load(Ordering::Acquire) {
            let rx = lock(&self.from_next).clone();
            if let Some(rx) = rx {
                return self.poll_from_next(&rx, cx, bufs, meta);
            }
        }
        loop {
            let n = ready!(self.udp.poll_recv(cx, bufs, meta))?;
            let Some(prev) = &self.previous else {
                return Poll::Ready(Ok(n));
            };
            let kept = self.pass_on(prev, &mut bufs[..n], &mut meta[..n]);
            if kept > 0 {
                return Poll::Ready(Ok(kept));
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.udp.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.udp.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.udp.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.udp.may_fragment()
    }
}

// === handover ===

/// One QUIC socket as handed to a new process: its address, the socket, and the new process's
/// end of the channel it passes this process's datagrams back on.
pub struct HandedOver {
    pub addr: SocketAddr,
    pub udp: OwnedFd,
    pub channel: OwnedFd,
}

/// Hands every live QUIC socket over: from now on this process reads its datagrams from the
/// returned channels (the new process, once serving, passes them on) and no longer from the
/// shared sockets. Call on the runtime; [`take_back`] undoes it if the new process fails. All or
/// nothing: everything that can fail (a descriptor short, under load) is made for every socket
/// before the first one switches, so an error leaves every socket read as before.
pub fn hand_over() -> io::Result<Vec<HandedOver>> {
    let sockets: Vec<Arc<QuicSocket>> = lock(&OPEN).iter().filter_map(Weak::upgrade).collect();
    let mut made = Vec::with_capacity(sockets.len());
    for s in &sockets {
        let (ours, theirs) = UnixDatagram::pair()?;
        ours.set_nonblocking(true)?;
        let ours = Arc::new(tokio::net::UnixDatagram::from_std(ours)?);
        let handed = HandedOver {
            addr: s.local_addr()?,
            udp: s.fd.try_clone()?,
            channel: theirs.into(),
        };
        made.push((ours, handed));
    }
    let mut out = Vec::with_capacity(made.len());
    for (s, (ours, handed)) in sockets.iter().zip(made) {
        *lock(&s.from_next) = Some(ours);
        s.handed.store(true, Ordering::Release);
        s.wake();
        out.push(handed);
    }
    Ok(out)
}

/// The new process failed: read the shared sockets again.
pub fn take_back() {
    for s in lock(&OPEN).iter().filter_map(Weak::upgrade) {
        s.handed.store(false, Ordering::Release);
        *lock(&s.from_next) = None;
        s.wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_carry_both_addresses() {
        for (from, dst) in [
            ("127.0.0.1:4433", Some("127.0.0.1")),
            ("[::1]:9", None),
            ("10.1.2.3:65535", Some("::1")),
        ] {
            let from: SocketAddr = from.parse().unwrap();
            let dst: Option<IpAddr> = dst.map(|d| d.parse().unwrap());
            let h = encode_header(from, dst);
            assert_eq!(decode_header(&h), Some((from, dst)));
        }
        assert_eq!(decode_header(&[0; HEADER - 1]), None);
    }

    #[test]
    fn the_tag_is_read_from_long_and_short_headers() {
        let mut short = vec![0x40, 0xab, 0xcd];
        short.extend_from_slice(&[0; 20]);
        assert_eq!(dcid_prefix(&short), Some([0xab, 0xcd]));
        let long = [0xc0, 0, 0, 0, 1, 8, 0x12, 0x34, 0, 0, 0, 0, 0, 0];
        assert_eq!(dcid_prefix(&long), Some([0x12, 0x34]));
        // A zero-length DCID, one of another length than this server's (a client's own, with
        // the tag by chance), or a datagram too short to hold one, has no tag.
        assert_eq!(dcid_prefix(&[0xc0, 0, 0, 0, 1, 0]), None);
        let mut other = vec![0xc0, 0, 0, 0, 1, 18, 0x12, 0x34];
        other.extend_from_slice(&[0; 16]);
        assert_eq!(dcid_prefix(&other), None);
        assert_eq!(dcid_prefix(&[0x40]), None);
        let mut cids = TaggedCids;
        let cid = cids.generate_cid();
        assert_eq!(cid.len(), CID_LEN);
        assert_eq!(cid[..2], tag());
    }
}
