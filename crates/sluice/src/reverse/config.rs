//! The reverse proxy's config types: `[[routes]]` entries and the `[reverse]` section, with their
//! validation.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sluice_http::route::{check_prefix, HostPattern};

/// One `[[routes]]` entry: which requests (host, path prefix) go to which upstream group, and how.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// `example.com`, `*.example.com`, or absent for any host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Path prefix; the longest matching prefix wins.
    #[serde(default = "root")]
    pub path: String,
    /// The listener (`[[server.listeners]]` name) serving the route; absent: `main`
    /// (`server.listen`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listener: Option<String>,
    /// The `[[upstreams]]` group that serves the route.
    pub upstream: String,
    /// Send the client's `Host` upstream (otherwise the chosen server's `host:port`).
    #[serde(default = "yes")]
    pub preserve_host: bool,
    /// Remove the route's path prefix before forwarding (`/api/x` → `/x`).
    #[serde(default)]
    pub strip_prefix: bool,
    /// Replace the route's path prefix with this one before forwarding (`/api/x` → `/v2/x`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<String>,
    /// Headers set on the upstream request (replacing any the client sent).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub request_headers_add: BTreeMap<String, String>,
    /// Headers removed from the upstream request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub request_headers_remove: Vec<String>,
    /// Headers set on the response to the client.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub response_headers_add: BTreeMap<String, String>,
    /// Headers removed from the response to the client.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub response_headers_remove: Vec<String>,
    /// Largest request body accepted, in bytes (413 beyond); 0 = no limit (bodies stream, never held).
    #[serde(default)]
    pub max_body_bytes: u64,
    /// Seconds to connect (and TLS handshake) to one server before trying the next.
    #[serde(default = "default_connect")]
    pub connect_timeout_secs: u64,
    /// Seconds from sending the request to the response head (504 beyond).
    #[serde(default = "default_headers")]
    pub header_timeout_secs: u64,
    /// Seconds a body (either direction) or a tunnel may go without a byte before it is cut.
    #[serde(default = "default_idle")]
    pub idle_timeout_secs: u64,
    /// How sluice talks to the servers: `http1`, `h2c` (HTTP/2 prior knowledge) or `https`
    /// (TLS, HTTP/2 or 1.1 by ALPN).
    #[serde(default)]
    pub upstream_protocol: UpstreamProtocol,
    /// Verify the servers' TLS certificates (webpki roots) with `upstream_protocol = "https"`.
    #[serde(default = "yes")]
    pub tls_verify: bool,
    /// TLS server name sent and verified; default: the server's host from `servers`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_sni: Option<String>,
    /// PEM file of extra CA certificates trusted for the servers (besides the webpki roots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// Attempts per request across servers (connect failures always move on; see `docs/reverse-proxy.md`).
    #[serde(default = "default_attempts")]
    pub max_attempts: u32,
    /// Tunnel WebSocket upgrades (HTTP/1.1 Upgrade and HTTP/2 extended CONNECT).
    #[serde(default = "yes")]
    pub websocket: bool,
    /// Pass request fields whose name holds `_` (`X_Forwarded_For`...) to the servers; off, they
    /// are dropped, as nginx's `underscores_in_headers off` does.
    #[serde(default)]
    pub underscores_in_headers: bool,
    /// Pass `X-HTTP-Method-Override`, `X-HTTP-Method`, `X-Method-Override`, `X-Original-URL` and
    /// `X-Rewrite-URL` to the servers; off, they are dropped.
    #[serde(default)]
    pub override_headers: bool,
    /// Serve GET/HEAD through the slice cache (`[cache]`); unsafe methods invalidate, `PURGE` purges.
    #[serde(default)]
    pub cache: bool,
    /// Stale window for this route when the origin names none (default: `[cache] grace_secs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_grace_secs: Option<u64>,
    /// Lifetime of responses without expiration or `Last-Modified` (default: `[cache] default_ttl_secs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_default_ttl_secs: Option<u64>,
    /// `honor` or `ignore` the client's `Cache-Control` (default: `[cache] request_directives`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_request_directives: Option<crate::cache::config::RequestDirectivesConfig>,
    /// Store responses to requests that carry `Cookie` (off: they are passed to the origin and
    /// never stored, Varnish's default, so one user's personalised page is not served to others).
    #[serde(default)]
    pub cache_cookies: bool,
    /// In a cache cluster, keep a local copy of what the owner sends (for at most
    /// `[cache.cluster] peer_copy_ttl_secs`): hot objects are then hits on every node.
    #[serde(default)]
    pub cache_peer_copy: bool,
}

impl RouteConfig {
    /// The route's cache policy overrides (serde's `flatten` cannot sit beside `deny_unknown_fields`,
    /// so the keys are spelled out here and gathered into the cache's own type).
    pub fn cache_policy(&self) -> crate::cache::RoutePolicyConfig {
        crate::cache::RoutePolicyConfig {
            cache_grace_secs: self.cache_grace_secs,
            cache_default_ttl_secs: self.cache_default_ttl_secs,
            cache_request_directives: self.cache_request_directives,
            cache_cookies: self.cache_cookies,
        }
    }
}

