//! `[server]` (listeners, TLS, limits, runtime) and `[endpoints]` (where the built-ins are
//! served): the server's sections, their defaults and their checks.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::bail;
use serde::{Deserialize, Serialize};

use crate::section::config_section;

/// Listeners and the downstream HTTP server.
#[derive(Debug, Clone, Serialize)]
pub struct ServerConfig {
    /// Addresses to listen on: the main listener (named `main`), which serves the user routes and
    /// the built-ins unless they name another listener.
    pub listen: Vec<SocketAddr>,
    /// More listeners, each with a name that routes (`listener = "..."`) and `[endpoints]`
    /// (`listener = "..."`) use to put themselves there instead: an admin port for `/metrics`.
    pub listeners: Vec<NamedListener>,
    /// PEM certificate chain; with `tls_key`, every listener speaks TLS (HTTP/2 and 1.1 by ALPN).
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// More certificates, chosen by the TLS server name (SNI); `tls_cert` serves every other name.
    pub certificates: Vec<super::tls::CertConfig>,
    /// File the process id is written to at startup, for `sluice reload`.
    pub pid_file: Option<PathBuf>,
    /// Seconds a keep-alive connection may sit idle between requests.
    pub idle_timeout_secs: u64,
    /// Seconds a client has to send a complete request head once it has begun one, and to begin
    /// the first one on a new connection.
    pub header_read_timeout_secs: u64,
    /// Largest request head accepted, in bytes.
    pub max_header_bytes: usize,
    /// Most request headers accepted.
    pub max_headers: usize,
    /// Seconds in-flight responses get to finish after SIGTERM/SIGINT.
    pub shutdown_grace_secs: u64,
    /// Client connections open at once across all listeners; at the limit sluice stops accepting
    /// (new clients wait in the kernel backlog) until one closes. 0: derived from the open-file
    /// limit, which sluice raises to its hard limit at start: (limit - 64) / 2.
    pub max_connections: usize,
    /// Connections one client IP may hold open at once (0 = no limit); past it a new
    /// connection from that IP is closed at once, so one client cannot take every slot of
    /// `max_connections` from everyone else.
    pub max_connections_per_ip: usize,
    /// WebSocket tunnels one client may hold open at once through reverse routes (0 = no limit);
    /// unset, `max_connections_per_ip`. Each holds an upstream socket for as long as it lasts,
    /// and one HTTP/2 or HTTP/3 connection carries many, so a site whose offices need thousands
    /// of connections per address can still hold each to a few long-lived tunnels. Counted as
    /// connections are (an IPv6 client by its /64 and /48), `per_ip_exempt` exempt; live on
    /// reload, over the tunnels open ([`ServerConfig::tunnels_per_ip`]).
    pub max_tunnels_per_ip: Option<usize>,
    /// Peers `max_connections_per_ip` does not apply to: by default loopback (a reverse proxy or
    /// load generator on the same host).
    pub per_ip_exempt: Vec<ipnet::IpNet>,
    /// Seconds a client may keep its receive window shut (no byte accepted) while a response is
    /// being sent; then the connection is cut and its upstream fetch and buffers released.
    pub send_timeout_secs: u64,
    /// Seconds a TLS client has to finish its handshake (separate from `idle_timeout_secs`).
    pub tls_handshake_timeout_secs: u64,
    /// TLS 1.3 connections continue on sluice's own record layer after rustls's handshake
    /// (records decrypted and encrypted in place); `false` keeps rustls's throughout.
    pub tls_own_record_layer: bool,
    /// HTTP/2: streams a client may have open at once on one connection; more are refused
    /// with `REFUSED_STREAM`. At most [`MAX_H2_STREAMS`].
    pub h2_max_concurrent_streams: u32,
    /// HTTP/2 connections are served by sluice's own HTTP/2 server (`server/http2`); `false`
    /// serves them with hyper's.
    pub h2_own_server: bool,
    /// HTTP/2: response bytes buffered per stream ahead of the client's flow-control window;
    /// one connection holds at most this times `h2_max_concurrent_streams`.
    pub h2_max_send_buf_bytes: usize,
    /// HTTP/2 (sluice's own server): the flow-control window of a connection's request bodies
    /// together, what one connection can make the server hold of request bodies not yet read;
    /// each body's own is a quarter of it (at least 64 KiB, or all of it when smaller), so one
    /// body nobody reads yet leaves the rest to the others. One upload moves its own window per
    /// round trip.
    pub h2_recv_window_bytes: u32,
    /// The runtime model: `work-stealing` (one multi-threaded runtime) or `per-core` (one
    /// current-thread runtime per thread, each with its own `SO_REUSEPORT` listeners and upstream
    /// pools).
    pub runtime: crate::runtime::RuntimeModel,
    /// Threads serving connections (work-stealing workers, or per-core runtimes); 0 = one per
    /// available core.
    pub threads: usize,
    /// HTTP/1.1 connections (plain, or TLS that settled on HTTP/1.1) serve simple GET/HEAD
    /// requests for plain-HTTP, uncached reverse routes on sluice's own HTTP/1.1 path, handing
    /// everything else to the general server.
    pub h1_fast_path: bool,
    /// Microseconds a current-thread runtime (one thread, or each per-core runtime) keeps polling
    /// for events after an HTTP request or TCP relay traffic before it sleeps; 0 = sleep at once
    /// (`runtime::busy_poll`).
    pub busy_poll_us: u64,
    /// After a burst, once a second passes with no new connection or request, free memory goes
    /// back to the system (`malloc_trim` with glibc, the kept large blocks in the static musl
    /// build; `runtime::release`).
    pub release_memory: bool,
    /// `[server.http3]`: HTTP/3 (QUIC) on the TLS listeners.
    pub http3: super::quic::Http3Config,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: vec![SocketAddr::from(([127, 0, 0, 1], 8888))],
            listeners: Vec::new(),
            tls_cert: None,
            tls_key: None,
            certificates: Vec::new(),
            pid_file: None,
            idle_timeout_secs: 75,
            header_read_timeout_secs: 30,
            max_header_bytes: 64 * 1024,
            max_headers: 100,
            shutdown_grace_secs: 10,
            max_connections: 0,
            max_connections_per_ip: 256,
            max_tunnels_per_ip: None,
            per_ip_exempt: vec![
                "127.0.0.0/8".parse().expect("valid net"),
                "::1/128".parse().expect("valid net"),
            ],
            send_timeout_secs: 60,
            tls_handshake_timeout_secs: 10,
            tls_own_record_layer: true,
            h2_max_concurrent_streams: 100,
            h2_own_server: true,
            h2_max_send_buf_bytes: 128 * 1024,
            h2_recv_window_bytes: 1 << 20,
            runtime: crate::runtime::RuntimeModel::WorkStealing,
            threads: 0,
            h1_fast_path: true,
            // Off: under an equal CPU budget it cost 1.5–2.4× the CPU per request at steady
            // moderate rates for at most a few ms of p99 (docs/decisions/busy-poll-default.md).
            busy_poll_us: 0,
            release_memory: true,
            http3: Default::default(),
        }
    }
}

