//! The HTTP/1.1 client every simulated user shares: one fresh connection per request (hyper's
//! connection API), the body handed to a checker as it arrives, everything under one deadline.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::HeaderMap;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
}

/// GET `target` (path and query) from `addr`; `sink` sees each body chunk.
pub async fn get(
    addr: SocketAddr,
    target: &str,
    limit: Duration,
    sink: impl FnMut(&[u8]),
) -> Result<Reply, String> {
    request(addr, "GET", target, &[], Bytes::new(), limit, sink).await
}

/// GET and keep the whole body (manifests, playlists, DASH media).
pub async fn get_body(
    addr: SocketAddr,
    target: &str,
    limit: Duration,
) -> Result<(u16, Vec<u8>), String> {
    let mut body = Vec::new();
    let r = get(addr, target, limit, |c| body.extend_from_slice(c)).await?;
    Ok((r.status, body))
}

pub async fn request(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: Bytes,
    limit: Duration,
    sink: impl FnMut(&[u8]),
) -> Result<Reply, String> {
    match tokio::time::timeout(limit, exchange(addr, method, target, headers, body, sink)).await {
        Ok(r) => r,
        Err(_) => Err("timeout".into()),
    }
}

async fn exchange(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: Bytes,
    mut sink: impl FnMut(&[u8]),
) -> Result<Reply, String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {}", e.kind()))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|_| "handshake".to_string())?;
    tokio::spawn(conn);
    let mut req = http::Request::builder()
        .method(method)
        .uri(target)
        .header("host", addr.to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(body))
        .map_err(|e| format!("request: {e}"))?;
    let resp = sender.send_request(req).await.map_err(|e| {
        if e.is_incomplete_message() {
            "closed before head".to_string()
        } else {
            "head".to_string()
        }
    })?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let mut body = resp.into_body();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| "body".to_string())?;
        if let Some(d) = frame.data_ref() {
            sink(d);
        }
    }
    Ok(Reply { status, headers })
}
