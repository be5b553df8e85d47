//! Attack catalogue against a running sluice: forged, flipped, replayed, re-scoped and re-pointed
//! tokens. Every refusal must be byte-identical and the origin must see nothing it should not.

mod support;

use std::convert::Infallible;
use std::io::Write;
use std::sync::{Arc, Mutex};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use bytes::Bytes;
use http::Response;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice_media::token::sealed::{Grant, SealedError, SealedKey};
use sluice_media::token::TokenKey;
use support::*;
use tokio::net::TcpListener;

const PW: &str = "hostile-test-password";
const SEGMENT: &[u8] = b"\x47segment-bytes-that-are-not-a-real-ts-but-exact";

/// A one-representation DASH manifest whose segments are [`SEGMENT`].
const MPD: &str = "<?xml version=\"1.0\"?>\n<MPD xmlns=\"urn:mpeg:dash:schema:mpd:2011\" \
    type=\"static\" mediaPresentationDuration=\"PT4S\" minBufferTime=\"PT2S\"><Period>\
    <AdaptationSet mimeType=\"video/mp4\" contentType=\"video\"><Representation id=\"v\" \
    bandwidth=\"500000\" width=\"640\" height=\"360\" codecs=\"avc1.4d401e\">\
    <SegmentTemplate timescale=\"1000\" duration=\"2000\" startNumber=\"1\" \
    initialization=\"init.mp4\" media=\"seg$Number$.m4s\"/></Representation></AdaptationSet>\
    </Period></MPD>";

/// A small HLS origin that records the headers of every request it gets.
struct HlsOrigin {
    addr: std::net::SocketAddr,
    seen: Arc<Mutex<Vec<(String, http::HeaderMap)>>>,
}

