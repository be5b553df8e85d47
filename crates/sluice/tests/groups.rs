//! One set of upstream groups for the reverse and TCP front ends: active health checks steer
//! reverse-proxy requests, ejection by HTTP traffic holds for TCP listeners, and a reload keeps a
//! server's health. Everything runs against real sluice parts on 127.0.0.1:0, wired as the binary
//! wires them (one app, TCP listeners over the app's groups, one reloader).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Response, StatusCode};
use sluice::app::reload::Reloader;
use sluice::app::App;
use sluice::config::{Config, Overrides};
use sluice::server::Server;
use sluice::tcp::{TcpMetrics, TcpProxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

mod reverse_support;
use reverse_support::{full, origin, BoxBody};

/// sluice as `serve_reloadable` builds it: HTTP server, TCP listeners and a reloader on `file`.
struct Running {
    addr: SocketAddr,
    app: Arc<App>,
    tcp: Arc<TcpProxy>,
    reloader: Reloader,
    _stop: oneshot::Sender<()>,
}

impl Running {
    async fn start(file: &std::path::Path) -> Running {
        let config = Config::load(Some(file), std::iter::empty(), &Overrides::default()).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = App::new(&config).unwrap();
        let tcp = Arc::new(TcpProxy::new(TcpMetrics::register(
            &mut prometheus_client::registry::Registry::default(),
        )));
        tcp.apply(&config.tcp, app.groups().current()).unwrap();
        let server = Server::from_listeners(vec![listener], &config.server, app.clone()).unwrap();
        let (tx, rx) = oneshot::channel();
        tokio::spawn(server.run(async {
            let _ = rx.await;
        }));
        let mut reloader = Reloader::new(Some(file.to_path_buf()), Overrides::default());
        reloader.add("routes", app.reload_part());
        reloader.add(
            "tcp",
            sluice::tcp::reload_part(Arc::clone(&tcp), Arc::clone(app.groups())),
        );
        Running {
            addr,
            app,
            tcp,
            reloader,
            _stop: tx,
        }
    }

    async fn get(&self, path: &str) -> (StatusCode, String) {
        let r = reverse_support::get(&format!("http://{}{}", self.addr, path), &[]).await;
        let body = r.body.unwrap();
        (r.status, String::from_utf8_lossy(&body).into_owned())
    }

    async fn metrics(&self) -> String {
        self.get("/metrics").await.1
    }

    /// Waits (at most 10 s) until `/metrics` shows `line`.
    async fn wait_metric(&self, line: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let m = self.metrics().await;
            if m.lines().any(|l| l == line) {
                return;
            }
            assert!(Instant::now() < deadline, "no {line:?} in:\n{m}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// An origin answering `name` on every path, and on `/health` 200 while `up` holds (500 after).
/// Counts the requests that are not health checks.
async fn named_origin(name: &'static str, up: Arc<AtomicBool>) -> (SocketAddr, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let addr = origin(move |req| {
        let (up, hits) = (up.clone(), h.clone());
        async move {
            let mut resp: Response<BoxBody> = if req.uri().path() == "/health" {
                Response::new(full(""))
            } else {
                hits.fetch_add(1, Ordering::SeqCst);
                Response::new(full(name))
            };
            if req.uri().path() == "/health" && !up.load(Ordering::SeqCst) {
                *resp.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            }
            resp
        }
    })
    .await;
    (addr, hits)
}

fn write_config(dir: &tempfile::TempDir, text: &str) -> std::path::PathBuf {
    let path = dir.path().join("sluice.toml");
    std::fs::write(&path, text).unwrap();
    path
}

const HEALTH: &str = r#"health_check = { kind = "http", path = "/health", interval_secs = 1, timeout_secs = 1, rise = 1, fall = 1 }"#;

#[tokio::test]
async fn http_health_check_steers_reverse_routes_and_503_when_all_down() {
    let (good_up, bad_up) = (
        Arc::new(AtomicBool::new(true)),
        Arc::new(AtomicBool::new(false)),
    );
    let (good, good_hits) = named_origin("good", good_up.clone()).await;
    let (bad, bad_hits) = named_origin("bad", bad_up).await;
    let dir = tempfile::tempdir().unwrap();
    let file = write_config(
        &dir,
        &format!(
            "[server]\nlisten = [\"127.0.0.1:0\"]\n\n[[upstreams]]\nname = \"web\"\n\
             servers = [\"{good}\", \"{bad}\"]\n{HEALTH}\n\n\
             [[routes]]\npath = \"/\"\nupstream = \"web\"\n"
        ),
    );
    let s = Running::start(&file).await;
    // The reverse proxy's group is the one the checkers and the gauges see.
    s.wait_metric(&format!(
        "sluice_upstream_server_up{{group=\"web\",server=\"{bad}\"}} 0"
    ))
    .await;
    s.wait_metric(&format!(
        "sluice_upstream_server_up{{group=\"web\",server=\"{good}\"}} 1"
    ))
    .await;
    let before = bad_hits.load(Ordering::SeqCst);
    for i in 0..20 {
        let (status, body) = s.get(&format!("/item/{i}")).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "good"));
    }
    assert_eq!(bad_hits.load(Ordering::SeqCst), before);
    assert!(good_hits.load(Ordering::SeqCst) >= 20);

    // Every server down: a clear 503, and no request reaches an origin.
    good_up.store(false, Ordering::SeqCst);
    s.wait_metric(&format!(
        "sluice_upstream_server_up{{group=\"web\",server=\"{good}\"}} 0"
    ))
    .await;
    let hits = good_hits.load(Ordering::SeqCst) + bad_hits.load(Ordering::SeqCst);
    let (status, body) = s.get("/item/x").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["kind"], "no_healthy_upstream", "{body}");
    // The body names no group or server (they are in the log).
    assert_eq!(json["error"], "no usable upstream server", "{body}");
    assert_eq!(
        good_hits.load(Ordering::SeqCst) + bad_hits.load(Ordering::SeqCst),
        hits
    );

    // Back up: served again.
    good_up.store(true, Ordering::SeqCst);
    s.wait_metric(&format!(
        "sluice_upstream_server_up{{group=\"web\",server=\"{good}\"}} 1"
    ))
    .await;
    assert_eq!(s.get("/again").await, (StatusCode::OK, "good".to_string()));
}

