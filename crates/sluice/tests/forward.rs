//! `/proxy/forward` against a real local origin: methods, bodies both ways (read ahead and
//! streamed, checked by hash), `{mediaflow_ip}`, the client's address kept back, caps, redirects,
//! and the refusals (no password, private destinations, host lists).

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::*;
use tokio::net::TcpListener;

/// One request as the origin saw it.
#[derive(Debug, Clone)]
struct Got {
    method: String,
    path_and_query: String,
    headers: http::HeaderMap,
    body: Bytes,
}

/// An origin that records every request (body included) and answers by path:
/// `/echo` 201 with the body's hash, `/big` 5 MiB with a length, `/big-chunked` 2 MiB without,
/// `/see-other` and `/temporary` redirects to `/echo`, `/ip` an echo service's answer.
struct Origin {
    addr: SocketAddr,
    got: Arc<Mutex<Vec<Got>>>,
}

const BIG: usize = 5 * 1024 * 1024;

impl Origin {
    async fn start() -> Origin {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let seen = got.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let seen = seen.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let seen = seen.clone();
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body.collect().await.unwrap().to_bytes();
                            seen.lock().unwrap().push(Got {
                                method: parts.method.to_string(),
                                path_and_query: parts.uri.to_string(),
                                headers: parts.headers.clone(),
                                body: body.clone(),
                            });
                            Ok::<_, Infallible>(answer(parts.uri.path(), &body))
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Origin { addr, got }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn got(&self, path: &str) -> Vec<Got> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .filter(|g| g.path_and_query.split('?').next() == Some(path))
            .cloned()
            .collect()
    }
}

fn answer(path: &str, body: &Bytes) -> Response<BoxBody> {
    let full = |b: Bytes| Full::new(b).map_err(|n| match n {}).boxed();
    let redirect = |status: u16| {
        Response::builder()
            .status(status)
            .header("location", "/echo?redirected=1")
            .body(full(Bytes::new()))
            .unwrap()
    };
    match path {
        "/echo" => Response::builder()
            .status(201)
            .header("content-type", "application/json")
            .header("x-ratelimit-remaining", "41")
            .header("set-cookie", "session=upstream; Path=/")
            .body(full(Bytes::from(format!(
                r#"{{"len":{},"sha256":"{}"}}"#,
                body.len(),
                sha256(body)
            ))))
            .unwrap(),
        "/big" => Response::new(full(pattern(BIG))),
        "/big-chunked" => {
            let chunks: Vec<Result<Frame<Bytes>, std::io::Error>> = pattern(2 * 1024 * 1024)
                .chunks(64 * 1024)
                .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
                .collect();
            Response::new(StreamBody::new(futures_util::stream::iter(chunks)).boxed())
        }
        "/see-other" => redirect(303),
        "/temporary" => redirect(307),
        "/ip" => Response::new(full(Bytes::from_static(b"203.0.113.9\n"))),
        _ => Response::builder()
            .status(404)
            .body(full(Bytes::new()))
            .unwrap(),
    }
}

/// A request to sluice with `body`; `chunked` sends it without a length, in 64 KiB frames.
async fn send(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Bytes,
    chunked: bool,
) -> Reply {
    let client =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http::<BoxBody>();
    let mut b = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let body: BoxBody = if chunked {
        let frames: Vec<Result<Frame<Bytes>, std::io::Error>> = body
            .chunks(64 * 1024)
            .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
            .collect();
        StreamBody::new(futures_util::stream::iter(frames)).boxed()
    } else {
        Full::new(body).map_err(|n| match n {}).boxed()
    };
    match client.request(b.body(body).unwrap()).await {
        Ok(resp) => {
            let (parts, body) = resp.into_parts();
            Reply {
                status: parts.status,
                headers: parts.headers,
                body: body
                    .collect()
                    .await
                    .map(|c| c.to_bytes())
                    .map_err(|e| e.to_string()),
            }
        }
        // sluice may answer 413 and close before the whole body is sent.
        Err(e) => Reply {
            status: StatusCode::from_u16(599).unwrap(),
            headers: Default::default(),
            body: Err(e.to_string()),
        },
    }
}

