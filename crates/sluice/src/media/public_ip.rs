//! `/proxy/ip`: the server's public address as the echo services see it, cached for a while.
//!
//! Debrid services bind links to the address that asked for them; users call this to learn which
//! address that is. The services in `[media.public_ip]` are asked in order, each with its own
//! timeout, until one answers with an address (`sluice_media::public_ip` parses the answer). One
//! lookup runs at a time: concurrent callers wait for it and share its answer, so a burst of calls
//! after the cache expires asks the services once. Failures are not cached.

use std::net::IpAddr;
use std::time::Duration;

use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use sluice_media::public_ip::{parse_answer, MAX_ANSWER_BYTES};
use tokio::sync::Mutex;
use tokio::time::Instant;
use url::Url;

use super::config::public_ip::{EchoService, PublicIpConfig};
use crate::body::{self, Body};
use crate::error::{ProxyError, Side};
use crate::upstream::{Upstream, UpstreamRequest};

/// Finds and caches the public address.
pub struct PublicIp {
    upstream: Upstream,
    config: PublicIpConfig,
    /// The last address found and when; the lock is held for a whole lookup.
    found: Mutex<Option<(IpAddr, Instant)>>,
}

impl PublicIp {
    pub fn new(upstream: Upstream, config: &PublicIpConfig) -> Self {
        PublicIp {
            upstream,
            config: config.clone(),
            found: Mutex::new(None),
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

    /// The address, from memory while fresh, else from the services.
    pub(crate) async fn lookup(&self) -> Result<IpAddr, ProxyError> {
        let mut found = self.found.lock().await;
        let ttl = Duration::from_secs(self.config.cache_secs);
        if let Some((ip, at)) = *found {
            if at.elapsed() < ttl {
                return Ok(ip);
            }
        }
        let timeout = Duration::from_secs(self.config.timeout_secs);
        let mut failures = Vec::new();
        for service in &self.config.services {
            let outcome = match tokio::time::timeout(timeout, self.ask(service)).await {
                Ok(outcome) => outcome,
                Err(_) => Err(format!("no answer within {} s", timeout.as_secs())),
            };
            match outcome {
                Ok(ip) => {
                    *found = Some((ip, Instant::now()));
                    return Ok(ip);
                }
                Err(why) => {
                    tracing::debug!(service = %service.url, %why, "echo service failed");
                    failures.push(format!("{}: {why}", host_of(&service.url)));
                }
            }
        }
        let message = if failures.is_empty() {
            "no echo service is configured (media.public_ip.services)".to_string()
        } else {
            format!(
                "no echo service answered with an address ({})",
                failures.join("; ")
            )
        };
        Err(ProxyError::new(
            Side::Upstream,
            StatusCode::BAD_GATEWAY,
            "public_ip",
            message,
        ))
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
