"""An HTTP/3 test client on aioquic: runs the plan given as JSON in argv[1] and prints one JSON
object with what happened. Plans:

  {"addr": "127.0.0.1:P", "sni": "h3.test", "gets": [{"path": "/x", "headers": [["range", "bytes=0-9"]]}]}
      Requests on one connection, in parallel (GET, or the item's "method"; a HEAD answer's
      content-length is not held against its body, which is reported); per request: status,
      headers (trailers after them), length, sha256, and the stream reset code if the server
      reset the stream. With "ca_der_hex" (any plan), the
      server's chain must verify against that root for `sni`; without, it is not checked.
  {"addr": ..., "attack": "data-first" | "no-path" | "too-many-streams" | "big-headers" | "length"
   | "no-head" | "no-end" | "huge-frame" | "partial-trailers" | "qpack-fill" | "qpack-close"
   | "cancel", ...}
      One hostile exchange, then (on a new connection when the first is gone) a plain GET of
      "then" to show the server still serves.
  {"addr": ..., "sequence": {"path": "/x", "secs": 6, "interval": 0.05, "slow": "/y"}}
      One request at a time for `secs` seconds (and `slow` once, beside them, at the start), as
      a client that honours GOAWAY: after one, or once the connection is gone, requests go on a
      new connection; a request refused with H3_REQUEST_REJECTED (not processed) is sent again
      there. Reports every request (connection number, time, status, length, sha256, resends).
  {"addr": ..., "hold": N, "path": "/health", "hold_secs": 2}
      Opens N connections one after another from one address, a GET of `path` on each (none with
      "no_request"), keeps those that opened for `hold_secs` (writing `ready_file`, if given, once
      they are open; with "ping", PINGs that often); per connection: the response, or the close
      code, and whether the server offered DATAGRAM frames; when the server closed each, and
      whether it said GOAWAY first (and with which id); with "bare", each bare stream's id and
      the server's reset code for it. With "no_uni", the client grants the server no
      unidirectional stream; with "bare" (seconds), a
      request stream that never gets past the first bytes of its head is opened that often (with
      "bare_head", one with a whole head saying `content-length: 0` that never ends). With
      "client_goaway" (seconds), each connection sends its own GOAWAY then and opens no more
      bare streams.
  {"addr": ..., "resume": true, "path": "/x"}
      A GET on one connection, then the same GET and a POST on a second connection resumed
      with the session ticket of the first and sent at once (0-RTT when allowed), then the GET
      on a third with that same ticket again; reports whether each resumed and had its early
      data accepted.
  {"addr": ..., "abandon": true, "get": "/x", "post": "/y", "wait": 3, "close": false}
      A session ticket from a first connection; then a first flight carrying a GET and a POST
      as 0-RTT early data, and nothing more for `wait` seconds (the handshake never finishes;
      with `close`, a CONNECTION_CLOSE 0.3 s after the flight ends the connection first).
      With "listen", what the server sends is read meanwhile (nothing sent): "requests" gives
      each request's status or the code its stream was reset with, by method.
  {"addr": ..., "reset_probe": true, "path": "/x", "ready_file": F, "go_file": G}
      A GET on one connection, which is then kept; writes F and waits for G to exist; then sends
      short-header datagrams carrying the server's connection ID (the one in use) from another
      socket, and reports whether an answer ended with the stateless-reset token the server gave
      for that ID ("token_matches"), and how many answers came.
  {"addr": ..., "flood": N}
      N QUIC Initials (real ClientHellos) from N source ports, never continued; counts the
      server's answers by packet type (Retry or Initial).
  {"plans": [plan, ...]}
      Each plan in turn, in this one process; prints the list of their reports.
  {"addr": ..., "flood": N, "answer_retry": true, "then_from": "127.0.0.2"}
      The same, each Retry answered once with the Initial carrying its token (the address
      proved), and nothing after the server's answer to that; counts those answers as "admitted"
      (the handshake goes on) or "refused" (CONNECTION_REFUSED). Then, with `then_from`, one whole
      handshake from that source address (Retry answered), reported as "then".
"""

import asyncio
import contextlib
import hashlib
import json
import os
import socket
import ssl
import sys
import time

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.buffer import Buffer, encode_uint_var
from aioquic.h3.connection import H3_ALPN, FrameType, H3Connection, encode_frame
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import ConnectionTerminated, HandshakeCompleted, StreamReset


class Exchange:
    def __init__(self):
        self.status = None
        self.headers = []
        self.body = bytearray()
        self.reset = None
        self.done = asyncio.get_event_loop().create_future()

    def finish(self):
        if not self.done.done():
            self.done.set_result(None)

    def report(self):
        return {
            "status": self.status,
            "headers": self.headers,
            "length": len(self.body),
            "sha256": hashlib.sha256(bytes(self.body)).hexdigest(),
            "reset": self.reset,
        }


