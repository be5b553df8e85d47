//! What serving one HTTP/2 request costs a server's protocol layer, five ways, over h2c on one
//! thread, each answering every GET with the same 1 KB body:
//! - `hyper`: hyper's HTTP/2 server over the h2 crate (sluice's patched copy), with the settings
//!   sluice's listener uses; the answer a `Full` body, as a handler gives it.
//! - `frames`: a minimal server of sluice's own over the same h2's codec (its frame reader and
//!   writer and HPACK): SETTINGS, PING, WINDOW_UPDATE, RST_STREAM and GOAWAY handled, each
//!   request's HEADERS answered by a HEADERS and a DATA frame within both flow-control windows.
//!   No request bodies (a stream that sends one is reset), no priorities, no limits: the floor
//!   of what a front end of sluice's own would pay for frames, HPACK and stream bookkeeping.
//! - `tasks`: `frames` in the shape a front end of sluice's own would take: each request made an
//!   `http::Request` (as h2 makes it), handed to a task of its own that calls the handler (an
//!   `async fn` giving a `Response` with a `Full` body, as in `hyper`), and the answer sent back
//!   to the connection's task over a channel, which frames it.
//! - `h2inline`, `h2tasks`: h2's own server (its stream store, flow control and limits) without
//!   hyper, each request answered inside the connection's task or from a task per stream.
//!
//! `h2-frontend-cost <hyper|frames|tasks|h2inline|h2tasks> PORT` serves until killed. Count with callgrind while h2load
//! loads it (the command is in `docs/decisions/tls-cost.md`, "An HTTP/2 front end of sluice's
//! own: the probe"):
//! `valgrind --tool=callgrind target/release/h2-frontend-cost frames 18443`, then
//! `h2load -c1 -m10 -n 200` to warm, `callgrind_control -z`, `h2load -c1 -m10 -n 2000`,
//! `callgrind_control -d`, and divide the dump's total by 2,000.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::future::poll_fn;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{FutureExt, Stream};
use h2::frame::{self, Frame, Headers, Pseudo, Settings, StreamId};
use http::header::{HeaderMap, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const BODY_LEN: usize = 1024;
/// RFC 9113's initial flow-control window.
const DEFAULT_WINDOW: i64 = 65_535;

fn body() -> Bytes {
    Bytes::from((0..BODY_LEN).map(|i| (i % 251) as u8).collect::<Vec<u8>>())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (mode, port) = match (args.get(1), args.get(2).and_then(|p| p.parse::<u16>().ok())) {
        (Some(m), Some(p))
            if ["hyper", "frames", "tasks", "h2inline", "h2tasks"].contains(&m.as_str()) =>
        {
            (m.clone(), p)
        }
        _ => {
            eprintln!("usage: h2-frontend-cost <hyper|frames|tasks> PORT");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let listener = TcpListener::bind(("127.0.0.1", port)).await.expect("bind");
        let body = body();
        loop {
            let (sock, _) = listener.accept().await.expect("accept");
            sock.set_nodelay(true).expect("nodelay");
            let body = body.clone();
            if mode == "hyper" {
                tokio::spawn(serve_hyper(sock, body));
            } else if mode.starts_with("h2") {
                tokio::spawn(serve_h2(sock, body, mode == "h2tasks"));
            } else {
                let tasks = mode == "tasks";
                tokio::spawn(async move {
                    if let Err(e) = serve_frames(sock, body, tasks).await {
                        eprintln!("connection: {e}");
                    }
                });
            }
        }
    });
}

#[derive(Clone, Copy)]
struct Spawn;

impl<F> hyper::rt::Executor<F> for Spawn
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        tokio::spawn(fut);
    }
}

/// The handler both `hyper` and `tasks` call.
async fn handle<B>(_req: Request<B>, body: Bytes) -> Response<Full<Bytes>> {
    Response::builder()
        .header(CONTENT_TYPE, "application/octet-stream")
        .header(CONTENT_LENGTH, BODY_LEN)
        .body(Full::new(body))
        .expect("response")
}

/// hyper's server with sluice's HTTP/2 settings (`server.rs`, `http_builder`).
async fn serve_hyper(sock: TcpStream, body: Bytes) {
    let service = hyper::service::service_fn(move |req| {
        let body = body.clone();
        async move { Ok::<_, Infallible>(handle(req, body).await) }
    });
    let mut builder = hyper::server::conn::http2::Builder::new(Spawn);
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .max_concurrent_streams(100)
        .enable_connect_protocol()
        .auto_date_header(false)
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .adaptive_window(true);
    let _ = builder
        .serve_connection(hyper_util::rt::TokioIo::new(sock), service)
        .await;
}

