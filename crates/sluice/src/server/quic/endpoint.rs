//! The QUIC endpoints: one UDP socket per TLS listener address (same port as its TCP socket),
//! the QUIC and TLS settings, and the accept loop with its limits.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use quinn::crypto::rustls::QuicServerConfig;
use quinn::VarInt;
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use super::conn::{self, Settings};
use super::socket::{self, QuicSocket};
use super::Http3Config;
use crate::metrics::protocol::ProtocolMetrics;
use crate::net::per_ip::{IpPlace, PerIp};
use crate::server::handler::{Handler, ListenerId};
use crate::server::listener::inherited;
use crate::server::listener::{Acceptor, Full, Slot};
use crate::server::ServerConfig;
use crate::server::TlsHandle;

/// Unidirectional streams a client may open: HTTP/3's control stream, the two QPACK streams,
/// and a few for GREASE and extensions it may try.
const MAX_UNI_STREAMS: u32 = 8;
/// H3_EXCESSIVE_LOAD (RFC 9114 §8.1): a connection closed after its handshake because the
/// connection limits were reached meanwhile.
const H3_EXCESSIVE_LOAD: u32 = 0x107;

/// UDP sockets bound for HTTP/3, not yet serving; each with the previous process's tag and
/// channel when it was handed over by a binary upgrade.
pub struct Bound(Vec<(ListenerId, std::net::UdpSocket, Option<Previous>)>);

type Previous = ([u8; 2], std::os::unix::net::UnixDatagram);

/// Binds one UDP socket on each of `addrs` (the TLS listeners' bound addresses), or takes the
/// one the previous process handed over for that address. Each socket has `SO_REUSEPORT`.
pub fn bind(addrs: &[(ListenerId, SocketAddr)]) -> anyhow::Result<Bound> {
    let mut sockets = Vec::new();
    for (id, addr) in addrs {
        if let Some(q) = inherited::take_quic(*addr) {
            socket::avoid_tag(q.tag);
            q.socket.set_nonblocking(true)?;
            sockets.push((*id, q.socket, Some((q.tag, q.channel))));
            continue;
        }
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(*addr),
            socket2::Type::DGRAM,
            Some(socket2::Protocol::UDP),
        )?;
        if addr.is_ipv6() {
            socket.set_only_v6(true)?;
        }
        socket.set_reuse_port(true)?;
        socket.set_nonblocking(true)?;
        socket
            .bind(&(*addr).into())
            .with_context(|| format!("cannot listen for HTTP/3 on udp {addr}"))?;
        sockets.push((*id, socket.into(), None));
    }
    Ok(Bound(sockets))
}

/// The running endpoints.
pub struct Endpoints {
    endpoints: Vec<quinn::Endpoint>,
    loops: Vec<tokio::task::JoinHandle<()>>,
}

/// What the accept loops share.
struct Accepting {
    config: Http3Config,
    tls: TlsHandle,
    idle: Duration,
    handshake_timeout: Duration,
    metrics: ProtocolMetrics,
    open: AtomicUsize,
    handshaking: AtomicUsize,
    /// The TCP listeners' connection limits (`server.max_connections`, and
    /// `max_connections_per_ip`): a QUIC connection holds a slot there like a TCP one.
    acceptor: Acceptor,
    /// Handshakes in progress per client IP that proved its address
    /// (`server.http3.max_handshakes_per_ip`).
    handshakes_per_ip: Arc<PerIp>,
}

impl Bound {
    /// Starts serving on the current runtime: connections and requests are tasks of `tracker`,
    /// and drain when `stop` turns true. Each connection holds a slot of `acceptor`.
    pub fn serve<H: Handler>(
        self,
        server: &ServerConfig,
        tls: TlsHandle,
        handler: Arc<H>,
        stop: watch::Receiver<bool>,
        tracker: TaskTracker,
        acceptor: Acceptor,
    ) -> anyhow::Result<Endpoints> {
        let idle = Duration::from_secs(server.idle_timeout_secs);
        let accepting = Arc::new(Accepting {
            config: server.http3.clone(),
            tls,
            idle,
            handshake_timeout: Duration::from_secs(server.tls_handshake_timeout_secs),
            metrics: handler.http_metrics().protocol.clone(),
            open: AtomicUsize::new(0),
            handshaking: AtomicUsize::new(0),
            acceptor,
            handshakes_per_ip: PerIp::by_network(
                server.http3.max_handshakes_per_ip,
                server.per_ip_exempt.clone(),
            ),
        });
        let mut running = Endpoints {
            endpoints: Vec::new(),
            loops: Vec::new(),
        };
        for (listener, socket, previous) in self.0 {
            let Some(tls) = accepting.tls.load_full() else {
                anyhow::bail!("HTTP/3 needs TLS on the listeners");
            };
            let mut endpoint_config =
                quinn::EndpointConfig::new(crate::crypto::quic_reset_key(&socket::reset_secret()));
            endpoint_config.cid_generator(|| Box::new(socket::TaggedCids));
            let config = accepting.quic_config(&tls)?;
            let endpoint = quinn::Endpoint::new_with_abstract_socket(
                endpoint_config,
                Some(config.clone()),
                QuicSocket::new(
                    socket,
                    previous,
                    accepting.metrics.quic_upgrade_dropped.clone(),
                )?,
                Arc::new(quinn::TokioRuntime),
            )?;
            if let Ok(addr) = endpoint.local_addr() {
                tracing::info!(%addr, "HTTP/3 listening (udp)");
            }
            let settings = Arc::new(Settings {
                handler: handler.clone(),
                listener,
                idle,
                send_timeout: Duration::from_secs(server.send_timeout_secs),
                header_read: Duration::from_secs(server.header_read_timeout_secs),
                max_field_section_size: server.max_header_bytes as u64,
                stop: stop.clone(),
                tracker: tracker.clone(),
            });
            running.loops.push(tokio::spawn(accept_loop(
                endpoint.clone(),
                accepting.clone(),
                settings,
                tls,
                config,
            )));
            running.endpoints.push(endpoint);
        }
        Ok(running)
    }
}