/// A server that accepts TCP but speaks no HTTP: it writes `X` and closes. HTTP requests through it
/// fail (and eject it); a raw TCP relay would happily connect to it.
async fn not_http() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let _ = stream.write_all(b"X").await;
        }
    });
    addr
}

#[tokio::test]
async fn ejection_by_http_traffic_holds_for_the_tcp_listener() {
    let x = not_http().await;
    let (y, _) = named_origin("y", Arc::new(AtomicBool::new(true))).await;
    let dir = tempfile::tempdir().unwrap();
    let file = write_config(
        &dir,
        &format!(
            "[server]\nlisten = [\"127.0.0.1:0\"]\n\n[[upstreams]]\nname = \"pool\"\n\
             servers = [\"{x}\", \"{y}\"]\nmax_fails = 1\nfail_timeout_secs = 60\n\n\
             [[routes]]\npath = \"/\"\nupstream = \"pool\"\n\n\
             [[tcp]]\nname = \"raw\"\nlisten = \"127.0.0.1:0\"\nupstream = \"pool\"\n"
        ),
    );
    let s = Running::start(&file).await;
    let tcp_addr = s.tcp.local_addrs()[0].1;
    // Round robin sends one of the first two requests to x, which fails and is ejected; the GET is
    // retried on y.
    for _ in 0..2 {
        assert_eq!(s.get("/").await, (StatusCode::OK, "y".to_string()));
    }
    s.wait_metric(&format!(
        "sluice_upstream_server_ejections_total{{group=\"pool\",server=\"{x}\"}} 1"
    ))
    .await;
    // Every TCP connection now goes to y, though x still accepts connections.
    for _ in 0..6 {
        let mut c = TcpStream::connect(tcp_addr).await.unwrap();
        c.write_all(b"GET /tcp HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut out))
            .await
            .unwrap()
            .unwrap();
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(text.ends_with("\r\n\r\ny"), "{text}");
    }
    let m = s.metrics().await;
    assert!(
        m.lines().any(|l| l
            == format!(
                "sluice_upstream_server_ejections_total{{group=\"pool\",server=\"{x}\"}} 1"
            )),
        "{m}"
    );
    // Same object behind both front ends.
    let groups = s.app.groups().current();
    assert!(groups.get("pool").unwrap().servers()[0].is_ejected());
}

#[tokio::test]
async fn reload_keeps_server_health_and_is_all_or_nothing() {
    let (good, _) = named_origin("good", Arc::new(AtomicBool::new(true))).await;
    let (bad, bad_hits) = named_origin("bad", Arc::new(AtomicBool::new(false))).await;
    let dir = tempfile::tempdir().unwrap();
    // After the reload a server needs 5 failed checks an hour apart to go down: only the
    // carried-over state keeps `bad` out (a fresh server would start up and be tried).
    let config = |path: &str, interval: u64, fall: u32| {
        format!(
            "[server]\nlisten = [\"127.0.0.1:0\"]\n\n[[upstreams]]\nname = \"web\"\n\
             servers = [\"{good}\", \"{bad}\"]\nhealth_check = {{ kind = \"http\", path = \"/health\", \
             interval_secs = {interval}, timeout_secs = 1, rise = 1, fall = {fall} }}\n\n\
             [[routes]]\npath = \"{path}\"\nupstream = \"web\"\n"
        )
    };
    let file = write_config(&dir, &config("/", 1, 1));
    let s = Running::start(&file).await;
    let down = format!("sluice_upstream_server_up{{group=\"web\",server=\"{bad}\"}} 0");
    s.wait_metric(&down).await;

    // A changed group (new interval) and a changed route table.
    std::fs::write(&file, config("/v2/", 3600, 5)).unwrap();
    s.reloader.reload().unwrap();
    s.wait_metric(&down).await;
    let before = bad_hits.load(Ordering::SeqCst);
    for i in 0..10 {
        assert_eq!(
            s.get(&format!("/v2/{i}")).await,
            (StatusCode::OK, "good".to_string())
        );
    }
    assert_eq!(bad_hits.load(Ordering::SeqCst), before);
    assert!(!s.app.groups().current().get("web").unwrap().servers()[1].is_usable());

    // A refused reload (route to a missing group) installs nothing: the running generation stays.
    let generation = s.app.groups().current();
    std::fs::write(
        &file,
        config("/v3/", 1, 1).replace("upstream = \"web\"\n", "upstream = \"nope\"\n"),
    )
    .unwrap();
    assert!(s.reloader.reload().is_err());
    assert!(Arc::ptr_eq(&generation, &s.app.groups().current()));
    assert_eq!(
        s.get("/v2/still").await,
        (StatusCode::OK, "good".to_string())
    );
}

/// An origin with uWSGI's default `buffer-size` (4096): a request head over 4 KiB has its
/// connection closed unanswered; any other request gets 200 and `name`.
async fn small_head_origin(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut chunk = [0u8; 1024];
                loop {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&chunk[..n]),
                    }
                    if head.len() > 4096 {
                        return;
                    }
                    if head.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{name}",
                    name.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    addr
}

