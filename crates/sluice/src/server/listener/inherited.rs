//! Listening sockets this process did not bind itself (systemd's `LISTEN_FDS`, or the ones the
//! previous process handed over on upgrade, HTTP/3's UDP sockets among them), and the record of
//! every listening socket open now.
//!
//! A socket is identified by its inode (`fstat` on a socket gives one unique to it), so a
//! descriptor number that was closed and reused is never handed on as a listener.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

/// Sockets waiting for a `bind` of their address.
static POOL: Mutex<Vec<std::net::TcpListener>> = Mutex::new(Vec::new());

/// HTTP/3's UDP sockets handed over, waiting for the QUIC endpoint of their address.
static QUIC_POOL: Mutex<Vec<InheritedQuic>> = Mutex::new(Vec::new());

/// A QUIC endpoint's UDP socket as the previous process handed it over.
#[derive(Debug)]
pub struct InheritedQuic {
    pub socket: std::net::UdpSocket,
    /// The first two bytes of the connection IDs the previous process issued.
    pub tag: [u8; 2],
    /// Where datagrams for the previous process's connections go back to it.
    pub channel: std::os::unix::net::UnixDatagram,
}

/// Adds handed-over QUIC sockets to their pool.
pub fn adopt_quic(sockets: Vec<InheritedQuic>) {
    lock(&QUIC_POOL).extend(sockets);
}

/// Takes the handed-over QUIC socket bound to exactly `addr`.
pub fn take_quic(addr: SocketAddr) -> Option<InheritedQuic> {
    let mut pool = lock(&QUIC_POOL);
    let at = pool
        .iter()
        .position(|q| q.socket.local_addr().ok() == Some(addr))?;
    Some(pool.remove(at))
}

/// Every listening socket bound or adopted: (descriptor, inode).
static OPEN: Mutex<Vec<(RawFd, u64)>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Takes the inherited socket bound to `addr`; for a port-0 address (tests, "any port"), the
/// first inherited socket on the same IP address.
pub fn take(addr: SocketAddr) -> Option<std::net::TcpListener> {
    let mut pool = lock(&POOL);
    let local: Vec<Option<SocketAddr>> = pool.iter().map(|l| l.local_addr().ok()).collect();
    let at = local.iter().position(|a| *a == Some(addr)).or_else(|| {
        (addr.port() == 0).then(|| {
            local
                .iter()
                .position(|a| a.is_some_and(|a| a.ip() == addr.ip()))
        })?
    })?;
    Some(pool.remove(at))
}

/// Adds sockets to the pool (from the previous process, or from systemd).
pub fn adopt(listeners: Vec<std::net::TcpListener>) {
    lock(&POOL).extend(listeners);
}

/// How many inherited sockets no `bind` has taken.
pub fn waiting() -> usize {
    lock(&POOL).len()
}

/// Closes the inherited sockets the config no longer names (their queued clients are reset);
/// returns their addresses.
pub fn close_unclaimed() -> Vec<SocketAddr> {
    let quic: Vec<SocketAddr> = lock(&QUIC_POOL)
        .drain(..)
        .filter_map(|q| q.socket.local_addr().ok())
        .collect();
    lock(&POOL)
        .drain(..)
        .filter_map(|l| l.local_addr().ok())
        .chain(quic)
        .collect()
}

fn inode(fd: BorrowedFd<'_>) -> Option<u64> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat only writes the struct we pass; `fd` is open for the call.
    (unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } == 0).then_some(st.st_ino as u64)
}

/// Records a listening socket as open, for [`handover`].
pub fn record(socket: &impl AsFd) {
    let fd = socket.as_fd();
    if let Some(ino) = inode(fd) {
        let mut open = lock(&OPEN);
        open.retain(|(f, _)| *f != fd.as_raw_fd());
        open.push((fd.as_raw_fd(), ino));
    }
}

