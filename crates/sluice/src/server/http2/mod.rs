//! HTTP/2 connections served by sluice itself over h2's frame codec (its frame reader and writer
//! and HPACK): the streams, flow control in both directions and the limits are kept here, and
//! each stream's handler and response body are polled inside the connection's own task, woken
//! per stream (`wake`), with no task, channel or lock of its own per stream. See
//! `docs/decisions/http2-server.md`.

mod recv;
mod request;
pub(crate) mod tunnel;
mod wake;

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use futures_util::Stream;
use h2::frame::{self, Frame, Headers, Pseudo, StreamId};
use h2::Reason;
use http::header::{self, HeaderMap};
use http::{Request, Response, StatusCode};
use prometheus_client::metrics::counter::Counter;
use slab::Slab;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::body::{BoxError, Incoming};
use recv::{NoBody, RecvBody, Shared};
use wake::{Ready, StreamWake};

/// How an HTTP/2 connection begins (RFC 9113 section 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// RFC 9113's initial window, before SETTINGS says otherwise.
const DEFAULT_WINDOW: i64 = 65_535;
/// A window may not exceed this (section 6.9.1).
const MAX_WINDOW: i64 = (1 << 31) - 1;
/// Control frames (SETTINGS and PING acknowledgements, resets) waiting to be written: past this
/// many, frames stop being read until the client reads what it was sent.
const MAX_CONTROL: usize = 64;
/// Streams the client may reset, or make this server reset by a malformed request, before their
/// response is done; each complete response earns one back, as far as `RESET_REFUNDS` allows. At
/// zero the connection is closed with `ENHANCE_YOUR_CALM` (the "rapid reset" attack,
/// CVE-2023-44487).
const RESET_BUDGET: u32 = 200;
/// Resets complete responses may earn back at once, and then per second: without a cap, a
/// client pairing each reset (a handler started, an upstream dialled, for nothing) with one cheap
/// request (a 404, a small cached object) never ran out, and started upstream requests at its
/// own pace past `max_concurrent_streams`.
const RESET_REFUNDS: f64 = 50.0;
const RESET_REFUNDS_PER_SEC: f64 = 5.0;
/// Responses under way a client may cancel without spending from `RESET_BUDGET` (a player's
/// seeks, channel switches, segments given up), at once and then per second: past that a cancel
/// is charged as a reset, so resetting every stream as soon as its head arrives (each may have
/// started a cache fill that goes on) still ends the connection.
const FREE_CANCELS: f64 = 100.0;
const FREE_CANCELS_PER_SEC: f64 = 2.0;
/// Request body bytes a client may send that nobody reads (the handler dropped the body): a
/// short rest is read (and checked) rather than cut; past this the stream's window is no longer
/// given back (the client stalls on it while the response is still going out; the connection's
/// window still is, so other streams go on), and once the response is complete the stream is
/// reset with `NO_ERROR`.
const MAX_UNREAD_AFTER_ANSWER: u64 = 1 << 20;
/// Streams this server reset that the client may not have heard of yet: frames for them are
/// dropped, not taken as errors. At least this many, and at least `max_concurrent_streams`:
/// `reset_parked` may reset every open stream at once, and request trailers then arriving on
/// one pushed out of a shorter list failed the whole connection (`STREAM_CLOSED`).
const RECENTLY_RESET: usize = 32;
/// The smallest window a request body gets when the connection's is larger (`stream_window`).
const MIN_STREAM_WINDOW: u32 = 64 * 1024;
/// What a parked response must send within a send timeout of `PARKED_PROGRESS_PER` for its
/// wait to count as over (`Parked`), less in proportion for a shorter timeout; and less again if
/// the client's initial stream window is smaller (a steady reader with a small window is not
/// reset), but never less than `PARKED_PROGRESS_MIN` (a client that sets its initial window to
/// one byte and opens it by one byte just inside every send timeout would make each byte
/// count). Bytes add up across window updates, so a steady reader gets there.
const PARKED_PROGRESS: i64 = 16 * 1024;
const PARKED_PROGRESS_PER: std::time::Duration = std::time::Duration::from_secs(60);
const PARKED_PROGRESS_MIN: i64 = 1024;
/// Streams removed while listed as blocked before those lists are pruned of them.
const STALE_BLOCKED: usize = 64;
/// A drain's PING (its acknowledgement ends the first GOAWAY's round trip), and how long the
/// final GOAWAY waits for that acknowledgement at most.
const DRAIN_PING: [u8; 8] = *b"sluice-d";
const DRAIN_ROUND_TRIP: std::time::Duration = std::time::Duration::from_secs(1);

/// What the listener's settings give this front end.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub max_concurrent_streams: u32,
    pub max_header_list_size: u32,
    /// The connection's window for all its request bodies together: what one connection can
    /// make this server hold of request bodies not yet read (at least 65535). Each body gets a
    /// quarter of it (`stream_window`).
    pub window: u32,
}

/// The window each request body gets on a connection whose window is `window`: a quarter of it,
/// at least `MIN_STREAM_WINDOW` (and all of it when it is smaller, HTTP/2's initial 65535). With
/// the whole connection's window per body, one body its handler does not read yet (waiting for
/// a busy upstream) took the window of every other body on the connection: no other upload
/// moved a byte until it was read, and behind a load balancer that multiplexes many users on
/// one connection, one stalled upload stalled them all.
fn stream_window(window: u32) -> u32 {
    (window / 4).max(MIN_STREAM_WINDOW).min(window)
}

/// Streams this server reset lately (`RECENTLY_RESET`), oldest first, with a set beside the
/// queue for the look-up every frame on a closed stream makes: the list holds up to
/// `max_concurrent_streams` entries, and a scan of it per frame cost that many comparisons.
#[derive(Default)]
struct RecentlyReset {
    order: VecDeque<u32>,
    set: HashSet<u32>,
}

impl RecentlyReset {
    /// Remembers `id`, forgetting the oldest past `keep` entries.
    fn push(&mut self, id: u32, keep: usize) {
        if !self.set.insert(id) {
            return;
        }
        if self.order.len() >= keep {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        self.order.push_back(id);
    }

    fn contains(&self, id: u32) -> bool {
        self.set.contains(&id)
    }
}

/// Why a connection ended badly.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("I/O: {0}")]
    Io(std::io::Error),
    #[error("the client broke the protocol: {0:?}")]
    Protocol(Reason),
    #[error("not an HTTP/2 connection preface")]
    Preface,
}

/// A stream's handler, then its response body.
enum Phase<F, B> {
    Handling(Pin<Box<F>>),
    Sending(Pin<Box<B>>),
    /// The response is all made (its last frames may still wait in `out`).
    Sent,
    /// The response is all written, and the client is still sending its body: kept to read and
    /// check the rest.
    Answered,
}

/// One open stream.
struct Slot<F, B> {
    id: StreamId,
    phase: Phase<F, B>,
    wake: Arc<StreamWake>,
    waker: Waker,
    /// What this server may still send on the stream.
    send_window: i64,
    /// What the client may still send on the stream, and what it read but was not yet given back.
    recv_window: i64,
    unreleased: u32,
    /// The request body's queue (`None`: the request ended with its head); what the handler
    /// reads of it is counted.
    body: Option<Arc<Shared>>,
    /// The client may still send on the stream.
    sending: bool,
    /// Flow-controlled bytes the stream received, and how many of them went back to the
    /// connection's window.
    received: u64,
    returned: u64,
    /// Bytes still to come by the request's `content-length`.
    remaining: Option<u64>,
    /// A HEAD request: the response's body is not sent.
    head: bool,
    /// A frame made but not yet written (windows, or the writer full).
    out: Option<Out>,
    /// Queued in `write_blocked` or `window_blocked` (once each).
    in_write_blocked: bool,
    in_window_blocked: bool,
    /// Request body bytes that arrived after its reader was gone.
    dropped: u64,
    /// How long the response has waited for a flow-control window (`reset_parked`).
    parked: Parked,
}

/// Since when a response has waited for a flow-control window (the stream's or the
/// connection's) without real progress, and what it sent since. Over once
/// `Connection::parked_progress` bytes went out (at the latest when `reset_parked` looks), the
/// parked chunk went out to its end, or both windows have that much room; not at any room at
/// all, else a client opening the window by one byte just inside every send timeout kept the
/// chunk and the stream for the connection's life.
#[derive(Default)]
struct Parked {
    /// `None` while the response has room or waits for anything else.
    since: Option<tokio::time::Instant>,
    sent: i64,
}

impl Parked {
    /// The response waits for a window: the clock starts unless it is running already.
    fn park(&mut self) {
        if self.since.is_none() {
            self.since = Some(crate::runtime::recent::recent());
            self.sent = 0;
        }
    }

    fn unpark(&mut self) {
        *self = Parked::default();
    }
}

/// An HTTP/2 connection over `io`, each request handed to `service`.
pub(crate) struct Connection<I, S, F, B> {
    state: State,
    codec: h2::Codec<I, Bytes>,
    service: S,
    limits: Limits,
    streams: Slab<Slot<F, B>>,
    /// Open streams by id (ids only grow, so this stays sorted).
    ids: VecDeque<(u32, usize)>,
    ready: Arc<Ready>,
    /// Streams to poll now, and a spare for the queue's swap.
    to_poll: Vec<usize>,
    /// Streams waiting for the writer to take frames, or for the connection's send window.
    write_blocked: Vec<usize>,
    window_blocked: Vec<usize>,
    control: VecDeque<Frame<Bytes>>,
    /// The highest stream id the client opened.
    last_id: u32,
    /// The window each request body gets (`stream_window`), announced as
    /// SETTINGS_INITIAL_WINDOW_SIZE.
    stream_window: u32,
    /// The connection's send window, the client's initial stream window, our receive window.
    send_window: i64,
    peer_initial: i64,
    recv_window: i64,
    /// Connection-window bytes read (or dropped) and not yet given back.
    unreleased: u32,
    resets: u32,
    /// Cancels of responses under way still free (`FREE_CANCELS`), as of `cancels_at`.
    free_cancels: f64,
    cancels_at: tokio::time::Instant,
    /// Resets complete responses may still earn back (`RESET_REFUNDS`), as of `refunds_at`.
    refunds: f64,
    refunds_at: tokio::time::Instant,
    recently_reset: RecentlyReset,
    /// What a parked response must send per send timeout (`PARKED_PROGRESS`), as of the last
    /// `reset_parked`.
    parked_per_limit: i64,
    /// GOAWAY sent: streams above this id are ignored, and the connection ends when the rest do.
    going_away: Option<u32>,
    /// The client said GOAWAY: no new streams will come.
    peer_going_away: bool,
    /// A drain's first GOAWAY (the highest stream id) is out: the final one goes when its PING
    /// comes back or this runs out.
    draining: Option<Pin<Box<tokio::time::Sleep>>>,
    /// A connection error: GOAWAY queued, the connection ends once it is written.
    failed: Option<Reason>,
    /// Requests refused for their body's framing (`count_framing_refusals`).
    framing_refused: Counter,
    /// Streams removed while listed in `write_blocked`, and in `window_blocked`, since that list
    /// was last emptied or pruned.
    stale_blocked: [usize; 2],
    /// When a stream's frame was last handed to the writer, or the writer last finished
    /// flushing one (`stuck_for`).
    last_sent: tokio::time::Instant,
    /// A stream's frame was handed to the writer since its last flush.
    unflushed: bool,
}

/// Which list of blocked streams.
#[derive(Clone, Copy)]
enum Blocked {
    Write,
    Window,
}

enum State {
    /// Reading the client's preface: this many bytes of it so far.
    Preface(usize),
    Open,
}

/// A stream's next frame. (Not boxed: a HEADERS frame is made once per response, and a box
/// would cost an allocation each time.)
#[allow(clippy::large_enum_variant)]
enum Out {
    /// The response head, or trailers.
    Head(Headers),
    /// Body bytes, and whether they end the stream.
    Data(Bytes, bool),
}

