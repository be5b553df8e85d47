//! `manifest.m3u8` (HLS master) and `playlist.m3u8` (one profile's media playlist) from a cached
//! MPD; SegmentBase tracks get their `sidx` fetched (and cached) on the way. A large MPD is parsed,
//! and every media playlist built, on the blocking pool.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, Response, StatusCode};
use sluice_media::dash::proxy::{self, Part, RequestError, PLAYLIST_PATH};
use sluice_media::dash::{
    parse_mpd, parse_sidx, to_hls_master, to_hls_media_live, ByteRange, DashError, LiveSequence,
    MediaOptions, MediaUrl, Mpd, SidxFetch, SidxFragment,
};
use sluice_media::query::ProxyParams;
use url::Url;

use super::{bad_request, respond, upstream_headers, Dash};
use crate::body::Body;
use crate::error::{ProxyError, Side};
use crate::media::cache::CacheKind;
use crate::media::cpu::{self, Lane};
use crate::media::links::{self, CredentialScope, Links, Reach};
use crate::request::RequestContext;

const PLAYLIST_TYPE: &str = "application/vnd.apple.mpegurl";

/// Most `sidx` boxes fetched for one playlist (one per Period of a SegmentBase track).
const MAX_SIDX_FETCHES: usize = 32;

/// `/proxy/mpd/manifest.m3u8`.
pub async fn master(
    dash: &Dash,
    ctx: &RequestContext,
    links: &Links,
) -> Result<Response<Body>, ProxyError> {
    let (params, _, mpd) = load(dash, ctx).await?;
    let options = proxy::master_options(&ctx.query)?;
    let carried = links::carried(&ctx.query, |k| !proxy::carried_to_playlist(k));
    let mpd_url = params.destination.as_str();
    let text = to_hls_master(&mpd, &options, |rep| {
        let mut p = proxy::playlist_params(mpd_url, rep);
        p.extend(carried.iter().cloned());
        links.url(PLAYLIST_PATH, &p)
    })
    .map_err(bad_mpd)?;
    respond(text, PLAYLIST_TYPE, &params)
}

/// `/proxy/mpd/playlist.m3u8`.
pub async fn media(
    dash: &Dash,
    ctx: &RequestContext,
    links: &Links,
) -> Result<Response<Body>, ProxyError> {
    let profile = ctx
        .query
        .get("profile_id")
        .ok_or(RequestError::Missing("profile_id"))?
        .to_owned();
    let (params, headers, mpd) = load(dash, ctx).await?;
    let live = mpd.is_live();
    let mut options = MediaOptions {
        now: unix_now(),
        live_depth: Some(dash.settings.live_depth),
        start_offset: proxy::start_offset(&ctx.query, live, dash.settings.live_start_offset)?,
        skip: proxy::parse_skip(&ctx.query)?,
        no_map: false,
        sidx: HashMap::new(),
    };
    // TS segments carry no init of their own: each segment URL names it and there is no map.
    let ts = proxy::remux_to_ts(&ctx.query, dash.settings.remux_to_ts);
    options.no_map = ts;
    let track = format!("dash {} {profile}", params.destination);
    let carried = links::carried(&ctx.query, |k| !proxy::carried(k));
    let mut job = PlaylistJob {
        mpd,
        profile,
        options,
        sequence: LiveSequence::default(),
        links: links.clone(),
        // A viewer's credentials are for the origin of the `d` they came with and the hosts
        // `media.credential_hosts` names (as HLS children's, `hls::RewriteJob`): segments and
        // inits on any other (a BaseURL elsewhere, where the MPD redirected) get the rest of
        // the headers.
        scope: super::credential_scope(dash, &params.destination),
        carried,
        ts,
    };
    for _ in 0..=MAX_SIDX_FETCHES {
        // The state is copied out, so the build runs on another thread without the lock, and
        // kept only if no other request kept a newer one meanwhile (see `Sequences::keep`).
        let seen = dash.sequences.current(&track);
        job.sequence = seen.clone();
        // Every build goes to the manifest lane, whatever the MPD's size: a 1 KB MPD with one
        // `<S r="99999"/>` (or an `@duration` Period of 100,000 slots) lists as many segments,
        // each made into a proxy URL (perhaps a sealed token), as the largest one. Counting them
        // first would repeat the expansion's rules here; the hop costs tens of microseconds.
        let (back, made) = cpu::run(Lane::Manifest, move || job.run())
            .await
            .map_err(|e| ProxyError::internal(format!("playlist build failed: {e}")))?;
        job = back;
        match made {
            Ok((text, parts)) => {
                let sequence = std::mem::take(&mut job.sequence);
                // Kept or not, this answer is served: its numbers follow the state it began from.
                dash.sequences.keep(&track, &seen, sequence);
                // For the upstream headers its segment fetches carry (`h_range` too), as HLS
                // registers: only this viewer's segment requests find it. Those of the segments
                // that carry the most: none of the credentials when every segment is on another
                // origin than `d`, no `h_host` on a `credential_hosts` host.
                let best = parts.iter().map(|p| job.scope.reach(&p.url)).max();
                let headers = links::scoped_headers(&headers, best.unwrap_or(Reach::Nothing));
                dash.prefetcher
                    .register_playlist_for(&track, &headers, parts);
                return respond(text, PLAYLIST_TYPE, &params);
            }
            Err(DashError::SidxMissing { url, range }) => {
                let url = Url::parse(&url).map_err(bad_mpd)?;
                let fragments = load_sidx(dash, &url, range, &headers, &job.scope).await?;
                job.options.sidx.insert(SidxFetch { url, range }, fragments);
            }
            Err(DashError::UnknownProfile(p)) => {
                return Err(ProxyError::downstream(
                    StatusCode::NOT_FOUND,
                    "unknown_profile",
                    format!("no profile {p:?} in the MPD"),
                ))
            }
            Err(e) => return Err(bad_mpd(e)),
        }
    }
    Err(bad_mpd("too many sidx boxes to fetch"))
}

