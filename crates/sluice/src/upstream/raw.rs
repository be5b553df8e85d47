//! One bodiless request over a fresh plain HTTP/1.1 connection of the client's own (address
//! guard, outgoing routes, setup limit and deadlines as for pooled requests), its response head
//! read off the socket, and the socket handed over at the first body byte: for bodies that are
//! spliced to the client instead of read. No redirects here: the caller falls back to
//! [`Upstream::send`] for those.

use std::fmt::Write as _;

use bytes::{Bytes, BytesMut};
use http::header;
use http::Uri;
use sluice_http::response_head::{self, ResponseHead};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tower_service::Service;

use super::connector::Conn;
use super::{host_of, Upstream, UpstreamError, UpstreamRequest};

/// Largest response head read.
const MAX_HEAD: usize = 64 * 1024;

/// A response head and the socket its body follows on.
pub struct RawResponse {
    pub head: ResponseHead,
    /// Positioned after `early`.
    pub socket: TcpStream,
    /// Body bytes that arrived with the head.
    pub early: Bytes,
}

impl Upstream {
    /// Sends `req` (an `http` URL) on a new connection that closes after this exchange, and
    /// reads the response head within the header timeout.
    pub async fn send_raw(&self, req: &UpstreamRequest) -> Result<RawResponse, UpstreamError> {
        let url = &req.url;
        let host = host_of(url);
        let protocol = |detail: String| UpstreamError::Protocol {
            host: host.clone(),
            detail,
        };
        if url.scheme() != "http" {
            return Err(protocol("only plain http is read raw".into()));
        }
        let uri: Uri = url
            .as_str()
            .parse()
            .map_err(|e: http::uri::InvalidUri| protocol(e.to_string()))?;
        self.metrics.requests.inc();
        let conn = self.connector.clone().call(uri).await?.into_inner();
        let Conn::Plain(mut socket) = conn else {
            return Err(protocol("a plain http URL got a TLS connection".into()));
        };
        let head = request_head(req, &self.user_agent);
        let exchange = async {
            socket
                .write_all(head.as_bytes())
                .await
                .map_err(|e| protocol(format!("sending the request: {e}")))?;
            let mut buf = BytesMut::with_capacity(8 * 1024);
            loop {
                if let Some(head) = response_head::parse(&buf).map_err(|e| protocol(e.to_string()))? {
                    let early = buf.split_off(head.len).freeze();
                    return Ok((head, early));
                }
                if buf.len() >= MAX_HEAD {
                    return Err(protocol(format!("response head over {MAX_HEAD} bytes")));
                }
                buf.reserve(8 * 1024);
                let n = socket
                    .read_buf(&mut buf)
                    .await
                    .map_err(|e| protocol(format!("reading the response head: {e}")))?;
                if n == 0 {
                    return Err(protocol("connection closed before a response head".into()));
                }
            }
        };
        let (head, early) = tokio::time::timeout(self.header_timeout, exchange)
            .await
            .map_err(|_| UpstreamError::HeaderTimeout {
                host: host.clone(),
                secs: self.header_timeout.as_secs(),
            })??;
        Ok(RawResponse {
            head,
            socket,
            early,
        })
    }

    /// How long a body may go without a byte.
    pub fn idle_read_timeout(&self) -> std::time::Duration {
        self.idle_timeout
    }

    /// Counts body bytes received from upstreams (`upstream_received_bytes`).
    pub fn count_received(&self, n: usize) {
        self.metrics.bytes.inc_by(n as u64);
    }
}

/// `GET /path?query HTTP/1.1` with `Host` (unless the request sets one), the client's
/// `User-Agent` (likewise), the request's headers and `Connection: close`. Header values are
/// `HeaderValue`s, which cannot hold CR or LF.
fn request_head(req: &UpstreamRequest, user_agent: &http::HeaderValue) -> String {
    let url = &req.url;
    let target = &url[url::Position::BeforePath..url::Position::AfterQuery];
    let mut head = String::with_capacity(256);
    let _ = write!(head, "{} {} HTTP/1.1\r\n", req.method, target);
    if !req.headers.contains_key(header::HOST) {
        let host = url.host_str().unwrap_or("");
        match url.port() {
            Some(port) => {
                let _ = write!(head, "host: {host}:{port}\r\n");
            }
            None => {
                let _ = write!(head, "host: {host}\r\n");
            }
        }
    }
    if !req.headers.contains_key(header::USER_AGENT) {
        push_field(&mut head, header::USER_AGENT.as_str(), user_agent.as_bytes());
    }
    for (name, value) in &req.headers {
        if name == header::CONNECTION {
            continue;
        }
        push_field(&mut head, name.as_str(), value.as_bytes());
    }
    head.push_str("connection: close\r\n\r\n");
    head
}

fn push_field(head: &mut String, name: &str, value: &[u8]) {
    head.push_str(name);
    head.push_str(": ");
    // Visible ASCII passes as is; other bytes (obs-text) as Latin-1, the way they arrived.
    head.extend(value.iter().map(|&b| b as char));
    head.push_str("\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_has_target_host_and_fields() {
        let mut req = UpstreamRequest::get("http://127.0.0.1:8080/a/b.mp4?x=1&y=%20".parse().unwrap());
        req.headers
            .insert("referer", http::HeaderValue::from_static("http://r/"));
        let head = request_head(&req, &http::HeaderValue::from_static("sluice"));
        assert_eq!(
            head,
            "GET /a/b.mp4?x=1&y=%20 HTTP/1.1\r\nhost: 127.0.0.1:8080\r\nuser-agent: sluice\r\n\
             referer: http://r/\r\nconnection: close\r\n\r\n"
        );
        let mut own = UpstreamRequest::get("http://example.com/".parse().unwrap());
        own.headers
            .insert(header::HOST, http::HeaderValue::from_static("other"));
        let head = request_head(&own, &http::HeaderValue::from_static("ua"));
        assert!(head.starts_with("GET / HTTP/1.1\r\nuser-agent: ua\r\nhost: other\r\n"));
    }
}
