//! The MediaFlow-compatible media front end: `/proxy/*` endpoints, thin handlers over `sluice-media`.

pub mod generate;
pub mod hls;
pub mod links;
pub mod stream;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use prometheus_client::registry::Registry;
use sluice_media::token::TokenKey;

use crate::app::RequestContext;
use crate::body::Body;
use crate::config::MediaConfig;
use crate::error::ProxyError;
use crate::upstream::Upstream;

/// The media proxy.
pub struct Media {
    upstream: Upstream,
    /// The server password's token key, for child URLs; `None` without a password.
    token_key: Option<TokenKey>,
    settings: MediaConfig,
}

impl Media {
    pub fn new(
        upstream: Upstream,
        token_key: Option<TokenKey>,
        settings: &MediaConfig,
        _registry: &mut Registry,
    ) -> Self {
        Media {
            upstream,
            token_key,
            settings: settings.clone(),
        }
    }

    /// Paths outside `/proxy/` that need no password because they fetch nothing.
    pub fn serves_open(path: &str) -> bool {
        generate::serves(path)
    }

    /// Serves a [`Media::serves_open`] path.
    pub async fn handle_open(
        &self,
        req: Request<Incoming>,
        ctx: &RequestContext,
    ) -> Result<Response<Body>, ProxyError> {
        generate::handle(req, ctx).await
    }

    /// Child-URL builder for a manifest served to `ctx`.
    pub fn links(&self, ctx: &RequestContext) -> links::Links {
        links::Links::new(ctx, self.token_key.as_ref())
    }

    /// Serves a `/proxy/*` request that has passed auth.
    pub async fn handle(
        &self,
        req: Request<Incoming>,
        ctx: &RequestContext,
    ) -> Result<Response<Body>, ProxyError> {
        let rest = ctx.path.strip_prefix("/proxy/").unwrap_or("");
        match rest
            .split_once('/')
            .map_or((rest, None), |(a, b)| (a, Some(b)))
        {
            ("hls", Some(rest)) => {
                require_get_or_head(req.method())?;
                hls::handle(self, &req, ctx, rest).await
            }
            ("stream", filename) => {
                require_get_or_head(req.method())?;
                let filename = filename.filter(|f| !f.is_empty()).map(decode_segment);
                stream::serve(&self.upstream, &req, ctx, filename.as_deref()).await
            }
            _ => Err(ProxyError::downstream(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such /proxy endpoint",
            )),
        }
    }
}

fn require_get_or_head(method: &Method) -> Result<(), ProxyError> {
    if method == Method::GET || method == Method::HEAD {
        Ok(())
    } else {
        Err(ProxyError::downstream(
            StatusCode::METHOD_NOT_ALLOWED,
            "method",
            "only GET and HEAD are allowed here",
        ))
    }
}

fn decode_segment(raw: &str) -> String {
    percent_encoding::percent_decode_str(raw)
        .decode_utf8_lossy()
        .into_owned()
}
