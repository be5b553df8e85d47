//! XC responses pointed back through the proxy: stream URLs in JSON, escaped JSON and M3U get the
//! proxy's origin and the proxy-issued username; the login answer names the proxy as the server.
//!
//! Only URLs whose path has the XC credential shape for the real user are touched, at any host and
//! in any spelling of it (`/live|movie|series|timeshift/{user}/...`, `/hlsr/{s}/{user}/...`,
//! `/{user}/{pw}/{id}`, and any path with `username={user}` in its query); logos and other assets
//! stay direct.

use std::borrow::Cow;

use serde_json::Value;

use super::{is_stream_id, json_cost};

/// Largest login answer parsed as JSON. A real one (`user_info` and `server_info`) is about
/// 2 KB; a parsed JSON value costs many times its text (a body of `[0,0,0,...]` is one value per
/// two bytes), so a provider's oversized answer would otherwise cost GiBs.
pub const MAX_LOGIN_BYTES: usize = 1024 * 1024;

/// Longest run after the provider's origin read as a stream URL (a real one is well under 1 KB).
const MAX_URL: usize = 16 * 1024;

/// What to rewrite, and into what.
#[derive(Debug, Clone)]
pub struct Rewriter<'a> {
    /// The provider's origin, `scheme://host[:port]`.
    pub upstream_origin: &'a str,
    /// The provider's username, as it appears in its URLs.
    pub real_user: &'a str,
    /// The proxy's origin as the client addressed it, `scheme://host[:port]`.
    pub public_origin: &'a str,
    /// The username the client uses with the proxy (an opaque token).
    pub public_user: &'a str,
}

