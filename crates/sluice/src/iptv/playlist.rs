//! `/playlist.m3u`: an M3U from a file or an `http://` URL, cached, with every `rtp://`,
//! `udp://` and `rtsp://` entry rewritten to point at this gateway. `rtsp://` catch-up sources
//! (`catchup-source="rtsp://…"`) go through the gateway too, and an RTSP entry without catch-up
//! attributes gets `catchup="default"` and a `catchup-source` so players offer time-shift.
//! Everything else (`#EXTINF` names, groups, logos, HTTP entries) is kept byte for byte, except
//! that the header's guide URL (`x-tvg-url`) points at this gateway's `/epg.xml.gz` when the
//! gateway serves it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::upstream::{fetch, Upstream};

/// Largest playlist accepted; a channel list is kilobytes, anything bigger is a mistake.
const MAX_PLAYLIST: usize = 16 * 1024 * 1024;
const FETCH_TIMEOUT: Duration = Duration::from_secs(15);

/// Attribute names players read the guide URL from, in the `#EXTM3U` header line.
const EPG_ATTRIBUTES: [&str; 2] = ["x-tvg-url", "url-tvg"];

/// Seals one entry: the scope its token opens (an entry's [`exact_scope`] of its gateway path,
/// `/udp/G:P`) and the query params it fixes, to the path prefix (`/_token_<T>`) carrying it.
///
/// [`exact_scope`]: crate::auth::token::exact_scope
pub type Seal = Arc<SealFn>;

/// What a [`Seal`] calls.
pub type SealFn = dyn Fn(&str, &[(String, String)]) -> String + Send + Sync;

/// Rewrites multicast and RTSP entries to `{base}/rtp/…`, `{base}/udp/…` or `{base}/rtsp/…`;
/// `base` has no trailing `/`. With `epg`, the header's guide URL becomes that. With
/// `catchup_query`, RTSP entries without catch-up attributes get
/// `catchup-source="{entry}?{catchup_query}"`. With `seal`, each entry URL carries a token
/// opening that entry alone, its query fixed inside the token except the catch-up params
/// (`seek_params` is `iptv.rtsp.seek_params`, the operator's own names among them).
pub fn rewrite_playlist(
    text: &str,
    base: &str,
    epg: Option<&str>,
    catchup_query: Option<&str>,
    seal: Option<&SealFn>,
    seek_params: &[String],
) -> String {
    let seal = seal.map(|seal| Sealer { seal, seek_params });
    let mut out = String::with_capacity(text.len() + text.len() / 4);
    // Where the last `#EXTINF` line sits in `out`, to add catch-up attributes to it once
    // its entry turns out to be RTSP.
    let mut extinf: Option<std::ops::Range<usize>> = None;
    for line in text.split_inclusive('\n') {
        let body = line.trim_end_matches(['\r', '\n']);
        let ending = &line[body.len()..];
        let trimmed = body.trim_start();
        let header = epg.filter(|_| trimmed.starts_with("#EXTM3U"));
        if header.is_none() && trimmed.starts_with("#EXTINF") {
            let start = out.len();
            out.push_str(&rewrite_catchup_source(body, base, seal.as_ref()));
            extinf = Some(start..out.len());
            out.push_str(ending);
            continue;
        }
        match (header, rewrite_entry(trimmed, base, seal.as_ref())) {
            (Some(epg), _) => {
                out.push_str(&replace_epg_attribute(body, epg));
                out.push_str(ending);
            }
            (None, Some(url)) => {
                if let (Some(query), Some(range)) = (catchup_query, extinf.take()) {
                    if is_rtsp(trimmed) && attribute(&out[range.clone()], "catchup").is_none() {
                        let sep = if url.contains('?') { '&' } else { '?' };
                        let attrs =
                            format!(" catchup=\"default\" catchup-source=\"{url}{sep}{query}\"");
                        let at = range.start + title_comma(&out[range]);
                        out.insert_str(at, &attrs);
                    }
                }
                out.push_str(&url);
                out.push_str(ending);
            }
            (None, None) => {
                if !trimmed.starts_with('#') && !trimmed.is_empty() {
                    extinf = None;
                }
                out.push_str(line)
            }
        }
    }
    out
}