/// Finding: passive ejection could empty a group. Requests with a head the origins drop (a
/// 5 KiB `Cookie` to uWSGI's 4 KiB buffer) failed on each server in turn (the GET is replayed),
/// each failure booked, until every server was ejected and everyone got 503 for
/// `fail_timeout_secs`. Passive ejection alone now never empties the plan: with every server
/// ejected the ones the active check (none here) calls up are still tried.
#[tokio::test]
async fn heads_an_origin_drops_cannot_take_every_server_out() {
    let (a, b) = (small_head_origin("a").await, small_head_origin("b").await);
    let dir = tempfile::tempdir().unwrap();
    let file = write_config(
        &dir,
        &format!(
            "[server]\nlisten = [\"127.0.0.1:0\"]\n\n[[upstreams]]\nname = \"web\"\n\
             servers = [\"{a}\", \"{b}\"]\nmax_fails = 1\nfail_timeout_secs = 60\n\n\
             [[routes]]\npath = \"/\"\nupstream = \"web\"\n"
        ),
    );
    let s = Running::start(&file).await;
    let group = Arc::clone(s.app.groups().current().get("web").unwrap());
    let cookie = format!("session={}", "x".repeat(5 * 1024));
    let url = format!("http://{}/big", s.addr);
    for _ in 0..10 {
        if group.servers().iter().all(|s| s.is_ejected()) {
            break;
        }
        let r = reverse_support::get(&url, &[("cookie", &cookie)]).await;
        assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{r:?}");
    }
    assert!(
        group.servers().iter().all(|s| s.is_ejected()),
        "the big heads ejected every server"
    );
    // A normal request is still served by one of them (it was a 503 `no_healthy_upstream`).
    let (status, body) = s.get("/normal").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body == "a" || body == "b", "{body}");
}