impl HlsOrigin {
    async fn start() -> HlsOrigin {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let log = log.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let log = log.clone();
                        async move {
                            let path = req.uri().path().to_string();
                            log.lock()
                                .unwrap()
                                .push((path.clone(), req.headers().clone()));
                            let body: Bytes = match path.as_str() {
                                "/live/index.m3u8" => Bytes::from_static(
                                    b"#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:4\n\
                                      #EXTINF:4.0,\nseg0.ts\n#EXTINF:4.0,\nseg1.ts\n#EXT-X-ENDLIST\n",
                                ),
                                "/vod/manifest.mpd" => Bytes::from_static(MPD.as_bytes()),
                                "/guide.xml" => Bytes::from_static(
                                    b"<?xml version=\"1.0\"?>\n<tv><channel id=\"a\"/></tv>\n",
                                ),
                                _ => Bytes::from_static(SEGMENT),
                            };
                            Ok::<_, Infallible>(Response::new(Full::new(body)))
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        HlsOrigin { addr, seen }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn requests(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    fn saw_header(&self, name: &str) -> bool {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .any(|(_, h)| h.contains_key(name))
    }
}

async fn sluice(accept_mediaflow: bool) -> Sluice {
    let mut config = test_config();
    config.auth.api_password = PW.into();
    config.auth.accept_mediaflow_tokens = accept_mediaflow;
    // The attacks are judged by the origin's request count: no background warm-up of the
    // playlist's segments may add to it.
    config.media.prebuffer_segments = 0;
    Sluice::start(config).await
}

/// [`sluice`] behind a trusted front proxy on this host, whose clients [`observe_from`] plays.
async fn fronted(accept_mediaflow: bool) -> Sluice {
    let mut config = test_config();
    config.auth.api_password = PW.into();
    config.auth.accept_mediaflow_tokens = accept_mediaflow;
    config.auth.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    config.media.prebuffer_segments = 0;
    Sluice::start(config).await
}

/// Everything a client can observe about a refusal except the `date` header.
#[derive(Debug, PartialEq, Eq)]
struct Observed {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    body: Bytes,
}

async fn observe(url: &str) -> Observed {
    observe_as(url, &[]).await
}

/// [`observe`] for the `n`th of many clients behind a trusted front proxy, each its own network:
/// a forged token is a guess at the password, and one network's 21st a minute is the 429
/// (`a_forged_token_is_a_guess_at_the_password_and_counted`), not the refusal judged here.
async fn observe_from(n: usize, url: &str) -> Observed {
    let client = std::net::Ipv4Addr::from(0x0a00_0000 + n as u32).to_string();
    observe_as(url, &[("x-forwarded-for", client.as_str())]).await
}

async fn observe_as(url: &str, headers: &[(&str, &str)]) -> Observed {
    let r = request("GET", url, headers).await;
    let mut headers: Vec<(String, Vec<u8>)> = r
        .headers
        .iter()
        .filter(|(k, _)| *k != http::header::DATE)
        .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
        .collect();
    headers.sort();
    Observed {
        status: r.status.as_u16(),
        headers,
        body: r.body.unwrap(),
    }
}

/// The reference refusal: a token that is plain garbage.
async fn reference(s: &Sluice) -> Observed {
    let r = observe(&s.url("/_token_garbage/proxy/stream")).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.body, Bytes::from_static(br#"{"detail":"invalid token"}"#));
    r
}

/// A real child token: the first segment URL of a manifest rewritten by sluice.
async fn child_segment_url(s: &Sluice, origin: &HlsOrigin) -> String {
    let url = s.url(&format!(
        "/proxy/hls/manifest.m3u8?d={}&api_password={PW}",
        enc(&origin.url("/live/index.m3u8"))
    ));
    let r = get(&url).await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    assert!(!text.contains(PW));
    text.lines()
        .find(|l| !l.starts_with('#') && !l.is_empty())
        .unwrap()
        .to_string()
}

fn split_token(url: &str) -> (&str, &str, &str) {
    let (base, rest) = url.split_once("/_token_").unwrap();
    let (token, path) = rest.split_once('/').unwrap();
    (base, token, path)
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[tokio::test]
async fn a_bit_flip_at_any_byte_of_a_minted_token_gets_the_same_refusal() {
    let origin = HlsOrigin::start().await;
    let s = fronted(true).await;
    let want = reference(&s).await;
    let url = child_segment_url(&s, &origin).await;
    let (base, token, path) = split_token(&url);
    // The untouched token plays the exact origin bytes.
    let ok = get(&url).await;
    assert_eq!(ok.status, 200);
    assert_eq!(ok.body.unwrap(), Bytes::from_static(SEGMENT));
    let fetched = origin.requests();
    let raw = URL_SAFE_NO_PAD
        .decode(token.strip_prefix("s1.").unwrap())
        .unwrap();
    assert!(raw.len() > 40);
    for i in 0..raw.len() {
        let mut flipped = raw.clone();
        flipped[i] ^= 1 << (i % 8);
        let forged = format!("s1.{}", URL_SAFE_NO_PAD.encode(&flipped));
        let got = observe_from(i, &format!("{base}/_token_{forged}/{path}")).await;
        assert_eq!(got, want, "flip at byte {i}");
    }
    // Truncated, extended and re-versioned tokens too.
    for (i, forged) in [
        token[..token.len() - 1].to_string(),
        format!("{token}A"),
        token.replacen("s1.", "s2.", 1),
        "s1.".to_string(),
    ]
    .into_iter()
    .enumerate()
    {
        let got = observe_from(raw.len() + i, &format!("{base}/_token_{forged}/{path}")).await;
        assert_eq!(got, want, "{forged}");
    }
    assert_eq!(
        origin.requests(),
        fetched,
        "no forged token reached the origin"
    );
}

#[tokio::test]
async fn a_padding_oracle_attack_on_a_mediaflow_token_learns_nothing() {
    let origin = Origin::start().await;
    let s = fronted(true).await;
    let want = reference(&s).await;
    // A token as /generate_url (and MediaFlow's own generator) makes it: password inside.
    let params = vec![
        ("d".to_string(), origin.url("/small")),
        ("api_password".to_string(), PW.to_string()),
    ];
    let token = TokenKey::new(PW).encrypt(&params, None, None, [9; 16]);
    let ok = get(&s.url(&format!("/_token_{token}/proxy/stream"))).await;
    assert_eq!(ok.status, 200);
    assert_eq!(ok.body.unwrap(), "hello");
    // The classic attack: vary the last byte of the block before the last one and watch for a
    // response that says "padding was fine". Some of these 255 variants do decrypt with valid
    // padding (then fail as JSON or lose the password); none may answer differently.
    let raw = URL_SAFE_NO_PAD.decode(&token).unwrap();
    let at = raw.len() - 17;
    for guess in 0..=255u8 {
        if guess == raw[at] {
            continue;
        }
        let mut forged = raw.clone();
        forged[at] = guess;
        let t = URL_SAFE_NO_PAD.encode(&forged);
        assert_eq!(
            observe_from(guess.into(), &s.url(&format!("/_token_{t}/proxy/stream"))).await,
            want,
            "guess {guess}"
        );
    }
    // A token that is only the last two blocks (CBC-R building block) and one forged for a
    // chosen plaintext with the wrong key fare no better.
    let t = URL_SAFE_NO_PAD.encode(&raw[raw.len() - 32..]);
    assert_eq!(
        observe_from(256, &s.url(&format!("/_token_{t}/proxy/stream"))).await,
        want
    );
    let t = TokenKey::new("guess").encrypt(&params, None, None, [1; 16]);
    assert_eq!(
        observe_from(257, &s.url(&format!("/_token_{t}/proxy/stream"))).await,
        want
    );
    // From one network, the attack stops at its 20th wrong guess: each forged token is one.
    for i in 0..21u8 {
        let mut forged = raw[raw.len() - 32..].to_vec();
        forged[0] ^= i + 1;
        let t = URL_SAFE_NO_PAD.encode(&forged);
        let url = s.url(&format!("/_token_{t}/proxy/stream"));
        let got = observe_from(258, &url).await.status;
        assert_eq!(got, if i < 20 { 401 } else { 429 }, "guess {}", i + 1);
    }
    // The same wrong token offered again (a player polling with a token minted before a password
    // change) is one guess, however often: its network is not locked out.
    let t = URL_SAFE_NO_PAD.encode(&raw[raw.len() - 32..]);
    let url = s.url(&format!("/_token_{t}/proxy/stream"));
    for i in 0..30 {
        assert_eq!(observe_from(259, &url).await.status, 401, "poll {}", i + 1);
    }
}

#[tokio::test]
async fn a_mediaflow_token_is_a_credential_only_with_the_password() {
    let origin = Origin::start().await;
    let s = sluice(true).await;
    let want = reference(&s).await;
    let key = TokenKey::new(PW);
    let d = ("d".to_string(), origin.url("/small"));
    let pw = ("api_password".to_string(), PW.to_string());
    // Decrypting is not enough: without the password inside it is refused.
    let without = key.encrypt(std::slice::from_ref(&d), None, None, [3; 16]);
    assert_eq!(
        observe(&s.url(&format!("/_token_{without}/proxy/stream"))).await,
        want
    );
    let wrong = key.encrypt(
        &[d.clone(), ("api_password".into(), "nope".into())],
        None,
        None,
        [3; 16],
    );
    assert_eq!(
        observe(&s.url(&format!("/proxy/stream?token={wrong}"))).await,
        want
    );
    // With it: streams, in the path and in the query.
    let with = key.encrypt(&[d.clone(), pw.clone()], None, None, [3; 16]);
    for url in [
        s.url(&format!("/_token_{with}/proxy/stream")),
        s.url(&format!("/proxy/stream?token={with}")),
    ] {
        let r = get(&url).await;
        assert_eq!(r.status, 200, "{url}");
        assert_eq!(r.body.unwrap(), "hello");
    }
    // Expired, or bound to another address: the same refusal.
    let expired = key.encrypt(&[d.clone(), pw.clone()], Some(now() - 5), None, [3; 16]);
    let elsewhere = key.encrypt(&[d.clone(), pw.clone()], None, Some("10.9.9.9"), [3; 16]);
    for t in [expired, elsewhere] {
        assert_eq!(
            observe(&s.url(&format!("/_token_{t}/proxy/stream"))).await,
            want
        );
    }
    // Switched off: even a token with the password is refused, the same way.
    let off = sluice(false).await;
    let want_off = reference(&off).await;
    assert_eq!(want_off, want);
    assert_eq!(
        observe(&off.url(&format!("/_token_{with}/proxy/stream"))).await,
        want
    );
}

#[tokio::test]
async fn an_hls_child_token_cannot_be_repointed_or_given_headers() {
    let origin = HlsOrigin::start().await;
    let s = sluice(true).await;
    let want = reference(&s).await;
    let url = child_segment_url(&s, &origin).await;
    let (base, token, _) = split_token(&url);
    let fetched = origin.requests();
    for attack in [
        format!("{url}?h_authorization=Bearer%20stolen"),
        format!("{url}?h_cookie=session%3D1"),
        format!("{url}?d={}", enc("http://127.0.0.1:1/elsewhere")),
        format!("{url}?key_id=00&key=00"),
        format!("{url}?x_headers=authorization"),
        format!("{url}?rp_content-type=text/html"),
        // Another endpoint family, the ops endpoints, the URL generator.
        format!(
            "{base}/_token_{token}/proxy/stream?d={}",
            enc(&origin.url("/x"))
        ),
        format!("{base}/_token_{token}/proxy/mpd/manifest.m3u8"),
        format!("{base}/_token_{token}/metrics"),
        format!("{base}/_token_{token}/status"),
        format!("{base}/_token_{token}/generate_url"),
        format!("{base}/_token_{token}/playlist.m3u"),
        format!("{base}/_token_{token}/rtp/239.1.1.1:5000"),
    ] {
        assert_eq!(observe(&attack).await, want, "{attack}");
    }
    assert_eq!(origin.requests(), fetched);
    assert!(!origin.saw_header("authorization"));
    assert!(!origin.saw_header("cookie"));
    // The documented harmless additions still play.
    let r = get(&format!("{url}?_HLS_msn=3&_HLS_part=1")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), Bytes::from_static(SEGMENT));
}

#[tokio::test]
async fn minted_tokens_expire_and_stay_bound() {
    let origin = HlsOrigin::start().await;
    let s = sluice(true).await;
    let want = reference(&s).await;
    // A grant sealed with the server's key but expired, or bound to another address, is refused
    // like any forgery (the key is derived as the server derives it).
    let key = SealedKey::derive(PW);
    let grant = |exp: Option<u64>, ip: Option<&str>| Grant {
        params: vec![("d".into(), origin.url("/live/seg0.ts"))],
        scope: vec!["/proxy/hls/".into()],
        exp,
        ip: ip.map(str::to_string),
    };
    let live = key.seal(&grant(Some(now() + 60), Some("127.0.0.1")), [5; 24]);
    let r = get(&s.url(&format!("/_token_{live}/proxy/hls/segment.ts"))).await;
    assert_eq!(r.status, 200);
    for t in [
        key.seal(&grant(Some(now() - 1), None), [5; 24]),
        key.seal(&grant(None, Some("10.1.1.1")), [5; 24]),
        // No scope at all opens nothing.
        key.seal(
            &Grant {
                scope: Vec::new(),
                ..grant(None, None)
            },
            [5; 24],
        ),
    ] {
        assert_eq!(
            observe(&s.url(&format!("/_token_{t}/proxy/hls/segment.ts"))).await,
            want
        );
    }
}

#[tokio::test]
async fn a_playlist_entry_token_opens_channels_only() {
    let origin = Origin::start().await;
    let mut m3u = tempfile::NamedTempFile::new().unwrap();
    m3u.write_all(b"#EXTM3U\n#EXTINF:-1,One\nrtp://239.1.2.3:5000\n")
        .unwrap();
    let mut config = test_config();
    config.auth.api_password = PW.into();
    config.iptv.playlist = Some(m3u.path().to_str().unwrap().to_string());
    config.iptv.interface = Some("lo".into());
    config.iptv.no_data_timeout_ms = 200;
    let s = Sluice::start(config).await;
    let want = reference(&s).await;
    let r = get(&s.url(&format!("/playlist.m3u?api_password={PW}"))).await;
    let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    let entry = text.lines().find(|l| l.starts_with("http://")).unwrap();
    let (base, token, path) = split_token(entry);
    assert_eq!(path, "rtp/239.1.2.3:5000");
    // The entry itself is authorized (the gateway answers 504: nothing is sent to the group).
    assert_eq!(get(entry).await.status, 504);
    for attack in [
        format!(
            "{base}/_token_{token}/proxy/stream?d={}",
            enc(&origin.url("/small"))
        ),
        format!(
            "{base}/proxy/stream?token={token}&d={}",
            enc(&origin.url("/small"))
        ),
        format!("{base}/_token_{token}/metrics"),
        format!("{base}/_token_{token}/status"),
        format!("{base}/_token_{token}/status.json"),
        format!("{base}/_token_{token}/playlist.m3u"),
        format!("{base}/_token_{token}/generate_url"),
    ] {
        assert_eq!(observe(&attack).await, want, "{attack}");
    }
    assert!(origin.seen_path("/small").is_empty());
}

/// `/playlist.m3u` sealed every entry under a fresh nonce per fetch: a player fetching the list
/// again got new URLs for every channel, each a token of its own. One client network now gets the
/// same entries at every fetch; another network its own; the unknown clients (`for=unknown`
/// through a trusted proxy) one network's, the same at every fetch (fresh ones each time were a
/// new share per fetch for a client that made itself unknown).
#[tokio::test]
async fn an_iptv_playlist_fetched_again_gives_the_same_entries_per_network() {
    let mut m3u = tempfile::NamedTempFile::new().unwrap();
    m3u.write_all(
        b"#EXTM3U\n#EXTINF:-1,One\nrtp://239.1.2.3:5000\n#EXTINF:-1,Two\nudp://239.1.2.4:5000\n",
    )
    .unwrap();
    let mut config = test_config();
    config.auth.api_password = PW.into();
    config.auth.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    config.iptv.playlist = Some(m3u.path().to_str().unwrap().to_string());
    config.iptv.interface = Some("lo".into());
    config.iptv.no_data_timeout_ms = 200;
    let s = Sluice::start(config).await;
    let entries = |headers: &'static [(&'static str, &'static str)]| {
        let url = s.url(&format!("/playlist.m3u?api_password={PW}"));
        async move {
            let r = request("GET", &url, headers).await;
            assert_eq!(r.status, 200);
            let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
            let entries: Vec<String> = text
                .lines()
                .filter(|l| l.starts_with("http://"))
                .map(str::to_string)
                .collect();
            assert_eq!(entries.len(), 2, "{text}");
            entries
        }
    };
    let first = entries(&[]).await;
    assert_ne!(first[0], first[1]);
    assert_eq!(
        entries(&[]).await,
        first,
        "the playlist fetched again changed its entry URLs"
    );
    const ELSEWHERE: &[(&str, &str)] = &[("x-forwarded-for", "10.77.0.1")];
    let other = entries(ELSEWHERE).await;
    assert_ne!(other[0], first[0]);
    assert_ne!(other[1], first[1]);
    assert_eq!(entries(ELSEWHERE).await, other);
    // Each is authorized where it was given (the gateway answers 504: the group sends nothing).
    assert_eq!(request("GET", &other[0], ELSEWHERE).await.status, 504);
    assert_eq!(get(&first[1]).await.status, 504);
    const UNKNOWN: &[(&str, &str)] = &[("forwarded", "for=unknown")];
    let unknown = entries(UNKNOWN).await;
    assert_eq!(entries(UNKNOWN).await[0], unknown[0]);
    assert_ne!(unknown[0], first[0]);
}

/// An RTSP entry's token is scoped to its one channel path, which the gateway appends verbatim
/// to `rtsp://host:port`: a dot segment (plain or percent-encoded) or an empty one after the
/// entry would walk the RTSP server to a sibling the scope never named. Refused, with the same
/// answer as every other token refusal, before anything connects.
#[tokio::test]
async fn a_playlist_entry_token_cannot_walk_out_of_its_rtsp_path() {
    let rtsp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = rtsp.local_addr().unwrap().port();
    let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = connections.clone();
    tokio::spawn(async move {
        // Takes each connection and drops it: the gateway answers 502.
        while let Ok((stream, _)) = rtsp.accept().await {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(stream);
        }
    });
    let mut m3u = tempfile::NamedTempFile::new().unwrap();
    write!(
        m3u,
        "#EXTM3U\n#EXTINF:-1,One\nrtsp://127.0.0.1:{port}/live/ch1\n"
    )
    .unwrap();
    let mut config = test_config();
    config.auth.api_password = PW.into();
    config.iptv.playlist = Some(m3u.path().to_str().unwrap().to_string());
    let s = Sluice::start(config).await;
    let want = reference(&s).await;
    let r = get(&s.url(&format!("/playlist.m3u?api_password={PW}"))).await;
    let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    let entry = text.lines().find(|l| l.starts_with("http://")).unwrap();
    let (base, token, path) = split_token(entry);
    assert_eq!(path, format!("rtsp/127.0.0.1:{port}/live/ch1"));
    // The entry itself is authorized: it reaches the RTSP server (which hangs up).
    assert_eq!(get(entry).await.status, 502);
    let before = connections.load(std::sync::atomic::Ordering::SeqCst);
    assert!(before > 0);
    for attack in [
        format!("{entry}/../../vod/x"),
        format!("{entry}/../ch2"),
        format!("{entry}/%2e%2e/%2e%2e/vod/x"),
        format!("{entry}/%2E%2E/ch2"),
        format!("{entry}/.%2e/ch2"),
        format!("{entry}/./x"),
        format!("{entry}//x"),
        format!("{entry}/..%2F..%2Fvod%2Fx"),
        format!("{entry}/..%5Cch2"),
        format!("{entry}/..;x/ch2"),
        format!("{base}/rtsp/127.0.0.1:{port}/live/ch1/../ch2?token={token}"),
    ] {
        assert_eq!(observe(&attack).await, want, "{attack}");
    }
    assert_eq!(
        connections.load(std::sync::atomic::Ordering::SeqCst),
        before,
        "an attack reached the RTSP server"
    );
}

/// A playlist entry's token opens that entry's URL alone: not a path below it on the same RTSP
/// server (`/live` opening `/live/other`), and an entry that is only a host (`rtsp://h:p/`) or only
/// the family (`udp://@`) opens none of the channels under it. Refused before anything connects.
#[tokio::test]
async fn a_playlist_entry_token_opens_no_other_path_on_its_host() {
    let rtsp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = rtsp.local_addr().unwrap().port();
    let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = connections.clone();
    tokio::spawn(async move {
        // Takes each connection and drops it: the gateway answers 502.
        while let Ok((stream, _)) = rtsp.accept().await {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(stream);
        }
    });
    let mut m3u = tempfile::NamedTempFile::new().unwrap();
    write!(
        m3u,
        "#EXTM3U\n#EXTINF:-1,One\nrtsp://127.0.0.1:{port}/live\n\
         #EXTINF:-1,Root\nrtsp://127.0.0.1:{port}/\n#EXTINF:-1,Any\nudp://@\n"
    )
    .unwrap();
    let mut config = test_config();
    config.auth.api_password = PW.into();
    config.iptv.playlist = Some(m3u.path().to_str().unwrap().to_string());
    config.iptv.interface = Some("lo".into());
    config.iptv.no_data_timeout_ms = 200;
    let s = Sluice::start(config).await;
    let want = reference(&s).await;
    let r = get(&s.url(&format!("/playlist.m3u?api_password={PW}"))).await;
    let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    let entries: Vec<&str> = text.lines().filter(|l| l.starts_with("http://")).collect();
    assert_eq!(entries.len(), 3, "{text}");
    let (base, live, path) = split_token(entries[0]);
    assert_eq!(path, format!("rtsp/127.0.0.1:{port}/live"));
    let (_, root, path) = split_token(entries[1]);
    assert_eq!(path, format!("rtsp/127.0.0.1:{port}/"));
    let (_, family, path) = split_token(entries[2]);
    assert_eq!(path, "udp/");
    // The entries themselves are authorized: they reach the RTSP server (which hangs up).
    assert_eq!(get(entries[0]).await.status, 502);
    assert_eq!(get(entries[1]).await.status, 502);
    let before = connections.load(std::sync::atomic::Ordering::SeqCst);
    assert!(before >= 2);
    for attack in [
        format!("{base}/_token_{live}/rtsp/127.0.0.1:{port}/live/other"),
        format!("{base}/_token_{live}/rtsp/127.0.0.1:{port}/live/"),
        format!("{base}/rtsp/127.0.0.1:{port}/live/other?token={live}"),
        format!("{base}/_token_{root}/rtsp/127.0.0.1:{port}/vod/x"),
        format!("{base}/_token_{root}/rtsp/127.0.0.1:{port}/live"),
        format!("{base}/_token_{family}/udp/239.1.2.3:5000"),
        format!("{base}/_token_{family}/udp/239.1.2.3:5000?fcc=127.0.0.1:{port}"),
    ] {
        assert_eq!(observe(&attack).await, want, "{attack}");
    }
    assert_eq!(
        connections.load(std::sync::atomic::Ordering::SeqCst),
        before,
        "an attack reached the RTSP server"
    );
}

/// The playlist's guide link carries a token that opens `/epg.xml.gz` alone: not a path below it
/// (a plain scope on `/epg.xml.gz` opens `/epg.xml.gz/...`), nor its neighbours. Each gets the
/// same answer as every other token refusal. (`/epg.xml.gz.bak` and the like route nowhere: they
/// get a 404 before any token is opened, whatever the token.)
#[tokio::test]
async fn the_guide_links_token_opens_the_guide_alone() {
    let origin = HlsOrigin::start().await;
    let mut m3u = tempfile::NamedTempFile::new().unwrap();
    write!(
        m3u,
        "#EXTM3U x-tvg-url=\"{}\"\n#EXTINF:-1,One\nrtp://239.1.2.3:5000\n",
        origin.url("/guide.xml")
    )
    .unwrap();
    let mut config = test_config();
    config.auth.api_password = PW.into();
    config.iptv.playlist = Some(m3u.path().to_str().unwrap().to_string());
    config.iptv.interface = Some("lo".into());
    let s = Sluice::start(config).await;
    let want = reference(&s).await;
    let r = get(&s.url(&format!("/playlist.m3u?api_password={PW}"))).await;
    let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    let head = text.lines().next().unwrap();
    let guide = head
        .split_once("x-tvg-url=\"")
        .and_then(|(_, rest)| rest.split_once('"'))
        .map(|(url, _)| url)
        .unwrap_or_else(|| panic!("no guide link: {head}"));
    let (base, token, path) = split_token(guide);
    assert_eq!(path, "epg.xml.gz");
    // The link itself opens the guide.
    let r = get(guide).await;
    assert_eq!(r.status, 200, "{guide}");
    assert_eq!(&r.body.unwrap()[..2], b"\x1f\x8b");
    for attack in [
        format!("{base}/_token_{token}/epg.xml.gz/x"),
        format!("{base}/_token_{token}/epg.xml.gz/"),
        format!("{base}/epg.xml.gz/x?token={token}"),
        format!("{base}/_token_{token}/epg.xml"),
        format!("{base}/epg.xml?token={token}"),
        format!("{base}/_token_{token}/playlist.m3u"),
        format!("{base}/_token_{token}/rtp/239.1.2.3:5000"),
    ] {
        assert_eq!(observe(&attack).await, want, "{attack}");
    }
}

/// `POST /generate_url` with this server's password; the URL it answers.
async fn generated(s: &Sluice, endpoint: &str, d: &str) -> String {
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let body = serde_json::json!({
        "mediaflow_proxy_url": s.url(""),
        "endpoint": endpoint,
        "destination_url": d,
        "api_password": PW,
    });
    let req = http::Request::post(s.url("/generate_url"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    use http_body_util::BodyExt;
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let url = json["url"].as_str().unwrap().to_string();
    assert!(!url.contains(PW));
    url
}

#[tokio::test]
async fn a_generated_url_opens_its_one_endpoint_only() {
    let origin = HlsOrigin::start().await;
    let s = sluice(true).await;
    let want = reference(&s).await;
    // HLS: the manifest plays, and its children play the origin's bytes.
    let hls = generated(
        &s,
        "/proxy/hls/manifest.m3u8",
        &origin.url("/live/index.m3u8"),
    )
    .await;
    let r = get(&hls).await;
    assert_eq!(r.status, 200, "{hls}");
    let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    let segment = text
        .lines()
        .find(|l| !l.starts_with('#') && !l.is_empty())
        .unwrap();
    let r = get(segment).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), Bytes::from_static(SEGMENT));
    // DASH as HLS: the master and a media playlist through its child token.
    let mpd = generated(
        &s,
        "/proxy/mpd/manifest.m3u8",
        &origin.url("/vod/manifest.mpd"),
    )
    .await;
    let r = get(&mpd).await;
    assert_eq!(r.status, 200, "{mpd}");
    let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    let variant = text
        .lines()
        .find(|l| !l.starts_with('#') && !l.is_empty())
        .unwrap();
    let r = get(variant).await;
    assert_eq!(r.status, 200, "{variant}");
    assert!(String::from_utf8_lossy(&r.body.unwrap()).contains("#EXTINF"));
    // Each token opens its own endpoint and nothing else: every other path gets the one refusal,
    // and nothing reaches the origin.
    let stream = generated(&s, "/proxy/stream", &origin.url("/live/seg0.ts")).await;
    let fetched = origin.requests();
    for url in [&hls, &mpd, &stream] {
        let (base, token, path) = split_token(url);
        for other in [
            "proxy/stream",
            "proxy/stream/a.ts",
            "proxy/hls/manifest.m3u8",
            "proxy/hls/segment.ts",
            "proxy/mpd/manifest.m3u8",
            "proxy/mpd/playlist.m3u8",
            "proxy/forward",
            "playlist/playlist",
            "generate_url",
            "metrics",
            "status",
            "playlist.m3u",
            "player_api.php?username=u&password=p",
            "live/u/p/1.ts",
            "rtp/239.1.1.1:5000",
        ] {
            if other.starts_with(path) {
                continue;
            }
            let attack = format!("{base}/_token_{token}/{other}");
            assert_eq!(observe(&attack).await, want, "{attack}");
        }
        let attack = format!("{base}/proxy/hls/manifest.m3u8?token={token}");
        if !path.starts_with("proxy/hls/") {
            assert_eq!(observe(&attack).await, want, "{attack}");
        }
    }
    assert_eq!(origin.requests(), fetched);
}

/// A sealed `/proxy/stream` token hides its destination, and the pacing refusal must not give it
/// away: a holder asking until the paced host's queue passes `max_wait_secs` gets a 503 with its
/// status, kind and `Retry-After`, naming no host.
#[tokio::test]
async fn a_paced_refusal_does_not_name_a_tokens_hidden_host() {
    let origin = HlsOrigin::start().await;
    let mut config = test_config();
    config.auth.api_password = PW.into();
    config.media.ratelimit.hosts = [("127.0.0.1".to_string(), 10_000)].into();
    config.media.ratelimit.max_wait_secs = 1;
    let s = Sluice::start(config).await;
    let stream = generated(&s, "/proxy/stream", &origin.url("/live/seg0.ts")).await;
    assert!(stream.contains("/_token_"), "{stream}");
    let r = get(&stream).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), Bytes::from_static(SEGMENT));
    let r = get(&stream).await;
    assert_eq!(r.status, 503);
    let retry: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((9..=10).contains(&retry), "{retry}");
    let body = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["kind"], "rate_limited", "{body}");
    assert!(v.get("upstream").is_none(), "{body}");
    assert!(!body.contains("127.0.0.1"), "{body}");
    assert_eq!(origin.requests(), 1);
}

