//! XC responses pointed back through the proxy: stream URLs in JSON, escaped JSON and M3U get the
//! proxy's origin and the proxy-issued username; the login answer names the proxy as the server.
//!
//! Only URLs whose path has the XC credential shape for the real user are touched, at any host and
//! in any spelling of it (`/live|movie|series|timeshift/{user}/...`, `/hlsr/{s}/{user}/...`,
//! `/{user}/{pw}/{id}`, and any path with `username={user}` in its query); logos and other assets
//! stay direct.

use std::borrow::Cow;
use std::cell::OnceCell;

use serde_json::Value;

use super::{is_stream_id, json_cost};

/// Largest login answer parsed as JSON. A real one (`user_info` and `server_info`) is about
/// 2 KB; a parsed JSON value costs many times its text (a body of `[0,0,0,...]` is one value per
/// two bytes), so a provider's oversized answer would otherwise cost GiBs.
pub const MAX_LOGIN_BYTES: usize = 1024 * 1024;

/// Longest run read as a stream URL (a real one is well under 1 KB).
const MAX_URL: usize = 16 * 1024;

/// Most URLs read in one run (a URL inside another, inside another...): a real answer nests one
/// or two, and each read costs up to the run's length.
const MAX_URLS_PER_RUN: usize = 8;

