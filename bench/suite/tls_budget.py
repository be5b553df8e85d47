"""`bench/run --budget --only TLS`: the TLS and HTTP/2 cells under equal CPU budgets. sluice,
nginx and HAProxy each terminate TLS in front of the same origin (1 KB through a plain route),
with an ECDSA P-256 and an RSA-2048 certificate: keep-alive HTTP/1.1, a full handshake per
request, a resumed handshake per request, and HTTP/2 over TLS (10 connections × 10 streams)."""

import functools
import os
import subprocess
from dataclasses import dataclass

from . import budget, peers
from .budget_runs import CLIENTS, QUOTA_PCT, _params


@dataclass
class Certs:
    """One server certificate: PEM chain, PEM key, both in one file (HAProxy), and the CA."""
    cert: str
    key: str
    combined: str
    ca: str


def _openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_certs(ctx):
    """A throwaway CA (ECDSA P-256) and two server certificates it signed, for 127.0.0.1 and
    localhost: {"ECDSA P-256": Certs, "RSA-2048": Certs}."""
    d = ctx.tempdir("tls-certs")
    ca_key, ca = os.path.join(d, "ca.key"), os.path.join(d, "ca.pem")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", ca_key, "-out", ca, "-days", "30",
             "-subj", "/CN=sluice bench CA")
    san = os.path.join(d, "san.ext")
    with open(san, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    out = {}
    for name, newkey in (("ECDSA P-256", ["ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]),
                         ("RSA-2048", ["rsa:2048"])):
        stem = os.path.join(d, "ec" if name.startswith("ECDSA") else "rsa")
        _openssl("req", "-newkey", *newkey, "-nodes", "-keyout", stem + ".key",
                 "-out", stem + ".csr", "-subj", "/CN=localhost")
        _openssl("x509", "-req", "-in", stem + ".csr", "-CA", ca, "-CAkey", ca_key,
                 "-CAcreateserial", "-out", stem + ".pem", "-days", "30", "-extfile", san)
        with open(stem + ".both.pem", "w") as both:
            for part in (stem + ".pem", stem + ".key"):
                with open(part) as f:
                    both.write(f.read())
        out[name] = Certs(stem + ".pem", stem + ".key", stem + ".both.pem", ca)
    return out


# (label, client connections, extra load-client arguments)
CELLS = [
    ("keep-alive HTTP/1.1", CLIENTS, ["--handshake", "keep"]),
    ("full handshake per request", CLIENTS, ["--handshake", "full"]),
    ("resumed handshake per request", CLIENTS, ["--handshake", "resume"]),
    ("HTTP/2 (10 conn × 10 streams)", 10, ["--h2-streams", "10"]),
]


# Five rounds in full mode (the other budget runs keep three): several of these cells' paired
# ratios are near 1.0, and three rounds spread wider than that difference. The run: 2
# certificates × 4 cells × 3 peers × 5 rounds × (5 s + 1 s warm-up) = 12 min, plus about 1–2 min
# of callgrind (the 3-round run took 8.4 min in all).
ROUNDS = 5


def tls(ctx):
    small = ctx.test_file("1k.bin", 1024)
    sluice = "sluice"
    starters = {
        # Busy polling off for all: nginx has none, and HAProxy's is off by default.
        sluice: functools.partial(peers.start_sluice_reverse, runtime="work-stealing",
                                  busy_poll_us=0),
        "nginx proxy_pass": peers.start_nginx_proxy,
        "HAProxy http": peers.start_haproxy_http,
    }
    p = dict(_params(ctx), rounds=1 if ctx.quick else ROUNDS)
    certs = make_certs(ctx)
    origin = peers.start_origin(ctx, ctx.files_dir, ctx.origin_cpus)
    helpers = budget.helper_groups(ctx, origin)
    out = {"quota_pct": QUOTA_PCT, "c": CLIENTS, "params": p, "budget": {},
           "instructions": budget.instructions_note(), "cells": [c[0] for c in CELLS]}
    try:
        for kind, cert in certs.items():
            plan = [(small, f"{kind}, {label}",
                     {"scheme": "https", "c": c, "args": ["--ca", cert.ca, *args]})
                    for label, c, args in CELLS]
            variant = {name: {"tls": cert} for name in starters}
            cells, load = budget.budget_cells(ctx, starters, origin, plan, QUOTA_PCT,
                                              p["rounds"], p["secs"], p["warm"], CLIENTS,
                                              variant)
            out["budget"][f"off ({kind})"] = {
                "rows": budget.summarize_budget(cells, sluice, QUOTA_PCT), "load": load,
                "handshakes": _handshakes(cells)}
        out["callgrind_cells"] = callgrind_cells(ctx, starters[sluice], origin, small,
                                                 certs["ECDSA P-256"])
        # The peers' own counts by the same method, so instructions compare across proxies
        # (their crypto, like sluice's, takes valgrind's portable code paths), in the two cells
        # a request's own work decides; the handshake cells are the key exchange's.
        out["callgrind_peers"] = {
            name: callgrind_cells(ctx, start, origin, small, certs["ECDSA P-256"], top=0,
                                  only=("keep-alive HTTP/1.1", "HTTP/2 (10 conn × 10 streams)"))
            for name, start in starters.items() if name != sluice}
    finally:
        origin.stop()
        if helpers:
            helpers.remove()
    out.update({"id": "TLS", "sluice": sluice, "shares_raised": helpers is not None})
    return out


def callgrind_cells(ctx, start, origin, file, cert, requests=1000, top=12, only=None):
    """One proxy's instructions per request in each cell (callgrind, ECDSA): for sluice the
    before/after of each cut, which a shared machine's timings cannot show to a few percent;
    for the peers the same count beside it. `top`: how many functions to list by self cost;
    `only`: the cells to count (all when None)."""
    out = {}
    for label, _, args in CELLS:
        if only is not None and label not in only:
            continue
        r = budget.callgrind_per_request(ctx, functools.partial(start, tls=cert), origin, file,
                                         requests=requests, warm_requests=100, scheme="https",
                                         extra=["--ca", cert.ca, *args], top=top)
        r.pop("dump", None)
        out[label] = r
    return out


def _handshakes(cells):
    """Per peer and cell, the handshakes that were resumptions (so a "resumed" cell that fell
    back to full handshakes shows it) and those that settled on TLS 1.2 (so a server that did
    not run TLS 1.3 shows it)."""
    out = {}
    for peer, by_cell in cells.items():
        for label, runs in by_cell.items():
            if not isinstance(runs, list):
                continue
            full = sum(r.get("tls_full_handshakes", 0) for r in runs)
            resumed = sum(r.get("tls_resumed_handshakes", 0) for r in runs)
            tls12 = sum(r.get("tls12_handshakes", 0) for r in runs)
            out.setdefault(peer, {})[label] = {"full": full, "resumed": resumed, "tls12": tls12}
    return out
