//! The HTTP/1.1 fast path's writer for a whole `Response<Body>` (a caching route's answer): the
//! head as hyper's server writes it, then the body counted, chunked when its length is unknown,
//! or, for a memory-tier hit whose slices are file-backed (`cache::shm::FileBody`), as file
//! ranges handed to `sendfile(2)`, so the stored bytes reach the socket without a copy.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::atomic::Counter;
use bytes::Bytes;
use futures_util::FutureExt;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body::Body as _;
use http_body_util::BodyExt;
use tokio::io::{AsyncWriteExt, Interest};

use super::fast::{write_head, FastClient};
use crate::body::Body;
use crate::cache::shm::{FileBody, Piece};
use crate::cache::StoredHead;
use crate::server::date;
use crate::upstream::h1::push_field as field;

/// A frame up to this size goes out in one write with what precedes it (the head, a chunk
/// header); a larger one is written on its own rather than copied.
const JOIN_MAX: usize = 16 * 1024;
/// At most this many body frames go into one vectored write (well under `IOV_MAX`).
const GATHER_MAX: usize = 64;

/// How the body is framed on the wire.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Framing {
    /// No body (HEAD, 1xx, 204, 304).
    None,
    Length(u64),
    Chunked,
}

/// Where the body bytes written are counted as they go out (a send timeout drops the writer):
/// all of them, and those sent with `sendfile`; `body` counts this response's (its access log
/// line).
#[derive(Clone, Copy)]
pub struct Meters<'a> {
    pub sent: &'a Counter,
    pub sendfile: &'a Counter,
    pub body: &'a AtomicU64,
}

impl Meters<'_> {
    fn count(&self, n: u64) {
        self.sent.inc_by(n);
        self.body.fetch_add(n, Ordering::Relaxed);
    }
}

/// Writes `resp` to `client`. `head_only` for a HEAD request; `close` adds `Connection: close`.
/// File pieces go through `sendfile` when the client is a plain socket. Returns whether the
/// response went out complete (the connection may carry another request).
pub async fn write_response<W: FastClient>(
    client: &mut W,
    resp: Response<Body>,
    head_only: bool,
    close: bool,
    meters: Meters<'_>,
) -> bool {
    let (mut parts, body) = resp.into_parts();
    let status = parts.status;
    let files = parts.extensions.remove::<FileBody>();
    let (out, framing) = match parts.extensions.remove::<StoredHead>() {
        // A whole hit: the stored head's bytes, not a map made and written per answer.
        Some(stored) if !head_only => (stored_head(&stored, close), Framing::Length(stored.length)),
        _ => {
            let framing = framing(status, head_only, &mut parts.headers, &body);
            let mut out = Vec::with_capacity(512);
            write_head(&mut out, status.as_u16(), &parts.headers, None, close);
            (out, framing)
        }
    };
    let result = match framing {
        Framing::None => client.write_all(&out).await,
        Framing::Length(n) => match files.filter(|f| f.total() == n && client.socket().is_some()) {
            Some(f) => send_pieces(client, out, f, meters).await,
            None => send_counted(client, out, body, n, meters).await,
        },
        Framing::Chunked => send_frames(client, out, body, None, meters).await,
    };
    match result {
        Ok(()) => client.flush().await.is_ok(),
        Err(e) => {
            tracing::debug!(error = %e, "fast path: cached response cut");
            false
        }
    }
}

