//! HTTP/2 conformance of sluice's own HTTP/2 server: h2spec's whole suite (its RFC 9113 and
//! RFC 7541 cases: framing, stream states, flow control, settings, HPACK, malformed requests) run
//! against a TLS listener with a reverse route, every case passing. h2spec is built from the Go
//! module proxy by `scripts/h2spec-tool` when missing. Also: hyper's server when chosen.

mod reverse_support;
mod self_signed;

use std::path::Path;
use std::process::Command;

use reverse_support::*;
use self_signed::SelfSigned as Cert;

fn h2spec() -> std::path::PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let ok = Command::new(root.join("scripts/h2spec-tool"))
        .status()
        .map(|s| s.success());
    assert!(matches!(ok, Ok(true)), "scripts/h2spec-tool failed");
    root.join("target/tools/h2spec")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2spec_passes_every_case() {
    let bin = h2spec();
    let o = echo("o").await;
    let cert = Cert::new(&["localhost"]);
    let p = Proxy::start(config(&format!(
        r#"
[server]
tls_cert = "{}"
tls_key = "{}"
[[upstreams]]
name = "app"
servers = ["{o}"]
[[routes]]
upstream = "app"
"#,
        cert.cert.path().display(),
        cert.key.path().display(),
    )))
    .await;
    let port = p.addr.port().to_string();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(bin)
            .args(["-t", "-k", "-h", "127.0.0.1", "-p", &port, "-o", "5"])
            .output()
            .expect("h2spec runs")
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let summary = text
        .lines()
        .rev()
        .find(|l| l.contains(" tests, "))
        .unwrap_or_else(|| panic!("no h2spec summary:\n{text}"));
    // "145 tests, 145 passed, 0 skipped, 0 failed"
    let count = |what: &str| -> u32 {
        summary
            .split(", ")
            .find_map(|part| part.trim().strip_suffix(what))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("{what} not in {summary:?}"))
    };
    let failures = text.split("Failures:").nth(1).unwrap_or("").to_string();
    assert_eq!(count(" failed"), 0, "h2spec failures:{failures}");
    assert_eq!(count(" skipped"), 0, "{summary}");
    assert!(count(" passed") >= 145, "{summary}");
}

/// `server.h2_own_server = false` goes back to hyper's HTTP/2 server: a POST over h2c still
/// reaches the origin whole (its body's hash as the origin saw it).
#[tokio::test]
async fn hypers_server_serves_http2_when_chosen() {
    use http_body_util::BodyExt;
    let o = echo("o").await;
    let p = Proxy::start(config(&format!(
        r#"
[server]
h2_own_server = false
[[upstreams]]
name = "app"
servers = ["{o}"]
[[routes]]
upstream = "app"
"#
    )))
    .await;
    let body = pattern(100_000);
    let mut client = h2_client(p.addr).await;
    let req = http::Request::post(format!("http://{}/up", p.addr))
        .body(full(body.clone()))
        .unwrap();
    let resp = client.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let report: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(report["len"], 100_000);
    assert_eq!(report["sha256"], sha256(&body));
}
