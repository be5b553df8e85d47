//! HTTP/1.1 over a connection of the client's own: the request head written, the response head
//! read with `sluice_http::response_head` (shared by `raw`, which splices bodies, and `fetch`,
//! which reads whole ones).

use std::io::Write as _;

use bytes::BytesMut;
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
#[cfg(feature = "upstream-pool")]
pub async fn exchange<S>(
    socket: &mut S,
    head: &[u8],
) -> Result<(ResponseHead, bytes::Bytes), Exchange>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (head, rest) = exchange_in(socket, head).await?;
    Ok((head, rest.freeze()))
}

/// Writes the request head and reads the response head; the bytes after it are left in their
/// read buffer (see [`read_head_in`]).
pub async fn exchange_in<S>(
    socket: &mut S,
    head: &[u8],
) -> Result<(ResponseHead, BytesMut), Exchange>
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
    read_head_in(socket, BytesMut::with_capacity(8 * 1024)).await
}

/// Reads a response head that starts at `buf` (bytes already read) and continues on `socket`;
/// the bytes after the head are left in the buffer they came in (no copy), for a reader that may
/// find another head there (after an interim 1xx one).
pub async fn read_head_in<S>(
    socket: &mut S,
    mut buf: BytesMut,
) -> Result<(ResponseHead, BytesMut), Exchange>
where
    S: AsyncRead + Unpin,
{
    // Empty lines before a head are dropped as they come, counted against `MAX_HEAD`.
    let mut skipped = drop_empty_lines(&mut buf);
    // Bytes already read are parsed at once (they may hold a whole head).
    let mut complete = has_head_bytes(&buf);
    loop {
        if complete {
            #[cfg(test)]
            tests::HEAD_PARSES.with(|n| n.set(n.get() + 1));
            match response_head::parse(&buf) {
                Ok(Some(head)) => {
                    let _ = buf.split_to(head.len);
                    return Ok((head, buf));
                }
                Ok(None) => {}
                Err(e) => return Err(Exchange::Failed(e.to_string())),
            }
        }
        if buf.len() + skipped >= MAX_HEAD {
            return Err(Exchange::Failed(format!(
                "response head over {MAX_HEAD} bytes"
            )));
        }
        buf.reserve(8 * 1024);
        let before = buf.len();
        match socket.read_buf(&mut buf).await {
            Ok(0) if buf.is_empty() && skipped == 0 => return Err(Exchange::Closed),
            Ok(0) => {
                return Err(Exchange::Failed(
                    "connection closed inside the response head".into(),
                ))
            }
            Ok(_) => {}
            Err(e)
                if buf.is_empty()
                    && skipped == 0
                    && e.kind() == std::io::ErrorKind::ConnectionReset =>
            {
                return Err(Exchange::Closed)
            }
            Err(e) => return Err(Exchange::Failed(format!("reading the response head: {e}"))),
        }
        // A head ends at an empty line: LF LF, or LF CR LF (the parser takes bare LFs too). A
        // read that brought no such end, the two bytes before it included, leaves the head
        // incomplete, so it is not parsed again from its start: a head trickled a byte at a time
        // cost a parse of all of it per byte (quadratic, about 2e9 bytes scanned for 64 KiB).
        // A head's first read is parsed whatever it holds: bytes that are no HTTP at all (a TLS
        // alert from a port that speaks TLS) are refused at once, not after the header timeout.
        // The parser skips empty lines before a status line, so they are dropped first: kept,
        // LFs trickled one per read each looked like a head's end (\n\n), a parse of up to
        // 64 KiB per byte again.
        let fresh = !has_head_bytes(&buf[..before]);
        let dropped = drop_empty_lines(&mut buf);
        skipped += dropped;
        let before = before.saturating_sub(dropped);
        complete = has_head_bytes(&buf) && (fresh || ends_a_head(&buf[before.saturating_sub(2)..]));
    }
}

/// Drops the empty lines (`\r\n` or `\n`) `buf` starts with, as the parser skips them before a
/// status line; how many bytes went. A lone `\r` stays: the byte after it decides.
fn drop_empty_lines(buf: &mut BytesMut) -> usize {
    let mut n = 0;
    loop {
        match buf.get(n) {
            Some(b'\n') => n += 1,
            Some(b'\r') if buf.get(n + 1) == Some(&b'\n') => n += 2,
            _ => break,
        }
    }
    if n > 0 {
        bytes::Buf::advance(buf, n);
    }
    n
}

/// Whether `buf` (its empty lines dropped) holds a byte of a head: anything but nothing or the
/// `\r` that may start an empty line.
fn has_head_bytes(buf: &[u8]) -> bool {
    !buf.is_empty() && buf != b"\r"
}

