//! The `sluice` binary: config errors, check-config masking, serve with defaults and SIGTERM.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

fn run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .env_remove("RUST_LOG")
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
         proxy = \"socks5://me:hidden@127.0.0.1:1080\"\n",
    );
    let (ok, out, err) = run(&["check-config", f.path().to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(
        !out.contains("topsecret") && !out.contains("hidden"),
        "{out}"
    );
    assert!(out.contains("api_password = \"********\""), "{out}");
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
