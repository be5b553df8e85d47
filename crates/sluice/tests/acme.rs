//! Automatic HTTPS against a real ACME CA: Pebble (Let's Encrypt's test CA) issues to a sluice
//! child process by each challenge (HTTP-01 on the plain listener, which one address cannot fill,
//! TLS-ALPN-01 in the handshake,
//! DNS-01 through BIND 9 with TSIG); the served chain verifies against Pebble's root; renewal by
//! ARI swaps the certificate under a handshake loop with none failing; two nodes on one state
//! directory order once, a name issued on demand included; on-demand issuance asks first, stays
//! bounded under a flood of made-up names and still issues a real name after it, and orders an
//! expired on-demand name again at its next handshake; a CA that is down or answers errors leaves
//! the held certificate in service.
//! Certificates from `[acme]` alone serve HTTP/3 as well (aioquic, `tests/h3_support`).
//!
//! Tools come from `scripts/acme-tools` (Pebble from the Go module proxy, BIND from Debian).
//! Every process listens on 127.0.0.1; every loop is bounded in count and time.

mod acme_support;
mod h3_support;
mod trust_anything;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use acme_support::*;

/// The `[acme]` section every test starts from: fast retries and checks.
fn acme_section(pebble: &Pebble, state: &Path, body: &str) -> String {
    format!(
        r#"[acme]
directory = "{}"
directory_ca = "{}"
state_dir = "{}"
contact = ["mailto:ops@example.test"]
check_secs = 1
retry_min_secs = 1
retry_max_secs = 4
{body}
"#,
        pebble.directory(),
        pebble.listener_ca.ca_pem.display(),
        state.display(),
    )
}

struct Setup {
    dir: tempfile::TempDir,
    ca: Arc<ListenerCa>,
}

fn setup() -> Setup {
    install_tools();
    let dir = tempfile::tempdir().unwrap();
    let ca = Arc::new(ListenerCa::new(dir.path()));
    Setup { dir, ca }
}

async fn metrics(s: &Sluice, name: &str, root: &[u8]) -> String {
    let (status, body) = https_get(s.tls, name, &[root], "/metrics").await.unwrap();
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http01_on_the_plain_listener_issues_a_chain_to_pebbles_root() {
    let t = setup();
    let dns = ChallSrv::start(t.dir.path());
    let (http_port, tls_port) = (free_port(), free_port());
    let pebble = Pebble::start(
        t.dir.path(),
        t.ca.clone(),
        PebbleOptions {
            http_port,
            tls_port: free_port(),
            dns: dns.dns,
            validity_secs: 7_776_000,
            always_valid: false,
            eab: None,
        },
    );
    let state = t.dir.path().join("state");
    let sluice = Sluice::start(
        t.dir.path(),
        "http01",
        tls_port,
        &acme_section(
            &pebble,
            &state,
            &format!(
                "names = [\"web.acme.test\"]\nchallenges = [\"http-01\"]\nhttp_listen = [\"127.0.0.1:{http_port}\"]"
            ),
        ),
    );
    let root = pebble.root().await;
    let chain = wait_for_cert(&sluice, "web.acme.test", &[&root], Duration::from_secs(30)).await;
    // The leaf is for the name, and the file in the state directory is what is served.
    let (_, leaf) = x509_parser::parse_x509_certificate(&chain[0]).unwrap();
    let sans: Vec<String> = leaf
        .subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names
        .iter()
        .map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(d) => d.to_string(),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(sans, ["web.acme.test"]);
    let stored = std::fs::read(state.join("certs/web.acme.test.pem")).unwrap();
    use rustls::pki_types::pem::PemObject;
    let first = rustls::pki_types::CertificateDer::pem_slice_iter(&stored)
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(first.as_ref(), chain[0].as_slice());
    // Owner-only: the file holds the private key.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(state.join("certs/web.acme.test.pem"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    // The plain listener redirects everything else to https, before any route or auth.
    let plain = std::net::SocketAddr::from(([127, 0, 0, 1], http_port));
    let reply = raw(
        plain,
        b"GET /a?b=c HTTP/1.1\r\nHost: web.acme.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 308"), "{reply}");
    assert!(
        reply.contains("location: https://web.acme.test/a?b=c\r\n"),
        "{reply}"
    );
    let reply = raw(
        plain,
        b"GET /.well-known/acme-challenge/nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 404"), "{reply}");

    // One address holds 32 connections at most: of 40 opened at once, each holding its place
    // with a head begun (a connection serves one request, then closes), those past the share
    // are closed at once and answer nothing (the two connections above may still hold their
    // places for a moment on a loaded machine, hence 30 to 32 served); once all are gone the
    // listener answers that address again.
    let mut held = Vec::new();
    for _ in 0..40 {
        use tokio::io::AsyncWriteExt;
        let mut s = tokio::net::TcpStream::connect(plain).await.unwrap();
        let _ = s.write_all(b"GET /x HTTP/1.1\r\n").await;
        held.push(s);
    }
    // Every one accepted (or closed) before any head is finished.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut served = 0;
    for s in &mut held {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        if s.write_all(b"Host: web.acme.test\r\n\r\n").await.is_err() {
            continue;
        }
        let mut buf = [0u8; 64];
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
            if buf[..n].starts_with(b"HTTP/1.1 308") {
                served += 1;
            }
        }
    }
    assert!(
        (30..=32).contains(&served),
        "{served} of 40 connections from one address served"
    );
    drop(held);
    let mut again = String::new();
    for _ in 0..50 {
        again = raw(
            plain,
            b"GET /x HTTP/1.1\r\nHost: web.acme.test\r\nConnection: close\r\n\r\n",
        )
        .await;
        if !again.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(again.starts_with("HTTP/1.1 308"), "{again}");

    let m = metrics(&sluice, "web.acme.test", &root).await;
    assert_eq!(
        metric(&m, "sluice_acme_orders_total{outcome=\"issued\"}"),
        Some(1.0),
        "{m}"
    );
    let expiry = metric(
        &m,
        "sluice_acme_certificate_expiry_timestamp_seconds{name=\"web.acme.test\"}",
    )
    .expect("expiry gauge");
    let not_after = leaf.validity().not_after.timestamp() as f64;
    assert_eq!(expiry, not_after);
    // What the plain listener did is counted: Pebble's validation answered, the redirects, the
    // 404s, and the connections past the share closed at once.
    let plain = |what: &str| {
        metric(
            &m,
            &format!("sluice_acme_plain_listener_total{{what=\"{what}\"}}"),
        )
        .unwrap_or(0.0)
    };
    assert!(plain("challenge") >= 1.0, "{m}");
    assert!(plain("redirect") >= 31.0, "{m}");
    assert!(plain("no_challenge") >= 1.0, "{m}");
    assert!(plain("per_client_refused") >= 8.0, "{m}");
}

