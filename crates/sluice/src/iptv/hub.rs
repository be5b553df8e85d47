//! One hub per `HubKey` (group, interface, FEC, FCC server): the only owner of its socket.
//!
//! The hub's receive loop is a tokio task rather than a thread per channel, so hundreds of
//! lingering channels cost no stacks or context switches. A quiet channel waits for readiness
//! (`AsyncFd`); a flowing one is read once per read slot, a 2 ms grid shared by every hub, with
//! one `recvmmsg` of up to 32 datagrams, so 8 channels cost the runtime one wakeup per slot
//! instead of one per datagram train each.
//! It strips RTP, restores order, checks TS continuity, appends to the ring, and publishes
//! the ring's end to subscribers only every `write_batch` bytes or `flush_interval`, which is
//! what makes their writes large.
//!
//! Payloads are copied once, out of the receive scratch and back to back into 32 KiB blocks
//! (only those the reorder window keeps: a block lives as long as any chunk of it), and the
//! in-order ones that sit side by side are joined into one ring chunk per wakeup: a
//! held byte of history costs one byte of memory, and a subscriber's write covers a whole
//! batch with a handful of iovecs. Small payloads released out of order (so not side by side)
//! are copied onto the chunk rather than starting one each (see `Joiner`).

use std::collections::HashMap;
use std::net::SocketAddrV4;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use sluice_media::fcc::Flavor;
use sluice_media::mpegts::{self, Continuity};
use sluice_media::rtp::{self, Reorder, ReorderStats};
use socket2::Socket;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::fcc::{FccSession, FccTarget, Multicast, Step};
use super::fec::FecState;
use super::metrics::HubMetrics;
use super::registry::Registry;
use super::ring::Ring;
use super::url::Mode;
use crate::net::multicast::{self, Group};
use crate::net::recv::RecvBatch;

/// Identity of a hub: requests with equal keys share it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HubKey {
    pub mode: Mode,
    pub group: Group,
    /// What the request adds to the group: its FEC stream and its FCC server; `None` when it
    /// names neither (and for RTSP hubs). Built by [`Extras::new`] so that equal requests
    /// make equal keys.
    pub extras: Option<Extras>,
    /// Set for an RTSP session hub (`/rtsp/`), which has no multicast group: `group` is
    /// then `super::rtsp::NO_GROUP` and the hub's pump is the RTSP client's.
    pub rtsp: Option<super::rtsp::RtspKey>,
}

/// The parts of a multicast request besides its group that change what the hub receives.
///
/// The FCC server is one: its unicast burst goes into the ring like the multicast, so a hub
/// started on one client's `?fcc=` server must not be what a request naming another server,
/// or none, receives (a server of the client's own would otherwise feed everyone who tunes
/// in to that channel while the burst lasts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Extras {
    /// Port of the group's SMPTE 2022-1 FEC stream, when the request asked for FEC.
    pub fec: Option<u16>,
    /// FCC server and dialect (`?fcc=IP:PORT&fcc-type=`), when the request named one.
    pub fcc: Option<(SocketAddrV4, Flavor)>,
}

impl Extras {
    /// `None` when there is neither, so a plain request has one key whatever builds it.
    pub fn new(fec: Option<u16>, fcc: Option<(SocketAddrV4, Flavor)>) -> Option<Extras> {
        (fec.is_some() || fcc.is_some()).then_some(Extras { fec, fcc })
    }
}

impl HubKey {
    /// Port of the group's FEC stream, when the request asked for FEC.
    pub fn fec_port(&self) -> Option<u16> {
        self.extras.and_then(|e| e.fec)
    }

    /// The FCC server and dialect the hub was started with, if any.
    pub fn fcc_server(&self) -> Option<(SocketAddrV4, Flavor)> {
        self.extras.and_then(|e| e.fcc)
    }

    /// The channel as a recording is named by: without the FCC server, which changes how a
    /// hub starts, not what it records (a timeshift folder keeps its name when `fcc=` is added
    /// or changed).
    pub fn recorded_channel(&self) -> String {
        let mut key = self.clone();
        key.extras = self.extras.and_then(|e| Extras::new(e.fec, None));
        key.channel()
    }

    /// `rtp://[S@]G:P` form used in logs, labels and the status page.
    pub fn channel(&self) -> String {
        if let Some(rtsp) = &self.rtsp {
            return rtsp.label();
        }
        let scheme = match self.mode {
            Mode::Rtp => "rtp",
            Mode::Udp => "udp",
        };
        let g = &self.group;
        let src = g
            .source
            .map(|s| format!("{}@", bracket(s)))
            .unwrap_or_default();
        let mut query = Vec::new();
        if let Some(port) = self.fec_port() {
            query.push(format!("fec={port}"));
        }
        if let Some((server, flavor)) = self.fcc_server() {
            query.push(format!("fcc={server}"));
            if flavor != Flavor::default() {
                query.push(format!("fcc-type={}", flavor.name()));
            }
        }
        let query = if query.is_empty() {
            String::new()
        } else {
            format!("?{}", query.join("&"))
        };
        format!("{scheme}://{src}{}:{}{query}", bracket(g.group), g.port)
    }
}

fn bracket(ip: std::net::IpAddr) -> String {
    match ip {
        std::net::IpAddr::V6(v6) => format!("[{v6}]"),
        v4 => v4.to_string(),
    }
}

/// Tunables a hub needs, taken from the config once.
#[derive(Debug, Clone)]
pub struct HubSettings {
    /// Most history held, however far behind the slowest subscriber is.
    pub ring_bytes: usize,
    /// History always held, for instant start.
    pub history: usize,
    pub write_batch: usize,
    pub flush_interval: Duration,
    pub linger: Duration,
    /// A subscriber that takes nothing for this long while data waits stops holding history.
    pub stall_timeout: Duration,
    pub no_data_timeout: Duration,
    pub refresh: Option<Duration>,
    pub reorder_window: usize,
    pub recv_buffer: usize,
    pub max_datagram: usize,
    /// What RTSP hubs share (client settings, upstream guard, session count).
    pub rtsp: Option<Arc<super::rtsp::Context>>,
    /// `[iptv.fcc] listen_port_range`, shared by every hub's FCC socket.
    pub fcc_ports: Option<Arc<super::fcc::Ports>>,
}

/// What subscribers may read: the ring up to `end`, and whether the hub has ended.
#[derive(Debug, Clone, Copy, Default)]
pub struct Published {
    pub end: u64,
    pub closed: bool,
}

/// `ClientStats::position` of a subscriber that has not started reading: holds nothing.
pub const NOT_READING: u64 = u64::MAX;

/// Per-subscriber figures for the status page.
#[derive(Debug)]
pub struct ClientStats {
    pub id: u64,
    pub peer: Option<std::net::SocketAddr>,
    pub started: Instant,
    pub bytes_out: AtomicU64,
    pub skips: AtomicU64,
    /// Ring index of the subscriber's next read, for its lag.
    pub position: AtomicU64,
}

