//! `/extractor/video[.ext]`: MediaFlow's extractor endpoint answered by external commands, one per
//! extractor name or page-host pattern (`docs/decisions/mediaflow-extras.md`). A command gets the
//! page URL and prints `{"destination_url": ..., "request_headers": {...}}` (or yt-dlp's `url` and
//! `http_headers`); sluice answers with a sealed `/proxy/stream` or `/proxy/hls/manifest.m3u8` URL
//! for it, as JSON or as a redirect (`redirect_stream`). Runs are bounded in time, output and
//! number, and their answers are kept for a few minutes per page.

pub mod run;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::body::Incoming;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sluice_http::route::HostPattern;
use sluice_media::query::{is_forbidden_header, ProxyParams};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use self::run::{Invocation, RunError};
use crate::body::{self, Body};
use crate::error::{ProxyError, Side};
use crate::request::RequestContext;

/// The path prefix this module serves.
pub const PATH: &str = "/extractor/video";

/// One configured extractor.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ExtractorEntry {
    /// MediaFlow's `host` parameter this command answers (`Vidoza`, `VixCloud`; any case).
    #[serde(default)]
    pub host: String,
    /// Page hosts this command answers (`vidoza.net`, `*.vidoza.net`), whatever `host` says.
    #[serde(default)]
    pub patterns: Vec<String>,
    /// The program and its first arguments; the page URL is appended. Run directly, no shell.
    pub command: Vec<String>,
}

/// `[media.extractors]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ExtractorsConfig {
    /// The commands; none configured means `/extractor/video` answers 404 for every host.
    pub commands: Vec<ExtractorEntry>,
    /// Seconds a run may take before it is killed (504).
    pub timeout_secs: u64,
    /// Bytes a run may print before it is killed (502).
    pub max_output_bytes: usize,
    /// Runs at once; a request that cannot start one within `timeout_secs` gets 503.
    pub max_running: usize,
    /// Seconds an answer is reused for the same page (MediaFlow keeps them 5 minutes); 0: never.
    pub cache_secs: u64,
    /// Answers kept at once.
    pub cache_entries: usize,
}

impl Default for ExtractorsConfig {
    fn default() -> Self {
        ExtractorsConfig {
            commands: Vec::new(),
            timeout_secs: 30,
            max_output_bytes: 4 * 1024 * 1024,
            max_running: 4,
            cache_secs: 300,
            cache_entries: 1024,
        }
    }
}

impl ExtractorsConfig {
    /// Checks the values before anything binds.
    pub fn validate(&self) -> anyhow::Result<()> {
        for (i, e) in self.commands.iter().enumerate() {
            if e.command.is_empty() || e.command[0].is_empty() {
                anyhow::bail!("media.extractors.commands[{i}].command names no program");
            }
            if e.host.is_empty() && e.patterns.is_empty() {
                anyhow::bail!("media.extractors.commands[{i}] needs `host` or `patterns`");
            }
            for p in &e.patterns {
                HostPattern::parse(p)
                    .map_err(|err| anyhow::anyhow!("media.extractors.commands[{i}]: {err}"))?;
            }
        }
        if self.timeout_secs == 0 || self.max_running == 0 || self.max_output_bytes == 0 {
            anyhow::bail!(
                "media.extractors.timeout_secs, max_running and max_output_bytes must be above 0"
            );
        }
        Ok(())
    }
}

/// What a command found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub url: url::Url,
    pub headers: Vec<(String, String)>,
    /// `true` for an HLS playlist (`/proxy/hls/manifest.m3u8`), else a file (`/proxy/stream`).
    pub hls: bool,
}

/// The extractors and their answers.
pub struct Extractors {
    config: ExtractorsConfig,
    patterns: Vec<Vec<HostPattern>>,
    running: Arc<Semaphore>,
    answers: Mutex<HashMap<[u8; 32], (Instant, Found)>>,
    /// One lock per page being extracted, so concurrent requests share one run.
    pending: Mutex<HashMap<[u8; 32], Arc<tokio::sync::Mutex<()>>>>,
}

impl Extractors {
    pub fn new(config: &ExtractorsConfig) -> Self {
        let patterns = config
            .commands
            .iter()
            .map(|e| {
                e.patterns
                    .iter()
                    .filter_map(|p| HostPattern::parse(p).ok())
                    .collect()
            })
            .collect();
        Extractors {
            running: Arc::new(Semaphore::new(config.max_running.max(1))),
            config: config.clone(),
            patterns,
            answers: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
        }
    }

