//! A hub's fast channel change (`?fcc=IP:port&fcc-type=…`): the signalling socket, the unicast
//! burst that starts the channel from the server's last keyframe, and the switch to the
//! multicast at the sequence number where the two meet.
//!
//! The hub, not each viewer, runs FCC: the first viewer of a channel gets the burst at once,
//! and later viewers start from the hub's history as usual. The session goes
//! `Requested → Waiting → Unicast → Switching → Done`:
//! - the request is sent (three times, as set-top boxes do); no answer, or no burst after an
//!   answer, within [`SIGNAL_TIMEOUT`] (80 ms) means plain multicast at once;
//! - the burst's RTP packets are the channel's own (same sequence numbers), so they go
//!   through the reorder window like multicast ones;
//! - the server's sync (or [`SYNC_TIMEOUT`] of burst without one) joins the multicast; its
//!   datagrams are held, the first one's sequence number is sent as the termination, and when
//!   the burst reaches the packet before it the held ones follow: no gap, no duplicate;
//! - the two streams race, so every ordering is expected: a multicast already at or behind the
//!   burst switches at once, and what it repeats of the burst is dropped (held or live); a
//!   burst that runs past the meeting point switches at once and the rest of it is ignored;
//! - a termination lost on the wire shows as a burst that keeps coming after the switch: it is
//!   sent again every [`TERMINATE_RESEND`], at most [`MAX_TERMINATE_RESENDS`] times;
//! - a burst silent for [`UNICAST_TIMEOUT`] ends the session (the held multicast, or a fresh
//!   join, takes over); a hub that ends mid-burst sends a forced termination.
//!
//! The socket takes a port of `[iptv.fcc] listen_port_range` when one is set (a gateway
//! behind NAT whose router forwards that range), and is bound to the FCC interface
//! (`?r2h-ifname-fcc=` or `[iptv.fcc] interface`) when one is named. When neither can be had
//! the channel starts on plain multicast at once: FCC only ever makes a start faster.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use sluice_media::fcc::{self, Action, Flavor, ServerMessage};
use sluice_media::rtp;
use tokio::net::UdpSocket;
use tokio::time::Instant;

/// No answer to the request, or no burst after the answer: give up on FCC (rtp2httpd's value).
pub const SIGNAL_TIMEOUT: Duration = Duration::from_millis(80);
/// A burst that stops for this long is over.
pub const UNICAST_TIMEOUT: Duration = Duration::from_secs(1);
/// Join the multicast after this much burst even if the server never says so.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(15);
/// Redirects followed before giving up on FCC.
pub const MAX_REDIRECTS: u8 = 5;
/// Multicast datagrams held while the burst catches up (about 3 s at 40 Mb/s); beyond it, or
/// beyond the hub's `buffer_bytes` of them, the switch happens at once, gap or not.
pub const MAX_HELD: usize = 12_000;
/// A burst still arriving this long after the termination means the server did not hear it.
pub const TERMINATE_RESEND: Duration = Duration::from_millis(100);
/// Termination re-sends (three copies each) before the gateway stops asking.
pub const MAX_TERMINATE_RESENDS: u8 = 5;

/// `[iptv.fcc]` in the config file.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct FccConfig {
    /// Local UDP ports the FCC socket may take, `"40000-40100"` or one port (rtp2httpd's
    /// `fcc-listen-port-range`), for a gateway behind a router that forwards them. None: a
    /// port the kernel picks.
    pub listen_port_range: Option<String>,
    /// Interface for FCC signalling and bursts (rtp2httpd's `upstream-interface-fcc`);
    /// `?r2h-ifname-fcc=` picks per request. None: the route to the server decides.
    pub interface: Option<String>,
    /// Networks FCC servers may be in besides public addresses: the operator's IPTV network
    /// (`["10.0.0.0/8"]`). An `?fcc=` server, or one a server redirects to, that is loopback,
    /// private, link-local or otherwise not public and outside these is refused.
    pub servers: Vec<ipnet::Ipv4Net>,
}

crate::section::config_section!(FccConfig {
    listen_port_range,
    interface,
    servers,
});

