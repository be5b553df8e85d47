//! `/playlist/playlist`, MediaFlow's M3U merger, and `POST /playlist/link`, which seals a URL for
//! it: sources fetched concurrently through the upstream client (SSRF guard, size cap, deadline),
//! merged by `sluice_media::m3u`, entries pointing back here under sealed tokens.

use std::sync::Arc;
use std::time::Duration;

use crate::body::Incoming;
use futures_util::future::join_all;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use serde::{Deserialize, Serialize};
use sluice_media::m3u::{self, Fetched, Limits, MergeError, ProxyTarget, Source};
use sluice_media::query::Query;

use super::Media;
use crate::auth::token::{self, TokenGate, TokenScope};
use crate::body::{self, Body};
use crate::error::ProxyError;
use crate::request::RequestContext;
use crate::upstream::{CollectError, UpstreamBodyError, UpstreamRequest};

/// The merger's path (MediaFlow's).
pub const PLAYLIST_PATH: &str = "/playlist/playlist";
/// Where a sealed playlist URL is minted (sluice's own; MediaFlow puts the password in the URL).
pub const LINK_PATH: &str = "/playlist/link";

/// How long one source may take from request to last byte (MediaFlow allows 30 s as well).
const SOURCE_DEADLINE: Duration = Duration::from_secs(30);
/// Merged lists larger than this are built on the blocking pool.
const BLOCKING_MERGE_BYTES: usize = 256 * 1024;

/// Serves `GET /playlist/playlist?d=<sources>` for an authorized request.
pub async fn serve(
    media: &Media,
    req: &Request<Incoming>,
    ctx: &RequestContext,
) -> Result<Response<Body>, ProxyError> {
    super::require_get_or_head(req.method())?;
    let d = ctx.query.get("d").ok_or_else(|| {
        bad("missing `d`: one or more playlist URLs separated by `;` (prefixes `sort:`, `no_proxy:`)")
    })?;
    let sources = m3u::parse_sources(d).map_err(|e| bad(&e.to_string()))?;
    let fetched = join_all(sources.iter().map(|s| fetch(media, s))).await;
    if fetched.iter().all(|f| matches!(f, Fetched::Failed(_))) {
        let reasons: Vec<String> = fetched
            .iter()
            .enumerate()
            .map(|(i, f)| match f {
                Fetched::Failed(why) => format!("playlist {}: {why}", i + 1),
                Fetched::Text(_) => String::new(),
            })
            .collect();
        return Err(ProxyError::new(
            crate::error::Side::Upstream,
            StatusCode::BAD_GATEWAY,
            "playlist_unavailable",
            format!("no playlist could be fetched ({})", reasons.join("; ")),
        ));
    }
    let linker = Linker::new(ctx, media.keys.tokens().as_ref());
    let size: usize = fetched
        .iter()
        .map(|f| match f {
            Fetched::Text(t) => t.len(),
            Fetched::Failed(_) => 0,
        })
        .sum();
    let limits = Limits::new(media.settings.max_merged_entries, &fetched);
    let merge = move || m3u::merge(&sources, &fetched, limits, &mut |t| linker.url(t));
    let text = if size > BLOCKING_MERGE_BYTES {
        crate::media::cpu::run(crate::media::cpu::Lane::Document, merge)
            .await
            .map_err(|e| ProxyError::internal(format!("playlist merge failed: {e}")))?
    } else {
        merge()
    }
    .map_err(too_large)?;
    let len = text.len();
    let mut resp = Response::new(body::full_unless_head(req.method(), text));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/vnd.apple.mpegurl"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    h.insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_static("attachment; filename=\"playlist.m3u\""),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(resp)
}

