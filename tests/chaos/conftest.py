"""Chaos suite fixtures: one private stack per session (scenarios restart its services), a
World factory on it, and the report (JSON + text) written at the end of the session."""

import json
import os
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import chaos_lib  # noqa: E402
from chaos_stack import Stack  # noqa: E402

_T0 = time.monotonic()
_STARTED = chaos_lib.STARTED
_TESTS = []  # (nodeid, outcome, seconds)
_STACK_INFO = {}


@pytest.fixture(scope="session")
def chaos_stack():
    if not os.environ.get("SL_BINARY_DIR"):
        pytest.fail("SL_BINARY_DIR is not set: point it at a build dir with the binaries "
                    "(ctest sets it)", pytrace=False)
    # Never run against somebody else's stack: the addresses come from ours only.
    for k in ("SLUICE_KAFKA_BROKERS", "SLUICE_REDIS_URL", "SLUICE_PG_DSN"):
        os.environ.pop(k, None)
    st = Stack(stack_dir=os.environ.get("CHAOS_STACK_DIR"),
               port_base=os.environ.get("CHAOS_PORT_BASE", "28000"),
               keep=os.environ.get("CHAOS_KEEP") == "1")
    t = time.monotonic()
    st.start()
    _STACK_INFO.update(dir=st.dir, port_base=st.base, start_s=round(time.monotonic() - t, 1))
    os.environ.update(st.env())
    print(f"\n[chaos] stack in {st.dir} on ports {st.base}.. ({_STACK_INFO['start_s']}s)")
    yield st
    st.stop()


@pytest.fixture
def stack(chaos_stack):
    """The session stack, with every service up at the start of each test (a failed test
    may have left one down)."""
    if chaos_stack.sh("status", check=False).returncode != 0:
        chaos_stack.restart_down()
    return chaos_stack


@pytest.fixture
def make_world(stack, request):
    worlds = []

    def make(**kw):
        w = chaos_lib.ChaosWorld(chaos_lib.world_dir(request.node.name), request.node.name, **kw)
        worlds.append(w)
        return w

    yield make
    for w in worlds:
        w.close()


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        outcome = report.outcome
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.outcome == "skipped" else "xpassed"
        _TESTS.append((report.nodeid, outcome, round(report.duration, 1)))


COLS = ("events", "delivered", "dead_lettered", "missing", "duplicates", "dup_bound",
        "recovery_s", "settle_s", "max_gap_s", "wall_s")


def _text_report(total_s):
    lines = [f"Sluice chaos suite, profile {chaos_lib.PROFILE.name}, started "
             f"{_STARTED.isoformat(timespec='seconds')}, {total_s:.0f} s in total",
             f"stack: {_STACK_INFO}", ""]
    hdr = f"{'scenario':58} " + " ".join(f"{c:>13}" for c in COLS)
    lines.append(hdr)
    lines.append("-" * len(hdr))
    for r in chaos_lib.RESULTS:
        vals = " ".join(f"{str(r.get(c, '')):>13}" for c in COLS)
        lines.append(f"{r['scenario'][:58]:58} {vals}")
    lines.append("")
    lines.append("tests:")
    for nodeid, outcome, secs in _TESTS:
        lines.append(f"  {outcome:8} {secs:7.1f}s  {nodeid}")
    return "\n".join(lines) + "\n"


def pytest_sessionfinish(session, exitstatus):
    if not _TESTS:
        return
    total = time.monotonic() - _T0
    d = chaos_lib.results_dir()
    report = {
        "profile": chaos_lib.PROFILE.name,
        "scale": chaos_lib.PROFILE.scale,
        "repeats": chaos_lib.PROFILE.repeats,
        "started": _STARTED.isoformat(timespec="seconds"),
        "total_s": round(total, 1),
        "stack": _STACK_INFO,
        "exit_status": int(exitstatus),
        "tests": [{"test": n, "outcome": o, "seconds": s} for n, o, s in _TESTS],
        "scenarios": chaos_lib.RESULTS,
    }
    with open(os.path.join(d, "report.json"), "w") as f:
        json.dump(report, f, indent=2, sort_keys=True, default=str)
    with open(os.path.join(d, "report.txt"), "w") as f:
        f.write(_text_report(total))
    _STACK_INFO["report_dir"] = d


def pytest_terminal_summary(terminalreporter):
    if not chaos_lib.RESULTS and not _TESTS:
        return
    terminalreporter.section("chaos figures")
    for line in _text_report(time.monotonic() - _T0).splitlines():
        terminalreporter.write_line(line)
    if "report_dir" in _STACK_INFO:
        terminalreporter.write_line(f"report: {_STACK_INFO['report_dir']}/report.{{json,txt}}")
