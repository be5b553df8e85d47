//! `/epg.xml` and `/epg.xml.gz`: the XMLTV guide named by the playlist's `x-tvg-url` (or
//! `iptv.epg_url`), fetched through the shared upstream client, kept gzip-compressed in memory,
//! refreshed on a schedule, and served with an ETag, Last-Modified and conditional GET.
//!
//! Only the compressed copy is held: guides compress about tenfold and players fetch them a few
//! times a day, so decompressing for the rare client that refuses gzip costs less than holding
//! the plain text on a router. That decompression streams: no request holds a plain copy.

use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, StatusCode};
#[cfg(test)]
use sha2::{Digest, Sha256};
use sluice_media::{gzip, xmltv};
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::upstream::fetch::{self, FetchError};
use crate::upstream::Upstream;

/// Why a guide could not be fetched or used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EpgError {
    #[error("no EPG source: the playlist has no x-tvg-url and iptv.epg_url is unset")]
    NoSource,
    #[error("bad EPG URL {0:?}")]
    BadUrl(String),
    #[error("EPG fetch failed: {0}")]
    Fetch(String),
    #[error("EPG source answered {0}")]
    Status(StatusCode),
    #[error("EPG larger than iptv.epg_max_bytes ({0} bytes)")]
    TooLarge(usize),
    #[error("EPG is not valid gzip: {0}")]
    Gzip(String),
    #[error("EPG is not XMLTV (no <tv> root near the start)")]
    NotXmltv,
    #[error("EPG fetch took longer than iptv.epg_fetch_timeout_secs ({0} s)")]
    TimedOut(u64),
}

impl EpgError {
    /// The same error with its texts cut short, to be kept for a while.
    fn shortened(&self) -> EpgError {
        let clip = |s: &str| s.chars().take(128).collect::<String>();
        match self {
            EpgError::BadUrl(s) => EpgError::BadUrl(clip(s)),
            EpgError::Fetch(s) => EpgError::Fetch(clip(s)),
            EpgError::Gzip(s) => EpgError::Gzip(clip(s)),
            other => other.clone(),
        }
    }
}

/// One fetched guide.
#[derive(Debug)]
pub struct Guide {
    /// The guide, gzip-compressed (the source's own bytes when it sent gzip).
    pub gz: Bytes,
    /// Length of the XML once decompressed.
    pub xml_len: usize,
    /// Strong validator of the XML content (the `.gz` form adds a suffix).
    pub etag: String,
    /// When this content was first seen; unchanged by refreshes that find the same content.
    pub last_modified: SystemTime,
    /// The source's own validators, sent back on the next refresh.
    upstream_etag: Option<HeaderValue>,
    upstream_modified: Option<HeaderValue>,
}

/// The guide cache and its refresher.
pub struct Epg {
    upstream: Upstream,
    configured: Option<String>,
    refresh: Duration,
    max_bytes: usize,
    /// Bound on one whole fetch (`iptv.epg_fetch_timeout_secs`).
    fetch_timeout: Duration,
    current: RwLock<Option<(Instant, Arc<Guide>)>>,
    /// The last fetch that failed with no guide to fall back on, answered without fetching
    /// again for [`Epg::backoff`]: while a source is down, slow or too big, every request
    /// would otherwise start (and wait in line for) a fetch of its own.
    failed: RwLock<Option<Failure>>,
    /// Held across a fetch so concurrent requests share it.
    fetching: Mutex<()>,
}

/// A remembered failure: when, of which source, and why (shortened).
struct Failure {
    at: Instant,
    source: String,
    error: EpgError,
}

/// Longest back-off after a failed first fetch (shorter when the refresh interval is): one
/// fetch per 10 s at most while the source is down, and a source that comes up a little after
/// sluice (a guide container started beside it) is seen within seconds.
const FAILURE_BACKOFF: Duration = Duration::from_secs(10);

