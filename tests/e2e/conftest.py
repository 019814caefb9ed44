import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from sluice_e2e import World  # noqa: E402


@pytest.fixture
def make_world(tmp_path):
    worlds = []

    def make(**kw):
        w = World(tmp_path, **kw)
        worlds.append(w)
        return w

    yield make
    for w in worlds:
        w.close()
