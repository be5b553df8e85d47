//! DNS-01 through RFC 2136 dynamic updates signed with TSIG (RFC 8945): the TXT record
//! `_acme-challenge.<name>` added before the challenge is answered and removed after.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};
use hickory_proto::dnssec::rdata::tsig::TsigAlgorithm;
use hickory_proto::dnssec::tsig::TSigner;
use hickory_proto::op::{update_message, Message, ResponseCode};
use hickory_proto::rr::rdata::TXT;
use hickory_proto::rr::{Name, RData, Record, RecordSet};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::config::DnsConfig;

/// Sends signed updates to one zone's primary server.
pub struct Updater {
    server: SocketAddr,
    zone: Name,
    ttl: u32,
    signer: TSigner,
}

/// A TSIG key as `tsig-keygen` writes it (its secret never printed: `Debug` leaves it out).
#[derive(PartialEq)]
pub struct KeyFile {
    pub name: String,
    pub algorithm: String,
    pub secret: Vec<u8>,
}

impl std::fmt::Debug for KeyFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyFile")
            .field("name", &self.name)
            .field("algorithm", &self.algorithm)
            .field("secret", &"(hidden)")
            .finish()
    }
}

/// Reads `key "NAME" { algorithm ALG; secret "BASE64"; };` (comments and spacing free).
pub fn parse_key_file(text: &str) -> anyhow::Result<KeyFile> {
    use base64::Engine;
    // Strip `#` and `//` comments line by line, then split on spaces, braces, quotes and `;`.
    let body: String = text
        .lines()
        .map(|l| {
            let l = l.split('#').next().unwrap_or("");
            l.split("//").next().unwrap_or("")
        })
        .collect::<Vec<_>>()
        .join(" ");
    let tokens: Vec<&str> = body
        .split(|c: char| c.is_whitespace() || matches!(c, '{' | '}' | ';' | '"'))
        .filter(|t| !t.is_empty())
        .collect();
    let after = |key: &str| {
        tokens
            .iter()
            .position(|t| t.eq_ignore_ascii_case(key))
            .and_then(|i| tokens.get(i + 1))
            .map(|s| s.to_string())
    };
    let (Some(name), Some(algorithm), Some(secret)) =
        (after("key"), after("algorithm"), after("secret"))
    else {
        bail!("not a TSIG key file: expected key \"name\" {{ algorithm ...; secret \"...\"; }};");
    };
    let secret = base64::engine::general_purpose::STANDARD
        .decode(secret.as_bytes())
        .context("the key's secret is not base64")?;
    Ok(KeyFile {
        name,
        algorithm: algorithm.to_ascii_lowercase(),
        secret,
    })
}

impl Updater {
    pub fn new(config: &DnsConfig) -> anyhow::Result<Updater> {
        let path: &Path = &config.tsig_key_file;
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading acme.dns.tsig_key_file {}", path.display()))?;
        let key = parse_key_file(&text).with_context(|| format!("in {}", path.display()))?;
        let algorithm = match key.algorithm.as_str() {
            "hmac-sha256" => TsigAlgorithm::HmacSha256,
            "hmac-sha384" => TsigAlgorithm::HmacSha384,
            "hmac-sha512" => TsigAlgorithm::HmacSha512,
            other => bail!("TSIG algorithm {other:?} is not supported: use hmac-sha256, hmac-sha384 or hmac-sha512"),
        };
        let signer = TSigner::new(key.secret, algorithm, Name::from_ascii(&key.name)?, 300)
            .map_err(|e| anyhow::anyhow!("TSIG key: {e}"))?;
        let mut zone = Name::from_ascii(&config.zone)?;
        zone.set_fqdn(true);
        Ok(Updater {
            server: config.server,
            zone,
            ttl: config.ttl,
            signer,
        })
    }

    /// Adds `value` to the TXT set of `_acme-challenge.<name>` (a wildcard's bare name).
    pub async fn add_txt(&self, name: &str, value: &str) -> anyhow::Result<()> {
        let set = self.txt_set(name, value)?;
        let msg = update_message::append(set, self.zone.clone(), false, false);
        self.send(msg).await
    }

    /// Removes that one TXT value again.
    pub async fn remove_txt(&self, name: &str, value: &str) -> anyhow::Result<()> {
        let set = self.txt_set(name, value)?;
        let msg = update_message::delete_by_rdata(set, self.zone.clone(), false);
        self.send(msg).await
    }

    fn txt_set(&self, name: &str, value: &str) -> anyhow::Result<RecordSet> {
        let bare = name.trim_start_matches("*.");
        let mut owner = Name::from_ascii(format!("_acme-challenge.{bare}"))?;
        owner.set_fqdn(true);
        // The update helpers assert this; a name outside the zone is a config error, not a panic.
        if !self.zone.zone_of(&owner) {
            bail!("{name} is outside the DNS-01 zone {}", self.zone);
        }
        let record = Record::from_rdata(owner, self.ttl, RData::TXT(TXT::new(vec![value.into()])));
        Ok(RecordSet::from(record))
    }

    /// Signs `msg`, sends it over TCP, and checks the signed answer says NOERROR.
    async fn send(&self, mut msg: Message) -> anyhow::Result<()> {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs() as u32;
        let verifier = msg
            .finalize(&self.signer, now)
            .map_err(|e| anyhow::anyhow!("signing the update: {e}"))?;
        let bytes = msg.to_vec()?;
        let exchange = async {
            let mut tcp = tokio::net::TcpStream::connect(self.server).await?;
            tcp.write_all(&(bytes.len() as u16).to_be_bytes()).await?;
            tcp.write_all(&bytes).await?;
            let len = tcp.read_u16().await? as usize;
            let mut answer = vec![0; len];
            tcp.read_exact(&mut answer).await?;
            Ok::<_, std::io::Error>(answer)
        };
        let answer = tokio::time::timeout(Duration::from_secs(10), exchange)
            .await
            .map_err(|_| anyhow::anyhow!("DNS server {} did not answer in 10 s", self.server))?
            .with_context(|| format!("sending the update to {}", self.server))?;
        let code = Message::from_vec(&answer)
            .context("unreadable DNS answer")?
            .response_code();
        // A signed update always gives a verifier; without one the answer is not taken. A
        // server that refuses a badly signed update may answer unsigned: the refusal is told
        // as such, anything else only once its signature checks.
        let mut verify = verifier.context("the update was not signed")?;
        let signed = verify(&answer).map_err(|e| anyhow::anyhow!("the answer's TSIG: {e}"));
        if code != ResponseCode::NoError {
            bail!("DNS server {} refused the update: {code}", self.server);
        }
        signed?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_files() {
        let text = "# made by tsig-keygen\nkey \"acme-key\" {\n\talgorithm hmac-sha256;\n\tsecret \"c2VjcmV0\";\n};\n";
        let key = parse_key_file(text).unwrap();
        assert_eq!(
            key,
            KeyFile {
                name: "acme-key".into(),
                algorithm: "hmac-sha256".into(),
                secret: b"secret".to_vec()
            }
        );
        let shown = format!("{key:?}");
        assert!(
            !shown.contains("secret\"") && !shown.contains("115"),
            "{shown}"
        );
        assert!(parse_key_file("key \"x\" { algorithm hmac-sha256; };").is_err());
        assert!(parse_key_file("key x { algorithm hmac-sha256; secret \"!!\"; };").is_err());
        assert!(parse_key_file("").is_err());
    }
}
