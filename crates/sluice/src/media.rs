//! The MediaFlow-compatible media front end: `/proxy/*` endpoints, thin handlers over `sluice-media`.

pub mod stream;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use prometheus_client::registry::Registry;

use crate::app::RequestContext;
use crate::body::Body;
use crate::error::ProxyError;
use crate::upstream::Upstream;

/// The media proxy.
pub struct Media {
    upstream: Upstream,
}

impl Media {
    pub fn new(upstream: Upstream, _registry: &mut Registry) -> Self {
        Media { upstream }
    }

    /// Serves a `/proxy/*` request that has passed auth.
    pub async fn handle(
        &self,
        req: Request<Incoming>,
        ctx: &RequestContext,
    ) -> Result<Response<Body>, ProxyError> {
        let path = req.uri().path();
        let rest = path.strip_prefix("/proxy/").unwrap_or("");
        match rest
            .split_once('/')
            .map_or((rest, None), |(a, b)| (a, Some(b)))
        {
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
