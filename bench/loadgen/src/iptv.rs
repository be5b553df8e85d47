//! IPTV receiver: N HTTP clients on a gateway's `/rtp/G:port` URLs, each verifying the TS stream
//! byte for byte (see `tsgen`) and counting what it got before, during and after a timed window.
//!
//! Timeline per run: connect and warm up, then the timed window (the gateway's process tree is
//! sampled only here), then a drain that reads until the stream goes quiet (the sender stopped),
//! so the last packet each client got can be compared with the last one the sender sent.

use crate::client::Target;
use crate::procstat::{Background, TreeSampler, Usage};
use crate::tsgen::Verifier;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

#[derive(Debug, Clone)]
pub struct Config {
    /// One URL per sender group, in the sender's group order (group index = position).
    pub urls: Vec<String>,
    pub clients: usize,
    pub seed: u64,
    pub warmup: Duration,
    pub secs: Duration,
    /// After the window, stop a client once nothing arrived for this long...
    pub idle_end: Duration,
    /// ...or at the latest this long after the window.
    pub max_drain: Duration,
    pub pid: Option<u32>,
    pub sample_interval: Duration,
}

#[derive(Debug, Default, Serialize)]
pub struct ClientReport {
    pub url: String,
    pub group: u32,
    pub status: u16,
    pub error: Option<String>,
    pub bytes_total: u64,
    pub bytes_window: u64,
    /// Bytes received from the window's start to the end of the stream.
    pub bytes_after_cut: u64,
    pub window_mbit_per_s: f64,
    pub first_ts: Option<u64>,
    /// Index of the next TS packet expected when the window started.
    pub ts_at_cut: Option<u64>,
    /// Index one past the last TS packet received.
    pub ts_end: Option<u64>,
    pub lost_ts: u64,
    pub behind_ts: u64,
    pub corrupt_ts: u64,
    pub end: String,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub mode: &'static str,
    pub clients: Vec<ClientReport>,
    pub window_s: f64,
    pub usage: Option<Usage>,
}

struct Times {
    cut: Instant,
    window_end: Instant,
    deadline: Instant,
}

async fn one_client(
    url: String,
    group: u32,
    seed: u64,
    t: Arc<Times>,
    idle_end: Duration,
) -> ClientReport {
    let mut r = ClientReport {
        url: url.clone(),
        group,
        ..Default::default()
    };
    let target = match Target::parse(&url) {
        Ok(t) => t,
        Err(e) => {
            r.error = Some(format!("{e:#}"));
            return r;
        }
    };
    let mut v = Verifier::new(seed, group);
    let outcome = async {
        let stream = TcpStream::connect(target.addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let (mut sender, conn) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let req = http::Request::get(target.path_and_query.as_str())
            .header(http::header::HOST, target.host.as_str())
            .header(http::header::USER_AGENT, "sluice-loadgen")
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("send: {e}"))?;
        r.status = resp.status().as_u16();
        if r.status != 200 {
            return Err(format!("status {}", r.status));
        }
        let mut body = resp.into_body();
        let (mut marked_cut, mut marked_end) = (false, false);
        let mut bytes_at_cut = 0u64;
        // Bounded by the deadline: every wait below is capped by it.
        loop {
            let now = Instant::now();
            if !marked_cut && now >= t.cut {
                marked_cut = true;
                bytes_at_cut = r.bytes_total;
                r.ts_at_cut = v.next;
            }
            if !marked_end && now >= t.window_end {
                marked_end = true;
                r.bytes_window = r.bytes_total - bytes_at_cut;
            }
            if now >= t.deadline {
                return Ok("deadline".to_string());
            }
            let wait = if marked_end {
                idle_end.min(t.deadline - now)
            } else {
                let next_mark = if marked_cut { t.window_end } else { t.cut };
                (next_mark - now).max(Duration::from_millis(1))
            };
            match tokio::time::timeout(wait, body.frame()).await {
                Err(_) if marked_end => return Ok("idle".to_string()),
                Err(_) => continue,
                Ok(None) => return Ok("closed".to_string()),
                Ok(Some(Err(e))) => return Err(format!("body: {e}")),
                Ok(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        r.bytes_total += data.len() as u64;
                        v.feed(data);
                    }
                }
            }
            r.bytes_after_cut = if marked_cut {
                r.bytes_total - bytes_at_cut
            } else {
                0
            };
        }
    }
    .await;
    match outcome {
        Ok(end) => r.end = end,
        Err(e) => {
            r.end = "error".into();
            r.error = Some(e);
        }
    }
    r.first_ts = v.first;
    r.ts_end = v.next;
    r.lost_ts = v.lost;
    r.behind_ts = v.behind;
    r.corrupt_ts = v.corrupt;
    let window = t.window_end.saturating_duration_since(t.cut).as_secs_f64();
    if window > 0.0 {
        r.window_mbit_per_s = r.bytes_window as f64 * 8.0 / 1e6 / window;
    }
    r
}

pub async fn run(cfg: Config) -> Report {
    let start = Instant::now();
    let times = Arc::new(Times {
        cut: start + cfg.warmup,
        window_end: start + cfg.warmup + cfg.secs,
        deadline: start + cfg.warmup + cfg.secs + cfg.max_drain,
    });
    let mut tasks = Vec::new();
    for k in 0..cfg.clients {
        let g = k % cfg.urls.len().max(1);
        let url = cfg.urls.get(g).cloned().unwrap_or_default();
        tasks.push(tokio::spawn(one_client(
            url,
            g as u32,
            cfg.seed,
            times.clone(),
            cfg.idle_end,
        )));
    }
    tokio::time::sleep_until(times.cut.into()).await;
    let sampler = cfg
        .pid
        .map(|pid| Background::run(TreeSampler::start(pid), cfg.sample_interval));
    tokio::time::sleep_until(times.window_end.into()).await;
    let usage = sampler.map(Background::stop);
    let mut clients = Vec::new();
    for t in tasks {
        if let Ok(r) = t.await {
            clients.push(r);
        }
    }
    Report {
        mode: "iptv-recv",
        clients,
        window_s: cfg.secs.as_secs_f64(),
        usage,
    }
}
