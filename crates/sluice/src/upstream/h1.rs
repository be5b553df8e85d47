//! HTTP/1.1 over a connection of the client's own: the request head written, the response head
//! read with `sluice_http::response_head` (shared by `raw`, which splices bodies, and `fetch`,
//! which reads whole ones).

use std::io::Write as _;

use bytes::{Bytes, BytesMut};
use http::{header, HeaderMap, HeaderValue, Method};
use sluice_http::response_head::{self, ResponseHead};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest response head read.
pub const MAX_HEAD: usize = 64 * 1024;

/// Why an exchange got no head.
pub enum Exchange {
    /// The connection ended before any response byte.
    Closed,
    Failed(String),
}

/// Writes the request head and reads the response head (and whatever body came with it).
pub async fn exchange<S>(socket: &mut S, head: &[u8]) -> Result<(ResponseHead, Bytes), Exchange>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    if let Err(e) = socket.write_all(head).await {
        return Err(match e.kind() {
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset => {
                Exchange::Closed
            }
            _ => Exchange::Failed(format!("sending the request: {e}")),
        });
    }
    if let Err(e) = socket.flush().await {
        return Err(Exchange::Failed(format!("sending the request: {e}")));
    }
    read_head(socket, BytesMut::with_capacity(8 * 1024)).await
}

/// Reads a response head that starts at `buf` (bytes already read) and continues on `socket`.
pub async fn read_head<S>(
    socket: &mut S,
    mut buf: BytesMut,
) -> Result<(ResponseHead, Bytes), Exchange>
where
    S: AsyncRead + Unpin,
{
    loop {
        match response_head::parse(&buf) {
            Ok(Some(head)) => {
                let early = buf.split_off(head.len).freeze();
                return Ok((head, early));
            }
            Ok(None) => {}
            Err(e) => return Err(Exchange::Failed(e.to_string())),
        }
        if buf.len() >= MAX_HEAD {
            return Err(Exchange::Failed(format!(
                "response head over {MAX_HEAD} bytes"
            )));
        }
        buf.reserve(8 * 1024);
        match socket.read_buf(&mut buf).await {
            Ok(0) if buf.is_empty() => return Err(Exchange::Closed),
            Ok(0) => {
                return Err(Exchange::Failed(
                    "connection closed inside the response head".into(),
                ))
            }
            Ok(_) => {}
            Err(e) if buf.is_empty() && e.kind() == std::io::ErrorKind::ConnectionReset => {
                return Err(Exchange::Closed)
            }
            Err(e) => return Err(Exchange::Failed(format!("reading the response head: {e}"))),
        }
    }
}

/// Whether the response's `Connection` field says the origin closes after it.
#[cfg(feature = "upstream-pool")]
pub fn says_close(headers: &HeaderMap) -> bool {
    headers.get_all(header::CONNECTION).iter().any(|v| {
        v.to_str()
            .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")))
    })
}

/// `METHOD target HTTP/1.1` with `Host: host` (unless `headers` sets one), `User-Agent`
/// (likewise), `headers` (never `Connection`: keep-alive is HTTP/1.1's default) and, with
/// `close`, `Connection: close`. Header values are `HeaderValue`s, which cannot hold CR or LF;
/// `target` and `host` come from a parsed URI, which cannot either.
pub fn request_head(
    method: &Method,
    target: &str,
    host: &str,
    headers: &HeaderMap,
    user_agent: &HeaderValue,
    close: bool,
) -> Vec<u8> {
    let mut head = Vec::with_capacity(256);
    let _ = write!(head, "{method} {target} HTTP/1.1\r\n");
    if !headers.contains_key(header::HOST) {
        let _ = write!(head, "host: {host}\r\n");
    }
    if !headers.contains_key(header::USER_AGENT) {
        push_field(
            &mut head,
            header::USER_AGENT.as_str(),
            user_agent.as_bytes(),
        );
    }
    for (name, value) in headers {
        if name == header::CONNECTION {
            continue;
        }
        push_field(&mut head, name.as_str(), value.as_bytes());
    }
    if close {
        head.extend_from_slice(b"connection: close\r\n");
    }
    head.extend_from_slice(b"\r\n");
    head
}

/// `name: value` and CRLF, appended to a head being written.
#[inline]
pub fn push_field(head: &mut Vec<u8>, name: &str, value: &[u8]) {
    head.extend_from_slice(name.as_bytes());
    head.extend_from_slice(b": ");
    // Byte for byte, the way the value arrived (obs-text included).
    head.extend_from_slice(value);
    head.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_has_target_host_and_fields() {
        let mut headers = HeaderMap::new();
        headers.insert("referer", HeaderValue::from_static("http://r/"));
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        let head = request_head(
            &Method::GET,
            "/a/b.mp4?x=1&y=%20",
            "127.0.0.1:8080",
            &headers,
            &HeaderValue::from_static("sluice"),
            false,
        );
        assert_eq!(
            head,
            b"GET /a/b.mp4?x=1&y=%20 HTTP/1.1\r\nhost: 127.0.0.1:8080\r\nuser-agent: sluice\r\n\
             referer: http://r/\r\n\r\n"
        );
        let mut own = HeaderMap::new();
        own.insert(header::HOST, HeaderValue::from_static("other"));
        let head = request_head(
            &Method::GET,
            "/",
            "example.com",
            &own,
            &HeaderValue::from_static("ua"),
            true,
        );
        assert_eq!(
            head,
            b"GET / HTTP/1.1\r\nuser-agent: ua\r\nhost: other\r\nconnection: close\r\n\r\n"
        );
        // A value with obs-text goes out byte for byte (UTF-8 in, the same UTF-8 out).
        let mut odd = HeaderMap::new();
        odd.insert(
            "x-name",
            HeaderValue::from_bytes("caf\u{e9}".as_bytes()).unwrap(),
        );
        let head = request_head(
            &Method::GET,
            "/",
            "h",
            &odd,
            &HeaderValue::from_static("ua"),
            false,
        );
        let want: &[u8] =
            b"GET / HTTP/1.1\r\nhost: h\r\nuser-agent: ua\r\nx-name: caf\xc3\xa9\r\n\r\n";
        assert_eq!(head, want);
    }
}