impl std::fmt::Debug for Epg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Epg")
            .field(
                "configured",
                &self.configured.as_deref().map(super::playlist::shown),
            )
            .field("refresh", &self.refresh)
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

impl Epg {
    pub fn new(
        upstream: Upstream,
        configured: Option<String>,
        refresh: Duration,
        max_bytes: usize,
        fetch_timeout: Duration,
    ) -> Self {
        Self {
            upstream,
            configured,
            refresh,
            max_bytes,
            fetch_timeout,
            current: RwLock::new(None),
            failed: RwLock::new(None),
            fetching: Mutex::new(()),
        }
    }

    /// The URL to fetch: the configured one, else the playlist's first `x-tvg-url`.
    pub fn source(&self, playlist: Option<&[u8]>) -> Option<String> {
        self.configured.clone().or_else(|| {
            let text = String::from_utf8_lossy(playlist?);
            super::playlist::epg_url(&text).map(str::to_string)
        })
    }

    /// The cached guide, fetched first when there is none or it is older than the refresh
    /// interval. A failed refresh keeps serving the previous guide; a failed fetch with none
    /// to serve is the answer for the back-off that follows.
    pub async fn get(&self, source: Option<String>) -> Result<Arc<Guide>, EpgError> {
        if let Some(guide) = self.fresh() {
            return Ok(guide);
        }
        if let Some(e) = self.recent_failure(source.as_deref()) {
            return Err(e);
        }
        let _fetching = self.fetching.lock().await;
        if let Some(guide) = self.fresh() {
            return Ok(guide);
        }
        // Those that waited for a fetch that failed get its answer, not a fetch each.
        if let Some(e) = self.recent_failure(source.as_deref()) {
            return Err(e);
        }
        let previous = self.cached();
        let outcome = match &source {
            // Bounded as a whole: the client's deadlines are per read, and a source sending a
            // byte now and then would otherwise hold `fetching`, and every request waiting on
            // it, for as long as it likes.
            Some(url) => {
                tokio::time::timeout(self.fetch_timeout, self.fetch(url, previous.as_deref()))
                    .await
                    .unwrap_or(Err(EpgError::TimedOut(self.fetch_timeout.as_secs())))
            }
            None => Err(EpgError::NoSource),
        };
        match (outcome, previous) {
            (Ok(guide), _) => {
                *self.current.write().unwrap_or_else(|p| p.into_inner()) =
                    Some((Instant::now(), guide.clone()));
                *self.failed.write().unwrap_or_else(|p| p.into_inner()) = None;
                Ok(guide)
            }
            (Err(e), Some(stale)) => {
                tracing::warn!(error = %e, "EPG refresh failed; serving the previous copy");
                // Try again after another interval rather than on every request.
                *self.current.write().unwrap_or_else(|p| p.into_inner()) =
                    Some((Instant::now(), stale.clone()));
                Ok(stale)
            }
            (Err(e), None) => {
                if let Some(source) = source {
                    *self.failed.write().unwrap_or_else(|p| p.into_inner()) = Some(Failure {
                        at: Instant::now(),
                        source,
                        error: e.shortened(),
                    });
                }
                Err(e)
            }
        }
    }

    /// How long a failed fetch with no guide to fall back on stands: [`FAILURE_BACKOFF`], or the
    /// refresh interval if that is shorter.
    fn backoff(&self) -> Duration {
        self.refresh.min(FAILURE_BACKOFF)
    }

    /// The failure of a fetch from `source` within the back-off, if there was one.
    fn recent_failure(&self, source: Option<&str>) -> Option<EpgError> {
        let failed = self.failed.read().unwrap_or_else(|p| p.into_inner());
        failed
            .as_ref()
            .filter(|f| Some(f.source.as_str()) == source && f.at.elapsed() < self.backoff())
            .map(|f| f.error.clone())
    }

    fn cached(&self) -> Option<Arc<Guide>> {
        let current = self.current.read().unwrap_or_else(|p| p.into_inner());
        current.as_ref().map(|(_, g)| g.clone())
    }

