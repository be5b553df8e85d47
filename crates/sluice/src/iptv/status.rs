//! Live status: a JSON snapshot of hubs and subscribers, an HTML page, and a server-sent events
//! stream that pushes the snapshot every second.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;
use http::{header, HeaderValue, Method, Response};
use http_body::Frame;
use serde::Serialize;

use super::hub::Hub;
use super::registry::{lock, Registry};
use crate::body::{self, Body, BoxError};

#[derive(Debug, Serialize)]
pub struct Snapshot {
    pub subscribers: usize,
    pub hubs: Vec<HubStatus>,
}

#[derive(Debug, Serialize)]
pub struct HubStatus {
    pub channel: String,
    pub interface: String,
    pub subscribers: usize,
    pub age_seconds: u64,
    pub bitrate_in: u64,
    pub bitrate_out: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub datagrams_in: u64,
    pub buffered_bytes: usize,
    pub rtp_lost: u64,
    pub rtp_reordered: u64,
    pub rtp_duplicates: u64,
    pub malformed: u64,
    pub ts_cc_errors: u64,
    pub slow_skips: u64,
    pub slow_disconnects: u64,
    pub slow_released: u64,
    pub membership_refreshes: u64,
    pub membership_refresh_failures: u64,
    pub fec_recovered: u64,
    pub fec_unrecoverable: u64,
    /// Unix time of the last successful leave-and-rejoin, if any.
    pub last_rejoin_unix: Option<u64>,
    /// Seconds since then, for people reading the JSON.
    pub last_rejoin_seconds_ago: Option<u64>,
    /// Fast channel change of a hub started with `?fcc=`: server, type, phase, outcome, interface.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fcc: Option<super::hub::FccStatus>,
    pub clients: Vec<ClientStatus>,
}

#[derive(Debug, Serialize)]
pub struct ClientStatus {
    pub id: u64,
    pub peer: Option<String>,
    pub age_seconds: u64,
    pub bytes_out: u64,
    pub lag_bytes: Option<usize>,
    pub skips: u64,
}

/// Reads every counter once; cheap enough to run per request and per second per viewer.
pub fn snapshot(registry: &Registry) -> Snapshot {
    let mut hubs: Vec<HubStatus> = registry.hubs().iter().map(|h| hub_status(h)).collect();
    hubs.sort_by(|a, b| (&a.channel, &a.interface).cmp(&(&b.channel, &b.interface)));
    Snapshot {
        subscribers: registry.total(),
        hubs,
    }
}