/// A duplicate of every recorded listening socket still open, with its address: what a new
/// process is handed on upgrade. Entries whose socket was closed are forgotten. A duplicate that
/// cannot be made for another reason (descriptors exhausted, under load) fails the whole
/// hand-over and forgets nothing: handing on fewer listeners would leave the new process
/// without one, and forgetting it would leave it out of every later upgrade.
pub fn handover() -> io::Result<Vec<(SocketAddr, OwnedFd)>> {
    let mut open = lock(&OPEN);
    let mut out = Vec::new();
    let mut failed = None;
    open.retain(|&(fd, ino)| {
        if failed.is_some() {
            return true;
        }
        // Duplicate first, then check the duplicate: a descriptor closed and reused in between
        // shows a different inode and is left alone.
        // SAFETY: F_DUPFD_CLOEXEC on any descriptor number is harmless; it fails if none is open.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
        if dup < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EBADF) {
                return false;
            }
            failed = Some(e);
            return true;
        }
        // SAFETY: `dup` is a descriptor we just created and own.
        let owned = unsafe { OwnedFd::from_raw_fd(dup) };
        if inode(owned.as_fd()) != Some(ino) {
            return false;
        }
        let Ok(addr) = socket2::SockRef::from(&owned).local_addr() else {
            return false;
        };
        match addr.as_socket() {
            Some(addr) => {
                out.push((addr, owned));
                true
            }
            None => false,
        }
    });
    match failed {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// Turns handed-over descriptors into listeners, refusing anything that is not a listening TCP
/// socket.
pub fn listeners_from(fds: Vec<OwnedFd>) -> io::Result<Vec<std::net::TcpListener>> {
    fds.into_iter()
        .map(|fd| {
            let socket = socket2::Socket::from(fd);
            let listening = socket.r#type()? == socket2::Type::STREAM
                && socket.local_addr()?.as_socket().is_some()
                && getsockopt_accepting(&socket)?;
            if !listening {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a handed-over descriptor is not a listening TCP socket",
                ));
            }
            Ok(std::net::TcpListener::from(socket))
        })
        .collect()
}

fn getsockopt_accepting(socket: &socket2::Socket) -> io::Result<bool> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: SO_ACCEPTCONN writes one int into `value`.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value != 0)
}

/// Turns a handed-over UDP socket and its channel into an [`InheritedQuic`], refusing
/// descriptors of any other kind.
pub fn quic_from(udp: OwnedFd, channel: OwnedFd, tag: [u8; 2]) -> io::Result<InheritedQuic> {
    let socket = socket2::Socket::from(udp);
    let channel = socket2::Socket::from(channel);
    let fits = socket.r#type()? == socket2::Type::DGRAM
        && socket.local_addr()?.as_socket().is_some()
        && channel.r#type()? == socket2::Type::DGRAM
        && channel.local_addr()?.is_unix();
    if !fits {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a handed-over QUIC descriptor is not a UDP socket with its Unix channel",
        ));
    }
    Ok(InheritedQuic {
        socket: socket.into(),
        tag,
        channel: std::os::unix::net::UnixDatagram::from(OwnedFd::from(channel)),
    })
}

/// systemd socket activation: the descriptors 3.. that `LISTEN_FDS` counts, when `LISTEN_PID`
/// names this process. Returns how many listening TCP sockets were adopted; anything else passed
/// in is reported and closed.
pub fn adopt_systemd(listen_pid: Option<&str>, listen_fds: Option<&str>) -> usize {
    let (Some(pid), Some(count)) = (listen_pid, listen_fds) else {
        return 0;
    };
    if pid.trim().parse::<u32>().ok() != Some(std::process::id()) {
        return 0;
    }
    let count: RawFd = match count.trim().parse() {
        Ok(n) if (0..=1024).contains(&n) => n,
        _ => {
            tracing::warn!(listen_fds = count, "LISTEN_FDS is not a count; ignored");
            return 0;
        }
    };
    let mut adopted = Vec::new();
    for fd in 3..3 + count {
        // SAFETY: systemd passed these descriptors to this process for it to own.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: setting FD_CLOEXEC on a descriptor we own.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        match listeners_from(vec![owned]) {
            Ok(mut l) => adopted.append(&mut l),
            Err(e) => tracing::warn!(fd, error = %e, "socket activation: descriptor not used"),
        }
    }
    let n = adopted.len();
    adopt(adopted);
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_matches_the_address_or_port_zero_on_the_same_ip() {
        let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let at = a.local_addr().unwrap();
        adopt(vec![a]);
        let other: SocketAddr = "127.0.0.2:0".parse().unwrap();
        assert!(take(other).is_none());
        let by_zero = take("127.0.0.1:0".parse().unwrap()).unwrap();
        assert_eq!(by_zero.local_addr().unwrap(), at);
        adopt(vec![by_zero]);
        assert_eq!(take(at).unwrap().local_addr().unwrap(), at);
    }

    #[test]
    fn handover_skips_closed_sockets() {
        let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = a.local_addr().unwrap();
        record(&a);
        assert!(handover().unwrap().iter().any(|(x, _)| *x == addr));
        drop(a);
        assert!(!handover().unwrap().iter().any(|(x, _)| *x == addr));
    }
}
