//! Zero-downtime binary upgrade: on SIGUSR2 (`sluice upgrade`) the running process starts the
//! binary now at its own path with its own arguments, hands it every listening socket over a Unix
//! socket pair (`SCM_RIGHTS`), and waits for it to say it is serving. Then it tells the service
//! manager the new main pid, stops accepting and drains within the grace period. If the new
//! process fails (a config error, a crash) before it is ready, the old one never stopped
//! accepting and goes on serving.
//!
//! HTTP/3 keeps working across it: the new process takes over each QUIC endpoint's UDP socket
//! and passes the datagrams of the old process's connections (known by the tag their
//! connection IDs begin with) back to it over a Unix datagram channel, so those connections
//! drain with GOAWAY in the old process while new ones start in the new (`quic::socket`).
//!
//! The new process makes its QUIC stateless-reset tokens with the old one's secret, so once
//! the old process is gone, the reset the new one sends for one of its connections is one that
//! connection's client recognises (it ends there instead of waiting out its idle timeout).
//!
//! The wire is one message each way on the pair: old → new, one line `listen <addr>` per TCP
//! socket, then one line `udp <addr> <tag>` per QUIC socket, with the descriptors attached in
//! the same order (two for each QUIC socket: the socket, then the new process's end of its
//! channel), then with QUIC sockets one line `reset <hex>` (the stateless-reset secret);
//! new → old, `ready <pid>`. Lines a process does not know are passed over.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use super::listener::inherited;

/// The environment variable that names, in the new process, its end of the pair.
pub const FD_VAR: &str = "SLUICE_UPGRADE_FD";

/// How long the new process has to bind and say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The most sockets handed over (the kernel's `SCM_MAX_FD` is 253 per message).
const MAX_SOCKETS: usize = 250;

/// The binary and arguments this process was started with, recorded at startup (the path is
/// read again at upgrade time, so it is the new file there).
static COMMAND: OnceLock<(PathBuf, Vec<std::ffi::OsString>)> = OnceLock::new();

/// In a process started by an upgrade: its end of the pair, until it says it is ready.
static PARENT: Mutex<Option<UnixStream>> = Mutex::new(None);

/// Records how this process was started; call at the top of `main`.
pub fn remember_command() {
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe"));
    let args = std::env::args_os().skip(1).collect();
    let _ = COMMAND.set((exe, args));
}

/// In a process started by an upgrade (`SLUICE_UPGRADE_FD` set): receives the previous
/// process's listening sockets into the inherited pool, so `bind` takes them instead of binding.
/// Returns how many; `Ok(0)` when this is a plain start. Call before the runtime starts.
pub fn take_over() -> anyhow::Result<usize> {
    let Some(raw) = std::env::var_os(FD_VAR) else {
        return Ok(0);
    };
    std::env::remove_var(FD_VAR);
    let fd: i32 = raw
        .to_str()
        .and_then(|s| s.parse().ok())
        .filter(|fd| *fd > 2)
        .ok_or_else(|| anyhow::anyhow!("{FD_VAR} is not a descriptor number"))?;
    // SAFETY: the previous process left this descriptor open for us, and nothing else owns it.
    let stream = unsafe { UnixStream::from_raw_fd(fd) };
    // SAFETY: marking our own descriptor close-on-exec.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    stream.set_read_timeout(Some(READY_TIMEOUT))?;
    let (text, fds) = receive(&stream)?;
    let n = adopt(&text, fds)?;
    *PARENT.lock().unwrap_or_else(|e| e.into_inner()) = Some(stream);
    Ok(n)
}

