//! Splits the bytes of an RTSP control connection into items: a response, a request from the
//! server, or a `$`-framed interleaved packet (RFC 2326 §10.12). Nothing is copied for frames:
//! the caller gets the payload's range in its own buffer.

use std::ops::Range;

/// Bounds on what one item may occupy; anything larger is an error, never a wait.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Start line plus headers.
    pub max_head: usize,
    /// `Content-Length` of a message body (an SDP is a few KiB).
    pub max_body: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_head: 16 * 1024,
            max_body: 64 * 1024,
        }
    }
}

/// Why the stream cannot be parsed; the connection is unusable after any of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RtspError {
    #[error("message head larger than {0} bytes")]
    HeadTooLarge(usize),
    #[error("message body of {0} bytes is larger than the limit of {1}")]
    BodyTooLarge(usize, usize),
    #[error("malformed start line {0:?}")]
    StartLine(String),
    #[error("malformed header line {0:?}")]
    HeaderLine(String),
    #[error("malformed Content-Length {0:?}")]
    ContentLength(String),
    #[error("unexpected byte 0x{0:02x} where a message or an interleaved frame should start")]
    Garbage(u8),
}

/// A parsed response or server request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Status code of a response; 0 for a request.
    pub status: u16,
    /// Reason phrase of a response, method of a request.
    pub text: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Message {
    /// The first header of that name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Every header of that name, in order.
    pub fn headers_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.headers
            .iter()
            .filter(move |(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn cseq(&self) -> Option<u32> {
        self.header("CSeq").and_then(|v| v.trim().parse().ok())
    }

    pub fn is_request(&self) -> bool {
        self.status == 0
    }
}

/// One item from the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// Interleaved binary data on `channel`; the payload is `buf[payload]`.
    Frame {
        channel: u8,
        payload: Range<usize>,
    },
    Message(Message),
}

/// What [`next_item`] found at the start of the buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// An item, and how many bytes of the buffer it took.
    Item(Item, usize),
    /// The item is not all there (and so far within the limits): a parse before the buffer
    /// holds at least this many bytes cannot finish it. Once a message's head (or a frame's
    /// header) is in, this is the item's whole length, so a caller that waits for it parses
    /// a body that trickles in twice, not once per read.
    NeedMore(usize),
}

impl Next {
    /// The item and its length; `None` when more bytes are needed.
    pub fn into_item(self) -> Option<(Item, usize)> {
        match self {
            Next::Item(item, used) => Some((item, used)),
            Next::NeedMore(_) => None,
        }
    }
}

/// Parses the item at the start of `buf`: the item and how many bytes it took, or how many
/// bytes the buffer must hold before it can be had (see [`Next::NeedMore`]).
pub fn next_item(buf: &[u8], limits: Limits) -> Result<Next, RtspError> {
    next_item_resumed(buf, limits, &mut 0)
}

/// As [`next_item`], for a caller that keeps `scanned` between the parses of one item: how
/// many bytes at the start of `buf` are known to hold no end of the item's head. Start each
/// item at 0; it is set back to 0 when an item is returned. A head that comes a byte per read
/// is then searched once, from where the last search stopped, not again from its start on
/// every read (16 KiB sent a byte at a time was ~134 M bytes searched, ~0.5 s of CPU).
pub fn next_item_resumed(
    buf: &[u8],
    limits: Limits,
    scanned: &mut usize,
) -> Result<Next, RtspError> {
    let next = parse_item(buf, limits, scanned)?;
    if let Next::Item(..) = next {
        *scanned = 0;
    }
    Ok(next)
}