/// The provider's origin, parsed when first needed.
type Provider = OnceCell<Option<url::Origin>>;

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
    /// client the real username (see [`Rewriter::rewrite_path`] for what is rewritten). So are
    /// `rtmp(s)://` and `rtsp(s)://` URLs (`get.php?output=rtmp`): sluice proxies none of them, and
    /// one with the credential shape becomes the sluice URL for the same path rather than name
    /// the real user.
    ///
    /// A URL inside another (`http://cdn/proxy?src=http://xc/live/{user}/...`) is looked at too:
    /// when the outer one is not rewritten the scan goes on after its `://`. At most
    /// [`MAX_URLS_PER_RUN`] URLs of one run (the text up to a space or a quote) are read, each in
    /// at most [`MAX_URL`] bytes, so a run of `http://http://...` costs a few times its length.
    /// What is not read (the rest of a run past its reads, a URL longer than [`MAX_URL`]) has
    /// each occurrence of the real username, as written or percent-encoded (see [`Spellings`]),
    /// replaced by the public one (one linear search), so a provider's twelfth URL in one run does
    /// not name the user either.
    fn scan_form(&self, body: &str, escaped: bool, emit: &mut dyn FnMut(&str)) -> bool {
        let provider = OnceCell::new();
        self.scan(body, escaped, &provider, None, emit)
    }

    /// [`Rewriter::scan_form`] with the provider's origin parsed at most once, when first asked
    /// for; `shared` is the enclosing run's budget of URLs read (`None`: each run has its own).
    fn scan(
        &self,
        body: &str,
        escaped: bool,
        provider: &Provider,
        mut shared: Option<&mut usize>,
        emit: &mut dyn FnMut(&str),
    ) -> bool {
        let bytes = body.as_bytes();
        let (mut changed, mut from, mut at) = (false, 0, 0);
        let (mut run_end, mut own) = (0, 0);
        while let Some((start, after)) = next_scheme(bytes, at, escaped) {
            #[cfg(test)]
            tests::step(1);
            // Every URL inside a run ends where the run does: it is looked for once.
            if start >= run_end {
                run_end = body[after..]
                    .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>'))
                    .map_or(body.len(), |e| after + e);
                own = MAX_URLS_PER_RUN;
            }
            let left = match shared.as_deref_mut() {
                Some(left) => left,
                None => &mut own,
            };
            let run = &body[start..run_end];
            // A URL that is not read (the run's reads are used up, or it is longer than any real
            // URL) still names no real user: each time the username is written in it (up to the
            // run's end, or up to the next URL, which is looked at in turn), it becomes the
            // public one, as a URL read would have it.
            let unread = match (*left, run.len() > MAX_URL) {
                (0, _) => Some(run_end),
                (_, true) => {
                    Some(next_scheme(&bytes[..run_end], after, escaped).map_or(run_end, |(s, _)| s))
                }
                _ => None,
            };
            if let Some(end) = unread {
                // Searched in one pass, a step a byte (see [`Spellings`]).
                let unread = &body[start..end];
                // Only where a URL would carry it, a path segment or a query value (`/alice/`,
                // `=alice&`): a short username (`tv`) elsewhere in the text is left as it is.
                let u = unread.as_bytes();
                let whole = |hit: &std::ops::Range<usize>| {
                    let before = hit.start.checked_sub(1).map(|i| u[i]);
                    let after = u.get(hit.end).copied();
                    // Percent-encoded separators (`%2F`, `%3D`, `%3A`, or `%252F` encoded
                    // again) count too: a nested URL.
                    let encoded = matches!(
                        encoded_before(u, hit.start).map(|d| d.map(|b| b.to_ascii_uppercase())),
                        Some([b'2', b'F'] | [b'3', b'D'] | [b'3', b'A'])
                    );
                    let ends = match after {
                        None => true,
                        // An encoded separator after it (`%2F`, `%3F`, `%26`, `%3A`, `%23`, in
                        // either letter case, at any depth): a nested URL. Not any other escape:
                        // `alice%40x` is another user, `alice@x`.
                        Some(b'%') => matches!(
                            decoded_at(u, hit.end, false).0,
                            b'/' | b'?' | b'&' | b':' | b'#'
                        ),
                        Some(c) => matches!(
                            c,
                            b'/' | b'&' | b',' | b'|' | b'\\' | b'?' | b'#' | b':' | b'@' | b';'
                        ),
                    };
                    (matches!(before, Some(b'/' | b'=' | b':')) || encoded) && ends
                };
                // As written, or with any of its bytes percent-encoded (`user%40x`, `%61lice`),
                // at any depth (`user%2540x` in a nested URL written encoded), and with `/` as
                // `\/` in the escaped form.
                let mut hits = Spellings::new(u, self.real_user.as_bytes(), escaped)
                    .filter(|hit| {
                        whole(hit)
                            && unread.is_char_boundary(hit.start)
                            && unread.is_char_boundary(hit.end)
                    })
                    .peekable();
                if hits.peek().is_some() {
                    emit(&body[from..start]);
                    let mut last = 0;
                    for hit in hits {
                        emit(&unread[last..hit.start]);
                        emit(self.public_user);
                        last = hit.end;
                    }
                    emit(&unread[last..]);
                    (from, changed) = (end, true);
                }
                at = if *left == 0 { run_end } else { after };
                continue;
            }
            match self.rewrite_url(run, escaped, provider, left) {
                Some(url) => {
                    emit(&body[from..start]);
                    emit(&url);
                    (from, at, changed) = (run_end, run_end, true);
                }
                None => at = after,
            }
        }
        emit(&body[from..]);
        changed
    }

    /// The public URL for an absolute URL `run` (in the form it was found in), or `None` when it
    /// is not an XC stream URL for this user. A run longer than any real URL is left as it is,
    /// so the copies made here stay small however the answer is built. One of `left` is taken
    /// for each run read; URLs inside the rewritten one take theirs from it too.
    fn rewrite_url(
        &self,
        run: &str,
        escaped: bool,
        provider: &Provider,
        left: &mut usize,
    ) -> Option<String> {
        if run.len() > MAX_URL {
            return None;
        }
        *left -= 1;
        #[cfg(test)]
        tests::step(run.len());
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
        // Compared parsed (scheme and host in lower case, the scheme's default port filled in),
        // and only when the short form away from a stream file asks.
        let at_provider = || {
            let origin = url::Url::parse(&format!("{scheme}://{authority}/"))
                .ok()
                .map(|u| u.origin());
            origin.is_some() && origin.as_ref() == self.provider(provider)
        };
        let path = self.rewrite_path_at(path_query, &at_provider)?;
        // A URL inside this one (in its query, say) is rewritten too.
        let mut url = self.public_origin.to_string();
        self.scan(&path, false, provider, Some(left), &mut |p| url.push_str(p));
        Some(if escaped {
            url.replace('/', "\\/")
        } else {
            url
        })
    }

    /// The provider's origin, parsed on first use (`None` when it is not a tuple origin).
    fn provider<'c>(&self, cell: &'c Provider) -> Option<&'c url::Origin> {
        cell.get_or_init(|| {
            url::Url::parse(self.upstream_origin)
                .ok()
                .map(|u| u.origin())
                .filter(url::Origin::is_tuple)
        })
        .as_ref()
    }

    /// The proxy's path for an upstream path (with query) at the provider's origin, or `None`
    /// when it is not an XC stream URL for this user.
    pub fn rewrite_path(&self, path_query: &str) -> Option<String> {
        self.rewrite_path_at(path_query, &|| true)
    }

    /// [`Rewriter::rewrite_path`] for a URL at the provider's origin or elsewhere (`at_provider`,
    /// asked only when needed). Rewritten wherever they point:
    /// `/live|movie|series|timeshift/{user}/{pw}/...`, `/hlsr/{s}/{user}/{pw}/...` and any path
    /// whose query says `username={user}` (the real user, compared decoded; pairs split at `&`
    /// or at `\u0026`, as Go's JSON encoder writes it); the short `/{user}/{pw}/{id}` too, but
    /// away from the provider's origin only with a stream file (`123`, `123.ts`, not `123.png`)
    /// last, as the XC form has it.
    fn rewrite_path_at<'p>(
        &self,
        path_query: &'p str,
        at_provider: &dyn Fn() -> bool,
    ) -> Option<String> {
        let (path, query) = match path_query.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path_query, None),
        };
        let is_user = |seg: &str| decode_segment(seg) == self.real_user;
        let split = |path: &'p str| -> Vec<&'p str> {
            path.strip_prefix('/').unwrap_or(path).split('/').collect()
        };
        let short = |segs: &[&str]| match segs {
            [user, _, id] => is_user(user) && (is_stream_file(id) || at_provider()),
            _ => false,
        };
        let segs = split(path);
        let user_at = match segs.as_slice() {
            _ if !path.starts_with('/') => None,
            ["live" | "movie" | "series" | "timeshift", user, _, _, ..] if is_user(user) => Some(1),
            ["hlsr", _, user, _, _, ..] if is_user(user) => Some(2),
            segs if short(segs) => Some(0),
            _ => None,
        };
        // A short form followed by more of its run (`/{user}/{pw}/1.ts,http://...`, URLs joined
        // by `,`, `|` or a JSON escape such as `\n`) ends there.
        let user_at = user_at.or_else(|| {
            let cut = path.find([',', '|', '\\'])?;
            (path.starts_with('/') && short(&split(&path[..cut]))).then_some(0)
        });
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
        let path = if path.is_empty() { "/" } else { path };
        let mut out = format!("{path}?");
        let mut found = false;
        for (pair, sep) in query_pairs(query) {
            // A value followed by more of its run (`username={user},http://...`) ends there too.
            let user_end = |v: &str| match decode(v) == self.real_user {
                true => Some(v.len()),
                false => v
                    .find([',', '|', '\\'])
                    .filter(|&cut| decode(&v[..cut]) == self.real_user),
            };
            let rest = pair
                .split_once('=')
                .filter(|(key, _)| decode(key) == "username")
                .and_then(|(_, v)| Some(&v[user_end(v)?..]));
            match rest {
                Some(rest) => {
                    found = true;
                    out.push_str("username=");
                    out.push_str(&encode(self.public_user));
                    out.push_str(rest);
                }
                None => out.push_str(pair),
            }
            out.push_str(sep);
        }
        found.then_some(out)
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

