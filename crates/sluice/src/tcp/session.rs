//! One downstream connection: PROXY header in (trusted peers only), SNI peek or TLS termination,
//! pick a group and connect to the first server that answers, PROXY header out, then relay until
//! both sides are done or a timeout or shutdown ends it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_http::{client_hello, proxy_protocol};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::server::TlsStream;

use super::config::ProxyVersion;
use super::metrics::{EndLabels, RefusedLabels, ServerLabels};
use super::share::Place;
use super::{Settings, Shared};
use crate::net::splice::{self, Direction, RelayError, Side};
use crate::upstream::group::health::is_local_exhaustion;
use crate::upstream::group::{Balance, Group, Groups, InFlight, Plan};
use crate::upstream::happy;

/// Most bytes buffered while waiting for a complete ClientHello (a 16 KiB hello in up to
/// `client_hello::MAX_RECORDS` records, with room to spare).
const MAX_HELLO_BUFFER: usize = 128 * 1024;

/// Why a connection was closed before relaying; the label of `tcp_connections_refused`.
type Refusal = &'static str;

enum Downstream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Downstream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Downstream::Plain(s) => s,
            Downstream::Tls(t) => t.get_ref().0,
        }
    }
}

/// What the handshake phase learned.
struct Accepted {
    down: Downstream,
    /// The client as the PROXY header (if trusted) or the socket says.
    client: SocketAddr,
    /// The address the client connected to.
    destination: SocketAddr,
    group: String,
    /// Bytes read while peeking (the ClientHello) that the upstream must receive first.
    prefix: Vec<u8>,
    /// The client's place in `max_connections_per_ip`, given back when the connection ends.
    _place: Place,
}

/// Serves one accepted connection to its end: its handshake under the listener's settings of
/// when it starts, its upstream from the groups of `settings` once the handshake is done.
pub(super) async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    settings: watch::Receiver<Arc<Settings>>,
    shared: Arc<Shared>,
) {
    // A connection keeps the settings it met (timeouts, TLS, PROXY, routes, its per-IP place)...
    let s = Arc::clone(&settings.borrow());
    let m = &shared.metrics;
    let labels = m.listener(&s.name);
    m.accepted.get_or_create(&labels).inc();
    let open = m.open.get_or_create(&labels).clone();
    open.inc();
    let started = Instant::now();
    let handshake = Duration::from_secs(s.config.handshake_timeout_secs);
    // Raced against a forced shutdown like the connect and the relay: unraced, clients trickling
    // their PROXY header, ClientHello or TLS handshake held `TcpProxy::shutdown` for up to
    // `handshake_timeout_secs` past its grace period.
    let mut force = shared.force.clone();
    // The client as the logs name it: the PROXY header's source once one is read (the address
    // the per-IP share counts), else the peer. Logged under the peer alone, a `per_ip` refusal
    // behind a load balancer named the balancer, not the client refused.
    let mut client = peer;
    // `None`: the shutdown came first.
    let accepted = tokio::select! {
        r = tokio::time::timeout(handshake, accept(stream, peer, &s, &mut client)) => Some(match r {
            Ok(Ok(a)) => Ok(a),
            Ok(Err(reason)) => Err(reason),
            Err(_) => Err("handshake_timeout"),
        }),
        Ok(_) = force.wait_for(|stop| *stop) => None,
    };
    let how = match accepted {
        Some(Ok(a)) => {
            // ...but its group is taken from the groups of now: a reload during the handshake
            // (up to `handshake_timeout_secs`) may have removed a server, or the group. Before,
            // the connection went to a server the reload had removed, counted on the old
            // generation's servers.
            let groups = Arc::clone(&settings.borrow().groups);
            relay(a, &s, &groups, &shared, started).await
        }
        None => {
            m.ended
                .get_or_create(&EndLabels {
                    listener: s.name.clone(),
                    how: "shutdown",
                })
                .inc();
            "shutdown"
        }
        Some(Err(reason)) => {
            tracing::debug!(listener = %s.name, %client, %peer, reason, "tcp connection refused");
            m.refused
                .get_or_create(&RefusedLabels {
                    listener: s.name.clone(),
                    reason,
                })
                .inc();
            reason
        }
    };
    m.duration
        .get_or_create(&labels)
        .observe(started.elapsed().as_secs_f64());
    open.dec();
    tracing::debug!(listener = %s.name, %client, %peer, how, "tcp connection ended");
}

