//! `/proxy/epg`: an XMLTV guide fetched through sluice and kept for a while, MediaFlow's EPG proxy
//! (`cache_ttl`, `X-EPG-Cache: HIT|MISS`) on the gateway's guide handling (`sluice_media::xmltv`:
//! checked to be XMLTV, held gzip-compressed, named by a hash for conditional GETs).
//!
//! Guides are keyed by the URL and the headers the fetch sends (every `h_*`, the last of a
//! repeated one), so one caller's credentials never serve another's guide. Concurrent misses of
//! one key share one fetch; the bodies of all fetches share [`FETCH_GUIDES`] × `max_bytes`, of
//! which one client holds at most [`CLIENT_GUIDES`]. The cache is bounded in entries and in
//! compressed bytes; the oldest fetch goes first.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::body::Incoming;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, StatusCode};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sluice_media::xmltv::{self, Prepared, XmltvError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::keyed::Keyed;
use crate::body::{self, Body};
use crate::error::{ProxyError, Side};
use crate::net::per_ip::network_of;
use crate::request::RequestContext;
use crate::upstream::{Upstream, UpstreamRequest};

/// The longest `cache_ttl` a request may ask for: a week.
const MAX_REQUEST_TTL: u64 = 7 * 24 * 3600;

/// Bodies of `max_bytes` that guide fetches may hold at once, as they arrive and until they are
/// checked: without it, a miss per distinct URL held up to `max_bytes` each, without bound, while
/// it waited for a place to be checked. (The XML being checked is bounded by the document lane's
/// places, `media::cpu`.)
const FETCH_GUIDES: usize = 4;

/// Of those, what one client's fetches may hold together (a quarter of the budget; its address as
/// `auth.trusted_proxies` make it out, an IPv6 one by its /64, as every per-address share counts
/// it): one largest guide, or smaller ones beside each other. Without it, one client's four
/// slow fetches of large guides held the whole budget, and every other user's guide was refused
/// until they ended.
const CLIENT_GUIDES: usize = 1;

/// `[media.epg]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct EpgConfig {
    /// Serve `/proxy/epg`.
    pub enabled: bool,
    /// Seconds a guide is served from memory (MediaFlow's `EPG_CACHE_TTL`); a request's
    /// `cache_ttl` overrides it (0: fetch every time, keep nothing).
    pub cache_ttl_secs: u64,
    /// Largest guide accepted, in bytes of XML (a gzip source is bounded once decompressed).
    pub max_bytes: usize,
    /// Guides kept at once.
    pub max_entries: usize,
    /// Bytes of compressed guides kept at once; a guide larger than this is served, not kept.
    pub cache_bytes: usize,
    /// Seconds one whole fetch may take.
    pub fetch_timeout_secs: u64,
}

impl Default for EpgConfig {
    fn default() -> Self {
        EpgConfig {
            enabled: true,
            cache_ttl_secs: 3600,
            max_bytes: 256 * 1024 * 1024,
            max_entries: 32,
            cache_bytes: 64 * 1024 * 1024,
            fetch_timeout_secs: 120,
        }
    }
}

impl EpgConfig {
    /// Checks the values before anything binds.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.max_bytes < 1024 || self.fetch_timeout_secs == 0 {
            anyhow::bail!(
                "media.epg.max_bytes must be at least 1024 and fetch_timeout_secs at least 1"
            );
        }
        Ok(())
    }
}

/// One kept guide.
struct Entry {
    guide: Arc<Prepared>,
    fetched: Instant,
    last_modified: SystemTime,
}

/// The guide cache.
pub struct EpgProxy {
    upstream: Upstream,
    config: EpgConfig,
    entries: Mutex<HashMap<[u8; 32], Entry>>,
    /// One lock per key being fetched, so concurrent misses share one fetch.
    fetching: Keyed<[u8; 32]>,
    /// What the fetches in flight may hold together ([`FETCH_GUIDES`] × `max_bytes`), and each
    /// client.
    budget: Arc<FetchBudget>,
}

impl EpgProxy {
    pub fn new(upstream: Upstream, config: &EpgConfig) -> Self {
        EpgProxy {
            upstream,
            config: config.clone(),
            entries: Mutex::new(HashMap::new()),
            fetching: Keyed::new(),
            budget: FetchBudget::for_guides(config.max_bytes),
        }
    }