#[derive(Debug)]
pub struct Hub {
    pub key: HubKey,
    pub metrics: HubMetrics,
    pub ring: Mutex<Ring>,
    pub published: watch::Sender<Published>,
    pub subscribers: AtomicUsize,
    /// HLS segmenters among `subscribers` (not viewers), and the HLS viewers they serve.
    pub hls_segmenters: AtomicUsize,
    pub hls_viewers: AtomicUsize,
    pub clients: Mutex<HashMap<u64, Arc<ClientStats>>>,
    pub created: Instant,
    /// Bits per second over the last second, in and out.
    pub rate_in: AtomicU64,
    pub rate_out: AtomicU64,
    /// Set (under the registry lock) once the hub stops accepting subscribers.
    pub closed: AtomicBool,
    /// Poked when the last subscriber leaves so linger starts promptly.
    pub wake: Notify,
    /// The client (`registry::client_of`) that started the hub: while nobody
    /// watches it (lingering, or an RTSP session still being set up), it takes one of that
    /// client's `max_subscribers_per_client` places. `None` once another client subscribed.
    pub starter: Mutex<Option<std::net::IpAddr>>,
    /// Wall-clock seconds (Unix) of the last successful membership refresh; 0 = none yet.
    pub last_rejoin: AtomicU64,
    /// The FCC session's phase and outcome, when the hub started with `?fcc=`.
    pub fcc: Mutex<Option<FccStatus>>,
}

/// What the status page shows of a hub's fast channel change.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FccStatus {
    pub server: String,
    #[serde(rename = "type")]
    pub flavor: &'static str,
    pub phase: &'static str,
    pub outcome: &'static str,
    /// The interface FCC is bound to, when one was named.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
}

impl FccStatus {
    fn new(target: &FccTarget, phase: super::fcc::Phase, outcome: &'static str) -> FccStatus {
        FccStatus {
            server: target.server.to_string(),
            flavor: target.flavor.name(),
            phase: phase.name(),
            outcome,
            interface: target.interface.clone(),
        }
    }
}

impl Hub {
    /// Viewers counted against `max_subscribers_per_channel`: raw-TS subscribers and HLS
    /// viewers (an HLS segmenter is not a viewer).
    pub fn viewers(&self) -> usize {
        (self.subscribers.load(Ordering::Acquire) + self.hls_viewers.load(Ordering::Acquire))
            .saturating_sub(self.hls_segmenters.load(Ordering::Acquire))
    }

    /// Opens the socket and starts the receive loop. Must run inside a tokio runtime.
    ///
    /// With `fcc`, the multicast is joined only when the FCC session says so (or gives up);
    /// a group that is not IPv4 ignores it. `sent` is set once the start has put something on
    /// the network (the FCC request, or the media join), so a start that fails after that (an
    /// FEC port that cannot bind) is told apart from one that joined nothing.
    pub fn start(
        key: HubKey,
        fcc: Option<FccTarget>,
        metrics: HubMetrics,
        settings: &HubSettings,
        registry: Arc<Registry>,
        sent: &mut bool,
    ) -> std::io::Result<Arc<Hub>> {
        if key.rtsp.is_some() {
            return super::rtsp::pump::start(key, metrics, settings, registry);
        }
        let ifindex = multicast::interface_index(&key.group.interface)?;
        let mut refused = None;
        let fcc = match (fcc, key.group.group) {
            (Some(target), std::net::IpAddr::V4(g)) => {
                let group = std::net::SocketAddrV4::new(g, key.group.port);
                match super::fcc::start(
                    &target,
                    group,
                    settings.recv_buffer,
                    settings.ring_bytes,
                    settings.fcc_ports.as_deref(),
                ) {
                    Ok(started) => {
                        *sent = true;
                        Some((target, started))
                    }
                    // FCC only makes a start faster: without it the channel still plays.
                    Err(e) => {
                        tracing::warn!(%group, server = %target.server, error = %e, "FCC: plain multicast");
                        refused = Some((target, e.outcome()));
                        None
                    }
                }
            }
            _ => None,
        };
        let sock = match fcc {
            Some(_) => None,
            None => Some(Source::Waiting(open_multicast(&key.group, settings)?)),
        };
        *sent = true;
        let fec_sock = match key
            .fec_port()
            .map(|port| super::fec::open(&key.group, port, settings.recv_buffer))
            .transpose()
        {
            Ok(sock) => sock,
            Err(e) => {
                // The FCC server was asked for its burst: tell it the session is over, or it
                // sends to a closed port until its own timeout.
                let mut fcc = fcc;
                if let Some((_, (session, sock))) = fcc.as_mut() {
                    session.close(sock);
                }
                return Err(e);
            }
        };
        let hub = Hub::new(key, metrics, settings);
        if let Some((target, outcome)) = refused {
            *hub.fcc.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(FccStatus::new(&target, super::fcc::Phase::Done, outcome));
            let labels = super::metrics::FccLabels { outcome };
            hub.metrics.fcc.get_or_create(&labels).inc();
        }
        let (session, fcc_sock) = match fcc {
            Some((target, (session, sock))) => {
                *hub.fcc.lock().unwrap_or_else(|e| e.into_inner()) = Some(FccStatus::new(
                    &target,
                    super::fcc::Phase::Requested,
                    "in progress",
                ));
                (Some(session), Some(sock))
            }
            None => (None, None),
        };
        let mut pump = Pump::new(hub.clone(), settings.clone(), ifindex);
        pump.fcc = session;
        tokio::spawn(pump.run(sock, fec_sock, fcc_sock, registry));
        Ok(hub)
    }

    /// The hub's shared state, with no source attached yet.
    pub(super) fn new(key: HubKey, metrics: HubMetrics, settings: &HubSettings) -> Arc<Hub> {
        Arc::new(Hub {
            ring: Mutex::new(Ring::new(settings.ring_bytes, settings.history)),
            published: watch::Sender::new(Published::default()),
            subscribers: AtomicUsize::new(0),
            hls_segmenters: AtomicUsize::new(0),
            hls_viewers: AtomicUsize::new(0),
            clients: Mutex::new(HashMap::new()),
            created: Instant::now(),
            rate_in: AtomicU64::new(0),
            rate_out: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            wake: Notify::new(),
            starter: Mutex::new(None),
            last_rejoin: AtomicU64::new(0),
            fcc: Mutex::new(None),
            key,
            metrics,
        })
    }

    /// Marks the hub ended so readers finish what they have and stop.
    pub fn publish_closed(&self) {
        self.published.send_modify(|p| p.closed = true);
    }
}

/// Opens and joins the channel's multicast socket, ready for the runtime.
fn open_multicast(group: &Group, settings: &HubSettings) -> std::io::Result<AsyncFd<Socket>> {
    register(multicast::open(group, settings.recv_buffer)?)
}

/// Registers the socket with the runtime for readiness. Datagrams already queued are reported
/// at once (`EPOLL_CTL_ADD` checks the current state), so none wait for the next arrival.
fn register(sock: Socket) -> std::io::Result<AsyncFd<Socket>> {
    // SAFETY: `Socket` owns its descriptor, keeps it open until dropped, and always
    // returns the same one from `as_raw_fd`.
    Ok(unsafe { AsyncFd::register_with_interest(sock, Interest::READABLE) }?)
}

/// How the hub learns that its multicast socket has datagrams.
///
/// A flowing channel is `Polled`: read once per read slot, and not registered with the
/// runtime, because an edge-triggered registration wakes the runtime's thread for every
/// datagram train that arrives (with 8 channels, 8 wakeups per sender tick) even while
/// nobody waits for it. A read that finds the socket empty hands it back to `Waiting`, so a
/// quiet or lingering channel costs no timer wakeups at all.
enum Source {
    Waiting(AsyncFd<Socket>),
    Polled(Socket),
}

