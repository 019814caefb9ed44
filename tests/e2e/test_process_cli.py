"""Command line of the long-running processes (sluice-consumer, sluice-recorder): --help,
--version, an unknown argument (exit 2, named), bad configuration (exit 78 before anything
connects, the option named, its secret value never echoed), --check-config. Needs no stack."""

import os
import subprocess

import pytest

PROCS = ["consumer/sluice-consumer", "recorder/sluice-recorder"]


def run(rel, *args, env=None):
    path = os.path.join(os.environ["SL_BINARY_DIR"], rel)
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    base.update(env or {})
    return subprocess.run([path, *args], env=base, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("rel", PROCS)
def test_help_version_and_unknown_argument(rel):
    name = os.path.basename(rel)
    r = run(rel, "--help")
    assert r.returncode == 0 and r.stdout.startswith(f"usage: {name}")
    r = run(rel, "--version")
    assert r.returncode == 0 and r.stdout.startswith(f"{name} ")
    r = run(rel, "--bogus")
    assert r.returncode == 2
    assert f'{name}: unknown argument "--bogus"' in r.stderr
    assert "usage:" in r.stderr


@pytest.mark.parametrize("rel", PROCS)
def test_bad_config_exits_78_naming_the_option(rel):
    secret = "pg-password-do-not-print"
    r = run(rel, env={"SLUICE_MAX_QUEUED": "1", "SLUICE_RECORDER_LANES": "0",
                      "SLUICE_PG_DSN": f"host=127.0.0.1 password={secret}"})
    assert r.returncode == 78, r.stderr
    assert "SLUICE_MAX_QUEUED" in r.stderr and "SLUICE_RECORDER_LANES" in r.stderr
    assert "2 configuration errors, not starting" in r.stderr
    assert secret not in r.stderr + r.stdout
    r = run(rel, "--check-config", env={"SLUICE_MASTER_KEY": "0" * 64})
    assert r.returncode == 0 and "configuration ok" in r.stdout


def test_config_reference_is_the_option_table():
    """docs/CONFIG.md is `sluicectl config-doc`'s output: an option added, renamed or
    re-documented in common/sl_cfg.c without regenerating the reference fails here."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = run("ctl/sluicectl", "config-doc")
    assert r.returncode == 0, r.stderr
    with open(os.path.join(repo, "docs", "CONFIG.md")) as f:
        committed = f.read()
    assert r.stdout == committed, ("docs/CONFIG.md is stale: regenerate it with "
                                   "`sluicectl config-doc > docs/CONFIG.md`")
