#!/usr/bin/env python3
"""RTSP server for sluice's tests: GStreamer's RTSP server (gst-rtsp-server) serving an
MPEG-TS file as RTP/MP2T (payload type 33) on 127.0.0.1.

Mounts: /live (shared by clients) and /archive (a session per client, for catch-up); with
--user every mount asks for those credentials (Basic or Digest per --auth). Prints "PORT <n>" once listening, then one JSON line per
request it receives (method, uri, and the Range, Transport, Session, Authorization and
User-Agent headers) so a test can check exactly what the client sent.

--drop-after S closes every client connection S seconds after the first PLAY (a server that
drops the session mid-stream). --session-timeout S makes sessions expire unless kept alive.
--redirect PATH=URL answers DESCRIBE of PATH with 302 and that Location.
--mtu N makes /live and /archive send RTP packets of up to N bytes (rtpmp2tpay's `mtu`: as
many whole TS packets as fit after the 12-byte RTP header; 3020 gives 16 of them).

--mp4 FILE adds two seekable mounts over an H.264 MP4 (qtdemux seeks it by time, and the
video is re-muxed to MPEG-TS): /vod, where GStreamer honours `Range: npt=` itself, and
/timeshift, an operator-style catch-up server whose recording began at --recorded-at
(YYYYMMDDThhmmssZ): a PLAY `Range: clock=` is a wall-clock instant of that recording. The
server maps it to the recording's own time (npt) before GStreamer handles the PLAY, because
GStreamer reads clock ranges as absolute times since 1900 (far past the end of any file).
"""
import argparse
import calendar
import contextlib
import ctypes
import json
import sys
import time

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtsp", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtsp, GstRtspServer  # noqa: E402

HEADERS = {
    "range": GstRtsp.RTSPHeaderField.RANGE,
    "transport": GstRtsp.RTSPHeaderField.TRANSPORT,
    "session": GstRtsp.RTSPHeaderField.SESSION,
    "authorization": GstRtsp.RTSPHeaderField.AUTHORIZATION,
    "user_agent": GstRtsp.RTSPHeaderField.USER_AGENT,
}


@contextlib.contextmanager
def writable(mini_object):
    """The Python wrapper holds a second reference to a query a probe receives, so GStreamer
    calls it read-only; the probe runs on the only thread using the query, so its reference
    count is set to 1 while it is answered, then restored. (PyGBoxed: the C pointer follows
    the 16-byte object header; GstMiniObject: the count follows the 8-byte type.)"""
    pointer = ctypes.c_void_p.from_address(id(mini_object) + 16).value
    refcount = ctypes.c_int.from_address(pointer + 8)
    saved = refcount.value
    refcount.value = 1
    try:
        yield
    finally:
        refcount.value = saved


LIBGSTRTSP = ctypes.CDLL("libgstrtsp-1.0.so.0")
LIBGSTRTSP.gst_rtsp_message_remove_header.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
LIBGSTRTSP.gst_rtsp_message_add_header.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p]


def set_range(ctx, value):
    """Replaces the Range header of the request being handled. `ctx.request` is a copy in
    Python, so the header is changed in the server's own message: GstRTSPContext's fourth
    field (after server, conn, client: pointers of 8 bytes), reached through the wrapper's C
    pointer."""
    context = ctypes.c_void_p.from_address(id(ctx) + 16).value
    message = ctypes.c_void_p.from_address(context + 3 * 8).value
    field = int(GstRtsp.RTSPHeaderField.RANGE)
    LIBGSTRTSP.gst_rtsp_message_remove_header(message, field, -1)
    LIBGSTRTSP.gst_rtsp_message_add_header(message, field, value.encode())


