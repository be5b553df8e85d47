//! The `sluice` binary: config errors (in the file and in `SLUICE_*` variables), check-config
//! masking and its route table, help text, serve with defaults and SIGTERM.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

fn run(args: &[&str]) -> (bool, String, String) {
    run_env(args, &[])
}

/// `run` with these environment variables set (and no backtrace after an error).
fn run_env(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn config_file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

#[test]
fn unknown_key_names_key_and_line() {
    let f = config_file("[server]\nlisten = [\"127.0.0.1:8888\"]\nidle_timeout = 3\n");
    let (ok, _, err) = run(&["check-config", f.path().to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("unknown field `idle_timeout`"), "{err}");
    assert!(
        err.contains("idle_timeout_secs"),
        "suggests the real key: {err}"
    );
    assert!(err.contains("line 3"), "{err}");
}

#[test]
fn bad_address_and_public_listener_refused() {
    let f = config_file("[server]\nlisten = [\"localhost:x\"]\n");
    let (ok, _, err) = run(&["check-config", f.path().to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("invalid socket address"), "{err}");
    let (ok, _, err) = run(&["serve", "--listen", "0.0.0.0:0"]);
    assert!(!ok);
    assert!(err.contains("no password is set"), "{err}");
}

#[test]
fn check_config_masks_secrets() {
    let f = config_file(
        "[auth]\napi_password = \"topsecret\"\n[[upstream.routes]]\npattern = \"all\"\n\
         proxy = \"socks5://me:hidden@127.0.0.1:1080\"\n\
         [iptv]\nplaylist = \"http://tv.example/get.php?username=u1&password=hidden2\"\n\
         epg_url = \"http://tv.example/xmltv.php?username=u1&password=hidden3\"\n\
         [media.acestream]\nengine_url = \"http://ace:hidden4@127.0.0.1:6878\"\n\
         [[upstreams]]\nname = \"app\"\nservers = [\"127.0.0.1:9\"]\n\
         [[routes]]\nupstream = \"app\"\n\
         request_headers_add = { Authorization = \"Bearer hidden5\", X-Team = \"blue\" }\n",
    );
    let (ok, out, err) = run(&["check-config", f.path().to_str().unwrap()]);
    assert!(ok, "{err}");
    for secret in ["topsecret", "hidden"] {
        assert!(!out.contains(secret), "{secret} printed: {out}");
    }
    assert!(out.contains("api_password = \"********\""), "{out}");
    // What is not a secret is still shown, so the printed config says what runs.
    assert!(
        out.contains("blue") && out.contains("username=****"),
        "{out}"
    );
    // A value the config refuses is named by its header, not quoted.
    let f = config_file(
        "[[upstreams]]\nname = \"app\"\nservers = [\"127.0.0.1:9\"]\n[[routes]]\n\
         upstream = \"app\"\nrequest_headers_add = { Authorization = \"Basic hidden6\\r\" }\n",
    );
    let (ok, _, err) = run(&["check-config", f.path().to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains("Authorization") && !err.contains("hidden6"),
        "{err}"
    );
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../sluice.example.toml");
    let (ok, _, err) = run(&["check-config", example]);
    assert!(ok, "{err}");
}

#[test]
fn help_and_version() {
    let (ok, out, _) = run(&["--help"]);
    assert!(ok && out.contains("serve") && out.contains("check-config"));
    let (ok, out, _) = run(&["serve", "--help"]);
    assert!(ok);
    for flag in [
        "--config",
        "--listen",
        "--api-password",
        "--allow-private-upstreams",
    ] {
        assert!(out.contains(flag), "{flag} in {out}");
    }
    let (ok, out, _) = run(&["--version"]);
    assert!(ok && out.starts_with("sluice "));
}

#[test]
fn top_level_help_lists_the_flags_and_every_command_has_its_own() {
    let (ok, out, _) = run(&["--help"]);
    assert!(ok);
    for flag in [
        "-c, --config <CONFIG>",
        "--listen <ADDR>",
        "--api-password-file <PATH>",
        "--api-password <PW>",
        "--allow-private-upstreams",
        "--multicast-interface <NAME>",
    ] {
        assert!(out.contains(flag), "{flag} in {out}");
    }
    for command in ["serve", "check-config", "reload", "upgrade", "health"] {
        let (ok, own, err) = run(&[command, "--help"]);
        assert!(ok, "{command}: {err}");
        assert!(
            own.contains(&format!("Usage: sluice {command} ")),
            "{command}: {own}"
        );
        assert!(own.contains("-h, --help"), "{command}: {own}");
        assert_eq!(run(&["help", command]).1, own, "sluice help {command}");
    }
}

#[test]
fn environment_errors_name_the_variable() {
    let f = config_file("[server]\nlisten = [\"127.0.0.1:8888\"]\n");
    let path = f.path().to_str().unwrap();
    for (var, value, message) in [
        (
            "SLUICE_SERVER_MAX_CONNECTIONS",
            "lots",
            "environment variable SLUICE_SERVER_MAX_CONNECTIONS (sets server.max_connections): \
             not a valid value: expected a whole number",
        ),
        (
            "SLUICE_UPSTREAM_ALLOW_PRIVATE",
            "maybe",
            "environment variable SLUICE_UPSTREAM_ALLOW_PRIVATE (sets upstream.allow_private): \
             not a valid value: expected a boolean",
        ),
    ] {
        let (ok, _, err) = run_env(&["check-config", path], &[(var, value)]);
        assert!(!ok);
        assert_eq!(
            err.lines().next(),
            Some(&*format!("Error: {message}")),
            "{err}"
        );
        assert!(!err.contains("line "), "{err}");
        assert!(!err.contains(value), "the value stays out: {err}");
    }
    // A key the section does not have: named by the variable, with the keys it does have.
    let (ok, _, err) = run_env(
        &["check-config", path],
        &[("SLUICE_SERVER_IDLE_TIMEOUT", "5")],
    );
    assert!(!ok);
    let first = err.lines().next().unwrap();
    assert!(
        first.starts_with(
            "Error: environment variable SLUICE_SERVER_IDLE_TIMEOUT (sets server.idle_timeout): \
             unknown field `idle_timeout`, expected one of"
        ),
        "{err}"
    );
    assert!(first.contains("`idle_timeout_secs`"), "{err}");
    // The same variable with a good value is taken.
    let (ok, out, err) = run_env(
        &["check-config", path],
        &[("SLUICE_SERVER_MAX_CONNECTIONS", "77")],
    );
    assert!(ok, "{err}");
    assert!(out.contains("max_connections = 77\n"), "{out}");
}

#[test]
#[cfg(all(feature = "reverse", feature = "tcp"))]
fn check_config_shows_caching_routes_and_tcp_listeners() {
    let f = config_file(
        r#"
[[upstreams]]
name = "app"
servers = ["127.0.0.1:9000"]

[[upstreams]]
name = "db"
servers = ["127.0.0.1:5433"]

[[routes]]
path = "/"
upstream = "app"
cache = true

[[routes]]
path = "/api/"
upstream = "app"

[[routes]]
path = "/static/"
upstream = "app"
cache = true
cache_default_ttl_secs = 300
cache_cookies = true

[cache]
grace_secs = 10
memory_bytes = "64MiB"

[[tcp]]
listen = "127.0.0.1:15432"
upstream = "db"

[[tcp]]
name = "edge"
listen = "127.0.0.1:15443"
upstream = "app"
sni = [{ server_name = "db.example.com", upstream = "db" }]
accept_proxy = true
trusted_proxies = ["127.0.0.1/32"]
"#,
    );
    let (ok, out, err) = run(&["check-config", f.path().to_str().unwrap()]);
    assert!(ok, "{err}");
    let table: Vec<String> = out
        .lines()
        .skip_while(|l| !l.starts_with("# effective route table"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.contains("built-in"))
        .collect();
    assert_eq!(
        table,
        [
            "# effective route table per listener, in precedence order",
            "main * /static/ -> upstream \"app\" (cache: default ttl 300 s, grace 10 s, \
             client Cache-Control honor, requests with Cookie stored)",
            "main * /api/ -> upstream \"app\"",
            "main * / -> upstream \"app\" (cache: default ttl 0 s, grace 10 s, client \
             Cache-Control honor, requests with Cookie passed)",
            "",
            "# cache, used by routes marked (cache: ...) above and the media front end's \
             manifests and segments",
            "memory 64 MiB, disk off (cache.disk_path unset), slices of 1 MiB",
            "",
            "# tcp listeners",
            "127.0.0.1:15432 -> upstream \"db\"",
            "127.0.0.1:15443 -> sni db.example.com -> \"db\", other names -> \"app\" (name \
             \"edge\", accepts PROXY)",
        ],
        "{out}"
    );
}

#[test]
fn serve_answers_then_stops_on_sigterm() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", &addr])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let body = loop {
        if let Ok(mut s) = std::net::TcpStream::connect(&addr) {
            use std::io::Read;
            s.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            break out;
        }
        assert!(Instant::now() < deadline, "sluice did not start");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(body.contains("{\"status\":\"healthy\"}"), "{body}");
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            break;
        }
        assert!(Instant::now() < deadline, "sluice did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A pid file left behind by a crash names a number another process may hold by now: `reload`
/// and `upgrade` refuse it (the process is not a sluice) instead of sending that process a
/// SIGHUP (which ends it) or SIGUSR2. The file's time plays no part (the wall clock may have
/// been set after the server started).
#[test]
fn a_stale_pid_file_signals_nothing() {
    let mut bystander = Command::new("sleep").arg("60").spawn().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("sluice.pid");
    std::fs::write(&pid_file, format!("{}\n", bystander.id())).unwrap();
    for command in ["reload", "upgrade"] {
        let (ok, _, err) = run(&[command, "--pid-file", pid_file.to_str().unwrap()]);
        assert!(
            !ok,
            "{command} signalled a process the pid file's writer was not"
        );
        assert!(err.contains("stale"), "{command}: {err}");
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        bystander.try_wait().unwrap().is_none(),
        "the bystander was signalled"
    );
    bystander.kill().unwrap();
    bystander.wait().unwrap();
}