config_section!(ServerConfig {
    listen,
    listeners,
    tls_cert,
    tls_key,
    certificates,
    pid_file,
    idle_timeout_secs,
    header_read_timeout_secs,
    max_header_bytes,
    max_headers,
    shutdown_grace_secs,
    max_connections,
    max_connections_per_ip,
    max_tunnels_per_ip,
    per_ip_exempt,
    send_timeout_secs,
    tls_handshake_timeout_secs,
    tls_own_record_layer,
    h2_max_concurrent_streams,
    h2_own_server,
    h2_max_send_buf_bytes,
    h2_recv_window_bytes,
    runtime,
    threads,
    h1_fast_path,
    busy_poll_us,
    release_memory,
    http3,
});

/// `[[server.listeners]]`: a named listener. It serves only the routes and built-ins that name it,
/// with the server's TLS settings and limits.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NamedListener {
    /// The name routes and `[endpoints]` refer to (`main` is `server.listen`).
    pub name: String,
    /// Addresses this listener binds.
    pub listen: Vec<SocketAddr>,
}

/// The name of the listener `server.listen` declares.
pub const MAIN_LISTENER: &str = "main";

/// The most `server.threads` may ask for: past any machine sluice runs on, and far below where
/// the system refuses to start another thread (which would stop the start with a panic).
pub const MAX_THREADS: usize = 1024;
/// The largest `max_tunnels_per_ip`: each tunnel holds an upstream socket, so as for every
/// `max_connections*` key, far past any descriptor limit (2^24).
pub const MAX_TUNNELS_PER_IP: usize = 1 << 24;

/// The most `server.h2_max_concurrent_streams` may allow: past what a client needs, and each
/// connection keeps state per stream (and remembers as many streams it reset).
pub const MAX_H2_STREAMS: u32 = 10_000;