impl Endpoints {
    /// Stops accepting new connections (the open ones drain on their own).
    pub fn stop_accepting(&self) {
        for l in &self.loops {
            l.abort();
        }
        for e in &self.endpoints {
            e.set_server_config(None);
        }
    }

    /// Closes whatever is still open and waits a moment for the close to reach the clients.
    pub async fn close(self) {
        for e in &self.endpoints {
            e.close(VarInt::from_u32(0x100), b"");
        }
        for e in &self.endpoints {
            let _ = tokio::time::timeout(Duration::from_secs(1), e.wait_idle()).await;
        }
    }
}

impl Accepting {
    /// The QUIC settings over the listeners' current TLS settings.
    fn quic_config(&self, tls: &rustls::ServerConfig) -> anyhow::Result<quinn::ServerConfig> {
        let h3 = &self.config;
        let crypto = self.quic_crypto(tls)?;
        let mut transport = quinn::TransportConfig::default();
        transport
            .max_concurrent_bidi_streams(VarInt::from_u32(h3.max_concurrent_streams))
            .max_concurrent_uni_streams(VarInt::from_u32(MAX_UNI_STREAMS))
            .stream_receive_window(VarInt::from_u32(h3.stream_window_bytes))
            .receive_window(VarInt::from_u32(h3.connection_window_bytes))
            .send_window(h3.send_window_bytes)
            .max_idle_timeout(Some(self.idle.try_into().context("idle timeout too long")?))
            // No QUIC DATAGRAM frames (not advertised): nothing here reads them, and each one
            // quinn keeps holds its whole receive buffer.
            .datagram_receive_buffer_size(None);
        let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        config
            .transport_config(Arc::new(transport))
            // Client Initials waiting for a decision, and the bytes they may hold: bounded, so a
            // flood of Initials costs a fixed amount of memory.
            .max_incoming(h3.max_handshakes)
            .incoming_buffer_size(64 * 1024)
            .incoming_buffer_size_total(h3.max_handshakes as u64 * 16 * 1024);
        Ok(config)
    }

    /// The QUIC settings of `base` with the listeners' TLS settings swapped for `tls` (a
    /// reload): the rest, the key Retry tokens are sealed under included, stays as it was, so a
    /// client that got a Retry just before the swap is not sent another.
    fn with_new_tls(
        &self,
        base: &quinn::ServerConfig,
        tls: &rustls::ServerConfig,
    ) -> anyhow::Result<quinn::ServerConfig> {
        let mut config = base.clone();
        config.crypto = Arc::new(self.quic_crypto(tls)?);
        Ok(config)
    }

    /// The listeners' TLS settings made QUIC's.
    fn quic_crypto(&self, tls: &rustls::ServerConfig) -> anyhow::Result<QuicServerConfig> {
        let h3 = &self.config;
        let mut tls = tls.clone();
        tls.alpn_protocols = vec![b"h3".to_vec()];
        // QUIC keeps its own record protection: no secrets kept for a takeover.
        tls.enable_secret_extraction = false;
        tls.key_log = Arc::new(rustls::NoKeyLog);
        // QUIC takes 0 (no early data) or all of it (`u32::MAX`); early data may be replayed.
        tls.max_early_data_size = if h3.early_data { u32::MAX } else { 0 };
        if h3.early_data {
            // Early data only with single-use sessions (not stateless tickets, which a replayed
            // ClientHello could use again): rustls offers it no other way.
            crate::server::tls::resume::single_use_sessions(&mut tls);
        }
        QuicServerConfig::try_from(tls).context("TLS settings unfit for QUIC")
    }