    /// Serves `/proxy/epg`.
    pub async fn serve(
        &self,
        req: &Request<Incoming>,
        ctx: &RequestContext,
    ) -> Result<Response<Body>, ProxyError> {
        if !self.config.enabled {
            return Err(ProxyError::downstream(
                StatusCode::NOT_FOUND,
                "not_found",
                "/proxy/epg is turned off (media.epg.enabled)",
            ));
        }
        let params = super::stream::parse_params(ctx)?;
        let ttl = match ctx.query.get("cache_ttl") {
            None => self.config.cache_ttl_secs,
            Some(v) => v.trim().parse::<u64>().map_err(|_| {
                ProxyError::downstream(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    "cache_ttl must be a whole number of seconds",
                )
            })?,
        }
        .min(MAX_REQUEST_TTL);
        let request = super::stream::fetch_request(&params)?;
        let key = cache_key(&request);
        let (guide, last_modified, hit) = match self.fresh(&key, ttl) {
            Some((g, lm)) => (g, lm, true),
            None => {
                // The key's gate leaves the map with its last holder, however each one ends (a
                // client that leaves mid-fetch included: one entry per URL and header set was
                // left behind), and never while another holds it.
                let holder = self.fetching.hold(key);
                let _turn = holder.turn().await;
                match self.fresh(&key, ttl) {
                    Some((g, lm)) => (g, lm, true),
                    None => {
                        let outcome = self.fetch(request, ctx.client_ip).await;
                        let guide = Arc::new(outcome?);
                        let lm = SystemTime::now();
                        if ttl > 0 {
                            self.keep(key, guide.clone(), lm);
                        }
                        (guide, lm, false)
                    }
                }
            }
        };
        Ok(respond(req, &guide, last_modified, hit, ttl))
    }

    fn fresh(&self, key: &[u8; 32], ttl: u64) -> Option<(Arc<Prepared>, SystemTime)> {
        let entries = self.entries.lock().expect("epg lock");
        let e = entries.get(key)?;
        (ttl > 0 && e.fetched.elapsed() < Duration::from_secs(ttl))
            .then(|| (e.guide.clone(), e.last_modified))
    }

    fn keep(&self, key: [u8; 32], guide: Arc<Prepared>, last_modified: SystemTime) {
        if guide.gz.len() > self.config.cache_bytes || self.config.max_entries == 0 {
            return;
        }
        let mut entries = self.entries.lock().expect("epg lock");
        entries.remove(&key);
        let mut total: usize = entries.values().map(|e| e.guide.gz.len()).sum();
        while entries.len() >= self.config.max_entries
            || total + guide.gz.len() > self.config.cache_bytes
        {
            let Some(oldest) = entries
                .iter()
                .min_by_key(|(_, e)| e.fetched)
                .map(|(k, _)| *k)
            else {
                break;
            };
            if let Some(e) = entries.remove(&oldest) {
                total -= e.guide.gz.len();
            }
        }
        entries.insert(
            key,
            Entry {
                guide,
                fetched: Instant::now(),
                last_modified,
            },
        );
    }

    /// Fetches and checks a guide for `client`, whose share of the budget its body is charged to.
    async fn fetch(
        &self,
        request: UpstreamRequest,
        client: IpAddr,
    ) -> Result<Prepared, ProxyError> {
        let secs = self.config.fetch_timeout_secs;
        let max = self.config.max_bytes;
        let host = request.url.host_str().unwrap_or("").to_string();
        let upstream_err = |status: StatusCode, kind: &'static str, msg: String| {
            let mut e = ProxyError::new(Side::Upstream, status, kind, msg);
            e.upstream = Some(host.clone());
            e
        };
        // The body, charged to the client before its buffer grows and given back once it is
        // checked (or the fetch fails, or the client leaves): what the cache keeps is bounded by
        // `cache_bytes`.
        let mut held = FetchCharge::new(&self.budget, client);
        let fetch = async {
            let resp = self
                .upstream
                .send(request)
                .await
                .map_err(|e| ProxyError::from_upstream(&e))?;
            if !resp.status.is_success() {
                // As MediaFlow: the source's error status, said in words.
                let status = match resp.status.as_u16() {
                    400..=599 => resp.status,
                    _ => StatusCode::BAD_GATEWAY,
                };
                return Err(upstream_err(
                    status,
                    "epg_status",
                    format!("EPG source answered {}", resp.status),
                ));
            }
            resp.body
                .collect_limited_with(max, |capacity| held.reserve(capacity))
                .await?
                .map_err(|e| upstream_err(StatusCode::BAD_GATEWAY, "epg_body", format!("EPG: {e}")))
        };
        let raw = tokio::time::timeout(Duration::from_secs(secs), fetch)
            .await
            .map_err(|_| {
                upstream_err(
                    StatusCode::GATEWAY_TIMEOUT,
                    "epg_timeout",
                    format!("EPG fetch took longer than media.epg.fetch_timeout_secs ({secs} s)"),
                )
            })??;
        // Decompressing and hashing tens of MB is CPU work; keep it off the threads that move video.
        // The charge goes with the body into the job: a client that leaves while it runs gives
        // back nothing before the body is freed.
        crate::media::cpu::run(crate::media::cpu::Lane::Document, move || {
            let prepared = xmltv::prepare(raw, max);
            drop(held);
            prepared
        })
        .await
        .map_err(|e| {
            ProxyError::new(
                Side::Internal,
                StatusCode::INTERNAL_SERVER_ERROR,
                "epg",
                e.to_string(),
            )
        })?
        .map_err(|e| {
            let status = match e {
                XmltvError::TooLarge(_) | XmltvError::Gzip(_) | XmltvError::NotXmltv => {
                    StatusCode::BAD_GATEWAY
                }
            };
            upstream_err(status, "epg_content", format!("EPG: {e}"))
        })
    }
}

