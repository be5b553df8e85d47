//! Multicast receive sockets: bound to the group, joined on one named interface, never another.
//!
//! Why each choice:
//! - Bound to the group address, not the wildcard, and `IP_MULTICAST_ALL` off: with N channels
//!   on one port a wildcard socket receives all N (the Go `ListenMulticastUDP` trap). Where the
//!   option does not exist (qemu-user, kernels before 2.6.31) the bind alone does that.
//! - Joined by interface index resolved from the name on every (re)join: an address or
//!   "default" interface silently picks another NIC, and PPPoE redials change indexes.
//! - Source-specific joins use `MCAST_JOIN_SOURCE_GROUP`, the protocol-independent form that
//!   takes an interface index (`IP_ADD_SOURCE_MEMBERSHIP` only takes an interface address).
//! - Refresh is leave-then-join on the same socket: without `CAP_NET_RAW` it is the only way
//!   to make the kernel send a fresh report, and the gap is two back-to-back syscalls. The
//!   kernel keeps one membership per (group, interface), shared by every socket that joined
//!   it, and reports only when the first joins or the last leaves: a leave and join on one
//!   socket while another holds the group sends nothing. So a hub's sockets on one group (its
//!   media and its FEC port) all leave before any joins again.

use std::ffi::CString;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;

use socket2::{Domain, InterfaceIndexOrAddress, Protocol, SockAddr, Socket, Type};

/// One membership: what to join, from whom, and where.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Group {
    pub group: IpAddr,
    pub port: u16,
    /// Source for source-specific multicast (SSM); `None` joins any source.
    pub source: Option<IpAddr>,
    /// Interface name, resolved to an index at every join.
    pub interface: String,
}

/// Resolves an interface name to its index; an unknown name is an error, never a fallback.
pub fn interface_index(name: &str) -> io::Result<u32> {
    let c = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if index == 0 {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no network interface named {name:?}"),
        ));
    }
    Ok(index)
}

/// Opens a non-blocking socket bound to `group:port`, joined on the named interface.
/// `recv_buffer` is forced past `rmem_max` when the process may (root), else requested.
pub fn open(g: &Group, recv_buffer: usize) -> io::Result<Socket> {
    let ifindex = interface_index(&g.interface)?;
    let domain = match g.group {
        IpAddr::V4(_) => Domain::IPV4,
        IpAddr::V6(_) => Domain::IPV6,
    };
    let sock = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    // Several hubs may bind the same group:port (another interface or source).
    sock.set_reuse_address(true)?;
    sock.set_nonblocking(true)?;
    set_recv_buffer(&sock, recv_buffer);
    let all_off = match g.group {
        IpAddr::V4(_) => sock.set_multicast_all_v4(false),
        IpAddr::V6(_) => {
            sock.set_only_v6(true)?;
            sock.set_multicast_all_v6(false)
        }
    };
    match all_off {
        // Kernels before 2.6.31 and user-mode emulators (qemu-user) do not know the option;
        // the group-address bind still keeps other groups out, only one group joined on two
        // interfaces then reaches the hubs of both.
        Err(e) if e.raw_os_error() == Some(libc::ENOPROTOOPT) => {
            tracing::debug!(group = %g.group, "IP_MULTICAST_ALL not supported here; left on");
        }
        other => other?,
    }
    let bind = match g.group {
        // A link-scoped IPv6 group needs the scope id to bind.
        IpAddr::V6(v6) => SocketAddr::V6(std::net::SocketAddrV6::new(v6, g.port, 0, ifindex)),
        v4 => SocketAddr::new(v4, g.port),
    };
    sock.bind(&bind.into())?;
    join(&sock, g, ifindex)?;
    Ok(sock)
}

/// Leaves on every socket of `members`, then joins on every one again, so routers and
/// snooping switches see a fresh report (the kernel sends one only when the membership all of
/// them share goes and comes back). All name one interface, whose index is resolved again
/// here: the joins are made on the interface as it is now, and `ifindex` (the index they were
/// last made on) becomes that one, failed or not, for the next refresh to leave on. It
/// changes when the interface was deleted and made again.
///
/// The leaves are made on the old index and, when the name now resolves to another, on that
/// one too: a socket may already hold the group there (the FCC path joins by name after the
/// hub took its index), and a join where it is held fails (`EADDRINUSE`) and sends nothing,
/// refresh after refresh.
pub fn refresh(members: &[(&Socket, &Group)], ifindex: &mut u32) -> io::Result<()> {
    refresh_by(members, ifindex, |sock, g, ifindex, joining| {
        if joining {
            join(sock, g, ifindex)
        } else {
            leave(sock, g, ifindex)
        }
    })
}

