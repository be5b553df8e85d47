//! `/proxy/hls/*`: playlists fetched (size-capped), checked and rewritten by `sluice_media::hls`;
//! segments, keys and init sections piped like `/proxy/stream`.
//!
//! A manifest request is a playlist when MediaFlow would call it one: the URL says so
//! (`.m3u8`, `.m3u`, `.m3u_plus`, `type=m3u*`), `force_playlist_proxy` is set, the upstream
//! Content-Type contains `mpegurl`, or, failing all of these, the body starts with `#EXTM3U` (a
//! playlist served as `text/plain` from a URL without `.m3u8`: passed on raw, its segment URLs,
//! tokens and all, would send the player straight to the origin). Anything else streams through
//! untouched, the bytes read to tell put back in front.

pub mod blocking;
pub mod options;

use crate::body::Incoming;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use sluice_media::dash::proxy::Part;
use sluice_media::hls::{self as rewriter, SegmentExt, Sniff, Target};
use sluice_media::query::ProxyParams;

use super::links::{CredentialScope, Reach};
use super::Media;
use super::{stream, transform};
use crate::body::{self, Body};
use crate::error::{ProxyError, Side};
use crate::request::RequestContext;
use crate::upstream::{CollectError, UpstreamResponse};
use options::{Child, HlsOptions};

const PLAYLIST_TYPE: &str = "application/vnd.apple.mpegurl";
const MANIFEST: &str = "/proxy/hls/manifest.m3u8";

/// Serves `/proxy/hls/<rest>`.
pub async fn handle(
    media: &Media,
    req: &Request<Incoming>,
    ctx: &RequestContext,
    rest: &str,
) -> Result<Response<Body>, ProxyError> {
    match rest {
        "manifest.m3u8" => manifest(media, req, ctx, false).await,
        "key_proxy/manifest.m3u8" => manifest(media, req, ctx, true).await,
        "segment" => segment(media, req, ctx, None).await,
        _ => match rest.strip_prefix("segment.").and_then(SegmentExt::parse) {
            Some(ext) => segment(media, req, ctx, Some(ext)).await,
            None => Err(ProxyError::downstream(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such /proxy/hls endpoint: use manifest.m3u8, key_proxy/manifest.m3u8 or \
                 segment.{ts,m4s,mp4,m4a,m4v,aac}",
            )),
        },
    }
}

/// Segment, key and init bytes: the stream pipe with the Content-Type the extension promises
/// (an `r_content-type` still wins). A whole-segment GET of a playlist we rewrote goes through
/// the prefetcher instead: served from the cache or a fetch in flight, and the next segments are
/// fetched ahead with the same upstream headers, unless the host is paced (`ratelimit`), where
/// fetching ahead would break the pacing, or there is no media cache, where the prefetcher would
/// only read the whole segment into memory before sending a byte. `transformer` applies to either
/// path.
async fn segment(
    media: &Media,
    req: &Request<Incoming>,
    ctx: &RequestContext,
    ext: Option<SegmentExt>,
) -> Result<Response<Body>, ProxyError> {
    let params = stream::parse_params(ctx)?;
    let transformer = transform::parse(&ctx.query)?;
    let content_type = match transformer {
        Some(t) => Some(transform::content_type(t)),
        None => ext.map(|e| HeaderValue::from_static(segment_type(e))),
    };
    if let Some(engine) = engine_for(media, &params.destination) {
        // Segments on the Acestream engine: through its own client (the only one that may reach
        // it), never prefetched (the engine is local and serves one player session).
        let request = match transformer {
            Some(_) => {
                let mut r = stream::fetch_request(&params)?;
                r.method = req.method().clone();
                r
            }
            None => stream::upstream_request(req, &params)?,
        };
        let up = engine
            .send(request)
            .await
            .map_err(|e| ProxyError::from_upstream(&e))?;
        let resp = stream::respond(up, &params, content_type)?;
        return Ok(match transformer {
            Some(t) => transform::apply(resp, t),
            None => resp,
        });
    }
    let part = Part {
        url: params.destination.clone(),
        range: None,
    };
    // With a transformer the client's Range names bytes of the output, not of the upstream object.
    let whole_get = req.method() == Method::GET
        && (transformer.is_some() || !req.headers().contains_key(header::RANGE));
    let through_cache = whole_get
        && media.prefetcher.caches()
        && media.prefetcher.knows(&part)
        && !media.pacer.paces(ctx, &params);
    // A user's own `h_range` or `h_if-*` asks the origin for something other than the whole
    // object: its answer (a 206, a 304) is relayed as it is, not stored or served as a 200.
    let upstream_headers = match through_cache {
        true => Some(stream::fetch_request(&params)?.headers),
        false => None,
    };
    let Some(upstream_headers) = upstream_headers.filter(|h| !super::cache::bypasses(h)) else {
        return match transformer {
            Some(t) => transform::pipe(&media.upstream, req, &params, t).await,
            None => stream::pipe(&media.upstream, req, &params, content_type).await,
        };
    };
    let bytes = media
        .prefetcher
        .get_or_fetch(&part, &upstream_headers)
        .await?;
    media
        .prefetcher
        .segment_fetched(&part, &upstream_headers, media.credential_hosts());
    let bytes = match transformer {
        Some(t) => transform::apply_whole(bytes, t),
        None => bytes,
    };
    let mut resp = Response::new(body::full(bytes.clone()));
    let headers = resp.headers_mut();
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
    if let Some(ct) = content_type {
        headers.insert(header::CONTENT_TYPE, ct);
    }
    stream::apply_params(&params, headers)?;
    Ok(resp)
}

