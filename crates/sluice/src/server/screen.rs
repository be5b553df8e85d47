//! The downstream socket wrapper that runs every HTTP/1.1 request head through
//! `sluice_http::h1screen` before hyper reads it, so a request with ambiguous framing
//! (`Content-Length` with `Transfer-Encoding`, and the other shapes `framing` refuses) is answered
//! 400 by hyper's parser and the connection closed, before any front end sees it.
//!
//! Body bytes go straight into hyper's buffer; only the bytes of a head are held here until the head
//! is complete (hyper waits for the whole head anyway), then released, altered if refused. Since
//! hyper's header read timeout only starts once it sees part of a head, a held head has the same
//! deadline here (`server.header_read_timeout_secs`): a slowloris client is cut all the same.
//!
//! After a request that asks to switch protocols (an `Upgrade` field, or `CONNECT`), the bytes that
//! follow are held (at most one read, made only while nothing is held, so that a client that
//! leaves is seen as under hyper) until the connection's service has answered it
//! ([`Upgrades`]): a switch turns the screen off, any other answer leaves an HTTP/1.1 connection
//! whose next head is screened like the first (so a client cannot turn the screen off by asking
//! for an upgrade that is not taken).
//!
//! A head longer than `server.max_header_bytes` (whole or not) is not handed to hyper, whose read
//! buffer limit (the one its automatic HTTP/1-or-2 builder takes) cannot go below 8 KiB: hyper is
//! given a head it must refuse as too large instead, so it answers 431 and closes the connection,
//! as for a head past its own limits; the connection's later bytes are not read.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use crate::atomic::Counter;
use sluice_http::h1screen::{Head, Screen};
use std::future::Future;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A read smaller than this is served from a read-ahead of `READ_AHEAD` bytes.
const READ_AHEAD_BELOW: usize = 512;
const READ_AHEAD: usize = 4096;

/// How the connection's service answered the request a [`Screened`] waits on after an upgrade
/// request: set by the service (which sees the response), taken by the screen.
#[derive(Debug, Default)]
pub struct Upgrades {
    /// [`Upgrades::NONE`], [`Upgrades::SWITCHED`] or [`Upgrades::STAYED`].
    answer: AtomicU8,
    /// The read waiting for the answer.
    waker: Mutex<Option<Waker>>,
}

impl Upgrades {
    const NONE: u8 = 0;
    const SWITCHED: u8 = 1;
    const STAYED: u8 = 2;

    /// Whether `req` asks to switch protocols as the screen reads it (then the screen waits for
    /// [`Upgrades::answered`] once its body ends).
    pub fn asks<B>(req: &http::Request<B>) -> bool {
        req.method() == http::Method::CONNECT || req.headers().contains_key(http::header::UPGRADE)
    }