/// Whether FCC signalling may go to `ip`: a public address (the upstream guard's rule) or one
/// inside `servers`. `Err` names the class of a refused address.
pub fn check_server(ip: Ipv4Addr, servers: &[ipnet::Ipv4Net]) -> Result<(), &'static str> {
    if servers.iter().any(|n| n.contains(&ip)) {
        return Ok(());
    }
    match crate::upstream::guard::non_public_reason(std::net::IpAddr::V4(ip)) {
        Some(class) => Err(class),
        None => Ok(()),
    }
}

impl FccConfig {
    pub fn validate(&self) -> Result<(), String> {
        if let Some(range) = &self.listen_port_range {
            Ports::parse(range)?;
        }
        if let Some(name) = &self.interface {
            if name.is_empty() || name.len() > 15 {
                return Err("interface must be a network interface name".into());
            }
        }
        Ok(())
    }

    /// The port range, shared by every hub (validated before).
    pub fn ports(&self) -> Option<std::sync::Arc<Ports>> {
        let range = self.listen_port_range.as_deref()?;
        Ports::parse(range).ok().map(std::sync::Arc::new)
    }
}

/// The ports of `listen_port_range`. Each session starts looking one port further than the
/// last, so a port just released (whose burst may still be arriving) is taken last.
#[derive(Debug)]
pub struct Ports {
    first: u16,
    last: u16,
    next: AtomicU32,
}

impl Ports {
    /// `"first-last"` or `"port"`, 1..=65535, first ≤ last.
    pub fn parse(s: &str) -> Result<Ports, String> {
        let bad = || format!("listen_port_range {s:?} must be PORT or FIRST-LAST (1-65535)");
        let port = |p: &str| p.trim().parse::<u16>().ok().filter(|&p| p > 0);
        let (first, last) = match s.split_once('-') {
            Some((a, b)) => (port(a).ok_or_else(bad)?, port(b).ok_or_else(bad)?),
            None => {
                let p = port(s).ok_or_else(bad)?;
                (p, p)
            }
        };
        if first > last {
            return Err(bad());
        }
        Ok(Ports {
            first,
            last,
            next: AtomicU32::new(0),
        })
    }

    /// Binds `sock` to the wildcard address on the first free port of the range.
    fn bind(&self, sock: &socket2::Socket) -> Result<u16, StartError> {
        let count = u32::from(self.last - self.first) + 1;
        let start = self.next.fetch_add(1, Ordering::Relaxed) % count;
        for i in 0..count {
            let port = self.first + ((start + i) % count) as u16;
            match sock.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)).into()) {
                Ok(()) => return Ok(port),
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
                Err(e) => return Err(StartError::Io(e)),
            }
        }
        Err(StartError::NoFreePort)
    }
}

/// Why a session could not start; the hub then joins the multicast at once.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("no free port in listen_port_range")]
    NoFreePort,
    #[error("cannot bind to the FCC interface: {0}")]
    Interface(std::io::Error),
    #[error("FCC socket: {0}")]
    Io(#[from] std::io::Error),
}

impl StartError {
    /// The outcome shown on the status page and counted in `iptv_fcc_sessions`.
    pub fn outcome(&self) -> &'static str {
        match self {
            StartError::NoFreePort => "no free port in listen_port_range",
            StartError::Interface(_) => "cannot bind to the FCC interface",
            StartError::Io(_) => "FCC socket failed",
        }
    }
}

/// Where to ask for a burst, in which dialect, and through which interface.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FccTarget {
    pub server: SocketAddrV4,
    pub flavor: Flavor,
    /// `?r2h-ifname-fcc=` or `[iptv.fcc] interface`; None: the route decides.
    pub interface: Option<String>,
    /// `[iptv.fcc] servers`: where a redirect may send the session.
    pub servers: std::sync::Arc<[ipnet::Ipv4Net]>,
}

/// Where the session stands; shown on the status page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Request sent, no answer yet.
    Requested,
    /// Accepted, waiting for the first burst packet.
    Waiting,
    /// Burst flowing.
    Unicast,
    /// Multicast joined and held until the burst meets it.
    Switching,
    /// On multicast (switched, refused, or fell back).
    Done,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Requested => "requested",
            Phase::Waiting => "waiting",
            Phase::Unicast => "unicast",
            Phase::Switching => "switching",
            Phase::Done => "multicast",
        }
    }
}

