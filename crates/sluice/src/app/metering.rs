//! Endpoint metering: per-endpoint series (in flight, first byte, total time, bytes sent),
//! requests by status and errors by side and kind, and the body wrapper that ends the clock.

use std::pin::Pin;
use std::task::{Context, Poll};

use crate::atomic::Counter;
use crate::atomic::Gauge;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use prometheus_client::metrics::histogram::Histogram;
use sluice_media::token::split_path_token;
use tokio::time::Instant;

use super::App;
use crate::body::{Body, BoxError};
use crate::error::ErrorMark;
use crate::metrics::{EndpointLabels, ErrorLabels, HttpMetrics, RequestLabels};
use crate::runtime::recent;
use crate::server::activity::ActivityGuard;

impl App {
    /// Counts one response head: requests by endpoint and status, errors by side and kind.
    pub(super) fn count_response(
        &self,
        endpoint: &'static str,
        status: u16,
        mark: Option<&ErrorMark>,
    ) {
        let labels = RequestLabels::new(endpoint, status);
        if endpoint == "reverse" && status == 200 {
            // The common answer's series, looked up once.
            self.proxy_ok
                .get_or_init(|| self.metrics.requests.get_or_create(&labels).clone())
                .inc();
        } else {
            self.metrics.requests.get_or_create(&labels).inc();
        }
        if let Some(mark) = mark {
            self.metrics
                .errors
                .get_or_create(&ErrorLabels {
                    side: mark.side.label(),
                    kind: mark.kind,
                })
                .inc();
        }
    }
}

/// One endpoint's per-request series (active, time to first byte, total time, bytes sent).
#[derive(Clone)]
pub(super) struct EndpointSeries {
    pub(super) active: Gauge,
    pub(super) first_byte: Histogram,
    pub(super) total: Histogram,
    pub(super) sent: Counter,
}

impl EndpointSeries {
    pub(super) fn of(metrics: &HttpMetrics, labels: &EndpointLabels) -> EndpointSeries {
        EndpointSeries {
            active: metrics.active.get_or_create(labels).clone(),
            first_byte: metrics.first_byte.get_or_create(labels).clone(),
            total: metrics.total.get_or_create(labels).clone(),
            sent: metrics.sent_bytes.get_or_create(labels).clone(),
        }
    }
}

/// The path without a `/_token_<T>` prefix.
pub(super) fn effective_path(path: &str) -> &str {
    split_path_token(path).map_or(path, |(_, rest)| rest)
}

/// Metric label for a path; a fixed set so label cardinality stays bounded.
pub(super) fn endpoint_label(path: &str) -> &'static str {
    match path {
        "/health" => "health",
        "/metrics" => "metrics",
        p if p == "/proxy/stream" || p.starts_with("/proxy/stream/") => "stream",
        p if p.starts_with("/proxy/hls/") => "hls",
        p if p.starts_with("/proxy/mpd/") => "mpd",
        p if p.starts_with("/proxy/acestream/") => "acestream",
        p if p.starts_with("/playlist/") => "playlist",
        #[cfg(feature = "media")]
        p if crate::media::xtream::Xtream::serves(p) => "xtream",
        _ => "other",
    }
}

/// Records the total time and releases the connection's in-flight mark once the body is done or
/// dropped (a client that goes away counts too).
pub(super) struct Finish {
    pub(super) start: Instant,
    pub(super) total: Histogram,
    pub(super) active: Gauge,
    pub(super) _guard: ActivityGuard,
}

impl Drop for Finish {
    fn drop(&mut self) {
        self.total.observe(recent::since(self.start).as_secs_f64());
        self.active.dec();
    }
}

pin_project_lite::pin_project! {
    pub(super) struct Metered {
        #[pin]
        pub(super) inner: Body,
        pub(super) sent: Counter,
        pub(super) finish: Option<Finish>,
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
