//! Request dispatch: one place that meters every request, checks auth, and hands the request to the
//! front end that owns its path.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use sluice_media::query::Query;
use sluice_media::token::split_path_token;
use tokio::time::Instant;

pub use crate::auth::token::TokenScope;
use crate::auth::token::{self, TokenGate};
use crate::auth::Auth;
use crate::body::{self, Body, BoxError};
use crate::config::Config;
use crate::error::{ErrorMark, ProxyError};
#[cfg(feature = "iptv")]
use crate::iptv::Iptv;
#[cfg(feature = "media")]
use crate::media::Media;
use crate::metrics::{self, EndpointLabels, ErrorLabels, HttpMetrics, RequestLabels};
use crate::server::activity::ActivityGuard;
use crate::upstream::Upstream;

/// What a front end needs to know about the request besides the request itself.
#[derive(Debug, Clone)]
pub struct RequestContext {
    pub peer: SocketAddr,
    /// The client's IP (from `X-Forwarded-For` only behind a trusted proxy).
    pub client_ip: std::net::IpAddr,
    /// The query, with an encrypted token's params merged in (the token's win).
    pub query: Query,
    /// The path to route on, with any `/_token_<T>` prefix removed.
    pub path: String,
    /// The `Host` the client used, for absolute child URLs.
    pub host: Option<String>,
    /// The request came over TLS.
    pub secure: bool,
    /// Present when the request was authorized by an encrypted token.
    pub token: Option<TokenScope>,
}

/// Everything the server dispatches to.
pub struct App {
    auth: Auth,
    tokens: Option<Arc<TokenGate>>,
    metrics: HttpMetrics,
    registry: Registry,
    #[cfg(feature = "media")]
    media: Option<Media>,
    #[cfg(feature = "iptv")]
    iptv: Arc<Iptv>,
    /// `/metrics` is open when every listener is loopback.
    metrics_open: bool,
}

impl App {
    /// Builds every service and front end from a validated config.
    pub fn new(config: &Config) -> anyhow::Result<Arc<App>> {
        let mut registry = Registry::with_prefix("sluice");
        let metrics = HttpMetrics::new(&mut registry);
        let upstream = Upstream::new(&config.upstream, &mut registry)?;
        let auth = Auth::new(&config.auth);
        let tokens = TokenGate::new(&config.auth).map(Arc::new);
        #[cfg(feature = "media")]
        let media = config.media.enabled.then(|| {
            Media::new(
                upstream.clone(),
                tokens.clone(),
                &config.media,
                &mut registry,
            )
        });
        // One config file may serve both builds: a gateway-only build says what it leaves out
        // rather than refusing to start.
        #[cfg(not(feature = "media"))]
        if config.media.enabled {
            tracing::warn!("media.enabled is set, but this build has no media front end (the `media` feature): /proxy/ answers 404");
        }
        #[cfg(feature = "iptv")]
        let iptv = Iptv::new(config.iptv.clone(), upstream.clone(), &mut registry)?;
        Ok(Arc::new(App {
            auth,
            tokens,
            #[cfg(feature = "iptv")]
            iptv,
            metrics,
            registry,
            #[cfg(feature = "media")]
            media,
            metrics_open: config.server.listen.iter().all(|a| a.ip().is_loopback()),
        }))
    }

    pub(crate) fn connection_accepted(&self) {
        self.metrics.connections.inc();
    }

    /// The server's connection-level metrics (accept pauses, send and handshake timeouts).
    pub(crate) fn http_metrics(&self) -> &crate::metrics::HttpMetrics {
        &self.metrics
    }

