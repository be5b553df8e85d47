//! Values of the `Transport`, `Session` and `Public` headers (RFC 2326 §12.39, §12.37, §12.28).

/// What a SETUP answer's `Transport` says about delivery.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Transport {
    /// `RTP/AVP/TCP`: packets arrive interleaved on the control connection.
    pub tcp: bool,
    /// Interleaved channels (RTP, RTCP).
    pub interleaved: Option<(u8, u8)>,
    /// Server's UDP ports (RTP, RTCP).
    pub server_port: Option<(u16, u16)>,
    /// Client's UDP ports as the server understood them.
    pub client_port: Option<(u16, u16)>,
    /// `source=`: where UDP packets come from when not the control connection's peer.
    pub source: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("Transport {0:?} is not RTP/AVP")]
    Profile(String),
    #[error("Transport parameter {0:?} is malformed")]
    Parameter(String),
    #[error("Session header is empty")]
    Session,
}

/// Parses the first transport spec of a `Transport` value.
pub fn transport(value: &str) -> Result<Transport, HeaderError> {
    let spec = value.split(',').next().unwrap_or("").trim();
    let mut params = spec.split(';').map(str::trim);
    let profile = params.next().unwrap_or("");
    let tcp = match profile.to_ascii_uppercase().as_str() {
        "RTP/AVP" | "RTP/AVP/UDP" => false,
        "RTP/AVP/TCP" => true,
        _ => return Err(HeaderError::Profile(clip(profile))),
    };
    let mut t = Transport {
        tcp,
        ..Transport::default()
    };
    for p in params {
        let (name, v) = p.split_once('=').unwrap_or((p, ""));
        let v = v.trim_matches('"');
        let bad = || HeaderError::Parameter(clip(p));
        match name.to_ascii_lowercase().as_str() {
            "interleaved" => t.interleaved = Some(pair(v).ok_or_else(bad)?),
            "server_port" => t.server_port = Some(pair(v).ok_or_else(bad)?),
            "client_port" => t.client_port = Some(pair(v).ok_or_else(bad)?),
            "source" => t.source = Some(v.to_string()),
            _ => {}
        }
    }
    Ok(t)
}

/// `a-b` or a lone `a` (then `b = a + 1`).
fn pair<T>(v: &str) -> Option<(T, T)>
where
    T: std::str::FromStr + Copy + TryFrom<u32>,
    u32: From<T>,
{
    match v.split_once('-') {
        Some((a, b)) => Some((a.trim().parse().ok()?, b.trim().parse().ok()?)),
        None => {
            let a: T = v.trim().parse().ok()?;
            let b = T::try_from(u32::from(a) + 1).ok()?;
            Some((a, b))
        }
    }
}

/// `Session: id[;timeout=secs]`: the id, and the timeout when given (RFC default is 60 s).
pub fn session(value: &str) -> Result<(String, Option<u64>), HeaderError> {
    let mut parts = value.split(';').map(str::trim);
    let id = parts.next().unwrap_or("");
    if id.is_empty() {
        return Err(HeaderError::Session);
    }
    let timeout = parts
        .filter_map(|p| p.split_once('='))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("timeout"))
        .and_then(|(_, v)| v.trim().parse().ok());
    Ok((id.to_string(), timeout))
}

/// True if a `Public` value lists `method`.
pub fn lists_method(public: &str, method: &str) -> bool {
    public
        .split(',')
        .any(|m| m.trim().eq_ignore_ascii_case(method))
}

fn clip(s: &str) -> String {
    s.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transports() {
        let t = transport("RTP/AVP/TCP;unicast;interleaved=0-1;ssrc=1A2B;mode=\"PLAY\"").unwrap();
        assert!(t.tcp);
        assert_eq!(t.interleaved, Some((0, 1)));
        let u = transport(
            "RTP/AVP;unicast;client_port=5000-5001;server_port=6970-6971;source=10.0.0.9",
        )
        .unwrap();
        assert!(!u.tcp);
        assert_eq!(u.server_port, Some((6970, 6971)));
        assert_eq!(u.client_port, Some((5000, 5001)));
        assert_eq!(u.source.as_deref(), Some("10.0.0.9"));
        assert_eq!(
            transport("RTP/AVP;interleaved=4").unwrap().interleaved,
            Some((4, 5))
        );
        assert!(transport("RAW/RAW/UDP").is_err());
        assert!(transport("RTP/AVP;server_port=x-1").is_err());
        assert!(transport("RTP/AVP;interleaved=255").is_err());
    }

    #[test]
    fn sessions_and_public() {
        assert_eq!(
            session("8D2E3F;timeout=30").unwrap(),
            ("8D2E3F".to_string(), Some(30))
        );
        assert_eq!(session("abc").unwrap(), ("abc".to_string(), None));
        assert!(session(" ;timeout=5").is_err());
        assert!(lists_method(
            "OPTIONS, DESCRIBE, GET_PARAMETER",
            "get_parameter"
        ));
        assert!(!lists_method("OPTIONS, DESCRIBE", "GET_PARAMETER"));
    }
}
