//! The home page, `/playlist/builder` and `/url-generator`: static pages embedded in the binary,
//! served with a strict Content-Security-Policy (own scripts and styles only, no inline code, no
//! third-party origin). They fetch nothing upstream, so they need no password; the forms send it
//! only in the bodies or headers of the POSTs they make.

use crate::body::Incoming;
use http::{header, HeaderValue, Request, Response, StatusCode};

use crate::body::{self, Body};
use crate::error::ProxyError;

/// One embedded file.
struct Asset {
    body: &'static str,
    content_type: &'static str,
}

const HTML: &str = "text/html; charset=utf-8";

const INDEX: Asset = Asset {
    body: include_str!("pages/index.html"),
    content_type: HTML,
};
const BUILDER: Asset = Asset {
    body: include_str!("pages/builder.html"),
    content_type: HTML,
};
const URL_GENERATOR: Asset = Asset {
    body: include_str!("pages/url-generator.html"),
    content_type: HTML,
};
const CSS: Asset = Asset {
    body: include_str!("pages/pages.css"),
    content_type: "text/css; charset=utf-8",
};
const BUILDER_JS: Asset = Asset {
    body: include_str!("pages/builder.js"),
    content_type: "text/javascript; charset=utf-8",
};
const URL_GENERATOR_JS: Asset = Asset {
    body: include_str!("pages/url-generator.js"),
    content_type: "text/javascript; charset=utf-8",
};

const ICON: Asset = Asset {
    body: include_str!("pages/icon.svg"),
    content_type: "image/svg+xml",
};

/// Same-origin scripts, styles and fetches only; no plugins, frames, inline code or form posts
/// elsewhere. The pages hold a password field, so nothing may load from another origin.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

/// The page or asset at `path` (MediaFlow's paths and their `.html` aliases included).
fn asset(path: &str) -> Option<&'static Asset> {
    Some(match path {
        "/" => &INDEX,
        "/playlist/builder" | "/playlist_builder.html" => &BUILDER,
        "/url-generator" | "/url_generator.html" => &URL_GENERATOR,
        "/pages/pages.css" => &CSS,
        "/pages/builder.js" => &BUILDER_JS,
        "/pages/url-generator.js" => &URL_GENERATOR_JS,
        "/pages/icon.svg" => &ICON,
        _ => return None,
    })
}

/// Paths served here.
pub fn serves(path: &str) -> bool {
    asset(path).is_some()
}

/// One job besides the media proxy on the home page, as the composition root describes it (this
/// front end knows no other).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Job {
    pub title: String,
    /// One paragraph of plain text.
    pub summary: String,
    /// Column headings; no table when empty.
    pub columns: Vec<&'static str>,
    pub rows: Vec<Vec<String>>,
}

/// What the home page says beside the media proxy: the other jobs, and who may use this sluice.
#[derive(Debug, Clone, Default)]
pub struct Home {
    pub jobs: Vec<Job>,
}

/// Text made safe inside HTML elements and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The jobs as HTML: a heading, a paragraph and a table each.
fn render_jobs(jobs: &[Job]) -> String {
    let mut out = String::new();
    for job in jobs {
        out.push_str(&format!(
            "<h2>{}</h2>\n<p>{}</p>\n",
            escape(&job.title),
            escape(&job.summary)
        ));
        if job.columns.is_empty() || job.rows.is_empty() {
            continue;
        }
        out.push_str("<table>\n  <tr>");
        for c in &job.columns {
            out.push_str(&format!("<th>{}</th>", escape(c)));
        }
        out.push_str("</tr>\n");
        for row in &job.rows {
            out.push_str("  <tr>");
            for cell in row {
                out.push_str(&format!("<td>{}</td>", escape(cell)));
            }
            out.push_str("</tr>\n");
        }
        out.push_str("</table>\n");
    }
    out
}

/// Who may use this sluice: with a password, what needs it; without, that only this machine may.
fn access(password_set: bool) -> &'static str {
    if password_set {
        "Every endpoint that fetches on a client's behalf needs the API password or a token."
    } else {
        "No API password is set: nothing here needs one, and sluice answers only on loopback \
         addresses, for loopback host names (127.0.0.1, localhost). To serve other hosts, set one \
         (auth.api_password, SLUICE_AUTH_API_PASSWORD or --api-password-file)."
    }
}

/// Serves one of [`serves`]' paths; the home page tells `home` and whether a password is set.
pub fn handle(
    req: &Request<Incoming>,
    path: &str,
    home: &Home,
    password_set: bool,
) -> Result<Response<Body>, ProxyError> {
    super::require_get_or_head(req.method())?;
    let asset = asset(path).ok_or_else(|| {
        ProxyError::downstream(StatusCode::NOT_FOUND, "not_found", "no such page")
    })?;
    let text = if asset.content_type == HTML {
        let text = asset.body.replace("{{version}}", env!("CARGO_PKG_VERSION"));
        if path == "/" {
            text.replace("{{jobs}}", &render_jobs(&home.jobs))
                .replace("{{access}}", access(password_set))
        } else {
            text
        }
    } else {
        asset.body.to_string()
    };
    let len = text.len();
    let mut resp = Response::new(body::full_unless_head(req.method(), text));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
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
    // Small, and changing with every release: revalidate rather than serve an old script.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_load_nothing_from_elsewhere_and_run_no_inline_code() {
        for path in [
            "/",
            "/playlist/builder",
            "/url-generator",
            "/pages/pages.css",
            "/pages/builder.js",
            "/pages/url-generator.js",
        ] {
            let body = asset(path).unwrap().body;
            for external in ["src=\"http", "src=\"//", "href=\"http", "href=\"//"] {
                assert!(
                    !body.contains(external),
                    "{path} loads from elsewhere: {external}"
                );
            }
            if path.ends_with(".css") {
                assert!(
                    !body.contains("url(") && !body.contains("@import"),
                    "{path}"
                );
            }
            assert!(!body.contains(" style="), "{path} has an inline style");
            assert!(!body.contains("localStorage"), "{path} stores something");
            assert!(!body.contains("sessionStorage"), "{path} stores something");
            assert!(!body.contains("document.cookie"), "{path} stores something");
            if body.starts_with("<!doctype") {
                // Every <script> names a same-origin file; none has a body.
                for tag in body.split("<script").skip(1) {
                    assert!(tag.starts_with(" src=\"/pages/"), "{path}: {tag}");
                    assert!(tag.contains("></script>"), "{path}: {tag}");
                }
                assert!(!has_inline_handler(body), "{path} has an inline handler");
            }
        }
        assert!(!serves("/pages/"));
        assert!(has_inline_handler("<a onclick=\"x()\">"));
        assert!(!has_inline_handler("<p>into one list</p>"));
        assert!(!serves("/playlist/playlist"));
    }

    /// An ` on<event>=` attribute.
    fn has_inline_handler(html: &str) -> bool {
        html.match_indices(" on").any(|(i, _)| {
            let rest = &html[i + 3..];
            let name_len = rest.bytes().take_while(u8::is_ascii_lowercase).count();
            name_len > 0 && rest[name_len..].starts_with('=')
        })
    }
}
