//! TLS connections on the HTTP/1.1 fast path: once the handshake settled on HTTP/1.1 (ALPN
//! `http/1.1`, or none), the connection is served by the same loop as a plain one, its answers
//! written through the record layer, until a request the fast path does not serve hands it to
//! hyper under the request screen, as a plain connection is handed.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Waker};

use tokio::io::AsyncWrite;

use super::stream::{FastStream, TlsClient};
use super::{End, Idle};
use crate::server::{Conn, Handler, SendWatch};

impl<H: Handler> Conn<H> {
    /// Serves a TLS connection whose handshake is done, to its end. It starts by reading, not by
    /// waiting for the socket: the first request may have come with the handshake's last
    /// flight, already opened and held by the record layer.
    pub(in crate::server) async fn serve_tls_fast(
        self: Arc<Self>,
        tls: TlsClient,
        peer: SocketAddr,
    ) {
        let mut idle = Idle::new(tls, self.clock.clone());
        loop {
            match self.serve_requests(&mut idle, peer).await {
                End::Idle => {
                    // Nothing is read or written while it waits: the record layer's buffers go
                    // (allocated again for the next request), as the head buffer went.
                    idle.stream.release_idle();
                    let waited = std::future::poll_fn(|cx| idle.poll_wait(&self, cx)).await;
                    if !waited {
                        return close(idle.into_stream());
                    }
                }
                End::Closed => return close(idle.into_stream()),
                End::HandOff(bytes) => {
                    let tls = idle.into_stream();
                    let watch = SendWatch::of(tls.tcp());
                    return self.clone().tls_to_hyper(tls, watch, peer, bytes).await;
                }
            }
        }
    }
}

/// Sends the TLS `close_notify` and the TCP FIN if the socket takes them now, as hyper's
/// connection does when it ends; a client that is not reading does not hold the task for it.
fn close(mut tls: TlsClient) {
    let mut cx = Context::from_waker(Waker::noop());
    let _ = Pin::new(&mut tls).poll_shutdown(&mut cx);
}