/// What a stream's turn ended with.
enum Turn {
    /// Waits for a wake, a window or the writer.
    Parked,
    /// The response is all written.
    Done,
    /// The response body failed: the stream is reset.
    Failed,
}

impl<I, S, F, B> Connection<I, S, F, B>
where
    I: AsyncRead + AsyncWrite + Unpin,
    S: FnMut(Request<Incoming>) -> F,
    F: Future<Output = Response<B>>,
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    /// A connection whose preface has not been read yet (`prefaced`: the caller read and checked
    /// it already).
    pub fn new(io: I, service: S, limits: Limits, prefaced: bool) -> Self {
        debug_assert!(
            i64::from(limits.window) >= DEFAULT_WINDOW,
            "checked by the config"
        );
        let mut codec = h2::Codec::new(io);
        // Response heads without the HPACK dynamic table, as hyper's server sends them here
        // (`vendor/h2-hpack-static.patch`): a server's fields mostly change per response.
        codec.encode_headers_without_table();
        codec.set_max_recv_header_list_size(limits.max_header_list_size as usize);
        let mut ours = frame::Settings::default();
        ours.set_max_concurrent_streams(Some(limits.max_concurrent_streams));
        let stream_window = stream_window(limits.window);
        ours.set_initial_window_size(Some(stream_window));
        ours.set_max_header_list_size(Some(limits.max_header_list_size));
        // RFC 8441: WebSocket over HTTP/2.
        ours.set_enable_connect_protocol(Some(1));
        let mut control = VecDeque::from([Frame::from(ours)]);
        let grow = limits.window.saturating_sub(DEFAULT_WINDOW as u32);
        if grow > 0 {
            control.push_back(frame::WindowUpdate::new(StreamId::zero(), grow).into());
        }
        Connection {
            state: if prefaced {
                State::Open
            } else {
                State::Preface(0)
            },
            codec,
            service,
            limits,
            streams: Slab::new(),
            ids: VecDeque::new(),
            ready: Arc::new(Ready::default()),
            to_poll: Vec::new(),
            write_blocked: Vec::new(),
            window_blocked: Vec::new(),
            control,
            last_id: 0,
            stream_window,
            send_window: DEFAULT_WINDOW,
            peer_initial: DEFAULT_WINDOW,
            recv_window: i64::from(limits.window),
            unreleased: 0,
            resets: RESET_BUDGET,
            free_cancels: FREE_CANCELS,
            cancels_at: crate::runtime::recent::recent(),
            refunds: RESET_REFUNDS,
            refunds_at: crate::runtime::recent::recent(),
            recently_reset: RecentlyReset::default(),
            parked_per_limit: PARKED_PROGRESS,
            going_away: None,
            peer_going_away: false,
            draining: None,
            failed: None,
            framing_refused: Counter::default(),
            stale_blocked: [0, 0],
            last_sent: crate::runtime::recent::recent(),
            unflushed: false,
        }
    }

    /// How long no stream's frame has gone out while a stream is still open (zero with none
    /// open): a stream whose client never opens its window stays open with nothing to show for
    /// it (`server::watch_over` drops such a connection once its close has begun). Control
    /// frames (acknowledgements, window updates) do not count: a client can draw them at will.
    pub fn stuck_for(&self) -> std::time::Duration {
        if self.streams.is_empty() {
            return std::time::Duration::ZERO;
        }
        crate::runtime::recent::since(self.last_sent)
    }

    /// Resets (`CANCEL`) every stream whose response has waited for a flow-control window for
    /// `limit` or longer, and drops what it held: its body (and with it the upstream fetch) and
    /// the data already taken from the body and parked for the window, which may be a view into
    /// a much larger buffer (a playlist slice holds the whole playlist). The send watch's
    /// release (`server::stall`) drops the body only; the parked chunk stayed as long as the
    /// connection did, so a client holding one stream's window at a byte while it kept the
    /// connection busy kept it all. A client reading slowly but steadily takes enough bytes
    /// (`PARKED_PROGRESS`, 16 KiB a minute) within `limit`, which starts the clock again; one
    /// opening its window a byte at a time does not. Returns how many streams were reset; their
    /// RST_STREAM frames go out on the connection's next poll. Not charged to the reset budget:
    /// this server chose to reset them.
    pub fn reset_parked(&mut self, limit: std::time::Duration) -> usize {
        if self.failed.is_some() {
            return 0;
        }
        let scaled = PARKED_PROGRESS as u128 * limit.as_millis() / PARKED_PROGRESS_PER.as_millis();
        self.parked_per_limit =
            i64::try_from(scaled).map_or(PARKED_PROGRESS, |n| n.min(PARKED_PROGRESS));
        let progress = self.parked_progress();
        let now = crate::runtime::recent::recent();
        let mut parked: Vec<(usize, u32)> = Vec::new();
        for (key, slot) in self.streams.iter_mut() {
            let Some(since) = slot.parked.since else {
                continue;
            };
            if now.saturating_duration_since(since) < limit {
                continue;
            }
            if slot.parked.sent >= progress {
                // Still parked, but it took enough meanwhile: a slow reader, whose next
                // timeout starts now.
                slot.parked = Parked {
                    since: Some(now),
                    sent: 0,
                };
            } else {
                parked.push((key, u32::from(slot.id)));
            }
        }
        for &(key, id) in &parked {
            tracing::debug!(stream = id, "HTTP/2 stream parked on its window: reset");
            self.remove(key);
            self.reset(id, Reason::CANCEL);
        }
        parked.len()
    }

    /// Where requests refused for their body's framing (a bad or conflicting `content-length`, a
    /// body longer or shorter than it) are counted; none by default.
    pub fn count_framing_refusals(mut self, counter: Counter) -> Self {
        self.framing_refused = counter;
        self
    }

    /// Stops taking new streams and ends the connection once the open ones are done, in RFC 9113
    /// §6.8's two steps: a GOAWAY with the highest stream id and a PING, so requests the client
    /// sent before it heard of the drain are still taken, then, once the PING comes back (or
    /// after `DRAIN_ROUND_TRIP`), the GOAWAY with the last stream id opened. Streams above it
    /// were not processed: the client may send them again elsewhere.
    pub fn graceful_shutdown(&mut self) {
        if self.going_away.is_some() || self.draining.is_some() || self.failed.is_some() {
            // Going already, or failed: its GOAWAY (with the error) is the last word.
            return;
        }
        if matches!(self.state, State::Preface(_)) {
            // No stream can be in flight yet.
            return self.go_away();
        }
        self.control
            .push_back(frame::GoAway::new(StreamId::MAX, Reason::NO_ERROR).into());
        self.control.push_back(frame::Ping::new(DRAIN_PING).into());
        self.draining = Some(Box::pin(tokio::time::sleep(DRAIN_ROUND_TRIP)));
    }

    /// The drain's final GOAWAY: no stream above the last one opened is taken from here on.
    fn go_away(&mut self) {
        self.draining = None;
        if self.going_away.is_none() && self.failed.is_none() {
            self.going_away = Some(self.last_id);
            self.control.push_back(
                frame::GoAway::new(StreamId::from(self.last_id), Reason::NO_ERROR).into(),
            );
            // Streams already answered wait only for the rest of a body nobody needs: the
            // client is asked to stop sending it (else a client that never ends one would hold
            // the connection open).
            let answered: Vec<(usize, u32)> = self
                .streams
                .iter()
                .filter(|(_, slot)| matches!(slot.phase, Phase::Answered))
                .map(|(key, slot)| (key, u32::from(slot.id)))
                .collect();
            for (key, id) in answered {
                self.remove(key);
                self.reset(id, Reason::NO_ERROR);
            }
        }
    }

    fn fail(&mut self, reason: Reason) {
        if self.failed.is_some() {
            return;
        }
        tracing::debug!(?reason, "HTTP/2 connection error");
        self.failed = Some(reason);
        self.draining = None;
        self.control.clear();
        self.control
            .push_back(frame::GoAway::new(StreamId::from(self.last_id), reason).into());
        for slot in self.streams.drain() {
            if let Some(body) = &slot.body {
                body.fail(reason);
            }
        }
        self.ids.clear();
    }

    fn slot_of(&self, id: u32) -> Option<usize> {
        self.ids
            .binary_search_by_key(&id, |(i, _)| *i)
            .ok()
            .map(|at| self.ids[at].1)
    }

    fn reset(&mut self, id: u32, reason: Reason) {
        self.control
            .push_back(frame::Reset::new(StreamId::from(id), reason).into());
        let keep = RECENTLY_RESET.max(self.limits.max_concurrent_streams as usize);
        self.recently_reset.push(id, keep);
    }

    /// A frame on stream `id` that no stream the client may open carries: an even id (the
    /// server's, and this one never pushes), or one above every stream opened that this server
    /// did not reset either (RFC 9113 section 5.1: a frame other than HEADERS or PRIORITY on an
    /// idle stream is a connection error). A stream above `last_id` may have been reset for its
    /// frame (`recv_error`), and frames the client sent on it before it heard are taken.
    fn never_opened(&self, id: u32) -> bool {
        id.is_multiple_of(2) || (id > self.last_id && !self.recently_reset.contains(id))
    }

    /// RFC 9113 section 10.5.1: a 431 for a header section past the limit, then the stream is
    /// closed either way (reset with `NO_ERROR` if the client has more to send).
    fn too_large(&mut self, id: u32, end_stream: bool) {
        let mut head = Headers::new(
            StreamId::from(id),
            Pseudo::response(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE),
            HeaderMap::new(),
        );
        head.set_end_stream();
        self.control.push_back(head.into());
        if !end_stream {
            self.reset(id, Reason::NO_ERROR);
        }
    }

    /// Whether a client's cancel of a response under way is still free (`FREE_CANCELS`).
    fn free_cancel(&mut self) -> bool {
        let now = crate::runtime::recent::recent();
        let secs = now.saturating_duration_since(self.cancels_at).as_secs_f64();
        self.cancels_at = now;
        self.free_cancels = (self.free_cancels + secs * FREE_CANCELS_PER_SEC).min(FREE_CANCELS);
        let free = self.free_cancels >= 1.0;
        if free {
            self.free_cancels -= 1.0;
        }
        free
    }

    /// A complete response earns one reset back, while `RESET_REFUNDS` lasts.
    fn earn_reset(&mut self) {
        if self.resets == RESET_BUDGET {
            return;
        }
        let now = crate::runtime::recent::recent();
        let secs = now.saturating_duration_since(self.refunds_at).as_secs_f64();
        self.refunds_at = now;
        self.refunds = (self.refunds + secs * RESET_REFUNDS_PER_SEC).min(RESET_REFUNDS);
        if self.refunds >= 1.0 {
            self.refunds -= 1.0;
            self.resets += 1;
        }
    }

    /// A stream closed before its response was done, by the client or for its mistake.
    fn spend_reset(&mut self) {
        self.resets = self.resets.saturating_sub(1);
        if self.resets == 0 {
            self.fail(Reason::ENHANCE_YOUR_CALM);
        }
    }

    /// Removes a stream; its handler and body are dropped (and with them any upstream fetch).
    fn remove(&mut self, key: usize) {
        let slot = self.streams.remove(key);
        if let Ok(at) = self.ids.binary_search_by_key(&slot.id.into(), |(i, _)| *i) {
            self.ids.remove(at);
        }
        if let Some(body) = &slot.body {
            body.fail(Reason::CANCEL);
        }
        // What the stream took of the connection's window and did not give back yet, read or
        // not, no longer counts against the connection.
        self.unreleased += slot.received.saturating_sub(slot.returned) as u32;
        self.stale_blocked[0] += usize::from(slot.in_write_blocked);
        self.stale_blocked[1] += usize::from(slot.in_window_blocked);
        if self.stale_blocked.iter().any(|&n| n > STALE_BLOCKED) {
            self.prune_blocked();
        }
    }

    /// Queues `key` for a turn from the connection's own task, unless it is queued already: a
    /// stream gets one turn however many frames came for it meanwhile.
    fn queue(&mut self, key: usize) {
        if self.streams.get(key).is_some_and(|s| s.wake.mark_queued()) {
            self.to_poll.push(key);
        }
    }

    /// Every stream waiting for the writer (`Write`) or the connection's window (`Window`)
    /// gets a turn; one still blocked in it queues itself again (once: its flag says so).
    fn unblock(&mut self, which: Blocked) {
        let (list, stale) = match which {
            Blocked::Write => (&mut self.write_blocked, &mut self.stale_blocked[0]),
            Blocked::Window => (&mut self.window_blocked, &mut self.stale_blocked[1]),
        };
        for &key in list.iter() {
            if let Some(slot) = self.streams.get_mut(key) {
                match which {
                    Blocked::Write => slot.in_write_blocked = false,
                    Blocked::Window => slot.in_window_blocked = false,
                }
            }
        }
        self.to_poll.append(list);
        *stale = 0;
    }

    /// Drops from the blocked lists the keys of streams removed since they were queued there
    /// (and so any key listed twice after its slot was reused): the lists stay as long as the
    /// streams blocked now.
    fn prune_blocked(&mut self) {
        let streams = &self.streams;
        for (list, window) in [
            (&mut self.write_blocked, false),
            (&mut self.window_blocked, true),
        ] {
            list.retain(|&key| {
                streams.get(key).is_some_and(|s| {
                    if window {
                        s.in_window_blocked
                    } else {
                        s.in_write_blocked
                    }
                })
            });
            list.sort_unstable();
            list.dedup();
        }
        self.stale_blocked = [0, 0];
    }

    /// One frame from the client.
    fn recv_frame(&mut self, frame: Frame) {
        match frame {
            Frame::Headers(h) => self.recv_headers(h),
            Frame::Data(d) => self.recv_data(d),
            Frame::WindowUpdate(w) => {
                let inc = i64::from(w.size_increment());
                let id = u32::from(w.stream_id());
                if id == 0 {
                    self.send_window += inc;
                    if self.send_window > MAX_WINDOW {
                        return self.fail(Reason::FLOW_CONTROL_ERROR);
                    }
                    self.unblock(Blocked::Window);
                } else if let Some(key) = self.slot_of(id) {
                    let slot = &mut self.streams[key];
                    slot.send_window += inc;
                    if slot.send_window > MAX_WINDOW {
                        // A reset the client provoked: spent from the same budget as its own
                        // (an open stream reset this way for nothing is the "MadeYouReset"
                        // attack, CVE-2025-8671).
                        let done = matches!(slot.phase, Phase::Answered);
                        self.remove(key);
                        self.reset(id, Reason::FLOW_CONTROL_ERROR);
                        if !done {
                            self.spend_reset();
                        }
                        return;
                    }
                    self.queue(key);
                } else if self.never_opened(id) {
                    self.fail(Reason::PROTOCOL_ERROR);
                }
            }
            Frame::Settings(s) => {
                if s.is_ack() {
                    return;
                }
                if let Some(w) = s.initial_window_size() {
                    let delta = i64::from(w) - self.peer_initial;
                    self.peer_initial = i64::from(w);
                    for (key, slot) in self.streams.iter_mut() {
                        slot.send_window += delta;
                        if slot.send_window > MAX_WINDOW {
                            return self.fail(Reason::FLOW_CONTROL_ERROR);
                        }
                        if delta > 0 && slot.wake.mark_queued() {
                            self.to_poll.push(key);
                        }
                    }
                }
                if let Some(size) = s.max_frame_size() {
                    self.codec.set_max_send_frame_size(size as usize);
                }
                if let Some(size) = s.header_table_size() {
                    self.codec.set_send_header_table_size(size as usize);
                }
                self.control.push_back(frame::Settings::ack().into());
            }
            Frame::Ping(p) => {
                if !p.is_ack() {
                    self.control
                        .push_back(frame::Ping::pong(p.into_payload()).into());
                } else if self.draining.is_some() && *p.payload() == DRAIN_PING {
                    self.go_away();
                }
            }
            Frame::Reset(r) => {
                let id = u32::from(r.stream_id());
                if id == 0 {
                    return self.fail(Reason::PROTOCOL_ERROR);
                }
                if let Some(key) = self.slot_of(id) {
                    // A stream reset before its handler answered is charged: that is what the
                    // rapid reset attack costs a server (a handler started for nothing). A
                    // client cancelling a response under way (a player's seek, a channel
                    // switch, a segment given up) got its answer: such cancels are free up to
                    // `FREE_CANCELS` (charging each would close a long connection after enough
                    // of them, with everything on it), and charged past it.
                    let phase = &self.streams[key].phase;
                    let early = matches!(phase, Phase::Handling(_));
                    let under_way = matches!(phase, Phase::Sending(_));
                    self.remove(key);
                    if early || (under_way && !self.free_cancel()) {
                        self.spend_reset();
                    }
                } else if self.never_opened(id) {
                    self.fail(Reason::PROTOCOL_ERROR);
                }
            }
            Frame::GoAway(_) => self.peer_going_away = true,
            Frame::Priority(_) => {}
            Frame::PushPromise(_) => self.fail(Reason::PROTOCOL_ERROR),
        }
    }

    fn recv_headers(&mut self, h: Headers) {
        let id = u32::from(h.stream_id());
        if id % 2 == 0 {
            return self.fail(Reason::PROTOCOL_ERROR);
        }
        if let Some(key) = self.slot_of(id) {
            return self.recv_trailers(key, h);
        }
        if id <= self.last_id {
            let unopened = self.going_away.is_some_and(|last| id > last);
            if !self.recently_reset.contains(id) && !unopened {
                self.fail(Reason::STREAM_CLOSED);
            }
            return;
        }
        self.last_id = id;
        if self.going_away.is_some_and(|last| id > last) || self.failed.is_some() {
            return;
        }
        if self.streams.len() >= self.limits.max_concurrent_streams as usize {
            return self.reset(id, Reason::REFUSED_STREAM);
        }
        let end_stream = h.is_end_stream();
        if h.is_over_size() {
            self.too_large(id, end_stream);
            return self.spend_reset();
        }
        let (req, framing) = match request::build(h, true) {
            Ok(built) => built,
            Err(request::Malformed { why, framing }) => {
                if framing {
                    self.framing_refused.inc();
                }
                tracing::debug!(stream = id, why, "malformed HTTP/2 request");
                self.reset(id, Reason::PROTOCOL_ERROR);
                return self.spend_reset();
            }
        };
        let entry = self.streams.vacant_entry();
        let key = entry.key();
        let wake = StreamWake::new(key, self.ready.clone());
        let waker = Waker::from(wake.clone());
        let (recv, req) = if end_stream {
            (None, req.map(|()| Incoming::adapted(NoBody)))
        } else {
            let shared = Shared::new(framing.length, framing.expects_continue);
            let body = RecvBody::new(shared.clone(), waker.clone());
            (Some(shared), req.map(|()| Incoming::adapted(body)))
        };
        let req = if framing.connect {
            tunnel_request(req)
        } else {
            req
        };
        let fut = (self.service)(req);
        entry.insert(Slot {
            id: StreamId::from(id),
            phase: Phase::Handling(Box::pin(fut)),
            wake,
            waker,
            send_window: self.peer_initial,
            recv_window: i64::from(self.stream_window),
            unreleased: 0,
            sending: recv.is_some(),
            body: recv,
            received: 0,
            returned: 0,
            remaining: framing.length,
            head: framing.head,
            out: None,
            in_write_blocked: false,
            in_window_blocked: false,
            dropped: 0,
            parked: Parked::default(),
        });
        self.ids.push_back((id, key));
        self.to_poll.push(key);
    }

    fn recv_trailers(&mut self, key: usize, h: Headers) {
        let id = u32::from(h.stream_id());
        let slot = &mut self.streams[key];
        let Some(recv) = slot.body.clone().filter(|_| slot.sending) else {
            // The client already ended its side.
            self.remove(key);
            self.reset(id, Reason::STREAM_CLOSED);
            return self.spend_reset();
        };
        if h.is_over_size() {
            // Past `max_header_bytes`: the codec kept only the fields up to it, and a shorter
            // trailer section must not be passed on as the whole one. The handler is dropped
            // (and with it the upstream request, its body cut); a 431 as for a head that size
            // (RFC 9113 section 10.5.1) if no response has begun, else the stream is reset.
            let answered = !matches!(slot.phase, Phase::Handling(_));
            let end_stream = h.is_end_stream();
            drop(recv);
            self.remove(key);
            if answered {
                self.reset(id, Reason::CANCEL);
            } else {
                self.too_large(id, end_stream);
            }
            return self.spend_reset();
        }
        let short = slot.remaining.is_some_and(|n| n > 0);
        let h_end = h.is_end_stream();
        let (pseudo, fields) = h.into_parts();
        let has_pseudo = pseudo.method.is_some()
            || pseudo.scheme.is_some()
            || pseudo.authority.is_some()
            || pseudo.path.is_some()
            || pseudo.protocol.is_some()
            || pseudo.status.is_some();
        // Trailers end the stream, carry no pseudo-field, and follow the whole body.
        if short || has_pseudo || !h_end {
            if short {
                self.framing_refused.inc();
            }
            recv.fail(Reason::PROTOCOL_ERROR);
            self.remove(key);
            self.reset(id, Reason::PROTOCOL_ERROR);
            return self.spend_reset();
        }
        recv.end(Some(fields));
        slot.sending = false;
        if matches!(slot.phase, Phase::Answered) {
            return self.remove(key);
        }
        self.to_poll.push(key);
    }

    fn recv_data(&mut self, d: frame::Data) {
        let id = u32::from(d.stream_id());
        let len = d.flow_controlled_len();
        self.recv_window -= len as i64;
        if self.recv_window < 0 {
            return self.fail(Reason::FLOW_CONTROL_ERROR);
        }
        let end = d.is_end_stream();
        let Some(key) = self.slot_of(id) else {
            // A stream already closed: the bytes go back to the connection's window at once.
            self.unreleased += len as u32;
            if self.never_opened(id) {
                self.fail(Reason::PROTOCOL_ERROR);
            } else if !self.recently_reset.contains(id)
                && self.going_away.is_none_or(|last| id <= last)
            {
                // Closed by both sides; data after this server's reset (or on a stream its
                // GOAWAY left unopened) is what the client sent before it heard of it. Not
                // remembered as a reset: more data on it is answered the same way, and
                // remembering each such id pushed the streams this server did reset out of
                // `recently_reset` (their trailers then ended the connection).
                self.control
                    .push_back(frame::Reset::new(StreamId::from(id), Reason::STREAM_CLOSED).into());
            }
            return;
        };
        let slot = &mut self.streams[key];
        let payload = d.into_payload();
        let padding = len - payload.len();
        slot.received += len as u64;
        slot.recv_window -= len as i64;
        let over = slot.recv_window < 0;
        let too_long = slot.remaining.is_some_and(|n| (payload.len() as u64) > n);
        if let Some(n) = slot.remaining.as_mut() {
            *n = n.saturating_sub(payload.len() as u64);
        }
        let short_at_end = end && slot.remaining.is_some_and(|n| n > 0);
        let Some(recv) = slot.body.clone().filter(|_| slot.sending) else {
            self.remove(key);
            self.reset(id, Reason::STREAM_CLOSED);
            return self.spend_reset();
        };
        if over || too_long || short_at_end {
            self.remove(key);
            let reason = if over {
                Reason::FLOW_CONTROL_ERROR
            } else {
                // A body longer or shorter than its `content-length`.
                self.framing_refused.inc();
                Reason::PROTOCOL_ERROR
            };
            self.reset(id, reason);
            return self.spend_reset();
        }
        if len == 0 && !end {
            // Nothing to pass on and no window spent: not worth the stream's turn (a flood of
            // them costs what any other small frame costs to read).
            return;
        }
        // Padding is never read: given back at once.
        let mut back = padding as u32;
        // Given back to the connection's window only.
        let mut connection_only = 0;
        let n = payload.len() as u32;
        if !recv.push(payload) {
            // Nobody reads it: its window goes back at once, the stream's only up to
            // `MAX_UNREAD_AFTER_ANSWER` (past it the client stalls on the stream's window).
            slot.dropped += u64::from(n);
            if slot.dropped <= MAX_UNREAD_AFTER_ANSWER {
                back += n;
            } else {
                connection_only = n;
            }
        }
        slot.unreleased += back;
        slot.returned += u64::from(back + connection_only);
        self.unreleased += back + connection_only;
        if end {
            recv.end(None);
            slot.sending = false;
        }
        if matches!(slot.phase, Phase::Answered) {
            if !slot.sending {
                return self.remove(key);
            }
            if slot.dropped > MAX_UNREAD_AFTER_ANSWER {
                // Ask the client to stop sending a body the answer did not wait for (RFC 9113
                // section 8.1).
                self.remove(key);
                return self.reset(id, Reason::NO_ERROR);
            }
        }
        self.queue(key);
    }

    /// An error the codec found in what the client sent.
    fn recv_error(&mut self, e: h2::proto::Error) -> Result<(), Error> {
        match e {
            h2::proto::Error::Reset(id, reason, _) => {
                // A stream error in a HEADERS or CONTINUATION frame (which opens the stream),
                // or in a PRIORITY frame, which any stream may get, an idle one too, and which
                // leaves it idle (RFC 9113 section 5.3.1): one depending on itself. The codec
                // does not say which, so `last_id` stays: taken from a PRIORITY frame for an
                // idle stream far ahead, it closed every stream below it (the client's next
                // HEADERS ended the connection, STREAM_CLOSED). A stream above it is
                // remembered as reset instead (frames following its HEADERS are taken), one
                // with an even id not at all (its frames end the connection).
                let id = u32::from(id);
                if let Some(key) = self.slot_of(id) {
                    self.remove(key);
                }
                if id.is_multiple_of(2) {
                    self.control
                        .push_back(frame::Reset::new(StreamId::from(id), reason).into());
                } else {
                    self.reset(id, reason);
                }
                self.spend_reset();
                Ok(())
            }
            h2::proto::Error::GoAway(_, reason, _) => {
                self.fail(reason);
                Ok(())
            }
            h2::proto::Error::Io(kind, msg) => Err(Error::Io(std::io::Error::new(
                kind,
                msg.unwrap_or_default(),
            ))),
        }
    }

    /// What a parked response must send, or both windows must offer, before its wait is over
    /// (`PARKED_PROGRESS`).
    fn parked_progress(&self) -> i64 {
        self.parked_per_limit
            .min(self.peer_initial)
            .max(PARKED_PROGRESS_MIN)
    }

    /// Gives one stream its turn: its handler, then its body, as far as windows and the writer
    /// allow.
    fn turn(&mut self, key: usize, cx: &mut Context<'_>) -> Result<Turn, Error> {
        let progress = self.parked_progress();
        let Some(slot) = self.streams.get_mut(key) else {
            return Ok(Turn::Parked);
        };
        slot.wake.polling();
        // Window the handler gave back by reading the request body.
        if let Some(body) = &slot.body {
            if slot.out.is_none()
                && matches!(slot.phase, Phase::Handling(_))
                && body.take_continue()
            {
                slot.out = Some(Out::Head(Headers::new(
                    slot.id,
                    Pseudo::response(StatusCode::CONTINUE),
                    HeaderMap::new(),
                )));
            }
            let (n, _) = body.take_consumed();
            slot.unreleased += n as u32;
            slot.returned += n as u64;
            self.unreleased += n as u32;
            if slot.sending && slot.unreleased >= self.stream_window / 4 {
                let n = std::mem::take(&mut slot.unreleased);
                slot.recv_window += i64::from(n);
                self.control
                    .push_back(frame::WindowUpdate::new(slot.id, n).into());
            }
        }
        let mut scx = Context::from_waker(&slot.waker);
        loop {
            match slot.out.take() {
                None => {}
                Some(Out::Head(head)) => {
                    match self.codec.poll_ready(cx) {
                        Poll::Ready(Ok(())) => {}
                        Poll::Ready(Err(e)) => return Err(Error::Io(e)),
                        Poll::Pending => {
                            slot.out = Some(Out::Head(head));
                            if !std::mem::replace(&mut slot.in_write_blocked, true) {
                                self.write_blocked.push(key);
                            }
                            return Ok(Turn::Parked);
                        }
                    }
                    let end = head.is_end_stream();
                    self.codec.buffer(head.into()).map_err(send_error)?;
                    self.last_sent = crate::runtime::recent::recent();
                    self.unflushed = true;
                    if end {
                        return Ok(Turn::Done);
                    }
                }
                Some(Out::Data(mut data, end)) => {
                    let room = slot
                        .send_window
                        .min(self.send_window)
                        .min(self.codec.max_send_frame_size() as i64);
                    if !data.is_empty() && room <= 0 {
                        slot.out = Some(Out::Data(data, end));
                        slot.parked.park();
                        if self.send_window <= 0
                            && !std::mem::replace(&mut slot.in_window_blocked, true)
                        {
                            self.window_blocked.push(key);
                        }
                        return Ok(Turn::Parked);
                    }
                    match self.codec.poll_ready(cx) {
                        Poll::Ready(Ok(())) => {}
                        Poll::Ready(Err(e)) => return Err(Error::Io(e)),
                        Poll::Pending => {
                            slot.out = Some(Out::Data(data, end));
                            if !std::mem::replace(&mut slot.in_write_blocked, true) {
                                self.write_blocked.push(key);
                            }
                            return Ok(Turn::Parked);
                        }
                    }
                    let n = data.len().min(room.max(0) as usize);
                    let chunk = data.split_to(n);
                    let last = end && data.is_empty();
                    let mut frame = frame::Data::new(slot.id, chunk);
                    frame.set_end_stream(last);
                    self.codec.buffer(frame.into()).map_err(send_error)?;
                    self.last_sent = crate::runtime::recent::recent();
                    self.unflushed = true;
                    slot.send_window -= n as i64;
                    self.send_window -= n as i64;
                    if slot.parked.since.is_some() {
                        // Some room is not yet progress: one byte per send timeout would keep
                        // the chunk for ever. Enough bytes, or the chunk's end, are.
                        slot.parked.sent += n as i64;
                        if slot.parked.sent >= progress || data.is_empty() {
                            slot.parked.unpark();
                        }
                    }
                    if last {
                        return Ok(Turn::Done);
                    }
                    if !data.is_empty() {
                        slot.out = Some(Out::Data(data, end));
                        continue;
                    }
                }
            }
            match &mut slot.phase {
                Phase::Handling(fut) => {
                    let Poll::Ready(resp) = fut.as_mut().poll(&mut scx) else {
                        return Ok(Turn::Parked);
                    };
                    let (mut parts, body) = resp.into_parts();
                    strip_connection_fields(&mut parts.headers);
                    let mut head =
                        Headers::new(slot.id, Pseudo::response(parts.status), parts.headers);
                    if let Some(lines) = parts.extensions.remove::<h2::ext::EncodedFields>() {
                        head.set_encoded_fields(lines.0);
                    }
                    if slot.head || body.is_end_stream() {
                        head.set_end_stream();
                        slot.phase = Phase::Sent;
                    } else {
                        slot.phase = Phase::Sending(Box::pin(body));
                    }
                    slot.out = Some(Out::Head(head));
                }
                Phase::Sending(body) => {
                    if slot.send_window <= 0 {
                        slot.parked.park();
                        return Ok(Turn::Parked);
                    }
                    if self.send_window <= 0 {
                        slot.parked.park();
                        if !std::mem::replace(&mut slot.in_window_blocked, true) {
                            self.window_blocked.push(key);
                        }
                        return Ok(Turn::Parked);
                    }
                    // Real room in both windows: whatever the body does next (a live stream
                    // may have nothing for a while), the client is reading. A byte or two of
                    // room is not (the clock runs on until enough goes out).
                    if slot.send_window >= progress && self.send_window >= progress {
                        slot.parked.unpark();
                    }
                    match body.as_mut().poll_frame(&mut scx) {
                        Poll::Pending => return Ok(Turn::Parked),
                        Poll::Ready(None) => {
                            slot.phase = Phase::Sent;
                            slot.out = Some(Out::Data(Bytes::new(), true));
                        }
                        Poll::Ready(Some(Err(e))) => {
                            let e: BoxError = e.into();
                            tracing::debug!(error = %e, "HTTP/2 response body failed");
                            return Ok(Turn::Failed);
                        }
                        Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                            Ok(data) => {
                                let end = body.is_end_stream();
                                if end {
                                    slot.phase = Phase::Sent;
                                }
                                if !data.is_empty() || end {
                                    slot.out = Some(Out::Data(data, end));
                                }
                            }
                            Err(frame) => {
                                if let Ok(mut trailers) = frame.into_trailers() {
                                    sluice_http::hop::strip_connection_specific_trailers(
                                        &mut trailers,
                                    );
                                    let mut t = Headers::trailers(slot.id, trailers);
                                    t.set_end_stream();
                                    slot.phase = Phase::Sent;
                                    slot.out = Some(Out::Head(t));
                                }
                            }
                        },
                    }
                }
                // Only reached with nothing left to write.
                Phase::Sent => return Ok(Turn::Done),
                Phase::Answered => return Ok(Turn::Parked),
            }
        }
    }

    /// A stream's response is done (or failed): the stream is closed and removed.
    fn finish(&mut self, key: usize, turn: Turn) {
        if let Turn::Parked = turn {
            return;
        }
        let id = u32::from(self.streams[key].id);
        let client_sending = self.streams[key].sending;
        match turn {
            Turn::Parked => {}
            Turn::Done => {
                self.earn_reset();
                if client_sending
                    && self.going_away.is_none()
                    && self.streams[key].dropped <= MAX_UNREAD_AFTER_ANSWER
                {
                    // The answer is out before the request's end: the rest of its body is
                    // read and checked, then dropped (`recv_data`), unless there is much of it
                    // (then the client may already be stalled on the stream's window) or the
                    // connection is draining (`graceful_shutdown`).
                    self.streams[key].phase = Phase::Answered;
                    return;
                }
                if client_sending {
                    self.reset(id, Reason::NO_ERROR);
                }
            }
            Turn::Failed => self.reset(id, Reason::INTERNAL_ERROR),
        }
        self.remove(key);
    }

    /// Polls every stream that was woken or unblocked.
    fn run_streams(&mut self, cx: &mut Context<'_>) -> Result<(), Error> {
        if !self.write_blocked.is_empty()
            && matches!(self.codec.poll_ready(cx), Poll::Ready(Ok(())))
        {
            self.unblock(Blocked::Write);
        }
        self.ready.take(&mut self.to_poll);
        while !self.to_poll.is_empty() {
            let mut batch = std::mem::take(&mut self.to_poll);
            for key in batch.drain(..) {
                if self.failed.is_some() {
                    break;
                }
                let turn = self.turn(key, cx)?;
                self.finish(key, turn);
            }
            // Reuse the allocation unless a turn queued more streams meanwhile.
            if self.to_poll.is_empty() {
                self.to_poll = batch;
            } else {
                self.to_poll.append(&mut batch);
            }
            self.ready.take(&mut self.to_poll);
        }
        Ok(())
    }

    /// Reads the client's preface; `Ready(Ok)` once it is all here and right.
    fn poll_preface(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        while let State::Preface(got) = self.state {
            let mut buf = [0u8; 24];
            let mut read = ReadBuf::new(&mut buf[..PREFACE.len() - got]);
            match Pin::new(self.codec.get_mut()).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(Error::Io(e))),
                Poll::Ready(Ok(())) => {
                    let n = read.filled().len();
                    if n == 0 || read.filled() != &PREFACE[got..got + n] {
                        return Poll::Ready(Err(Error::Preface));
                    }
                    self.state = if got + n == PREFACE.len() {
                        State::Open
                    } else {
                        State::Preface(got + n)
                    };
                }
            }
        }
        Poll::Ready(Ok(()))
    }

    /// With no stream open and everything written, gives back the buffers an idle connection
    /// does not need (the codec's read and write buffers, the queues); each is allocated again
    /// when next used.
    fn release_idle_memory(&mut self) {
        self.codec.release_idle_buffers();
        if self.streams.capacity() != 0 {
            self.streams = Slab::new();
        }
        if self.control.capacity() != 0 {
            self.control = VecDeque::new();
        }
        if self.ids.capacity() != 0 {
            self.ids = VecDeque::new();
        }
        for list in [
            &mut self.to_poll,
            &mut self.write_blocked,
            &mut self.window_blocked,
        ] {
            if list.capacity() != 0 {
                *list = Vec::new();
            }
        }
    }

    /// Writes queued control frames and the connection's window update, then flushes.
    fn write_out(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        if self.unreleased >= self.limits.window / 4 && self.failed.is_none() {
            let n = std::mem::take(&mut self.unreleased);
            self.recv_window += i64::from(n);
            self.control
                .push_back(frame::WindowUpdate::new(StreamId::zero(), n).into());
        }
        std::task::ready!(self.write_control(cx))?;
        let flushed = self.codec.flush(cx).map_err(Error::Io);
        // A frame that took long to leave (a client reading slowly) is progress when it is out.
        if matches!(flushed, Poll::Ready(Ok(()))) && std::mem::take(&mut self.unflushed) {
            self.last_sent = crate::runtime::recent::recent();
        }
        flushed
    }

    /// Hands the queued control frames to the writer.
    fn write_control(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        while !self.control.is_empty() {
            match self.codec.poll_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(Error::Io(e))),
                Poll::Pending => return Poll::Pending,
            }
            if let Some(f) = self.control.pop_front() {
                self.codec.buffer(f).map_err(send_error)?;
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<I, S, F, B> Future for Connection<I, S, F, B>
where
    I: AsyncRead + AsyncWrite + Unpin,
    S: FnMut(Request<Incoming>) -> F + Unpin,
    F: Future<Output = Response<B>>,
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Output = Result<(), Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        let this = self.get_mut();
        if let State::Preface(_) = this.state {
            if this.going_away.is_some() {
                return Poll::Ready(Ok(()));
            }
            std::task::ready!(this.poll_preface(cx))?;
        }
        this.ready.register(cx.waker());
        loop {
            // Frames in, while there is room to answer them.
            let mut stopped_full = false;
            let mut ended = false;
            while this.failed.is_none() {
                if this.control.len() >= MAX_CONTROL {
                    stopped_full = true;
                    break;
                }
                match Pin::new(&mut this.codec).poll_next(cx) {
                    Poll::Ready(Some(Ok(frame))) => this.recv_frame(frame),
                    Poll::Ready(Some(Err(e))) => this.recv_error(e)?,
                    Poll::Ready(None) => {
                        ended = true;
                        break;
                    }
                    Poll::Pending => break,
                }
            }
            if ended {
                // The client closed the connection: nothing sent now would be read.
                for slot in this.streams.drain() {
                    if let Some(body) = &slot.body {
                        body.fail(Reason::CANCEL);
                    }
                }
                return Poll::Ready(Ok(()));
            }
            if let Some(wait) = &mut this.draining {
                if wait.as_mut().poll(cx).is_ready() {
                    this.go_away();
                }
            }
            if this.failed.is_none() {
                // Acknowledgements first: a client that changed a setting hears so before it
                // sees data sent under it.
                let _ = this.write_control(cx)?;
                this.run_streams(cx)?;
            }
            let flushed = this.write_out(cx)?;
            if let Some(reason) = this.failed {
                if flushed.is_ready() {
                    let _ = this.codec.shutdown(cx);
                    return Poll::Ready(Err(Error::Protocol(reason)));
                }
                return Poll::Pending;
            }
            if (this.going_away.is_some() || this.peer_going_away)
                && this.streams.is_empty()
                && flushed.is_ready()
            {
                let _ = this.codec.shutdown(cx);
                return Poll::Ready(Ok(()));
            }
            // Reading stopped at a pending read (its waker registered) unless the control
            // queue was full; then go round again once the writer took the queue.
            if !(stopped_full && flushed.is_ready()) {
                if this.streams.is_empty() && flushed.is_ready() {
                    this.release_idle_memory();
                }
                return Poll::Pending;
            }
        }
    }
}