impl Rewriter<'_> {
    /// Rewrites every XC stream URL in `body`, in plain (`http://`) and JSON-escaped
    /// (`http:\/\/`) form. No bound on the output: for trusted text (see
    /// [`Rewriter::rewrite_text_within`]).
    pub fn rewrite_text(&self, body: &str) -> String {
        self.rewrite_text_within(body, &mut |_| true)
            .map(Cow::into_owned)
            .unwrap_or_default()
    }

    /// [`Rewriter::rewrite_text`] for a provider's answer: each rewrite is measured first and its
    /// exact size asked of `grant` before it is allocated, so the caller can bound and charge
    /// what the rewrites hold (a short `http://a/u/p/1` grows ten-fold or more into the public
    /// origin and a sealed username). `None` when `grant` refuses; `Borrowed` when nothing in
    /// `body` changes.
    pub fn rewrite_text_within<'a>(
        &self,
        body: &'a str,
        grant: &mut dyn FnMut(usize) -> bool,
    ) -> Option<Cow<'a, str>> {
        let plain = match self.rewrite_form(body, false, grant)? {
            Cow::Borrowed(same) => return self.rewrite_form(same, true, grant),
            Cow::Owned(plain) => plain,
        };
        // Both forms are held at once here; the caller was asked for both.
        let escaped = match self.rewrite_form(&plain, true, grant)? {
            Cow::Owned(escaped) => Some(escaped),
            Cow::Borrowed(_) => None,
        };
        Some(Cow::Owned(escaped.unwrap_or(plain)))
    }

    /// One form's rewrite: measured, granted, then written into a buffer of exactly its size.
    fn rewrite_form<'a>(
        &self,
        body: &'a str,
        escaped: bool,
        grant: &mut dyn FnMut(usize) -> bool,
    ) -> Option<Cow<'a, str>> {
        let mut len = 0usize;
        if !self.scan_form(body, escaped, &mut |piece| len += piece.len()) {
            return Some(Cow::Borrowed(body));
        }
        if !grant(len) {
            return None;
        }
        let mut out = String::with_capacity(len);
        self.scan_form(body, escaped, &mut |piece| out.push_str(piece));
        Some(Cow::Owned(out))
    }

    /// Walks `body` handing each piece of its rewrite to `emit`; whether any URL was rewritten.
    ///
    /// Every absolute `http(s)` URL is looked at, in any letter case and at any host: a provider
    /// writes its own origin in more than one spelling (`HTTP://XC:80/...`, `https://xc:443/...`)
    /// and may name a CDN or the panel's own host beside it, and each of those would hand the
    /// client the real username (see [`Rewriter::rewrite_path`] for what is rewritten).
    fn scan_form(&self, body: &str, escaped: bool, emit: &mut dyn FnMut(&str)) -> bool {
        let provider = url::Url::parse(self.upstream_origin)
            .ok()
            .map(|u| u.origin())
            .filter(url::Origin::is_tuple);
        let bytes = body.as_bytes();
        let (mut changed, mut from, mut at) = (false, 0, 0);
        while let Some(i) = memchr::memchr2(b'h', b'H', &bytes[at..]) {
            let start = at + i;
            let Some(after) = scheme_end(bytes, start, escaped) else {
                at = start + 1;
                continue;
            };
            let end = body[after..]
                .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>'))
                .map_or(body.len(), |e| after + e);
            if let Some(url) = self.rewrite_url(&body[start..end], escaped, provider.as_ref()) {
                emit(&body[from..start]);
                emit(&url);
                from = end;
                changed = true;
            }
            at = end;
        }
        emit(&body[from..]);
        changed
    }

    /// The public URL for an absolute URL `run` (in the form it was found in), or `None` when it
    /// is not an XC stream URL for this user. A run longer than any real URL is left as it is,
    /// so the copies made here stay small however the answer is built.
    fn rewrite_url(
        &self,
        run: &str,
        escaped: bool,
        provider: Option<&url::Origin>,
    ) -> Option<String> {
        if run.len() > MAX_URL {
            return None;
        }
        let unescaped = if escaped {
            Cow::Owned(run.replace("\\/", "/"))
        } else {
            Cow::Borrowed(run)
        };
        let (scheme, rest) = unescaped.split_once("://")?;
        let host_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, path_query) = rest.split_at(host_end);
        if authority.is_empty() || !path_query.starts_with(['/', '?']) {
            return None;
        }
        // Compared parsed: scheme and host in lower case, the scheme's default port filled in.
        let origin = url::Url::parse(&format!("{scheme}://{authority}/"))
            .ok()
            .map(|u| u.origin());
        let at_provider = origin.is_some() && origin.as_ref() == provider;
        let path = self.rewrite_path_at(path_query, at_provider)?;
        let url = format!("{}{path}", self.public_origin);
        Some(if escaped {
            url.replace('/', "\\/")
        } else {
            url
        })
    }

    /// The proxy's path for an upstream path (with query) at the provider's origin, or `None`
    /// when it is not an XC stream URL for this user.
    pub fn rewrite_path(&self, path_query: &str) -> Option<String> {
        self.rewrite_path_at(path_query, true)
    }

    /// [`Rewriter::rewrite_path`] for a URL at the provider's origin or elsewhere. Rewritten
    /// wherever they point: `/live|movie|series|timeshift/{user}/{pw}/...`,
    /// `/hlsr/{s}/{user}/{pw}/...` and any path whose query says `username={user}` (the real user,
    /// compared decoded); the short `/{user}/{pw}/{id}` too, but away from the provider's origin
    /// only with a stream id (`123`, `123.ts`) last, as the XC form has it.
    fn rewrite_path_at(&self, path_query: &str, at_provider: bool) -> Option<String> {
        let (path, query) = match path_query.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path_query, None),
        };
        let is_user = |seg: &str| decode_segment(seg) == self.real_user;
        let segs: Vec<&str> = path.strip_prefix('/').unwrap_or(path).split('/').collect();
        let user_at = match segs.as_slice() {
            _ if !path.starts_with('/') => None,
            ["live" | "movie" | "series" | "timeshift", user, _, _, ..] if is_user(user) => Some(1),
            ["hlsr", _, user, _, _, ..] if is_user(user) => Some(2),
            [user, _, id] if is_user(user) && (at_provider || is_stream_id(id)) => Some(0),
            _ => None,
        };
        if let Some(i) = user_at {
            let mut segs: Vec<String> = segs.iter().map(|s| s.to_string()).collect();
            segs[i] = self.public_user.to_string();
            let mut out = format!("/{}", segs.join("/"));
            if let Some(q) = query {
                out.push('?');
                out.push_str(q);
            }
            return Some(out);
        }
        let query = query?;
        let mut found = false;
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((key, v)) if decode(key) == "username" && decode(v) == self.real_user => {
                    found = true;
                    format!("username={}", encode(self.public_user))
                }
                _ => pair.to_string(),
            })
            .collect();
        let path = if path.is_empty() { "/" } else { path };
        found.then(|| format!("{path}?{}", pairs.join("&")))
    }

    /// The `player_api.php` login answer (`user_info` + `server_info`) with the proxy as the
    /// server and the proxy-issued username, then [`Rewriter::rewrite_text`]. Bodies that are not
    /// JSON are only text-rewritten. `None` for a body over [`MAX_LOGIN_BYTES`] bytes as sent
    /// (before any invalid UTF-8 is replaced), which is not parsed: no real login answer is that
    /// big, and a text rewrite alone would leave the provider's host and user in `server_info`
    /// and `user_info`.
    pub fn rewrite_login<B: AsRef<[u8]> + ?Sized>(&self, body: &B) -> Option<String> {
        self.rewrite_login_within(body.as_ref(), &mut |_| true)
            .map(Cow::into_owned)
    }

    /// [`Rewriter::rewrite_login`] with everything it builds asked of `grant` first, as in
    /// [`Rewriter::rewrite_text_within`]: a copy of an answer that is not UTF-8, the parsed JSON
    /// (estimated from above by a pass that builds nothing: a value costs many times its text),
    /// the text it is written back to, and the text rewrite's buffers. `Borrowed` when the answer
    /// is sent as it came (not JSON, and nothing in it to rewrite).
    pub fn rewrite_login_within<'a>(
        &self,
        body: &'a [u8],
        grant: &mut dyn FnMut(usize) -> bool,
    ) -> Option<Cow<'a, str>> {
        if body.len() > MAX_LOGIN_BYTES {
            return None;
        }
        let body = text_within(body, grant)?;
        let Some(parsed) = json_cost::parsed(&body) else {
            return self.rewrite_kept(body, grant);
        };
        // The five fields set below: new entries at worst, their values the public names.
        let set = self.public_user.len() + 4 * self.public_origin.len();
        if !grant(parsed.saturating_add(json_cost::inserted(5, set))) {
            return None;
        }
        let Ok(mut value) = serde_json::from_str::<Value>(&body) else {
            return self.rewrite_kept(body, grant);
        };
        if let Some(user) = value.get_mut("user_info").and_then(Value::as_object_mut) {
            if user.contains_key("username") {
                user.insert("username".into(), Value::String(self.public_user.into()));
            }
        }
        if let Some(server) = value.get_mut("server_info").and_then(Value::as_object_mut) {
            let (scheme, host, port) = split_origin(self.public_origin);
            server.insert("url".into(), Value::String(host.to_string()));
            server.insert("server_protocol".into(), Value::String(scheme.to_string()));
            let port = Value::String(port.to_string());
            server.insert("port".into(), port.clone());
            server.insert("https_port".into(), port);
        }
        // Written back into a buffer of its measured size (`to_string` would double its way up).
        let mut measured = Measured(0);
        if serde_json::to_writer(&mut measured, &value).is_err() {
            return self.rewrite_kept(body, grant);
        }
        if !grant(measured.0) {
            return None;
        }
        let mut text = Vec::with_capacity(measured.0);
        if serde_json::to_writer(&mut text, &value).is_err() {
            return self.rewrite_kept(body, grant);
        }
        drop(value);
        match String::from_utf8(text) {
            Ok(text) => self.rewrite_kept(Cow::Owned(text), grant),
            Err(_) => self.rewrite_kept(body, grant),
        }
    }

    /// A provider's answer as text (see [`text_within`]) with its stream URLs rewritten, every
    /// buffer asked of `grant` first. `Borrowed` when the answer is sent as it came.
    pub fn rewrite_answer_within<'a>(
        &self,
        body: &'a [u8],
        grant: &mut dyn FnMut(usize) -> bool,
    ) -> Option<Cow<'a, str>> {
        let text = text_within(body, grant)?;
        self.rewrite_kept(text, grant)
    }

    /// `text` rewritten, or `text` itself when nothing in it changes (never a copy of it).
    fn rewrite_kept<'a>(
        &self,
        text: Cow<'a, str>,
        grant: &mut dyn FnMut(usize) -> bool,
    ) -> Option<Cow<'a, str>> {
        match text {
            Cow::Borrowed(text) => self.rewrite_text_within(text, grant),
            Cow::Owned(text) => {
                let changed = match self.rewrite_text_within(&text, grant)? {
                    Cow::Owned(out) => Some(out),
                    Cow::Borrowed(_) => None,
                };
                Some(Cow::Owned(changed.unwrap_or(text)))
            }
        }
    }
}

