import zlib

import numpy as np
import pytest


@pytest.fixture
def rng(request):
    """A generator seeded from the test's id: deterministic, different per test."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