async fn manifest(
    media: &Media,
    req: &Request<Incoming>,
    ctx: &RequestContext,
    key_proxy: bool,
) -> Result<Response<Body>, ProxyError> {
    let params = stream::parse_params(ctx)?;
    let opts = options::parse(&ctx.query, key_proxy, media.settings.live_start_offset)?;
    // LL-HLS: a blocking reload or delta update goes upstream with its directives, shared.
    let directives = rewriter::blocking::parse_directives(&ctx.query).map_err(|e| {
        ProxyError::downstream(StatusCode::BAD_REQUEST, "bad_request", e.to_string())
    })?;
    if let Some(d) = directives {
        return blocking::serve(media, req.method() == Method::HEAD, ctx, &opts, &params, &d).await;
    }
    let by_url = opts.force_playlist || rewriter::is_playlist_url(&params.destination);
    let head = req.method() == Method::HEAD;
    let fetched = if by_url {
        Fetched::Whole(send(media, stream::fetch_request(&params)?).await?)
    } else {
        let up = send(media, stream::upstream_request(req, &params)?).await?;
        let (status, fetched) = if says_playlist(&up.headers) {
            (up.status, Fetched::Whole(up))
        } else if head || !up.status.is_success() {
            // No body to tell by (HEAD), or an error page: passed on as it is.
            return stream::respond(up, &params, None);
        } else {
            let deadline = Deadline::after(media.upstream.whole_body_timeout());
            let host = up.final_url.host_str().unwrap_or("").to_string();
            let peeked = Peeked::read(up, deadline)
                .await
                .map_err(|e| body_error(&host, e))?;
            if !peeked.playlist {
                return peeked.respond(&params);
            }
            (peeked.status, Fetched::Peeked(peeked, deadline))
        };
        if status == StatusCode::PARTIAL_CONTENT || head {
            // A part of a playlist, or none of it: fetch the whole one to rewrite.
            drop(fetched);
            Fetched::Whole(send(media, stream::fetch_request(&params)?).await?)
        } else {
            fetched
        }
    };
    let (limit, graceful) = (
        media.settings.max_manifest_bytes,
        media.settings.graceful_stream_end,
    );
    let got = match fetched {
        Fetched::Whole(up) => playlist_text(up, limit, graceful).await?,
        Fetched::Peeked(peeked, deadline) => {
            peeked.playlist_text(limit, graceful, deadline).await?
        }
    };
    let text = match got {
        Some((text, base)) => rewrite(media, ctx, &opts, text, base, head).await?,
        None => rewriter::graceful_end_playlist().to_string(),
    };
    playlist_response(text, head, &params)
}

/// A manifest answer taken for a playlist: as it came, or with its first bytes already read to
/// tell (and the deadline its whole body must arrive by).
enum Fetched {
    Whole(UpstreamResponse),
    Peeked(Peeked, Deadline),
}