async fn start(origin: &Origin, tweak: impl FnOnce(&mut sluice::config::Config)) -> Sluice {
    let mut config = test_config();
    config.auth.api_password = "pw".into();
    config.media.public_ip.services = vec![sluice::config::public_ip::EchoService {
        url: origin.url("/ip"),
        field: String::new(),
    }];
    tweak(&mut config);
    Sluice::start(config).await
}

fn forward(s: &Sluice, d: &str, extra: &str) -> String {
    s.url(&format!(
        "/proxy/forward?api_password=pw&d={}{extra}",
        enc(d)
    ))
}

#[tokio::test]
async fn post_with_placeholder_reaches_the_origin_from_sluice() {
    let origin = Origin::start().await;
    let s = start(&origin, |_| {}).await;
    let body = r#"{"magnet":"x","ip":"{mediaflow_ip}"}"#;
    let url = forward(
        &s,
        &origin.url("/echo?ip={mediaflow_ip}&k=v"),
        "&h_Authorization=Bearer%20tok&h_X-Real-IP=198.51.100.7&r_x-note=relayed",
    );
    let r = send(
        "POST",
        &url,
        &[
            ("content-type", "application/json"),
            ("x-forwarded-for", "198.51.100.7"),
            ("cookie", "api_password=pw"),
        ],
        Bytes::from(body),
        false,
    )
    .await;
    assert_eq!(r.status, 201);
    let filled = br#"{"magnet":"x","ip":"203.0.113.9"}"#;
    let expected = format!(
        r#"{{"len":{},"sha256":"{}"}}"#,
        filled.len(),
        sha256(filled)
    );
    assert_eq!(r.body.unwrap(), Bytes::from(expected));
    assert_eq!(r.headers["content-type"], "application/json");
    assert_eq!(r.headers["x-ratelimit-remaining"], "41");
    assert_eq!(r.headers["x-note"], "relayed");
    assert!(r.headers.get("set-cookie").is_none(), "{:?}", r.headers);

    let got = origin.got("/echo");
    assert_eq!(got.len(), 1);
    let g = &got[0];
    assert_eq!(g.method, "POST");
    assert_eq!(g.path_and_query, "/echo?ip=203.0.113.9&k=v");
    assert_eq!(&g.body[..], filled);
    assert_eq!(g.headers["authorization"], "Bearer tok");
    assert_eq!(g.headers["content-type"], "application/json");
    assert_eq!(
        g.headers["content-length"],
        filled.len().to_string().as_str()
    );
    for leak in ["x-forwarded-for", "x-real-ip", "cookie", "forwarded"] {
        assert!(g.headers.get(leak).is_none(), "{leak}: {:?}", g.headers);
    }
}