/// Fetches one source; every failure becomes a reason the merged list shows as a comment (and a
/// 502 when every source failed). Reasons name no host and no URL: the merged list and the error
/// go to clients that may never have been shown the sources (a sealed `/playlist/link` token),
/// and a source URL may carry credentials; the merge names the source by its position.
async fn fetch(media: &Media, source: &Source) -> Fetched {
    let limit = media.settings.max_manifest_bytes;
    let work = async {
        let mut req = UpstreamRequest::get(source.url.clone());
        req.headers
            .insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        let up = media.upstream.send(req).await.map_err(|e| {
            // The whole message (host included) for the operator's log only.
            tracing::debug!(error = %e, "a playlist source could not be fetched");
            not_fetched(ProxyError::from_upstream(&e).kind)
        })?;
        if !up.status.is_success() {
            return Err(format!("upstream answered {}", up.status));
        }
        let html = up
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.to_ascii_lowercase().contains("text/html"));
        let bytes = up.body.collect_limited(limit).await.map_err(|e| match e {
            CollectError::TooLarge { .. } => {
                format!("the playlist is over {limit} bytes (media.max_manifest_bytes)")
            }
            CollectError::Body(e) => not_read(&e),
        })?;
        let head = String::from_utf8_lossy(&bytes[..bytes.len().min(512)]).to_ascii_lowercase();
        if html || head.trim_start().starts_with("<!doctype") || head.contains("<html") {
            return Err("upstream sent an HTML page, not a playlist".to_string());
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    match tokio::time::timeout(SOURCE_DEADLINE, work).await {
        Ok(Ok(text)) => Fetched::Text(text),
        Ok(Err(why)) => Fetched::Failed(why),
        Err(_) => Fetched::Failed(format!(
            "no complete answer within {} s",
            SOURCE_DEADLINE.as_secs()
        )),
    }
}

/// Why a source's request failed, by the error's kind: its message names the host.
fn not_fetched(kind: &str) -> String {
    let why = match kind {
        "upstream_not_allowed" => "the source's address is not allowed (upstream guard)",
        "redirect_not_allowed" => "a redirect led to an address that is not allowed",
        "dns" => "the source's host name did not resolve",
        "connect_timeout" => "connecting to the source timed out",
        "connect" => "the source refused or dropped the connection",
        "tls" => "the TLS handshake with the source failed",
        "outgoing_proxy" => "the outgoing proxy failed",
        "header_timeout" => "the source sent no response head in time",
        "redirect" => "the source redirected too often or to an unusable location",
        "protocol" => "the HTTP exchange with the source failed",
        _ => "the request to the source failed",
    };
    why.to_string()
}

/// Why a source's body could not be read, without the host the body error names.
fn not_read(e: &UpstreamBodyError) -> String {
    match e {
        UpstreamBodyError::Idle { secs, .. } => {
            format!("reading the playlist failed: nothing arrived for {secs} s")
        }
        UpstreamBodyError::Deadline { secs, .. } => {
            format!("reading the playlist failed: not complete within {secs} s")
        }
        UpstreamBodyError::Read { .. } => {
            "reading the playlist failed: the connection broke".to_string()
        }
    }
}

/// Turns merged entries into URLs on this server, in the request's auth mode.
struct Linker {
    /// `scheme://host[:port]` as the client addressed us, or empty for path-absolute URLs.
    origin: String,
    gate: Option<Arc<TokenGate>>,
    parent: Option<TokenScope>,
    /// The client's address: an entry's token is the same at every fetch from one client
    /// network, another network's its own.
    client: std::net::IpAddr,
}

impl Linker {
    fn new(ctx: &RequestContext, gate: Option<&Arc<TokenGate>>) -> Self {
        Linker {
            origin: origin(ctx),
            gate: gate.cloned(),
            parent: ctx.token.clone(),
            client: ctx.client_ip,
        }
    }

    /// With a password, a sealed token scoped to the entry's endpoint alone (its manifest: the
    /// family would open `/proxy/hls/segment.ts`, which pipes the hidden source as written). It
    /// has no expiry of its own (players keep a channel list for days), but keeps the parent
    /// token's expiry and address; it fixes every parameter, so a holder can fetch that one
    /// channel and nothing else.
    ///
    /// The token is sealed under a nonce derived from its grant and the client's network (an
    /// IPv4 address, an IPv6 /64; `TokenGate::mint_entry`), so one network gets the same token
    /// at every fetch with nothing remembered, however long the merge: a sealed token's
    /// in-flight share (`media.max_requests_per_token`) is keyed by its text, and a fresh nonce
    /// per fetch gave every channel a new full share each time the merge was fetched again.
    /// Another network gets its own token, so its own share: one viewer holding slow requests
    /// does not lock a channel for every viewer.
    fn url(&self, target: &ProxyTarget) -> String {
        let path = target.endpoint.path();
        match &self.gate {
            Some(gate) => {
                let scope = super::links::child_scope(path);
                let t =
                    gate.mint_entry(&target.params, &[&scope], self.parent.as_ref(), self.client);
                format!("{}/_token_{t}{path}", self.origin)
            }
            None => format!(
                "{}{path}?{}",
                self.origin,
                Query::from_pairs(target.params.clone()).encode()
            ),
        }
    }
}

fn origin(ctx: &RequestContext) -> String {
    match &ctx.host {
        Some(host) => format!("{}://{}", if ctx.secure { "https" } else { "http" }, host),
        None => String::new(),
    }
}

/// Body of `POST /playlist/link`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LinkRequest {
    /// The sources, as `/playlist/playlist` takes them.
    d: String,
    /// Seconds until the URL stops working; zero or absent: never.
    #[serde(default)]
    expiration: u64,
}