/// Any token a player holds tests a password guess offline: its tag verifies or not. A token the
/// server mints must not open under the fast key schedule (HKDF of the password alone) even for
/// the right password, so each guess costs an Argon2id. A token sealed under that old schedule
/// before the change (a saved XC username) still plays, and only under the server's password.
#[tokio::test]
async fn a_minted_token_cannot_test_password_guesses_at_hkdf_speed() {
    let origin = HlsOrigin::start().await;
    let s = sluice(false).await;
    let want = reference(&s).await;
    let child = child_segment_url(&s, &origin).await;
    let (_, token, _) = split_token(&child);
    for guess in ["password", "hunter2", PW] {
        assert_eq!(
            SealedKey::legacy(guess).open(token),
            Err(SealedError::Authentication),
            "{guess}"
        );
    }
    assert!(SealedKey::derive(PW).open(token).is_ok());
    let r = get(&child).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), Bytes::from_static(SEGMENT));
    // Legacy tokens: the server's password plays, another is the reference refusal.
    let grant = Grant {
        params: vec![("d".into(), origin.url("/live/seg1.ts"))],
        scope: vec!["/proxy/hls/".into()],
        exp: Some(now() + 60),
        ip: None,
    };
    let old = SealedKey::legacy(PW).seal(&grant, [8; 24]);
    let r = get(&s.url(&format!("/_token_{old}/proxy/hls/segment.ts"))).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), Bytes::from_static(SEGMENT));
    let fetched = origin.requests();
    let foreign = SealedKey::legacy("another-password").seal(&grant, [8; 24]);
    assert_eq!(
        observe(&s.url(&format!("/_token_{foreign}/proxy/hls/segment.ts"))).await,
        want
    );
    assert_eq!(origin.requests(), fetched);
}

