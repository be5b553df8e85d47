//! Whole-body GETs for the gateway's own fetches (the playlist and the guide): one HTTP/1.1
//! exchange per hop on a fresh connection from the client's connector (address guard, proxy
//! routes, setup limit, TLS when built), redirects followed and bounded, the body read by
//! `Content-Length`, chunked coding or connection close, bounded in size, under the client's
//! header, idle-read and whole-body deadlines.
//!
//! Not the pooled client: these fetches happen minutes apart, so a kept-alive connection would
//! only sit idle, and the gateway-only build then needs neither hyper's client nor `url`.

use bytes::{Bytes, BytesMut};
use http::{header, HeaderMap, Method, StatusCode, Uri};
use sluice_http::chunked;
use sluice_http::response_head::{BodyLength, ResponseHead};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::connector::Conn;
use super::h1::{self, Exchange};
use super::{Upstream, UpstreamError};

/// A fetched response: head and whole body.
#[derive(Debug)]
pub struct Fetched {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Why a fetch failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("not an absolute http or https URL")]
    BadUrl,
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    #[error("upstream {host} sent nothing for {secs} s")]
    Idle { host: String, secs: u64 },
    #[error("upstream {host} did not finish the body within {secs} s")]
    Deadline { host: String, secs: u64 },
    #[error("upstream body larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("upstream {host} body: {detail}")]
    Body { host: String, detail: String },
}

/// Bytes no URL may carry as they are, percent-encoded before parsing the way browsers and
/// players send them (a playlist URL with a space or an accented letter in its path or query
/// is common); non-ASCII bytes are encoded too. A `%` stays as written.
const NOT_IN_URLS: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'<')
    .add(b'>')
    .add(b'\\')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}');

/// Checks that `url` can be fetched: absolute, `http` or `https`, with a host.
pub fn parse_url(url: &str) -> Result<Uri, FetchError> {
    let encoded = percent_encoding::utf8_percent_encode(url.trim(), NOT_IN_URLS).to_string();
    let uri: Uri = encoded.parse().map_err(|_| FetchError::BadUrl)?;
    let scheme_ok = matches!(uri.scheme_str(), Some("http" | "https"));
    if !scheme_ok || uri.host().is_none_or(str::is_empty) {
        return Err(FetchError::BadUrl);
    }
    Ok(uri)
}

/// `host[:port]` as the `Host` field carries it: the authority without user info.
fn host_field(uri: &Uri) -> String {
    let host = uri.host().unwrap_or("");
    match uri.port_u16() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_string(),
    }
}

/// Scheme, host and port: requests keep their credentials only while these stay the same.
fn origin(uri: &Uri) -> (Option<&str>, String, Option<u16>) {
    let default = if uri.scheme_str() == Some("https") {
        443
    } else {
        80
    };
    (
        uri.scheme_str(),
        uri.host().unwrap_or("").to_ascii_lowercase(),
        Some(uri.port_u16().unwrap_or(default)),
    )
}

impl Upstream {
    /// GETs `url` with `headers`, following redirects, and reads the whole body, refusing more
    /// than `limit` bytes. Any status is returned; the caller decides what it accepts.
    pub async fn fetch(
        &self,
        url: &str,
        mut headers: HeaderMap,
        limit: usize,
    ) -> Result<Fetched, FetchError> {
        let mut uri = parse_url(url)?;
        // Kept across redirects, as on the pooled client's requests: a playlist or guide URL
        // that leads back to this sluice must show it (`guard::LOOP_HEADER`).
        headers.insert(super::guard::LOOP_HEADER, super::guard::loop_mark().clone());
        let mut redirects = 0;
        // One time-to-headers deadline for every hop, as for the pooled client's requests
        // (`relay`): reset at each redirect, a fetch and its `max_redirects` hops had a header
        // timeout each.
        let deadline = tokio::time::Instant::now() + self.header_timeout;
        loop {
            let host = uri.host().unwrap_or("").to_string();
            let (head, conn, early) = self.exchange(&uri, &headers, deadline).await?;
            let location = head.headers.get(header::LOCATION);
            let redirect = matches!(head.status.as_u16(), 301 | 302 | 303 | 307 | 308);
            let (true, Some(location)) = (redirect, location) else {
                // A total deadline too: the idle one is reset by every byte.
                let body = tokio::time::timeout(
                    self.whole_body_timeout,
                    self.read_body(&head, conn, early, limit, &host),
                )
                .await
                .map_err(|_| FetchError::Deadline {
                    host: host.clone(),
                    secs: self.whole_body_timeout.as_secs(),
                })??;
                return Ok(Fetched {
                    status: head.status,
                    headers: head.headers,
                    body,
                });
            };
            let bad = || UpstreamError::bad_redirect(host.clone(), location.as_bytes());
            let text = location.to_str().map_err(|_| bad())?;
            let next = sluice_http::location::resolve(&uri, text).map_err(|_| bad())?;
            redirects += 1;
            if redirects > self.max_redirects {
                return Err(UpstreamError::TooManyRedirects {
                    host,
                    limit: self.max_redirects,
                }
                .into());
            }
            if origin(&next) != origin(&uri) {
                for name in super::CREDENTIAL_FIELDS {
                    headers.remove(name);
                }
                // A `Host` given for the first origin named that origin; the request head
                // writes the new one's only when the field is absent.
                headers.remove(http::header::HOST);
            }
            uri = next;
        }
    }