/// When a body read whole must have ended (`upstream.whole_body_timeout_secs` from its head).
#[derive(Clone, Copy)]
struct Deadline {
    at: tokio::time::Instant,
    secs: u64,
}

impl Deadline {
    fn after(whole: std::time::Duration) -> Self {
        Deadline {
            at: tokio::time::Instant::now() + whole,
            secs: whole.as_secs(),
        }
    }

    fn error(self, host: &str) -> CollectError {
        CollectError::Body(crate::upstream::UpstreamBodyError::Deadline {
            host: host.to_string(),
            secs: self.secs,
        })
    }
}

/// A body that could not be read far enough to tell what it is: `504` when the origin was too
/// slow, else `502`, both the origin's fault.
fn body_error(host: &str, e: CollectError) -> ProxyError {
    use crate::upstream::UpstreamBodyError;
    let status = match &e {
        CollectError::Body(UpstreamBodyError::Idle { .. } | UpstreamBodyError::Deadline { .. }) => {
            StatusCode::GATEWAY_TIMEOUT
        }
        _ => StatusCode::BAD_GATEWAY,
    };
    let mut err = ProxyError::new(Side::Upstream, status, "upstream_body", e.to_string());
    err.upstream = Some(host.to_string());
    err
}

/// Whether `start`, the first bytes of a body (at most [`SNIFF_BYTES`]), begins a playlist:
/// `#EXTM3U` after an optional UTF-8 BOM and whitespace. `None`: too few bytes to tell yet
/// (`ended`: the body has no more).
fn starts_playlist(start: &[u8], ended: bool) -> Option<bool> {
    const BOM: &[u8] = b"\xEF\xBB\xBF";
    const MAGIC: &[u8] = b"#EXTM3U";
    let undecided = !ended && start.len() < SNIFF_BYTES;
    if undecided && start.len() < BOM.len() && BOM.starts_with(start) {
        return None;
    }
    let text = start.strip_prefix(BOM).unwrap_or(start);
    let text = match text.iter().position(|b| !b.is_ascii_whitespace()) {
        Some(at) => &text[at..],
        None => &[],
    };
    if text.len() >= MAGIC.len() {
        return Some(text.starts_with(MAGIC));
    }
    match undecided && MAGIC.starts_with(text) {
        true => None,
        false => Some(false),
    }
}

/// The frames read to tell, then the rest of the upstream body.
struct Replay {
    frames: std::collections::VecDeque<http_body::Frame<bytes::Bytes>>,
    rest: Option<std::pin::Pin<Box<crate::upstream::UpstreamBody>>>,
}

impl http_body::Body for Replay {
    type Data = bytes::Bytes;
    type Error = crate::upstream::UpstreamBodyError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Some(frame) = this.frames.pop_front() {
            return std::task::Poll::Ready(Some(Ok(frame)));
        }
        match this.rest.as_mut() {
            Some(rest) => rest.as_mut().poll_frame(cx),
            None => std::task::Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && self.rest.as_ref().is_none_or(|r| r.is_end_stream())
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let read: u64 = self
            .frames
            .iter()
            .filter_map(|f| f.data_ref())
            .map(|d| d.len() as u64)
            .sum();
        let Some(rest) = &self.rest else {
            return http_body::SizeHint::with_exact(read);
        };
        let rest = rest.size_hint();
        let mut hint = http_body::SizeHint::new();
        hint.set_lower(rest.lower() + read);
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + read);
        }
        hint
    }
}

/// At most this many bytes of a body that neither its URL nor its Content-Type calls a playlist
/// are read to see whether it starts with `#EXTM3U` (after a UTF-8 BOM and whitespace): enough
/// for any preamble a real playlist has, little enough to hold for every stream piped through.
const SNIFF_BYTES: usize = 1024;

/// An upstream answer whose first frames were read to tell a playlist from anything else.
struct Peeked {
    status: StatusCode,
    headers: HeaderMap,
    final_url: url::Url,
    host: String,
    /// The frames read, as they came (the last may run past [`SNIFF_BYTES`]).
    frames: std::collections::VecDeque<http_body::Frame<bytes::Bytes>>,
    /// The rest of the body; `None` once it has ended.
    rest: Option<std::pin::Pin<Box<crate::upstream::UpstreamBody>>>,
    /// The body starts with `#EXTM3U`.
    playlist: bool,
}

