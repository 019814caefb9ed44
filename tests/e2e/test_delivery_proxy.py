"""Deliveries through an egress proxy (delivery_proxy), as platforms whose endpoints allow only
fixed source addresses run them.

tinyproxy (Debian's tinyproxy-bin, started here on loopback with basic authentication)
stands in for the egress proxy. The consumer tunnels every request through it with CONNECT,
plain HTTP and HTTPS alike: both endpoints get their signed requests and the proxy's log
shows one tunnel target per endpoint. An endpoint whose host is a refused address is still
refused (ssrf_refused) and never asked of the proxy, although the proxy itself is on
loopback. With the proxy down the consumer does not go direct: deliveries are retried
(proxy_unreachable) until it is back, and an endpoint the proxy cannot reach fails with
connect as without a proxy. A proxy that refuses the consumer's credentials (401 from tinyproxy) gives proxy_refused:
retried, counted in sluice_attempt_failures_total, and no failure of the endpoint's (its
breaker stays closed). The proxy's password reaches neither a log line nor
--print-config, and a proxy URL of another scheme is refused at start-up (78).

The same through a SOCKS5 proxy (Debian's microsocks, user and password): socks5h:// (the
proxy resolves names, so the consumers' own resolution cannot be bypassed by one) carries
plain HTTP and HTTPS; the refused literal is still never asked of it; an endpoint it cannot
reach is the endpoint's connect failure; its refusal of the credentials is proxy_refused and
opens no breaker; socks5:// (names resolved here, where the SSRF rules would not see the
address connected to) is refused at start-up.

And through an https:// proxy (stunnel, Debian's stunnel4, terminating TLS in front of
tinyproxy) whose certificate is from a CA of its own: verified against
delivery_proxy_ca_file, plain HTTP and HTTPS endpoints delivered through it; without that
file its certificate does not verify, which is the proxy's failure (proxy_unreachable, no
endpoint's breaker opened), not the endpoints' tls, while an endpoint's own certificate that
does not verify is its tls; with the proxy behind the TLS terminator down, the connections
dropped before any answer to CONNECT are proxy_unreachable as well.
"""

import json
import os
import shutil
import socket
import subprocess
import urllib.request

from sluice_e2e import event, final_states, free_port, wait_until
from test_https_endpoints import TlsReceiver, signature_ok
from tls_helpers import CA

MULT = float(os.environ.get("SL_TEST_TIMEOUT_MULT", "1"))
TINYPROXY = shutil.which("tinyproxy") or "/usr/bin/tinyproxy"
MICROSOCKS = shutil.which("microsocks") or "/usr/bin/microsocks"
STUNNEL = shutil.which("stunnel4") or shutil.which("stunnel") or "/usr/bin/stunnel4"


def settled(w, evs, ep_down):
    """The latest outcomes once every event has ended (delivered or dead-lettered) and the
    one to ep_down, which nothing reaches, has been tried (retried, or deferred once its
    breaker opened); else None."""
    fin = final_states(w.outcomes())
    for e in evs:
        st = fin.get((e["id"], e["endpoint"]), {}).get("state")
        if st not in (("retry_scheduled", "deferred", "dead_letter") if e["endpoint"] == ep_down
                      else ("delivered", "dead_letter")):
            return None
    return fin