#[tokio::test]
async fn large_bodies_stream_both_ways() {
    let origin = Origin::start().await;
    let s = start(&origin, |c| c.media.forward.max_response_bytes = 8 << 20).await;
    // 3 MiB up, with a length and without one.
    let up = pattern(3 * 1024 * 1024 + 17);
    let want = format!(r#"{{"len":{},"sha256":"{}"}}"#, up.len(), sha256(&up));
    for (method, chunked) in [("PUT", false), ("POST", true)] {
        let r = send(
            method,
            &forward(&s, &origin.url("/echo"), ""),
            &[],
            up.clone(),
            chunked,
        )
        .await;
        assert_eq!(r.status, 201, "{method}");
        assert_eq!(r.body.unwrap(), Bytes::from(want.clone()), "{method}");
    }
    let got = origin.got("/echo");
    assert_eq!(
        got[0].headers["content-length"],
        up.len().to_string().as_str()
    );
    assert!(got[1].headers.get("content-length").is_none());
    // 5 MiB down.
    let r = send(
        "GET",
        &forward(&s, &origin.url("/big"), ""),
        &[],
        Bytes::new(),
        false,
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-length"], BIG.to_string().as_str());
    assert_eq!(sha256(&r.body.unwrap()), sha256(&pattern(BIG)));
    // HEAD stays HEAD.
    let r = send(
        "HEAD",
        &forward(&s, &origin.url("/big"), ""),
        &[],
        Bytes::new(),
        false,
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(origin.got("/big")[1].method, "HEAD");
}

#[tokio::test]
async fn caps_bound_both_directions() {
    let origin = Origin::start().await;
    let s = start(&origin, |c| {
        c.media.forward.max_request_bytes = 1 << 20;
        c.media.forward.max_response_bytes = 1 << 20;
    })
    .await;
    let up = pattern(2 << 20);
    // A declared length over the cap never reaches the origin.
    let r = send(
        "POST",
        &forward(&s, &origin.url("/echo"), ""),
        &[],
        up.clone(),
        false,
    )
    .await;
    assert!(r.status == 413 || r.status == 599, "{:?}", r.status);
    // A chunked body is stopped where it passes the cap.
    let r = send(
        "POST",
        &forward(&s, &origin.url("/echo"), ""),
        &[],
        up,
        true,
    )
    .await;
    assert!(r.status == 413 || r.status == 599, "{:?}", r.status);
    assert!(origin.got("/echo").iter().all(|g| g.body.len() <= 1 << 20));
    // A declared answer over the cap is a 502; one that grows past it is cut off.
    let r = send(
        "GET",
        &forward(&s, &origin.url("/big"), ""),
        &[],
        Bytes::new(),
        false,
    )
    .await;
    assert_eq!(r.status, 502);
    let r = send(
        "GET",
        &forward(&s, &origin.url("/big-chunked"), ""),
        &[],
        Bytes::new(),
        false,
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.body.is_err(), "the body must not end cleanly");
}

#[tokio::test]
async fn redirects_replay_small_bodies_as_clients_do() {
    let origin = Origin::start().await;
    let s = start(&origin, |_| {}).await;
    let body = Bytes::from_static(b"a=1&b=2");
    let r = send(
        "POST",
        &forward(&s, &origin.url("/temporary"), ""),
        &[("content-type", "application/x-www-form-urlencoded")],
        body.clone(),
        false,
    )
    .await;
    assert_eq!(r.status, 201);
    let r = send(
        "POST",
        &forward(&s, &origin.url("/see-other"), ""),
        &[("content-type", "application/x-www-form-urlencoded")],
        body.clone(),
        false,
    )
    .await;
    assert_eq!(r.status, 201);
    let got = origin.got("/echo");
    assert_eq!((got[0].method.as_str(), &got[0].body), ("POST", &body));
    assert_eq!(got[1].method, "GET");
    assert!(got[1].body.is_empty() && got[1].headers.get("content-type").is_none());
}

#[tokio::test]
async fn refusals() {
    let origin = Origin::start().await;
    let s = start(&origin, |c| {
        c.media.forward.denied_hosts = vec!["localhost".into()];
    })
    .await;
    // No password: nothing leaves.
    let url = s.url(&format!("/proxy/forward?d={}", enc(&origin.url("/echo"))));
    let r = send("POST", &url, &[], Bytes::from_static(b"x"), false).await;
    assert_eq!(r.status, 403);
    // A denied host.
    let d = format!("http://localhost:{}/echo", origin.addr.port());
    let r = send("GET", &forward(&s, &d, ""), &[], Bytes::new(), false).await;
    assert_eq!(r.status, 403);
    // Methods that are not requests for a resource.
    let r = send(
        "TRACE",
        &forward(&s, &origin.url("/echo"), ""),
        &[],
        Bytes::new(),
        false,
    )
    .await;
    assert_eq!(r.status, 405);
    assert!(origin.got("/echo").is_empty());

    // Private destinations are refused unless the operator allows them.
    let strict = start(&origin, |c| c.upstream.allow_private = false).await;
    for d in [
        origin.url("/echo"),
        format!("http://localhost:{}/echo", origin.addr.port()),
        format!("http://[::ffff:127.0.0.1]:{}/echo", origin.addr.port()),
    ] {
        let r = send(
            "POST",
            &forward(&strict, &d, ""),
            &[],
            Bytes::from_static(b"x"),
            false,
        )
        .await;
        assert_eq!(r.status, 403, "{d}");
    }
    // Allowed hosts narrow it further.
    let narrow = start(&origin, |c| {
        c.media.forward.allowed_hosts = vec!["*.debrid.example".into()];
    })
    .await;
    let r = send(
        "GET",
        &forward(&narrow, &origin.url("/echo"), ""),
        &[],
        Bytes::new(),
        false,
    )
    .await;
    assert_eq!(r.status, 403);
    assert!(origin.got("/echo").is_empty());
}

/// `h_host` is checked against the host lists like `d`: before, `d` on an allowed host (or an
/// address, which a list of names does not match) with `h_host` naming another site reached that
/// site's virtual host on the same server.
#[tokio::test]
async fn the_virtual_host_is_held_to_the_host_lists() {
    let origin = Origin::start().await;
    let port = origin.addr.port();
    let allowed = start(&origin, |c| {
        c.media.forward.allowed_hosts = vec!["127.0.0.1".into()];
    })
    .await;
    let denied = start(&origin, |c| {
        c.media.forward.denied_hosts = vec!["*.internal.example".into(), "localhost".into()];
    })
    .await;
    let d = origin.url("/echo");
    for (s, h_host) in [
        (&allowed, "other.example"),
        (&allowed, "localhost:80"),
        (&denied, "admin.internal.example"),
        (&denied, "LOCALHOST."),
        (&denied, &format!("localhost:{port}")),
    ] {
        let url = forward(s, &d, &format!("&h_host={}", enc(h_host)));
        let r = send("GET", &url, &[], Bytes::new(), false).await;
        assert_eq!(r.status, 403, "{h_host}");
        assert!(String::from_utf8_lossy(&r.body.unwrap()).contains("forward_host"));
    }
    // Not a host at all: the client's 400.
    let url = forward(&denied, &d, "&h_host=a%20b");
    let r = send("GET", &url, &[], Bytes::new(), false).await;
    assert_eq!(r.status, 400);
    assert!(
        origin.got("/echo").is_empty(),
        "a refused virtual host was asked"
    );
    // A virtual host the lists allow is sent as before.
    for (s, h_host) in [(&allowed, "127.0.0.1"), (&denied, "api.example")] {
        let url = forward(s, &d, &format!("&h_host={h_host}"));
        let r = send("GET", &url, &[], Bytes::new(), false).await;
        assert_eq!(r.status, 201, "{h_host}");
    }
    let got = origin.got("/echo");
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].headers["host"], "api.example");
}

/// An origin that answers every request with `status` and `Location: to`.
async fn redirector(status: u16, to: String) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let to = to.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |_req: Request<Incoming>| {
                    let to = to.clone();
                    async move {
                        Ok::<_, Infallible>(
                            Response::builder()
                                .status(status)
                                .header("location", to)
                                .body(Full::new(Bytes::new()))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

/// `d` on an allowed host that redirects to a host the lists refuse: before, the relay followed
/// the redirect unchecked (a denied host reached through any open redirect, an allow-list left by
/// any allowed host's redirect). Now every hop is checked and refused exactly as `d` would be.
#[tokio::test]
async fn redirects_stay_within_the_host_lists() {
    let target = Origin::start().await;
    let port = target.addr.port();
    // `127.0.0.1` redirects to `localhost`: both reach `target`, under different names.
    let to_localhost = redirector(302, format!("http://localhost:{port}/echo")).await;
    let to_localhost_307 = redirector(307, format!("http://localhost:{port}/echo")).await;
    let to_loopback = redirector(302, format!("http://127.0.0.1:{port}/echo")).await;
    let direct = format!("http://localhost:{port}/echo");

    let denied = start(&target, |c| {
        c.media.forward.denied_hosts = vec!["localhost".into()];
    })
    .await;
    let allowed = start(&target, |c| {
        c.media.forward.allowed_hosts = vec!["127.0.0.1".into()];
    })
    .await;
    for s in [&denied, &allowed] {
        let refusal = send("GET", &forward(s, &direct, ""), &[], Bytes::new(), false).await;
        assert_eq!(refusal.status, 403);
        let refusal = refusal.body.unwrap();
        for (method, hop) in [("GET", to_localhost), ("POST", to_localhost_307)] {
            let d = format!("http://{hop}/login");
            let r = send(method, &forward(s, &d, ""), &[], Bytes::from("a=1"), false).await;
            assert_eq!(r.status, 403, "{method} via a redirect");
            assert_eq!(r.body.unwrap(), refusal, "the same refusal as for `d`");
        }
    }
    assert!(
        target.got("/echo").is_empty(),
        "the refused host saw a request"
    );
    // An IPv4 address written IPv4-mapped is that address: a deny-list naming `127.0.0.1` refuses
    // `[::ffff:127.0.0.1]`, as `d` and through a redirect.
    let to_mapped = redirector(302, format!("http://[::ffff:127.0.0.1]:{port}/echo")).await;
    let denied_v4 = start(&target, |c| {
        c.media.forward.denied_hosts = vec!["127.0.0.1".into()];
    })
    .await;
    let mapped = format!("http://[::ffff:127.0.0.1]:{port}/echo");
    let via = format!("http://localhost:{}/login", to_mapped.port());
    for d in [mapped, via] {
        let r = send(
            "GET",
            &forward(&denied_v4, &d, ""),
            &[],
            Bytes::new(),
            false,
        )
        .await;
        assert_eq!(r.status, 403, "{d}");
    }
    assert!(target.got("/echo").is_empty());
    // A redirect that stays within the lists is followed as before.
    let d = format!("http://{to_loopback}/login");
    let r = send("GET", &forward(&allowed, &d, ""), &[], Bytes::new(), false).await;
    assert_eq!(r.status, 201);
    assert_eq!(target.got("/echo").len(), 1);
}

/// An origin that counts the request heads it gets and keeps the bodies that arrive whole
/// (answering those 201); a body cut short is only counted.
struct Sink {
    addr: SocketAddr,
    heads: Arc<Mutex<usize>>,
    whole: Arc<Mutex<Vec<Bytes>>>,
}

impl Sink {
    async fn start() -> Sink {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let heads = Arc::new(Mutex::new(0));
        let whole = Arc::new(Mutex::new(Vec::new()));
        let (h, w) = (heads.clone(), whole.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (h, w) = (h.clone(), w.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let (h, w) = (h.clone(), w.clone());
                        async move {
                            *h.lock().unwrap() += 1;
                            let status = match req.into_body().collect().await {
                                Ok(b) => {
                                    w.lock().unwrap().push(b.to_bytes());
                                    201
                                }
                                Err(_) => 400,
                            };
                            Ok::<_, Infallible>(
                                Response::builder()
                                    .status(status)
                                    .body(Full::new(Bytes::new()))
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Sink { addr, heads, whole }
    }
}

/// Reads one answer from a raw connection: its status and body as JSON (`Null` when the body
/// is not JSON: the sink's 201 is empty), or `None` when the connection ends first.
async fn read_answer(
    conn: &mut (impl tokio::io::AsyncRead + Unpin),
) -> Option<(u16, serde_json::Value)> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if buf.len() >= end + 4 + len {
                let status = head[9..12].parse().unwrap();
                let body = serde_json::from_slice(&buf[end + 4..end + 4 + len])
                    .unwrap_or(serde_json::Value::Null);
                return Some((status, body));
            }
        }
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// An answer with both `Transfer-Encoding` and `Content-Length` is framed by its chunks (RFC 9112
/// 6.3): before, the relay kept the `Content-Length` (the client waited for 100 bytes of a
/// 5-byte body, or got a body cut short) and refused a small chunked body whose stray length was
/// over `max_response_bytes`.
#[tokio::test]
async fn an_answer_framed_both_ways_goes_by_its_chunks() {
    let origin = Origin::start().await;
    let s = start(&origin, |_| {}).await;
    for length in ["100", "99999999"] {
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {length}\r\nTransfer-Encoding: chunked\r\n\
             X-Kept: yes\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        );
        let addr = support::raw_origin(Box::leak(response.into_bytes().into_boxed_slice())).await;
        let d = format!("http://{addr}/x");
        let r = send("GET", &forward(&s, &d, ""), &[], Bytes::new(), false).await;
        assert_eq!(r.status, 200, "{length}: {:?}", r.body);
        assert!(r.headers.get("content-length").is_none(), "{length}");
        assert_eq!(r.headers["x-kept"], "yes");
        assert_eq!(r.body.unwrap(), "hello", "{length}");
    }
}

/// Fields a web server in front of sluice acts on (nginx's `X-Accel-Redirect` serves one of its
/// internal locations, `X-Sendfile` and lighttpd's `X-Lighttpd-Send-File` a file) never reach it
/// from the origin, nor from the client through `r_*` / `rp_*`: before, an origin or a
/// password holder could have the front server answer with what it keeps internal.
#[tokio::test]
async fn no_one_hands_the_front_server_an_internal_redirect() {
    let addr = support::raw_origin(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Accel-Redirect: /internal/secret\r\n\
          X-Accel-Buffering: no\r\nX-Accel-Limit-Rate: 1\r\nX-Sendfile: /etc/shadow\r\n\
          X-Lighttpd-Send-File: /etc/shadow\r\nX-Kept: yes\r\n\r\nok",
    )
    .await;
    let origin = Origin::start().await;
    let s = start(&origin, |_| {}).await;
    let d = format!("http://{addr}/x");
    let r = send("GET", &forward(&s, &d, ""), &[], Bytes::new(), false).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["x-kept"], "yes");
    for gone in [
        "x-accel-redirect",
        "x-accel-buffering",
        "x-accel-limit-rate",
        "x-sendfile",
        "x-lighttpd-send-file",
    ] {
        assert!(r.headers.get(gone).is_none(), "{gone}: {:?}", r.headers);
    }
    for param in [
        "r_x-accel-redirect",
        "r_X-Sendfile",
        "rp_x-accel-expires",
        "r_x-lighttpd-send-file",
    ] {
        let url = forward(
            &s,
            &origin.url("/echo"),
            &format!("&{param}=%2Finternal%2Fx"),
        );
        let r = send("GET", &url, &[], Bytes::new(), false).await;
        assert_eq!(r.status, 400, "{param}");
        assert!(r.headers.get("x-accel-redirect").is_none());
    }
    assert!(origin.got("/echo").is_empty());
}

/// Sends a POST head declaring `declared` bytes and then `sent` of them on a raw connection, goes
/// silent, and reads the answer (status and JSON body), or `None` when none comes within `wait`.
async fn stalled_upload(
    s: &Sluice,
    d: &str,
    declared: usize,
    sent: usize,
    wait: std::time::Duration,
) -> (Option<(u16, serde_json::Value)>, tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt;
    let path = format!("/proxy/forward?api_password=pw&d={}", enc(d));
    let mut conn = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\n\
         Content-Length: {declared}\r\n\r\n"
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(&pattern(sent)).await.unwrap();
    let read = read_answer(&mut conn);
    let answer = tokio::time::timeout(wait, read).await.ok().flatten();
    (answer, conn)
}

/// A client that declares a body and stops sending it: before, nothing bounded the wait (the
/// connection's idle timeout does not run while a request is in flight), so the task, the
/// connection and the client's `/proxy/*` place were held for ever; past the read-ahead the
/// stall ran into the upstream's header timeout and came back as a 504 booked to the upstream.
/// Now the upstream idle deadline ends it as a 408 booked to the client, the place is freed and
/// the upstream never gets a whole request.
#[tokio::test]
async fn stalled_uploads_end_as_408_booked_to_the_client() {
    let sink = Sink::start().await;
    let d = format!("http://{}/upload", sink.addr);
    let origin = Origin::start().await;
    let s = start(&origin, |c| {
        c.upstream.idle_read_timeout_secs = 1;
        c.upstream.header_timeout_secs = 20;
        c.media.max_requests_per_client = 1;
    })
    .await;
    let wait = std::time::Duration::from_secs(6);
    // Within the read-ahead window (nothing sent upstream yet), and past it (streaming).
    for (declared, sent) in [(60_000, 10), (300_000, 100 * 1024)] {
        let started = std::time::Instant::now();
        let (answer, conn) = stalled_upload(&s, &d, declared, sent, wait).await;
        let (status, json) = answer.unwrap_or_else(|| panic!("no answer for {sent} of {declared}"));
        assert_eq!(status, 408, "{sent} of {declared}: {json}");
        assert_eq!(json["side"], "downstream", "{json}");
        assert_eq!(json["kind"], "client_body_timeout", "{json}");
        assert!(started.elapsed() < wait, "{:?}", started.elapsed());
        // The place is free again, with the stalled connection still open: with one place per
        // client, a held one would be a 429.
        let r = send(
            "POST",
            &forward(&s, &d, ""),
            &[],
            Bytes::from("next"),
            false,
        )
        .await;
        assert_eq!(r.status, 201, "after {sent} of {declared}");
        drop(conn);
    }
    // Only the two follow-up requests arrived whole; the streamed stall reached the upstream
    // (its head), cut short.
    let whole = sink.whole.lock().unwrap().clone();
    assert_eq!(whole, vec![Bytes::from("next"), Bytes::from("next")]);
    assert_eq!(*sink.heads.lock().unwrap(), 3);

    // An upstream header timeout shorter than the idle deadline, run out while the body still
    // waits for the client: the client's fault too, not a 504 booked to the upstream.
    let s = start(&origin, |c| {
        c.upstream.idle_read_timeout_secs = 30;
        c.upstream.header_timeout_secs = 1;
    })
    .await;
    let (answer, _conn) = stalled_upload(&s, &d, 300_000, 100 * 1024, wait).await;
    let (status, json) = answer.expect("an answer");
    assert_eq!(
        (status, &json["side"], &json["kind"]),
        (408, &"downstream".into(), &"client_body_timeout".into()),
        "{json}"
    );
    // A slow upstream with the body sent whole is still the upstream's 504.
    let slow = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let slow_d = format!("http://{}/x", slow.local_addr().unwrap());
    let _held = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((c, _)) = slow.accept().await {
            held.push(c);
        }
    });
    let r = send(
        "POST",
        &forward(&s, &slow_d, ""),
        &[],
        pattern(200 * 1024),
        false,
    )
    .await;
    assert_eq!(r.status, 504);
    let json: serde_json::Value = serde_json::from_slice(&r.body.unwrap()).unwrap();
    assert_eq!(json["side"], "upstream", "{json}");
}

/// A field the upstream's `Connection` names is hop-by-hop (RFC 9110 7.6.1): before, only
/// `Connection` itself was dropped and `X-Backend: 10.0.0.5` (the origin's internal address)
/// reached the client.
#[tokio::test]
async fn fields_named_in_connection_stay_behind() {
    let addr = support::raw_origin(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: X-Backend, close\r\n\
          X-Backend: 10.0.0.5\r\nX-Kept: yes\r\nKeep-Alive: timeout=5\r\n\r\nok",
    )
    .await;
    let origin = Origin::start().await;
    let s = start(&origin, |_| {}).await;
    let d = format!("http://{addr}/x");
    let r = send("GET", &forward(&s, &d, ""), &[], Bytes::new(), false).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), "ok");
    assert_eq!(r.headers["x-kept"], "yes");
    for gone in ["x-backend", "keep-alive"] {
        assert!(r.headers.get(gone).is_none(), "{gone}: {:?}", r.headers);
    }
}

/// Sends a POST head declaring `declared` bytes, then `first` of them at once and `step` more
/// every `every` for as long as sluice takes them, and reads the answer (status, JSON body and
/// when it came), or `None` when none comes within `wait`.
async fn trickled_upload(
    s: &Sluice,
    d: &str,
    declared: usize,
    first: usize,
    (step, every): (usize, std::time::Duration),
    wait: std::time::Duration,
) -> Option<(u16, serde_json::Value, std::time::Duration)> {
    use tokio::io::AsyncWriteExt;
    let path = format!("/proxy/forward?api_password=pw&d={}", enc(d));
    let conn = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let (mut rx, mut tx) = conn.into_split();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\n\
         Content-Length: {declared}\r\n\r\n"
    );
    let started = std::time::Instant::now();
    tx.write_all(head.as_bytes()).await.unwrap();
    tx.write_all(&pattern(first)).await.unwrap();
    let writer = tokio::spawn(async move {
        let mut sent = first;
        while sent + step <= declared {
            tokio::time::sleep(every).await;
            if tx.write_all(&vec![b'x'; step]).await.is_err() {
                return;
            }
            sent += step;
        }
        // Open until the answer is read: a half-closed request is dropped, not answered.
        std::future::pending::<()>().await;
        drop(tx);
    });
    let read = async {
        let (status, body) = read_answer(&mut rx).await?;
        Some((status, body, started.elapsed()))
    };
    let answer = tokio::time::timeout(wait, read).await.ok().flatten();
    writer.abort();
    answer
}

