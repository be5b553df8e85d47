//! Attack catalogue, round 2: each test attacks a running sluice the way the finding describes
//! and asserts the defence (a reload that must revoke, a page that must sandbox, a browser page
//! that must be refused, a guard that must hold).

mod support;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{enc, get, request, test_config, Origin, Sluice};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

// === Helpers for a sluice run as a child process ===

/// One HTTP/1.1 exchange over a fresh connection; the whole answer as text.
fn raw(addr: &str, method: &str, path: &str, headers: &str, body: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

fn status(answer: &str) -> u16 {
    answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// An origin answering every request with `body` (thread per connection).
fn fixed_origin(body: &'static str) -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nCache-Control: max-age=600\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    addr
}

fn free_listen() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("127.0.0.1:{port}")
}

struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.0.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
    }
}

fn serve(file: &std::path::Path, listen: &str, pid: &std::path::Path) -> Child {
    let child = Command::new(BIN)
        .args(["serve", "--config", file.to_str().unwrap()])
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let child = Child(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(listen).is_err() || !pid.exists() {
        assert!(Instant::now() < deadline, "sluice did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

fn reload_config(
    listen: &str,
    pid: &std::path::Path,
    origin: &str,
    password: &str,
    purge_key: &str,
    idle: u64,
) -> String {
    format!(
        r#"
[server]
listen = ["{listen}"]
pid_file = "{}"
idle_timeout_secs = {idle}

[auth]
api_password = "{password}"

[upstream]
allow_private = true

[cache]
purge_key = "{purge_key}"

[[upstreams]]
name = "app"
servers = ["{origin}"]

[[routes]]
path = "/c/"
upstream = "app"
cache = true
"#,
        pid.display()
    )
}

// === 2: a reload applies [auth] and the purge key, or refuses naming what needs a restart ===

#[test]
fn a_reload_revokes_the_old_password_tokens_and_purge_key() {
    let origin = fixed_origin("origin-body");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.toml");
    let pid = dir.path().join("sluice.pid");
    let listen = free_listen();
    std::fs::write(
        &file,
        reload_config(&listen, &pid, &origin, "old-pw", "key-1", 60),
    )
    .unwrap();
    let _child = serve(&file, &listen, &pid);

    let stream = format!("/proxy/stream?d={}", enc(&format!("http://{origin}/s")));
    let with_old = raw(
        &listen,
        "GET",
        &format!("{stream}&api_password=old-pw"),
        "",
        "",
    );
    assert_eq!(status(&with_old), 200, "{with_old}");
    assert!(with_old.ends_with("origin-body"));
    // A sealed token minted under the old password.
    let link = raw(
        &listen,
        "POST",
        "/playlist/link",
        "api_password: old-pw\r\nContent-Type: application/json\r\n",
        &format!(r#"{{"d":"http://{origin}/list.m3u"}}"#),
    );
    assert_eq!(status(&link), 200, "{link}");
    let token_path = link
        .split("/_token_")
        .nth(1)
        .and_then(|t| t.split('"').next())
        .map(|t| format!("/_token_{t}"))
        .expect("a token URL");
    assert_ne!(status(&raw(&listen, "GET", &token_path, "", "")), 401);
    // Fill the cache, then the old purge key works.
    assert_eq!(status(&raw(&listen, "GET", "/c/x", "", "")), 200);
    let purge = raw(&listen, "PURGE", "/c/x", "X-Purge-Key: key-1\r\n", "");
    assert_eq!(status(&purge), 200, "{purge}");

    std::fs::write(
        &file,
        reload_config(&listen, &pid, &origin, "new-pw", "key-2", 60),
    )
    .unwrap();
    let answer = raw(
        &listen,
        "POST",
        "/admin/reload",
        "api_password: old-pw\r\n",
        "",
    );
    assert_eq!(status(&answer), 200, "{answer}");
    assert!(
        answer.ends_with(r#"{"changed":["auth.api_password","cache.purge_key"],"reloaded":true}"#),
        "{answer}"
    );
    assert!(
        !answer.contains("new-pw") && !answer.contains("key-2"),
        "{answer}"
    );

    // The old password, its token and the old purge key stop working at once.
    let old = raw(
        &listen,
        "GET",
        &format!("{stream}&api_password=old-pw"),
        "",
        "",
    );
    assert_eq!(status(&old), 403, "{old}");
    let new = raw(
        &listen,
        "GET",
        &format!("{stream}&api_password=new-pw"),
        "",
        "",
    );
    assert_eq!(status(&new), 200, "{new}");
    let token = raw(&listen, "GET", &token_path, "", "");
    assert_eq!(status(&token), 401, "{token}");
    assert!(token.ends_with(r#"{"detail":"invalid token"}"#), "{token}");
    assert_eq!(status(&raw(&listen, "GET", "/c/x", "", "")), 200);
    let purge = raw(&listen, "PURGE", "/c/x", "X-Purge-Key: key-1\r\n", "");
    assert_eq!(status(&purge), 403, "{purge}");
    let purge = raw(&listen, "PURGE", "/c/x", "X-Purge-Key: key-2\r\n", "");
    assert_eq!(status(&purge), 200, "{purge}");
    // The API password purges too, and only the new one.
    let purge = raw(&listen, "PURGE", "/c/x", "X-Purge-Key: old-pw\r\n", "");
    assert_eq!(status(&purge), 403, "{purge}");

    // A key that needs a restart refuses the reload, by name, and nothing changes.
    std::fs::write(
        &file,
        reload_config(&listen, &pid, &origin, "third-pw", "key-2", 61),
    )
    .unwrap();
    let answer = raw(
        &listen,
        "POST",
        "/admin/reload",
        "api_password: new-pw\r\n",
        "",
    );
    assert_eq!(status(&answer), 422, "{answer}");
    assert!(answer.contains(r#""reloaded":false"#), "{answer}");
    assert!(answer.contains("server.idle_timeout_secs"), "{answer}");
    assert!(!answer.contains("third-pw"), "{answer}");
    let new = raw(
        &listen,
        "GET",
        &format!("{stream}&api_password=new-pw"),
        "",
        "",
    );
    assert_eq!(
        status(&new),
        200,
        "the refused reload changed nothing: {new}"
    );
    // `sluice reload` (SIGHUP) says the same, and fails.
    let out = Command::new(BIN)
        .args(["reload", "--pid-file", pid.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("server.idle_timeout_secs"), "{stderr}");
    // With the restart key put back, SIGHUP applies the password and says so.
    std::fs::write(
        &file,
        reload_config(&listen, &pid, &origin, "third-pw", "key-2", 60),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["reload", "--pid-file", pid.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("changed: auth.api_password"), "{stdout}");
    let third = raw(
        &listen,
        "GET",
        &format!("{stream}&api_password=third-pw"),
        "",
        "",
    );
    assert_eq!(status(&third), 200, "{third}");
}

// === 12: a TOML error names line, column and key, never the line itself ===

#[test]
fn a_toml_error_never_quotes_the_secret_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.toml");
    let pid = dir.path().join("sluice.pid");
    let listen = free_listen();
    let good = format!(
        "[server]\nlisten = [\"{listen}\"]\npid_file = \"{}\"\n\n[auth]\napi_password = \"pw\"\n",
        pid.display()
    );
    std::fs::write(&file, &good).unwrap();
    let _child = serve(&file, &listen, &pid);
    let broken = good.replace(
        "api_password = \"pw\"",
        "api_password = \"hunter2-secret\" trailing",
    );
    std::fs::write(&file, &broken).unwrap();
    let answer = raw(&listen, "POST", "/admin/reload", "api_password: pw\r\n", "");
    assert_eq!(status(&answer), 422, "{answer}");
    assert!(!answer.contains("hunter2"), "{answer}");
    assert!(answer.contains("line 6, column"), "{answer}");
    assert!(answer.contains("auth.api_password"), "{answer}");
    let out = Command::new(BIN)
        .args(["check-config", file.to_str().unwrap()])
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success());
    assert!(!text.contains("hunter2"), "{text}");
    assert!(text.contains("line 6, column"), "{text}");
    // A value of the wrong type is not quoted either.
    let wrong = good.replace("api_password = \"pw\"", "api_password = 12345678");
    std::fs::write(&file, &wrong).unwrap();
    let out = Command::new(BIN)
        .args(["check-config", file.to_str().unwrap()])
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!text.contains("12345678"), "{text}");
    assert!(text.contains("auth.api_password"), "{text}");
}

// === In-process helpers ===

/// An origin that answers every path with an HTML page that would run script.
async fn html_origin() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let body = "<html><script>steal(document.cookie)</script></html>";
                let _ = s
                    .write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nSet-Cookie: a=b\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
            });
        }
    });
    addr
}

/// One raw HTTP/1.1 request to `addr` with the given head lines; the answer as text.
async fn raw_async(addr: SocketAddr, head: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("{head}Connection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

fn header<'a>(answer: &'a str, name: &str) -> Option<&'a str> {
    let head = answer.split("\r\n\r\n").next().unwrap_or("");
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

// === 5: every piped body is sandboxed ===

#[tokio::test]
async fn hls_segments_and_manifests_are_sandboxed() {
    let origin = html_origin().await;
    let s = Sluice::start(test_config()).await;
    let d = enc(&format!("http://{origin}/page"));
    for path in [
        format!("/proxy/hls/segment.ts?d={d}"),
        format!("/proxy/hls/segment.ts?d={d}&r_content-type=text%2Fhtml"),
        format!("/proxy/hls/manifest.m3u8?d={d}"),
        format!("/proxy/stream?d={d}"),
        format!("/proxy/stream?d={d}&r_content-type=text%2Fhtml"),
    ] {
        let r = get(&s.url(&path)).await;
        assert_eq!(
            r.headers
                .get("content-security-policy")
                .map(|v| v.to_str().unwrap()),
            Some("sandbox"),
            "{path}: {:?}",
            r.headers
        );
        assert_eq!(r.headers["x-content-type-options"], "nosniff", "{path}");
        assert!(r.headers.get("set-cookie").is_none(), "{path}");
    }
}

// === 16: response headers a link may not set ===

#[tokio::test]
async fn r_params_may_not_set_cookies_or_lift_the_sandbox() {
    let origin = Origin::start().await;
    let s = Sluice::start(test_config()).await;
    let d = enc(&origin.url("/small"));
    for bad in [
        "r_set-cookie=session%3Dattacker",
        "rp_Set-Cookie=session%3Dattacker",
        "r_content-security-policy=default-src%20*",
        "r_access-control-allow-origin=https%3A%2F%2Fevil.example",
        "r_strict-transport-security=max-age%3D99999999",
        "r_clear-site-data=%22*%22",
        "r_refresh=0%3Burl%3Dhttps%3A%2F%2Fevil.example",
    ] {
        let r = get(&s.url(&format!("/proxy/stream?d={d}&{bad}"))).await;
        assert_eq!(r.status, 400, "{bad}");
        assert!(r.headers.get("set-cookie").is_none(), "{bad}");
    }
    assert!(
        origin.seen_path("/small").is_empty(),
        "a refused link fetches nothing"
    );
    // An ordinary response header still works.
    let r = get(&s.url(&format!("/proxy/stream?d={d}&r_x-label=ok"))).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["x-label"], "ok");
}

// === 6: a password-free server and the browser ===

#[tokio::test]
async fn a_password_free_server_answers_only_loopback_names_and_grants_no_cors() {
    let origin = Origin::start().await;
    let s = Sluice::start(test_config()).await;
    // DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1.
    for path in ["/status.json", "/metrics", "/playlist.m3u", "/health"] {
        let answer = raw_async(
            s.addr,
            &format!(
                "GET {path} HTTP/1.1\r\nHost: evil.example:{}\r\n",
                s.addr.port()
            ),
        )
        .await;
        assert_eq!(status(&answer), 421, "{path}: {answer}");
    }
    let stream = format!("/proxy/stream?d={}", enc(&origin.url("/small")));
    let answer = raw_async(
        s.addr,
        &format!("GET {stream} HTTP/1.1\r\nHost: evil.example\r\n"),
    )
    .await;
    assert_eq!(status(&answer), 421, "{answer}");
    assert!(
        origin.seen_path("/small").is_empty(),
        "no open proxy for a foreign page"
    );
    let post = raw_async(
        s.addr,
        "POST /admin/reload HTTP/1.1\r\nHost: evil.example\r\nOrigin: http://evil.example\r\nContent-Length: 0\r\n",
    )
    .await;
    assert_eq!(status(&post), 421, "{post}");

    // Loopback names are served, without CORS: another origin cannot read the answers.
    for host in ["127.0.0.1", "localhost", "[::1]"] {
        let answer = raw_async(
            s.addr,
            &format!(
                "GET /status.json HTTP/1.1\r\nHost: {host}:{}\r\nOrigin: http://evil.example\r\n",
                s.addr.port()
            ),
        )
        .await;
        assert_eq!(status(&answer), 200, "{host}: {answer}");
        assert_eq!(
            header(&answer, "access-control-allow-origin"),
            None,
            "{answer}"
        );
    }
    let r = get(&s.url(&stream)).await;
    assert_eq!(r.status, 200);
    assert!(r.headers.get("access-control-allow-origin").is_none());
    let pre = request(
        "OPTIONS",
        &s.url("/admin/reload"),
        &[
            ("origin", "http://evil.example"),
            ("access-control-request-method", "POST"),
            ("access-control-request-headers", "api_password"),
        ],
    )
    .await;
    assert!(pre.headers.get("access-control-allow-origin").is_none());
    assert!(pre.headers.get("access-control-allow-headers").is_none());
}

#[tokio::test]
async fn behind_a_password_players_get_cors_and_the_operator_endpoints_do_not() {
    let origin = Origin::start().await;
    let mut config = test_config();
    config.auth.api_password = "pw".into();
    let s = Sluice::start(config).await;
    let stream = s.url(&format!(
        "/proxy/stream?d={}&api_password=pw",
        enc(&origin.url("/small"))
    ));
    let r = get(&stream).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["access-control-allow-origin"], "*");
    for path in [
        "/status.json?api_password=pw",
        "/metrics?api_password=pw",
        "/playlist.m3u?api_password=pw",
    ] {
        let r = get(&s.url(path)).await;
        assert!(
            r.headers.get("access-control-allow-origin").is_none(),
            "{path}"
        );
    }
    // With a password any Host is served (the password is the gate).
    let answer = raw_async(
        s.addr,
        "GET /status.json?api_password=pw HTTP/1.1\r\nHost: tv.example\r\n",
    )
    .await;
    assert_eq!(status(&answer), 200, "{answer}");
}

// === 16: state-changing POSTs take the password from a header only (no CSRF by cookie) ===

#[tokio::test]
async fn the_password_cookie_cannot_reload_or_mint() {
    let mut config = test_config();
    config.auth.api_password = "pw".into();
    let s = Sluice::start(config).await;
    let cookie = [
        ("cookie", "api_password=pw"),
        ("content-type", "application/json"),
    ];
    let r = request("POST", &s.url("/admin/reload"), &cookie).await;
    assert_eq!(r.status, 403);
    let r = request("POST", &s.url("/playlist/link"), &cookie).await;
    assert_eq!(r.status, 403);
    // Remembered Basic credentials do not count either.
    let basic = [("authorization", "Basic dTpwdw==")];
    let r = request("POST", &s.url("/admin/reload"), &basic).await;
    assert_eq!(r.status, 403);
}

// === A password-free server: a cross-site form cannot post /admin/reload ===

/// Without a password the only gates are a loopback client and a loopback `Host`, which a form
/// on any web page opened in a browser on this machine passes (`action="http://127.0.0.1:PORT/
/// admin/reload"`). The browser marks such a request (`Origin`, `Sec-Fetch-Site`); sluice
/// refuses it before the reload runs. curl and `sluice reload` send neither and still reload.
#[test]
fn a_cross_site_form_cannot_reload_a_password_free_server() {
    let (a, b) = (fixed_origin("from-a"), fixed_origin("from-b"));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.toml");
    let pid = dir.path().join("sluice.pid");
    let listen = free_listen();
    let config = |origin: &str| {
        format!(
            "[server]\nlisten = [\"{listen}\"]\npid_file = \"{}\"\n\n[upstream]\n\
             allow_private = true\n\n[[upstreams]]\nname = \"app\"\nservers = [\"{origin}\"]\n\n\
             [[routes]]\npath = \"/r/\"\nupstream = \"app\"\n",
            pid.display()
        )
    };
    std::fs::write(&file, config(&a)).unwrap();
    let _child = serve(&file, &listen, &pid);
    let routed = || raw(&listen, "GET", "/r/x", "", "");
    assert!(routed().ends_with("from-a"), "{}", routed());
    std::fs::write(&file, config(&b)).unwrap();
    let form = "Content-Type: application/x-www-form-urlencoded\r\n";
    for marks in [
        "Origin: https://evil.example\r\n".to_string(),
        "Origin: null\r\n".to_string(),
        "Origin: http://127.0.0.1.evil.example\r\n".to_string(),
        "Sec-Fetch-Site: cross-site\r\nOrigin: https://evil.example\r\n".to_string(),
        // Another port of localhost is the same site, not the same origin.
        "Sec-Fetch-Site: same-site\r\nOrigin: http://localhost:8080\r\n".to_string(),
        "Sec-Fetch-Site: cross-site\r\n".to_string(),
    ] {
        let answer = raw(
            &listen,
            "POST",
            "/admin/reload",
            &format!("{form}{marks}"),
            "a=1",
        );
        assert_eq!(status(&answer), 403, "{marks}: {answer}");
        assert!(routed().ends_with("from-a"), "{marks}: reloaded");
    }
    // sluice's own pages (same origin) and command-line clients (no marks) still reload.
    let own = format!("Origin: http://{listen}\r\nSec-Fetch-Site: same-origin\r\n");
    let answer = raw(&listen, "POST", "/admin/reload", &own, "");
    assert_eq!(status(&answer), 200, "{answer}");
    assert!(routed().ends_with("from-b"), "{}", routed());
    std::fs::write(&file, config(&a)).unwrap();
    let answer = raw(&listen, "POST", "/admin/reload", "", "");
    assert_eq!(status(&answer), 200, "{answer}");
    assert!(routed().ends_with("from-a"), "{}", routed());
}

// === Issue 34: the pages need the password ===

/// A GET from `local` (a loopback address other than 127.0.0.1) to `addr`.
async fn get_from(local: &str, addr: SocketAddr, path: &str, extra: &str) -> String {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(format!("{local}:0").parse().unwrap()).unwrap();
    let mut s = sock.connect(addr).await.unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: tv.example\r\n{extra}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn the_pages_ask_a_client_for_the_password() {
    let mut config = test_config();
    config.auth.api_password = "pw".into();
    // A listener on every address, as on a home server.
    config.server.listen = vec!["0.0.0.0:0".parse().unwrap()];
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = sluice::app::App::new(&config).unwrap();
    let server =
        sluice::server::Server::from_listeners(vec![listener], &config.server, app).unwrap();
    tokio::spawn(server.run(std::future::pending()));
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    for path in [
        "/status",
        "/status.json",
        "/player",
        "/playlist/builder",
        "/url-generator",
        "/",
    ] {
        let answer = get_from("127.0.0.2", addr, path, "").await;
        assert_eq!(status(&answer), 401, "{path}: {answer}");
        assert_eq!(
            header(&answer, "www-authenticate"),
            Some("Basic realm=\"sluice\", charset=\"UTF-8\""),
            "{path}"
        );
        // A wrong password is refused the same way.
        let answer = get_from(
            "127.0.0.2",
            addr,
            path,
            "Authorization: Basic dTp3cm9uZw==\r\n",
        )
        .await;
        assert_eq!(status(&answer), 401, "{path}: {answer}");
    }
    // "u:pw": any user name, the API password.
    for path in ["/status", "/playlist/builder", "/"] {
        let answer = get_from("127.0.0.2", addr, path, "Authorization: Basic dTpwdw==\r\n").await;
        assert_eq!(status(&answer), 200, "{path}: {answer}");
        assert!(
            answer.contains("<html")
                || answer.contains("<!DOCTYPE")
                || answer.contains("<!doctype"),
            "{path}"
        );
    }
    let answer = get_from(
        "127.0.0.2",
        addr,
        "/status.json",
        "Authorization: Basic dTpwdw==\r\n",
    )
    .await;
    assert_eq!(status(&answer), 200, "{answer}");
    // From 127.0.0.1 the rule is the same: a same-host reverse proxy makes every client local.
    let answer = get_from("127.0.0.1", addr, "/status", "").await;
    assert_eq!(status(&answer), 401, "{answer}");
}

// === 15: FCC signalling goes through the upstream guard ===

#[tokio::test]
async fn fcc_signalling_to_loopback_is_refused() {
    // Something listening where the attacker points FCC.
    let target = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let target_addr = target.local_addr().unwrap();
    let mut config = test_config();
    config.iptv.interfaces = vec!["lo".into()];
    let s = Sluice::start(config).await;
    let r = get(&s.url(&format!(
        "/udp/239.255.10.11:5000?iface=lo&fcc={target_addr}&fcc-type=telecom"
    )))
    .await;
    assert_eq!(r.status, 400);
    let body = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    assert!(
        body.contains("loopback") && body.contains("iptv.fcc.servers"),
        "{body}"
    );
    let mut buf = [0u8; 64];
    let got = tokio::time::timeout(Duration::from_millis(300), target.recv_from(&mut buf)).await;
    assert!(got.is_err(), "a datagram reached the loopback target");
}

// === 16: the SSRF guard knows the special-purpose registries ===

#[tokio::test]
async fn the_upstream_guard_refuses_special_purpose_ipv6() {
    let mut config = test_config();
    config.upstream.allow_private = false;
    let s = Sluice::start(config).await;
    for (host, class) in [
        ("[::ffff:0:7f00:1]", "IPv4-translated"),
        ("[2001::7f00:1]", "protocol-assignment"),
        ("[fec0::1]", "site-local"),
        ("[100::1]", "discard"),
        ("[64:ff9b::7f00:1]", "NAT64"),
        ("[2002:7f00:1::1]", "6to4"),
        ("[2001:db8::1]", "documentation"),
        ("192.0.2.1", "documentation"),
    ] {
        let r = get(&s.url(&format!(
            "/proxy/stream?d={}",
            enc(&format!("http://{host}/x"))
        )))
        .await;
        assert_eq!(r.status, 403, "{host}");
        let body = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
        assert!(body.contains(class), "{host}: {body}");
    }
}

// === The SSRF guard refuses this machine's own interface addresses ===

/// This machine's interface addresses other than loopback and link-local (`getifaddrs(3)`, read
/// here independently of the guard's own reader).
fn interface_addresses() -> Vec<std::net::IpAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    assert_eq!(unsafe { libc::getifaddrs(&mut head) }, 0);
    let mut node = head;
    while !node.is_null() {
        let ifa = unsafe { &*node };
        if !ifa.ifa_addr.is_null() {
            let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
            if family == libc::AF_INET {
                let sin =
                    unsafe { std::ptr::read_unaligned(ifa.ifa_addr.cast::<libc::sockaddr_in>()) };
                out.push(std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)).into());
            } else if family == libc::AF_INET6 {
                let sin6 =
                    unsafe { std::ptr::read_unaligned(ifa.ifa_addr.cast::<libc::sockaddr_in6>()) };
                let v6 = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                if (v6.segments()[0] & 0xffc0) != 0xfe80 {
                    out.push(v6.into());
                }
            }
        }
        node = ifa.ifa_next;
    }
    unsafe { libc::freeifaddrs(head) };
    out.retain(|a: &std::net::IpAddr| !a.is_loopback());
    out
}

