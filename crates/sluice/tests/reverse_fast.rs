//! The HTTP/1.1 fast path end to end against raw origins on 127.0.0.1: the upstream head it
//! writes is byte for byte the hyper path's, pipelining, the hand-off to hyper in the middle of a
//! connection, body framings (HEAD, 204, 304, length, chunked, close-delimited, by SHA-256),
//! upstream faults, slow and idle clients, and the metrics; large counted bodies spliced socket to
//! socket (exact bytes, keep-alive after them, a client that stops reading mid-splice).

mod reverse_support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use reverse_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// `reverse_support::raw_origin` (heads recorded byte for byte, the answer `answer` gives for
/// the target, a close after one marked `close-now`) without its connection count.
async fn raw_origin(answer: Answer) -> (SocketAddr, Arc<Mutex<Vec<Vec<u8>>>>) {
    let (addr, heads, _) = reverse_support::raw_origin(answer).await;
    (addr, heads)
}

fn proxy_config(origin: SocketAddr, fast: bool, extra: &str) -> sluice::config::Config {
    config(&(toml_of(origin, fast) + extra))
}

/// [`proxy_config`]'s text, without anything extra.
fn toml_of(origin: SocketAddr, fast: bool) -> String {
    format!(
        r#"
[server]
h1_fast_path = {fast}
header_read_timeout_secs = 1
idle_timeout_secs = 2

[reverse]
forwarded = true

[[upstreams]]
name = "app"
servers = ["{origin}"]

[[routes]]
path = "/api"
upstream = "app"
strip_prefix = true
request_headers_add = {{ "x-route" = "api" }}
request_headers_remove = ["x-secret"]
response_headers_add = {{ "x-served-by" = "sluice" }}
response_headers_remove = ["x-internal"]
header_timeout_secs = 2
"#
    )
}

/// One response read off a client connection: head text and body bytes.
struct Raw {
    head: String,
    body: Vec<u8>,
}

impl Raw {
    fn status(&self) -> u16 {
        self.head[9..12].parse().unwrap()
    }

    fn field(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }
}