    /// Serves `/extractor/video[.ext]` for a request that has passed auth.
    pub async fn serve(
        &self,
        media: &super::Media,
        req: &Request<Incoming>,
        ctx: &RequestContext,
    ) -> Result<Response<Body>, ProxyError> {
        super::require_get_or_head(req.method())?;
        let rest = ctx.path.strip_prefix(PATH).unwrap_or("x");
        if !(rest.is_empty() || rest.starts_with('.') && !rest.contains('/')) {
            return Err(not_found(
                "no such extractor endpoint: use /extractor/video[.ext]",
            ));
        }
        let params = super::stream::parse_params(ctx)?;
        let host = ctx.query.get("host").unwrap_or("").trim().to_string();
        let extra = ctx.query.get("extra_params").unwrap_or("{}").to_string();
        if serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&extra).is_err() {
            return Err(bad_request("extra_params must be a JSON object"));
        }
        let redirect = ctx
            .query
            .get("redirect_stream")
            .is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "true" | "1" | "yes"));
        let page = params.destination.clone();
        let index = self
            .choose(&host, page.host_str().unwrap_or(""))
            .ok_or_else(|| {
                not_found(&format!(
                    "no extractor is configured for host {host:?} or pages on {} \
                 (media.extractors.commands)",
                    page.host_str().unwrap_or("")
                ))
            })?;
        let key = answer_key(index, page.as_str(), &extra);
        let found = self
            .answer(index, key, &host, page.as_str(), &extra)
            .await?;
        respond(media, ctx, &params, &found, redirect)
    }

    /// The command for `host`, else the first whose patterns cover the page's host.
    fn choose(&self, host: &str, page_host: &str) -> Option<usize> {
        let named = self
            .config
            .commands
            .iter()
            .position(|e| !host.is_empty() && e.host.eq_ignore_ascii_case(host));
        named.or_else(|| {
            self.patterns
                .iter()
                .position(|ps| ps.iter().any(|p| p.matches(page_host)))
        })
    }

    async fn answer(
        &self,
        index: usize,
        key: [u8; 32],
        host: &str,
        page: &str,
        extra: &str,
    ) -> Result<Found, ProxyError> {
        if let Some(found) = self.kept(&key) {
            return Ok(found);
        }
        let gate = self
            .pending
            .lock()
            .expect("extractor lock")
            .entry(key)
            .or_default()
            .clone();
        let _held = gate.lock().await;
        if let Some(found) = self.kept(&key) {
            return Ok(found);
        }
        let outcome = self.extract(index, host, page, extra).await;
        self.pending.lock().expect("extractor lock").remove(&key);
        let found = outcome?;
        if self.config.cache_secs > 0 && self.config.cache_entries > 0 {
            let mut answers = self.answers.lock().expect("extractor lock");
            let ttl = Duration::from_secs(self.config.cache_secs);
            answers.retain(|_, (at, _)| at.elapsed() < ttl);
            while answers.len() >= self.config.cache_entries {
                let oldest = answers
                    .iter()
                    .min_by_key(|(_, (at, _))| *at)
                    .map(|(k, _)| *k);
                match oldest {
                    Some(k) => answers.remove(&k),
                    None => break,
                };
            }
            answers.insert(key, (Instant::now(), found.clone()));
        }
        Ok(found)
    }

    fn kept(&self, key: &[u8; 32]) -> Option<Found> {
        let answers = self.answers.lock().expect("extractor lock");
        let (at, found) = answers.get(key)?;
        (at.elapsed() < Duration::from_secs(self.config.cache_secs)).then(|| found.clone())
    }

    async fn extract(
        &self,
        index: usize,
        host: &str,
        page: &str,
        extra: &str,
    ) -> Result<Found, ProxyError> {
        let timeout = Duration::from_secs(self.config.timeout_secs);
        let _permit = tokio::time::timeout(timeout, self.running.clone().acquire_owned())
            .await
            .map_err(|_| {
                let mut e = ProxyError::new(
                    Side::Internal,
                    StatusCode::SERVICE_UNAVAILABLE,
                    "extractor_busy",
                    "every extractor slot is busy (media.extractors.max_running)",
                );
                e.retry_after = Some(self.config.timeout_secs);
                e
            })?
            .expect("semaphore never closed");
        let entry = &self.config.commands[index];
        let out = run::run(Invocation {
            argv: &entry.command,
            page,
            host,
            extra_params: extra,
            timeout,
            max_output: self.config.max_output_bytes,
        })
        .await
        .map_err(|e| {
            let (status, kind) = match e {
                RunError::Timeout(_) => (StatusCode::GATEWAY_TIMEOUT, "extractor_timeout"),
                _ => (StatusCode::BAD_GATEWAY, "extractor_failed"),
            };
            ProxyError::new(Side::Upstream, status, kind, e.to_string())
        })?;
        parse_output(&out).map_err(|why| {
            ProxyError::new(
                Side::Upstream,
                StatusCode::BAD_GATEWAY,
                "extractor_output",
                format!("the extractor's answer is unusable: {why}"),
            )
        })
    }
}