/// Bounds of `server.h2_recv_window_bytes`: HTTP/2's initial window, and 64 MiB.
const MIN_H2_WINDOW: u32 = 65_535;
const MAX_H2_WINDOW: u32 = 64 << 20;

impl ServerConfig {
    /// Every listener's name, by listener id: `main` (id 0), then `[[server.listeners]]` in order.
    pub fn listener_names(&self) -> Vec<String> {
        std::iter::once(MAIN_LISTENER.to_string())
            .chain(self.listeners.iter().map(|l| l.name.clone()))
            .collect()
    }

    /// Every address to bind with the id of the listener it belongs to.
    pub fn all_listen(&self) -> Vec<(usize, SocketAddr)> {
        let main = self.listen.iter().map(|a| (0, *a));
        let named = self
            .listeners
            .iter()
            .enumerate()
            .flat_map(|(i, l)| l.listen.iter().map(move |a| (i + 1, *a)));
        main.chain(named).collect()
    }

    /// The id of the listener called `name` (empty = `main`).
    pub fn listener_id(&self, name: &str) -> Option<usize> {
        if name.is_empty() {
            return Some(0);
        }
        self.listener_names().iter().position(|n| n == name)
    }

    /// Open WebSocket tunnels one client may hold (0 = no limit): `max_tunnels_per_ip`, or
    /// when unset `max_connections_per_ip`.
    pub fn tunnels_per_ip(&self) -> usize {
        self.max_tunnels_per_ip
            .unwrap_or(self.max_connections_per_ip)
    }

    /// Checks what the types alone cannot, within `[server]`, for a server whose TLS
    /// certificates are all in this section.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.validate_with(false)
    }

    /// [`ServerConfig::validate`] for a server that may also hold certificates managed
    /// elsewhere (`managed_tls`: `[acme]` is on), which make its listeners TLS as well.
    pub fn validate_with(&self, managed_tls: bool) -> anyhow::Result<()> {
        if self.listen.is_empty() {
            bail!("server.listen is empty: give at least one address, e.g. \"127.0.0.1:8888\"");
        }
        let mut names = std::collections::HashSet::new();
        for l in &self.listeners {
            if l.name.is_empty() || l.name == MAIN_LISTENER || !names.insert(l.name.as_str()) {
                bail!(
                    "server.listeners: name {:?} is empty, reserved (\"main\" is server.listen) or used twice",
                    l.name
                );
            }
            if l.listen.is_empty() {
                bail!("server.listeners {:?}: listen is empty", l.name);
            }
        }
        match (&self.tls_cert, &self.tls_key) {
            (Some(_), None) | (None, Some(_)) => {
                bail!("server.tls_cert and server.tls_key must be given together")
            }
            _ => {}
        }
        self.http3
            .validate(managed_tls || self.tls_cert.is_some() || !self.certificates.is_empty())?;
        for (name, value) in [
            ("server.idle_timeout_secs", self.idle_timeout_secs),
            ("server.send_timeout_secs", self.send_timeout_secs),
            (
                "server.tls_handshake_timeout_secs",
                self.tls_handshake_timeout_secs,
            ),
            (
                "server.h2_max_concurrent_streams",
                u64::from(self.h2_max_concurrent_streams),
            ),
            (
                "server.header_read_timeout_secs",
                self.header_read_timeout_secs,
            ),
        ] {
            if value == 0 {
                bail!("{name} must be at least 1");
            }
        }
        if self.h2_max_concurrent_streams > MAX_H2_STREAMS {
            bail!("server.h2_max_concurrent_streams must be from 1 to {MAX_H2_STREAMS}");
        }
        if self.max_header_bytes < 1024 {
            bail!("server.max_header_bytes must be at least 1024");
        }
        if self.h2_max_send_buf_bytes < 16 * 1024 {
            bail!("server.h2_max_send_buf_bytes must be at least 16384 (one HTTP/2 frame)");
        }
        // Below HTTP/2's initial 65535 the connection's window could not be shrunk to match.
        if !(MIN_H2_WINDOW..=MAX_H2_WINDOW).contains(&self.h2_recv_window_bytes) {
            bail!(
                "server.h2_recv_window_bytes must be from {MIN_H2_WINDOW} to {MAX_H2_WINDOW} (64 MiB)"
            );
        }
        if self
            .max_tunnels_per_ip
            .is_some_and(|n| n > MAX_TUNNELS_PER_IP)
        {
            bail!(
                "server.max_tunnels_per_ip must be at most {MAX_TUNNELS_PER_IP}; 0 = no limit, \
                 unset = max_connections_per_ip"
            );
        }
        if self.threads > MAX_THREADS {
            bail!("server.threads must be at most {MAX_THREADS}; 0 = one per available core");
        }
        // Past a second the poll no longer bridges gaps between packets: it only burns the core.
        if self.busy_poll_us > 1_000_000 {
            bail!("server.busy_poll_us must be at most 1000000 (1 s); 0 turns polling off");
        }
        if !cfg!(feature = "tls") && (self.tls_cert.is_some() || !self.certificates.is_empty()) {
            bail!("server.tls_cert and server.certificates need a build with the `tls` feature");
        }
        Ok(())
    }
}

