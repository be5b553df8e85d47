//! The optional access log: one line per finished request, formatted on the request path but written
//! by a background task, so a slow disk never delays a response (lines are dropped and counted when
//! the writer falls behind).

use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use crate::atomic::Counter;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::config::AccessLogFormat;

/// Lines waiting for the writer before new ones are dropped.
const QUEUE: usize = 8192;

/// One finished request.
#[derive(Debug, Clone)]
pub struct Entry {
    pub client: IpAddr,
    pub method: String,
    pub target: String,
    pub version: &'static str,
    pub status: u16,
    pub bytes: u64,
    pub duration: Duration,
    pub route: String,
    pub server: Option<String>,
    pub referer: Option<String>,
    pub user_agent: Option<String>,
}

/// The sending side of the log.
#[derive(Clone)]
pub struct AccessLog {
    tx: mpsc::Sender<String>,
    format: AccessLogFormat,
    dropped: Counter,
}

impl AccessLog {
    /// Opens `dest` (`stderr` or a file path, appended) and starts the writer task.
    /// Needs a running tokio runtime (the writer is a task on it).
    pub fn open(
        dest: &str,
        format: AccessLogFormat,
        dropped: Counter,
    ) -> anyhow::Result<AccessLog> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| anyhow::anyhow!("the access log needs the server's runtime"))?;
        let mut out: Box<dyn tokio::io::AsyncWrite + Send + Unpin> = if dest == "stderr" {
            Box::new(tokio::io::stderr())
        } else {
            use std::os::unix::fs::OpenOptionsExt;
            // It holds client addresses and full query strings (which can carry tokens): the
            // server's user and group only, never everyone.
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o640)
                .open(dest)
                .map_err(|e| anyhow::anyhow!("cannot open access log {dest}: {e}"))?;
            Box::new(tokio::fs::File::from_std(file))
        };
        let (tx, mut rx) = mpsc::channel::<String>(QUEUE);
        runtime.spawn(async move {
            let mut buf = Vec::with_capacity(64 * 1024);
            while let Some(line) = rx.recv().await {
                buf.extend_from_slice(line.as_bytes());
                // Batch whatever is already queued into one write.
                while buf.len() < 60 * 1024 {
                    match rx.try_recv() {
                        Ok(more) => buf.extend_from_slice(more.as_bytes()),
                        Err(_) => break,
                    }
                }
                if out.write_all(&buf).await.is_err() || out.flush().await.is_err() {
                    tracing::warn!("access log write failed; lines are being lost");
                }
                buf.clear();
            }
        });
        Ok(AccessLog {
            tx,
            format,
            dropped,
        })
    }

    /// Queues one line; never waits.
    pub fn record(&self, e: &Entry) {
        let line = match self.format {
            AccessLogFormat::Json => json_line(e),
            AccessLogFormat::Combined => combined_line(e, SystemTime::now()),
        };
        if self.tx.try_send(line).is_err() {
            self.dropped.inc();
        }
    }
}

fn json_line(e: &Entry) -> String {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let mut line = serde_json::json!({
        "ts": now,
        "client": e.client.to_string(),
        "method": e.method,
        "target": e.target,
        "proto": e.version,
        "status": e.status,
        "bytes": e.bytes,
        "duration_ms": (e.duration.as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0,
        "route": e.route,
        "server": e.server,
        "referer": e.referer,
        "user_agent": e.user_agent,
    })
    .to_string();
    line.push('\n');
    line
}

/// `client - - [date] "METHOD target PROTO" status bytes "referer" "agent"` (Apache/nginx combined).
pub fn combined_line(e: &Entry, at: SystemTime) -> String {
    let secs = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!(
        "{} - - [{}] \"{} {} {}\" {} {} \"{}\" \"{}\"\n",
        e.client,
        clf_date(secs),
        e.method,
        escape(&e.target),
        e.version,
        e.status,
        e.bytes,
        escape(e.referer.as_deref().unwrap_or("-")),
        escape(e.user_agent.as_deref().unwrap_or("-")),
    )
}

/// Quotes and control bytes cannot break a combined line.
fn escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| match c {
            '"' => vec!['\\', '"'],
            '\\' => vec!['\\', '\\'],
            c if c.is_control() => vec!['?'],
            c => vec![c],
        })
        .collect()
}

/// `10/Oct/2000:13:55:36 +0000` for a UNIX time (UTC).
fn clf_date(secs: u64) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + if month <= 2 { 1 } else { 0 };
    format!(
        "{:02}/{}/{}:{:02}:{:02}:{:02} +0000",
        day,
        MONTHS[(month - 1) as usize],
        year,
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combined_format() {
        let e = Entry {
            client: "10.0.0.1".parse().unwrap(),
            method: "GET".into(),
            target: "/a?b=\"c\"".into(),
            version: "HTTP/1.1",
            status: 200,
            bytes: 1234,
            duration: Duration::from_millis(5),
            route: "*/".into(),
            server: Some("127.0.0.1:9000".into()),
            referer: None,
            user_agent: Some("curl/8".into()),
        };
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(971_186_136);
        assert_eq!(
            combined_line(&e, at),
            "10.0.0.1 - - [10/Oct/2000:13:55:36 +0000] \"GET /a?b=\\\"c\\\" HTTP/1.1\" 200 1234 \"-\" \"curl/8\"\n"
        );
        let j: serde_json::Value = serde_json::from_str(&json_line(&e)).unwrap();
        assert_eq!(j["status"], 200);
        assert_eq!(j["server"], "127.0.0.1:9000");
    }

    /// Sets the process's umask while it lives, then puts the old one back (also on a panic).
    struct Umask(libc::mode_t);

    impl Umask {
        fn set(mask: libc::mode_t) -> Umask {
            // SAFETY: umask has no preconditions; it only swaps the process's file mode mask.
            Umask(unsafe { libc::umask(mask) })
        }
    }

    impl Drop for Umask {
        fn drop(&mut self) {
            // SAFETY: as above.
            unsafe { libc::umask(self.0) };
        }
    }

    /// A new log file is not readable by other users, whatever the umask lets through: under the
    /// usual 022 (which lets "others" read) it is still 0640. The umask is the whole process's,
    /// so it is set only around the one `open`: a file another test thread creates in that
    /// window gets 022 too, which is the common default anyway.
    #[tokio::test]
    async fn a_new_log_file_is_closed_to_other_users() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let dest = path.to_str().unwrap();
        let opened = {
            let _umask = Umask::set(0o022);
            AccessLog::open(dest, AccessLogFormat::Combined, Counter::default())
        };
        opened.unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o077 & !0o040, 0, "mode {mode:o}");
    }
}