    fn fresh(&self) -> Option<Arc<Guide>> {
        let current = self.current.read().unwrap_or_else(|p| p.into_inner());
        match current.as_ref() {
            Some((at, g)) if at.elapsed() < self.refresh => Some(g.clone()),
            _ => None,
        }
    }

    async fn fetch(&self, url: &str, previous: Option<&Guide>) -> Result<Arc<Guide>, EpgError> {
        fetch::parse_url(url).map_err(|_| EpgError::BadUrl(super::playlist::shown(url)))?;
        let mut headers = HeaderMap::new();
        if let Some(prev) = previous {
            if let Some(v) = &prev.upstream_etag {
                headers.insert(header::IF_NONE_MATCH, v.clone());
            }
            if let Some(v) = &prev.upstream_modified {
                headers.insert(header::IF_MODIFIED_SINCE, v.clone());
            }
        }
        let resp = self
            .upstream
            .fetch(url, headers, self.max_bytes)
            .await
            .map_err(|e| match e {
                FetchError::TooLarge { .. } => EpgError::TooLarge(self.max_bytes),
                other => EpgError::Fetch(other.to_string()),
            })?;
        if resp.status == StatusCode::NOT_MODIFIED {
            if let Some(prev) = previous {
                tracing::debug!("EPG unchanged at the source");
                return Ok(Arc::new(prev.same()));
            }
        }
        if !resp.status.is_success() {
            return Err(EpgError::Status(resp.status));
        }
        let upstream_etag = resp.headers.get(header::ETAG).cloned();
        let upstream_modified = resp.headers.get(header::LAST_MODIFIED).cloned();
        let raw = resp.body;
        let max = self.max_bytes;
        // Decompressing, hashing and compressing tens of MB is CPU work; keep it off the
        // threads that move video.
        let mut guide = tokio::task::spawn_blocking(move || prepare(raw, max))
            .await
            .map_err(|e| EpgError::Fetch(e.to_string()))??;
        guide.upstream_etag = upstream_etag;
        guide.upstream_modified = upstream_modified;
        if let Some(prev) = previous.filter(|p| p.etag == guide.etag) {
            guide.last_modified = prev.last_modified;
        }
        tracing::info!(
            bytes = guide.xml_len,
            gzip_bytes = guide.gz.len(),
            "EPG loaded"
        );
        Ok(Arc::new(guide))
    }

    /// Keeps the guide fresh without waiting for a request; runs until the runtime ends.
    pub async fn refresh_loop(self: Arc<Self>, playlist: Option<Arc<super::playlist::Playlist>>) {
        loop {
            let text = match &playlist {
                Some(p) => p.get().await.ok(),
                None => None,
            };
            if let Some(source) = self.source(text.as_deref()) {
                if let Err(e) = self.get(Some(source)).await {
                    tracing::warn!(error = %e, "EPG fetch failed");
                }
            }
            tokio::time::sleep(self.refresh).await;
        }
    }
}

impl Guide {
    /// A copy for a refresh that found the source unchanged.
    fn same(&self) -> Guide {
        Guide {
            gz: self.gz.clone(),
            xml_len: self.xml_len,
            etag: self.etag.clone(),
            last_modified: self.last_modified,
            upstream_etag: self.upstream_etag.clone(),
            upstream_modified: self.upstream_modified.clone(),
        }
    }

    /// The XML itself, decompressed (bounded: it was checked when fetched).
    pub fn xml(&self) -> Result<Bytes, EpgError> {
        gzip::decompress(&self.gz, self.xml_len)
            .map(Bytes::from)
            .map_err(|e| EpgError::Gzip(e.to_string()))
    }

    /// The XML as a body decompressed while the client reads it (`body::inflated`): a request
    /// holds the inflate state and one 64 KiB chunk, never a copy of the guide.
    pub fn xml_body(&self) -> crate::body::Body {
        crate::body::inflated(self.gz.clone(), self.xml_len)
    }
}

