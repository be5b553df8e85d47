//! A request head's forwarding fields through `forwarded::apply`, `Fresh` and `claimed_scope`,
//! for a hop the input describes. Input: a flag byte (trusted, `Forwarded`, `Via`, https, client
//! none / the peer / another, IPv6 peer, a host), the peer's address (4 or 16 bytes), the other
//! client's (4 bytes), the host line when there is one, then fields: a name-choice byte and a
//! value per line.
//!
//! What `apply` must do, checked against a plain reading of its doc: from a peer that is not
//! trusted the chain is replaced (`X-Forwarded-For` is the peer, the proto and host this hop's,
//! no other proxy's fields pass, `Forwarded` is this hop's element alone); from a trusted peer
//! it is extended (the prior `X-Forwarded-For` and `Forwarded` values, then this hop's), and
//! its proto and host kept. `X-Real-IP` is the client this proxy determined, never the client's
//! own; `Via` is extended when the hop names one; each field written has one value; any other
//! field is untouched. `Fresh` adds what `apply` does; `claimed_scope` is `None` for an
//! untrusted peer and otherwise a sequence of length-prefixed values.
#![no_main]

use std::net::IpAddr;

use http::header::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use sluice_http::forwarded::{
    apply, claimed_scope, is_forwarding_field, is_proxy_field, strip_proxy_fields, Fresh,
    FreshHost, Hop, PROXY_FIELDS,
};

const NAMES: [&str; 16] = [
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "forwarded",
    "x-real-ip",
    "via",
    "x-forwarded-scheme",
    "x-forwarded-port",
    "x-forwarded-server",
    "x-host",
    "front-end-https",
    "host",
    "accept",
    "x-other",
    "cookie",
    "x-forwarded-prefix",
];

fn values(h: &HeaderMap, name: &str) -> Vec<Vec<u8>> {
    h.get_all(name)
        .iter()
        .map(|v| v.as_bytes().to_vec())
        .collect()
}