/// The next absolute URL's scheme at or after `at`: `(start, end)` of `http://`, `https://`,
/// `rtmp://`, `rtmps://`, `rtsp://` or `rtsps://` (any letter case; `:\/\/` in the escaped form).
fn next_scheme(body: &[u8], from: usize, escaped: bool) -> Option<(usize, usize)> {
    let sep: &[u8] = if escaped { b":\\/\\/" } else { b"://" };
    let mut at = from;
    loop {
        let colon = at + memchr::memchr(b':', body.get(at..)?)?;
        at = colon + 1;
        if !body[colon..].starts_with(sep) {
            continue;
        }
        let named = |len: usize, names: &[&[u8]]| {
            let start = colon.checked_sub(len).filter(|&s| s >= from)?;
            let name = &body[start..colon];
            names
                .iter()
                .any(|n| name.eq_ignore_ascii_case(n))
                .then_some(start)
        };
        let start = named(5, &[b"https", b"rtmps", b"rtsps"])
            .or_else(|| named(4, &[b"http", b"rtmp", b"rtsp"]));
        if let Some(start) = start {
            return Some((start, colon + sep.len()));
        }
    }
}

/// Where a username is written in a URL's text: each occurrence of `user`, leftmost first and not
/// overlapping, as `start..end` in `text`, whatever the spelling of each of its bytes: as it is,
/// percent-encoded in either letter case (`%40`, `%4a`, `%4A`), encoded again as a nested URL
/// written encoded has it (`%2540`), and `/` as `\/` in the JSON-escaped form. One pass over
/// `text` (a KMP automaton over its bytes as decoded), so trying each place the name could start
/// never costs the name's length at each.
struct Spellings<'t> {
    text: &'t [u8],
    /// The username as decoded the same way as `text` (see [`Spellings::new`]).
    user: Vec<u8>,
    escaped: bool,
    /// The longest proper prefix of `user[..=i]` that is also its suffix, for each `i`.
    fail: Vec<usize>,
    /// Where each of the last `user.len()` decoded bytes began in `text`, by its count.
    starts: Vec<usize>,
    /// The next byte of `text`, the decoded bytes read and how many of `user` they end with.
    at: usize,
    read: usize,
    matched: usize,
}