/// Checks and normalises fetched bytes (`sluice_media::xmltv`, shared with `/proxy/epg`).
fn prepare(raw: Bytes, max: usize) -> Result<Guide, EpgError> {
    let p = xmltv::prepare(raw, max).map_err(|e| match e {
        xmltv::XmltvError::TooLarge(n) => EpgError::TooLarge(n),
        xmltv::XmltvError::Gzip(why) => EpgError::Gzip(why),
        xmltv::XmltvError::NotXmltv => EpgError::NotXmltv,
    })?;
    Ok(Guide {
        gz: p.gz,
        xml_len: p.xml_len,
        etag: p.etag,
        last_modified: SystemTime::now(),
        upstream_etag: None,
        upstream_modified: None,
    })
}

pub use sluice_media::xmltv::looks_like_xmltv;

#[cfg(test)]
fn hex16(digest: &[u8]) -> String {
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Which representation a request gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// `/epg.xml` for a client that does not accept gzip.
    Xml,
    /// `/epg.xml` with `Content-Encoding: gzip`.
    XmlGzipEncoded,
    /// `/epg.xml.gz`: a gzip file.
    GzFile,
}

impl Form {
    pub fn choose(path_gz: bool, headers: &HeaderMap) -> Form {
        if path_gz {
            Form::GzFile
        } else if accepts_gzip(headers) {
            Form::XmlGzipEncoded
        } else {
            Form::Xml
        }
    }

    /// The ETag for this form: the gzip bytes are a different representation from the XML.
    pub fn etag(self, guide: &Guide) -> String {
        match self {
            Form::Xml => guide.etag.clone(),
            Form::XmlGzipEncoded | Form::GzFile => {
                format!("{}-gz\"", guide.etag.trim_end_matches('"'))
            }
        }
    }
}

pub use sluice_http::coding::accepts_gzip;

/// RFC 9110 §13.1.2 and §13.1.3: `If-None-Match` (weak comparison) decides when present,
/// else `If-Modified-Since` against the content's Last-Modified.
pub fn not_modified(headers: &HeaderMap, etag: &str, last_modified: SystemTime) -> bool {
    if let Some(inm) = headers.get(header::IF_NONE_MATCH) {
        let Ok(inm) = inm.to_str() else {
            return false;
        };
        let bare = |t: &str| t.trim().trim_start_matches("W/").to_string();
        return inm
            .split(',')
            .any(|t| t.trim() == "*" || bare(t) == bare(etag));
    }
    let since = headers
        .get(header::IF_MODIFIED_SINCE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| httpdate::parse_http_date(v).ok());
    match since {
        // HTTP dates have whole seconds; the content is unmodified if not newer than that.
        Some(since) => {
            httpdate::fmt_http_date(last_modified) == httpdate::fmt_http_date(since)
                || last_modified <= since
        }
        None => false,
    }
}

/// Status line and headers for a guide response (the body is the caller's).
pub fn head(form: Form, guide: &Guide, not_modified: bool) -> (StatusCode, HeaderMap) {
    let mut h = HeaderMap::new();
    let etag = form.etag(guide);
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    if let Ok(v) = HeaderValue::from_str(&httpdate::fmt_http_date(guide.last_modified)) {
        h.insert(header::LAST_MODIFIED, v);
    }
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=300"),
    );
    if form != Form::GzFile {
        h.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    }
    if not_modified {
        return (StatusCode::NOT_MODIFIED, h);
    }
    let content_type = match form {
        Form::GzFile => "application/gzip",
        Form::Xml | Form::XmlGzipEncoded => "application/xml; charset=utf-8",
    };
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if form == Form::XmlGzipEncoded {
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    (StatusCode::OK, h)
}

#[cfg(test)]
#[path = "epg/tests.rs"]
mod tests;
