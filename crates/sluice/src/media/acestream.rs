//! `/proxy/acestream/{stream,manifest.m3u8,status}`: Acestream engine sessions, one per content
//! id, shared by every viewer.
//!
//! MediaFlow (both implementations) lets a second viewer of the same id stall or end the first,
//! because each viewer talks to the engine's single playback session on its own. Here one task
//! reads the engine's MPEG-TS and publishes packet-aligned chunks into a bounded broadcast
//! buffer; each viewer is a reader position in it. A viewer that falls more than the buffer behind
//! skips ahead (and is counted), never holding back the reader or other viewers. When the last
//! viewer leaves, the session lingers for `linger_secs`, then the engine is told to stop.

pub mod session;

use std::sync::Arc;

use crate::body::Incoming;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use sluice_media::acestream::Content;
use sluice_media::query::Query;

use super::Media;
use crate::body::{self, Body};
use crate::error::ProxyError;
use crate::request::RequestContext;
use session::{Kind, Sessions};

pub use super::config::AcestreamConfig;

/// Serves `/proxy/acestream/<rest>` (auth already checked).
pub async fn handle(
    media: &Media,
    req: &Request<Incoming>,
    ctx: &RequestContext,
    rest: &str,
) -> Result<Response<Body>, ProxyError> {
    let sessions = media.acestream.as_ref().ok_or_else(|| {
        ProxyError::downstream(
            StatusCode::NOT_FOUND,
            "not_found",
            "the Acestream proxy is turned off (media.acestream.enabled)",
        )
    })?;
    match rest {
        "status" => status(sessions, ctx).await,
        "stream" => {
            let content = content(ctx)?;
            if req.method() == Method::HEAD {
                // A player probing the type must not start a P2P session.
                return Ok(head("video/mp2t"));
            }
            let viewer = sessions.join(&content, Kind::Stream, ctx.client_ip).await?;
            let mut resp = Response::new(viewer.into_body());
            resp.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("video/mp2t"));
            resp.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            Ok(resp)
        }
        "manifest.m3u8" => {
            let content = content(ctx)?;
            if req.method() == Method::HEAD {
                // As for `stream`: a probe starts no P2P session.
                return Ok(head("application/vnd.apple.mpegurl"));
            }
            let playlist_url = sessions.touch_hls(&content, ctx.client_ip).await?;
            // The engine's playlist goes through the HLS proxy like any other; the session stays
            // open while players keep refreshing it.
            let mut hls_ctx = ctx.clone();
            hls_ctx.query = Query::from_pairs(vec![("d".into(), playlist_url)]);
            hls_ctx.path = "/proxy/hls/manifest.m3u8".into();
            super::hls::handle(media, req, &hls_ctx, "manifest.m3u8").await
        }
        _ => Err(ProxyError::downstream(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such /proxy/acestream endpoint: use stream, manifest.m3u8 or status",
        )),
    }
}

fn content(ctx: &RequestContext) -> Result<Content, ProxyError> {
    Content::from_params(ctx.query.get("id"), ctx.query.get("infohash"))
        .map_err(|e| ProxyError::downstream(StatusCode::BAD_REQUEST, "bad_request", e.to_string()))
}

fn head(content_type: &'static str) -> Response<Body> {
    let mut resp = Response::new(body::empty());
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// JSON: every open session, or the one `id`/`infohash` names, with the engine's statistics. A
/// bad `id`/`infohash` is refused (400), not taken as "every session".
async fn status(
    sessions: &Arc<Sessions>,
    ctx: &RequestContext,
) -> Result<Response<Body>, ProxyError> {
    let only = match (ctx.query.get("id"), ctx.query.get("infohash")) {
        (None, None) => None,
        _ => Some(content(ctx)?),
    };
    let report = sessions.report(only.as_ref()).await;
    let text = serde_json::to_string(&report).unwrap_or_else(|_| "{}".into());
    let mut resp = Response::new(body::full(text));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(resp)
}