class GoawayAwareH3(H3Connection):
    """aioquic's HTTP/3 connection, noting a GOAWAY on the control stream (it ignores them)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.goaway = False
        self.goaway_id = None
        # The streams that carry a HEAD: aioquic does not track the method, and would hold
        # the `content-length` of such an answer (the GET's length, RFC 9110 §8.6) against its
        # body, which is none.
        self.head_streams = set()

    def _check_content_length(self, stream):
        if stream.stream_id in self.head_streams:
            return
        super()._check_content_length(stream)

    def _handle_control_frame(self, frame_type, frame_data):
        if frame_type == FrameType.GOAWAY:
            self.goaway = True
            self.goaway_id = Buffer(data=frame_data).pull_uint_var()
        return super()._handle_control_frame(frame_type, frame_data)


H3_REQUEST_REJECTED = 0x10B
H3_REQUEST_CANCELLED = 0x10C


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if Client.no_uni:
            self._quic._local_max_streams_uni.value = 0
        self.http = GoawayAwareH3(self._quic)
        self.exchanges = {}
        self.terminated = asyncio.get_event_loop().create_future()

    # The last close any connection saw (a refused handshake leaves no protocol to ask).
    last_terminated = None
    # Grant the server no unidirectional stream (so it cannot open its control stream).
    no_uni = False
    # Seconds to hold back everything the client sends after the server's first answer (so its
    # handshake's Finished): 0-RTT requests are then still early data when the server reads them.
    hold_finish = 0
    _first_answer = None

    def datagram_received(self, data, addr):
        if self._first_answer is None:
            self._first_answer = time.monotonic()
        super().datagram_received(data, addr)

    def transmit(self):
        if self._first_answer is not None and Client.hold_finish:
            wait = self._first_answer + Client.hold_finish - time.monotonic()
            if wait > 0:
                asyncio.get_event_loop().call_later(wait, self.transmit)
                return
        super().transmit()

    def quic_event_received(self, event):
        if isinstance(event, ConnectionTerminated):
            Client.last_terminated = {"error_code": event.error_code,
                                      "reason": event.reason_phrase}
            if not self.terminated.done():
                self.terminated.set_result(
                    {"error_code": event.error_code, "reason": event.reason_phrase}
                )
            for ex in self.exchanges.values():
                ex.finish()
        if isinstance(event, StreamReset) and event.stream_id in self.exchanges:
            ex = self.exchanges[event.stream_id]
            ex.reset = event.error_code
            ex.finish()
        for h3 in self.http.handle_event(event):
            ex = self.exchanges.get(getattr(h3, "stream_id", None))
            if ex is None:
                continue
            if isinstance(h3, HeadersReceived):
                for k, v in h3.headers:
                    if k == b":status":
                        ex.status = int(v)
                    else:
                        ex.headers.append([k.decode(), v.decode()])
                if h3.stream_ended:
                    ex.finish()
            elif isinstance(h3, DataReceived):
                ex.body += h3.data
                if h3.stream_ended:
                    ex.finish()

    def request(self, authority, path, headers=(), method="GET", fields=None):
        stream_id = self._quic.get_next_available_stream_id()
        if fields is None:
            fields = [
                (b":method", method.encode()),
                (b":scheme", b"https"),
                (b":authority", authority.encode()),
                (b":path", path.encode()),
            ] + [(k.encode(), v.encode()) for k, v in headers]
        ex = Exchange()
        self.exchanges[stream_id] = ex
        if (b":method", b"HEAD") in fields:
            self.http.head_streams.add(stream_id)
        self.http.send_headers(stream_id, fields, end_stream=True)
        self.transmit()
        return ex


def qpack_int(value, prefix_bits, first):
    """An integer with an N-bit prefix (RFC 9204 §4.1.1), the prefix's high bits from `first`."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def qpack_literals(fields):
    """A QPACK field section with no dynamic table: every field a literal with a literal name."""
    out = b"\x00\x00"
    for name, value in fields:
        out += qpack_int(len(name), 3, 0x20) + name
        out += qpack_int(len(value), 7, 0x00) + value
    return out


def configuration(plan):
    c = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN)
    if plan.get("ca_der_hex"):
        # Verify the server's chain against this root (DER, hex) for the name `sni`.
        c.verify_mode = ssl.CERT_REQUIRED
        c.load_verify_locations(
            cadata=ssl.DER_cert_to_PEM_cert(bytes.fromhex(plan["ca_der_hex"])).encode()
        )
    else:
        c.verify_mode = ssl.CERT_NONE
    c.server_name = plan.get("sni", "h3.test")
    c.max_data = 64 * 1024 * 1024
    c.max_stream_data = 16 * 1024 * 1024
    c.idle_timeout = plan.get("timeout", 30)
    return c


async def ends_of(client, exs, since, secs, step, until_all_ended=False):
    """Keeps the connection up with a PING every `step` seconds for `secs`: each exchange's
    report with when (seconds after `since`, to `step`) it ended, or None. With
    `until_all_ended`, stops 1.5 s after every exchange has ended (their reports cannot change;
    the wait keeps a server that closes the connection a little after the resets from passing
    the request that follows on it)."""
    at = [None] * len(exs)
    all_ended = None
    for n in range(int(secs / step)):
        await asyncio.sleep(step)
        client._quic.send_ping(n)
        client.transmit()
        for i, ex in enumerate(exs):
            if ex.done.done() and at[i] is None:
                at[i] = round(time.monotonic() - since, 2)
        if until_all_ended and all_ended is None and all(t is not None for t in at):
            all_ended = time.monotonic()
        if all_ended is not None and time.monotonic() - all_ended >= 1.5:
            break
    return [dict(ex.report(), at=at[i]) for i, ex in enumerate(exs)]


