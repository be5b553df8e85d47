//! XMLTV guides as sluice keeps them: checked to be XMLTV, held gzip-compressed, named by a hash of
//! their XML. Shared by the gateway's `/epg.xml` and the media front end's `/proxy/epg`. No I/O.

use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::gzip;

/// Why fetched bytes are not a usable guide.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum XmltvError {
    #[error("guide larger than {0} bytes")]
    TooLarge(usize),
    #[error("guide is not valid gzip: {0}")]
    Gzip(String),
    #[error("guide is not XMLTV (no <tv> root near the start)")]
    NotXmltv,
}

/// A checked guide.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The guide gzip-compressed: the source's own bytes when it sent gzip.
    pub gz: Bytes,
    /// Length of the XML once decompressed.
    pub xml_len: usize,
    /// Strong validator of the XML content, quoted (`"<16 hex digits>"`).
    pub etag: String,
}

impl Prepared {
    /// The XML itself (bounded: its length was checked when prepared).
    pub fn xml(&self) -> Result<Bytes, XmltvError> {
        gzip::decompress(&self.gz, self.xml_len)
            .map(Bytes::from)
            .map_err(|e| XmltvError::Gzip(e.to_string()))
    }
}

/// Checks and normalises fetched bytes: gunzip with a bound when gzip, check that it is XMLTV,
/// hash it, and compress it when it came plain. `max` bounds the XML, compressed or not.
pub fn prepare(raw: Bytes, max: usize) -> Result<Prepared, XmltvError> {
    let is_gzip = raw.starts_with(&[0x1f, 0x8b]);
    let xml: Bytes = if is_gzip {
        match gzip::decompress(&raw, max) {
            Ok(out) => out.into(),
            Err(gzip::GzipError::TooLarge(_)) => return Err(XmltvError::TooLarge(max)),
            Err(e) => return Err(XmltvError::Gzip(e.to_string())),
        }
    } else if raw.len() > max {
        return Err(XmltvError::TooLarge(max));
    } else {
        raw.clone()
    };
    if !looks_like_xmltv(&xml) {
        return Err(XmltvError::NotXmltv);
    }
    let etag = etag_of(&xml);
    let gz = if is_gzip {
        raw
    } else {
        Bytes::from(gzip::compress(&xml, 6))
    };
    Ok(Prepared {
        gz,
        xml_len: xml.len(),
        etag,
    })
}

/// The quoted strong validator of `xml`: the first 8 bytes of its SHA-256 in hex.
pub fn etag_of(xml: &[u8]) -> String {
    let digest = Sha256::digest(xml);
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("\"{hex}\"")
}

/// An XMLTV document has a `<tv` root within its first few KiB (after the prolog and DOCTYPE);
/// an HTML error page or a JSON answer does not.
pub fn looks_like_xmltv(xml: &[u8]) -> bool {
    let head = &xml[..xml.len().min(8192)];
    let head = head.strip_prefix(b"\xef\xbb\xbf").unwrap_or(head);
    let first = head.iter().position(|b| !b.is_ascii_whitespace());
    first.is_some_and(|at| head[at] == b'<')
        && head.windows(4).any(|w| w == b"<tv>" || w == b"<tv ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const XMLTV: &[u8] = b"<?xml version=\"1.0\"?>\n<tv><channel id=\"a\"/></tv>\n";

    #[test]
    fn plain_and_gzip_give_one_guide_and_bounds_hold() {
        let plain = prepare(Bytes::from_static(XMLTV), 1 << 20).unwrap();
        let zipped = prepare(Bytes::from(gzip::compress(XMLTV, 1)), 1 << 20).unwrap();
        assert_eq!(plain.etag, zipped.etag);
        assert_eq!(&zipped.xml().unwrap()[..], XMLTV);
        assert_eq!(
            prepare(Bytes::from_static(XMLTV), 10).unwrap_err(),
            XmltvError::TooLarge(10)
        );
        assert_eq!(
            prepare(Bytes::from(gzip::compress(XMLTV, 1)), 10).unwrap_err(),
            XmltvError::TooLarge(10)
        );
        assert_eq!(
            prepare(Bytes::from_static(b"<html><body>no</body></html>"), 1 << 20).unwrap_err(),
            XmltvError::NotXmltv
        );
        assert!(matches!(
            prepare(Bytes::from_static(b"\x1f\x8bnot really"), 1 << 20),
            Err(XmltvError::Gzip(_))
        ));
    }
}
