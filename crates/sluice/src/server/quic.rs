//! HTTP/3 downstream: QUIC (quinn) on the TLS listeners' ports over UDP, with the same
//! certificates, HTTP/3 framing (h3), and requests handed to the same handler HTTP/1.1 and HTTP/2
//! use. Its settings (`[server.http3]`) are always read, so one config file serves every build.
//!
//! # Layout
//! - `endpoint`: the UDP socket and QUIC endpoint per listener, the accept loop (connection
//!   limit, address validation with Retry when many handshakes are pending, handshake timeout).
//! - `conn`: one HTTP/3 connection: accepts request streams, drains with GOAWAY on shutdown.
//! - `exchange`: one request stream: the request in, the handler's response out.
//! - `body`: an HTTP/3 request stream as an `http_body::Body`.
//! - `socket`: the UDP socket under an endpoint: tagged connection IDs, and the datagram
//!   hand-off between the old and the new process of a binary upgrade.

use serde::{Deserialize, Serialize};

#[cfg(feature = "http3")]
mod body;
#[cfg(feature = "http3")]
mod conn;
#[cfg(feature = "http3")]
mod endpoint;
#[cfg(feature = "http3")]
mod exchange;
#[cfg(feature = "http3")]
mod socket;

#[cfg(feature = "http3")]
pub use endpoint::{bind, Bound, Endpoints};
#[cfg(feature = "http3")]
pub use socket::{hand_over, inherit_reset_secret, reset_secret, tag, take_back, RESET_SECRET_LEN};

/// `[server.http3]`: HTTP/3 on the TLS listeners.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Http3Config {
    /// Serve HTTP/3 (QUIC over UDP) on every TLS listener's address, same port.
    pub enabled: bool,
    /// Advertise it with `Alt-Svc` on the HTTP/1.1 and HTTP/2 responses of TLS listeners.
    pub alt_svc: bool,
    /// How long a client may remember the `Alt-Svc` advertisement (its `ma`).
    pub alt_svc_max_age_secs: u64,
    /// QUIC connections open at once (over all listeners); more are refused.
    pub max_connections: usize,
    /// Request streams a client may have open at once on one connection.
    pub max_concurrent_streams: u32,
    /// Flow control: request body bytes a client may send ahead on one stream.
    pub stream_window_bytes: u32,
    /// Flow control: bytes a client may send ahead on one connection, all streams together.
    pub connection_window_bytes: u32,
    /// Response bytes buffered per connection ahead of the client's flow-control window.
    pub send_window_bytes: u64,
    /// Handshakes in progress above which a new client must first prove its address (a Retry
    /// round trip); 0 = always.
    pub retry_above_handshakes: usize,
    /// Handshakes in progress at most (and unvalidated client Initials queued); more are refused.
    pub max_handshakes: usize,
    /// Handshakes in progress at most from one client IP (IPv6: one /64) that proved its address
    /// (a Retry's token); more are refused (0 = no limit). Peers in `server.per_ip_exempt` are
    /// not counted.
    pub max_handshakes_per_ip: usize,
    /// Accept 0-RTT (early data). Off: early data can be replayed by an attacker. On, QUIC
    /// sessions resume from the session cache only (single use), as rustls requires for it.
    pub early_data: bool,
}

impl Default for Http3Config {
    fn default() -> Self {
        Http3Config {
            enabled: false,
            alt_svc: true,
            alt_svc_max_age_secs: 86_400,
            max_connections: 10_000,
            max_concurrent_streams: 100,
            stream_window_bytes: 1024 * 1024,
            connection_window_bytes: 4 * 1024 * 1024,
            send_window_bytes: 4 * 1024 * 1024,
            retry_above_handshakes: 64,
            max_handshakes: 1024,
            max_handshakes_per_ip: 32,
            early_data: false,
        }
    }
}

impl Http3Config {
    /// Checks what types alone cannot.
    pub fn validate(&self, tls: bool) -> anyhow::Result<()> {
        if !self.enabled {
            return Ok(());
        }
        if !cfg!(feature = "http3") {
            anyhow::bail!("server.http3.enabled needs a build with the `http3` feature");
        }
        if !tls {
            anyhow::bail!(
                "server.http3.enabled needs TLS on the listeners (server.tls_cert and tls_key, \
                 [[server.certificates]], or [acme] names): HTTP/3 is always encrypted"
            );
        }
        for (name, value) in [
            ("max_connections", self.max_connections as u64),
            (
                "max_concurrent_streams",
                u64::from(self.max_concurrent_streams),
            ),
            ("max_handshakes", self.max_handshakes as u64),
        ] {
            if value == 0 {
                anyhow::bail!("server.http3.{name} must be at least 1");
            }
        }
        if self.stream_window_bytes < 16 * 1024 || self.connection_window_bytes < 16 * 1024 {
            anyhow::bail!("server.http3 flow-control windows must be at least 16384 bytes");
        }
        if self.send_window_bytes < 16 * 1024 {
            anyhow::bail!("server.http3.send_window_bytes must be at least 16384");
        }
        Ok(())
    }

    /// The `Alt-Svc` value that points clients of a TLS listener on `port` at HTTP/3 there;
    /// `None` when HTTP/3 is off or not advertised.
    pub fn alt_svc(&self, port: u16) -> Option<http::HeaderValue> {
        if !(self.enabled && self.alt_svc && cfg!(feature = "http3")) {
            return None;
        }
        let value = format!("h3=\":{port}\"; ma={}", self.alt_svc_max_age_secs);
        http::HeaderValue::from_str(&value).ok()
    }
}
