//! One HTTP/3 connection: accepts request streams until the client goes, the connection idles
//! out, or the server drains (GOAWAY, in-flight requests finish, then the connection closes).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::atomic::Counter;
use bytes::Bytes;
use futures_util::future::{FutureExt, Shared as SharedFuture};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio_util::task::TaskTracker;

use super::exchange;
use crate::server::activity::Activity;
use crate::server::handler::{Handler, ListenerId};
use crate::server::DRAIN_IDLE;

/// How often an open connection looks at its clocks.
const TICK: Duration = Duration::from_millis(250);

/// Request streams of one connection whose heads are being read at once. h3 reads a head's
/// frame whole out of QUIC's flow control (up to twice `server.max_header_bytes`), so without a
/// bound a client could park about that much per stream it may open (100), on every connection,
/// for the header read timeout; the next stream is accepted as a head completes (HTTP/2's codec
/// reads one header block at a time).
const HEADS_AT_ONCE: usize = 16;
/// How long no stream data must have gone out before an idle connection closes (at least; four
/// round trips if longer).
const QUIET: Duration = Duration::from_millis(500);

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
    /// This connection's GOAWAY (the server's drain, or the connection's idle close): a request
    /// stream whose head is still coming then is rejected (H3_REQUEST_REJECTED: not processed,
    /// safe to send again), not waited for.
    pub going_away: watch::Receiver<bool>,
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
    /// The next request stream (boxed: the resolver is large beside the other events), with its
    /// place among the heads being read.
    Accepted(
        Result<Option<Box<Resolver>>, h3::error::ConnectionError>,
        OwnedSemaphorePermit,
    ),
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
    let (goaway_tx, goaway_rx) = watch::channel(false);
    let shared = Arc::new(Shared {
        handler: settings.handler.clone(),
        listener: settings.listener,
        activity: Activity::new(),
        send_timeout: settings.send_timeout,
        header_read: settings.header_read,
        requests: settings.handler.http_metrics().protocol.http3.clone(),
        going_away: goaway_rx,
        handshake,
    });
    let mut stop = settings.stop.clone();
    let mut draining = false;
    let mut goaway = *stop.borrow();
    // The client said GOAWAY and its last requests are done: no more are taken, and the
    // connection closes as an idle one does, once what it sent has gone out.
    let mut finished = false;
    let mut ticker = tokio::time::interval(TICK);
    // A stall (the GOAWAY write, a busy runtime) must not bring ticks back to back: two ticks
    // a moment apart would read as a quiet spell.
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_stream_frames = 0;
    let heads = Arc::new(Semaphore::new(HEADS_AT_ONCE));
    let mut quiet_since: Option<tokio::time::Instant> = None;
    loop {
        if goaway && !draining {
            draining = true;
            let _ = goaway_tx.send(true);
            // GOAWAY: the requests already accepted finish here; the client sends new ones on a
            // new connection. A client that takes no control-stream data is not waited on past
            // `DRAIN_IDLE`: the drain goes on without it (nothing more is sent on that stream).
            // The GOAWAY names the stream after the last accepted one, the first the client must
            // send again elsewhere (RFC 9114 §5.2); `shutdown(0)` named the last accepted itself,
            // which a client would count as not processed and might send twice.
            match tokio::time::timeout(DRAIN_IDLE, h3.shutdown(1)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "HTTP/3 GOAWAY not sent");
                    break;
                }
                Err(_) => tracing::debug!(%peer, "HTTP/3 GOAWAY not taken in time; draining on"),
            }
        }
        let event = tokio::select! {
            (accepted, place) = async {
                // Never closed: a place always comes.
                let place = heads.clone().acquire_owned().await.expect("open");
                (h3.accept().await, place)
            }, if !finished => {
                Event::Accepted(accepted.map(|r| r.map(Box::new)), place)
            }
            changed = stop.changed(), if !goaway => Event::Stop(changed.is_err() || *stop.borrow()),
            _ = ticker.tick() => Event::Tick,
        };
        match event {
            Event::Accepted(Ok(Some(resolver)), place) => {
                // Built in its box: the stream's future is large, and the task's set-up and
                // end would otherwise copy all of it a few times over.
                let shared = shared.clone();
                settings
                    .tracker
                    .spawn(crate::server::boxed_in_place(move || {
                        exchange::serve(resolver, place, shared, peer)
                    }));
            }
            // The client's GOAWAY, its requests done (their last bytes may still be going out).
            Event::Accepted(Ok(None), _) => finished = true,
            Event::Accepted(Err(e), _) => {
                if !e.is_h3_no_error() {
                    tracing::debug!(%peer, error = %e, "HTTP/3 connection ended with an error");
                }
                break;
            }
            Event::Stop(stopping) => goaway = stopping,
            Event::Tick => {
                // A finished response may still sit in QUIC's send buffer, and a close discards
                // it: the connection closes only once no stream data has gone out for a while
                // (nothing left to send or resend: longer than a few round trips, so a loss
                // probe's resend is waited for). Only stream frames count: a client that keeps
                // the line busy with PINGs draws nothing but acknowledgements.
                let now = tokio::time::Instant::now();
                let sent = quic.stats().frame_tx.stream;
                if std::mem::replace(&mut last_stream_frames, sent) != sent {
                    quiet_since = None;
                }
                let quiet_for = now - *quiet_since.get_or_insert(now);
                let quiet = quiet_for >= QUIET.max(quic.rtt() * 4);
                // Nothing in flight for the idle timeout, or for `DRAIN_IDLE` once draining (at
                // once once the client said GOAWAY); a tail still going out after that gets the
                // send timeout, as a response does.
                let limit = match (finished, draining) {
                    (true, _) => Duration::ZERO,
                    (false, true) => DRAIN_IDLE,
                    (false, false) => settings.idle,
                };
                let idle = shared.activity.idle_for();
                if idle.is_some_and(|d| d >= limit && (quiet || d >= limit + settings.send_timeout))
                {
                    if !draining && !finished {
                        // Idle: a GOAWAY first (RFC 9114 §5.2), so a request that crosses the
                        // close is refused as not processed (H3_REQUEST_REJECTED, safe to send
                        // again) rather than lost with the connection; the close follows once
                        // the GOAWAY has gone out and the line is quiet again. Heads still coming
                        // are rejected as on a drain (`Shared::going_away`). (QUIC's own idle
                        // timeout, the same length, may end a silent client's connection first,
                        // without a word, as both ends expect.)
                        goaway = true;
                        continue;
                    }
                    break;
                }
            }
        }
    }
    quic.close(H3_NO_ERROR.into(), b"");
}