    /// Serves one request and meters it from arrival to the end of its body.
    pub async fn handle(
        self: &Arc<Self>,
        req: Request<Incoming>,
        peer: SocketAddr,
        secure: bool,
        guard: ActivityGuard,
    ) -> Response<Body> {
        let start = Instant::now();
        let endpoint = endpoint_label(effective_path(req.uri().path()));
        let labels = EndpointLabels { endpoint };
        let active = self.metrics.active.get_or_create(&labels).clone();
        active.inc();
        let mut resp = if req.method() == http::Method::OPTIONS {
            preflight()
        } else {
            self.route(req, peer, secure).await
        };
        allow_any_origin(resp.headers_mut());
        self.metrics
            .first_byte
            .get_or_create(&labels)
            .observe(start.elapsed().as_secs_f64());
        self.metrics
            .requests
            .get_or_create(&RequestLabels {
                endpoint,
                status: resp.status().as_u16(),
            })
            .inc();
        if let Some(mark) = resp.extensions().get::<ErrorMark>() {
            self.metrics
                .errors
                .get_or_create(&ErrorLabels {
                    side: mark.side.label(),
                    kind: mark.kind,
                })
                .inc();
        }
        let finish = Finish {
            start,
            total: self.metrics.total.get_or_create(&labels).clone(),
            active,
            _guard: guard,
        };
        let sent = self.metrics.sent_bytes.get_or_create(&labels).clone();
        resp.map(|inner| {
            body::boxed(Metered {
                inner,
                sent,
                finish: Some(finish),
            })
        })
    }

    async fn route(
        &self,
        req: Request<Incoming>,
        peer: SocketAddr,
        secure: bool,
    ) -> Response<Body> {
        let ctx = match self.context(&req, peer, secure) {
            Ok(ctx) => ctx,
            Err(why) => {
                tracing::debug!(reason = %why, "token refused");
                let mut resp = token::refusal();
                resp.extensions_mut().insert(ErrorMark {
                    side: crate::error::Side::Downstream,
                    kind: "token",
                });
                return resp;
            }
        };
        let result = match ctx.path.as_str() {
            "/health" => Ok(json(StatusCode::OK, r#"{"status":"healthy"}"#)),
            "/metrics" => self.serve_metrics(&req, &ctx),
            #[cfg(feature = "media")]
            p if Media::serves_open(p) && self.media.is_some() => match &self.media {
                Some(media) => media.handle_open(req, &ctx).await,
                None => Err(not_found(p)),
            },
            #[cfg(feature = "iptv")]
            p if Iptv::serves(p) => match self.authorize(&req, &ctx) {
                Ok(()) => Ok(self.iptv.handle(self.iptv_parts(req, &ctx)).await),
                Err(e) => Err(e),
            },
            #[cfg(feature = "media")]
            p if p.starts_with("/proxy/") => match &self.media {
                Some(media) => match self.authorize(&req, &ctx) {
                    Ok(()) => media.handle(req, &ctx).await,
                    Err(e) => Err(e),
                },
                None => Err(not_found(p)),
            },
            p => Err(not_found(p)),
        };
        result.unwrap_or_else(ProxyError::into_response)
    }

    /// Works out the client IP, the routing path and the effective query. A token (in the path as
    /// `/_token_<T>/...` or as `?token=`) is opened and its scope enforced here, before any front
    /// end sees the request; every token failure gets the same [`token::refusal`].
    fn context(
        &self,
        req: &Request<Incoming>,
        peer: SocketAddr,
        secure: bool,
    ) -> Result<RequestContext, token::TokenRefusal> {
        let client_ip = self.auth.client_ip(peer.ip(), req.headers());
        let raw_path = req.uri().path();
        let mut query = Query::parse(req.uri().query().unwrap_or(""));
        let (token, path) = match split_path_token(raw_path) {
            Some((token, rest)) => (Some(token.to_string()), rest.to_string()),
            None => (query.get("token").map(str::to_string), raw_path.to_string()),
        };
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| req.uri().authority().map(|a| a.as_str()))
            .filter(|h| h.bytes().all(|b| b.is_ascii_graphic()))
            .map(str::to_string);
        let mut scope = None;
        if let Some(token) = token {
            let opened = self
                .tokens
                .as_ref()
                .ok_or(token::TokenRefusal::NoKey)
                .and_then(|gate| gate.open(&token, client_ip, token::now()))
                .and_then(|opened| {
                    let q = token::scoped_query(&opened, &path, &query)?;
                    Ok((opened.scope, q))
                });
            match opened {
                Ok((s, q)) => {
                    query = q;
                    scope = Some(s);
                }
                Err(why) => return Err(why),
            }
        }
        Ok(RequestContext {
            peer,
            client_ip,
            query,
            path,
            host,
            secure,
            token: scope,
        })
    }

    fn authorize(&self, req: &Request<Incoming>, ctx: &RequestContext) -> Result<(), ProxyError> {
        if ctx.token.is_some() {
            // Authenticated and scoped in `context`: a sealed token only reaches the paths it was
            // minted for, a MediaFlow token carries the password.
            return Ok(());
        }
        let offered = Auth::offered(ctx.query.get("api_password"), req.headers());
        if self.auth.check(offered) {
            return Ok(());
        }
        let message = if offered.is_some() {
            "wrong api_password"
        } else {
            "missing api_password: pass it as the api_password query parameter or header"
        };
        Err(ProxyError::downstream(
            StatusCode::FORBIDDEN,
            "auth",
            message,
        ))
    }

    /// The request head as the IPTV front end sees it: the token prefix stripped from the path, and
    /// the prefix playlist entries need when a password is configured.
    #[cfg(feature = "iptv")]
    fn iptv_parts(&self, req: Request<Incoming>, ctx: &RequestContext) -> http::request::Parts {
        let (mut parts, _) = req.into_parts();
        parts
            .extensions
            .insert(SocketAddr::new(ctx.client_ip, ctx.peer.port()));
        if parts.uri.path() != ctx.path {
            let pq = match parts.uri.query() {
                Some(q) => format!("{}?{q}", ctx.path),
                None => ctx.path.clone(),
            };
            if let Ok(uri) = pq.parse() {
                parts.uri = uri;
            }
        }
        if let Some(gate) = &self.tokens {
            // Channel paths only, and no expiry of their own: a saved playlist keeps working.
            let token = gate.mint(
                &[],
                &token::CHANNEL_SCOPE,
                ctx.token.as_ref(),
                false,
                token::now(),
            );
            parts
                .extensions
                .insert(crate::iptv::EntryPrefix(format!("/_token_{token}")));
        }
        parts
    }

    fn serve_metrics(
        &self,
        req: &Request<Incoming>,
        ctx: &RequestContext,
    ) -> Result<Response<Body>, ProxyError> {
        if !self.metrics_open {
            self.authorize(req, ctx)?;
        }
        let accept = req
            .headers()
            .get(header::ACCEPT)
            .and_then(|a| a.to_str().ok());
        let format = metrics::Format::negotiate(accept);
        let mut resp = Response::new(body::full(metrics::exposition(&self.registry, format)));
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(format.content_type()),
        );
        Ok(resp)
    }
}

