//! One HTTP/3 connection: accepts request streams until the client goes, the connection idles
//! out, or the server drains (GOAWAY, in-flight requests finish, then the connection closes).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::atomic::Counter;
use bytes::Bytes;
use futures_util::future::{FutureExt, Shared as SharedFuture};
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use super::exchange;
use crate::server::activity::Activity;
use crate::server::handler::{Handler, ListenerId};
use crate::server::DRAIN_IDLE;

/// H3_GENERAL_PROTOCOL_ERROR: the close of a connection whose peer never let the set-up finish.
const H3_GENERAL_PROTOCOL_ERROR: u32 = 0x101;

/// H3_NO_ERROR: the application close code of a connection that ends normally.
pub(super) const H3_NO_ERROR: u32 = 0x100;

/// What every connection of one endpoint shares.
pub struct Settings<H> {
    pub handler: Arc<H>,
    pub listener: ListenerId,
    /// `server.idle_timeout_secs`: no request in flight for this long closes the connection.
    pub idle: Duration,
    /// `server.send_timeout_secs`, per response stream.
    pub send_timeout: Duration,
    /// `server.header_read_timeout_secs`: a request stream's head, and the end of a request that
    /// declares no body, must arrive within it.
    pub header_read: Duration,
    /// `server.max_header_bytes`, as HTTP/3's `SETTINGS_MAX_FIELD_SECTION_SIZE`.
    pub max_field_section_size: u64,
    pub stop: watch::Receiver<bool>,
    pub tracker: TaskTracker,
}

/// What the request streams of one connection share.
pub struct Shared<H> {
    pub handler: Arc<H>,
    pub listener: ListenerId,
    pub activity: Arc<Activity>,
    pub send_timeout: Duration,
    pub header_read: Duration,
    pub requests: Counter,
    /// For a connection served before its handshake finished (0-RTT); `None`: the handshake was
    /// over before the first request.
    pub handshake: Option<Handshake>,
}

/// The handshake of a connection served before it finished (0-RTT, `server.http3.early_data`).
#[derive(Clone)]
pub struct Handshake {
    /// Ends when the handshake has finished, or when the connection ends first.
    connected: SharedFuture<quinn::ZeroRttAccepted>,
    quic: quinn::Connection,
}

impl Handshake {
    pub fn new(connected: quinn::ZeroRttAccepted, quic: quinn::Connection) -> Handshake {
        Handshake {
            connected: connected.shared(),
            quic,
        }
    }

    /// Whether the handshake has finished with the connection open, asked when a request is
    /// looked at: one read after that is not early data.
    pub fn finished(&self) -> bool {
        // Unconstrained: a task that has used up its cooperative budget would otherwise be told
        // "not yet" by quinn's channel, and a request read after the handshake taken as early.
        tokio::task::unconstrained(self.connected.clone())
            .now_or_never()
            .is_some()
            && self.quic.close_reason().is_none()
    }

    /// Waits for the handshake's end: true when it finished with the connection open, false
    /// when the connection ended first (a first flight never completed, or replayed).
    pub async fn wait(&self) -> bool {
        self.connected.clone().await;
        self.quic.close_reason().is_none()
    }
}

type Resolver = h3::server::RequestResolver<h3_quinn::Connection, Bytes>;

/// What woke the connection loop.
enum Event {
    /// The next request stream (boxed: the resolver is large beside the other events).
    Accepted(Result<Option<Box<Resolver>>, h3::error::ConnectionError>),
    Stop(bool),
    Tick,
}

/// Serves one QUIC connection to its end; `handshake` as in [`Shared::handshake`].
pub async fn serve<H: Handler>(
    quic: quinn::Connection,
    settings: Arc<Settings<H>>,
    handshake: Option<Handshake>,
) {
    let peer: SocketAddr = quic.remote_address();
    let mut builder = h3::server::builder();
    builder
        .max_field_section_size(settings.max_field_section_size)
        // No GREASE frames: h3 puts one after a response's last DATA frame, and clients on
        // aioquic then never see the response end (the FIN arrives with the unknown frame).
        .send_grease(false);
    let built = builder.build::<_, Bytes>(h3_quinn::Connection::new(quic.clone()));
    // The set-up opens the server's control and QPACK streams and sends SETTINGS: a client that
    // grants no stream for them would hold it for ever.
    let built = tokio::time::timeout(settings.header_read, built).await;
    let mut h3 = match built {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "HTTP/3 connection set-up failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "HTTP/3 connection set-up not done in time");
            quic.close(H3_GENERAL_PROTOCOL_ERROR.into(), b"");
            return;
        }
    };
    let shared = Arc::new(Shared {
        handler: settings.handler.clone(),
        listener: settings.listener,
        activity: Activity::new(),
        send_timeout: settings.send_timeout,
        header_read: settings.header_read,
        requests: settings.handler.http_metrics().protocol.http3.clone(),
        handshake,
    });
    let mut stop = settings.stop.clone();
    let mut draining = false;
    let mut goaway = *stop.borrow();
    let mut ticker = tokio::time::interval(Duration::from_millis(250));
    let mut last_stream_frames = 0;
    loop {
        if goaway && !draining {
            draining = true;
            // GOAWAY: the requests already accepted finish here; the client sends new ones on a
            // new connection.
            // Not timed out here: a GOAWAY cut halfway would leave the control stream with half a
            // frame, and the drain's end (`shutdown_grace_secs`) bounds the wait.
            if let Err(e) = h3.shutdown(0).await {
                tracing::debug!(%peer, error = %e, "HTTP/3 GOAWAY not sent");
                break;
            }
        }
        let event = tokio::select! {
            accepted = h3.accept() => Event::Accepted(accepted.map(|r| r.map(Box::new))),
            changed = stop.changed(), if !goaway => Event::Stop(changed.is_err() || *stop.borrow()),
            _ = ticker.tick() => Event::Tick,
        };
        match event {
            Event::Accepted(Ok(Some(resolver))) => {
                settings
                    .tracker
                    .spawn(exchange::serve(resolver, shared.clone(), peer));
            }
            Event::Accepted(Ok(None)) => break,
            Event::Accepted(Err(e)) => {
                if !e.is_h3_no_error() {
                    tracing::debug!(%peer, error = %e, "HTTP/3 connection ended with an error");
                }
                break;
            }
            Event::Stop(stopping) => goaway = stopping,
            Event::Tick => {
                // A finished response may still sit in QUIC's send buffer, and a close discards
                // it: the connection closes only once no stream data has gone out for a tick
                // (nothing left to send or resend). Only stream frames count: a client that
                // keeps the line busy with PINGs draws nothing but acknowledgements.
                let sent = quic.stats().frame_tx.stream;
                let quiet = std::mem::replace(&mut last_stream_frames, sent) == sent;
                // Nothing in flight for the idle timeout, or for `DRAIN_IDLE` once draining; a
                // tail still going out after that gets the send timeout, as a response does.
                let limit = if draining { DRAIN_IDLE } else { settings.idle };
                let idle = shared.activity.idle_for();
                if idle.is_some_and(|d| d >= limit && (quiet || d >= limit + settings.send_timeout))
                {
                    break;
                }
            }
        }
    }
    quic.close(H3_NO_ERROR.into(), b"");
}
