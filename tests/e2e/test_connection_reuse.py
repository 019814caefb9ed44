"""A quiet endpoint keeps its connection while a busy one fills the window.

Most webhook endpoints receive an event now and then, beside a few that receive most of the
traffic. The consumer spreads its connections over several libcurl connection caches (to
keep each cache's scans short when thousands of requests go to one host); a host's
connections must still be found again by its next request, or a quiet endpoint would open
new connections (over HTTPS, each a TLS handshake) while its idle ones wait in other caches.

Two receivers stand for two hosts: a busy one whose endpoints answer after a delay (their
requests fill the window, and handles are taken and returned all the time) and a quiet one
that gets an event now and then, each published once the one before was delivered. The quiet
host must see one connection, not one per delivery. A quiet HTTPS host that closes every
connection must see each new connection resume the TLS session of the one before (a resumed
handshake skips the certificate's transfer, parsing and verification).

A host that drops a kept-alive connection when the next request arrives on it (a server
whose idle timeout raced the request), closing it or resetting it, gets that request again
on a new connection, every time: libcurl counts such retries per handle and, on the consumer's pooled handles, would
otherwise give up now and then without a retry ("Connection died, tried 5 times"), a `send`
failure charged to an endpoint that did nothing wrong.
"""
import json
import os
import socket
import ssl
import struct
import threading
import urllib.request

import pytest

from sluice_e2e import event, final_states, ledger_ok, wait_until
from tls_helpers import CA

MULT = float(os.environ.get("SL_TEST_TIMEOUT_MULT", "1"))


def receiver_stats(r):
    with urllib.request.urlopen(f"{r.base}/_stats", timeout=10) as resp:
        return json.loads(resp.read())


def quiet_beside_busy(w, quiet, quiet_url, rounds, **cfg):
    """A busy origin (40 endpoints of their own receiver, answering after 100..490 ms, so
    answers come all the time, not in waves: about 10 s of traffic at 400 in flight) and,
    once it is busy, `rounds` events to the quiet endpoint at quiet_url, each published once
    the one before was delivered (quiet's ledger says so). Returns the consumer (running)
    and how many busy deliveries were still to come when the quiet ones were done."""
    busy = w.receiver(extra=["--no-ledger-ok"])
    busy_eps = [w.add_endpoint(f"busy{i}_{w.tag}", busy.url("ok", f"busy{i}_{w.tag}") +
                               f"?delay_ms={100 + 10 * i}") for i in range(40)]
    quiet_ep = w.add_endpoint(f"quiet_{w.tag}", quiet_url)
    assert w.produce([event(ep, i, w.tag) for i in range(300) for ep in busy_eps]
                     ).returncode == 0
    c = w.consumer(consumer_threads=2, max_inflight=400, max_inflight_per_endpoint=10, **cfg)
    wait_until(lambda: receiver_stats(busy)["by_status"].get("204", 0) > 400, 60 * MULT, 0.2,
               "the busy endpoints' first answers")
    for i in range(rounds):
        assert w.produce([event(quiet_ep, i, w.tag)]).returncode == 0
        wait_until(lambda: len(ledger_ok(quiet)) > i, 30 * MULT, 0.05, f"quiet delivery {i}")
    return c, 40 * 300 - receiver_stats(busy)["by_status"].get("204", 0)


def test_a_quiet_host_reuses_its_connection_beside_a_busy_one(make_world):
    w = make_world(partitions=2)
    quiet = w.receiver()  # its ledger, read from the file, says when it is done
    before = receiver_stats(quiet)["connections"]  # this request's connection included
    rounds = 12
    c, left = quiet_beside_busy(w, quiet, quiet.url("ok", f"quiet_{w.tag}"), rounds)
    st = receiver_stats(quiet)
    opened = st["connections"] - before - 1  # less this request's own connection
    assert c.term() == 0, c.logs()[-3000:]
    assert left > 0, "the busy endpoints were done before the quiet one: the test proves nothing"
    assert st["by_status"].get("204", 0) == rounds, st
    assert opened == 1, (
        f"{opened} connections opened to the quiet host for {rounds} deliveries, one at a time")