/// PROXY header, then TLS or SNI, then the group. `client` is set to the PROXY header's source as
/// soon as it is read, so a refusal after it is logged under the client refused.
async fn accept(
    stream: TcpStream,
    peer: SocketAddr,
    s: &Settings,
    client: &mut SocketAddr,
) -> Result<Accepted, Refusal> {
    let mut down = stream;
    *client = peer;
    let mut destination = down.local_addr().map_err(|_| "socket_error")?;
    if s.config.accept_proxy {
        let trusted = s
            .config
            .trusted_proxies
            .iter()
            .any(|net| net.contains(&peer.ip().to_canonical()));
        if !trusted {
            return Err("untrusted_proxy");
        }
        if let proxy_protocol::Addresses::Tcp {
            source,
            destination: d,
        } = read_proxy_header(&mut down).await?
        {
            *client = source;
            destination = d;
        }
    }
    // The place is held by the TCP peer that connected, unless that peer is a trusted proxy
    // whose PROXY header named the client: then by the header's source address, since every
    // client behind a load balancer arrives from its one address. (An untrusted peer never gets
    // here; a header with no address, LOCAL or UNIX, leaves the peer's.)
    let place = s.per_ip.take(client.ip()).ok_or("per_ip")?;
    let mut prefix = Vec::new();
    let (down, server_name) = match &s.tls {
        Some(acceptor) => {
            let tls = acceptor.accept(down).await.map_err(|_| "tls_handshake")?;
            let name = tls.get_ref().1.server_name().map(str::to_ascii_lowercase);
            (Downstream::Tls(Box::new(tls)), name)
        }
        None if !s.config.sni.is_empty() => {
            let name = read_client_hello(&mut down, &mut prefix).await?;
            (Downstream::Plain(down), name)
        }
        None => (Downstream::Plain(down), None),
    };
    let group = s
        .config
        .group_for(server_name.as_deref())
        .ok_or("no_route")?
        .to_string();
    Ok(Accepted {
        down,
        client: *client,
        destination,
        group,
        prefix,
        _place: place,
    })
}

/// Where a PROXY header is read from: the accepted socket (a seam so tests can count reads).
trait HeaderSource {
    /// Copies the bytes waiting into `buf` without consuming them (waits for at least one).
    async fn peek_some(&mut self, buf: &mut [u8]) -> std::io::Result<usize>;
    /// Consumes exactly `buf.len()` bytes into `buf`.
    async fn consume(&mut self, buf: &mut [u8]) -> std::io::Result<()>;
}

impl HeaderSource for TcpStream {
    async fn peek_some(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        TcpStream::peek(self, buf).await
    }

    async fn consume(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        AsyncReadExt::read_exact(self, buf).await.map(drop)
    }
}