    /// The slot of a connection whose handshake has just proved its address; `None`, and the
    /// connection closed (H3_EXCESSIVE_LOAD), when the address's share or the server filled
    /// meanwhile.
    fn slot_after_handshake(&self, connection: &quinn::Connection) -> Option<Slot> {
        let peer = connection.remote_address();
        match self.acceptor.try_slot(peer.ip()) {
            Ok(slot) => Some(slot),
            Err(_) => {
                self.metrics.quic_refused.inc();
                tracing::debug!(%peer, "QUIC connection closed after its handshake: the address's share or the server is full");
                connection.close(VarInt::from_u32(H3_EXCESSIVE_LOAD), b"");
                None
            }
        }
    }

    /// Whether a new connection attempt is let in (with its connection slot and its place in
    /// its address's handshake share when its address is proved; else the slot is taken once
    /// its handshake has proved it), sent a Retry, or refused.
    fn admit(&self, incoming: quinn::Incoming) -> Option<(quinn::Incoming, Admitted)> {
        let h3 = &self.config;
        let handshaking = self.handshaking.load(Ordering::Relaxed);
        // A connection still in its handshake counts toward the connection limit too.
        if self.open.load(Ordering::Relaxed) + handshaking >= h3.max_connections
            || handshaking >= h3.max_handshakes
        {
            self.metrics.quic_refused.inc();
            incoming.refuse();
            return None;
        }
        if handshaking >= h3.retry_above_handshakes
            && !incoming.remote_address_validated()
            && incoming.may_retry()
        {
            self.metrics.quic_retries.inc();
            // A Retry costs no state: the client comes back with a token that proves its address.
            if let Err(e) = incoming.retry() {
                e.into_incoming().ignore();
            }
            return None;
        }
        // The slot is looked at after the Retry decision, and held from here only by a client
        // that proved its address (a Retry's token): one that has not (below the Retry
        // threshold) takes its slot when its handshake is done, so Initials that never go on,
        // spoofed ones included, cannot hold the share of the address they name. A proved
        // address also holds a place in its share of the handshakes in progress, so a few
        // addresses that stop after the Retry cannot fill `max_handshakes` for everyone.
        let validated = incoming.remote_address_validated();
        let ip = incoming.remote_address().ip();
        let shaking = match validated {
            true => match self.handshakes_per_ip.take(ip) {
                Some(place) => place,
                None => {
                    self.metrics.quic_refused.inc();
                    let peer = incoming.remote_address();
                    tracing::debug!(%peer, "QUIC connection refused: max_handshakes_per_ip reached");
                    incoming.refuse();
                    return None;
                }
            },
            false => None,
        };
        match self.acceptor.try_slot(ip) {
            Ok(slot) if validated => Some((
                incoming,
                Admitted {
                    slot: Some(slot),
                    shaking,
                },
            )),
            Ok(_room) => Some((
                incoming,
                Admitted {
                    slot: None,
                    shaking,
                },
            )),
            Err(full) => {
                self.metrics.quic_refused.inc();
                let peer = incoming.remote_address();
                match full {
                    Full::PerIp => {
                        tracing::debug!(%peer, "QUIC connection refused: max_connections_per_ip reached")
                    }
                    Full::Connections => {
                        tracing::debug!(%peer, "QUIC connection refused: max_connections reached")
                    }
                }
                // CONNECTION_REFUSED at once, as a TCP connection over its share is closed at once.
                incoming.refuse();
                None
            }
        }
    }
}

/// What an admitted attempt holds: its connection slot when its address is proved (else taken
/// when its handshake has proved it), and its place in its address's share of the handshakes in
/// progress (a proved address outside `server.per_ip_exempt`).
struct Admitted {
    slot: Option<Slot>,
    shaking: Option<IpPlace>,
}

/// One connection attempt in its handshake, counted from the moment it is admitted (not when its
/// task first runs: a burst of Initials admitted in one turn of the accept loop would all see the
/// count before any of them raised it) until the handshake ends; with its place in its address's
/// share, given back then too.
struct Handshaking {
    accepting: Arc<Accepting>,
    _place: Option<IpPlace>,
}

impl Handshaking {
    fn new(accepting: Arc<Accepting>, place: Option<IpPlace>) -> Handshaking {
        accepting.handshaking.fetch_add(1, Ordering::Relaxed);
        accepting.metrics.quic_handshakes.inc();
        Handshaking {
            accepting,
            _place: place,
        }
    }
}

impl Drop for Handshaking {
    fn drop(&mut self) {
        self.accepting.handshaking.fetch_sub(1, Ordering::Relaxed);
        self.accepting.metrics.quic_handshakes.dec();
    }
}

/// Counts one in the given gauge and counter while alive.
struct Held<'a>(&'a AtomicUsize, &'a crate::atomic::Gauge);

