//! ACME test support: Pebble (Let's Encrypt's test CA) and its DNS test server, BIND 9 taking
//! RFC 2136 updates with TSIG, sluice as a child process, and a TLS client that verifies what
//! sluice serves against Pebble's root. Every process here listens on 127.0.0.1 and is killed
//! when its handle drops.
#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use rustls::pki_types::{CertificateDer, ServerName};

pub const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// `target/tools`, where `scripts/acme-tools` puts Pebble.
fn tools() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tools")
}

/// Installs what is missing (once per test binary); a missing tool is a failure, never a skip.
pub fn install_tools() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/acme-tools");
        let ok = Command::new(script).status().map(|s| s.success());
        assert!(
            matches!(ok, Ok(true)),
            "scripts/acme-tools failed: the ACME tests need Pebble and BIND 9"
        );
    });
}

/// A loopback port free for TCP and UDP, below the kernel's ephemeral range (32768 and up).
///
/// A port the kernel handed out with `bind(0)` and that was closed again can be taken as the local
/// port of any outgoing connection before the process meant to listen on it starts (Pebble, BIND
/// and sluice all connect out here), which makes that listener fail with "address in use".
/// Outgoing connections never take a port below the ephemeral range, so a port from there stays
/// free unless another test picks it; a counter seeded by the process id keeps the picks of
/// parallel tests and test binaries apart.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7919) % SPAN,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..SPAN {
        let port = (LOW + NEXT.fetch_add(1, Ordering::Relaxed) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok()
            && std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok()
        {
            return port;
        }
    }
    panic!("no free loopback port between {LOW} and {}", LOW + SPAN)
}

fn free_udp_port() -> u16 {
    // `free_port` checks UDP too: DNS servers listen on both.
    free_port()
}

/// Waits until something accepts TCP connections on `addr`.
pub fn wait_port(addr: SocketAddr, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(Instant::now() < deadline, "{what} did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(30));
    }
}