def test_a_quiet_https_host_resumes_its_tls_session_on_each_new_connection(make_world,
                                                                           tmp_path):
    # The quiet host closes every connection (Connection: close) and issues session tickets:
    # each delivery after the first must resume the TLS session the one before left, whichever
    # pooled handle sends it (the handles of a connection cache share their sessions).
    ca = CA(str(tmp_path / "ca"))
    cert, key = ca.issue("quiet", "127.0.0.1")
    w = make_world(partitions=2)
    quiet = w.receiver(extra=["--tls-cert", cert, "--tls-key", key, "--tls-resume"])
    quiet_base = f"https://127.0.0.1:{quiet.port}"
    rounds = 12
    c, left = quiet_beside_busy(w, quiet, f"{quiet_base}/ok/quiet_{w.tag}?close=1", rounds,
                                endpoint_ca_file=ca.cert)
    ctx = ssl.create_default_context(cafile=ca.cert)
    with urllib.request.urlopen(f"{quiet_base}/_stats", timeout=10, context=ctx) as resp:
        st = json.loads(resp.read())
    assert c.term() == 0, c.logs()[-3000:]
    assert left > 0, "the busy endpoints were done before the quiet one: the test proves nothing"
    assert st["by_status"].get("204", 0) == rounds, st
    assert st["tls_resumed"] == rounds - 1, (
        f"{st['tls_resumed']} of the {rounds - 1} deliveries after the first resumed the "
        "TLS session")


class DropsSecondRequest:
    """An HTTP/1.1 server on loopback that answers the first request on each connection
    (204, kept alive) and closes the connection, unanswered, once the second has arrived:
    cleanly, or with a reset (SO_LINGER 0, as some load balancers do)."""

    def __init__(self, reset=False):
        self.reset = reset
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.port = self.sock.getsockname()[1]
        self.answered = self.dropped = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    @staticmethod
    def _request(c, buf):
        """(True, what follows it) once a whole request is in; (False, b"") at EOF."""
        while b"\r\n\r\n" not in buf:
            d = c.recv(65536)
            if not d:
                return False, b""
            buf += d
        head, rest = buf.split(b"\r\n\r\n", 1)
        n = next((int(l.split(b":")[1]) for l in head.split(b"\r\n")
                  if l.lower().startswith(b"content-length:")), 0)
        while len(rest) < n:
            d = c.recv(65536)
            if not d:
                return False, b""
            rest += d
        return True, rest[n:]

    def _serve(self, c):
        with c:
            ok, rest = self._request(c, b"")
            if not ok:
                return
            c.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")
            with self.lock:
                self.answered += 1
            ok, _ = self._request(c, rest)
            if ok:
                if self.reset:
                    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                with self.lock:
                    self.dropped += 1

    def close(self):
        self.sock.close()


@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
def test_a_request_on_a_connection_that_died_is_sent_again_every_time(make_world, reset):
    srv = DropsSecondRequest(reset)
    try:
        w = make_world(retry_base_ms=300, retry_cap_ms=600)
        ep = w.add_endpoint(f"dr_{w.tag}", f"http://127.0.0.1:{srv.port}/hook")
        evs = [event(ep, i, w.tag) for i in range(300)]
        assert w.produce(evs).returncode == 0
        # one request at a time: each goes out on the connection the one before opened, which
        # dies, then on a new one; so each meets exactly one dead connection (with more in
        # flight a request may meet several idle ones in a row, and curl gives up after five
        # in one transfer by design)
        c = w.consumer(max_inflight=1)

        def delivered():
            fin = final_states(w.outcomes())
            return all(fin.get((e["id"], ep), {}).get("state") == "delivered" for e in evs)
        wait_until(delivered, 120 * MULT, 0.5, "every event delivered")
        # most requests went out on a kept-alive connection that then died unanswered: each
        # was sent again on a new one, and no attempt failed
        assert srv.dropped >= 100, (srv.answered, srv.dropped)
        failed = [(o.get("err"), o.get("msg")) for o in w.outcomes() if o.get("err")]
        assert failed == [], failed[:5]
        assert c.term() == 0
    finally:
        srv.close()