/// A listener on every address (`0.0.0.0` or `[::]`) of one port that answers `200 own` and
/// counts the connections it accepts.
async fn counting_listener(any: &str) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let l = tokio::net::TcpListener::bind(any).await.unwrap();
    let port = l.local_addr().unwrap().port();
    let accepts = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = accepts.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nown",
                    )
                    .await;
            });
        }
    });
    (port, accepts)
}

#[tokio::test]
async fn the_upstream_guard_refuses_this_machines_own_addresses() {
    use std::sync::atomic::Ordering::SeqCst;
    let own = interface_addresses();
    let Some(v4) = own.iter().find(|a| a.is_ipv4()).copied() else {
        eprintln!("no IPv4 interface address besides loopback: nothing to test");
        return;
    };
    // Services bound to every address, as a database or a container daemon often is.
    let (port4, accepts4) = counting_listener("0.0.0.0:0").await;
    let v6_listener = match tokio::net::TcpListener::bind("[::1]:0").await {
        Ok(_) => Some(counting_listener("[::]:0").await),
        Err(_) => None,
    };
    let mut targets = vec![
        format!("http://{v4}:{port4}/x"),
        format!("http://[::ffff:{v4}]:{port4}/x"),
    ];
    if let Some((port6, _)) = &v6_listener {
        for a in own.iter().filter(|a| a.is_ipv6()) {
            targets.push(format!("http://[{a}]:{port6}/x"));
        }
    }

    // The guard on: refused before any connection, like every other class (403, the class named).
    let mut config = test_config();
    config.upstream.allow_private = false;
    let s = Sluice::start(config).await;
    for target in &targets {
        for path in ["/proxy/stream", "/proxy/forward"] {
            let r = get(&s.url(&format!("{path}?d={}", enc(target)))).await;
            assert_eq!(r.status, 403, "{path} {target}");
            let body = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
            assert!(
                body.contains("resolves to a this-host address"),
                "{path} {target}: {body}"
            );
        }
    }
    assert_eq!(
        accepts4.load(SeqCst),
        0,
        "sluice connected to its own address"
    );
    if let Some((_, accepts6)) = &v6_listener {
        assert_eq!(
            accepts6.load(SeqCst),
            0,
            "sluice connected to its own address"
        );
    }
    drop(s);

    // With `allow_private` the operator allows it: the traffic stays on this host.
    let s = Sluice::start(test_config()).await;
    let r = get(&s.url(&format!(
        "/proxy/stream?d={}",
        enc(&format!("http://{v4}:{port4}/x"))
    )))
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), "own");
    assert_eq!(accepts4.load(SeqCst), 1);
}

