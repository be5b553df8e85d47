//! The HTTP/3 test client: `h3client.py` (aioquic) run with a JSON plan, its JSON report back.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

/// The Python of the aioquic venv; a missing venv is an error, never a skip.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("SLUICE_AIOQUIC_PYTHON") {
        return PathBuf::from(p);
    }
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let p = target.parent().unwrap().join("aioquic-venv/bin/python3");
    assert!(
        p.exists(),
        "no aioquic venv at {}: run scripts/aioquic-venv (scripts/test.sh does)",
        p.display()
    );
    p
}

/// The client script's path.
pub fn script() -> &'static str {
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/h3_support/h3client.py")
}

/// Runs one client plan (see `h3client.py`) and returns its report.
pub async fn client(plan: Value) -> Value {
    run(plan, 90).await
}

/// Runs `plans` one after another in a single client process (one interpreter start, not one
/// per plan) and returns their reports in order.
#[allow(dead_code)]
pub async fn clients(plans: Vec<Value>) -> Vec<Value> {
    let n = plans.len() as u64;
    let out = run(serde_json::json!({ "plans": plans }), 60 + 30 * n).await;
    let Value::Array(reports) = out else {
        panic!("not a list of reports: {out}");
    };
    assert_eq!(reports.len() as u64, n);
    reports
}

/// The client process for `plan`, bounded by `secs`; its JSON report.
async fn run(plan: Value, secs: u64) -> Value {
    let out = tokio::time::timeout(
        Duration::from_secs(secs),
        tokio::process::Command::new(python())
            .arg(script())
            .arg(plan.to_string())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("HTTP/3 client did not finish in {secs} s"))
    .unwrap();
    assert!(
        out.status.success(),
        "client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