/// The memory guide fetches share, in KiB, and what each client's fetches hold of it.
struct FetchBudget {
    kib: Arc<Semaphore>,
    /// KiB each client's fetches hold now, by [`network_of`] its address; a client leaves at zero.
    clients: Mutex<HashMap<IpAddr, usize>>,
    /// KiB one client's fetches may hold together.
    share: usize,
}

impl FetchBudget {
    /// [`FETCH_GUIDES`] guides of `max_bytes`, [`CLIENT_GUIDES`] a client's share (each rounded
    /// up as a charge is, so a guide of `max_bytes` fits in a share).
    fn for_guides(max_bytes: usize) -> Arc<FetchBudget> {
        let kib = |guides: usize| {
            max_bytes
                .saturating_mul(guides)
                .div_ceil(1024)
                .min(Semaphore::MAX_PERMITS)
        };
        Arc::new(FetchBudget {
            kib: Arc::new(Semaphore::new(kib(FETCH_GUIDES))),
            clients: Mutex::new(HashMap::new()),
            share: kib(CLIENT_GUIDES),
        })
    }

    fn clients(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.clients.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `kib` a client's fetch gave back.
    fn give_back(&self, client: IpAddr, kib: usize) {
        let mut clients = self.clients();
        if let Some(held) = clients.get_mut(&client) {
            *held = held.saturating_sub(kib);
            if *held == 0 {
                clients.remove(&client);
            }
        }
    }
}

/// What one fetch holds of [`EpgProxy::budget`], grown as it needs more and charged to its
/// client; given back when dropped.
struct FetchCharge {
    budget: Arc<FetchBudget>,
    client: IpAddr,
    permit: Option<OwnedSemaphorePermit>,
}

impl FetchCharge {
    /// A fetch for `client`, counted by its /64 when it is IPv6: one host commonly has a whole
    /// /64, so counting its addresses one by one would multiply its share.
    fn new(budget: &Arc<FetchBudget>, client: IpAddr) -> Self {
        FetchCharge {
            budget: budget.clone(),
            client: network_of(client),
            permit: None,
        }
    }

    /// Grows the charge to cover `bytes`, or 503 when the other fetches hold the rest, or when
    /// this client's fetches would hold more than its share (the same answer: booked to the
    /// client, which holds what it is refused for).
    fn reserve(&mut self, bytes: usize) -> Result<(), ProxyError> {
        let have = self.permit.as_ref().map_or(0, |p| p.num_permits());
        let more = bytes.div_ceil(1024).saturating_sub(have);
        if more == 0 {
            return Ok(());
        }
        let busy = |side| {
            ProxyError::new(
                side,
                StatusCode::SERVICE_UNAVAILABLE,
                "epg_busy",
                format!(
                    "the guides being fetched now hold all the memory set aside for them \
                     ({FETCH_GUIDES} × media.epg.max_bytes); try again shortly"
                ),
            )
            .with_retry_after(1)
        };
        let mut clients = self.budget.clients();
        let mine = clients.get(&self.client).copied().unwrap_or(0);
        if mine.saturating_add(more) > self.budget.share {
            return Err(busy(Side::Downstream));
        }
        let taken = u32::try_from(more)
            .ok()
            .and_then(|n| self.budget.kib.clone().try_acquire_many_owned(n).ok())
            .ok_or_else(|| busy(Side::Internal))?;
        *clients.entry(self.client).or_insert(0) += more;
        drop(clients);
        match &mut self.permit {
            Some(p) => p.merge(taken),
            None => self.permit = Some(taken),
        }
        Ok(())
    }
}

impl Drop for FetchCharge {
    fn drop(&mut self) {
        if let Some(p) = self.permit.take() {
            self.budget.give_back(self.client, p.num_permits());
        }
    }
}

/// SHA-256 over the URL and the headers of the fetch, length-prefixed: the request as it is sent
/// (a repeated `h_*` sends its last value), so two keys never share a guide fetched differently.
fn cache_key(request: &UpstreamRequest) -> [u8; 32] {
    let mut h = Sha256::new();
    let mut field = |b: &[u8]| {
        h.update((b.len() as u64).to_be_bytes());
        h.update(b);
    };
    field(request.url.as_str().as_bytes());
    let mut headers: Vec<_> = request
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_bytes()))
        .collect();
    headers.sort();
    for (k, v) in headers {
        field(k.as_bytes());
        field(v);
    }
    h.finalize().into()
}