/// Everything one media playlist build needs, owned, so it can move to the blocking pool; it
/// comes back with its result, for another try once a missing `sidx` is fetched.
struct PlaylistJob {
    mpd: Arc<Mpd>,
    profile: String,
    options: MediaOptions,
    sequence: LiveSequence,
    links: Links,
    /// Where the request's credentials go: each link carries those its URLs may get.
    scope: CredentialScope,
    carried: Vec<(String, String)>,
    /// Segments are remuxed to MPEG-TS (their URLs name the init; no map).
    ts: bool,
}

impl PlaylistJob {
    /// The playlist text and the segments it lists (for the prefetcher).
    fn run(mut self) -> (Self, Result<(String, Vec<Part>), DashError>) {
        let mut parts = Vec::new();
        let (live, ts) = (self.mpd.is_live(), self.ts);
        let (links, scope, carried) = (&self.links, &self.scope, &self.carried);
        let made = to_hls_media_live(
            &self.mpd,
            &self.profile,
            &self.options,
            &mut self.sequence,
            |target| {
                if let MediaUrl::Segment { segment, .. } = target {
                    parts.push(Part {
                        url: segment.url.clone(),
                        range: segment.byte_range,
                    });
                }
                let credentials = media_credentials(&target, scope, carried);
                let (endpoint, mut p) = if ts {
                    proxy::ts_media_params(target, live)
                } else {
                    proxy::media_params(target, live)
                };
                p.extend(credentials);
                links.url(endpoint, &p)
            },
        );
        (self, made.map(|text| (text, parts)))
    }
}

/// Parameters, upstream headers and the MPD of a playlist request; refuses a protected MPD
/// requested without keys.
async fn load(
    dash: &Dash,
    ctx: &RequestContext,
) -> Result<(ProxyParams, HeaderMap, Arc<Mpd>), ProxyError> {
    let params = ProxyParams::from_query(&ctx.query).map_err(bad_request)?;
    let keys = proxy::key_ring(&ctx.query).map_err(bad_request)?;
    let headers = upstream_headers(&params)?;
    let (mpd, _) = load_mpd_text(dash, &params.destination, &headers).await?;
    if let Some(needed) = proxy::keys_needed(&mpd, keys.as_ref()) {
        return Err(ProxyError::downstream(
            StatusCode::BAD_REQUEST,
            "key_required",
            needed.to_string(),
        ));
    }
    Ok((params, headers, mpd))
}