fn is_rtsp(line: &str) -> bool {
    line.get(..7)
        .is_some_and(|s| s.eq_ignore_ascii_case("rtsp://"))
}

/// Where the attributes of an `#EXTINF` line end: its first comma outside quotes (the title
/// follows it), or the line's end.
fn title_comma(line: &str) -> usize {
    let mut quoted = false;
    for (i, c) in line.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => return i,
            _ => {}
        }
    }
    line.len()
}

/// An `#EXTINF` line with an `rtsp://` catch-up source pointed at this gateway.
fn rewrite_catchup_source(line: &str, base: &str, seal: Option<&Sealer>) -> String {
    match attribute(line, "catchup-source") {
        Some(value) if is_rtsp(value) => {
            let at = value.as_ptr() as usize - line.as_ptr() as usize;
            let url = gateway_url(base, "rtsp", &value[7..], seal);
            format!("{}{url}{}", &line[..at], &line[at + value.len()..])
        }
        _ => line.to_string(),
    }
}

/// The first guide URL of the playlist header (`x-tvg-url="a,b"` lists several; the first
/// is the one fetched).
pub fn epg_url(text: &str) -> Option<&str> {
    let header = text
        .lines()
        .map(str::trim_start)
        .find(|l| l.starts_with("#EXTM3U"))?;
    EPG_ATTRIBUTES.iter().find_map(|name| {
        let value = attribute(header, name)?;
        let first = value.split(',').next()?.trim();
        (!first.is_empty()).then_some(first)
    })
}

/// The value of `name="value"` in an M3U directive line.
fn attribute<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let mut from = 0;
    while let Some(at) = line[from..].find(name) {
        let start = from + at;
        let before_ok = start == 0 || line.as_bytes()[start - 1].is_ascii_whitespace();
        let rest = &line[start + name.len()..];
        if before_ok {
            if let Some(quoted) = rest.strip_prefix("=\"") {
                return quoted.find('"').map(|end| &quoted[..end]);
            }
        }
        from = start + name.len();
    }
    None
}

/// The header line with its guide attribute set to `epg` (added when it had none).
fn replace_epg_attribute(line: &str, epg: &str) -> String {
    for name in EPG_ATTRIBUTES {
        if let Some(value) = attribute(line, name) {
            // `value` borrows from `line`, so its offset is exact.
            let at = value.as_ptr() as usize - line.as_ptr() as usize;
            return format!("{}{epg}{}", &line[..at], &line[at + value.len()..]);
        }
    }
    format!("{line} x-tvg-url=\"{epg}\"")
}

fn rewrite_entry(line: &str, base: &str, seal: Option<&Sealer>) -> Option<String> {
    let (kind, rest) = ["rtp", "udp", "rtsp"].iter().find_map(|k| {
        let scheme = line.get(..k.len() + 3)?;
        scheme
            .eq_ignore_ascii_case(&format!("{k}://"))
            .then(|| (*k, &line[k.len() + 3..]))
    })?;
    // VLC writes `udp://@G:P` for "any source".
    let rest = match kind {
        "rtsp" => rest,
        _ => rest.strip_prefix('@').unwrap_or(rest),
    };
    Some(gateway_url(base, kind, rest, seal))
}

/// What seals entries: the [`Seal`] and the configured seek params, which stay out of the token.
struct Sealer<'a> {
    seal: &'a SealFn,
    seek_params: &'a [String],
}