fn parse_item(buf: &[u8], limits: Limits, scanned: &mut usize) -> Result<Next, RtspError> {
    // Until the head is complete, nothing says how long the item is: one more byte.
    let more = Next::NeedMore(buf.len() + 1);
    let Some(&first) = buf.first() else {
        return Ok(more);
    };
    if first == b'$' {
        if buf.len() < 4 {
            return Ok(Next::NeedMore(4));
        }
        let len = u16::from_be_bytes([buf[2], buf[3]]) as usize;
        if buf.len() < 4 + len {
            return Ok(Next::NeedMore(4 + len));
        }
        let item = Item::Frame {
            channel: buf[1],
            payload: 4..4 + len,
        };
        return Ok(Next::Item(item, 4 + len));
    }
    if !first.is_ascii_alphabetic() {
        return Err(RtspError::Garbage(first));
    }
    // A search that found no end examined every newline with the two bytes after it in; the
    // last three bytes it saw are looked at again, for an end cut short by that read.
    let from = (*scanned).min(buf.len()).saturating_sub(3);
    let Some((head_len, body_start)) = find_head_end(buf, limits.max_head, from)? else {
        *scanned = buf.len();
        return Ok(more);
    };
    let head = String::from_utf8_lossy(&buf[..head_len]);
    let mut lines = head.split('\n').map(|l| l.trim_end_matches('\r'));
    let start = lines.next().unwrap_or_default();
    let (status, text) = start_line(start)?;
    let mut headers: Vec<(String, String)> = Vec::new();
    for line in lines {
        if line.is_empty() {
            continue;
        }
        if line.starts_with([' ', '\t']) {
            // An obsolete folded continuation: part of the previous header's value.
            match headers.last_mut() {
                Some((_, v)) => {
                    v.push(' ');
                    v.push_str(line.trim());
                }
                None => return Err(RtspError::HeaderLine(clip(line))),
            }
            continue;
        }
        let (k, v) = line
            .split_once(':')
            .ok_or_else(|| RtspError::HeaderLine(clip(line)))?;
        let k = k.trim();
        if k.is_empty() || k.contains(' ') {
            return Err(RtspError::HeaderLine(clip(line)));
        }
        headers.push((k.to_string(), v.trim().to_string()));
    }
    let body_len = match headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("Content-Length"))
    {
        Some((_, v)) => v
            .trim()
            .parse::<usize>()
            .map_err(|_| RtspError::ContentLength(clip(v)))?,
        None => 0,
    };
    if body_len > limits.max_body {
        return Err(RtspError::BodyTooLarge(body_len, limits.max_body));
    }
    let total = body_start + body_len;
    if buf.len() < total {
        return Ok(Next::NeedMore(total));
    }
    let message = Message {
        status,
        text,
        headers,
        body: buf[body_start..total].to_vec(),
    };
    Ok(Next::Item(Item::Message(message), total))
}

/// Where the head ends (before the blank line) and where the body starts; accepts bare `\n`.
/// The search starts at `from`: no end lies before it.
fn find_head_end(
    buf: &[u8],
    max_head: usize,
    from: usize,
) -> Result<Option<(usize, usize)>, RtspError> {
    let window = &buf[..buf.len().min(max_head + 4)];
    let mut i = from.min(window.len());
    #[cfg(test)]
    tests::SCANNED.with(|s| s.set(s.get() + window.len() - i));
    while let Some(at) = memchr::memchr(b'\n', &window[i..]) {
        let nl = i + at;
        let rest = &window[nl + 1..];
        if rest.first() == Some(&b'\n') {
            return Ok(Some((nl, nl + 2)));
        }
        if rest.starts_with(b"\r\n") {
            return Ok(Some((nl, nl + 3)));
        }
        if rest.len() < 2 && buf.len() <= max_head {
            // The next bytes decide whether this is the end; wait for them.
            return Ok(None);
        }
        i = nl + 1;
    }
    if buf.len() > max_head {
        return Err(RtspError::HeadTooLarge(max_head));
    }
    Ok(None)
}

/// `RTSP/1.0 200 OK` gives (200, "OK"); `OPTIONS rtsp://… RTSP/1.0` gives (0, "OPTIONS").
fn start_line(line: &str) -> Result<(u16, String), RtspError> {
    let bad = || RtspError::StartLine(clip(line));
    if let Some(rest) = line.strip_prefix("RTSP/") {
        let mut parts = rest.splitn(3, ' ');
        let _version = parts.next().ok_or_else(bad)?;
        let code = parts.next().ok_or_else(bad)?;
        if code.len() != 3 {
            return Err(bad());
        }
        let status: u16 = code.parse().map_err(|_| bad())?;
        if !(100..=999).contains(&status) {
            return Err(bad());
        }
        return Ok((status, parts.next().unwrap_or("").trim().to_string()));
    }
    let mut parts = line.split(' ');
    let method = parts.next().ok_or_else(bad)?;
    let _uri = parts.next().ok_or_else(bad)?;
    let version = parts.next().ok_or_else(bad)?;
    if !version.starts_with("RTSP/")
        || !method.bytes().all(|b| b.is_ascii_alphabetic() || b == b'_')
    {
        return Err(bad());
    }
    Ok((0, method.to_string()))
}

/// At most 64 characters of offending input go into an error.
fn clip(s: &str) -> String {
    s.chars().take(64).collect()
}

#[cfg(test)]
#[path = "message/tests.rs"]
mod tests;
