//! The small built-ins (`/admin/reload`, `/metrics`) and the response helpers every built-in
//! shares: JSON, 404, the sandbox headers, CORS for browser players.

use crate::body::Incoming;
use http::{header, HeaderValue, Request, Response, StatusCode};

use super::App;
#[cfg(feature = "iptv")]
use crate::auth::token;
use crate::auth::Auth;
use crate::body::{self, Body};
use crate::error::ProxyError;
use crate::metrics;
use crate::request::RequestContext;

impl App {
    /// `POST /admin/reload`: only with the password in the `api_password` header (never a token or
    /// a query parameter, which end up in logs), from a `client` not past its wrong passwords.
    pub(super) async fn admin_reload(
        &self,
        req: &Request<Incoming>,
        client: std::net::IpAddr,
    ) -> Result<Response<Body>, ProxyError> {
        if req.method() != http::Method::POST {
            return Err(ProxyError::downstream(
                StatusCode::METHOD_NOT_ALLOWED,
                "method",
                "use POST",
            ));
        }
        // Without a password any local user may ask: such a caller is not shown why a reload was
        // refused, since the reason may quote a config value (the outcome file is 0600 for it).
        let password_set = self.keys.load().auth.required();
        let proved = self.password_ok(client, Auth::offered_in_header(req.headers()))?;
        if !proved {
            return Err(ProxyError::downstream(
                StatusCode::FORBIDDEN,
                "auth",
                "the admin endpoint needs the password in the api_password header",
            ));
        }
        let Some(reloader) = self.reloader.get().cloned() else {
            return Err(ProxyError::downstream(
                StatusCode::NOT_FOUND,
                "not_found",
                "live reload is not set up for this server",
            ));
        };
        let outcome = tokio::task::spawn_blocking(move || reloader.reload_logged("admin endpoint"))
            .await
            .map_err(|e| ProxyError::internal(e.to_string()))?;
        match outcome {
            Ok(applied) => {
                let body = serde_json::json!({"reloaded": true, "changed": applied.changed});
                let mut resp = Response::new(body::full(body.to_string()));
                resp.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                Ok(resp)
            }
            Err(e) => {
                let error = if password_set {
                    format!("{e:#}")
                } else {
                    "the new configuration was refused; see the log for why".to_string()
                };
                let body = serde_json::json!({"reloaded": false, "error": error});
                let mut resp = Response::new(body::full(body.to_string()));
                *resp.status_mut() = StatusCode::UNPROCESSABLE_ENTITY;
                resp.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                Ok(resp)
            }
        }
    }

    pub(super) fn serve_metrics(
        &self,
        req: &Request<Incoming>,
        ctx: &RequestContext,
    ) -> Result<Response<Body>, ProxyError> {
        // Open without the password only to this machine: every listener on loopback, the
        // client (as a trusted front proxy reports it) on loopback, and a loopback `Host` (a DNS
        // name rebound to 127.0.0.1 is not one). The series name upstreams, routes and channels.
        let local = ctx.client_ip.is_loopback() && super::gate::local_host(req);
        if !(self.metrics_open && local) {
            self.authorize(req, ctx)?;
        }
        let accept = req
            .headers()
            .get(header::ACCEPT)
            .and_then(|a| a.to_str().ok());
        let format = metrics::Format::negotiate(accept);
        let mut resp = Response::new(body::full(metrics::exposition(&self.registry, format)));
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(format.content_type()),
        );
        // Series carry names the operator's sources chose (channels, routes): a browser must not
        // read the text as anything but its declared type.
        h.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        Ok(resp)
    }
}

pub(super) fn not_found(path: &str) -> ProxyError {
    let shown: String = path.chars().take(200).collect();
    ProxyError::downstream(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no endpoint at {shown}"),
    )
}

/// The IPTV gateway's channel paths (bodies from a multicast group or an RTSP server).
#[cfg(feature = "iptv")]
pub(super) fn is_channel_path(p: &str) -> bool {
    token::CHANNEL_SCOPE
        .iter()
        .any(|prefix| p.starts_with(prefix))
}

/// Every body piped from an origin (or a multicast group) may be an attacker's HTML: a sandbox
/// policy gives such a page an opaque origin and no scripts, and `nosniff` keeps the browser to
/// the declared type. Set last, so no `r_*` parameter or origin header overrides them.
pub(super) fn sandboxed(mut resp: Response<Body>) -> Response<Body> {
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("sandbox"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    resp
}

/// Browser players (hls.js, shaka-player) on other origins fetch manifests and segments with CORS;
/// responses carry no credentials, so any origin may read them.
pub(super) fn allow_any_origin(headers: &mut http::HeaderMap) {
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    headers.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("Content-Length, Content-Range, Accept-Ranges"),
    );
}

/// The answer to a CORS preflight: for a player path behind a password, GET and HEAD with Range
/// and the password header allowed from any origin; elsewhere no grant at all (the operator's
/// endpoints are not for other origins).
pub(super) fn preflight(cors: bool) -> Response<Body> {
    let mut resp = Response::new(body::empty());
    *resp.status_mut() = StatusCode::NO_CONTENT;
    if !cors {
        return resp;
    }
    allow_any_origin(resp.headers_mut());
    let h = resp.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, HEAD, POST, OPTIONS"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("Range, If-Range, Content-Type, api_password"),
    );
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("86400"),
    );
    resp
}

/// A small JSON response.
pub fn json(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut resp = Response::new(body::full(text));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}
