"""Test session settings. Two xdist workers share two cores, so each uses one torch thread: oversubscribed
threads make the many tiny tensor ops of these tests several times slower."""
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests import their shared helpers (helpers, engine_utils, ...)
torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def _own_cache_folder(tmp_path_factory):
    """multispec's cache folder for this session ($MULTISPEC_CACHE_DIR, also for the CLI and server subprocesses):
    no test plans from the cost calibrations or acceptance statistics an earlier session stored, and none writes
    into the user's (a session's temporary models left hundreds of entries there). The user's compiled code, GGUF
    conversions and real models are linked in: rebuilding them would take minutes. The compiled-code folder is
    made when the user has none yet (as multispec's first compile would make it), so that the next session finds
    this one's code: compiled cold, tests/test_backend_compiled.py took 124 CPU-seconds here, warm 19 (its C++
    kernels are built once; entries are keyed by the graphs, the same ones every session)."""
    from multispec.paths import cache_root

    user, mine = cache_root(), tmp_path_factory.mktemp("multispec_cache")
    try:
        (user / "inductor").mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only cache folder: this session compiles into its own, as before
        pass
    for name in ("inductor", "kernels", "gguf", "real_models", "file_hashes"):
        if (user / name).is_dir():
            (mine / name).symlink_to(user / name, target_is_directory=True)
    before = os.environ.get("MULTISPEC_CACHE_DIR")
    os.environ["MULTISPEC_CACHE_DIR"] = str(mine)
    yield
    if before is None:
        os.environ.pop("MULTISPEC_CACHE_DIR", None)
    else:
        os.environ["MULTISPEC_CACHE_DIR"] = before


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