/// Reads a command's answer: MediaFlow's `destination_url`/`request_headers` (with an optional
/// `mediaflow_endpoint`), or yt-dlp's `url`/`http_headers` (`protocol` `m3u8*` for HLS).
pub fn parse_output(out: &[u8]) -> Result<Found, String> {
    let text = std::str::from_utf8(out).map_err(|_| "not UTF-8".to_string())?;
    // yt-dlp prints one JSON object per line; the first is the answer.
    let first = text.trim().lines().next().unwrap_or("");
    let v: serde_json::Value =
        serde_json::from_str(first).map_err(|e| format!("not JSON ({e})"))?;
    let field = |names: &[&str]| names.iter().find_map(|n| v.get(*n));
    let raw = field(&["destination_url", "url"])
        .and_then(|u| u.as_str())
        .ok_or("no destination_url")?;
    let url = url::Url::parse(raw).map_err(|_| "destination_url is not a URL".to_string())?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err("destination_url is not an http(s) URL".into());
    }
    let mut headers = Vec::new();
    if let Some(map) =
        field(&["request_headers", "http_headers", "headers"]).and_then(|h| h.as_object())
    {
        for (name, value) in map {
            let Some(value) = value.as_str() else {
                continue;
            };
            let valid = http::HeaderName::from_bytes(name.as_bytes()).is_ok()
                && HeaderValue::from_str(value).is_ok();
            // Framing headers and invalid ones are left out rather than failing the stream.
            if valid && !is_forbidden_header(name) {
                headers.push((name.to_ascii_lowercase(), value.to_string()));
            }
        }
    }
    headers.sort();
    let endpoint = field(&["mediaflow_endpoint", "protocol"])
        .and_then(|e| e.as_str())
        .unwrap_or("");
    let path = url.path().to_ascii_lowercase();
    let hls = endpoint.contains("hls")
        || endpoint.starts_with("m3u8")
        || path.ends_with(".m3u8")
        || path.ends_with(".m3u");
    Ok(Found { url, headers, hls })
}

fn answer_key(index: usize, page: &str, extra: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    for part in [
        index.to_string().as_bytes(),
        page.as_bytes(),
        extra.as_bytes(),
    ] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    h.finalize().into()
}

/// The sealed proxy URL for what was found, as JSON or as a redirect. The request's own `h_*`
/// headers are added to the extractor's (the request's win), as MediaFlow does.
fn respond(
    media: &super::Media,
    ctx: &RequestContext,
    params: &ProxyParams,
    found: &Found,
    redirect: bool,
) -> Result<Response<Body>, ProxyError> {
    let mut headers: Vec<(String, String)> = found.headers.clone();
    for (k, v) in &params.request_headers {
        headers.retain(|(name, _)| !name.eq_ignore_ascii_case(k));
        headers.push((k.to_ascii_lowercase(), v.clone()));
    }
    let endpoint = match found.hls {
        true => "/proxy/hls/manifest.m3u8",
        false => "/proxy/stream",
    };
    let mut child = vec![("d".to_string(), found.url.to_string())];
    child.extend(headers.iter().map(|(k, v)| (format!("h_{k}"), v.clone())));
    let proxied = media.links(ctx).url(endpoint, &child);
    if redirect {
        let mut resp = Response::new(body::empty());
        *resp.status_mut() = StatusCode::FOUND;
        let location = HeaderValue::from_str(&proxied)
            .map_err(|_| ProxyError::internal("the proxied URL is not a header value"))?;
        resp.headers_mut().insert(header::LOCATION, location);
        resp.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        return Ok(resp);
    }
    let request_headers: serde_json::Map<String, serde_json::Value> = headers
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    let json = serde_json::json!({
        "destination_url": found.url.as_str(),
        "request_headers": request_headers,
        "mediaflow_endpoint": if found.hls { "hls_manifest_proxy" } else { "proxy_stream_endpoint" },
        "mediaflow_proxy_url": proxied,
    });
    let mut resp = Response::new(body::full(json.to_string()));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(resp)
}

fn not_found(why: &str) -> ProxyError {
    ProxyError::downstream(StatusCode::NOT_FOUND, "not_found", why.to_string())
}

fn bad_request(why: &str) -> ProxyError {
    ProxyError::downstream(StatusCode::BAD_REQUEST, "bad_request", why.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mediaflow_and_ytdlp_answers() {
        let f = parse_output(
            br#"{"destination_url":"https://cdn.example/v/master.m3u8?t=1","request_headers":{"Referer":"https://page.example/","Content-Length":"9","bad name":"x"}}"#,
        )
        .unwrap();
        assert!(f.hls);
        assert_eq!(
            f.headers,
            vec![("referer".into(), "https://page.example/".into())]
        );
        let y = parse_output(
            b"{\"url\":\"https://cdn.example/file\",\"protocol\":\"https\",\"http_headers\":{\"User-Agent\":\"UA\"}}\n{\"url\":\"x\"}\n",
        )
        .unwrap();
        assert!(!y.hls);
        assert_eq!(y.url.as_str(), "https://cdn.example/file");
        let h = parse_output(br#"{"url":"https://cdn.example/live","protocol":"m3u8_native"}"#)
            .unwrap();
        assert!(h.hls);
        for bad in [
            &b"not json"[..],
            br#"{"destination_url":"file:///etc/passwd"}"#,
            br#"{"x":1}"#,
            b"\xff",
        ] {
            assert!(parse_output(bad).is_err());
        }
    }
}
