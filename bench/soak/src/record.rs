//! What happened: every client operation's front end, start and end time, verified bytes and, for a
//! failure, a short kind ("status 502", "body", "mismatch", ...).

use std::sync::Mutex;
use std::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Front {
    ReversePlain,
    ReverseCached,
    Stream,
    Hls,
    Dash,
    Tcp,
    Iptv,
    Reload,
}

impl Front {
    pub const ALL: [Front; 8] = [
        Front::ReversePlain,
        Front::ReverseCached,
        Front::Stream,
        Front::Hls,
        Front::Dash,
        Front::Tcp,
        Front::Iptv,
        Front::Reload,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Front::ReversePlain => "reverse (no cache)",
            Front::ReverseCached => "reverse + cache",
            Front::Stream => "/proxy/stream",
            Front::Hls => "HLS player",
            Front::Dash => "DASH-ClearKey player",
            Front::Tcp => "[[tcp]] relay",
            Front::Iptv => "IPTV viewer",
            Front::Reload => "reload (admin)",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Outcome {
    pub front: Front,
    pub start: f64,
    pub end: f64,
    pub bytes: u64,
    pub error: Option<String>,
}

pub struct Log {
    t0: Instant,
    items: Mutex<Vec<Outcome>>,
}

impl Log {
    pub fn new(t0: Instant) -> Self {
        Log {
            t0,
            items: Mutex::new(Vec::new()),
        }
    }

    /// Seconds since the run began.
    pub fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    pub fn ok(&self, front: Front, start: f64, bytes: u64) {
        self.push(Outcome {
            front,
            start,
            end: self.now(),
            bytes,
            error: None,
        });
    }

    pub fn fail(&self, front: Front, start: f64, bytes: u64, error: impl Into<String>) {
        self.push(Outcome {
            front,
            start,
            end: self.now(),
            bytes,
            error: Some(error.into()),
        });
    }

    /// Records a result: Ok(verified bytes) or Err(kind).
    pub fn result(&self, front: Front, start: f64, r: Result<u64, String>) {
        match r {
            Ok(b) => self.ok(front, start, b),
            Err(e) => self.fail(front, start, 0, e),
        }
    }

    fn push(&self, o: Outcome) {
        self.items.lock().unwrap().push(o);
    }

    pub fn take(&self) -> Vec<Outcome> {
        std::mem::take(&mut *self.items.lock().unwrap())
    }
}