/// `refresh`, with the leave or join (`true`) of one socket done by `op`.
fn refresh_by(
    members: &[(&Socket, &Group)],
    ifindex: &mut u32,
    mut op: impl FnMut(&Socket, &Group, u32, bool) -> io::Result<()>,
) -> io::Result<()> {
    let Some((_, first)) = members.first() else {
        return Ok(());
    };
    let now = interface_index(&first.interface);
    let old = *ifindex;
    let mut left_on = vec![old];
    left_on.extend(now.as_ref().ok().filter(|&&i| i != old));
    for &index in &left_on {
        for (sock, g) in members {
            // Best effort: the old membership may already be gone with its interface, and a
            // socket holds the new index only when it joined there apart from the hub.
            let _ = op(sock, g, index, false);
        }
    }
    *ifindex = now?;
    // Every socket is joined again even when one fails: the first error is the answer.
    let mut failed = None;
    for (sock, g) in members {
        if let Err(e) = op(sock, g, *ifindex, true) {
            failed.get_or_insert(e);
        }
    }
    failed.map_or(Ok(()), Err)
}

fn join(sock: &Socket, g: &Group, ifindex: u32) -> io::Result<()> {
    match (g.group, g.source) {
        (IpAddr::V4(group), None) => {
            sock.join_multicast_v4_n(&group, &InterfaceIndexOrAddress::Index(ifindex))
        }
        (IpAddr::V6(group), None) => sock.join_multicast_v6(&group, ifindex),
        (group, Some(source)) => source_membership(sock, group, source, ifindex, true),
    }
}

fn leave(sock: &Socket, g: &Group, ifindex: u32) -> io::Result<()> {
    match (g.group, g.source) {
        (IpAddr::V4(group), None) => {
            sock.leave_multicast_v4_n(&group, &InterfaceIndexOrAddress::Index(ifindex))
        }
        (IpAddr::V6(group), None) => sock.leave_multicast_v6(&group, ifindex),
        (group, Some(source)) => source_membership(sock, group, source, ifindex, false),
    }
}

fn source_membership(
    sock: &Socket,
    group: IpAddr,
    source: IpAddr,
    ifindex: u32,
    join: bool,
) -> io::Result<()> {
    let req = libc::group_source_req {
        gsr_interface: ifindex,
        gsr_group: SockAddr::from(SocketAddr::new(group, 0)).as_storage(),
        gsr_source: SockAddr::from(SocketAddr::new(source, 0)).as_storage(),
    };
    let level = match group {
        IpAddr::V4(_) => libc::IPPROTO_IP,
        IpAddr::V6(_) => libc::IPPROTO_IPV6,
    };
    let name = if join {
        libc::MCAST_JOIN_SOURCE_GROUP
    } else {
        libc::MCAST_LEAVE_SOURCE_GROUP
    };
    setsockopt(sock, level, name, &req)
}