    /// The service answered such a request with `status` (to a `CONNECT` when `connect`).
    pub fn answered(&self, status: http::StatusCode, connect: bool) {
        let switched =
            status == http::StatusCode::SWITCHING_PROTOCOLS || (connect && status.is_success());
        let answer = if switched {
            Upgrades::SWITCHED
        } else {
            Upgrades::STAYED
        };
        self.answer.store(answer, Ordering::Release);
        let waker = self.waker.lock().expect("upgrade waker").take();
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Forgets an answer given before the screen passed on the head now going to hyper (which
    /// therefore cannot be that head's): one the screen did not wait for.
    fn forget(&self) {
        self.answer.store(Upgrades::NONE, Ordering::Release);
    }

    /// The answer, once (`Some(switched)`); without one, `cx` is woken when it comes.
    fn take(&self, cx: &mut Context<'_>) -> Option<bool> {
        let take = || match self.answer.swap(Upgrades::NONE, Ordering::AcqRel) {
            Upgrades::SWITCHED => Some(true),
            Upgrades::STAYED => Some(false),
            _ => None,
        };
        if let Some(a) = take() {
            return Some(a);
        }
        *self.waker.lock().expect("upgrade waker") = Some(cx.waker().clone());
        // An answer set between the look and the waker's registration.
        take()
    }
}

/// A downstream stream whose HTTP/1.1 request heads are screened.
pub struct Screened<I> {
    inner: I,
    screen: Screen,
    /// Bytes read from `inner` that hyper has not been given yet.
    held: Vec<u8>,
    /// How many bytes at the front of `held` have been screened and may be handed over.
    ready: usize,
    refused: Counter,
    head_timeout: Duration,
    /// Running while an incomplete head is held.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    /// A head was too large: hyper is given [`overflow_head`] in its place, then the end of the
    /// stream.
    too_large: bool,
    /// `server.max_header_bytes` and `server.max_headers`, as hyper has them.
    limits: (usize, usize),
    /// Answers to upgrade requests, from the connection's service.
    upgrades: Arc<Upgrades>,
}

/// The head hyper reads in place of one longer than `max_head_bytes`, which hyper's parser must
/// stop at as too large (431): one field more than `max_headers` (hyper's field limit is the
/// server's), or, if that is the longer, a field value past hyper's read buffer limit
/// (`max_head_bytes`, at least 8 KiB, as the server sets it). A few hundred bytes at the usual
/// limits.
fn overflow_head((max_head_bytes, max_headers): (usize, usize)) -> Vec<u8> {
    const LINE: &[u8] = b"GET / HTTP/1.1\r\n";
    let by_fields = LINE.len() + 4 * (max_headers + 1) + 2;
    let by_bytes = LINE.len() + max_head_bytes.max(8192) + 16;
    let mut head = Vec::with_capacity(by_fields.min(by_bytes));
    head.extend_from_slice(LINE);
    if by_fields <= by_bytes {
        for _ in 0..=max_headers {
            head.extend_from_slice(b"a:\r\n");
        }
        head.extend_from_slice(b"\r\n");
    } else {
        head.extend_from_slice(b"a: ");
        head.resize(by_bytes, b'a');
    }
    head
}

impl<I> Screened<I> {
    /// Screens `inner`; `http2` (negotiated by ALPN) turns the screen off from the start.
    pub fn new(
        inner: I,
        max_head_bytes: usize,
        max_headers: usize,
        http2: bool,
        refused: Counter,
        head_timeout: Duration,
    ) -> Self {
        let mut screen = Screen::new(max_head_bytes, max_headers);
        if http2 {
            screen.turn_off();
        }
        Screened {
            inner,
            screen,
            held: Vec::new(),
            ready: 0,
            refused,
            head_timeout,
            deadline: None,
            too_large: false,
            limits: (max_head_bytes, max_headers),
            upgrades: Arc::default(),
        }
    }

    /// Where the connection's service tells this screen how it answered upgrade requests.
    pub fn upgrades(&self) -> Arc<Upgrades> {
        self.upgrades.clone()
    }

    /// `held`, of which the first `ready` bytes are screened, kept for hyper; after a head too
    /// large, what follows those bytes is replaced by [`overflow_head`].
    fn keep(&mut self, mut held: Vec<u8>, ready: usize) {
        if self.too_large {
            held.truncate(ready);
            held.extend_from_slice(&overflow_head(self.limits));
            self.ready = held.len();
        } else {
            self.ready = ready;
        }
        self.held = held;
    }

    /// One read of up to `READ_AHEAD` bytes into the empty `held`; what the read gave when it gave
    /// no bytes (pending, the end, or an error), `None` when the bytes are in `held`.
    fn read_ahead(&mut self, cx: &mut Context<'_>) -> Option<Poll<io::Result<()>>>
    where
        I: AsyncRead + Unpin,
    {
        self.held.resize(READ_AHEAD, 0);
        let mut ahead = ReadBuf::new(&mut self.held);
        let polled = Pin::new(&mut self.inner).poll_read(cx, &mut ahead);
        let got = ahead.filled().len();
        self.held.truncate(got);
        if got == 0 {
            self.held = Vec::new();
            return Some(polled);
        }
        None
    }

    /// Gives `bytes`, already read off the connection (the HTTP/1.1 fast path's hand-off), back
    /// first, screened like any others. Called before the first read.
    pub fn replay(&mut self, bytes: Vec<u8>) {
        if bytes.is_empty() {
            return;
        }
        let mut held = bytes;
        let ready = self.screen(&mut held);
        self.keep(held, ready);
    }

    /// Screens `data` from the start: heads once complete (altered in place when refused), body
    /// bytes as they come. Returns how many bytes were screened; the rest is an incomplete head.
    fn screen(&mut self, data: &mut [u8]) -> usize {
        let mut at = 0;
        while at < data.len() {
            if self.screen.is_off() {
                return data.len();
            }
            if self.screen.deciding() {
                // Held until the service has answered the upgrade request.
                return at;
            }
            if self.screen.at_head() {
                #[cfg(test)]
                tests::SCREENS.with(|n| n.set(n.get() + 1));
                match self.screen.head(&mut data[at..]) {
                    Head::Partial => return at,
                    Head::Passed(n) => {
                        self.upgrades.forget();
                        at += n;
                    }
                    Head::Refused(n, why) => {
                        self.refused.inc();
                        tracing::debug!(reason = %why, "request refused for ambiguous framing");
                        at += n;
                    }
                    Head::Off => {}
                    Head::TooLarge => {
                        tracing::debug!("request head over server.max_header_bytes: 431");
                        self.too_large = true;
                        return at;
                    }
                }
            } else {
                at += self.screen.body(&data[at..]);
            }
        }
        at
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Screened<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.held.is_empty() || this.ready > 0 {
                this.deadline = None;
            }
            if this.ready > 0 {
                let n = this.ready.min(buf.remaining());
                buf.put_slice(&this.held[..n]);
                this.held.drain(..n);
                this.ready -= n;
                if this.held.is_empty() {
                    // A connection keeps no read-ahead buffer between requests.
                    this.held = Vec::new();
                }
                return Poll::Ready(Ok(()));
            }
            if this.too_large {
                // The head in place of the one too large was given whole: nothing more.
                return Poll::Ready(Ok(()));
            }
            if this.screen.deciding() {
                // After an upgrade request nothing is passed on until the service has answered
                // it (what was read with it stays held, unscreened; at most one read while
                // nothing is held): then either the screen is off, or the held bytes start the
                // next head.
                let Some(switched) = this.upgrades.take(cx) else {
                    if !this.held.is_empty() {
                        return Poll::Pending;
                    }
                    // With nothing held, one read as hyper's own (it reads while the service
                    // runs, to see a client that leaves): its end or error goes up, its bytes
                    // are held.
                    if let Some(polled) = this.read_ahead(cx) {
                        return polled;
                    }
                    continue;
                };
                this.screen.decided(switched);
                this.deadline = None;
                let mut held = std::mem::take(&mut this.held);
                let ready = this.screen(&mut held);
                this.keep(held, ready);
                continue;
            }
            if this.held.is_empty() && buf.remaining() < READ_AHEAD_BELOW {
                // A small read is the HTTP/2 preface check (24 bytes) before hyper's own: read
                // what the socket holds at once and give hyper the rest from here, one `recvfrom`
                // per new connection instead of two.
                if let Some(polled) = this.read_ahead(cx) {
                    return polled;
                }
                let mut held = std::mem::take(&mut this.held);
                let ready = this.screen(&mut held);
                this.keep(held, ready);
                continue;
            }
            if this.held.is_empty() {
                // The common case: bytes go straight into the caller's buffer and are screened
                // there; only an incomplete head at the end is taken back and held.
                let before = buf.filled().len();
                ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
                let end = buf.filled().len();
                if end == before {
                    return Poll::Ready(Ok(()));
                }
                let fresh = &mut buf.filled_mut()[before..];
                let screened = this.screen(fresh);
                if screened < fresh.len() {
                    if this.too_large {
                        this.keep(Vec::new(), 0);
                    } else {
                        this.held.extend_from_slice(&fresh[screened..]);
                    }
                    buf.set_filled(before + screened);
                }
                if screened > 0 {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            // An incomplete head is held: read the rest of it next to it, within the deadline.
            let limit = this.head_timeout;
            let deadline = this
                .deadline
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
            if deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "request head not complete within server.header_read_timeout_secs",
                )));
            }
            let start = this.held.len();
            this.held.resize(start + 4096, 0);
            let mut more = ReadBuf::new(&mut this.held[start..]);
            let polled = Pin::new(&mut this.inner).poll_read(cx, &mut more);
            let got = more.filled().len();
            this.held.truncate(start + got);
            ready!(polled)?;
            if got == 0 {
                // End of stream inside a head: hand over what there is; hyper sees it truncated.
                this.screen.turn_off();
                this.ready = this.held.len();
                continue;
            }
            // A head is only ever complete at an LF: until one comes (or the head passes the
            // limit) it is not parsed again, so a head sent a byte at a time is parsed once per
            // line, not once per read (which was quadratic). A head the parser would refuse
            // without an LF (a bad method, say) is handed on at the next LF or the limit.
            if this.held.len() <= this.limits.0 && !this.held[start..].contains(&b'\n') {
                continue;
            }
            let mut held = std::mem::take(&mut this.held);
            let ready = this.screen(&mut held);
            this.keep(held, ready);
        }
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Screened<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, data)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// `io` screened with the usual limits, and its refusal counter.
    fn screen_of<I>(io: I) -> (Screened<I>, Counter) {
        let refused = Counter::default();
        let screened = Screened::new(
            io,
            8192,
            100,
            false,
            refused.clone(),
            Duration::from_secs(5),
        );
        (screened, refused)
    }