impl Peeked {
    /// Reads frames of `up` until its first bytes tell (or [`SNIFF_BYTES`] have come, or the body
    /// ends). Each read keeps the body's idle timeout (`upstream.idle_read_timeout_secs`), and all
    /// of them `deadline`: an origin that sends nothing, or a byte now and then, is a `504`.
    async fn read(up: UpstreamResponse, deadline: Deadline) -> Result<Self, CollectError> {
        use http_body_util::BodyExt;
        let host = up.final_url.host_str().unwrap_or("").to_string();
        let mut rest = Box::pin(up.body);
        let mut frames = std::collections::VecDeque::new();
        let mut start = Vec::new();
        let (playlist, ended) = loop {
            if let Some(playlist) = starts_playlist(&start, false) {
                break (playlist, false);
            }
            let frame = tokio::time::timeout_at(deadline.at, rest.frame()).await;
            match frame.map_err(|_| deadline.error(&host))? {
                None => break (starts_playlist(&start, true).unwrap_or(false), true),
                Some(Err(e)) => return Err(e.into()),
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        let take = data.len().min(SNIFF_BYTES - start.len());
                        start.extend_from_slice(&data[..take]);
                    }
                    frames.push_back(frame);
                }
            }
        };
        Ok(Peeked {
            status: up.status,
            headers: up.headers,
            final_url: up.final_url,
            host,
            frames,
            rest: (!ended).then_some(rest),
            playlist,
        })
    }

    /// The answer as [`stream::respond`] gives it, the frames read first, byte for byte.
    fn respond(self, params: &ProxyParams) -> Result<Response<Body>, ProxyError> {
        let mut resp = Response::new(body::boxed(Replay {
            frames: self.frames,
            rest: self.rest,
        }));
        *resp.status_mut() = self.status;
        let headers = resp.headers_mut();
        stream::mirror_headers(&self.headers, headers);
        stream::apply_params(params, headers)?;
        Ok(resp)
    }

    /// [`playlist_text`] for a body whose first frames were read: the rest collected under the
    /// same `limit` and by `deadline`.
    async fn playlist_text(
        self,
        limit: usize,
        graceful_stream_end: bool,
        deadline: Deadline,
    ) -> Result<Option<(String, url::Url)>, ProxyError> {
        use http_body_util::BodyExt;
        let Peeked {
            status,
            headers,
            final_url,
            host,
            frames,
            rest,
            ..
        } = self;
        let collect = async move {
            let mut out = Vec::new();
            let mut push = |data: &[u8]| {
                if out.len() + data.len() > limit {
                    return Err(CollectError::TooLarge { limit });
                }
                out.extend_from_slice(data);
                Ok(())
            };
            for frame in &frames {
                if let Some(data) = frame.data_ref() {
                    push(data)?;
                }
            }
            if let Some(mut rest) = rest {
                loop {
                    let frame = tokio::time::timeout_at(deadline.at, rest.frame()).await;
                    match frame.map_err(|_| deadline.error(&host))? {
                        None => break,
                        Some(Err(e)) => return Err(CollectError::Body(e)),
                        Some(Ok(frame)) => {
                            if let Some(data) = frame.data_ref() {
                                push(data)?;
                            }
                        }
                    }
                }
            }
            Ok(bytes::Bytes::from(out))
        };
        checked_playlist(
            status,
            &headers,
            final_url,
            limit,
            graceful_stream_end,
            collect,
        )
        .await
    }
}

/// A playlist fetch: through the Acestream engine's client for a URL on the configured engine,
/// else through the guarded upstream client like every other fetch.
async fn send(
    media: &Media,
    req: crate::upstream::UpstreamRequest,
) -> Result<UpstreamResponse, ProxyError> {
    let sent = match engine_for(media, &req.url) {
        Some(engine) => engine.send(req).await,
        None => media.upstream.send(req).await,
    };
    sent.map_err(|e| ProxyError::from_upstream(&e))
}