impl Source {
    fn socket(&self) -> &Socket {
        match self {
            Source::Waiting(fd) => fd.get_ref(),
            Source::Polled(sock) => sock,
        }
    }

    fn waiting(&self) -> Option<&AsyncFd<Socket>> {
        match self {
            Source::Waiting(fd) => Some(fd),
            Source::Polled(_) => None,
        }
    }

    /// Leaves the runtime's readiness set for slot reads.
    fn poll(self) -> Source {
        match self {
            Source::Waiting(fd) => Source::Polled(fd.into_inner()),
            polled => polled,
        }
    }

    /// Back to waiting for readiness.
    fn wait(self) -> std::io::Result<Source> {
        Ok(match self {
            Source::Polled(sock) => Source::Waiting(register(sock)?),
            waiting => waiting,
        })
    }
}

/// The receive loop's state: from payload in to published ring chunks. The multicast loop
/// (`run`) drives it from its sockets; an RTSP hub drives it from its session.
pub(super) struct Pump {
    hub: Arc<Hub>,
    settings: HubSettings,
    ifindex: u32,
    packer: Packer,
    released: Vec<BytesMut>,
    reorder: Reorder<BytesMut>,
    /// Present when the channel has a FEC stream.
    fec: Option<FecState>,
    /// Present while the hub was started with `?fcc=`.
    fcc: Option<FccSession>,
    continuity: Continuity,
    /// Bytes appended but not yet published.
    pending: usize,
    last_data: Instant,
    received_since_tick: bool,
    /// Flush ticks in a row with nothing received.
    quiet_ticks: u32,
    idle_since: Option<Instant>,
    rate_mark: (Instant, u64, u64),
    reported: ReorderStats,
    /// Each subscriber's position when the hub last saw it move (or catch up), and when.
    progress: HashMap<u64, Progress>,
}

/// What the hub last saw of one subscriber, to tell a slow reader from a stopped one.
#[derive(Debug, Clone, Copy)]
struct Progress {
    position: u64,
    since: Instant,
    /// Already counted as stalled (counted once per stall).
    released: bool,
}

/// Quiet flush ticks before a FEC channel gives up on a gap (one for other channels).
const FEC_PATIENCE_TICKS: u32 = 4;

/// How many `recvmmsg` calls one wakeup may make before yielding to other tasks.
const DRAIN_CALLS: usize = 8;

/// Datagrams taken per `recvmmsg`.
const RECV_BATCH: usize = 32;

/// Spacing of the read slots: how long, at most, a flowing channel's datagrams wait in the
/// socket before the hub reads them.
///
/// Senders pace in ticks of about a millisecond, and on a fast host a hub woken by readiness
/// woke on the first datagram of each tick's train: at 40 Mb/s two or three datagrams per
/// wakeup, each paying for `epoll_wait`, a task poll, two `recvmmsg` (the second only to hear
/// `EAGAIN`) and often a thread switch, and with 8 channels 8 times over. Reading by slots on
/// one grid, every flowing hub is woken by the same timer expiry, and each reads its whole
/// queue with one call (see `Source` for why the socket leaves the epoll set meanwhile). The
/// cost is at most a slot (plus the timer's millisecond rounding) of added delay, far below
/// what `write_batch` already adds, and that much data waiting in the socket buffer (about
/// 150 KB at 400 Mb/s, well inside `recv_buffer_bytes`).
const READ_SLOT: Duration = Duration::from_millis(2);

/// Slot reads in a row that find nothing before a hub waits for readiness again: a channel
/// of a few Mb/s has slots without a datagram, and should not pay a deregistration and a
/// registration for each.
const EMPTY_SLOTS: u32 = 4;

/// The first read slot after `now`, on a grid common to every hub of the process.
fn read_slot(now: Instant) -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(|| now);
    let slot = READ_SLOT.as_nanos();
    let since = now.saturating_duration_since(epoch).as_nanos();
    let next = (since / slot + 1) * slot;
    epoch + Duration::from_nanos(u64::try_from(next).unwrap_or(u64::MAX))
}

/// What one wakeup's reading found.
#[derive(Debug, Default, Clone, Copy)]
struct Drained {
    datagrams: usize,
    /// The socket's queue ran out (rather than the wakeup's call budget).
    emptied: bool,
}

impl Drained {
    /// Hold off reading after a wakeup that took datagrams and emptied the queue; one that
    /// used its whole budget reads again as soon as other tasks have had their turn.
    fn hold(self) -> bool {
        self.datagrams > 0 && self.emptied
    }
}

thread_local! {
    /// One receive scratch per runtime thread, shared by every hub drained on it: a hub uses
    /// it only within one synchronous `drain`, so 100 channels cost two scratches, not 100.
    static SCRATCH: std::cell::RefCell<Option<RecvBatch>> = const { std::cell::RefCell::new(None) };
}

impl Pump {
    pub(super) fn new(hub: Arc<Hub>, settings: HubSettings, ifindex: u32) -> Self {
        let now = Instant::now();
        let fec = hub.key.fec_port().map(|_| FecState::default());
        let window = if fec.is_some() {
            settings.reorder_window.max(super::fec::MIN_REORDER_WINDOW)
        } else {
            settings.reorder_window
        };
        Self {
            reorder: Reorder::new(window),
            fec,
            fcc: None,
            packer: Packer::default(),
            released: Vec::with_capacity(64),
            continuity: Continuity::default(),
            pending: 0,
            last_data: now,
            received_since_tick: false,
            quiet_ticks: 0,
            idle_since: None,
            rate_mark: (now, 0, 0),
            reported: ReorderStats::default(),
            progress: HashMap::new(),
            hub,
            settings,
            ifindex,
        }
    }

