//! Content codings a client accepts (RFC 9110 §12.5.3). No I/O.

use http::header::{HeaderMap, ACCEPT_ENCODING};

/// `Accept-Encoding` lists gzip (or `*`) with a non-zero q.
pub fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';').map(str::trim);
            let coding = parts.next().unwrap_or("");
            let q_zero = parts.any(|p| {
                p.strip_prefix("q=")
                    .is_some_and(|q| q.parse::<f32>().is_ok_and(|q| q <= 0.0))
            });
            (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !q_zero
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_with_q() {
        let h = |v: &'static str| {
            let mut m = HeaderMap::new();
            m.insert(ACCEPT_ENCODING, v.parse().unwrap());
            m
        };
        assert!(accepts_gzip(&h("br, GZIP;q=0.5")));
        assert!(accepts_gzip(&h("*")));
        assert!(!accepts_gzip(&h("gzip;q=0, br")));
        assert!(!accepts_gzip(&HeaderMap::new()));
    }
}