/// The Acestream sessions when `url` is on the configured engine: the engine usually sits on a
/// private address the guard refuses, and its own client may reach that address and no other.
fn engine_for<'a>(
    media: &'a Media,
    url: &url::Url,
) -> Option<&'a std::sync::Arc<super::acestream::session::Sessions>> {
    media.acestream.as_ref().filter(|s| s.is_engine(url))
}

/// Reads the playlist body and the URL it came from (after redirects), turning every way it can
/// be wrong into an error a user can act on. `None`: an HTML page (login wall, CDN block) came
/// instead and `media.graceful_stream_end` asks for an ended playlist rather than an error.
pub(super) async fn playlist_text(
    up: UpstreamResponse,
    limit: usize,
    graceful_stream_end: bool,
) -> Result<Option<(String, url::Url)>, ProxyError> {
    let UpstreamResponse {
        status,
        headers,
        body,
        final_url,
    } = up;
    let collect = body.collect_limited(limit);
    checked_playlist(
        status,
        &headers,
        final_url,
        limit,
        graceful_stream_end,
        collect,
    )
    .await
}

/// [`playlist_text`] for an answer's head and its body, `collect` (awaited only on a success).
async fn checked_playlist(
    status: StatusCode,
    headers: &HeaderMap,
    final_url: url::Url,
    limit: usize,
    graceful_stream_end: bool,
    collect: impl std::future::Future<Output = Result<bytes::Bytes, CollectError>>,
) -> Result<Option<(String, url::Url)>, ProxyError> {
    let host = final_url.host_str().unwrap_or("").to_string();
    let fail = |status: StatusCode, kind: &'static str, message: String| {
        let mut e = ProxyError::new(Side::Upstream, status, kind, message);
        e.upstream = Some(host.clone());
        e
    };
    if status.is_client_error() || status.is_server_error() {
        return Err(fail(
            status,
            "upstream_status",
            format!("upstream {host} answered {status} for the playlist"),
        ));
    }
    if !status.is_success() {
        return Err(fail(
            StatusCode::BAD_GATEWAY,
            "upstream_status",
            format!("upstream {host} answered {status} instead of a playlist"),
        ));
    }
    let html_type = content_type(headers).contains("text/html");
    let base = final_url;
    let bytes = collect.await.map_err(|e| match e {
        CollectError::TooLarge { .. } => fail(
            StatusCode::BAD_GATEWAY,
            "playlist_too_large",
            format!(
                "upstream {host} sent a playlist over {limit} bytes (media.max_manifest_bytes)"
            ),
        ),
        CollectError::Body(e) => fail(StatusCode::BAD_GATEWAY, "upstream_body", e.to_string()),
    })?;
    let sniffed = rewriter::sniff(&bytes[..bytes.len().min(1024)]);
    match sniffed {
        Sniff::Playlist => Ok(Some((String::from_utf8_lossy(&bytes).into_owned(), base))),
        _ if sniffed == Sniff::Html || html_type => {
            if graceful_stream_end {
                return Ok(None);
            }
            Err(fail(
                StatusCode::BAD_GATEWAY,
                "not_a_playlist",
                format!("upstream {host} sent HTML, not a playlist"),
            ))
        }
        _ => Err(fail(
            StatusCode::BAD_GATEWAY,
            "not_a_playlist",
            format!("upstream {host} sent no HLS playlist (it does not start with #EXTM3U)"),
        )),
    }
}

/// Playlists larger than this are rewritten on the blocking pool, so a huge VOD playlist never holds
/// an async worker (and the streams and IPTV hubs scheduled on it) for milliseconds.
const BLOCKING_REWRITE_BYTES: usize = 256 * 1024;