fn root() -> String {
    "/".to_string()
}
fn yes() -> bool {
    true
}
fn default_connect() -> u64 {
    5
}
fn default_headers() -> u64 {
    60
}
fn default_idle() -> u64 {
    60
}
fn default_attempts() -> u32 {
    3
}

/// The wire protocol to the servers of a route.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamProtocol {
    #[default]
    Http1,
    H2c,
    Https,
}

/// `[reverse]`: settings shared by every route.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ReverseConfig {
    /// Add a `Via: <version> sluice` header to requests and responses.
    pub via: bool,
    /// Also send an RFC 7239 `Forwarded` header (X-Forwarded-* are always sent).
    pub forwarded: bool,
    /// Retries may add at most this percentage of the recent request rate (plus `retry_min_per_sec`).
    pub retry_budget_percent: u32,
    /// Retries always allowed per second, whatever the budget.
    pub retry_min_per_sec: u32,
    /// Idle pooled connections kept per server.
    pub pool_max_idle_per_server: usize,
    /// Seconds an idle pooled connection is kept.
    pub pool_idle_secs: u64,
    /// Access log: `""` (off), `"stderr"`, or a file path (appended).
    pub access_log: String,
    /// `json` (one object per line) or `combined` (the Apache/nginx format).
    pub access_log_format: AccessLogFormat,
    /// Move large response bodies of known length from a plain-HTTP server to a plain-HTTP/1.1
    /// client with `splice(2)`, socket to socket, instead of copying them through sluice.
    pub splice_bodies: bool,
    /// Send HTTP/2 and HTTP/3 GET and HEAD requests without a body on plain-HTTP routes without
    /// a cache through the HTTP/1.1 fast path's upstream connections instead of hyper's client
    /// (the name is from when only HTTP/2 took it).
    pub h2_fast_path: bool,
}

impl Default for ReverseConfig {
    fn default() -> Self {
        ReverseConfig {
            via: true,
            forwarded: false,
            retry_budget_percent: 20,
            retry_min_per_sec: 10,
            pool_max_idle_per_server: 1024,
            pool_idle_secs: 90,
            access_log: String::new(),
            access_log_format: AccessLogFormat::Json,
            splice_bodies: true,
            h2_fast_path: true,
        }
    }
}

/// Access log line format.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AccessLogFormat {
    #[default]
    Json,
    Combined,
}

/// Why the routes cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RouteConfigError {
    #[error("route {index} ({path:?}): {detail}")]
    Invalid {
        index: usize,
        path: String,
        detail: String,
    },
}

impl RouteConfig {
    /// Checks one route against the group names; `index` is its position in the file.
    pub fn validate(&self, index: usize, groups: &[&str]) -> Result<(), RouteConfigError> {
        let fail = |detail: String| RouteConfigError::Invalid {
            index,
            path: self.path.clone(),
            detail,
        };
        HostPattern::parse(self.host.as_deref().unwrap_or("")).map_err(|e| fail(e.to_string()))?;
        check_prefix(&self.path).map_err(|e| fail(e.to_string()))?;
        if let Some(r) = &self.rewrite {
            check_prefix(r).map_err(|e| fail(format!("rewrite: {e}")))?;
            if self.strip_prefix {
                return Err(fail("strip_prefix and rewrite exclude each other".into()));
            }
        }
        if !groups.contains(&self.upstream.as_str()) {
            return Err(fail(format!(
                "upstream {:?} is not an [[upstreams]] name",
                self.upstream
            )));
        }
        for name in self
            .request_headers_add
            .keys()
            .chain(self.response_headers_add.keys())
            .chain(self.request_headers_remove.iter())
            .chain(self.response_headers_remove.iter())
        {
            http::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| fail(format!("{name:?} is not a header name")))?;
        }
        for (name, value) in self
            .request_headers_add
            .iter()
            .chain(self.response_headers_add.iter())
        {
            // Named by its header, not quoted: the value may be a credential, and this text
            // reaches the log and the reload's answer.
            http::HeaderValue::from_str(value)
                .map_err(|_| fail(format!("the value added for {name:?} is not a header value (a control character or a non-ASCII one)")))?;
        }
        if self.connect_timeout_secs == 0
            || self.header_timeout_secs == 0
            || self.idle_timeout_secs == 0
        {
            return Err(fail("timeouts must be at least 1 s".into()));
        }
        if self.max_attempts == 0 {
            return Err(fail("max_attempts must be at least 1".into()));
        }
        if let Some(sni) = &self.tls_sni {
            rustls::pki_types::ServerName::try_from(sni.clone())
                .map_err(|_| fail(format!("tls_sni {sni:?} is not a server name")))?;
        }
        Ok(())
    }
}