/// `{base}/{kind}/{rest}`; sealed, `{base}/_token_<T>/{kind}/{path}` with the query's params
/// inside the token, except on RTSP the catch-up params (`playseek`, the configured seek params
/// such as `starttime`) and their `{utc}` or `${(b)…}` placeholders, which a player fills in
/// and so stay in the URL: sealed, a placeholder would reach the gateway as literal text, and
/// the token would fix the time so the player could not add it either.
fn gateway_url(base: &str, kind: &str, rest: &str, seal: Option<&Sealer>) -> String {
    let Some(Sealer { seal, seek_params }) = seal else {
        return format!("{base}/{kind}/{rest}");
    };
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (format!("/{kind}/{p}"), q),
        None => (format!("/{kind}/{rest}"), ""),
    };
    let mut kept = Vec::new();
    let mut fixed = String::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let name = pair.split('=').next().unwrap_or("");
        if kind == "rtsp" && crate::auth::token::is_catchup_param(name, seek_params) {
            kept.push(pair);
        } else {
            if !fixed.is_empty() {
                fixed.push('&');
            }
            fixed.push_str(pair);
        }
    }
    let params = sluice_media::query::Query::parse(&fixed).pairs().to_vec();
    // The entry's path alone: as a plain scope, `/rtsp/h/live` would open every path below it
    // on that host, and an entry that is only a family (`rtsp://h/`, `udp://@`) all of it.
    let prefix = seal(&crate::auth::token::exact_scope(&path), &params);
    match kept.is_empty() {
        true => format!("{base}{prefix}{path}"),
        false => format!("{base}{prefix}{path}?{}", kept.join("&")),
    }
}

/// A playlist or guide location as logs and errors may show it: no user info and no query,
/// where providers put account credentials (`user:pass@`, `?username=..&password=..`).
/// Everything up to the last `@` goes, wherever it stands: a password with an unencoded `/`,
/// `?` or `#` hides the end of the user info from a parser, not from this.
pub(super) fn shown(location: &str) -> String {
    let (prefix, rest) = match location.split_once("://") {
        Some((scheme, rest)) => (&location[..scheme.len() + 3], rest),
        None => ("", location),
    };
    let rest = rest.rfind('@').map_or(rest, |at| &rest[at + 1..]);
    let no_query = rest.split(['?', '#']).next().unwrap_or("");
    format!("{prefix}{no_query}")
}

/// Where the playlist comes from.
#[derive(Debug, Clone)]
enum Source {
    File(std::path::PathBuf),
    Http,
}

fn source(location: &str) -> Result<Source, String> {
    if location.starts_with("http://") || location.starts_with("https://") {
        return fetch::parse_url(location)
            .map(|_| Source::Http)
            .map_err(|e| format!("bad playlist URL {}: {e}", shown(location)));
    }
    Ok(Source::File(location.trim_start_matches("file://").into()))
}

/// The configured playlist, refreshed when older than the refresh interval. A failed fetch is
/// remembered: for a back-off after it, requests get the previous copy (or, with none, the
/// failure) at once, without fetching again or waiting for a fetch.
pub struct Playlist {
    location: String,
    refresh: Duration,
    upstream: Upstream,
    /// The copy, or the failure, and until when it stands. Held briefly, never across a fetch.
    state: Arc<std::sync::Mutex<State>>,
    /// Held across a fetch so concurrent requests share one.
    fetching: Arc<Mutex<()>>,
}

/// First wait after a failed fetch before the next; it doubles with each failure in a row up to
/// the refresh interval (never below this). Meanwhile requests get the previous copy, or the
/// failure, at once: while a provider is down or drops packets, every request would otherwise
/// fetch again (each up to [`FETCH_TIMEOUT`], in line behind the others), and log a warning.
/// Short enough that a provider coming up a little after sluice is seen within seconds.
const FIRST_BACKOFF: Duration = Duration::from_secs(10);

/// The longest back-off while there is no copy to serve: every request is a 502 meanwhile.
const NO_COPY_BACKOFF: Duration = Duration::from_secs(300);

/// At most one warning a minute about failed fetches; the next says how many were not.
static FETCH_WARNINGS: crate::logging::WarnLimit = crate::logging::WarnLimit::new(60_000);

#[derive(Default)]
struct State {
    copy: Option<Bytes>,
    /// Until when the copy (fresh, or stale behind a failure) or the failure is the answer;
    /// `None` before the first fetch.
    until: Option<Instant>,
    failure: Option<Failure>,
    /// Fetches finished, so a request that waited for one takes its outcome.
    fetches: u64,
}