async def gets(client, plan, items, timeout):
    authority = plan.get("authority", "127.0.0.1")
    exs = [client.request(authority, g["path"], g.get("headers", []), g.get("method", "GET"))
           for g in items]
    await asyncio.wait_for(asyncio.gather(*(e.done for e in exs)), timeout)
    return [e.report() for e in exs]


def served_certificate(client):
    """The SHA-256 (hex) of the leaf certificate the server presented."""
    from cryptography.hazmat.primitives.serialization import Encoding

    leaf = client._quic.tls._peer_certificate
    return hashlib.sha256(leaf.public_bytes(Encoding.DER)).hexdigest()


async def run(plan):
    host, port = plan["addr"].rsplit(":", 1)
    port = int(port)
    timeout = plan.get("timeout", 30)
    out = {}
    async with connect(
        host, port, configuration=configuration(plan), create_protocol=Client, wait_connected=True
    ) as client:
        attack = plan.get("attack")
        if attack is None:
            out["responses"] = await gets(client, plan, plan["gets"], timeout)
            out["certificate_sha256"] = served_certificate(client)
            if client.terminated.done():
                out["terminated"] = client.terminated.result()
            return out
        q = client._quic
        if attack == "data-first":
            # A DATA frame where the request's HEADERS must come first: H3_FRAME_UNEXPECTED.
            sid = q.get_next_available_stream_id()
            q.send_stream_data(sid, encode_uint_var(FrameType.DATA) + encode_uint_var(3) + b"abc")
            client.transmit()
        elif attack == "no-path":
            # A request without :path is malformed: the stream is reset (H3_MESSAGE_ERROR) and
            # the connection goes on.
            ex = client.request(
                "",
                "",
                fields=[(b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"127.0.0.1")],
            )
            await asyncio.wait_for(ex.done, timeout)
            out["attack"] = ex.report()
        elif attack == "big-headers":
            # A head over the server's SETTINGS_MAX_FIELD_SECTION_SIZE (aioquic's encoder would
            # refuse to write it, so the field section is encoded here).
            fields = [
                (b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"127.0.0.1"),
                (b":path", plan["then"].encode()), (b"x-big", b"a" * plan["size"]),
            ]
            sid = q.get_next_available_stream_id()
            ex = Exchange()
            client.exchanges[sid] = ex
            block = qpack_literals(fields)
            q.send_stream_data(
                sid,
                encode_uint_var(FrameType.HEADERS) + encode_uint_var(len(block)) + block,
                end_stream=True,
            )
            client.transmit()
            await asyncio.wait_for(ex.done, timeout)
            out["attack"] = ex.report()
        elif attack == "length":
            # A POST whose body is `parts` (byte counts, each its own DATA frame sent 0.2 s
            # after the one before; 0 is an empty DATA frame) under a content-length of
            # `declared` (none when null): a mismatch is malformed (RFC 9114 section 4.1.2),
            # never passed on cut to length.
            sid = q.get_next_available_stream_id()
            ex = Exchange()
            client.exchanges[sid] = ex
            method = plan.get("method", "POST").encode()
            fields = [(b":method", method), (b":scheme", b"https"),
                      (b":authority", b"127.0.0.1"), (b":path", plan["path"].encode())]
            # "pseudo": more pseudo-header fields ([[name, value]]) right after these.
            fields += [(k.encode(), v.encode()) for k, v in plan.get("pseudo") or []]
            if plan["declared"] is not None:
                fields.append((b"content-length", str(plan["declared"]).encode()))
            # "fields": more request fields ([[name, value]]).
            fields += [(k.encode(), v.encode()) for k, v in plan.get("fields") or []]
            # With "trailers" ([[name, value]]) the body ends with them; with "after_trailers"
            # (a byte count) a DATA frame follows them, which is malformed (RFC 9114 section 4.1).
            trailers = [(k.encode(), v.encode()) for k, v in plan.get("trailers") or []]
            after = plan.get("after_trailers")
            # With "truncated" ([frame length, bytes sent]) the parts are followed by a DATA
            # frame that says more than it carries, and then the stream's end on its own.
            truncated = plan.get("truncated")
            parts = plan["parts"]
            client.http.send_headers(
                sid, fields, end_stream=not parts and not trailers and not truncated
            )
            for i, n in enumerate(parts):
                if i:
                    await asyncio.sleep(0.2)
                last = i == len(parts) - 1 and not trailers and not truncated
                client.http.send_data(sid, b"x" * n, end_stream=last)
                client.transmit()
            if truncated:
                frame_len, sent = truncated
                q.send_stream_data(
                    sid, encode_uint_var(FrameType.DATA) + encode_uint_var(frame_len) + b"x" * sent
                )
                client.transmit()
                await asyncio.sleep(0.2)
                q.send_stream_data(sid, b"", end_stream=True)
                client.transmit()
            if trailers:
                await asyncio.sleep(0.2)
                client.http.send_headers(sid, trailers, end_stream=after is None)
                client.transmit()
            if after is not None:
                await asyncio.sleep(0.2)
                q.send_stream_data(
                    sid,
                    encode_uint_var(FrameType.DATA) + encode_uint_var(after) + b"x" * after,
                    end_stream=True,
                )
                client.transmit()
            await asyncio.wait_for(ex.done, timeout)
            out["attack"] = ex.report()
            if after is not None or truncated:
                # The server closes the connection for it, perhaps just after answering.
                await asyncio.wait([client.terminated], timeout=5)
            if client.terminated.done():
                out["terminated"] = client.terminated.result()
        elif attack == "huge-frame":
            # A request stream's frame (`kind`: "headers", or "unknown" for a reserved type,
            # which must be skipped) declaring `declared` bytes, its payload sent 64 KiB at a
            # time up to `send` bytes or until the connection is closed; then the close code,
            # and how many bytes the server had taken by then.
            sid = q.get_next_available_stream_id()
            ex = Exchange()
            client.exchanges[sid] = ex
            ty = FrameType.HEADERS if plan["kind"] == "headers" else 0x1F * 7 + 0x21
            q.send_stream_data(sid, encode_uint_var(ty) + encode_uint_var(plan["declared"]))
            client.transmit()
            sent = 0
            while sent < plan["send"] and not client.terminated.done():
                try:
                    q.send_stream_data(sid, b"\0" * 65536)
                except AssertionError:
                    # The stream was reset as the connection closed.
                    break
                sent += 65536
                client.transmit()
                await asyncio.sleep(0.01)
            await asyncio.wait([client.terminated], timeout=plan.get("wait", 5))
            if client.terminated.done():
                out["terminated"] = client.terminated.result()
            # How far the server let the stream go (its MAX_STREAM_DATA grows only as it reads).
            stream = q._streams.get(sid)
            out["attack"] = {"sent": sent,
                             "max_stream_data": stream.max_stream_data_remote if stream else None}
        elif attack == "partial-trailers":
            # `streams` POSTs to `path`, each a head, a DATA frame of 10 bytes, then trailers (a
            # HEADERS frame) declaring `declared` bytes of which `sent` are sent, never the rest;
            # then `wait` seconds. Reports how many streams got that far before the connection
            # closed, and the close.
            opened = 0
            for _ in range(plan["streams"]):
                if client.terminated.done():
                    break
                sid = q.get_next_available_stream_id()
                fields = [(b":method", b"POST"), (b":scheme", b"https"),
                          (b":authority", b"127.0.0.1"), (b":path", plan["path"].encode())]
                client.http.send_headers(sid, fields)
                client.http.send_data(sid, b"x" * 10, end_stream=False)
                head = encode_uint_var(FrameType.HEADERS) + encode_uint_var(plan["declared"])
                q.send_stream_data(sid, head + b"\0" * plan["sent"])
                client.transmit()
                opened += 1
                await asyncio.sleep(0.05)
            await asyncio.wait([client.terminated], timeout=plan.get("wait", 3))
            if client.terminated.done():
                out["terminated"] = client.terminated.result()
            out["attack"] = {"opened": opened}
        elif attack == "qpack-fill":
            # `send` bytes on each of the client's QPACK encoder and decoder streams, then `wait`
            # seconds: how far the server let each go (its MAX_STREAM_DATA grows only as it
            # reads them).
            sids = [client.http._local_encoder_stream_id, client.http._local_decoder_stream_id]
            sent = 0
            while sent < plan["send"] and not client.terminated.done():
                for sid in sids:
                    q.send_stream_data(sid, b"\0" * 65536)
                sent += 65536
                client.transmit()
                await asyncio.sleep(0.005)
            # Until the server has let all of it through, or `wait` seconds.
            deadline = time.monotonic() + plan.get("wait", 10)
            while time.monotonic() < deadline:
                if all(q._streams[sid].max_stream_data_remote >= plan["send"] for sid in sids):
                    break
                await asyncio.sleep(0.1)
            out["attack"] = {
                "max_stream_data": [q._streams[sid].max_stream_data_remote for sid in sids],
            }
        elif attack == "qpack-close":
            # The client's QPACK encoder (or, with "decoder", decoder) stream ended, or with
            # "reset" reset: a critical stream closed (RFC 9204 §4.2). After one request, so the
            # server has read the streams' types: a stream reset before that may be dropped
            # unread (RFC 9114 §6.2 asks a receiver to tolerate it).
            await gets(client, plan, [{"path": plan["then"]}], timeout)
            sid = (client.http._local_decoder_stream_id if plan.get("decoder")
                   else client.http._local_encoder_stream_id)
            if plan.get("reset"):
                q.reset_stream(sid, 0x100)
            else:
                q.send_stream_data(sid, b"", end_stream=True)
            client.transmit()
        elif attack == "no-end":
            # A POST whose head says `content-length: 0`, its stream never ended, the connection
            # kept up by PINGs for up to `secs`.
            sid = q.get_next_available_stream_id()
            ex = Exchange()
            client.exchanges[sid] = ex
            client.http.send_headers(
                sid,
                [(b":method", b"POST"), (b":scheme", b"https"), (b":authority", b"127.0.0.1"),
                 (b":path", plan["path"].encode()), (b"content-length", b"0")],
            )
            client.transmit()
            opened = time.monotonic()
            for n in range(int(plan["secs"] / 0.25)):
                await asyncio.sleep(0.25)
                q.send_ping(n)
                client.transmit()
                if ex.done.done():
                    break
            out["attack"] = dict(ex.report(), at=round(time.monotonic() - opened, 2))
        elif attack == "no-head":
            # `streams` request streams, each holding the first bytes of a HEADERS frame that
            # never completes, the connection kept up by PINGs for `secs`: each stream's reset
            # code and when it came.
            opened = time.monotonic()
            exs = []
            for _ in range(plan["streams"]):
                sid = q.get_next_available_stream_id()
                ex = Exchange()
                client.exchanges[sid] = ex
                exs.append(ex)
                q.send_stream_data(
                    sid, encode_uint_var(FrameType.HEADERS) + encode_uint_var(100) + b"\0" * 10
                )
            client.transmit()
            # Up to `secs`, or until every stream has ended (the report cannot change after).
            out["attack"] = await ends_of(client, exs, opened, plan["secs"], 0.25, True)
        elif attack == "cancel":
            # The requests of `items` (as in "gets"), cancelled after `after` seconds as RFC 9114
            # §4.1.1 says a client cancels (STOP_SENDING with H3_REQUEST_CANCELLED; the request
            # side ended with its head already), then the connection kept up by PINGs for `secs`: each
            # stream's reset code from the server and when it came.
            exs = [client.request(plan.get("authority", "127.0.0.1"), g["path"],
                                  g.get("headers", []), g.get("method", "GET"))
                   for g in plan["items"]]
            sids = list(client.exchanges)[-len(exs):]
            await asyncio.sleep(plan["after"])
            cancelled = time.monotonic()
            for sid in sids:
                q.stop_stream(sid, H3_REQUEST_CANCELLED)
            client.transmit()
            out["attack"] = await ends_of(client, exs, cancelled, plan["secs"], 0.1)
        elif attack == "too-many-streams":
            # Ignore the server's stream limit and open far more request streams than it allows.
            q._remote_max_streams_bidi = 1 << 20
            for _ in range(plan["streams"]):
                sid = q.get_next_available_stream_id()
                q.send_stream_data(sid, b"", end_stream=False)
                client.http.send_headers(
                    sid,
                    [(b":method", b"GET"), (b":scheme", b"https"),
                     (b":authority", b"127.0.0.1"), (b":path", plan["then"].encode())],
                    end_stream=True,
                )
            client.transmit()
        if not plan.get("then"):
            # No follow-up asked for (the server may be going away).
            return out
        if attack in ("data-first", "too-many-streams", "qpack-close"):
            out["terminated"] = await asyncio.wait_for(client.terminated, timeout)
        elif not client.terminated.done():
            out["responses"] = await gets(client, plan, [{"path": plan["then"]}], timeout)
            return out
    # The first connection is gone; a new one must be served.
    async with connect(
        host, port, configuration=configuration(plan), create_protocol=Client, wait_connected=True
    ) as client:
        out["responses"] = await gets(client, plan, [{"path": plan["then"]}], timeout)
    return out