fn not_found(path: &str) -> ProxyError {
    let shown: String = path.chars().take(200).collect();
    ProxyError::downstream(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no endpoint at {shown}"),
    )
}

/// Browser players (hls.js, shaka-player) on other origins fetch manifests and segments with CORS;
/// responses carry no credentials, so any origin may read them.
fn allow_any_origin(headers: &mut http::HeaderMap) {
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    headers.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("Content-Length, Content-Range, Accept-Ranges"),
    );
}

/// The answer to a CORS preflight: GET and HEAD with Range and the password header allowed.
fn preflight() -> Response<Body> {
    let mut resp = Response::new(body::empty());
    *resp.status_mut() = StatusCode::NO_CONTENT;
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

/// The path without a `/_token_<T>` prefix.
fn effective_path(path: &str) -> &str {
    split_path_token(path).map_or(path, |(_, rest)| rest)
}

/// Metric label for a path; a fixed set so label cardinality stays bounded.
fn endpoint_label(path: &str) -> &'static str {
    match path {
        "/health" => "health",
        "/metrics" => "metrics",
        p if p == "/proxy/stream" || p.starts_with("/proxy/stream/") => "stream",
        p if p.starts_with("/proxy/hls/") => "hls",
        p if p.starts_with("/proxy/mpd/") => "mpd",
        _ => "other",
    }
}

/// Records the total time and releases the connection's in-flight mark once the body is done or
/// dropped (a client that goes away counts too).
struct Finish {
    start: Instant,
    total: Histogram,
    active: Gauge,
    _guard: ActivityGuard,
}

impl Drop for Finish {
    fn drop(&mut self) {
        self.total.observe(self.start.elapsed().as_secs_f64());
        self.active.dec();
    }
}

pin_project_lite::pin_project! {
    struct Metered {
        #[pin]
        inner: Body,
        sent: Counter,
        finish: Option<Finish>,
    }
}

impl http_body::Body for Metered {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        let poll = this.inner.poll_frame(cx);
        match &poll {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.sent.inc_by(data.len() as u64);
                }
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => {
                this.finish.take();
            }
            Poll::Pending => {}
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