/// Reads exactly one PROXY header (v1 or v2), never a byte of the payload after it.
///
/// A load balancer sends its header in one segment, often with the payload behind it: one peek of
/// up to `V1_MAX_LEN` bytes finds the whole header, then one read takes exactly its length.
/// Otherwise (a header still arriving, or a v2 one with TLVs past the peek) the header is read as
/// the parser asks, which for v1 is a byte at a time past its first 15 (the line's end is not
/// known before it arrives). Before, every v1 header was read that way: ~35-93 reads each.
async fn read_proxy_header<S: HeaderSource>(
    down: &mut S,
) -> Result<proxy_protocol::Addresses, Refusal> {
    let mut peeked = [0u8; proxy_protocol::V1_MAX_LEN];
    let n = down
        .peek_some(&mut peeked)
        .await
        .map_err(|_| "bad_proxy_header")?;
    match proxy_protocol::parse(&peeked[..n]) {
        Ok(proxy_protocol::Parsed::Complete(h)) => {
            // `h.len <= n`: these bytes are the ones peeked, already here.
            down.consume(&mut peeked[..h.len])
                .await
                .map_err(|_| "bad_proxy_header")?;
            return Ok(h.addresses);
        }
        Err(_) => return Err("bad_proxy_header"),
        // Read as it comes, below: peeking again would spin on the same partial bytes.
        Ok(proxy_protocol::Parsed::Incomplete { .. }) => {}
    }
    let mut buf = Vec::with_capacity(proxy_protocol::V1_MAX_LEN);
    loop {
        match proxy_protocol::parse(&buf) {
            Ok(proxy_protocol::Parsed::Complete(h)) => return Ok(h.addresses),
            Ok(proxy_protocol::Parsed::Incomplete { needed }) => {
                let have = buf.len();
                buf.resize(needed.min(proxy_protocol::V2_MAX_LEN), 0);
                down.consume(&mut buf[have..])
                    .await
                    .map_err(|_| "bad_proxy_header")?;
            }
            Err(_) => return Err("bad_proxy_header"),
        }
    }
}

/// Reads until a whole ClientHello is buffered in `buf`; returns its server name.
async fn read_client_hello(
    down: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> Result<Option<String>, Refusal> {
    loop {
        match client_hello::parse(buf) {
            Ok(client_hello::Parsed::Complete(hello)) => return Ok(hello.server_name),
            Ok(client_hello::Parsed::Incomplete { needed }) => {
                if needed > MAX_HELLO_BUFFER {
                    return Err("not_tls");
                }
                // Parse again only once the bytes it asked for are here: a hello sent a byte per
                // segment is then parsed a few times, not once per segment.
                buf.reserve(needed - buf.len());
                while buf.len() < needed {
                    if down.read_buf(buf).await.map_err(|_| "closed_early")? == 0 {
                        return Err("closed_early");
                    }
                }
            }
            Err(_) => return Err("not_tls"),
        }
    }
}

/// Connects to a server of `a`'s group in `groups` (the listener's current ones), sends the
/// PROXY header and prefix, relays; returns how the connection ended.
async fn relay(
    a: Accepted,
    s: &Settings,
    groups: &Groups,
    shared: &Shared,
    started: Instant,
) -> &'static str {
    let m = &shared.metrics;
    let refuse = |reason: &'static str| {
        m.refused
            .get_or_create(&RefusedLabels {
                listener: s.name.clone(),
                reason,
            })
            .inc();
        reason
    };
    // Gone from the current groups: a reload removed it since the route was picked.
    let Some(group) = groups.get(&a.group) else {
        return refuse("no_server");
    };
    let key = a.client.ip().to_canonical().to_string();
    let plan = group.plan((group.balance() == Balance::Hash).then_some(key.as_bytes()));
    if plan.is_empty() {
        return refuse("no_server");
    }
    // Raced against a forced shutdown like the relay: unraced, a plan of servers that drop SYNs
    // held `TcpProxy::shutdown` for servers × `connect_timeout_secs` past its grace period.
    let mut force = shared.force.clone();
    let connected = tokio::select! {
        c = connect_first(plan, group, s, shared) => c,
        Ok(_) = force.wait_for(|stop| *stop) => Err(Unconnected::Shutdown),
    };
    let (up, in_flight) = match connected {
        Ok(c) => c,
        Err(Unconnected::Refused(reason)) => return refuse(reason),
        Err(Unconnected::Shutdown) => {
            m.ended
                .get_or_create(&EndLabels {
                    listener: s.name.clone(),
                    how: "shutdown",
                })
                .inc();
            return "shutdown";
        }
    };
    let _ = up.set_nodelay(true);
    let server_labels = ServerLabels {
        group: group.name().to_string(),
        server: in_flight.server().addr().to_string(),
    };
    m.server_connections.get_or_create(&server_labels).inc();
    let server_open = m.server_open.get_or_create(&server_labels).clone();
    server_open.inc();

    let mut first = match s.config.send_proxy {
        Some(ProxyVersion::V1) => proxy_protocol::encode_v1(a.client, a.destination),
        Some(ProxyVersion::V2) => proxy_protocol::encode_v2(a.client, a.destination),
        None => Vec::new(),
    };
    first.extend_from_slice(&a.prefix);
    let how = pump(a.down, up, &first, s, shared, started, &server_labels).await;
    server_open.dec();
    m.ended
        .get_or_create(&EndLabels {
            listener: s.name.clone(),
            how,
        })
        .inc();
    drop(in_flight);
    how
}