/// A sluice whose app the test keeps, to reload it.
async fn reloadable(config: &sluice::config::Config) -> (String, Arc<sluice::app::App>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = sluice::app::App::new(config).unwrap();
    let server =
        sluice::server::Server::from_listeners(vec![listener], &config.server, app.clone())
            .unwrap();
    tokio::spawn(server.run(std::future::pending::<()>()));
    (base, app)
}

/// The first child URL of the origin's playlist as rewritten by the sluice at `base`.
async fn child_at(base: &str, origin: &HlsOrigin, password: &str) -> String {
    let url = format!(
        "{base}/proxy/hls/manifest.m3u8?d={}&api_password={password}",
        enc(&origin.url("/live/index.m3u8"))
    );
    let r = get(&url).await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    text.lines()
        .find(|l| !l.starts_with('#') && !l.is_empty())
        .unwrap()
        .to_string()
}

/// A rolling upgrade: nodes of an older version, which know only the legacy key, share the
/// password with upgraded ones. With `auth.seal_with_legacy_key` an upgraded node's child URLs
/// open on an old node (and on an upgraded node without the switch); turned off by a reload, new
/// children are sealed under the Argon2id key only. A reload that keeps the password keeps the
/// key and the children minted so far; a new password refuses them.
#[tokio::test]
async fn the_legacy_switch_carries_a_rolling_upgrade_and_reloads_keep_the_key() {
    let origin = HlsOrigin::start().await;
    let old_node = SealedKey::legacy(PW);
    let mut config = test_config();
    config.auth.api_password = PW.into();
    config.auth.seal_with_legacy_key = true;
    config.media.prebuffer_segments = 0;
    config.server.listen = vec!["127.0.0.1:0".parse().unwrap()];
    let (base, app) = reloadable(&config).await;
    let default_node = sluice(false).await;
    let child = child_at(&base, &origin, PW).await;
    let (_, token, path) = split_token(&child);
    assert_eq!(
        old_node.open(token).unwrap().params,
        [("d".to_string(), origin.url("/live/seg0.ts"))]
    );
    let on_default = default_node.url(&format!("/_token_{token}/{path}"));
    let r = get(&on_default).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), Bytes::from_static(SEGMENT));

    // The upgrade is done: the switch goes off by a reload, the password stays.
    config.auth.seal_with_legacy_key = false;
    app.reload(&config).unwrap();
    let strong = child_at(&base, &origin, PW).await;
    assert_ne!(
        strong, child,
        "a child sealed under the key just turned off was reused"
    );
    let (_, strong_token, _) = split_token(&strong);
    assert_eq!(
        old_node.open(strong_token),
        Err(SealedError::Authentication)
    );
    // The legacy-sealed child still plays.
    let r = get(&child).await;
    assert_eq!(r.status, 200);

    // A reload that changes nothing the key hangs on: the same child URL (the key and the
    // children it minted are kept).
    config.auth.accept_mediaflow_tokens = true;
    app.reload(&config).unwrap();
    assert_eq!(child_at(&base, &origin, PW).await, strong);

    // A new password: the old children are refused, new ones differ.
    config.auth.api_password = "another-hostile-password".into();
    app.reload(&config).unwrap();
    let r = get(&strong).await;
    assert_eq!(r.status, 401);
    let moved = child_at(&base, &origin, "another-hostile-password").await;
    assert_ne!(moved, strong);
    let r = get(&moved).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), Bytes::from_static(SEGMENT));
}