    /// Writes `pieces` with pauses (so reads see them split) and returns what the reader got.
    async fn through(pieces: Vec<&'static [u8]>) -> (Vec<u8>, u64) {
        let (mut client, server) = tokio::io::duplex(64);
        let (mut screened, refused) = screen_of(server);
        let writer = tokio::spawn(async move {
            for p in pieces {
                client.write_all(p).await.unwrap();
                tokio::task::yield_now().await;
            }
        });
        let mut out = Vec::new();
        screened.read_to_end(&mut out).await.unwrap();
        writer.await.unwrap();
        (out, refused.get())
    }

    thread_local! {
        /// The heads parsed on this thread.
        pub(super) static SCREENS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// Gives its bytes one per read, as a head sent a byte at a time arrives.
    struct OneByte(std::collections::VecDeque<u8>);

    impl AsyncRead for OneByte {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            if let Some(b) = self.0.pop_front() {
                buf.put_slice(&[b]);
            }
            Poll::Ready(Ok(()))
        }
    }

    /// What hyper reads from `bytes` sent a byte at a time through a screen with an 8 KiB head
    /// limit, how many heads were refused, and how many times a head was parsed.
    async fn one_byte_at_a_time(bytes: &[u8]) -> (Vec<u8>, u64, usize) {
        let (mut screened, refused) = screen_of(OneByte(bytes.iter().copied().collect()));
        SCREENS.with(|n| n.set(0));
        let mut out = Vec::new();
        screened.read_to_end(&mut out).await.unwrap();
        (out, refused.get(), SCREENS.with(std::cell::Cell::get))
    }

