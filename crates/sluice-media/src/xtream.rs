//! Xtream Codes (XC) API: the usernames that carry the upstream server, the path shapes of XC
//! requests, and (in `rewrite`) XC responses pointed back through the proxy. No I/O.
//!
//! An XC player only knows a server, a username and a password. To proxy many providers
//! statelessly the username carries the provider too, in MediaFlow's two formats:
//! - base64 (either alphabet, padding optional) of `{server}:{user}[:{api_password}]`, where the
//!   server may include a port (`http://host:8080:user:pw`);
//! - the legacy colon form `{base64(server)}:{user}[:{api_password}]`.

mod json_cost;
pub mod rewrite;

use base64::Engine;
use percent_encoding::percent_decode_str;

/// The provider account an XC username names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// `scheme://host[:port][/path]`, without a trailing slash.
    pub server: String,
    /// The username the provider knows.
    pub username: String,
    /// The proxy's API password, when the username carries one (MediaFlow's formats do).
    pub api_password: Option<String>,
}

/// Why a username or path is not an XC request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum XtreamError {
    #[error("the XC username is neither base64 of `server:user[:api_password]` nor `base64(server):user[:api_password]`")]
    Username,
    #[error("the upstream XC server is not an http(s) URL with a host")]
    Server,
    #[error("the XC username names no provider user")]
    EmptyUser,
}

/// Parses an XC username in either MediaFlow format.
pub fn parse_username(raw: &str) -> Result<Account, XtreamError> {
    if let Some(decoded) = decode_b64(raw).filter(|d| d.contains("://")) {
        return parse_decoded(&decoded);
    }
    let mut parts = raw.split(':');
    let (Some(server), Some(user)) = (parts.next(), parts.next()) else {
        return Err(XtreamError::Username);
    };
    let api_password = parts.next().filter(|p| !p.is_empty()).map(str::to_string);
    if parts.next().is_some() {
        return Err(XtreamError::Username);
    }
    let server = decode_b64(server).ok_or(XtreamError::Username)?;
    account(&server, user, api_password)
}

/// `scheme://host[:port]:user[:api_password]` after base64 decoding.
fn parse_decoded(decoded: &str) -> Result<Account, XtreamError> {
    let (scheme, rest) = decoded.split_once("://").ok_or(XtreamError::Username)?;
    let parts: Vec<&str> = rest.split(':').collect();
    let is_port = |p: &str| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit());
    let (host, user, password) = match parts.as_slice() {
        [host, user] => (host.to_string(), *user, None),
        [host, port, user] if is_port(port) => (format!("{host}:{port}"), *user, None),
        [host, user, pw] => (host.to_string(), *user, Some(*pw)),
        [host, port, user, pw] if is_port(port) => (format!("{host}:{port}"), *user, Some(*pw)),
        _ => return Err(XtreamError::Username),
    };
    let password = password.filter(|p| !p.is_empty()).map(str::to_string);
    account(&format!("{scheme}://{host}"), user, password)
}

fn account(server: &str, user: &str, api_password: Option<String>) -> Result<Account, XtreamError> {
    let server = canonical_server(server)?;
    if user.is_empty() {
        return Err(XtreamError::EmptyUser);
    }
    Ok(Account {
        server,
        username: user.to_string(),
        api_password,
    })
}

/// An `http(s)` XC server in one spelling for each server: as the URL standard serialises it
/// (scheme and host in lower case, the scheme's default port dropped, dot segments resolved),
/// without a trailing slash. `HTTP://XC`, `http://xc:80` and `http://xc/` are one server, so
/// what is sealed for it (and counted by it) does not depend on how a login wrote it.
pub fn canonical_server(server: &str) -> Result<String, XtreamError> {
    let url = url::Url::parse(server.trim_end_matches('/')).map_err(|_| XtreamError::Server)?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(XtreamError::Server);
    }
    let text = url.as_str();
    let text = match (url.query(), url.fragment()) {
        (None, None) => text.trim_end_matches('/'),
        _ => text,
    };
    Ok(text.to_string())
}

