//! LL-HLS blocking playlist reloads, forwarded upstream and shared across viewers: every viewer
//! asking for the same segment or part of the same playlist (same upstream URL, directives and
//! headers) waits on one upstream request, and its answer serves late arrivals for a moment more.
//!
//! A hundred viewers of one live channel each block on `_HLS_msn=N&_HLS_part=P` at the same time;
//! the origin sees that request once. The answer is the origin's playlist text, which every viewer
//! then has rewritten with its own child URLs.
//!
//! A flight lives only while some viewer waits on it: when the last one hangs up, the upstream
//! request is dropped. Any token holder may add `_HLS_msn`, and each value is a new flight, so a
//! flight outliving its viewers would let one client leave thousands of upstream fetches running
//! (each collecting up to `max_manifest_bytes`). Since every waiter holds one of its client's
//! `/proxy/*` places (`media.max_requests_per_client` and `_per_token`, `media::limit`), the
//! flights one client keeps alive are bounded by its share.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::atomic::Counter;
use prometheus_client::registry::Registry;
use sluice_media::hls::blocking::{upstream_url, Directives, DIRECTIVES};
use tokio::sync::watch;
use url::Url;

use crate::error::{ProxyError, Side};
use crate::upstream::{Upstream, UpstreamRequest};
use http::StatusCode;

/// How long a finished answer keeps serving the same request: long enough for viewers whose
/// reload arrives just after the part was published, far shorter than any part duration
/// players are given.
const HOLD: Duration = Duration::from_millis(1000);

/// Most requests in flight or held; past it a request goes upstream on its own.
const MAX_FLIGHTS: usize = 4096;

/// The playlist text and the URL it came from (after redirects).
pub type Answer = Arc<(String, Url)>;
type Outcome = Option<Result<Answer, ProxyError>>;
/// Requests in flight or held, by key: a generation number and the answer's channel. The map holds
/// a sender, not a receiver, so the channel's receivers are exactly the viewers waiting.
type Flights = HashMap<String, (u64, watch::Sender<Outcome>)>;

/// Blocking reloads in flight, by upstream request.
pub struct Blocking {
    flights: Arc<Mutex<Flights>>,
    next_id: std::sync::atomic::AtomicU64,
    upstream_requests: Counter,
    shared: Counter,
}

impl Blocking {
    pub fn new(registry: &mut Registry) -> Self {
        let upstream_requests = Counter::default();
        registry.register(
            "media_llhls_upstream_reloads",
            "LL-HLS blocking playlist reloads sent upstream",
            upstream_requests.clone(),
        );
        let shared = Counter::default();
        registry.register(
            "media_llhls_shared_reloads",
            "LL-HLS blocking playlist reloads answered by another viewer's upstream request",
            shared.clone(),
        );
        Blocking {
            flights: Arc::default(),
            next_id: Default::default(),
            upstream_requests,
            shared,
        }
    }

    /// The playlist `req` answers, fetched once for every concurrent identical request.
    pub async fn fetch(
        &self,
        upstream: &Upstream,
        req: UpstreamRequest,
        limit: usize,
    ) -> Result<Answer, ProxyError> {
        let key = key(&req);
        let joined = {
            let mut flights = self.flights.lock().unwrap_or_else(|e| e.into_inner());
            match flights.get(&key) {
                Some((_, tx)) => {
                    self.shared.inc();
                    Some(tx.subscribe())
                }
                None if flights.len() >= MAX_FLIGHTS => None,
                None => {
                    let id = self
                        .next_id
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let (tx, rx) = watch::channel(None);
                    flights.insert(key.clone(), (id, tx.clone()));
                    self.upstream_requests.inc();
                    // The fetch runs on its own, so a viewer leaving never cancels the others';
                    // the last one leaving cancels it.
                    let (upstream, all) = (upstream.clone(), self.flights.clone());
                    let req = req.clone();
                    tokio::spawn(async move {
                        // Forgets the flight however the task ends, a panic included: the map
                        // holds a sender, so a flight left in it would keep its viewers (and
                        // every later one) waiting for good.
                        let _forget = Forget {
                            flights: &all,
                            key: &key,
                            id,
                        };
                        let fetch = fetch_playlist(&upstream, req, limit);
                        let Some(answer) = until_abandoned(fetch, &tx, &all, &key, id).await else {
                            return;
                        };
                        let failed = answer.is_err();
                        // Stored even with nobody waiting now: it serves late arrivals while held.
                        tx.send_replace(Some(answer));
                        // A failure is not held: the next reload asks again.
                        if !failed {
                            tokio::time::sleep(HOLD).await;
                        }
                    });
                    Some(rx)
                }
            }
        };
        let Some(mut rx) = joined else {
            self.upstream_requests.inc();
            return fetch_playlist(upstream, req, limit).await;
        };
        let outcome = rx
            .wait_for(Option::is_some)
            .await
            .map_err(|_| ProxyError::internal("blocking reload abandoned"))?;
        outcome.clone().expect("waited for Some")
    }
}