/// Rewrites `text` so every URI comes back through this proxy, in the parent's auth mode. `head`:
/// the client asked with HEAD, so it gets no playlist and its segments are not prebuffered.
async fn rewrite(
    media: &Media,
    ctx: &RequestContext,
    opts: &HlsOptions,
    text: String,
    base: url::Url,
    head: bool,
) -> Result<String, ProxyError> {
    let cap = media.settings.max_playlist_segments;
    let entries = rewriter::count_entries(&text);
    if entries > cap {
        // The origin's playlist is at fault, like one over `max_manifest_bytes`.
        return Err(bad_playlist(
            &base,
            "too_many_entries",
            format!(
                "the playlist from {} lists {entries} URIs, over the limit of {cap} \
                 (media.max_playlist_segments)",
                base.host_str().unwrap_or("")
            ),
        ));
    }
    let vod = job_is_vod(&text);
    let params = stream::parse_params(ctx)?;
    let playlist = options::carried(&ctx.query, Child::Playlist, opts.key_proxy);
    let segment = options::carried(&ctx.query, Child::Segment, opts.key_proxy);
    let scope = credential_scope(media, &params.destination);
    let job = RewriteJob {
        links: media.links(ctx),
        // A viewer's credentials are for the origin of the `d` they came with (and the hosts
        // `media.credential_hosts` names): children on any other (where a redirect led, a key
        // vendor, another CDN) get the rest of the headers, as a redirect to another origin
        // drops them.
        scope: scope.clone(),
        playlist,
        segment,
        opts: opts.rewrite.clone(),
        text,
        base,
    };
    let (rewritten, parts, base) = if job.text.len() > BLOCKING_REWRITE_BYTES {
        crate::media::cpu::run(crate::media::cpu::Lane::Manifest, move || job.run())
            .await
            .map_err(|e| ProxyError::internal(format!("playlist rewrite failed: {e}")))?
    } else {
        job.run()
    };
    // Engine segments are not prefetched: the prefetcher fetches through the guarded client.
    if rewritten.is_ok() && !parts.is_empty() && engine_for(media, &base).is_none() {
        let warm = super::prebuffer::pick(&parts, vod, media.settings.prebuffer_segments);
        // Registered for the upstream headers its segment links carry (every `h_*` but `h_range`),
        // so only this viewer's segment requests find it and fetch ahead with their headers: those
        // of the segments that carry the most (when every segment is on another origin than `d`,
        // a redirect, a CDN, no credentials; on a `credential_hosts` host, no `h_host`).
        let mut headers = stream::fetch_request(&params)?.headers;
        headers.remove(header::RANGE);
        let best = parts.iter().map(|p| scope.reach(&p.url)).max();
        let headers = super::links::scoped_headers(&headers, best.unwrap_or(Reach::Nothing));
        media
            .prefetcher
            .register_playlist_for(base.as_str(), &headers, parts);
        if !head {
            super::prebuffer::warm(media, ctx, warm);
        }
    }
    rewritten.map_err(|e| {
        let kind = match e {
            rewriter::HlsError::UrlTooLong { .. } => "playlist_url_too_long",
            rewriter::HlsError::OutputTooLarge { .. } => "playlist_rewrite_too_large",
            _ => "bad_playlist",
        };
        let message = format!(
            "cannot rewrite the playlist from {}: {e}",
            base.host_str().unwrap_or("")
        );
        bad_playlist(&base, kind, message)
    })
}

/// Where credentials given with `d` go (`media.credential_hosts`, parsed once at start).
pub(super) fn credential_scope(media: &Media, d: &url::Url) -> CredentialScope {
    CredentialScope::new(d, media.credential_hosts().clone())
}

/// A 502 booked to the origin whose playlist at `base` cannot be served.
fn bad_playlist(base: &url::Url, kind: &'static str, message: String) -> ProxyError {
    let mut err = ProxyError::new(Side::Upstream, StatusCode::BAD_GATEWAY, kind, message);
    err.upstream = base.host_str().map(str::to_string);
    err
}

/// A playlist that ends (or says it is VOD) plays from its top; any other is live.
fn job_is_vod(text: &str) -> bool {
    text.contains("#EXT-X-ENDLIST") || text.contains("#EXT-X-PLAYLIST-TYPE:VOD")
}

/// Everything a rewrite needs, owned, so it can run on the blocking pool.
struct RewriteJob {
    links: super::links::Links,
    /// Where the request's credentials go: each child carries the `h_*` its own URL may get.
    scope: CredentialScope,
    playlist: Vec<(String, String)>,
    segment: Vec<(String, String)>,
    opts: rewriter::RewriteOptions,
    text: String,
    base: url::Url,
}