/// The values of `name` that are text, joined by `, `, when there are any.
fn joined(h: &HeaderMap, name: &str) -> Option<String> {
    let parts: Vec<&str> = h
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// `prior, mine` when `prior` holds more than blanks, else `mine`.
fn extended(prior: Option<String>, mine: &str) -> String {
    match prior {
        Some(p) if !p.trim().is_empty() => format!("{p}, {mine}"),
        _ => mine.to_string(),
    }
}

/// The one value a written field must hold (`None`: the field is absent).
fn expect_one(h: &HeaderMap, name: &str, want: Option<&[u8]>) {
    let got = values(h, name);
    match want {
        Some(w) => assert_eq!(got, vec![w.to_vec()], "{name}"),
        None => assert!(got.is_empty(), "{name}: {got:?}"),
    }
}

/// The text as a field value, if it can be one.
fn as_value(text: &str) -> Option<Vec<u8>> {
    HeaderValue::from_str(text)
        .ok()
        .map(|v| v.as_bytes().to_vec())
}

/// Reads a scope as `<length>:<bytes>` values (a `-` for no host in second place).
fn scope_values(scope: &str) -> Vec<Option<String>> {
    let mut out = Vec::new();
    let mut rest = scope;
    while !rest.is_empty() {
        if out.len() == 1 {
            if let Some(r) = rest.strip_prefix('-') {
                out.push(None);
                rest = r;
                continue;
            }
        }
        let (len, r) = rest.split_once(':').expect("a length prefix");
        let len: usize = len.parse().expect("a decimal length");
        assert!(r.len() >= len, "{scope:?}");
        out.push(Some(r[..len].to_string()));
        rest = &r[len..];
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, mut rest)) = data.split_first() else {
        return;
    };
    let mut take = |n: usize| -> Option<&[u8]> {
        let (a, b) = (rest.get(..n)?, rest.get(n..)?);
        rest = b;
        Some(a)
    };
    let peer: IpAddr = if flags & 0x40 != 0 {
        <[u8; 16]>::try_from(take(16).unwrap_or(&[0; 16]))
            .unwrap()
            .into()
    } else {
        <[u8; 4]>::try_from(take(4).unwrap_or(&[0; 4]))
            .unwrap()
            .into()
    };
    let other: IpAddr = <[u8; 4]>::try_from(take(4).unwrap_or(&[0; 4]))
        .unwrap()
        .into();
    let client = match (flags >> 4) & 3 {
        0 => None,
        1 => Some(peer),
        _ => Some(other),
    };
    let mut lines = rest.split(|&b| b == b'\n');
    let host_line = if flags & 0x80 != 0 {
        let Some(Ok(h)) = lines.next().map(std::str::from_utf8) else {
            return;
        };
        Some(h)
    } else {
        None
    };
    let mut headers = HeaderMap::new();
    for line in lines.take(32) {
        let Some((&pick, value)) = line.split_first() else {
            continue;
        };
        if let Ok(v) = HeaderValue::from_bytes(value) {
            headers.append(NAMES[usize::from(pick) % NAMES.len()], v);
        }
    }
    let trusted = flags & 1 != 0;
    let proto = if flags & 8 != 0 { "https" } else { "http" };
    let hop = Hop {
        peer,
        trusted,
        client,
        proto,
        host: host_line,
        host_value: None,
        forwarded: flags & 2 != 0,
        via: (flags & 4 != 0).then_some(("sluice", "1.1")),
    };

    let mut out = headers.clone();
    apply(&mut out, &hop);
    let mut again = headers.clone();
    apply(&mut again, &hop);
    assert_eq!(out, again);
    // The same, given the host as a field value.
    if let Some(v) = host_line.and_then(|h| HeaderValue::from_str(h).ok()) {
        let mut given = headers.clone();
        apply(
            &mut given,
            &Hop {
                host_value: Some(v),
                ..hop.clone()
            },
        );
        assert_eq!(out, given);
    }

    let peer_text = peer.to_string();
    if trusted {
        expect_one(
            &out,
            "x-forwarded-for",
            Some(extended(joined(&headers, "x-forwarded-for"), &peer_text).as_bytes()),
        );
        let proto_kept = headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok());
        expect_one(
            &out,
            "x-forwarded-proto",
            as_value(proto_kept.unwrap_or(proto)).as_deref(),
        );
        let host_kept = headers
            .get("x-forwarded-host")
            .and_then(|v| v.to_str().ok())
            .or(host_line);
        expect_one(
            &out,
            "x-forwarded-host",
            host_kept.and_then(as_value).as_deref(),
        );
        for name in PROXY_FIELDS {
            assert_eq!(values(&out, name.as_str()), values(&headers, name.as_str()));
        }
    } else {
        expect_one(&out, "x-forwarded-for", Some(peer_text.as_bytes()));
        expect_one(&out, "x-forwarded-proto", Some(proto.as_bytes()));
        expect_one(
            &out,
            "x-forwarded-host",
            host_line.and_then(as_value).as_deref(),
        );
        for name in PROXY_FIELDS {
            assert!(
                out.get(&name).is_none(),
                "{name} passed from an untrusted peer"
            );
        }
        assert_eq!(claimed_scope(&headers, &hop), None);
    }
    expect_one(
        &out,
        "x-real-ip",
        client.map(|c| c.to_string()).as_deref().map(str::as_bytes),
    );
    if hop.forwarded {
        let node = match peer {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("\"[{v6}]\""),
        };
        let mut element = format!("for={node}");
        if let Some(h) = host_line {
            let token = !h.is_empty()
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            if token {
                element.push_str(&format!(";host={h}"));
            } else {
                element.push_str(&format!(
                    ";host=\"{}\"",
                    h.replace('\\', "\\\\").replace('"', "\\\"")
                ));
            }
        }
        element.push_str(&format!(";proto={proto}"));
        let prior = if trusted {
            joined(&headers, "forwarded")
        } else {
            None
        };
        expect_one(
            &out,
            "forwarded",
            as_value(&extended(prior, &element)).as_deref(),
        );
    } else {
        expect_one(&out, "forwarded", None);
    }
    match hop.via {
        Some((name, version)) => {
            let mine = format!("{version} {name}");
            expect_one(
                &out,
                "via",
                as_value(&extended(joined(&headers, "via"), &mine)).as_deref(),
            );
        }
        None => assert_eq!(values(&out, "via"), values(&headers, "via")),
    }
    // Any other field as it came.
    for name in NAMES {
        if !is_forwarding_field(name) && !is_proxy_field(name) {
            assert_eq!(values(&out, name), values(&headers, name), "{name}");
        }
    }

    // Kept aside: the same fields, in the same order, for a head without forwarding fields.
    let plain = !headers.keys().any(|k| is_forwarding_field(k.as_str()));
    if plain && !hop.forwarded {
        let given = host_line
            .and_then(|h| HeaderValue::from_str(h).ok())
            .map(FreshHost::Value);
        match (host_line, Fresh::new(&hop, given)) {
            (_, Some(fresh)) => {
                let fields = |h: &HeaderMap| {
                    h.iter()
                        .map(|(k, v)| (k.as_str().to_string(), v.as_bytes().to_vec()))
                        .collect::<Vec<_>>()
                };
                let mut added = headers.clone();
                fresh.add_to(&mut added);
                assert_eq!(fields(&added), fields(&out));
                // As the server does: other proxies' fields stripped first, then these written.
                let mut stripped = headers.clone();
                if !trusted {
                    strip_proxy_fields(&mut stripped);
                }
                let mut each = fields(&stripped);
                fresh.each(|name, value| each.push((name.to_string(), value.to_vec())));
                assert_eq!(each, fields(&out));
            }
            // Refused only when the host cannot be given as a value.
            (Some(h), None) => assert!(h.is_empty() || HeaderValue::from_str(h).is_err()),
            (None, None) => panic!("no host, yet not kept aside"),
        }
    }

    // A scope is deterministic and reads back as length-prefixed values.
    let scope = claimed_scope(&headers, &hop);
    assert_eq!(scope, claimed_scope(&headers, &hop));
    if let Some(s) = scope {
        assert!(trusted);
        let parts = scope_values(&s);
        assert!(parts.len() >= 2 && parts.len().is_multiple_of(2), "{s:?}");
        assert!(parts[0].is_some());
    }
});