/// What the hub must do after the session saw something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Nothing,
    /// Join the multicast now (and feed what it receives to [`FccSession::hold`] while the
    /// session is switching).
    Join,
    /// The burst met the multicast: feed the held datagrams, then the multicast directly.
    Switch,
}

/// What the hub does with one multicast datagram while the session exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Multicast {
    /// Deliver it as usual.
    Deliver,
    /// Held until the burst meets the multicast.
    Held,
    /// This one met the burst: deliver the held datagrams ([`FccSession::take_held`]).
    Switched,
    /// The burst already delivered this sequence number.
    Duplicate,
}

/// One hub's FCC session.
#[derive(Debug)]
pub struct FccSession {
    flavor: Flavor,
    /// The interface the socket is bound to, if any (the Huawei request names its address).
    interface: Option<String>,
    group: SocketAddrV4,
    /// Where signalling goes now (after redirects and port changes).
    server: SocketAddrV4,
    /// Where the last request went: only its answer counts (a redirecting server answers
    /// each of the three copies).
    asked: SocketAddrV4,
    /// Addresses the burst may come from.
    peers: Vec<Ipv4Addr>,
    /// `[iptv.fcc] servers`, for the addresses answers name.
    servers: std::sync::Arc<[ipnet::Ipv4Net]>,
    phase: Phase,
    since: Instant,
    last_unicast: Instant,
    unicast_started: Option<Instant>,
    redirects: u8,
    /// The first multicast sequence number held: where the burst must stop.
    meet: Option<u16>,
    /// The last burst packet delivered.
    last_seq: Option<u16>,
    /// After the switch: multicast up to this sequence number repeats the burst.
    overlap_until: Option<u16>,
    held: Vec<Vec<u8>>,
    /// Bytes in `held`, and the most it may have: the hub's ring size, so a burst that never
    /// meets the multicast cannot hold more than the ring would.
    held_bytes: usize,
    max_held_bytes: usize,
    /// The termination sent (kept for re-sends), when, and how often it was sent again.
    termination: Option<Vec<u8>>,
    terminated_at: Instant,
    resends: u8,
    /// Why the session ended, for the log and status page.
    pub outcome: &'static str,
}

/// Opens the signalling socket (which also receives the burst, so it gets the multicast's
/// `recv_buffer`) on the FCC interface and a port of `ports`, and sends the request; at most
/// `max_held_bytes` of multicast wait for the burst. Must run inside a tokio runtime.
pub fn start(
    target: &FccTarget,
    group: SocketAddrV4,
    recv_buffer: usize,
    max_held_bytes: usize,
    ports: Option<&Ports>,
) -> Result<(FccSession, UdpSocket), StartError> {
    let raw = udp_socket(target.interface.as_deref())?;
    crate::net::multicast::set_recv_buffer(&raw, recv_buffer);
    match ports {
        Some(ports) => {
            ports.bind(&raw)?;
        }
        None => raw.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)).into())?,
    }
    raw.set_nonblocking(true)?;
    let sock = UdpSocket::from_std(raw.into())?;
    let now = Instant::now();
    let mut session = FccSession {
        flavor: target.flavor,
        interface: target.interface.clone(),
        group,
        server: target.server,
        asked: target.server,
        peers: vec![*target.server.ip()],
        servers: target.servers.clone(),
        phase: Phase::Requested,
        since: now,
        last_unicast: now,
        unicast_started: None,
        redirects: 0,
        meet: None,
        last_seq: None,
        overlap_until: None,
        held: Vec::new(),
        held_bytes: 0,
        max_held_bytes,
        termination: None,
        terminated_at: now,
        resends: 0,
        outcome: "in progress",
    };
    session.send_request(&sock)?;
    Ok((session, sock))
}

impl FccSession {
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// A multicast datagram: held while switching, dropped when it repeats the burst.
    pub fn on_multicast(&mut self, sock: &UdpSocket, d: &[u8]) -> Multicast {
        match self.phase {
            Phase::Switching => match self.hold(sock, d) {
                Step::Switch => Multicast::Switched,
                _ => Multicast::Held,
            },
            Phase::Done => {
                if self.repeats_burst(d) {
                    Multicast::Duplicate
                } else {
                    Multicast::Deliver
                }
            }
            _ => Multicast::Deliver,
        }
    }

