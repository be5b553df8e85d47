//! XC responses pointed back through the proxy: stream URLs in JSON, escaped JSON and M3U get the
//! proxy's origin and the proxy-issued username; the login answer names the proxy as the server.
//!
//! Only URLs at the provider's origin whose path has the XC credential shape are touched
//! (`/live|movie|series|timeshift/{user}/...`, `/hlsr/{s}/{user}/...`, `/{user}/{pw}/{id}`, and
//! the scripts with `username={user}`); logos and other assets at the same origin stay direct.

use serde_json::Value;

/// Largest login answer parsed as JSON. A real one (`user_info` and `server_info`) is about
/// 2 KB; a parsed JSON value costs many times its text (a body of `[0,0,0,...]` is one value per
/// two bytes), so a provider's oversized answer would otherwise cost GiBs.
pub const MAX_LOGIN_BYTES: usize = 1024 * 1024;

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
    /// (`http:\/\/`) form.
    pub fn rewrite_text(&self, body: &str) -> String {
        let plain = self.rewrite_form(body, false);
        self.rewrite_form(&plain, true)
    }

    fn rewrite_form(&self, body: &str, escaped: bool) -> String {
        let origin = if escaped {
            self.upstream_origin.replace('/', "\\/")
        } else {
            self.upstream_origin.to_string()
        };
        if origin.is_empty() {
            return body.to_string();
        }
        let mut out = String::with_capacity(body.len());
        let mut rest = body;
        while let Some(at) = rest.find(&origin) {
            out.push_str(&rest[..at]);
            let after = &rest[at + origin.len()..];
            let end = after
                .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>'))
                .unwrap_or(after.len());
            let tail = &after[..end];
            let unescaped = if escaped {
                tail.replace("\\/", "/")
            } else {
                tail.to_string()
            };
            // The origin must end where the URL's host ends (`http://h:80` is not `http://h:8080`).
            let ends_host = unescaped.is_empty() || unescaped.starts_with(['/', '?']);
            match self.rewrite_path(&unescaped).filter(|_| ends_host) {
                Some(path) => {
                    let url = format!("{}{path}", self.public_origin);
                    out.push_str(&if escaped {
                        url.replace('/', "\\/")
                    } else {
                        url
                    });
                }
                None => {
                    out.push_str(&origin);
                    out.push_str(tail);
                }
            }
            rest = &after[end..];
        }
        out.push_str(rest);
        out
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
    /// JSON are only text-rewritten. `None` for a body over [`MAX_LOGIN_BYTES`], which is not
    /// parsed: no real login answer is that big, and a text rewrite alone would leave the
    /// provider's host and user in `server_info` and `user_info`.
    pub fn rewrite_login(&self, body: &str) -> Option<String> {
        if body.len() > MAX_LOGIN_BYTES {
            return None;
        }
        let Ok(mut value) = serde_json::from_str::<Value>(body) else {
            return Some(self.rewrite_text(body));
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
        let text = serde_json::to_string(&value).unwrap_or_else(|_| body.to_string());
        Some(self.rewrite_text(&text))
    }
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
}