async def sequence(plan):
    host, port = plan["addr"].rsplit(":", 1)
    port = int(port)
    seq = plan["sequence"]
    timeout = plan.get("timeout", 30)
    authority = plan.get("authority", "127.0.0.1")
    conns = []
    out = {"requests": []}
    start = time.monotonic()
    async with contextlib.AsyncExitStack() as stack:

        async def new_connection():
            c = await stack.enter_async_context(
                connect(host, port, configuration=configuration(plan), create_protocol=Client,
                        wait_connected=True)
            )
            conns.append(c)
            return c

        client = await new_connection()
        slow = client.request(authority, seq["slow"]) if seq.get("slow") else None
        while time.monotonic() - start < seq["secs"]:
            if client.http.goaway or client.terminated.done():
                client = await new_connection()
            resent = 0
            while True:
                ex = client.request(authority, seq["path"])
                await asyncio.wait_for(ex.done, timeout)
                if ex.reset == H3_REQUEST_REJECTED and resent < 3:
                    resent += 1
                    client = await new_connection()
                    continue
                break
            r = ex.report()
            r.update({"connection": len(conns), "at": round(time.monotonic() - start, 3),
                      "resent": resent})
            out["requests"].append(r)
            await asyncio.sleep(seq.get("interval", 0.05))
        if slow is not None:
            await asyncio.wait_for(slow.done, timeout)
            out["slow"] = slow.report()
        out["connections"] = len(conns)
        out["goaways"] = sum(1 for c in conns if c.http.goaway)
        for c in conns:
            # Connections to a process that is gone: do not wait for their close to be answered.
            c._quic.close()
            c.transmit()
    return out


