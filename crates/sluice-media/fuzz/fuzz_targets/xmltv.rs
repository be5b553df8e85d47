//! Fuzzes the preparation of a fetched XMLTV guide (`/epg.xml`, `/proxy/epg`): never a panic,
//! never more XML than the bound, and what it accepts is XMLTV whose stored form reads back to
//! the same XML under the same ETag. A plain guide and the same guide gzip-compressed get the
//! same verdict.
//!
//! Framing: a two-byte little-endian bound (`max`, up to 64 KiB so the bound is reached), then
//! the fetched bytes.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use sluice_media::gzip;
use sluice_media::xmltv::{etag_of, looks_like_xmltv, prepare, Prepared, XmltvError};

/// What `prepare` made of `raw`, checked against the bound; the XML when it was accepted.
fn prepared(raw: &[u8], max: usize) -> Result<(Prepared, Bytes), XmltvError> {
    let is_gzip = raw.starts_with(&[0x1f, 0x8b]);
    match prepare(Bytes::copy_from_slice(raw), max) {
        Ok(p) => {
            let xml = p.xml().expect("a prepared guide reads back");
            assert!(xml.len() == p.xml_len && p.xml_len <= max);
            assert!(looks_like_xmltv(&xml));
            assert_eq!(p.etag, etag_of(&xml));
            if is_gzip {
                // The source's own gzip is served as it came.
                assert_eq!(&p.gz[..], raw);
            } else {
                assert_eq!(&xml[..], raw);
            }
            Ok((p, xml))
        }
        Err(e) => {
            match &e {
                XmltvError::TooLarge(n) => assert!(*n == max && (is_gzip || raw.len() > max)),
                XmltvError::NotXmltv => assert!(is_gzip || !looks_like_xmltv(raw)),
                XmltvError::Gzip(_) => assert!(is_gzip),
            }
            Err(e)
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((max, raw)) = data.split_first_chunk::<2>() else {
        return;
    };
    let max = usize::from(u16::from_le_bytes(*max));
    let plain = prepared(raw, max);
    if raw.starts_with(&[0x1f, 0x8b]) {
        return;
    }
    // The same guide as a source that sends gzip.
    let zipped = prepared(&gzip::compress(raw, 1), max);
    match (plain, zipped) {
        (Ok((p, _)), Ok((z, xml))) => {
            assert_eq!(p.etag, z.etag);
            assert_eq!(&xml[..], raw);
        }
        (Err(p), Err(z)) => assert_eq!(p, z),
        (p, z) => panic!("plain {:?} but gzip {:?}", p.err(), z.err()),
    }
});
