//! Unit tests for guide preparation, content negotiation and conditional GET.

use std::io::Write;

use flate2::write::GzEncoder;

use super::*;

const XMLTV: &[u8] = b"\xef\xbb\xbf<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE tv SYSTEM \"xmltv.dtd\">\n<tv generator-info-name=\"t\"><channel id=\"a\"><display-name>A</display-name></channel></tv>\n";

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(*k, v.parse().unwrap());
    }
    h
}

#[test]
fn plain_and_gzip_sources_give_the_same_guide() {
    let plain = prepare(Bytes::from_static(XMLTV), 1 << 20).unwrap();
    let gz_src = Bytes::from(gzip(XMLTV));
    let zipped = prepare(gz_src.clone(), 1 << 20).unwrap();
    assert_eq!(plain.etag, zipped.etag);
    assert_eq!(plain.xml_len, XMLTV.len());
    assert_eq!(&plain.xml().unwrap()[..], XMLTV);
    assert_eq!(&zipped.xml().unwrap()[..], XMLTV);
    // A gzip source is kept as sent, not recompressed.
    assert_eq!(zipped.gz, gz_src);
    let digest = Sha256::digest(XMLTV);
    assert_eq!(plain.etag, format!("\"{}\"", hex16(&digest)));
}

#[test]
fn refuses_oversized_broken_and_non_xmltv_input() {
    let bomb = Bytes::from(gzip(&vec![b' '; 200_000]));
    assert!(matches!(
        prepare(bomb, 100_000),
        Err(EpgError::TooLarge(100_000))
    ));
    let mut broken = gzip(XMLTV);
    broken.truncate(broken.len() / 2);
    assert!(matches!(
        prepare(broken.into(), 1 << 20),
        Err(EpgError::Gzip(_))
    ));
    let html = Bytes::from_static(b"<!doctype html><html><body>502</body></html>");
    assert!(matches!(prepare(html, 1 << 20), Err(EpgError::NotXmltv)));
    assert!(matches!(
        prepare(Bytes::new(), 1 << 20),
        Err(EpgError::NotXmltv)
    ));
}

#[test]
fn negotiates_gzip() {
    assert!(accepts_gzip(&headers(&[(
        "accept-encoding",
        "gzip, deflate, br"
    )])));
    assert!(accepts_gzip(&headers(&[(
        "accept-encoding",
        "br;q=1.0, GZIP;q=0.5"
    )])));
    assert!(accepts_gzip(&headers(&[("accept-encoding", "*")])));
    assert!(!accepts_gzip(&headers(&[("accept-encoding", "gzip;q=0")])));
    assert!(!accepts_gzip(&headers(&[("accept-encoding", "identity")])));
    assert!(!accepts_gzip(&HeaderMap::new()));
    assert_eq!(Form::choose(true, &HeaderMap::new()), Form::GzFile);
    assert_eq!(Form::choose(false, &HeaderMap::new()), Form::Xml);
}

#[test]
fn conditional_get() {
    let guide = prepare(Bytes::from_static(XMLTV), 1 << 20).unwrap();
    let etag = Form::Xml.etag(&guide);
    let gz_etag = Form::GzFile.etag(&guide);
    assert_ne!(etag, gz_etag);
    assert!(gz_etag.starts_with('"') && gz_etag.ends_with("-gz\""));
    let lm = guide.last_modified;
    let date = httpdate::fmt_http_date(lm);
    assert!(not_modified(
        &headers(&[("if-none-match", &etag)]),
        &etag,
        lm
    ));
    let weak = format!("\"x\", W/{etag}");
    assert!(not_modified(
        &headers(&[("if-none-match", &weak)]),
        &etag,
        lm
    ));
    assert!(not_modified(&headers(&[("if-none-match", "*")]), &etag, lm));
    assert!(!not_modified(
        &headers(&[("if-none-match", &gz_etag)]),
        &etag,
        lm
    ));
    // If-None-Match wins over If-Modified-Since when both are present.
    let both = headers(&[("if-none-match", "\"other\""), ("if-modified-since", &date)]);
    assert!(!not_modified(&both, &etag, lm));
    assert!(not_modified(
        &headers(&[("if-modified-since", &date)]),
        &etag,
        lm
    ));
    let old = httpdate::fmt_http_date(lm - Duration::from_secs(3600));
    assert!(!not_modified(
        &headers(&[("if-modified-since", &old)]),
        &etag,
        lm
    ));
    assert!(!not_modified(
        &headers(&[("if-modified-since", "garbage")]),
        &etag,
        lm
    ));

    let (status, h) = head(Form::XmlGzipEncoded, &guide, false);
    assert_eq!(status, StatusCode::OK);
    assert_eq!(h[header::CONTENT_ENCODING], "gzip");
    assert_eq!(h[header::ETAG], gz_etag.as_str());
    assert_eq!(h[header::VARY], "Accept-Encoding");
    let (status, h) = head(Form::GzFile, &guide, true);
    assert_eq!(status, StatusCode::NOT_MODIFIED);
    assert!(h.get(header::CONTENT_TYPE).is_none());
    assert_eq!(h[header::LAST_MODIFIED], date.as_str());
}
