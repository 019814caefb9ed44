"""The chaos verdict's fate rules on synthetic oracles (no stack, no binaries): ctest
`chaos_verdict`, label unit. A dead letter is a final fate only where the endpoint's script
explains it: a permanent answer from an endpoint scripted to give one, or a spent retry budget
at an endpoint scripted to fail transiently; never on an endpoint that answers 2xx."""

import os
import subprocess
import sys
import types

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from chaos_lib import (OK, PERMANENT, TRANSIENT, ChaosWorld, EndpointScript,  # noqa: E402
                       behaviour_fates, fate_verdict)

EV = "evt_t_1"


def outcome(ep, state, attempt=1, ev=EV, http=0):
    return {"id": ev, "endpoint": ep, "state": state, "attempt": attempt, "http": http,
            "ts_ms": 1000 + attempt}


def line(ep, status, ev=EV):
    return {"webhook_id": ev, "endpoint": ep, "status": status, "ts_ms": 1000}


def judge(script, outcomes, ledger, ep="ep"):
    return fate_verdict({(EV, ep)}, outcomes, ledger, {ep: script}, dup_bound=0,
                        dup_reason="none expected")


def dead_letter_only(ep, attempt=1):
    return [outcome(ep, "dead_letter", attempt)]


# ---- dead letters on endpoints that answer 2xx

@pytest.mark.parametrize("behaviour,query", [("ok", ""), ("ok", "?delay_ms=50"),
                                             ("endless", ""), ("slow/300", "")])
def test_dead_letter_on_a_2xx_endpoint_fails(behaviour, query):
    v = judge(EndpointScript(behaviour, query, max_attempts=8, timeout_ms=2000),
              dead_letter_only("ep"), [])
    assert v["dead_unexplained"], "a dead letter on a 2xx endpoint was accepted"
    assert len(v["problems"]) == 1
    assert "always answers 2xx" in v["problems"][0]
    assert not v["missing"], "the dead letter still counts as a fate (judged, not missing)"


def test_dead_letter_on_a_2xx_endpoint_fails_even_after_failed_requests():
    # the ledger shows failures the script never asked for (status 0: a connection the
    # receiver saw close): still no reason for a dead letter on an endpoint scripted ok
    v = judge(EndpointScript("ok", max_attempts=2), dead_letter_only("ep", 2),
              [line("ep", 0), line("ep", 0)])
    assert v["dead_unexplained"]


# ---- permanent failures

@pytest.mark.parametrize("behaviour,status", [("status/400", 400), ("status/410", 410),
                                              ("gone", 410), ("unauth", 401),
                                              ("redirect", 302), ("status/404", 404)])
def test_dead_letter_on_a_permanently_failing_endpoint_passes(behaviour, status):
    v = judge(EndpointScript(behaviour, max_attempts=8), [outcome("ep", "dead_letter", 1,
                                                                  http=status)],
              [line("ep", status)])
    assert v["problems"] == [], v["problems"]
    assert v["dead"] == {(EV, "ep")} and not v["dead_unexplained"]


def test_dead_letter_on_a_permanent_endpoint_needs_its_permanent_answer():
    # scripted 400, but the endpoint never saw the event: the dead letter is the
    # consumer's own verdict, not the endpoint's
    v = judge(EndpointScript("status/400"), dead_letter_only("ep"), [])
    assert v["dead_unexplained"]
    assert "never gave it a permanent answer" in v["problems"][0]


# ---- transient failures: only a spent retry budget explains a dead letter

@pytest.mark.parametrize("behaviour,query,status", [
    ("flaky/30", "", 500), ("status/500", "", 500), ("status/503", "", 503),
    ("retryafter/2", "", 429), ("reset", "", 0), ("ok", "?fail_n=1", 500),
    ("status/429", "", 429), ("status/408", "", 408), ("slow/3000", "", 0)])
def test_transient_endpoint_dead_letter_within_the_budget_fails(behaviour, query, status):
    sc = EndpointScript(behaviour, query, max_attempts=8, timeout_ms=1000)
    assert TRANSIENT in sc.fates()
    v = judge(sc, dead_letter_only("ep", 3), [line("ep", status)] * 3)
    assert v["dead_unexplained"], "a dead letter after 3 of 8 attempts was accepted"
    assert "fewer than the 8 attempts" in v["problems"][0]


