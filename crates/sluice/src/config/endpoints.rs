//! `[endpoints]`: where the built-in endpoints are served (host, listener), and which families.

use serde::Serialize;

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

super::section::config_section!(EndpointsConfig {
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
