//! An [`Origin`] over the shared upstream client: the cache's requests go to one base URL (scheme,
//! host, port, optional path prefix) with the pooled client's connect, header and idle deadlines.

use std::sync::Arc;

use http::header::HOST;
use http::{Request, Response};
use url::Url;

use super::{Origin, OriginError, OriginFuture};
use crate::upstream::{Upstream, UpstreamError, UpstreamRequest};

/// Sends cache requests to `base` through `upstream`.
pub struct UpstreamOrigin {
    upstream: Upstream,
    base: Url,
}

impl UpstreamOrigin {
    /// `base` names the origin; a path prefix in it is put before every request path.
    pub fn new(upstream: Upstream, base: Url) -> Arc<UpstreamOrigin> {
        Arc::new(UpstreamOrigin { upstream, base })
    }

    fn url_for(&self, uri: &http::Uri) -> Url {
        let mut url = self.base.clone();
        let prefix = self.base.path().trim_end_matches('/');
        url.set_path(&format!("{prefix}{}", uri.path()));
        url.set_query(uri.query());
        url
    }
}

impl Origin for UpstreamOrigin {
    fn fetch(&self, req: Request<()>) -> OriginFuture {
        let (parts, ()) = req.into_parts();
        let mut headers = parts.headers;
        // The connector sets Host for the origin it connects to.
        headers.remove(HOST);
        let request = UpstreamRequest {
            method: parts.method,
            url: self.url_for(&parts.uri),
            headers,
        };
        let upstream = self.upstream.clone();
        Box::pin(async move {
            let resp = upstream.send(request).await.map_err(|e| match e {
                UpstreamError::HeaderTimeout { .. } => OriginError::Timeout,
                other => OriginError::Unreachable(other.to_string()),
            })?;
            let mut out = Response::new(crate::body::boxed(resp.body));
            *out.status_mut() = resp.status;
            *out.headers_mut() = resp.headers;
            Ok(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_go_under_the_base() {
        let mut registry = prometheus_client::registry::Registry::default();
        let up = Upstream::new(&crate::upstream::UpstreamConfig::default(), &mut registry).unwrap();
        let o = UpstreamOrigin::new(up, Url::parse("http://origin.test:8080/media/").unwrap());
        let uri: http::Uri = "/a/b.mp4?x=1".parse().unwrap();
        assert_eq!(
            o.url_for(&uri).as_str(),
            "http://origin.test:8080/media/a/b.mp4?x=1"
        );
    }
}