/// One request with a body from the client a trusted front proxy on this host names in
/// `X-Forwarded-For`: its status and `Retry-After`.
async fn from(
    client: &str,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Option<String>) {
    let http = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let mut b = http::Request::builder()
        .method(method)
        .uri(url)
        .header("x-forwarded-for", client);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b.body(Full::new(Bytes::from(body.to_string()))).unwrap();
    let resp = http.request(req).await.unwrap();
    let retry = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    (resp.status().as_u16(), retry)
}

/// A sluice with a password behind a trusted front proxy on this host.
async fn guarded() -> Sluice {
    let mut config = test_config();
    config.auth.api_password = PW.into();
    config.auth.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    Sluice::start(config).await
}

/// A request offering a password: method, URL, headers, and the status a wrong one gets.
type Place = (&'static str, String, Vec<(String, String)>, u16);

/// Each place that compares the password, with `pw` offered in its form, and the status it gives
/// a wrong one.
fn password_places(s: &Sluice, pw: &str) -> Vec<Place> {
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("u:{pw}"))
    );
    let xc_user =
        base64::engine::general_purpose::STANDARD.encode(format!("http://xc.invalid:u:{pw}"));
    let header = vec![("api_password".to_string(), pw.to_string())];
    vec![
        (
            "GET",
            s.url(&format!("/metrics?api_password={}", enc(pw))),
            vec![],
            403,
        ),
        (
            "GET",
            s.url("/status"),
            vec![("authorization".to_string(), basic)],
            401,
        ),
        ("POST", s.url("/admin/reload"), header.clone(), 403),
        ("POST", s.url("/playlist/link"), header, 403),
        (
            "GET",
            s.url(&format!(
                "/player_api.php?username={}&password=x",
                enc(&xc_user)
            )),
            vec![],
            403,
        ),
    ]
}