/// Reads one response (the request was `head_request` or not) from `s`, leaving what follows.
async fn read_response(s: &mut TcpStream, buf: &mut Vec<u8>, head_request: bool) -> Option<Raw> {
    let end = loop {
        if let Some(i) = find(buf, b"\r\n\r\n") {
            break i + 4;
        }
        if read_into(s, buf).await? == 0 {
            return None;
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    buf.drain(..end);
    let mut raw = Raw {
        head,
        body: Vec::new(),
    };
    let status = raw.status();
    if head_request || status == 204 || status == 304 {
        return Some(raw);
    }
    // Framed by the last coding (RFC 9112 §6.3).
    let chunked = raw
        .field("transfer-encoding")
        .and_then(|v| v.rsplit(',').next().map(|c| c.trim().to_string()))
        .is_some_and(|c| c.eq_ignore_ascii_case("chunked"));
    let length: Option<usize> = raw.field("content-length").map(|v| v.parse().unwrap());
    let mut decoder = sluice_http::chunked::Decoder::new();
    loop {
        if chunked {
            let used = decoder.decode(buf, &mut raw.body).ok()?;
            buf.drain(..used);
            if decoder.is_done() {
                return Some(raw);
            }
        } else if let Some(n) = length {
            let take = (n - raw.body.len()).min(buf.len());
            raw.body.extend(buf.drain(..take));
            if raw.body.len() == n {
                return Some(raw);
            }
        } else {
            raw.body.append(buf);
        }
        if read_into(s, buf).await? == 0 {
            // Close-delimited ends here; any other body was cut.
            return (length.is_none() && !chunked).then_some(raw);
        }
    }
}

/// One read from `s` appended to `buf`, within 5 s: how many bytes (0 at the end); `None` on an
/// error or the timeout.
async fn read_into(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    buf.reserve(65536);
    tokio::time::timeout(Duration::from_secs(5), s.read_buf(buf))
        .await
        .ok()?
        .ok()
}

/// A client connection to sluice and the bytes read past the last response.
struct Client {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    async fn to(p: &Proxy) -> Client {
        Client {
            s: TcpStream::connect(p.addr).await.unwrap(),
            buf: Vec::new(),
        }
    }

    /// Sends one request and reads its response (a HEAD's without a body).
    async fn ask(&mut self, request: &[u8]) -> Raw {
        self.s.write_all(request).await.unwrap();
        read_response(&mut self.s, &mut self.buf, request.starts_with(b"HEAD "))
            .await
            .expect("a complete response")
    }

    /// Reads the next response to a GET.
    async fn read(&mut self) -> Raw {
        read_response(&mut self.s, &mut self.buf, false)
            .await
            .expect("a complete response")
    }
}

fn ok_answer(body: &'static str) -> Answer {
    Arc::new(move |_t: &str| {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nX-Internal: 1\r\nConnection: keep-alive, x-hop\r\nX-Hop: 1\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    })
}

#[tokio::test]
async fn the_upstream_head_is_the_hyper_paths_byte_for_byte() {
    let (origin, heads) = raw_origin(ok_answer("hello")).await;
    let request = b"GET /api/x/../y/z?q=1&r=%20 HTTP/1.1\r\nHost: Example.COM:8080\r\nUser-Agent: t/1\r\nAccept: */*\r\nX-Multi: 1\r\nConnection: keep-alive, X-Drop\r\nX-Drop: gone\r\nX-Secret: s\r\nx-multi: 2\r\nX-Forwarded-For: 6.6.6.6\r\nVia: 1.0 front\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nCookie: a=b\r\n\r\n";
    let mut seen = Vec::new();
    let mut answers = Vec::new();
    for fast in [true, false] {
        let p = Proxy::start(proxy_config(origin, fast, "")).await;
        let r = Client::to(&p).await.ask(request).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.body, b"hello");
        answers.push(r);
        seen.push(heads.lock().unwrap().pop().unwrap());
    }
    let fast = String::from_utf8(seen[0].clone()).unwrap();
    let hyper = String::from_utf8(seen[1].clone()).unwrap();
    assert_eq!(fast, hyper, "fast path head differs from the hyper path's");
    // And byte for byte what both paths have always sent: the forwarding fields' names, values
    // and places (the client's X-Forwarded-For replaced, not extended: the peer is not trusted).
    assert_eq!(
        fast,
        "GET /y/z?q=1&r=%20 HTTP/1.1\r\nte: trailers\r\nuser-agent: t/1\r\naccept: */*\r\n\
         x-multi: 1\r\nx-multi: 2\r\ncookie: a=b\r\nvia: 1.0 front, 1.1 sluice\r\n\
         forwarded: for=127.0.0.1;host=\"Example.COM:8080\";proto=http\r\n\
         x-forwarded-for: 127.0.0.1\r\nx-forwarded-proto: http\r\n\
         x-forwarded-host: Example.COM:8080\r\nx-real-ip: 127.0.0.1\r\nx-route: api\r\n\
         host: Example.COM:8080\r\n\r\n"
    );
    assert!(
        fast.starts_with("GET /y/z?q=1&r=%20 HTTP/1.1\r\n"),
        "{fast}"
    );
    assert!(fast.contains("\r\nx-multi: 1\r\nx-multi: 2\r\n"), "{fast}");
    assert!(fast.contains("\r\nhost: Example.COM:8080\r\n"), "{fast}");
    assert!(!fast.to_ascii_lowercase().contains("x-drop"), "{fast}");
    assert!(!fast.contains("x-secret"), "{fast}");
    // The response head: same fields as the hyper path's, the origin's hop-by-hop ones dropped.
    let fields = |r: &Raw| {
        let mut f: Vec<String> = r
            .head
            .lines()
            .skip(1)
            .filter(|l| !l.is_empty() && !l.starts_with("date:"))
            .map(str::to_string)
            .collect();
        f.sort();
        f
    };
    assert_eq!(fields(&answers[0]), fields(&answers[1]));
    assert_eq!(answers[0].field("x-served-by").as_deref(), Some("sluice"));
    assert_eq!(answers[0].field("x-internal"), None);
    assert_eq!(answers[0].field("x-hop"), None);
    assert_eq!(answers[0].field("via").as_deref(), Some("1.1 sluice"));
}

/// A head without forwarding fields of its own, on a route without header edits and without
/// `Forwarded`: this hop's fields follow the client's in `forwarded::apply`'s order, then `host`,
/// the same on the fast path (written as bytes) and through hyper's client; the target goes up
/// as the client sent it.
#[tokio::test]
async fn forwarding_fields_after_a_plain_head_are_the_hyper_paths() {
    let (origin, heads) = raw_origin(ok_answer("hello")).await;
    let request = b"GET /plain/a?b=1&c=%20 HTTP/1.1\r\nHost: Example.com\r\nAccept: */*\r\nConnection: keep-alive\r\n\r\n";
    let mut seen = Vec::new();
    for fast in [true, false] {
        let p = Proxy::start(config(&format!(
            r#"
[server]
h1_fast_path = {fast}
header_read_timeout_secs = 1
idle_timeout_secs = 2

[[upstreams]]
name = "app"
servers = ["{origin}"]

[[routes]]
path = "/plain"
upstream = "app"
header_timeout_secs = 2
"#
        )))
        .await;
        let r = Client::to(&p).await.ask(request).await;
        assert_eq!(r.status(), 200);
        seen.push(String::from_utf8(heads.lock().unwrap().pop().unwrap()).unwrap());
    }
    assert_eq!(
        seen[0], seen[1],
        "fast path head differs from the hyper path's"
    );
    assert_eq!(
        seen[0],
        "GET /plain/a?b=1&c=%20 HTTP/1.1\r\naccept: */*\r\nx-forwarded-for: 127.0.0.1\r\n\
         x-forwarded-proto: http\r\nx-forwarded-host: Example.com\r\nx-real-ip: 127.0.0.1\r\n\
         via: 1.1 sluice\r\nhost: Example.com\r\n\r\n"
    );
}

/// A response head with nothing to edit, on a route without response edits, is passed on as it
/// came (`plain_head`): byte for byte what the field-map path writes for the same head (a route
/// whose only edit removes a field no head has), this hop's `Connection`/`Keep-Alive` dropped,
/// `Via` and `Connection: close` added in the same places; with `via = false` too.
#[tokio::test]
async fn plain_response_heads_are_the_field_map_paths_byte_for_byte() {
    let answer: Answer = Arc::new(|t: &str| {
        let t = t.rsplit('/').next().unwrap_or("");
        let head = match t {
            "nginx" => "HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Thu, 03 Dec 2026 06:00:00 GMT\r\n\
                        Content-Type: application/octet-stream\r\nContent-Length: 5\r\n\
                        Last-Modified: Wed, 02 Dec 2026 10:00:00 GMT\r\nConnection: keep-alive\r\n\
                        Keep-Alive: timeout=5\r\nETag: \"6752-5\"\r\nAccept-Ranges: bytes\r\n\r\n",
            "cookies" => "HTTP/1.1 201 Created\r\nSet-Cookie: a=1\r\nset-cookie: b=2\r\nX-Obs: caf\u{e9}\tok\r\n\
                          Date: Thu, 03 Dec 2026 06:00:00 GMT\r\nContent-Length: 5\r\n\r\n",
            "nodate" => "HTTP/1.1 404 Gone Fishing\r\nContent-Length: 5\r\n\r\n",
            "closes" => "HTTP/1.1 200 OK\r\nConnection: close\r\nX-Mode: close-now\r\n\
                         Date: Thu, 03 Dec 2026 06:00:00 GMT\r\nContent-Length: 5\r\n\r\n",
            "via" => "HTTP/1.1 200 OK\r\nVia: 1.1 cdn\r\nDate: Thu, 03 Dec 2026 06:00:00 GMT\r\n\
                      Content-Length: 5\r\n\r\n",
            _ => "HTTP/1.1 200 OK\r\nDate: Thu, 03 Dec 2026 06:00:00 GMT\r\nContent-Length: 5\r\n\r\n",
        };
        let mut out = head.as_bytes().to_vec();
        out.extend_from_slice(b"hello");
        out
    });
    let (origin, _, accepted) = reverse_support::raw_origin(answer).await;
    // The head as text, without a `date:` line sluice added (its own is this second's).
    let head_of = |r: &Raw| {
        let has_date = r.head.contains("Thu, 03 Dec 2026");
        r.head
            .lines()
            .filter(|l| has_date || !l.starts_with("date:"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    for via in [true, false] {
        let p = Proxy::start(config(&format!(
            r#"
[server]
header_read_timeout_secs = 1
idle_timeout_secs = 2

[reverse]
via = {via}

[[upstreams]]
name = "app"
servers = ["{origin}"]

[[routes]]
path = "/plain"
upstream = "app"

[[routes]]
path = "/mapped"
upstream = "app"
response_headers_remove = ["x-no-head-has-this"]
"#
        )))
        .await;
        for (t, method, closing) in [
            ("nginx", "GET", false),
            ("nginx", "HEAD", false),
            ("nginx", "GET", true),
            ("cookies", "GET", false),
            ("nodate", "GET", false),
            ("closes", "GET", false),
            ("via", "GET", false),
        ] {
            let mut heads = Vec::new();
            for route in ["plain", "mapped"] {
                let close = if closing { "Connection: close\r\n" } else { "" };
                let request = format!("{method} /{route}/{t} HTTP/1.1\r\nHost: a\r\n{close}\r\n");
                let mut c = Client::to(&p).await;
                let r = c.ask(request.as_bytes()).await;
                if method == "GET" {
                    assert_eq!(r.body, b"hello", "{route} {t}");
                }
                heads.push(head_of(&r));
            }
            // The same status line and fields; the order can differ where the map path took a
            // hop-by-hop field out (a field map moves its last field into the gap).
            let sorted = |h: &str| {
                let mut lines: Vec<&str> = h.lines().collect();
                lines[1..].sort_unstable();
                lines.join("\n")
            };
            assert_eq!(
                sorted(&heads[0]),
                sorted(&heads[1]),
                "{t} {method} close={closing} via={via}"
            );
            let head = &heads[0];
            assert!(!head.contains("keep-alive"), "{head}");
            assert_eq!(head.contains("1.1 sluice"), via, "{head}");
            assert_eq!(head.contains("connection: close"), closing, "{head}");
            if t == "closes" {
                // The origin's order, its own `Connection` left out.
                let expected = "HTTP/1.1 200 OK\nx-mode: close-now\n\
                                date: Thu, 03 Dec 2026 06:00:00 GMT\ncontent-length: 5";
                assert!(head.starts_with(expected), "{head}");
            }
            if t == "nginx" {
                let expected = "HTTP/1.1 200 OK\nserver: nginx/1.22.1\n\
                                date: Thu, 03 Dec 2026 06:00:00 GMT\n\
                                content-type: application/octet-stream\ncontent-length: 5\n\
                                last-modified: Wed, 02 Dec 2026 10:00:00 GMT\n\
                                etag: \"6752-5\"\naccept-ranges: bytes";
                assert!(head.starts_with(expected), "{head}");
            }
            if t == "nodate" {
                assert!(head.starts_with("HTTP/1.1 404 Not Found\n"), "{head}");
            }
        }
        // A keep-alive client gets several plain answers on one connection, and the upstream
        // connection is reused (the origin saw one connection for them).
        let mut c = Client::to(&p).await;
        let before = accepted.load(std::sync::atomic::Ordering::SeqCst);
        for _ in 0..3 {
            let r = c.ask(b"GET /plain/nginx HTTP/1.1\r\nHost: a\r\n\r\n").await;
            assert_eq!(r.body, b"hello");
        }
        let after = accepted.load(std::sync::atomic::Ordering::SeqCst);
        assert!(
            after - before <= 1,
            "{} upstream connections",
            after - before
        );
    }
    // The order of a repeated name is the origin's on the plain path (a field map groups it).
    let p = Proxy::start(config(&format!(
        "[[upstreams]]\nname = \"app\"\nservers = [\"{origin}\"]\n\
         [[routes]]\npath = \"/plain\"\nupstream = \"app\"\n"
    )))
    .await;
    let r = Client::to(&p)
        .await
        .ask(b"GET /plain/cookies HTTP/1.1\r\nHost: a\r\n\r\n")
        .await;
    assert!(
        r.head
            .contains("set-cookie: a=1\r\nset-cookie: b=2\r\nx-obs: caf\u{e9}\tok\r\n"),
        "{}",
        r.head
    );
}

/// Heads that repeat with a new date, or differ in a length, a field or the date's form, come
/// through one upstream connection each as it came (sluice keeps the last plain head per upstream
/// connection and passes the next one like it on without a parse).
#[tokio::test]
async fn heads_repeated_or_changed_on_one_upstream_connection_each_come_through_as_they_came() {
    // The target says what to answer: `d<N>` a date of second N (`h<N>` the same for HEAD, no
    // body), `len` a longer body, `field` one field more, `short` a date of another length,
    // `ctl` a date the parser refuses.
    let answer: Answer = Arc::new(|t: &str| {
        let t = t.rsplit('/').next().unwrap_or("").to_string();
        let (date, extra, body) = match t.as_str() {
            "len" => ("Fri, 04 Dec 2026 06:00:00 GMT".to_string(), "", "hello!"),
            "field" => (
                "Fri, 04 Dec 2026 06:00:00 GMT".to_string(),
                "X-More: 1\r\n",
                "hello",
            ),
            "short" => ("Fri, 4 Dec 2026 06:00:00 GMT".to_string(), "", "hello"),
            "ctl" => ("Fri, 04 Dec 2026 06:00:\x010 GMT".to_string(), "", "hello"),
            d => (
                format!(
                    "Fri, 04 Dec 2026 06:00:{:02} GMT",
                    d[1..].parse::<u32>().unwrap()
                ),
                "",
                "hello",
            ),
        };
        let sent = if t.starts_with('h') { "" } else { body };
        format!(
            "HTTP/1.1 200 OK\r\nServer: o\r\nDate: {date}\r\n{extra}Content-Length: {}\r\n\
             ETag: \"e\"\r\n\r\n{sent}",
            body.len()
        )
        .into_bytes()
    });
    let (origin, _, accepted) = reverse_support::raw_origin(answer).await;
    // A route without edits: its heads are plain.
    let p = Proxy::start(config(&format!(
        "[[upstreams]]\nname = \"app\"\nservers = [\"{origin}\"]\n\
         [[routes]]\npath = \"/\"\nupstream = \"app\"\n"
    )))
    .await;
    let mut c = Client::to(&p).await;
    for (t, method) in [
        ("d1", "GET"),
        ("d1", "GET"),
        ("d2", "GET"),
        ("h3", "HEAD"),
        ("d4", "GET"),
        ("len", "GET"),
        ("d5", "GET"),
        ("field", "GET"),
        ("d6", "GET"),
        ("short", "GET"),
        ("d7", "GET"),
        ("ctl", "GET"),
        ("d8", "GET"),
    ] {
        let r = c
            .ask(format!("{method} /{t} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes())
            .await;
        if t == "ctl" {
            // Refused by the parser as on any path; the connection goes on.
            assert_eq!(r.status(), 502, "{}", r.head);
            continue;
        }
        assert_eq!(r.status(), 200, "{t}: {}", r.head);
        let date = match t {
            "short" => "Fri, 4 Dec 2026 06:00:00 GMT".to_string(),
            "len" | "field" => "Fri, 04 Dec 2026 06:00:00 GMT".to_string(),
            d => format!(
                "Fri, 04 Dec 2026 06:00:{:02} GMT",
                d[1..].parse::<u32>().unwrap()
            ),
        };
        assert_eq!(r.field("date").as_deref(), Some(date.as_str()), "{t}");
        let body: &[u8] = if t == "len" { b"hello!" } else { b"hello" };
        assert_eq!(
            r.field("content-length"),
            Some(body.len().to_string()),
            "{t}"
        );
        assert_eq!(r.field("x-more").is_some(), t == "field", "{t}");
        assert_eq!(r.field("etag").as_deref(), Some("\"e\""), "{t}");
        if method == "GET" {
            assert_eq!(r.body, body, "{t}");
        }
    }
    // All of them on one upstream connection but after the refused head (which closes it).
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    let answer: Answer = Arc::new(|t: &str| {
        let body = t.to_string();
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    });
    let (origin, _) = raw_origin(answer).await;
    let p = Proxy::start(proxy_config(origin, true, "")).await;
    let mut c = Client::to(&p).await;
    let mut batch = Vec::new();
    for i in 0..5 {
        batch.extend_from_slice(format!("GET /api/n{i} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes());
    }
    c.s.write_all(&batch).await.unwrap();
    for i in 0..5 {
        let r = c.read().await;
        assert_eq!(r.status(), 200);
        assert_eq!(String::from_utf8(r.body).unwrap(), format!("/n{i}"));
    }
}

#[tokio::test]
async fn a_post_mid_connection_hands_over_to_hyper_and_the_connection_goes_on() {
    let o = echo("a").await;
    let p = Proxy::start(proxy_config(o, true, "")).await;
    let mut c = Client::to(&p).await;
    let r = c.ask(b"GET /api/one HTTP/1.1\r\nHost: a\r\n\r\n").await;
    let j: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(j["path"], "/one");
    // A POST with a body, and a GET pipelined right behind it: hyper takes both.
    let body = pattern(100_000);
    let mut post = format!(
        "POST /api/two HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    post.extend_from_slice(&body);
    post.extend_from_slice(b"GET /api/three HTTP/1.1\r\nHost: a\r\n\r\n");
    c.s.write_all(&post).await.unwrap();
    let r = c.read().await;
    let j: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(j["method"], "POST");
    assert_eq!(j["sha256"], sha256(&body));
    let r = c.read().await;
    let j: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(j["path"], "/three");
}

#[tokio::test]
async fn bodiless_answers_and_every_body_framing() {
    let big = pattern(3 * 1024 * 1024 + 17);
    let big2 = big.clone();
    let answer: Answer = Arc::new(move |t: &str| {
        match t {
        "/head" => b"HTTP/1.1 200 OK\r\nContent-Length: 12345\r\n\r\n".to_vec(),
        "/204" => b"HTTP/1.1 204 No Content\r\nX-A: 1\r\n\r\n".to_vec(),
        "/304" => b"HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\nContent-Length: 99\r\n\r\n".to_vec(),
        "/interim" => b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec(),
        "/chunked" => {
            let mut out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            for piece in big2.chunks(70_000) {
                out.extend_from_slice(format!("{:x};ext=1\r\n", piece.len()).as_bytes());
                out.extend_from_slice(piece);
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"0\r\nX-Trailer: t\r\n\r\n");
            out
        }
        // A coding not ending in chunked: delimited by the close.
        "/gzip" => {
            let mut out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nX-Mode: close-now\r\n\r\n".to_vec();
            out.extend_from_slice(&big2[..100_000]);
            out
        }
        // Two fields whose last coding is not chunked: the body ends at the close, and the
        // client is told both codings, not the first field's alone.
        "/two-codings" => {
            let mut out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\nX-Mode: close-now\r\n\r\n".to_vec();
            out.extend_from_slice(&big2[..50_000]);
            out
        }
        // Both framings: the coded one wins (RFC 9112 §6.3), and the client never sees both.
        "/both" => b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".to_vec(),
        "/close" => {
            let mut out = b"HTTP/1.1 200 OK\r\nX-Mode: close-now\r\n\r\n".to_vec();
            out.extend_from_slice(&big2);
            out
        }
        _ => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec(),
    }
    });
    let (origin, _) = raw_origin(answer).await;
    let p = Proxy::start(proxy_config(origin, true, "")).await;
    let mut c = Client::to(&p).await;
    let r = c.ask(b"HEAD /api/head HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.field("content-length").as_deref(), Some("12345"));
    for (path, status) in [("/api/204", 204), ("/api/304", 304), ("/api/interim", 200)] {
        c.s.write_all(format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let r = c.read().await;
        assert_eq!(r.status(), status, "{path}");
    }
    // Same connection still: nothing was left over from the bodiless answers.
    let r = c.ask(b"GET /api/chunked HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(r.field("transfer-encoding").as_deref(), Some("chunked"));
    assert_eq!(sha256(&r.body), sha256(&big));
    let r = c.ask(b"GET /api/both HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(r.field("transfer-encoding").as_deref(), Some("chunked"));
    assert_eq!(r.field("content-length"), None);
    assert_eq!(r.body, b"hello");
    // Close-delimited: relayed, then the client connection is closed.
    let r = c.ask(b"GET /api/close HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(r.field("connection").as_deref(), Some("close"));
    assert_eq!(sha256(&r.body), sha256(&big));
    let mut c = Client::to(&p).await;
    let r = c.ask(b"GET /api/gzip HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(r.field("transfer-encoding").as_deref(), Some("gzip"));
    assert_eq!(r.field("content-length"), None);
    assert_eq!(r.field("connection").as_deref(), Some("close"));
    assert_eq!(sha256(&r.body), sha256(&big[..100_000]));
    let mut c = Client::to(&p).await;
    let r = c
        .ask(b"GET /api/two-codings HTTP/1.1\r\nHost: a\r\n\r\n")
        .await;
    assert_eq!(
        r.field("transfer-encoding").as_deref(),
        Some("chunked, gzip")
    );
    assert_eq!(r.field("connection").as_deref(), Some("close"));
    assert_eq!(sha256(&r.body), sha256(&big[..50_000]));
}

#[tokio::test]
async fn upstream_faults_match_the_hyper_path() {
    let answer: Answer = Arc::new(|t: &str| match t {
        "/garbage" => b"SPDY/9 banana\r\n\r\nclose-now".to_vec(),
        "/reset" => {
            let mut out =
                b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\nX-Mode: close-now\r\n\r\n".to_vec();
            out.extend_from_slice(&pattern(1000));
            out
        }
        _ => b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec(),
    });
    let (origin, _) = raw_origin(answer).await;
    let dead = dead_port().await;
    let mut garbage = Vec::new();
    for fast in [true, false] {
        let p = Proxy::start(proxy_config(origin, fast, "")).await;
        let mut c = Client::to(&p).await;
        let r = c.ask(b"GET /api/garbage HTTP/1.1\r\nHost: a\r\n\r\n").await;
        garbage.push((r.status(), r.field("content-type"), r.body));
        // Cut mid-body: the head went out, then the client connection is cut short.
        let mut c = Client::to(&p).await;
        c.s.write_all(b"GET /api/reset HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .unwrap();
        let mut all = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), c.s.read_to_end(&mut all)).await;
        let text = String::from_utf8_lossy(&all[..all.len().min(200)]).into_owned();
        assert!(
            text.starts_with("HTTP/1.1 200 OK\r\n"),
            "fast={fast}: {text}"
        );
        assert!(all.len() < 1_000_000, "fast={fast}: the cut was hidden");
    }
    assert_eq!(garbage[0].0, 502);
    assert_eq!(garbage[0], garbage[1]);
    // A refused server: the same 502 as the hyper path.
    let mut refused = Vec::new();
    for fast in [true, false] {
        let p = Proxy::start(proxy_config(dead, fast, "")).await;
        let mut c = Client::to(&p).await;
        let r = c.ask(b"GET /api/x HTTP/1.1\r\nHost: a\r\n\r\n").await;
        refused.push((r.status(), r.body));
    }
    assert_eq!(refused[0].0, 502);
    assert_eq!(refused[0], refused[1]);
}

/// An origin that takes connections and requests and never answers.
async fn silent_origin() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut sink = [0u8; 4096];
                while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
            });
        }
    });
    addr
}

/// An origin that takes the request and never answers: the fast path, which keeps the route's
/// header timeout (2 s here) without a timer of its own, looking at it on its connection's tick
/// (1 s here), answers the same 504 as the hyper path within a tick of the deadline (the bound
/// allows another second for a loaded machine). With a second server in the group, the request
/// moves on to it and is answered.
#[tokio::test]
async fn a_silent_upstream_times_out_as_on_the_hyper_path() {
    let silent = silent_origin().await;
    let mut answers = Vec::new();
    for fast in [true, false] {
        let p = Proxy::start(proxy_config(silent, fast, "")).await;
        let mut c = Client::to(&p).await;
        let started = tokio::time::Instant::now();
        let r = c.ask(b"GET /api/x HTTP/1.1\r\nHost: a\r\n\r\n").await;
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(1990) && took < Duration::from_millis(4500),
            "fast={fast}: answered after {took:?}"
        );
        answers.push((r.status(), r.field("content-type"), r.body));
    }
    assert_eq!(answers[0].0, 504);
    assert_eq!(answers[0], answers[1]);

    let (origin, _) = raw_origin(ok_answer("hi")).await;
    let both = format!("servers = [\"{silent}\", \"{origin}\"]");
    for fast in [true, false] {
        let text = toml_of(silent, fast).replace(&format!("servers = [\"{silent}\"]"), &both);
        let p = Proxy::start(config(&text)).await;
        let mut c = Client::to(&p).await;
        let mut slow = 0;
        for _ in 0..2 {
            let started = tokio::time::Instant::now();
            let r = c.ask(b"GET /api/x HTTP/1.1\r\nHost: a\r\n\r\n").await;
            assert_eq!(
                (r.status(), r.body.as_slice()),
                (200, &b"hi"[..]),
                "fast={fast}"
            );
            if started.elapsed() >= Duration::from_millis(1990) {
                slow += 1;
            }
        }
        // Round robin sends one of the two to the silent server first (or only the first, if
        // its failure took it out of the plan).
        assert!(slow >= 1, "fast={fast}: the silent server was never tried");
    }
}

#[tokio::test]
async fn slow_and_idle_clients_are_cut() {
    let (origin, _) = raw_origin(ok_answer("hi")).await;
    let p = Proxy::start(proxy_config(origin, true, "")).await;
    // A head that never completes: closed after header_read_timeout_secs (1 s), no answer.
    let mut c = Client::to(&p).await;
    c.s.write_all(b"GET /api/x HTTP/1.1\r\nHost: a\r\nX-Slow: ")
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), c.s.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "slowloris connection not cut");
    assert!(out.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(900));
    // Keep-alive: idle for idle_timeout_secs (2 s) after a request, then closed.
    let mut c = Client::to(&p).await;
    let r = c.ask(b"GET /api/x HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(r.body, b"hi");
    let started = tokio::time::Instant::now();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(6), c.s.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "idle connection not cut");
    assert!(rest.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(1900));
}

/// Reads until the proxy closes the connection (bounded): the bytes read, or `None` when it
/// was still open after `limit`.
async fn closed_within(s: &mut TcpStream, limit: Duration) -> Option<Vec<u8>> {
    let mut rest = Vec::new();
    tokio::time::timeout(limit, s.read_to_end(&mut rest))
        .await
        .ok()?
        .ok()?;
    Some(rest)
}

/// Idle connections wait on the runtime's one clock rather than a timer each: a crowd of idle
/// keep-alive clients is still closed at the idle timeout (not before, and not long after), one
/// that never sends a head at the header read timeout, and a client that keeps asking within
/// the timeout is served past it, its clock restarting with each request.
#[tokio::test]
async fn idle_connections_are_closed_on_time_by_the_shared_clock() {
    let (origin, _) = raw_origin(ok_answer("hi")).await;
    let p = Proxy::start(proxy_config(origin, true, "")).await;
    let mut idle = Vec::new();
    for _ in 0..40 {
        let mut c = Client::to(&p).await;
        assert_eq!(
            c.ask(b"GET /api/x HTTP/1.1\r\nHost: a\r\n\r\n").await.body,
            b"hi"
        );
        idle.push((c, tokio::time::Instant::now()));
    }
    let mut silent = TcpStream::connect(p.addr).await.unwrap();
    let silent_since = tokio::time::Instant::now();
    let mut busy = Client::to(&p).await;
    let busy_since = tokio::time::Instant::now();
    let keep_asking = async {
        // Every 600 ms for 3.6 s: longer than the 2 s idle timeout, never idle that long.
        for _ in 0..6 {
            let r = busy.ask(b"GET /api/x HTTP/1.1\r\nHost: a\r\n\r\n").await;
            assert_eq!(r.body, b"hi");
            tokio::time::sleep(Duration::from_millis(600)).await;
        }
        assert!(busy_since.elapsed() >= Duration::from_millis(3_500));
        let r = busy.ask(b"GET /api/x HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert_eq!(r.body, b"hi");
    };
    let silent_cut = async {
        let rest = closed_within(&mut silent, Duration::from_secs(6)).await;
        assert_eq!(
            rest.as_deref(),
            Some(&b""[..]),
            "a silent connection was not cut"
        );
        // header_read_timeout_secs = 1
        assert!(silent_since.elapsed() >= Duration::from_millis(900));
    };
    let idle_cut = async {
        for (c, since) in &mut idle {
            let rest = closed_within(&mut c.s, Duration::from_secs(6)).await;
            assert_eq!(
                rest.as_deref(),
                Some(&b""[..]),
                "an idle connection was not cut"
            );
            // idle_timeout_secs = 2
            assert!(
                since.elapsed() >= Duration::from_millis(1_800),
                "{:?}",
                since.elapsed()
            );
        }
    };
    tokio::join!(keep_asking, silent_cut, idle_cut);
}

/// On shutdown the clock wakes every idle connection: one that asks in the next moment is
/// answered with `Connection: close`, one that stays silent is closed about a second later,
/// long before its 30 s keep-alive timeout.
#[tokio::test]
async fn shutdown_drains_idle_connections_waiting_on_the_clock() {
    let (origin, _) = raw_origin(ok_answer("hi")).await;
    let mut config = proxy_config(origin, true, "");
    config.server.idle_timeout_secs = 30;
    let p = Proxy::start(config).await;
    let mut asks = Client::to(&p).await;
    let mut quiet = Client::to(&p).await;
    for c in [&mut asks, &mut quiet] {
        assert_eq!(
            c.ask(b"GET /api/x HTTP/1.1\r\nHost: a\r\n\r\n").await.body,
            b"hi"
        );
    }
    // Both idle on the clock by now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopped = tokio::time::Instant::now();
    drop(p);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = asks.ask(b"GET /api/x HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(r.body, b"hi");
    assert_eq!(r.field("connection").as_deref(), Some("close"));
    let rest = closed_within(&mut asks.s, Duration::from_secs(3)).await;
    assert_eq!(rest.as_deref(), Some(&b""[..]));
    let rest = closed_within(&mut quiet.s, Duration::from_secs(3)).await;
    assert_eq!(
        rest.as_deref(),
        Some(&b""[..]),
        "an idle connection outlived the drain"
    );
    assert!(stopped.elapsed() >= Duration::from_millis(950));
}

#[tokio::test]
async fn fast_path_requests_are_metered() {
    let (origin, _) = raw_origin(ok_answer("hello")).await;
    let p = Proxy::start(proxy_config(origin, true, "")).await;
    let mut c = Client::to(&p).await;
    for _ in 0..7 {
        let r = c.ask(b"GET /api/m HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert_eq!(r.body, b"hello");
    }
    // One upstream connection carried all seven.
    let m = get(&p.url("/metrics"), &[]).await;
    let text = String::from_utf8(m.body.unwrap().to_vec()).unwrap();
    let line = |prefix: &str| -> Option<String> {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .map(str::to_string)
    };
    assert_eq!(
        line("sluice_requests_total{endpoint=\"reverse\",status=\"200\"}").as_deref(),
        Some("sluice_requests_total{endpoint=\"reverse\",status=\"200\"} 7"),
        "{text}"
    );
    assert!(
        line("sluice_sent_bytes_total{endpoint=\"reverse\"}").is_some_and(|l| l.ends_with(" 35")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("sluice_reverse_requests_total{")
                && l.contains("class=\"2xx\"")
                && l.ends_with(" 7")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("sluice_reverse_server_requests_total{") && l.ends_with(" 7")),
        "{text}"
    );
    let _ = Bytes::new();
}

#[tokio::test]
async fn shutdown_finishes_the_response_in_flight_then_closes() {
    let o = origin(|_req| async {
        tokio::time::sleep(Duration::from_millis(400)).await;
        http::Response::new(full(pattern(50_000)))
    })
    .await;
    let p = Proxy::start(proxy_config(o, true, "")).await;
    let mut c = Client::to(&p).await;
    c.s.write_all(b"GET /api/slow HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Shutdown begins while the origin is still thinking.
    drop(p);
    let r = c.read().await;
    assert_eq!(r.status(), 200);
    assert_eq!(sha256(&r.body), sha256(&pattern(50_000)));
    assert_eq!(r.field("connection").as_deref(), None);
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), c.s.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "connection not closed after shutdown");
    assert!(rest.is_empty());
}

#[tokio::test]
async fn fast_path_requests_reach_the_access_log() {
    let (origin, _) = raw_origin(ok_answer("hello")).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let mut config = proxy_config(origin, true, "");
    config.reverse.access_log = log.to_str().unwrap().to_string();
    let p = Proxy::start(config).await;
    let mut c = Client::to(&p).await;
    let r = c
        .ask(b"GET /api/log?x=1 HTTP/1.1\r\nHost: a\r\nUser-Agent: probe/1\r\nReferer: http://r/\r\n\r\n")
        .await;
    assert_eq!(r.body, b"hello");
    let r = c.ask(b"HEAD /api/log HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(r.status(), 200);
    // Written off the request path: wait for both lines.
    let mut lines = Vec::new();
    for _ in 0..50 {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        lines = text.lines().map(str::to_string).collect();
        if lines.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(lines.len(), 2, "{lines:?}");
    let get: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(get["method"], "GET");
    assert_eq!(get["target"], "/api/log?x=1");
    assert_eq!(get["proto"], "HTTP/1.1");
    assert_eq!(get["status"], 200);
    assert_eq!(get["bytes"], 5);
    assert_eq!(get["client"], "127.0.0.1");
    assert_eq!(get["server"], origin.to_string());
    assert_eq!(get["user_agent"], "probe/1");
    assert_eq!(get["referer"], "http://r/");
    let head: serde_json::Value = serde_json::from_str(&lines[1]).unwrap();
    assert_eq!(head["method"], "HEAD");
    assert_eq!(head["bytes"], 0);
}

#[tokio::test]
async fn an_idle_upstream_connection_is_closed_after_pool_idle_secs() {
    // One connection: answer one request, then time how long sluice keeps it open.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = listener.local_addr().unwrap();
    let closed_after = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        let mut got = Vec::new();
        while find(&got, b"\r\n\r\n").is_none() {
            let n = s.read(&mut buf).await.unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            .await
            .unwrap();
        let idle_from = tokio::time::Instant::now();
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await;
        (n.map(|r| r.unwrap_or(0)).ok(), idle_from.elapsed())
    });
    let mut config = proxy_config(origin, true, "");
    config.reverse.pool_idle_secs = 1;
    let p = Proxy::start(config).await;
    let r = Client::to(&p)
        .await
        .ask(b"GET /api/x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .await;
    assert_eq!(r.body, b"ok");
    // No further request comes: the pool's sweep closes it, not a later check-out.
    let (read, after) = closed_after.await.unwrap();
    assert_eq!(read, Some(0), "the idle upstream connection was not closed");
    assert!(
        after >= Duration::from_millis(900),
        "closed too early: {after:?}"
    );
    assert!(after < Duration::from_secs(3), "closed late: {after:?}");
    drop(p);
}

/// The value of the metric line starting with `prefix` on `p`'s `/metrics`.
async fn metric(p: &Proxy, prefix: &str) -> Option<String> {
    let m = get(&p.url("/metrics"), &[]).await;
    let text = String::from_utf8(m.body.unwrap().to_vec()).unwrap();
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .map(str::to_string)
}

/// Everything `s` still delivers until it ends, within 10 s (`None`: it did not end).
async fn read_until_cut(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut all = Vec::new();
    let mut chunk = vec![0u8; 1 << 20];
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => all.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await
    .ok()?;
    Some(all)
}

/// An answer with a counted body of `body`'s bytes.
fn counted(body: &Bytes) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
    out.extend_from_slice(body);
    out
}

#[tokio::test]
async fn large_counted_bodies_are_spliced_exactly_and_both_connections_live_on() {
    let big = pattern(3 * 1024 * 1024 + 17);
    // Just above the splice threshold once the head's read took its share, and just below it.
    let mid = pattern(200_000);
    let small = pattern(40_000);
    let (b, m, sm) = (big.clone(), mid.clone(), small.clone());
    let answer: Answer = Arc::new(move |t: &str| match t {
        "/big" => counted(&b),
        "/mid" => counted(&m),
        _ => counted(&sm),
    });
    let (origin, heads, accepted) = reverse_support::raw_origin(answer).await;
    // The third round: splicing on but no pipe to be had (the descriptor limit): the bodies go
    // by copy, whole, where the splice cut them short after their heads.
    for (splice, no_pipe) in [(true, false), (false, false), (true, true)] {
        sluice::net::splice::refuse_pipes_on_this_thread(no_pipe);
        heads.lock().unwrap().clear();
        accepted.store(0, std::sync::atomic::Ordering::SeqCst);
        let mut config = proxy_config(origin, true, "");
        config.reverse.splice_bodies = splice;
        let p = Proxy::start(config).await;
        let mut c = Client::to(&p).await;
        // Pipelined: a spliced body must neither swallow nor reorder what follows it.
        c.s.write_all(
            b"GET /api/big HTTP/1.1\r\nHost: a\r\n\r\nGET /api/small HTTP/1.1\r\nHost: a\r\n\r\n\
              GET /api/mid HTTP/1.1\r\nHost: a\r\n\r\nGET /api/big HTTP/1.1\r\nHost: a\r\n\r\n",
        )
        .await
        .unwrap();
        for want in [&big, &small, &mid, &big] {
            let r = c.read().await;
            assert_eq!(r.status(), 200, "splice={splice} no_pipe={no_pipe}");
            assert_eq!(
                r.field("content-length"),
                Some(want.len().to_string()),
                "splice={splice} no_pipe={no_pipe}"
            );
            assert_eq!(
                sha256(&r.body),
                sha256(want),
                "splice={splice} no_pipe={no_pipe}"
            );
        }
        // The client connection carries on after them.
        let r = c.ask(b"GET /api/small HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert_eq!(sha256(&r.body), sha256(&small));
        assert_eq!(
            heads.lock().unwrap().len(),
            5,
            "splice={splice} no_pipe={no_pipe}"
        );
        // Every body was read to its end, so one upstream connection carried all five requests.
        assert_eq!(
            accepted.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "splice={splice} no_pipe={no_pipe}"
        );
        let spliced = metric(&p, "sluice_reverse_spliced_bodies_total{").await;
        let want = if splice && !no_pipe { "3" } else { "0" };
        assert_eq!(
            spliced.as_deref().unwrap_or("0"),
            want,
            "splice={splice} no_pipe={no_pipe}"
        );
        let sent = metric(&p, "sluice_sent_bytes_total{endpoint=\"reverse\"}").await;
        let total = 2 * big.len() + mid.len() + 2 * small.len();
        assert_eq!(
            sent,
            Some(total.to_string()),
            "splice={splice} no_pipe={no_pipe}"
        );
    }
    sluice::net::splice::refuse_pipes_on_this_thread(false);
}

#[tokio::test]
async fn a_client_that_stops_reading_a_spliced_body_is_cut_and_others_go_on() {
    // Far more than the loopback socket buffers hold, so the splice blocks on the client.
    let big = pattern(64 * 1024 * 1024);
    let b = big.clone();
    let (origin, _) = raw_origin(Arc::new(move |_t: &str| counted(&b))).await;
    let mut config = proxy_config(origin, true, "");
    config.server.send_timeout_secs = 1;
    let p = Proxy::start(config).await;
    let mut stalled = Client::to(&p).await;
    stalled
        .s
        .write_all(b"GET /api/big HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    // Meanwhile another client gets the whole body.
    let mut c = Client::to(&p).await;
    let r = c.ask(b"GET /api/big HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(sha256(&r.body), sha256(&big));
    // The stalled client reads nothing for 4 s (the send timeout is 1 s, checked each second),
    // then finds its connection ended before the body's end.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let all = read_until_cut(&mut stalled.s)
        .await
        .expect("the stalled connection was never cut");
    assert!(all.starts_with(b"HTTP/1.1 200 OK\r\n"));
    assert!(
        all.len() < big.len(),
        "the whole body arrived: {}",
        all.len()
    );
    let timeouts = metric(&p, "sluice_downstream_send_timeouts_total").await;
    assert_eq!(timeouts.as_deref(), Some("1"));
    // Both bodies took the splice path.
    let spliced = metric(&p, "sluice_reverse_spliced_bodies_total{").await;
    assert_eq!(spliced.as_deref(), Some("2"));
    // The cut body's bytes count too: one whole body and part of another.
    let sent: u64 = metric(&p, "sluice_sent_bytes_total{endpoint=\"reverse\"}")
        .await
        .unwrap()
        .parse()
        .unwrap();
    assert!(sent > big.len() as u64, "{sent}");
    // The proxy still serves.
    let mut c = Client::to(&p).await;
    let r = c.ask(b"GET /api/big HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(sha256(&r.body), sha256(&big));
}

/// What a caching origin answers: `/api/big*` a counted body of `big`'s bytes, `/api/chunked` the
/// bytes of `small` in 7,000-byte chunks (no length), both cacheable for an hour with an ETag.
fn cacheable(big: Bytes, small: Bytes) -> Answer {
    Arc::new(move |t: &str| {
        let fields = "Cache-Control: max-age=3600\r\nETag: \"e1\"\r\nX-Internal: 1\r\n";
        if t.starts_with("/big") {
            let mut out = format!(
                "HTTP/1.1 200 OK\r\n{fields}Content-Length: {}\r\n\r\n",
                big.len()
            )
            .into_bytes();
            out.extend_from_slice(&big);
            return out;
        }
        let mut out =
            format!("HTTP/1.1 200 OK\r\n{fields}Transfer-Encoding: chunked\r\n\r\n").into_bytes();
        for c in small.chunks(7000) {
            out.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
            out.extend_from_slice(c);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0\r\n\r\n");
        out
    })
}

const CACHED: &str = r#"cache = true

[cache]
memory_bytes = "64MiB"
slice_bytes = "1MiB"
sendfile = true
"#;

/// A response head without the fields that vary from one answer to the next.
fn stable_head(r: &Raw) -> String {
    r.head
        .lines()
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            !(l.starts_with("date:") || l.starts_with("age:") || l.starts_with("cache-status:"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn caching_routes_answer_on_the_fast_path_as_through_hyper_with_hits_sent_from_files() {
    let big = pattern(3 * 1024 * 1024 + 17);
    let small = pattern(200_000);
    let (origin, _) = raw_origin(cacheable(big.clone(), small.clone())).await;
    let range = 1000..=2_100_000usize;
    let mut heads: Vec<Vec<String>> = Vec::new();
    for fast in [true, false] {
        let p = Proxy::start(proxy_config(origin, fast, CACHED)).await;
        let mut c = Client::to(&p).await;
        let mut seen = Vec::new();
        // A miss, then a hit, on one connection.
        for hit in [false, true] {
            let r = c.ask(b"GET /api/big HTTP/1.1\r\nHost: a\r\n\r\n").await;
            assert_eq!(r.status(), 200);
            assert_eq!(sha256(&r.body), sha256(&big), "fast {fast}, hit {hit}");
            let status = r.field("cache-status").unwrap();
            assert_eq!(status.contains("; hit"), hit, "{status}");
            assert_eq!(r.field("x-served-by").as_deref(), Some("sluice"));
            assert_eq!(r.field("x-internal"), None);
            seen.push(stable_head(&r));
        }
        let r = c
            .ask(b"GET /api/big HTTP/1.1\r\nHost: a\r\nRange: bytes=1000-2100000\r\n\r\n")
            .await;
        assert_eq!(r.status(), 206);
        assert_eq!(r.body, &big[range.clone()]);
        seen.push(stable_head(&r));
        let r = c
            .ask(b"GET /api/big HTTP/1.1\r\nHost: a\r\nRange: bytes=0-9,-5\r\n\r\n")
            .await;
        assert_eq!(r.status(), 206);
        let text = String::from_utf8_lossy(&r.body).into_owned();
        assert!(text.contains("Content-Range: bytes 0-9/3145745"), "{text}");
        assert!(r.body.ends_with(b"--\r\n"));
        let r = c.ask(b"HEAD /api/big HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert_eq!(r.field("content-length").as_deref(), Some("3145745"));
        seen.push(stable_head(&r));
        let r = c
            .ask(b"GET /api/big HTTP/1.1\r\nHost: a\r\nIf-None-Match: \"e1\"\r\n\r\n")
            .await;
        assert_eq!(r.status(), 304);
        assert!(r.body.is_empty());
        seen.push(stable_head(&r));
        // An object of unknown length goes out chunked while it fills, counted once stored.
        let r = c.ask(b"GET /api/chunked HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert_eq!(r.field("transfer-encoding").as_deref(), Some("chunked"));
        assert_eq!(sha256(&r.body), sha256(&small));
        seen.push(stable_head(&r));
        let r = c.ask(b"GET /api/chunked HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert_eq!(r.field("content-length").as_deref(), Some("200000"));
        assert_eq!(sha256(&r.body), sha256(&small));
        seen.push(stable_head(&r));
        // The connection lived through all of it.
        let r = c.ask(b"GET /api/big HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert_eq!(sha256(&r.body), sha256(&big));
        let sent = metric(&p, "sluice_cache_memory_sendfile_bytes_total").await;
        let want = if fast {
            // The hits' 1 MiB slices (the 17-byte tail is on the heap), the range, the first
            // part of the two, the stored chunked object, and the last hit.
            (3 * 1024 * 1024 + (range.end() - range.start() + 1) + 10 + 200_000 + 3 * 1024 * 1024)
                .to_string()
        } else {
            "0".to_string()
        };
        assert_eq!(sent.as_deref(), Some(want.as_str()), "fast {fast}");
        heads.push(seen);
    }
    assert_eq!(
        heads[0], heads[1],
        "the fast path's heads differ from hyper's"
    );
}

#[tokio::test]
async fn a_client_that_stops_reading_a_hit_sent_from_files_is_cut_and_others_go_on() {
    // Far more than the loopback socket buffers hold for a client that reads nothing (128 KiB
    // received, at most 4 MiB sent), so `sendfile` blocks on the client; two slices of 8 MiB, so
    // the hit stays on the memory fast path (at most 8 MiB, or two slices, held from the start);
    // and small enough that the object and the slices a fill may hold in transit (a quarter of
    // the 64 MiB budget, taken from the memory tier meanwhile) fit the budget together. At
    // 48 MiB, a fill that ended with its whole quarter in transit left the tier a head's bytes
    // short of the object, and one slice was evicted (seen twice on loaded runs).
    let big = pattern(16 * 1024 * 1024);
    let b = big.clone();
    // An origin that honours `Range`, so each slice costs one slice.
    let origin = origin(move |req: http::Request<hyper::body::Incoming>| {
        let b = b.clone();
        async move {
            let range = req
                .headers()
                .get("range")
                .and_then(|v| v.to_str().ok()?.strip_prefix("bytes=")?.split_once('-'))
                .map(|(a, z)| (a.parse::<usize>().unwrap(), z.parse::<usize>().unwrap()));
            let builder = http::Response::builder().header("cache-control", "max-age=3600");
            match range {
                Some((a, z)) => {
                    let z = z.min(b.len() - 1);
                    builder
                        .status(206)
                        .header("content-range", format!("bytes {a}-{z}/{}", b.len()))
                        .body(full(b.slice(a..=z)))
                        .unwrap()
                }
                None => builder.body(full(b)).unwrap(),
            }
        }
    })
    .await;
    let cached = CACHED.replace(r#"slice_bytes = "1MiB""#, r#"slice_bytes = "8MiB""#);
    let mut config = proxy_config(origin, true, &cached);
    config.server.send_timeout_secs = 1;
    let p = Proxy::start(config).await;
    let mut c = Client::to(&p).await;
    let r = c.ask(b"GET /api/big HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(sha256(&r.body), sha256(&big));
    // The miss's last slices may still be on their way into the memory tier when its body has
    // arrived (a loaded machine shows it); the hits below are meant to be sent from there.
    let mut held = 0u64;
    for _ in 0..100 {
        held = metric(&p, "sluice_cache_tier_bytes{tier=\"memory\"}")
            .await
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if held >= big.len() as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        held >= big.len() as u64,
        "the memory tier holds {held} bytes"
    );
    let mut stalled = Client::to(&p).await;
    stalled
        .s
        .write_all(b"GET /api/big HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    // Meanwhile another client gets the whole hit.
    let r = c.ask(b"GET /api/big HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(sha256(&r.body), sha256(&big));
    tokio::time::sleep(Duration::from_secs(4)).await;
    let all = read_until_cut(&mut stalled.s)
        .await
        .expect("the stalled connection was never cut");
    assert!(all.starts_with(b"HTTP/1.1 200 OK\r\n"));
    assert!(all.len() < big.len(), "the whole body arrived");
    let timeouts = metric(&p, "sluice_downstream_send_timeouts_total").await;
    assert_eq!(timeouts.as_deref(), Some("1"));
    // The proxy still serves (on a new connection: the first one idled out meanwhile).
    let mut c = Client::to(&p).await;
    let r = c.ask(b"GET /api/big HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(sha256(&r.body), sha256(&big));
    let sent: u64 = metric(&p, "sluice_cache_memory_sendfile_bytes_total")
        .await
        .unwrap()
        .parse()
        .unwrap();
    assert!(sent >= 2 * big.len() as u64, "{sent}");
    // The cut response's bytes count too: a miss, two whole hits and part of one.
    let sent: u64 = metric(&p, "sluice_sent_bytes_total{endpoint=\"reverse\"}")
        .await
        .unwrap()
        .parse()
        .unwrap();
    assert!(sent > 3 * big.len() as u64, "{sent}");
}

#[tokio::test]
async fn a_head_answered_with_an_error_gets_no_body_and_the_connection_lives_on() {
    let p = Proxy::start(proxy_config(dead_port().await, true, "")).await;
    let mut c = Client::to(&p).await;
    for _ in 0..2 {
        let r = c.ask(b"HEAD /api/x HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert_eq!(r.status(), 502, "{}", r.head);
        let length: usize = r.field("content-length").unwrap().parse().unwrap();
        assert!(length > 0);
    }
    // Nothing followed either head: the next answer starts where the last head ended.
    let r = c.ask(b"GET /api/x HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(r.status(), 502, "{}", r.head);
    assert!(!r.body.is_empty());
}

/// An origin that answers a HEAD with its head, then, a moment later, with bytes shaped like a
/// second answer (a body sent to a HEAD); any other request gets `ok`. Counts its connections.
async fn head_with_late_bytes() -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let end = loop {
                        if let Some(i) = find(&buf, b"\r\n\r\n") {
                            break i + 4;
                        }
                        if read_into(&mut s, &mut buf).await.unwrap_or(0) == 0 {
                            return;
                        }
                    };
                    let head: Vec<u8> = buf.drain(..end).collect();
                    let ok = if head.starts_with(b"HEAD ") {
                        let sent = s
                            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")
                            .await;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        sent.is_ok()
                            && s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEVIL!")
                                .await
                                .is_ok()
                    } else {
                        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                            .await
                            .is_ok()
                    };
                    if !ok {
                        return;
                    }
                }
            });
        }
    });
    (addr, accepted)
}

#[tokio::test]
async fn bytes_an_origin_sends_past_its_answer_never_answer_the_next_request() {
    // Past a counted body, in the same write: a splice takes the body's bytes exactly and leaves
    // the rest in the socket.
    let big = pattern(1024 * 1024);
    let b = big.clone();
    let answer: Answer = Arc::new(move |t: &str| match t {
        "/big" => {
            let mut out = counted(&b);
            out.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEVIL!");
            out
        }
        _ => b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec(),
    });
    let (origin, _, _) = reverse_support::raw_origin(answer).await;
    for splice in [true, false] {
        let mut config = proxy_config(origin, true, "");
        config.reverse.splice_bodies = splice;
        let p = Proxy::start(config).await;
        let mut c = Client::to(&p).await;
        let r = c.ask(b"GET /api/big HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert_eq!(sha256(&r.body), sha256(&big), "splice={splice}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        for _ in 0..2 {
            let r = c.ask(b"GET /api/next HTTP/1.1\r\nHost: a\r\n\r\n").await;
            assert_eq!(r.body, b"ok", "splice={splice}");
        }
    }

    // Sent to a HEAD a moment after its head: the connection went back to the pool clean, and
    // the bytes arrived while it sat there.
    let (origin, accepted) = head_with_late_bytes().await;
    let p = Proxy::start(proxy_config(origin, true, "")).await;
    let mut c = Client::to(&p).await;
    for round in 0..3 {
        let r = c.ask(b"HEAD /api/x HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert_eq!(r.status(), 200);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let r = c.ask(b"GET /api/next HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert_eq!(r.body, b"ok", "round {round}");
    }
    // Each HEAD's connection was given up, not reused: every GET went on a new one (which the
    // next HEAD then took from the pool).
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        4,
        "the first connection and one per GET"
    );
}

#[tokio::test]
async fn an_endless_run_of_interim_answers_is_a_502() {
    let answer: Answer = Arc::new(|_t: &str| {
        b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n".repeat(20_000)
    });
    let (origin, _, _) = reverse_support::raw_origin(answer).await;
    let p = Proxy::start(proxy_config(origin, true, "")).await;
    let mut c = Client::to(&p).await;
    let started = std::time::Instant::now();
    let r = c.ask(b"GET /api/x HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(r.status(), 502);
    // Refused at once, not when the route's header timeout (2 s) ran out.
    assert!(started.elapsed() < Duration::from_millis(1500));
}

/// An origin's length fields on answers without a body: a 204 gets none (its `Content-Length`
/// was relayed raw, `5, 7` and all), nor does a 304 to GET (its `99` was relayed); a HEAD's
/// answer keeps one valid decimal and loses anything else, as hyper writes them; the connection
/// goes on after each.
#[tokio::test]
async fn length_fields_on_bodiless_answers_are_written_as_hyper_writes_them() {
    let answer: Answer = Arc::new(|t: &str| match t {
        "/204" => b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n".to_vec(),
        "/204-two" => b"HTTP/1.1 204 No Content\r\nContent-Length: 5, 7\r\n\r\n".to_vec(),
        "/304" => b"HTTP/1.1 304 Not Modified\r\nContent-Length: 99\r\n\r\n".to_vec(),
        "/304-two" => b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5, 7\r\n\r\n".to_vec(),
        "/head-bad" => b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n".to_vec(),
        "/head-coded" => {
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n".to_vec()
        }
        _ => b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec(),
    });
    let (origin, _) = raw_origin(answer).await;
    let p = Proxy::start(proxy_config(origin, true, "")).await;
    let mut c = Client::to(&p).await;
    for (request, status, length) in [
        // The server's coding (hop-by-hop, not relayed) overrides its length (RFC 9112 §6.3):
        // `5` is not the GET answer's length, and goes out neither alone nor with the coding.
        ("HEAD /api/head-coded", 200, None),
        ("GET /api/204", 204, None),
        ("GET /api/204-two", 204, None),
        ("HEAD /api/204", 204, None),
        // A 304 to GET says no length (hyper's and `fast_write`'s way); to HEAD it may.
        ("GET /api/304", 304, None),
        ("HEAD /api/304", 304, Some("99")),
        ("GET /api/304-two", 304, None),
        ("HEAD /api/head-bad", 200, None),
    ] {
        let r = c
            .ask(format!("{request} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes())
            .await;
        assert_eq!(r.status(), status, "{request}");
        assert_eq!(
            r.field("content-length").as_deref(),
            length,
            "{request}: {}",
            r.head
        );
        assert_eq!(r.field("transfer-encoding"), None, "{request}");
        // The same connection goes on: nothing was taken for a body.
        let r = c.ask(b"GET /api/next HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert_eq!(r.body, b"ok", "after {request}");
    }
    // hyper's path drops the coded answer's length too.
    let p = Proxy::start(proxy_config(origin, false, "")).await;
    let r = Client::to(&p)
        .await
        .ask(b"HEAD /api/head-coded HTTP/1.1\r\nHost: a\r\n\r\n")
        .await;
    assert_eq!(
        (r.status(), r.field("content-length")),
        (200, None),
        "{}",
        r.head
    );
}

/// What a slow origin saw of one request.
#[derive(Debug, PartialEq)]
enum Seen {
    /// Its connection was closed before it answered.
    Cancelled,
    /// It answered.
    Answered,
}

/// An origin that answers `GET /wait/<ms>` with `ok` after that many milliseconds, unless its
/// connection is closed first; it reports each request's fate.
async fn slow_origin() -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let end = loop {
                        if let Some(i) = find(&buf, b"\r\n\r\n") {
                            break i + 4;
                        }
                        if read_into(&mut s, &mut buf).await.unwrap_or(0) == 0 {
                            return;
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.drain(..end);
                    let ms: u64 = head
                        .split(' ')
                        .nth(1)
                        .and_then(|t| t.strip_prefix("/wait/"))
                        .and_then(|ms| ms.parse().ok())
                        .unwrap_or(0);
                    let mut probe = [0u8; 1];
                    tokio::select! {
                        read = s.read(&mut probe) => {
                            if matches!(read, Ok(0) | Err(_)) {
                                let _ = tx.send(Seen::Cancelled);
                                return;
                            }
                            // A request sent before the answer: not in this test.
                            return;
                        }
                        _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
                    }
                    let _ = tx.send(Seen::Answered);
                    if s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (addr, rx)
}

/// A client that leaves while the origin works on its request cancels the request: the origin
/// sees its connection closed (not after the route's header timeout, 60 s here: the origin
/// answers after 15 s without the cancel), as on hyper's path. A client that waits, or that
/// pipelined a second request before it shut its side, still gets its answers.
#[tokio::test]
async fn a_client_that_leaves_cancels_its_fast_path_request() {
    let (origin, mut seen) = slow_origin().await;
    let text = toml_of(origin, true).replace("header_timeout_secs = 2", "header_timeout_secs = 60");
    let p = Proxy::start(config(&text)).await;

    let mut c = Client::to(&p).await;
    c.s.write_all(b"GET /api/wait/15000 HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    // The request reached the origin (a byte of an answer would need the origin).
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(c);
    let fate = tokio::time::timeout(Duration::from_secs(20), seen.recv()).await;
    assert_eq!(
        fate.ok().flatten(),
        Some(Seen::Cancelled),
        "the origin request outlived its client"
    );

    // Still there (the origin answers after a few of the connection's ticks): answered.
    let mut c = Client::to(&p).await;
    let r = c
        .ask(b"GET /api/wait/2500 HTTP/1.1\r\nHost: a\r\n\r\n")
        .await;
    assert_eq!(r.body, b"ok");
    assert_eq!(seen.recv().await, Some(Seen::Answered));

    // Two requests in one write, then the client's side shut: both are answered.
    let mut c = Client::to(&p).await;
    c.s.write_all(
        b"GET /api/wait/2500 HTTP/1.1\r\nHost: a\r\n\r\nGET /api/wait/0 HTTP/1.1\r\nHost: a\r\n\r\n",
    )
    .await
    .unwrap();
    c.s.shutdown().await.unwrap();
    for _ in 0..2 {
        assert_eq!(c.read().await.body, b"ok");
    }
}

/// An `http://` route pointed at a port that speaks TLS: the server answers the request with a
/// TLS alert (7 bytes, no LF) and keeps its connection open. The fast path refuses it at once
/// with the hyper path's 502, as it did before heads were parsed only at an LF (it waited for
/// an LF until the route's header timeout, 2 s here, and answered 504). The origin never closes:
/// a 502 comes from the bytes alone.
#[tokio::test]
async fn an_origin_that_answers_a_tls_alert_is_a_502_at_once() {
    let answer: Answer = Arc::new(|_t: &str| vec![0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28]);
    let (origin, _) = raw_origin(answer).await;
    let mut answers = Vec::new();
    for fast in [true, false] {
        let p = Proxy::start(proxy_config(origin, fast, "")).await;
        let mut c = Client::to(&p).await;
        let r = c.ask(b"GET /api/x HTTP/1.1\r\nHost: a\r\n\r\n").await;
        answers.push((r.status(), r.field("content-type"), r.body));
    }
    assert_eq!(
        answers[0].0,
        502,
        "{:?}",
        String::from_utf8_lossy(&answers[0].2)
    );
    assert_eq!(answers[0], answers[1]);
}

/// A `Transfer-Encoding` a route adds and a `Content-Length` never go out together (RFC 9112
/// §6.2) on an answer to HEAD: the length is dropped, the coding kept; a GET's answer is framed
/// by its length as ever.
#[tokio::test]
async fn a_coding_a_route_adds_to_a_head_answer_drops_its_length() {
    let answer: Answer = Arc::new(|t: &str| match t {
        "/head" => b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n".to_vec(),
        _ => b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello".to_vec(),
    });
    let (origin, _) = raw_origin(answer).await;
    let text = toml_of(origin, true).replace(
        r#"response_headers_add = { "x-served-by" = "sluice" }"#,
        r#"response_headers_add = { "transfer-encoding" = "chunked" }"#,
    );
    let p = Proxy::start(config(&text)).await;
    let mut c = Client::to(&p).await;
    let r = c.ask(b"HEAD /api/head HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.field("content-length"), None, "{}", r.head);
    assert_eq!(r.field("transfer-encoding").as_deref(), Some("chunked"));
    let r = c.ask(b"GET /api/x HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(
        r.field("content-length").as_deref(),
        Some("5"),
        "{}",
        r.head
    );
    assert_eq!(r.field("transfer-encoding"), None);
    assert_eq!(r.body, b"hello");
}

/// The same answer to HEAD to an HTTP/2 client (`fast_h2`): the server's `Content-Length` beside
/// its `Transfer-Encoding` is not passed on as the GET answer's length.
#[tokio::test]
async fn a_head_answer_with_both_a_coding_and_a_length_loses_the_length_over_http2() {
    let answer: Answer = Arc::new(|t: &str| match t {
        "/head-coded" => {
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n".to_vec()
        }
        _ => b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec(),
    });
    let (origin, heads) = raw_origin(answer).await;
    let p = Proxy::start(proxy_config(origin, true, "")).await;
    let mut send = h2_client(p.addr).await;
    let req = http::Request::builder()
        .method("HEAD")
        .uri(p.url("/api/head-coded"))
        .body(full(Bytes::new()))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(heads.lock().unwrap().len(), 1, "through the fast exchange");
    assert_eq!(
        resp.headers().get("content-length"),
        None,
        "{:?}",
        resp.headers()
    );
    assert_eq!(resp.headers().get("transfer-encoding"), None);
}

/// An origin for the pooled retry: answers `ok` (keep-alive) to `/fill`, each answer held until
/// `fill` requests are in at once (so each came on a connection of its own), and once `dropping`
/// is set, reads each request, counts it in `dropped` and closes the connection unanswered.
async fn dropping_origin(
    fill: usize,
) -> (
    SocketAddr,
    Arc<std::sync::atomic::AtomicBool>,
    Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let dropping = Arc::new(AtomicBool::new(false));
    let dropped = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(fill));
    let (mode, count) = (dropping.clone(), dropped.clone());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let (mode, count, barrier) = (mode.clone(), count.clone(), barrier.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let end = loop {
                        if let Some(i) = find(&buf, b"\r\n\r\n") {
                            break i + 4;
                        }
                        if read_into(&mut s, &mut buf).await.unwrap_or(0) == 0 {
                            return;
                        }
                    };
                    buf.drain(..end);
                    if mode.load(Ordering::SeqCst) {
                        count.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    barrier.wait().await;
                    if s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (addr, dropping, dropped)
}

/// A GET that the origin drops unanswered on a pooled connection is sent once more, on a new
/// connection, not again on every idle one in the pool: with six pooled, the origin sees it
/// twice, not seven times.
#[tokio::test]
async fn a_get_dropped_unanswered_is_retried_once_not_on_every_pooled_connection() {
    use std::sync::atomic::Ordering;
    const POOLED: usize = 6;
    let (origin, dropping, dropped) = dropping_origin(POOLED).await;
    let p = Proxy::start(proxy_config(origin, true, "")).await;
    // Six requests at once: six upstream connections, each back in the pool after its answer.
    let mut clients = Vec::new();
    for _ in 0..POOLED {
        let mut c = Client::to(&p).await;
        c.s.write_all(b"GET /api/fill HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .unwrap();
        clients.push(c);
    }
    for c in &mut clients {
        assert_eq!(c.read().await.body, b"ok");
    }
    // Let the last answers' connections be checked in.
    tokio::time::sleep(Duration::from_millis(200)).await;
    dropping.store(true, Ordering::SeqCst);
    let mut c = Client::to(&p).await;
    let r = c.ask(b"GET /api/boom HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(r.status(), 502, "{}", r.head);
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        2,
        "the pooled try and one retry on a new connection"
    );
}