def deliver_through(w, proxy_url, rcv, tls, px):
    """Four endpoints (plain HTTP on rcv, HTTPS on tls, a refused literal registered without
    the registry's rules, and one on a port nothing listens on), ten events to each of the
    first two and one to each other, sent by a consumer through proxy_url: the first two
    delivered and signed, the literal refused by the consumer's own rules (never asked of the
    proxy), the last the endpoint's connect failure. Returns (the consumer, still running,
    the HTTP endpoint's id, the port nothing listens on)."""
    ep_http = w.add_endpoint(f"{px}h_{w.tag}", rcv.url("ok", f"{px}h_{w.tag}"))
    ep_tls = w.add_endpoint(f"{px}t_{w.tag}", tls.url("hook"))
    r = w.ctl("endpoints", "add", "--id", f"{px}p_{w.tag}", "--url", "http://10.0.0.1/x",
              "--secret", w.secret, env=dict(w.env, SLUICE_SSRF_PROTECTION="false"))
    assert r.returncode == 0, r.stderr
    ep_priv = f"{px}p_{w.tag}"
    down_port = free_port()
    ep_down = w.add_endpoint(f"{px}d_{w.tag}", f"http://127.0.0.1:{down_port}/x")
    evs = ([event(ep_http, i, w.tag) for i in range(10)]
           + [event(ep_tls, i, w.tag) for i in range(10)] + [event(ep_priv, 0, w.tag)]
           + [event(ep_down, 0, w.tag)])
    assert w.produce(evs).returncode == 0
    c = w.consumer(delivery_proxy=proxy_url)
    fin = wait_until(lambda: settled(w, evs, ep_down), 60 * MULT, 0.5,
                     "every delivery to end (the unreachable endpoint's: a retry)")
    for e in evs:
        o = fin[(e["id"], e["endpoint"])]
        if e["endpoint"] == ep_priv:
            assert o["state"] == "dead_letter" and o["err"] == "ssrf_refused", o
        elif e["endpoint"] == ep_down:   # the endpoint's failure, not the proxy's
            tries = [x for x in w.outcomes() if x["endpoint"] == ep_down
                     and x["state"] == "retry_scheduled"]
            assert tries and all(x["err"] == "connect" for x in tries), tries
        else:
            assert o["state"] == "delivered", o
    assert len(tls.requests) == 10
    assert all(signature_ok(w.secret, h, b) for _, h, b in tls.requests)
    assert len([l for l in rcv.ledger() if l["endpoint"] == ep_http]) == 10
    return c, ep_http, down_port


def refused_then_delivered(w, ep_http, bad_url, good_url, while_refused=None, **cfg):
    """Eight events to ep_http through bad_url, whose credentials the proxy refuses: a retry
    of each as proxy_refused, not the endpoint's failure (no breaker opened: 5 would);
    while_refused() runs then; once sent through good_url, all delivered."""
    lates = [event(ep_http, 90 + i, w.tag) for i in range(8)]
    assert w.produce(lates).returncode == 0
    c = w.consumer(delivery_proxy=bad_url, **cfg)
    ids = {e["id"] for e in lates}

    def refused():
        outs = [o for o in w.outcomes() if o["id"] in ids and o["state"] == "retry_scheduled"]
        return len({o["id"] for o in outs}) == len(lates) and outs
    outs = wait_until(refused, 30 * MULT, 0.3, "a retry of each after the proxy's refusal")
    assert all(o.get("err") == "proxy_refused" and not o.get("http") for o in outs), \
        [(o.get("err"), o.get("http"), o.get("msg")) for o in outs]
    assert f"breaker opened for endpoint {ep_http}" not in c.logs()
    if while_refused:
        while_refused()
    assert c.term() == 0
    c2 = w.consumer(delivery_proxy=good_url)
    wait_until(lambda: all(final_states(w.outcomes()).get((e["id"], ep_http), {})
                           .get("state") == "delivered" for e in lates),
               60 * MULT, 0.5, "delivered with the password")
    assert c2.term() == 0


def password_nowhere(w, password, *proxy_logs):
    """Not in any of the world's log files (but the proxies' own) nor in any outcome (curl's
    error texts are in them)."""
    logs = "".join(open(os.path.join(w.dir, f), errors="replace").read()
                   for f in os.listdir(w.dir) if f.endswith(".log") and f not in proxy_logs)
    assert len(logs) > 200 and password not in logs
    assert password not in json.dumps(w.outcomes())


