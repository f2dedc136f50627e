"""The short soak (scripts/soak with small counts): one session run many times on small and on large inputs, and
sessions created and destroyed with the library registered each time, without the process's resident memory growing
beyond the soak's bound after warm-up, and without file descriptors or threads left behind. The full soak is run by
hand (docs/robustness.md, "Long runs"); this one shows that the short version passes and that its bound catches a
leak of 1 KiB per run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parents[2] / "scripts" / "soak.py"
SHORT = ["--small", "100000", "--large", "1000", "--sessions", "500", "--samples", "10"]

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="the soak reads Linux's /proc/self")


def soak(*args):
    return subprocess.run([sys.executable, str(SOAK), *args], capture_output=True, text=True, timeout=600)


def test_short_soak_finds_no_leak():
    result = soak(*SHORT)
    assert result.returncode == 0, result.stdout + result.stderr
    for phase in ("small", "large", "sessions"):
        assert re.search(rf"^{phase} +after warm-up", result.stdout, re.MULTILINE), result.stdout
    assert result.stdout.rstrip().endswith("soak: ok")


def test_soak_bound_catches_a_leak():
    # 1 KiB kept per small run: the 27,000 runs after warm-up grow the process by about 27 MiB, past the 8 MiB bound.
    result = soak("--small", "30000", "--large", "0", "--sessions", "0", "--inject-leak", "1024")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "soak: FAIL small: RSS grew" in result.stderr
