#!/usr/bin/env python3
"""Component test for sluice-receiver: every behaviour, driven with the curl CLI.

usage: test_receiver.py /path/to/sluice-receiver

Starts receivers on port 0 (reading the `port=N` line), checks status codes, headers,
timing (a slow/3000 request must not delay a concurrent /ok even with one worker thread),
reset/hang/endless connection behaviour, Standard Webhooks signature checks against the
published test vector, /_stats, /_ledger/ids, and the ledger file (one line per request,
never a body, query value or signature). Python 3.11 standard library only.

Environment: SL_TEST_TIMEOUT_MULT scales timeouts (sanitizer builds); SL_CURL names curl;
SL_TEST_KEEP=1 keeps the temp dir even on success (it is always kept on failure).
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

MULT = float(os.environ.get("SL_TEST_TIMEOUT_MULT", "1") or "1")
CURL = os.environ.get("SL_CURL", "curl")

# Standard Webhooks test vector (standard-webhooks spec / official libraries).
VEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
VEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
VEC_TS = "1614265330"
VEC_BODY = '{"test": 2432232314}'
VEC_SIG = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

# Markers that must never reach the ledger.
BODY_MARKER = "BODYMARKER_clk_7f3a9"
QUERY_MARKER = "QUERYMARKER_clk_51c2"


class Fail(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Fail(what)


class Receiver:
    """One sluice-receiver process on an ephemeral port."""

    def __init__(self, binary, tmp, name, *args):
        self.name = name
        self.ledger = os.path.join(tmp, name + ".ledger.jsonl")
        self.stderr_path = os.path.join(tmp, name + ".stderr")
        self.args = [binary, "--port", "0", "--ledger", self.ledger, *args]
        self.err = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=self.err)
        line = self.proc.stdout.readline().decode().strip()
        if not line.startswith("port="):
            self.proc.kill()
            raise Fail(f"{name}: first stdout line is {line!r}, expected port=N")
        self.port = int(line[5:])
        check(0 < self.port < 65536, f"{name}: bad port {self.port}")
        self.host = "[::1]" if "--ipv6" in args else "127.0.0.1"
        self.scheme = "https" if "--tls-cert" in args else "http"

    def url(self, path):
        return f"{self.scheme}://{self.host}:{self.port}{path}"

    def stop(self):
        """SIGTERM; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10 * MULT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise Fail(f"{self.name}: did not exit within 10 s of SIGTERM")
        self.err.close()
        return self.proc.returncode

    def ledger_lines(self):
        if not os.path.exists(self.ledger):
            return []
        with open(self.ledger, encoding="utf-8") as f:
            # a last line without its newline is still being written (read it next time)
            return [json.loads(l) for l in f if l.endswith("\n") and l.strip()]

    def wait_ledger(self, n, timeout=2.0):
        """Wait until the ledger holds at least n lines (flushed every 100 ms)."""
        deadline = time.monotonic() + timeout * MULT
        while True:
            lines = self.ledger_lines()
            if len(lines) >= n or time.monotonic() > deadline:
                return lines
            time.sleep(0.02)


class Resp:
    def __init__(self, rc, code, headers, body, elapsed, num_connects):
        self.rc = rc              # curl exit status
        self.code = code          # HTTP status, 0 = none
        self.headers = headers    # lower-case name -> value (last response)
        self.body = body          # bytes
        self.elapsed = elapsed    # seconds
        self.num_connects = num_connects


