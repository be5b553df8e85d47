//! The HTTP/1.1 fast path's dispatch: which simple heads reach a reverse route the fast path
//! serves (`reverse::fast`), and their metering, the same as a proxied request's through hyper.

use std::net::SocketAddr;

use super::metering::{EndpointSeries, Finish};
use super::routes;
use super::{App, FastRoute};
use crate::error::ErrorMark;
use crate::metrics::EndpointLabels;
use crate::reverse::forward::{ClientHost, Downstream};
use crate::runtime::recent::{self, recent};
use crate::server::activity::ActivityGuard;
use crate::server::handler::{FastClient, FastRequest, Served};

impl App {
    /// The fast path's routing (`server::h1fast`): the route table a plain HTTP/1.1 GET or HEAD
    /// for `host` and the normalised `path` on `listener` reaches, when that is a reverse route the
    /// fast path serves (plain HTTP/1.1 upstream and no cache, or a caching route; see
    /// `Reverse::serves_fast`). `None`: the request goes to hyper.
    #[cfg(feature = "reverse")]
    pub(super) fn fast_route(
        &self,
        listener: routes::ListenerId,
        host: &str,
        path: &str,
    ) -> Option<FastRoute> {
        let routing = self.routing.load_full();
        match routing.lookup(listener, Some(host), path) {
            Some(routes::Target::Proxy(route)) if routing.reverse.serves_fast(route) => {
                let route = route.clone();
                Some((routing, route))
            }
            _ => None,
        }
    }

    /// Whether any route of the current table is one the fast path serves.
    #[cfg(feature = "reverse")]
    pub(super) fn has_fast_routes(&self) -> bool {
        let routing = self.routing.load();
        routing
            .reverse
            .routes()
            .iter()
            .any(|r| routing.reverse.serves_fast(r))
    }

    /// Serves one fast-path request on `route` and meters it exactly as [`App::handle`] meters a
    /// proxied request: the `reverse` endpoint's active gauge, first-byte and total histograms,
    /// bytes sent, requests by status and errors by side and kind.
    #[cfg(feature = "reverse")]
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn serve_fast<W: FastClient>(
        &self,
        (routing, route): FastRoute,
        req: FastRequest<'_>,
        path: &str,
        host: &str,
        peer: SocketAddr,
        client: &mut W,
        guard: ActivityGuard,
    ) -> Served {
        let start = recent();
        let labels = EndpointLabels {
            endpoint: "reverse",
        };
        let series = self
            .proxy_series
            .get_or_init(|| EndpointSeries::of(&self.metrics, &labels));
        series.active.inc();
        // Dropped with the request, also when a send timeout cuts it.
        let finish = Finish {
            start,
            total: series.total.clone(),
            active: series.active.clone(),
            _guard: guard,
        };
        let down = Downstream {
            peer,
            client_ip: self.keys.load().auth.client_ip(peer.ip(), &req.headers),
            trusted: self.keys.load().auth.is_trusted(peer.ip()),
            secure: req.secure,
            host: Some(ClientHost::of_field(&req.headers, host)),
        };
        let on_head = |status: u16, mark: Option<ErrorMark>| {
            series
                .first_byte
                .observe(recent::since(start).as_secs_f64());
            self.count_response("reverse", status, mark.as_ref());
        };
        let served = routing
            .reverse
            .serve_fast(&route, req, path, &down, client, (on_head, &series.sent))
            .await;
        drop(finish);
        served
    }
}