fn hub_status(hub: &Hub) -> HubStatus {
    let m = &hub.metrics;
    let ring = lock(&hub.ring);
    let mut clients: Vec<ClientStatus> = lock(&hub.clients)
        .values()
        .map(|c| ClientStatus {
            id: c.id,
            peer: c.peer.map(|p| p.to_string()),
            age_seconds: c.started.elapsed().as_secs(),
            bytes_out: c.bytes_out.load(Ordering::Relaxed),
            lag_bytes: ring.lag(c.position.load(Ordering::Relaxed)),
            skips: c.skips.load(Ordering::Relaxed),
        })
        .collect();
    // Ids are unique: the unstable sort orders them the same and is smaller code.
    clients.sort_unstable_by_key(|c| c.id);
    let last_rejoin = Some(hub.last_rejoin.load(Ordering::Relaxed)).filter(|&t| t > 0);
    HubStatus {
        channel: m.labels.channel.clone(),
        interface: m.labels.interface.clone(),
        subscribers: hub.subscribers.load(Ordering::Acquire),
        age_seconds: hub.created.elapsed().as_secs(),
        bitrate_in: hub.rate_in.load(Ordering::Relaxed),
        bitrate_out: hub.rate_out.load(Ordering::Relaxed),
        bytes_in: m.received_bytes.get(),
        bytes_out: m.sent_bytes.get(),
        datagrams_in: m.received_datagrams.get(),
        buffered_bytes: ring.bytes(),
        rtp_lost: m.rtp_lost.get(),
        rtp_reordered: m.rtp_reordered.get(),
        rtp_duplicates: m.rtp_duplicates.get(),
        malformed: m.malformed.get(),
        ts_cc_errors: m.ts_cc_errors.get(),
        slow_skips: m.slow_skips.get(),
        slow_disconnects: m.slow_disconnects.get(),
        slow_released: m.slow_released.get(),
        membership_refreshes: m.refreshes.get(),
        membership_refresh_failures: m.refresh_failures.get(),
        fec_recovered: m.fec_recovered.get(),
        fec_unrecoverable: m.fec_unrecoverable.get(),
        last_rejoin_unix: last_rejoin,
        last_rejoin_seconds_ago: last_rejoin.map(|t| unix_now().saturating_sub(t)),
        fcc: hub.fcc.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        clients,
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub fn json(registry: &Registry) -> Bytes {
    serde_json::to_vec(&snapshot(registry))
        .unwrap_or_default()
        .into()
}

/// `data: {snapshot}` every `every`, until the viewer goes away.
pub fn events(
    registry: std::sync::Arc<Registry>,
    every: Duration,
) -> impl Stream<Item = Result<Frame<Bytes>, BoxError>> + Send {
    let ticker = tokio::time::interval(every);
    futures_util::stream::unfold((registry, ticker), |(registry, mut ticker)| async move {
        ticker.tick().await;
        let mut event = b"data: ".to_vec();
        event.extend_from_slice(&json(&registry));
        event.extend_from_slice(b"\n\n");
        Some((Ok(Frame::data(Bytes::from(event))), (registry, ticker)))
    })
}

/// The status page: a table refreshed from `/status/events`, its script and style in files of
/// their own beside it (`/status/status.js`, `/status/status.css`) so its Content-Security-Policy
/// allows no inline code. `{{dir}}` is where they are relative to the page's URL: `status/` from
/// `/status`, nothing from `/status/` (relative, so a token prefix in the path carries over).
const PAGE: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>sluice IPTV status</title>
<link rel="stylesheet" href="{{dir}}status.css">
<script src="{{dir}}status.js" defer></script>
</head><body>
<h1>IPTV gateway</h1>
<p id="summary">connecting…</p>
<div id="hubs"></div>
</body></html>
"#;

const STYLE: &str = r#"body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin-bottom:1.5em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th:first-child,td:first-child{text-align:left}
.bad{color:#b00;font-weight:600}
"#;

const SCRIPT: &str = r#"const rate = b => b >= 1e6 ? (b / 1e6).toFixed(2) + ' Mb/s' : (b / 1e3).toFixed(0) + ' kb/s';
const esc = s => String(s).replace(/[&<>"]/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c]));
const cell = (v, bad) => `<td class="${bad ? 'bad' : ''}">${esc(v)}</td>`;
function render(s) {
  document.getElementById('summary').textContent =
    `${s.hubs.length} channel(s), ${s.subscribers} subscriber(s)`;
  document.getElementById('hubs').innerHTML = s.hubs.map(h => `
    <h2>${esc(h.channel)} on ${esc(h.interface)}</h2>
    <table><tr><th>subscribers</th><th>in</th><th>out</th><th>lost</th><th>reordered</th>
    <th>duplicates</th><th>CC errors</th><th>slow skips</th><th>slow drops</th><th>refreshes</th><th>last rejoin</th></tr>
    <tr>${cell(h.subscribers)}${cell(rate(h.bitrate_in))}${cell(rate(h.bitrate_out))}
    ${cell(h.rtp_lost, h.rtp_lost)}${cell(h.rtp_reordered)}${cell(h.rtp_duplicates)}
    ${cell(h.ts_cc_errors, h.ts_cc_errors)}${cell(h.slow_skips, h.slow_skips)}
    ${cell(h.slow_disconnects, h.slow_disconnects)}
    ${cell(h.membership_refreshes + ' / ' + h.membership_refresh_failures + ' failed', h.membership_refresh_failures)}
    ${cell(h.last_rejoin_seconds_ago == null ? 'never' : h.last_rejoin_seconds_ago + ' s ago')}</tr></table>
    <table><tr><th>client</th><th>peer</th><th>age s</th><th>sent</th><th>lag</th><th>skips</th></tr>
    ${h.clients.map(c => `<tr>${cell(c.id)}${cell(c.peer ?? '-')}${cell(c.age_seconds)}
      ${cell((c.bytes_out / 1e6).toFixed(1) + ' MB')}${cell(c.lag_bytes ?? 'lapped')}${cell(c.skips, c.skips)}</tr>`).join('')}
    </table>`).join('');
}
// Relative to the page (this script runs in it), so a token prefix in the path
// (/_token_…/status) carries over.
const es = new EventSource(location.pathname.replace(/\/?$/, '') + '/events');
es.onmessage = e => render(JSON.parse(e.data));
es.onerror = () => document.getElementById('summary').textContent = 'disconnected, retrying…';
"#;

/// Same-origin script, style and event stream only; no inline code, plugins, frames or forms;
/// framed by no one. As the player's, less what playing media needs.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The page and its files: `/status`, `/status/`, `/status/status.js`, `/status/status.css`.
pub fn serves_page(path: &str) -> bool {
    matches!(
        path,
        "/status" | "/status/" | "/status/status.js" | "/status/status.css"
    )
}

/// One of [`serves_page`]'s paths (GET or HEAD, checked by the caller), with the headers the
/// other pages have: the policy above, `nosniff`, no referrer, no framing. No `Cache-Control`:
/// the answers behind the password are made `private, no-store`.
pub fn page(method: &Method, path: &str) -> Response<Body> {
    let (content_type, text): (&'static str, Bytes) = match path {
        "/status/status.js" => (
            "text/javascript; charset=utf-8",
            Bytes::from_static(SCRIPT.as_bytes()),
        ),
        "/status/status.css" => (
            "text/css; charset=utf-8",
            Bytes::from_static(STYLE.as_bytes()),
        ),
        "/status/" => (
            "text/html; charset=utf-8",
            PAGE.replace("{{dir}}", "").into(),
        ),
        _ => (
            "text/html; charset=utf-8",
            PAGE.replace("{{dir}}", "status/").into(),
        ),
    };
    let len = text.len();
    let payload = if method == Method::HEAD {
        body::empty()
    } else {
        body::full(text)
    };
    let mut resp = Response::new(payload);
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn text(resp: Response<Body>) -> String {
        use http_body_util::BodyExt;
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    /// Every `<script>` and stylesheet of the page names a same-origin file its policy allows,
    /// and none has a body; from `/status` and `/status/` alike, each resolves to a file served.
    #[tokio::test]
    async fn the_page_holds_no_inline_code_and_its_files_are_served() {
        for (path, dir) in [("/status", "/status/"), ("/status/", "/status/")] {
            let resp = page(&Method::GET, path);
            assert_eq!(resp.headers()[header::CONTENT_SECURITY_POLICY], CSP);
            let html = text(resp).await;
            assert!(!html.contains("<style"), "{html}");
            let scripts: Vec<&str> = html.split("<script").skip(1).collect();
            assert_eq!(scripts.len(), 1, "{html}");
            for tag in scripts {
                assert!(tag.contains("></script>"), "{path}: {tag}");
            }
            // Resolved as a browser would against the page's URL.
            let base = &path[..=path.rfind('/').unwrap()];
            for (attr, file) in [("src=\"", "status.js"), ("href=\"", "status.css")] {
                let at = html.find(attr).unwrap() + attr.len();
                let rel = &html[at..at + html[at..].find('"').unwrap()];
                let resolved = format!("{base}{rel}");
                assert_eq!(resolved, format!("{dir}{file}"), "{path}");
                assert!(serves_page(&resolved), "{resolved}");
            }
        }
        let js = text(page(&Method::GET, "/status/status.js")).await;
        assert!(js.contains("new EventSource("), "{js}");
        let css = text(page(&Method::GET, "/status/status.css")).await;
        assert!(css.contains(".bad{"), "{css}");
        // A HEAD gets the length, not the body.
        let head = page(&Method::HEAD, "/status/status.js");
        assert_eq!(
            head.headers()[header::CONTENT_LENGTH],
            SCRIPT.len().to_string()
        );
        assert!(text(head).await.is_empty());
    }
}