/// A child process killed on drop.
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    fn spawn(cmd: &mut Command, log: PathBuf) -> Proc {
        let out = std::fs::File::create(&log).unwrap();
        let child = cmd
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        Proc { child, log }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A CA of the test's own for Pebble's HTTPS listener (sluice trusts it as `directory_ca`).
pub struct ListenerCa {
    pub ca_pem: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca_der: Vec<u8>,
}

impl ListenerCa {
    pub fn new(dir: &Path) -> ListenerCa {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "acme test listener CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let mut leaf_params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        leaf_params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress([127, 0, 0, 1].into()));
        let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
        let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();
        let write = |name: &str, text: String| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        ListenerCa {
            ca_pem: write("listener-ca.pem", ca.pem()),
            cert: write("listener.pem", leaf.pem()),
            key: write("listener.key", leaf_key.serialize_pem()),
            ca_der: ca.der().to_vec(),
        }
    }
}

/// How a Pebble is set up.
pub struct PebbleOptions {
    /// The port Pebble validates HTTP-01 on (sluice's `acme.http_listen`).
    pub http_port: u16,
    /// The port Pebble validates TLS-ALPN-01 on (sluice's TLS listener).
    pub tls_port: u16,
    /// The DNS server Pebble resolves names through.
    pub dns: SocketAddr,
    /// Certificate lifetime, seconds.
    pub validity_secs: u64,
    /// `PEBBLE_VA_ALWAYS_VALID=1`: every challenge passes (tests that are about something else).
    pub always_valid: bool,
    /// New accounts must carry an external account binding to this key id and base64url HMAC
    /// key (RFC 8555 §7.3.4).
    pub eab: Option<(String, String)>,
}

/// A running Pebble.
pub struct Pebble {
    pub proc: Proc,
    pub addr: SocketAddr,
    pub management: SocketAddr,
    pub listener_ca: Arc<ListenerCa>,
}

impl Pebble {
    pub fn start(dir: &Path, ca: Arc<ListenerCa>, o: PebbleOptions) -> Pebble {
        install_tools();
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let management: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let config = serde_json::json!({
            "pebble": {
                "listenAddress": addr.to_string(),
                "managementListenAddress": management.to_string(),
                "certificate": ca.cert,
                "privateKey": ca.key,
                "httpPort": o.http_port,
                "tlsPort": o.tls_port,
                "ocspResponderURL": "",
                "externalAccountBindingRequired": o.eab.is_some(),
                "externalAccountMACKeys": o.eab.iter().cloned().collect::<std::collections::HashMap<_, _>>(),
                "domainBlocklist": [],
                "retryAfter": {"authz": 1, "order": 1},
                "keyAlgorithm": "ecdsa",
                "profiles": {"default": {"description": "test", "validityPeriod": o.validity_secs}}
            }
        });
        let path = dir.join(format!("pebble-{}.json", addr.port()));
        std::fs::write(&path, config.to_string()).unwrap();
        let mut cmd = Command::new(tools().join("pebble"));
        cmd.arg("-config")
            .arg(&path)
            .arg("-dnsserver")
            .arg(o.dns.to_string())
            .arg("-strict=false")
            .env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_WFE_NONCEREJECT", "0")
            .env("PEBBLE_AUTHZREUSE", "0");
        if o.always_valid {
            cmd.env("PEBBLE_VA_ALWAYS_VALID", "1");
        }
        let proc = Proc::spawn(&mut cmd, dir.join(format!("pebble-{}.log", addr.port())));
        wait_port(addr, "pebble");
        wait_port(management, "pebble management");
        Pebble {
            proc,
            addr,
            management,
            listener_ca: ca,
        }
    }

    pub fn directory(&self) -> String {
        format!("https://{}/dir", self.addr)
    }

    /// Pebble's root (made anew at each start), DER: what sluice's certificates must chain to.
    pub async fn root(&self) -> Vec<u8> {
        let pem = https_text(
            self.management,
            "localhost",
            &[&self.listener_ca.ca_der],
            "/roots/0",
        )
        .await
        .expect("pebble's root");
        use rustls::pki_types::pem::PemObject;
        let der = CertificateDer::pem_slice_iter(pem.as_bytes()).next();
        der.unwrap().unwrap().to_vec()
    }
}

/// pebble-challtestsrv as a DNS server answering 127.0.0.1 for every A query.
pub struct ChallSrv {
    pub proc: Proc,
    pub dns: SocketAddr,
}

impl ChallSrv {
    pub fn start(dir: &Path) -> ChallSrv {
        install_tools();
        let port = free_udp_port();
        let management = free_port();
        let dns: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut cmd = Command::new(tools().join("pebble-challtestsrv"));
        cmd.args(["-dnsserver", &dns.to_string()])
            .args(["-management", &format!("127.0.0.1:{management}")])
            .args(["-http01", "", "-https01", "", "-tlsalpn01", "", "-doh", ""])
            .args(["-defaultIPv4", "127.0.0.1", "-defaultIPv6", ""]);
        let proc = Proc::spawn(&mut cmd, dir.join(format!("challtestsrv-{port}.log")));
        wait_port(dns, "challtestsrv DNS (tcp)");
        ChallSrv { proc, dns }
    }
}

/// BIND 9 as the primary of one zone, taking updates signed with a `tsig-keygen` key.
pub struct Bind {
    pub proc: Proc,
    pub dns: SocketAddr,
    pub key_file: PathBuf,
    pub zone: String,
}

impl Bind {
    pub fn start(dir: &Path, zone: &str) -> Bind {
        install_tools();
        let port = free_udp_port();
        let dns: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let work = dir.join("bind");
        std::fs::create_dir_all(&work).unwrap();
        let key = Command::new("tsig-keygen")
            .args(["-a", "hmac-sha256", "acme-update"])
            .output()
            .expect("tsig-keygen");
        assert!(key.status.success());
        let key_text = String::from_utf8(key.stdout).unwrap();
        let key_file = work.join("acme-update.key");
        std::fs::write(&key_file, &key_text).unwrap();
        let zone_file = work.join("zone.db");
        std::fs::write(
            &zone_file,
            format!(
                "$TTL 60\n@ IN SOA ns.{zone}. admin.{zone}. 1 60 60 600 60\n@ IN NS ns.{zone}.\nns IN A 127.0.0.1\n@ IN A 127.0.0.1\n* IN A 127.0.0.1\n"
            ),
        )
        .unwrap();
        let conf = work.join("named.conf");
        let w = work.display();
        std::fs::write(
            &conf,
            format!(
                r#"options {{
  directory "{w}";
  pid-file "{w}/named.pid";
  session-keyfile "{w}/session.key";
  managed-keys-directory "{w}";
  listen-on port {port} {{ 127.0.0.1; }};
  listen-on-v6 {{ none; }};
  recursion no;
  dnssec-validation no;
  allow-query {{ any; }};
}};
controls {{ }};
{key_text}
zone "{zone}" {{
  type primary;
  file "{zf}";
  update-policy {{ grant acme-update zonesub TXT; }};
}};
"#,
                zf = zone_file.display()
            ),
        )
        .unwrap();
        let mut cmd = Command::new("named");
        cmd.arg("-g").arg("-c").arg(&conf).args(["-n", "1"]);
        let proc = Proc::spawn(&mut cmd, work.join("named.log"));
        wait_port(dns, "named");
        Bind {
            proc,
            dns,
            key_file,
            zone: zone.to_string(),
        }
    }
}

/// sluice as a child process with a config file of the test's.
pub struct Sluice {
    pub proc: Proc,
    pub tls: SocketAddr,
    pub config: PathBuf,
}

impl Sluice {
    pub fn start(dir: &Path, tag: &str, tls_port: u16, config: &str) -> Sluice {
        let path = dir.join(format!("sluice-{tag}.toml"));
        let text = format!("[server]\nlisten = [\"127.0.0.1:{tls_port}\"]\n{config}");
        std::fs::write(&path, text).unwrap();
        let mut cmd = Command::new(BIN);
        cmd.arg("serve")
            .arg("--config")
            .arg(&path)
            .env("RUST_LOG", "info,sluice::acme=debug");
        let proc = Proc::spawn(&mut cmd, dir.join(format!("sluice-{tag}.log")));
        let tls: SocketAddr = format!("127.0.0.1:{tls_port}").parse().unwrap();
        let mut sluice = Sluice {
            proc,
            tls,
            config: path,
        };
        sluice.wait_listening();
        sluice
    }