/// Puts the received sockets in the inherited pools, matching them to the lines that announced
/// them; returns how many sockets that is.
fn adopt(text: &str, fds: Vec<OwnedFd>) -> anyhow::Result<usize> {
    let mut fds = fds.into_iter();
    let mut listeners = Vec::new();
    let mut quic = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("listen") => {
                let fd = fds
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("upgrade: a socket is missing"))?;
                listeners.extend(inherited::listeners_from(vec![fd])?);
            }
            Some("udp") => {
                let (Some(udp), Some(channel)) = (fds.next(), fds.next()) else {
                    anyhow::bail!("upgrade: a QUIC socket is missing");
                };
                let tag = words
                    .nth(1)
                    .and_then(|t| u16::from_str_radix(t, 16).ok())
                    .ok_or_else(|| anyhow::anyhow!("upgrade: bad line {line:?}"))?;
                quic.push(inherited::quic_from(udp, channel, tag.to_be_bytes())?);
            }
            #[cfg(feature = "http3")]
            Some("reset") => match words.next().and_then(reset_secret_from_hex) {
                Some(secret) => super::quic::inherit_reset_secret(secret),
                // Not the secret's text in the message: it is a secret.
                None => tracing::warn!(
                    "upgrade: the QUIC reset secret is malformed; the previous process's \
                     connections will not recognise this one's stateless resets"
                ),
            },
            _ => {}
        }
    }
    anyhow::ensure!(
        fds.next().is_none(),
        "upgrade: more sockets received than announced"
    );
    let n = listeners.len() + quic.len() * 2;
    inherited::adopt(listeners);
    inherited::adopt_quic(quic);
    Ok(n)
}

/// Every listener is bound: tells the previous process (after an upgrade) or the service
/// manager (`READY=1`) that this process is serving.
pub fn announce_ready() {
    let parent = PARENT.lock().unwrap_or_else(|e| e.into_inner()).take();
    match parent {
        Some(mut stream) => {
            let line = format!("ready {}\n", std::process::id());
            if let Err(e) = stream.write_all(line.as_bytes()) {
                tracing::warn!(error = %e, "upgrade: cannot tell the previous process we are ready");
            }
        }
        None => super::notify::ready(),
    }
}

/// The SIGUSR2 stream [`on_sigusr2`] reads. Create it before the pid file is written and before
/// `READY` is announced: until a handler is installed, a SIGUSR2 (a `sluice upgrade` through the
/// pid file) takes the default action and kills the process. `None` (logged) when it cannot be.
pub fn sigusr2() -> Option<tokio::signal::unix::Signal> {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::user_defined2()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot install the SIGUSR2 handler; binary upgrade is off");
            None
        }
    }
}

/// Resolves when a new process has taken over the listeners (after a SIGUSR2 on `usr2`, made by
/// [`sigusr2`]); each failed attempt is logged, `pid_file` (when there is one) names this
/// process again, and this process goes on serving. A SIGUSR2 that came while the upgrade ran
/// is passed on to the new process. Never resolves without `usr2`.
pub async fn on_sigusr2(
    usr2: Option<tokio::signal::unix::Signal>,
    pid_file: Option<PathBuf>,
) -> u32 {
    let Some(mut usr2) = usr2 else {
        return std::future::pending().await;
    };
    while usr2.recv().await.is_some() {
        tracing::info!("SIGUSR2: starting the new binary and handing it the listeners");
        match hand_over().await {
            Ok(pid) => {
                tracing::info!(
                    new_pid = pid,
                    "upgrade: the new process is serving; draining and exiting"
                );
                super::notify::handed_over(pid);
                if pending(&mut usr2) {
                    pass_on_sigusr2(pid).await;
                }
                return pid;
            }
            Err(e) => {
                tracing::error!("upgrade failed, this process goes on serving: {e:#}");
                // The new process may have written its pid there before it failed. Rewritten
                // only then, and whole, never through a symlink (`PidFile::put`): a reader must
                // never find it empty, as a truncating write would show it for a moment.
                if let Some(path) = &pid_file {
                    let own = format!("{}\n", std::process::id());
                    let names_us = std::fs::read_to_string(path).is_ok_and(|t| t == own);
                    let put = || crate::PidFile::put(path);
                    if let Err(e) = if names_us { Ok(()) } else { put() } {
                        tracing::warn!(
                            error = %e,
                            path = %path.display(),
                            "upgrade: cannot write this process's pid back to the pid file"
                        );
                    }
                }
            }
        }
    }
    std::future::pending().await
}