/// h2's own server (its stream store, flow control and limits) without hyper: each request
/// answered inline in the connection's task (`h2inline`) or from a task per stream (`h2tasks`).
async fn serve_h2(sock: TcpStream, body: Bytes, tasks: bool) {
    let mut builder = h2::server::Builder::new();
    builder
        .max_concurrent_streams(100)
        .enable_connect_protocol();
    let Ok(mut conn) = builder.handshake::<_, Bytes>(sock).await else {
        return;
    };
    while let Some(Ok((req, mut respond))) = conn.accept().await {
        let body = body.clone();
        let answer = move |req: Request<h2::RecvStream>| async move {
            let (head, _) = handle(req, body.clone()).await.into_parts();
            let Ok(mut send) = respond.send_response(Response::from_parts(head, ()), false) else {
                return;
            };
            let _ = send.send_data(body, true);
        };
        if tasks {
            tokio::spawn(answer(req));
        } else {
            answer(req).now_or_never();
        }
    }
}

/// One connection of the minimal server.
struct Conn {
    /// Our send window on the connection and the initial one for new streams.
    send_window: i64,
    initial_window: i64,
    /// Open streams and their send windows.
    streams: HashMap<StreamId, i64>,
    /// Streams whose answer waits to be written, oldest first.
    answer: VecDeque<StreamId>,
    /// SETTINGS acks, PING acks and resets to write before answers.
    control: VecDeque<Frame<Bytes>>,
    fields: HeaderMap,
    body: Bytes,
    going_away: bool,
    /// `tasks`: answers come back from each stream's task on this channel.
    tasks: Option<Answers>,
    /// `tasks`: answers ready to frame, by stream.
    ready: HashMap<StreamId, (HeaderMap, StatusCode, Bytes)>,
}

type Answers = (
    mpsc::UnboundedSender<(StreamId, Response<Full<Bytes>>)>,
    mpsc::UnboundedReceiver<(StreamId, Response<Full<Bytes>>)>,
);

/// The request in a HEADERS frame, as h2's server makes it (`Peer::convert_poll_message`).
fn request_of(head: Headers) -> Result<Request<()>, String> {
    let (pseudo, fields) = head.into_parts();
    let mut parts = http::uri::Parts::default();
    if let Some(scheme) = pseudo.scheme {
        parts.scheme = Some(http::uri::Scheme::try_from(&*scheme).map_err(|e| e.to_string())?);
    }
    if let Some(authority) = pseudo.authority {
        parts.authority = Some(
            http::uri::Authority::from_maybe_shared(Bytes::copy_from_slice(authority.as_ref()))
                .map_err(|e| e.to_string())?,
        );
    }
    if let Some(path) = pseudo.path {
        parts.path_and_query = Some(
            http::uri::PathAndQuery::from_maybe_shared(Bytes::copy_from_slice(path.as_ref()))
                .map_err(|e| e.to_string())?,
        );
    }
    let mut req = Request::new(());
    *req.method_mut() = pseudo.method.ok_or("no :method")?;
    *req.uri_mut() = http::Uri::from_parts(parts).map_err(|e| e.to_string())?;
    *req.version_mut() = http::Version::HTTP_2;
    *req.headers_mut() = fields;
    Ok(req)
}

impl Conn {
    fn recv(&mut self, frame: Frame) -> Result<(), String> {
        match frame {
            Frame::Headers(h) => {
                let id = h.stream_id();
                if !h.is_end_stream() {
                    self.control
                        .push_back(frame::Reset::new(id, h2::Reason::REFUSED_STREAM).into());
                    return Ok(());
                }
                self.streams.insert(id, self.initial_window);
                self.answer.push_back(id);
                if let Some((tx, _)) = &self.tasks {
                    let req = request_of(h)?;
                    let (tx, body) = (tx.clone(), self.body.clone());
                    tokio::spawn(async move {
                        let _ = tx.send((id, handle(req, body).await));
                    });
                }
            }
            Frame::Data(d) => {
                let id = d.stream_id();
                if self.streams.remove(&id).is_some() {
                    self.answer.retain(|s| *s != id);
                }
                self.control
                    .push_back(frame::Reset::new(id, h2::Reason::REFUSED_STREAM).into());
            }
            Frame::Settings(s) => {
                if s.is_ack() {
                    return Ok(());
                }
                if let Some(w) = s.initial_window_size() {
                    let delta = i64::from(w) - self.initial_window;
                    self.initial_window = i64::from(w);
                    for window in self.streams.values_mut() {
                        *window += delta;
                    }
                }
                self.control.push_back(Settings::ack().into());
            }
            Frame::Ping(p) => {
                if !p.is_ack() {
                    self.control
                        .push_back(frame::Ping::pong(p.into_payload()).into());
                }
            }
            Frame::WindowUpdate(w) => {
                let inc = i64::from(w.size_increment());
                if w.stream_id().is_zero() {
                    self.send_window += inc;
                } else if let Some(window) = self.streams.get_mut(&w.stream_id()) {
                    *window += inc;
                }
            }
            Frame::Reset(r) => {
                let id = r.stream_id();
                self.streams.remove(&id);
                self.answer.retain(|s| *s != id);
            }
            Frame::GoAway(_) => self.going_away = true,
            Frame::Priority(_) => {}
            Frame::PushPromise(_) => return Err("a client sent PUSH_PROMISE".into()),
        }
        Ok(())
    }
}

