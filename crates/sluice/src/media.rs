//! The MediaFlow-compatible media front end: `/proxy/*` endpoints, thin handlers over `sluice-media`.

pub mod acestream;
pub mod cache;
mod cluster;
pub mod config;
/// The CPU lanes live with the runtime (the IPTV gateway's fMP4 rewrite waits in them too).
pub use crate::runtime::cpu;
pub mod dash;
pub mod epg;
pub mod extractor;
pub mod forward;
pub mod generate;
pub mod hls;
mod keyed;
pub mod limit;
pub mod links;
pub mod pace;
pub mod pages;
pub mod playlist;
pub mod prebuffer;
pub mod prefetch;
pub mod public_ip;
pub mod spliced;
pub mod stream;
pub mod transform;
pub mod xtream;

use std::sync::Arc;

use crate::body::Incoming;
use http::{Method, Request, Response, StatusCode};
use prometheus_client::registry::Registry;

use crate::auth::Keys;
use crate::body::Body;
use crate::error::ProxyError;
use crate::request::RequestContext;
use crate::upstream::Upstream;
pub use config::MediaConfig;

/// The media proxy.
pub struct Media {
    upstream: Upstream,
    /// Mints child URLs' tokens (none without a password); swapped by a reload.
    keys: Keys,
    settings: MediaConfig,
    /// MPDs, init segments and segments through the slice cache service.
    pub cache: Arc<cache::MediaCache>,
    /// Segment fetches through the cache, and fetching ahead of players.
    pub prefetcher: Arc<prefetch::Prefetcher>,
    dash: dash::Dash,
    /// The Xtream Codes proxy.
    pub xtream: xtream::Xtream,
    /// Shared Acestream engine sessions; `None` when turned off.
    acestream: Option<Arc<acestream::session::Sessions>>,
    /// `ratelimit`: per-host pacing of upstream requests.
    pub(crate) pacer: pace::Pacer,
    /// `/proxy/ip`.
    public_ip: public_ip::PublicIp,
    /// `/proxy/stream` bodies spliced socket to socket.
    spliced: crate::atomic::Counter,
    /// LL-HLS blocking playlist reloads shared across viewers.
    blocking: hls::blocking::Blocking,
    /// `/proxy/forward`.
    forward: forward::Forward,
    /// `/proxy/epg`.
    epg: epg::EpgProxy,
    /// `/extractor/video`.
    extractors: extractor::Extractors,
}

impl Media {
    /// `cache`: the process's slice cache when the media front end caches (`media.cache`), with
    /// the `[cache]` policy keys its lifetimes apply over.
    pub fn new(
        upstream: Upstream,
        keys: Keys,
        config: &MediaConfig,
        engine_upstream: Option<Upstream>,
        cache: Option<(crate::cache::Cache, crate::cache::config::PolicyConfig)>,
        registry: &mut Registry,
    ) -> anyhow::Result<Self> {
        let (cache, defaults) = match cache {
            Some((c, d)) => (Some(c), d),
            None => (None, Default::default()),
        };
        let cache = cache::MediaCache::new(
            cache,
            upstream.clone(),
            config,
            &defaults,
            cache::MediaCacheMetrics::register(registry),
        );
        let prefetcher = prefetch::Prefetcher::new(
            cache.clone(),
            config.prefetch_segments,
            config.max_segment_bytes,
            config.prefetch_registry_bytes,
            registry,
        );
        let dash = dash::Dash::new(cache.clone(), prefetcher.clone(), config, registry);
        let xtream = xtream::Xtream::new(
            upstream.clone(),
            keys.clone(),
            config.xtream_max_response_bytes,
        );
        let acestream = match engine_upstream.filter(|_| config.acestream.enabled) {
            Some(engine) => Some(acestream::session::Sessions::new(
                engine,
                &config.acestream,
            )?),
            None => None,
        };
        let pacer = pace::Pacer::new(&config.ratelimit);
        let public_ip = public_ip::PublicIp::new(upstream.clone(), &config.public_ip);
        let spliced = crate::atomic::Counter::default();
        registry.register(
            "media_spliced_bodies",
            "/proxy/stream response bodies moved socket to socket with splice(2)",
            spliced.clone(),
        );
        let blocking = hls::blocking::Blocking::new(registry);
        Ok(Media {
            blocking,
            forward: forward::Forward::new(&config.forward),
            epg: epg::EpgProxy::new(upstream.clone(), &config.epg),
            extractors: extractor::Extractors::new(&config.extractors),
            spliced,
            pacer,
            public_ip,
            upstream,
            keys,
            settings: config.clone(),
            cache,
            prefetcher,
            dash,
            xtream,
            acestream,
        })
    }