/// Sends raw bytes, reads until the server closes (5 s at most).
async fn raw(addr: std::net::SocketAddr, req: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(req).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_alpn01_in_the_handshake_and_unknown_names_fail_cleanly() {
    let t = setup();
    let dns = ChallSrv::start(t.dir.path());
    let tls_port = free_port();
    let pebble = Pebble::start(
        t.dir.path(),
        t.ca.clone(),
        PebbleOptions {
            http_port: free_port(),
            tls_port,
            dns: dns.dns,
            validity_secs: 7_776_000,
            always_valid: false,
            eab: None,
        },
    );
    let state = t.dir.path().join("state");
    // HTTP/3 on, with no certificate but what `[acme]` gets.
    let sluice = Sluice::start(
        t.dir.path(),
        "alpn",
        tls_port,
        &format!(
            "[server.http3]\nenabled = true\n{}",
            acme_section(
                &pebble,
                &state,
                "names = [\"alpn.acme.test\"]\nchallenges = [\"tls-alpn-01\"]",
            )
        ),
    );
    let root = pebble.root().await;
    let chain = wait_for_cert(&sluice, "alpn.acme.test", &[&root], Duration::from_secs(30)).await;
    assert!(chain.len() >= 2, "leaf and intermediate");
    // The issued certificate serves HTTP/3 too: the QUIC handshake verifies against Pebble's root.
    let root_hex: String = root.iter().map(|b| format!("{b:02x}")).collect();
    let r = h3_support::client(serde_json::json!({
        "addr": sluice.tls.to_string(),
        "sni": "alpn.acme.test",
        "ca_der_hex": root_hex,
        "gets": [{"path": "/health"}],
    }))
    .await;
    assert_eq!(r["responses"][0]["status"], 200, "{r}");
    // A name nothing covers, on-demand off: the handshake fails (an alert), nothing is ordered,
    // and the server goes on serving.
    let err = handshake(sluice.tls, "unknown.acme.test", &[&root])
        .await
        .unwrap_err();
    assert!(!err.is_empty());
    let again = handshake(sluice.tls, "alpn.acme.test", &[&root])
        .await
        .unwrap();
    assert_eq!(again[0], chain[0]);
    let m = metrics(&sluice, "alpn.acme.test", &root).await;
    assert_eq!(
        metric(&m, "sluice_acme_orders_total{outcome=\"issued\"}"),
        Some(1.0),
        "{m}"
    );
    assert!(!m.contains("unknown.acme.test"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns01_wildcard_through_rfc2136_updates_signed_with_tsig() {
    let t = setup();
    let bind = Bind::start(t.dir.path(), "dns01.test");
    let tls_port = free_port();
    let pebble = Pebble::start(
        t.dir.path(),
        t.ca.clone(),
        PebbleOptions {
            http_port: free_port(),
            tls_port: free_port(),
            dns: bind.dns,
            validity_secs: 7_776_000,
            always_valid: false,
            eab: None,
        },
    );
    let state = t.dir.path().join("state");
    let sluice = Sluice::start(
        t.dir.path(),
        "dns01",
        tls_port,
        &acme_section(
            &pebble,
            &state,
            &format!(
                "names = [\"*.dns01.test\"]\nchallenges = [\"dns-01\"]\n[acme.dns]\nserver = \"{}\"\nzone = \"dns01.test\"\ntsig_key_file = \"{}\"\n",
                bind.dns,
                bind.key_file.display()
            ),
        ),
    );
    let root = pebble.root().await;
    let chain = wait_for_cert(&sluice, "a.dns01.test", &[&root], Duration::from_secs(40)).await;
    let other = handshake(sluice.tls, "b.dns01.test", &[&root])
        .await
        .unwrap();
    assert_eq!(
        other[0], chain[0],
        "one wildcard certificate for every name under it"
    );
    // Two labels deep is not covered by `*.dns01.test`.
    assert!(handshake(sluice.tls, "x.y.dns01.test", &[&root])
        .await
        .is_err());
    // BIND took the signed update, and the removal once the order was done.
    let log = bind.proc.log_text();
    assert!(
        log.contains("adding an RR at '_acme-challenge.dns01.test' TXT"),
        "{log}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !bind
        .proc
        .log_text()
        .contains("deleting an RR at _acme-challenge.dns01.test TXT")
    {
        assert!(Instant::now() < deadline, "{}", bind.proc.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renews_by_ari_and_swaps_live_with_no_failed_handshake() {
    let t = setup();
    let dns = ChallSrv::start(t.dir.path());
    let tls_port = free_port();
    // A 30 s lifetime: Pebble's ARI window then opens at issuance and ends at expiry.
    let pebble = Pebble::start(
        t.dir.path(),
        t.ca.clone(),
        PebbleOptions {
            http_port: free_port(),
            tls_port,
            dns: dns.dns,
            validity_secs: 30,
            always_valid: false,
            eab: None,
        },
    );
    let state = t.dir.path().join("state");
    let sluice = Sluice::start(
        t.dir.path(),
        "renew",
        tls_port,
        &acme_section(
            &pebble,
            &state,
            "names = [\"renew.acme.test\"]\nchallenges = [\"tls-alpn-01\"]",
        ),
    );
    let root = pebble.root().await;
    let first = wait_for_cert(
        &sluice,
        "renew.acme.test",
        &[&root],
        Duration::from_secs(30),
    )
    .await;
    let first_serial = serial(&first[0]);
    // Handshakes back to back, 4 at a time, until a new certificate is served (40 s at most).
    let failures = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut workers = Vec::new();
    for _ in 0..4 {
        let (failures, done, root) = (failures.clone(), done.clone(), root.clone());
        let first_serial = first_serial.clone();
        let addr = sluice.tls;
        workers.push(tokio::spawn(async move {
            let mut renewed = None;
            while Instant::now() < deadline && renewed.is_none() {
                match handshake(addr, "renew.acme.test", &[&root]).await {
                    Ok(chain) => {
                        done.fetch_add(1, Ordering::Relaxed);
                        if serial(&chain[0]) != first_serial {
                            renewed = Some(chain[0].clone());
                        }
                    }
                    Err(e) => {
                        eprintln!("handshake failed: {e}");
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            renewed
        }));
    }
    let mut renewed = Vec::new();
    for w in workers {
        renewed.extend(w.await.unwrap());
    }
    assert!(
        !renewed.is_empty(),
        "no renewed certificate within 40 s\n{}",
        sluice.proc.log_text()
    );
    assert_eq!(
        failures.load(Ordering::Relaxed),
        0,
        "{} handshakes",
        done.load(Ordering::Relaxed)
    );
    let m = metrics(&sluice, "renew.acme.test", &root).await;
    assert!(
        metric(&m, "sluice_acme_orders_total{outcome=\"issued\"}").unwrap() >= 2.0,
        "{m}"
    );
    // Renewed by ARI: the time was chosen in Pebble's window, and the order named the
    // certificate it replaces, which Pebble took (with `ari = false`, neither line appears).
    let log = sluice.proc.log_text();
    assert!(
        log.contains("renewal time chosen in the CA's window (ARI)"),
        "{log}"
    );
    assert!(
        log.contains("ordering as the renewal of the held certificate (ARI)"),
        "{log}"
    );
    assert!(!log.contains("not taken as a renewal"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_on_one_state_directory_order_once_and_share_it() {
    let t = setup();
    let dns = ChallSrv::start(t.dir.path());
    // Every challenge passes: this test is about the lock, not validation.
    let pebble = Pebble::start(
        t.dir.path(),
        t.ca.clone(),
        PebbleOptions {
            http_port: free_port(),
            tls_port: free_port(),
            dns: dns.dns,
            validity_secs: 7_776_000,
            always_valid: true,
            eab: None,
        },
    );
    let state = t.dir.path().join("state");
    let (ask, asked) = ask_server(&["od.acme.test"]).await;
    let section = acme_section(
        &pebble,
        &state,
        &format!(
            "names = [\"shared.acme.test\"]\nchallenges = [\"tls-alpn-01\"]\n\
             [acme.on_demand]\nenabled = true\nask = \"http://{ask}/ask\"\n"
        ),
    );
    let a = Sluice::start(t.dir.path(), "node-a", free_port(), &section);
    let b = Sluice::start(t.dir.path(), "node-b", free_port(), &section);
    let root = pebble.root().await;
    let from_a = wait_for_cert(&a, "shared.acme.test", &[&root], Duration::from_secs(30)).await;
    let from_b = wait_for_cert(&b, "shared.acme.test", &[&root], Duration::from_secs(30)).await;
    assert_eq!(from_a[0], from_b[0], "both nodes serve the one certificate");
    let issued = |m: &str| metric(m, "sluice_acme_orders_total{outcome=\"issued\"}").unwrap_or(0.0);
    let ma = metrics(&a, "shared.acme.test", &root).await;
    let mb = metrics(&b, "shared.acme.test", &root).await;
    assert_eq!(issued(&ma) + issued(&mb), 1.0, "{ma}\n{mb}");
    // One account for both.
    let accounts = std::fs::read_dir(&state)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("account-")
        })
        .count();
    assert_eq!(accounts, 1);
    // A name issued on demand by one node is the other's at its first handshake for it, from
    // the directory: not asked about, not ordered again.
    // (A configured name is never the ask URL's business, ordered or not yet.)
    assert_eq!(asked.load(Ordering::Relaxed), 0);
    let od_a = wait_for_cert(&a, "od.acme.test", &[&root], Duration::from_secs(30)).await;
    assert_eq!(asked.load(Ordering::Relaxed), 1);
    let od_b = handshake(b.tls, "od.acme.test", &[&root]).await.unwrap();
    assert_eq!(od_a[0], od_b[0]);
    assert_eq!(asked.load(Ordering::Relaxed), 1, "node b asked again");
    let mb = metrics(&b, "shared.acme.test", &root).await;
    assert_eq!(
        metric(
            &mb,
            "sluice_acme_on_demand_decisions_total{decision=\"from_store\"}"
        ),
        Some(1.0),
        "{mb}"
    );
    let ma = metrics(&a, "shared.acme.test", &root).await;
    assert_eq!(issued(&ma) + issued(&mb), 2.0, "{ma}\n{mb}");
}

/// Nodes behind one address share a state directory: the CA's HTTP-01 validation reaches a node
/// that did not place the order (here Pebble validates on node b's plain listener only), and
/// that node answers it from the directory. The answer files go when the order is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http01_is_answered_by_a_node_that_did_not_place_the_order() {
    another_node_answers("http-01").await;
}

/// The same for TLS-ALPN-01: Pebble validates on node b's TLS listener only, and node b builds
/// the challenge certificate from the digest node a recorded in the directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_alpn01_is_answered_by_a_node_that_did_not_place_the_order() {
    another_node_answers("tls-alpn-01").await;
}

async fn another_node_answers(challenge: &str) {
    let t = setup();
    let dns = ChallSrv::start(t.dir.path());
    let (a_http, b_http, b_tls) = (free_port(), free_port(), free_port());
    let pebble = Pebble::start(
        t.dir.path(),
        t.ca.clone(),
        PebbleOptions {
            http_port: b_http,
            tls_port: b_tls,
            dns: dns.dns,
            validity_secs: 7_776_000,
            always_valid: false,
            eab: None,
        },
    );
    let state = t.dir.path().join("state");
    let listen = |port: u16| match challenge {
        "http-01" => format!("http_listen = [\"127.0.0.1:{port}\"]\n"),
        _ => String::new(),
    };
    // With HTTP-01, node b orders nothing: no names, and on demand only for a name no handshake
    // asks for. With TLS-ALPN-01, node b has a name of its own and no on-demand issuance: the
    // challenge alone has it read ClientHellos.
    let (ask, asked) = ask_server(&["nobody.acme.test"]).await;
    let b_names = match challenge {
        "http-01" => format!("[acme.on_demand]\nenabled = true\nask = \"http://{ask}/ask\"\n"),
        _ => "names = [\"own.acme.test\"]\n".to_string(),
    };
    let b = Sluice::start(
        t.dir.path(),
        "node-b",
        b_tls,
        &acme_section(
            &pebble,
            &state,
            &format!(
                "challenges = [\"{challenge}\"]\n{}{b_names}",
                listen(b_http)
            ),
        ),
    );
    let a = Sluice::start(
        t.dir.path(),
        "node-a",
        free_port(),
        &acme_section(
            &pebble,
            &state,
            &format!(
                "names = [\"web.acme.test\"]\nchallenges = [\"{challenge}\"]\n{}",
                listen(a_http)
            ),
        ),
    );
    let root = pebble.root().await;
    // (Pebble validates on node b's listeners alone: the order's success is b's answer.)
    let chain = wait_for_cert(&a, "web.acme.test", &[&root], Duration::from_secs(30)).await;
    let m = metrics(&a, "web.acme.test", &root).await;
    assert_eq!(
        metric(&m, "sluice_acme_orders_total{outcome=\"issued\"}"),
        Some(1.0),
        "{m}"
    );
    let mut own = Vec::new();
    if challenge == "http-01" {
        // Node b serves the certificate too, from the directory, without asking anyone.
        let from_b = handshake(b.tls, "web.acme.test", &[&root]).await.unwrap();
        assert_eq!(from_b[0], chain[0]);
        assert_eq!(asked.load(Ordering::Relaxed), 0);
    } else {
        // Node b's own order, answered by itself.
        own = wait_for_cert(&b, "own.acme.test", &[&root], Duration::from_secs(30)).await;
    }
    // The order's records are gone with it.
    let left: Vec<_> = std::fs::read_dir(state.join(challenge))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
    if challenge == "http-01" {
        // A token no node holds is a 404 on either listener.
        for port in [a_http, b_http] {
            let reply = raw(
                std::net::SocketAddr::from(([127, 0, 0, 1], port)),
                b"GET /.well-known/acme-challenge/nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            )
            .await;
            assert!(reply.starts_with("HTTP/1.1 404"), "{reply}");
        }
    } else {
        // With the order closed, a validation handshake for the name gets nothing from node b
        // (the challenge it took up went with the record) ...
        assert!(acme_tls_handshake(b.tls, "web.acme.test").await.is_err());
        // A record another node wrote is answered with a certificate carrying its digest (the
        // acmeIdentifier extension, RFC 8737 §3), and no longer once the record is gone.
        let digest: Vec<u8> = (1..=32).collect();
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        let record = state.join("tls-alpn-01/other.acme.test");
        std::fs::write(&record, hex).unwrap();
        let leaf = acme_tls_handshake(b.tls, "other.acme.test").await.unwrap();
        let (_, leaf) = x509_parser::parse_x509_certificate(&leaf).unwrap();
        let id = leaf
            .extensions()
            .iter()
            .find(|e| e.oid.to_id_string() == "1.3.6.1.5.5.7.1.31")
            .expect("acmeIdentifier");
        assert_eq!(id.value, [&[0x04, 32][..], &digest].concat());
        std::fs::remove_file(&record).unwrap();
        assert!(acme_tls_handshake(b.tls, "other.acme.test").await.is_err());
        // ... and a flood of validation handshakes for made-up names, each a look-up in the
        // directory, gets nothing either while real clients are served on.
        let flood: Vec<_> = (0..64)
            .map(|i| {
                let addr = b.tls;
                tokio::spawn(async move {
                    acme_tls_handshake(addr, &format!("made-up-{i}.acme.test")).await
                })
            })
            .collect();
        for f in flood {
            assert!(f.await.unwrap().is_err());
        }
        let again = handshake(b.tls, "own.acme.test", &[&root]).await.unwrap();
        assert_eq!(again[0], own[0]);
    }
}

/// A tiny `ask` endpoint: 200 for the `allowed` names, 403 for every other `domain=`; counts
/// requests.
async fn ask_server(allowed: &'static [&'static str]) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let allowed = allowed.iter().map(|n| n.to_string()).collect();
    ask_server_of(Arc::new(std::sync::Mutex::new(allowed))).await
}

/// As `ask_server`, with a list of allowed names the test may change.
async fn ask_server_of(
    allowed: Arc<std::sync::Mutex<Vec<String>>>,
) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let (seen, allowed) = (seen.clone(), allowed.clone());
            tokio::spawn(async move {
                let mut buf = vec![0; 4096];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).into_owned();
                let ok = allowed
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|name| head.starts_with(&format!("GET /ask?domain={name} ")));
                // Counted once the answer is decided: a test that changes the list after seeing
                // the count changes no answer already counted.
                seen.fetch_add(1, Ordering::Relaxed);
                let status = if ok { "200 OK" } else { "403 Forbidden" };
                let _ = s
                    .write_all(
                        format!(
                            "HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        )
                        .as_bytes(),
                    )
                    .await;
            });
        }
    });
    (addr, count)
}

/// On-demand issuance asks first; a flood of made-up names costs asks (each name once while
/// remembered, the oldest forgotten past `max_names`), not the orders' budget: a real name after
/// the flood is still issued, and `per_minute` counts orders only. (The budget counted asks, so
/// five made-up names a minute locked every new name out.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_demand_asks_first_and_a_flood_of_made_up_names_stays_bounded() {
    let t = setup();
    let dns = ChallSrv::start(t.dir.path());
    let tls_port = free_port();
    let pebble = Pebble::start(
        t.dir.path(),
        t.ca.clone(),
        PebbleOptions {
            http_port: free_port(),
            tls_port,
            dns: dns.dns,
            validity_secs: 7_776_000,
            always_valid: false,
            eab: None,
        },
    );
    let (ask, asked) = ask_server(&[
        "yes.ondemand.test",
        "late.ondemand.test",
        "third.ondemand.test",
    ])
    .await;
    let state = t.dir.path().join("state");
    let sluice = Sluice::start(
        t.dir.path(),
        "ondemand",
        tls_port,
        &acme_section(
            &pebble,
            &state,
            &format!(
                "challenges = [\"tls-alpn-01\"]\n[acme.on_demand]\nenabled = true\nask = \"http://{ask}/ask\"\nper_minute = 2\nmax_names = 50\nwait_secs = 8\n"
            ),
        ),
    );
    let root = pebble.root().await;
    let began = std::time::Instant::now();
    // The first handshake for an allowed name waits for its certificate (within `wait_secs`;
    // on a loaded machine the order may take longer, then a later handshake gets it).
    if let Err(e) = handshake(sluice.tls, "yes.ondemand.test", &[&root]).await {
        eprintln!("first on-demand handshake did not wait long enough: {e}");
    }
    wait_for_cert(
        &sluice,
        "yes.ondemand.test",
        &[&root],
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(asked.load(Ordering::Relaxed), 1);
    // A name the ask URL refuses: asked once, no order, the handshake fails.
    assert!(handshake(sluice.tls, "no.ondemand.test", &[&root])
        .await
        .is_err());
    assert_eq!(asked.load(Ordering::Relaxed), 2);
    // And not asked again right away (once per name per `per_name_secs`).
    assert!(handshake(sluice.tls, "no.ondemand.test", &[&root])
        .await
        .is_err());
    assert_eq!(asked.load(Ordering::Relaxed), 2);

    // A flood: 400 made-up names, 48 at a time (more than the 32 ask places). Each is asked
    // about once and refused; every handshake ends (refused), the process stays up, memory
    // bounded.
    let rss_before = sluice.rss_kb();
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..48 {
        let (next, root) = (next.clone(), root.clone());
        let addr = sluice.tls;
        workers.push(tokio::spawn(async move {
            let mut ended = 0;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= 400 {
                    return ended;
                }
                let name = format!("made-up-{i}.flood.test");
                let r =
                    tokio::time::timeout(Duration::from_secs(20), handshake(addr, &name, &[&root]))
                        .await;
                assert!(matches!(r, Ok(Err(_))), "{name}: {r:?}");
                ended += 1;
            }
        }));
    }
    let mut ended = 0;
    for w in workers {
        ended += w.await.unwrap();
    }
    assert_eq!(ended, 400);
    assert_eq!(asked.load(Ordering::Relaxed), 402);
    // Only the last `max_names` (50) are remembered: a name from the flood's end is not asked
    // about again, one from its start was forgotten and is.
    assert!(handshake(sluice.tls, "made-up-399.flood.test", &[&root])
        .await
        .is_err());
    assert_eq!(asked.load(Ordering::Relaxed), 402);
    assert!(handshake(sluice.tls, "made-up-0.flood.test", &[&root])
        .await
        .is_err());
    assert_eq!(asked.load(Ordering::Relaxed), 403);

    // The first name's order must still be in the last 60 s for `per_minute` to bite below.
    assert!(
        began.elapsed() < Duration::from_secs(50),
        "too slow for this test's per_minute window: {:?}",
        began.elapsed()
    );
    // Two real names right after the flood, at once: the flood spent no order, so one of them
    // is ordered and issued; the other is asked about, allowed and put off (`per_minute` = 2
    // orders in any 60 s, one spent on the first name).
    let late = ["late.ondemand.test", "third.ondemand.test"].map(|name| {
        let (addr, root) = (sluice.tls, root.clone());
        tokio::spawn(async move { handshake(addr, name, &[&root]).await.is_ok() })
    });
    for h in late {
        let _ = h.await.unwrap();
    }
    assert_eq!(asked.load(Ordering::Relaxed), 405);
    let issued = |m: &str| metric(m, "sluice_acme_orders_total{outcome=\"issued\"}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let m = loop {
        let m = metrics(&sluice, "yes.ondemand.test", &root).await;
        if issued(&m) == Some(2.0) || tokio::time::Instant::now() > deadline {
            break m;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(issued(&m), Some(2.0), "{m}");
    let has = |name: &str| m.contains(&format!("name=\"{name}\""));
    let (got, put_off) = if has("late.ondemand.test") {
        ("late.ondemand.test", "third.ondemand.test")
    } else {
        ("third.ondemand.test", "late.ondemand.test")
    };
    assert!(!has(put_off), "both late names issued: {m}");
    handshake(sluice.tls, got, &[&root])
        .await
        .expect("the issued late name is served");

    let mut s = sluice;
    assert!(s.proc.running());
    let rss_after = s.rss_kb();
    assert!(
        rss_after < rss_before + 20 * 1024,
        "{rss_before} kB -> {rss_after} kB"
    );
    let m = metrics(&s, "yes.ondemand.test", &root).await;
    let decisions = |d: &str| {
        metric(
            &m,
            &format!("sluice_acme_on_demand_decisions_total{{decision=\"{d}\"}}"),
        )
    };
    assert_eq!(decisions("refused_by_ask"), Some(402.0), "{m}");
    assert_eq!(decisions("allowed"), Some(2.0), "{m}");
    assert_eq!(decisions("rate_limited"), Some(1.0), "{m}");
    assert!(decisions("recently_tried").unwrap() >= 2.0, "{m}");
    assert_eq!(
        metric(&m, "sluice_acme_orders_total{outcome=\"issued\"}"),
        Some(2.0),
        "{m}"
    );
}

/// An on-demand name whose certificate expired (the renewal loop was told no by the ask URL,
/// and asks again only after `retry_max_secs`) is asked about and ordered again at its next
/// handshake, as an unknown name is. Before, the expired certificate counted as cover: it was
/// served and nothing was asked until the loop's next try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_on_demand_certificate_is_ordered_again_at_a_handshake() {
    let t = setup();
    let dns = ChallSrv::start(t.dir.path());
    let tls_port = free_port();
    let pebble = Pebble::start(
        t.dir.path(),
        t.ca.clone(),
        PebbleOptions {
            http_port: free_port(),
            tls_port,
            dns: dns.dns,
            validity_secs: 7_776_000,
            always_valid: false,
            eab: None,
        },
    );
    let allowed = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (ask, asked) = ask_server_of(allowed.clone()).await;
    // The name's certificate in the state directory, expired in 2020.
    let state = t.dir.path().join("state");
    std::fs::create_dir_all(state.join("certs")).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["old.ondemand.test".into()]).unwrap();
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2020, 4, 1);
    let expired = params.self_signed(&key).unwrap();
    std::fs::write(
        state.join("certs/old.ondemand.test.pem"),
        format!("{}{}", expired.pem(), key.serialize_pem()),
    )
    .unwrap();
    let section = acme_section(
        &pebble,
        &state,
        &format!(
            "challenges = [\"tls-alpn-01\"]\n[acme.on_demand]\nenabled = true\nask = \"http://{ask}/ask\"\nwait_secs = 8\n"
        ),
    )
    .replace("retry_max_secs = 4", "retry_max_secs = 600");
    let sluice = Sluice::start(t.dir.path(), "expired", tls_port, &section);
    let root = pebble.root().await;
    // The renewal loop finds the certificate due, asks, is told no: it asks again in 600 s.
    let deadline = Instant::now() + Duration::from_secs(20);
    while asked.load(Ordering::Relaxed) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(asked.load(Ordering::Relaxed), 1);
    // The ask URL says yes now: the next handshake for the name asks and orders, and the new
    // certificate verifies to Pebble's root (without it, the expired one is served for 600 s).
    allowed.lock().unwrap().push("old.ondemand.test".into());
    let chain = wait_for_cert(
        &sluice,
        "old.ondemand.test",
        &[&root],
        Duration::from_secs(30),
    )
    .await;
    assert_ne!(chain[0], expired.der().to_vec());
    assert_eq!(asked.load(Ordering::Relaxed), 2);
    let m = metrics(&sluice, "old.ondemand.test", &root).await;
    assert_eq!(
        metric(
            &m,
            "sluice_acme_on_demand_decisions_total{decision=\"allowed\"}"
        ),
        Some(1.0),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_that_is_down_or_answers_errors_leaves_the_held_certificate_in_service() {
    let t = setup();
    let dns = ChallSrv::start(t.dir.path());
    let tls_port = free_port();
    let pebble = Pebble::start(
        t.dir.path(),
        t.ca.clone(),
        PebbleOptions {
            http_port: free_port(),
            tls_port,
            dns: dns.dns,
            validity_secs: 7_776_000,
            always_valid: false,
            eab: None,
        },
    );
    let state = t.dir.path().join("state");
    let names = "names = [\"kept.acme.test\"]\nchallenges = [\"tls-alpn-01\"]";
    let root = pebble.root().await;
    let held = {
        let s = Sluice::start(
            t.dir.path(),
            "first",
            tls_port,
            &acme_section(&pebble, &state, names),
        );
        wait_for_cert(&s, "kept.acme.test", &[&root], Duration::from_secs(30)).await
    };

    // The CA goes away; sluice restarts with one more name to order.
    let section = acme_section(
        &pebble,
        &state,
        "names = [\"kept.acme.test\", \"new.acme.test\"]\nchallenges = [\"tls-alpn-01\"]",
    );
    drop(pebble);
    let mut s = Sluice::start(t.dir.path(), "ca-down", tls_port, &section);
    let served = wait_for_cert(&s, "kept.acme.test", &[&root], Duration::from_secs(10)).await;
    assert_eq!(served[0], held[0], "the stored certificate serves at once");
    // Retries back off (1 s, 2 s, 4 s, capped at 4 s): a few failures in 8 s, not hundreds.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(s.proc.running());
    let log = s.proc.log_text();
    let failed = log.matches("acme: order failed").count();
    assert!((2..=6).contains(&failed), "{failed} failures\n{log}");
    assert!(log.contains("outcome=\"ca_error\""), "{log}");
    assert!(log.contains("retry_in_secs=4"), "{log}");
    assert_eq!(
        handshake(s.tls, "kept.acme.test", &[&root]).await.unwrap()[0],
        held[0]
    );
    assert!(handshake(s.tls, "new.acme.test", &[&root]).await.is_err());
    drop(s);

    // A CA that answers, but only errors: the same.
    let broken = broken_ca(&t.ca).await;
    let section = format!(
        "[acme]\ndirectory = \"https://{broken}/dir\"\ndirectory_ca = \"{}\"\nstate_dir = \"{}\"\ncheck_secs = 1\nretry_min_secs = 1\nretry_max_secs = 4\nnames = [\"kept.acme.test\", \"new.acme.test\"]\nchallenges = [\"tls-alpn-01\"]\n",
        t.ca.ca_pem.display(),
        state.display()
    );
    let mut s = Sluice::start(t.dir.path(), "ca-errors", tls_port, &section);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(s.proc.running());
    assert_eq!(
        handshake(s.tls, "kept.acme.test", &[&root]).await.unwrap()[0],
        held[0]
    );
    let log = s.proc.log_text();
    assert!(log.contains("acme: order failed name=new.acme.test outcome=\"ca_error\" error=CA error: ACME directory https://"), "{log}");
    drop(s);

    // A CA that takes the connection and never answers (a stalled balancer, a black hole): each
    // exchange is cut after 30 s and booked as the CA's failure, and the loop goes on. Before,
    // the renewal loop (and the name's lock) waited for the answer for as long as the process
    // ran, with nothing logged.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_at = silent.local_addr().unwrap();
    let holding = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((c, _)) = silent.accept().await {
            held.push(c);
        }
    });
    let section = format!(
        "[acme]\ndirectory = \"https://{silent_at}/dir\"\ndirectory_ca = \"{}\"\nstate_dir = \"{}\"\ncheck_secs = 1\nretry_min_secs = 1\nretry_max_secs = 4\nari = false\nnames = [\"kept.acme.test\", \"new.acme.test\"]\nchallenges = [\"tls-alpn-01\"]\n",
        t.ca.ca_pem.display(),
        state.display()
    );
    let s = Sluice::start(t.dir.path(), "ca-silent", tls_port, &section);
    let deadline = std::time::Instant::now() + Duration::from_secs(50);
    let log = loop {
        let log = s.proc.log_text();
        if log.contains("acme: order failed name=new.acme.test") {
            break log;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no failure booked in 50 s\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(log.contains("outcome=\"ca_error\""), "{log}");
    assert!(log.contains("did not answer within 30s"), "{log}");
    assert_eq!(
        handshake(s.tls, "kept.acme.test", &[&root]).await.unwrap()[0],
        held[0]
    );
    holding.abort();
}

/// An HTTPS server (the test's listener CA) that answers every request with a 503 problem.
async fn broken_ca(ca: &ListenerCa) -> std::net::SocketAddr {
    let config = sluice::server::tls::server_config(&ca.cert, &ca.key).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(s).await else {
                    return;
                };
                let svc = hyper::service::service_fn(
                    |_req: http::Request<hyper::body::Incoming>| async {
                        let body = r#"{"type":"urn:ietf:params:acme:error:serverInternal","detail":"overloaded","status":503}"#;
                        let resp = http::Response::builder()
                            .status(503)
                            .header("content-type", "application/problem+json")
                            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                            .unwrap();
                        Ok::<_, std::convert::Infallible>(resp)
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    addr
}

/// A challenge the CA cannot validate (its HTTP-01 request finds nothing listening): the order
/// fails as `invalid` (the validation's problem is the order's, not the CA's), the log says why
/// in the CA's words, nothing is stored, and the process keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_challenge_the_ca_cannot_validate_fails_the_order_and_the_log_says_why() {
    let t = setup();
    let dns = ChallSrv::start(t.dir.path());
    let tls_port = free_port();
    // Pebble validates HTTP-01 on a port where nothing listens; sluice answers on another.
    let pebble = Pebble::start(
        t.dir.path(),
        t.ca.clone(),
        PebbleOptions {
            http_port: free_port(),
            tls_port: free_port(),
            dns: dns.dns,
            validity_secs: 7_776_000,
            always_valid: false,
            eab: None,
        },
    );
    let state = t.dir.path().join("state");
    let http_port = free_port();
    let mut s = Sluice::start(
        t.dir.path(),
        "invalid",
        tls_port,
        &acme_section(
            &pebble,
            &state,
            &format!(
                "names = [\"unreachable.acme.test\"]\nchallenges = [\"http-01\"]\nhttp_listen = [\"127.0.0.1:{http_port}\"]"
            ),
        ),
    );
    let root = pebble.root().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut log = String::new();
    while Instant::now() < deadline {
        log = s.proc.log_text();
        if log.contains("outcome=\"invalid\"") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let line = log
        .lines()
        .find(|l| l.contains("acme: order failed") && l.contains("outcome=\"invalid\""))
        .unwrap_or_else(|| panic!("no failed order in the log:\n{log}"));
    // Why, in the CA's words: what it tried, what happened, the problem type.
    assert!(line.contains("name=unreachable.acme.test"), "{line}");
    assert!(line.contains("/.well-known/acme-challenge/"), "{line}");
    assert!(line.contains("connection refused"), "{line}");
    assert!(
        line.contains("urn:ietf:params:acme:error:connection"),
        "{line}"
    );
    assert!(s.proc.running());
    assert!(handshake(s.tls, "unreachable.acme.test", &[&root])
        .await
        .is_err());
    assert!(!state.join("certs/unreachable.acme.test.pem").exists());
}

/// A CA that binds accounts to accounts of its own (ZeroSSL, Google Trust Services): without
/// `[acme.eab]`, or with the wrong key, no account is made and the log says what to set (a
/// setup error, not the CA's); with the key id and HMAC key it issued, the account is bound and
/// the certificate issued. The key file's contents appear in no log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_that_requires_an_external_account_binding_gets_one_from_acme_eab() {
    use base64::Engine;
    let t = setup();
    let dns = ChallSrv::start(t.dir.path());
    let raw: Vec<u8> = (0u8..48)
        .map(|b| b.wrapping_mul(151).wrapping_add(7))
        .collect();
    let key = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&raw);
    let pebble = Pebble::start(
        t.dir.path(),
        t.ca.clone(),
        PebbleOptions {
            http_port: free_port(),
            tls_port: free_port(),
            dns: dns.dns,
            validity_secs: 7_776_000,
            always_valid: true,
            eab: Some(("kid-sluice".into(), key.clone())),
        },
    );
    let root = pebble.root().await;
    let good = t.dir.path().join("eab-good.key");
    std::fs::write(&good, format!("{key}\n")).unwrap();
    let wrong_key = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode([9u8; 48]);
    let wrong = t.dir.path().join("eab-wrong.key");
    std::fs::write(&wrong, &wrong_key).unwrap();
    let names = "names = [\"bound.acme.test\"]\nchallenges = [\"tls-alpn-01\"]";

    // Waits for the first failed order's log line and returns it.
    async fn failed_order(s: &mut Sluice) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let log = s.proc.log_text();
            if let Some(line) = log.lines().find(|l| l.contains("acme: order failed")) {
                return line.to_string();
            }
            assert!(Instant::now() < deadline, "no failed order:\n{log}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    for (tag, eab, hint) in [
        (
            "no-eab",
            String::new(),
            "set [acme.eab] key_id and mac_key_file",
        ),
        (
            "wrong-eab",
            format!(
                "[acme.eab]\nkey_id = \"kid-sluice\"\nmac_key_file = \"{}\"",
                wrong.display()
            ),
            "check [acme.eab] key_id and mac_key_file",
        ),
    ] {
        let state = t.dir.path().join(format!("state-{tag}"));
        let tls_port = free_port();
        let mut s = Sluice::start(
            t.dir.path(),
            tag,
            tls_port,
            &acme_section(&pebble, &state, &format!("{names}\n{eab}")),
        );
        let line = failed_order(&mut s).await;
        assert!(line.contains("outcome=\"setup_error\""), "{tag}: {line}");
        assert!(line.contains(hint), "{tag}: {line}");
        if tag == "no-eab" {
            assert!(line.contains("externalAccountRequired"), "{line}");
        }
        assert!(s.proc.running());
        assert!(handshake(s.tls, "bound.acme.test", &[&root]).await.is_err());
        assert!(!state.join("certs/bound.acme.test.pem").exists());
        let log = s.proc.log_text();
        assert!(!log.contains(&wrong_key) && !log.contains(&key), "{log}");
    }

    // The binding the CA issued.
    let state = t.dir.path().join("state-eab");
    let tls_port = free_port();
    let s = Sluice::start(
        t.dir.path(),
        "eab",
        tls_port,
        &acme_section(
            &pebble,
            &state,
            &format!(
                "{names}\n[acme.eab]\nkey_id = \"kid-sluice\"\nmac_key_file = \"{}\"",
                good.display()
            ),
        ),
    );
    let chain = wait_for_cert(&s, "bound.acme.test", &[&root], Duration::from_secs(30)).await;
    assert!(!chain.is_empty());
    let log = s.proc.log_text();
    assert!(
        log.contains("acme: account created") && log.contains("bound=\"kid-sluice\""),
        "{log}"
    );
    assert!(!log.contains(&key), "{log}");

    // A key file that holds no key stops `serve` at start, naming the file and not its text.
    let bad = t.dir.path().join("eab-bad.key");
    std::fs::write(&bad, "not a key!").unwrap();
    let config = t.dir.path().join("sluice-bad-eab.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = [\"127.0.0.1:{}\"]\n{}",
            free_port(),
            acme_section(
                &pebble,
                &t.dir.path().join("state-bad"),
                &format!(
                    "{names}\n[acme.eab]\nkey_id = \"kid-sluice\"\nmac_key_file = \"{}\"",
                    bad.display()
                ),
            )
        ),
    )
    .unwrap();
    let mut child = std::process::Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("sluice did not stop at a key file that holds no key");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!status.success(), "{err}");
    assert!(err.contains("acme.eab.mac_key_file"), "{err}");
    assert!(err.contains("not a base64url HMAC key"), "{err}");
    assert!(!err.contains("not a key!"), "{err}");
}