/// An extended CONNECT: its body becomes the tunnel's incoming side, handed to the handler in
/// the request's extensions (`tunnel::Tunnel`); the request itself carries no body.
fn tunnel_request(req: Request<Incoming>) -> Request<Incoming> {
    let (mut parts, body) = req.into_parts();
    let websocket = parts
        .extensions
        .get::<h2::ext::Protocol>()
        .is_some_and(|p| p.as_str().eq_ignore_ascii_case("websocket"));
    if websocket {
        // The handlers look for hyper's name of it.
        parts
            .extensions
            .insert(hyper::ext::Protocol::from_static("websocket"));
    }
    parts.extensions.insert(tunnel::Tunnel::new(body));
    Request::from_parts(parts, Incoming::adapted(NoBody))
}

/// The writer refused a frame: only a frame too big for it (a bug here, not the client's).
fn send_error(e: h2::UserError) -> Error {
    Error::Io(std::io::Error::other(format!(
        "HTTP/2 frame refused: {e:?}"
    )))
}

/// Fields that mean something only to an HTTP/1.1 connection (RFC 9113 section 8.2.2): an HTTP/2
/// response must not carry them.
fn strip_connection_fields(fields: &mut HeaderMap) {
    if fields.is_empty() {
        return;
    }
    for name in sluice_http::hop::connection_specific_names() {
        fields.remove(name);
    }
    // Every value: `te: trailers` then `te: gzip` is as malformed as `te: gzip` alone.
    if fields.get_all(header::TE).iter().any(|v| v != "trailers") {
        fields.remove(header::TE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// The next frame's type, flags and stream.
    async fn next_frame(io: &mut tokio::io::DuplexStream) -> (u8, u8, u32) {
        let mut head = [0u8; 9];
        io.read_exact(&mut head).await.unwrap();
        let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        io.read_exact(&mut payload).await.unwrap();
        (
            head[3],
            head[4],
            u32::from_be_bytes([head[5], head[6], head[7], head[8]]),
        )
    }

    /// Reads frames until a GOAWAY; its error code.
    async fn goaway(io: &mut tokio::io::DuplexStream) -> u32 {
        loop {
            let mut head = [0u8; 9];
            io.read_exact(&mut head).await.unwrap();
            let len =
                (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
            let mut payload = vec![0u8; len];
            io.read_exact(&mut payload).await.unwrap();
            if head[3] == 7 {
                return u32::from_be_bytes(payload[4..8].try_into().unwrap());
            }
        }
    }

    #[test]
    fn every_te_value_is_checked() {
        let mut fields = HeaderMap::new();
        fields.append(header::TE, "trailers".parse().unwrap());
        fields.append(header::TE, "gzip".parse().unwrap());
        strip_connection_fields(&mut fields);
        assert!(!fields.contains_key(header::TE));
        let mut fields = HeaderMap::new();
        fields.append(header::TE, "trailers".parse().unwrap());
        strip_connection_fields(&mut fields);
        assert_eq!(fields[header::TE], "trailers");
        // Trailers keep no `te` at all, nor any other connection-specific field.
        fields.append(header::CONNECTION, "close".parse().unwrap());
        fields.append("x-sum", "1".parse().unwrap());
        sluice_http::hop::strip_connection_specific_trailers(&mut fields);
        assert_eq!(fields.len(), 1);
        assert_eq!(fields["x-sum"], "1");
    }

    /// A handler that holds the request (and its body) and never reads or answers, on a
    /// connection with `window`: the server's connection window says `window` and its SETTINGS
    /// each stream's (`stream_window`); bodies of `window` bytes together, each within its
    /// stream's, are taken; one byte more is a FLOW_CONTROL_ERROR.
    async fn past_a_window_nobody_reads(window: u32) {
        let (mut client, server) = tokio::io::duplex(4 << 20);
        let service = |req: Request<Incoming>| async move {
            let _held = req;
            std::future::pending::<Response<http_body_util::Empty<Bytes>>>().await
        };
        let limits = Limits {
            max_concurrent_streams: 10,
            max_header_list_size: 16 * 1024,
            window,
        };
        let conn = tokio::spawn(Connection::new(server, service, limits, false));
        let mut out = PREFACE.to_vec();
        out.extend(frame(4, 0, 0, &[]));
        client.write_all(&out).await.unwrap();
        // The server's first frames: its SETTINGS, then (above 65535) the connection's window.
        let (kind, _, payload) = next_payload(&mut client).await;
        assert_eq!(kind, 4, "SETTINGS first");
        let initial = payload
            .chunks(6)
            .find(|s| s[..2] == [0, 4])
            .map(|s| u32::from_be_bytes(s[2..6].try_into().unwrap()));
        let per_stream = stream_window(window);
        assert_eq!(initial, Some(per_stream), "SETTINGS_INITIAL_WINDOW_SIZE");
        if window > 65_535 {
            let (kind, stream, payload) = next_payload(&mut client).await;
            assert_eq!((kind, stream), (8, 0), "WINDOW_UPDATE on the connection");
            assert_eq!(
                u32::from_be_bytes(payload[..4].try_into().unwrap()),
                window - 65_535
            );
        }
        // POSTs of / (static table), :authority literal, each with as much body as its window
        // takes, until `window` bytes are out; then one more.
        let mut out = Vec::new();
        let chunk = vec![0u8; 16 * 1024];
        let mut left = window as usize;
        let mut id = 1;
        while left > 0 {
            out.extend(frame(1, 4, id, &[0x83, 0x86, 0x84, 0x41, 1, b'x']));
            let mut body = left.min(per_stream as usize);
            left -= body;
            while body > 0 {
                let n = body.min(chunk.len());
                out.extend(frame(0, 0, id, &chunk[..n]));
                body -= n;
            }
            id += 2;
        }
        client.write_all(&out).await.unwrap();
        // The whole window is taken: no GOAWAY while the connection is otherwise quiet.
        let ping = frame(6, 0, 0, b"12345678");
        client.write_all(&ping).await.unwrap();
        loop {
            let (kind, _, payload) = next_payload(&mut client).await;
            // Within the window: no reset, no GOAWAY, and no window given back (nothing read).
            assert!(
                ![3, 7, 8].contains(&kind),
                "frame type {kind} within the window"
            );
            if kind == 6 && payload == b"12345678" {
                break;
            }
        }
        client.write_all(&frame(0, 0, 1, b"!")).await.unwrap();
        assert_eq!(goaway(&mut client).await, 0x3, "FLOW_CONTROL_ERROR");
        assert!(matches!(
            conn.await.unwrap(),
            Err(Error::Protocol(Reason::FLOW_CONTROL_ERROR))
        ));
    }

    #[tokio::test]
    async fn a_body_past_the_window_nobody_reads_is_a_flow_control_error() {
        // The default window, the smallest allowed and one between.
        for window in [1 << 20, 65_535, 200_000] {
            tokio::time::timeout(
                std::time::Duration::from_secs(10),
                past_a_window_nobody_reads(window),
            )
            .await
            .expect("the connection answered in time");
        }
    }

    /// The next frame's type, stream and payload.
    async fn next_payload(io: &mut tokio::io::DuplexStream) -> (u8, u32, Vec<u8>) {
        let mut head = [0u8; 9];
        io.read_exact(&mut head).await.unwrap();
        let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        io.read_exact(&mut payload).await.unwrap();
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        (head[3], stream, payload)
    }

    #[tokio::test]
    async fn bytes_nobody_reads_go_back_to_the_connection_window() {
        let (mut client, server) = tokio::io::duplex(4 << 20);
        // Answers at once without reading the body: what the client sends after is dropped
        // and its window given back, so the connection never runs out of window.
        let service = |_req: Request<Incoming>| async move {
            Response::new(http_body_util::Full::new(Bytes::from_static(b"ok")))
        };
        let limits = Limits {
            max_concurrent_streams: 10,
            max_header_list_size: 16 * 1024,
            window: 1 << 20,
        };
        let _conn = tokio::spawn(Connection::new(server, service, limits, false));
        let mut out = PREFACE.to_vec();
        out.extend(frame(4, 0, 0, &[]));
        client.write_all(&out).await.unwrap();
        let chunk = vec![0u8; 16 * 1024];
        // Six streams of 256 KiB each (each stream's window): 1.5 MiB, past the connection's
        // 1 MiB unless the window comes back.
        assert_eq!(stream_window(1 << 20), 256 * 1024);
        for id in [1u32, 3, 5, 7, 9, 11] {
            let block = vec![0x83, 0x86, 0x84, 0x41, 1, b'x'];
            client.write_all(&frame(1, 4, id, &block)).await.unwrap();
            for i in 0..16 {
                let end = if i == 15 { 1 } else { 0 };
                client.write_all(&frame(0, end, id, &chunk)).await.unwrap();
            }
        }
        // Every stream answered, no GOAWAY: count the six answers' END_STREAM DATA frames.
        let mut ended = 0;
        let read = async {
            while ended < 6 {
                let mut head = [0u8; 9];
                client.read_exact(&mut head).await.unwrap();
                let len = (usize::from(head[0]) << 16)
                    | (usize::from(head[1]) << 8)
                    | usize::from(head[2]);
                let mut payload = vec![0u8; len];
                client.read_exact(&mut payload).await.unwrap();
                assert_ne!(head[3], 7, "GOAWAY");
                if head[3] == 0 && head[4] & 1 == 1 {
                    ended += 1;
                }
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), read)
            .await
            .expect("all six answered");
    }

    /// A body nobody reads, sent while its answer is still going out: its bytes are dropped and
    /// the connection's window given back, but the stream's only up to `MAX_UNREAD_AFTER_ANSWER`,
    /// so an upload beside a long (live) answer stalls instead of being taken at line rate for
    /// as long as the answer lasts; other streams go on.
    #[tokio::test]
    async fn a_body_nobody_reads_stalls_on_its_window_while_the_answer_goes_on() {
        use futures_util::StreamExt;
        let (mut client, server) = tokio::io::duplex(4 << 20);
        // `/live`: the body dropped unread, an answer that never ends; anything else: "ok".
        let service = |req: Request<Incoming>| {
            let live = req.uri().path() == "/live";
            drop(req);
            async move {
                let chunks: Box<dyn Stream<Item = _> + Send + Unpin> = if live {
                    Box::new(
                        futures_util::stream::iter([Ok::<_, std::convert::Infallible>(
                            http_body::Frame::data(Bytes::from_static(b"live")),
                        )])
                        .chain(futures_util::stream::pending()),
                    )
                } else {
                    Box::new(futures_util::stream::iter([Ok(http_body::Frame::data(
                        Bytes::from_static(b"ok"),
                    ))]))
                };
                Response::new(http_body_util::StreamBody::new(chunks))
            }
        };
        let _conn = tokio::spawn(Connection::new(server, service, test_limits(), false));
        // POST /live (literal :path), the body never ended.
        let mut out = PREFACE.to_vec();
        out.extend(frame(4, 0, 0, &[]));
        out.extend(frame(
            1,
            4,
            1,
            &[
                0x83, 0x86, 0x04, 5, b'/', b'l', b'i', b'v', b'e', 0x41, 1, b'x',
            ],
        ));
        client.write_all(&out).await.unwrap();
        // The client keeps to the windows the server gives (256 KiB for the stream and 1 MiB for
        // the connection at first), sending 16 KiB frames until 6 MiB are out or nothing has
        // opened for a while.
        let chunk = vec![0u8; 16 * 1024];
        let (mut stream_window, mut conn_window) =
            (i64::from(super::stream_window(1 << 20)), 65_535i64);
        let mut sent = 0usize;
        let (mut rd, mut wr) = tokio::io::split(client);
        let (tx, mut updates) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let mut head = [0u8; 9];
                if rd.read_exact(&mut head).await.is_err() {
                    return;
                }
                let len = (usize::from(head[0]) << 16)
                    | (usize::from(head[1]) << 8)
                    | usize::from(head[2]);
                let mut payload = vec![0u8; len];
                if rd.read_exact(&mut payload).await.is_err() {
                    return;
                }
                let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
                let _ = tx.send((head[3], head[4], id, payload));
            }
        });
        // Counts a frame's window update; whether it ends stream 3's answer.
        let take = |f: (u8, u8, u32, Vec<u8>), sw: &mut i64, cw: &mut i64| -> bool {
            if f.0 == 8 {
                let n = i64::from(u32::from_be_bytes(f.3[..4].try_into().unwrap()));
                if f.2 == 0 {
                    *cw += n;
                } else if f.2 == 1 {
                    *sw += n;
                }
            }
            assert_ne!(f.0, 7, "no GOAWAY");
            assert!(
                !(f.0 == 3 && f.2 == 1),
                "stream 1 not reset while its answer goes on"
            );
            f.0 == 0 && f.2 == 3 && f.1 & 1 == 1
        };
        let began = std::time::Instant::now();
        while sent < 6 << 20 && began.elapsed() < std::time::Duration::from_secs(10) {
            if stream_window >= chunk.len() as i64 && conn_window >= chunk.len() as i64 {
                wr.write_all(&frame(0, 0, 1, &chunk)).await.unwrap();
                stream_window -= chunk.len() as i64;
                conn_window -= chunk.len() as i64;
                sent += chunk.len();
                while let Ok(f) = updates.try_recv() {
                    take(f, &mut stream_window, &mut conn_window);
                }
                continue;
            }
            match tokio::time::timeout(std::time::Duration::from_millis(500), updates.recv()).await
            {
                Ok(Some(f)) => {
                    take(f, &mut stream_window, &mut conn_window);
                }
                _ => break,
            }
        }
        // The first window and what went back up to the cap, then stalled.
        assert!(
            sent <= (1 << 20) + MAX_UNREAD_AFTER_ANSWER as usize + (1 << 18),
            "{sent} bytes taken"
        );
        assert!(sent >= 1 << 20, "{sent} bytes taken");
        // The connection's window came back: another stream is answered.
        wr.write_all(&frame(1, 5, 3, &GET)).await.unwrap();
        let wait = async {
            loop {
                let f = updates.recv().await.expect("the connection stays up");
                if take(f, &mut stream_window, &mut conn_window) {
                    break;
                }
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), wait)
            .await
            .expect("stream 3 answered");
    }

    /// Complete answers earn resets back only at `RESET_REFUNDS_PER_SEC` past `RESET_REFUNDS`: a
    /// client pairing each reset of a started handler with one cheap request, one round trip
    /// each, runs out of budget (it never did when every answer earned one back).
    #[tokio::test]
    async fn cheap_answers_do_not_pay_for_resets_without_end() {
        let (mut client, server) = tokio::io::duplex(4 << 20);
        // `/` answers at once; any other path never answers.
        let service = |req: Request<Incoming>| {
            let cheap = req.uri().path() == "/";
            async move {
                if !cheap {
                    std::future::pending::<()>().await;
                }
                Response::new(http_body_util::Full::new(Bytes::from_static(b"ok")))
            }
        };
        let conn = tokio::spawn(Connection::new(server, service, test_limits(), false));
        let mut out = PREFACE.to_vec();
        out.extend(frame(4, 0, 0, &[]));
        client.write_all(&out).await.unwrap();
        let slow = [0x82, 0x86, 0x04, 2, b'/', b's', 0x41, 1, b'x'];
        let mut code = None;
        'pairs: for i in 0..600u32 {
            let (reset, cheap) = (4 * i + 1, 4 * i + 3);
            // The slow request, a moment for its handler to start, then its reset.
            client.write_all(&frame(1, 5, reset, &slow)).await.unwrap();
            tokio::task::yield_now().await;
            let mut pair = frame(3, 0, reset, &8u32.to_be_bytes());
            pair.extend(frame(1, 5, cheap, &GET));
            client.write_all(&pair).await.unwrap();
            loop {
                let (kind, id, payload) = tokio::time::timeout(
                    std::time::Duration::from_secs(5),
                    next_payload(&mut client),
                )
                .await
                .expect("a frame");
                if kind == 7 {
                    code = Some(u32::from_be_bytes(payload[4..8].try_into().unwrap()));
                    break 'pairs;
                }
                // "ok" is one DATA frame, which ends the stream.
                if kind == 0 && id == cheap {
                    break;
                }
            }
        }
        assert_eq!(code, Some(0xb), "ENHANCE_YOUR_CALM");
        conn.abort();
    }

    /// A connection over `server` (10 streams, a 1 MiB window) that drains
    /// (`graceful_shutdown`) when the returned sender fires; the task ends with the connection.
    fn drained_on_signal<S, F>(
        server: tokio::io::DuplexStream,
        service: S,
    ) -> (
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<Result<(), Error>>,
    )
    where
        S: FnMut(Request<Incoming>) -> F + Unpin + Send + 'static,
        F: Future<Output = Response<http_body_util::Full<Bytes>>> + Send + 'static,
    {
        let limits = Limits {
            max_concurrent_streams: 10,
            max_header_list_size: 16 * 1024,
            window: 1 << 20,
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut conn = std::pin::pin!(Connection::new(server, service, limits, false));
            tokio::select! {
                r = conn.as_mut() => return r,
                _ = stopped => {}
            }
            conn.as_mut().get_mut().graceful_shutdown();
            conn.await
        });
        (stop, task)
    }

    /// Limits for the tests below: 10 streams, a 1 MiB window.
    fn test_limits() -> Limits {
        Limits {
            max_concurrent_streams: 10,
            max_header_list_size: 16 * 1024,
            window: 1 << 20,
        }
    }

    /// A GET of `/` on `x` (HPACK: `:method GET`, `:scheme http`, `:path /`, `:authority x`).
    const GET: [u8; 6] = [0x82, 0x86, 0x84, 0x41, 1, b'x'];

    /// Runs `conn` for a moment (it never ends by itself here).
    async fn run_a_while<F: Future + Unpin>(conn: &mut F) {
        let _ = tokio::time::timeout(std::time::Duration::from_millis(300), conn).await;
    }

    /// A stream that waits for the connection's window is listed once, however many stream
    /// WINDOW_UPDATEs come meanwhile (each gave it a turn, which listed it again: a client that
    /// never opened the connection's window grew the list by 8 bytes per 13-byte frame, without
    /// end).
    #[tokio::test]
    async fn a_stream_waiting_for_the_connection_window_is_listed_once() {
        let (client, server) = tokio::io::duplex(4 << 20);
        let (mut rd, mut wr) = tokio::io::split(client);
        // Whatever the server writes is read and dropped.
        tokio::spawn(async move {
            let mut sink = vec![0u8; 1 << 16];
            while rd.read(&mut sink).await.is_ok_and(|n| n > 0) {}
        });
        let service = |_req: Request<Incoming>| async move {
            Response::new(http_body_util::Full::new(Bytes::from(vec![b'x'; 100_000])))
        };
        let mut conn = Box::pin(Connection::new(server, service, test_limits(), false));
        let mut out = PREFACE.to_vec();
        out.extend(frame(4, 0, 0, &[]));
        out.extend(frame(1, 5, 1, &GET));
        wr.write_all(&out).await.unwrap();
        run_a_while(&mut conn).await;
        // The default windows (65,535) are spent; the stream's is opened a byte at a time, the
        // connection's never.
        let mut updates = Vec::new();
        for _ in 0..2_000 {
            updates.extend(frame(8, 0, 1, &1u32.to_be_bytes()));
        }
        wr.write_all(&updates).await.unwrap();
        run_a_while(&mut conn).await;
        assert_eq!(conn.streams.len(), 1, "the stream is still open");
        assert_eq!(conn.window_blocked.len(), 1, "listed once");
        assert!(conn.to_poll.is_empty());
        // Nothing written since the windows shut: the connection says it is stuck.
        let stuck = conn.stuck_for();
        assert!(stuck >= std::time::Duration::from_millis(250), "{stuck:?}");
        // Opening both windows sends the rest.
        let mut open = frame(8, 0, 0, &100_000u32.to_be_bytes());
        open.extend(frame(8, 0, 1, &100_000u32.to_be_bytes()));
        wr.write_all(&open).await.unwrap();
        run_a_while(&mut conn).await;
        assert!(conn.streams.is_empty(), "answered whole");
        assert!(conn.window_blocked.is_empty());
        assert_eq!(
            conn.stuck_for(),
            std::time::Duration::ZERO,
            "no stream left"
        );
    }

    /// Streams `reset_parked` resets all at once, more of them than `RECENTLY_RESET`, are all
    /// remembered: request trailers arriving on the first of them afterwards (sent before the
    /// client heard of its reset) are dropped, not taken for a frame on a closed stream that
    /// ends the connection (`STREAM_CLOSED`).
    #[tokio::test]
    async fn every_stream_reset_parked_at_once_is_remembered() {
        let (client, server) = tokio::io::duplex(4 << 20);
        let (mut rd, mut wr) = tokio::io::split(client);
        let written = tokio::spawn(async move {
            let mut all = Vec::new();
            let _ = rd.read_to_end(&mut all).await;
            all
        });
        let service = |_req: Request<Incoming>| async move {
            Response::new(http_body_util::Full::new(Bytes::from(vec![b'x'; 1_000])))
        };
        let streams = 2 * RECENTLY_RESET as u32;
        let limits = Limits {
            max_concurrent_streams: streams,
            ..test_limits()
        };
        let mut conn = Box::pin(Connection::new(server, service, limits, false));
        let mut out = PREFACE.to_vec();
        // SETTINGS_INITIAL_WINDOW_SIZE = 0: every response parks on its window.
        out.extend(frame(4, 0, 0, &[0, 4, 0, 0, 0, 0]));
        // POSTs whose bodies (here, trailers) are still to come.
        for i in 0..streams {
            out.extend(frame(1, 4, 2 * i + 1, &[0x83, 0x86, 0x84, 0x41, 1, b'x']));
        }
        wr.write_all(&out).await.unwrap();
        run_a_while(&mut conn).await;
        assert_eq!(conn.streams.len(), streams as usize, "all open, parked");
        assert_eq!(
            conn.as_mut()
                .get_mut()
                .reset_parked(std::time::Duration::ZERO),
            streams as usize
        );
        run_a_while(&mut conn).await;
        // Stream 1's trailers (`a: b`, a literal), sent before its reset reached the client.
        wr.write_all(&frame(1, 5, 1, &[0x00, 1, b'a', 1, b'b']))
            .await
            .unwrap();
        run_a_while(&mut conn).await;
        assert_eq!(conn.failed, None, "the connection goes on");
        drop(conn);
        let all = written.await.unwrap();
        let mut at = 0;
        let mut resets = 0;
        while at + 9 <= all.len() {
            let len = (usize::from(all[at]) << 16)
                | (usize::from(all[at + 1]) << 8)
                | usize::from(all[at + 2]);
            assert_ne!(all[at + 3], 7, "no GOAWAY");
            resets += usize::from(all[at + 3] == 3);
            at += 9 + len;
        }
        assert_eq!(resets, streams as usize, "one RST_STREAM per stream");
    }

    /// A stream reset because the client's WINDOW_UPDATE overflowed its window is spent from
    /// the reset budget like any reset the client causes: opening streams and resetting them so
    /// (each starting its handler, then dropping it) ends in ENHANCE_YOUR_CALM, as a flood of
    /// RST_STREAM does (CVE-2025-8671, "MadeYouReset").
    #[tokio::test]
    async fn resets_provoked_by_window_overflows_are_spent_from_the_budget() {
        let (mut client, server) = tokio::io::duplex(4 << 20);
        // A handler that never answers: every stream is open when it is reset.
        let service = |_req: Request<Incoming>| {
            std::future::pending::<Response<http_body_util::Full<Bytes>>>()
        };
        let conn = tokio::spawn(Connection::new(server, service, test_limits(), false));
        let mut out = PREFACE.to_vec();
        out.extend(frame(4, 0, 0, &[]));
        for i in 0..400u32 {
            let id = 2 * i + 1;
            out.extend(frame(1, 5, id, &GET));
            out.extend(frame(8, 0, id, &0x7fff_ffffu32.to_be_bytes()));
        }
        let _ = client.write_all(&out).await;
        let code = tokio::time::timeout(std::time::Duration::from_secs(5), goaway(&mut client))
            .await
            .expect("a GOAWAY");
        assert_eq!(code, 0xb, "ENHANCE_YOUR_CALM");
        conn.abort();
    }

    #[tokio::test]
    async fn a_drain_resets_answered_streams_whose_client_never_ends_its_body() {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let service = |_req: Request<Incoming>| async move {
            Response::new(http_body_util::Full::new(Bytes::from_static(b"ok")))
        };
        let (stop, task) = drained_on_signal(server, service);
        let mut out = PREFACE.to_vec();
        out.extend(frame(4, 0, 0, &[]));
        // A POST whose body never comes.
        out.extend(frame(1, 4, 1, &[0x83, 0x86, 0x84, 0x41, 1, b'x']));
        client.write_all(&out).await.unwrap();
        let mut frames = Vec::new();
        // The answer, all of it.
        while !frames
            .iter()
            .any(|&(t, f, id)| t == 0 && f & 1 == 1 && id == 1)
        {
            frames.push(next_frame(&mut client).await);
        }
        stop.send(()).unwrap();
        let ended = tokio::time::timeout(std::time::Duration::from_secs(5), task)
            .await
            .expect("the drain ends the connection")
            .unwrap();
        assert!(ended.is_ok());
        while !frames.iter().any(|&(t, _, id)| t == 3 && id == 1) {
            frames.push(next_frame(&mut client).await);
        }
    }

    /// A drain in two steps (RFC 9113 §6.8): a GOAWAY with the highest stream id and a PING; a
    /// request the client sends before it answers the PING (one in flight as the drain began)
    /// is served; the PING's acknowledgement brings the final GOAWAY with the last stream
    /// opened, a stream above it is not served, and the connection ends with the last answer.
    /// A client that never answers the PING gets the final GOAWAY a round-trip allowance later.
    #[tokio::test]
    async fn a_drain_takes_streams_in_flight_then_names_the_last() {
        for acks in [true, false] {
            let (mut client, server) = tokio::io::duplex(1 << 20);
            let (release, released) = tokio::sync::watch::channel(false);
            let service = move |req: Request<Incoming>| {
                let mut released = released.clone();
                async move {
                    // Stream 1's answer waits for the test; the others come at once.
                    if req.uri().path() == "/wait" {
                        let _ = released.wait_for(|r| *r).await;
                    }
                    Response::new(http_body_util::Full::new(Bytes::from_static(b"ok")))
                }
            };
            let (stop, task) = drained_on_signal(server, service);
            // GET (static), :scheme https, :path literal, :authority literal.
            let get = |path: &str| {
                let mut block = vec![0x82, 0x87, 0x04, path.len() as u8];
                block.extend_from_slice(path.as_bytes());
                block.extend_from_slice(&[0x41, 1, b'x']);
                block
            };
            let mut out = PREFACE.to_vec();
            out.extend(frame(4, 0, 0, &[]));
            out.extend(frame(1, 5, 1, &get("/wait")));
            client.write_all(&out).await.unwrap();
            // The server's SETTINGS, its WINDOW_UPDATE, the SETTINGS ack: then the drain.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            stop.send(()).unwrap();
            let began = std::time::Instant::now();
            // Frames as (type, stream, payload), until the first GOAWAY and the PING.
            let mut seen: Vec<(u8, u32, Vec<u8>)> = Vec::new();
            while !seen.iter().any(|f| f.0 == 6) {
                seen.push(next_payload(&mut client).await);
            }
            let first = seen
                .iter()
                .find(|f| f.0 == 7)
                .expect("a GOAWAY before the PING");
            assert_eq!(
                first.2[..4],
                (u32::MAX >> 1).to_be_bytes(),
                "first GOAWAY's id"
            );
            let ping = seen.iter().find(|f| f.0 == 6).unwrap().2.clone();
            // A request sent before the PING is answered: in flight when the drain began.
            client
                .write_all(&frame(1, 5, 3, &get("/now")))
                .await
                .unwrap();
            let mut answered_3 = false;
            while !answered_3 {
                let f = next_payload(&mut client).await;
                answered_3 = f.0 == 1 && f.1 == 3;
                assert_ne!(f.0, 7, "no final GOAWAY before the PING's answer");
            }
            if acks {
                client.write_all(&frame(6, 1, 0, &ping)).await.unwrap();
            }
            let last = loop {
                let f = next_payload(&mut client).await;
                if f.0 == 7 {
                    break u32::from_be_bytes(f.2[..4].try_into().unwrap());
                }
            };
            assert_eq!(last, 3, "final GOAWAY names the last stream opened");
            let waited = began.elapsed();
            if acks {
                assert!(
                    waited < DRAIN_ROUND_TRIP,
                    "final GOAWAY on the ack: {waited:?}"
                );
            } else {
                assert!(waited >= DRAIN_ROUND_TRIP, "final GOAWAY early: {waited:?}");
            }
            // Stream 5, after the final GOAWAY: not served. Then stream 1's answer, and the end.
            client
                .write_all(&frame(1, 5, 5, &get("/now")))
                .await
                .unwrap();
            release.send(true).unwrap();
            let ended = tokio::time::timeout(std::time::Duration::from_secs(5), task)
                .await
                .expect("the drain ends the connection")
                .unwrap();
            assert!(ended.is_ok());
            let mut rest = Vec::new();
            client.read_to_end(&mut rest).await.unwrap();
            let mut at = 0;
            let mut streams = Vec::new();
            while at + 9 <= rest.len() {
                let len = (usize::from(rest[at]) << 16)
                    | (usize::from(rest[at + 1]) << 8)
                    | usize::from(rest[at + 2]);
                if rest[at + 3] == 1 {
                    streams.push(u32::from_be_bytes(rest[at + 5..at + 9].try_into().unwrap()));
                }
                at += 9 + len;
            }
            assert_eq!(streams, vec![1], "after the final GOAWAY (acks: {acks})");
        }
    }

    /// A POST on stream `id` to `path` (a literal `:path`), its body still to come.
    fn post_to(id: u32, path: &str) -> Vec<u8> {
        let mut block = vec![0x83, 0x86, 0x04, path.len() as u8];
        block.extend_from_slice(path.as_bytes());
        block.extend_from_slice(&[0x41, 1, b'x']);
        frame(1, 4, id, &block)
    }

    /// `fut`, which must be done within 5 s (a test's reads, which would wait for ever).
    async fn within<T>(fut: impl Future<Output = T>) -> T {
        tokio::time::timeout(std::time::Duration::from_secs(5), fut)
            .await
            .expect("done within 5 s")
    }

    /// Reads frames up to the acknowledgement of a PING sent now (all the client sent before
    /// it has been taken), adding up the connection's window updates, and failing at a GOAWAY.
    async fn connection_updates_until_pinged(io: &mut tokio::io::DuplexStream) -> i64 {
        io.write_all(&frame(6, 0, 0, b"pingpong")).await.unwrap();
        let mut updates = 0;
        within(async {
            loop {
                let (kind, stream, payload) = next_payload(io).await;
                assert_ne!(kind, 7, "no GOAWAY");
                if kind == 8 && stream == 0 {
                    updates += i64::from(u32::from_be_bytes(payload[..4].try_into().unwrap()));
                }
                if kind == 6 && payload == b"pingpong" {
                    return updates;
                }
            }
        })
        .await
    }

    /// A request body its handler does not read yet (waiting for a busy upstream) takes its own
    /// window, a quarter of the connection's: the rest is left to the other bodies on the
    /// connection, and another upload goes through whole. (Each body had the whole connection's
    /// window: one unread upload stopped every other one until it was read, all the users
    /// behind a load balancer sharing the connection.) One byte past its own window resets that
    /// stream only.
    #[tokio::test]
    async fn a_body_nobody_reads_yet_leaves_the_connection_window_to_others() {
        let (mut client, server) = tokio::io::duplex(4 << 20);
        // `/hold`: the request held, its body never read, no answer; anything else: the body
        // read whole, its length answered.
        let service = |req: Request<Incoming>| async move {
            if req.uri().path() == "/hold" {
                let _held = req;
                return std::future::pending().await;
            }
            let body = http_body_util::BodyExt::collect(req.into_body()).await;
            let n = body.map_or(0, |b| b.to_bytes().len());
            Response::new(http_body_util::Full::new(Bytes::from(n.to_string())))
        };
        let window = test_limits().window;
        let _conn = tokio::spawn(Connection::new(server, service, test_limits(), false));
        let mut out = PREFACE.to_vec();
        out.extend(frame(4, 0, 0, &[]));
        client.write_all(&out).await.unwrap();
        // The windows the server gives: its SETTINGS, then the connection's update.
        let (kind, _, payload) = next_payload(&mut client).await;
        assert_eq!(kind, 4, "SETTINGS first");
        let per_stream = payload
            .chunks(6)
            .find(|s| s[..2] == [0, 4])
            .map_or(DEFAULT_WINDOW, |s| {
                i64::from(u32::from_be_bytes(s[2..6].try_into().unwrap()))
            });
        let (kind, stream, payload) = next_payload(&mut client).await;
        assert_eq!((kind, stream), (8, 0), "WINDOW_UPDATE on the connection");
        let mut conn_window =
            DEFAULT_WINDOW + i64::from(u32::from_be_bytes(payload[..4].try_into().unwrap()));
        // Stream 1 would send more than the whole connection's window: it sends what the
        // windows let it, which nobody reads.
        let wanted = i64::from(window) + 100_000;
        let mut first = per_stream.min(conn_window).min(wanted);
        conn_window -= first;
        let mut out = post_to(1, "/hold");
        let chunk = vec![0u8; 16 * 1024];
        while first > 0 {
            let n = first.min(chunk.len() as i64);
            out.extend(frame(0, 0, 1, &chunk[..n as usize]));
            first -= n;
        }
        client.write_all(&out).await.unwrap();
        conn_window += connection_updates_until_pinged(&mut client).await;
        // Stream 3's upload, 10,000 bytes, fits in what is left.
        let body = vec![b'b'; 10_000];
        assert!(
            conn_window >= body.len() as i64,
            "the connection's window left for stream 3: {conn_window} bytes"
        );
        let mut out = post_to(3, "/up");
        out.extend(frame(0, 1, 3, &body));
        client.write_all(&out).await.unwrap();
        let mut answer = Vec::new();
        let read = async {
            loop {
                let (kind, stream, payload) = next_payload(&mut client).await;
                assert_ne!(kind, 7, "no GOAWAY");
                assert!(!(kind == 3 && stream == 1), "stream 1 not reset");
                if kind == 0 && stream == 3 {
                    answer.extend_from_slice(&payload);
                    if answer == b"10000" {
                        break;
                    }
                }
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), read)
            .await
            .expect("stream 3 answered");
        // Stream 1's window is spent: one byte more resets it (FLOW_CONTROL_ERROR), not the
        // connection.
        client.write_all(&frame(0, 0, 1, b"!")).await.unwrap();
        within(async {
            loop {
                let (kind, stream, payload) = next_payload(&mut client).await;
                assert_ne!(kind, 7, "no GOAWAY");
                if kind == 3 {
                    assert_eq!(stream, 1);
                    assert_eq!(payload, 3u32.to_be_bytes(), "FLOW_CONTROL_ERROR");
                    break;
                }
            }
        })
        .await;
    }

    /// Frames on an even stream id, which only this server could open and never does (it does
    /// not push), end the connection with PROTOCOL_ERROR (RFC 9113 section 5.1.1), below the
    /// highest stream opened as above it: DATA there was answered with a reset (and
    /// remembered, so a flood of them pushed the streams this server did reset out of
    /// `recently_reset`), RST_STREAM and WINDOW_UPDATE were ignored. PRIORITY may name any
    /// stream and is still ignored.
    #[tokio::test]
    async fn frames_on_even_stream_ids_end_the_connection() {
        // DATA, RST_STREAM (CANCEL), WINDOW_UPDATE.
        let frames = [
            (0u8, vec![0u8; 10]),
            (3, 8u32.to_be_bytes().to_vec()),
            (8, 1u32.to_be_bytes().to_vec()),
        ];
        for (kind, payload) in frames {
            let (mut client, server) = tokio::io::duplex(1 << 20);
            let service = |_req: Request<Incoming>| async move {
                Response::new(http_body_util::Full::new(Bytes::from_static(b"ok")))
            };
            let conn = tokio::spawn(Connection::new(server, service, test_limits(), false));
            let mut out = PREFACE.to_vec();
            out.extend(frame(4, 0, 0, &[]));
            // Streams 1 and 5 (2 is below the highest), then PRIORITY on 2: still fine.
            out.extend(frame(1, 5, 1, &GET));
            out.extend(frame(1, 5, 5, &GET));
            out.extend(frame(2, 0, 2, &[0, 0, 0, 1, 16]));
            client.write_all(&out).await.unwrap();
            let mut answered = 0;
            within(async {
                while answered < 2 {
                    let (kind, flags, _) = next_frame(&mut client).await;
                    assert_ne!(kind, 7, "no GOAWAY before the even stream's frame");
                    answered += usize::from(kind == 0 && flags & 1 == 1);
                }
            })
            .await;
            client
                .write_all(&frame(kind, 0, 2, &payload))
                .await
                .unwrap();
            let code = tokio::time::timeout(std::time::Duration::from_secs(5), goaway(&mut client))
                .await
                .unwrap_or_else(|_| panic!("frame type {kind} on stream 2: no GOAWAY"));
            assert_eq!(code, 1, "frame type {kind}: PROTOCOL_ERROR");
            assert!(matches!(
                within(conn).await.unwrap(),
                Err(Error::Protocol(Reason::PROTOCOL_ERROR))
            ));
        }
    }

    /// A PRIORITY frame depending on itself is a stream error of its stream (RFC 9113 section
    /// 5.3.1), which it leaves idle: the streams below it can still be opened. (The stream's id
    /// was taken as the highest opened: the client's next HEADERS, on a lower id, ended the
    /// connection with STREAM_CLOSED.) An even id is not taken either.
    #[tokio::test]
    async fn a_priority_depending_on_itself_opens_no_stream() {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let service = |_req: Request<Incoming>| async move {
            Response::new(http_body_util::Full::new(Bytes::from_static(b"ok")))
        };
        let _conn = tokio::spawn(Connection::new(server, service, test_limits(), false));
        let mut out = PREFACE.to_vec();
        out.extend(frame(4, 0, 0, &[]));
        // Stream 101, idle, then stream 2, each depending on itself.
        out.extend(frame(2, 0, 101, &[0, 0, 0, 101, 16]));
        out.extend(frame(2, 0, 2, &[0, 0, 0, 2, 16]));
        client.write_all(&out).await.unwrap();
        let mut resets = Vec::new();
        within(async {
            while resets.len() < 2 {
                let (kind, stream, payload) = next_payload(&mut client).await;
                assert_ne!(kind, 7, "no GOAWAY");
                if kind == 3 {
                    assert_eq!(payload, 1u32.to_be_bytes(), "PROTOCOL_ERROR");
                    resets.push(stream);
                }
            }
        })
        .await;
        assert_eq!(resets, [101, 2]);
        // Streams 1 and 3 come after, then 101 itself.
        let mut out = frame(1, 5, 1, &GET);
        out.extend(frame(1, 5, 3, &GET));
        out.extend(frame(1, 5, 101, &GET));
        client.write_all(&out).await.unwrap();
        let mut answered = Vec::new();
        let read = async {
            while answered.len() < 3 {
                let (kind, flags, stream) = next_frame(&mut client).await;
                assert_ne!(kind, 7, "no GOAWAY");
                if kind == 0 && flags & 1 == 1 {
                    answered.push(stream);
                }
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), read)
            .await
            .expect("all three answered");
        answered.sort_unstable();
        assert_eq!(answered, [1, 3, 101]);
    }

    /// DATA on streams the client skipped (closed, never reset by this server) is answered with
    /// RST_STREAM(STREAM_CLOSED) without being remembered as a reset: a flood of it pushed the
    /// streams this server did reset out of `recently_reset`, and trailers then arriving on one
    /// of those (sent before the client heard of its reset) ended the connection.
    #[tokio::test]
    async fn data_on_skipped_streams_does_not_push_out_the_streams_reset() {
        let (client, server) = tokio::io::duplex(4 << 20);
        let (mut rd, mut wr) = tokio::io::split(client);
        tokio::spawn(async move {
            let mut sink = vec![0u8; 1 << 16];
            while rd.read(&mut sink).await.is_ok_and(|n| n > 0) {}
        });
        let service = |_req: Request<Incoming>| async move {
            Response::new(http_body_util::Full::new(Bytes::from(vec![b'x'; 1_000])))
        };
        let mut conn = Box::pin(Connection::new(server, service, test_limits(), false));
        let mut out = PREFACE.to_vec();
        // SETTINGS_INITIAL_WINDOW_SIZE = 0: the response parks on its window.
        out.extend(frame(4, 0, 0, &[0, 4, 0, 0, 0, 0]));
        // A POST whose trailers are still to come, then stream 1001.
        out.extend(frame(1, 4, 1, &[0x83, 0x86, 0x84, 0x41, 1, b'x']));
        out.extend(frame(1, 5, 1001, &GET));
        wr.write_all(&out).await.unwrap();
        run_a_while(&mut conn).await;
        assert!(
            conn.as_mut()
                .get_mut()
                .reset_parked(std::time::Duration::ZERO)
                >= 1
        );
        run_a_while(&mut conn).await;
        // Empty DATA on 200 skipped streams (3 to 401), each closed.
        let mut flood = Vec::new();
        for i in 1..=200u32 {
            flood.extend(frame(0, 0, 2 * i + 1, &[]));
        }
        wr.write_all(&flood).await.unwrap();
        run_a_while(&mut conn).await;
        assert_eq!(conn.failed, None);
        // Stream 1's trailers (`a: b`, a literal), sent before its reset reached the client.
        wr.write_all(&frame(1, 5, 1, &[0x00, 1, b'a', 1, b'b']))
            .await
            .unwrap();
        run_a_while(&mut conn).await;
        assert_eq!(conn.failed, None, "the connection goes on");
    }
}
