//! `/extractor/video[.ext]`: MediaFlow's extractor endpoint answered by external commands, one per
//! extractor name or page-host pattern (`docs/decisions/mediaflow-extras.md`). A command gets the
//! page URL and prints `{"destination_url": ..., "request_headers": {...}}` (or yt-dlp's `url` and
//! `http_headers`); sluice answers with a sealed `/proxy/stream` or `/proxy/hls/manifest.m3u8` URL
//! for it, as JSON or as a redirect (`redirect_stream`). Runs are bounded in time, output and
//! number, and their answers are kept for a few minutes per page.

pub mod run;

use std::collections::HashMap;
use std::net::IpAddr;
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
use super::keyed::Keyed;
use super::limit::InFlight;
use crate::body::{self, Body};
use crate::error::{ProxyError, Side};
use crate::request::RequestContext;
use crate::upstream::{ConnectError, Upstream, UpstreamError};

/// Bytes of answers kept at once, whatever `cache_entries` allows: an answer may be as large as
/// `max_output_bytes`, and 1024 of those would be gigabytes. The oldest go first; an answer
/// larger than this is not kept.
pub const CACHE_MAX_BYTES: usize = 32 * 1024 * 1024;

/// Bytes of a command's destination URL, at most: it is kept, and sealed into every answer.
pub const MAX_URL_BYTES: usize = 16 * 1024;

/// Headers a command's answer may carry, at most, and bytes of their names and values together.
pub const MAX_HEADERS: usize = 64;
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// Failed runs kept at once for the requests that were waiting for them (each for at most
/// `timeout_secs`); past it a failure is not shared, and its waiters run again.
const FAILURES_KEPT: usize = 4096;

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
    /// Runs at once; a request that cannot get its page's turn and a slot within `timeout_secs`
    /// gets 503. One client network has at most half of them (at least 1) waiting or running.
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
    answers: Mutex<Answers>,
    /// One lock per page being extracted, so concurrent requests share one run; the last request
    /// holding or waiting for it removes it, however it ends.
    pending: Keyed<[u8; 32]>,
    /// Failed runs, for the requests that were already waiting for them.
    failures: Mutex<Failures>,
    /// Runs (waiting for a slot or running) per client network, so one client cannot take every
    /// slot: at most half of `max_running` (at least 1).
    per_client: Arc<InFlight<IpAddr>>,
}

/// Failed runs, each numbered: a request that arrived before a failure was numbered (it was
/// waiting for that run, or arrived while it ran) takes its error rather than running again; a
/// later request runs again (failures are not kept).
#[derive(Default)]
struct Failures {
    /// The number of the latest failure.
    seq: u64,
    map: HashMap<[u8; 32], (u64, Instant, ProxyError)>,
}

/// The kept answers and what they weigh.
#[derive(Default)]
struct Answers {
    map: HashMap<[u8; 32], (Instant, Found, usize)>,
    bytes: usize,
}

impl Answers {
    fn remove(&mut self, key: &[u8; 32]) {
        if let Some((_, _, size)) = self.map.remove(key) {
            self.bytes -= size;
        }
    }

    /// Keeps `found`, first dropping expired answers, then the oldest until both bounds hold.
    fn insert(
        &mut self,
        key: [u8; 32],
        found: Found,
        ttl: Duration,
        max_entries: usize,
        max_bytes: usize,
    ) {
        let expired: Vec<[u8; 32]> = self
            .map
            .iter()
            .filter(|(_, (at, _, _))| at.elapsed() >= ttl)
            .map(|(k, _)| *k)
            .collect();
        for k in expired.iter().chain([&key]) {
            self.remove(k);
        }
        let size = answer_size(&found);
        if size > max_bytes || max_entries == 0 {
            return;
        }
        while self.map.len() >= max_entries || self.bytes + size > max_bytes {
            let oldest = self
                .map
                .iter()
                .min_by_key(|(_, (at, _, _))| *at)
                .map(|(k, _)| *k);
            match oldest {
                Some(k) => self.remove(&k),
                None => break,
            }
        }
        self.bytes += size;
        self.map.insert(key, (Instant::now(), found, size));
    }
}