impl<'a> Held<'a> {
    fn new(count: &'a AtomicUsize, gauge: &'a crate::atomic::Gauge) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        gauge.inc();
        Held(count, gauge)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
        self.1.dec();
    }
}

async fn accept_loop<H: Handler>(
    endpoint: quinn::Endpoint,
    accepting: Arc<Accepting>,
    settings: Arc<Settings<H>>,
    mut tls: Arc<rustls::ServerConfig>,
    base: quinn::ServerConfig,
) {
    let mut current = Arc::new(base.clone());
    while let Some(incoming) = endpoint.accept().await {
        // A reload swapped the certificates: this handshake and the next use them (the attempt
        // in hand was taken in under the settings the endpoint had, so it is accepted with the
        // new ones explicitly).
        if let Some(now) = accepting.tls.load_full() {
            if !Arc::ptr_eq(&now, &tls) {
                match accepting.with_new_tls(&base, &now) {
                    Ok(c) => {
                        endpoint.set_server_config(Some(c.clone()));
                        current = Arc::new(c);
                    }
                    Err(e) => tracing::warn!(error = %e, "HTTP/3 keeps its previous certificates"),
                }
                tls = now;
            }
        }
        let Some((incoming, Admitted { slot, shaking })) = accepting.admit(incoming) else {
            continue;
        };
        let handshake = Handshaking::new(accepting.clone(), shaking);
        let accepting = accepting.clone();
        let settings = settings.clone();
        let config = current.clone();
        settings.tracker.clone().spawn(async move {
            let peer = incoming.remote_address();
            let early = accepting.config.early_data;
            let deadline = tokio::time::Instant::now() + accepting.handshake_timeout;
            let done = tokio::time::timeout_at(deadline, async move {
                let connecting = incoming.accept_with(config)?;
                if early {
                    // A server always takes 0.5-RTT: requests are served while the handshake
                    // goes on.
                    match connecting.into_0rtt() {
                        Ok((c, accepted)) => return Ok((c, Some(accepted))),
                        Err(connecting) => return connecting.await.map(|c| (c, None)),
                    }
                }
                connecting.await.map(|c| (c, None))
            })
            .await;
            match done {
                Ok(Ok((connection, accepted))) => {
                    let _open = Held::new(&accepting.open, &accepting.metrics.quic_open);
                    match accepted {
                        None => {
                            // An address the handshake has just proved takes its slot now.
                            let Some(slot) =
                                slot.or_else(|| accepting.slot_after_handshake(&connection))
                            else {
                                return;
                            };
                            settings.handler.connection_accepted();
                            drop(handshake);
                            conn::serve(connection, settings, None).await;
                            drop(slot);
                        }
                        Some(accepted) => {
                            // Served at once, yet still in its handshake: it keeps its place in
                            // the handshake count (so Retry and max_handshakes still apply) until
                            // the handshake finishes, and is closed if that takes longer than
                            // the handshake timeout, as without early data. An address not
                            // proved yet takes its slot when the handshake has proved it.
                            settings.handler.connection_accepted();
                            let held = Arc::new(std::sync::Mutex::new(slot));
                            let shake = conn::Handshake::new(accepted, connection.clone());
                            let (quic, waiting) = (connection.clone(), shake.clone());
                            let (accepting, held_here) = (accepting.clone(), held.clone());
                            let finish = async move {
                                match tokio::time::timeout_at(deadline, waiting.wait()).await {
                                    Ok(true) => {
                                        let mut slot =
                                            held_here.lock().unwrap_or_else(|p| p.into_inner());
                                        if slot.is_none() {
                                            *slot = accepting.slot_after_handshake(&quic);
                                        }
                                    }
                                    Ok(false) => {
                                        accepting.metrics.quic_handshake_errors.inc();
                                        tracing::debug!(%peer, "QUIC handshake failed (0-RTT)");
                                    }
                                    Err(_) => {
                                        accepting.metrics.quic_handshake_timeouts.inc();
                                        tracing::debug!(%peer, "QUIC handshake timed out (0-RTT)");
                                        quic.close(
                                            VarInt::from_u32(conn::H3_NO_ERROR),
                                            b"handshake timeout",
                                        );
                                    }
                                }
                                drop(handshake);
                            };
                            tokio::join!(conn::serve(connection, settings, Some(shake)), finish);
                            drop(held);
                        }
                    }
                }
                Ok(Err(e)) => {
                    accepting.metrics.quic_handshake_errors.inc();
                    drop(handshake);
                    tracing::debug!(%peer, error = %e, "QUIC handshake failed");
                }
                Err(_) => {
                    accepting.metrics.quic_handshake_timeouts.inc();
                    drop(handshake);
                    tracing::debug!(%peer, "QUIC handshake timed out");
                }
            }
        });
    }
}