def emit(record):
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ts", required=True)
    ap.add_argument("--user")
    ap.add_argument("--password")
    ap.add_argument("--auth", choices=["basic", "digest"], default="digest")
    ap.add_argument("--drop-after", type=float, default=0)
    ap.add_argument("--session-timeout", type=int, default=0)
    ap.add_argument("--redirect", action="append", default=[])
    ap.add_argument("--mp4")
    ap.add_argument("--recorded-at", default="20240101T120000Z")
    ap.add_argument("--mtu", type=int, default=0)
    args = ap.parse_args()

    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service("0")
    mounts = server.get_mount_points()
    mtu = f" mtu={args.mtu}" if args.mtu else ""
    launch = (
        f'( filesrc location="{args.ts}" ! tsparse set-timestamps=true '
        f"! rtpmp2tpay name=pay0 pt=33{mtu} )"
    )
    mounts_list = [("/live", True, launch), ("/archive", False, launch)]
    if args.mp4:
        seekable = (
            f'( filesrc location="{args.mp4}" ! qtdemux name=d d.video_0 ! queue '
            "! h264parse config-interval=-1 ! mpegtsmux name=mux ! rtpmp2tpay name=pay0 pt=33 )"
        )
        mounts_list += [("/vod", False, seekable), ("/timeshift", False, seekable)]
    recorded_at = calendar.timegm(time.strptime(args.recorded_at, "%Y%m%dT%H%M%SZ"))

    def answer_seeking(pad, info, demux):
        # mpegtsmux answers the SEEKING query "not seekable" (an aggregator does not ask
        # upstream), so the RTSP server would refuse every seek. The demuxer behind it does
        # seek and the muxer passes seek events upstream, so the muxer's answer is replaced
        # by the demuxer's range.
        query = info.get_query()
        if query.type != Gst.QueryType.SEEKING:
            return Gst.PadProbeReturn.OK
        ok, duration = demux.query_duration(Gst.Format.TIME)
        with writable(query):
            query.set_seeking(Gst.Format.TIME, ok, 0, duration if ok else -1)
        return Gst.PadProbeReturn.HANDLED

    def on_media_configure(factory, media):
        bin_ = media.get_element()
        mux = bin_.get_by_name("mux")
        if mux is not None:
            mux.get_static_pad("src").add_probe(
                Gst.PadProbeType.QUERY_UPSTREAM, answer_seeking, bin_.get_by_name("d")
            )

    for path, shared, pipeline in mounts_list:
        factory = GstRtspServer.RTSPMediaFactory()
        factory.set_launch(pipeline)
        factory.set_shared(shared)
        factory.connect("media-configure", on_media_configure)
        if args.user:
            perms = GstRtspServer.RTSPPermissions()
            perms.add_role("viewer")
            perms.add_permission_for_role("viewer", "media.factory.access", True)
            perms.add_permission_for_role("viewer", "media.factory.construct", True)
            factory.set_permissions(perms)
        mounts.add_factory(path, factory)

    if args.user:
        auth = GstRtspServer.RTSPAuth()
        token = GstRtspServer.RTSPToken()
        token.set_string("media.factory.role", "viewer")
        if args.auth == "digest":
            auth.set_supported_methods(GstRtsp.RTSPAuthMethod.DIGEST)
            auth.add_digest(args.user, args.password, token)
        else:
            auth.set_supported_methods(GstRtsp.RTSPAuthMethod.BASIC)
            basic = GstRtspServer.RTSPAuth.make_basic(args.user, args.password)
            auth.add_basic(basic, token)
        server.set_auth(auth)

    redirects = dict(r.split("=", 1) for r in args.redirect)
    state = {"drop_scheduled": False}

    def drop_all():
        emit({"event": "drop"})
        server.client_filter(lambda srv, client, *_: GstRtspServer.RTSPFilterResult.REMOVE)
        return False

    def on_request(name):
        def handler(client, ctx):
            req = ctx.request
            _, _, uri, _ = req.parse_request()
            record = {"method": name, "uri": uri}
            for key, field in HEADERS.items():
                res, value = req.get_header(field, 0)
                if res == GstRtsp.RTSPResult.OK:
                    record[key] = value
            emit(record)
            if name == "DESCRIBE":
                path = ctx.uri.abspath if ctx.uri else ""
                if path in redirects:
                    resp = GstRtsp.RTSPMessage.new_response(
                        GstRtsp.RTSPStatusCode.FOUND, None, req
                    )[1]
                    resp.add_header(GstRtsp.RTSPHeaderField.LOCATION, redirects[path])
                    client.send_message(None, resp)
                    return GstRtsp.RTSPStatusCode.FOUND
            if name == "PLAY" and ctx.uri and ctx.uri.abspath.startswith("/timeshift"):
                res, value = req.get_header(GstRtsp.RTSPHeaderField.RANGE, 0)
                if res == GstRtsp.RTSPResult.OK and value.startswith("clock="):
                    begin = value[len("clock="):].split("-", 1)[0]
                    at = calendar.timegm(time.strptime(begin.split(".")[0], "%Y%m%dT%H%M%SZ"))
                    if at < recorded_at:
                        return GstRtsp.RTSPStatusCode.INVALID_RANGE
                    set_range(ctx, f"npt={at - recorded_at}.000-")
            if name == "PLAY" and args.drop_after and not state["drop_scheduled"]:
                state["drop_scheduled"] = True
                GLib.timeout_add(int(args.drop_after * 1000), drop_all)
            return GstRtsp.RTSPStatusCode.OK

        return handler

    def on_client(srv, client):
        for name in ("OPTIONS", "DESCRIBE", "SETUP", "PLAY", "TEARDOWN", "GET_PARAMETER"):
            signal = "pre-" + name.lower().replace("_", "-") + "-request"
            client.connect(signal, on_request(name))
        if args.session_timeout:
            client.connect(
                "new-session", lambda c, s: s.set_timeout(args.session_timeout)
            )

    server.connect("client-connected", on_client)
    server.attach(None)
    pool = server.get_session_pool()
    # Expired sessions are removed only when the pool is swept.
    GLib.timeout_add(500, lambda: pool.cleanup() >= 0)
    emit({"event": "listening", "port": server.get_bound_port()})
    sys.stdout.write(f"PORT {server.get_bound_port()}\n")
    sys.stdout.flush()
    GLib.MainLoop().run()


if __name__ == "__main__":
    main()