async def resume(plan):
    """A GET of `path` on a first connection, keeping the session ticket the server sends; then
    a second connection resumed with it, the same GET sent before the handshake is confirmed (as
    0-RTT early data when the ticket allows it). Reports whether the second connection resumed,
    whether the server accepted early data, and both responses."""
    host, port = plan["addr"].rsplit(":", 1)
    port = int(port)
    timeout = plan.get("timeout", 30)
    tickets = []
    out = {}
    async with connect(
        host, port, configuration=configuration(plan), create_protocol=Client,
        session_ticket_handler=tickets.append, wait_connected=True,
    ) as client:
        out["first"] = (await gets(client, plan, [{"path": plan["path"]}], timeout))[0]
        # The ticket comes after the handshake: give it a moment.
        deadline = time.time() + 5
        while not tickets and time.time() < deadline:
            await asyncio.sleep(0.05)
    out["ticket"] = bool(tickets)
    out["ticket_allows_early_data"] = bool(tickets) and (tickets[-1].max_early_data_size or 0) > 0
    if not tickets:
        return out
    c = configuration(plan)
    c.session_ticket = tickets[-1]
    # The handshake's end held back a moment: on loopback it would otherwise often reach the
    # server before the requests are read, which are then no longer early.
    Client.hold_finish = 0.3
    async with connect(
        host, port, configuration=c, create_protocol=Client, wait_connected=False,
    ) as client:
        # A GET and a POST, both sent before the handshake is confirmed.
        authority = plan.get("authority", "127.0.0.1")
        exs = [client.request(authority, plan["path"]),
               client.request(authority, plan["path"], method="POST")]
        await asyncio.wait_for(asyncio.gather(*(e.done for e in exs)), timeout)
        out["second"], out["second_post"] = exs[0].report(), exs[1].report()
        out["resumed"] = client._quic.tls.session_resumed
        out["early_data_accepted"] = client._quic.tls.early_data_accepted
    Client.hold_finish = 0
    # The same ticket once more, as an attacker replaying the first flight would present it.
    c = configuration(plan)
    c.session_ticket = tickets[-1]
    async with connect(
        host, port, configuration=c, create_protocol=Client, wait_connected=False,
    ) as client:
        out["replayed"] = (await gets(client, plan, [{"path": plan["path"]}], timeout))[0]
        out["replay_resumed"] = client._quic.tls.session_resumed
        out["replay_early_data_accepted"] = client._quic.tls.early_data_accepted
    return out