/// What an answer weighs in the cache: its text and a little for the entry itself.
fn answer_size(found: &Found) -> usize {
    let headers: usize = found.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
    found.url.as_str().len() + headers + 128
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
            answers: Mutex::new(Answers::default()),
            pending: Keyed::new(),
            failures: Mutex::new(Failures::default()),
            per_client: InFlight::new((config.max_running / 2).max(1)),
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
        let raw_host = ctx.query.get("host").unwrap_or("");
        if raw_host.chars().any(char::is_control) {
            return Err(bad_request("host must not contain control characters"));
        }
        let host = raw_host.trim().to_string();
        let extra = ctx.query.get("extra_params").unwrap_or("{}").to_string();
        if serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&extra).is_err() {
            return Err(bad_request("extra_params must be a JSON object"));
        }
        let redirect = ctx
            .query
            .get("redirect_stream")
            .is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "true" | "1" | "yes"));
        let page = params.destination.clone();
        let index = self.choose(&host, page.host_str().unwrap_or(""))?;
        // The command fetches the page itself: it gets no address the guard refuses.
        self.guard(&media.upstream, &page).await?;
        let key = answer_key(index, page.as_str(), &extra);
        let found = self
            .answer(index, key, ctx.client_ip, page.as_str(), &extra)
            .await?;
        respond(media, ctx, &params, &found, redirect)
    }

    /// The command for `host`, else the first whose patterns cover the page's host. A command
    /// that lists `patterns` answers only pages they cover, even when `host` names it.
    fn choose(&self, host: &str, page_host: &str) -> Result<usize, ProxyError> {
        let covers = |i: usize| self.patterns[i].iter().any(|p| p.matches(page_host));
        let named = self
            .config
            .commands
            .iter()
            .position(|e| !host.is_empty() && e.host.eq_ignore_ascii_case(host));
        if let Some(i) = named {
            if self.config.commands[i].patterns.is_empty() || covers(i) {
                return Ok(i);
            }
            return Err(not_found(&format!(
                "the extractor for host {host:?} answers only pages its patterns cover, \
                 not pages on {page_host} (media.extractors.commands)"
            )));
        }
        (0..self.patterns.len())
            .find(|&i| covers(i))
            .ok_or_else(|| {
                not_found(&format!(
                    "no extractor is configured for host {host:?} or pages on {page_host} \
                 (media.extractors.commands)"
                ))
            })
    }

    /// The address guard (`upstream.allow_private`) applied to the page before a command is
    /// given it, answered as every fetching endpoint answers it (403). The command resolves the
    /// name again itself, so this narrows but cannot close a DNS-rebinding window
    /// (`docs/security.md`). With the guard on, a name that cannot be resolved here is refused
    /// too; with it off, the command is left to try.
    async fn guard(&self, upstream: &Upstream, page: &url::Url) -> Result<(), ProxyError> {
        let host = match page.host() {
            Some(url::Host::Domain(d)) => d.to_string(),
            Some(url::Host::Ipv4(ip)) => ip.to_string(),
            Some(url::Host::Ipv6(ip)) => ip.to_string(),
            None => return Err(bad_request("d has no host")),
        };
        let port = page.port_or_known_default().unwrap_or(80);
        let step = Duration::from_secs(self.config.timeout_secs);
        let checked = tokio::time::timeout(step, upstream.resolve_checked(&host, port)).await;
        let refuse = |e: ConnectError| Err(ProxyError::from_upstream(&UpstreamError::Connect(e)));
        match checked {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e @ ConnectError::Refused { .. })) => refuse(e),
            Ok(Err(e)) if !upstream.allows_private() => refuse(e),
            Err(_) if !upstream.allows_private() => refuse(ConnectError::Timeout {
                host,
                secs: step.as_secs(),
            }),
            _ => Ok(()),
        }
    }

    async fn answer(
        &self,
        index: usize,
        key: [u8; 32],
        client: IpAddr,
        page: &str,
        extra: &str,
    ) -> Result<Found, ProxyError> {
        if let Some(found) = self.kept(&key) {
            return Ok(found);
        }
        // The page's turn and a slot are waited for `timeout_secs` together: a page whose runs
        // are slow or stalled does not queue its requests one run after another.
        let deadline = Instant::now() + Duration::from_secs(self.config.timeout_secs);
        let arrived = self.failures().seq;
        // This request's place among the page's holders, given up however it ends (a client
        // that goes away while waiting included).
        let share = self.pending.hold(key);
        let _held = tokio::time::timeout_at(deadline, share.turn())
            .await
            .map_err(|_| self.busy())?;
        if let Some(found) = self.kept(&key) {
            return Ok(found);
        }
        // The run this request waited for failed: its error, not another run.
        if let Some(e) = self.failed_since(&key, arrived) {
            return Err(e);
        }
        // A run of this client's (waiting for a slot or running), given back however it ends.
        let _place = self
            .per_client
            .take(crate::net::per_ip::network_of(client))
            .ok_or_else(|| {
                ProxyError::downstream(
                    StatusCode::TOO_MANY_REQUESTS,
                    "too_many_requests",
                    "this client has too many extractor runs at once \
                     (half of media.extractors.max_running)",
                )
                .with_retry_after(self.config.timeout_secs)
            })?;
        let found = match self.extract(index, page, extra, deadline).await {
            Ok(found) => found,
            Err(e) => {
                // No slot within its wait is this request's own lot: those waiting behind it
                // wait for a slot themselves rather than take its refusal.
                if e.kind != "extractor_busy" {
                    self.fail(key, &e);
                }
                return Err(e);
            }
        };
        if self.config.cache_secs > 0 && self.config.cache_entries > 0 {
            self.answers.lock().expect("extractor lock").insert(
                key,
                found.clone(),
                Duration::from_secs(self.config.cache_secs),
                self.config.cache_entries,
                CACHE_MAX_BYTES,
            );
        }
        Ok(found)
    }

    fn failures(&self) -> std::sync::MutexGuard<'_, Failures> {
        self.failures.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The error of a run of `key` that failed after a request numbered `arrived` came.
    fn failed_since(&self, key: &[u8; 32], arrived: u64) -> Option<ProxyError> {
        let failures = self.failures();
        let (seq, _, e) = failures.map.get(key)?;
        (*seq > arrived).then(|| e.clone())
    }

    /// Keeps a failed run's error for the requests waiting for it: each waits at most
    /// `timeout_secs` for its turn, so older failures have no one left to take them.
    fn fail(&self, key: [u8; 32], e: &ProxyError) {
        let wait = Duration::from_secs(self.config.timeout_secs);
        let mut failures = self.failures();
        failures.map.retain(|_, (_, at, _)| at.elapsed() <= wait);
        failures.seq += 1;
        let seq = failures.seq;
        if failures.map.len() < FAILURES_KEPT || failures.map.contains_key(&key) {
            failures.map.insert(key, (seq, Instant::now(), e.clone()));
        }
    }

    fn busy(&self) -> ProxyError {
        ProxyError::new(
            Side::Internal,
            StatusCode::SERVICE_UNAVAILABLE,
            "extractor_busy",
            "every extractor slot is busy (media.extractors.max_running)",
        )
        .with_retry_after(self.config.timeout_secs)
    }

    fn kept(&self, key: &[u8; 32]) -> Option<Found> {
        let answers = self.answers.lock().expect("extractor lock");
        let (at, found, _) = answers.map.get(key)?;
        (at.elapsed() < Duration::from_secs(self.config.cache_secs)).then(|| found.clone())
    }

    /// Bytes the kept answers weigh (at most [`CACHE_MAX_BYTES`]).
    pub fn cached_bytes(&self) -> usize {
        self.answers.lock().expect("extractor lock").bytes
    }

    async fn extract(
        &self,
        index: usize,
        page: &str,
        extra: &str,
        deadline: Instant,
    ) -> Result<Found, ProxyError> {
        let timeout = Duration::from_secs(self.config.timeout_secs);
        let _permit = tokio::time::timeout_at(deadline, self.running.clone().acquire_owned())
            .await
            .map_err(|_| self.busy())?
            .expect("semaphore never closed");
        let entry = &self.config.commands[index];
        let out = run::run(Invocation {
            argv: &entry.command,
            page,
            // The configured entry's name, not the client's spelling: the answer is kept per
            // command, page and `extra_params`, so what the command is given must be no more.
            host: &entry.host,
            extra_params: extra,
            timeout,
            max_output: self.config.max_output_bytes,
        })
        .await
        .map_err(|e| {
            // What the command printed on standard error (which may describe what its fetch of
            // the page met: a refused port, a 404) is the operator's, in the log only: Debug-
            // escaped (it is the page's server's text, passed on), every URL's query masked
            // (yt-dlp prints the page URL it was given).
            tracing::warn!(
                command = %entry.command[0],
                page = ?crate::redact::mask_url(page),
                error = ?mask_urls_in(&e.to_string()),
                "extractor run failed"
            );
            let (side, status, kind, message) = match e {
                RunError::Timeout(_) => (
                    Side::Upstream,
                    StatusCode::GATEWAY_TIMEOUT,
                    "extractor_timeout",
                    e.to_string(),
                ),
                RunError::TooMuch(_) => (
                    Side::Upstream,
                    StatusCode::BAD_GATEWAY,
                    "extractor_failed",
                    e.to_string(),
                ),
                RunError::Failed { .. } => (
                    Side::Upstream,
                    StatusCode::BAD_GATEWAY,
                    "extractor_failed",
                    "the extractor found no stream for this page (details are in sluice's log)"
                        .to_string(),
                ),
                // Starting it, or reading or waiting for it, failed here: sluice's (or its
                // configuration's) fault, not the page's.
                RunError::Spawn(_) => (
                    Side::Internal,
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "extractor_failed",
                    "the extractor could not be run (details are in sluice's log)".to_string(),
                ),
            };
            ProxyError::new(side, status, kind, message)
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
    let too_long = || format!("destination_url is longer than {MAX_URL_BYTES} bytes");
    if raw.len() > MAX_URL_BYTES {
        return Err(too_long());
    }
    let url = url::Url::parse(raw).map_err(|_| "destination_url is not a URL".to_string())?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err("destination_url is not an http(s) URL".into());
    }
    // (Parsing may percent-encode it longer.)
    if url.as_str().len() > MAX_URL_BYTES {
        return Err(too_long());
    }
    let mut headers = Vec::new();
    if let Some(map) =
        field(&["request_headers", "http_headers", "headers"]).and_then(|h| h.as_object())
    {
        // Counted as given, the ones left out below included.
        let bytes: usize = map
            .iter()
            .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
            .sum();
        if map.len() > MAX_HEADERS || bytes > MAX_HEADER_BYTES {
            return Err(format!(
                "more than {MAX_HEADERS} headers or {MAX_HEADER_BYTES} bytes of them"
            ));
        }
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

/// `text` with every URL in it (`scheme://` up to a space or quote) masked as
/// [`crate::redact::mask_url`] masks one: query values and a user info's password starred.
fn mask_urls_in(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        // The scheme: the letters, digits, `+`, `-` and `.` right before `://`.
        let start = rest[..at]
            .char_indices()
            .rev()
            .find(|&(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |(i, c)| i + c.len_utf8());
        let end = rest[at..]
            .find(|c: char| c.is_whitespace() || c.is_control() || "\"'<>`".contains(c))
            .map_or(rest.len(), |i| at + i);
        out.push_str(&rest[..start]);
        out.push_str(&crate::redact::mask_url(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
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

    fn shell(script: &str, config: ExtractorsConfig) -> Extractors {
        Extractors::new(&ExtractorsConfig {
            commands: vec![ExtractorEntry {
                host: "Sh".into(),
                patterns: Vec::new(),
                command: vec!["sh".into(), "-c".into(), script.into(), "sh".into()],
            }],
            ..config
        })
    }

    const CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[test]
    fn kept_answers_stay_within_the_byte_bound() {
        // Each page's answer weighs about 1 MiB (commands' answers are bounded far below that,
        // the byte bound holds whatever they weigh); 1024 entries would allow 1 GiB.
        let mut answers = Answers::default();
        for n in 0..40 {
            let page = format!("https://page.example/{n}");
            let found = Found {
                url: url::Url::parse(&format!("http://cdn.example/{}", "a".repeat(1_000_000)))
                    .unwrap(),
                headers: Vec::new(),
                hls: false,
            };
            answers.insert(
                answer_key(0, &page, "{}"),
                found,
                Duration::from_secs(300),
                1024,
                CACHE_MAX_BYTES,
            );
            assert!(answers.bytes <= CACHE_MAX_BYTES, "{}", answers.bytes);
        }
        assert!(answers.map.len() >= 30 && answers.map.len() < 40);
        // The newest is kept, the oldest went.
        assert!(answers
            .map
            .contains_key(&answer_key(0, "https://page.example/39", "{}")));
        assert!(!answers
            .map
            .contains_key(&answer_key(0, "https://page.example/0", "{}")));
        // An answer larger than the whole bound is not kept.
        let mut a = Answers::default();
        let big = Found {
            url: url::Url::parse(&format!("http://a.example/{}", "a".repeat(1000))).unwrap(),
            headers: Vec::new(),
            hls: false,
        };
        a.insert([1; 32], big, Duration::from_secs(60), 10, 500);
        assert!(a.map.is_empty());
        assert_eq!(a.bytes, 0);
    }

    #[tokio::test]
    async fn an_abandoned_wait_leaves_no_pending_gate() {
        let x = Arc::new(shell("sleep 20", ExtractorsConfig::default()));
        let key = answer_key(0, "https://page.example/slow", "{}");
        let spawn = |x: Arc<Extractors>| {
            tokio::spawn(async move {
                x.answer(0, key, CLIENT, "https://page.example/slow", "{}")
                    .await
            })
        };
        // One request runs the command, a second waits for it; both clients go away.
        let first = spawn(x.clone());
        tokio::time::sleep(Duration::from_millis(200)).await;
        let second = spawn(x.clone());
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(x.pending.keys_held(), 1);
        second.abort();
        let _ = second.await;
        // The runner still holds the gate.
        assert_eq!(x.pending.keys_held(), 1);
        first.abort();
        let _ = first.await;
        assert_eq!(x.pending.keys_held(), 0);
    }

    /// What a failed run's standard error says reaches the log with every URL's query masked:
    /// yt-dlp prints the page URL it was given, a signed one's token among it.
    #[test]
    fn urls_in_a_failed_run_are_masked_for_the_log() {
        let e = RunError::Failed {
            status: "exit status: 1".into(),
            stderr: "[generic] Extracting URL: https://u:pw@page.example/v?token=SECRET1&x=2\n\
                     ERROR: Unable to download 'http://cdn.example/a.m3u8?sig=SECRET2' (404)"
                .into(),
        };
        let logged = mask_urls_in(&e.to_string());
        assert!(!logged.contains("SECRET"), "{logged}");
        assert!(!logged.contains(":pw@"), "{logged}");
        assert!(
            logged.contains("https://u:****@page.example/v?token=****&x=****"),
            "{logged}"
        );
        assert!(logged.contains("'http://cdn.example/a.m3u8?sig=****' (404)"));
        assert_eq!(mask_urls_in("no url: a://"), "no url: a://");
        // A wide character right before the scheme (quotes, a lossy byte) is not cut into.
        for (text, kept) in [
            ("«https://x.example/p?t=SECRET3»", "«https://x.example/p?t="),
            (
                "\u{FFFD}http://x.example/?sig=SECRET4",
                "\u{FFFD}http://x.example/?sig=",
            ),
        ] {
            let logged = mask_urls_in(text);
            assert!(
                logged.starts_with(kept) && !logged.contains("SECRET"),
                "{logged}"
            );
        }
    }

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
