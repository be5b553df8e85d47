//! The state directory: the account, one PEM file per name (chain then key, replaced atomically),
//! a lock file per name so two nodes sharing the directory never order one name at once, and the
//! answers of open HTTP-01 and TLS-ALPN-01 challenges, so any node sharing it (or the next process
//! after a binary upgrade) answers a validation another placed.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

/// The folder of open HTTP-01 challenges' answers, a file per token.
const HTTP01: &str = "http-01";

/// The folder of open TLS-ALPN-01 challenges, a file per name.
const TLS_ALPN01: &str = "tls-alpn-01";

/// The longest token looked up (Let's Encrypt's are 43 characters).
const MAX_TOKEN: usize = 128;

/// An answer file older than this is left from a process that ended mid-order.
const STALE_TOKEN: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// A file being written (`<name>.tmp<n>`) older than this was left by a write that failed or a
/// process that ended during it (a write takes milliseconds): removed at the next open.
const STALE_WRITE: std::time::Duration = std::time::Duration::from_secs(3600);

/// The largest stored file read (a certificate chain with its key, an account): a bigger one
/// is not the process's own writing.
const MAX_FILE: u64 = 1024 * 1024;

/// The state directory.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

/// The lock files this process holds. On NFS, Linux emulates `flock` with POSIX locks, which
/// belong to the process (a second lock of the same file in it succeeds) and go when any of its
/// descriptors of the file is closed: so a name's holder in this process is known here, not
/// from the file.
static HELD: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);

fn held() -> std::sync::MutexGuard<'static, Option<HashSet<PathBuf>>> {
    HELD.lock().unwrap_or_else(|e| e.into_inner())
}

/// What tells a stored certificate file from another without reading it
/// ([`Store::cert_stamp`]): its modification time, inode and length.
pub type CertStamp = (SystemTime, u64, u64);

/// An exclusive `flock` on a name, released when dropped (or when the process dies).
#[derive(Debug)]
pub struct NameLock {
    claim: Option<Claim>,
}

/// A name's claim in this process and, once taken, its locked file. Dropping it closes the file,
/// then gives back the claim: until the file is closed, the name stays held here too.
#[derive(Debug)]
struct Claim {
    file: Option<File>,
    path: PathBuf,
}

impl Drop for Claim {
    fn drop(&mut self) {
        drop(self.file.take());
        #[cfg(test)]
        tests::closed_on(&self.path);
        if let Some(held) = held().as_mut() {
            held.remove(&self.path);
        }
    }
}

impl Drop for NameLock {
    fn drop(&mut self) {
        let Some(claim) = self.claim.take() else {
            return;
        };
        // On NFS the close releases an emulated POSIX lock with a round trip to the server: on
        // a runtime's thread, a server that is away would stall every connection it serves.
        // A blocking task dropped unrun (the runtime shutting down) drops the claim inline.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(move || drop(claim))),
            Err(_) => drop(claim),
        }
    }
}