def abandon(plan):
    """A session ticket from a first connection; then a second connection's first flight
    carrying, as 0-RTT early data, a GET of `get` and a POST to `post`, and never another
    packet (the handshake is never finished, as with a replayed first flight)."""
    host, port = plan["addr"].rsplit(":", 1)
    addr = (host, int(port))
    tickets = []

    async def first():
        async with connect(
            host, int(port), configuration=configuration(plan), create_protocol=Client,
            session_ticket_handler=tickets.append, wait_connected=True,
        ) as client:
            await gets(client, plan, [{"path": plan["get"]}], 30)
            deadline = time.time() + 5
            while not tickets and time.time() < deadline:
                await asyncio.sleep(0.05)

    asyncio.run(first())
    out = {"ticket": bool(tickets)}
    if not tickets:
        return out
    c = configuration(plan)
    c.session_ticket = tickets[-1]
    quic = QuicConnection(configuration=c)
    quic.connect(addr, now=time.time())
    http = H3Connection(quic)
    sids = {}
    for method, path in ((b"GET", plan["get"]), (b"POST", plan["post"])):
        sid = quic.get_next_available_stream_id()
        sids[method.decode()] = sid
        http.send_headers(sid, [(b":method", method), (b":scheme", b"https"),
                                (b":authority", b"127.0.0.1"), (b":path", path.encode())],
                          end_stream=True)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    sent = 0
    for data, _ in quic.datagrams_to_send(now=time.time()):
        s.sendto(data, addr)
        sent += 1
    out["sent"] = sent
    if plan.get("close"):
        # The client closes the connection instead (CONNECTION_CLOSE), before the server's
        # handshake timeout would end it.
        time.sleep(0.3)
        quic.close(error_code=0, reason_phrase="gone")
        for data, _ in quic.datagrams_to_send(now=time.time()):
            s.sendto(data, addr)
    if plan.get("listen"):
        # What the server sends is read (its half of the handshake, the responses, resets),
        # nothing more is sent: the handshake stays unfinished on the server's side.
        out.update(listen(quic, http, s, addr, sids, plan.get("wait", 3)))
    else:
        time.sleep(plan.get("wait", 3))
    s.close()
    return out


def listen(quic, http, s, addr, sids, secs):
    """Feeds `quic` what arrives on `s` for `secs` seconds, never sending: per request (by
    method), its status or the code its stream was reset with."""
    s.setblocking(False)
    by_sid = {sid: method for method, sid in sids.items()}
    seen = {method: {} for method in sids}
    deadline = time.time() + secs
    closed = False
    while time.time() < deadline and not closed:
        try:
            data = s.recv(65536)
        except BlockingIOError:
            time.sleep(0.01)
            continue
        quic.receive_datagram(data, addr, now=time.time())
        while (event := quic.next_event()) is not None:
            # The server closed the connection: nothing more will come.
            closed = closed or isinstance(event, ConnectionTerminated)
            if isinstance(event, StreamReset) and event.stream_id in by_sid:
                seen[by_sid[event.stream_id]]["reset"] = event.error_code
            for h3 in http.handle_event(event):
                if isinstance(h3, HeadersReceived) and h3.stream_id in by_sid:
                    status = dict(h3.headers).get(b":status")
                    seen[by_sid[h3.stream_id]]["status"] = int(status) if status else None
    return {"requests": seen}