class Tinyproxy:
    """tinyproxy in the foreground on 127.0.0.1:port, basic auth user/password, its log in
    dir/tinyproxy.log; start() / stop() keep the port."""

    def __init__(self, d, user, password):
        self.dir, self.port = d, free_port()
        self.log = os.path.join(d, "tinyproxy.log")
        self.conf = os.path.join(d, "tinyproxy.conf")
        with open(self.conf, "w") as f:
            # no ConnectPort line: CONNECT to any port (the test servers' are random)
            f.write(f"Port {self.port}\nListen 127.0.0.1\nTimeout 30\nMaxClients 200\n"
                    f"Allow 127.0.0.1\nBasicAuth {user} {password}\nLogLevel Info\n"
                    f"LogFile \"{self.log}\"\nDisableViaHeader Yes\n")
        open(self.log, "a").close()
        os.chmod(self.log, 0o666)   # tinyproxy may drop to nobody when started as root
        os.chmod(d, 0o777)
        self.p = None

    def start(self):
        self.p = subprocess.Popen([TINYPROXY, "-d", "-c", self.conf], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        def up():
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", self.port)) == 0
        wait_until(up, 20 * MULT, 0.1, "tinyproxy to listen")

    def stop(self):
        if self.p and self.p.poll() is None:
            self.p.terminate()
            self.p.wait(10)

    def connects(self):
        """The CONNECT targets the proxy was asked for, in order."""
        out = []
        for line in open(self.log, errors="replace"):
            i = line.find("CONNECT ", line.find("Request"))
            if "Request" in line and i >= 0:
                out.append(line[i + 8:].split()[0])
        return out


class Microsocks:
    """microsocks (a SOCKS5 server) on 127.0.0.1:port with user/password authentication, its
    output (one line per connection it made) in dir/microsocks.log."""

    def __init__(self, d, user, password):
        self.port, self.user, self.password = free_port(), user, password
        self.log = os.path.join(d, "microsocks.log")
        self.p = None

    def start(self):
        with open(self.log, "a") as out:
            self.p = subprocess.Popen([MICROSOCKS, "-i", "127.0.0.1", "-p", str(self.port),
                                       "-u", self.user, "-P", self.password],
                                      stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        def up():
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", self.port)) == 0
        wait_until(up, 20 * MULT, 0.1, "microsocks to listen")

    def stop(self):
        if self.p and self.p.poll() is None:
            self.p.terminate()
            self.p.wait(10)

    def connects(self):
        """The targets the proxy connected to ("client[5] 127.0.0.1: connected to h:p")."""
        return [l.rsplit("connected to ", 1)[1].strip()
                for l in open(self.log, errors="replace") if "connected to " in l]


class Stunnel:
    """stunnel in the foreground: TLS with cert/key on 127.0.0.1:port, relayed in the clear to
    127.0.0.1:target_port (here tinyproxy), so that the pair is an https:// proxy."""

    def __init__(self, d, cert, key, target_port):
        self.port = free_port()
        self.conf = os.path.join(d, "stunnel.conf")
        with open(self.conf, "w") as f:
            f.write(f"foreground = yes\npid =\noutput = {os.path.join(d, 'stunnel.log')}\n"
                    f"[proxy]\naccept = 127.0.0.1:{self.port}\n"
                    f"connect = 127.0.0.1:{target_port}\ncert = {cert}\nkey = {key}\n")
        self.p = None

    def start(self):
        self.p = subprocess.Popen([STUNNEL, self.conf], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        def up():
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", self.port)) == 0
        wait_until(up, 20 * MULT, 0.1, "stunnel to listen")

    def stop(self):
        if self.p and self.p.poll() is None:
            self.p.terminate()
            self.p.wait(10)


def test_deliveries_tunnel_through_the_proxy_and_never_around_it(make_world, tmp_path):
    assert os.access(TINYPROXY, os.X_OK), "tinyproxy not installed: run scripts/setup.sh"
    password = "Pr0xyPa55wd"
    ca = CA(str(tmp_path / "ca"))
    tls = TlsReceiver(*ca.issue("tls", "127.0.0.1"))
    # 5 failures open a breaker: the endpoint the proxy cannot reach opens its own; the
    # proxy's own failures (down, 401) are charged to no endpoint
    w = make_world(endpoint_ca_file=ca.cert, retry_base_ms=300, retry_cap_ms=600,
                   max_attempts=30, breaker_cooldown_ms=1000, breaker_cooldown_max_ms=2000,
                   breaker_threshold=5)
    proxy = Tinyproxy(w.dir, "sluice", password)
    proxy.start()
    try:
        rcv = w.receiver()
        proxy_url = f"http://sluice:{password}@127.0.0.1:{proxy.port}"
        # tinyproxy answers 500 for the endpoint it cannot reach
        c, ep_http, down_port = deliver_through(w, proxy_url, rcv, tls, "p")
        targets = set(proxy.connects())
        assert targets == {f"127.0.0.1:{rcv.port}", f"127.0.0.1:{tls.port}",
                           f"127.0.0.1:{down_port}"}, targets

        # the proxy down: deferred without spending an attempt (an outage longer than the
        # retry schedule dead-letters nothing), never sent around it; delivered once it is
        # back, each at its first attempt
        proxy.stop()
        more = [event(ep_http, i, w.tag) for i in range(10, 15)]
        assert w.produce(more).returncode == 0

        ids = {e["id"] for e in more}

        def deferred():  # more failures than open a breaker (5)
            outs = [o for o in w.outcomes() if o["id"] in ids and o["state"] == "deferred"]
            return len(outs) >= 8 and outs
        outs = wait_until(deferred, 30 * MULT, 0.3, "deferrals while the proxy is down")
        assert all(o.get("err") == "proxy_unreachable" for o in outs), outs
        assert not [o for o in w.outcomes() if o["id"] in ids
                    and o["state"] in ("retry_scheduled", "dead_letter")]
        assert len([l for l in rcv.ledger() if l["endpoint"] == ep_http]) == 10
        proxy.start()

        def delivered_more():
            fin = final_states(w.outcomes())
            return all(fin.get((e["id"], ep_http), {}).get("state") == "delivered"
                       for e in more) and fin
        fin = wait_until(delivered_more, 90 * MULT, 0.5, "delivery once the proxy is back")
        assert all(fin[(e["id"], ep_http)]["attempt"] == 1 for e in more), \
            [fin[(e["id"], ep_http)] for e in more]
        assert f"breaker opened for endpoint {ep_http}" not in c.logs()
        assert c.term() == 0

        # credentials the proxy refuses (tinyproxy answers 401): proxy_refused, not the
        # endpoint's 4xx nor its failure, and counted as such
        mport = free_port()

        def counted():
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics",
                                             timeout=10).read()
            counts = {l.split("}")[0].split('class="')[1].rstrip('"'): float(l.split()[-1])
                      for l in metrics.decode().splitlines()
                      if l.startswith("sluice_attempt_failures_total{")}
            assert counts["proxy_refused"] >= 1 and counts["connect"] == 0, counts
        refused_then_delivered(w, ep_http, f"http://sluice:wrong@127.0.0.1:{proxy.port}",
                               proxy_url, counted, metrics_listen=f"127.0.0.1:{mport}")

        # the password: not in any log line, masked by --print-config
        password_nowhere(w, password, "tinyproxy.log")
        env = dict(w.env, SLUICE_DELIVERY_PROXY=proxy_url)
        r = w.run("consumer/sluice-consumer", "--print-config", env=env)
        assert r.returncode == 0 and password not in r.stdout + r.stderr
        assert f'delivery_proxy = "http://[redacted]@127.0.0.1:{proxy.port}"' in r.stdout, r.stdout
        for bad, why in (("ftp://127.0.0.1:21", "scheme"), ("http://127.0.0.1:3128/path", "path"),
                         (f"127.0.0.1:{proxy.port}", "scheme")):
            r = w.run("consumer/sluice-consumer", "--check-config",
                      env=dict(w.env, SLUICE_DELIVERY_PROXY=bad))
            assert r.returncode == 78, r.stderr
            assert "SLUICE_DELIVERY_PROXY (env)" in r.stderr and why in r.stderr, r.stderr
            assert bad not in r.stderr
    finally:
        proxy.stop()
        tls.close()


def test_deliveries_through_a_socks5h_proxy_keep_the_rules_and_the_failures_apart(make_world,
                                                                                  tmp_path):
    assert os.access(MICROSOCKS, os.X_OK), "microsocks not installed: run scripts/setup.sh"
    password = "S0cksPa55wd"
    ca = CA(str(tmp_path / "ca"))
    tls = TlsReceiver(*ca.issue("tls", "127.0.0.1"))
    w = make_world(endpoint_ca_file=ca.cert, retry_base_ms=300, retry_cap_ms=600,
                   max_attempts=30, breaker_cooldown_ms=1000, breaker_cooldown_max_ms=2000,
                   breaker_threshold=5)
    proxy = Microsocks(w.dir, "sluice", password)
    proxy.start()
    try:
        rcv = w.receiver()
        proxy_url = f"socks5h://sluice:{password}@127.0.0.1:{proxy.port}"
        # microsocks answers "connection refused" for the endpoint it cannot reach
        c, ep_http, _ = deliver_through(w, proxy_url, rcv, tls, "s")
        targets = set(proxy.connects())   # connected: the endpoint that is down is not listed
        assert targets == {f"127.0.0.1:{rcv.port}", f"127.0.0.1:{tls.port}"}, targets
        assert c.term() == 0
        refused_then_delivered(w, ep_http, f"socks5h://sluice:wrong@127.0.0.1:{proxy.port}",
                               proxy_url)
        password_nowhere(w, password, "microsocks.log")

        # socks5:// would resolve names here, outside the proxy's and the consumers' rules
        bad = f"socks5://sluice:{password}@127.0.0.1:{proxy.port}"
        r = w.run("consumer/sluice-consumer", "--check-config",
                  env=dict(w.env, SLUICE_DELIVERY_PROXY=bad))
        assert r.returncode == 78, r.stderr
        assert "SLUICE_DELIVERY_PROXY (env)" in r.stderr and "socks5h" in r.stderr, r.stderr
        assert password not in r.stderr
    finally:
        proxy.stop()
        tls.close()


def test_an_https_proxy_is_verified_against_its_own_ca_and_its_tls_failure_is_the_proxys(
        make_world, tmp_path):
    assert os.access(STUNNEL, os.X_OK), "stunnel4 not installed: run scripts/setup.sh"
    assert os.access(TINYPROXY, os.X_OK), "tinyproxy not installed: run scripts/setup.sh"
    password = "Tl5Pr0xyPw"
    ca = CA(str(tmp_path / "ca"))            # the endpoints'
    pca = CA(str(tmp_path / "pca"), "pca")   # the proxy's own, a CA of its own
    tls = TlsReceiver(*ca.issue("tls", "127.0.0.1"))
    other = CA(str(tmp_path / "other"), "other")   # trusted by nobody here
    untrusted = TlsReceiver(*other.issue("untrusted", "127.0.0.1"))
    w = make_world(endpoint_ca_file=ca.cert, retry_base_ms=300, retry_cap_ms=600,
                   max_attempts=30, breaker_cooldown_ms=1000, breaker_cooldown_max_ms=2000,
                   breaker_threshold=5)
    tiny = Tinyproxy(w.dir, "sluice", password)
    tiny.start()
    st = Stunnel(w.dir, *pca.issue("proxy", "127.0.0.1"), tiny.port)
    st.start()
    try:
        rcv = w.receiver()
        ep_http = w.add_endpoint(f"th_{w.tag}", rcv.url("ok", f"th_{w.tag}"))
        ep_tls = w.add_endpoint(f"tt_{w.tag}", tls.url("hook"))
        proxy_url = f"https://sluice:{password}@127.0.0.1:{st.port}"

        # without delivery_proxy_ca_file the proxy's certificate does not verify: the
        # proxy's failure, deferred with no attempt spent, charged to no endpoint (8 failures
        # each; 5 open a breaker)
        evs = [event(ep, i, w.tag) for ep in (ep_http, ep_tls) for i in range(8)]
        assert w.produce(evs).returncode == 0
        c = w.consumer(delivery_proxy=proxy_url)
        ids = {e["id"] for e in evs}

        def failed_each():
            outs = [o for o in w.outcomes() if o["id"] in ids and o["state"] == "deferred"]
            return len({(o["id"], o["endpoint"]) for o in outs}) == len(evs) and outs
        outs = wait_until(failed_each, 30 * MULT, 0.3, "a deferral of each: the proxy's TLS")
        assert all(o.get("err") == "proxy_unreachable" and not o.get("http") for o in outs), \
            [(o.get("err"), o.get("http"), o.get("msg")) for o in outs]
        assert "breaker opened for endpoint" not in c.logs()
        assert tiny.connects() == []   # nothing got past the proxy's TLS
        assert c.term() == 0

        # with it: verified, and every request tunnelled through it
        c2 = w.consumer(delivery_proxy=proxy_url, delivery_proxy_ca_file=pca.cert)
        wait_until(lambda: all(final_states(w.outcomes()).get((e["id"], e["endpoint"]), {})
                               .get("state") == "delivered" for e in evs),
                   60 * MULT, 0.5, "delivered through the https:// proxy")
        assert len(tls.requests) == 8
        assert all(signature_ok(w.secret, h, b) for _, h, b in tls.requests)
        assert len([l for l in rcv.ledger() if l["endpoint"] == ep_http]) == 8
        assert set(tiny.connects()) == {f"127.0.0.1:{rcv.port}", f"127.0.0.1:{tls.port}"}

        # an endpoint's own certificate that does not verify, through the verified proxy: the
        # endpoint's failure (tls), charged to its breaker as without a proxy
        ep_bad = w.add_endpoint(f"tb_{w.tag}", untrusted.url("hook"))
        bads = [event(ep_bad, i, w.tag) for i in range(8)]
        assert w.produce(bads).returncode == 0
        bad_ids = {e["id"] for e in bads}

        def bad_failed():
            outs = [o for o in w.outcomes() if o["id"] in bad_ids and o.get("err")]
            return len(outs) >= 5 and outs
        outs = wait_until(bad_failed, 30 * MULT, 0.3, "the endpoint's tls failures")
        assert all(o["err"] in ("tls", "breaker_open") for o in outs), \
            [(o.get("err"), o.get("msg")) for o in outs]
        assert any(o["err"] == "tls" for o in outs)
        wait_until(lambda: f"breaker opened for endpoint {ep_bad}" in c2.logs(), 30 * MULT, 0.3,
                   "its breaker to open")
        assert untrusted.requests == []
        assert f"127.0.0.1:{untrusted.port}" in tiny.connects()   # tunnelled, then refused

        assert c2.term() == 0

        # the TLS terminator up, the proxy behind it down: new connections it takes and drops
        # before any answer to CONNECT are the proxy's failure, charged to no endpoint (a new
        # consumer: a kept-alive tunnel that dies is a reused connection, which curl retries
        # on a new one, or after five such retries on one handle reports as the endpoint's
        # send failure: it cannot tell whose end closed it)
        tiny.stop()
        c3 = w.consumer(delivery_proxy=proxy_url, delivery_proxy_ca_file=pca.cert)
        downs = [event(ep_http, 50 + i, w.tag) for i in range(6)]
        assert w.produce(downs).returncode == 0
        down_ids = {e["id"] for e in downs}

        def dropped():
            outs = [o for o in w.outcomes() if o["id"] in down_ids and o["state"] == "deferred"]
            return len({o["id"] for o in outs}) == len(downs) and outs
        outs = wait_until(dropped, 30 * MULT, 0.3, "a deferral of each, the proxy behind TLS down")
        assert all(o.get("err") == "proxy_unreachable" for o in outs), \
            [(o.get("err"), o.get("msg")) for o in outs]
        assert f"breaker opened for endpoint {ep_http}" not in c3.logs()
        tiny.start()
        wait_until(lambda: all(final_states(w.outcomes()).get((e["id"], ep_http), {})
                               .get("state") == "delivered" for e in downs),
                   60 * MULT, 0.5, "delivered once the proxy is back")
        assert c3.term() == 0
        password_nowhere(w, password, "tinyproxy.log", "stunnel.log")
    finally:
        st.stop()
        tiny.stop()
        tls.close()
        untrusted.close()