/// The parsed MPD at `url` and its text (DASH out rewrites the text itself), from the cache or
/// fetched. A static MPD is cached for `mpd_ttl` (unless the origin says otherwise); a live one
/// is used for at most its `minimumUpdatePeriod` (and `live_mpd_ttl`), so an older copy is
/// fetched again.
pub(super) async fn load_mpd_text(
    dash: &Dash,
    url: &Url,
    headers: &HeaderMap,
) -> Result<(Arc<Mpd>, bytes::Bytes), ProxyError> {
    let part = Part {
        url: url.clone(),
        range: None,
    };
    let limit = dash.settings.max_mpd_bytes;
    let mut max_age = None;
    loop {
        let fetched = dash
            .cache
            .fetch(CacheKind::Mpd, &part, headers, limit, max_age)
            .await?;
        let mpd = if fetched.bytes.len() > BLOCKING_PARSE_BYTES {
            // A large document is parsed on the blocking pool, as a large HLS playlist is
            // rewritten there: an 8 MiB MPD holds a runtime worker for tens of milliseconds.
            let (bytes, url) = (fetched.bytes.clone(), fetched.final_url.clone());
            cpu::run(Lane::Manifest, move || parse_text(&bytes, &url))
                .await
                .map_err(|_| bad_mpd("the parse did not finish"))??
        } else {
            parse_text(&fetched.bytes, &fetched.final_url)?
        };
        if !mpd.is_live() || max_age.is_some() {
            return Ok((Arc::new(mpd), fetched.bytes));
        }
        let refresh = mpd
            .minimum_update_period
            .filter(|p| p.is_finite() && *p > 0.0)
            .map(Duration::from_secs_f64)
            .unwrap_or(dash.settings.live_mpd_ttl)
            .min(dash.settings.live_mpd_ttl)
            .as_secs();
        if fetched.age <= refresh {
            return Ok((Arc::new(mpd), fetched.bytes));
        }
        // A live MPD older than its refresh period: once more, no older than that.
        max_age = Some(refresh);
    }
}

/// Above this many bytes an MPD is parsed and (DASH out) its text rewritten on the blocking pool
/// (the HLS rewrite's threshold).
pub(super) const BLOCKING_PARSE_BYTES: usize = 256 * 1024;

fn parse_text(bytes: &[u8], url: &Url) -> Result<Mpd, ProxyError> {
    let text = std::str::from_utf8(bytes).map_err(|_| bad_mpd("not UTF-8 text"))?;
    parse_mpd(text, url).map_err(bad_mpd)
}

/// The carried parameters a playlist's (or DASH out MPD's) init or segment link gets: the `h_*`
/// the URL it fetches may get, or for a segment with its init, those the one that may get more
/// may; the segment and the init are then fetched each with its own (`segment::segment`), decided
/// against `d`'s origin, which the link names (`cred_origin`) when they are on different origins.
pub(super) fn media_credentials(
    target: &MediaUrl<'_>,
    scope: &CredentialScope,
    carried: &[(String, String)],
) -> Vec<(String, String)> {
    let (own, other) = match target {
        MediaUrl::Init { init, .. } => (&init.url, None),
        MediaUrl::Segment { init, segment, .. } => (&segment.url, init.map(|i| &i.url)),
    };
    link_credentials(own, other, scope, carried)
}

/// [`media_credentials`] for a link fetching `own` (which stands for `d` when it is served), and
/// perhaps `other` (an init).
pub(super) fn link_credentials(
    own: &Url,
    other: Option<&Url>,
    scope: &CredentialScope,
    carried: &[(String, String)],
) -> Vec<(String, String)> {
    let reach = scope.reach(own);
    let best = other.map_or(reach, |o| reach.max(scope.reach(o)));
    let mut p: Vec<_> = links::scoped_params(carried, best).collect();
    let credentialed = p.iter().any(|(k, _)| links::is_credential_param(k));
    if credentialed && other.is_some_and(|o| o.origin() != own.origin()) {
        p.push((links::CREDENTIAL_ORIGIN.to_owned(), scope.home()));
    }
    p
}

/// The fragments listed by the `sidx` in `range` of `url` (bytes cached). `headers` are the
/// viewer's for the request's `d`, whose credentials go where `scope` says: a `sidx` the MPD
/// names on another origin is fetched without them.
pub(super) async fn load_sidx(
    dash: &Dash,
    url: &Url,
    range: ByteRange,
    headers: &HeaderMap,
    scope: &CredentialScope,
) -> Result<Vec<SidxFragment>, ProxyError> {
    let headers = &links::scoped_headers(headers, scope.reach(url));
    let part = Part {
        url: url.clone(),
        range: Some(range),
    };
    let fetched = dash
        .cache
        .fetch(
            CacheKind::Sidx,
            &part,
            headers,
            dash.settings.max_segment_bytes,
            None,
        )
        .await?;
    parse_sidx(&fetched.bytes, range.0).map_err(bad_mpd)
}

/// A 502 for an MPD (or sidx) that cannot be used, with the reason.
pub(super) fn bad_mpd(e: impl std::fmt::Display) -> ProxyError {
    ProxyError::new(
        Side::Upstream,
        StatusCode::BAD_GATEWAY,
        "bad_mpd",
        format!("the MPD cannot be used: {e}"),
    )
}

pub(super) fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