/// The last fetch failed (and every one before it since the last success, `backoff` says).
struct Failure {
    error: String,
    backoff: Duration,
}

impl State {
    /// The copy if there is one (even stale), else the failure.
    fn answer(&self) -> Option<Result<Bytes, String>> {
        match (&self.copy, &self.failure) {
            (Some(copy), _) => Some(Ok(copy.clone())),
            (None, Some(failure)) => Some(Err(failure.error.clone())),
            (None, None) => None,
        }
    }

    /// The answer while it stands, without a fetch.
    fn standing(&self) -> Option<Result<Bytes, String>> {
        self.until.filter(|until| Instant::now() < *until)?;
        self.answer()
    }

    /// Records a fetch's outcome; a failure re-stamps the previous copy for the back-off.
    fn record(
        &mut self,
        outcome: Result<Bytes, String>,
        refresh: Duration,
        location: &str,
    ) -> Result<Bytes, String> {
        self.fetches += 1;
        let now = Instant::now();
        let error = match outcome {
            Ok(text) => {
                self.copy = Some(text.clone());
                self.failure = None;
                self.until = Some(later(now, refresh));
                return Ok(text);
            }
            Err(error) => error,
        };
        // Doubling up to the refresh interval; with no copy to serve meanwhile, to at most
        // `NO_COPY_BACKOFF` (a provider down at start would otherwise be tried again an hour on).
        let most = match self.copy {
            Some(_) => refresh.max(FIRST_BACKOFF),
            None => refresh.max(FIRST_BACKOFF).min(NO_COPY_BACKOFF),
        };
        let backoff = match &self.failure {
            Some(f) => f.backoff.saturating_mul(2).min(most),
            None => FIRST_BACKOFF,
        };
        self.until = Some(later(now, backoff));
        let stale = self.copy.is_some();
        match FETCH_WARNINGS.allow_now() {
            Some(suppressed) if stale => {
                tracing::warn!(location = %shown(location), error = %error, retry_secs = backoff.as_secs(), suppressed, "playlist refresh failed; serving the previous copy")
            }
            Some(suppressed) => {
                tracing::warn!(location = %shown(location), error = %error, retry_secs = backoff.as_secs(), suppressed, "playlist fetch failed")
            }
            None => {
                tracing::debug!(location = %shown(location), error = %error, stale, "playlist fetch failed")
            }
        }
        self.failure = Some(Failure {
            error: error.clone(),
            backoff,
        });
        match &self.copy {
            Some(copy) => Ok(copy.clone()),
            None => Err(error),
        }
    }
}

/// `now + d`, or far ahead when that overflows (a refresh interval of `u64::MAX` seconds).
fn later(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(86_400 * 365 * 30)))
        .unwrap_or(now)
}

fn lock(state: &std::sync::Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl std::fmt::Debug for Playlist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Playlist")
            .field("location", &shown(&self.location))
            .field("refresh", &self.refresh)
            .finish_non_exhaustive()
    }
}

impl Playlist {
    pub fn new(location: String, refresh: Duration, upstream: Upstream) -> Result<Self, String> {
        source(&location)?;
        Ok(Self {
            location,
            refresh,
            upstream,
            state: Arc::default(),
            fetching: Arc::default(),
        })
    }