    /// Whether `d` is a multicast datagram the burst already delivered. The first one past the
    /// burst ends the check, so a later sequence wrap cannot look like an old packet.
    fn repeats_burst(&mut self, d: &[u8]) -> bool {
        let Some(end) = self.overlap_until else {
            return false;
        };
        let repeat =
            rtp::parse_rtp(d).is_ok_and(|p| (p.header.sequence.wrapping_sub(end) as i16) <= 0);
        if !repeat {
            self.overlap_until = None;
        }
        repeat
    }

    /// When [`FccSession::on_timer`] must run next; `None` once done.
    pub fn deadline(&self) -> Option<Instant> {
        match self.phase {
            Phase::Requested | Phase::Waiting => Some(self.since + SIGNAL_TIMEOUT),
            Phase::Unicast => {
                let sync = self.unicast_started.map(|t| t + SYNC_TIMEOUT);
                let quiet = self.last_unicast + UNICAST_TIMEOUT;
                Some(sync.map_or(quiet, |s| s.min(quiet)))
            }
            Phase::Switching => Some(self.last_unicast + UNICAST_TIMEOUT),
            Phase::Done => None,
        }
    }

    fn set(&mut self, phase: Phase) {
        tracing::debug!(group = %self.group, from = self.phase.name(), to = phase.name(), "FCC");
        self.phase = phase;
        self.since = Instant::now();
    }

    /// Gives up on FCC: forced termination, plain multicast.
    fn fall_back(&mut self, sock: &UdpSocket, why: &'static str) -> Step {
        self.terminate(sock, None);
        self.outcome = why;
        tracing::info!(group = %self.group, server = %self.server, reason = why, "FCC: plain multicast");
        let was_switching = self.phase == Phase::Switching;
        self.overlap_until = self.last_seq;
        self.set(Phase::Done);
        if was_switching {
            // Already joined: what is held goes out as it is.
            Step::Switch
        } else {
            Step::Join
        }
    }

    /// Timeouts: a silent server, a stalled burst, a sync that never comes.
    pub fn on_timer(&mut self, sock: &UdpSocket) -> Step {
        let now = Instant::now();
        match self.phase {
            Phase::Requested | Phase::Waiting if now >= self.since + SIGNAL_TIMEOUT => {
                let why = if self.phase == Phase::Requested {
                    "no answer within 80 ms"
                } else {
                    "no burst within 80 ms of the answer"
                };
                self.fall_back(sock, why)
            }
            Phase::Unicast if now >= self.last_unicast + UNICAST_TIMEOUT => {
                self.fall_back(sock, "burst stopped before the sync")
            }
            Phase::Unicast
                if self
                    .unicast_started
                    .is_some_and(|t| now >= t + SYNC_TIMEOUT) =>
            {
                self.set(Phase::Switching);
                Step::Join
            }
            Phase::Switching if now >= self.last_unicast + UNICAST_TIMEOUT => {
                self.fall_back(sock, "burst stopped before meeting the multicast")
            }
            _ => Step::Nothing,
        }
    }

    /// A datagram on the signalling socket. Returns the step, and whether `d` is burst media
    /// the hub must deliver.
    pub fn on_datagram(&mut self, sock: &UdpSocket, d: &[u8], from: SocketAddr) -> (Step, bool) {
        let SocketAddr::V4(from) = from else {
            return (Step::Nothing, false);
        };
        if !self.peers.contains(from.ip()) {
            return (Step::Nothing, false);
        }
        if fcc::is_feedback(d) {
            return (self.on_signal(sock, d, from), false);
        }
        if rtp::parse_rtp(d).is_err() {
            return (Step::Nothing, false);
        }
        self.on_unicast(sock, d)
    }