    /// Connects, sends the request and reads the response head (skipping interim 1xx heads) by
    /// `deadline`, the fetch's time-to-headers deadline: the wait for a setup slot and the
    /// connect count against it too.
    async fn exchange(
        &self,
        uri: &Uri,
        headers: &HeaderMap,
        deadline: tokio::time::Instant,
    ) -> Result<(ResponseHead, Conn, Bytes), UpstreamError> {
        let host = uri.host().unwrap_or("").to_string();
        let target = uri.path_and_query().map_or("/", |pq| pq.as_str());
        let head = h1::request_head(
            &Method::GET,
            target,
            &host_field(uri),
            headers,
            &self.user_agent,
            true,
        );
        self.metrics.requests.inc();
        let timed_out = || UpstreamError::HeaderTimeout {
            host: host.clone(),
            secs: self.header_timeout.as_secs(),
        };
        let mut conn = tokio::time::timeout_at(deadline, self.connector.open(uri))
            .await
            .map_err(|_| timed_out())??;
        let protocol = |detail: String| UpstreamError::Protocol {
            host: host.clone(),
            detail,
        };
        let exchange = async {
            let (head, rest) = h1::exchange_in(&mut conn, &head).await?;
            past_interim(&mut conn, head, rest).await
        };
        let got = tokio::time::timeout_at(deadline, exchange)
            .await
            .map_err(|_| timed_out())?;
        match got {
            Ok((head, early)) => Ok((head, conn, early)),
            Err(Exchange::Closed) => {
                Err(protocol("connection closed before a response head".into()))
            }
            Err(Exchange::Failed(detail)) => Err(protocol(detail)),
        }
    }

    /// Reads the body after `head`: `early` came with the head, the rest from `conn`.
    async fn read_body(
        &self,
        head: &ResponseHead,
        mut conn: Conn,
        early: Bytes,
        limit: usize,
        host: &str,
    ) -> Result<Bytes, FetchError> {
        let body_err = |detail: String| FetchError::Body {
            host: host.to_string(),
            detail,
        };
        let length = head
            .body_length(false)
            .map_err(|e| body_err(e.to_string()))?;
        let mut out = Vec::new();
        match length {
            BodyLength::Empty => {}
            BodyLength::Exact(n) => {
                if n > limit as u64 {
                    return Err(FetchError::TooLarge { limit });
                }
                let n = n as usize;
                // What the origin claims, up to a first MiB: the rest grows as bytes arrive.
                out.reserve_exact(n.min(1 << 20));
                let mut input = early;
                loop {
                    let take = input.len().min(n - out.len());
                    out.extend_from_slice(&input[..take]);
                    if out.len() == n {
                        break;
                    }
                    input = self.read_some(&mut conn, host).await?;
                    if input.is_empty() {
                        return Err(body_err(format!(
                            "connection closed after {} of {n} bytes",
                            out.len()
                        )));
                    }
                }
            }
            BodyLength::Coded => {
                if !chunked_only(&head.headers) {
                    return Err(body_err("transfer coding other than chunked".to_string()));
                }
                let mut decoder = chunked::Decoder::new();
                let mut input = early;
                loop {
                    decoder
                        .decode(&input, &mut out)
                        .map_err(|e| body_err(e.to_string()))?;
                    if out.len() > limit {
                        return Err(FetchError::TooLarge { limit });
                    }
                    if decoder.is_done() {
                        break;
                    }
                    input = self.read_some(&mut conn, host).await?;
                    if input.is_empty() {
                        return Err(body_err("connection closed inside a chunked body".into()));
                    }
                }
            }
            BodyLength::UntilClose => {
                let mut input = early;
                loop {
                    if out.len() + input.len() > limit {
                        return Err(FetchError::TooLarge { limit });
                    }
                    out.extend_from_slice(&input);
                    input = self.read_some(&mut conn, host).await?;
                    if input.is_empty() {
                        break;
                    }
                }
            }
        }
        Ok(Bytes::from(out))
    }

    /// The next bytes from `conn` (empty at its end), within the idle-read deadline; counted.
    async fn read_some<S: AsyncRead + Unpin>(
        &self,
        conn: &mut S,
        host: &str,
    ) -> Result<Bytes, FetchError> {
        let mut buf = BytesMut::with_capacity(16 * 1024);
        let read = tokio::time::timeout(self.idle_timeout, conn.read_buf(&mut buf))
            .await
            .map_err(|_| FetchError::Idle {
                host: host.to_string(),
                secs: self.idle_timeout.as_secs(),
            })?
            .map_err(|e| FetchError::Body {
                host: host.to_string(),
                detail: e.to_string(),
            })?;
        self.metrics.bytes.inc_by(read as u64);
        Ok(buf.freeze())
    }
}