async def hold(plan):
    host, port = plan["addr"].rsplit(":", 1)
    port = int(port)
    timeout = plan.get("timeout", 10)
    authority = plan.get("authority", "127.0.0.1")
    out = {"connections": []}
    conns = []
    Client.no_uni = bool(plan.get("no_uni"))
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(plan["hold"]):
            try:
                c = await asyncio.wait_for(stack.enter_async_context(
                    connect(host, port, configuration=configuration(plan),
                            create_protocol=Client, wait_connected=True)), timeout)
            except ConnectionError:
                out["connections"].append({"refused": Client.last_terminated})
                continue
            except asyncio.TimeoutError:
                out["connections"].append({"refused": "timeout"})
                continue
            conns.append(c)
            # What the server offered: QUIC DATAGRAM frames (max_datagram_frame_size) or not.
            datagrams = c._quic._remote_max_datagram_frame_size
            if plan.get("no_request"):
                out["connections"].append({"open": True, "datagrams": datagrams})
                continue
            ex = c.request(authority, plan["path"])
            await asyncio.wait_for(ex.done, timeout)
            if c.terminated.done():
                out["connections"].append({"refused": c.terminated.result()})
            else:
                out["connections"].append({"response": ex.report(), "datagrams": datagrams})
        if plan.get("ready_file"):
            with open(plan["ready_file"], "w") as f:
                f.write("held\n")
        # With "ping" (seconds), each connection sends a PING that often while it is held: the
        # line is never quiet. When the server closed each, from the end of the opening.
        # With "bare" (seconds), each also opens a request stream that often that never gets
        # past the first bytes of its head.
        start = time.monotonic()
        closed = [None] * len(conns)
        bares = [[] for _ in conns]
        last_bare = start
        while time.monotonic() - start < plan.get("hold_secs", 0):
            # Every held connection closed: nothing more can be seen, so the hold ends early.
            if conns and all(t is not None for t in closed):
                break
            await asyncio.sleep(plan.get("ping") or 0.1)
            gone = plan.get("client_goaway") is not None and (
                time.monotonic() - start >= plan["client_goaway"])
            bare = (plan.get("bare") and not gone
                    and time.monotonic() - last_bare >= plan["bare"])
            if bare:
                last_bare = time.monotonic()
            for i, c in enumerate(conns):
                if c.terminated.done():
                    if closed[i] is None:
                        closed[i] = round(time.monotonic() - start, 2)
                    continue
                if bare:
                    # Each bare stream's reset, if the server sent one.
                    bares[i].append((c._quic.get_next_available_stream_id(), Exchange()))
                    c.exchanges[bares[i][-1][0]] = bares[i][-1][1]
                if bare and plan.get("bare_head"):
                    # A whole head that says `content-length: 0`, the stream never ended.
                    sid = c._quic.get_next_available_stream_id()
                    c.http.send_headers(sid, [
                        (b":method", b"POST"), (b":scheme", b"https"),
                        (b":authority", b"127.0.0.1"), (b":path", b"/plain/size/1"),
                        (b"content-length", b"0"),
                    ])
                elif bare:
                    sid = c._quic.get_next_available_stream_id()
                    c._quic.send_stream_data(
                        sid, encode_uint_var(FrameType.HEADERS) + encode_uint_var(100) + b"\0" * 10
                    )
                if gone and not getattr(c, "said_goaway", False):
                    # The client's GOAWAY names the push ID it would still take (none: 0).
                    c.said_goaway = True
                    c._quic.send_stream_data(
                        c.http._local_control_stream_id,
                        encode_frame(FrameType.GOAWAY, encode_uint_var(0)))
                    c.transmit()
                if plan.get("ping"):
                    c._quic.send_ping(i)
                if bare or plan.get("ping"):
                    c.transmit()
        out["closed_at"] = closed
        out["goaway"] = [c.http.goaway for c in conns]
        out["goaway_id"] = [c.http.goaway_id for c in conns]
        out["bare"] = [[{"id": sid, "reset": ex.reset} for sid, ex in b] for b in bares]
    return out


async def reset_probe(plan):
    host, port = plan["addr"].rsplit(":", 1)
    port = int(port)
    timeout = plan.get("timeout", 10)
    out = {}
    async with connect(host, port, configuration=configuration(plan), create_protocol=Client,
                       wait_connected=True) as c:
        ex = c.request(plan.get("authority", "127.0.0.1"), plan["path"])
        await asyncio.wait_for(ex.done, timeout)
        out["status"] = ex.status
        cid = c._quic._peer_cid.cid
        token = c._quic._peer_cid.stateless_reset_token
        out["cid_len"] = len(cid)
        with open(plan["ready_file"], "w") as f:
            f.write("open\n")
        deadline = time.monotonic() + plan.get("wait", 30)
        while not os.path.exists(plan["go_file"]):
            if time.monotonic() > deadline:
                out["go"] = False
                return out
            await asyncio.sleep(0.05)
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        probe.setblocking(False)
        loop = asyncio.get_event_loop()
        answers = 0
        out["token_matches"] = False
        try:
            for _ in range(30):
                # A short header (fixed bit set) with the server's connection ID, and enough
                # bytes after it for a reset to be smaller than the datagram.
                datagram = bytes([0x40 | (os.urandom(1)[0] & 0x3F)]) + cid + os.urandom(80)
                probe.sendto(datagram, (host, port))
                try:
                    got = await asyncio.wait_for(loop.sock_recv(probe, 2048), 0.2)
                except asyncio.TimeoutError:
                    continue
                answers += 1
                if got[-16:] == token:
                    out["token_matches"] = True
                    break
        finally:
            probe.close()
        out["answers"] = answers
    return out


