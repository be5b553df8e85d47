//! Engine sessions shared by viewers: one engine session and one reader per content id, a bounded
//! broadcast buffer, viewers as reader positions, linger after the last one, then `stop`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::StatusCode;
use http_body::Frame;
use http_body_util::BodyExt;
use serde::Serialize;
use sluice_media::acestream::{self as engine_api, AceError, Content, EngineSession, EngineStat};
use tokio::sync::{broadcast, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use url::Url;

use super::AcestreamConfig;
use crate::error::{ProxyError, Side};
use crate::net::per_ip::network_of;
use crate::upstream::relay::RelayBody;
use crate::upstream::{Upstream, UpstreamError, UpstreamRequest, UpstreamResponse};

/// MPEG-TS packet size: chunks are cut on packet boundaries so a viewer that skips ahead resumes
/// on a whole packet.
const TS_PACKET: usize = 188;
/// Typical chunk size, used to size the broadcast buffer in chunks.
const CHUNK_ESTIMATE: usize = 16 * 1024;
/// Largest engine API answer read.
const MAX_API_BYTES: usize = 64 * 1024;
/// Longest `/proxy/acestream/status` waits for one session's engine statistics (all are asked at
/// once): a hanging engine leaves them out rather than holding the call.
const STAT_TIMEOUT: Duration = Duration::from_secs(2);

/// How a session delivers: one MPEG-TS byte stream, or the engine's HLS playlist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Stream,
    Hls,
}

/// Every open engine session.
pub struct Sessions {
    /// The engine's client: it may reach private addresses, so it is only ever given URLs on the
    /// configured engine ([`Sessions::send`]).
    upstream: Upstream,
    engine: Url,
    config: AcestreamConfig,
    map: Mutex<HashMap<String, Arc<Session>>>,
    /// Sessions closed while their start was still asking the engine: out of `map` (no viewer
    /// finds them), but the engine's session lives until its start answers and sends `stop`, so
    /// they count toward `max_sessions` and their opener's share until then. Locked under `map`
    /// and `Session::start` when added (map -> start -> closing, never the reverse).
    closing: Mutex<Vec<Arc<Session>>>,
    /// Linger tasks running now, at most one per session (tests check it).
    linger_tasks: Arc<AtomicUsize>,
}

struct Session {
    key: String,
    kind: Kind,
    content: Content,
    /// The client that opened it, by [`network_of`]: what the per-client share counts.
    client: IpAddr,
    /// Set (under the map lock) once another client joins: the session is then no longer its
    /// opener's to answer for, and leaves its share (as the IPTV hub forgets its starter).
    shared: AtomicBool,
    /// Asking the engine for the session, and its answer: asked once, by a task of its own.
    start: Mutex<Start>,
    /// Woken when `start` gets its answer.
    answered: Notify,
    /// Changed only under the map lock, so joining and the linger check never race.
    viewers: AtomicUsize,
    tx: broadcast::Sender<Bytes>,
    /// Largest piece sent into `tx`, whole packets: its slots times this stay within
    /// `buffer_bytes`, whatever the size of the engine's body frames.
    piece: usize,
    /// Cancelled when the session ends, from either side.
    closed: CancellationToken,
    /// Set by whichever side closes first, so the engine is told to stop once.
    stopping: AtomicBool,
    /// Set while the session's one linger task runs: a departure then starts no other, since
    /// that task re-reads `touched` and so covers it.
    lingering: AtomicBool,
    bytes: AtomicU64,
    /// Chunks viewers skipped because they fell more than the buffer behind.
    skipped: AtomicU64,
    opened: Instant,
    /// For HLS sessions: the last playlist request.
    touched: Mutex<Instant>,
}

/// Where asking the engine for a session stands.
struct Start {
    state: StartState,
    /// Whether the engine was told to stop the session (once).
    stop_sent: bool,
}

enum StartState {
    NotAsked,
    Asking,
    Answered(Result<EngineSession, ProxyError>),
}

impl Session {
    /// The engine's session, once it has answered with one.
    fn engine(&self) -> Option<EngineSession> {
        match &lock(&self.start).state {
            StartState::Answered(Ok(engine)) => Some(engine.clone()),
            _ => None,
        }
    }
}

/// What `/proxy/acestream/status` reports per session.
#[derive(Debug, Serialize)]
pub struct SessionReport {
    pub content: String,
    pub kind: &'static str,
    pub viewers: usize,
    pub bytes: u64,
    pub skipped_chunks: u64,
    pub age_secs: u64,
    pub engine: Option<EngineStat>,
}

impl Sessions {
    /// `upstream` must be allowed to reach the engine (it usually sits on a private address).
    pub fn new(upstream: Upstream, config: &AcestreamConfig) -> anyhow::Result<Arc<Self>> {
        Ok(Arc::new(Sessions {
            upstream,
            engine: Url::parse(&config.engine_url)?,
            config: config.clone(),
            map: Mutex::new(HashMap::new()),
            closing: Mutex::new(Vec::new()),
            linger_tasks: Arc::new(AtomicUsize::new(0)),
        }))
    }

    /// Joins (or opens, for `client`) the stream session for `content` as one more viewer.
    pub async fn join(
        self: &Arc<Self>,
        content: &Content,
        kind: Kind,
        client: IpAddr,
    ) -> Result<Viewer, ProxyError> {
        let session = self.enter(content, kind, client)?;
        let guard = ViewerGuard {
            sessions: self.clone(),
            session: session.clone(),
        };
        // Subscribed before the reader starts, so the first viewer misses nothing.
        let rx = session.tx.subscribe();
        self.ensure_started(&session).await?;
        Ok(Viewer {
            rx,
            closed: session.closed.clone(),
            session,
            _guard: guard,
        })
    }