/// A whole hit's head from its stored bytes: as `write_head` writes the same answer's map (the
/// stored fields, then `Age`, `Cache-Status`, `Connection: close` when closing, and `Date`
/// unless stored).
fn stored_head(stored: &StoredHead, close: bool) -> Vec<u8> {
    use std::io::Write;
    let mut out = Vec::with_capacity(stored.fields.len() + 160);
    out.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    out.extend_from_slice(&stored.fields);
    let _ = write!(out, "age: {}\r\n", stored.age);
    field(&mut out, "cache-status", stored.cache_status.as_bytes());
    if close {
        field(&mut out, "connection", b"close");
    }
    if !stored.has_date {
        date::with_text(|d| field(&mut out, "date", d.as_bytes()));
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// The body's framing, with the head's fields made to say it (as hyper would).
fn framing(
    status: StatusCode,
    head_only: bool,
    headers: &mut http::HeaderMap,
    body: &Body,
) -> Framing {
    if status.is_informational() || status == StatusCode::NO_CONTENT {
        // No body and no framing fields, whatever the method (RFC 9110 §8.6, RFC 9112 §6.1),
        // as `fast::map_head` writes a relayed one.
        headers.remove(header::CONTENT_LENGTH);
        headers.remove(header::TRANSFER_ENCODING);
        return Framing::None;
    }
    if head_only && headers.contains_key(header::TRANSFER_ENCODING) {
        // The fields describe the GET answer: its coding is kept, and never a length beside it
        // (RFC 9112 §6.2), as `fast::map_head` writes a relayed one.
        headers.remove(header::CONTENT_LENGTH);
        return Framing::None;
    }
    if status == StatusCode::NOT_MODIFIED {
        // No body, and (as hyper writes them) no length either (a 304's would be the length of
        // a body it does not have) but on the answer to HEAD; `fast::map_head` writes a relayed
        // one so too.
        if !head_only {
            headers.remove(header::CONTENT_LENGTH);
            headers.remove(header::TRANSFER_ENCODING);
        }
        return Framing::None;
    }
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if head_only {
        // The fields describe the GET answer. One sluice made itself (an error) says its own
        // body's length, as hyper writes it.
        if declared.is_none() {
            if let Some(n) = body.size_hint().exact().filter(|n| *n > 0) {
                headers.insert(header::CONTENT_LENGTH, n.into());
            }
        }
        return Framing::None;
    }
    headers.remove(header::TRANSFER_ENCODING);
    if let Some(n) = declared {
        return Framing::Length(n);
    }
    if let Some(n) = body.size_hint().exact() {
        headers.insert(header::CONTENT_LENGTH, n.into());
        return Framing::Length(n);
    }
    headers.remove(header::CONTENT_LENGTH);
    headers.insert(
        header::TRANSFER_ENCODING,
        HeaderValue::from_static("chunked"),
    );
    Framing::Chunked
}

/// Writes `pending` and then `data`, in one write when `data` is small.
async fn write_after<W: FastClient>(
    client: &mut W,
    pending: &mut Vec<u8>,
    data: &[u8],
) -> io::Result<()> {
    if data.len() <= JOIN_MAX {
        pending.extend_from_slice(data);
        client.write_all(pending).await?;
    } else {
        if !pending.is_empty() {
            client.write_all(pending).await?;
        }
        client.write_all(data).await?;
    }
    pending.clear();
    Ok(())
}

/// The body's frames, counted (`Some(n)`: at most `n` bytes, and exactly that to be complete)
/// or chunked; `meters` count the body bytes as they go out.
async fn send_frames<W: FastClient>(
    client: &mut W,
    mut pending: Vec<u8>,
    mut body: Body,
    length: Option<u64>,
    meters: Meters<'_>,
) -> io::Result<()> {
    let mut sent = 0u64;
    loop {
        // What is ready goes out with what precedes it; a body that must wait (a fill still
        // reading the origin) gets the head, or the chunk so far, sent first (as hyper does).
        let next = match body.frame().now_or_never() {
            Some(next) => next,
            None => {
                if !pending.is_empty() {
                    client.write_all(&pending).await?;
                    pending.clear();
                }
                body.frame().await
            }
        };
        let frame = match next {
            None => break,
            Some(Ok(f)) => f,
            Some(Err(e)) => return Err(io::Error::other(e.to_string())),
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        match length {
            Some(n) if sent + data.len() as u64 > n => {
                return Err(io::Error::other("body longer than its length"));
            }
            Some(_) => {}
            None => pending.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes()),
        }
        write_after(client, &mut pending, &data).await?;
        sent += data.len() as u64;
        meters.count(data.len() as u64);
        if length.is_none() {
            pending.extend_from_slice(b"\r\n");
        }
    }
    if length.is_none() {
        pending.extend_from_slice(b"0\r\n\r\n");
    }
    if !pending.is_empty() {
        client.write_all(&pending).await?;
    }
    match length {
        Some(n) if sent != n => Err(io::Error::other("body shorter than its length")),
        _ => Ok(()),
    }
}

/// A counted body: what is ready goes out at once with what precedes it (the head) in vectored
/// writes, none of it copied (a hit from memory: the head and every slice in as few `writev`s
/// as the socket takes); a body that must wait (a fill still reading the origin) has what it
/// gave so far written first. The body must be exactly `length` bytes to be complete.
async fn send_counted<W: FastClient>(
    client: &mut W,
    mut head: Vec<u8>,
    mut body: Body,
    length: u64,
    meters: Meters<'_>,
) -> io::Result<()> {
    let mut sent = 0u64;
    let mut ready: Vec<Bytes> = Vec::new();
    loop {
        let mut ended = false;
        // Everything ready now, up to a bounded batch.
        while ready.len() < GATHER_MAX {
            let next = match body.frame().now_or_never() {
                Some(next) => next,
                None if head.is_empty() && ready.is_empty() => body.frame().await,
                None => break,
            };
            match next {
                None => {
                    ended = true;
                    break;
                }
                Some(Err(e)) => return Err(io::Error::other(e.to_string())),
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    if data.is_empty() {
                        continue;
                    }
                    sent += data.len() as u64;
                    if sent > length {
                        return Err(io::Error::other("body longer than its length"));
                    }
                    ready.push(data);
                }
            }
        }
        write_gathered(client, &head, &ready, meters).await?;
        head.clear();
        ready.clear();
        if ended {
            break;
        }
    }
    if sent != length {
        return Err(io::Error::other("body shorter than its length"));
    }
    Ok(())
}

/// Writes `head` and then `bufs` with vectored writes, counting the body bytes of each write.
async fn write_gathered<W: FastClient>(
    client: &mut W,
    head: &[u8],
    bufs: &[Bytes],
    meters: Meters<'_>,
) -> io::Result<()> {
    // The bytes of `head` not yet written, then those of `bufs[at]` from `off` onwards.
    let mut head_left = head.len();
    let (mut at, mut off) = (0, 0);
    // On the stack: a write takes the head and up to `IOV` slices; the rest go in later ones.
    const IOV: usize = 16;
    let mut iov = [io::IoSlice::new(&[]); IOV + 1];
    while head_left > 0 || at < bufs.len() {
        let mut k = 0;
        if head_left > 0 {
            iov[k] = io::IoSlice::new(&head[head.len() - head_left..]);
            k += 1;
        }
        for (i, b) in bufs[at..].iter().take(IOV).enumerate() {
            iov[k] = io::IoSlice::new(if i == 0 { &b[off..] } else { b });
            k += 1;
        }
        let mut n = client.write_vectored(&iov[..k]).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "write sent nothing",
            ));
        }
        let from_head = n.min(head_left);
        head_left -= from_head;
        n -= from_head;
        meters.count(n as u64);
        while n > 0 {
            let left = bufs[at].len() - off;
            if n < left {
                off += n;
                n = 0;
            } else {
                n -= left;
                at += 1;
                off = 0;
            }
        }
    }
    Ok(())
}