/// `fetch`'s answer, or `None` once no viewer waits for it any more (the flight is forgotten
/// then, and the fetch dropped with its upstream request).
async fn until_abandoned<F: std::future::Future>(
    fetch: F,
    tx: &watch::Sender<Outcome>,
    flights: &Mutex<Flights>,
    key: &str,
    id: u64,
) -> Option<F::Output> {
    tokio::pin!(fetch);
    loop {
        tokio::select! {
            answer = &mut fetch => return Some(answer),
            () = tx.closed() => {
                // Viewers join under the lock, so none can arrive between this check and the
                // removal; one that joined since `closed` fired keeps the flight going.
                let mut flights = flights.lock().unwrap_or_else(|e| e.into_inner());
                if tx.receiver_count() == 0 {
                    forget(&mut flights, key, id);
                    return None;
                }
            }
        }
    }
}

/// Forgets its flight when dropped.
struct Forget<'a> {
    flights: &'a Mutex<Flights>,
    key: &'a str,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        forget(
            &mut self.flights.lock().unwrap_or_else(|e| e.into_inner()),
            self.key,
            self.id,
        );
    }
}

/// Removes flight `id` under `key`, unless a newer flight took the key.
fn forget(flights: &mut Flights, key: &str, id: u64) {
    if flights.get(key).is_some_and(|(i, _)| *i == id) {
        flights.remove(key);
    }
}

/// The upstream request as a key: URL (directives included) and every header sent.
fn key(req: &UpstreamRequest) -> String {
    let mut headers: Vec<String> = req
        .headers
        .iter()
        .map(|(k, v)| format!("{k}:{}", String::from_utf8_lossy(v.as_bytes())))
        .collect();
    headers.sort();
    format!("{} {}\n{}", req.method, req.url, headers.join("\n"))
}

/// One upstream playlist fetch: an error status, an oversized body or something that is not a
/// playlist is an error naming the upstream host.
async fn fetch_playlist(
    upstream: &Upstream,
    req: UpstreamRequest,
    limit: usize,
) -> Result<Answer, ProxyError> {
    let up = upstream
        .send(req)
        .await
        .map_err(|e| ProxyError::from_upstream(&e))?;
    // Without a graceful end an HTML page is already an error; `None` cannot come back.
    super::playlist_text(up, limit, false)
        .await?
        .map(Arc::new)
        .ok_or_else(|| {
            ProxyError::new(
                Side::Upstream,
                StatusCode::BAD_GATEWAY,
                "not_a_playlist",
                "upstream sent no HLS playlist",
            )
        })
}

/// `/proxy/hls/manifest.m3u8` with delivery directives: forwarded upstream on the URL, shared
/// with every identical request, then rewritten for this viewer.
pub(super) async fn serve(
    media: &super::Media,
    head: bool,
    ctx: &crate::request::RequestContext,
    opts: &super::HlsOptions,
    params: &sluice_media::query::ProxyParams,
    directives: &Directives,
) -> Result<http::Response<crate::body::Body>, ProxyError> {
    let mut req = super::stream::fetch_request(params)?;
    req.url = upstream_url(&req.url, directives);
    let answer = media
        .blocking
        .fetch(&media.upstream, req, media.settings.max_manifest_bytes)
        .await?;
    let (text, base) = (answer.0.clone(), without_directives(&answer.1));
    let text = super::rewrite(media, ctx, opts, text, base, head).await?;
    super::playlist_response(text, head, params)
}

/// The answering URL without the directives, so relative URIs and the prefetch registry see the
/// playlist's own URL whatever part was asked for.
fn without_directives(url: &Url) -> Url {
    let kept: Vec<(String, String)> = url
        .query_pairs()
        .filter(|(k, _)| !DIRECTIVES.contains(&k.as_ref()))
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let mut out = url.clone();
    if kept.len() == url.query_pairs().count() {
        return out;
    }
    if kept.is_empty() {
        out.set_query(None);
    } else {
        out.query_pairs_mut().clear().extend_pairs(kept);
    }
    out
}