// === 16: /epg.xml.gz is routed ===

#[tokio::test]
async fn the_gzipped_guide_is_routed() {
    let s = Sluice::start(test_config()).await;
    for path in ["/epg.xml", "/epg.xml.gz"] {
        let r = get(&s.url(path)).await;
        let body = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
        assert_eq!(r.status, 404, "{path}");
        assert!(body.starts_with("no EPG source"), "{path}: {body}");
    }
}

// === 4: a playlist entry's token opens that channel alone ===

#[tokio::test]
async fn a_playlist_entry_token_opens_its_channel_only() {
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("list.m3u");
    std::fs::write(
        &list,
        "#EXTM3U\n#EXTINF:-1,One\nudp://@239.255.20.1:5000\n#EXTINF:-1,Two\nrtp://239.255.20.2:5002?fcc=127.0.0.1:9\n",
    )
    .unwrap();
    let mut config = test_config();
    config.auth.api_password = "entry-scope-pw-4417".into();
    config.iptv.interface = Some("lo".into());
    config.iptv.no_data_timeout_ms = 200;
    config.iptv.playlist = Some(list.to_str().unwrap().to_string());
    config.iptv.fcc.servers = vec!["127.0.0.0/8".parse().unwrap()];
    let s = Sluice::start(config).await;
    let r = get(&s.url("/playlist.m3u?api_password=entry-scope-pw-4417")).await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    let entries: Vec<&str> = text.lines().filter(|l| l.starts_with("http")).collect();
    assert_eq!(entries.len(), 2, "{text}");
    assert!(!text.contains("entry-scope-pw-4417"), "{text}");
    let token_of = |entry: &str| {
        let t = entry.split("/_token_").nth(1).unwrap();
        t.split('/').next().unwrap().to_string()
    };
    let (one, two) = (token_of(entries[0]), token_of(entries[1]));
    assert!(
        entries[0].ends_with("/udp/239.255.20.1:5000"),
        "{}",
        entries[0]
    );
    // The second entry's query is inside its token, not in the URL.
    assert!(
        entries[1].ends_with("/rtp/239.255.20.2:5002"),
        "{}",
        entries[1]
    );
    // Its own channel: served (no sender, so 504 after the no-data timeout), never 401.
    let own = get(&s.url(&format!("/_token_{one}/udp/239.255.20.1:5000"))).await;
    assert_eq!(own.status, 504);
    // mDNS, another group, another port, another path family, another interface: refused.
    for path in [
        format!("/_token_{one}/udp/224.0.0.251:5353"),
        format!("/_token_{one}/udp/239.255.20.9:5000"),
        format!("/_token_{one}/udp/239.255.20.1:50001"),
        format!("/_token_{one}/rtp/239.255.20.1:5000"),
        format!("/_token_{one}/rtsp/203.0.113.5:554/x"),
        format!("/_token_{one}/udp/239.255.20.1:5000?iface=eth0"),
        format!("/_token_{two}/rtp/239.255.20.2:5002?fcc=127.0.0.2:9"),
        format!("/_token_{one}/status.json"),
    ] {
        let r = get(&s.url(&path)).await;
        assert_eq!(r.status, 401, "{path}");
        assert_eq!(r.body.unwrap(), r#"{"detail":"invalid token"}"#, "{path}");
    }
    // With the password itself: control groups and unconfigured interfaces are still refused.
    for (path, why) in [
        (
            "/udp/224.0.0.251:5353?api_password=entry-scope-pw-4417",
            "control traffic",
        ),
        (
            "/udp/[ff02::fb]:5353?api_password=entry-scope-pw-4417",
            "control traffic",
        ),
        (
            "/udp/239.255.20.1:5000?iface=eth0&api_password=entry-scope-pw-4417",
            "not one this gateway serves",
        ),
    ] {
        let r = get(&s.url(path)).await;
        assert_eq!(r.status, 400, "{path}");
        let body = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
        assert!(body.contains(why), "{path}: {body}");
    }
}

// === 3: a self-proxy loop is cut at the first hop, and one client's share is bounded ===

/// An origin answering every request with a redirect to `to` (read per request), counting hits.
async fn redirecting_origin(
    to: std::sync::Arc<std::sync::Mutex<String>>,
) -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let to = to.lock().unwrap().clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(
                        format!("HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                            .as_bytes(),
                    )
                    .await;
            });
        }
    });
    (addr, hits)
}