/// The pieces of a memory-tier hit: bytes written, file ranges sent with `sendfile`.
async fn send_pieces<W: FastClient>(
    client: &mut W,
    mut pending: Vec<u8>,
    body: FileBody,
    meters: Meters<'_>,
) -> io::Result<()> {
    for piece in body.pieces {
        match piece {
            Piece::Bytes(b) => {
                write_after(client, &mut pending, &b).await?;
                meters.count(b.len() as u64);
            }
            Piece::File { file, offset, len } => {
                if !pending.is_empty() {
                    client.write_all(&pending).await?;
                    pending.clear();
                }
                send_file(&*client, file.raw_fd(), (offset, len), meters).await?;
            }
        }
    }
    if !pending.is_empty() {
        client.write_all(&pending).await?;
    }
    Ok(())
}

/// Sends `len` bytes of `fd` from `offset` into the client's socket, waiting for room as a
/// write would; the connection's send watch hears of stalls and progress, the meters of every
/// call's bytes.
async fn send_file<W: FastClient>(
    client: &W,
    fd: RawFd,
    (mut offset, len): (u64, u64),
    meters: Meters<'_>,
) -> io::Result<()> {
    let Some(sock) = client.socket() else {
        return Err(io::Error::other("no client socket to send a file into"));
    };
    let end = offset + len;
    while offset < end {
        let want = (end - offset).min(1 << 30) as usize;
        let r = sock.try_io(Interest::WRITABLE, || {
            let mut off = offset as libc::off_t;
            // SAFETY: both descriptors are open (the socket borrowed, the file held by the
            // caller's piece); `off` is a valid in-out pointer.
            let n = unsafe { libc::sendfile(sock.as_raw_fd(), fd, &mut off, want) };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as u64)
            }
        });
        match r {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "sendfile sent nothing",
                ))
            }
            Ok(n) => {
                offset += n;
                meters.count(n);
                meters.sendfile.inc_by(n);
                client.wrote();
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                client.write_blocked();
                sock.writable().await?;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(fields: &[(&str, &str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (k, v) in fields {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn framing_follows_the_response() {
        let streaming = || {
            crate::body::boxed(http_body_util::StreamBody::new(futures_util::stream::iter(
                Vec::<Result<http_body::Frame<bytes::Bytes>, crate::body::BoxError>>::new(),
            )))
        };
        let mut h = headers(&[("content-length", "10")]);
        assert_eq!(
            framing(StatusCode::OK, false, &mut h, &streaming()),
            Framing::Length(10)
        );
        let mut h = headers(&[]);
        assert_eq!(
            framing(StatusCode::OK, false, &mut h, &crate::body::full("abc")),
            Framing::Length(3)
        );
        assert_eq!(h.get("content-length").unwrap(), "3");
        let mut h = headers(&[]);
        assert_eq!(
            framing(StatusCode::OK, false, &mut h, &streaming()),
            Framing::Chunked
        );
        assert_eq!(h.get("transfer-encoding").unwrap(), "chunked");
        let mut h = headers(&[("content-length", "10")]);
        assert_eq!(
            framing(StatusCode::OK, true, &mut h, &crate::body::empty()),
            Framing::None
        );
        assert_eq!(h.get("content-length").unwrap(), "10");
        // Never a length beside a coding (RFC 9112 §6.2): the coding is kept.
        for status in [StatusCode::OK, StatusCode::NOT_MODIFIED] {
            let mut h = headers(&[("content-length", "10"), ("transfer-encoding", "chunked")]);
            assert_eq!(
                framing(status, true, &mut h, &crate::body::empty()),
                Framing::None
            );
            assert!(h.get("content-length").is_none(), "{status}");
            assert_eq!(h.get("transfer-encoding").unwrap(), "chunked", "{status}");
        }
        let mut h = headers(&[("etag", "\"a\""), ("content-length", "12")]);
        assert_eq!(
            framing(
                StatusCode::NOT_MODIFIED,
                false,
                &mut h,
                &crate::body::empty()
            ),
            Framing::None
        );
        assert!(h.get("content-length").is_none());
        let mut h = headers(&[("content-length", "0")]);
        assert_eq!(
            framing(StatusCode::NO_CONTENT, false, &mut h, &crate::body::empty()),
            Framing::None
        );
        assert!(h.get("content-length").is_none());
        // A HEAD answered 204 with a coding a route added: no framing field at all (RFC 9112
        // §6.1), as a relayed one is written.
        let mut h = headers(&[("content-length", "5"), ("transfer-encoding", "chunked")]);
        assert_eq!(
            framing(StatusCode::NO_CONTENT, true, &mut h, &crate::body::empty()),
            Framing::None
        );
        assert!(h.get("content-length").is_none() && h.get("transfer-encoding").is_none());
        // A HEAD answered with an error sluice made says its body's length.
        let mut h = headers(&[]);
        assert_eq!(
            framing(
                StatusCode::BAD_GATEWAY,
                true,
                &mut h,
                &crate::body::full("origin down")
            ),
            Framing::None
        );
        assert_eq!(h.get("content-length").unwrap(), "11");
    }
}
