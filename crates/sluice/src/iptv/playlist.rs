//! `/playlist.m3u`: an M3U from a file or an `http://` URL, cached, with every `rtp://` and
//! `udp://` entry rewritten to point at this gateway. Everything else (`#EXTINF` names, groups,
//! logos, catch-up attributes, HTTP entries) is kept byte for byte.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::sync::Mutex;
use tokio::time::Instant;

/// Largest playlist accepted; a channel list is kilobytes, anything bigger is a mistake.
const MAX_PLAYLIST: usize = 16 * 1024 * 1024;
const FETCH_TIMEOUT: Duration = Duration::from_secs(15);

/// Rewrites multicast entries to `{base}/rtp/…` or `{base}/udp/…`; `base` has no trailing `/`.
pub fn rewrite_playlist(text: &str, base: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 4);
    for line in text.split_inclusive('\n') {
        let body = line.trim_end_matches(['\r', '\n']);
        let ending = &line[body.len()..];
        match rewrite_entry(body.trim_start(), base) {
            Some(url) => {
                out.push_str(&url);
                out.push_str(ending);
            }
            None => out.push_str(line),
        }
    }
    out
}

fn rewrite_entry(line: &str, base: &str) -> Option<String> {
    let (kind, rest) = ["rtp", "udp"].iter().find_map(|k| {
        let scheme = line.get(..k.len() + 3)?;
        scheme
            .eq_ignore_ascii_case(&format!("{k}://"))
            .then(|| (*k, &line[k.len() + 3..]))
    })?;
    // VLC writes `udp://@G:P` for "any source".
    let rest = rest.strip_prefix('@').unwrap_or(rest);
    Some(format!("{base}/{kind}/{rest}"))
}

/// Where the playlist comes from.
#[derive(Debug, Clone)]
enum Source {
    File(std::path::PathBuf),
    Http(http::Uri),
}

fn source(location: &str) -> Result<Source, String> {
    if location.starts_with("https://") {
        return Err("https playlists are not supported yet; use http:// or a file".into());
    }
    if location.starts_with("http://") {
        return location
            .parse()
            .map(Source::Http)
            .map_err(|e| format!("bad playlist URL: {e}"));
    }
    Ok(Source::File(location.trim_start_matches("file://").into()))
}

/// The configured playlist, refreshed when older than the refresh interval. If a refresh fails
/// the previous copy keeps being served (and the failure is logged).
#[derive(Debug)]
pub struct Playlist {
    location: String,
    refresh: Duration,
    cached: Mutex<Option<(Instant, Bytes)>>,
}

impl Playlist {
    pub fn new(location: String, refresh: Duration) -> Result<Self, String> {
        source(&location)?;
        Ok(Self {
            location,
            refresh,
            cached: Mutex::new(None),
        })
    }

    /// The playlist text, loading or refreshing it if needed.
    pub async fn get(&self) -> Result<Bytes, String> {
        // Held across the load so concurrent requests share one fetch.
        let mut cached = self.cached.lock().await;
        if let Some((at, text)) = cached.as_ref() {
            if at.elapsed() < self.refresh {
                return Ok(text.clone());
            }
        }
        match self.load().await {
            Ok(text) => {
                *cached = Some((Instant::now(), text.clone()));
                Ok(text)
            }
            Err(e) => match cached.as_ref() {
                Some((_, stale)) => {
                    tracing::warn!(location = %crate::config::mask_userinfo(&self.location), error = %e, "playlist refresh failed; serving the previous copy");
                    Ok(stale.clone())
                }
                None => Err(e),
            },
        }
    }

    async fn load(&self) -> Result<Bytes, String> {
        match source(&self.location)? {
            Source::File(path) => tokio::fs::read(&path)
                .await
                .map(Bytes::from)
                .map_err(|e| format!("cannot read playlist {}: {e}", path.display())),
            Source::Http(uri) => tokio::time::timeout(FETCH_TIMEOUT, fetch(uri))
                .await
                .map_err(|_| "playlist fetch timed out".to_string())?,
        }
    }
}

/// The playlist URL as logs may show it: no user info and no query, where providers put account
/// credentials (`user:pass@`, `?username=..&password=..`).
fn shown(uri: &http::Uri) -> String {
    format!(
        "{}://{}{}",
        uri.scheme_str().unwrap_or("http"),
        uri.host().unwrap_or(""),
        uri.path()
    )
}

/// A plain HTTP/1.1 GET; enough for a channel list until the shared upstream client lands.
async fn fetch(uri: http::Uri) -> Result<Bytes, String> {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<Bytes>>();
    let resp = client
        .get(uri.clone())
        .await
        .map_err(|e| format!("playlist fetch from {} failed: {e}", shown(&uri)))?;
    if !resp.status().is_success() {
        return Err(format!(
            "playlist fetch from {}: status {}",
            shown(&uri),
            resp.status()
        ));
    }
    let limited = http_body_util::Limited::new(resp.into_body(), MAX_PLAYLIST);
    limited
        .collect()
        .await
        .map(|b| b.to_bytes())
        .map_err(|e| format!("playlist body from {}: {e}", shown(&uri)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_only_multicast_entries() {
        let input = "#EXTM3U x-tvg-url=\"http://epg/e.xml\"\r\n\
#EXTINF:-1 tvg-id=\"a\" group-title=\"News\" catchup=\"default\" catchup-source=\"rtsp://10.0.0.1/a?playseek={utc}\",A\r\n\
rtp://239.1.1.1:5000\r\n\
#EXTINF:-1,B\n\
UDP://@239.1.1.2:1234\n\
#EXTINF:-1,C\n\
rtp://10.0.0.9@232.1.1.1:5140\n\
#EXTINF:-1,D\n\
http://example.invalid/d.m3u8\n";
        let out = rewrite_playlist(input, "http://gw:8080");
        let want = "#EXTM3U x-tvg-url=\"http://epg/e.xml\"\r\n\
#EXTINF:-1 tvg-id=\"a\" group-title=\"News\" catchup=\"default\" catchup-source=\"rtsp://10.0.0.1/a?playseek={utc}\",A\r\n\
http://gw:8080/rtp/239.1.1.1:5000\r\n\
#EXTINF:-1,B\n\
http://gw:8080/udp/239.1.1.2:1234\n\
#EXTINF:-1,C\n\
http://gw:8080/rtp/10.0.0.9@232.1.1.1:5140\n\
#EXTINF:-1,D\n\
http://example.invalid/d.m3u8\n";
        assert_eq!(out, want);
    }

    #[test]
    fn refuses_https_sources() {
        assert!(Playlist::new("https://x/y.m3u".into(), Duration::from_secs(1)).is_err());
        assert!(Playlist::new("http://127.0.0.1:1/y.m3u".into(), Duration::from_secs(1)).is_ok());
    }
}
