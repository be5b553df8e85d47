//! The binary as an operator meets it: the password from a file (never in argv), a misspelled
//! `RUST_LOG`, plain logs on a pipe, a `/metrics` whose Content-Type matches its body, a home page
//! that names every job configured, upstream failures in plain words and a `PURGE` refusal that
//! says what to configure.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

/// The sluice binary on a free loopback port, its stderr lines collected by a thread.
struct Binary {
    child: Child,
    port: u16,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Binary {
    fn start(args: &[&str], env: &[(&str, &str)]) -> Binary {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let listen = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.args(["serve", "--listen", &listen])
            .args(args)
            .env_remove("RUST_LOG")
            .env_remove("SLUICE_AUTH_API_PASSWORD")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = lines.clone();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        let b = Binary { child, port, lines };
        b.wait_for("listening");
        b
    }

    fn wait_for(&self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self
                .lines
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.contains(needle))
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("no {needle:?} in {:?}", self.lines.lock().unwrap());
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn stderr(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn password_file_keeps_the_secret_out_of_argv_and_bad_rust_log_keeps_info() {
    let origin = Origin::start().await;
    let secret = "file-secret-7f3a";
    let mut file = tempfile::NamedTempFile::new().unwrap();
    writeln!(file, "{secret}").unwrap();
    let b = Binary::start(
        &[
            "--allow-private-upstreams",
            "--api-password-file",
            file.path().to_str().unwrap(),
        ],
        &[("RUST_LOG", "warning")],
    );
    // The password works, the trailing newline is not part of it, and argv does not show it.
    let d = enc(&origin.url("/small"));
    assert_eq!(
        get(&b.url(&format!("/proxy/stream?d={d}"))).await.status,
        403
    );
    let r = get(&b.url(&format!("/proxy/stream?d={d}&api_password={secret}"))).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), "hello");
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", b.child.id())).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains(secret));
    // `warning` is not a level: a warning says so, and info lines (the listener) still appear,
    // without colour codes because stderr is a pipe.
    let log = b.stderr();
    assert!(log.contains("\"warning\" is not a level"), "{log}");
    assert!(log.contains("listening"), "{log}");
    assert!(!log.contains('\u{1b}'), "{log}");
    assert!(!log.contains(secret), "{log}");
}

#[tokio::test]
async fn password_from_the_environment() {
    let b = Binary::start(&[], &[("SLUICE_AUTH_API_PASSWORD", "env-secret")]);
    let d = enc("http://127.0.0.1:1/x");
    assert_eq!(
        get(&b.url(&format!("/proxy/stream?d={d}"))).await.status,
        403
    );
    let r = get(&b.url(&format!("/proxy/stream?d={d}&api_password=wrong"))).await;
    assert_eq!(r.status, 403);
}

#[tokio::test]
async fn empty_password_file_is_refused() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--listen", "127.0.0.1:0", "--api-password-file"])
        .arg(file.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is empty"));
}

#[tokio::test]
async fn metrics_content_type_matches_the_body() {
    let s = Sluice::start(test_config()).await;
    // Spend a little CPU (bounded: 150 ms of wall time) so the CPU counter has something to show.
    let spin = Instant::now();
    let mut x = 0u64;
    while spin.elapsed() < Duration::from_millis(150) {
        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
    }
    // A plain scraper gets Prometheus text 0.0.4: no `# EOF`, counters typed by their sample name.
    let r = get(&s.url("/metrics")).await;
    assert_eq!(
        r.headers["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    assert!(!text.contains("# EOF"), "{text}");
    assert!(
        text.contains("# TYPE sluice_requests_total counter"),
        "{text}"
    );
    // Prometheus asks for OpenMetrics first and gets it.
    let r = request(
        "GET",
        &s.url("/metrics"),
        &[(
            "accept",
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
        )],
    )
    .await;
    assert_eq!(
        r.headers["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(text.contains("# TYPE sluice_requests counter"), "{text}");
    // The standard process families, with believable values.
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} in {text}"))
            .parse()
            .unwrap()
    };
    assert!(value("process_resident_memory_bytes") > 1e6);
    assert!(value("process_open_fds") >= 3.0);
    assert!(value("process_cpu_seconds_total") > 0.0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let start = value("process_start_time_seconds");
    assert!(
        start <= now + 1.0 && start > now - 3600.0,
        "{start} vs {now}"
    );
}

#[tokio::test]
async fn playlist_credentials_never_reach_a_client() {
    let mut config = test_config();
    // A provider URL with credentials in both places providers put them; nothing listens there.
    config.iptv.playlist =
        Some("http://acct:sekret1@127.0.0.1:1/get.php?username=acct&password=sekret2".into());
    let s = Sluice::start(config).await;
    let r = get(&s.url("/playlist.m3u")).await;
    assert_eq!(r.status, 502);
    assert_eq!(r.body.unwrap(), "playlist unavailable\n");
}

/// A config from TOML text, listening on loopback.
fn parsed(text: &str) -> sluice::config::Config {
    let mut config = sluice::config::Config::parse_file(text).unwrap();
    config.server.listen = vec!["127.0.0.1:0".parse().unwrap()];
    config.upstream.allow_private = true;
    config.validate().unwrap();
    config
}

fn text(r: &Reply) -> String {
    String::from_utf8(r.body.as_ref().unwrap().to_vec()).unwrap()
}

const NO_PASSWORD_HINT: &str =
    "No API password is set: nothing here needs one, and sluice answers \
     only on loopback addresses, for loopback host names (127.0.0.1, localhost). To serve other \
     hosts, set one (auth.api_password, SLUICE_AUTH_API_PASSWORD or --api-password-file).";
const PASSWORD_HINT: &str =
    "Every endpoint that fetches on a client's behalf needs the API password or a token.";

#[tokio::test]
async fn home_page_names_every_job_configured() {
    let s = Sluice::start(parsed(
        r#"
[[upstreams]]
name = "app"
servers = ["127.0.0.1:9"]

[[upstreams]]
name = "db"
servers = ["127.0.0.1:5433"]

[[routes]]
path = "/shop/"
upstream = "app"
cache = true

[[routes]]
host = "api.test"
upstream = "app"

[[tcp]]
listen = "127.0.0.1:15432"
upstream = "db"

[iptv]
interface = "lo"
"#,
    ))
    .await;
    let r = get(&s.url("/")).await;
    assert_eq!(r.status, 200);
    let page = text(&r);
    let jobs = "</table>\n\
<h2>Reverse proxy</h2>\n\
<p>2 routes to upstream groups; the longest matching path wins (sluice check-config prints the \
whole table, built-in endpoints included).</p>\n\
<table>\n  <tr><th>host</th><th>path</th><th>upstream group (servers)</th><th>cached</th></tr>\n  \
<tr><td>any</td><td>/shop/</td><td>app (127.0.0.1:9)</td><td>yes</td></tr>\n  \
<tr><td>api.test</td><td>/</td><td>app (127.0.0.1:9)</td><td>no</td></tr>\n</table>\n\
<h2>Slice cache</h2>\n\
<p>Used by 1 route and the media proxy&#39;s manifests and segments. Memory 256 MiB, disk off, \
slices of 1 MiB.</p>\n\
<h2>TCP proxy</h2>\n\
<p>Every connection to one of these listeners is relayed to a server of its group.</p>\n\
<table>\n  <tr><th>listens on</th><th>goes to</th></tr>\n  \
<tr><td>127.0.0.1:15432</td><td>upstream &quot;db&quot;</td></tr>\n</table>\n\
<h2>IPTV gateway</h2>\n\
<p>Channels play at /rtp/&lt;group&gt;:&lt;port&gt;, /udp/&lt;group&gt;:&lt;port&gt; and \
/rtsp/&lt;host&gt;:&lt;port&gt;/&lt;path&gt;. Every channel also plays as HLS at \
/hls/&lt;channel path&gt;/index.m3u8, and /player plays them in a browser. Multicast joins use \
interface lo. No channel list is configured (iptv.playlist). /status shows channels, viewers \
and loss live.</p>\n";
    assert!(page.contains(jobs), "{page}");
    assert!(page.contains("<h2>Media proxy</h2>"), "{page}");
    assert!(!page.contains("Not set up here"), "{page}");
    // No password is set, and the page says so instead of asking for one.
    assert!(
        page.contains(&format!("<p class=\"hint\">{NO_PASSWORD_HINT}</p>")),
        "{page}"
    );
    assert!(!page.contains(PASSWORD_HINT), "{page}");
}

#[tokio::test]
async fn home_page_with_a_password_and_nothing_but_the_defaults() {
    let mut config = test_config();
    config.auth.api_password = "home-secret-x9".into();
    let s = Sluice::start(config).await;
    assert_eq!(get(&s.url("/")).await.status, 401);
    // HTTP Basic, any user name: "me:home-secret-x9".
    let r = request(
        "GET",
        &s.url("/"),
        &[("authorization", "Basic bWU6aG9tZS1zZWNyZXQteDk=")],
    )
    .await;
    assert_eq!(r.status, 200);
    let page = text(&r);
    assert!(
        page.contains(&format!("<p class=\"hint\">{PASSWORD_HINT}</p>")),
        "{page}"
    );
    assert!(!page.contains("No API password is set"), "{page}");
    assert!(
        page.contains(
            "<h2>Not set up here</h2>\n<p>reverse proxy ([[upstreams]] and [[routes]]); TCP \
             proxy ([[upstreams]] and [[tcp]]). sluice.example.toml documents every key.</p>\n"
        ),
        "{page}"
    );
    assert!(!page.contains("home-secret-x9"), "{page}");
}

#[tokio::test]
async fn upstream_failures_read_plainly() {
    let s = Sluice::start(test_config()).await;
    // `.invalid` names fail in the resolver itself (RFC 6761): no query leaves the machine.
    let r = get(&s.url(&format!(
        "/proxy/stream?d={}",
        enc("http://nosuchhost.invalid/x")
    )))
    .await;
    assert_eq!(r.status, 502);
    assert_eq!(
        text(&r),
        r#"{"error":"cannot resolve nosuchhost.invalid: no such name in DNS","kind":"dns","side":"upstream","upstream":"nosuchhost.invalid"}"#
    );
    // A port nothing listens on: the message names host and port.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let r = get(&s.url(&format!(
        "/proxy/stream?d={}",
        enc(&format!("http://127.0.0.1:{closed}/x"))
    )))
    .await;
    assert_eq!(r.status, 502);
    assert_eq!(
        text(&r),
        format!(
            r#"{{"error":"cannot connect to 127.0.0.1:{closed}: connection refused","kind":"connect","side":"upstream","upstream":"127.0.0.1"}}"#
        )
    );
    // With the guard on, a closed port and an open one on loopback are refused alike: the port
    // in the connect message tells nothing about private addresses.
    let origin = Origin::start().await;
    let mut guarded = test_config();
    guarded.upstream.allow_private = false;
    let g = Sluice::start(guarded).await;
    let refused = |url: String| {
        let g = g.url(&format!("/proxy/stream?d={}", enc(&url)));
        async move { get(&g).await }
    };
    let open = refused(origin.url("/small")).await;
    let shut = refused(format!("http://127.0.0.1:{closed}/x")).await;
    assert_eq!(open.status, 403);
    assert_eq!((shut.status, text(&shut)), (open.status, text(&open)));
}

#[tokio::test]
async fn purge_refusal_says_what_to_configure() {
    let origin = Origin::start().await;
    let config = |extra: &str| {
        parsed(&format!(
            "[[upstreams]]\nname = \"app\"\nservers = [\"{}\"]\n\n[[routes]]\npath = \"/\"\n\
             upstream = \"app\"\ncache = true\n{extra}",
            origin.addr
        ))
    };
    let purge = |s: &Sluice, key: Option<&str>| {
        let url = s.url("/small");
        let key = key.map(str::to_string);
        async move {
            let headers: Vec<(&str, &str)> = key
                .as_deref()
                .map(|k| vec![("x-purge-key", k)])
                .unwrap_or_default();
            let r = request("PURGE", &url, &headers).await;
            (r.status.as_u16(), text(&r))
        }
    };
    // Neither a purge key nor a password: nothing can purge, and the answer says what to set.
    let s = Sluice::start(config("")).await;
    let off = (
        403,
        r#"{"error":"forbidden: PURGE is off until cache.purge_key is set; then send that key in X-Purge-Key from an address in cache.purge_allow"}"#.to_string(),
    );
    assert_eq!(purge(&s, None).await, off);
    assert_eq!(purge(&s, Some("guess")).await, off);
    // A password but no purge key: the password purges; every refusal reads the same.
    let s = Sluice::start(config("[auth]\napi_password = \"purge-pw-4k\"\n")).await;
    let hint = (
        403,
        r#"{"error":"forbidden: no cache.purge_key is set; send the API password in X-Purge-Key from an address in cache.purge_allow, or set cache.purge_key"}"#.to_string(),
    );
    assert_eq!(purge(&s, None).await, hint);
    assert_eq!(purge(&s, Some("guess")).await, hint);
    assert_eq!(
        purge(&s, Some("purge-pw-4k")).await,
        (200, r#"{"purged":0,"soft":false}"#.to_string())
    );
    // With a purge key set, a refusal is the plain 403 it always was.
    let s = Sluice::start(config("[cache]\npurge_key = \"pk-77\"\n")).await;
    let plain = (403, r#"{"error":"forbidden"}"#.to_string());
    assert_eq!(purge(&s, None).await, plain);
    assert_eq!(purge(&s, Some("guess")).await, plain);
    assert_eq!(purge(&s, Some("pk-77")).await.0, 200);
}

#[tokio::test]
async fn home_page_follows_a_reload() {
    let first = parsed("");
    let app = sluice::app::App::new(&first).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server =
        sluice::server::Server::from_listeners(vec![listener], &first.server, app.clone()).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let done = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    let home = || async move { text(&get(&format!("http://{addr}/")).await) };
    assert!(home()
        .await
        .contains("<h2>Not set up here</h2>\n<p>reverse proxy"));
    // A route added by a reload shows at once, its names escaped.
    app.reload(&parsed(
        "[[upstreams]]\nname = \"web&co\"\nservers = [\"127.0.0.1:9\"]\n\n[[routes]]\n\
         path = \"/w/\"\nupstream = \"web&co\"\n",
    ))
    .unwrap();
    let page = home().await;
    assert!(
        page.contains(
            "<tr><td>any</td><td>/w/</td><td>web&amp;co (127.0.0.1:9)</td><td>no</td></tr>"
        ),
        "{page}"
    );
    assert!(!page.contains("<p>reverse proxy ("), "{page}");
    let _ = stop.send(());
    let _ = done.await;
}
