//! A small SOCKS4/4a/5 server for the outgoing-proxy tests: it records what each client asked
//! for (an address, or a name for the proxy to resolve) and resolves names from its own table,
//! the way a VPN container's proxy knows names the host's resolver does not.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What one client asked the proxy to connect to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asked {
    Addr(SocketAddr),
    Name(String, u16),
}

/// A running proxy.
pub struct Socks {
    pub addr: SocketAddr,
    pub asked: Arc<Mutex<Vec<(u8, Asked)>>>,
}

impl Socks {
    /// Starts the proxy; `names` is its own resolver.
    pub async fn start(names: &[(&str, IpAddr)]) -> Socks {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let names: Arc<HashMap<String, IpAddr>> =
            Arc::new(names.iter().map(|(n, ip)| (n.to_string(), *ip)).collect());
        let asked = Arc::new(Mutex::new(Vec::new()));
        let log = asked.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (names, log) = (names.clone(), log.clone());
                tokio::spawn(async move {
                    let _ = serve(stream, &names, &log).await;
                });
            }
        });
        Socks { addr, asked }
    }

    /// (SOCKS version, target) of every tunnel asked for.
    pub fn asked(&self) -> Vec<(u8, Asked)> {
        self.asked.lock().unwrap().clone()
    }
}

async fn serve(
    mut client: TcpStream,
    names: &HashMap<String, IpAddr>,
    log: &Mutex<Vec<(u8, Asked)>>,
) -> std::io::Result<()> {
    let version = client.read_u8().await?;
    let asked = match version {
        4 => socks4_request(&mut client).await?,
        5 => socks5_request(&mut client).await?,
        _ => return Ok(()),
    };
    log.lock().unwrap().push((version, asked.clone()));
    let target = match &asked {
        Asked::Addr(a) => Some(*a),
        Asked::Name(n, port) => names.get(n).map(|ip| SocketAddr::new(*ip, *port)),
    };
    let upstream = match target {
        Some(t) => TcpStream::connect(t).await.ok(),
        None => None,
    };
    let ok = upstream.is_some();
    match version {
        4 => {
            let code = if ok { 0x5a } else { 0x5b };
            client.write_all(&[0, code, 0, 0, 0, 0, 0, 0]).await?;
        }
        _ => {
            let code = if ok { 0 } else { 4 };
            client.write_all(&[5, code, 0, 1, 0, 0, 0, 0, 0, 0]).await?;
        }
    }
    if let Some(mut up) = upstream {
        let _ = tokio::io::copy_bidirectional(&mut client, &mut up).await;
    }
    Ok(())
}

async fn read_cstring(s: &mut TcpStream) -> std::io::Result<String> {
    let mut out = Vec::new();
    loop {
        match s.read_u8().await? {
            0 => return Ok(String::from_utf8_lossy(&out).into_owned()),
            b => out.push(b),
        }
    }
}

async fn socks4_request(s: &mut TcpStream) -> std::io::Result<Asked> {
    let _cmd = s.read_u8().await?;
    let port = s.read_u16().await?;
    let mut ip = [0u8; 4];
    s.read_exact(&mut ip).await?;
    let _user = read_cstring(s).await?;
    if ip[..3] == [0, 0, 0] && ip[3] != 0 {
        let name = read_cstring(s).await?;
        return Ok(Asked::Name(name, port));
    }
    Ok(Asked::Addr(SocketAddr::new(IpAddr::from(ip), port)))
}

async fn socks5_request(s: &mut TcpStream) -> std::io::Result<Asked> {
    let n = s.read_u8().await? as usize;
    let mut methods = vec![0u8; n];
    s.read_exact(&mut methods).await?;
    s.write_all(&[5, 0]).await?;
    let mut head = [0u8; 4];
    s.read_exact(&mut head).await?;
    let asked = match head[3] {
        1 => {
            let mut ip = [0u8; 4];
            s.read_exact(&mut ip).await?;
            Asked::Addr(SocketAddr::new(IpAddr::from(ip), s.read_u16().await?))
        }
        4 => {
            let mut ip = [0u8; 16];
            s.read_exact(&mut ip).await?;
            Asked::Addr(SocketAddr::new(IpAddr::from(ip), s.read_u16().await?))
        }
        _ => {
            let len = s.read_u8().await? as usize;
            let mut name = vec![0u8; len];
            s.read_exact(&mut name).await?;
            Asked::Name(
                String::from_utf8_lossy(&name).into_owned(),
                s.read_u16().await?,
            )
        }
    };
    Ok(asked)
}
