//! `/proxy/mpd/*`: DASH as HLS. Master and media playlists made from the MPD, and init and media
//! segments decrypted with the caller's ClearKey keys. Thin: the MPD model, HLS text, parameters
//! and decryption all live in `sluice-media`.
//!
//! # Layout
//! - `manifest`: `manifest.m3u8` (master) and `playlist.m3u8` (one profile), MPD and sidx loading.
//! - `segment`: `init.mp4` and `segment.mp4`, init processing and decryption.
//! - `clear`: decrypted segments kept briefly, one decryption per segment for all its viewers.
//! - `remux`: `segment.ts`, a segment decrypted and remuxed to MPEG-TS.
//! - `sequences`: live media sequence state per track, kept between playlist requests.
//! - `out`: DASH out, `manifest.mpd` and its templated segments `out/{number}/{time}/segment.mp4`.

pub mod clear;
pub mod manifest;
pub mod out;
pub mod remux;
pub mod segment;
pub mod sequences;

use std::sync::Arc;
use std::time::Duration;

use crate::body::Incoming;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use sluice_media::dash::proxy::RequestError;
use sluice_media::query::{ProxyParams, Query};

use super::cache::MediaCache;
use super::prefetch::Prefetcher;
use super::MediaConfig;
use crate::body::{self, Body};
use crate::error::ProxyError;
use crate::request::RequestContext;

/// Shared state of the DASH endpoints.
pub struct Dash {
    pub(crate) cache: Arc<MediaCache>,
    pub(crate) prefetcher: Arc<Prefetcher>,
    pub(crate) settings: Settings,
    /// Seconds spent decrypting one segment.
    pub(crate) decrypt_seconds: Histogram,
    /// Seconds spent remuxing one segment to MPEG-TS.
    pub(crate) remux_seconds: Histogram,
    /// MPEG-TS continuity counters carried from one remuxed segment to the next (shared with
    /// the remux running on the blocking pool).
    pub(crate) ts_counters: Arc<remux::Counters>,
    /// HLS media sequence state of live tracks.
    pub(crate) sequences: sequences::Sequences,
    /// Decrypted segments, shared by the viewers asking for them.
    pub(crate) clear: clear::ClearSegments,
    /// Segments remuxed to MPEG-TS (decrypted first when keys are given), shared the same way.
    pub(crate) ts: clear::ClearSegments,
}

/// The `media.*` settings the DASH endpoints use.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The longest a live MPD is used before it is fetched again.
    pub live_mpd_ttl: Duration,
    pub live_depth: usize,
    pub live_start_offset: f64,
    pub max_mpd_bytes: usize,
    pub max_segment_bytes: usize,
    pub remux_to_ts: bool,
    /// `media.credential_hosts`.
    pub credential_hosts: super::links::CredentialHosts,
}

impl Settings {
    pub fn from_config(c: &MediaConfig) -> Self {
        Settings {
            live_mpd_ttl: Duration::from_secs(c.live_mpd_ttl_secs),
            live_depth: c.mpd_live_playlist_depth,
            live_start_offset: c.live_start_offset,
            max_mpd_bytes: c.max_mpd_bytes,
            max_segment_bytes: c.max_segment_bytes,
            remux_to_ts: c.remux_to_ts,
            credential_hosts: super::links::CredentialHosts::from_config(&c.credential_hosts),
        }
    }
}

