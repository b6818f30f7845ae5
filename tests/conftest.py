"""Test session settings. Two xdist workers share two cores, so each uses one torch thread: oversubscribed
threads make the many tiny tensor ops of these tests several times slower."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests import their shared helpers (helpers, engine_utils, ...)
torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def _own_acceptance_statistics(tmp_path_factory):
    """auto's acceptance statistics (drafting/auto/memory.py) kept in this session's folder, so that no test plans
    from what an earlier test session stored in the user's cache (the cost cache and compiled code stay shared)."""
    from multispec.drafting.auto import memory

    path = tmp_path_factory.mktemp("acceptance") / memory.FILE
    real = memory._file
    memory._file = lambda: path
    yield
    memory._file = real


@pytest.fixture(autouse=True)
def _one_thread():
    """One thread for every test, also after a test that changed it (the CLI's load-aware `set_threads`, a test
    asking for torch's default), restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """A tiny saved pair (helpers.save_tiny_pair), once per module that asks for it: the CLI and bad-input tests."""
    from helpers import save_tiny_pair

    return save_tiny_pair(tmp_path_factory.mktemp("pair"))


@pytest.fixture(scope="module")
def pair(dirs):
    """That pair loaded (modules with a pair of their own define their own `pair` fixture, which wins)."""
    import multispec

    return multispec.load_pair(target=str(dirs["target"]), draft=str(dirs["draft"]))