    /// Opens or refreshes the HLS session for `content`; the engine's playlist URL.
    pub async fn touch_hls(
        self: &Arc<Self>,
        content: &Content,
        client: IpAddr,
    ) -> Result<String, ProxyError> {
        let session = self.enter(content, Kind::Hls, client)?;
        // An HLS player holds no connection: count it as a viewer only while this request runs,
        // and let the linger timer measure from its last refresh.
        let guard = ViewerGuard {
            sessions: self.clone(),
            session: session.clone(),
        };
        *lock(&session.touched) = Instant::now();
        let started = self.ensure_started(&session).await?;
        drop(guard);
        Ok(started.playback_url)
    }

    fn enter(
        self: &Arc<Self>,
        content: &Content,
        kind: Kind,
        client: IpAddr,
    ) -> Result<Arc<Session>, ProxyError> {
        let key = format!("{}:{}", kind_label(kind), content.key());
        let client = network_of(client);
        let mut map = lock(&self.map);
        let session = match map.get(&key) {
            Some(s) if !s.closed.is_cancelled() => {
                // Joining an open session is always allowed, whoever opened it.
                if s.client != client {
                    s.shared.store(true, Ordering::SeqCst);
                }
                s.clone()
            }
            _ => {
                map.retain(|_, s| {
                    let open = !s.closed.is_cancelled();
                    if !open {
                        self.retire(s);
                    }
                    open
                });
                self.make_room(&mut map, client)?;
                let capacity = (self.config.buffer_bytes / CHUNK_ESTIMATE).max(16);
                // The channel rounds its slots up to a power of two.
                let slots = capacity.next_power_of_two();
                let piece =
                    (self.config.buffer_bytes / slots / TS_PACKET * TS_PACKET).max(TS_PACKET);
                let (tx, _) = broadcast::channel(capacity);
                let s = Arc::new(Session {
                    key: key.clone(),
                    kind,
                    content: content.clone(),
                    client,
                    shared: AtomicBool::new(false),
                    start: Mutex::new(Start {
                        state: StartState::NotAsked,
                        stop_sent: false,
                    }),
                    answered: Notify::new(),
                    viewers: AtomicUsize::new(0),
                    tx,
                    piece,
                    closed: CancellationToken::new(),
                    stopping: AtomicBool::new(false),
                    lingering: AtomicBool::new(false),
                    bytes: AtomicU64::new(0),
                    skipped: AtomicU64::new(0),
                    opened: Instant::now(),
                    touched: Mutex::new(Instant::now()),
                });
                map.insert(key, s.clone());
                s
            }
        };
        session.viewers.fetch_add(1, Ordering::SeqCst);
        Ok(session)
    }