/// The `/generate_url` body offering `pw`.
fn generate_body(s: &Sluice, pw: &str) -> String {
    serde_json::json!({
        "mediaflow_proxy_url": s.url(""),
        "endpoint": "/proxy/stream",
        "destination_url": "http://origin.invalid/v.mp4",
        "api_password": pw,
    })
    .to_string()
}

/// A guesser gets 20 wrong passwords a minute from its network, wherever it offers them; then
/// every request that offers one (the right one too, so the limit proves nothing) is a 429 with
/// `Retry-After` until the window ends, while another client is served. Without the limit the
/// 21st guess was compared like the first (thousands a second over one HTTP/2 connection).
#[tokio::test]
async fn password_guessing_is_limited_per_client_network() {
    let s = guarded().await;
    let (guesser, other) = ("203.0.113.7", "203.0.113.8");
    let json = [("content-type", "application/json")];
    for round in 0..5 {
        for (method, url, headers, wrong) in password_places(&s, &format!("guess-{round}")) {
            let headers: Vec<(&str, &str)> = headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let (status, retry) = from(guesser, method, &url, &headers, "{}").await;
            if round < 4 {
                assert_eq!((status, retry), (wrong, None), "guess {round} at {url}");
            } else {
                // Guesses 21-25: refused uncompared.
                assert_eq!(status, 429, "guess {round} at {url}");
                let retry: u64 = retry.unwrap().parse().unwrap();
                assert!((1..=60).contains(&retry), "{retry}");
            }
        }
    }
    // The right password, in every form, from the guesser's network: refused too.
    for (method, url, headers, _) in password_places(&s, PW) {
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let (status, retry) = from(guesser, method, &url, &headers, "{}").await;
        assert_eq!(status, 429, "right password at {url}");
        assert!(retry.is_some());
    }
    let body = generate_body(&s, PW);
    let (status, _) = from(guesser, "POST", &s.url("/generate_url"), &json, &body).await;
    assert_eq!(status, 429);
    // Another client (as the front proxy names it) is served.
    let url = s.url(&format!("/metrics?api_password={PW}"));
    assert_eq!(from(other, "GET", &url, &[], "").await.0, 200);

    // `/generate_url` answers 200 to a wrong password, with a token whose form tells it from the
    // right one: each is a guess, counted against the same limit.
    let generator = "198.51.100.9";
    for i in 0..20 {
        let body = generate_body(&s, &format!("guess-{i}"));
        let (status, _) = from(generator, "POST", &s.url("/generate_url"), &json, &body).await;
        assert_eq!(status, 200, "guess {i}");
    }
    let body = generate_body(&s, "guess-20");
    let (status, retry) = from(generator, "POST", &s.url("/generate_url"), &json, &body).await;
    assert_eq!((status, retry.is_some()), (429, true));
    let body = generate_body(&s, PW);
    let (status, _) = from(generator, "POST", &s.url("/generate_url"), &json, &body).await;
    assert_eq!(status, 429);
    assert_eq!(from(generator, "GET", &url, &[], "").await.0, 429);
    // A right password there is not a guess: another client mints with it.
    let (status, _) = from(other, "POST", &s.url("/generate_url"), &json, &body).await;
    assert_eq!(status, 200);

    // Seen: 20 + 20 wrong passwords, and the refusals.
    let metrics = get(&s.url(&format!("/metrics?api_password={PW}"))).await;
    let text = String::from_utf8(metrics.body.unwrap().to_vec()).unwrap();
    assert!(text.contains("sluice_auth_failures_total 40"), "{text}");
    assert!(text.contains("sluice_auth_limited_total 14"), "{text}");
}

