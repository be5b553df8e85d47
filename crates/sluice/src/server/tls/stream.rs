//! A client's TLS connection once its handshake is done: TLS 1.3 on sluice's own record layer
//! (`own`), taken over from rustls with the keys and sequence numbers rustls reached; TLS 1.2, or
//! a handshake that ended in a state the takeover cannot start from, stays with rustls.

use std::io::{self, IoSlice, Read};
use std::pin::Pin;
use std::task::{Context, Poll};

use rustls::crypto::cipher::{AeadKey, Iv};
use rustls::{ConnectionTrafficSecrets, SupportedCipherSuite};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::capture::Secrets;
use super::framed::Framed;
use super::own::{Keys, Own};
use super::record;
use super::seal::Sealer;

/// The handshake's stream: rustls over the socket read a record at a time.
pub type Handshaken<IO> = tokio_rustls::server::TlsStream<Framed<IO>>;

/// A client's TLS connection after the handshake. sluice's record layer, the common case, is
/// held inline (it is read and written for every request); rustls's, boxed.
#[allow(clippy::large_enum_variant)]
pub enum ServerTls<IO> {
    Own(Own<IO>),
    Rustls(Box<Handshaken<IO>>),
}

impl<IO: AsyncRead + AsyncWrite + Unpin> ServerTls<IO> {
    /// The connection `tls` continues on sluice's record layer when it can (TLS 1.3, the
    /// traffic secrets kept by `capture`, nothing of rustls's left unsent or half read).
    pub fn take_over(tls: Handshaken<IO>, secrets: Secrets) -> io::Result<ServerTls<IO>> {
        let (framed, conn) = tls.get_ref();
        let suite = match conn.negotiated_cipher_suite() {
            Some(SupportedCipherSuite::Tls13(suite)) if Sealer::knows(suite) => Some(suite),
            _ => None,
        };
        let ready = !conn.wants_write() && !framed.holds_part();
        let (Some(suite), Some(client), Some(server), true) =
            (suite, secrets.client, secrets.server, ready)
        else {
            return Ok(ServerTls::rustls(tls));
        };
        let (framed, mut conn) = tls.into_inner();
        // A request that came with the handshake's last flight, opened by rustls already.
        let mut early = Vec::new();
        let mut closed = false;
        let mut chunk = [0u8; 4096];
        loop {
            match conn.reader().read(&mut chunk) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(n) => early.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        let extracted = conn.dangerous_extract_secrets().map_err(io::Error::other)?;
        let ((rx_seq, rx), (tx_seq, tx)) = (extracted.rx, extracted.tx);
        let (Some((rx_key, rx_iv)), Some((tx_key, tx_iv))) = (key_and_iv(rx), key_and_iv(tx))
        else {
            return Err(io::Error::other("TLS traffic keys of an unknown kind"));
        };
        // The kept secrets must be the ones behind rustls's keys, or a key update would derive
        // keys the peer does not use (or one already used): the IVs they give are compared.
        if record::iv_of(suite, &client).as_ref() != rx_iv.as_ref()
            || record::iv_of(suite, &server).as_ref() != tx_iv.as_ref()
        {
            return Err(io::Error::other(
                "TLS traffic secrets do not match the keys",
            ));
        }
        // Records are sealed with the provider's AEAD itself (`seal`), into the write buffer.
        let Some(seal) = Sealer::new(suite, &tx_key, tx_iv) else {
            return Err(io::Error::other("TLS 1.3 suite without a sealer"));
        };
        let (io, rest) = framed.into_parts();
        let rest = rest.ok_or_else(|| io::Error::other("TLS record split at the takeover"))?;
        Ok(ServerTls::Own(Own::new(
            io,
            suite,
            Keys {
                protect: suite.aead_alg.decrypter(rx_key, rx_iv),
                seq: rx_seq,
                secret: client,
            },
            Keys {
                protect: seal,
                seq: tx_seq,
                secret: server,
            },
            rest,
            early,
            closed,
        )))
    }
}

impl<IO> ServerTls<IO> {
    /// The connection stays with rustls, its reads no longer a record at a time.
    fn rustls(mut tls: Handshaken<IO>) -> ServerTls<IO> {
        tls.get_mut().0.pass_through();
        ServerTls::Rustls(Box::new(tls))
    }

    /// The socket underneath.
    pub fn get_ref(&self) -> &IO {
        match self {
            ServerTls::Own(own) => own.get_ref(),
            ServerTls::Rustls(tls) => tls.get_ref().0.get_ref(),
        }
    }

    /// Served by sluice's record layer.
    pub fn is_own(&self) -> bool {
        matches!(self, ServerTls::Own(_))
    }

    /// The connection waits for its next request: sluice's record layer gives back the buffers
    /// it holds nothing in (`Own::release_idle`). rustls's keeps its own.
    pub fn release_idle(&mut self) {
        if let ServerTls::Own(own) = self {
            own.release_idle();
        }
    }
}

/// The key and IV of TLS 1.3 traffic keys.
fn key_and_iv(keys: ConnectionTrafficSecrets) -> Option<(AeadKey, Iv)> {
    match keys {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv }
        | ConnectionTrafficSecrets::Aes256Gcm { key, iv }
        | ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => Some((key, iv)),
        _ => None,
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for ServerTls<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerTls::Own(s) => Pin::new(s).poll_read(cx, buf),
            ServerTls::Rustls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for ServerTls<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ServerTls::Own(s) => Pin::new(s).poll_write(cx, data),
            ServerTls::Rustls(s) => Pin::new(s.as_mut()).poll_write(cx, data),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ServerTls::Own(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            ServerTls::Rustls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            ServerTls::Own(s) => s.is_write_vectored(),
            ServerTls::Rustls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerTls::Own(s) => Pin::new(s).poll_flush(cx),
            ServerTls::Rustls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerTls::Own(s) => Pin::new(s).poll_shutdown(cx),
            ServerTls::Rustls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