    /// Frees a place for one more session opened by `client`, or refuses. One client holds at
    /// most half the pool, so touching many ids cannot take every session from the others; what
    /// it holds is what it opened that no other client has joined. When its share or the pool is
    /// full, its session idle longest with no viewer is closed at once rather than refusing: a
    /// viewer zapping through channels keeps zapping and merely loses the linger of those it
    /// left. Only when every session it holds has a viewer is it refused. Sessions closed while
    /// still starting count until their start has answered and stopped them (`closing`), and a
    /// session still starting is never closed for room: the engine's session would outlive it
    /// unstopped until the engine answers, so hanging up and asking again would open engine
    /// sessions past the pool at the rate of requests.
    fn make_room(
        self: &Arc<Self>,
        map: &mut HashMap<String, Arc<Session>>,
        client: IpAddr,
    ) -> Result<(), ProxyError> {
        let share = (self.config.max_sessions / 2).max(1);
        let holds = |s: &Session| s.client == client && !s.shared.load(Ordering::SeqCst);
        loop {
            let (closing, closing_own) = {
                let closing = lock(&self.closing);
                (closing.len(), closing.iter().filter(|s| holds(s)).count())
            };
            let own: Vec<&Arc<Session>> = map.values().filter(|s| holds(s)).collect();
            if map.len() + closing < self.config.max_sessions && own.len() + closing_own < share {
                return Ok(());
            }
            // Viewers change only under the map lock (held here), so none can join it now. An
            // HLS session has a viewer only while a playlist request runs: between a player's
            // reloads it counts as watched until its linger is over (when it closes itself), or
            // two players behind one address, at a full pool, would close each other's channel
            // at every reload.
            let linger = Duration::from_secs(self.config.linger_secs);
            let idle = own
                .into_iter()
                .filter(|s| s.viewers.load(Ordering::SeqCst) == 0)
                .filter(|s| !matches!(lock(&s.start).state, StartState::Asking))
                .filter(|s| s.kind != Kind::Hls || lock(&s.touched).elapsed() >= linger)
                .min_by_key(|s| *lock(&s.touched))
                .cloned();
            let Some(idle) = idle else {
                return Err(ProxyError::downstream(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "acestream_sessions",
                    "all Acestream sessions are in use (media.acestream.max_sessions)",
                ));
            };
            map.remove(&idle.key);
            self.retire(&idle);
            if idle.stopping.swap(true, Ordering::SeqCst) {
                continue;
            }
            idle.closed.cancel();
            tracing::info!(session = %idle.key, "closed early: its client needs the place");
            // The map lock is held: the engine hears `stop` from a task.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let sessions = self.clone();
                rt.spawn(async move { sessions.stop_engine(&idle).await });
            }
        }
    }

    /// The engine's answer for the session, asked once. The asking runs in a task of its own,
    /// so a viewer who hangs up meanwhile cancels nothing: an engine session the engine opened
    /// is always known, and so told to stop.
    async fn ensure_started(
        self: &Arc<Self>,
        session: &Arc<Session>,
    ) -> Result<EngineSession, ProxyError> {
        loop {
            // Registered before looking, so an answer in between is not missed.
            let answered = session.answered.notified();
            let mut answered = std::pin::pin!(answered);
            answered.as_mut().enable();
            {
                let mut start = lock(&session.start);
                match &start.state {
                    StartState::Answered(result) => return result.clone(),
                    StartState::Asking => {}
                    StartState::NotAsked => {
                        start.state = StartState::Asking;
                        tokio::spawn(self.clone().start(session.clone()));
                    }
                }
            }
            answered.await;
        }
    }

    /// Asks the engine for the session and records its answer; the stream kind also starts its
    /// reader. A session closed while the engine was answering (its viewers gone, its linger
    /// over, its place taken) found nothing to stop then: its engine session is stopped now.
    async fn start(self: Arc<Self>, session: Arc<Session>) {
        // Should the asking panic (or the runtime drop the task), its waiters get an error
        // instead of waiting for an answer that never comes.
        let unanswered = Unanswered(&self, &session);
        let result = self
            .open_engine_session(&session.content, session.kind)
            .await;
        std::mem::forget(unanswered);
        let closed_meanwhile = {
            let mut start = lock(&session.start);
            start.state = StartState::Answered(result.clone());
            // Under the lock `stop_engine` reads the answer with: either it saw the answer, or
            // this sees the `stopping` set before it.
            session.stopping.load(Ordering::SeqCst)
        };
        session.answered.notify_waiters();
        match result {
            Err(_) => {
                session.closed.cancel();
                self.forget(&session);
                self.retired(&session);
            }
            Ok(_) if closed_meanwhile => {
                tracing::debug!(session = %session.key, "closed while starting: engine told to stop");
                self.stop_engine(&session).await;
                self.retired(&session);
            }
            Ok(engine) => {
                if session.kind == Kind::Stream {
                    self.read(session, engine).await;
                }
            }
        }
    }

    async fn open_engine_session(
        &self,
        content: &Content,
        kind: Kind,
    ) -> Result<EngineSession, ProxyError> {
        let path = match kind {
            Kind::Stream => "/ace/getstream",
            Kind::Hls => "/ace/manifest.m3u8",
        };
        let mut url = self
            .engine
            .join(path)
            .map_err(|e| ProxyError::internal(e.to_string()))?;
        let (name, value) = content.engine_param();
        // One player id per session: the engine ties its playback session to it.
        let pid = format!(
            "sluice-{}",
            super::super::generate::random_iv()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        url.query_pairs_mut()
            .append_pair("format", "json")
            .append_pair(name, value)
            .append_pair("pid", &pid);
        let body = self.fetch(url).await?;
        let mut session = engine_api::parse_session(&body).map_err(|e| match &e {
            // A well-formed id the engine does not know (or cannot find): the client's to fix.
            AceError::Engine(said) if content_not_found(said) => {
                ProxyError::downstream(StatusCode::NOT_FOUND, "acestream_content", e.to_string())
            }
            // Any other error is the engine's own failure (out of space, shutting down, ...).
            _ => engine_error(e.to_string()),
        })?;
        session.playback_url = self.on_engine(&session.playback_url)?;
        session.stat_url = self.on_engine(&session.stat_url)?;
        session.command_url = self.on_engine(&session.command_url)?;
        Ok(session)
    }

    /// An engine-given URL, forced onto the configured engine's scheme, host and port: the
    /// engine's answer cannot send the proxy anywhere else (it may also name itself by an
    /// address only it can reach, e.g. inside a container).
    fn on_engine(&self, given: &str) -> Result<String, ProxyError> {
        let given = Url::parse(given)
            .or_else(|_| self.engine.join(given))
            .map_err(|e| engine_error(format!("bad URL from the engine: {e}")))?;
        let mut url = self.engine.clone();
        url.set_path(given.path());
        url.set_query(given.query());
        Ok(url.to_string())
    }

    /// Whether `url` is HLS playback on the engine while an HLS session is open: the engine's
    /// origin, and a path under its playback prefixes (`/ace/m/`: the playlists; `/ace/c/`: the
    /// segments its playlists name). Nothing else on the engine (its API: new sessions,
    /// statistics, commands) is reached this way, whoever's playlist names it.
    pub fn is_engine(&self, url: &Url) -> bool {
        if url.origin() != self.engine.origin() {
            return false;
        }
        let path = url.path();
        if !(path.starts_with("/ace/m/") || path.starts_with("/ace/c/")) {
            return false;
        }
        let map = lock(&self.map);
        map.values()
            .any(|s| s.kind == Kind::Hls && !s.closed.is_cancelled() && s.engine().is_some())
    }

    /// Sends `req` through the engine's client, which the address guard does not stop: only a
    /// URL of an open HLS session on the engine (`is_engine`) is sent, and a redirect elsewhere
    /// is not followed.
    pub async fn send(&self, req: UpstreamRequest) -> Result<UpstreamResponse, UpstreamError> {
        if !self.is_engine(&req.url) {
            return Err(UpstreamError::RedirectRefused {
                host: req.url.host_str().unwrap_or("").to_string(),
            });
        }
        self.upstream
            .relay(req, RelayBody::Empty, &|next: &Url| self.is_engine(next))
            .await
    }

    /// An engine API call (fixed paths sluice builds itself): sent through the engine's client,
    /// redirects only on the engine.
    async fn send_api(&self, req: UpstreamRequest) -> Result<UpstreamResponse, UpstreamError> {
        let engine = self.engine.origin();
        if req.url.origin() != engine {
            return Err(UpstreamError::RedirectRefused {
                host: req.url.host_str().unwrap_or("").to_string(),
            });
        }
        self.upstream
            .relay(req, RelayBody::Empty, &|next: &Url| next.origin() == engine)
            .await
    }

    async fn fetch(&self, url: Url) -> Result<Bytes, ProxyError> {
        let up = self
            .send_api(UpstreamRequest::get(url))
            .await
            .map_err(|e| ProxyError::from_upstream(&e))?;
        if !up.status.is_success() {
            return Err(engine_error(format!("engine answered {}", up.status)));
        }
        up.body
            .collect_limited(MAX_API_BYTES)
            .await
            .map_err(|e| engine_error(e.to_string()))
    }

    /// The one upstream reader of a stream session: engine bytes, cut on packet boundaries, into
    /// the broadcast buffer until the engine ends or the session is closed.
    async fn read(self: Arc<Self>, session: Arc<Session>, engine: EngineSession) {
        let result = async {
            let url = Url::parse(&engine.playback_url).map_err(|e| e.to_string())?;
            let up = self
                .send_api(UpstreamRequest::get(url))
                .await
                .map_err(|e| e.to_string())?;
            if !up.status.is_success() {
                return Err(format!("engine playback answered {}", up.status));
            }
            let mut body = std::pin::pin!(up.body);
            let mut carry = BytesMut::new();
            loop {
                let frame = tokio::select! {
                    _ = session.closed.cancelled() => return Ok(()),
                    f = body.frame() => f,
                };
                let Some(frame) = frame else { return Ok(()) };
                let Ok(data) = frame.map_err(|e| e.to_string())?.into_data() else {
                    continue;
                };
                publish(&session, &mut carry, &data);
            }
        }
        .await;
        if let Err(e) = result {
            tracing::warn!(session = %session.key, error = %e, "Acestream playback ended");
        }
        self.close(&session).await;
    }

    /// Ends a session: viewers finish their buffered bytes, the engine is told to stop.
    async fn close(&self, session: &Arc<Session>) {
        if session.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        session.closed.cancel();
        self.forget(session);
        self.stop_engine(session).await;
    }

    /// Tells the engine to stop a session it started, once (callers set `stopping` first). One
    /// still starting is stopped by its start, when the engine answers.
    async fn stop_engine(&self, session: &Session) {
        let command_url = {
            let mut guard = lock(&session.start);
            let start = &mut *guard;
            match &start.state {
                StartState::Answered(Ok(engine)) if !start.stop_sent => {
                    start.stop_sent = true;
                    engine.command_url.clone()
                }
                _ => return,
            }
        };
        if let Ok(mut url) = Url::parse(&command_url) {
            url.query_pairs_mut().append_pair("method", "stop");
            if let Err(e) = self.fetch(url).await {
                tracing::debug!(session = %session.key, error = %e.message, "engine stop failed");
            }
        }
    }

    fn forget(&self, session: &Arc<Session>) {
        let mut map = lock(&self.map);
        if map
            .get(&session.key)
            .is_some_and(|s| Arc::ptr_eq(s, session))
        {
            map.remove(&session.key);
            self.retire(session);
        }
    }

    /// Called (under the map lock) for a session just taken out of the map: one whose start is
    /// still asking the engine goes to `closing`, where it counts until its start is answered.
    /// Checked and added under the start lock, so the start cannot answer in between and leave
    /// it there for good.
    fn retire(&self, session: &Arc<Session>) {
        let start = lock(&session.start);
        if matches!(start.state, StartState::Asking) {
            lock(&self.closing).push(session.clone());
        }
    }

    /// A session's start has answered (and stopped an engine session it found closed): it no
    /// longer counts in `closing`.
    fn retired(&self, session: &Arc<Session>) {
        lock(&self.closing).retain(|s| !Arc::ptr_eq(s, session));
    }

    /// Sessions closed while starting whose engine session is not yet stopped.
    #[cfg(test)]
    fn closing(&self) -> usize {
        lock(&self.closing).len()
    }

    /// A viewer left; after the linger, a session nobody rejoined is closed.
    fn left(self: &Arc<Self>, session: &Arc<Session>) {
        let now_empty = {
            let _map = lock(&self.map);
            session.viewers.fetch_sub(1, Ordering::SeqCst) == 1
        };
        if now_empty {
            // The linger runs from the last departure (or, for HLS, the last refresh).
            *lock(&session.touched) = Instant::now();
        }
        if !now_empty || session.closed.is_cancelled() {
            return;
        }
        // Every HLS refresh is a departure: without this, each one added a task that lived as
        // long as the session, so a day of refreshes left tens of thousands on one session.
        if session.lingering.swap(true, Ordering::SeqCst) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            session.lingering.store(false, Ordering::SeqCst);
            return;
        };
        let alive = LingerTask::new(&self.linger_tasks);
        rt.spawn(self.clone().linger(session.clone(), alive));
    }

    /// The session's one linger task: closes it once it has had no viewer and no refresh for
    /// `linger_secs`; stands down when a viewer rejoins.
    async fn linger(self: Arc<Self>, session: Arc<Session>, _alive: LingerTask) {
        let linger = Duration::from_secs(self.config.linger_secs);
        loop {
            let since = *lock(&session.touched);
            tokio::select! {
                _ = session.closed.cancelled() => return,
                _ = tokio::time::sleep_until(since + linger) => {}
            }
            let (empty, expired) = {
                let _map = lock(&self.map);
                let empty = session.viewers.load(Ordering::SeqCst) == 0;
                (empty, empty && lock(&session.touched).elapsed() >= linger)
            };
            if expired {
                self.close(&session).await;
                return;
            }
            if empty {
                continue;
            }
            // Rejoined: the next viewer to leave starts the timer again. A viewer who left
            // between the check above and clearing the flag saw it still set and started
            // nothing, so look once more after clearing it and carry on for them.
            session.lingering.store(false, Ordering::SeqCst);
            if session.viewers.load(Ordering::SeqCst) > 0
                || session.closed.is_cancelled()
                || session.lingering.swap(true, Ordering::SeqCst)
            {
                return;
            }
        }
    }

    /// Linger tasks running now.
    #[cfg(test)]
    fn linger_tasks(&self) -> usize {
        self.linger_tasks.load(Ordering::SeqCst)
    }

    /// Every open session (or the one for `only`), with the engine's statistics: asked for all
    /// sessions at once, each for at most [`STAT_TIMEOUT`].
    pub async fn report(&self, only: Option<&Content>) -> Vec<SessionReport> {
        let sessions: Vec<Arc<Session>> = lock(&self.map)
            .values()
            .filter(|s| only.is_none_or(|c| &s.content == c))
            .cloned()
            .collect();
        let stats = futures_util::future::join_all(sessions.iter().map(|s| self.stat(s))).await;
        let mut out = Vec::with_capacity(sessions.len());
        for (s, engine) in sessions.into_iter().zip(stats) {
            out.push(SessionReport {
                content: s.content.key(),
                kind: kind_label(s.kind),
                viewers: s.viewers.load(Ordering::SeqCst),
                bytes: s.bytes.load(Ordering::Relaxed),
                skipped_chunks: s.skipped.load(Ordering::Relaxed),
                age_secs: s.opened.elapsed().as_secs(),
                engine,
            });
        }
        out
    }

    /// The engine's statistics for `session`, if it answers them within [`STAT_TIMEOUT`].
    async fn stat(&self, session: &Session) -> Option<EngineStat> {
        let url = Url::parse(&session.engine()?.stat_url).ok()?;
        let body = tokio::time::timeout(STAT_TIMEOUT, self.fetch(url))
            .await
            .ok()?
            .ok()?;
        engine_api::parse_stat(&body).ok()
    }
}