    /// Waits until sluice accepts on its TLS port; if it exits or does not listen in time, the
    /// panic carries its log.
    fn wait_listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect_timeout(&self.tls, Duration::from_millis(200)).is_err() {
            if let Ok(Some(status)) = self.proc.child.try_wait() {
                panic!(
                    "sluice exited ({status}) before listening on {}:\n{}",
                    self.tls,
                    self.proc.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "sluice did not listen on {} within 30 s:\n{}",
                self.tls,
                self.proc.log_text()
            );
            std::thread::sleep(Duration::from_millis(30));
        }
    }

    /// The process's resident memory, kB.
    pub fn rss_kb(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.proc.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }
}

fn client_config(roots: &[&[u8]], alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        store.add(CertificateDer::from(r.to_vec())).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(store)
    .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// A TLS handshake to `addr` for `name`, verified against `roots`: the chain served, or why not.
pub async fn handshake(
    addr: SocketAddr,
    name: &str,
    roots: &[&[u8]],
) -> Result<Vec<Vec<u8>>, String> {
    let chain = served_chain(addr, name, client_config(roots, &[b"http/1.1"])).await?;
    Ok(chain)
}

/// A TLS-ALPN-01 validation handshake (ALPN `acme-tls/1`) for `name`, as a CA makes it: the
/// certificate served is taken whatever it is (a CA checks its `acmeIdentifier`, not its
/// issuer). The leaf, or why there was none.
pub async fn acme_tls_handshake(addr: SocketAddr, name: &str) -> Result<Vec<u8>, String> {
    let config = crate::trust_anything::config(&[b"acme-tls/1"]);
    let chain = served_chain(addr, name, config).await?;
    chain
        .into_iter()
        .next()
        .ok_or_else(|| "no certificate".to_string())
}

/// A TLS handshake to `addr` for `name` with `config` (20 s at most): the chain served.
async fn served_chain(
    addr: SocketAddr,
    name: &str,
    config: Arc<rustls::ClientConfig>,
) -> Result<Vec<Vec<u8>>, String> {
    let connector = tokio_rustls::TlsConnector::from(config);
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from(name.to_string()).map_err(|e| e.to_string())?;
    let tls = tokio::time::timeout(Duration::from_secs(20), connector.connect(name, tcp))
        .await
        .map_err(|_| "handshake timed out".to_string())?
        .map_err(|e| e.to_string())?;
    Ok(tls
        .get_ref()
        .1
        .peer_certificates()
        .unwrap_or_default()
        .iter()
        .map(|c| c.to_vec())
        .collect())
}

/// Handshakes until one for `name` verifies against `roots` (or `limit` passes).
pub async fn wait_for_cert(
    sluice: &Sluice,
    name: &str,
    roots: &[&[u8]],
    limit: Duration,
) -> Vec<Vec<u8>> {
    let deadline = Instant::now() + limit;
    loop {
        match handshake(sluice.tls, name, roots).await {
            Ok(chain) => return chain,
            Err(e) => {
                if Instant::now() >= deadline {
                    // Why the order did not complete is in sluice's log (acme at debug).
                    let log = sluice.proc.log_text();
                    let tail: Vec<&str> = log.lines().rev().take(60).collect();
                    let tail: Vec<&str> = tail.into_iter().rev().collect();
                    panic!(
                        "no verified certificate for {name} within {limit:?}: {e}\n\
                         sluice's log, last lines:\n{}",
                        tail.join("\n")
                    );
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `GET path` over TLS for SNI `name` with `Host: 127.0.0.1` (built-ins answer loopback hosts):
/// the status line's code and the body.
pub async fn https_get(
    addr: SocketAddr,
    name: &str,
    roots: &[&[u8]],
    path: &str,
) -> Result<(u16, String), String> {
    use http_body_util::BodyExt;
    let connector = tokio_rustls::TlsConnector::from(client_config(roots, &[b"http/1.1"]));
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let sn = ServerName::try_from(name.to_string()).map_err(|e| e.to_string())?;
    let tls = connector
        .connect(sn, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = http::Request::get(path)
        .header("host", "127.0.0.1")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

async fn https_text(
    addr: SocketAddr,
    name: &str,
    roots: &[&[u8]],
    path: &str,
) -> Result<String, String> {
    let (status, body) = https_get(addr, name, roots, path).await?;
    if status != 200 {
        return Err(format!("{path}: {status}"));
    }
    Ok(body)
}

/// The value of one Prometheus series (`name{labels}` exactly as rendered), if present.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// The leaf's serial number (to tell a renewed certificate from the old one).
pub fn serial(leaf_der: &[u8]) -> Vec<u8> {
    let (_, cert) = x509_parser::parse_x509_certificate(leaf_der).unwrap();
    cert.raw_serial().to_vec()
}
