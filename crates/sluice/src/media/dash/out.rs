//! DASH out: `manifest.mpd` serves the origin's MPD rewritten for DASH players (every init and
//! segment back through sluice, decrypted when the request carries ClearKey keys), and
//! `out/{number}/{time}/segment.mp4` serves the segments of its SegmentTemplate tracks. A large
//! MPD is rewritten on the blocking pool, as it is parsed there.

use std::collections::HashMap;
use std::sync::Arc;

use http::{Response, StatusCode};
use sluice_media::dash::out::{
    rewrite_mpd, template_params, template_path, template_segment_url, OutOptions, OutUrl,
};
use sluice_media::dash::proxy::{self, media_params};
use sluice_media::dash::{DashError, Mpd, SidxFetch};
use sluice_media::query::{ProxyParams, Query};
use url::{Origin, Url};

use super::manifest::{bad_mpd, load_mpd_text, load_sidx, media_is_home, unix_now};
use super::{bad_request, respond, segment, upstream_headers, Dash};
use crate::body::Body;
use crate::error::ProxyError;
use crate::media::cpu::{self, Lane};
use crate::media::links::{self, Links};
use crate::request::RequestContext;

const MPD_TYPE: &str = "application/dash+xml";

/// Most `sidx` boxes fetched for one MPD (one per SegmentBase Representation and Period).
const MAX_SIDX_FETCHES: usize = 64;

/// `/proxy/mpd/manifest.mpd`.
pub async fn manifest(
    dash: &Dash,
    ctx: &RequestContext,
    links: &Links,
) -> Result<Response<Body>, ProxyError> {
    let params = ProxyParams::from_query(&ctx.query).map_err(bad_request)?;
    let keys = proxy::key_ring(&ctx.query).map_err(bad_request)?;
    let headers = upstream_headers(&params)?;
    let (mpd, text) = load_mpd_text(dash, &params.destination, &headers).await?;
    let large = text.len() > super::manifest::BLOCKING_PARSE_BYTES;
    let carried = links::carried(&ctx.query, |k| !proxy::carried(k));
    // Keys: sluice decrypts, so players must not see protection. No keys: the content passes
    // through as the origin serves it, protection signalling and all, for a player with its
    // own licence.
    let mut job = RewriteJob {
        text,
        options: OutOptions {
            now: unix_now(),
            strip_protection: keys.is_some(),
            sidx: HashMap::new(),
        },
        mpd,
        links: links.clone(),
        // The viewer's credentials go only to the origin of their `d`, as for HLS children
        // (`hls::RewriteJob`): inits and segments on any other get the rest of the headers.
        origin: params.destination.origin(),
        foreign: links::without_credentials(&carried),
        carried,
    };
    for _ in 0..=MAX_SIDX_FETCHES {
        let (back, made) = if large {
            // A large MPD may list up to a million segments over its Representations, each
            // made into a proxy URL: rewritten on the blocking pool, like its parse, so a
            // hostile origin's MPD holds no runtime worker (and every connection on it).
            cpu::run(Lane::Manifest, move || job.run())
                .await
                .map_err(|e| ProxyError::internal(format!("MPD rewrite failed: {e}")))?
        } else {
            job.run()
        };
        job = back;
        match made {
            Ok(out) => return respond(out, MPD_TYPE, &params),
            Err(DashError::SidxMissing { url, range }) => {
                let url = Url::parse(&url).map_err(bad_mpd)?;
                let fragments = load_sidx(dash, &url, range, &headers, &job.origin).await?;
                job.options.sidx.insert(SidxFetch { url, range }, fragments);
            }
            Err(e) => return Err(bad_mpd(e)),
        }
    }
    Err(bad_mpd("too many sidx boxes to fetch"))
}

/// Everything one MPD rewrite needs, owned, so a large one can move to the blocking pool; it
/// comes back with its result, for another try once a missing `sidx` is fetched.
struct RewriteJob {
    /// The MPD's text, as the origin sent it (already read as UTF-8 by its parse).
    text: bytes::Bytes,
    mpd: Arc<Mpd>,
    options: OutOptions,
    links: Links,
    /// The origin of the request's `d`: children elsewhere get `foreign`, not `carried`.
    origin: Origin,
    carried: Vec<(String, String)>,
    /// `carried` without the viewer's credentials.
    foreign: Vec<(String, String)>,
}

impl RewriteJob {
    /// The rewritten MPD.
    fn run(self) -> (Self, Result<String, DashError>) {
        let made = match std::str::from_utf8(&self.text) {
            Ok(text) => self.rewrite(text),
            Err(_) => Err(DashError::Xml("not UTF-8 text".to_owned())),
        };
        (self, made)
    }

    /// `text` (the MPD's) rewritten, every init and segment URL made to come back through sluice.
    fn rewrite(&self, text: &str) -> Result<String, DashError> {
        let live = self.mpd.is_live();
        let (links, origin) = (&self.links, &self.origin);
        let (carried, foreign) = (&self.carried, &self.foreign);
        rewrite_mpd(text, &self.mpd, &self.options, |target| {
            // A templated segment also checks, when served, that the template keeps it on the
            // BaseURL's origin (`template_segment`).
            let home = match &target {
                OutUrl::Template { rep, init, .. } => {
                    rep.base_url.origin() == *origin
                        && init.is_none_or(|i| i.url.origin() == *origin)
                }
                OutUrl::Media(m) => media_is_home(m, origin),
                OutUrl::File { url, .. } => url.origin() == *origin,
            };
            let carried = if home { carried } else { foreign };
            let (endpoint, mut p) = match target {
                OutUrl::Template {
                    rep,
                    template,
                    init,
                } => (
                    template_path(template),
                    template_params(rep, template, init, live),
                ),
                OutUrl::Media(m) => {
                    let (endpoint, p) = media_params(m, live);
                    (endpoint.to_owned(), p)
                }
                OutUrl::File { url, .. } => {
                    let mut p = vec![("d".to_owned(), url.to_string())];
                    p.extend(carried.iter().filter(|(k, _)| k.starts_with("h_")).cloned());
                    return links.url("/proxy/stream", &p);
                }
            };
            p.extend(carried.iter().cloned());
            links.url(&endpoint, &p)
        })
    }
}

/// `/proxy/mpd/out/{number}/{time}/segment.mp4`: the sealed template rendered for the segment
/// the player names in the path, then served as `segment.mp4` is (`head`: a HEAD request).
pub async fn template_segment(
    dash: &Dash,
    ctx: &RequestContext,
    rest: &str,
    head: bool,
) -> Result<Response<Body>, ProxyError> {
    let url = template_segment_url(rest, &ctx.query).map_err(|e| {
        ProxyError::downstream(StatusCode::BAD_REQUEST, "bad_request", e.to_string())
    })?;
    // The MPD's rewrite gave this link the viewer's credentials only for a BaseURL on their
    // `d`'s origin; a template that leads elsewhere (an absolute `media`, a host made of
    // `$Number$`) sends them no further than a redirect would.
    let base = ctx.query.get("seg_base").and_then(|b| Url::parse(b).ok());
    let foreign = base.is_none_or(|b| b.origin() != url.origin());
    let mut pairs: Vec<(String, String)> = ctx
        .query
        .pairs()
        .iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "seg_base" | "seg_template" | "rep_id" | "bandwidth"
            )
        })
        .filter(|(k, _)| !(foreign && links::is_credential_param(k)))
        .cloned()
        .collect();
    pairs.push(("segment_url".to_owned(), url.to_string()));
    let mut child = ctx.clone();
    child.query = Query::from_pairs(pairs);
    segment::segment(dash, &child, head).await
}