    async fn run(
        mut self,
        mut sock: Option<Source>,
        fec_sock: Option<AsyncFd<Socket>>,
        fcc_sock: Option<tokio::net::UdpSocket>,
        registry: Arc<Registry>,
    ) {
        let mut fcc_buf = vec![0u8; self.settings.max_datagram.max(2048)];
        let mut tick = tokio::time::interval(self.settings.flush_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let refresh_every = self.settings.refresh.unwrap_or(Duration::from_secs(86_400));
        let mut refresh = tokio::time::interval_at(Instant::now() + refresh_every, refresh_every);
        let channel = self.hub.key.channel();
        // Per start, and a zapping client starts one per request: the debug log's.
        tracing::debug!(%channel, interface = %self.hub.key.group.interface, "hub joined");
        let hub = self.hub.clone();
        // Set after a wakeup that emptied the socket: reading waits until then (see READ_SLOT).
        let mut hold: Option<Instant> = None;
        // Slot reads in a row that found nothing.
        let mut empty_slots = 0u32;
        let reason = loop {
            let fcc_deadline = self.fcc.as_ref().and_then(FccSession::deadline);
            tokio::select! {
                ready = readable(sock.as_ref().and_then(Source::waiting)) => match ready {
                    Ok(mut guard) => {
                        let fd = guard.get_inner().as_raw_fd();
                        let drained = self.drain(fcc_sock.as_ref(), |batch| {
                            guard.try_io(|_| batch.recv(fd)).ok()
                        });
                        if drained.hold() {
                            // Flowing: read it by slots from now on.
                            sock = sock.take().map(Source::poll);
                            hold = Some(read_slot(Instant::now()));
                        }
                    }
                    Err(e) => break format!("socket error: {e}"),
                },
                _ = sleep_until(hold), if hold.is_some() => {
                    hold = None;
                    let Some(Source::Polled(polled)) = sock.as_ref() else { continue };
                    let fd = polled.as_raw_fd();
                    let drained = self.drain(fcc_sock.as_ref(), |batch| match batch.recv(fd) {
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
                        got => Some(got),
                    });
                    empty_slots = if drained.datagrams > 0 { 0 } else { empty_slots + 1 };
                    if drained.hold() || (drained.emptied && empty_slots < EMPTY_SLOTS) {
                        hold = Some(read_slot(Instant::now()));
                    } else if drained.emptied {
                        // Nothing came for several slots: wait for readiness again.
                        empty_slots = 0;
                        match sock.take().map(Source::wait).transpose() {
                            Ok(waiting) => sock = waiting,
                            Err(e) => break format!("socket error: {e}"),
                        }
                    } else {
                        // The call budget ran out with more queued: read on after other tasks.
                        tokio::task::yield_now().await;
                        hold = Some(Instant::now());
                    }
                },
                got = recv_from(fcc_sock.as_ref(), &mut fcc_buf) => {
                    let Some(fcc_sock) = fcc_sock.as_ref() else { continue };
                    let step = match got {
                        Ok((n, from)) => self.fcc_datagram(fcc_sock, &fcc_buf[..n], from),
                        Err(e) => {
                            tracing::debug!(error = %e, "FCC receive failed");
                            Step::Nothing
                        }
                    };
                    if let Err(e) = self.fcc_step(step, &mut sock) {
                        break format!("joining after FCC failed: {e}");
                    }
                },
                _ = sleep_until(fcc_deadline) => {
                    let (Some(session), Some(fcc_sock)) = (self.fcc.as_mut(), fcc_sock.as_ref()) else {
                        continue;
                    };
                    let step = session.on_timer(fcc_sock);
                    if let Err(e) = self.fcc_step(step, &mut sock) {
                        break format!("joining after FCC failed: {e}");
                    }
                },
                ready = readable(fec_sock.as_ref()) => match ready {
                    Ok(mut guard) => {
                        let Some(fec) = self.fec.as_mut() else { continue };
                        let more = fec.drain(&mut guard, &self.hub.metrics);
                        self.received_since_tick = true;
                        if more {
                            // Budget used up with more queued: the socket stays ready, and
                            // is read again after other tasks have had their turn.
                            drop(guard);
                            tokio::task::yield_now().await;
                        }
                    }
                    Err(e) => break format!("FEC socket error: {e}"),
                },
                _ = tick.tick() => {
                    self.repair();
                    if let Some(reason) = self.on_tick(&registry) {
                        break reason;
                    }
                }
                _ = refresh.tick(), if self.settings.refresh.is_some() => {
                    self.refresh(
                        sock.as_ref().map(Source::socket),
                        fec_sock.as_ref().map(AsyncFd::get_ref),
                    );
                }
                _ = hub.wake.notified() => {
                    if let Some(reason) = self.check_idle(&registry) {
                        break reason;
                    }
                }
            }
        };
        if let (Some(session), Some(fcc_sock)) = (self.fcc.as_mut(), fcc_sock.as_ref()) {
            session.close(fcc_sock);
        }
        // The socket drops here, which leaves the group.
        registry.remove(&self.hub);
        tracing::debug!(%channel, %reason, "hub left");
    }

    /// A datagram on the FCC socket: signalling, or burst media to deliver.
    fn fcc_datagram(
        &mut self,
        fcc_sock: &tokio::net::UdpSocket,
        d: &[u8],
        from: std::net::SocketAddr,
    ) -> Step {
        let Some(session) = self.fcc.as_mut() else {
            return Step::Nothing;
        };
        let (step, deliver) = session.on_datagram(fcc_sock, d, from);
        if deliver {
            self.take_datagram(d);
            self.append_released();
        }
        step
    }

    /// Carries out what the FCC session decided: join the multicast, or switch to it.
    fn fcc_step(&mut self, step: Step, sock: &mut Option<Source>) -> std::io::Result<()> {
        match step {
            Step::Nothing => {}
            Step::Join => {
                if sock.is_none() {
                    *sock = Some(Source::Waiting(open_multicast(
                        &self.hub.key.group,
                        &self.settings,
                    )?));
                }
            }
            Step::Switch => self.release_held(),
        }
        self.show_fcc();
        Ok(())
    }

    /// Copies the FCC session's phase and outcome to the status page, and counts the
    /// outcome once the session is over.
    fn show_fcc(&self) {
        if let Some(session) = self.fcc.as_ref() {
            let mut status = self.hub.fcc.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(s) = status.as_mut() {
                let ended = session.phase() == super::fcc::Phase::Done;
                if ended && s.phase != super::fcc::Phase::Done.name() {
                    let outcome = super::metrics::FccLabels {
                        outcome: session.outcome,
                    };
                    self.hub.metrics.fcc.get_or_create(&outcome).inc();
                }
                s.phase = session.phase().name();
                s.outcome = session.outcome;
            }
        }
    }

    /// The multicast held while the burst caught up, delivered after it.
    fn release_held(&mut self) {
        let Some(session) = self.fcc.as_mut() else {
            return;
        };
        for d in session.take_held() {
            classify(
                &self.hub,
                &d,
                &mut self.packer,
                &mut self.reorder,
                self.fec.as_mut(),
                &mut self.released,
            );
        }
        self.append_released();
    }

    /// Reads what the socket holds, up to `DRAIN_CALLS` batches, with `recv` (which answers
    /// `None` for `EAGAIN`). A batch that comes back short means the queue is (all but)
    /// empty, so no further call is made just to hear `EAGAIN`.
    fn drain(
        &mut self,
        fcc_sock: Option<&tokio::net::UdpSocket>,
        mut recv: impl FnMut(&mut RecvBatch) -> Option<std::io::Result<u64>>,
    ) -> Drained {
        let mut drained = Drained::default();
        SCRATCH.with_borrow_mut(|scratch| {
            let max = self.settings.max_datagram;
            let batch = match scratch {
                Some(b) if b.slot() == max.clamp(64, crate::net::recv::MAX_SLOT) => b,
                _ => scratch.insert(RecvBatch::new(max, RECV_BATCH)),
            };
            for _ in 0..DRAIN_CALLS {
                match recv(batch) {
                    Some(Ok(truncated)) => {
                        self.hub.metrics.malformed.inc_by(truncated);
                        let got = batch.received();
                        drained.datagrams += got;
                        self.take_batch(batch, fcc_sock);
                        if got < RECV_BATCH {
                            drained.emptied = true;
                            break;
                        }
                    }
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "multicast receive failed");
                        drained.emptied = true;
                        break;
                    }
                    None => {
                        drained.emptied = true;
                        break;
                    }
                }
            }
        });
        if drained.datagrams > 0 {
            self.append_released();
        }
        drained
    }

    /// Strips, packs and reorders the datagrams of one `recvmmsg` (or holds them while an FCC
    /// burst catches up with the multicast).
    fn take_batch(&mut self, batch: &RecvBatch, fcc_sock: Option<&tokio::net::UdpSocket>) {
        self.last_data = Instant::now();
        self.received_since_tick = true;
        let (mut count, mut bytes) = (0u64, 0u64);
        for d in batch.datagrams() {
            count += 1;
            bytes += d.len() as u64;
            if let (Some(session), Some(fcc_sock)) = (self.fcc.as_mut(), fcc_sock) {
                match session.on_multicast(fcc_sock, d) {
                    Multicast::Deliver => {}
                    Multicast::Held | Multicast::Duplicate => continue,
                    Multicast::Switched => {
                        self.release_held();
                        self.show_fcc();
                        continue;
                    }
                }
            }
            classify(
                &self.hub,
                d,
                &mut self.packer,
                &mut self.reorder,
                self.fec.as_mut(),
                &mut self.released,
            );
        }
        let m = &self.hub.metrics;
        m.received_datagrams.inc_by(count);
        m.received_bytes.inc_by(bytes);
    }

    /// Takes one datagram (RTP or bare TS) that arrived by other means than `recvmmsg`; call
    /// `append_released` after a batch of them.
    ///
    /// One larger than `max_datagram_bytes` is malformed and dropped: an RTSP server's
    /// interleaved frame can be 64 KiB, and the reorder window would hold each in a block of
    /// its own, `reorder_window` of them per session.
    pub(super) fn take_datagram(&mut self, d: &[u8]) {
        if d.len() > self.settings.max_datagram {
            self.hub.metrics.malformed.inc();
            return;
        }
        self.last_data = Instant::now();
        self.received_since_tick = true;
        classify(
            &self.hub,
            d,
            &mut self.packer,
            &mut self.reorder,
            self.fec.as_mut(),
            &mut self.released,
        );
        let m = &self.hub.metrics;
        m.received_datagrams.inc();
        m.received_bytes.inc_by(d.len() as u64);
    }

    /// Publishes everything received, gaps the reorder window still holds included: the
    /// source has ended and readers should get all of it before the hub closes.
    pub(super) fn finish(&mut self) {
        self.reorder.flush(&mut self.released);
        self.append_released();
        if self.pending > 0 {
            self.publish();
        }
    }

    /// Feeds packets rebuilt from FEC into the reorder window, where their gaps are waiting.
    fn repair(&mut self) {
        let Some(fec) = self.fec.as_mut() else {
            return;
        };
        for p in fec.repair(&self.hub.metrics) {
            let payload = self.packer.pack_if(&self.reorder, p.sequence, &p.payload);
            self.reorder.push(p.sequence, payload, &mut self.released);
        }
        self.append_released();
    }

    /// Appends what the reorder window released, joined into as few chunks as `Joiner` can,
    /// under one ring lock.
    pub(super) fn append_released(&mut self) {
        if self.released.is_empty() {
            return;
        }
        let mut errors = 0;
        {
            let mut ring = self.hub.ring.lock().unwrap_or_else(|e| e.into_inner());
            let mut joiner = Joiner::default();
            for piece in self.released.drain(..) {
                if piece.is_empty() {
                    continue;
                }
                errors += self.continuity.check(&piece);
                self.pending += piece.len();
                if let Some(done) = joiner.add(piece) {
                    ring.push(done.freeze());
                }
            }
            if let Some(done) = joiner.finish() {
                ring.push(done.freeze());
            }
        }
        self.hub.metrics.ts_cc_errors.inc_by(errors);
        self.sync_reorder_stats();
        if self.pending >= self.settings.write_batch {
            self.publish();
        }
    }

    /// Moves the reorder window's counters into the metrics (it counts; metrics only add).
    fn sync_reorder_stats(&mut self) {
        let (s, was) = (self.reorder.stats(), self.reported);
        let m = &self.hub.metrics;
        m.rtp_lost.inc_by(s.lost - was.lost);
        m.rtp_reordered.inc_by(s.reordered - was.reordered);
        m.rtp_duplicates.inc_by(s.duplicates - was.duplicates);
        self.reported = s;
    }

    /// Makes everything appended so far readable, and lets go of history no one needs.
    fn publish(&mut self) {
        let floor = self.slowest_reader();
        let end = {
            let mut ring = self.hub.ring.lock().unwrap_or_else(|e| e.into_inner());
            ring.release(floor);
            ring.end()
        };
        self.hub.published.send_modify(|p| p.end = end);
        self.pending = 0;
    }

    /// The lowest next-read index among subscribers that are reading (`u64::MAX` with none).
    ///
    /// This is where the slow-subscriber policy is enforced by the hub rather than by the
    /// client's body: a subscriber whose position has not moved for `stall_timeout` although
    /// published data waits for it has stopped reading (its connection is not being polled),
    /// so it no longer holds history. Its position is evicted like any other, and if it ever
    /// reads again it finds itself lapped and is skipped ahead or disconnected. A subscriber
    /// that has not started reading holds nothing: its start point is in the kept history.
    fn slowest_reader(&mut self) -> u64 {
        let now = Instant::now();
        let published = self.hub.published.borrow().end;
        let clients = self.hub.clients.lock().unwrap_or_else(|e| e.into_inner());
        self.progress.retain(|id, _| clients.contains_key(id));
        let mut floor = u64::MAX;
        for (id, client) in clients.iter() {
            let position = client.position.load(Ordering::Acquire);
            if position == NOT_READING {
                continue;
            }
            let seen = self.progress.entry(*id).or_insert(Progress {
                position,
                since: now,
                released: false,
            });
            if seen.position != position || position >= published {
                *seen = Progress {
                    position,
                    since: now,
                    released: false,
                };
            }
            if now.duration_since(seen.since) >= self.settings.stall_timeout {
                if !seen.released {
                    seen.released = true;
                    self.hub.metrics.slow_released.inc();
                    tracing::debug!(
                        channel = %self.hub.key.channel(),
                        subscriber = id,
                        "subscriber stopped reading: no longer holding history for it"
                    );
                }
                continue;
            }
            floor = floor.min(position);
        }
        floor
    }

    /// Flush timer: publish small remainders, give up on stuck gaps, enforce timeouts.
    pub(super) fn on_tick(&mut self, registry: &Registry) -> Option<String> {
        let fec_waiting = self.fec.as_ref().is_some_and(FecState::waiting);
        self.quiet_ticks = if self.received_since_tick {
            0
        } else {
            self.quiet_ticks.saturating_add(1)
        };
        // A FEC channel waits a few ticks more: a sender pausing mid-block would otherwise
        // make the gap be given up just before the block's parity arrives to fill it.
        let patience = if self.fec.is_some() {
            FEC_PATIENCE_TICKS
        } else {
            1
        };
        if self.quiet_ticks >= patience && !fec_waiting && self.reorder.held() > 0 {
            // Nothing arrived for long enough (neither media nor FEC that could still
            // repair it): the gap will not fill in time to matter.
            self.reorder.flush(&mut self.released);
            self.append_released();
        }
        self.received_since_tick = false;
        if self.pending > 0 {
            self.publish();
        }
        self.update_rates();
        let subscribers = self.hub.subscribers.load(Ordering::Acquire);
        if subscribers > 0 && self.last_data.elapsed() >= self.settings.no_data_timeout {
            registry.remove(&self.hub);
            return Some(format!("no data for {:?}", self.settings.no_data_timeout));
        }
        self.check_idle(registry)
    }

    /// Linger: leave only after the hub has had no subscriber for the whole linger time.
    pub(super) fn check_idle(&mut self, registry: &Registry) -> Option<String> {
        if self.hub.closed.load(Ordering::Acquire) {
            // Released early: its starter needed the place for another channel.
            return Some("released for its client's next channel".into());
        }
        if self.hub.subscribers.load(Ordering::Acquire) > 0 {
            self.idle_since = None;
            return None;
        }
        let since = *self.idle_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= self.settings.linger && registry.remove_if_idle(&self.hub) {
            return Some("linger expired".into());
        }
        None
    }

    /// Leaves and joins again on the media socket and the FEC socket together: the kernel keeps
    /// one membership per group and interface for all its sockets, so a leave and join on one
    /// while the other holds the group changes nothing and sends no report.
    fn refresh(&mut self, media: Option<&Socket>, fec: Option<&Socket>) {
        let channel = self.hub.key.channel();
        let group = &self.hub.key.group;
        let fec_group = self.hub.key.fec_port().map(|port| Group {
            port,
            ..group.clone()
        });
        let members: Vec<(&Socket, &Group)> = media
            .map(|s| (s, group))
            .into_iter()
            .chain(fec.zip(fec_group.as_ref()))
            .collect();
        if members.is_empty() {
            return;
        }
        match multicast::refresh(&members, &mut self.ifindex) {
            Ok(()) => {
                self.hub.metrics.refreshes.inc();
                self.hub.last_rejoin.store(unix_now(), Ordering::Relaxed);
                tracing::info!(%channel, ifindex = self.ifindex, "multicast membership refreshed");
            }
            Err(e) => {
                self.hub.metrics.refresh_failures.inc();
                tracing::warn!(%channel, error = %e, "multicast membership refresh failed");
            }
        }
    }

    fn update_rates(&mut self) {
        let (at, bytes_in, bytes_out) = self.rate_mark;
        let elapsed = at.elapsed();
        if elapsed < Duration::from_secs(1) {
            return;
        }
        let m = &self.hub.metrics;
        let (now_in, now_out) = (m.received_bytes.get(), m.sent_bytes.get());
        let bps = |delta: u64| (delta as f64 * 8.0 / elapsed.as_secs_f64()) as u64;
        self.hub
            .rate_in
            .store(bps(now_in - bytes_in), Ordering::Relaxed);
        self.hub
            .rate_out
            .store(bps(now_out - bytes_out), Ordering::Relaxed);
        self.rate_mark = (Instant::now(), now_in, now_out);
    }
}

