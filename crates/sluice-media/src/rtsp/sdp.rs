//! The part of a DESCRIBE answer a TS relay needs: which media section carries MPEG-TS over
//! RTP (static payload type 33, or a dynamic one mapped to `MP2T`) and its control URL.

/// The MPEG-TS media section found in an SDP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TsMedia {
    pub payload_type: u8,
    /// `a=control:` of the media section, else of the session, if any.
    pub control: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SdpError {
    #[error("the SDP has no media section")]
    NoMedia,
    #[error("the SDP has no MPEG-TS (MP2T) media; it offers: {0}")]
    NotTs(String),
}

/// Finds the first MPEG-TS media section.
pub fn ts_media(sdp: &str) -> Result<TsMedia, SdpError> {
    let mut session_control = None;
    let mut sections: Vec<Section> = Vec::new();
    for line in sdp.lines().map(str::trim) {
        if let Some(m) = line.strip_prefix("m=") {
            sections.push(Section::new(m));
        } else if let Some(attr) = line.strip_prefix("a=") {
            let (name, value) = attr.split_once(':').unwrap_or((attr, ""));
            match sections.last_mut() {
                Some(s) => s.attribute(name, value),
                None if name == "control" => session_control = Some(value.trim().to_string()),
                None => {}
            }
        }
    }
    if sections.is_empty() {
        return Err(SdpError::NoMedia);
    }
    for s in &sections {
        if let Some(pt) = s.ts_payload_type() {
            return Ok(TsMedia {
                payload_type: pt,
                control: s.control.clone().or(session_control.clone()),
            });
        }
    }
    Err(SdpError::NotTs(offered(&sections)))
}

/// Longest list of offered media an error carries, in characters, as for the other errors:
/// a server's SDP (up to the message bound) would otherwise reach the log whole.
const OFFERED_CHARS: usize = 64;

/// The media sections, described one after another, cut at [`OFFERED_CHARS`]; no more of
/// them is described than that needs.
fn offered(sections: &[Section]) -> String {
    let mut out = String::new();
    for (i, s) in sections.iter().enumerate() {
        if out.chars().count() > OFFERED_CHARS {
            break;
        }
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&s.describe());
    }
    out.chars().take(OFFERED_CHARS).collect()
}

/// Resolves a control attribute against the presentation's base URL the way RTSP servers
/// expect: `*` is the base itself, an absolute URL stands alone, anything else is appended
/// to the base as a path segment (RFC 2326 C.1.1, as deployed servers read it).
pub fn control_url(base: &str, control: Option<&str>) -> String {
    match control.map(str::trim) {
        None | Some("") | Some("*") => base.to_string(),
        Some(c) if c.contains("://") => c.to_string(),
        Some(c) => {
            // A query on the base stays on the base: the control goes into the path.
            let (path, query) = match base.split_once('?') {
                Some((p, q)) => (p, Some(q)),
                None => (base, None),
            };
            let mut out = path.trim_end_matches('/').to_string();
            out.push('/');
            out.push_str(c.trim_start_matches('/'));
            if let Some(q) = query {
                if !c.contains('?') {
                    out.push('?');
                    out.push_str(q);
                }
            }
            out
        }
    }
}

struct Section {
    media: String,
    proto: String,
    formats: Vec<u8>,
    mp2t: Vec<u8>,
    control: Option<String>,
}

impl Section {
    fn new(m: &str) -> Self {
        let mut parts = m.split_whitespace();
        let media = parts.next().unwrap_or("").to_string();
        let _port = parts.next();
        let proto = parts.next().unwrap_or("").to_string();
        let formats = parts.filter_map(|f| f.parse().ok()).collect();
        Self {
            media,
            proto,
            formats,
            mp2t: Vec::new(),
            control: None,
        }
    }

    fn attribute(&mut self, name: &str, value: &str) {
        match name {
            "control" => self.control = Some(value.trim().to_string()),
            "rtpmap" => {
                let (pt, enc) = value.trim().split_once(' ').unwrap_or((value, ""));
                let is_ts = enc
                    .split('/')
                    .next()
                    .is_some_and(|e| e.eq_ignore_ascii_case("MP2T"));
                if let (true, Ok(pt)) = (is_ts, pt.parse()) {
                    self.mp2t.push(pt);
                }
            }
            _ => {}
        }
    }