    fn on_signal(&mut self, sock: &UdpSocket, d: &[u8], from: SocketAddrV4) -> Step {
        match fcc::parse_server(self.flavor, d) {
            // A sync overtaking the answer still means the server has the request.
            Ok(ServerMessage::Sync) => match self.phase {
                Phase::Requested | Phase::Waiting | Phase::Unicast => {
                    self.set(Phase::Switching);
                    Step::Join
                }
                _ => Step::Nothing,
            },
            Ok(ServerMessage::Response(r))
                if self.phase == Phase::Requested && from == self.asked =>
            {
                if !r.accepted(self.flavor) {
                    return self.fall_back(sock, "server refused");
                }
                // An answer names the next hop itself: it gets the same check as `?fcc=`.
                if let Some(ip) = r.server {
                    if let Err(class) = check_server(ip, &self.servers) {
                        tracing::debug!(%ip, class, "FCC: answer names a refused address");
                        return self.fall_back(sock, "server named a refused address");
                    }
                }
                if let Some(ip) = r.server {
                    if !self.peers.contains(&ip) {
                        self.peers.push(ip);
                    }
                }
                match r.action {
                    Some(Action::Unicast) => {
                        self.accept(sock, &r);
                        Step::Nothing
                    }
                    Some(Action::Redirect) => self.redirect(sock, &r),
                    _ => self.fall_back(sock, "server says join the multicast"),
                }
            }
            Ok(ServerMessage::Response(_)) => Step::Nothing,
            Err(e) => {
                tracing::debug!(error = %e, "FCC: unusable signalling packet");
                Step::Nothing
            }
        }
    }

    fn accept(&mut self, sock: &UdpSocket, r: &fcc::Response) {
        let server_ip = r.server.unwrap_or(*self.server.ip());
        match self.flavor {
            Flavor::Telecom => {
                if let Some(port) = r.signal_port {
                    self.server.set_port(port);
                }
                self.server.set_ip(server_ip);
                // Open the way back through a NAT to both ports, as set-top boxes do.
                if let Some(port) = r.media_port {
                    let _ = send(sock, &[], SocketAddrV4::new(server_ip, port));
                }
                let _ = send(sock, &[], self.server);
            }
            Flavor::Huawei => {
                if r.nat_probe && r.session != 0 {
                    let port = r.media_port.unwrap_or(self.server.port());
                    let probe = fcc::nat_probe(r.session);
                    let _ = send(sock, &probe, SocketAddrV4::new(server_ip, port));
                }
            }
        }
        self.set(Phase::Waiting);
    }

    fn redirect(&mut self, sock: &UdpSocket, r: &fcc::Response) -> Step {
        self.redirects += 1;
        if self.redirects > MAX_REDIRECTS {
            return self.fall_back(sock, "too many redirects");
        }
        if let Some(ip) = r.server {
            self.server.set_ip(ip);
        }
        if let Some(port) = r.signal_port {
            self.server.set_port(port);
        }
        tracing::debug!(group = %self.group, server = %self.server, "FCC redirect");
        if self.send_request(sock).is_err() {
            return self.fall_back(sock, "request to the redirect target failed");
        }
        self.set(Phase::Requested);
        Step::Nothing
    }

    fn on_unicast(&mut self, sock: &UdpSocket, d: &[u8]) -> (Step, bool) {
        match self.phase {
            Phase::Requested | Phase::Waiting | Phase::Unicast => {
                if self.phase != Phase::Unicast {
                    // Some servers start the burst before (or without) their answer.
                    self.set(Phase::Unicast);
                    self.unicast_started = Some(Instant::now());
                }
                self.last_unicast = Instant::now();
                self.last_seq = Some(seq_of(d));
                (Step::Nothing, true)
            }
            Phase::Switching => {
                self.last_unicast = Instant::now();
                let seq = seq_of(d);
                match self.meet {
                    // Past the meeting point: the held multicast has it.
                    Some(meet) if (seq.wrapping_sub(meet) as i16) >= 0 => {
                        (self.switch("switched at the meeting point"), false)
                    }
                    Some(meet) if seq.wrapping_add(1) == meet => {
                        self.last_seq = Some(seq);
                        (self.switch("switched at the meeting point"), true)
                    }
                    _ => {
                        self.last_seq = Some(seq);
                        (Step::Nothing, true)
                    }
                }
            }
            Phase::Done => {
                self.resend_termination(sock);
                (Step::Nothing, false)
            }
        }
    }

