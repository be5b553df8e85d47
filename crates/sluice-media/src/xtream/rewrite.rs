//! XC responses pointed back through the proxy: stream URLs in JSON, escaped JSON and M3U get the
//! proxy's origin and the proxy-issued username; the login answer names the proxy as the server.
//!
//! Only URLs at the provider's origin whose path has the XC credential shape are touched
//! (`/live|movie|series|timeshift/{user}/...`, `/hlsr/{s}/{user}/...`, `/{user}/{pw}/{id}`, and
//! the scripts with `username={user}`); logos and other assets at the same origin stay direct.

use std::borrow::Cow;

use serde_json::Value;

use super::json_cost;

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
    fn scan_form(&self, body: &str, escaped: bool, emit: &mut dyn FnMut(&str)) -> bool {
        let origin = if escaped {
            self.upstream_origin.replace('/', "\\/")
        } else {
            self.upstream_origin.to_string()
        };
        if origin.is_empty() {
            emit(body);
            return false;
        }
        let mut changed = false;
        let mut rest = body;
        while let Some(at) = rest.find(&origin) {
            emit(&rest[..at]);
            let after = &rest[at + origin.len()..];
            let end = after
                .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>'))
                .unwrap_or(after.len());
            let tail = &after[..end];
            match self.rewrite_url(tail, escaped) {
                Some(url) => {
                    emit(&url);
                    changed = true;
                }
                None => {
                    emit(&origin);
                    emit(tail);
                }
            }
            rest = &after[end..];
        }
        emit(rest);
        changed
    }

    /// The public URL for what follows the provider's origin, in the same form, or `None` when
    /// it is not an XC stream URL for this user. A run longer than any real URL is left as it is,
    /// so the copies made here stay small however the answer is built.
    fn rewrite_url(&self, tail: &str, escaped: bool) -> Option<String> {
        if tail.len() > MAX_URL {
            return None;
        }
        let unescaped = if escaped {
            Cow::Owned(tail.replace("\\/", "/"))
        } else {
            Cow::Borrowed(tail)
        };
        // The origin must end where the URL's host ends (`http://h:80` is not `http://h:8080`).
        if !(unescaped.is_empty() || unescaped.starts_with(['/', '?'])) {
            return None;
        }
        let url = format!("{}{}", self.public_origin, self.rewrite_path(&unescaped)?);
        Some(if escaped {
            url.replace('/', "\\/")
        } else {
            url
        })
    }

    /// The proxy's path for an upstream path (with query), or `None` when it is not an XC
    /// stream URL for this user.
    pub fn rewrite_path(&self, path_query: &str) -> Option<String> {
        let (path, query) = match path_query.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path_query, None),
        };
        let segs: Vec<&str> = path.strip_prefix('/')?.split('/').collect();
        let user_at = match segs.as_slice() {
            ["live" | "movie" | "series" | "timeshift", user, _, _, ..]
                if *user == self.real_user =>
            {
                Some(1)
            }
            ["hlsr", _, user, _, _, ..] if *user == self.real_user => Some(2),
            [user, _, _] if *user == self.real_user => Some(0),
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
        let script = matches!(
            path,
            "/get.php"
                | "/player_api.php"
                | "/xmltv.php"
                | "/panel_api.php"
                | "/streaming/timeshift.php"
        );
        let query = query.filter(|_| script)?;
        let mut found = false;
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some(("username", v)) if decode(v) == self.real_user => {
                    found = true;
                    format!("username={}", encode(self.public_user))
                }
                _ => pair.to_string(),
            })
            .collect();
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
            "#EXTM3U\n#EXTINF:-1 tvg-logo=\"http://xc.example:8080/images/a.png\",A\nhttps://proxy.example/TOK/pw/1.ts\n#EXTINF:-1,B\nhttps://proxy.example/movie/TOK/pw/2.mkv\r\nhttp://xc.example:8080/movie/bob/pw/3.mkv\nhttp://xc.example:80801/alice/pw/4\n"
        );
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
        assert_eq!(R.rewrite_path("/other.php?username=alice"), None);
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