/// The idle deadline restarts at every byte, so a client declaring 65,000 bytes (all read ahead)
/// and sending one every half second under a 2 s idle deadline was held until it finished, and
/// at one byte every 59 s under the default 60 s, some 44 days: the task, the connection and the
/// client's `/proxy/*` place. Now the read-ahead also has `upstream.whole_body_timeout_secs` to
/// arrive whole and ends as the same 408, the place freed and nothing sent upstream.
#[tokio::test]
async fn a_trickled_upload_ends_as_408_at_the_whole_body_deadline() {
    let sink = Sink::start().await;
    let d = format!("http://{}/upload", sink.addr);
    let origin = Origin::start().await;
    let s = start(&origin, |c| {
        c.upstream.idle_read_timeout_secs = 2;
        c.upstream.whole_body_timeout_secs = 3;
        c.upstream.header_timeout_secs = 20;
        c.media.max_requests_per_client = 1;
    })
    .await;
    let every = std::time::Duration::from_millis(500);
    let wait = std::time::Duration::from_secs(10);
    let (status, json, took) = trickled_upload(&s, &d, 65_000, 10, (1, every), wait)
        .await
        .expect("an answer within 10 s");
    assert_eq!(
        (status, &json["side"], &json["kind"]),
        (408, &"downstream".into(), &"client_body_timeout".into()),
        "{json}"
    );
    let error = json["error"].as_str().unwrap();
    assert!(
        error.contains("upstream.whole_body_timeout_secs"),
        "{error}"
    );
    assert!(
        took >= std::time::Duration::from_secs(3) && took < std::time::Duration::from_secs(6),
        "{took:?}"
    );
    // Nothing reached the upstream, and the client's one place is free again.
    assert_eq!(*sink.heads.lock().unwrap(), 0);
    let r = send(
        "POST",
        &forward(&s, &d, ""),
        &[],
        Bytes::from("next"),
        false,
    )
    .await;
    assert_eq!(r.status, 201);
    // A body read ahead that comes whole in time, however slowly, still goes through.
    let (status, json, _) = trickled_upload(&s, &d, 20, 10, (5, every), wait)
        .await
        .expect("an answer");
    assert_eq!(status, 201, "{json}");
}

