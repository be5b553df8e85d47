//! An [`Origin`] over the shared upstream client: the cache's requests go to one base URL (scheme,
//! host, port, optional path prefix) with the pooled client's connect, header and idle deadlines.

use std::sync::Arc;

use http::header::HOST;
use http::{Request, Response};
use url::Url;

use super::{Origin, OriginError, OriginFuture};
use crate::upstream::group::health::is_local_failure;
use crate::upstream::{ConnectError, Upstream, UpstreamError, UpstreamRequest};

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
            let resp = upstream.send(request).await.map_err(origin_error)?;
            let mut out = Response::new(crate::body::boxed(resp.body));
            *out.status_mut() = resp.status;
            *out.headers_mut() = resp.headers;
            Ok(out)
        })
    }
}

/// A failure of the shared client as the cache books it: a timeout, this side's own shortage
/// (descriptors, memory, local ports, on the connect or on the lookup of the origin's name: as
/// the reverse path's `connect_failure` tells it apart), or the origin unreachable.
pub fn origin_error(e: UpstreamError) -> OriginError {
    match e {
        UpstreamError::HeaderTimeout { .. } => OriginError::Timeout,
        UpstreamError::Connect(
            ConnectError::Connect { ref source, .. } | ConnectError::Dns { ref source, .. },
        ) if is_local_failure(source) => OriginError::Local(e.to_string()),
        other => OriginError::Unreachable(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Finding: every failure of the shared client but a header timeout was the origin's
    /// (`Unreachable`: a 502, an origin error), EMFILE on the connect included. This side's
    /// shortage is its own kind, as the reverse path tells it apart.
    #[test]
    fn connect_failures_of_this_side_are_local() {
        let connect = |code: i32| {
            UpstreamError::Connect(ConnectError::Connect {
                host: "origin.test".into(),
                port: 80,
                source: std::io::Error::from_raw_os_error(code),
            })
        };
        let dns = |code: i32| {
            UpstreamError::Connect(ConnectError::Dns {
                host: "origin.test".into(),
                source: std::io::Error::from_raw_os_error(code),
            })
        };
        let local = [
            libc::EMFILE,
            libc::ENFILE,
            libc::ENOBUFS,
            libc::ENOMEM,
            libc::EADDRNOTAVAIL,
        ];
        for code in local {
            for e in [connect(code), dns(code)] {
                let e = origin_error(e);
                assert!(matches!(e, OriginError::Local(_)), "{code}: {e}");
            }
        }
        for code in [libc::ECONNREFUSED, libc::EHOSTUNREACH, libc::ECONNRESET] {
            let e = origin_error(connect(code));
            assert!(matches!(e, OriginError::Unreachable(_)), "{code}: {e}");
        }
        let timeout = UpstreamError::HeaderTimeout {
            host: "origin.test".into(),
            secs: 1,
        };
        assert!(matches!(origin_error(timeout), OriginError::Timeout));
    }

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