async fn serve_frames(mut sock: TcpStream, body: Bytes, tasks: bool) -> Result<(), String> {
    let mut preface = [0u8; 24];
    sock.read_exact(&mut preface)
        .await
        .map_err(|e| e.to_string())?;
    if preface != PREFACE {
        return Err("not an HTTP/2 preface".into());
    }
    let mut codec: h2::Codec<TcpStream, Bytes> = h2::Codec::new(sock);
    let mut ours = Settings::default();
    ours.set_max_concurrent_streams(Some(100));
    let mut fields = HeaderMap::new();
    fields.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    fields.insert(CONTENT_LENGTH, HeaderValue::from(BODY_LEN));
    let mut conn = Conn {
        send_window: DEFAULT_WINDOW,
        initial_window: DEFAULT_WINDOW,
        streams: HashMap::new(),
        answer: VecDeque::new(),
        control: VecDeque::from([Frame::from(ours)]),
        fields,
        body,
        going_away: false,
        tasks: tasks.then(mpsc::unbounded_channel),
        ready: HashMap::new(),
    };
    poll_fn(|cx| loop {
        // Everything the client sent that is here.
        let mut ended = false;
        loop {
            match Pin::new(&mut codec).poll_next(cx) {
                Poll::Ready(Some(Ok(frame))) => conn.recv(frame)?,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e.to_string())),
                Poll::Ready(None) => {
                    ended = true;
                    break;
                }
                Poll::Pending => break,
            }
        }
        // Answers the streams' tasks have made.
        if let Some((_, rx)) = &mut conn.tasks {
            while let Poll::Ready(Some((id, resp))) = rx.poll_recv(cx) {
                let (parts, body) = resp.into_parts();
                let data =
                    futures_util::FutureExt::now_or_never(http_body_util::BodyExt::collect(body))
                        .expect("a full body is ready")
                        .expect("infallible")
                        .to_bytes();
                conn.ready.insert(id, (parts.headers, parts.status, data));
            }
        }
        // Control frames, then every answer both windows allow.
        let mut wrote = false;
        while !conn.control.is_empty() || !conn.answer.is_empty() {
            match codec.poll_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e.to_string())),
                Poll::Pending => break,
            }
            if let Some(f) = conn.control.pop_front() {
                codec.buffer(f).map_err(|e| format!("{e:?}"))?;
                wrote = true;
                continue;
            }
            let id = conn.answer[0];
            let answer = if conn.tasks.is_some() {
                match conn.ready.remove(&id) {
                    Some(a) => a,
                    None => break,
                }
            } else {
                (conn.fields.clone(), StatusCode::OK, conn.body.clone())
            };
            let len = answer.2.len() as i64;
            let window = conn.streams.get(&id).copied().unwrap_or(0);
            if window < len || conn.send_window < len {
                if conn.tasks.is_some() {
                    conn.ready.insert(id, answer);
                }
                break;
            }
            conn.answer.pop_front();
            conn.streams.remove(&id);
            conn.send_window -= len;
            let (fields, status, data) = answer;
            let mut head = Headers::new(id, Pseudo::response(status), fields);
            head.set_end_headers();
            codec.buffer(head.into()).map_err(|e| format!("{e:?}"))?;
            let mut data = frame::Data::new(id, data);
            data.set_end_stream(true);
            codec.buffer(data.into()).map_err(|e| format!("{e:?}"))?;
            wrote = true;
        }
        match codec.flush(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e.to_string())),
            Poll::Pending => return Poll::Pending,
        }
        if ended || (conn.going_away && conn.answer.is_empty()) {
            return Poll::Ready(Ok(()));
        }
        if !wrote {
            return Poll::Pending;
        }
    })
    .await
}
