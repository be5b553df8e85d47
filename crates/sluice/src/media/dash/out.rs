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
use url::Url;

use super::manifest::{
    bad_mpd, link_credentials, load_mpd_text, load_sidx, media_credentials, unix_now,
};
use super::{bad_request, respond, segment, upstream_headers, Dash};
use crate::body::Body;
use crate::error::ProxyError;
use crate::media::cpu::{self, Lane};
use crate::media::links::{self, CredentialScope, Links};
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
        // The viewer's credentials go only to the origin of their `d` and the hosts
        // `media.credential_hosts` names, as for HLS children (`hls::RewriteJob`): inits and
        // segments on any other get the rest of the headers.
        scope: super::credential_scope(dash, &params.destination),
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
                let fragments = load_sidx(dash, &url, range, &headers, &job.scope).await?;
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
    /// Where the request's credentials go: each link carries those its URLs may get.
    scope: CredentialScope,
    carried: Vec<(String, String)>,
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
        let (links, scope, carried) = (&self.links, &self.scope, &self.carried);
        rewrite_mpd(text, &self.mpd, &self.options, |target| {
            // A templated segment is decided by its BaseURL, and checked when served against
            // where the template leads (`template_segment`).
            let credentials = match &target {
                OutUrl::Template { rep, init, .. } => {
                    link_credentials(&rep.base_url, init.map(|i| &i.url), scope, carried)
                }
                OutUrl::Media(m) => media_credentials(m, scope, carried),
                OutUrl::File { url, .. } => link_credentials(url, None, scope, carried),
            };
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
                    p.extend(credentials.into_iter().filter(|(k, _)| k.starts_with("h_")));
                    return links.url("/proxy/stream", &p);
                }
            };
            p.extend(credentials);
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
    // The MPD's rewrite gave this link the viewer's credentials only for a BaseURL (or init) they
    // may reach; a template that leads elsewhere (an absolute `media`, a host made of
    // `$Number$`) sends them no further than their rule allows: the segment is decided against
    // the link's `cred_origin`, else the BaseURL's origin (the link's stand-in for `d`), never
    // the rendered URL's own.
    let base = ctx.query.get("seg_base").and_then(|b| Url::parse(b).ok());
    let named = ctx.query.get(links::CREDENTIAL_ORIGIN).is_some();
    let foreign = !named && base.is_none();
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
    if let Some(base) = base.filter(|_| !named) {
        pairs.push((
            links::CREDENTIAL_ORIGIN.to_owned(),
            base.origin().ascii_serialization(),
        ));
    }
    pairs.push(("segment_url".to_owned(), url.to_string()));
    let mut child = ctx.clone();
    child.query = Query::from_pairs(pairs);
    segment::segment(dash, &child, head).await
}