/// Why no upstream connection came out of the plan.
enum Unconnected {
    /// Refused, with its `tcp_connections_refused` reason.
    Refused(Refusal),
    /// A forced shutdown came first.
    Shutdown,
}

/// Connects to the first server of `plan` that answers within `connect_timeout_secs`.
async fn connect_first(
    plan: Plan<'_>,
    group: &Group,
    s: &Settings,
    shared: &Shared,
) -> Result<(TcpStream, InFlight), Unconnected> {
    let m = &shared.metrics;
    let connect_timeout = Duration::from_secs(s.config.connect_timeout_secs);
    // Each address of a server's name may use half the budget, as the other dials do, so a
    // silent first address leaves the next its turn within `connect_timeout_secs`.
    let attempt = (connect_timeout / 2).max(happy::STAGGER);
    for (index, server) in plan.indexed() {
        let in_flight = server.begin();
        let why = match tokio::time::timeout(connect_timeout, dial(server.addr(), attempt)).await {
            Ok(Ok(up)) => {
                server.report_success();
                return Ok((up, in_flight));
            }
            Ok(Err(e)) if is_local_exhaustion(&e) => {
                // Out of our own descriptors or memory: not the server's fault, so nothing
                // is counted against it; the next server would fail the same way.
                tracing::warn!(error = %e, "tcp connect: out of local resources");
                return Err(Unconnected::Refused("local_resources"));
            }
            Ok(Err(e)) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => {
                // No local port left toward this server (ports run out per destination), or
                // an address this host cannot reach from: this side's, not counted against
                // the server; the next one may still be reached.
                tracing::debug!(group = group.name(), server = server.addr(), error = %e, "tcp connect: no local address");
                continue;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {} s", connect_timeout.as_secs()),
        };
        // Through the plan: only its own attempt decides a recovery trial.
        plan.report_failure(index);
        tracing::debug!(group = group.name(), server = server.addr(), %why, "tcp connect failed");
        m.connect_failures
            .get_or_create(&ServerLabels {
                group: group.name().to_string(),
                server: server.addr().to_string(),
            })
            .inc();
    }
    Err(Unconnected::Refused("connect_failed"))
}

/// Connects to a server: an `ip:port` at once; a `host:port` through the shared resolver
/// (cached, `localhost` answered locally, C library lookups bounded) with its addresses raced as
/// Happy Eyeballs does (at most [`happy::MAX_ATTEMPTS`]), each within `attempt`: a silent first
/// address costs [`happy::STAGGER`], not the whole connect deadline.
async fn dial(addr: &str, attempt: Duration) -> std::io::Result<TcpStream> {
    // An address (the common server): one connect, no resolver and no race to set up.
    if let Ok(sa) = addr.parse::<SocketAddr>() {
        return TcpStream::connect(sa).await;
    }
    happy::connect_name(addr, attempt).await
}

/// `first` (PROXY header, peeked ClientHello) to the upstream, then the relay, raced against the
/// idle and total timeouts and a forced shutdown.
async fn pump(
    mut down: Downstream,
    mut up: TcpStream,
    first: &[u8],
    s: &Settings,
    shared: &Shared,
    started: Instant,
    server_labels: &ServerLabels,
) -> &'static str {
    let m = &shared.metrics;
    let labels = m.listener(&s.name);
    let (l_up, l_down) = (
        m.listener_up_bytes.get_or_create(&labels).clone(),
        m.listener_down_bytes.get_or_create(&labels).clone(),
    );
    let (s_up, s_down) = (
        m.server_up_bytes.get_or_create(server_labels).clone(),
        m.server_down_bytes.get_or_create(server_labels).clone(),
    );
    let last = AtomicU64::new(0);
    let on_bytes = |dir: Direction, n: usize| {
        last.store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
        // While bytes flow, the runtime polls instead of sleeping (`runtime::busy_poll`).
        crate::runtime::busy_poll::stamp();
        let n = n as u64;
        match dir {
            Direction::Up => {
                l_up.inc_by(n);
                s_up.inc_by(n);
            }
            Direction::Down => {
                l_down.inc_by(n);
                s_down.inc_by(n);
            }
        }
    };
    let idle = Duration::from_secs(s.config.idle_timeout_secs);
    let total = match s.config.total_timeout_secs {
        0 => None,
        secs => Some(started + Duration::from_secs(secs)),
    };
    let mut force = shared.force.clone();
    let result = {
        let relay = async {
            // Inside the race: an upstream that accepts but never reads must not hold the
            // connection (and a graceful shutdown) past the timeouts.
            if !first.is_empty() {
                up.write_all(first)
                    .await
                    .map_err(|e| RelayError::Io(Side::Upstream, e))?;
            }
            match &mut down {
                Downstream::Plain(d) => {
                    splice::relay_tcp(d, &up, shared.pool, idle, &on_bytes).await
                }
                Downstream::Tls(t) => splice::copy_both(&mut **t, &mut up, idle, &on_bytes).await,
            }
        };
        tokio::select! {
            r = relay => r.map(|_| "closed"),
            _ = idle_watch(&last, started, idle) => Ok("idle_timeout"),
            _ = async {
                match total {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            } => Ok("total_timeout"),
            _ = force.wait_for(|stop| *stop) => Ok("shutdown"),
        }
    };
    match result {
        Ok(how) => how,
        // A peer that read nothing of what it was sent for `idle_timeout_secs`, however busy the
        // other direction: ended as idle, and reset both ways, so the kernel drops what it still
        // holds for it.
        Err(e) if splice::is_stalled(&e) => {
            splice::reset_on_close(down.tcp());
            splice::reset_on_close(&up);
            tracing::debug!(listener = %s.name, error = %e, "tcp relay ended: a write stalled");
            "idle_timeout"
        }
        Err(e) => {
            // A reset (or a broken socket) on one side is passed on as a reset to the other.
            splice::reset_on_close(down.tcp());
            splice::reset_on_close(&up);
            tracing::debug!(listener = %s.name, error = %e, "tcp relay ended by an error");
            match e {
                RelayError::Reset(_) => "reset",
                RelayError::Io(..) => "error",
            }
        }
    }
}

/// Resolves once no byte moved either way for `idle`.
async fn idle_watch(last: &AtomicU64, started: Instant, idle: Duration) {
    loop {
        let deadline = started + Duration::from_millis(last.load(Ordering::Relaxed)) + idle;
        if Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep_until(deadline.into()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// Two connected sockets on loopback.
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (outer, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (outer.unwrap(), accepted.unwrap().0)
    }

    /// An upstream that accepts but never reads cannot hold the first bytes' write (PROXY
    /// header, peeked ClientHello) past the idle timeout or a forced shutdown. Before, that
    /// write ran ahead of the relay, outside both: the connection and its slot were held for
    /// good and `TcpProxy::shutdown` never returned. (A real prefix is at most ~130 KiB, which
    /// loopback's autotuned socket buffers always take, so the test sends more than they hold.)
    #[tokio::test]
    async fn a_first_write_the_upstream_never_reads_is_bounded() {
        let config: super::super::TcpConfig =
            toml::from_str("listen = \"127.0.0.1:0\"\nupstream = \"g\"\nidle_timeout_secs = 1")
                .unwrap();
        let settings = Settings {
            name: "t".into(),
            config,
            groups: Arc::new(crate::upstream::group::Groups::new(&[]).unwrap()),
            tls: None,
            per_ip: super::super::share::Share::new(0, Vec::new()),
        };
        let (force_tx, force) = tokio::sync::watch::channel(false);
        let shared = Shared {
            metrics: super::super::TcpMetrics::register(&mut Default::default()),
            pool: splice::shared_pool(),
            force,
        };
        let labels = ServerLabels {
            group: "g".into(),
            server: "s".into(),
        };
        let first = vec![0x5a; 64 << 20];
        // Idle timeout.
        let ((_client, down), (up, _deaf)) = (pair().await, pair().await);
        let started = Instant::now();
        let how = tokio::time::timeout(
            Duration::from_secs(5),
            pump(
                Downstream::Plain(down),
                up,
                &first,
                &settings,
                &shared,
                started,
                &labels,
            ),
        )
        .await;
        assert_eq!(how, Ok("idle_timeout"));
        // Forced shutdown, long before the idle timeout.
        let ((_client, down), (up, _deaf)) = (pair().await, pair().await);
        let mut settings = settings;
        settings.config.idle_timeout_secs = 600;
        let pumped = pump(
            Downstream::Plain(down),
            up,
            &first,
            &settings,
            &shared,
            Instant::now(),
            &labels,
        );
        let force = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            force_tx.send(true).unwrap();
        };
        let (how, ()) = tokio::time::timeout(Duration::from_secs(5), async {
            tokio::join!(pumped, force)
        })
        .await
        .unwrap();
        assert_eq!(how, "shutdown");
    }

    /// A listener that never accepts, its one-place queue full: further SYNs go unanswered, as
    /// from a host that drops them. Returns it and the connections that fill its queue.
    async fn silent() -> (TcpListener, Vec<TcpStream>) {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = sock.listen(0).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut fillers = Vec::new();
        loop {
            match tokio::time::timeout(Duration::from_millis(300), TcpStream::connect(addr)).await {
                Ok(Ok(s)) => fillers.push(s),
                Ok(Err(e)) => panic!("{e}"),
                Err(_) => break,
            }
            assert!(fillers.len() < 16, "the accept queue never filled");
        }
        (listener, fillers)
    }

    /// A forced shutdown ends a connection still connecting upstream at once. Before, the connect
    /// loop ran outside the race with `force`: with three servers that drop SYNs it held the
    /// connection (and `TcpProxy::shutdown`) for 3 × `connect_timeout_secs` = 15 s.
    #[tokio::test]
    async fn a_forced_shutdown_ends_a_connect_in_progress() {
        let mut held = Vec::new();
        let mut servers = Vec::new();
        for _ in 0..3 {
            let (listener, fillers) = silent().await;
            servers.push(format!("\"{}\"", listener.local_addr().unwrap()));
            held.push((listener, fillers));
        }
        let group: crate::upstream::group::GroupConfig =
            toml::from_str(&format!("name = \"g\"\nservers = [{}]", servers.join(", "))).unwrap();
        let config: super::super::TcpConfig =
            toml::from_str("listen = \"127.0.0.1:0\"\nupstream = \"g\"\nconnect_timeout_secs = 5")
                .unwrap();
        let settings = Settings {
            name: "t".into(),
            config,
            groups: Arc::new(crate::upstream::group::Groups::new(&[group]).unwrap()),
            tls: None,
            per_ip: super::super::share::Share::new(0, Vec::new()),
        };
        let (force_tx, force) = tokio::sync::watch::channel(false);
        let shared = Shared {
            metrics: super::super::TcpMetrics::register(&mut Default::default()),
            pool: splice::shared_pool(),
            force,
        };
        let (_client, down) = pair().await;
        let client = down.peer_addr().unwrap();
        let accepted = Accepted {
            client,
            destination: down.local_addr().unwrap(),
            down: Downstream::Plain(down),
            group: "g".into(),
            prefix: Vec::new(),
            _place: settings.per_ip.take(client.ip()).unwrap(),
        };
        let started = Instant::now();
        let relayed = relay(accepted, &settings, &settings.groups, &shared, started);
        let force = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            force_tx.send(true).unwrap();
        };
        let ended = tokio::time::timeout(Duration::from_secs(4), async {
            tokio::join!(relayed, force)
        })
        .await;
        assert!(
            matches!(ended, Ok(("shutdown", ()))),
            "{ended:?} after {:?}",
            started.elapsed()
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        // Cut short by the shutdown, not failed: nothing is counted against the servers.
        let g = settings.groups.get("g").unwrap();
        assert!(g.servers().iter().all(|s| s.failures() == 0));
        drop(held);
    }
    /// A socket whose header reads (peeks included) are counted.
    struct Counted<'a> {
        s: &'a mut TcpStream,
        calls: usize,
    }

    impl HeaderSource for Counted<'_> {
        async fn peek_some(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.calls += 1;
            self.s.peek_some(buf).await
        }

        async fn consume(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
            self.calls += 1;
            self.s.consume(buf).await
        }
    }

    /// 64 KiB that no header parser would take for the end of a line.
    fn payload() -> Vec<u8> {
        (0..64 * 1024u32).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    /// Reads the rest of `down` after the header (the client has shut its side).
    async fn rest(down: &mut TcpStream) -> Vec<u8> {
        let mut rest = Vec::new();
        down.read_to_end(&mut rest).await.unwrap();
        rest
    }

    /// A PROXY header sent with the payload behind it in one write, as a load balancer sends it,
    /// takes one peek and one read, whatever its length, and the payload after it arrives intact.
    /// Before, a v1 header was read a byte per read past its first 15: 93 reads for the longest.
    #[tokio::test]
    async fn a_proxy_header_in_one_write_takes_one_peek_and_one_read() {
        let source: SocketAddr = "[2001:db8:ffff:ffff:ffff:ffff:ffff:ffff]:65535"
            .parse()
            .unwrap();
        let destination: SocketAddr = "[2001:db8::1]:443".parse().unwrap();
        let v4 = |a: &str| a.parse::<SocketAddr>().unwrap();
        for (header, want) in [
            (
                proxy_protocol::encode_v1(source, destination),
                proxy_protocol::Addresses::Tcp {
                    source,
                    destination,
                },
            ),
            (
                proxy_protocol::encode_v1(v4("203.0.113.7:1000"), v4("198.51.100.1:5432")),
                proxy_protocol::Addresses::Tcp {
                    source: v4("203.0.113.7:1000"),
                    destination: v4("198.51.100.1:5432"),
                },
            ),
            (
                b"PROXY UNKNOWN\r\n".to_vec(),
                proxy_protocol::Addresses::Unknown,
            ),
            (
                proxy_protocol::encode_v2(source, destination),
                proxy_protocol::Addresses::Tcp {
                    source,
                    destination,
                },
            ),
        ] {
            let (mut client, mut down) = pair().await;
            let body = payload();
            client
                .write_all(&[&header[..], &body[..]].concat())
                .await
                .unwrap();
            client.shutdown().await.unwrap();
            // All of the header is here before it is read (loopback may still be delivering).
            let mut probe = [0u8; proxy_protocol::V1_MAX_LEN];
            while down.peek(&mut probe).await.unwrap() < header.len().min(probe.len()) {
                tokio::task::yield_now().await;
            }
            let mut counted = Counted {
                s: &mut down,
                calls: 0,
            };
            assert_eq!(read_proxy_header(&mut counted).await, Ok(want));
            let calls = counted.calls;
            assert!(
                calls <= 2,
                "{calls} reads for a {}-byte header",
                header.len()
            );
            assert!(
                rest(&mut down).await == body,
                "the payload after the header changed"
            );
        }
    }

    /// A header trickled a byte per write is still read whole, and never a byte past it.
    #[tokio::test]
    async fn a_trickled_proxy_header_is_still_read() {
        let source: SocketAddr = "203.0.113.7:1000".parse().unwrap();
        let destination: SocketAddr = "198.51.100.1:5432".parse().unwrap();
        for header in [
            proxy_protocol::encode_v1(source, destination),
            proxy_protocol::encode_v2(source, destination),
        ] {
            let (mut client, mut down) = pair().await;
            client.set_nodelay(true).unwrap();
            let body = payload();
            let send = async move {
                for b in &header {
                    client.write_all(std::slice::from_ref(b)).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                client.write_all(&body).await.unwrap();
                client.shutdown().await.unwrap();
                body
            };
            let read = async {
                let got = read_proxy_header(&mut down).await;
                (got, rest(&mut down).await)
            };
            let (body, (got, after)) = tokio::join!(send, read);
            assert_eq!(
                got,
                Ok(proxy_protocol::Addresses::Tcp {
                    source,
                    destination
                })
            );
            assert!(after == body, "the payload after the header changed");
        }
    }

    /// Keeps the events logged while it is the default subscriber, as lines.
    struct Capture(Arc<std::sync::Mutex<Vec<String>>>);

    impl tracing::Subscriber for Capture {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            let line = crate::logging::format_line(std::time::UNIX_EPOCH, event, false);
            self.0.lock().unwrap().push(line);
        }
    }

    /// Behind a trusted proxy, a connection refused for its client's share is logged under that
    /// client (the PROXY header's source, which the share counted), with the proxy as the peer.
    /// Before, it was logged under the peer alone: the load balancer's address, the same for
    /// every client behind it.
    #[tokio::test]
    async fn a_refusal_behind_a_proxy_is_logged_under_the_client() {
        let config: super::super::TcpConfig = toml::from_str(
            "listen = \"127.0.0.1:0\"\nupstream = \"g\"\naccept_proxy = true\n\
             trusted_proxies = [\"127.0.0.0/8\"]",
        )
        .unwrap();
        let settings = Settings {
            name: "t".into(),
            config,
            groups: Arc::new(crate::upstream::group::Groups::new(&[]).unwrap()),
            tls: None,
            per_ip: super::super::share::Share::new(1, Vec::new()),
        };
        let source: SocketAddr = "203.0.113.7:1000".parse().unwrap();
        // The client already holds its one place.
        let _held = settings.per_ip.take(source.ip()).unwrap();
        let (_force_tx, force) = tokio::sync::watch::channel(false);
        let shared = Shared {
            metrics: super::super::TcpMetrics::register(&mut Default::default()),
            pool: splice::shared_pool(),
            force,
        };
        let (mut client, down) = pair().await;
        let peer = down.peer_addr().unwrap();
        client
            .write_all(&proxy_protocol::encode_v1(
                source,
                "198.51.100.1:5432".parse().unwrap(),
            ))
            .await
            .unwrap();
        let lines = Arc::new(std::sync::Mutex::new(Vec::new()));
        let guard = tracing::subscriber::set_default(Capture(Arc::clone(&lines)));
        let (_settings_tx, settings) = tokio::sync::watch::channel(Arc::new(settings));
        serve(down, peer, settings, Arc::new(shared)).await;
        drop(guard);
        let lines = lines.lock().unwrap();
        let refused = lines
            .iter()
            .find(|l| l.contains("tcp connection refused"))
            .unwrap_or_else(|| panic!("{lines:?}"));
        assert!(refused.contains("reason=\"per_ip\""), "{refused}");
        assert!(
            refused.contains(&format!("client={source}")),
            "not logged under the client: {refused}"
        );
        assert!(refused.contains(&format!("peer={peer}")), "{refused}");
    }
}