/// Bare TS passes as is; RTP is parsed once, its payload packed and reordered.
fn classify(
    hub: &Hub,
    d: &[u8],
    packer: &mut Packer,
    reorder: &mut Reorder<BytesMut>,
    fec: Option<&mut FecState>,
    released: &mut Vec<BytesMut>,
) {
    if d.first() == Some(&mpegts::SYNC_BYTE) {
        released.push(packer.pack(d));
        return;
    }
    match rtp::parse_rtp(d) {
        Ok(p) => {
            let payload = &d[p.payload.clone()];
            if super::fec::is_rs_fec(&p.header, payload) {
                // Reed-Solomon FEC sent on the media port: never media.
                if let Some(fec) = fec {
                    fec.datagram(d, &hub.metrics);
                }
                return;
            }
            if let Some(fec) = fec {
                fec.media(&p.header, payload, d);
            }
            let payload = packer.pack_if(reorder, p.header.sequence, &d[p.payload]);
            reorder.push(p.header.sequence, payload, released);
        }
        Err(_) if hub.key.mode == Mode::Udp => released.push(packer.pack(d)),
        Err(_) => {
            hub.metrics.malformed.inc();
        }
    }
}

/// Size of the blocks payloads are packed into.
const BLOCK_BYTES: usize = 32 * 1024;

