//! `/proxy/ip`: the server's public address as the echo services see it, cached for a while.
//!
//! Debrid services bind links to the address that asked for them; users call this to learn which
//! address that is. The services in `[media.public_ip]` are asked in order, each with its own
//! timeout, until one answers with an address (`sluice_media::public_ip` parses the answer). One
//! lookup runs at a time, in a task of its own: concurrent callers wait for it and share its
//! outcome, an address or the failure, so a burst of calls after the cache expires asks the
//! services once. A failure is kept [`FAILURE_TTL`] (at most `cache_secs`): during an outage of the
//! services a caller gets the 502 at once instead of queueing behind lookups that each wait out
//! every service's timeout (before, 64 callers queued behind one lock, the last ~16 minutes).

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use sluice_media::public_ip::{parse_answer, MAX_ANSWER_BYTES};
use tokio::sync::watch;
use tokio::time::Instant;
use url::Url;

use super::config::public_ip::{EchoService, PublicIpConfig};
use crate::body::{self, Body};
use crate::error::{ProxyError, Side};
use crate::upstream::{Upstream, UpstreamRequest};

/// How long a failed lookup is answered from memory (never longer than `cache_secs`).
const FAILURE_TTL: Duration = Duration::from_secs(10);

/// A lookup's outcome: the address, or why no service gave one.
type Outcome = Result<IpAddr, String>;

/// Finds and caches the public address.
pub struct PublicIp {
    inner: Arc<Inner>,
}

struct Inner {
    upstream: Upstream,
    config: PublicIpConfig,
    /// Held only to read or update the state, never across a lookup.
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The last lookup's outcome and when it ended.
    last: Option<(Outcome, Instant)>,
    /// The lookup running now, if any: its outcome appears here.
    running: Option<watch::Receiver<Option<Outcome>>>,
}

impl PublicIp {
    pub fn new(upstream: Upstream, config: &PublicIpConfig) -> Self {
        PublicIp {
            inner: Arc::new(Inner {
                upstream,
                config: config.clone(),
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// `{"ip": "<address>"}`, MediaFlow's answer shape.
    pub async fn serve(&self) -> Result<Response<Body>, ProxyError> {
        let ip = self.lookup().await?;
        let json = serde_json::json!({ "ip": ip.to_string() }).to_string();
        let mut resp = Response::new(body::full(json));
        let headers = resp.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        Ok(resp)
    }

    /// The address, from memory while fresh, else from the lookup running now or a new one.
    pub(crate) async fn lookup(&self) -> Result<IpAddr, ProxyError> {
        let mut rx = {
            let mut state = self.inner.lock();
            let cache = Duration::from_secs(self.inner.config.cache_secs);
            if let Some((outcome, at)) = &state.last {
                let ttl = match outcome {
                    Ok(_) => cache,
                    Err(_) => FAILURE_TTL.min(cache),
                };
                if at.elapsed() < ttl {
                    return outcome.clone().map_err(failed);
                }
            }
            match &state.running {
                Some(rx) => rx.clone(),
                None => {
                    let (tx, rx) = watch::channel(None);
                    state.running = Some(rx.clone());
                    // Its own task: a caller that hangs up does not end the lookup the others
                    // wait for.
                    let inner = self.inner.clone();
                    tokio::spawn(async move {
                        let outcome = inner.ask_all().await;
                        let mut state = inner.lock();
                        state.last = Some((outcome.clone(), Instant::now()));
                        state.running = None;
                        let _ = tx.send(Some(outcome));
                    });
                    rx
                }
            }
        };
        // The lookup ends within every service's timeout; the wait is bounded by that too.
        let timeout = Duration::from_secs(self.inner.config.timeout_secs);
        let services = u32::try_from(self.inner.config.services.len()).unwrap_or(u32::MAX);
        let bound = timeout.saturating_mul(services) + Duration::from_secs(1);
        let waited = tokio::time::timeout(bound, rx.wait_for(Option::is_some))
            .await
            .map(|r| r.map(|outcome| outcome.clone()).map_err(|_| ()));
        let outcome = match waited {
            Ok(Ok(outcome)) => outcome.unwrap_or_else(|| Err(String::new())),
            Ok(Err(())) => {
                // The lookup's task ended without an outcome (it panicked): the next caller
                // starts another.
                let mut state = self.inner.lock();
                if state.running.as_ref().is_some_and(|r| r.same_channel(&rx)) {
                    state.running = None;
                }
                Err("the lookup ended without an outcome".to_string())
            }
            Err(_) => Err(format!(
                "the lookup gave no outcome within {} s",
                bound.as_secs()
            )),
        };
        outcome.map_err(failed)
    }
}

/// The 502 of a lookup that found no address.
fn failed(message: String) -> ProxyError {
    ProxyError::new(
        Side::Upstream,
        StatusCode::BAD_GATEWAY,
        "public_ip",
        message,
    )
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Asks the services in order until one answers with an address.
    async fn ask_all(&self) -> Outcome {
        let timeout = Duration::from_secs(self.config.timeout_secs);
        let mut failures = Vec::new();
        for service in &self.config.services {
            let outcome = match tokio::time::timeout(timeout, self.ask(service)).await {
                Ok(outcome) => outcome,
                Err(_) => Err(format!("no answer within {} s", timeout.as_secs())),
            };
            match outcome {
                Ok(ip) => return Ok(ip),
                Err(why) => {
                    tracing::debug!(service = %service.url, %why, "echo service failed");
                    failures.push(format!("{}: {why}", host_of(&service.url)));
                }
            }
        }
        Err(if failures.is_empty() {
            "no echo service is configured (media.public_ip.services)".to_string()
        } else {
            format!(
                "no echo service answered with an address ({})",
                failures.join("; ")
            )
        })
    }

    /// One service, one address or the reason it gave none.
    async fn ask(&self, service: &EchoService) -> Result<IpAddr, String> {
        // Validated at startup, so this only fails on a config that skipped validation.
        let url = Url::parse(&service.url).map_err(|e| e.to_string())?;
        let mut request = UpstreamRequest::get(url);
        request.headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/json, text/plain"),
        );
        let resp = self
            .upstream
            .send(request)
            .await
            .map_err(|e| e.to_string())?;
        if !resp.status.is_success() {
            return Err(format!("answered {}", resp.status));
        }
        let bytes = resp
            .body
            .collect_limited(MAX_ANSWER_BYTES)
            .await
            .map_err(|e| e.to_string())?;
        parse_answer(&bytes, Some(service.field.as_str())).map_err(|e| e.to_string())
    }
}

fn host_of(url: &str) -> String {
    Url::parse(url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_string))
        .unwrap_or_else(|| "?".to_string())
}
