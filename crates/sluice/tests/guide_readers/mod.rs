//! What slow readers of a large guide are given: a large XMLTV guide, and the rest of an answer
//! read by its length (what they hold is counted by `counting_alloc`).

use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// An XMLTV guide of at least `size` bytes, compressible as real guides are.
pub fn big_xmltv(size: usize) -> Vec<u8> {
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<tv>\n");
    let mut i = 0u64;
    while x.len() < size {
        let ch = i % 300;
        x.push_str(&format!(
            "<programme channel=\"ch{ch}\" start=\"202601{:02}{:02}0000 +0000\"><title>Show {} of {ch}</title>\
             <desc>Episode {i}: {:x} things happen on channel {ch}.</desc></programme>\n",
            1 + i % 28,
            i % 24,
            i / 7,
            i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40,
        ));
        i += 1;
    }
    x.push_str("</tv>\n");
    x.into_bytes()
}

/// The rest of an HTTP/1.1 answer whose first bytes are `got`: its body, by its
/// `Content-Length`.
pub async fn rest_of_body(mut tcp: TcpStream, mut got: Vec<u8>) -> Vec<u8> {
    let mut buf = vec![0u8; 256 * 1024];
    let head_end = loop {
        if let Some(at) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed inside the head");
        got.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .unwrap_or_else(|| panic!("no content-length: {head}"))
        .trim()
        .parse()
        .unwrap();
    let mut body = got.split_off(head_end);
    while body.len() < len {
        let n = tokio::time::timeout(Duration::from_secs(20), tcp.read(&mut buf))
            .await
            .expect("body within 20 s")
            .unwrap();
        assert!(n > 0, "closed after {} of {len} bytes", body.len());
        body.extend_from_slice(&buf[..n]);
    }
    body
}