/// Base64 in either alphabet, padding optional, to UTF-8; `None` otherwise.
fn decode_b64(s: &str) -> Option<String> {
    if s.is_empty() || !s.is_ascii() {
        return None;
    }
    let normalized: String = s
        .trim_end_matches('=')
        .chars()
        .map(|c| match c {
            '-' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(normalized)
        .ok()?;
    String::from_utf8(bytes).ok()
}

/// The username MediaFlow writes for an account without a password: base64url of
/// `server:user`, unpadded. Used only when the proxy has no password to protect.
pub fn encode_username(server: &str, user: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{server}:{user}"))
}

/// The XC API scripts; their username and password travel in the query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/player_api.php`: login, categories, stream lists.
    Player,
    /// `/xmltv.php`: the EPG.
    Xmltv,
    /// `/get.php`: the M3U playlist.
    Playlist,
    /// `/panel_api.php`: the older combined API.
    Panel,
    /// `/streaming/timeshift.php`: catch-up in query form.
    Timeshift,
}

impl Api {
    /// The script's path at the provider, without the leading slash.
    pub fn script(self) -> &'static str {
        match self {
            Api::Player => "player_api.php",
            Api::Xmltv => "xmltv.php",
            Api::Playlist => "get.php",
            Api::Panel => "panel_api.php",
            Api::Timeshift => "streaming/timeshift.php",
        }
    }
}

/// An XC request, by the shape of its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XcPath {
    /// A script taking `username` and `password` in the query.
    Api(Api),
    /// A stream URL with the credentials in the path:
    /// `/{prefix}{user}/{password}/{tail}`, e.g. prefix `live/`, `timeshift/`, `hlsr/{session}/`
    /// or empty for the short `/{user}/{password}/{id}[.ext]` form.
    Stream {
        prefix: String,
        user: String,
        password: String,
        tail: String,
    },
    /// `/hls/{session}/{id}.m3u8`: no credentials; the server comes from the `upstream` query
    /// parameter (base64), as in MediaFlow.
    HlsSession { rest: String },
}

impl XcPath {
    /// The path at the provider for the provider's own username.
    pub fn upstream_path(&self, real_user: &str) -> String {
        match self {
            XcPath::Api(api) => api.script().to_string(),
            XcPath::Stream {
                prefix,
                password,
                tail,
                ..
            } => {
                let enc = |s: &str| percent_encoding::utf8_percent_encode(s, SEGMENT).to_string();
                format!("{prefix}{}/{}/{tail}", enc(real_user), enc(password))
            }
            XcPath::HlsSession { rest } => format!("hls/{rest}"),
        }
    }
}

/// Characters escaped inside one path segment: the URL standard's path set (so the URL crate
/// leaves the segment as written) plus `%`, `/` and `\`, which it would read as separators.
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b'\\')
    .add(b'?')
    .add(b'<')
    .add(b'>')
    .add(b'`')
    .add(b'{')
    .add(b'}');

/// Recognises an XC path; `None` for anything else (the caller answers 404).
pub fn parse_path(path: &str) -> Option<XcPath> {
    let api = match path {
        "/player_api.php" => Some(Api::Player),
        "/xmltv.php" => Some(Api::Xmltv),
        "/get.php" => Some(Api::Playlist),
        "/panel_api.php" => Some(Api::Panel),
        "/streaming/timeshift.php" => Some(Api::Timeshift),
        _ => None,
    };
    if let Some(api) = api {
        return Some(XcPath::Api(api));
    }
    let rest = path.strip_prefix('/')?;
    let segs: Vec<&str> = rest.split('/').collect();
    // The URL crate resolves `%2e%2e` as `..` too: a dot segment in any spelling would walk the
    // upstream request out of the XC shape to any path on the provider's host.
    if segs
        .iter()
        .any(|s| s.is_empty() || matches!(&*decode(s), "." | ".."))
    {
        return None;
    }
    let stream = |prefix: String, user: &str, password: &str, tail: &[&str]| {
        // The user and password are decoded and escaped again; the rest goes up as written, so
        // an escaped separator in it would be a segment the panel or the URL crate splits.
        if !tail.iter().all(|s| is_one_segment(s)) {
            return None;
        }
        Some(XcPath::Stream {
            prefix,
            user: decode(user),
            password: decode(password),
            tail: tail.join("/"),
        })
    };
    match segs.as_slice() {
        [kind @ ("live" | "movie" | "series"), user, pw, id] => {
            stream(format!("{kind}/"), user, pw, &[id])
        }
        // /timeshift/{user}/{pw}/{duration}/{start}/{id}.{ext}
        ["timeshift", user, pw, tail @ ..] if tail.len() == 3 => {
            stream("timeshift/".into(), user, pw, tail)
        }
        // /hlsr/{session}/{user}/{pw}/{channel}/{start}/{end}/index.m3u8
        ["hlsr", session, user, pw, tail @ ..] if tail.len() == 4 && is_one_segment(session) => {
            stream(format!("hlsr/{session}/"), user, pw, tail)
        }
        ["hls", session, file]
            if file.ends_with(".m3u8") && is_one_segment(session) && is_one_segment(file) =>
        {
            Some(XcPath::HlsSession {
                rest: format!("{session}/{file}"),
            })
        }
        [user, pw, id] if is_stream_id(id) => stream(String::new(), user, pw, &[id]),
        _ => None,
    }
}