type RewriteOutcome = (Result<String, rewriter::HlsError>, Vec<Part>, url::Url);

impl RewriteJob {
    /// The rewritten text, the segments in playback order (for prefetch; byte-range playlists are
    /// left to the pipe, since their segments are slices the player asks for with Range), and the
    /// base URL.
    fn run(self) -> RewriteOutcome {
        let RewriteJob {
            links,
            scope,
            playlist,
            segment,
            opts,
            text,
            base,
        } = self;
        let mut parts = Vec::new();
        let collect = !has_byte_ranges(&text);
        let mut make_url = |target: Target, url: &url::Url| {
            if collect && matches!(target, Target::Segment { .. }) {
                parts.push(Part {
                    url: url.clone(),
                    range: None,
                });
            }
            let (ext, carried) = match target {
                Target::Playlist => (None, &playlist),
                Target::Key => (Some(SegmentExt::Ts), &segment),
                Target::Segment { ext } | Target::Map { ext } => (Some(ext), &segment),
            };
            let mut params = Vec::with_capacity(carried.len() + 1);
            params.push(("d".to_string(), url.to_string()));
            params.extend(super::links::scoped_params(carried, scope.reach(url)));
            match ext {
                None => links.url(MANIFEST, &params),
                Some(ext) => links.url(&format!("/proxy/hls/segment.{}", ext.as_str()), &params),
            }
        };
        let rewritten = rewriter::rewrite_playlist(&text, &base, &opts, &mut make_url);
        (rewritten, parts, base)
    }
}

/// Whether any segment of `text` is a slice of a file: an `EXT-X-BYTERANGE` tag, or an LL-HLS
/// part or preload hint with a `BYTERANGE` attribute (`BYTERANGE=`, `BYTERANGE-START`). Such
/// segments are left to the pipe: registered whole, a warm-up would fetch the growing file.
fn has_byte_ranges(text: &str) -> bool {
    text.contains("BYTERANGE")
        && text
            .lines()
            .any(|l| l.starts_with("#EXT") && l.contains("BYTERANGE"))
}

fn playlist_response(
    text: String,
    head: bool,
    params: &ProxyParams,
) -> Result<Response<Body>, ProxyError> {
    let len = text.len();
    let mut resp = Response::new(if head {
        body::empty()
    } else {
        body::full(text)
    });
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(PLAYLIST_TYPE),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    stream::apply_params(params, headers)?;
    Ok(resp)
}

fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase()
}

/// `application/vnd.apple.mpegurl`, `application/x-mpegurl`, `audio/mpegurl`...
fn says_playlist(headers: &HeaderMap) -> bool {
    content_type(headers).contains("mpegurl")
}

