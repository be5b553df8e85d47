//! sluice's own TLS 1.3 record layer for a client connection whose handshake rustls did: each
//! record is opened where it lies in the read buffer (rustls's record protection) and sealed
//! straight into the write buffer (the provider's AEAD, `seal`), with rustls's key schedule
//! (`docs/decisions/own-record-layer.md`).
//! The rules it keeps (alerts, key updates, the AES-GCM record limit) are in `record`.

use std::io::{self, IoSlice};
use std::ops::Range;
use std::pin::Pin;
use std::task::{Context, Poll};

use rustls::crypto::cipher::{InboundOpaqueMessage, MessageDecrypter};
use rustls::crypto::tls13::OkmBlock;
use rustls::{ContentType, ProtocolVersion, Tls13CipherSuite};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::record::{self, alert, Fatal, Inner, HEADER, MAX_CIPHERTEXT, MAX_PLAINTEXT};
use super::seal::Sealer;

/// Bytes read from the socket at once when the record needs no more: a request head or two.
const READ_AHEAD: usize = 4096;
/// Sealed bytes held for a socket that is not taking them before writers are told to wait (as
/// rustls's default buffer limit).
const WRITE_LIMIT: usize = 64 * 1024;
/// Buffers above this size are given back once empty, so a busy connection's do not stay large;
/// an idle one gives back the rest (`Own::release_idle`).
const KEEP: usize = 2 * (HEADER + MAX_CIPHERTEXT);
/// Slices gathered into one record at most.
const GATHER: usize = 16;

/// One direction's keys: the record protection for the current traffic secret (rustls's to open,
/// the provider's AEAD to seal in place), the next record's sequence number, and the secret (for
/// the next key update).
pub struct Keys<P> {
    pub protect: P,
    pub seq: u64,
    pub secret: OkmBlock,
}

/// A TLS 1.3 connection after its handshake.
pub struct Own<IO> {
    io: IO,
    suite: &'static Tls13CipherSuite,
    rx: Keys<Box<dyn MessageDecrypter>>,
    tx: Keys<Sealer>,
    /// Records sealed under one key before a key update (the suite's confidentiality limit,
    /// with room for the update's own record).
    tx_limit: u64,
    /// Received bytes; `rat` is where the unopened ones start.
    rbuf: Vec<u8>,
    rat: usize,
    /// Plaintext opened in `rbuf` and not yet read.
    plain: Range<usize>,
    /// Plaintext rustls had decrypted before the takeover, read first.
    early: Vec<u8>,
    /// Records without application data (key updates, empty records, ignored warnings) since
    /// the last that had some.
    idle_in_a_row: u32,
    /// The peer sent `close_notify`.
    read_closed: bool,
    /// The connection failed: every read and write after says so.
    failed: Option<Fatal>,
    /// Sealed bytes; `wat` is where the unsent ones start.
    wbuf: Vec<u8>,
    wat: usize,
    /// A key update was asked for: it is sent before the next record.
    owe_update: bool,
    close_sent: bool,
}

impl<IO> Own<IO> {
    /// The connection as rustls left it: `rest` read past the handshake and not opened, `early`
    /// plaintext rustls opened.
    pub fn new(
        io: IO,
        suite: &'static Tls13CipherSuite,
        rx: Keys<Box<dyn MessageDecrypter>>,
        tx: Keys<Sealer>,
        rest: Vec<u8>,
        early: Vec<u8>,
        read_closed: bool,
    ) -> Own<IO> {
        Own {
            io,
            suite,
            rx,
            tx,
            tx_limit: suite.common.confidentiality_limit.saturating_sub(2),
            rbuf: rest,
            rat: 0,
            plain: 0..0,
            early,
            idle_in_a_row: 0,
            read_closed,
            failed: None,
            wbuf: Vec::new(),
            wat: 0,
            owe_update: false,
            close_sent: false,
        }
    }

    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// Gives back the buffers a connection waiting for its next request does not need: the read
    /// buffer once it holds nothing unread (no plaintext, no part of a record), the write buffer
    /// once everything sealed was sent, and the plaintext rustls handed over once read. Each is
    /// allocated again when next used; bytes received or sealed and not yet passed on stay.
    pub fn release_idle(&mut self) {
        if self.early.is_empty() && self.early.capacity() != 0 {
            self.early = Vec::new();
        }
        if self.plain.is_empty() && self.rat == self.rbuf.len() && self.rbuf.capacity() != 0 {
            self.rbuf = Vec::new();
            self.rat = 0;
            self.plain = 0..0;
        }
        if self.wat == self.wbuf.len() && self.wbuf.capacity() != 0 {
            self.wbuf = Vec::new();
            self.wat = 0;
        }
    }