/// `123` or `123.ts`: the short form's last segment, so that `/a/b/c` stays a 404.
fn is_stream_id(seg: &str) -> bool {
    let id = seg.split_once('.').map_or(seg, |(id, _)| id);
    !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `seg` stays one segment however it is read: no `/` or `\`, escaped or not (the URL
/// crate reads `\` as `/` in http URLs).
fn is_one_segment(seg: &str) -> bool {
    !decode(seg).contains(['/', '\\'])
}

fn decode(seg: &str) -> String {
    percent_decode_str(seg).decode_utf8_lossy().into_owned()
}

/// The extension of a stream path's last segment (`m3u8`, `ts`, ...), lowercased.
pub fn extension(tail: &str) -> Option<String> {
    let last = tail.rsplit('/').next()?;
    last.rsplit_once('.')
        .map(|(_, ext)| ext.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
    }

    #[test]
    fn base64_formats() {
        let acc = parse_username(&b64("http://xc.example:8080:alice:secret")).unwrap();
        assert_eq!(
            acc,
            Account {
                server: "http://xc.example:8080".into(),
                username: "alice".into(),
                api_password: Some("secret".into()),
            }
        );
        let acc = parse_username(&b64("https://xc.example:alice")).unwrap();
        assert_eq!(acc.server, "https://xc.example");
        assert_eq!(acc.api_password, None);
        let acc = parse_username(&b64("http://xc.example:8080:alice")).unwrap();
        assert_eq!(acc.server, "http://xc.example:8080");
        assert_eq!(acc.username, "alice");
        let acc = parse_username(&b64("http://xc.example:alice:pw")).unwrap();
        assert_eq!(acc.username, "alice");
        assert_eq!(acc.api_password.as_deref(), Some("pw"));
        // Standard alphabet with padding works too.
        let std = base64::engine::general_purpose::STANDARD.encode("http://h:9:u:p");
        assert_eq!(parse_username(&std).unwrap().server, "http://h:9");
    }

    #[test]
    fn legacy_colon_format() {
        let raw = format!("{}:bob:pw", b64("http://xc.example:25461/"));
        let acc = parse_username(&raw).unwrap();
        assert_eq!(acc.server, "http://xc.example:25461");
        assert_eq!(acc.username, "bob");
        assert_eq!(acc.api_password.as_deref(), Some("pw"));
        let raw = format!("{}:bob", b64("http://xc.example"));
        assert_eq!(parse_username(&raw).unwrap().api_password, None);
    }

    /// Every spelling of one server is one `server`: scheme and host in lower case, the default
    /// port dropped, no trailing slash; a path is kept (in the URL standard's form).
    #[test]
    fn a_server_has_one_spelling() {
        for spelled in [
            "http://xc.example",
            "HTTP://XC.Example",
            "http://xc.example:80",
            "http://xc.example/",
            "Http://XC.EXAMPLE:80//",
        ] {
            let raw = format!("{}:alice:pw", b64(spelled));
            assert_eq!(parse_username(&raw).unwrap().server, "http://xc.example");
        }
        for spelled in [
            "HTTP://XC.Example:alice:pw",
            "http://xc.example:80:alice:pw",
        ] {
            let acc = parse_username(&b64(spelled)).unwrap();
            assert_eq!(acc.server, "http://xc.example", "{spelled}");
        }
        for (spelled, want) in [
            ("HTTPS://xc.example:443/", "https://xc.example"),
            ("https://xc.example:8443", "https://xc.example:8443"),
            (
                "http://XC.example:8080/Panel/",
                "http://xc.example:8080/Panel",
            ),
            ("http://[::1]:80", "http://[::1]"),
        ] {
            assert_eq!(canonical_server(spelled).as_deref(), Ok(want), "{spelled}");
        }
    }

    #[test]
    fn bad_usernames() {
        assert_eq!(parse_username("alice"), Err(XtreamError::Username));
        assert_eq!(parse_username("a:b:c:d"), Err(XtreamError::Username));
        assert_eq!(
            parse_username(&b64("ftp://h:u:p")),
            Err(XtreamError::Server)
        );
        assert_eq!(
            parse_username(&b64("http://h:1:2:3:4")),
            Err(XtreamError::Username)
        );
        assert_eq!(
            parse_username(&b64("http://h:")),
            Err(XtreamError::EmptyUser)
        );
        assert!(parse_username("").is_err());
        assert!(parse_username("ü:ö").is_err());
    }

    #[test]
    fn paths() {
        assert_eq!(
            parse_path("/player_api.php"),
            Some(XcPath::Api(Api::Player))
        );
        let p = parse_path("/movie/U/pw/42.mkv").unwrap();
        assert_eq!(p.upstream_path("bob"), "movie/bob/pw/42.mkv");
        let p = parse_path("/timeshift/U/pw/60/2026-01-01:10-00/7.ts").unwrap();
        assert_eq!(
            p.upstream_path("bob"),
            "timeshift/bob/pw/60/2026-01-01:10-00/7.ts"
        );
        let p = parse_path("/hlsr/sess/U/pw/7/100/200/index.m3u8").unwrap();
        assert_eq!(
            p.upstream_path("bob"),
            "hlsr/sess/bob/pw/7/100/200/index.m3u8"
        );
        let p = parse_path("/U/p%2Fw/42").unwrap();
        assert_eq!(p.upstream_path("b b"), "b%20b/p%2Fw/42");
        assert_eq!(
            parse_path("/hls/abc/7.m3u8"),
            Some(XcPath::HlsSession {
                rest: "abc/7.m3u8".into()
            })
        );
        assert_eq!(parse_path("/a/b/c"), None);
        assert_eq!(parse_path("/live/u/p"), None);
        assert_eq!(parse_path("/live/u/../1.ts"), None);
        assert_eq!(parse_path("/live//p/1.ts"), None);
        assert_eq!(parse_path("/proxy/stream/x"), None);
        assert_eq!(extension("7.M3U8").as_deref(), Some("m3u8"));
        assert_eq!(extension("60/x/7"), None);
    }

    #[test]
    fn escaped_dot_segments_and_separators_are_refused() {
        for path in [
            "/timeshift/U/pw/%2e%2e/%2e%2e/admin%2Fx.php",
            "/timeshift/U/pw/60/%2E%2e/7.ts",
            "/timeshift/U/pw/60/.%2e/7.ts",
            "/live/U/%2e/7.ts",
            "/live/%2e%2e/pw/7.ts",
            "/movie/U/pw/%2e%2e",
            "/%2e%2e/pw/7",
            "/hlsr/%2e%2e/U/pw/7/1/2/index.m3u8",
            "/hls/%2e%2e/7.m3u8",
            // Separators the URL crate or the panel would split on.
            "/timeshift/U/pw/60/a%2Fb/7.ts",
            "/timeshift/U/pw/60/a%5Cb/7.ts",
            "/timeshift/U/pw/60/a\\b/7.ts",
            "/hlsr/s%2Fx/U/pw/7/1/2/index.m3u8",
            "/hls/a%5c/index.m3u8",
        ] {
            assert_eq!(parse_path(path), None, "{path}");
        }
        // An escaped separator in the user or password is escaped again on the way up, so it
        // stays one segment there.
        let p = parse_path("/live/U/p%5Cw%2F/7.ts").unwrap();
        assert_eq!(p.upstream_path("a{b}`"), "live/a%7Bb%7D%60/p%5Cw%2F/7.ts");
        // A dot inside a segment is ordinary.
        assert!(parse_path("/timeshift/U/pw/60/2026-01-01:10.00/7.ts").is_some());
    }
}
