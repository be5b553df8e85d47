//! Multicast sender: paced RTP/MPEG-TS datagrams to G groups, on a loopback interface only.
//!
//! The socket is bound to 127.0.0.1, pinned to the interface with `SO_BINDTODEVICE` and
//! `IP_MULTICAST_IF` (by index), multicast loop on and TTL 1, and the interface must carry the
//! kernel's loopback flag: nothing this sends can leave the machine. Pacing is by a 1 ms tick:
//! every tick each group gets the datagrams its rate says are due by now, sent with `sendmmsg`.

use crate::tsgen::{write_datagram, DATAGRAM_LEN};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::ffi::CString;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct Config {
    pub groups: Vec<Ipv4Addr>,
    pub port: u16,
    pub interface: String,
    /// Per group, counting whole RTP datagrams (UDP payload).
    pub mbit_per_s: f64,
    pub secs: Duration,
    pub seed: u64,
}

#[derive(Debug, Serialize)]
pub struct GroupReport {
    pub group: String,
    pub datagrams: u64,
    pub ts_packets: u64,
    pub payload_bytes: u64,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub mode: &'static str,
    pub interface: String,
    pub port: u16,
    pub target_mbit_per_s: f64,
    pub elapsed_s: f64,
    pub groups: Vec<GroupReport>,
    /// Achieved rate per group, datagram bytes.
    pub achieved_mbit_per_s: f64,
    pub send_errors: u64,
    /// Largest number of datagrams one group was behind schedule at a tick.
    pub max_behind: u64,
    /// This process's own CPU seconds (user + system).
    pub cpu_s: f64,
}

const BATCH: usize = 64;
const TICK: Duration = Duration::from_millis(1);

fn is_loopback_interface(name: &str) -> Result<u32> {
    if name.is_empty() || name.contains('/') || name.contains("..") {
        bail!("bad interface name {name:?}");
    }
    let flags = std::fs::read_to_string(format!("/sys/class/net/{name}/flags"))
        .with_context(|| format!("no network interface named {name:?}"))?;
    let flags = u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16)?;
    if flags & libc::IFF_LOOPBACK as u32 == 0 {
        bail!("refusing to send multicast on {name}: not a loopback interface");
    }
    let c = CString::new(name)?;
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if index == 0 {
        bail!("no network interface named {name:?}");
    }
    Ok(index)
}

fn setsockopt<T>(fd: i32, level: i32, name: i32, value: &T, what: &str) -> Result<()> {
    // SAFETY: `value` points to a live `T` of the size passed, for the duration of the call.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context(what.to_string());
    }
    Ok(())
}

fn open_socket(interface: &str) -> Result<UdpSocket> {
    let ifindex = is_loopback_interface(interface)?;
    let sock = UdpSocket::bind("127.0.0.1:0")?;
    let fd = sock.as_raw_fd();
    let dev = CString::new(interface)?;
    let name = dev.as_bytes_with_nul();
    // SAFETY: `name` is a live byte slice of the length passed.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_BINDTODEVICE,
            name.as_ptr().cast(),
            name.len() as libc::socklen_t,
        )
    };
    if rc != 0 {
        // Needs CAP_NET_RAW; IP_MULTICAST_IF below still pins the interface.
        eprintln!("note: SO_BINDTODEVICE: {}", std::io::Error::last_os_error());
    }
    let req = libc::ip_mreqn {
        imr_multiaddr: libc::in_addr { s_addr: 0 },
        imr_address: libc::in_addr {
            s_addr: u32::from(Ipv4Addr::LOCALHOST).to_be(),
        },
        imr_ifindex: ifindex as i32,
    };
    setsockopt(
        fd,
        libc::IPPROTO_IP,
        libc::IP_MULTICAST_IF,
        &req,
        "IP_MULTICAST_IF",
    )?;
    sock.set_multicast_ttl_v4(1)?;
    sock.set_multicast_loop_v4(true)?;
    Ok(sock)
}

