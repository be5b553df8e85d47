//! `/player`: a page that plays any channel of `/playlist.m3u` in a browser through the HLS
//! output, with the guide's current programme. Embedded in the binary with hls.js (the light
//! build from npm, refreshed by `scripts/vendor-hls-js`), so nothing loads from a CDN; served
//! with a Content-Security-Policy that allows this origin only (and `blob:` media, which
//! Media Source Extensions need).

use http::{header, HeaderMap, HeaderValue, Method, Response, StatusCode};

use crate::body::{self, Body};

const PAGE: &str = include_str!("player/index.html");
const SCRIPT: &str = include_str!("player/player.js");
const STYLE: &str = include_str!("player/player.css");
const ICON: &str = include_str!("player/icon.svg");
/// hls.js, gzipped once by `scripts/vendor-hls-js`.
const HLS_JS_GZ: &[u8] = include_bytes!("player/hls.light.min.js.gz");
/// Largest hls.js accepted when a client without gzip needs it inflated.
const HLS_JS_MAX: usize = 4 << 20;

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   media-src 'self' blob:; worker-src 'self' blob:; img-src 'self'; \
                   base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Paths served here.
pub fn serves(path: &str) -> bool {
    matches!(
        path,
        "/player"
            | "/player/"
            | "/player/player.js"
            | "/player/player.css"
            | "/player/icon.svg"
            | "/player/hls.js"
    )
}

/// Serves one of [`serves`]' paths (GET or HEAD, checked by the caller).
pub fn handle(method: &Method, path: &str, headers: &HeaderMap) -> Response<Body> {
    let (content_type, bytes, gzipped): (&'static str, bytes::Bytes, bool) = match path {
        "/player/" => {
            // The page's URLs are relative to `/player`.
            let mut resp = Response::new(body::empty());
            *resp.status_mut() = StatusCode::MOVED_PERMANENTLY;
            resp.headers_mut()
                .insert(header::LOCATION, HeaderValue::from_static("../player"));
            return resp;
        }
        "/player" => (
            "text/html; charset=utf-8",
            PAGE.replace("{{version}}", env!("CARGO_PKG_VERSION"))
                .into(),
            false,
        ),
        "/player/player.js" => (
            "text/javascript; charset=utf-8",
            bytes::Bytes::from_static(SCRIPT.as_bytes()),
            false,
        ),
        "/player/player.css" => (
            "text/css; charset=utf-8",
            bytes::Bytes::from_static(STYLE.as_bytes()),
            false,
        ),
        "/player/icon.svg" => (
            "image/svg+xml",
            bytes::Bytes::from_static(ICON.as_bytes()),
            false,
        ),
        _ if accepts_gzip(headers) => (
            "text/javascript; charset=utf-8",
            bytes::Bytes::from_static(HLS_JS_GZ),
            true,
        ),
        _ => match hls_js_inflated() {
            Ok(js) => ("text/javascript; charset=utf-8", js, false),
            Err(e) => {
                return super::text(StatusCode::INTERNAL_SERVER_ERROR, &format!("hls.js: {e}\n"))
            }
        },
    };
    let len = bytes.len();
    let payload = if method == Method::HEAD {
        body::empty()
    } else {
        body::full(bytes)
    };
    let mut resp = Response::new(payload);
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    if gzipped {
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    h.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
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
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// hls.js inflated for clients without gzip, once: inflating it per request cost each of them
/// the work of turning 120 KB into 389 KB (and as much memory), as often as it liked to ask.
fn hls_js_inflated() -> Result<bytes::Bytes, String> {
    static INFLATED: std::sync::OnceLock<Result<bytes::Bytes, String>> = std::sync::OnceLock::new();
    INFLATED
        .get_or_init(|| {
            sluice_media::gzip::decompress(HLS_JS_GZ, HLS_JS_MAX)
                .map(bytes::Bytes::from)
                .map_err(|e| e.to_string())
        })
        .clone()
}

/// `Accept-Encoding` lists gzip (with a non-zero q).
fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';');
            let name = parts.next().unwrap_or("").trim();
            let q_zero = parts.any(|p| {
                p.trim()
                    .strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    == Some(0.0)
            });
            (name.eq_ignore_ascii_case("gzip") || name == "*") && !q_zero
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_nothing_from_elsewhere_and_runs_no_inline_code() {
        for text in [PAGE, SCRIPT, STYLE] {
            for external in [
                "http://",
                "https://",
                "src=\"//",
                "href=\"//",
                "<script>",
                "style=\"",
            ] {
                assert!(!text.contains(external), "{external}");
            }
        }
    }

    #[test]
    fn hls_js_is_gzipped_only_for_clients_that_take_it() {
        let mut h = HeaderMap::new();
        h.insert(
            header::ACCEPT_ENCODING,
            "gzip, deflate, br".parse().unwrap(),
        );
        assert!(accepts_gzip(&h));
        h.insert(header::ACCEPT_ENCODING, "br, gzip;q=0".parse().unwrap());
        assert!(!accepts_gzip(&h));
        let plain = handle(&Method::GET, "/player/hls.js", &HeaderMap::new());
        assert_eq!(plain.status(), StatusCode::OK);
        assert!(plain.headers().get(header::CONTENT_ENCODING).is_none());
        let js = sluice_media::gzip::decompress(HLS_JS_GZ, HLS_JS_MAX).unwrap();
        assert_eq!(
            plain.headers()[header::CONTENT_LENGTH],
            js.len().to_string()
        );
        assert!(String::from_utf8_lossy(&js[..200]).contains("function"));
    }

    /// The body of a `handle` answer, as the one buffer it was given.
    fn body_of(resp: Response<Body>) -> bytes::Bytes {
        use http_body_util::BodyExt;
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let frame = rt.block_on(resp.into_body().frame()).unwrap().unwrap();
        frame.into_data().unwrap()
    }

    /// hls.js for a client without gzip is the same bytes as inflating it on the spot, from
    /// one buffer inflated once (each request inflated 120 KB into 389 KB of its own before).
    #[test]
    fn hls_js_is_inflated_once_for_clients_without_gzip() {
        let want = sluice_media::gzip::decompress(HLS_JS_GZ, HLS_JS_MAX).unwrap();
        let first = body_of(handle(&Method::GET, "/player/hls.js", &HeaderMap::new()));
        let second = body_of(handle(&Method::GET, "/player/hls.js", &HeaderMap::new()));
        assert_eq!(&first[..], &want[..]);
        assert_eq!(&second[..], &want[..]);
        assert_eq!(
            first.as_ptr(),
            second.as_ptr(),
            "each request inflated a copy of its own"
        );
        // Gzip-taking clients still get the embedded bytes as they are.
        let mut gz = HeaderMap::new();
        gz.insert(header::ACCEPT_ENCODING, "gzip".parse().unwrap());
        let gzipped = body_of(handle(&Method::GET, "/player/hls.js", &gz));
        assert_eq!(&gzipped[..], HLS_JS_GZ);
    }
}