@pytest.mark.parametrize("behaviour,status", [("flaky/60", 500), ("status/500", 500),
                                              ("reset", 0)])
def test_transient_endpoint_dead_letter_after_the_whole_budget_passes(behaviour, status):
    v = judge(EndpointScript(behaviour, max_attempts=3), dead_letter_only("ep", 3),
              [line("ep", status)] * 3)
    assert v["problems"] == [], v["problems"]


def test_endpoint_that_recovers_within_the_budget_never_explains_a_dead_letter():
    # status/500 for the fault, then ok (set_url), 50 attempts: 12 failures are no reason
    sc = EndpointScript("status/503", max_attempts=50)
    sc.phases.append(("ok", ""))
    v = judge(sc, dead_letter_only("ep", 12), [line("ep", 503)] * 12)
    assert v["dead_unexplained"]


def test_other_checks_still_hold():
    ep = "ep"
    clean = judge(EndpointScript("ok"), [outcome(ep, "delivered")], [line(ep, 204)])
    assert clean["problems"] == []
    missing = judge(EndpointScript("ok"), [], [])
    assert missing["missing"] and "missing" in missing["problems"][0]
    unaccepted = judge(EndpointScript("ok"), [outcome(ep, "delivered")], [line(ep, 500)])
    assert unaccepted["unaccepted"]
    conflict = judge(EndpointScript("status/400"), dead_letter_only(ep),
                     [line(ep, 400), line(ep, 204)])
    assert conflict["dead_accepted"]


# ---- classification of receiver behaviours

def test_behaviour_classification():
    assert behaviour_fates("ok") == {OK}
    assert behaviour_fates("ok", "?status=200") == {OK}
    assert behaviour_fates("ok", "?status=404") == {PERMANENT}
    assert behaviour_fates("status/400") == {PERMANENT}
    assert behaviour_fates("status/500") == {TRANSIENT}
    assert behaviour_fates("status/201") == {OK}
    assert behaviour_fates("flaky/30") == {OK, TRANSIENT}
    assert behaviour_fates("flaky/100") == {TRANSIENT}
    assert behaviour_fates("ok", "?fail_pct=10&fail_status=410") == {OK, PERMANENT}
    assert behaviour_fates("ok", "?delay_ms=5000", timeout_ms=2000) == {TRANSIENT}
    assert behaviour_fates("status/400", "?delay_ms=50", timeout_ms=2000) == {PERMANENT}
    assert behaviour_fates("slow/3000", timeout_ms=1000) == {TRANSIENT}
    assert behaviour_fates("slow/300", timeout_ms=1000) == {OK}
    with pytest.raises(ValueError, match="not classified"):
        behaviour_fates("teapot")


# ---- the world records each endpoint's script (ChaosWorld.endpoints / set_url)

def test_world_records_scripts_and_budgets():
    calls = []
    w = types.SimpleNamespace(
        tag="tg", scripts={},
        env={"SLUICE_MAX_ATTEMPTS": "8", "SLUICE_HTTP_TIMEOUT_MS": "2000"},
        add_endpoint=lambda ep, url, *flags: calls.append((ep, url, flags)),
        ctl=lambda *a: subprocess.CompletedProcess(a, 0, "", ""))
    rcv = types.SimpleNamespace(url=lambda behaviour, ep: f"http://r/{behaviour}/{ep}")
    eps = ChaosWorld.endpoints(w, rcv, "bad", 1, "status/400")
    eps += ChaosWorld.endpoints(w, rcv, "one", 1, "ok", "?fail_n=1", "--max-attempts", "3",
                                "--timeout-ms", "500")
    assert eps == ["bad0_tg", "one0_tg"]
    assert calls[1] == ("one0_tg", "http://r/ok/one0_tg?fail_n=1",
                        ("--max-attempts", "3", "--timeout-ms", "500"))
    bad, one = w.scripts["bad0_tg"], w.scripts["one0_tg"]
    assert (bad.max_attempts, bad.timeout_ms, bad.fates()) == (8, 2000, {PERMANENT})
    assert (one.max_attempts, one.timeout_ms) == (3, 500)
    ChaosWorld.set_url(w, rcv, "bad0_tg", "ok")
    assert bad.phases == [("status/400", ""), ("ok", "")]
    assert bad.fates() == {PERMANENT, OK}
    with pytest.raises(ValueError):
        ChaosWorld.endpoints(w, rcv, "x", 1, "teapot")