/// Whether a SIGUSR2 came on `usr2` since it was last read (it is read, then).
fn pending(usr2: &mut tokio::signal::unix::Signal) -> bool {
    let waker = futures_util::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    matches!(usr2.poll_recv(&mut cx), std::task::Poll::Ready(Some(())))
}

/// Another upgrade was asked for while one ran (two package installs in a row): sends SIGUSR2
/// on to the new process `pid`, which starts the binary now installed. Only once that process
/// catches SIGUSR2 (a build that installs its handler late would be killed by it); it is given
/// a few seconds, then the signal is dropped, logged. Awaited before the drain starts: a process
/// with nothing to drain exits at once, and a task left behind would go with it.
async fn pass_on_sigusr2(pid: u32) {
    tracing::warn!(
        new_pid = pid,
        "upgrade: another SIGUSR2 came during the upgrade; passing it on to the new process \
         (it upgrades again, to the binary installed now)"
    );
    for _ in 0..250 {
        if catches(pid, libc::SIGUSR2) {
            // SAFETY: kill(2) on the process this one started, with a signal it catches.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGUSR2) };
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tracing::warn!(
        new_pid = pid,
        "upgrade: the new process does not catch SIGUSR2; the second upgrade was not passed \
         on (run `sluice upgrade` again)"
    );
}

/// Whether process `pid` has a handler for `sig` (its `SigCgt` mask in `/proc`).
fn catches(pid: u32, sig: libc::c_int) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (sig - 1)) != 0)
}

/// Takes the QUIC sockets back when dropped armed: every way [`hand_over`] fails (an error
/// return, a panic in its task, the future dropped) leaves this process reading them again.
struct QuicGuard {
    armed: bool,
}

impl Drop for QuicGuard {
    fn drop(&mut self) {
        if self.armed {
            take_back_quic();
        }
    }
}

/// Starts the new binary, sends it the sockets, waits for its `ready`.
async fn hand_over() -> anyhow::Result<u32> {
    let (exe, args) = COMMAND
        .get()
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("the start command was not recorded"))?;
    let sockets = inherited::handover()
        .map_err(|e| anyhow::anyhow!("upgrade: duplicating the listening sockets: {e}"))?;
    anyhow::ensure!(!sockets.is_empty(), "no listening socket to hand over");
    // From here the QUIC sockets' datagrams come through the new process; the guard takes
    // them back unless it serves (`quic::hand_over` itself switches all of them or none).
    let mut guard = QuicGuard { armed: true };
    let quic = hand_over_quic()?;
    let count = sockets.len() + quic.len() * 2;
    anyhow::ensure!(
        count <= MAX_SOCKETS,
        "{count} sockets; at most {MAX_SOCKETS} can be handed over"
    );
    let (ours, theirs) =
        UnixStream::pair().map_err(|e| anyhow::anyhow!("upgrade: socket pair: {e}"))?;
    let mut child = spawn(&exe, &args, theirs.as_fd())?;
    drop(theirs);
    let pid = child.id();
    let result = tokio::task::spawn_blocking(move || {
        let mut text = String::new();
        for (addr, _) in &sockets {
            text.push_str(&format!("listen {addr}\n"));
        }
        let mut fds: Vec<BorrowedFd<'_>> = sockets.iter().map(|(_, fd)| fd.as_fd()).collect();
        for (addr, tag, udp, channel) in &quic {
            text.push_str(&format!("udp {addr} {tag:04x}\n"));
            fds.push(udp.as_fd());
            fds.push(channel.as_fd());
        }
        if !quic.is_empty() {
            text.push_str(&reset_secret_line());
        }
        send(&ours, text.as_bytes(), &fds)?;
        drop(fds);
        drop(sockets);
        drop(quic);
        wait_ready(ours, pid)
    })
    .await
    .unwrap_or_else(|e| Err(anyhow::anyhow!("upgrade task: {e}")));
    if result.is_err() {
        drop(guard);
        // Reap it (it exits on its own when it failed; a hung one is killed).
        let _ = child.kill();
        let _ = tokio::task::spawn_blocking(move || child.wait()).await;
    } else {
        guard.armed = false;
    }
    result
}