    /// The burst goes on after the switch: the server may not have heard the termination.
    fn resend_termination(&mut self, sock: &UdpSocket) {
        let Some(packet) = self.termination.as_ref() else {
            return;
        };
        let now = Instant::now();
        if self.resends >= MAX_TERMINATE_RESENDS || now < self.terminated_at + TERMINATE_RESEND {
            return;
        }
        self.resends += 1;
        self.terminated_at = now;
        tracing::debug!(group = %self.group, resends = self.resends, "FCC: burst after the termination, sending it again");
        if let Err(e) = send_thrice(sock, packet, self.server) {
            tracing::debug!(error = %e, "FCC: termination not sent");
        }
    }

    fn switch(&mut self, why: &'static str) -> Step {
        self.outcome = why;
        self.overlap_until = self.last_seq;
        tracing::debug!(group = %self.group, meet = ?self.meet, held = self.held.len(), "FCC: switched to multicast");
        self.set(Phase::Done);
        Step::Switch
    }

    /// A multicast datagram while switching: held; the first one names the meeting point.
    fn hold(&mut self, sock: &UdpSocket, d: &[u8]) -> Step {
        self.held.push(d.to_vec());
        self.held_bytes += d.len();
        let Ok(p) = rtp::parse_rtp(d) else {
            // Bare TS has no sequence number to meet at.
            return self.fall_back(sock, "multicast is not RTP");
        };
        if self.meet.is_none() {
            let meet = p.header.sequence;
            self.meet = Some(meet);
            self.terminate(sock, Some(meet));
            // The burst may already have reached (or passed) the multicast's first packet:
            // switch now; what the multicast repeats is dropped on the way out.
            let reached = self
                .last_seq
                .is_some_and(|last| (last.wrapping_add(1).wrapping_sub(meet) as i16) >= 0);
            if reached {
                return self.switch("switched at the meeting point");
            }
        }
        if self.held.len() >= MAX_HELD || self.held_bytes >= self.max_held_bytes {
            return self.fall_back(sock, "burst too slow to meet the multicast");
        }
        Step::Nothing
    }

    /// The held multicast datagrams, oldest first, without those the burst already delivered.
    pub fn take_held(&mut self) -> Vec<Vec<u8>> {
        let mut held = std::mem::take(&mut self.held);
        self.held_bytes = 0;
        held.retain(|d| !self.repeats_burst(d));
        held
    }

    fn send_request(&mut self, sock: &UdpSocket) -> std::io::Result<()> {
        self.asked = self.server;
        let port = sock.local_addr()?.port();
        let local = local_ip_towards(self.server, self.interface.as_deref())
            .unwrap_or(Ipv4Addr::UNSPECIFIED);
        let packet = fcc::request(self.flavor, self.group, port, local);
        send_thrice(sock, &packet, self.server)
    }

    /// Sends the termination once: the meeting point, or a forced stop.
    fn terminate(&mut self, sock: &UdpSocket, first_multicast_seq: Option<u16>) {
        if self.termination.is_some() {
            return;
        }
        let packet = fcc::terminate(self.flavor, *self.group.ip(), first_multicast_seq);
        if let Err(e) = send_thrice(sock, &packet, self.server) {
            tracing::debug!(error = %e, "FCC: termination not sent");
        }
        self.termination = Some(packet);
        self.terminated_at = Instant::now();
    }

    /// The hub is ending: stop a burst that is still running.
    pub fn close(&mut self, sock: &UdpSocket) {
        if self.phase != Phase::Done {
            self.terminate(sock, None);
        }
    }
}

/// The RTP sequence number of a datagram already known to be RTP.
fn seq_of(d: &[u8]) -> u16 {
    u16::from_be_bytes([d[2], d[3]])
}

/// Signalling is UDP without retransmission; set-top boxes send each packet three times.
fn send_thrice(sock: &UdpSocket, packet: &[u8], to: SocketAddrV4) -> std::io::Result<()> {
    for _ in 0..3 {
        send(sock, packet, to)?;
    }
    Ok(())
}

/// One datagram, sent on the socket directly: a small UDP send does not wait for buffer
/// space, and tokio's `try_send_to` refuses until the socket was first seen writable.
fn send(sock: &UdpSocket, packet: &[u8], to: SocketAddrV4) -> std::io::Result<usize> {
    socket2::SockRef::from(sock).send_to(packet, &SocketAddr::V4(to).into())
}