/// Interim heads answering one request: real origins send one or two (`103 Early Hints`); a
/// stream of them is an origin that never answers, refused at once rather than at the header
/// deadline.
const MAX_INTERIM_HEADS: usize = 1024;

/// The final head after `head` (skipped while interim, 1xx), read from `rest` (the bytes after
/// `head`) and then `conn`; with the body bytes that came with it. Each head is split off the
/// front of one buffer: copying the bytes after every interim head into a new one cost a read
/// of many small 103 heads a copy of up to its whole length per head.
async fn past_interim<S: AsyncRead + Unpin>(
    conn: &mut S,
    mut head: ResponseHead,
    mut rest: BytesMut,
) -> Result<(ResponseHead, Bytes), Exchange> {
    let mut interim = 0;
    while head.status.is_informational() {
        if head.status == StatusCode::SWITCHING_PROTOCOLS {
            return Err(Exchange::Failed("unasked protocol switch".into()));
        }
        interim += 1;
        if interim > MAX_INTERIM_HEADS {
            return Err(Exchange::Failed(format!(
                "more than {MAX_INTERIM_HEADS} informational responses"
            )));
        }
        (head, rest) = h1::read_head_in(conn, rest).await?;
    }
    Ok((head, rest.freeze()))
}

/// Whether `Transfer-Encoding` is exactly `chunked` (the only coding read here).
fn chunked_only(headers: &HeaderMap) -> bool {
    let mut codings = headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("?").split(','))
        .map(str::trim)
        .filter(|c| !c.is_empty());
    codings
        .next()
        .is_some_and(|c| c.eq_ignore_ascii_case("chunked"))
        && codings.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_origins() {
        assert!(parse_url("http://h.example/p?q").is_ok());
        assert!(parse_url("https://u:p@h.example:8443/").is_ok());
        for bad in [
            "ftp://h/",
            "/relative",
            "http://",
            "h.example/x",
            "http://h b/a",
            "http://h\u{e9}.example/",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
        // Spaces, quotes and non-ASCII in the path or query are sent encoded; `%XX` as written.
        assert_eq!(
            parse_url("http://h/a b/\"c\".m3u?n=caf\u{e9}&x=%41").unwrap(),
            "http://h/a%20b/%22c%22.m3u?n=caf%C3%A9&x=%41"
        );
        let a = parse_url("http://H.example/x").unwrap();
        assert_eq!(
            origin(&a),
            origin(&parse_url("http://h.example:80/y").unwrap())
        );
        assert_ne!(
            origin(&a),
            origin(&parse_url("https://h.example/x").unwrap())
        );
        assert_ne!(
            origin(&a),
            origin(&parse_url("http://h.example:81/x").unwrap())
        );
        assert_eq!(
            host_field(&parse_url("http://u:p@h.example:8080/x").unwrap()),
            "h.example:8080"
        );
        let mut te = HeaderMap::new();
        te.append(header::TRANSFER_ENCODING, "Chunked".parse().unwrap());
        assert!(chunked_only(&te));
        te.append(header::TRANSFER_ENCODING, "gzip".parse().unwrap());
        assert!(!chunked_only(&te));
    }

    /// Interim heads are split off the buffer they came in: the final head's body bytes are
    /// where the first read put them, not in a copy made after each interim head (500 heads in
    /// one read were 500 copies of what followed them). Past the bound, an error.
    #[tokio::test]
    async fn interim_heads_are_skipped_without_copies_and_bounded() {
        let body = b"the body";
        let mut sent = b"HTTP/1.1 103 Early Hints\r\n\r\n".repeat(500);
        sent.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n");
        sent.extend_from_slice(body);
        let buf = BytesMut::from(&sent[..]);
        let at = buf.as_ptr() as usize;
        let mut nothing = tokio::io::empty();
        let Ok((first, rest)) = h1::read_head_in(&mut nothing, buf).await else {
            panic!("no first head")
        };
        let Ok((last, early)) = past_interim(&mut nothing, first, rest).await else {
            panic!("no final head")
        };
        assert_eq!(last.status, StatusCode::OK);
        assert_eq!(&early[..], body);
        assert_eq!(
            early.as_ptr() as usize,
            at + sent.len() - body.len(),
            "the body bytes were copied"
        );

        let mut flood = b"HTTP/1.1 103 Early Hints\r\n\r\n".repeat(MAX_INTERIM_HEADS + 1);
        flood.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
        let Ok((first, rest)) = h1::read_head_in(&mut nothing, BytesMut::from(&flood[..])).await
        else {
            panic!("no first head")
        };
        match past_interim(&mut nothing, first, rest).await {
            Err(Exchange::Failed(detail)) => assert!(detail.contains("informational"), "{detail}"),
            _ => panic!("a flood of interim heads was read through"),
        }
    }
}