fn sockaddr(addr: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: addr.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*addr.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

fn own_cpu_s() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid out pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Sends `datagrams` (already built) to `dest` with one `sendmmsg`; returns how many went out.
fn send_batch(fd: i32, dest: &libc::sockaddr_in, bufs: &mut [[u8; DATAGRAM_LEN]]) -> Result<usize> {
    let mut iovs: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: DATAGRAM_LEN,
        })
        .collect();
    let mut msgs: Vec<libc::mmsghdr> = iovs
        .iter_mut()
        .map(|iov| {
            // SAFETY: an all-zero msghdr is a valid empty header; the fields we need follow.
            let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
            h.msg_hdr.msg_name = (dest as *const libc::sockaddr_in).cast_mut().cast();
            h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            h.msg_hdr.msg_iov = iov;
            h.msg_hdr.msg_iovlen = 1;
            h
        })
        .collect();
    // SAFETY: `msgs` describes `bufs` and `dest`, all alive for the call.
    let n = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), msgs.len() as u32, 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(n as usize)
}

pub fn run(cfg: Config) -> Result<Report> {
    if cfg.groups.is_empty() || cfg.groups.iter().any(|g| !g.is_multicast()) {
        bail!("every --groups entry must be an IPv4 multicast address");
    }
    if !(cfg.mbit_per_s > 0.0 && cfg.mbit_per_s <= 10_000.0) {
        bail!("--mbps must be in (0, 10000]");
    }
    let sock = open_socket(&cfg.interface)?;
    let fd = sock.as_raw_fd();
    let dests: Vec<libc::sockaddr_in> = cfg
        .groups
        .iter()
        .map(|g| sockaddr(SocketAddrV4::new(*g, cfg.port)))
        .collect();
    let per_s = cfg.mbit_per_s * 1e6 / 8.0 / DATAGRAM_LEN as f64;
    let mut sent = vec![0u64; cfg.groups.len()];
    let mut bufs = vec![[0u8; DATAGRAM_LEN]; BATCH];
    let (mut errors, mut max_behind) = (0u64, 0u64);
    let start = Instant::now();
    let mut next_tick = start;
    // Bounded: the loop ends at `secs` whatever happens; every inner loop is bounded by BATCH.
    while start.elapsed() < cfg.secs {
        let elapsed = start.elapsed().as_secs_f64();
        let due = (elapsed * per_s) as u64;
        let timestamp = (elapsed * 90_000.0) as u32;
        for (g, dest) in dests.iter().enumerate() {
            let behind = due.saturating_sub(sent[g]);
            max_behind = max_behind.max(behind);
            // Catch up at most 4 batches per tick so one slow tick cannot starve the others.
            for _ in 0..4 {
                let n = due.saturating_sub(sent[g]).min(BATCH as u64) as usize;
                if n == 0 {
                    break;
                }
                for (k, buf) in bufs[..n].iter_mut().enumerate() {
                    write_datagram(cfg.seed, g as u32, sent[g] + k as u64, timestamp, buf);
                }
                match send_batch(fd, dest, &mut bufs[..n]) {
                    Ok(done) => sent[g] += done as u64,
                    Err(_) => {
                        errors += 1;
                        break;
                    }
                }
            }
        }
        next_tick += TICK;
        let now = Instant::now();
        if next_tick > now {
            std::thread::sleep(next_tick - now);
        } else {
            next_tick = now;
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let groups: Vec<GroupReport> = cfg
        .groups
        .iter()
        .zip(&sent)
        .map(|(g, n)| GroupReport {
            group: g.to_string(),
            datagrams: *n,
            ts_packets: n * crate::tsgen::TS_PER_DATAGRAM as u64,
            payload_bytes: n * (DATAGRAM_LEN - crate::tsgen::RTP_HEADER_LEN) as u64,
        })
        .collect();
    let total: u64 = sent.iter().sum();
    Ok(Report {
        mode: "mcast-send",
        interface: cfg.interface,
        port: cfg.port,
        target_mbit_per_s: cfg.mbit_per_s,
        elapsed_s: elapsed,
        achieved_mbit_per_s: total as f64 * DATAGRAM_LEN as f64 * 8.0
            / 1e6
            / elapsed
            / cfg.groups.len() as f64,
        groups,
        send_errors: errors,
        max_behind,
        cpu_s: own_cpu_s(),
    })
}