fn segment_type(ext: SegmentExt) -> &'static str {
    match ext {
        SegmentExt::Ts => "video/mp2t",
        SegmentExt::M4s | SegmentExt::Mp4 | SegmentExt::M4v => "video/mp4",
        SegmentExt::M4a => "audio/mp4",
        SegmentExt::Aac => "audio/aac",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_media::query::Query;

    fn job(text: &str) -> RewriteJob {
        let ctx = RequestContext {
            peer: "127.0.0.1:5000".parse().unwrap(),
            client_ip: "127.0.0.1".parse().unwrap(),
            query: Query::parse("d=http%3A%2F%2Fo%2Fl.m3u8"),
            path: MANIFEST.into(),
            host: Some("proxy.example".into()),
            secure: false,
            token: None,
        };
        RewriteJob {
            links: super::super::links::Links::new(&ctx, None),
            scope: CredentialScope::new(
                &url::Url::parse("http://o/l.m3u8").unwrap(),
                super::super::links::CredentialHosts::default(),
            ),
            playlist: Vec::new(),
            segment: Vec::new(),
            opts: rewriter::RewriteOptions::default(),
            text: text.to_string(),
            base: url::Url::parse("http://o/l.m3u8").unwrap(),
        }
    }

    #[test]
    fn a_playlist_is_told_by_its_first_bytes() {
        let cases: &[(&[u8], bool, Option<bool>)] = &[
            (b"#EXTM3U\n", false, Some(true)),
            (b"\xEF\xBB\xBF \r\n\t#EXTM3U", false, Some(true)),
            // Too few bytes yet: empty, part of a BOM, whitespace, a prefix of the magic.
            (b"", false, None),
            (b"\xEF\xBB", false, None),
            (b"\xEF\xBB\xBF  ", false, None),
            (b"#EXTM", false, None),
            // Told at once, or when the body ends.
            (b"\x47\x40", false, Some(false)),
            (b"#EXT-X-", false, Some(false)),
            (b"#EXTM", true, Some(false)),
            (b"", true, Some(false)),
            (b"\xEF\xBB", true, Some(false)),
            (b"#extm3u", false, Some(false)),
        ];
        for (start, ended, want) in cases {
            assert_eq!(starts_playlist(start, *ended), *want, "{start:?} {ended}");
        }
        // Whitespace filling the sniffed bytes is no playlist, without waiting for more.
        assert_eq!(starts_playlist(&[b' '; SNIFF_BYTES], false), Some(false));
        assert_eq!(starts_playlist(&[b' '; SNIFF_BYTES - 1], false), None);
    }

    #[test]
    fn byte_range_parts_are_not_registered_whole() {
        let head = "#EXTM3U\n#EXT-X-TARGETDURATION:4\n#EXT-X-PART-INF:PART-TARGET=1.0\n";
        let plain = format!(
            "{head}#EXT-X-PART:DURATION=1.0,URI=\"p0.mp4\"\n#EXTINF:4.0,\ns0.mp4\n\
             #EXT-X-PRELOAD-HINT:TYPE=PART,URI=\"p1.mp4\"\n"
        );
        let (out, parts, _) = job(&plain).run();
        assert!(out.is_ok());
        assert!(!parts.is_empty());
        for ranged in [
            format!(
                "{head}#EXT-X-PART:DURATION=1.0,URI=\"s1.mp4\",BYTERANGE=1000@0\n\
                 #EXT-X-PART:DURATION=1.0,URI=\"s1.mp4\",BYTERANGE=1000@1000\n"
            ),
            format!(
                "{head}#EXTINF:4.0,\ns0.mp4\n\
                 #EXT-X-PRELOAD-HINT:TYPE=PART,URI=\"s1.mp4\",BYTERANGE-START=0\n"
            ),
            format!("{head}#EXT-X-BYTERANGE:1000@0\n#EXTINF:4.0,\ns0.mp4\n"),
        ] {
            let (out, parts, _) = job(&ranged).run();
            assert!(out.is_ok(), "{ranged}");
            assert_eq!(parts, [], "{ranged}");
        }
        // A URI that merely says BYTERANGE keeps its segments.
        let (_, parts, _) = job("#EXTM3U\n#EXTINF:4.0,\nBYTERANGE.ts\n").run();
        assert_eq!(parts.len(), 1);
    }

    #[test]
    fn children_on_another_origin_lose_the_credentials() {
        let mut j = job(
            "#EXTM3U\n#EXT-X-KEY:METHOD=AES-128,URI=\"https://keys.example/k\"\n\
             #EXTINF:4.0,\na.ts\n#EXTINF:4.0,\nhttp://o:8080/b.ts\n#EXTINF:4.0,\n\
             https://o/c.ts\n#EXTINF:4.0,\nhttp://O:80/d.ts\n",
        );
        let creds = vec![
            ("h_authorization".to_string(), "Bearer X".to_string()),
            ("h_referer".to_string(), "r".to_string()),
        ];
        j.segment = creds;
        let (out, _, _) = j.run();
        let out = out.unwrap();
        let lines: Vec<&str> = out.lines().filter(|l| l.contains("/proxy/")).collect();
        assert_eq!(lines.len(), 5, "{out}");
        let with = |l: &&&str| l.contains("h_authorization=Bearer");
        // Only a.ts and d.ts (the same scheme, host and port as `d`) carry them.
        let carrying: Vec<_> = lines.iter().filter(with).collect();
        assert_eq!(carrying.len(), 2, "{out}");
        assert!(carrying
            .iter()
            .all(|l| l.contains("a.ts") || l.contains("d.ts")));
        assert!(lines.iter().all(|l| l.contains("h_referer=r")));
    }
}
