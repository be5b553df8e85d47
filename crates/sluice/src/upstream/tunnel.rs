//! Client handshakes for outgoing proxies: HTTP CONNECT, SOCKS5 (RFC 1928, RFC 1929 auth) and
//! SOCKS4 with its 4a extension (names resolved by the proxy).

use std::io;
use std::net::IpAddr;

use base64::Engine;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Asks an HTTP proxy for a tunnel to `host:port`.
pub async fn http_connect(
    stream: &mut TcpStream,
    host: &str,
    port: u16,
    auth: Option<&(String, String)>,
) -> io::Result<()> {
    let target = authority(host, port);
    let mut head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
    if let Some((user, pass)) = auth {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
        head.push_str(&format!("Proxy-Authorization: Basic {token}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    // Read the response head byte-wise so no tunnel bytes are consumed.
    let mut buf = Vec::with_capacity(256);
    while !buf.ends_with(b"\r\n\r\n") {
        if buf.len() > 8192 {
            return Err(proxy_error("CONNECT response head too large"));
        }
        let byte = stream.read_u8().await?;
        buf.push(byte);
    }
    let status_ok = buf
        .split(|b| *b == b' ')
        .nth(1)
        .is_some_and(|code| code.first() == Some(&b'2'));
    if !status_ok {
        let line =
            String::from_utf8_lossy(buf.split(|b| *b == b'\r').next().unwrap_or(&[])).into_owned();
        return Err(proxy_error(&format!("proxy refused CONNECT: {line}")));
    }
    Ok(())
}

/// Opens a SOCKS5 tunnel to `host:port`. With `ip` given the proxy gets the address, else the name.
pub async fn socks5(
    stream: &mut TcpStream,
    host: &str,
    ip: Option<IpAddr>,
    port: u16,
    auth: Option<&(String, String)>,
) -> io::Result<()> {
    let methods: &[u8] = if auth.is_some() {
        &[0x00, 0x02]
    } else {
        &[0x00]
    };
    let mut hello = vec![0x05, methods.len() as u8];
    hello.extend_from_slice(methods);
    stream.write_all(&hello).await?;
    let mut choice = [0u8; 2];
    stream.read_exact(&mut choice).await?;
    match (choice, auth) {
        ([0x05, 0x00], _) => {}
        ([0x05, 0x02], Some((user, pass))) => {
            if user.len() > 255 || pass.len() > 255 {
                return Err(proxy_error("SOCKS5 credentials longer than 255 bytes"));
            }
            let mut msg = vec![0x01, user.len() as u8];
            msg.extend_from_slice(user.as_bytes());
            msg.push(pass.len() as u8);
            msg.extend_from_slice(pass.as_bytes());
            stream.write_all(&msg).await?;
            let mut reply = [0u8; 2];
            stream.read_exact(&mut reply).await?;
            if reply[1] != 0 {
                return Err(proxy_error("SOCKS5 proxy rejected the credentials"));
            }
        }
        _ => return Err(proxy_error("SOCKS5 proxy offered no usable auth method")),
    }
    let mut req = vec![0x05, 0x01, 0x00];
    match ip {
        Some(IpAddr::V4(v4)) => {
            req.push(0x01);
            req.extend_from_slice(&v4.octets());
        }
        Some(IpAddr::V6(v6)) => {
            req.push(0x04);
            req.extend_from_slice(&v6.octets());
        }
        None => {
            if host.len() > 255 {
                return Err(proxy_error("host name longer than 255 bytes"));
            }
            req.push(0x03);
            req.push(host.len() as u8);
            req.extend_from_slice(host.as_bytes());
        }
    }
    req.extend_from_slice(&port.to_be_bytes());
    stream.write_all(&req).await?;
    let mut reply = [0u8; 4];
    stream.read_exact(&mut reply).await?;
    if reply[1] != 0 {
        return Err(proxy_error(&format!(
            "SOCKS5 connect failed with code {}",
            reply[1]
        )));
    }
    let skip = match reply[3] {
        0x01 => 4,
        0x04 => 16,
        0x03 => stream.read_u8().await? as usize,
        _ => return Err(proxy_error("SOCKS5 reply has an unknown address type")),
    };
    let mut rest = vec![0u8; skip + 2];
    stream.read_exact(&mut rest).await?;
    Ok(())
}

/// Opens a SOCKS4 tunnel to `host:port`: to `ip` (IPv4 only) when given, else to the name (4a).
pub async fn socks4(
    stream: &mut TcpStream,
    host: &str,
    ip: Option<IpAddr>,
    port: u16,
    user: Option<&str>,
) -> io::Result<()> {
    let user = user.unwrap_or("");
    if user.len() > 255 || host.len() > 255 || user.contains('\0') || host.contains('\0') {
        return Err(proxy_error("SOCKS4 user id or host name too long"));
    }
    let mut req = vec![0x04, 0x01];
    req.extend_from_slice(&port.to_be_bytes());
    match ip {
        Some(IpAddr::V4(v4)) => {
            req.extend_from_slice(&v4.octets());
            req.extend_from_slice(user.as_bytes());
            req.push(0);
        }
        Some(IpAddr::V6(_)) => {
            return Err(proxy_error(
                "SOCKS4 cannot reach an IPv6 address; use socks5",
            ));
        }
        None => {
            // 4a: an address 0.0.0.x (x not 0) says the name follows the user id.
            req.extend_from_slice(&[0, 0, 0, 1]);
            req.extend_from_slice(user.as_bytes());
            req.push(0);
            req.extend_from_slice(host.as_bytes());
            req.push(0);
        }
    }
    stream.write_all(&req).await?;
    let mut reply = [0u8; 8];
    stream.read_exact(&mut reply).await?;
    if reply[1] != 0x5a {
        return Err(proxy_error(&format!(
            "SOCKS4 connect failed with code {:#04x}",
            reply[1]
        )));
    }
    Ok(())
}

fn authority(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

fn proxy_error(msg: &str) -> io::Error {
    io::Error::other(msg.to_string())
}