/// Answers a session's start with an error when dropped: set only while the start is asking.
struct Unanswered<'a>(&'a Sessions, &'a Arc<Session>);

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        let Unanswered(sessions, session) = *self;
        lock(&session.start).state = StartState::Answered(Err(ProxyError::new(
            Side::Internal,
            StatusCode::INTERNAL_SERVER_ERROR,
            "acestream_start",
            "starting the engine session failed",
        )));
        session.closed.cancel();
        session.answered.notify_waiters();
        sessions.retired(session);
    }
}

/// Appends `data` to `carry` and sends its whole packets to the viewers in pieces of at most
/// `session.piece` bytes, each copied into an allocation of its own: the buffer's slots times
/// the piece bound what it holds, however large the engine's frames (or `carry`) are. The
/// copy is one more memcpy of a stream's bitrate; a slice would keep all of `carry` alive.
fn publish(session: &Session, carry: &mut BytesMut, data: &[u8]) {
    carry.extend_from_slice(data);
    let whole = carry.len() - carry.len() % TS_PACKET;
    session.bytes.fetch_add(whole as u64, Ordering::Relaxed);
    let mut left = whole;
    while left > 0 {
        let n = left.min(session.piece);
        // No receiver is fine: the session lingers without viewers.
        let _ = session.tx.send(Bytes::copy_from_slice(&carry[..n]));
        carry.advance(n);
        left -= n;
    }
}