    /// A head sent a byte at a time is screened once per line (and once past the limit), not
    /// once per read: parsing the whole held head again after every byte was quadratic (a 64 KiB
    /// head cost a worker most of a second). What hyper reads is unchanged.
    #[tokio::test]
    async fn a_head_sent_a_byte_at_a_time_is_screened_once_per_line() {
        let mut head = b"POST / HTTP/1.1\r\nHost: x\r\n".to_vec();
        for i in 0..10 {
            head.extend_from_slice(format!("X-{i}: {}\r\n", "v".repeat(300)).as_bytes());
        }
        head.extend_from_slice(b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n");
        let lines = head.iter().filter(|&&b| b == b'\n').count();
        let (out, refused, screens) = one_byte_at_a_time(&head).await;
        assert!(
            screens <= lines + 1,
            "{screens} parses of {} bytes",
            head.len()
        );
        // Still refused, when whole.
        assert_eq!(refused, 1);
        assert_eq!(out.len(), head.len());
        assert!(String::from_utf8_lossy(&out).contains("Transfer-Encoding  chunked"));
        // A line that never ends: hyper is given the head it refuses as too large, once the
        // limit is passed.
        let mut long = b"GET /".to_vec();
        long.resize(9000, b'a');
        let (out, _, screens) = one_byte_at_a_time(&long).await;
        assert_eq!(out, overflow_head((8192, 100)));
        // Its first byte, then past the limit.
        assert_eq!(screens, 2);
        // A bad method goes to hyper (which answers 400) at its line's end.
        let bad = b"G(T / HTTP/1.1\r\nHost: x\r\n\r\n";
        let (out, _, screens) = one_byte_at_a_time(bad).await;
        assert_eq!(out, bad);
        // Its first byte, then its first line.
        assert_eq!(screens, 2);
    }

    /// Counts the reads that reach the socket.
    struct Reads<I> {
        inner: I,
        count: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }

    impl<I: AsyncRead + Unpin> AsyncRead for Reads<I> {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            self.count
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Pin::new(&mut self.inner).poll_read(cx, buf)
        }
    }