/// A UDP socket, bound to `interface` (`SO_BINDTODEVICE`) when one is named: the route to
/// the FCC server may otherwise leave by another interface (a PPPoE IPTV link beside the
/// multicast VLAN is the usual case).
fn udp_socket(interface: Option<&str>) -> Result<socket2::Socket, StartError> {
    let raw = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    if let Some(name) = interface {
        raw.bind_device(Some(name.as_bytes()))
            .map_err(StartError::Interface)?;
    }
    Ok(raw)
}

/// The local address the kernel would use towards `server`, through `interface` when one is
/// named (Huawei requests carry it).
fn local_ip_towards(server: SocketAddrV4, interface: Option<&str>) -> Option<Ipv4Addr> {
    let probe: std::net::UdpSocket = udp_socket(interface).ok()?.into();
    probe.connect(server).ok()?;
    match probe.local_addr().ok()? {
        SocketAddr::V4(a) => Some(*a.ip()),
        SocketAddr::V6(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_ranges_parse_or_say_why() {
        let p = Ports::parse("40000-40100").unwrap();
        assert_eq!((p.first, p.last), (40000, 40100));
        let p = Ports::parse("5000").unwrap();
        assert_eq!((p.first, p.last), (5000, 5000));
        for bad in ["", "0", "0-5", "5-4", "1-70000", "a-b", "-", "40000-"] {
            let err = Ports::parse(bad).unwrap_err();
            assert!(err.contains("PORT or FIRST-LAST"), "{bad}: {err}");
        }
    }

    fn socket() -> socket2::Socket {
        udp_socket(None).unwrap()
    }

    /// Successive sessions start one port further on, skip ports in use, and run out.
    #[test]
    fn sessions_take_free_ports_in_turn_until_none_is_left() {
        // Two free ports next to each other, found by holding them.
        let (first, held) = (20_000..60_000u16)
            .step_by(7)
            .find_map(|p| {
                let a = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, p)).ok()?;
                let b = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, p + 1)).ok()?;
                Some((p, (a, b)))
            })
            .unwrap();
        drop(held);
        let ports = Ports::parse(&format!("{first}-{}", first + 1)).unwrap();
        let (a, b) = (socket(), socket());
        assert_eq!(ports.bind(&a).unwrap(), first);
        assert_eq!(ports.bind(&b).unwrap(), first + 1);
        // Both taken: the third session gets none.
        assert!(matches!(ports.bind(&socket()), Err(StartError::NoFreePort)));
        // One released: the next session finds it wherever its turn starts.
        drop(a);
        assert_eq!(ports.bind(&socket()).unwrap(), first);
    }

    /// A burst that never meets the multicast holds no more of it than `max_held_bytes` (the
    /// hub's ring size), however many datagrams `MAX_HELD` would allow: then the switch
    /// happens, gap or not, and the held datagrams go out.
    #[tokio::test]
    async fn held_multicast_is_bounded_in_bytes() {
        let server = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let SocketAddr::V4(addr) = server.local_addr().unwrap() else {
            unreachable!()
        };
        let target = FccTarget {
            server: addr,
            flavor: Flavor::Telecom,
            interface: None,
            servers: Vec::new().into(),
        };
        let group = SocketAddrV4::new(Ipv4Addr::new(239, 1, 1, 1), 5000);
        let max = 64 * 1024;
        let (mut session, sock) = start(&target, group, 65536, max, None).unwrap();
        // Burst delivered up to 99; the multicast is far ahead, so it is held.
        session.last_seq = Some(99);
        session.set(Phase::Switching);
        let datagram = |seq: u16| {
            let mut d = vec![0x80, 33];
            d.extend_from_slice(&seq.to_be_bytes());
            d.resize(12 + 7 * 188, 0);
            d
        };
        let mut held = 0;
        let last = loop {
            let step = session.on_multicast(&sock, &datagram(5000 + held as u16));
            held += 1;
            if step != Multicast::Held || held > MAX_HELD {
                break step;
            }
        };
        assert_eq!(last, Multicast::Switched);
        assert_eq!(
            held,
            max.div_ceil(12 + 7 * 188),
            "held until the byte bound"
        );
        assert_eq!(session.outcome, "burst too slow to meet the multicast");
        assert_eq!(session.take_held().len(), held);
        assert_eq!(session.held_bytes, 0);
    }
}