def flood(plan):
    """Sends real client Initials from many source ports and never answers; returns counts of
    what came back, by long-header packet type."""
    host, port = plan["addr"].rsplit(":", 1)
    addr = (host, int(port))
    socks = []
    # Each socket's connection, and the Retry it got (answered later with `answer_retry`).
    quics = []
    sent = 0
    for _ in range(plan["flood"]):
        quic = QuicConnection(configuration=configuration(plan))
        quic.connect(addr, now=time.time())
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        s.setblocking(False)
        for data, _ in quic.datagrams_to_send(now=time.time()):
            s.sendto(data, addr)
            sent += 1
        socks.append(s)
        quics.append([quic, None])
    counts = {"retry": 0, "initial": 0, "other": 0, "silent": 0, "sent": sent}
    deadline = time.time() + plan.get("wait", 3)
    answered = set()
    while time.time() < deadline and len(answered) < len(socks):
        for i, s in enumerate(socks):
            if i in answered:
                continue
            try:
                data = s.recv(65536)
            except BlockingIOError:
                continue
            answered.add(i)
            kind = (data[0] & 0x30) >> 4 if data[0] & 0x80 else -1
            if kind == 3:
                quics[i][1] = data
            counts["retry" if kind == 3 else "initial" if kind == 0 else "other"] += 1
        time.sleep(0.01)
    counts["silent"] = len(socks) - len(answered)
    if plan.get("answer_retry"):
        counts.update(answer_retries(plan, addr, socks, quics))
    if plan.get("then_from"):
        counts["then"] = one_handshake(plan, addr, plan["then_from"])
    for s in socks:
        s.close()
    return counts


def feed(quic, data, addr):
    quic.receive_datagram(data, addr, now=time.time())


def answer_retries(plan, addr, socks, quics):
    """Answers each socket's Retry (kept in `quics` by `flood`) once and sorts the server's
    answers to that: a CONNECTION_CLOSE with CONNECTION_REFUSED (0x2), or the handshake going on."""
    out = {"admitted": 0, "refused": 0, "unanswered": 0}
    for s, (quic, retry) in zip(socks, quics):
        if retry is None:
            continue
        feed(quic, retry, addr)
        for data, _ in quic.datagrams_to_send(now=time.time()):
            s.sendto(data, addr)
    deadline = time.time() + plan.get("wait", 3)
    pending = {i for i, (_, retry) in enumerate(quics) if retry is not None}
    while time.time() < deadline and pending:
        for i in list(pending):
            try:
                data = socks[i].recv(65536)
            except BlockingIOError:
                continue
            quic = quics[i][0]
            feed(quic, data, addr)
            close = quic._close_event
            if close is not None:
                out["refused" if close.error_code == 0x2 else "unanswered"] += 1
            else:
                out["admitted"] += 1
            pending.discard(i)
        time.sleep(0.01)
    out["unanswered"] += len(pending)
    return out


def one_handshake(plan, addr, source):
    """A whole handshake from `source` (a Retry answered): whether it completed, or the error
    code it was closed with."""
    quic = QuicConnection(configuration=configuration(plan))
    quic.connect(addr, now=time.time())
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((source, 0))
    s.setblocking(False)
    deadline = time.time() + plan.get("wait", 3) + 5
    try:
        while time.time() < deadline:
            for data, _ in quic.datagrams_to_send(now=time.time()):
                s.sendto(data, addr)
            try:
                data = s.recv(65536)
            except BlockingIOError:
                time.sleep(0.005)
                continue
            feed(quic, data, addr)
            while (event := quic.next_event()) is not None:
                if isinstance(event, HandshakeCompleted):
                    # The client's Finished too, so the server's handshake ends.
                    for data, _ in quic.datagrams_to_send(now=time.time()):
                        s.sendto(data, addr)
                    time.sleep(0.2)
                    return {"completed": True}
            if quic._close_event is not None:
                return {"completed": False, "error": quic._close_event.error_code}
        return {"completed": False, "error": None}
    finally:
        s.close()


def one(plan):
    """Runs one plan, from a clean slate, and returns its report."""
    Client.no_uni = False
    Client.hold_finish = 0
    Client.last_terminated = None
    if "flood" in plan:
        out = flood(plan)
    elif "sequence" in plan:
        out = asyncio.run(asyncio.wait_for(sequence(plan), plan["sequence"]["secs"] + 60))
    elif "abandon" in plan:
        out = abandon(plan)
    elif "resume" in plan:
        out = asyncio.run(asyncio.wait_for(resume(plan), 90))
    elif "hold" in plan:
        out = asyncio.run(asyncio.wait_for(hold(plan), 60))
    elif "reset_probe" in plan:
        out = asyncio.run(asyncio.wait_for(reset_probe(plan), 90))
    else:
        out = asyncio.run(asyncio.wait_for(run(plan), plan.get("timeout", 30) * 2))
    return out


def main():
    plan = json.loads(sys.argv[1])
    # {"plans": [...]}: each plan in turn in this one process (one interpreter start for many),
    # a list of their reports.
    if "plans" in plan:
        out = [one(p) for p in plan["plans"]]
    else:
        out = one(plan)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