    /// What hyper is given for a head too large stops its parser as too large either way: by
    /// one field over its field limit (the usual limits, a few hundred bytes), or by a field
    /// value past its read buffer limit when that is the shorter.
    #[test]
    fn the_head_given_in_place_is_one_hyper_refuses_as_too_large() {
        let fields = overflow_head((2048, 100));
        assert!(fields.len() < 500, "{}", fields.len());
        let mut slots = [httparse::EMPTY_HEADER; 100];
        assert_eq!(
            httparse::Request::new(&mut slots).parse(&fields),
            Err(httparse::Error::TooManyHeaders)
        );
        let bytes = overflow_head((1024, 100_000));
        assert!(bytes.len() > 8192 && bytes.len() < 8300, "{}", bytes.len());
        let mut slots = [httparse::EMPTY_HEADER; 4];
        assert!(httparse::Request::new(&mut slots)
            .parse(&bytes)
            .is_ok_and(|s| s.is_partial()));
    }

    #[tokio::test]
    async fn a_small_first_read_reads_ahead_and_hands_over_the_rest() {
        let (mut client, server) = tokio::io::duplex(8192);
        let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut screened = Screened::new(
            Reads {
                inner: server,
                count: count.clone(),
            },
            8192,
            100,
            false,
            Counter::default(),
            Duration::from_secs(5),
        );
        let request: &[u8] = b"GET /a/long/enough/path HTTP/1.1\r\nHost: example\r\n\r\n";
        client.write_all(request).await.unwrap();
        // The preface check's 24 bytes, then hyper's read: one read of the socket for both.
        let mut sniff = [0u8; 24];
        screened.read_exact(&mut sniff).await.unwrap();
        let mut rest = vec![0u8; request.len() - 24];
        screened.read_exact(&mut rest).await.unwrap();
        assert_eq!(count.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert_eq!([&sniff[..], &rest[..]].concat(), request);
        assert!(
            screened.held.capacity() == 0,
            "no buffer kept between requests"
        );
        // The end of the stream still reads as the end.
        drop(client);
        let mut tail = Vec::new();
        screened.read_to_end(&mut tail).await.unwrap();
        assert!(tail.is_empty());
    }

    #[tokio::test]
    async fn passes_requests_and_bodies_unchanged_however_split() {
        let stream: &'static [u8] = b"POST /a HTTP/1.1\r\nContent-Length: 300\r\n\r\n";
        let mut body = stream.to_vec();
        body.extend(std::iter::repeat_n(b'x', 300));
        body.extend_from_slice(b"GET /b HTTP/1.1\r\nHost: a\r\n\r\n");
        let whole: &'static [u8] = Box::leak(body.into_boxed_slice());
        for split in [1, 7, 50, 200, 341, whole.len() - 3] {
            let (out, refused) = through(vec![&whole[..split], &whole[split..]]).await;
            assert_eq!(out, whole, "split at {split}");
            assert_eq!(refused, 0);
        }
    }

    #[tokio::test]
    async fn replayed_bytes_come_first_and_are_screened() {
        let (mut client, server) = tokio::io::duplex(64);
        let (mut screened, refused) = screen_of(server);
        screened.replay(
            b"GET / HTTP/1.1\r\nHost: a\r\n\r\nPOST / HTTP/1.1\r\nContent-Length: 1\r\n".to_vec(),
        );
        client
            .write_all(b"Transfer-Encoding: chunked\r\n\r\n")
            .await
            .unwrap();
        drop(client);
        let mut out = Vec::new();
        screened.read_to_end(&mut out).await.unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("GET / HTTP/1.1\r\nHost: a\r\n\r\nPOST / HTTP/1.1\r\n"));
        assert_eq!(
            refused.get(),
            1,
            "the replayed head's conflict was not screened"
        );
    }

    #[tokio::test]
    async fn a_conflicting_head_is_altered_and_counted() {
        let bad: &'static [u8] =
            b"POST / HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
        let (out, refused) = through(vec![&bad[..20], &bad[20..]]).await;
        assert_eq!(refused, 1);
        assert_eq!(out.len(), bad.len());
        assert!(String::from_utf8_lossy(&out).contains("Transfer-Encoding  chunked"));
    }
}