    /// The playlist text, loading or refreshing it if needed. After a failed fetch, the previous
    /// copy (or the failure) for a back-off; while a fetch is under way, the previous copy.
    pub async fn get(&self) -> Result<Bytes, String> {
        let seen = {
            let state = lock(&self.state);
            if let Some(answer) = state.standing() {
                return answer;
            }
            state.fetches
        };
        let fetching = match self.fetching.clone().try_lock_owned() {
            Ok(guard) => guard,
            Err(_) => {
                // Someone is fetching: the previous copy now, rather than a wait of up to
                // FETCH_TIMEOUT for its refresh. With none, wait for that fetch's outcome.
                if let Some(copy) = lock(&self.state).copy.clone() {
                    return Ok(copy);
                }
                self.fetching.clone().lock_owned().await
            }
        };
        {
            let state = lock(&self.state);
            // A fetch finished while this one waited: its outcome is the answer.
            let answer = match state.fetches != seen {
                true => state.answer(),
                false => state.standing(),
            };
            if let Some(answer) = answer {
                return answer;
            }
        }
        // In a task of its own, so the outcome is kept even if this request is dropped (its
        // client gave up): the next request takes it rather than starting over.
        let (location, upstream, refresh, state) = (
            self.location.clone(),
            self.upstream.clone(),
            self.refresh,
            self.state.clone(),
        );
        tokio::spawn(async move {
            let outcome = load(&location, &upstream).await;
            let answer = lock(&state).record(outcome, refresh, &location);
            drop(fetching);
            answer
        })
        .await
        .unwrap_or_else(|e| Err(format!("playlist fetch failed: {e}")))
    }
}

async fn load(location: &str, upstream: &Upstream) -> Result<Bytes, String> {
    match source(location)? {
        Source::File(path) => tokio::fs::read(&path)
            .await
            .map(Bytes::from)
            .map_err(|e| format!("cannot read playlist {}: {e}", path.display())),
        Source::Http => tokio::time::timeout(FETCH_TIMEOUT, fetch(location, upstream))
            .await
            .map_err(|_| "playlist fetch timed out".to_string())?,
    }
}

