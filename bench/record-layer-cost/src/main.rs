//! What a TLS 1.3 server's record layer costs per request/response exchange, two ways: rustls's
//! buffered API (`read_tls`, `process_new_packets`, `reader().read`, `writer().write_all`,
//! `write_tls`, the calls tokio-rustls makes), and each record opened where it lies and sealed
//! into one reused buffer with the traffic secrets taken after the handshake.
//!
//! `record-layer-cost <buffered|inplace> N` runs a handshake in memory (an ECDSA P-256
//! certificate made at start), then N exchanges of a 100-byte request for a 1,150-byte response;
//! the client checks every answer. Count only the server's step with callgrind:
//! `valgrind --tool=callgrind --toggle-collect='record_layer_cost::server_*_step' ...`, then
//! divide the total by N.

use std::io::{Read, Write};
use std::sync::Arc;

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM, AES_256_GCM};
use rustls::ConnectionTrafficSecrets;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

fn pair() -> (rustls::ClientConnection, rustls::ServerConnection) {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert: CertificateDer<'static> = made.cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(made.signing_key.serialize_der().into());
    let mut sc = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)
        .unwrap();
    sc.enable_secret_extraction = true;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let mut cc = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cc.enable_secret_extraction = true;
    let mut c =
        rustls::ClientConnection::new(Arc::new(cc), ServerName::try_from("localhost").unwrap())
            .unwrap();
    let mut s = rustls::ServerConnection::new(Arc::new(sc)).unwrap();
    let mut buf = Vec::new();
    for _ in 0..10 {
        buf.clear();
        c.write_tls(&mut buf).unwrap();
        s.read_tls(&mut &buf[..]).unwrap();
        s.process_new_packets().unwrap();
        buf.clear();
        s.write_tls(&mut buf).unwrap();
        c.read_tls(&mut &buf[..]).unwrap();
        c.process_new_packets().unwrap();
    }
    assert!(!c.is_handshaking() && !s.is_handshaking());
    (c, s)
}

#[inline(never)]
fn server_buffered_step(
    s: &mut rustls::ServerConnection,
    req: &[u8],
    resp: &[u8],
    rbuf: &mut [u8],
    out: &mut Vec<u8>,
) -> usize {
    s.read_tls(&mut &req[..]).unwrap();
    s.process_new_packets().unwrap();
    let n = s.reader().read(rbuf).unwrap();
    s.writer().write_all(resp).unwrap();
    out.clear();
    s.write_tls(out).unwrap();
    n
}

struct Dir {
    key: LessSafeKey,
    iv: [u8; 12],
    seq: u64,
}
impl Dir {
    fn new(s: ConnectionTrafficSecrets, seq: u64) -> Dir {
        let (alg, key, iv) = match s {
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&AES_128_GCM, key, iv),
            _ => panic!("suite"),
        };
        let mut v = [0u8; 12];
        v.copy_from_slice(iv.as_ref());
        Dir {
            key: LessSafeKey::new(UnboundKey::new(alg, key.as_ref()).unwrap()),
            iv: v,
            seq,
        }
    }
    fn nonce(&mut self) -> Nonce {
        let mut n = self.iv;
        for (a, b) in n[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *a ^= b;
        }
        self.seq += 1;
        Nonce::assume_unique_for_key(n)
    }
    #[inline(always)]
    fn seal(&mut self, plain: &[u8], out: &mut Vec<u8>) {
        let at = out.len();
        let len = plain.len() + 1 + 16;
        out.extend_from_slice(&[23, 3, 3, (len >> 8) as u8, len as u8]);
        out.extend_from_slice(plain);
        out.push(23);
        let hdr: [u8; 5] = out[at..at + 5].try_into().unwrap();
        let nonce = self.nonce();
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(hdr), &mut out[at + 5..])
            .unwrap();
        out.extend_from_slice(tag.as_ref());
    }
    #[inline(always)]
    fn open<'a>(&mut self, rec: &'a mut [u8]) -> &'a [u8] {
        let hdr: [u8; 5] = rec[..5].try_into().unwrap();
        assert_eq!(hdr[0], 23);
        let len = u16::from_be_bytes([hdr[3], hdr[4]]) as usize;
        let nonce = self.nonce();
        let p = self
            .key
            .open_in_place(nonce, Aad::from(hdr), &mut rec[5..5 + len])
            .unwrap();
        let end = p.iter().rposition(|&b| b != 0).unwrap();
        assert_eq!(p[end], 23);
        &p[..end]
    }
}

#[inline(never)]
fn server_inplace_step(
    rx: &mut Dir,
    tx: &mut Dir,
    req: &mut [u8],
    resp: &[u8],
    rbuf: &mut [u8],
    out: &mut Vec<u8>,
) -> usize {
    let p = rx.open(req);
    let n = p.len();
    // The buffered side copies the request out to its caller; so does this one.
    rbuf[..n].copy_from_slice(p);
    out.clear();
    tx.seal(resp, out);
    n
}

fn main() {
    let mode = std::env::args().nth(1).unwrap();
    let iters: usize = std::env::args().nth(2).unwrap().parse().unwrap();
    let req = vec![b'q'; 100];
    let resp = vec![b'r'; 1150];
    let mut rbuf = vec![0u8; 16384];
    let mut out = Vec::with_capacity(20000);
    let (mut c, mut s) = pair();
    let mut rec = Vec::new();
    let mut total = 0;
    if mode == "buffered" {
        let mut sink = vec![0u8; 4096];
        for _ in 0..iters {
            c.writer().write_all(&req).unwrap();
            rec.clear();
            c.write_tls(&mut rec).unwrap();
            total += server_buffered_step(&mut s, &rec, &resp, &mut rbuf, &mut out);
            c.read_tls(&mut &out[..]).unwrap();
            c.process_new_packets().unwrap();
            let n = c.reader().read(&mut sink).unwrap();
            assert_eq!(n, resp.len());
        }
    } else {
        let cs = c.dangerous_extract_secrets().unwrap();
        let ss = s.dangerous_extract_secrets().unwrap();
        let (mut ctx, mut crx) = (Dir::new(cs.tx.1, cs.tx.0), Dir::new(cs.rx.1, cs.rx.0));
        let (mut stx, mut srx) = (Dir::new(ss.tx.1, ss.tx.0), Dir::new(ss.rx.1, ss.rx.0));
        for _ in 0..iters {
            rec.clear();
            ctx.seal(&req, &mut rec);
            total += server_inplace_step(&mut srx, &mut stx, &mut rec, &resp, &mut rbuf, &mut out);
            let got = crx.open(&mut out);
            assert_eq!(got.len(), resp.len());
        }
    }
    println!("{mode} {total}");
}