/// A token is a credential as the password is, and a forged one a guess at it: a MediaFlow token
/// (whose key is the password padded, no MAC) made under a guess and carrying it opens only when
/// the guess is right, as does a sealed token under the legacy key (a cheap HKDF of the bare
/// password), in the path, the query or an XC username. Each forgery is booked against the same
/// limit as a wrong password: the 21st from one network is the 429, and so is a valid token from
/// it then, while another network's valid token plays. Without it every forgery was the one 401,
/// uncounted: one free guess per request.
#[tokio::test]
async fn a_forged_token_is_a_guess_at_the_password_and_counted() {
    let origin = Origin::start().await;
    let s = guarded().await;
    let d = ("d".to_string(), origin.url("/small"));
    let mediaflow = |pw: &str| {
        let claims = [d.clone(), ("api_password".to_string(), pw.to_string())];
        TokenKey::new(pw).encrypt(&claims, None, None, [5; 16])
    };
    let valid = mediaflow(PW);
    let (guesser, other) = ("203.0.113.7", "203.0.113.8");
    for i in 0..25 {
        let forged = mediaflow(&format!("guess-{i}"));
        let url = match i % 2 {
            0 => s.url(&format!("/proxy/stream?token={forged}")),
            _ => s.url(&format!("/_token_{forged}/proxy/stream")),
        };
        let (status, retry) = from(guesser, "GET", &url, &[], "").await;
        if i < 20 {
            assert_eq!((status, retry), (401, None), "guess {}", i + 1);
        } else {
            assert_eq!(status, 429, "guess {}", i + 1);
            let retry: u64 = retry.unwrap().parse().unwrap();
            assert!((1..=60).contains(&retry), "{retry}");
        }
    }
    // The right token from the guesser's network: refused too, so the limit proves nothing.
    for url in [
        s.url(&format!("/proxy/stream?token={valid}")),
        s.url(&format!("/_token_{valid}/proxy/stream")),
    ] {
        assert_eq!(from(guesser, "GET", &url, &[], "").await.0, 429, "{url}");
        assert_eq!(from(other, "GET", &url, &[], "").await.0, 200, "{url}");
    }

    // Sealed tokens under the legacy key of a guess, in the path and as an XC username.
    let grant = Grant {
        params: vec![("d".into(), origin.url("/small"))],
        scope: vec!["/proxy/stream".into()],
        exp: None,
        ip: None,
    };
    for (network, xc) in [("198.51.100.7", false), ("198.51.100.8", true)] {
        for i in 0..21 {
            let guess = format!("guess-{i}");
            let url = if xc {
                let user = SealedKey::legacy(&guess).seal(&grant, [9; 24]);
                s.url(&format!("/player_api.php?username={user}&password=x"))
            } else {
                let token = SealedKey::legacy(&guess).seal(&grant, [9; 24]);
                s.url(&format!("/_token_{token}/proxy/stream"))
            };
            let want = match (i < 20, xc) {
                (true, false) => 401,
                (true, true) => 403,
                (false, _) => 429,
            };
            let (status, _) = from(network, "GET", &url, &[], "").await;
            assert_eq!(status, want, "xc {xc}, guess {}", i + 1);
        }
        let url = s.url(&format!("/_token_{valid}/proxy/stream"));
        assert_eq!(from(network, "GET", &url, &[], "").await.0, 429);
    }

    // Refusals that test no password are not guesses: an expired token of the right password,
    // and garbage, stay the one 401 however many times.
    let expired = TokenKey::new(PW).encrypt(
        &[d.clone(), ("api_password".to_string(), PW.to_string())],
        Some(now() - 5),
        None,
        [5; 16],
    );
    let honest = "192.0.2.44";
    for i in 0..25 {
        let url = match i % 2 {
            0 => s.url(&format!("/_token_{expired}/proxy/stream")),
            _ => s.url("/_token_garbage/proxy/stream"),
        };
        assert_eq!(from(honest, "GET", &url, &[], "").await.0, 401, "{i}");
    }
    let url = s.url(&format!("/_token_{valid}/proxy/stream"));
    assert_eq!(from(honest, "GET", &url, &[], "").await.0, 200);
}

/// `/generate_url` and `/generate_urls` mint links for another MediaFlow server with that
/// server's password (docs/media.md): with `mediaflow_proxy_url` naming another host or port,
/// the password is not compared with this server's, so it is no guess and never limited, and
/// the answer is MediaFlow's format under it. Without the check each was a wrong password: the
/// 21st request from one network was a 429, and the network was locked out of everything.
#[tokio::test]
async fn minting_links_for_another_mediaflow_server_is_no_guess() {
    let s = guarded().await;
    let json = [("content-type", "application/json")];
    let client = "198.51.100.20";
    let this_port = s.addr.port();
    let others = [
        "https://other.example".to_string(),
        format!("http://other.example:{this_port}"),
        // This server's host on another port.
        format!("http://127.0.0.1:{}", this_port.wrapping_add(1).max(1)),
    ];
    for i in 0..25 {
        let base = &others[i % others.len()];
        let body = serde_json::json!({
            "mediaflow_proxy_url": base,
            "endpoint": "/proxy/stream",
            "destination_url": "http://origin.invalid/v.mp4",
            "api_password": "other-server-pw",
        })
        .to_string();
        let http = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .build_http::<Full<Bytes>>();
        let req = http::Request::post(s.url("/generate_url"))
            .header("x-forwarded-for", client)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let resp = http.request(req).await.unwrap();
        assert_eq!(resp.status(), 200, "request {} for {base}", i + 1);
        let bytes = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap()
            .to_bytes();
        let answer: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let url = answer["url"].as_str().unwrap();
        let (got_base, rest) = url.split_once("/_token_").unwrap();
        assert_eq!(got_base, base.as_str());
        let (token, path) = rest.split_once('/').unwrap();
        assert_eq!(path, "proxy/stream");
        // MediaFlow's token for that server, as MediaFlow writes it: the password inside.
        let claims = sluice_media::token::decrypt_token(token, "other-server-pw").unwrap();
        assert_eq!(claims.param("api_password"), Some("other-server-pw"));
    }
    for i in 0..5 {
        let body = serde_json::json!({
            "mediaflow_proxy_url": "https://other.example",
            "api_password": "other-server-pw",
            "urls": [{"endpoint": "/proxy/stream", "destination_url": "http://o.invalid/v.mp4"}],
        })
        .to_string();
        let (status, _) = from(client, "POST", &s.url("/generate_urls"), &json, &body).await;
        assert_eq!(status, 200, "generate_urls {}", i + 1);
    }
    // Not limited: the right password from that network is served.
    let url = s.url(&format!("/metrics?api_password={PW}"));
    assert_eq!(from(client, "GET", &url, &[], "").await.0, 200);
    // This server named (its `Host`), a wrong password is still a guess.
    for i in 0..20 {
        let body = generate_body(&s, &format!("guess-{i}"));
        let (status, _) = from(client, "POST", &s.url("/generate_url"), &json, &body).await;
        assert_eq!(status, 200, "guess {}", i + 1);
    }
    let body = generate_body(&s, "guess-20");
    let (status, _) = from(client, "POST", &s.url("/generate_url"), &json, &body).await;
    assert_eq!(status, 429);
}

/// An origin answering fixed texts by path; `/once/...` holds its first request open (forever)
/// and answers its others with the text of the rest of the path. Counts requests by path.
struct TextOrigin {
    addr: std::net::SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
}

impl TextOrigin {
    async fn start(texts: &'static [(&'static str, &'static str)]) -> TextOrigin {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::<String>::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let log = log.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let log = log.clone();
                        async move {
                            let path = req.uri().path().to_string();
                            let before = {
                                let mut log = log.lock().unwrap();
                                let n = log.iter().filter(|p| **p == path).count();
                                log.push(path.clone());
                                n
                            };
                            let name = match path.strip_prefix("/once") {
                                Some(rest) => {
                                    if before == 0 {
                                        std::future::pending::<()>().await;
                                    }
                                    rest.to_string()
                                }
                                None => path.clone(),
                            };
                            let text = texts
                                .iter()
                                .find(|(p, _)| *p == name)
                                .map_or("", |(_, t)| *t);
                            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(text))))
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        TextOrigin { addr, seen }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn seen(&self, path: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|p| *p == path)
            .count()
    }
}

/// A variant playlist naming its segments where an XC panel writes them: under the account
/// sluice hides.
const HIDDEN_VARIANT: &str = "#EXTM3U\n#EXT-X-TARGETDURATION:4\n#EXTINF:4.0,\n\
    http://127.0.0.1:9/hlsr/sess/realuser/realpass/1.ts\n#EXT-X-ENDLIST\n";