    fn ts_payload_type(&self) -> Option<u8> {
        if !self.proto.starts_with("RTP/") {
            return None;
        }
        self.formats
            .iter()
            .copied()
            .find(|pt| *pt == 33 || self.mp2t.contains(pt))
    }

    fn describe(&self) -> String {
        // Each part is clipped first: one section's name or format list can be a whole SDP.
        let clip = |s: &str| s.chars().take(OFFERED_CHARS).collect::<String>();
        let formats = self
            .formats
            .iter()
            .take(OFFERED_CHARS / 2)
            .collect::<Vec<_>>();
        let formats = if self.formats.len() > formats.len() {
            format!("{formats:?}…")
        } else {
            format!("{formats:?}")
        };
        format!("{} {} {formats}", clip(&self.media), clip(&self.proto))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GST: &str = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=Session\r\nt=0 0\r\na=control:*\r\n\
        m=video 0 RTP/AVP 33\r\nc=IN IP4 0.0.0.0\r\na=rtpmap:33 MP2T/90000\r\na=control:stream=0\r\n";

    #[test]
    fn finds_static_and_dynamic_ts() {
        let m = ts_media(GST).unwrap();
        assert_eq!(m.payload_type, 33);
        assert_eq!(m.control.as_deref(), Some("stream=0"));
        let dynamic =
            "m=audio 0 RTP/AVP 0\na=control:a\nm=video 0 RTP/AVP 96\na=rtpmap:96 mp2t/90000\n";
        let m = ts_media(dynamic).unwrap();
        assert_eq!(m.payload_type, 96);
        assert_eq!(m.control, None);
    }

    #[test]
    fn refuses_non_ts() {
        let h264 = "m=video 0 RTP/AVP 96\na=rtpmap:96 H264/90000\n";
        assert_eq!(
            ts_media(h264),
            Err(SdpError::NotTs("video RTP/AVP [96]".into()))
        );
        assert_eq!(ts_media("v=0\n"), Err(SdpError::NoMedia));
    }

    #[test]
    fn a_huge_non_ts_sdp_gives_a_short_error() {
        // About 64 KiB of media sections, none of them TS: the error once listed them all
        // (about 96 KiB of text); it keeps the first 64 characters, as the other errors do.
        let mut sdp = String::new();
        while sdp.len() < 64 * 1024 {
            sdp.push_str("m=video 0 RTP/AVP 96 97 98\na=rtpmap:96 H264/90000\n");
        }
        let Err(SdpError::NotTs(offered)) = ts_media(&sdp) else {
            panic!("not refused as not TS");
        };
        assert_eq!(offered.chars().count(), 64, "{:.100}", offered);
        assert!(offered.starts_with("video RTP/AVP [96, 97, 98], video RTP/AVP [96, 97, 98], "));
        let long = format!("m={} 0 RTP/AVP 96\n", "v".repeat(10_000));
        let Err(SdpError::NotTs(offered)) = ts_media(&long) else {
            panic!("not refused as not TS");
        };
        assert_eq!(offered, "v".repeat(64));
    }

    #[test]
    fn resolves_control() {
        let base = "rtsp://h:554/live/ch1/";
        assert_eq!(
            control_url(base, Some("stream=0")),
            "rtsp://h:554/live/ch1/stream=0"
        );
        assert_eq!(
            control_url("rtsp://h/ch", Some("trackID=1")),
            "rtsp://h/ch/trackID=1"
        );
        assert_eq!(control_url(base, Some("*")), base);
        assert_eq!(control_url(base, None), base);
        assert_eq!(control_url(base, Some("rtsp://o/x")), "rtsp://o/x");
        assert_eq!(
            control_url("rtsp://h/ch?a=1", Some("track1")),
            "rtsp://h/ch/track1?a=1"
        );
    }
}
