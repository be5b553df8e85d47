//! The service manager's notify protocol (`sd_notify(3)`), spoken directly: one datagram of
//! `KEY=VALUE` lines to the socket named by `$NOTIFY_SOCKET`, no libsystemd.
//!
//! sluice says `READY=1` once every listener is bound, `RELOADING=1` (with `MONOTONIC_USEC`) and
//! then `READY=1` around a reload, `STOPPING=1` when it starts draining, `MAINPID=` when a new
//! binary took over (`server::upgrade`), and `WATCHDOG=1` at half the unit's `WatchdogSec`.
//! Outside systemd (no `$NOTIFY_SOCKET`) every call is a no-op.

use std::io;
use std::os::unix::net::UnixDatagram;
use std::sync::OnceLock;
use std::time::Duration;

/// Where the notifications go, read once at startup.
struct Target {
    socket: UnixDatagram,
    addr: std::os::unix::net::SocketAddr,
}

static TARGET: OnceLock<Option<Target>> = OnceLock::new();

/// The watchdog interval the manager asked for (`WATCHDOG_USEC`, for this process).
static WATCHDOG: OnceLock<Option<Duration>> = OnceLock::new();

/// Reads `$NOTIFY_SOCKET` and `$WATCHDOG_USEC`/`$WATCHDOG_PID`. They stay in the environment: a
/// new binary started on upgrade becomes the main process and speaks to the same socket (it is
/// started without `WATCHDOG_PID`, which names this process).
pub fn init() {
    let path = std::env::var_os("NOTIFY_SOCKET");
    let watchdog = watchdog_interval(
        std::env::var("WATCHDOG_USEC").ok().as_deref(),
        std::env::var("WATCHDOG_PID").ok().as_deref(),
        std::process::id(),
    );
    let target = path.and_then(|p| match connect(&p) {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!("warning: NOTIFY_SOCKET {}: {e}", p.to_string_lossy());
            None
        }
    });
    let _ = TARGET.set(target);
    let _ = WATCHDOG.set(watchdog);
}

fn connect(path: &std::ffi::OsStr) -> io::Result<Target> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_bytes();
    let addr = match bytes.first() {
        // `@name`: a Linux abstract socket.
        Some(b'@') => {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(&bytes[1..])?
        }
        Some(b'/') => std::os::unix::net::SocketAddr::from_pathname(path)?,
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "neither an absolute path nor an abstract name (@...)",
            ))
        }
    };
    let socket = UnixDatagram::unbound()?;
    Ok(Target { socket, addr })
}

/// `WATCHDOG_USEC` as a duration, when it is meant for this process (no `WATCHDOG_PID`, or ours).
pub fn watchdog_interval(usec: Option<&str>, pid: Option<&str>, own: u32) -> Option<Duration> {
    if let Some(pid) = pid {
        if pid.trim().parse::<u32>().ok()? != own {
            return None;
        }
    }
    let usec: u64 = usec?.trim().parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec))
}

/// Sends one notification (lines of `KEY=VALUE`); false when there is no manager to tell or the
/// send failed (logged: a manager that never hears `READY=1` kills the unit).
pub fn send(state: &str) -> bool {
    let Some(Some(target)) = TARGET.get() else {
        return false;
    };
    match target.socket.send_to_addr(state.as_bytes(), &target.addr) {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(error = %e, state, "cannot notify the service manager");
            false
        }
    }
}

/// Whether a service manager listens (`$NOTIFY_SOCKET` was set).
pub fn enabled() -> bool {
    matches!(TARGET.get(), Some(Some(_)))
}

/// Every listener is bound and serving.
pub fn ready() {
    send(&format!(
        "READY=1\nSTATUS=serving\nMAINPID={}",
        std::process::id()
    ));
}

/// A reload begins; `READY=1` follows when it is over (applied or refused).
pub fn reloading() {
    send(&format!(
        "RELOADING=1\nMONOTONIC_USEC={}\nSTATUS=reloading the config",
        monotonic_usec()
    ));
}

/// The reload is over.
pub fn reloaded(applied: bool) {
    let status = if applied {
        "serving (config reloaded)"
    } else {
        "serving (config reload refused: see the log)"
    };
    send(&format!("READY=1\nSTATUS={status}"));
}

/// Draining before exit.
pub fn stopping() {
    send("STOPPING=1\nSTATUS=draining");
}

/// A new process (`pid`) took over the listeners; it is the service's main process from now on.
pub fn handed_over(pid: u32) {
    send(&format!(
        "MAINPID={pid}\nREADY=1\nSTATUS=handed over to pid {pid}, draining"
    ));
}

/// `CLOCK_MONOTONIC` in microseconds, the clock `MONOTONIC_USEC` is read against.
fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the struct we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000 + (ts.tv_nsec as u64) / 1_000
}

/// Pets the watchdog at half its interval for as long as the runtime runs (nothing to do when
/// the unit sets no `WatchdogSec`). Stalls of the runtime itself are what it catches.
pub async fn watchdog() {
    let Some(Some(interval)) = WATCHDOG.get().copied() else {
        return;
    };
    let mut tick = tokio::time::interval(interval / 2);
    loop {
        tick.tick().await;
        send("WATCHDOG=1");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchdog_only_for_this_process() {
        let s = Duration::from_secs(10);
        assert_eq!(watchdog_interval(Some("10000000"), None, 7), Some(s));
        assert_eq!(watchdog_interval(Some("10000000"), Some("7"), 7), Some(s));
        assert_eq!(watchdog_interval(Some("10000000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval(Some("x"), None, 7), None);
        assert_eq!(watchdog_interval(None, None, 7), None);
    }
}