    /// Serves an Xtream Codes path ([`xtream::Xtream::serves`]). `password_ok` checks an API
    /// password offered inside the XC username.
    pub async fn handle_xtream(
        &self,
        req: Request<Incoming>,
        ctx: &RequestContext,
        password_ok: &(dyn Fn(Option<&str>) -> bool + Sync),
    ) -> Result<Response<Body>, ProxyError> {
        self.xtream.handle(&req, ctx, password_ok).await
    }

    /// Paths outside `/proxy/` that need no password because they fetch nothing.
    pub fn serves_open(path: &str) -> bool {
        generate::serves(path)
    }

    /// Serves a [`Media::serves_open`] path.
    pub async fn handle_open(
        &self,
        req: Request<Incoming>,
        ctx: &RequestContext,
    ) -> Result<Response<Body>, ProxyError> {
        generate::handle(req, ctx, &self.keys).await
    }

    /// The embedded pages (home, playlist builder, URL generator): open, they fetch nothing.
    pub fn serves_page(path: &str) -> bool {
        pages::serves(path)
    }

    /// Serves a [`Media::serves_page`] path; the home page also describes `home`.
    pub fn handle_page(
        &self,
        req: &Request<Incoming>,
        ctx: &RequestContext,
        home: &pages::Home,
    ) -> Result<Response<Body>, ProxyError> {
        pages::handle(req, &ctx.path, home, self.keys.load().auth.required())
    }

    /// `/playlist/playlist` for a request that has passed auth.
    pub async fn handle_playlist(
        &self,
        req: Request<Incoming>,
        ctx: &RequestContext,
    ) -> Result<Response<Body>, ProxyError> {
        playlist::serve(self, &req, ctx).await
    }

    /// `POST /playlist/link` for a caller that proved the password.
    pub async fn handle_playlist_link(
        &self,
        req: Request<Incoming>,
        ctx: &RequestContext,
    ) -> Result<Response<Body>, ProxyError> {
        playlist::link(self, req, ctx).await
    }

    /// Whether `path` is `/extractor/video[.ext]`'s (any path under `/extractor/`).
    pub fn serves_extractor(path: &str) -> bool {
        path.starts_with("/extractor/")
    }

    /// `/extractor/video[.ext]` for a request that has passed auth.
    pub async fn handle_extractor(
        &self,
        req: Request<Incoming>,
        ctx: &RequestContext,
    ) -> Result<Response<Body>, ProxyError> {
        self.extractors.serve(self, &req, ctx).await
    }

    /// Child-URL builder for a manifest served to `ctx`.
    pub fn links(&self, ctx: &RequestContext) -> links::Links {
        links::Links::new(ctx, self.keys.tokens().as_ref())
    }

    /// `media.credential_hosts`, parsed once: the list DASH's settings hold serves HLS too.
    pub(crate) fn credential_hosts(&self) -> &links::CredentialHosts {
        &self.dash.settings.credential_hosts
    }

    /// Whether `/proxy/stream` splices plain HTTP/1.1 bodies (`media.splice_stream`).
    pub fn splices_streams(&self) -> bool {
        self.settings.splice_stream
    }