fn put(h: &mut HeaderMap, name: header::HeaderName, value: String) {
    if let Ok(v) = HeaderValue::from_str(&value) {
        h.insert(name, v);
    }
}

/// The guide as the client asked: gzip-encoded when it accepts gzip, XML otherwise; 304 when
/// its validators match.
fn respond(
    req: &Request<Incoming>,
    guide: &Prepared,
    last_modified: SystemTime,
    hit: bool,
    ttl: u64,
) -> Response<Body> {
    let gzip = sluice_http::coding::accepts_gzip(req.headers());
    let etag = match gzip {
        true => format!("{}-gz\"", guide.etag.trim_end_matches('"')),
        false => guide.etag.clone(),
    };
    let mut h = HeaderMap::new();
    put(&mut h, header::ETAG, etag);
    put(
        &mut h,
        header::LAST_MODIFIED,
        httpdate::fmt_http_date(last_modified),
    );
    put(
        &mut h,
        header::CACHE_CONTROL,
        format!("public, max-age={ttl}"),
    );
    put(&mut h, header::VARY, "Accept-Encoding".into());
    put(
        &mut h,
        header::HeaderName::from_static("x-epg-cache"),
        if hit { "HIT" } else { "MISS" }.into(),
    );
    if sluice_http::conditional::not_modified(req.headers(), &h) {
        let mut resp = Response::new(body::empty());
        *resp.status_mut() = StatusCode::NOT_MODIFIED;
        *resp.headers_mut() = h;
        return resp;
    }
    put(
        &mut h,
        header::CONTENT_TYPE,
        "application/xml; charset=utf-8".into(),
    );
    // A client that takes gzip gets the held bytes as they are. One that does not gets the XML
    // inflated as it reads (the inflate state and one 64 KiB chunk per request, never a copy of
    // the guide: 64 slow readers of a 256 MiB guide held 16 GiB, and each inflated it whole on a
    // runtime thread). A HEAD inflates nothing.
    let (length, resp_body) = match gzip {
        true => {
            put(&mut h, header::CONTENT_ENCODING, "gzip".into());
            (
                guide.gz.len(),
                body::full_unless_head(req.method(), guide.gz.clone()),
            )
        }
        false if req.method() == http::Method::HEAD => (guide.xml_len, body::empty()),
        false => (
            guide.xml_len,
            body::inflated(guide.gz.clone(), guide.xml_len),
        ),
    };
    put(&mut h, header::CONTENT_LENGTH, length.to_string());
    let mut resp = Response::new(resp_body);
    // A HEAD answer has no body but keeps the GET answer's length.
    *resp.headers_mut() = h;
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_media::query::ProxyParams;

    fn key_of(headers: &[(&str, &str)]) -> [u8; 32] {
        let params = ProxyParams {
            destination: "http://guide.example/epg.xml".parse().unwrap(),
            request_headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            response_headers: Vec::new(),
            propagate_headers: Vec::new(),
            strip_headers: Vec::new(),
        };
        cache_key(&super::super::stream::fetch_request(&params).unwrap())
    }

    #[test]
    fn the_key_follows_the_headers_the_fetch_sends() {
        let a_then_b = key_of(&[("cookie", "A"), ("cookie", "B")]);
        let b_then_a = key_of(&[("cookie", "B"), ("cookie", "A")]);
        // The fetch sends the last value: B, then A.
        assert_ne!(a_then_b, b_then_a);
        assert_eq!(a_then_b, key_of(&[("cookie", "B")]));
        assert_eq!(b_then_a, key_of(&[("cookie", "A")]));
        // Order between different headers does not matter; their values do.
        assert_eq!(
            key_of(&[("cookie", "A"), ("user-agent", "x")]),
            key_of(&[("user-agent", "x"), ("cookie", "A")])
        );
        assert_ne!(key_of(&[]), key_of(&[("cookie", "A")]));
    }
}
