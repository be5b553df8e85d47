//! The socket under a TLS handshake, read a whole record at a time: rustls never holds part of a
//! record when the handshake ends, so the connection's own record layer (`own`) takes over
//! exactly where rustls stopped, with the bytes read past it.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::record::{HEADER, MAX_CIPHERTEXT};

/// Bytes read ahead at once: a ClientHello, or a client's last flight and first request.
const READ_AHEAD: usize = 4096;

/// A socket whose reads end at record boundaries: bytes of a record are handed on once the whole
/// record has arrived, and never together with the next one.
pub struct Framed<IO> {
    io: IO,
    buf: Vec<u8>,
    /// Where the unread bytes start in `buf`.
    at: usize,
    /// What is left of the record being handed on, once its first bytes have been.
    left: usize,
    /// Reads go straight to the socket once the bytes here are handed on (`pass_through`).
    through: bool,
    /// A record was just handed on: the next read yields first (see `poll_read`).
    handed: bool,
}

impl<IO> Framed<IO> {
    pub fn new(io: IO) -> Framed<IO> {
        Framed {
            io,
            buf: Vec::new(),
            at: 0,
            left: 0,
            through: false,
            handed: false,
        }
    }

    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// After a handshake that stays with rustls: what is here is handed on, then reads go
    /// straight to the socket (no copy, no record boundaries).
    pub fn pass_through(&mut self) {
        self.through = true;
        self.handed = false;
    }

    /// rustls holds part of a record (its reader had less room than the record).
    pub fn holds_part(&self) -> bool {
        self.left > 0
    }

    /// The socket, and the bytes read from it and not yet handed on (whole records and perhaps
    /// the start of one), or `None` if rustls holds part of a record.
    pub fn into_parts(mut self) -> (IO, Option<Vec<u8>>) {
        let rest = (self.left == 0).then(|| self.buf.split_off(self.at));
        (self.io, rest)
    }

    /// The length of the whole record at the front of the unread bytes, once it is all there.
    /// A header that is not a TLS record's (a content type TLS does not have, a version that is
    /// not 3.x: plain HTTP sent to a TLS port) or names a record too long for TLS is handed on
    /// as it is: rustls refuses it at once, rather than after waiting for a length it read from
    /// text.
    fn whole_record(&self) -> Option<usize> {
        let unread = &self.buf[self.at..];
        if unread.len() < HEADER {
            return None;
        }
        let len = HEADER + u16::from_be_bytes([unread[3], unread[4]]) as usize;
        let not_tls = !(20..=24).contains(&unread[0]) || unread[1] != 3;
        if not_tls || len > HEADER + MAX_CIPHERTEXT {
            return Some(unread.len());
        }
        (unread.len() >= len).then_some(len)
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Framed<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.through {
            let unread = this.buf.len() - this.at;
            if unread == 0 {
                this.buf = Vec::new();
                this.at = 0;
                return Pin::new(&mut this.io).poll_read(cx, out);
            }
            let n = unread.min(out.remaining());
            out.put_slice(&this.buf[this.at..this.at + n]);
            this.at += n;
            return Poll::Ready(Ok(()));
        }
        // tokio-rustls reads on after the handshake is over, while rustls wants bytes: what it
        // read past the record that ended the handshake (a key update, an alert) would change
        // rustls's keys under the takeover. So each read after a record handed on yields once
        // (the task is woken at once): the handshake's loop sees the handshake over and stops.
        if std::mem::take(&mut this.handed) {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        loop {
            if this.left == 0 {
                this.left = this.whole_record().unwrap_or(0);
            }
            if this.left > 0 {
                let n = this.left.min(out.remaining());
                out.put_slice(&this.buf[this.at..this.at + n]);
                this.at += n;
                this.left -= n;
                this.handed = this.left == 0;
                return Poll::Ready(Ok(()));
            }
            // Not a whole record yet: read more, keeping the part already here.
            this.buf.drain(..this.at);
            this.at = 0;
            this.buf.reserve(READ_AHEAD);
            let len = this.buf.len();
            let mut spare = ReadBuf::uninit(this.buf.spare_capacity_mut());
            ready!(Pin::new(&mut this.io).poll_read(cx, &mut spare))?;
            let n = spare.filled().len();
            if n == 0 {
                // The end: what is here goes on as it is, and then the end does.
                let rest = this.buf.len() - this.at;
                if rest == 0 {
                    return Poll::Ready(Ok(()));
                }
                // Not a whole record: rustls sees it and then the end.
                this.left = rest;
                continue;
            }
            // SAFETY: `poll_read` initialised the first `n` bytes of the spare capacity.
            unsafe { this.buf.set_len(len + n) };
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Framed<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, data)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// Reads end at record boundaries, whatever the writes were.
    #[tokio::test]
    async fn reads_end_at_records() {
        let (mut a, b) = tokio::io::duplex(1 << 16);
        let mut f = Framed::new(b);
        let mut wire = vec![22, 3, 1, 0, 3, 1, 2, 3];
        wire.extend_from_slice(&[23, 3, 3, 0, 2, 7, 7]);
        wire.extend_from_slice(&[23, 3, 3, 0, 4, 9]);
        tokio::io::AsyncWriteExt::write_all(&mut a, &wire)
            .await
            .unwrap();
        let mut got = [0u8; 64];
        assert_eq!(f.read(&mut got).await.unwrap(), 8);
        assert_eq!(f.read(&mut got).await.unwrap(), 7);
        let (_, rest) = f.into_parts();
        assert_eq!(rest.unwrap(), [23, 3, 3, 0, 4, 9]);
    }

    /// A reader with less room than the record gets it in parts; the rest is not free to take.
    #[tokio::test]
    async fn part_of_a_record() {
        let (mut a, b) = tokio::io::duplex(1 << 16);
        let mut f = Framed::new(b);
        tokio::io::AsyncWriteExt::write_all(&mut a, &[23, 3, 3, 0, 3, 1, 2, 3])
            .await
            .unwrap();
        let mut got = [0u8; 6];
        assert_eq!(f.read(&mut got).await.unwrap(), 6);
        let (_, rest) = f.into_parts();
        assert!(rest.is_none());
    }

    /// Passing through: what was read ahead first, then the socket as it comes.
    #[tokio::test]
    async fn pass_through() {
        let (mut a, b) = tokio::io::duplex(1 << 16);
        let mut f = Framed::new(b);
        tokio::io::AsyncWriteExt::write_all(&mut a, &[23, 3, 3, 0, 1, 1, 23, 3])
            .await
            .unwrap();
        let mut got = [0u8; 64];
        assert_eq!(f.read(&mut got).await.unwrap(), 6);
        f.pass_through();
        assert_eq!(f.read(&mut got).await.unwrap(), 2);
        tokio::io::AsyncWriteExt::write_all(&mut a, &[3, 0])
            .await
            .unwrap();
        assert_eq!(f.read(&mut got).await.unwrap(), 2);
        assert_eq!(&got[..2], &[3, 0]);
    }
}