fn kind_label(kind: Kind) -> &'static str {
    match kind {
        Kind::Stream => "stream",
        Kind::Hls => "hls",
    }
}

/// What the engine answers (in its JSON `error`) for a content id or infohash it cannot find:
/// "missing content", and "failed to load content" / "cannot load transport file" when the
/// transport file behind the id cannot be fetched. Matched case-insensitively as substrings;
/// every other engine error is its own failure (502).
const NOT_FOUND_ERRORS: [&str; 3] = [
    "missing content",
    "failed to load content",
    "cannot load transport file",
];

/// Whether the engine's `error` says it cannot find the content (the client's 404).
fn content_not_found(said: &str) -> bool {
    let said = said.to_ascii_lowercase();
    NOT_FOUND_ERRORS.iter().any(|e| said.contains(e))
}

fn engine_error(message: String) -> ProxyError {
    ProxyError::new(
        Side::Upstream,
        StatusCode::BAD_GATEWAY,
        "acestream_engine",
        message,
    )
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere must not take every session down with it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Counts one linger task for as long as it lives, including a task dropped unrun.
struct LingerTask(Arc<AtomicUsize>);

impl LingerTask {
    fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        LingerTask(count.clone())
    }
}

impl Drop for LingerTask {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Counts one viewer for as long as it lives.
struct ViewerGuard {
    sessions: Arc<Sessions>,
    session: Arc<Session>,
}

impl Drop for ViewerGuard {
    fn drop(&mut self) {
        self.sessions.left(&self.session);
    }
}

/// One viewer: a reader position in its session's buffer.
pub struct Viewer {
    rx: broadcast::Receiver<Bytes>,
    closed: CancellationToken,
    session: Arc<Session>,
    _guard: ViewerGuard,
}

impl Viewer {
    /// The viewer as a response body.
    pub fn into_body(self) -> crate::body::Body {
        let stream = futures_util::stream::unfold(self, |mut v| async move {
            let chunk = v.next_chunk().await?;
            Some((Ok::<_, std::convert::Infallible>(Frame::data(chunk)), v))
        });
        crate::body::boxed(http_body_util::StreamBody::new(stream))
    }