/// Finding (review of the above): the fallback held primaries only, so with the primary down by
/// the active check and the backup ejected by heads it drops, every request got 503
/// `no_healthy_upstream`: passive ejection alone had emptied the group. With no primary the
/// check calls up, the fallback turns to the backups it does, and counts the plan.
#[tokio::test]
async fn a_backup_ejected_by_dropped_heads_still_serves_when_the_check_takes_the_primary() {
    let (primary, _) = named_origin("primary", Arc::new(AtomicBool::new(false))).await;
    let backup = small_head_origin("z").await;
    let dir = tempfile::tempdir().unwrap();
    let file = write_config(
        &dir,
        &format!(
            "[server]\nlisten = [\"127.0.0.1:0\"]\n\n[[upstreams]]\nname = \"web\"\n\
             servers = [\"{primary}\", {{ addr = \"{backup}\", backup = true }}]\n\
             max_fails = 1\nfail_timeout_secs = 60\n{HEALTH}\n\n\
             [[routes]]\npath = \"/\"\nupstream = \"web\"\n"
        ),
    );
    let s = Running::start(&file).await;
    s.wait_metric(&format!(
        "sluice_upstream_server_up{{group=\"web\",server=\"{primary}\"}} 0"
    ))
    .await;
    let cookie = format!("session={}", "x".repeat(5 * 1024));
    let r = reverse_support::get(
        &format!("http://{}/big", s.addr),
        &[("cookie", cookie.as_str())],
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{r:?}");
    let group = Arc::clone(s.app.groups().current().get("web").unwrap());
    assert!(
        group.servers()[1].is_ejected(),
        "the big head ejected the backup"
    );
    // Served by the backup (it was a 503 `no_healthy_upstream`), and counted.
    assert_eq!(s.get("/normal").await, (StatusCode::OK, "z".to_string()));
    s.wait_metric("sluice_upstream_fallback_plans_total{group=\"web\"} 1")
        .await;
}

/// `sluice_reverse_server_healthy` follows the active check: a server the check takes down reads
/// 0 though no request failed on it, and 1 again once the check brings it back. Set by request
/// attempts alone, it read 1 through the whole outage (no request reaches a server the check
/// took out).
#[tokio::test]
async fn the_reverse_healthy_gauge_follows_the_check() {
    let (a_up, b_up) = (
        Arc::new(AtomicBool::new(true)),
        Arc::new(AtomicBool::new(true)),
    );
    let (a, _) = named_origin("a", a_up.clone()).await;
    let (b, _) = named_origin("b", b_up).await;
    let dir = tempfile::tempdir().unwrap();
    let file = write_config(
        &dir,
        &format!(
            "[server]\nlisten = [\"127.0.0.1:0\"]\n\n[[upstreams]]\nname = \"web\"\n\
             servers = [\"{a}\", \"{b}\"]\n{HEALTH}\n\n\
             [[routes]]\npath = \"/\"\nupstream = \"web\"\n"
        ),
    );
    let s = Running::start(&file).await;
    // Both servers served a request (round robin): their series exist either way.
    for i in 0..4 {
        assert_eq!(s.get(&format!("/item/{i}")).await.0, StatusCode::OK);
    }
    let healthy = |addr: SocketAddr, v: u8| {
        format!("sluice_reverse_server_healthy{{group=\"web\",server=\"{addr}\"}} {v}")
    };
    s.wait_metric(&healthy(a, 1)).await;
    a_up.store(false, Ordering::SeqCst);
    s.wait_metric(&format!(
        "sluice_upstream_server_up{{group=\"web\",server=\"{a}\"}} 0"
    ))
    .await;
    let m = s.metrics().await;
    assert!(m.lines().any(|l| l == healthy(a, 0)), "{m}");
    assert!(m.lines().any(|l| l == healthy(b, 1)), "{m}");
    a_up.store(true, Ordering::SeqCst);
    s.wait_metric(&healthy(a, 1)).await;
}