/// `[endpoints]`: where the built-in endpoints are served, or whether at all.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EndpointsConfig {
    /// Serve the built-ins only for this host (`example.com` or `*.example.com`); empty = any host.
    pub host: String,
    /// Serve the built-ins only on this listener (a `[[server.listeners]]` name); empty = `main`
    /// (`server.listen`).
    pub listener: String,
    /// The MediaFlow-compatible `/proxy/*`, `/generate_url*`, `/base64/*` and `/playlist/*`
    /// endpoints, and the pages (`/`, `/playlist/builder`, `/url-generator`).
    pub media: bool,
    /// The IPTV gateway: `/rtp/`, `/udp/`, `/rtsp/`, `/playlist.m3u`, `/status`.
    pub iptv: bool,
    /// `/health`.
    pub health: bool,
    /// `/metrics`.
    pub metrics: bool,
    /// `POST /admin/reload` (password in the `api_password` header).
    pub admin: bool,
}

config_section!(EndpointsConfig {
    host,
    listener,
    media,
    iptv,
    health,
    metrics,
    admin,
});

impl Default for EndpointsConfig {
    fn default() -> Self {
        EndpointsConfig {
            host: String::new(),
            listener: String::new(),
            media: true,
            iptv: true,
            health: true,
            metrics: true,
            admin: true,
        }
    }
}

impl EndpointsConfig {
    /// Checks `host` (whether `listener` names a listener is the composition's check).
    pub fn validate(&self) -> anyhow::Result<()> {
        sluice_http::route::HostPattern::parse(&self.host)
            .map_err(|e| anyhow::anyhow!("endpoints.host: {e}"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `max_tunnels_per_ip` unset follows `max_connections_per_ip`; set, it is its own bound
    /// (0: no limit), at most `MAX_TUNNELS_PER_IP`.
    #[test]
    fn the_tunnel_share_defaults_to_the_connection_share() {
        let parse = |t: &str| -> ServerConfig { toml::from_str(t).unwrap() };
        assert_eq!(parse("").tunnels_per_ip(), 256);
        assert_eq!(
            parse("max_connections_per_ip = 2000").tunnels_per_ip(),
            2000
        );
        let own = parse("max_connections_per_ip = 2000\nmax_tunnels_per_ip = 50");
        assert_eq!(own.tunnels_per_ip(), 50);
        own.validate().unwrap();
        assert_eq!(parse("max_tunnels_per_ip = 0").tunnels_per_ip(), 0);
        let err = parse("max_tunnels_per_ip = 16777217")
            .validate()
            .unwrap_err();
        assert!(
            err.to_string().contains("server.max_tunnels_per_ip"),
            "{err}"
        );
        parse(&format!("max_tunnels_per_ip = {MAX_TUNNELS_PER_IP}"))
            .validate()
            .unwrap();
    }

    /// `h2_max_concurrent_streams` is from 1 to `MAX_H2_STREAMS`: each connection remembers as
    /// many streams it reset, and a frame on a closed stream looks there (unbounded, a config
    /// could ask for millions).
    #[test]
    fn the_http2_stream_limit_is_bounded() {
        let parse = |t: &str| -> ServerConfig { toml::from_str(t).unwrap() };
        for ok in [1, 100, MAX_H2_STREAMS] {
            parse(&format!("h2_max_concurrent_streams = {ok}"))
                .validate()
                .unwrap();
        }
        for bad in [0, MAX_H2_STREAMS + 1, u32::MAX] {
            let err = parse(&format!("h2_max_concurrent_streams = {bad}"))
                .validate()
                .unwrap_err()
                .to_string();
            assert!(err.contains("server.h2_max_concurrent_streams"), "{err}");
            if bad > 0 {
                assert!(err.contains("from 1 to 10000"), "{err}");
            }
        }
    }
}