    async fn next_chunk(&mut self) -> Option<Bytes> {
        loop {
            let received = tokio::select! {
                biased;
                r = self.rx.recv() => r,
                _ = self.closed.cancelled() => {
                    // Deliver what is already buffered, then end.
                    return self.rx.try_recv().ok();
                }
            };
            match received {
                Ok(chunk) => return Some(chunk),
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    self.session.skipped.fetch_add(n, Ordering::Relaxed);
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Linger tasks and the per-client share, against a small scripted engine on 127.0.0.1:0.

    use super::*;
    use http_body_util::Full;
    use hyper::service::service_fn;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use std::convert::Infallible;

    /// An engine answering the HLS session call for any id, counting `stop` commands.
    async fn engine() -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stops = Arc::new(AtomicUsize::new(0));
        let counted = stops.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let stops = counted.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let stops = stops.clone();
                        async move {
                            let body = match req.uri().path() {
                                "/ace/manifest.m3u8" => format!(
                                    r#"{{"response":{{"playback_url":"/ace/m/h1.m3u8","stat_url":"/ace/stat/h1","command_url":"/ace/cmd/h1","infohash":"{}","playback_session_id":"h1","is_live":1,"is_encrypted":0}},"error":null}}"#,
                                    "0".repeat(40)
                                ),
                                "/ace/cmd/h1" if req.uri().query() == Some("method=stop") => {
                                    stops.fetch_add(1, Ordering::SeqCst);
                                    r#"{"response":"ok","error":null}"#.to_string()
                                }
                                _ => String::new(),
                            };
                            Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from(body))))
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        (format!("http://{addr}"), stops)
    }

    fn sessions(engine_url: &str, linger_secs: u64, max_sessions: usize) -> Arc<Sessions> {
        let mut registry = prometheus_client::registry::Registry::default();
        let upstream_config = crate::upstream::UpstreamConfig {
            allow_private: true,
            ..Default::default()
        };
        let upstream = Upstream::new(&upstream_config, &mut registry).unwrap();
        let config = AcestreamConfig {
            engine_url: engine_url.into(),
            linger_secs,
            max_sessions,
            ..Default::default()
        };
        Sessions::new(upstream, &config).unwrap()
    }