#[derive(Debug, Serialize)]
struct LinkResponse {
    url: String,
}

/// Serves `POST /playlist/link` for a caller that proved the password: a `/playlist/playlist`
/// URL whose sealed token fixes `d`, opens that path only and holds no password.
pub async fn link(
    media: &Media,
    req: Request<Incoming>,
    ctx: &RequestContext,
) -> Result<Response<Body>, ProxyError> {
    if req.method() != Method::POST {
        return Err(ProxyError::downstream(
            StatusCode::METHOD_NOT_ALLOWED,
            "method",
            "use POST here",
        ));
    }
    let request: LinkRequest = super::generate::read_json(req).await?;
    m3u::parse_sources(&request.d).map_err(|e| bad(&e.to_string()))?;
    let params = vec![("d".to_string(), request.d)];
    let url = match &media.keys.tokens() {
        Some(gate) => {
            let now = token::now();
            let limit = (request.expiration > 0).then(|| TokenScope {
                exp: Some(now.saturating_add(request.expiration)),
                ip: None,
                paths: None,
            });
            let t = gate.mint(&params, &[PLAYLIST_PATH], limit.as_ref(), false, now);
            format!("{}/_token_{t}{PLAYLIST_PATH}", origin(ctx))
        }
        // No password: nothing to hide, nothing to seal.
        None => format!(
            "{}{PLAYLIST_PATH}?{}",
            origin(ctx),
            Query::from_pairs(params).encode()
        ),
    };
    Ok(super::generate::json_response(&LinkResponse { url }))
}

/// A merge past its bounds: a 502 booked to the sources, like an HLS playlist over its own (the
/// same kinds). It names no source: `d` may come sealed in a `/playlist/link` token whose holder
/// was never shown it.
fn too_large(e: MergeError) -> ProxyError {
    let (kind, key) = match e {
        MergeError::TooManyEntries { .. } => (
            "too_many_entries",
            " (media.max_merged_entries)".to_string(),
        ),
        MergeError::TooManyLines { .. } => (
            "too_many_entries",
            format!(
                " ({} lines per entry of media.max_merged_entries)",
                m3u::LINES_PER_ENTRY
            ),
        ),
        MergeError::OutputTooLarge { .. } => ("playlist_rewrite_too_large", String::new()),
    };
    ProxyError::new(
        crate::error::Side::Upstream,
        StatusCode::BAD_GATEWAY,
        kind,
        format!("cannot merge the playlists: {e}{key}"),
    )
}

fn bad(message: &str) -> ProxyError {
    ProxyError::downstream(StatusCode::BAD_REQUEST, "bad_request", message.to_string())
}