/// Payloads shorter than this that do not follow the current chunk in memory are copied onto
/// it. Real ones (1,316 bytes of RTP, whole TS datagrams) are far larger, and in order they
/// are joined without a copy anyway.
const SMALL_PIECE: usize = 512;

/// Joins released payloads, in order, into ring chunks: one that sits right after the run in
/// memory (packed after it, released after it) joins without a copy; a small one that does not
/// is copied onto the run; anything else starts a new chunk.
///
/// Without the copy, a sender of 1-byte payloads in swapped pairs (2, 1, 4, 3, ...: packed in
/// that order, released as 1, 2, 3, 4, so none follows the one before it in memory) made
/// every payload a chunk of its own: a million handles for a megabyte of history. The ring's
/// `CHUNK_OVERHEAD` bounds that anyway; this keeps such a channel's history its size in bytes.
///
/// A run grows to at most `BLOCK_BYTES` (or one payload, when that is larger): one chunk of
/// megabytes (the FCC burst's thousands of held datagrams released at once) would make the
/// ring drop its whole history to take it. A copied run gives back what it grew by beyond its
/// bytes before it is handed on, since the ring charges a chunk its length, not its capacity.
#[derive(Debug, Default)]
struct Joiner {
    run: Option<BytesMut>,
    /// `run` is a copy of its own (not a view into a packer block), so it can grow in place.
    owned: bool,
}

impl Joiner {
    /// Takes the next piece; returns a finished chunk when the piece starts a new one.
    fn add(&mut self, piece: BytesMut) -> Option<BytesMut> {
        let fits = |run: &BytesMut| run.len() + piece.len() <= BLOCK_BYTES;
        match self.run.as_mut() {
            Some(run)
                if !self.owned
                    && fits(run)
                    && run.as_ptr().wrapping_add(run.len()) == piece.as_ptr() =>
            {
                run.unsplit(piece);
                None
            }
            Some(run) if piece.len() < SMALL_PIECE && fits(run) => {
                if !self.owned {
                    // Growing a view into a shared block would allocate a whole block's worth
                    // (`BytesMut` keeps the original capacity): copy instead.
                    let mut copy = BytesMut::with_capacity(run.len() + piece.len());
                    copy.extend_from_slice(run);
                    *run = copy;
                    self.owned = true;
                }
                run.extend_from_slice(&piece);
                None
            }
            _ => {
                let done = self.take();
                self.run = Some(piece);
                done
            }
        }
    }

    /// The run so far, its spare capacity given back when it is a copy (growing it in place
    /// doubled its capacity at times), and copied out of its block when it is a view smaller
    /// than `SMALL_PIECE`.
    ///
    /// A view keeps its whole 32 KiB block alive while the ring charges it only its length.
    /// That is fair when the rest of the block is other chunks (all the packer packs is kept,
    /// see `Packer::pack_if`), and this is a second guard in case it is not: a lone tiny
    /// payload is the shape an attack on it needs. The threshold stays below real payloads
    /// (1,316 bytes) on purpose: a low-bitrate channel's chunk is often one of them, a tenth
    /// of a block, and copying those would copy every byte such channels carry. Charging the
    /// ring a block per view is no better: it cannot tell a shared block from a wasted one, and
    /// would cut those channels' history twentyfold.
    fn take(&mut self) -> Option<BytesMut> {
        let run = self.run.take()?;
        let owned = std::mem::take(&mut self.owned);
        if (owned && run.capacity() > run.len()) || (!owned && run.len() < SMALL_PIECE) {
            return Some(BytesMut::from(&run[..]));
        }
        Some(run)
    }

