import os
import zlib

import numpy as np
import pytest

# The auto target's choices in tests come from the shipped table, never from a table `ort-rmsnorm tune` wrote for the
# machine running them (subprocesses inherit this; tests of the tuned table set their own).
os.environ["ORT_RMSNORM_AUTO_TABLE"] = "shipped"
# ... and by the table alone: the test models are small enough to run warm in any L2, which would have `auto` write
# ours everywhere (tests of that regime set their own L2).
os.environ["ORT_RMSNORM_L2_BYTES"] = "0"


@pytest.fixture(scope="session", autouse=True)
def _neutral_working_directory(tmp_path_factory):
    """Run every test from an empty directory. Subprocesses started with `python -c` or `python -m` put their working
    directory first on sys.path; from the checkout, `import ort_rmsnorm` would then find the source tree (which has
    no compiled library) instead of the installed package under test."""
    previous = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(previous)


@pytest.fixture(scope="session", autouse=True)
def _schemas_registered():
    """The tests check fused models with onnx's checker and inference in this process, whatever ran before them:
    the ops' schemas are registered once, as code doing that must (fresh interpreters test where the package
    registers them itself: tests/tools/test_schemas.py)."""
    import ort_rmsnorm

    ort_rmsnorm.register_schemas()


@pytest.fixture
def rng(request):
    """A generator seeded from the test's id: deterministic, different per test."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