/// The QUIC sockets to hand over: (address, this process's connection ID tag, socket, channel).
type QuicHandover = Vec<(std::net::SocketAddr, u16, OwnedFd, OwnedFd)>;

#[cfg(feature = "http3")]
fn hand_over_quic() -> anyhow::Result<QuicHandover> {
    let tag = u16::from_be_bytes(super::quic::tag());
    Ok(super::quic::hand_over()
        .map_err(|e| anyhow::anyhow!("QUIC hand-over: {e}"))?
        .into_iter()
        .map(|h| (h.addr, tag, h.udp, h.channel))
        .collect())
}

#[cfg(not(feature = "http3"))]
fn hand_over_quic() -> anyhow::Result<QuicHandover> {
    Ok(Vec::new())
}

/// The `reset <hex>` line that passes this process's QUIC stateless-reset secret on.
#[cfg(feature = "http3")]
fn reset_secret_line() -> String {
    let hex = sluice_media::keys::to_hex(&super::quic::reset_secret());
    format!("reset {hex}\n")
}

#[cfg(not(feature = "http3"))]
fn reset_secret_line() -> String {
    String::new()
}

/// The secret from a `reset` line's hex text; `None` unless it is exactly the secret's length.
#[cfg(feature = "http3")]
fn reset_secret_from_hex(hex: &str) -> Option<[u8; super::quic::RESET_SECRET_LEN]> {
    let bytes = hex.as_bytes();
    if bytes.len() != 2 * super::quic::RESET_SECRET_LEN || !bytes.iter().all(u8::is_ascii_hexdigit)
    {
        return None;
    }
    let mut out = [0u8; super::quic::RESET_SECRET_LEN];
    for (o, pair) in out.iter_mut().zip(bytes.chunks(2)) {
        let text = std::str::from_utf8(pair).ok()?;
        *o = u8::from_str_radix(text, 16).ok()?;
    }
    Some(out)
}

fn take_back_quic() {
    #[cfg(feature = "http3")]
    super::quic::take_back();
}

/// Starts `exe` with `args`, its end of the pair left open across exec and named in the
/// environment; the socket-activation variables (they named this process) are not passed on.
fn spawn(
    exe: &std::path::Path,
    args: &[std::ffi::OsString],
    theirs: BorrowedFd<'_>,
) -> anyhow::Result<std::process::Child> {
    use std::os::unix::process::CommandExt;
    let fd = theirs.as_raw_fd();
    let mut cmd = std::process::Command::new(exe);
    cmd.args(args)
        .env(FD_VAR, fd.to_string())
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_PID")
        .env_remove("LISTEN_FDNAMES")
        .env_remove("WATCHDOG_PID");
    // SAFETY: between fork and exec only fcntl(2), which is async-signal-safe, runs.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn()
        .map_err(|e| anyhow::anyhow!("cannot start {}: {e}", exe.display()))
}

/// Reads the new process's `ready <pid>` line; its end closing first means it failed.
fn wait_ready(mut stream: UnixStream, pid: u32) -> anyhow::Result<u32> {
    stream.set_read_timeout(Some(READY_TIMEOUT))?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 64];
    while !reply.contains(&b'\n') && reply.len() < 256 {
        match stream.read(&mut buf) {
            Ok(0) => anyhow::bail!("the new process (pid {pid}) exited before it was ready"),
            Ok(n) => reply.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                anyhow::bail!(
                    "the new process (pid {pid}) was not ready within {} s",
                    READY_TIMEOUT.as_secs()
                )
            }
            Err(e) => return Err(e.into()),
        }
    }
    let line = String::from_utf8_lossy(&reply);
    match line.trim().strip_prefix("ready ") {
        Some(p) if p.parse() == Ok(pid) => Ok(pid),
        _ => anyhow::bail!("the new process answered {:?}", line.trim()),
    }
}

