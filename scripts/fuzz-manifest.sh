#!/usr/bin/env bash
# Regenerates crates/sluice-media/fuzz/Cargo.toml with one [[bin]] per file in fuzz_targets/.
set -euo pipefail
cd "$(dirname "$0")/../crates/sluice-media/fuzz"
{
  cat <<'HEAD'
[package]
name = "sluice-media-fuzz"
version = "0.0.0"
publish = false
edition = "2021"

[package.metadata]
cargo-fuzz = true

[dependencies]
libfuzzer-sys = "0.4"
url = "2"
bytes = "1"
http = "1"
sluice-media = { path = ".." }

# Its own workspace, so the main workspace build never compiles the fuzz crate (cargo fuzz builds it).
[workspace]
HEAD
  for f in fuzz_targets/*.rs; do
    name=$(basename "$f" .rs)
    printf '\n[[bin]]\nname = "%s"\npath = "%s"\ntest = false\ndoc = false\nbench = false\n' "$name" "$f"
  done
} > Cargo.toml