/// The URI lines of a playlist.
fn uris(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// A manifest's child token was scoped to the whole `/proxy/hls/` family, so it opened
/// `/proxy/hls/segment.ts`, which pipes the token's `d` back byte for byte: the holder of a
/// variant playlist's token read the upstream playlist as written (the account and URLs the
/// rewrite hides). Each child now opens the one endpoint it was minted for.
#[tokio::test]
async fn a_manifest_child_cannot_read_its_playlist_unrewritten() {
    let origin = TextOrigin::start(&[
        (
            "/master.m3u8",
            "#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=1000\nv.m3u8\n",
        ),
        ("/v.m3u8", HIDDEN_VARIANT),
    ])
    .await;
    let s = sluice(true).await;
    let want = reference(&s).await;
    let master = s.url(&format!(
        "/proxy/hls/manifest.m3u8?d={}&api_password={PW}",
        enc(&origin.url("/master.m3u8"))
    ));
    let r = get(&master).await;
    assert_eq!(r.status, 200);
    let variant = uris(std::str::from_utf8(&r.body.unwrap()).unwrap()).remove(0);
    let (base, token, path) = split_token(&variant);
    assert_eq!(path, "proxy/hls/manifest.m3u8");
    // Played as it was minted: rewritten, the account hidden.
    let r = get(&variant).await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    assert!(
        text.contains("#EXTINF") && !text.contains("realpass"),
        "{text}"
    );
    let fetched = origin.seen("/v.m3u8");
    for other in [
        "proxy/hls/segment.ts",
        "proxy/hls/segment.m4s",
        "proxy/hls/segment",
        "proxy/hls/key_proxy/manifest.m3u8",
    ] {
        let attack = format!("{base}/_token_{token}/{other}");
        let got = observe(&attack).await;
        assert!(
            !String::from_utf8_lossy(&got.body).contains("realpass"),
            "{attack}: the upstream playlist as written"
        );
        assert_eq!(got, want, "{attack}");
    }
    assert_eq!(origin.seen("/v.m3u8"), fetched);
    // Its segment's child opens its segment endpoint alone, not the manifest.
    let seg = uris(&text).remove(0);
    let (base, token, path) = split_token(&seg);
    assert_eq!(path, "proxy/hls/segment.ts");
    let attack = format!("{base}/_token_{token}/proxy/hls/manifest.m3u8");
    assert_eq!(observe(&attack).await, want, "{attack}");
}

/// A `/playlist/playlist` entry's token was scoped to its endpoint family the same way: its
/// holder read the hidden source's playlist as written through `segment.ts`.
#[tokio::test]
async fn a_merged_playlist_entry_cannot_read_its_source_unrewritten() {
    let origin = TextOrigin::start(&[("/v.m3u8", HIDDEN_VARIANT)]).await;
    let s = sluice(true).await;
    let want = reference(&s).await;
    let entry = merged_entry(&s, &origin).await;
    let (base, token, path) = split_token(&entry);
    assert_eq!(path, "proxy/hls/manifest.m3u8");
    let r = get(&entry).await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    assert!(
        text.contains("#EXTINF") && !text.contains("realpass"),
        "{text}"
    );
    for other in ["proxy/hls/segment.ts", "proxy/hls/key_proxy/manifest.m3u8"] {
        let attack = format!("{base}/_token_{token}/{other}");
        let got = observe(&attack).await;
        assert!(
            !String::from_utf8_lossy(&got.body).contains("realpass"),
            "{attack}: the upstream playlist as written"
        );
        assert_eq!(got, want, "{attack}");
    }
}

/// The one entry of a `/playlist/playlist` merge of a list naming `origin`'s `/v.m3u8`.
async fn merged_entry(s: &Sluice, origin: &TextOrigin) -> String {
    merged_entries(s, &[origin.url("/v.m3u8")]).await.remove(0)
}

/// The entries of a merge of one list naming `targets`, fetched with the password.
async fn merged_entries(s: &Sluice, targets: &[String]) -> Vec<String> {
    merged_entries_as(s, targets, &[]).await
}

/// [`merged_entries`], the merge fetched with `headers`.
async fn merged_entries_as(
    s: &Sluice,
    targets: &[String],
    headers: &[(&str, &str)],
) -> Vec<String> {
    let mut list = String::from("#EXTM3U\n");
    for (i, t) in targets.iter().enumerate() {
        list.push_str(&format!("#EXTINF:-1,Channel {i}\n{t}\n"));
    }
    let lists = ListOrigin::start(list).await;
    let url = s.url(&format!(
        "/playlist/playlist?d={}&api_password={PW}",
        enc(&lists)
    ));
    let r = request("GET", &url, headers).await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    assert!(!text.contains(PW));
    let entries = uris(&text);
    assert_eq!(entries.len(), targets.len(), "{text}");
    entries
}

/// Serves one M3U list at `/list.m3u`; its URL.
struct ListOrigin;

impl ListOrigin {
    async fn start(list: String) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let list = Bytes::from(list);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let list = list.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |_req: http::Request<hyper::body::Incoming>| {
                        let list = list.clone();
                        async move { Ok::<_, Infallible>(Response::new(Full::new(list))) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        format!("http://{addr}/list.m3u")
    }
}

/// `/playlist/playlist` sealed every entry again under a fresh nonce per fetch, and a sealed
/// token's in-flight share is keyed by its text: fetching the merge again gave each channel a new
/// spelling with a new full share of `media.max_requests_per_token`. One client network now gets
/// the same entry URLs at every fetch, so one share per channel; another network gets its own
/// (one share for every viewer of a channel would let one viewer lock it).
#[tokio::test]
async fn a_merged_playlist_fetched_again_gives_the_same_entries_and_no_new_share() {
    let origin = TextOrigin::start(&[("/v.m3u8", HIDDEN_VARIANT)]).await;
    let mut config = test_config();
    config.auth.api_password = PW.into();
    // Clients of a front proxy on this host: another network is another `X-Forwarded-For`.
    config.auth.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    config.media.prebuffer_segments = 0;
    config.media.max_requests_per_token = 1;
    let s = Sluice::start(config).await;
    let targets = [origin.url("/once/v.m3u8"), origin.url("/v.m3u8")];
    let first = merged_entries(&s, &targets).await;
    let second = merged_entries(&s, &targets).await;
    assert_eq!(
        first, second,
        "the merge fetched again changed its entry URLs"
    );
    // The entry's one place is held: its upstream request never ends.
    let held = {
        let url = first[0].clone();
        tokio::spawn(async move { get(&url).await })
    };
    while origin.seen("/once/v.m3u8") == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // The same channel from either fetch is past its share.
    for (fetch, entry) in [("first", &first[0]), ("second", &second[0])] {
        let r = get(entry).await;
        assert_eq!(
            r.status, 429,
            "the {fetch} fetch's entry got a share of its own"
        );
        let body = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
        assert!(body.contains("max_requests_per_token"), "{body}");
    }
    assert_eq!(origin.seen("/once/v.m3u8"), 1);
    // Another channel has its own share.
    assert_eq!(get(&second[1]).await.status, 200);
    // Another client network gets its own entries, with their own shares.
    let elsewhere = [("x-forwarded-for", "10.77.0.1")];
    let other = merged_entries_as(&s, &targets, &elsewhere).await;
    assert_ne!(other[0], first[0]);
    assert_eq!(merged_entries_as(&s, &targets, &elsewhere).await, other);
    let r = request("GET", &other[0], &elsewhere).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(origin.seen("/once/v.m3u8"), 2);
    assert!(!held.is_finished());
    held.abort();
}
