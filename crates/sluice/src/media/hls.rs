//! `/proxy/hls/*`: playlists fetched (size-capped), checked and rewritten by `sluice_media::hls`;
//! segments, keys and init sections piped like `/proxy/stream`.
//!
//! A manifest request is a playlist when MediaFlow would call it one: the URL says so
//! (`.m3u8`, `.m3u`, `.m3u_plus`, `type=m3u*`), `force_playlist_proxy` is set, or the upstream
//! Content-Type contains `mpegurl`. Anything else streams through untouched.

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
    let up = if by_url {
        send(media, stream::fetch_request(&params)?).await?
    } else {
        let up = send(media, stream::upstream_request(req, &params)?).await?;
        if !says_playlist(&up.headers) {
            return stream::respond(up, &params, None);
        }
        if up.status == StatusCode::PARTIAL_CONTENT || req.method() == Method::HEAD {
            // A part of a playlist, or none of it: fetch the whole one to rewrite.
            drop(up);
            send(media, stream::fetch_request(&params)?).await?
        } else {
            up
        }
    };
    let text = match playlist_text(
        up,
        media.settings.max_manifest_bytes,
        media.settings.graceful_stream_end,
    )
    .await?
    {
        Some((text, base)) => {
            let head = req.method() == Method::HEAD;
            rewrite(media, ctx, &opts, text, base, head).await?
        }
        None => rewriter::graceful_end_playlist().to_string(),
    };
    playlist_response(text, req.method() == Method::HEAD, &params)
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
    let host = up.final_url.host_str().unwrap_or("").to_string();
    let fail = |status: StatusCode, kind: &'static str, message: String| {
        let mut e = ProxyError::new(Side::Upstream, status, kind, message);
        e.upstream = Some(host.clone());
        e
    };
    if up.status.is_client_error() || up.status.is_server_error() {
        return Err(fail(
            up.status,
            "upstream_status",
            format!("upstream {host} answered {} for the playlist", up.status),
        ));
    }
    if !up.status.is_success() {
        return Err(fail(
            StatusCode::BAD_GATEWAY,
            "upstream_status",
            format!(
                "upstream {host} answered {} instead of a playlist",
                up.status
            ),
        ));
    }
    let html_type = content_type(&up.headers).contains("text/html");
    let base = up.final_url.clone();
    let bytes = up.body.collect_limited(limit).await.map_err(|e| match e {
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