/// A writer that only counts what it is given.
struct Measured(usize);

impl std::io::Write for Measured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 = self.0.saturating_add(buf.len());
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `body` as text: borrowed when it is UTF-8, else a copy with each invalid sequence replaced by
/// U+FFFD (three bytes, so up to three times the body), its exact size asked of `grant` first.
pub fn text_within<'a>(
    body: &'a [u8],
    grant: &mut dyn FnMut(usize) -> bool,
) -> Option<Cow<'a, str>> {
    if let Ok(text) = std::str::from_utf8(body) {
        return Some(Cow::Borrowed(text));
    }
    let replaced = |c: &std::str::Utf8Chunk<'_>| match c.invalid().is_empty() {
        true => 0,
        false => char::REPLACEMENT_CHARACTER.len_utf8(),
    };
    let len: usize = body
        .utf8_chunks()
        .map(|c| c.valid().len() + replaced(&c))
        .sum();
    if !grant(len) {
        return None;
    }
    let mut text = String::with_capacity(len);
    for chunk in body.utf8_chunks() {
        text.push_str(chunk.valid());
        if replaced(&chunk) > 0 {
            text.push(char::REPLACEMENT_CHARACTER);
        }
    }
    Some(Cow::Owned(text))
}

/// `(scheme, host, port)` of `scheme://host[:port]`, with the scheme's default port.
fn split_origin(origin: &str) -> (&str, &str, String) {
    let (scheme, authority) = origin.split_once("://").unwrap_or(("http", origin));
    let default = if scheme == "https" { "443" } else { "80" };
    // An IPv6 literal keeps its brackets; its port follows the closing one.
    let split = match authority.rfind(']') {
        Some(close) => authority[close..].find(':').map(|i| close + i),
        None => authority.rfind(':'),
    };
    match split {
        Some(i) => (scheme, &authority[..i], authority[i + 1..].to_string()),
        None => (scheme, authority, default.to_string()),
    }
}