/// Sends `text` with `fds` attached, in one message.
fn send(stream: &UnixStream, text: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("control buffer too small"));
    }
    let sent = rustix::net::sendmsg(
        stream,
        &[IoSlice::new(text)],
        &mut control,
        SendFlags::empty(),
    )?;
    if sent != text.len() {
        return Err(io::Error::other("the socket list was sent in part"));
    }
    Ok(())
}

/// Receives one message: its text and the descriptors attached.
fn receive(stream: &UnixStream) -> io::Result<(String, Vec<OwnedFd>)> {
    let mut text = vec![0u8; 64 * 1024];
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_SOCKETS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        stream,
        &mut [IoSliceMut::new(&mut text)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    if got.bytes == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the previous process sent nothing",
        ));
    }
    text.truncate(got.bytes);
    Ok((String::from_utf8_lossy(&text).into_owned(), fds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_cross_a_pair_with_their_addresses() {
        let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let b = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (x, y) = UnixStream::pair().unwrap();
        let text = format!(
            "listen {}\nlisten {}\n",
            a.local_addr().unwrap(),
            b.local_addr().unwrap()
        );
        send(&x, text.as_bytes(), &[a.as_fd(), b.as_fd()]).unwrap();
        let (got, fds) = receive(&y).unwrap();
        assert_eq!(got, text);
        let listeners = inherited::listeners_from(fds).unwrap();
        let addrs: Vec<_> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
        assert_eq!(
            addrs,
            vec![a.local_addr().unwrap(), b.local_addr().unwrap()]
        );
        // The received socket is the same listening socket: a client connecting to `a` is
        // accepted on the copy.
        drop(a);
        let _client = std::net::TcpStream::connect(addrs[0]).unwrap();
        let (_conn, _) = listeners[0].accept().unwrap();
    }

    #[test]
    fn a_connected_socket_is_not_taken_for_a_listener() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let fd: OwnedFd = c.into();
        assert!(inherited::listeners_from(vec![fd]).is_err());
    }

    /// The pid file (at startup, and written back after a failed upgrade) in a directory other
    /// users can write: a symlink planted at its path or at the old fixed temporary name leaves
    /// its target untouched, and the pid file ends up a plain file holding this process's id.
    #[test]
    fn the_pid_file_is_never_written_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sluice.pid");
        let victim = dir.path().join("victim");
        let tmp_victim = dir.path().join("tmp-victim");
        std::fs::write(&victim, "precious\n").unwrap();
        std::fs::write(&tmp_victim, "precious too\n").unwrap();
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        std::os::unix::fs::symlink(&tmp_victim, path.with_extension("pid.tmp")).unwrap();
        let own = format!("{}\n", std::process::id());

        crate::PidFile::put(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
        assert_eq!(
            std::fs::read_to_string(&tmp_victim).unwrap(),
            "precious too\n"
        );
        assert!(!std::fs::symlink_metadata(&path).unwrap().is_symlink());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), own);

        // At startup too, over a symlink planted again; and no temporary file is left behind.
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        let pid_file = crate::PidFile::write(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), own);
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["sluice.pid", "sluice.pid.tmp", "tmp-victim", "victim"]
        );
        drop(pid_file);
        assert!(!path.exists());
    }

    #[cfg(feature = "http3")]
    #[test]
    fn the_reset_secret_crosses_as_hex_and_nothing_else_is_taken_for_it() {
        let line = reset_secret_line();
        let hex = line.strip_prefix("reset ").unwrap().trim_end();
        assert_eq!(
            reset_secret_from_hex(hex),
            Some(super::super::quic::reset_secret())
        );
        let short = &hex[..hex.len() - 2];
        let signed = format!("+{}", &hex[1..]);
        let odd = format!("{short}g0");
        for bad in [short, signed.as_str(), odd.as_str(), ""] {
            assert_eq!(reset_secret_from_hex(bad), None, "{bad}");
        }
    }
}