impl Store {
    /// Opens (creating) the directory and its `certs/`, `locks/`, `http-01/` and `tls-alpn-01/`
    /// folders, owner-only. Challenge answers left by a process that ended mid-order (a day
    /// old: an order times out long before) are removed.
    pub fn open(root: &Path) -> std::io::Result<Store> {
        for dir in [
            root.to_path_buf(),
            root.join("certs"),
            root.join("locks"),
            root.join(HTTP01),
            root.join(TLS_ALPN01),
        ] {
            fs::create_dir_all(&dir)?;
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))?;
        }
        let age = |e: &fs::DirEntry| {
            e.metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
        };
        for entries in [HTTP01, TLS_ALPN01].map(|d| fs::read_dir(root.join(d))) {
            let Ok(entries) = entries else { continue };
            for e in entries.flatten() {
                if age(&e).is_some_and(|age| age > STALE_TOKEN) {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
        // Half-written files (a certificate's holds its private key) left by a failed write.
        for entries in [root.to_path_buf(), root.join("certs")].map(fs::read_dir) {
            let Ok(entries) = entries else { continue };
            for e in entries.flatten() {
                // `<file>.tmp<digits>`, as `write_atomic` names them (a stored name may hold
                // `.tmp` itself, but a stored file ends in `.pem` or `.json`).
                let partial = e.file_name().to_str().is_some_and(|n| {
                    n.rsplit_once(".tmp").is_some_and(|(_, n)| {
                        !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
                    })
                });
                if partial && age(&e).is_some_and(|age| age > STALE_WRITE) {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
        Ok(Store {
            root: root.to_path_buf(),
        })
    }

    /// The file of an HTTP-01 token; `None` unless the token is one a CA could have sent
    /// (RFC 8555 §8.3: base64url), so a request's path never names another file.
    fn http_token_path(&self, token: &str) -> Option<PathBuf> {
        well_formed_token(token).then(|| self.root.join(HTTP01).join(token))
    }

    /// Records an open HTTP-01 challenge's answer for every node sharing the directory.
    pub fn write_http_token(&self, token: &str, key_authorization: &str) -> std::io::Result<()> {
        let path = self
            .http_token_path(token)
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a token"))?;
        write_atomic(&path, key_authorization.as_bytes())
    }

    /// The answer another node (or an earlier process) recorded for `token`, if any.
    pub fn read_http_token(&self, token: &str) -> Option<String> {
        use std::io::Read;
        let file = File::open(self.http_token_path(token)?).ok()?;
        let mut text = String::new();
        // A key authorization is the token and a 43-character thumbprint.
        file.take(MAX_TOKEN as u64 + 64)
            .read_to_string(&mut text)
            .ok()?;
        Some(text)
    }

    /// Removes a closed challenge's answer.
    pub fn remove_http_token(&self, token: &str) {
        if let Some(path) = self.http_token_path(token) {
            let _ = fs::remove_file(path);
        }
    }

    /// The file of a TLS-ALPN-01 challenge for `name`; `None` unless `name` is a plain
    /// lowercase DNS name (what the handshake's server name is), so it names no other file.
    fn alpn_path(&self, name: &str) -> Option<PathBuf> {
        let well_formed = (1..=253).contains(&name.len())
            && !name.starts_with('.')
            && !name.contains("..")
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        well_formed.then(|| self.root.join(TLS_ALPN01).join(name))
    }

    /// Records an open TLS-ALPN-01 challenge for `name`: the key authorization's SHA-256, from
    /// which any node builds the challenge certificate.
    pub fn write_alpn_digest(&self, name: &str, digest: &[u8]) -> std::io::Result<()> {
        let path = self.alpn_path(name).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a DNS name")
        })?;
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        write_atomic(&path, hex.as_bytes())
    }

    /// The digest another node (or an earlier process) recorded for `name`, if any.
    pub fn read_alpn_digest(&self, name: &str) -> Option<Vec<u8>> {
        use std::io::Read;
        let file = File::open(self.alpn_path(name)?).ok()?;
        let mut hex = String::new();
        file.take(64).read_to_string(&mut hex).ok()?;
        if hex.len() != 64 {
            return None;
        }
        (0..32)
            .map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok())
            .collect()
    }

    /// Removes a closed TLS-ALPN-01 challenge's record.
    pub fn remove_alpn_digest(&self, name: &str) {
        if let Some(path) = self.alpn_path(name) {
            let _ = fs::remove_file(path);
        }
    }

    /// The account file for one directory URL (accounts are per CA).
    fn account_path(&self, directory: &str) -> PathBuf {
        self.root
            .join(format!("account-{}.json", short_hash(directory.as_bytes())))
    }

    pub fn read_account(&self, directory: &str) -> Option<String> {
        String::from_utf8(read_bounded(&self.account_path(directory))?).ok()
    }

    pub fn write_account(&self, directory: &str, json: &str) -> std::io::Result<()> {
        write_atomic(&self.account_path(directory), json.as_bytes())
    }

    /// The PEM file of `name` (`*.example.com` is stored as `_.example.com.pem`).
    pub fn cert_path(&self, name: &str) -> PathBuf {
        self.root
            .join("certs")
            .join(format!("{}.pem", name.replace('*', "_")))
    }

    /// When `name`'s stored file was last written, which file it is (its inode: a file replaced
    /// whole within the file system's time granularity is still another) and its length (one
    /// rewritten in place within that granularity, read half written, differs by it), without
    /// reading it.
    pub fn cert_stamp(&self, name: &str) -> Option<CertStamp> {
        use std::os::unix::fs::MetadataExt;
        let meta = fs::metadata(self.cert_path(name)).ok()?;
        Some((meta.modified().ok()?, meta.ino(), meta.len()))
    }

    /// The stored chain and key of `name`, with the file's modification time.
    pub fn read_cert(&self, name: &str) -> Option<(Vec<u8>, SystemTime)> {
        let path = self.cert_path(name);
        let modified = fs::metadata(&path).and_then(|m| m.modified()).ok()?;
        Some((read_bounded(&path)?, modified))
    }

    /// Every name with a stored certificate (`_.example.com.pem` is `*.example.com`). A file
    /// whose name is not a lower-case hostname a CA issues for (`config::check_name`) was not
    /// stored by sluice: it is logged and left alone, never sent to the ask URL or the CA.
    pub fn stored_names(&self) -> Vec<String> {
        let Ok(entries) = fs::read_dir(self.root.join("certs")) else {
            return Vec::new();
        };
        entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|f| f.strip_suffix(".pem").map(str::to_string))
            .map(|n| match n.strip_prefix("_.") {
                Some(rest) => format!("*.{rest}"),
                None => n,
            })
            .filter(|n| {
                let ok = super::config::check_name(n).is_ok() && *n == n.to_ascii_lowercase();
                if !ok {
                    tracing::warn!(file = %self.cert_path(n).display(), "acme: a file in certs/ that names no hostname is left alone");
                }
                ok
            })
            .collect()
    }

    /// Replaces `name`'s PEM file whole: readers see the old file or the new one, never half.
    #[cfg(test)]
    pub fn write_cert(&self, name: &str, chain_pem: &str, key_pem: &str) -> std::io::Result<()> {
        self.write_bundle(name, &bundle(chain_pem, key_pem))
    }

    /// Replaces `name`'s PEM file whole with `bundle` (see [`bundle`]).
    pub fn write_bundle(&self, name: &str, bundle: &str) -> std::io::Result<()> {
        write_atomic(&self.cert_path(name), bundle.as_bytes())
    }

    /// Takes `key`'s lock without waiting; `None` while another process, or another task of
    /// this one, holds it.
    pub fn try_lock(&self, key: &str) -> std::io::Result<Option<NameLock>> {
        let path = self
            .root
            .join("locks")
            .join(format!("{}.lock", key.replace('*', "_")));
        // Claimed in this process before the file is opened: on NFS, opening and closing the
        // file again would release the holder's lock.
        if !held().get_or_insert_with(HashSet::new).insert(path.clone()) {
            return Ok(None);
        }
        // From here the claim is given back when `claim` drops, whatever happens (this runs
        // off the runtime's threads, so it is dropped here, inline).
        let mut claim = Claim { file: None, path };
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&claim.path)?;
        // SAFETY: flock on a descriptor this function owns; no memory is passed.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            claim.file = Some(file);
            return Ok(Some(NameLock { claim: Some(claim) }));
        }
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::WouldBlock {
            Ok(None)
        } else {
            Err(e)
        }
    }
}

