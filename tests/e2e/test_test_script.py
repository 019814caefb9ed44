"""scripts/test.sh's stage selection (SLUICE_TEST_ONLY): an unknown stage name is refused with
exit 2 and a message naming the valid stages, before anything is installed, started or built;
each valid name is accepted. Needs no stack and builds nothing.

The script runs from a copy in a temp dir (byte for byte; it finds its repository from its own
path) whose scripts/setup.sh, scripts/stack.sh and scripts/check-src.sh are stubs that only
record their calls, and with cmake and ctest stubs first on PATH: even a broken check can
neither install packages nor start, stop or reuse anybody's stack."""

import os
import re
import shutil
import stat
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "test.sh")

STUB = """#!/usr/bin/env bash
echo "{name} $*" >> "$STUB_CALLS"
{tail}
"""


def script_stages():
    """The stage names the script actually runs: every `if stage NAME; then`."""
    with open(SCRIPT) as f:
        return re.findall(r"^if stage ([a-z0-9_-]+); then", f.read(), re.M)


@pytest.fixture
def sandbox(tmp_path):
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy2(SCRIPT, root / "scripts" / "test.sh")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    stubs = {
        root / "scripts" / "setup.sh": ("setup", "exit 0"),
        root / "scripts" / "stack.sh": ("stack", "exit 0"),  # `env` prints nothing
        root / "scripts" / "check-src.sh": ("check-src", "exit 0"),
        bindir / "cmake": ("cmake", "exit 1"),  # a stage that builds stops at once
        bindir / "ctest": ("ctest", "exit 1"),
    }
    for path, (name, tail) in stubs.items():
        path.write_text(STUB.format(name=name, tail=tail))
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    calls = tmp_path / "calls"
    calls.write_text("")

    def run(only):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLUICE_", "CHAOS_"))}
        env.update(SLUICE_TEST_ONLY=only, STUB_CALLS=str(calls),
                   PATH=f"{bindir}:{os.environ['PATH']}")
        r = subprocess.run(["bash", str(root / "scripts" / "test.sh")], env=env,
                           capture_output=True, text=True, timeout=30)
        return r, calls.read_text().splitlines()

    return run


def test_the_script_has_the_stages_it_documents():
    assert script_stages() == ["gcc", "asan", "fuzz", "lint"]


@pytest.mark.parametrize("name", ["bogus", "ASAN", "gcc asan", "gcc,asan", "lin", "gcc "])
def test_unknown_stage_is_refused_before_anything_runs(sandbox, name):
    r, calls = sandbox(name)
    assert r.returncode == 2, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert f'unknown stage "{name}" in SLUICE_TEST_ONLY' in r.stderr, r.stderr
    # the message names exactly the stages the script runs, so it cannot drift from them
    m = re.search(r"valid stages: (.*)$", r.stderr, re.M)
    assert m and m.group(1).split() == script_stages(), r.stderr
    assert "all stages passed" not in r.stdout + r.stderr
    assert calls == [], f"something ran for an unknown stage: {calls}"


@pytest.mark.parametrize("name", script_stages())
def test_every_valid_stage_is_accepted_and_runs(sandbox, name):
    r, calls = sandbox(name)
    assert "unknown stage" not in r.stderr, r.stderr
    assert calls[:2] == ["setup ", "stack start"], calls
    if name == "lint":  # the one stage the stubs let finish
        assert r.returncode == 0, r.stderr
        assert "check-src " in calls and "all stages passed" in r.stdout
        assert not [c for c in calls if c.startswith(("cmake", "ctest"))], calls
    else:  # it got as far as its build (the cmake stub fails it)
        assert r.returncode != 0 and any(c.startswith("cmake ") for c in calls), calls
        assert "all stages passed" not in r.stdout