impl<'t> Spellings<'t> {
    /// The search for `user` in `text`. The name is decoded as the text is, so the one that
    /// holds what reads as an escape (`ab%41`, which `text` gives as `abA` in each of its
    /// spellings: `ab%41` as written, `ab%2541` encoded) is found in every one of them.
    fn new(text: &'t [u8], user: &[u8], escaped: bool) -> Spellings<'t> {
        let mut decoded = Vec::with_capacity(user.len());
        let mut at = 0;
        while at < user.len() {
            let (byte, len) = decoded_at(user, at, false);
            decoded.push(byte);
            at += len;
        }
        let user = decoded;
        let mut fail = vec![0; user.len()];
        let mut k = 0;
        for i in 1..user.len() {
            while k > 0 && user[i] != user[k] {
                k = fail[k - 1];
            }
            if user[i] == user[k] {
                k += 1;
            }
            fail[i] = k;
        }
        Spellings {
            text,
            starts: vec![0; user.len()],
            user,
            escaped,
            fail,
            at: 0,
            read: 0,
            matched: 0,
        }
    }

    /// The byte at `at` as decoded, and how many bytes of `text` it takes.
    fn decoded(&self, at: usize) -> (u8, usize) {
        decoded_at(self.text, at, self.escaped)
    }
}

/// The byte at `at` of a URL's text as decoded, whatever its spelling (see [`Spellings`]), and
/// how many bytes of `text` it takes: a percent-escape at any depth (`%41`, `%2541`) is the byte
/// it encodes, and with `escaped` `\/` is `/`.
fn decoded_at(text: &[u8], at: usize, escaped: bool) -> (u8, usize) {
    let hex = |i: usize| text.get(i).and_then(|&c| (c as char).to_digit(16));
    match text[at] {
        b'%' => {
            // `%25` stands for `%`: past each, the escape it encoded.
            let mut end = at + 1;
            while text.get(end..end + 2) == Some(b"25") && hex(end + 2).is_some() {
                end += 2;
            }
            match (hex(end), hex(end + 1)) {
                (Some(high), Some(low)) => ((high << 4 | low) as u8, end + 2 - at),
                // `%25` with no escape after it: `%` encoded once.
                _ if end > at + 1 => (b'%', 3),
                _ => (b'%', 1),
            }
        }
        b'\\' if escaped && text.get(at + 1) == Some(&b'/') => (b'/', 2),
        c => (c, 1),
    }
}

impl Iterator for Spellings<'_> {
    type Item = std::ops::Range<usize>;

    fn next(&mut self) -> Option<Self::Item> {
        let m = self.user.len();
        if m == 0 {
            return None;
        }
        while self.at < self.text.len() {
            #[cfg(test)]
            tests::step(1);
            let (byte, len) = self.decoded(self.at);
            self.starts[self.read % m] = self.at;
            (self.at, self.read) = (self.at + len, self.read + 1);
            while self.matched > 0 && self.user[self.matched] != byte {
                #[cfg(test)]
                tests::step(1);
                self.matched = self.fail[self.matched - 1];
            }
            if self.user[self.matched] == byte {
                self.matched += 1;
            }
            if self.matched == m {
                self.matched = 0;
                return Some(self.starts[(self.read - m) % m]..self.at);
            }
        }
        None
    }
}

/// The two hex digits of the percent-escape that ends at `end` in `text`, at any depth (`%2F`,
/// `%252F`), if one does.
fn encoded_before(text: &[u8], end: usize) -> Option<[u8; 2]> {
    let digits = text.get(end.checked_sub(2)?..end)?;
    let mut at = end - 2;
    while at >= 2 && &text[at - 2..at] == b"25" {
        at -= 2;
    }
    (at >= 1 && text[at - 1] == b'%').then(|| [digits[0], digits[1]])
}

/// The `(pair, separator after it)` of a query: split at `&` and at `\u0026` (a JSON encoder's
/// `&`, Go's among them); the last separator is empty.
fn query_pairs(query: &str) -> impl Iterator<Item = (&str, &str)> {
    let mut rest = Some(query);
    std::iter::from_fn(move || {
        let q = rest?;
        let amp = q.find('&');
        let esc = q.find("\\u0026");
        let (end, sep) = match (amp, esc) {
            (Some(a), Some(e)) if e < a => (e, 6),
            (Some(a), _) => (a, 1),
            (None, Some(e)) => (e, 6),
            (None, None) => {
                rest = None;
                return Some((q, ""));
            }
        };
        rest = Some(&q[end + sep..]);
        Some((&q[..end], &q[end..end + sep]))
    })
}