/// Through the shared upstream client, so its address guard, proxy routes and TLS apply.
async fn fetch(location: &str, upstream: &Upstream) -> Result<Bytes, String> {
    let shown = shown(location);
    let resp = upstream
        .fetch(location, http::HeaderMap::new(), MAX_PLAYLIST)
        .await
        .map_err(|e| format!("playlist fetch from {shown} failed: {e}"))?;
    if !resp.status.is_success() {
        return Err(format!(
            "playlist fetch from {shown}: status {}",
            resp.status
        ));
    }
    Ok(resp.body)
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
        let out = rewrite_playlist(input, "http://gw:8080", None, None, None, &[]);
        let want = "#EXTM3U x-tvg-url=\"http://epg/e.xml\"\r\n\
#EXTINF:-1 tvg-id=\"a\" group-title=\"News\" catchup=\"default\" catchup-source=\"http://gw:8080/rtsp/10.0.0.1/a?playseek={utc}\",A\r\n\
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
    fn rtsp_entries_get_catch_up() {
        let input = "#EXTM3U\n\
#EXTINF:-1 tvg-id=\"x,y\",News, late\n\
rtsp://10.0.0.1:554/ch1?a=1\n\
#EXTINF:-1 catchup=\"append\" catchup-source=\"?seek=${start}\",Kept\n\
rtsp://10.0.0.1/ch2\n\
#EXTINF:-1,NoQuery\n\
#EXTVLCOPT:network-caching=1000\n\
RTSP://h/ch3\n\
#EXTINF:-1,Multicast\n\
rtp://239.1.1.1:5000\n";
        let q = "playseek=${(b)yyyyMMddHHmmss}-${(e)yyyyMMddHHmmss}";
        let out = rewrite_playlist(input, "http://gw", None, Some(q), None, &[]);
        let want = "#EXTM3U\n\
#EXTINF:-1 tvg-id=\"x,y\" catchup=\"default\" catchup-source=\"http://gw/rtsp/10.0.0.1:554/ch1?a=1&playseek=${(b)yyyyMMddHHmmss}-${(e)yyyyMMddHHmmss}\",News, late\n\
http://gw/rtsp/10.0.0.1:554/ch1?a=1\n\
#EXTINF:-1 catchup=\"append\" catchup-source=\"?seek=${start}\",Kept\n\
http://gw/rtsp/10.0.0.1/ch2\n\
#EXTINF:-1 catchup=\"default\" catchup-source=\"http://gw/rtsp/h/ch3?playseek=${(b)yyyyMMddHHmmss}-${(e)yyyyMMddHHmmss}\",NoQuery\n\
#EXTVLCOPT:network-caching=1000\n\
http://gw/rtsp/h/ch3\n\
#EXTINF:-1,Multicast\n\
http://gw/rtp/239.1.1.1:5000\n";
        assert_eq!(out, want);
    }

    #[test]
    fn shown_hides_credentials() {
        assert_eq!(
            shown("http://user:pw@lists.example:8080/get.php?username=u&password=p"),
            "http://lists.example:8080/get.php"
        );
        assert_eq!(shown("https://h.example#frag"), "https://h.example");
        assert_eq!(shown("/etc/sluice/list.m3u"), "/etc/sluice/list.m3u");
        assert_eq!(shown("ht tp://a@b/c?d"), "ht tp://b/c");
        // Unencoded `/`, `?`, `#` in a password.
        assert_eq!(
            shown("http://user:pa/ss@host/list.m3u"),
            "http://host/list.m3u"
        );
        assert_eq!(shown("http://u:p?x@host/l.m3u"), "http://host/l.m3u");
        assert_eq!(shown("http://u:p#x@host/l.m3u"), "http://host/l.m3u");
        assert_eq!(shown("user:pw@host/l.m3u"), "host/l.m3u");
    }

    #[test]
    fn finds_and_replaces_the_guide_url() {
        let text = "#EXTM3U x-tvg-url=\"http://e/a.xml.gz,http://e/b.xml\" catchup=\"append\"\n#EXTINF:-1,A\nrtp://239.1.1.1:5000\n";
        assert_eq!(epg_url(text), Some("http://e/a.xml.gz"));
        assert_eq!(
            epg_url("#EXTM3U url-tvg=\"http://e/c.xml\"\n"),
            Some("http://e/c.xml")
        );
        assert_eq!(epg_url("#EXTM3U my-x-tvg-url=\"http://no\"\n"), None);
        assert_eq!(epg_url("#EXTINF:-1,A\n"), None);
        let out = rewrite_playlist(
            text,
            "http://gw",
            Some("http://gw/epg.xml.gz"),
            None,
            None,
            &[],
        );
        assert_eq!(
            out,
            "#EXTM3U x-tvg-url=\"http://gw/epg.xml.gz\" catchup=\"append\"\n#EXTINF:-1,A\nhttp://gw/rtp/239.1.1.1:5000\n"
        );
        let added = rewrite_playlist(
            "#EXTM3U\r\n",
            "http://gw",
            Some("http://gw/epg.xml.gz"),
            None,
            None,
            &[],
        );
        assert_eq!(added, "#EXTM3U x-tvg-url=\"http://gw/epg.xml.gz\"\r\n");
    }

    #[test]
    fn sealed_entries_carry_their_own_scope_and_query() {
        let seal = |path: &str, params: &[(String, String)]| {
            let q: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("/_token_[{path}|{}]", q.join("&"))
        };
        let input = "#EXTM3U\n\
#EXTINF:-1 catchup-source=\"rtsp://h/c?tvdr={utc}&x=1\",A\n\
udp://@239.1.1.1:5000?fcc=10.0.0.1:8027\n\
rtsp://h/c\n";
        let out = rewrite_playlist(input, "http://gw", None, None, Some(&seal), &[]);
        let want = "#EXTM3U\n\
#EXTINF:-1 catchup-source=\"http://gw/_token_[=/rtsp/h/c|x=1]/rtsp/h/c?tvdr={utc}\",A\n\
http://gw/_token_[=/udp/239.1.1.1:5000|fcc=10.0.0.1:8027]/udp/239.1.1.1:5000\n\
http://gw/_token_[=/rtsp/h/c|]/rtsp/h/c\n";
        assert_eq!(out, want);
    }

    /// The operator's seek param (`iptv.rtsp.seek_params`) stays outside the token with its
    /// placeholder, as `playseek` does; on a multicast entry it is an ordinary param, sealed.
    #[test]
    fn sealed_entries_leave_configured_seek_params_to_the_player() {
        let seal = |path: &str, params: &[(String, String)]| {
            let q: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("/_token_[{path}|{}]", q.join("&"))
        };
        let input = "#EXTM3U\n\
#EXTINF:-1 catchup-source=\"rtsp://h/c?id=7&starttime=${(b)yyyyMMddHHmmss}\",A\n\
rtsp://h/c?id=7\n\
udp://@239.1.1.1:5000?starttime=1\n";
        let seek = ["starttime".to_string()];
        let out = rewrite_playlist(input, "http://gw", None, None, Some(&seal), &seek);
        let want = "#EXTM3U\n\
#EXTINF:-1 catchup-source=\"http://gw/_token_[=/rtsp/h/c|id=7]/rtsp/h/c?starttime=${(b)yyyyMMddHHmmss}\",A\n\
http://gw/_token_[=/rtsp/h/c|id=7]/rtsp/h/c\n\
http://gw/_token_[=/udp/239.1.1.1:5000|starttime=1]/udp/239.1.1.1:5000\n";
        assert_eq!(out, want);
    }

    /// A failed load stands for a back-off that doubles with each failure in a row: the
    /// previous copy (or the failure) is the answer until then, without loading again, even
    /// with a refresh interval of 0 (load on every request). Before, every `get` loaded again.
    #[tokio::test(start_paused = true)]
    async fn a_failed_load_stands_for_a_back_off_that_doubles() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("list.m3u");
        let upstream = Upstream::new(
            &crate::upstream::UpstreamConfig::default(),
            &mut prometheus_client::registry::Registry::default(),
        )
        .unwrap();
        let list = |upstream: &Upstream, refresh: u64| {
            let location = path.to_str().unwrap().to_string();
            let refresh = Duration::from_secs(refresh);
            Playlist::new(location, refresh, upstream.clone()).unwrap()
        };
        let step = Duration::from_secs(11);

        // No copy: the failure is the answer for the back-off, then the file is read again.
        let p = list(&upstream, 0);
        let missing = p.get().await.unwrap_err();
        assert!(missing.contains("cannot read playlist"), "{missing}");
        std::fs::write(&path, "v1").unwrap();
        assert_eq!(p.get().await.unwrap_err(), missing);
        tokio::time::advance(step).await;
        assert_eq!(p.get().await.unwrap(), "v1");

        // A copy: served through the back-off after a failure, then the new one.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(p.get().await.unwrap(), "v1");
        std::fs::write(&path, "v2").unwrap();
        assert_eq!(p.get().await.unwrap(), "v1");
        tokio::time::advance(step).await;
        assert_eq!(p.get().await.unwrap(), "v2");

        // Failures in a row: 10 s, then 20 s, up to the refresh interval (here 60 s; with
        // 0, as above, the back-off stays 10 s).
        let p = list(&upstream, 60);
        assert_eq!(p.get().await.unwrap(), "v2");
        std::fs::remove_file(&path).unwrap();
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(p.get().await.unwrap(), "v2");
        tokio::time::advance(step).await;
        assert_eq!(p.get().await.unwrap(), "v2");
        std::fs::write(&path, "v3").unwrap();
        tokio::time::advance(step).await;
        assert_eq!(p.get().await.unwrap(), "v2", "the second back-off is 20 s");
        tokio::time::advance(step).await;
        assert_eq!(p.get().await.unwrap(), "v3");

        // No copy and a refresh of an hour: the back-off stops at 300 s (every request is a
        // 502 meanwhile), where it doubled to the hour.
        std::fs::remove_file(&path).unwrap();
        let p = list(&upstream, 3600);
        for _ in 0..8 {
            assert!(p.get().await.is_err());
            tokio::time::advance(Duration::from_secs(301)).await;
        }
        std::fs::write(&path, "v4").unwrap();
        tokio::time::advance(Duration::from_secs(301)).await;
        assert_eq!(p.get().await.unwrap(), "v4", "tried again within 300 s");
    }
}