/// Whether `bytes` hold the empty line that ends a head (`\n\n` or `\n\r\n`).
fn ends_a_head(bytes: &[u8]) -> bool {
    bytes.windows(2).enumerate().any(|(i, w)| {
        w[0] == b'\n' && (w[1] == b'\n' || (w[1] == b'\r' && bytes.get(i + 2) == Some(&b'\n')))
    })
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

    thread_local! {
        /// The parses of a response head `read_head_in` made on this thread.
        pub(super) static HEAD_PARSES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// A reader that gives one byte per read.
    struct Trickle(std::io::Cursor<Vec<u8>>);

    impl AsyncRead for Trickle {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            let mut byte = [0u8; 1];
            let n = std::io::Read::read(&mut self.0, &mut byte)?;
            buf.put_slice(&byte[..n]);
            std::task::Poll::Ready(Ok(()))
        }
    }

    /// A response head sent a byte per read is parsed at its first read and at its end, not
    /// once per read: parsing all of it again after every byte was quadratic. Bare-LF heads end
    /// as well, and what follows an interim head is parsed without a read.
    #[tokio::test]
    async fn a_head_sent_a_byte_at_a_time_is_parsed_at_its_end() {
        let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
        for i in 0..40 {
            head.extend_from_slice(format!("X-{i}: {}\r\n", "v".repeat(90)).as_bytes());
        }
        head.extend_from_slice(b"Content-Length: 2\r\n\r\n");
        let mut sent = head.clone();
        sent.extend_from_slice(b"ok");
        HEAD_PARSES.with(|n| n.set(0));
        let mut socket = Trickle(std::io::Cursor::new(sent));
        let Ok((got, early)) = read_head_in(&mut socket, BytesMut::new()).await else {
            panic!("no head")
        };
        let parses = HEAD_PARSES.with(std::cell::Cell::get);
        assert_eq!(got.status, http::StatusCode::OK);
        assert_eq!(got.len, head.len());
        assert_eq!(got.headers.len(), 41);
        assert!(early.is_empty());
        assert_eq!(parses, 2, "{} bytes read one at a time", head.len());

        // Bare LFs; an interim head whose read brought the final one's start too.
        let sent = b"HTTP/1.1 103 Early Hints\nLink: </a>\n\nHTTP/1.1 204 No Content\n\nrest";
        let mut socket = Trickle(std::io::Cursor::new(sent.to_vec()));
        let Ok((interim, rest)) = read_head_in(&mut socket, BytesMut::new()).await else {
            panic!("no interim head")
        };
        assert_eq!(interim.status, http::StatusCode::EARLY_HINTS);
        assert!(rest.is_empty());
        let Ok((last, early)) = read_head_in(&mut socket, rest).await else {
            panic!("no final head")
        };
        assert_eq!(last.status, http::StatusCode::NO_CONTENT);
        assert!(early.is_empty());
        let mut socket = std::io::Cursor::new(sent.to_vec());
        let Ok((interim, rest)) = read_head_in(&mut socket, BytesMut::new()).await else {
            panic!("no interim head")
        };
        assert_eq!(interim.status, http::StatusCode::EARLY_HINTS);
        HEAD_PARSES.with(|n| n.set(0));
        let Ok((last, early)) = read_head_in(&mut socket, rest).await else {
            panic!("no final head")
        };
        assert_eq!(last.status, http::StatusCode::NO_CONTENT);
        assert_eq!(&early[..], b"rest");
        assert_eq!(HEAD_PARSES.with(std::cell::Cell::get), 1);
    }

    /// Empty lines before a status line (which the parser skips) trickled a byte per read are
    /// dropped as they come: kept, every LF after the first made the last two bytes look like a
    /// head's end, a parse of everything read so far (up to 64 KiB) per byte. They count toward
    /// the head's bound.
    #[tokio::test]
    async fn empty_lines_trickled_before_a_head_are_not_parsed() {
        let mut sent = b"\n".repeat(2048);
        sent.extend_from_slice(&b"\r\n".repeat(1024));
        sent.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
        HEAD_PARSES.with(|n| n.set(0));
        let mut socket = Trickle(std::io::Cursor::new(sent));
        let Ok((got, early)) = read_head_in(&mut socket, BytesMut::new()).await else {
            panic!("no head")
        };
        assert_eq!(got.status, http::StatusCode::OK);
        assert!(early.is_empty());
        let parses = HEAD_PARSES.with(std::cell::Cell::get);
        assert!(
            parses <= 3,
            "{parses} parses for 4 KiB of empty lines and a head"
        );

        // A lone CR before a status line is still refused; empty lines alone are bounded.
        let mut socket = Trickle(std::io::Cursor::new(
            b"\r\n\rHTTP/1.1 200 OK\r\n\r\n".to_vec(),
        ));
        assert!(matches!(
            read_head_in(&mut socket, BytesMut::new()).await,
            Err(Exchange::Failed(_))
        ));
        let mut socket = std::io::Cursor::new(b"\n".repeat(MAX_HEAD + 1));
        match read_head_in(&mut socket, BytesMut::new()).await {
            Err(Exchange::Failed(detail)) => assert!(detail.contains("over"), "{detail}"),
            _ => panic!("64 KiB of empty lines read through"),
        }
        // Empty lines and then the end of the connection: not a connection closed unanswered.
        let mut socket = std::io::Cursor::new(b"\r\n\n".to_vec());
        assert!(matches!(
            read_head_in(&mut socket, BytesMut::new()).await,
            Err(Exchange::Failed(_))
        ));
    }

    #[test]
    fn ends_of_heads() {
        for (bytes, ends) in [
            (&b"\r\n\r\n"[..], true),
            (b"\n\n", true),
            (b"\n\r\n", true),
            (b"a\r\n", false),
            (b"\n\r", false),
            (b"\r\n\r", false),
            (b"", false),
        ] {
            assert_eq!(ends_a_head(bytes), ends, "{bytes:?}");
        }
    }

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