    fn content(n: u8) -> Content {
        Content::from_params(Some(&format!("{n:040x}")), None).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[tokio::test]
    async fn hls_refreshes_keep_one_linger_task_and_still_close() {
        let (url, stops) = engine().await;
        let sessions = sessions(&url, 1, 16);
        let client = ip("192.0.2.7");
        let mut most = 0;
        for _ in 0..200 {
            let playlist = sessions.touch_hls(&content(1), client).await.unwrap();
            assert_eq!(playlist, format!("{url}/ace/m/h1.m3u8"));
            most = most.max(sessions.linger_tasks());
        }
        assert_eq!(most, 1, "linger tasks alive at once");
        assert_eq!(stops.load(Ordering::SeqCst), 0);

        // No refresh for the linger: the engine is told to stop, once, and the task is gone.
        let deadline = Instant::now() + Duration::from_secs(5);
        while stops.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(stops.load(Ordering::SeqCst), 1, "session not stopped");
        assert!(sessions.report(None).await.is_empty());
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(sessions.linger_tasks(), 0);
        assert_eq!(stops.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_rejoined_session_lingers_again_after_its_next_viewer() {
        let sessions = sessions("http://127.0.0.1:9", 10, 16);
        let viewer = |s: &Arc<Sessions>| ViewerGuard {
            sessions: s.clone(),
            session: s.enter(&content(1), Kind::Hls, ip("192.0.2.7")).unwrap(),
        };
        let first = viewer(&sessions);
        let session = first.session.clone();
        drop(first);
        assert_eq!(sessions.linger_tasks(), 1);
        // Back before the linger ends: the task stands down when it wakes.
        let second = viewer(&sessions);
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert_eq!(sessions.linger_tasks(), 0);
        assert!(!session.closed.is_cancelled());
        // The last viewer leaves again: a new linger closes the session.
        drop(second);
        assert_eq!(sessions.linger_tasks(), 1);
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert!(!session.closed.is_cancelled(), "closed before the linger");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(session.closed.is_cancelled());
        assert_eq!(sessions.linger_tasks(), 0);
    }

    #[tokio::test]
    async fn one_client_opens_at_most_half_the_sessions() {
        let pool = sessions("http://127.0.0.1:9", 10, 4);
        let refused = |r: Result<Arc<Session>, ProxyError>| {
            let e = r.err().expect("opened past the limit");
            assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(e.kind, "acestream_sessions");
        };
        let a = ip("192.0.2.7");
        pool.enter(&content(1), Kind::Hls, a).unwrap();
        pool.enter(&content(2), Kind::Stream, a).unwrap();
        refused(pool.enter(&content(3), Kind::Hls, a));
        // Joining a session already open is not opening one, whoever opened it.
        pool.enter(&content(1), Kind::Hls, a).unwrap();
        // An IPv4-mapped address is the same client.
        refused(pool.enter(&content(3), Kind::Hls, ip("::ffff:192.0.2.7")));
        // An IPv6 client counts by its /64.
        let b = ip("2001:db8:1:2::1");
        pool.enter(&content(3), Kind::Hls, b).unwrap();
        pool.enter(&content(1), Kind::Stream, b).unwrap();
        refused(pool.enter(&content(4), Kind::Hls, ip("2001:db8:1:2::ffff")));
        // The pool is full for everyone else.
        refused(pool.enter(&content(4), Kind::Hls, ip("198.51.100.1")));

        // A pool of one still lets one client open it.
        let small = sessions("http://127.0.0.1:9", 10, 1);
        small.enter(&content(1), Kind::Hls, a).unwrap();
        refused(small.enter(&content(2), Kind::Hls, b));
    }

    #[tokio::test]
    async fn a_full_pool_takes_the_lingering_session_of_whoever_opens() {
        let pool = sessions("http://127.0.0.1:9", 600, 4);
        let (a, b, c) = (ip("192.0.2.7"), ip("198.51.100.1"), ip("203.0.113.9"));
        let viewer = |n: u8, client: IpAddr| ViewerGuard {
            sessions: pool.clone(),
            session: pool.enter(&content(n), Kind::Stream, client).unwrap(),
        };
        let _b1 = viewer(1, b);
        let _b2 = viewer(2, b);
        let _c3 = viewer(3, c);
        let left = viewer(4, a).session.clone();
        // The pool is full though `a` is under its share: its own lingering session goes.
        let _a5 = viewer(5, a);
        assert!(
            left.closed.is_cancelled(),
            "the lingering session was not closed"
        );
        let e = pool
            .enter(&content(6), Kind::Stream, c)
            .err()
            .expect("opened past the pool");
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(open_ids(&pool).await.len(), 4);
    }

    /// The open sessions' content keys, sorted.
    async fn open_ids(pool: &Sessions) -> Vec<String> {
        let mut ids: Vec<String> = pool
            .report(None)
            .await
            .into_iter()
            .map(|r| r.content)
            .collect();
        ids.sort();
        ids
    }

    #[tokio::test]
    async fn a_zapping_client_closes_what_it_left_instead_of_being_refused() {
        // A share of 2, and a linger far longer than the test: only making room closes anything.
        let pool = sessions("http://127.0.0.1:9", 600, 4);
        let a = ip("192.0.2.7");
        // Three times its share of ids, one after another, each left (lingering) for the next.
        let mut left = Vec::new();
        for n in 1..=6 {
            let viewer = ViewerGuard {
                sessions: pool.clone(),
                session: pool.enter(&content(n), Kind::Stream, a).unwrap(),
            };
            left.push(viewer.session.clone());
            drop(viewer);
            assert!(
                pool.report(None).await.len() <= 2,
                "past the share at id {n}"
            );
        }
        // The four it left first were closed to make room.
        let closed: Vec<bool> = left.iter().map(|s| s.closed.is_cancelled()).collect();
        assert_eq!(closed, [true, true, true, true, false, false]);
        assert_eq!(open_ids(&pool).await, [content(5).key(), content(6).key()]);
        // The other half of the pool is still there for another client.
        let b = ip("198.51.100.1");
        pool.enter(&content(7), Kind::Stream, b).unwrap();
        pool.enter(&content(8), Kind::Stream, b).unwrap();
        assert_eq!(pool.report(None).await.len(), 4);
    }

    /// Two players behind one address, one of them on HLS, at a full pool: the HLS channel,
    /// between two reloads (no request in flight), is not closed for the other's new channel;
    /// that one is refused. Once its linger is over without a reload, it may go.
    #[tokio::test]
    async fn an_hls_session_between_reloads_is_not_closed_for_room() {
        let (url, _stops) = engine().await;
        let pool = sessions(&url, 1, 2);
        let (a, b) = (ip("192.0.2.7"), ip("198.51.100.1"));
        pool.touch_hls(&content(1), a).await.unwrap();
        let _other = ViewerGuard {
            sessions: pool.clone(),
            session: pool.enter(&content(2), Kind::Stream, b).unwrap(),
        };
        let e = pool
            .enter(&content(3), Kind::Hls, a)
            .err()
            .expect("a watched HLS channel was closed for room");
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(open_ids(&pool).await, [content(1).key(), content(2).key()]);
    }

    /// The engine's body frames can be far larger than the chunk the buffer is sized by (up to
    /// `upstream.read_buffer_bytes`): what a viewer that stopped reading holds back stays within
    /// `buffer_bytes` however large they are, in whole packets.
    #[tokio::test]
    async fn the_buffer_holds_buffer_bytes_whatever_the_frame_size() {
        for buffer_bytes in [64 * 1024, 1024 * 1024 + 5, 4 * 1024 * 1024] {
            let mut pool = sessions("http://127.0.0.1:9", 600, 4);
            Arc::get_mut(&mut pool).unwrap().config.buffer_bytes = buffer_bytes;
            let session = pool
                .enter(&content(1), Kind::Stream, ip("192.0.2.7"))
                .unwrap();
            let mut rx = session.tx.subscribe();
            let mut carry = BytesMut::new();
            // 1 MiB frames, and an odd one that leaves part of a packet for the next.
            let frame = vec![0x47u8; 1024 * 1024];
            publish(&session, &mut carry, &frame[..1000]);
            for _ in 0..12 {
                publish(&session, &mut carry, &frame);
            }
            let mut held = 0;
            loop {
                match rx.try_recv() {
                    Ok(piece) => {
                        assert_eq!(piece.len() % TS_PACKET, 0);
                        held += piece.len();
                    }
                    Err(broadcast::error::TryRecvError::Lagged(_)) => {}
                    Err(_) => break,
                }
            }
            assert!(
                held <= buffer_bytes,
                "{held} bytes buffered for buffer_bytes {buffer_bytes}"
            );
            let sent = 1000 + 12 * 1024 * 1024;
            assert_eq!(carry.len(), sent % TS_PACKET);
            assert_eq!(
                session.bytes.load(Ordering::Relaxed),
                (sent - carry.len()) as u64
            );
        }
    }

    /// A session still asking the engine is not closed for room, even with no viewer: its
    /// engine session would live on, stopped only when the engine answers, outside the pool. One
    /// closed while asking (its linger over) is out of the map but still counts toward the pool
    /// and its opener's share until its start has answered.
    #[tokio::test]
    async fn sessions_still_starting_keep_their_place() {
        // A share of 1, and a linger far longer than the test.
        let pool = sessions("http://127.0.0.1:9", 600, 2);
        let refused = |r: Result<Arc<Session>, ProxyError>| {
            let e = r.err().expect("opened past the limit");
            assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        };
        let (a, b, c) = (ip("192.0.2.7"), ip("198.51.100.1"), ip("203.0.113.9"));
        let starting = pool.enter(&content(1), Kind::Stream, a).unwrap();
        lock(&starting.start).state = StartState::Asking;
        // Its viewer hangs up while the engine starts: it lingers, still starting.
        drop(ViewerGuard {
            sessions: pool.clone(),
            session: starting.clone(),
        });
        refused(pool.enter(&content(2), Kind::Stream, a));
        assert!(
            !starting.closed.is_cancelled(),
            "a session still starting was closed for room"
        );
        // Closed while starting: gone from the map, not from the count.
        starting.stopping.store(true, Ordering::SeqCst);
        starting.closed.cancel();
        refused(pool.enter(&content(2), Kind::Stream, a));
        assert!(open_ids(&pool).await.is_empty());
        assert_eq!(pool.closing(), 1);
        // It holds one place of the pool for everyone else too.
        pool.enter(&content(3), Kind::Stream, b).unwrap();
        refused(pool.enter(&content(4), Kind::Stream, c));
        // Its start answers (and stops it): the place is free.
        lock(&starting.start).state = StartState::Answered(Err(engine_error("gone".into())));
        pool.retired(&starting);
        assert_eq!(pool.closing(), 0);
        pool.enter(&content(2), Kind::Stream, a).unwrap();
    }

    #[test]
    fn only_the_engines_not_found_errors_are_the_clients() {
        for said in [
            "missing content",
            "Failed to load content",
            "cannot load transport file: timeout",
        ] {
            assert!(content_not_found(said), "{said}");
        }
        for said in [
            "",
            "Internal error",
            "no space left on device",
            "engine is shutting down",
        ] {
            assert!(!content_not_found(said), "{said}");
        }
    }

    #[tokio::test]
    async fn only_watched_sessions_a_client_alone_holds_refuse_it() {
        let pool = sessions("http://127.0.0.1:9", 600, 4);
        let refused = |r: Result<Arc<Session>, ProxyError>| {
            let e = r.err().expect("opened past the share");
            assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(e.kind, "acestream_sessions");
        };
        let (a, b) = (ip("192.0.2.7"), ip("198.51.100.1"));
        let viewer = |n: u8, client: IpAddr| ViewerGuard {
            sessions: pool.clone(),
            session: pool.enter(&content(n), Kind::Stream, client).unwrap(),
        };
        // Its share held with live viewers: refused, and nothing of its own closed.
        let one = viewer(1, a);
        let two = viewer(2, a);
        refused(pool.enter(&content(3), Kind::Stream, a));
        assert!(!one.session.closed.is_cancelled() && !two.session.closed.is_cancelled());
        // One of them left (lingering): that one makes room.
        let left = two.session.clone();
        drop(two);
        let three = viewer(3, a);
        assert!(
            left.closed.is_cancelled(),
            "the lingering session was not closed"
        );
        assert!(!one.session.closed.is_cancelled());
        refused(pool.enter(&content(4), Kind::Stream, a));
        // A session another client joined is no longer its opener's, even once it has left.
        drop(viewer(3, b));
        let four = viewer(4, a);
        assert!(!three.session.closed.is_cancelled() && !four.session.closed.is_cancelled());
        assert_eq!(
            open_ids(&pool).await,
            [content(1).key(), content(3).key(), content(4).key()]
        );
    }
}