/// The end of `http://` or `https://` (any letter case; `:\/\/` in the escaped form) starting at
/// `at`, or `None` when no such scheme starts there.
fn scheme_end(body: &[u8], at: usize, escaped: bool) -> Option<usize> {
    let rest = body.get(at..)?;
    let name = match rest.get(..5) {
        Some(s) if s.eq_ignore_ascii_case(b"https") => 5,
        _ if rest.get(..4)?.eq_ignore_ascii_case(b"http") => 4,
        _ => return None,
    };
    let sep: &[u8] = if escaped { b":\\/\\/" } else { b"://" };
    rest[name..]
        .starts_with(sep)
        .then_some(at + name + sep.len())
}

/// A path segment decoded (`+` is itself there).
fn decode_segment(seg: &str) -> String {
    percent_encoding::percent_decode_str(seg)
        .decode_utf8_lossy()
        .into_owned()
}

fn decode(v: &str) -> String {
    percent_encoding::percent_decode_str(&v.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

fn encode(v: &str) -> String {
    percent_encoding::utf8_percent_encode(v, percent_encoding::NON_ALPHANUMERIC).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: Rewriter<'static> = Rewriter {
        upstream_origin: "http://xc.example:8080",
        real_user: "alice",
        public_origin: "https://proxy.example",
        public_user: "TOK",
    };

    #[test]
    fn m3u_entries() {
        let m3u = "#EXTM3U\n#EXTINF:-1 tvg-logo=\"http://xc.example:8080/images/a.png\",A\nhttp://xc.example:8080/alice/pw/1.ts\n#EXTINF:-1,B\nhttp://xc.example:8080/movie/alice/pw/2.mkv\r\nhttp://xc.example:8080/movie/bob/pw/3.mkv\nhttp://xc.example:80801/alice/pw/4\n";
        assert_eq!(
            R.rewrite_text(m3u),
            "#EXTM3U\n#EXTINF:-1 tvg-logo=\"http://xc.example:8080/images/a.png\",A\nhttps://proxy.example/TOK/pw/1.ts\n#EXTINF:-1,B\nhttps://proxy.example/movie/TOK/pw/2.mkv\r\nhttp://xc.example:8080/movie/bob/pw/3.mkv\nhttps://proxy.example/TOK/pw/4\n"
        );
    }

    /// The provider's origin in any spelling (the default port written out, another letter case,
    /// `https` on 443), a CDN or panel host it names, and the scripts' `username=` at any host are
    /// all rewritten: none of them leaves the real username in the answer. Logos, other users,
    /// and a three-segment path that is no stream away from the provider stay as they are.
    #[test]
    fn every_spelling_of_a_stream_url_is_rewritten() {
        let r = Rewriter {
            upstream_origin: "http://xc.example",
            ..R
        };
        for (url, want) in [
            (
                "http://xc.example:80/live/alice/pw/1.ts",
                "/live/TOK/pw/1.ts",
            ),
            ("HTTP://XC.Example/live/alice/pw/1.ts", "/live/TOK/pw/1.ts"),
            ("Http://xc.EXAMPLE:80/alice/pw/x", "/TOK/pw/x"),
            (
                "https://xc.example:443/movie/alice/pw/2.mkv",
                "/movie/TOK/pw/2.mkv",
            ),
            (
                "https://XC.example/series/alice/pw/3.mp4",
                "/series/TOK/pw/3.mp4",
            ),
            (
                "http://cdn7.example:8000/live/alice/pw/1.m3u8",
                "/live/TOK/pw/1.m3u8",
            ),
            ("http://cdn.example/alice/pw/101", "/TOK/pw/101"),
            ("http://cdn.example/al%69ce/pw/101.ts", "/TOK/pw/101.ts"),
            (
                "http://[::1]:9/timeshift/alice/pw/60/x/1.ts",
                "/timeshift/TOK/pw/60/x/1.ts",
            ),
            (
                "http://panel.example/get.php?username=alice&password=pw",
                "/get.php?username=TOK&password=pw",
            ),
            ("http://panel.example?username=alice", "/?username=TOK"),
        ] {
            assert_eq!(
                r.rewrite_text(&format!("#EXTINF:-1,A\n{url}\n")),
                format!("#EXTINF:-1,A\nhttps://proxy.example{want}\n"),
                "{url}"
            );
            let escaped = url.replace('/', "\\/");
            let want = format!("https://proxy.example{want}").replace('/', "\\/");
            assert_eq!(
                r.rewrite_text(&format!(r#"{{"direct_source":"{escaped}"}}"#)),
                format!(r#"{{"direct_source":"{want}"}}"#),
                "{url}"
            );
        }
        for kept in [
            "http://xc.example:80/logo/alice/x.png/more",
            "HTTP://XC.EXAMPLE/images/alice.png",
            "http://cdn.example/alice/photos/x.png",
            "http://cdn.example/live/bob/pw/1.ts",
            "ftp://cdn.example/live/alice/pw/1.ts",
            "http:/cdn.example/live/alice/pw/1.ts",
            "http://",
        ] {
            let text = format!("x {kept} y");
            assert_eq!(r.rewrite_text(&text), text, "{kept}");
        }
    }

    #[test]
    fn escaped_json() {
        let json = r#"[{"direct_source":"http:\/\/xc.example:8080\/live\/alice\/pw\/7.m3u8","icon":"http:\/\/xc.example:8080\/i.png"}]"#;
        assert_eq!(
            R.rewrite_text(json),
            r#"[{"direct_source":"https:\/\/proxy.example\/live\/TOK\/pw\/7.m3u8","icon":"http:\/\/xc.example:8080\/i.png"}]"#
        );
    }

    #[test]
    fn scripts_and_catchup() {
        assert_eq!(
            R.rewrite_path("/get.php?username=alice&password=pw&type=m3u")
                .as_deref(),
            Some("/get.php?username=TOK&password=pw&type=m3u")
        );
        assert_eq!(
            R.rewrite_path("/hlsr/s/alice/pw/7/1/2/index.m3u8")
                .as_deref(),
            Some("/hlsr/s/TOK/pw/7/1/2/index.m3u8")
        );
        assert_eq!(
            R.rewrite_path("/timeshift/alice/pw/60/2026-01-01:10-00/7.ts")
                .as_deref(),
            Some("/timeshift/TOK/pw/60/2026-01-01:10-00/7.ts")
        );
        assert_eq!(R.rewrite_path("/get.php?username=bob"), None);
        // Any path whose query names the real user: the username must not reach the client.
        assert_eq!(
            R.rewrite_path("/other.php?username=alice").as_deref(),
            Some("/other.php?username=TOK")
        );
        assert_eq!(R.rewrite_path("/other.php?user=alice"), None);
        assert_eq!(R.rewrite_path("no-slash"), None);
    }

    #[test]
    fn login_names_the_proxy() {
        let body = r#"{"user_info":{"username":"alice","password":"pw","auth":1},"server_info":{"url":"xc.example","port":"8080","https_port":"8443","server_protocol":"http"}}"#;
        let out: Value = serde_json::from_str(&R.rewrite_login(body).unwrap()).unwrap();
        assert_eq!(out["user_info"]["username"], "TOK");
        assert_eq!(out["user_info"]["password"], "pw");
        assert_eq!(out["server_info"]["url"], "proxy.example");
        assert_eq!(out["server_info"]["port"], "443");
        assert_eq!(out["server_info"]["server_protocol"], "https");
        assert_eq!(R.rewrite_login("[1").as_deref(), Some("[1"));
        assert_eq!(split_origin("http://[::1]:9").1, "[::1]");
        assert_eq!(split_origin("http://[::1]:9").2, "9");
    }

    #[test]
    fn an_oversized_login_answer_is_refused_unparsed() {
        // 2 MiB of `[0,0,...]`: a million JSON values if parsed.
        let mut body = "[0".to_string();
        while body.len() < 2 * 1024 * 1024 {
            body.push_str(",0");
        }
        body.push(']');
        assert_eq!(R.rewrite_login(&body), None);
        // At the bound it is still parsed and rewritten.
        let at_bound = format!(
            r#"{{"user_info":{{"username":"alice"}},"pad":"{}"}}"#,
            "x".repeat(MAX_LOGIN_BYTES - 64)
        );
        assert!(at_bound.len() <= MAX_LOGIN_BYTES);
        let out: Value = serde_json::from_str(&R.rewrite_login(&at_bound).unwrap()).unwrap();
        assert_eq!(out["user_info"]["username"], "TOK");
    }
    /// A grant of at most `cap` bytes in all, recording each size asked.
    fn capped(cap: usize, asked: &mut Vec<usize>) -> impl FnMut(usize) -> bool + '_ {
        let mut left = cap;
        move |n| {
            asked.push(n);
            let ok = n <= left;
            left -= if ok { n } else { 0 };
            ok
        }
    }

    #[test]
    fn a_rewrite_past_its_grant_is_refused_before_it_is_built() {
        // Short stream URLs grow seven-fold into the public origin and a long sealed username.
        let token = "T".repeat(200);
        let r = Rewriter {
            public_user: &token,
            ..R
        };
        let body = "http://xc.example:8080/alice/p/1\n".repeat(1000);
        let want = format!("https://proxy.example/{token}/p/1\n").repeat(1000);
        assert!(want.len() > 6 * body.len());
        let mut asked = Vec::new();
        let out = r.rewrite_text_within(&body, &mut capped(want.len() - 1, &mut asked));
        assert!(out.is_none());
        assert_eq!(asked, [want.len()]);
        // At the exact size it is rewritten, into one buffer of that size.
        let mut asked = Vec::new();
        let out = r
            .rewrite_text_within(&body, &mut capped(want.len(), &mut asked))
            .unwrap();
        assert_eq!(out, want);
        assert_eq!(out.len(), want.len());
        assert!(matches!(out, Cow::Owned(ref s) if s.capacity() == want.len()));
        assert_eq!(asked, [want.len()]);
        // Both forms at once are asked for both buffers; nothing to rewrite asks for nothing.
        let both = format!(
            "{}{}",
            &body[..33],
            r#""http:\/\/xc.example:8080\/alice\/p\/1""#
        );
        let mut asked = Vec::new();
        let out = r
            .rewrite_text_within(&both, &mut capped(usize::MAX, &mut asked))
            .unwrap();
        assert_eq!(asked.len(), 2);
        assert_eq!(asked[1], out.len());
        assert!(!out.contains("xc.example"));
        let mut asked = Vec::new();
        let logos = "http://xc.example:8080/logo.png\n".repeat(10);
        let out = r.rewrite_text_within(&logos, &mut capped(0, &mut asked));
        assert!(matches!(out, Some(Cow::Borrowed(s)) if s == logos));
        assert!(asked.is_empty());
    }

    #[test]
    fn a_login_answer_asks_for_its_parsed_value_and_its_text() {
        // 20,000 zeros: 40 KB of text that parses into 20,000 values of 32 bytes or more.
        let login = format!(
            r#"{{"user_info":{{"username":"alice"}},"pad":[{}0]}}"#,
            "0,".repeat(19_999)
        );
        let values = 20_000 * std::mem::size_of::<Value>();
        let mut asked = Vec::new();
        let out = R
            .rewrite_login_within(login.as_bytes(), &mut capped(usize::MAX, &mut asked))
            .unwrap();
        let out_value: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(out_value["user_info"]["username"], "TOK");
        // The parsed value first, then the text it is written back to, at its exact size; the
        // text rewrite finds nothing to change and sends that text itself, not a copy.
        assert_eq!(asked.len(), 2, "{asked:?}");
        assert!(asked[0] >= values, "{asked:?}");
        assert_eq!(asked[1], out.len());
        assert!(matches!(out, Cow::Owned(ref s) if s.capacity() == s.len()));
        // Short of the parsed value's cost it is refused before anything is parsed.
        let mut asked = Vec::new();
        let out = R.rewrite_login_within(login.as_bytes(), &mut capped(values, &mut asked));
        assert!(out.is_none());
        assert_eq!(asked.len(), 1);
        // An answer that is not JSON and names no stream is sent as it came, not copied.
        let mut asked = Vec::new();
        let out = R.rewrite_login_within(b"[1", &mut capped(0, &mut asked));
        assert!(matches!(out, Some(Cow::Borrowed("[1"))));
        assert!(asked.is_empty());
    }

    #[test]
    fn invalid_utf8_is_copied_only_within_its_grant() {
        let body = b"ok \xff\xfe http://xc.example:8080/alice/p/1 \xc3";
        let want = "ok \u{fffd}\u{fffd} http://xc.example:8080/alice/p/1 \u{fffd}";
        let mut asked = Vec::new();
        assert!(text_within(body, &mut capped(want.len() - 1, &mut asked)).is_none());
        assert_eq!(asked, [want.len()]);
        let mut asked = Vec::new();
        let text = text_within(body, &mut capped(want.len(), &mut asked)).unwrap();
        assert_eq!(text, want);
        assert_eq!(text, String::from_utf8_lossy(body));
        assert!(matches!(
            text_within(b"plain", &mut |_| false),
            Some(Cow::Borrowed("plain"))
        ));
        // A login answer is bounded by its size as sent: 600 KiB of invalid bytes would be
        // 1.8 MiB once replaced, and is still parsed and rewritten.
        let mut login = br#"{"user_info":{"username":"alice"},"pad":""#.to_vec();
        login.extend(std::iter::repeat_n(0xffu8, 600 * 1024));
        login.extend(br#""}"#);
        let out: Value = serde_json::from_str(&R.rewrite_login(&login[..]).unwrap()).unwrap();
        assert_eq!(out["user_info"]["username"], "TOK");
    }
}
