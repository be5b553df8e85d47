//! Acestream engine HTTP API: content ids checked, `getstream`/`manifest` answers and `stat`
//! answers parsed. No I/O.

use serde::Deserialize;

/// Why an engine exchange or a content id is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AceError {
    #[error("give exactly one of `id` (content id) or `infohash`, 40 hex digits")]
    ContentId,
    #[error("the engine answered with an error: {0}")]
    Engine(String),
    #[error("the engine's answer is not the expected JSON: {0}")]
    Malformed(String),
}

/// Which content: a content id (from `acestream://`) or a torrent infohash.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Content {
    Id(String),
    Infohash(String),
}

impl Content {
    /// From the request's `id` / `infohash` (exactly one, 40 hex digits, case-folded so that the
    /// same channel always maps to the same shared session).
    pub fn from_params(id: Option<&str>, infohash: Option<&str>) -> Result<Content, AceError> {
        let check = |s: &str| {
            let s = s.trim().to_ascii_lowercase();
            (s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit()))
                .then_some(s)
                .ok_or(AceError::ContentId)
        };
        match (id, infohash) {
            (Some(id), None) => Ok(Content::Id(check(id)?)),
            (None, Some(h)) => Ok(Content::Infohash(check(h)?)),
            _ => Err(AceError::ContentId),
        }
    }

    /// The engine query parameter naming it: `id=...` or `infohash=...`.
    pub fn engine_param(&self) -> (&'static str, &str) {
        match self {
            Content::Id(id) => ("id", id),
            Content::Infohash(h) => ("infohash", h),
        }
    }

    /// A short stable key for maps and status output.
    pub fn key(&self) -> String {
        let (name, value) = self.engine_param();
        format!("{name}:{value}")
    }
}

/// One engine playback session, from `/ace/getstream?format=json` or
/// `/ace/manifest.m3u8?format=json`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct EngineSession {
    /// Where the bytes (or the HLS playlist) are.
    pub playback_url: String,
    /// Per-session statistics (peers, speeds).
    pub stat_url: String,
    /// `?method=stop` ends the session.
    pub command_url: String,
    #[serde(default)]
    pub infohash: Option<String>,
    #[serde(default)]
    pub playback_session_id: Option<String>,
    #[serde(default)]
    pub is_live: Option<u8>,
}

#[derive(Deserialize)]
struct Envelope<T> {
    response: Option<T>,
    error: Option<String>,
}

/// Parses a `getstream` / `manifest` answer.
pub fn parse_session(body: &[u8]) -> Result<EngineSession, AceError> {
    let env: Envelope<EngineSession> =
        serde_json::from_slice(body).map_err(|e| AceError::Malformed(e.to_string()))?;
    match (env.response, env.error) {
        (_, Some(err)) if !err.is_empty() => Err(AceError::Engine(err)),
        (Some(session), _) => Ok(session),
        (None, _) => Err(AceError::Malformed("no `response`".into())),
    }
}

/// What the engine's `stat_url` says about a session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
pub struct EngineStat {
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub peers: Option<u64>,
    #[serde(default)]
    pub speed_down: Option<u64>,
    #[serde(default)]
    pub speed_up: Option<u64>,
    #[serde(default)]
    pub downloaded: Option<u64>,
}

/// Parses a `stat_url` answer.
pub fn parse_stat(body: &[u8]) -> Result<EngineStat, AceError> {
    let env: Envelope<EngineStat> =
        serde_json::from_slice(body).map_err(|e| AceError::Malformed(e.to_string()))?;
    match (env.response, env.error) {
        (_, Some(err)) if !err.is_empty() => Err(AceError::Engine(err)),
        (Some(stat), _) => Ok(stat),
        (None, _) => Err(AceError::Malformed("no `response`".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789ABCDEF01234567";

    #[test]
    fn content_ids() {
        let c = Content::from_params(Some(ID), None).unwrap();
        assert_eq!(c.key(), format!("id:{}", ID.to_ascii_lowercase()));
        assert_eq!(
            Content::from_params(None, Some(ID))
                .unwrap()
                .engine_param()
                .0,
            "infohash"
        );
        assert_eq!(
            Content::from_params(Some(ID), Some(ID)),
            Err(AceError::ContentId)
        );
        assert_eq!(Content::from_params(None, None), Err(AceError::ContentId));
        assert_eq!(
            Content::from_params(Some("xyz"), None),
            Err(AceError::ContentId)
        );
        assert_eq!(
            Content::from_params(Some("../../../../../../etc/passwd0123456789ab"), None),
            Err(AceError::ContentId)
        );
    }

    #[test]
    fn sessions() {
        let body = br#"{"response":{"playback_url":"http://e/ace/r/h/s","stat_url":"http://e/ace/stat/h/s","command_url":"http://e/ace/cmd/h/s","infohash":"h","playback_session_id":"s","is_live":1,"is_encrypted":0},"error":null}"#;
        let s = parse_session(body).unwrap();
        assert_eq!(s.playback_url, "http://e/ace/r/h/s");
        assert_eq!(s.command_url, "http://e/ace/cmd/h/s");
        assert_eq!(s.is_live, Some(1));
        assert_eq!(
            parse_session(br#"{"response":null,"error":"missing content"}"#),
            Err(AceError::Engine("missing content".into()))
        );
        assert!(matches!(
            parse_session(b"<html>"),
            Err(AceError::Malformed(_))
        ));
        let stat =
            parse_stat(br#"{"response":{"status":"dl","peers":7,"speed_down":120},"error":null}"#)
                .unwrap();
        assert_eq!(stat.peers, Some(7));
        assert_eq!(stat.status.as_deref(), Some("dl"));
    }
}