#[tokio::test]
async fn an_origin_redirecting_to_sluice_itself_starts_no_chain() {
    let to = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let (origin, hits) = redirecting_origin(to.clone()).await;
    let mut config = test_config();
    // One upstream exchange per request (no splice attempt before the pipe), so hits count hops.
    config.media.splice_stream = false;
    let s = Sluice::start(config).await;
    let looping = format!("/proxy/stream?d={}", enc(&format!("http://{origin}/loop")));
    // The origin sends sluice back to itself, by address and by name.
    for back in [
        s.url(&looping),
        format!("http://localhost:{}{looping}", s.addr.port()),
    ] {
        *to.lock().unwrap() = back.clone();
        hits.store(0, std::sync::atomic::Ordering::SeqCst);
        let r = get(&s.url(&looping)).await;
        assert_eq!(r.status, 403, "{back}");
        let body = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
        assert!(body.contains("own listener"), "{body}");
        assert_eq!(
            hits.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "one hop, no chain: {back} {body}"
        );
    }
    // A request that carries this sluice's own loop mark (another route back here, through a
    // name or address the listener check cannot know) is refused before anything is fetched.
    let origin = Origin::start().await;
    let mark = sluice::upstream::guard::loop_mark()
        .to_str()
        .unwrap()
        .to_string();
    let r = request(
        "GET",
        &s.url(&format!("/proxy/stream?d={}", enc(&origin.url("/small")))),
        &[("x-sluice-loop", mark.as_str())],
    )
    .await;
    assert_eq!(r.status, 508);
    assert!(origin.seen_path("/small").is_empty());
    // Every upstream request carries the mark, so such a loop always shows.
    let r = get(&s.url(&format!("/proxy/stream?d={}", enc(&origin.url("/small"))))).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        origin.seen_path("/small")[0].headers["x-sluice-loop"],
        mark.as_str()
    );
    // Another sluice's mark is a chain of two proxies, which works.
    let r = request(
        "GET",
        &s.url(&format!("/proxy/stream?d={}", enc(&origin.url("/small")))),
        &[("x-sluice-loop", "0123456789abcdef")],
    )
    .await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn one_client_holds_at_most_its_share_of_media_requests() {
    let origin = Origin::start().await;
    let mut config = test_config();
    config.media.max_requests_per_client = 2;
    let s = Sluice::start(config).await;
    let hang = s.url(&format!("/proxy/stream?d={}", enc(&origin.url("/hang"))));
    let held: Vec<_> = (0..2)
        .map(|_| {
            let url = hang.clone();
            tokio::spawn(async move { get(&url).await })
        })
        .collect();
    // Wait until both reached the origin.
    let deadline = Instant::now() + Duration::from_secs(5);
    while origin.seen_path("/hang").len() < 2 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let small = s.url(&format!("/proxy/stream?d={}", enc(&origin.url("/small"))));
    let r = get(&small).await;
    assert_eq!(r.status, 429);
    let body = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    assert!(body.contains("max_requests_per_client"), "{body}");
    assert!(origin.seen_path("/small").is_empty());
    // Once they end (the header timeout cuts them), the client's share is free again.
    for h in held {
        assert_eq!(h.await.unwrap().status, 504);
    }
    let r = get(&small).await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn one_ip_holds_at_most_its_share_of_connections() {
    let mut config = test_config();
    config.server.max_connections_per_ip = 2;
    config.server.per_ip_exempt = Vec::new();
    let s = Sluice::start(config).await;
    let mut open = Vec::new();
    for _ in 0..2 {
        let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
        c.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .await
            .unwrap();
        let mut head = [0u8; 12];
        c.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 200");
        open.push(c);
    }
    // The third from the same address is closed without an answer...
    let mut third = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let _ = third
        .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await;
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), third.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the extra connection was left open");
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    // ...while another client is served.
    let answer = get_from("127.0.0.2", s.addr, "/health", "").await;
    assert_eq!(
        status(&answer),
        421,
        "served (a password-free server answers loopback names only): {answer}"
    );
    drop(open.pop());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let answer = raw_async(s.addr, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n").await;
    assert_eq!(status(&answer), 200, "{answer}");
}

#[tokio::test]
async fn one_client_watches_at_most_its_share_of_channels() {
    let mut config = test_config();
    config.iptv.interfaces = vec!["lo".into()];
    config.iptv.max_subscribers_per_client = 1;
    config.iptv.no_data_timeout_ms = 2000;
    let s = Sluice::start(config).await;
    let first = {
        let url = s.url("/udp/239.255.30.1:5000?iface=lo");
        tokio::spawn(async move { get(&url).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = get(&s.url("/udp/239.255.30.2:5000?iface=lo")).await;
    assert_eq!(r.status, 429);
    let body = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    assert_eq!(body, "this client is at its limit of 1 channels at once\n");
    assert_eq!(first.await.unwrap().status, 504);
}

// === Gating round: no open proxy behind a front proxy, no token on the operator's views ===

/// A client elsewhere, as a front proxy on this host listed in `auth.trusted_proxies` reports it.
const REMOTE: [(&str, &str); 1] = [("x-forwarded-for", "203.0.113.7")];

/// Without a password sluice is this machine's: behind a front proxy on the same host (listed in
/// `auth.trusted_proxies`, sending a loopback `Host`), a client elsewhere must not use
/// `/proxy/*`, the extractor, the playlist merge, the URL generators or the Xtream Codes paths as
/// an open proxy. `/health` and the IPTV gateway's paths stay open to it.
#[tokio::test]
async fn a_password_free_server_is_no_open_proxy_behind_a_front_proxy() {
    let origin = Origin::start().await;
    let mut config = test_config();
    config.auth.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    let s = Sluice::start(config).await;
    let small = enc(&origin.url("/small"));
    let stream = format!("/proxy/stream?d={small}");
    let fetches = [
        ("GET", stream.clone()),
        ("GET", format!("/proxy/hls/manifest.m3u8?d={small}")),
        ("GET", format!("/extractor/video?host=x&d={small}")),
        ("GET", format!("/playlist/playlist?d={small}")),
        ("POST", "/playlist/link".to_string()),
        ("POST", "/generate_url".to_string()),
        ("POST", "/generate_urls".to_string()),
        ("GET", "/live/u/p/1.ts".to_string()),
        ("GET", "/player_api.php?username=u&password=p".to_string()),
    ];
    for (method, path) in &fetches {
        let r = request(method, &s.url(path), &REMOTE).await;
        assert_eq!(r.status, 403, "{method} {path} from 203.0.113.7");
        let body = String::from_utf8_lossy(&r.body.unwrap_or_default()).into_owned();
        assert!(body.contains("no password"), "{path}: {body}");
    }
    assert!(
        origin.seen.lock().unwrap().is_empty(),
        "a client elsewhere had sluice fetch for it"
    );
    // This machine's clients, forwarded or not, are served as before.
    for via in [&[][..], &[("x-forwarded-for", "127.0.0.1")][..]] {
        let r = request("GET", &s.url(&stream), via).await;
        assert_eq!(r.status, 200, "via {via:?}");
        assert_eq!(r.body.unwrap(), "hello");
    }
    // The health check and the gateway's paths stay open to the client elsewhere (this gateway
    // has no channels: its own 404, not the gate's 403).
    let r = request("GET", &s.url("/health"), &REMOTE).await;
    assert_eq!(r.status, 200);
    for path in ["/playlist.m3u", "/udp/239.255.30.9:5000"] {
        let r = request("GET", &s.url(path), &REMOTE).await;
        let body = String::from_utf8_lossy(&r.body.unwrap_or_default()).into_owned();
        assert!(!body.contains("no password"), "{path}: {} {body}", r.status);
    }
}

/// No token opens the operator's views: not `/metrics`, the status, or the pages, even a
/// MediaFlow token that carries the password (it is a link handed to players). It gets the one
/// token refusal; the password itself still opens them, and the token still opens its stream.
#[tokio::test]
async fn no_token_opens_the_metrics_the_status_or_the_pages() {
    use sluice_media::token::TokenKey;
    let origin = Origin::start().await;
    let mut config = test_config();
    config.auth.api_password = "pw".into();
    config.auth.accept_mediaflow_tokens = true;
    config.auth.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    let s = Sluice::start(config).await;
    let params = vec![
        ("d".to_string(), origin.url("/small")),
        ("api_password".to_string(), "pw".to_string()),
    ];
    let t = TokenKey::new("pw").encrypt(&params, None, None, [5; 16]);
    let refused = request("GET", &s.url("/_token_garbage/proxy/stream"), &REMOTE).await;
    assert_eq!(refused.status, 401);
    let ok = request("GET", &s.url(&format!("/_token_{t}/proxy/stream")), &REMOTE).await;
    assert_eq!(ok.status, 200);
    assert_eq!(ok.body.unwrap(), "hello");
    let mut paths = vec![
        format!("/_token_{t}/metrics"),
        format!("/metrics?token={t}"),
        format!("/_token_{t}/status.json"),
        format!("/_token_{t}/status"),
        format!("/status.json?token={t}"),
        format!("/_token_{t}/player"),
    ];
    if cfg!(feature = "media") {
        paths.extend([
            format!("/_token_{t}/"),
            format!("/_token_{t}/playlist/builder"),
        ]);
    }
    for path in &paths {
        // From this machine and from elsewhere alike.
        for via in [&[][..], &REMOTE[..]] {
            let r = request("GET", &s.url(path), via).await;
            assert_eq!(r.status, 401, "{path} via {via:?}");
            assert_eq!(r.body, refused.body, "{path} via {via:?}");
        }
    }
    // The password itself opens them.
    let pw = [REMOTE[0], ("api_password", "pw")];
    for path in ["/metrics", "/status.json"] {
        let r = request("GET", &s.url(path), &pw).await;
        assert_eq!(r.status, 200, "{path}");
    }
}

/// `/playlist/playlist` fetches up to 16 sources of up to 8 MiB each: its requests hold places in
/// the client's in-flight share as `/proxy/*` ones do.
#[tokio::test]
async fn a_playlist_merge_holds_its_place_in_the_clients_share() {
    let origin = Origin::start().await;
    let mut config = test_config();
    config.media.max_requests_per_client = 2;
    let s = Sluice::start(config).await;
    let hang = s.url(&format!(
        "/playlist/playlist?d={}",
        enc(&origin.url("/hang"))
    ));
    let held: Vec<_> = (0..2)
        .map(|_| {
            let url = hang.clone();
            tokio::spawn(async move { get(&url).await })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while origin.seen_path("/hang").len() < 2 {
        assert!(
            Instant::now() < deadline,
            "the merges did not reach the origin"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for path in [
        format!("/playlist/playlist?d={}", enc(&origin.url("/small"))),
        format!("/proxy/stream?d={}", enc(&origin.url("/small"))),
    ] {
        let r = get(&s.url(&path)).await;
        assert_eq!(r.status, 429, "{path}");
        let body = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
        assert!(body.contains("max_requests_per_client"), "{body}");
    }
    assert!(origin.seen_path("/small").is_empty());
    for h in held {
        h.await.unwrap();
    }
    let r = get(&s.url(&format!("/proxy/stream?d={}", enc(&origin.url("/small"))))).await;
    assert_eq!(r.status, 200);
}

/// The in-flight share is one per IPv6 /64, as the connection share is: a host holding a whole
/// /64 does not get a share per address it cares to use.
#[tokio::test]
async fn one_ipv6_network_holds_one_share_of_media_requests() {
    let origin = Origin::start().await;
    let mut config = test_config();
    config.auth.api_password = "pw".into();
    config.auth.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    config.media.max_requests_per_client = 2;
    let s = Sluice::start(config).await;
    let hang = s.url(&format!(
        "/proxy/stream?d={}&api_password=pw",
        enc(&origin.url("/hang"))
    ));
    let held: Vec<_> = ["2001:db8:1:2::1", "2001:db8:1:2::2"]
        .into_iter()
        .map(|ip| {
            let url = hang.clone();
            tokio::spawn(async move { request("GET", &url, &[("x-forwarded-for", ip)]).await })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while origin.seen_path("/hang").len() < 2 {
        assert!(
            Instant::now() < deadline,
            "the streams did not reach the origin"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let small = s.url(&format!(
        "/proxy/stream?d={}&api_password=pw",
        enc(&origin.url("/small"))
    ));
    // A third address in the same /64 is over the share...
    let r = request("GET", &small, &[("x-forwarded-for", "2001:db8:1:2::3")]).await;
    assert_eq!(r.status, 429);
    assert!(origin.seen_path("/small").is_empty());
    // ...another /64 is not.
    let r = request("GET", &small, &[("x-forwarded-for", "2001:db8:1:3::1")]).await;
    assert_eq!(r.status, 200);
    for h in held {
        assert_eq!(h.await.unwrap().status, 504);
    }
}

/// Without a password any local user may post `/admin/reload`: a refused reload tells such a
/// caller to read the log, not why (the reason may quote a config value). With a password the
/// caller proved it is the operator and is told (see the reload test above).
#[test]
fn a_refused_reload_tells_a_password_free_caller_nothing_of_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.toml");
    let pid = dir.path().join("sluice.pid");
    let listen = free_listen();
    let config = |idle: u64| {
        format!(
            "[server]\nlisten = [\"{listen}\"]\npid_file = \"{}\"\nidle_timeout_secs = {idle}\n",
            pid.display()
        )
    };
    std::fs::write(&file, config(60)).unwrap();
    let _child = serve(&file, &listen, &pid);
    // A key that needs a restart: the reload is refused, naming the key in the log only.
    std::fs::write(&file, config(61)).unwrap();
    let answer = raw(&listen, "POST", "/admin/reload", "", "");
    assert_eq!(status(&answer), 422, "{answer}");
    assert!(answer.contains(r#""reloaded":false"#), "{answer}");
    assert!(answer.contains("see the log"), "{answer}");
    assert!(!answer.contains("idle_timeout"), "{answer}");
}

/// A front proxy on this host that is not listed in `auth.trusted_proxies` connects from
/// 127.0.0.1 for every client: its forwarding header is not believed, so the client address is
/// loopback. On a password-free server such a request (any of `X-Forwarded-For`, `Forwarded`,
/// `X-Real-IP` from an untrusted peer) is not local: `/proxy/*` gets the local-only 403, telling
/// the operator to list the proxy, while the same request without the header is served and
/// `/health` answers either way. Before, the proxy made sluice an open proxy again.
#[tokio::test]
async fn a_password_free_server_is_no_open_proxy_behind_an_untrusted_front_proxy() {
    let origin = Origin::start().await;
    let s = Sluice::start(test_config()).await;
    let stream = format!("/proxy/stream?d={}", enc(&origin.url("/small")));
    let relayed: [[(&str, &str); 1]; 3] = [
        [("x-forwarded-for", "203.0.113.7")],
        [("forwarded", "for=203.0.113.7;proto=https")],
        [("x-real-ip", "203.0.113.7")],
    ];
    for via in &relayed {
        let r = request("GET", &s.url(&stream), via).await;
        assert_eq!(r.status, 403, "via {via:?}");
        let body = String::from_utf8_lossy(&r.body.unwrap_or_default()).into_owned();
        assert!(body.contains("no password"), "{body}");
        assert!(body.contains("auth.trusted_proxies"), "{body}");
        let r = request("GET", &s.url("/health"), via).await;
        assert_eq!(r.status, 200, "/health via {via:?}");
    }
    assert!(
        origin.seen.lock().unwrap().is_empty(),
        "a relayed client had sluice fetch for it"
    );
    // This machine's own client, without the header: served.
    let r = request("GET", &s.url(&stream), &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), "hello");
}

/// Finding: only `X-Forwarded-For` was read from a trusted proxy, so behind one that writes
/// `X-Real-IP` alone (nginx's common `proxy_set_header X-Real-IP $remote_addr`) or `Forwarded`
/// alone (HAProxy's `option forwarded`) every client was the proxy itself: listed as trusted on
/// this host, every client elsewhere was local, and a password-free sluice an open proxy with open
/// admin endpoints. Now `Forwarded` is read as `X-Forwarded-For` is, `X-Real-IP` alone makes the
/// client unknown (refused), and an `X-Forwarded-For` a client forged through a proxy that writes
/// only `Forwarded` does not pass for local.
#[tokio::test]
async fn a_password_free_server_reads_forwarded_and_never_x_real_ip_alone() {
    let origin = Origin::start().await;
    let mut config = test_config();
    config.auth.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    let s = Sluice::start(config).await;
    let stream = format!("/proxy/stream?d={}", enc(&origin.url("/small")));
    let refused: [&[(&str, &str)]; 5] = [
        &[("x-real-ip", "203.0.113.7")],
        &[("forwarded", "for=203.0.113.7")],
        &[("forwarded", "for=\"203.0.113.7:4711\";proto=https")],
        &[("forwarded", "for=unknown")],
        // Forged by the client, passed by a proxy that writes `Forwarded` only.
        &[
            ("x-forwarded-for", "127.0.0.1"),
            ("forwarded", "for=203.0.113.7"),
        ],
    ];
    for via in refused {
        for path in [stream.as_str(), "/metrics"] {
            let r = request("GET", &s.url(path), via).await;
            assert_eq!(r.status, 403, "{path} via {via:?}");
            let body = String::from_utf8_lossy(&r.body.unwrap_or_default()).into_owned();
            assert!(body.contains("no password"), "{path}: {body}");
        }
    }
    assert!(
        origin.seen.lock().unwrap().is_empty(),
        "a client elsewhere had sluice fetch for it"
    );
    // This machine's client, as the trusted proxy names it in `Forwarded`: local.
    let local: [&[(&str, &str)]; 2] = [
        &[("forwarded", "for=127.0.0.1")],
        &[("forwarded", "proto=http;For=\"127.0.0.1:5555\"")],
    ];
    for via in local {
        let r = request("GET", &s.url("/metrics"), via).await;
        assert_eq!(r.status, 200, "/metrics via {via:?}");
    }
    let r = request("GET", &s.url(&stream), local[0]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), "hello");
}