    /// The write buffer's size (tests of its bound).
    #[cfg(test)]
    pub fn write_buffer_capacity(&self) -> usize {
        self.wbuf.capacity()
    }

    /// The bytes the connection's buffers hold allocated (tests of what an idle one keeps).
    #[cfg(test)]
    pub fn buffer_capacity(&self) -> usize {
        self.rbuf.capacity() + self.wbuf.capacity() + self.early.capacity()
    }

    /// Seals records under one key up to `limit` only (tests of the key update it forces).
    #[cfg(test)]
    pub fn set_tx_limit(&mut self, limit: u64) {
        self.tx_limit = limit;
    }

    fn error(why: Fatal) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, why.why)
    }

    /// Ends the connection for `why`: its alert is queued (sent with what is flushed next) and
    /// every later read and write fails.
    fn fail(&mut self, why: Fatal) -> io::Error {
        if self.failed.is_none() {
            self.failed = Some(why);
            if why.alert != alert::CLOSE_NOTIFY && !self.close_sent {
                let _ = self.seal_raw(ContentType::Alert, &[&[2, why.alert]]);
            }
            // Nothing follows a fatal alert, sent or received: not even `close_notify`.
            self.close_sent = true;
        }
        Self::error(why)
    }

    /// Seals one record of `typ` holding `parts` (at most `MAX_PLAINTEXT` bytes together) into
    /// the write buffer; a key update goes first when one is owed or the key is worn.
    fn seal_one(&mut self, typ: ContentType, parts: &[&[u8]]) -> Result<(), Fatal> {
        if typ != ContentType::Alert && (self.owe_update || self.tx.seq >= self.tx_limit) {
            self.update_tx()?;
        }
        self.seal_raw(typ, parts)
    }

    fn seal_raw(&mut self, typ: ContentType, parts: &[&[u8]]) -> Result<(), Fatal> {
        if self.wat > 0 {
            // What was sent goes first, so the buffer holds only unsent bytes (bounded by
            // `WRITE_LIMIT` and a record) however long a slow reader keeps it from emptying.
            self.wbuf.drain(..self.wat);
            self.wat = 0;
        }
        self.tx
            .protect
            .seal_into(&mut self.wbuf, typ, parts, self.tx.seq)
            .map_err(|_| Fatal {
                alert: alert::CLOSE_NOTIFY,
                why: "encryption failed",
            })?;
        self.tx.seq += 1;
        Ok(())
    }

    /// Sends a key update (not asking for one back) under the current key (the limit leaves
    /// room for this record), then seals under the next one.
    fn update_tx(&mut self) -> Result<(), Fatal> {
        // The next key first: a key update is never sent without one to follow it.
        let next = record::next_keys(self.suite, &self.tx.secret);
        let Some(protect) = Sealer::new(self.suite, &next.key, next.iv) else {
            return Err(Fatal {
                alert: alert::CLOSE_NOTIFY,
                why: "encryption failed",
            });
        };
        let msg = record::key_update(false);
        self.seal_raw(ContentType::Handshake, &[&msg])?;
        self.tx = Keys {
            protect,
            seq: 0,
            secret: next.secret,
        };
        self.owe_update = false;
        Ok(())
    }

    /// Follows the peer's key update.
    fn update_rx(&mut self) {
        let next = record::next_keys(self.suite, &self.rx.secret);
        self.rx = Keys {
            protect: self.suite.aead_alg.decrypter(next.key, next.iv),
            seq: 0,
            secret: next.secret,
        };
    }

    /// Opens the records in the read buffer until one holds application data (`true`) or none
    /// is whole (`false`).
    fn open_next(&mut self) -> Result<bool, Fatal> {
        while let Some(len) = record::next_record(&self.rbuf[self.rat..])? {
            let start = self.rat;
            self.rat += len;
            let body = &mut self.rbuf[start + HEADER..start + len];
            let base = body.as_ptr() as usize;
            let msg = InboundOpaqueMessage::new(
                ContentType::ApplicationData,
                ProtocolVersion::TLSv1_2,
                body,
            );
            if self.rx.seq == u64::MAX {
                return Err(Fatal {
                    alert: alert::CLOSE_NOTIFY,
                    why: "record sequence exhausted",
                });
            }
            let plain = match self.rx.protect.decrypt(msg, self.rx.seq) {
                Ok(p) => p,
                Err(rustls::Error::PeerSentOversizedRecord) => {
                    return Err(Fatal {
                        alert: alert::RECORD_OVERFLOW,
                        why: "plaintext longer than 2^14",
                    })
                }
                Err(rustls::Error::DecryptError) => {
                    return Err(Fatal {
                        alert: alert::BAD_RECORD_MAC,
                        why: "a record failed authentication",
                    })
                }
                Err(_) => {
                    return Err(Fatal {
                        alert: alert::UNEXPECTED_MESSAGE,
                        why: "malformed protected record",
                    })
                }
            };
            self.rx.seq += 1;
            let at = start + HEADER + (plain.payload.as_ptr() as usize - base);
            let range = at..at + plain.payload.len();
            let inner = record::classify(u8::from(plain.typ), plain.payload)?;
            if inner == Inner::Data && !range.is_empty() {
                self.idle_in_a_row = 0;
                self.plain = range;
                return Ok(true);
            }
            // Each costs a decryption (a key update a key derivation too) and gives nothing: a
            // stream of them is an attack on CPU, not a use (rustls's limits are alike).
            self.idle_in_a_row += 1;
            if self.idle_in_a_row > record::MAX_IDLE_RECORDS_IN_A_ROW {
                return Err(Fatal {
                    alert: alert::UNEXPECTED_MESSAGE,
                    why: "too many key updates, empty records or warnings in a row",
                });
            }
            match inner {
                Inner::Data | Inner::Ignore => {}
                Inner::Closed => {
                    self.read_closed = true;
                    return Ok(false);
                }
                Inner::KeyUpdate(request) => {
                    // What follows is under the new key; ours changes before our next
                    // record (`seal_one`).
                    self.update_rx();
                    self.owe_update |= request;
                }
            }
        }
        Ok(false)
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Own<IO> {
    /// Writes sealed bytes until none wait or the socket takes no more.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.wat < self.wbuf.len() {
            match Pin::new(&mut self.io).poll_write(cx, &self.wbuf[self.wat..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => self.wat += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        self.wat = 0;
        self.wbuf.clear();
        if self.wbuf.capacity() > KEEP {
            self.wbuf = Vec::new();
        }
        Poll::Ready(Ok(()))
    }

    /// Reads from the socket into the read buffer: `Ready(Ok(0))` at its end.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.rat == self.rbuf.len() {
            self.rbuf.clear();
            if self.rbuf.capacity() > KEEP {
                self.rbuf = Vec::new();
            }
        } else if self.rat > 0 {
            self.rbuf.drain(..self.rat);
        }
        self.rat = 0;
        // Room for the whole record when its header is here, else for a read ahead.
        let want = match self.rbuf.get(3..5) {
            Some(len) => (HEADER + u16::from_be_bytes([len[0], len[1]]) as usize).max(READ_AHEAD),
            None => READ_AHEAD,
        };
        self.rbuf.reserve(want.saturating_sub(self.rbuf.len()));
        let len = self.rbuf.len();
        let mut spare = ReadBuf::uninit(self.rbuf.spare_capacity_mut());
        match Pin::new(&mut self.io).poll_read(cx, &mut spare) {
            Poll::Ready(Ok(())) => {
                let n = spare.filled().len();
                // SAFETY: `poll_read` initialised the first `n` bytes of the spare capacity.
                unsafe { self.rbuf.set_len(len + n) };
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Copies opened plaintext into `out` while there is some and room for it.
    fn take_plain(&mut self, out: &mut ReadBuf<'_>) -> Result<(), Fatal> {
        if !self.early.is_empty() {
            let n = self.early.len().min(out.remaining());
            out.put_slice(&self.early[..n]);
            self.early.drain(..n);
            return Ok(());
        }
        loop {
            if self.plain.is_empty() && !self.read_closed && !self.open_next()? {
                return Ok(());
            }
            if self.plain.is_empty() {
                return Ok(());
            }
            let n = self.plain.len().min(out.remaining());
            out.put_slice(&self.rbuf[self.plain.start..self.plain.start + n]);
            self.plain.start += n;
            if out.remaining() == 0 {
                return Ok(());
            }
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for Own<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(why) = this.failed {
            return Poll::Ready(Err(Self::error(why)));
        }
        let before = out.filled().len();
        loop {
            if let Err(why) = this.take_plain(out) {
                let e = this.fail(why);
                let _ = this.poll_send(cx);
                // Plaintext read before the bad record is the reader's; the failure is told at
                // the next read.
                if out.filled().len() > before {
                    return Poll::Ready(Ok(()));
                }
                return Poll::Ready(Err(e));
            }
            if out.filled().len() > before || this.read_closed || out.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            match this.poll_fill(cx) {
                Poll::Ready(Ok(0)) => {
                    // The end without `close_notify`, as rustls reports it.
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "peer closed connection without sending TLS close_notify",
                    )));
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Own<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(data)])
    }

    /// Seals what it is given into records of up to 16 KiB, each gathering as many of the
    /// slices as fit, and sends what the socket takes now; waits only while `WRITE_LIMIT`
    /// sealed bytes are still unsent.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(why) = this.failed {
            return Poll::Ready(Err(Self::error(why)));
        }
        if this.close_sent {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        if let Poll::Ready(Err(e)) = this.poll_send(cx) {
            return Poll::Ready(Err(e));
        }
        if this.wbuf.len() - this.wat >= WRITE_LIMIT {
            return Poll::Pending;
        }
        let mut taken = 0;
        let (mut slice, mut offset) = (0, 0);
        while slice < bufs.len() && this.wbuf.len() - this.wat < WRITE_LIMIT {
            let mut parts: [&[u8]; GATHER] = [&[]; GATHER];
            let (mut count, mut len) = (0, 0);
            while slice < bufs.len() && count < GATHER && len < MAX_PLAINTEXT {
                let rest = &bufs[slice][offset..];
                let n = rest.len().min(MAX_PLAINTEXT - len);
                if n > 0 {
                    parts[count] = &rest[..n];
                    count += 1;
                    len += n;
                }
                if n == rest.len() {
                    slice += 1;
                    offset = 0;
                } else {
                    offset += n;
                }
            }
            if len == 0 {
                break;
            }
            if let Err(why) = this.seal_one(ContentType::ApplicationData, &parts[..count]) {
                return Poll::Ready(Err(this.fail(why)));
            }
            taken += len;
        }
        match this.poll_send(cx) {
            Poll::Ready(Err(e)) if taken == 0 => Poll::Ready(Err(e)),
            // A write error after bytes were taken shows at the next write or flush.
            _ => Poll::Ready(Ok(taken)),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_send(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    /// Sends `close_notify`, then the end of the stream.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.close_sent {
            this.close_sent = true;
            let _ = this.seal_raw(ContentType::Alert, &[&[1, alert::CLOSE_NOTIFY]]);
        }
        std::task::ready!(this.poll_send(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::task::Waker;

    use rustls::crypto::tls13::OkmBlock;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    use super::*;

    /// One end of a connection on this record layer: it opens under traffic secret `rx` (every
    /// byte `rx`) and seals under `tx`, so two ends with the secrets crossed talk to each other.
    fn end(io: DuplexStream, rx: u8, tx: u8, early: Vec<u8>) -> Own<DuplexStream> {
        let suite = crate::crypto::backend::cipher_suite::TLS13_AES_128_GCM_SHA256
            .tls13()
            .unwrap();
        let r = record::keys_of(suite, OkmBlock::new(&[rx; 32]));
        let t = record::keys_of(suite, OkmBlock::new(&[tx; 32]));
        Own::new(
            io,
            suite,
            Keys {
                protect: suite.aead_alg.decrypter(r.key, r.iv),
                seq: 0,
                secret: r.secret,
            },
            Keys {
                protect: Sealer::new(suite, &t.key, t.iv).unwrap(),
                seq: 0,
                secret: t.secret,
            },
            Vec::new(),
            early,
            false,
        )
    }

    /// A read that finds nothing to read now, as the fast path's before it waits.
    fn reads_nothing(own: &mut Own<DuplexStream>) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        let mut buf = [0u8; 64];
        let mut out = ReadBuf::new(&mut buf);
        Pin::new(own).poll_read(&mut cx, &mut out).is_pending()
    }

    /// A request whose head carries a 15 KB cookie (one record of ~15 KB), a 32 KiB answer
    /// written at once (two full records): once the connection waits for its next request it
    /// holds no buffer; the next request and answer come through as before.
    #[tokio::test]
    async fn an_idle_connection_gives_its_buffers_back() {
        let (a, b) = tokio::io::duplex(1 << 20);
        let mut server = end(a, 1, 2, b"GET /early HTTP/1.1\r\n\r\n".to_vec());
        let mut client = end(b, 2, 1, Vec::new());
        let mut early = [0u8; 23];
        server.read_exact(&mut early).await.unwrap();
        assert_eq!(&early, b"GET /early HTTP/1.1\r\n\r\n");
        let head = format!("GET / HTTP/1.1\r\nCookie: {}\r\n\r\n", "c".repeat(15_000));
        client.write_all(head.as_bytes()).await.unwrap();
        client.flush().await.unwrap();
        let mut got = vec![0u8; head.len()];
        server.read_exact(&mut got).await.unwrap();
        assert!(got == head.as_bytes());
        let answer: Vec<u8> = (0..32 * 1024).map(|i| i as u8).collect();
        server.write_all(&answer).await.unwrap();
        server.flush().await.unwrap();
        let mut back = vec![0u8; answer.len()];
        client.read_exact(&mut back).await.unwrap();
        assert!(back == answer);

        assert!(reads_nothing(&mut server));
        let held = server.buffer_capacity();
        assert!(held > 32 * 1024 + 15_000, "the buffers held {held} B");
        server.release_idle();
        assert_eq!(server.buffer_capacity(), 0, "held {held} B before");

        // The next request at once: the buffers are allocated again, nothing else changes.
        for round in 0..2u8 {
            let next = format!("GET /next/{round} HTTP/1.1\r\n\r\n");
            client.write_all(next.as_bytes()).await.unwrap();
            client.flush().await.unwrap();
            let mut got = vec![0u8; next.len()];
            server.read_exact(&mut got).await.unwrap();
            assert!(got == next.as_bytes());
            server.write_all(&answer[..1000]).await.unwrap();
            server.flush().await.unwrap();
            let mut back = vec![0u8; 1000];
            client.read_exact(&mut back).await.unwrap();
            assert!(back[..] == answer[..1000]);
            assert!(reads_nothing(&mut server));
            server.release_idle();
            assert_eq!(server.buffer_capacity(), 0);
        }
    }

    /// Bytes not passed on yet stay through `release_idle`: part of a record, plaintext not read
    /// yet (rustls's and the record layer's), sealed bytes the socket has not taken.
    #[tokio::test]
    async fn release_idle_keeps_what_is_not_passed_on() {
        // A record as the client sends it.
        let (c, mut wire) = tokio::io::duplex(1 << 20);
        let mut client = end(c, 2, 1, Vec::new());
        let msg: Vec<u8> = (0..3000).map(|i| (i * 7) as u8).collect();
        client.write_all(&msg).await.unwrap();
        client.flush().await.unwrap();
        let mut rec = vec![0u8; HEADER + msg.len() + 17];
        wire.read_exact(&mut rec).await.unwrap();

        let (s, mut feed) = tokio::io::duplex(2000);
        let mut server = end(s, 1, 2, b"early bytes".to_vec());
        let mut first = [0u8; 5];
        server.read_exact(&mut first).await.unwrap();
        server.release_idle();
        // (Each check of a capacity fails at once where a lost byte would leave a read waiting.)
        assert!(server.buffer_capacity() > 0);
        // Part of a record.
        feed.write_all(&rec[..10]).await.unwrap();
        let mut rest = [0u8; 6];
        server.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b" bytes");
        assert!(reads_nothing(&mut server));
        server.release_idle();
        assert!(server.buffer_capacity() > 0);
        feed.write_all(&rec[10..1500]).await.unwrap();
        assert!(reads_nothing(&mut server));
        server.release_idle();
        let writer = tokio::spawn(async move {
            feed.write_all(&rec[1500..]).await.unwrap();
            feed
        });
        // Plaintext opened and not all read.
        let mut got = vec![0u8; 100];
        server.read_exact(&mut got).await.unwrap();
        server.release_idle();
        assert!(server.buffer_capacity() > 0);
        got.resize(msg.len(), 0);
        server.read_exact(&mut got[100..]).await.unwrap();
        assert!(got == msg);
        let mut feed = writer.await.unwrap();

        // Sealed bytes the socket (room for 2,000 bytes) has not taken.
        let answer: Vec<u8> = (0..5000).map(|i| (i * 3) as u8).collect();
        let n = std::future::poll_fn(|cx| Pin::new(&mut server).poll_write(cx, &answer))
            .await
            .unwrap();
        assert_eq!(n, answer.len());
        server.release_idle();
        assert!(server.write_buffer_capacity() > 0);
        let mut back = vec![0u8; HEADER + answer.len() + 17];
        let (flushed, read) = tokio::join!(server.flush(), feed.read_exact(&mut back));
        flushed.unwrap();
        read.unwrap();
        let (c, mut wire) = tokio::io::duplex(1 << 20);
        let mut client = end(c, 2, 1, Vec::new());
        wire.write_all(&back).await.unwrap();
        let mut plain = vec![0u8; answer.len()];
        client.read_exact(&mut plain).await.unwrap();
        assert!(plain == answer);
    }
}