def curl(tmp, url, *extra, data=None, headers=(), method=None, max_time=10):
    """Run curl once; returns Resp. Never raises for HTTP or transport errors."""
    out = os.path.join(tmp, "curl.body")
    hdr = os.path.join(tmp, "curl.headers")
    for p in (out, hdr):
        if os.path.exists(p):
            os.unlink(p)
    cmd = [CURL, "-s", "-o", out, "-D", hdr, "-m", str(max_time * MULT),
           "-w", "%{http_code} %{time_total} %{num_connects}"]
    if method:
        cmd += ["-X", method]
    for h in headers:
        cmd += ["-H", h]
    if data is not None:
        datafile = os.path.join(tmp, "curl.data")
        with open(datafile, "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())
        cmd += ["--data-binary", "@" + datafile]
    cmd += list(extra) + [url]
    p = subprocess.run(cmd, capture_output=True, timeout=(max_time + 10) * MULT)
    w = p.stdout.decode().split()
    hdrs = {}
    if os.path.exists(hdr):
        with open(hdr, "rb") as f:
            for line in f.read().decode("latin-1").splitlines():
                if line.startswith("HTTP/"):
                    hdrs = {}
                elif ":" in line:
                    k, v = line.split(":", 1)
                    hdrs[k.strip().lower()] = v.strip()
    body = b""
    if os.path.exists(out):
        with open(out, "rb") as f:
            body = f.read()
    return Resp(p.returncode, int(w[0]) if w else 0, hdrs, body,
                float(w[1]) if len(w) > 1 else 0.0, int(w[2]) if len(w) > 2 else 0)


def stats(tmp, r, *extra):
    s = curl(tmp, r.url("/_stats"), *extra)
    check(s.code == 200, f"/_stats answered {s.code}")
    return json.loads(s.body)


def wait_stat(tmp, r, pred, what, timeout=3.0):
    deadline = time.monotonic() + timeout * MULT
    while True:
        st = stats(tmp, r)
        if pred(st):
            return st
        if time.monotonic() > deadline:
            raise Fail(f"{what}: /_stats stayed {st}")
        time.sleep(0.05)


# ==== the checks (each gets a fresh view; receivers are shared where harmless) ====


def t_simple_statuses(tmp, r):
    cases = [
        ("/ok/ep-simple", 204, None),
        ("/ok/ep-simple?status=200", 200, b'{"status":200}\n'),
        ("/status/503/ep-simple", 503, None),
        ("/status/418", 418, None),
        ("/unauth", 401, None),
        ("/gone", 410, None),
        ("/no-such-behaviour", 404, None),
        ("/no-such-behaviour?status=200", 404, None),
        ("/status/99", 400, None),        # out of range
        ("/slow/abc", 400, None),         # not a number
        ("/ok?delay_ms=-1", 400, None),   # strict parsing
    ]
    for path, code, body in cases:
        resp = curl(tmp, r.url(path), data="{}")
        check(resp.rc == 0, f"{path}: curl exit {resp.rc}")
        check(resp.code == code, f"{path}: status {resp.code}, expected {code}")
        if body is not None:
            check(resp.body == body, f"{path}: body {resp.body!r}")
    ok = curl(tmp, r.url("/ok/x"), data="{}")
    check(ok.body == b"", "204 carries no body")


def t_headers(tmp, r):
    ra = curl(tmp, r.url("/retryafter/7/ep-ra"), data="{}")
    check(ra.code == 429 and ra.headers.get("retry-after") == "7",
          f"retryafter/7: {ra.code} {ra.headers}")
    q = curl(tmp, r.url("/status/503?retry_after=3"), data="{}")
    check(q.code == 503 and q.headers.get("retry-after") == "3", f"?retry_after: {q.code} {q.headers}")
    rd = curl(tmp, r.url("/redirect/ep-rd"), data="{}")
    check(rd.code == 302, f"redirect: {rd.code}")
    check(rd.headers.get("location") == "http://169.254.169.254/latest/meta-data/",
          f"redirect Location: {rd.headers.get('location')}")


def t_keepalive(tmp, r):
    # Two URLs in one curl run share the connection under HTTP/1.1 keep-alive.
    out = subprocess.run([CURL, "-s", "-o", "/dev/null", "-w", "%{http_code} %{num_connects}\n",
                          r.url("/ok/ka"), r.url("/ok/ka")], capture_output=True,
                         timeout=20 * MULT).stdout.decode().split("\n")
    check(out[0] == "204 1" and out[1] == "204 0", f"keep-alive: curl said {out}")


def t_close(tmp, r, *extra):
    # ?close=1 answers with Connection: close, so the next request opens a new connection;
    # the 204 fast path and a built answer (status=200) both carry it.
    for q in ("close=1", "close=1&status=200"):
        out = subprocess.run([CURL, "-s", *extra, "-o", "/dev/null", "-D", "-", "-w",
                              "%{http_code} %{num_connects}\n", r.url(f"/ok/cl?{q}"),
                              r.url("/ok/cl")], capture_output=True,
                             timeout=20 * MULT).stdout.decode()
        codes = [l for l in out.splitlines() if l and l[0].isdigit()]
        want = "200 1" if "status=200" in q else "204 1"
        check(codes == [want, "204 1"], f"close ({q}): curl said {codes}")
        check(out.lower().count("connection: close") == 1, f"close ({q}): headers {out!r}")
    bad = curl(tmp, r.url("/ok/cl?close=2"), *extra)
    check(bad.code == 400, f"close=2: {bad.code}, expected 400")


def make_cert(root):
    """A self-signed P-256 certificate for 127.0.0.1 made with the openssl CLI: (cert, key)."""
    cert, key = os.path.join(root, "tls.pem"), os.path.join(root, "tls.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "2", "-subj", "/CN=127.0.0.1", "-addext",
                    "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True,
                   timeout=60 * MULT)
    return cert, key


def t_tls(tmp, binary, root):
    # --tls-cert/--tls-key: HTTPS with that certificate, every behaviour as over HTTP,
    # keep-alive and ?close=1 included; a client that does not trust it gets nothing.
    cert, key = make_cert(root)
    r = Receiver(binary, root, "tls", "--tls-cert", cert, "--tls-key", key)
    try:
        ok = curl(tmp, r.url("/ok/ep-tls"), "--cacert", cert, data="x")
        check(ok.code == 204, f"https /ok: {ok.code} (curl rc {ok.rc})")
        st = curl(tmp, r.url("/status/503/ep-tls"), "--cacert", cert)
        check(st.code == 503, f"https /status/503: {st.code}")
        untrusted = curl(tmp, r.url("/ok/ep-tls"))
        check(untrusted.rc == 60 and untrusted.code == 0,
              f"untrusted certificate: curl rc {untrusted.rc}, status {untrusted.code}")
        plain = curl(tmp, f"http://127.0.0.1:{r.port}/ok/ep-tls")
        check(plain.code != 204, f"plain HTTP to the HTTPS port answered {plain.code}")
        out = subprocess.run([CURL, "-s", "--cacert", cert, "-o", "/dev/null", "-w",
                              "%{http_code} %{num_connects}\n", r.url("/ok/ka"),
                              r.url("/ok/ka")], capture_output=True,
                             timeout=20 * MULT).stdout.decode().split("\n")
        check(out[0] == "204 1" and out[1] == "204 0", f"https keep-alive: curl said {out}")
        c0 = stats(tmp, r, "--cacert", cert)["connections"]
        t_close(tmp, r, "--cacert", cert)
        # t_close: two curl runs of two requests (the first answered with close) and one more
        # request, then this stats request: 2 + 2 + 1 + 1 connections
        c1 = stats(tmp, r, "--cacert", cert)["connections"]
        check(c1 - c0 == 6, f"https: {c1 - c0} connections counted, expected 6")
        # t_close's curl runs closed connections between requests: curl resumes a session
        # on its next connection only when the receiver issues tickets
        check(stats(tmp, r, "--cacert", cert)["tls_resumed"] == 0, "resumed without tickets")
        lines = r.wait_ledger(9)
        check(sum(1 for l in lines if l["path"] == "/ok/ep-tls" and l["status"] == 204) == 1,
              "https: the ledger does not hold the /ok request")
    finally:
        check(r.stop() == 0, "tls receiver exit status")
    rr = Receiver(binary, root, "tls-resume", "--tls-cert", cert, "--tls-key", key,
                  "--tls-resume")
    try:
        out = subprocess.run([CURL, "-s", "--cacert", cert, "-o", "/dev/null", "-w",
                              "%{http_code} %{num_connects}\n", rr.url("/ok/r?close=1"),
                              rr.url("/ok/r?close=1"), rr.url("/ok/r")], capture_output=True,
                             timeout=20 * MULT).stdout.decode().split("\n")
        check(out[:3] == ["204 1", "204 1", "204 1"], f"--tls-resume: curl said {out}")
        st = stats(tmp, rr, "--cacert", cert)
        check(st["connections"] == 4 and st["tls_resumed"] == 2,
              f"--tls-resume: {st['connections']} connections, {st['tls_resumed']} resumed; "
              "expected 4 (three requests and this one), 2 resumed (the second and third)")
    finally:
        check(rr.stop() == 0, "tls-resume receiver exit status")


def t_big(tmp, r):
    b = curl(tmp, r.url("/big/100000/ep-big"))
    check(b.code == 200 and len(b.body) == 100000, f"big: {b.code} {len(b.body)} bytes")
    check(b.headers.get("content-length") == "100000", f"big Content-Length {b.headers}")
    z = curl(tmp, r.url("/big/0"))
    check(z.code == 200 and z.body == b"", f"big/0: {z.code} {len(z.body)}")
    q = curl(tmp, r.url("/status/500?bytes=5000"))
    check(q.code == 500 and len(q.body) == 5000, f"?bytes=5000: {q.code} {len(q.body)}")


def t_slow_does_not_block(tmp, r):
    # r runs with --threads 1: a blocking sleep would stall the /ok below for ~3 s.
    slow_cmd = [CURL, "-s", "-o", "/dev/null", "-w", "%{http_code} %{time_total}",
                "-m", str(20 * MULT), "-d", "{}", r.url("/slow/3000/ep-slow")]
    slow = subprocess.Popen(slow_cmd, stdout=subprocess.PIPE)
    wait_stat(tmp, r, lambda s: s["waiting"] >= 1, "slow request suspended")
    ok = curl(tmp, r.url("/ok/ep-fast"), data="{}")
    check(ok.code == 204, f"concurrent ok: {ok.code}")
    check(ok.elapsed < 1.5 * MULT, f"concurrent ok took {ok.elapsed:.3f} s while slow in flight")
    check(slow.poll() is None, "slow request finished before the ok request")
    out, _ = slow.communicate(timeout=20 * MULT)
    code, t = out.decode().split()
    check(code == "200", f"slow: status {code}")
    check(2.9 <= float(t) < 3.0 + 2 * MULT, f"slow/3000 took {t} s")
    d = curl(tmp, r.url("/ok/ep-d?delay_ms=300"), data="{}")
    check(d.code == 204 and d.elapsed >= 0.29, f"?delay_ms=300: {d.code} in {d.elapsed:.3f} s")


def t_reset(tmp, r):
    x = curl(tmp, r.url("/reset/ep-reset"), data="{}")
    check(x.code == 0, f"reset: got HTTP status {x.code}")
    check(x.rc in (52, 56), f"reset: curl exit {x.rc}, expected 52 (empty reply) or 56 (reset)")
    check(curl(tmp, r.url("/ok/after-reset")).code == 204, "receiver serves after reset")


def t_endless(tmp, r):
    t0 = time.monotonic()
    e = curl(tmp, r.url("/endless/ep-endless"), max_time=2)
    took = time.monotonic() - t0
    check(e.rc == 28, f"endless: curl exit {e.rc}, expected 28 (timeout)")
    check(e.code == 200, f"endless: status {e.code}")
    check(e.headers.get("transfer-encoding") == "chunked", f"endless headers {e.headers}")
    # ~1 MB/s for 2 s plus a 16 KiB burst; loose bounds (sanitizers, shared CPU).
    check(200_000 <= len(e.body) <= 4_000_000, f"endless: {len(e.body)} bytes in {took:.2f} s")
    ok = curl(tmp, r.url("/ok/after-endless"))
    check(ok.code == 204 and ok.elapsed < 1.0 * MULT, f"ok after endless: {ok.code} {ok.elapsed}")
    wait_stat(tmp, r, lambda s: s["waiting"] == 0, "endless stream released")


def t_hang(tmp, r):
    h = curl(tmp, r.url("/hang/ep-hang"), data="{}", max_time=1)
    check(h.rc == 28 and h.code == 0, f"hang: curl exit {h.rc}, status {h.code}")
    # The client left; the receiver notices (peer-close poll) and frees the connection.
    wait_stat(tmp, r, lambda s: s["waiting"] == 0, "hung connection released after client left")


def t_flaky_n(tmp, r):
    codes = []
    for _ in range(4):
        codes.append(curl(tmp, r.url("/flaky_n/2/ep-fn"), data="{}",
                          headers=["webhook-id: msg_fn_1"]).code)
    check(codes == [500, 500, 200, 200], f"flaky_n/2 for one id: {codes}")
    other = curl(tmp, r.url("/flaky_n/2/ep-fn"), data="{}", headers=["webhook-id: msg_fn_2"])
    check(other.code == 500, f"flaky_n counts per id: {other.code}")
    q = [curl(tmp, r.url("/ok/ep-fq?fail_n=1&fail_status=503"), data="{}",
              headers=["webhook-id: msg_fq"]).code for _ in range(2)]
    check(q == [503, 204], f"?fail_n=1&fail_status=503: {q}")


def flaky_sequence(tmp, r, ids, tries):
    seq = {}
    for i in ids:
        codes = []
        for _ in range(tries):
            c = curl(tmp, r.url("/flaky/50/ep-fl"), data="{}", headers=[f"webhook-id: {i}"]).code
            codes.append(c)
            if c == 200:
                break
        seq[i] = codes
    return seq


def t_flaky_pct(tmp, r, binary):
    ids = [f"msg_fl_{n}" for n in range(12)]
    seq = flaky_sequence(tmp, r, ids, 12)
    for i, codes in seq.items():
        check(set(codes) <= {200, 500}, f"flaky/50 {i}: {codes}")
        check(codes[-1] == 200, f"flaky/50 {i}: no success in 12 attempts: {codes}")
    firsts = [codes[0] for codes in seq.values()]
    check(500 in firsts and 200 in firsts, f"flaky/50 first attempts all alike: {firsts}")
    # Deterministic: a fresh receiver gives the same sequences.
    r2 = Receiver(binary, os.path.dirname(r.ledger), "flaky2", "--threads", "1")
    try:
        check(flaky_sequence(tmp, r2, ids, 12) == seq, "flaky/50 not deterministic across runs")
    finally:
        check(r2.stop() == 0, "second receiver exit status")
    always = [curl(tmp, r.url("/flaky/100/ep-f100"), data="{}", headers=["webhook-id: m"]).code
              for _ in range(3)]
    never = [curl(tmp, r.url("/flaky/0/ep-f0"), data="{}", headers=["webhook-id: m"]).code
             for _ in range(3)]
    check(always == [500] * 3 and never == [200] * 3, f"flaky/100 {always}, flaky/0 {never}")


def t_ratelimit(tmp, r):
    codes, ras = [], set()
    for _ in range(12):
        x = curl(tmp, r.url("/ratelimit/2/ep-rl"), data="{}")
        codes.append(x.code)
        if x.code == 429:
            ras.add(x.headers.get("retry-after"))
    # Burst 2, refill 2/s: 12 back-to-back requests cannot all pass unless each took 0.5 s.
    check(codes[:2] == [200] * 2, f"ratelimit/2: first two {codes[:2]}")
    check(429 in codes, f"ratelimit/2: never limited in 12 fast requests: {codes}")
    check(ras == {"1"}, f"ratelimit Retry-After values {ras}")
    # Buckets are per endpoint.
    check(curl(tmp, r.url("/ratelimit/2/ep-rl-other"), data="{}").code == 200,
          "another endpoint has its own bucket")
    time.sleep(1.1)
    check(curl(tmp, r.url("/ratelimit/2/ep-rl"), data="{}").code == 200, "bucket refills")


def t_body_cap(tmp, r):
    big = b"x" * (2 * 1024 * 1024 + 1)
    x = curl(tmp, r.url("/ok/ep-413"), data=big)
    check(x.code == 413, f"declared body over --max-body: {x.code}")
    y = curl(tmp, r.url("/ok/ep-413"), data=big, headers=["Transfer-Encoding: chunked"])
    check(y.code == 413, f"chunked body over --max-body: {y.code}")
    z = curl(tmp, r.url("/ok/ep-413"), data=b"y" * (2 * 1024 * 1024))
    check(z.code == 204, f"body of exactly --max-body: {z.code}")


def t_get_postback(tmp, r):
    x = curl(tmp, r.url(f"/ok/ep-pb?click_id={QUERY_MARKER}&payout=1.5&status=200"),
             headers=["x-sluice-created-ms: 1700000000123"])
    check(x.code == 200, f"GET postback: {x.code}")


def t_ids_and_dups(tmp, r):
    for wid in ("msg_a", "msg_b", "msg_a"):
        check(curl(tmp, r.url("/ok/ep-ids"), data=BODY_MARKER,
                   headers=[f"webhook-id: {wid}"]).code == 204, "ids: ok")
    curl(tmp, r.url("/status/500/ep-ids"), data="{}", headers=["webhook-id: msg_c"])
    curl(tmp, r.url("/ok/ep-ids-other"), data="{}", headers=["webhook-id: msg_d"])
    ids = curl(tmp, r.url("/_ledger/ids?endpoint=ep-ids"))
    got = sorted(ids.body.decode().split())
    check(ids.code == 200 and got == ["msg_a", "msg_b"], f"/_ledger/ids: {ids.code} {got}")
    none = curl(tmp, r.url("/_ledger/ids?endpoint=nobody"))
    check(none.code == 200 and none.body == b"", f"/_ledger/ids for unknown endpoint: {none.body}")


def t_stats(tmp, r, expect_at_least):
    st = stats(tmp, r)
    check(st["requests"] >= expect_at_least, f"/_stats requests {st['requests']}")
    for key in ("by_status", "by_behaviour", "waiting", "sig", "ids", "ledger", "dups"):
        check(key in st, f"/_stats lacks {key}")
    check(st["by_status"].get("204", 0) >= 5, f"/_stats by_status {st['by_status']}")
    for kind in ("ok", "status", "slow", "flaky", "flaky_n", "ratelimit", "retryafter",
                 "unauth", "gone", "redirect", "reset", "endless", "big", "hang"):
        check(st["by_behaviour"].get(kind, 0) >= 1, f"/_stats by_behaviour lacks {kind}")
    check(st["dups"] >= 1, f"/_stats dups {st['dups']}")
    return st


def t_ledger(tmp, r, nreq):
    rc = r.stop()
    check(rc == 0, f"exit status after SIGTERM: {rc}")
    raw = open(r.ledger, encoding="utf-8").read()
    for marker in (BODY_MARKER, QUERY_MARKER, VEC_SIG.split(",")[1], "payout=", "1.5"):
        check(marker not in raw, f"ledger contains {marker!r}")
    lines = [json.loads(l) for l in raw.splitlines()]
    check(len(lines) == nreq, f"ledger has {len(lines)} lines for {nreq} recorded requests")
    fields = {"ts_ms", "path_kind", "endpoint", "webhook_id", "webhook_timestamp", "sig_ok",
              "status", "bytes", "method", "created_ms", "path", "query_keys", "attempt", "dup"}
    for l in lines:
        check(set(l) == fields, f"ledger fields {sorted(l)}")
        check("?" not in l["path"], f"ledger path has a query: {l['path']}")
    pb = [l for l in lines if l["endpoint"] == "ep-pb"]
    check(len(pb) == 1, f"GET postback lines {len(pb)}")
    pb = pb[0]
    check(pb["method"] == "GET" and pb["path"] == "/ok/ep-pb" and pb["query_keys"] == 3,
          f"GET postback line {pb}")
    check(pb["created_ms"] == 1700000000123 and pb["status"] == 200, f"created_ms/status {pb}")
    ok = [l for l in lines if l["endpoint"] == "ep-ids" and l["status"] == 204]
    check([l["webhook_id"] for l in ok] == ["msg_a", "msg_b", "msg_a"], f"ep-ids lines {ok}")
    check([l["dup"] for l in ok] == [False, False, True], f"dup flags {[l['dup'] for l in ok]}")
    check(ok[0]["bytes"] == len(BODY_MARKER) and ok[0]["path_kind"] == "ok"
          and ok[0]["sig_ok"] is None, f"ok line {ok[0]}")
    by_kind = {}
    for l in lines:
        by_kind.setdefault(l["path_kind"], []).append(l)
    check(all(l["status"] == 0 for l in by_kind["reset"]), "reset lines have status 0")
    check(all(l["status"] == 0 for l in by_kind["hang"]), "hang lines have status 0")
    check(all(l["status"] == 200 for l in by_kind["endless"]), "endless lines have status 200")
    fn = [l for l in lines if l["webhook_id"] == "msg_fn_1"]
    check([l["attempt"] for l in fn] == [1, 2, 3, 4] and
          [l["status"] for l in fn] == [500, 500, 200, 200], f"flaky_n lines {fn}")
    slow = [l for l in lines if l["endpoint"] == "ep-slow"]
    check(len(slow) == 1 and slow[0]["status"] == 200 and slow[0]["path_kind"] == "slow",
          f"slow line {slow}")
    big = [l for l in lines if l["status"] == 413]
    check(len(big) == 2 and all(l["bytes"] > 2 * 1024 * 1024 for l in big), f"413 lines {big}")


def t_ledger_flush_interval(tmp, binary, root):
    r = Receiver(binary, root, "flush")
    try:
        curl(tmp, r.url("/ok/flush"), data="{}")
        t0 = time.monotonic()
        lines = r.wait_ledger(1, timeout=1.0)
        check(len(lines) == 1, "ledger line not flushed within 1 s (while running)")
        check(time.monotonic() - t0 < 0.5 * MULT, "ledger flush slower than ~100 ms")
    finally:
        check(r.stop() == 0, "flush receiver exit status")


def t_no_ledger_ok(tmp, binary, root):
    r = Receiver(binary, root, "noledgerok", "--no-ledger-ok")
    try:
        curl(tmp, r.url("/ok/a"), data="{}")
        curl(tmp, r.url("/status/500/a"), data="{}")
        curl(tmp, r.url("/ok/a?status=200"), data="{}")
    finally:
        check(r.stop() == 0, "no-ledger-ok exit status")
    lines = r.ledger_lines()
    check([l["status"] for l in lines] == [500], f"--no-ledger-ok ledger statuses {lines}")


def t_signatures(tmp, binary, root):
    sig_headers = [f"webhook-id: {VEC_ID}", f"webhook-timestamp: {VEC_TS}"]
    # 1) Known vector, tolerance disabled, bad signatures rejected.
    r = Receiver(binary, root, "sig", "--secret", VEC_SECRET, "--no-tolerance",
                 "--reject-bad-sig", "--ipv6")
    try:
        good = curl(tmp, r.url("/ok/ep-sig"), data=VEC_BODY,
                    headers=sig_headers + [f"webhook-signature: {VEC_SIG}"])
        check(good.code == 204, f"known vector: {good.code}")
        rot = curl(tmp, r.url("/ok/ep-sig"), data=VEC_BODY,
                   headers=sig_headers + ["webhook-signature: v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA= "
                                          + VEC_SIG + " v2,zzz"])
        check(rot.code == 204, f"vector among several signatures: {rot.code}")
        tampered = curl(tmp, r.url("/ok/ep-sig"), data=VEC_BODY.replace("2", "3"),
                        headers=sig_headers + [f"webhook-signature: {VEC_SIG}"])
        check(tampered.code == 401, f"tampered body: {tampered.code}")
        noncanon = VEC_SIG[:-2] + "F="  # same bytes under a lax decoder
        nc = curl(tmp, r.url("/ok/ep-sig"), data=VEC_BODY,
                  headers=sig_headers + [f"webhook-signature: {noncanon}"])
        check(nc.code == 401, f"non-canonical base64 signature: {nc.code}")
        missing = curl(tmp, r.url("/ok/ep-sig"), data=VEC_BODY, headers=sig_headers)
        check(missing.code == 401, f"missing signature: {missing.code}")
        st = stats(tmp, r)
        check(st["sig"] == {"ok": 2, "bad": 3}, f"sig counters {st['sig']}")
    finally:
        check(r.stop() == 0, "sig receiver exit status")
    lines = r.ledger_lines()
    check([l["sig_ok"] for l in lines] == [True, True, False, False, False],
          f"sig_ok in ledger {[l['sig_ok'] for l in lines]}")
    raw = open(r.ledger, encoding="utf-8").read()
    check(VEC_SIG[3:] not in raw and "test" not in raw, "ledger holds a signature or body")
    check(lines[0]["webhook_timestamp"] == int(VEC_TS) and lines[0]["webhook_id"] == VEC_ID,
          f"id/timestamp in ledger {lines[0]}")
    # 2) Default tolerance: the 2021 vector is too old; without --reject-bad-sig it is
    #    still answered normally but recorded as sig_ok false.
    r = Receiver(binary, root, "sigtol", "--secret", VEC_SECRET)
    try:
        old = curl(tmp, r.url("/ok/ep-sig"), data=VEC_BODY,
                   headers=sig_headers + [f"webhook-signature: {VEC_SIG}"])
        check(old.code == 204, f"old timestamp without --reject-bad-sig: {old.code}")
    finally:
        check(r.stop() == 0, "sigtol receiver exit status")
    check([l["sig_ok"] for l in r.ledger_lines()] == [False], "old timestamp gives sig_ok false")


def t_shutdown_inflight(tmp, binary, root):
    # MHD aborts if stopped with suspended connections: SIGTERM while slow, hang and
    # endless requests are in flight must still flush the ledger and exit 0, promptly.
    r = Receiver(binary, root, "shutdown")
    clients = []
    try:
        for path in ("/slow/10000/sd", "/hang/sd", "/endless/sd"):
            clients.append(subprocess.Popen(
                [CURL, "-s", "-o", "/dev/null", "-m", str(30 * MULT), r.url(path)]))
        wait_stat(tmp, r, lambda s: s["waiting"] >= 2 and s["requests"] >= 2,
                  "slow and hang suspended")
        time.sleep(0.3)
        t0 = time.monotonic()
        rc = r.stop()
        took = time.monotonic() - t0
        check(rc == 0, f"exit status with requests in flight: {rc}")
        check(took < 3 * MULT, f"shutdown took {took:.2f} s")
        for c in clients:
            c.wait(timeout=10 * MULT)
            check(c.returncode != 0, "a client in flight got a complete answer at shutdown")
    finally:
        for c in clients:
            if c.poll() is None:
                c.kill()
        r.stop()
    got = sorted((l["path_kind"], l["status"]) for l in r.ledger_lines())
    check(got == [("endless", 200), ("hang", 0), ("slow", 0)], f"shutdown ledger {got}")


def t_128_ready_at_once(tmp, binary, root):
    """A loop holding exactly 128 ready connections answers them at once. libmicrohttpd's
    own loop (0.9.75) waited again with the full timeout after one epoll_wait returned its
    128-event maximum, serving none until another event came; common/sl_httpd runs the loop
    itself. The second requests arrive while the receiver is stopped (SIGSTOP), so on
    SIGCONT all 128 are ready at once."""
    r = Receiver(binary, root, "ready128", "--threads", "1", "--idle-timeout-s", "300")
    conns = []
    try:
        req = b"POST /ok/e HTTP/1.1\r\nHost: r\r\nContent-Length: 2\r\n\r\nhi"
        conns = [socket.create_connection(("127.0.0.1", r.port), timeout=30 * MULT)
                 for _ in range(128)]
        for s in conns:
            s.sendall(req)
        for s in conns:
            check(read_status(s) == 204, "first round: not 204")
        os.kill(r.proc.pid, signal.SIGSTOP)
        try:
            for s in conns:
                s.sendall(req)
            time.sleep(0.3)
        finally:
            os.kill(r.proc.pid, signal.SIGCONT)
        for i, s in enumerate(conns):
            try:
                check(read_status(s) == 204, f"connection {i}: not 204")
            except socket.timeout:
                raise Fail(f"connection {i} of 128 unanswered after {30 * MULT} s: the loop "
                           "waited with every request unread") from None
    finally:
        for s in conns:
            s.close()
        check(r.stop() == 0, "ready128: exit status not 0")


def read_status(s):
    """Read one HTTP/1.1 answer (no body, or one with a Content-Length) from s; its status."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(4096)
        check(chunk, "connection closed before an answer")
        buf += chunk
    head, body = buf.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    n = next((int(l.split(":", 1)[1]) for l in lines
              if l.lower().startswith("content-length:")), 0)
    while len(body) < n:
        chunk = s.recv(4096)
        check(chunk, "connection closed inside an answer")
        body += chunk
    return int(lines[0].split()[1])


def t_bad_options(tmp, binary):
    notpem = os.path.join(tmp, "not.pem")
    with open(notpem, "w") as f:
        f.write("not a certificate\n")
    cert, key = make_cert(tmp)
    for args in (["--port", "70000"], ["--secret", "nope"], ["--reject-bad-sig"],
                 ["--threads", "x"], ["extra"], ["--tls-cert", cert],
                 ["--tls-key", key], ["--tls-cert", notpem, "--tls-key", key],
                 ["--tls-cert", cert, "--tls-key", os.path.join(tmp, "missing.key")],
                 ["--tls-resume"]):
        p = subprocess.run([binary, *args], capture_output=True, timeout=10 * MULT)
        check(p.returncode == 78, f"{args}: exit {p.returncode}, expected 78")
        check(b"nope" not in p.stderr or args[0] != "--secret", "secret value echoed")
    h = subprocess.run([binary, "--help"], capture_output=True, timeout=10 * MULT)
    check(h.returncode == 0, "--help exit status")
    for word in (b"flaky_n", b"ratelimit", b"endless", b"--no-ledger-ok", b"/_ledger/ids",
                 b"--no-tolerance", b"port=", b"--tls-cert", b"close=1"):
        check(word in h.stdout, f"--help does not mention {word!r}")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    binary = os.path.abspath(sys.argv[1])
    root = tempfile.mkdtemp(prefix="sl-receiver-test-")
    tmp = os.path.join(root, "curl")
    os.mkdir(tmp)
    failures = []
    results = []

    def run(name, fn, *a):
        t0 = time.monotonic()
        try:
            fn(*a)
            results.append(f"ok   {name} ({time.monotonic() - t0:.2f} s)")
        except Exception as e:  # report every check, not just the first failure
            failures.append(name)
            detail = str(e) if isinstance(e, Fail) else traceback.format_exc()
            results.append(f"FAIL {name}: {detail}")
        print(results[-1], flush=True)

    # Main receiver: one worker thread, so the non-blocking delay claim is really tested.
    main_r = None
    try:
        main_r = Receiver(binary, root, "main", "--threads", "1")
    except Exception as e:
        print(f"FAIL start: {e}")
        print(f"kept {root}")
        return 1
    run("simple statuses", t_simple_statuses, tmp, main_r)
    run("retry-after and redirect headers", t_headers, tmp, main_r)
    run("keep-alive", t_keepalive, tmp, main_r)
    run("close=1", t_close, tmp, main_r)
    run("big bodies", t_big, tmp, main_r)
    run("slow does not block others", t_slow_does_not_block, tmp, main_r)
    run("reset", t_reset, tmp, main_r)
    run("endless cut by client", t_endless, tmp, main_r)
    run("hang", t_hang, tmp, main_r)
    run("flaky_n", t_flaky_n, tmp, main_r)
    run("flaky percentage", t_flaky_pct, tmp, main_r, binary)
    run("ratelimit", t_ratelimit, tmp, main_r)
    run("body cap 413", t_body_cap, tmp, main_r)
    run("GET postback", t_get_postback, tmp, main_r)
    run("accepted ids and dups", t_ids_and_dups, tmp, main_r)
    st = {}
    try:
        st = stats(tmp, main_r)
    except Exception as e:
        failures.append("stats fetch")
        print(f"FAIL stats fetch: {e}")
    run("stats", t_stats, tmp, main_r, 40)
    run("ledger", t_ledger, tmp, main_r, st.get("requests", -1))
    run("ledger flush interval", t_ledger_flush_interval, tmp, binary, root)
    run("--no-ledger-ok", t_no_ledger_ok, tmp, binary, root)
    run("signatures", t_signatures, tmp, binary, root)
    run("shutdown with requests in flight", t_shutdown_inflight, tmp, binary, root)
    run("128 connections ready at once", t_128_ready_at_once, tmp, binary, root)
    run("https", t_tls, tmp, binary, root)
    run("bad options", t_bad_options, tmp, binary)
    if main_r.proc.poll() is None:
        main_r.stop()

    if failures:
        print(f"\n{len(failures)} failed: {', '.join(failures)}\nkept {root} "
              "(receiver stderr and ledgers inside)")
        return 1
    if os.environ.get("SL_TEST_KEEP") == "1":
        print(f"kept {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    print(f"all {len(results)} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