/// A stored file's text: the chain, then the key.
pub fn bundle(chain_pem: &str, key_pem: &str) -> String {
    let mut both = String::with_capacity(chain_pem.len() + key_pem.len() + 1);
    both.push_str(chain_pem.trim_end());
    both.push('\n');
    both.push_str(key_pem);
    both
}

/// Whether `token` is one a CA could have sent (RFC 8555 §8.3: base64url, at most
/// `MAX_TOKEN` characters); only such a token is ever looked up as a file.
pub fn well_formed_token(token: &str) -> bool {
    (1..=MAX_TOKEN).contains(&token.len())
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Writes a sibling temporary file, syncs it, and renames it over `path`. The temporary name is
/// the whole file name with a random suffix: two writes (of two names that differ in their last
/// label, or by two nodes whose processes have the same pid) never share one.
/// Writes `path` whole or not at all: a temporary file beside it, synced, renamed over it, and
/// the directory synced so the rename survives a crash. A failed write leaves no temporary file
/// (one left by a crash is removed by [`Store::open`]).
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut salt = [0u8; 8];
    getrandom::getrandom(&mut salt).map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp{}", u64::from_le_bytes(salt)));
    let tmp = PathBuf::from(tmp);
    let written = (|| {
        let mut f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
        return written;
    }
    if let Some(dir) = path.parent() {
        let _ = File::open(dir).and_then(|d| d.sync_all());
    }
    Ok(())
}

/// A stored file's bytes, if it is not larger than [`MAX_FILE`].
fn read_bounded(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    File::open(path)
        .ok()?
        .take(MAX_FILE + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    (bytes.len() as u64 <= MAX_FILE).then_some(bytes)
}

fn short_hash(bytes: &[u8]) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(bytes);
    d[..8].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread::ThreadId;

    /// Where each lock file was closed, and on which thread.
    static CLOSED: Mutex<Vec<(PathBuf, ThreadId)>> = Mutex::new(Vec::new());

    pub(super) fn closed_on(path: &Path) {
        let mut closed = CLOSED.lock().unwrap_or_else(|e| e.into_inner());
        closed.push((path.to_path_buf(), std::thread::current().id()));
    }

    fn closed_by(path: &Path) -> Option<ThreadId> {
        let closed = CLOSED.lock().unwrap_or_else(|e| e.into_inner());
        closed.iter().find(|(p, _)| p == path).map(|(_, t)| *t)
    }

    #[test]
    fn a_lock_dropped_on_a_runtime_thread_is_closed_off_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let here = std::thread::current().id();
        // Without a runtime, the file is closed at once, here.
        let inline = dir.path().join("locks/inline.test.lock");
        drop(store.try_lock("inline.test").unwrap().unwrap());
        assert_eq!(closed_by(&inline), Some(here));
        assert!(store.try_lock("inline.test").unwrap().is_some());
        // On a runtime's one thread (this one), the close goes to the blocking pool: on NFS it
        // is a round trip to the server, which may be away.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let path = dir.path().join("locks/a.test.lock");
        runtime.block_on(async {
            drop(store.try_lock("a.test").unwrap().unwrap());
        });
        let mut closed = None;
        for _ in 0..500 {
            closed = closed_by(&path);
            if closed.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let closed = closed.expect("the lock file was closed");
        assert_ne!(closed, here, "closed on the runtime's thread");
        // Once closed, the name is free again in this process.
        let mut again = None;
        for _ in 0..500 {
            again = store.try_lock("a.test").unwrap();
            if again.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(again.is_some());
    }

    #[test]
    fn a_file_that_names_no_hostname_is_not_a_managed_name() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.write_cert("a.example.com", "chain", "key").unwrap();
        store.write_cert("*.w.example.com", "chain", "key").unwrap();
        for bad in [
            "notes",
            "x y.example.com",
            "UPPER.example.com",
            "a..example.com",
        ] {
            std::fs::write(dir.path().join("certs").join(format!("{bad}.pem")), "x").unwrap();
        }
        let mut names = store.stored_names();
        names.sort();
        assert_eq!(names, ["*.w.example.com", "a.example.com"]);
    }

    #[test]
    fn files_and_locks() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.write_cert("*.a.test", "CHAIN\n\n", "KEY\n").unwrap();
        let (bytes, _) = store.read_cert("*.a.test").unwrap();
        assert_eq!(bytes, b"CHAIN\nKEY\n");
        assert!(store.cert_path("*.a.test").ends_with("certs/_.a.test.pem"));
        assert_eq!(store.stored_names(), ["*.a.test"]);
        let held = store.try_lock("a.test").unwrap();
        assert!(held.is_some());
        // flock is per open file: a second open (as another node would) is refused.
        assert!(store.try_lock("a.test").unwrap().is_none());
        drop(held);
        assert!(store.try_lock("a.test").unwrap().is_some());
        // A failed open leaves no claim behind.
        std::fs::remove_dir_all(dir.path().join("locks")).unwrap();
        assert!(store.try_lock("b.test").is_err());
        std::fs::create_dir(dir.path().join("locks")).unwrap();
        assert!(store.try_lock("b.test").unwrap().is_some());
        assert!(store.read_account("https://ca/dir").is_none());
        store.write_account("https://ca/dir", "{}").unwrap();
        assert_eq!(store.read_account("https://ca/dir").unwrap(), "{}");
    }

    #[test]
    fn a_name_held_in_this_process_is_refused_whatever_the_file_lock_says() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let other = Store::open(dir.path()).unwrap();
        let held = store.try_lock("a.test").unwrap().unwrap();
        // What NFS does in one process: its emulated flock is a POSIX lock, which the same
        // process may take again (and which any close of the file releases). Let go of the
        // file lock as the kernel would there; the name is still held here.
        let fd = held
            .claim
            .as_ref()
            .unwrap()
            .file
            .as_ref()
            .unwrap()
            .as_raw_fd();
        // SAFETY: flock on a descriptor the lock owns and keeps open; no memory is passed.
        assert_eq!(unsafe { libc::flock(fd, libc::LOCK_UN) }, 0);
        assert!(store.try_lock("a.test").unwrap().is_none());
        assert!(other.try_lock("a.test").unwrap().is_none());
        assert!(store.try_lock("b.test").unwrap().is_some());
        drop(held);
        assert!(other.try_lock("a.test").unwrap().is_some());
    }

    #[test]
    fn http01_answers_by_token_and_only_by_token() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let other = Store::open(dir.path()).unwrap();
        store
            .write_http_token("tok-EN_1", "tok-EN_1.thumb")
            .unwrap();
        assert_eq!(other.read_http_token("tok-EN_1").unwrap(), "tok-EN_1.thumb");
        // Nothing but a base64url token names a file: no way out of the folder, no other file.
        std::fs::write(dir.path().join("secret"), "x").unwrap();
        for bad in [
            "../secret",
            "..",
            "",
            "a/b",
            "a.b",
            "%2e%2e",
            &"a".repeat(129),
        ] {
            assert!(other.read_http_token(bad).is_none(), "{bad}");
            assert!(store.write_http_token(bad, "x").is_err(), "{bad}");
        }
        store.remove_http_token("tok-EN_1");
        assert!(other.read_http_token("tok-EN_1").is_none());
        // A day-old answer (a process that ended mid-order) goes at the next open.
        store.write_http_token("old", "old.thumb").unwrap();
        let f = std::fs::File::options()
            .write(true)
            .open(dir.path().join("http-01/old"))
            .unwrap();
        f.set_modified(SystemTime::now() - STALE_TOKEN * 2).unwrap();
        drop(f);
        store.write_http_token("new", "new.thumb").unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert!(store.read_http_token("old").is_none());
        assert_eq!(store.read_http_token("new").unwrap(), "new.thumb");
        // An hour-old half-written certificate goes too; a fresh one (a write in progress on
        // another node) stays; an oversized stored file is not read.
        let (old, fresh) = (
            dir.path().join("certs/a.test.pem.tmp1"),
            dir.path().join("certs/b.test.pem.tmp2"),
        );
        std::fs::write(&old, "partial").unwrap();
        std::fs::write(&fresh, "partial").unwrap();
        let f = std::fs::File::options().write(true).open(&old).unwrap();
        f.set_modified(SystemTime::now() - STALE_WRITE * 2).unwrap();
        drop(f);
        let kept = store.cert_path("x.tmp1.test");
        store.write_cert("x.tmp1.test", "chain", "key").unwrap();
        let f = std::fs::File::options().write(true).open(&kept).unwrap();
        f.set_modified(SystemTime::now() - STALE_WRITE * 2).unwrap();
        drop(f);
        let store = Store::open(dir.path()).unwrap();
        assert!(!old.exists());
        assert!(fresh.exists());
        assert!(kept.exists(), "a stored certificate whose name holds .tmp");
        std::fs::write(
            store.cert_path("big.test"),
            vec![b'x'; MAX_FILE as usize + 1],
        )
        .unwrap();
        assert!(store.read_cert("big.test").is_none());
        store.write_cert("c.test", "chain", "key").unwrap();
        assert!(store.read_cert("c.test").is_some());
    }

    #[test]
    fn tls_alpn01_digests_by_name_and_only_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let digest: Vec<u8> = (0..32).collect();
        store.write_alpn_digest("a.example.com", &digest).unwrap();
        let other = Store::open(dir.path()).unwrap();
        assert_eq!(other.read_alpn_digest("a.example.com").unwrap(), digest);
        for bad in [
            "../x",
            "..",
            "",
            "a/b",
            "A.example.com",
            ".a",
            "a..b",
            "*.a.com",
        ] {
            assert!(other.read_alpn_digest(bad).is_none(), "{bad}");
            assert!(store.write_alpn_digest(bad, &digest).is_err(), "{bad}");
        }
        // A file that is not 64 hex digits is no digest.
        std::fs::write(
            dir.path().join("tls-alpn-01/b.example.com"),
            "zz".repeat(32),
        )
        .unwrap();
        assert!(other.read_alpn_digest("b.example.com").is_none());
        store.remove_alpn_digest("a.example.com");
        assert!(other.read_alpn_digest("a.example.com").is_none());
    }
}