/// A steady upload still running when the upstream's header timeout (which counts the upload)
/// runs out is the client's 408 as before, but it said "sent no bytes for 30 s" of a body that
/// never paused: now it names the deadline it met.
#[tokio::test]
async fn a_steady_upload_past_the_header_timeout_says_so() {
    let sink = Sink::start().await;
    let d = format!("http://{}/upload", sink.addr);
    let origin = Origin::start().await;
    let s = start(&origin, |c| {
        c.upstream.idle_read_timeout_secs = 30;
        c.upstream.header_timeout_secs = 1;
    })
    .await;
    let every = std::time::Duration::from_millis(100);
    let wait = std::time::Duration::from_secs(6);
    // Past the read-ahead (streamed), then 1 KiB every 100 ms: never idle, never done in 1 s.
    let (status, json, took) =
        trickled_upload(&s, &d, 1024 * 1024, 100 * 1024, (1024, every), wait)
            .await
            .expect("an answer");
    assert_eq!(
        (status, &json["side"], &json["kind"]),
        (408, &"downstream".into(), &"client_body_timeout".into()),
        "{json}"
    );
    let error = json["error"].as_str().unwrap();
    assert!(error.contains("upstream.header_timeout_secs"), "{error}");
    assert!(!error.contains("no bytes"), "{error}");
    assert!(took < std::time::Duration::from_secs(4), "{took:?}");
}