/// The short form's last segment away from the provider: a stream id with no extension or a
/// stream's (`123`, `123.ts`; not `123.png`, which a third party's `/{word}/x/123.png` may be).
fn is_stream_file(seg: &str) -> bool {
    const STREAM_EXTENSIONS: &[&str] = &[
        "ts", "m3u8", "m3u", "mp4", "m4v", "m4s", "mkv", "avi", "flv", "mov", "webm", "mpd", "aac",
        "mp3",
    ];
    is_stream_id(seg)
        && seg.split_once('.').is_none_or(|(_, ext)| {
            STREAM_EXTENSIONS
                .iter()
                .any(|e| ext.eq_ignore_ascii_case(e))
        })
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

    thread_local! {
        /// Work done by the scan on this thread: one per scheme found, one per byte of a URL read,
        /// one per byte of unread text searched for the username and per fallback of that search.
        static STEPS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    pub(super) fn step(n: usize) {
        STEPS.with(|s| s.set(s.get() + n));
    }

    /// The scan's steps for `body`, each form once.
    fn steps(r: &Rewriter<'_>, body: &str) -> usize {
        STEPS.with(|s| s.set(0));
        for escaped in [false, true] {
            r.scan_form(body, escaped, &mut |_| {});
        }
        STEPS.with(|s| s.get())
    }

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

    /// A URL inside another is looked at: after one that is not rewritten (a CDN's or a player's
    /// `?src=`, at any depth, past a long query), and inside one that is. Both forms.
    #[test]
    fn a_url_inside_another_is_rewritten() {
        let pad = "a".repeat(20_000);
        for (text, want) in [
            (
                "http://cdn.example/proxy?src=http://xc.example:8080/live/alice/pw/1.ts".to_string(),
                "http://cdn.example/proxy?src=https://proxy.example/live/TOK/pw/1.ts".to_string(),
            ),
            (
                "http://a.example/?u=http://b.example/x?v=http://cdn.example/alice/pw/7.ts"
                    .to_string(),
                "http://a.example/?u=http://b.example/x?v=https://proxy.example/TOK/pw/7.ts"
                    .to_string(),
            ),
            (
                format!("http://cdn.example/p?x={pad}&src=http://cdn.example/movie/alice/pw/2.mkv"),
                format!("http://cdn.example/p?x={pad}&src=https://proxy.example/movie/TOK/pw/2.mkv"),
            ),
            (
                "http://xc.example:8080/live/alice/pw/1.ts?next=http://cdn.example/live/alice/pw/2.ts"
                    .to_string(),
                "https://proxy.example/live/TOK/pw/1.ts?next=https://proxy.example/live/TOK/pw/2.ts"
                    .to_string(),
            ),
        ] {
            assert_eq!(R.rewrite_text(&format!("{text}\n")), format!("{want}\n"));
            let (text, want) = (text.replace('/', "\\/"), want.replace('/', "\\/"));
            assert_eq!(
                R.rewrite_text(&format!(r#"{{"u":"{text}"}}"#)),
                format!(r#"{{"u":"{want}"}}"#)
            );
        }
    }

    /// However URLs nest in one run, the scan reads at most [`MAX_URLS_PER_RUN`] of them, each
    /// in at most the run: a few times the answer's length (a 16 KiB run of `http://http://...`
    /// read from each of its 2,340 schemes is some 19 million steps).
    #[test]
    fn nested_urls_cost_a_few_times_their_length() {
        let nested = |n: usize, sep: &str| format!("http:{sep}").repeat(n / (5 + sep.len()));
        let runs = [
            nested(64 * 1024, "//"),
            nested(MAX_URL, "//"),
            nested(MAX_URL - 7, "//") + "alice/pw/1.ts",
            nested(2048, "//").repeat(2) + " ",
            nested(MAX_URL, r"\/\/"),
            format!("{}\n", nested(1024, "//")).repeat(64),
        ];
        for body in runs {
            let steps = steps(&R, &body);
            assert!(
                steps <= (MAX_URLS_PER_RUN + 1) * body.len(),
                "{steps} steps for {} bytes",
                body.len()
            );
        }
    }

    /// Go's JSON encoder writes `&` as `\u0026`: the pairs it separates are read as pairs, in
    /// either form, and the separator is kept as it was.
    #[test]
    fn json_escaped_ampersands_separate_query_pairs() {
        for (url, want) in [
            (
                r"http://xc.example:8080/get.php?password=pw\u0026username=alice\u0026type=m3u",
                r"https://proxy.example/get.php?password=pw\u0026username=TOK\u0026type=m3u",
            ),
            (
                r"http://cdn.example/x?username=alice\u0026password=pw&a=b",
                r"https://proxy.example/x?username=TOK\u0026password=pw&a=b",
            ),
        ] {
            let json = |u: &str| format!(r#"{{"url":"{u}"}}"#);
            assert_eq!(R.rewrite_text(&json(url)), json(want));
            let esc = |u: &str| json(&u.replace('/', "\\/"));
            assert_eq!(R.rewrite_text(&esc(url)), esc(want));
        }
        assert_eq!(
            R.rewrite_path(r"/get.php?username=alice\u0026password=pw")
                .as_deref(),
            Some(r"/get.php?username=TOK\u0026password=pw")
        );
        let other = r#"{"url":"http://cdn.example/x?username=bob\u0026password=pw"}"#;
        assert_eq!(R.rewrite_text(other), other);
    }

    /// With a real username that is a common word, a third party's `/{word}/x/123.png` is no XC
    /// stream: away from the provider the short form needs a stream id with no extension or a
    /// stream's. At the provider it is the XC form whatever its id.
    #[test]
    fn the_short_form_elsewhere_needs_a_stream_file() {
        let r = Rewriter {
            real_user: "tv",
            ..R
        };
        for kept in [
            "http://img.example/tv/x/123.png",
            "http://img.example/tv/x/123.JPG",
            "https://img.example/tv/2024/05.html",
            "http://img.example/tv/x/logo",
        ] {
            let text = format!("x {kept} y");
            assert_eq!(r.rewrite_text(&text), text, "{kept}");
        }
        for (url, want) in [
            ("http://cdn.example/tv/x/123", "/TOK/x/123"),
            ("http://cdn.example/tv/x/123.ts", "/TOK/x/123.ts"),
            ("http://cdn.example/tv/x/123.M3U8", "/TOK/x/123.M3U8"),
            ("http://cdn.example/tv/x/9.mkv", "/TOK/x/9.mkv"),
            ("http://xc.example:8080/tv/x/123.png", "/TOK/x/123.png"),
        ] {
            assert_eq!(
                r.rewrite_text(&format!("x {url} y")),
                format!("x https://proxy.example{want} y"),
                "{url}"
            );
        }
    }

    /// `get.php?output=rtmp` answers `rtmp://` URLs: with the credential shape they become the
    /// sluice URL for the same path (sluice proxies no RTMP or RTSP) rather than name the user.
    #[test]
    fn rtmp_and_rtsp_urls_do_not_name_the_user() {
        for (url, want) in [
            ("rtmp://xc.example:1935/live/alice/pw/1", "/live/TOK/pw/1"),
            (
                "RTMPS://cdn.example/live/alice/pw/1.ts",
                "/live/TOK/pw/1.ts",
            ),
            ("rtsp://cdn.example:554/alice/pw/5", "/TOK/pw/5"),
            (
                "rtmp://xc.example:1935/live?username=alice&password=pw",
                "/live?username=TOK&password=pw",
            ),
        ] {
            assert_eq!(
                R.rewrite_text(&format!("#EXTINF:-1,A\n{url}\n")),
                format!("#EXTINF:-1,A\nhttps://proxy.example{want}\n"),
                "{url}"
            );
        }
        for kept in [
            "rtmp://cdn.example/live/bob/pw/1",
            "rtmpx://cdn.example/live/alice/pw/1",
        ] {
            let text = format!("x {kept} y");
            assert_eq!(R.rewrite_text(&text), text, "{kept}");
        }
    }

    /// Past its [`MAX_URLS_PER_RUN`] reads, the rest of a run (URLs joined by `,`, `|` or a JSON
    /// `\n`) is not read as URLs, but the real username in it still becomes the public one; so
    /// does one in a URL longer than any real one. Both forms.
    #[test]
    fn the_username_past_a_runs_reads_is_replaced() {
        let pad = "a".repeat(MAX_URL);
        for sep in [",", "|", r"\n"] {
            let mut urls: Vec<String> = (1..12)
                .map(|i| format!("http://cdn.example/logo/{i}.png"))
                .collect();
            urls.push("http://xc.example:8080/live/alice/pw/12.ts".into());
            let long = format!(
                "http://xc.example:8080/live/alice/pw/1.ts{sep}http://cdn.example/?p={pad}"
            );
            for run in [urls.join(sep), long] {
                let escaped = run.replace('/', "\\/");
                for text in [
                    format!("#EXTINF:-1,A\n{run}\n"),
                    format!(r#"{{"u":"{escaped}"}}"#),
                ] {
                    let out = R.rewrite_text(&text);
                    assert!(
                        !out.contains("alice"),
                        "{sep}: {}",
                        &out[..out.len().min(400)]
                    );
                    assert!(out.replace("\\/", "/").contains("/live/TOK/pw/"), "{sep}");
                }
            }
        }
        let twelve = (1..12)
            .map(|i| format!("http://cdn.example/logo/{i}.png"))
            .chain(["http://cdn.example/get.php?username=alice&password=pw".to_string()])
            .collect::<Vec<_>>()
            .join(",");
        let out = R.rewrite_text(&format!("{twelve}\n"));
        assert!(
            out.ends_with(",http://cdn.example/get.php?username=TOK&password=pw\n"),
            "{out}"
        );
        // Only where a URL carries it: the name inside another word is left as written.
        let other = (1..13)
            .map(|i| format!("http://cdn.example/logo/{i}.png"))
            .chain(["http://cdn.example/img/alicescope.png?x=malice".to_string()])
            .collect::<Vec<_>>()
            .join(",");
        let out = R.rewrite_text(&format!("{other}\n"));
        assert!(out.ends_with("/img/alicescope.png?x=malice\n"), "{out}");
        // A nested URL written percent-encoded, and user info: the name goes all the same.
        for last in [
            "http://cdn.example/p?src=http%3A%2F%2Fxc%2Flive%2Falice%2Fpw%2F1.ts",
            "http://cdn.example/p?src=rtmp://alice:pw@xc/live",
        ] {
            let run = (1..13)
                .map(|i| format!("http://cdn.example/logo/{i}.png"))
                .chain([last.to_string()])
                .collect::<Vec<_>>()
                .join(",");
            let out = R.rewrite_text(&format!("{run}\n"));
            assert!(!out.contains("alice"), "{out}");
        }
    }

    /// The username in text the scan does not read (past a run's reads, in a URL longer than
    /// any real one) goes in any spelling a URL may give it: any of its bytes percent-encoded, in
    /// either letter case, encoded again in a nested URL written encoded, and in the escaped form
    /// too; it stays where it is not a URL's segment or value. The search is one pass: a name
    /// that nearly matches everywhere costs no more than one that never does.
    #[test]
    fn a_percent_encoded_username_past_a_runs_reads_is_replaced() {
        let at = Rewriter {
            real_user: "user@x",
            ..R
        };
        let unread = |last: &str| {
            let logos = (1..13).map(|i| format!("http://cdn.example/logo/{i}.png"));
            let run = logos.chain([last.to_string()]).collect::<Vec<_>>();
            format!("{}\n", run.join(","))
        };
        for (r, last, want) in [
            (
                &at,
                "http://cdn.example/live/user%40x/pw/1.ts",
                "http://cdn.example/live/TOK/pw/1.ts",
            ),
            (
                &at,
                "http://cdn.example/get.php?username=user%40x&password=pw",
                "http://cdn.example/get.php?username=TOK&password=pw",
            ),
            (
                &at,
                "http://cdn.example/p?src=http%3A%2F%2Fxc%2Flive%2Fuser%2540x%2Fpw%2F1.ts",
                "http://cdn.example/p?src=http%3A%2F%2Fxc%2Flive%2FTOK%2Fpw%2F1.ts",
            ),
            (
                &at,
                "http://cdn.example/p?src=http%253A%252F%252Fxc%252Fuser%252540x%252Fpw%252F1",
                "http://cdn.example/p?src=http%253A%252F%252Fxc%252FTOK%252Fpw%252F1",
            ),
            (
                &R,
                "http://cdn.example/live/%61lice/pw/1.ts",
                "http://cdn.example/live/TOK/pw/1.ts",
            ),
            (
                &R,
                "http://cdn.example/live/a%6cice/pw/1.ts,http://cdn.example/a%6Cice/pw/2",
                "http://cdn.example/live/TOK/pw/1.ts,http://cdn.example/TOK/pw/2",
            ),
            (
                &R,
                "http://cdn.example/x?u=%61%6C%69%63%65&p=%2f%61lic%65%2F",
                "http://cdn.example/x?u=TOK&p=%2fTOK%2F",
            ),
            // Not a segment or a value: as written.
            (
                &R,
                "http://cdn.example/img/%61licescope.png?x=m%61lice",
                "http://cdn.example/img/%61licescope.png?x=m%61lice",
            ),
        ] {
            let out = r.rewrite_text(&unread(last));
            assert!(out.ends_with(&format!(",{want}\n")), "{last}: {out}");
            // The same in the escaped form.
            let escaped = unread(last).replace('/', "\\/");
            let out = r.rewrite_text(&format!(r#"{{"u":"{escaped}"}}"#));
            let want = want.replace('/', "\\/");
            assert!(out.ends_with(&format!(",{want}\n\"}}")), "{last}: {out}");
        }
        // A name that nearly matches at every byte: one pass, not one per place it could start.
        let long = Rewriter {
            real_user: &format!("{}b", "a".repeat(999)),
            ..R
        };
        let body = unread(&format!("http://cdn.example/{}", "%61".repeat(100_000)));
        let steps = steps(&long, &body);
        assert!(
            steps <= 2 * body.len(),
            "{steps} steps for {} bytes",
            body.len()
        );
        // A near miss first (999 bytes, then a separator), then the name.
        let a = "%61".repeat(999);
        let out = long.rewrite_text(&unread(&format!("http://cdn.example/{a}/{a}%62/pw/1")));
        assert!(
            out.ends_with(&format!(",http://cdn.example/{a}/TOK/pw/1\n")),
            "{out}"
        );
    }

    /// Text past a run's reads, in both forms: `(last URL of the run, what it becomes)`.
    fn assert_unread(r: &Rewriter<'_>, cases: &[(&str, &str)]) {
        let unread = |last: &str| {
            let logos = (1..13).map(|i| format!("http://cdn.example/logo/{i}.png"));
            let run = logos.chain([last.to_string()]).collect::<Vec<_>>();
            format!("{}\n", run.join(","))
        };
        for (last, want) in cases {
            let out = r.rewrite_text(&unread(last));
            assert!(out.ends_with(&format!(",{want}\n")), "{last}: {out}");
            let escaped = unread(last).replace('/', "\\/");
            let out = r.rewrite_text(&format!(r#"{{"u":"{escaped}"}}"#));
            let want = want.replace('/', "\\/");
            assert!(out.ends_with(&format!(",{want}\n\"}}")), "{last}: {out}");
        }
    }

    /// A username holding what reads as an escape (`ab%41`) is found past a run's reads in each
    /// spelling: as written, encoded once (`ab%2541`, as a URL names it), encoded again in a
    /// nested URL written encoded.
    #[test]
    fn a_username_holding_an_escape_past_a_runs_reads_is_replaced() {
        let r = Rewriter {
            real_user: "ab%41",
            ..R
        };
        assert_unread(
            &r,
            &[
                (
                    "http://cdn.example/live/ab%41/pw/1.ts",
                    "http://cdn.example/live/TOK/pw/1.ts",
                ),
                (
                    "http://cdn.example/live/ab%2541/pw/1.ts",
                    "http://cdn.example/live/TOK/pw/1.ts",
                ),
                (
                    "http://cdn.example/get.php?username=ab%2541&password=pw",
                    "http://cdn.example/get.php?username=TOK&password=pw",
                ),
                (
                    "http://cdn.example/p?src=http%3A%2F%2Fxc%2Flive%2Fab%252541%2Fpw%2F1.ts",
                    "http://cdn.example/p?src=http%3A%2F%2Fxc%2Flive%2FTOK%2Fpw%2F1.ts",
                ),
            ],
        );
    }

    /// Past a run's reads, an escape right after the name ends it only when it encodes a
    /// separator (`%2F`, `%3F`, `%26`, `%3A`, `%23`, either letter case, at any depth): the name
    /// in a nested URL written encoded goes, `alice%40x` (another user, `alice@x`) stays.
    #[test]
    fn an_escape_after_the_username_ends_it_only_as_a_separator() {
        assert_unread(
            &R,
            &[
                (
                    "http://cdn.example/live/alice%40x/pw/1.ts",
                    "http://cdn.example/live/alice%40x/pw/1.ts",
                ),
                (
                    "http://cdn.example/get.php?username=alice%2540x&password=pw",
                    "http://cdn.example/get.php?username=alice%2540x&password=pw",
                ),
                (
                    "http://cdn.example/live/alice%2Ex/pw/1.ts",
                    "http://cdn.example/live/alice%2Ex/pw/1.ts",
                ),
                (
                    "http://cdn.example/p?src=http%3A%2F%2Fxc%2Flive%2Falice%2fpw%2F1.ts",
                    "http://cdn.example/p?src=http%3A%2F%2Fxc%2Flive%2FTOK%2fpw%2F1.ts",
                ),
                (
                    "http://cdn.example/p?src=http%253A%252F%252Fxc%252Falice%252Fpw%252F1",
                    "http://cdn.example/p?src=http%253A%252F%252Fxc%252FTOK%252Fpw%252F1",
                ),
                (
                    "http://cdn.example/p?src=http%3A%2F%2Fxc%2Fget.php%3Fusername%3Dalice%26p%3D1",
                    "http://cdn.example/p?src=http%3A%2F%2Fxc%2Fget.php%3Fusername%3DTOK%26p%3D1",
                ),
                (
                    "http://cdn.example/p?src=rtmp%3A%2F%2Falice%3Apw%40xc%2Flive",
                    "http://cdn.example/p?src=rtmp%3A%2F%2FTOK%3Apw%40xc%2Flive",
                ),
                (
                    "http://cdn.example/p?u=alice%3Fx&v=alice%23y",
                    "http://cdn.example/p?u=TOK%3Fx&v=TOK%23y",
                ),
            ],
        );
    }

    /// A short-form URL followed by more of its run ends at `,`, `|` or a backslash (a JSON
    /// `\n` between URLs), as does a `username=` value: both are rewritten, and the URLs after
    /// them too.
    #[test]
    fn a_short_form_followed_by_more_of_its_run_is_rewritten() {
        for sep in [",", "|", r"\n"] {
            for (url, want) in [
                (
                    "http://xc.example:8080/alice/pw/1.ts",
                    "https://proxy.example/TOK/pw/1.ts",
                ),
                (
                    "http://cdn.example/alice/pw/7",
                    "https://proxy.example/TOK/pw/7",
                ),
                (
                    "http://cdn.example/get.php?password=pw&username=alice",
                    "https://proxy.example/get.php?password=pw&username=TOK",
                ),
            ] {
                let next = "http://cdn.example/live/alice/pw/2.ts";
                let next_want = "https://proxy.example/live/TOK/pw/2.ts";
                let (text, want) = (
                    format!("{url}{sep}{next}"),
                    format!("{want}{sep}{next_want}"),
                );
                assert_eq!(R.rewrite_text(&format!("{text}\n")), format!("{want}\n"));
                let (text, want) = (text.replace('/', "\\/"), want.replace('/', "\\/"));
                assert_eq!(
                    R.rewrite_text(&format!(r#"{{"u":"{text}"}}"#)),
                    format!(r#"{{"u":"{want}"}}"#)
                );
            }
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