fn setsockopt<T>(sock: &Socket, level: i32, name: i32, value: &T) -> io::Result<()> {
    // SAFETY: `value` points to a live `T` of the size passed; the kernel only reads it.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A burst of 4K video outruns the default 208 KiB buffer within milliseconds of a stall, so
/// ask for more; `SO_RCVBUFFORCE` ignores `rmem_max` when running as root.
pub fn set_recv_buffer(sock: &Socket, bytes: usize) {
    let want = i32::try_from(bytes).unwrap_or(i32::MAX);
    if setsockopt(sock, libc::SOL_SOCKET, SO_RCVBUFFORCE, &want).is_err() {
        let _ = sock.set_recv_buffer_size(bytes);
    }
}

/// Not exported by `libc` for Linux targets; the kernel's asm-generic value (MIPS too)...
#[cfg(not(any(target_arch = "sparc", target_arch = "sparc64")))]
const SO_RCVBUFFORCE: i32 = 33;
/// ...and SPARC's own.
#[cfg(any(target_arch = "sparc", target_arch = "sparc64"))]
const SO_RCVBUFFORCE: i32 = 0x100b;

/// A sender socket pinned to one interface, for tests and benchmarks on loopback.
pub fn sender(interface: &str, v6: bool) -> io::Result<Socket> {
    let ifindex = interface_index(interface)?;
    let domain = if v6 { Domain::IPV6 } else { Domain::IPV4 };
    let sock = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    if v6 {
        sock.set_multicast_if_v6(ifindex)?;
        sock.set_multicast_hops_v6(1)?;
        sock.set_multicast_loop_v6(true)?;
    } else {
        let req = libc::ip_mreqn {
            imr_multiaddr: libc::in_addr { s_addr: 0 },
            imr_address: libc::in_addr {
                s_addr: u32::from(Ipv4Addr::UNSPECIFIED).to_be(),
            },
            imr_ifindex: ifindex as i32,
        };
        setsockopt(&sock, libc::IPPROTO_IP, libc::IP_MULTICAST_IF, &req)?;
        sock.set_multicast_ttl_v4(1)?;
        sock.set_multicast_loop_v4(true)?;
    }
    Ok(sock)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Users` of `group`'s membership on `lo` in `/proc/net/igmp`, if it is joined there.
    fn users_on_lo(group: Ipv4Addr) -> Option<u32> {
        // The kernel prints the address as a host-order (little-endian) hex word.
        let hex = format!("{:08X}", u32::from_le_bytes(group.octets()));
        let text = std::fs::read_to_string("/proc/net/igmp").unwrap();
        let mut device = "";
        for line in text.lines().skip(1) {
            if !line.starts_with('\t') {
                device = line.split_whitespace().nth(1).unwrap_or("");
                continue;
            }
            let mut cols = line.split_whitespace();
            if device == "lo" && cols.next() == Some(hex.as_str()) {
                return cols.next().and_then(|u| u.parse().ok());
            }
        }
        None
    }

    /// A hub with `?fec=` holds its group on two sockets (media and FEC port). Refreshing them
    /// leaves the kernel's shared membership gone before the first join, which is what makes
    /// it send a report; a leave and join on one socket at a time never dropped it (the other
    /// held it), so a refresh sent nothing at all.
    #[test]
    fn a_group_held_by_two_sockets_is_left_by_both_before_either_joins() {
        let group = Ipv4Addr::new(239, 77, 4, 1);
        let member = |port| Group {
            group: group.into(),
            port,
            source: None,
            interface: "lo".into(),
        };
        let (media, fec) = (member(46701), member(46703));
        let media_sock = open(&media, 1 << 16).unwrap();
        let fec_sock = open(&fec, 1 << 16).unwrap();
        assert_eq!(users_on_lo(group), Some(2));
        let ifindex = interface_index("lo").unwrap();
        // What `/proc/net/igmp` said just before each join.
        let mut before_joins = Vec::new();
        let members = [(&media_sock, &media), (&fec_sock, &fec)];
        let mut got = ifindex;
        refresh_by(&members, &mut got, |sock, g, i, joining| {
            if joining {
                before_joins.push(users_on_lo(group));
                join(sock, g, i)
            } else {
                leave(sock, g, i)
            }
        })
        .unwrap();
        assert_eq!(got, ifindex);
        assert_eq!(
            before_joins,
            [None, Some(1)],
            "the group's membership on lo before each join"
        );
        assert_eq!(users_on_lo(group), Some(2), "both sockets joined again");
        // The real one does the same (its effect seen only as the membership kept).
        refresh(&members, &mut got).unwrap();
        assert_eq!(got, ifindex);
        assert_eq!(users_on_lo(group), Some(2));
        drop((media_sock, fec_sock));
        assert_eq!(users_on_lo(group), None);
    }

    /// The index a refresh is given is one the interface no longer has (it was deleted and
    /// made again), and the socket already holds the group on the new one (joined by name
    /// after the hub took its index: the FCC path). The refresh leaves there too before it
    /// joins, and goes on from the new index: leaving on the old one alone, its join found the
    /// group held (`EADDRINUSE`), failed, and kept the old index, refresh after refresh.
    #[test]
    fn a_refresh_from_a_stale_index_leaves_and_joins_on_the_current_one() {
        let group = Ipv4Addr::new(239, 77, 4, 2);
        let member = Group {
            group: group.into(),
            port: 46705,
            source: None,
            interface: "lo".into(),
        };
        let sock = open(&member, 1 << 16).unwrap();
        let lo = interface_index("lo").unwrap();
        // An index no interface has now: the one the hub took before the interface went.
        let stale = (1_000_000u32..)
            .find(|&i| {
                let mut name = [0 as libc::c_char; libc::IF_NAMESIZE];
                // SAFETY: `name` has the IF_NAMESIZE bytes the call may write.
                unsafe { libc::if_indextoname(i, name.as_mut_ptr()) }.is_null()
            })
            .unwrap();
        let members = [(&sock, &member)];
        for round in 0..2 {
            let mut ifindex = if round == 0 { stale } else { lo };
            let mut before_joins = Vec::new();
            let refreshed = refresh_by(&members, &mut ifindex, |sock, g, i, joining| {
                if joining {
                    before_joins.push(users_on_lo(group));
                    join(sock, g, i)
                } else {
                    leave(sock, g, i)
                }
            });
            assert!(refreshed.is_ok(), "round {round}: {refreshed:?}");
            assert_eq!(ifindex, lo, "round {round}");
            assert_eq!(before_joins, [None], "round {round}: left before the join");
            assert_eq!(users_on_lo(group), Some(1));
        }
        // The real one, from the stale index too.
        let mut ifindex = stale;
        refresh(&members, &mut ifindex).unwrap();
        assert_eq!(ifindex, lo);
        drop(sock);
        assert_eq!(users_on_lo(group), None);
    }
}