impl Dash {
    pub fn new(
        cache: Arc<MediaCache>,
        prefetcher: Arc<Prefetcher>,
        config: &MediaConfig,
        registry: &mut Registry,
    ) -> Self {
        // 100 µs .. ~3 s
        let decrypt_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 15));
        registry.register(
            "media_decrypt_seconds",
            "Time to decrypt one media segment",
            decrypt_seconds.clone(),
        );
        let remux_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 15));
        registry.register(
            "media_remux_seconds",
            "Time to remux one media segment to MPEG-TS",
            remux_seconds.clone(),
        );
        Dash {
            remux_seconds,
            ts_counters: Default::default(),
            sequences: Default::default(),
            clear: clear::ClearSegments::new(Duration::from_secs(config.segment_ttl_secs.min(60))),
            ts: clear::ClearSegments::new(Duration::from_secs(config.segment_ttl_secs.min(60))),
            cache,
            prefetcher,
            settings: Settings::from_config(config),
            decrypt_seconds,
        }
    }

    /// Serves `/proxy/mpd/{endpoint}`.
    pub async fn handle(
        &self,
        req: &Request<Incoming>,
        ctx: &RequestContext,
        links: &super::links::Links,
        endpoint: &str,
    ) -> Result<Response<Body>, ProxyError> {
        // HEAD gets the same head; hyper leaves the body out. It starts no fetch ahead: a HEAD
        // is a probe, not playback (as on the HLS segment path).
        debug_assert!(matches!(*req.method(), Method::GET | Method::HEAD));
        let head = req.method() == Method::HEAD;
        match endpoint {
            "manifest.m3u8" | "manifest" => manifest::master(self, ctx, links).await,
            "playlist.m3u8" | "playlist" => manifest::media(self, ctx, links).await,
            "segment.mp4" | "segment" => segment::segment(self, ctx, head).await,
            "segment.ts" => remux::segment_ts(self, ctx, head).await,
            "init.mp4" | "init" => segment::init(self, ctx).await,
            "manifest.mpd" => out::manifest(self, ctx, links).await,
            e if e.starts_with("out/") => {
                out::template_segment(self, ctx, &e["out/".len()..], head).await
            }
            _ => Err(ProxyError::downstream(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such /proxy/mpd endpoint",
            )),
        }
    }
}

/// A 400 for a bad parameter.
pub(crate) fn bad_request(e: impl std::fmt::Display) -> ProxyError {
    ProxyError::downstream(StatusCode::BAD_REQUEST, "bad_request", e.to_string())
}

impl From<RequestError> for ProxyError {
    fn from(e: RequestError) -> Self {
        bad_request(e)
    }
}

/// Upstream request headers from `h_*`.
pub(crate) fn upstream_headers(params: &ProxyParams) -> Result<HeaderMap, ProxyError> {
    let mut headers = HeaderMap::new();
    for (name, value) in &params.request_headers {
        let name = header::HeaderName::from_bytes(name.as_bytes()).map_err(bad_request)?;
        let value = HeaderValue::from_str(value).map_err(bad_request)?;
        headers.insert(name, value);
    }
    Ok(headers)
}

/// The shared proxy parameters of a request whose upstream URL is not in `d` (segments), so `d`
/// is filled with `url` for parsing.
pub(crate) fn params_for(query: &Query, url: &url::Url) -> Result<ProxyParams, ProxyError> {
    let mut pairs = vec![("d".to_owned(), url.to_string())];
    pairs.extend(query.pairs().iter().filter(|(k, _)| k != "d").cloned());
    ProxyParams::from_query(&Query::from_pairs(pairs)).map_err(bad_request)
}

/// Where a DASH request's credentials go: the origin of its `d` and `media.credential_hosts`.
pub(crate) fn credential_scope(dash: &Dash, d: &url::Url) -> super::links::CredentialScope {
    super::links::CredentialScope::new(d, dash.settings.credential_hosts.clone())
}

/// Where a segment or init link's credentials go: against its `cred_origin`, else `own` (the URL
/// the link is for) as `d`. Each fetch it makes gets the headers decided for its own URL.
pub(crate) fn link_scope(
    dash: &Dash,
    query: &Query,
    own: &url::Url,
) -> Result<super::links::CredentialScope, ProxyError> {
    let hosts = dash.settings.credential_hosts.clone();
    super::links::CredentialScope::of_link(query, own, hosts).map_err(bad_request)
}

/// A complete response with `content_type`, `r_*`/`rp_*`/`x_headers` applied.
pub(crate) fn respond(
    bytes: impl Into<bytes::Bytes>,
    content_type: &'static str,
    params: &ProxyParams,
) -> Result<Response<Body>, ProxyError> {
    let mut resp = Response::new(body::full(bytes));
    let headers = resp.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    super::stream::apply_params(params, headers)?;
    Ok(resp)
}