    /// The last chunk, if any.
    fn finish(mut self) -> Option<BytesMut> {
        self.take()
    }
}

/// Copies payloads back to back into shared blocks; each comes out as its own `BytesMut`, and
/// consecutive ones can be joined again without a copy (`BytesMut::unsplit`).
#[derive(Debug, Default)]
struct Packer {
    block: BytesMut,
}

impl Packer {
    /// Packs an RTP payload only if the reorder window will keep it: a duplicate or late one
    /// comes out empty (no copy, nothing allocated), to be pushed and counted as dropped.
    ///
    /// Packing it anyway left its bytes in the block after the window dropped it, and the
    /// block lives as long as any payload kept from it: a sender of 1-byte payloads each
    /// followed by a block's worth of duplicates made every 1-byte ring chunk (charged
    /// `CHUNK_OVERHEAD` and a byte) hold 32 KiB, 2 GiB per channel instead of 4 MiB.
    fn pack_if(&mut self, reorder: &Reorder<BytesMut>, seq: u16, payload: &[u8]) -> BytesMut {
        if reorder.accepts(seq) {
            self.pack(payload)
        } else {
            BytesMut::new()
        }
    }

    fn pack(&mut self, payload: &[u8]) -> BytesMut {
        if self.block.capacity() - self.block.len() < payload.len() {
            self.block = BytesMut::with_capacity(BLOCK_BYTES.max(payload.len()));
        }
        self.block.extend_from_slice(payload);
        self.block.split()
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A datagram on an optional UDP socket; never ready when there is none.
async fn recv_from(
    sock: Option<&tokio::net::UdpSocket>,
    buf: &mut [u8],
) -> std::io::Result<(usize, std::net::SocketAddr)> {
    match sock {
        Some(s) => s.recv_from(buf).await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `deadline`; forever without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Readiness of an optional socket; never ready when there is none.
async fn readable(
    sock: Option<&AsyncFd<Socket>>,
) -> std::io::Result<tokio::io::unix::AsyncFdReadyGuard<'_, Socket>> {
    match sock {
        Some(s) => s.readable().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_slots_are_one_grid_for_every_hub() {
        let base = Instant::now();
        let first = read_slot(base);
        // Wherever hubs stand inside a slot, they are given the same next slot...
        for offset_us in [0u64, 1, 700, 1_999] {
            let now = first - READ_SLOT + Duration::from_micros(offset_us);
            assert_eq!(read_slot(now), first, "offset {offset_us} µs");
        }
        // ...always strictly later and at most one slot away.
        for offset_us in [0u64, 1, 1_000, 1_999, 2_000, 2_001, 123_457] {
            let now = first + Duration::from_micros(offset_us);
            let next = read_slot(now);
            assert!(
                next > now && next - now <= READ_SLOT,
                "offset {offset_us} µs"
            );
            assert_eq!(read_slot(next - Duration::from_nanos(1)), next);
        }
    }

    #[test]
    fn only_a_wakeup_that_emptied_the_socket_holds() {
        let hold = |datagrams, emptied| Drained { datagrams, emptied }.hold();
        assert!(hold(3, true));
        assert!(
            !hold(0, true),
            "nothing read: wait for readiness, not a slot"
        );
        assert!(!hold(256, false), "budget used up: read again at once");
    }

    /// Packs `payloads` (sequence, bytes) as the hub does, through a reorder window, and joins
    /// what comes out as `append_released` does; returns the chunks.
    fn joined(payloads: &[(u16, Vec<u8>)]) -> Vec<BytesMut> {
        let mut packer = Packer::default();
        let mut reorder = Reorder::new(64);
        let mut released = Vec::new();
        for (seq, payload) in payloads {
            reorder.push(*seq, packer.pack(payload), &mut released);
        }
        reorder.flush(&mut released);
        let mut joiner = Joiner::default();
        let mut chunks: Vec<BytesMut> =
            released.into_iter().filter_map(|p| joiner.add(p)).collect();
        chunks.extend(joiner.finish());
        chunks
    }

    /// Attack: 1-byte RTP payloads in swapped pairs, so no released payload follows the one
    /// before it in memory. They are copied into one chunk, in order, not one chunk each.
    #[test]
    fn small_pieces_out_of_order_join_one_chunk() {
        let mut payloads = vec![(0u16, vec![0u8])];
        for pair in (1..2001u16).collect::<Vec<_>>().chunks(2) {
            for &seq in pair.iter().rev() {
                payloads.push((seq, vec![seq as u8]));
            }
        }
        let chunks = joined(&payloads);
        assert_eq!(chunks.len(), 1, "{} chunks", chunks.len());
        let want: Vec<u8> = (0..2001u16).map(|s| s as u8).collect();
        assert_eq!(&chunks[0][..], &want[..]);
        assert!(
            chunks[0].capacity() < 2 * want.len(),
            "no block-sized copies"
        );
    }

    /// Attack: small payloads out of order, hundreds of kilobytes of them released at once
    /// (as an FCC burst's held datagrams are). They are copied into chunks of at most
    /// `BLOCK_BYTES`, each holding no more memory than its bytes (the ring charges a chunk its
    /// length): not one chunk of all of them, its capacity grown by doubling.
    #[test]
    fn copied_runs_are_capped_and_hold_only_their_bytes() {
        for (size, count) in [(1usize, 2100u16), (100, 3001)] {
            let mut payloads = vec![(0u16, vec![0u8; size])];
            for pair in (1..count).collect::<Vec<_>>().chunks(2) {
                for &seq in pair.iter().rev() {
                    payloads.push((seq, vec![seq as u8; size]));
                }
            }
            let chunks = joined(&payloads);
            let all: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
            let want: Vec<u8> = (0..count).flat_map(|s| vec![s as u8; size]).collect();
            assert_eq!(all, want, "{size}-byte payloads");
            for c in &chunks {
                assert!(c.len() <= BLOCK_BYTES, "a chunk of {} bytes", c.len());
                assert!(
                    c.capacity() <= c.len() + 64,
                    "{} bytes held for {}",
                    c.capacity(),
                    c.len()
                );
            }
            // Still joined: about one chunk per block's worth.
            let most = want.len().div_ceil(BLOCK_BYTES - SMALL_PIECE);
            assert!(chunks.len() <= most, "{} chunks", chunks.len());
        }
    }

    /// `accepts` says beforehand exactly what `push` keeps (held or released) and what it
    /// drops, through duplicates, late packets, a jump past the window and sender restarts.
    #[test]
    fn accepts_agrees_with_push() {
        let mut seqs: Vec<u16> = vec![10, 10, 12, 11, 12, 9, 30, 15, 15, 31, 40, 39, 38];
        seqs.extend([5000, 5001, 4999, 5003, 5003]);
        // A sender restarting a little behind: late at first, then followed.
        seqs.extend((4900..4940).flat_map(|s| [s, s]));
        seqs.extend([65534, 65535, 0, 65535, 1]);
        let mut r = Reorder::new(8);
        let mut out = Vec::new();
        for seq in seqs {
            let accepted = r.accepts(seq);
            let before = r.held() as u64 + r.stats().delivered;
            r.push(seq, seq, &mut out);
            let kept = r.held() as u64 + r.stats().delivered - before;
            assert_eq!(kept, u64::from(accepted), "sequence {seq}");
        }
    }

    /// A hub with no socket, fed the way `fcc_datagram` and RTSP feed it.
    fn pump(ring_bytes: usize, history: usize) -> Pump {
        let settings = HubSettings {
            ring_bytes,
            history,
            write_batch: 64 * 1024,
            flush_interval: Duration::from_millis(50),
            linger: Duration::from_secs(1),
            stall_timeout: Duration::from_secs(1),
            no_data_timeout: Duration::from_secs(1),
            refresh: None,
            reorder_window: 64,
            recv_buffer: 1 << 20,
            max_datagram: 2048,
            rtsp: None,
            fcc_ports: None,
        };
        let key = HubKey {
            mode: Mode::Rtp,
            group: Group {
                group: std::net::Ipv4Addr::new(239, 1, 1, 1).into(),
                port: 5000,
                source: None,
                interface: "lo".into(),
            },
            extras: None,
            rtsp: None,
        };
        let labels = crate::iptv::metrics::HubLabels {
            channel: key.channel(),
            interface: "lo".into(),
        };
        let metrics = crate::iptv::metrics::Metrics::default().hub(labels);
        let hub = Hub::new(key, metrics, &settings);
        Pump::new(hub, settings, 0)
    }

    /// An RTP datagram (MP2T payload type) carrying `payload`.
    fn rtp_datagram(seq: u16, payload: &[u8]) -> Vec<u8> {
        let mut d = vec![0x80, 33];
        d.extend(seq.to_be_bytes());
        d.extend([0; 8]);
        d.extend(payload);
        d
    }

    /// Attack (an `?fcc=` server of the client's own, or any sender on the group): a 1-byte
    /// payload, then 22 duplicates of it of 1,400 bytes (a block's worth), then the next
    /// sequence number, and so on; each datagram appended on its own, as `fcc_datagram` does.
    /// The memory the ring's chunks pin (every packer block one of them is a view into, whole,
    /// plus the bytes of those that are copies) stays within the ring's bound: it was a 32 KiB
    /// block per kept byte, for `ring_bytes` of 65-byte charges.
    #[test]
    fn dropped_duplicates_do_not_pin_blocks_behind_kept_chunks() {
        let ring_bytes = 64 * 1024;
        let mut pump = pump(ring_bytes, 16 * 1024);
        // Each block the packer has used, by its end address, kept alive by an empty handle so
        // that no later allocation can take its address while the test looks chunks up.
        let mut blocks = std::collections::BTreeMap::new();
        let rounds = 1500u16;
        for seq in 0..rounds {
            let mut send = |payload: &[u8]| {
                pump.take_datagram(&rtp_datagram(seq, payload));
                pump.append_released();
                let block = &mut pump.packer.block;
                let end = block.as_ptr() as usize + block.capacity();
                blocks.entry(end).or_insert_with(|| block.split_to(0));
            };
            send(&[seq as u8]);
            for _ in 0..22 {
                send(&[0xee; 1400]);
            }
        }
        // Still pushed, so still counted.
        assert_eq!(pump.reorder.stats().duplicates, 22 * u64::from(rounds));

        let ring = pump.hub.ring.lock().unwrap();
        let mut chunks = std::collections::VecDeque::new();
        let mut at = super::super::ring::Position {
            index: ring.base(),
            offset: 0,
        };
        ring.read(&mut at, ring.end(), usize::MAX, &mut chunks);
        let mut pinned_blocks = std::collections::HashSet::new();
        let mut copied = 0;
        for chunk in &chunks {
            let at = chunk.as_ptr() as usize;
            match blocks.range(at + 1..).next() {
                Some((&end, _)) if end - BLOCK_BYTES <= at => {
                    pinned_blocks.insert(end);
                }
                _ => copied += chunk.len(),
            }
        }
        let pinned = pinned_blocks.len() * BLOCK_BYTES + copied;
        // The kept bytes, in order, and nothing of the duplicates.
        let held: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        assert!(held.len() > 500, "{} bytes held", held.len());
        let first = rounds - held.len() as u16;
        let want: Vec<u8> = (first..rounds).map(|s| s as u8).collect();
        assert_eq!(held, want);
        // Two blocks of slack: the newest is still being filled, the oldest partly evicted.
        assert!(
            pinned <= ring_bytes + 2 * BLOCK_BYTES,
            "{} chunks pin {pinned} bytes ({} blocks) for a {ring_bytes}-byte ring",
            chunks.len(),
            pinned_blocks.len()
        );
    }

    /// Duplicates are not copied at all: the whole attack above fits in one block.
    #[test]
    fn dropped_duplicates_are_not_packed() {
        let mut pump = pump(64 * 1024, 16 * 1024);
        let mut ends = std::collections::HashSet::new();
        for seq in 0..100u16 {
            for payload in std::iter::once(vec![seq as u8]).chain(vec![vec![0xee; 1400]; 22]) {
                pump.take_datagram(&rtp_datagram(seq, &payload));
                let block = &pump.packer.block;
                ends.insert(block.as_ptr() as usize + block.capacity());
            }
        }
        pump.append_released();
        assert_eq!(ends.len(), 1, "{} blocks used for 100 bytes", ends.len());
    }

    /// Second guard: a lone payload smaller than `SMALL_PIECE` leaves the joiner as a copy of
    /// its own, not a view that keeps its packer block alive; a full-size one stays a view.
    #[test]
    fn a_lone_small_view_is_copied_out_of_its_block() {
        let mut packer = Packer::default();
        for (len, copied) in [(1usize, true), (SMALL_PIECE - 1, true), (1316, false)] {
            let piece = packer.pack(&vec![7u8; len]);
            let at = piece.as_ptr();
            let mut joiner = Joiner::default();
            assert!(joiner.add(piece).is_none());
            let chunk = joiner.finish().unwrap();
            assert_eq!(&chunk[..], &vec![7u8; len][..]);
            assert_eq!(chunk.as_ptr() != at, copied, "{len}-byte payload");
            assert_eq!(chunk.capacity(), len, "{len}-byte payload");
        }
    }

    /// Real payloads: in order they join into one chunk; out of order, each starts a chunk as
    /// before (they are never copied).
    #[test]
    fn full_payloads_are_joined_only_when_side_by_side() {
        let payload = |seq: u16| vec![seq as u8; 1316];
        let in_order: Vec<_> = (0..20u16).map(|s| (s, payload(s))).collect();
        let chunks = joined(&in_order);
        assert_eq!(chunks.len(), 1);
        assert_eq!(
            &chunks[0][..],
            &in_order
                .iter()
                .flat_map(|p| p.1.clone())
                .collect::<Vec<_>>()[..]
        );
        let swapped = [
            (0u16, payload(0)),
            (2, payload(2)),
            (1, payload(1)),
            (3, payload(3)),
        ];
        let chunks = joined(&swapped);
        let lens: Vec<usize> = chunks.iter().map(|c| c.len()).collect();
        // Packed 0, 2, 1, 3 and released 0, 1, 2, 3: none follows its predecessor in memory.
        assert_eq!(lens, [1316; 4]);
        let all: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        assert_eq!(all, (0..4u16).flat_map(payload).collect::<Vec<_>>());
    }
}