    /// Serves a `/proxy/*` request that has passed auth.
    pub async fn handle(
        &self,
        req: Request<Incoming>,
        ctx: &RequestContext,
    ) -> Result<Response<Body>, ProxyError> {
        let rest = ctx.path.strip_prefix("/proxy/").unwrap_or("");
        match rest
            .split_once('/')
            .map_or((rest, None), |(a, b)| (a, Some(b)))
        {
            ("hls", Some(rest)) => {
                require_get_or_head(req.method())?;
                self.pace(ctx).await?;
                hls::handle(self, &req, ctx, rest).await
            }
            ("stream", filename) => {
                require_get_or_head(req.method())?;
                self.pace(ctx).await?;
                let filename = filename.filter(|f| !f.is_empty()).map(decode_segment);
                let splice = self.settings.splice_stream.then_some(&self.spliced);
                stream::serve(&self.upstream, &req, ctx, filename.as_deref(), splice).await
            }
            ("forward", None) => self.forward.serve(self, req, ctx).await,
            ("epg", None) => {
                require_get_or_head(req.method())?;
                self.epg.serve(&req, ctx).await
            }
            ("ip", None) => {
                require_get_or_head(req.method())?;
                self.public_ip.serve().await
            }
            ("acestream", Some(rest)) => {
                require_get_or_head(req.method())?;
                acestream::handle(self, &req, ctx, rest).await
            }
            ("mpd", Some(endpoint)) => {
                require_get_or_head(req.method())?;
                self.dash
                    .handle(&req, ctx, &self.links(ctx), endpoint)
                    .await
            }
            _ => Err(ProxyError::downstream(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such /proxy endpoint",
            )),
        }
    }
}

impl Media {
    /// Waits for the request's turn at a paced upstream host (`ratelimit`). A query without a
    /// valid destination is the handler's to refuse, with the error naming the parameter.
    async fn pace(&self, ctx: &RequestContext) -> Result<(), ProxyError> {
        match sluice_media::query::ProxyParams::from_query(&ctx.query) {
            Ok(params) => self.pacer.wait(ctx, &params).await,
            Err(_) => Ok(()),
        }
    }
}

pub(crate) fn require_get_or_head(method: &Method) -> Result<(), ProxyError> {
    if method == Method::GET || method == Method::HEAD {
        Ok(())
    } else {
        Err(ProxyError::downstream(
            StatusCode::METHOD_NOT_ALLOWED,
            "method",
            "only GET and HEAD are allowed here",
        ))
    }
}

fn decode_segment(raw: &str) -> String {
    percent_encoding::percent_decode_str(raw)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// HLS requests use the one list parsed at start (the one DASH's settings hold), not a new
    /// parse of `media.credential_hosts` per request.
    #[tokio::test]
    async fn hls_and_dash_share_one_parsed_credential_hosts_list() {
        let mut registry = Registry::default();
        let upstream =
            Upstream::new(&crate::upstream::UpstreamConfig::default(), &mut registry).unwrap();
        let keys = Keys::new(&crate::auth::AuthConfig::default());
        let config = MediaConfig {
            credential_hosts: vec!["*.example.com".into()],
            ..MediaConfig::default()
        };
        let media = Media::new(upstream, keys, &config, None, None, &mut registry).unwrap();
        let d = url::Url::parse("https://www.example.com/m.m3u8").unwrap();
        let hls = hls::credential_scope(&media, &d);
        let dash = dash::credential_scope(&media.dash, &d);
        let cdn = url::Url::parse("https://cdn.example.com/a.ts").unwrap();
        assert_eq!(hls.reach(&cdn), links::Reach::Credentials);
        assert_eq!(dash.reach(&cdn), links::Reach::Credentials);
        assert!(hls.hosts().is_same_list(dash.hosts()));
        assert!(media
            .credential_hosts()
            .is_same_list(&media.dash.settings.credential_hosts));
    }
}
