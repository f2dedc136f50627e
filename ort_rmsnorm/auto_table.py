"""The ``auto`` target's table: per op and type, the longest rows on which onnxruntime's own norm op runs faster than
ours on this machine, measured cold (right after a MatMul, where decoders run their norms).

Two tables exist: the shipped one (``ort_rmsnorm.rewrites._auto_table``, measured on one machine when the package
was built) and a table of this machine, written by ``ort-rmsnorm tune`` to :func:`machine_table_path`. ``auto``
reads this machine's table when there is one for this CPU, else the shipped one; ``ORT_RMSNORM_AUTO_TABLE`` names
another table file, or ``shipped`` for the shipped table alone. The report's ``choice`` names the table used.

The table is measured cold: with more weights between two norms than the L2 cache holds. A model whose weights
between norms fit in half of the L2 (:func:`l2_cache_bytes`; ``ORT_RMSNORM_L2_BYTES`` gives the serving CPU's, ``0``
has every model taken as cold) runs its norms warm, where ours is faster at every length measured, and ``auto``
writes ours there whatever the table says.

A table file is JSON: ``{"format": 1, "measured_on": TEXT, "cpu": TEXT (:func:`cpu_key`), "onnxruntime": TEXT,
"faster_up_to": {OP: {DTYPE: H}}}`` with OP ``RMSNorm`` or ``SkipRMSNorm``, DTYPE ``float32``, ``float16`` or
``bfloat16`` and H a row length: onnxruntime's op where rows have at most H elements, ours above; an op or type
absent means ours at every length.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
from pathlib import Path
from typing import Mapping

from .contract import RMSNORM, SKIP_RMSNORM

ENV = "ORT_RMSNORM_AUTO_TABLE"
L2_ENV = "ORT_RMSNORM_L2_BYTES"  # the serving CPU's L2 cache per core, in bytes; 0: take every model as cold
SHIPPED = "shipped"  # ENV's value for the shipped table alone
FORMAT = 1
OPS = (RMSNORM, SKIP_RMSNORM)
DTYPES = ("float32", "float16", "bfloat16")
_MAX_BYTES = 64 * 1024  # a table is a few hundred bytes
_MAX_LENGTH = 1 << 31


class AutoTableError(ValueError):
    """A table file that cannot be used; the message names the file and the problem."""


@dataclasses.dataclass(frozen=True)
class AutoTable:
    faster_up_to: Mapping[str, Mapping[str, int]]
    measured_on: str
    source: str  # SHIPPED, or the file it was read from
    note: str = ""  # why this table and not this machine's, where that is worth saying

    def describe(self) -> str:
        where = "the shipped table" if self.source == SHIPPED else f"the table {self.source}"
        return f"{where}, {self.measured_on}" + (f"; {self.note}" if self.note else "")

    def to_json(self, cpu: str, onnxruntime: str) -> str:
        return json.dumps({"format": FORMAT, "measured_on": self.measured_on, "cpu": cpu,
                           "onnxruntime": onnxruntime,
                           "faster_up_to": {op: dict(limits) for op, limits in self.faster_up_to.items()}},
                          indent=2) + "\n"


def machine_table_path() -> Path:
    """Where ``ort-rmsnorm tune`` writes this machine's table and ``auto`` looks for it: ``$ORT_RMSNORM_AUTO_TABLE``
    when it names a file, else ``$XDG_CONFIG_HOME/ort-rmsnorm/auto-table.json`` (``~/.config`` by default)."""
    named = os.environ.get(ENV, "")
    if named and named != SHIPPED:
        return Path(named).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "ort-rmsnorm" / "auto-table.json"


def cpuinfo() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo (it describes them all); empty where there is none."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_key() -> str:
    """This machine's CPU as a table names it: the model name with vendor, family, model and stepping (VMs often
    give a generic name), from /proc/cpuinfo; the platform's processor name elsewhere."""
    fields = cpuinfo()
    name = fields.get("model name") or platform.processor() or platform.machine()
    parts = [f"{key} {fields[key]}" for key in ("vendor_id", "cpu family", "model", "stepping", "CPU implementer",
                                                 "CPU part") if fields.get(key)]
    return f"{name} ({', '.join(parts)})" if parts else name


def l2_cache_bytes() -> int | None:
    """The L2 cache of one core in bytes: ``ORT_RMSNORM_L2_BYTES`` when set and not empty (a count of bytes, ``0`` for
    none), else Linux's description of CPU 0's caches; None where neither says. :class:`AutoTableError` for a value
    that is no count of bytes."""
    named = os.environ.get(L2_ENV, "")
    if named:  # empty: unset
        text = named.strip()
        if not text.isascii() or not text.isdigit() or len(text) > 15:
            raise AutoTableError(f"{L2_ENV}={named[:40]!r}: not a count of bytes (e.g. 1048576, or 0)")
        return int(text)
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index[0-9]*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        if level == "2" and kind in ("Unified", "Data"):
            units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
            digits = size[:-1] if size[-1:] in units else size
            if digits.isdigit():
                return int(digits) * units.get(size[-1:], 1)
    return None


def _limits(value: object, path: Path) -> dict[str, dict[str, int]]:
    if not isinstance(value, dict):
        raise AutoTableError(f"{path}: 'faster_up_to' must be an object of ops")
    limits: dict[str, dict[str, int]] = {}
    for op, by_dtype in value.items():
        if op not in OPS:
            raise AutoTableError(f"{path}: unknown op {op!r} in 'faster_up_to' (expected {' or '.join(OPS)})")
        if not isinstance(by_dtype, dict):
            raise AutoTableError(f"{path}: 'faster_up_to'.{op} must be an object of types")
        for dtype, length in by_dtype.items():
            if dtype not in DTYPES:
                raise AutoTableError(f"{path}: unknown type {dtype!r} under {op} (expected one of {', '.join(DTYPES)})")
            if type(length) is not int or not 0 < length < _MAX_LENGTH:
                raise AutoTableError(f"{path}: {op}.{dtype} must be a row length from 1 to {_MAX_LENGTH - 1}")
            limits.setdefault(op, {})[dtype] = length
    return limits


def _short_int(text: str) -> int:
    if len(text) > 12:
        raise ValueError(f"an integer of {len(text)} digits")
    return int(text)


def read(path: Path) -> tuple[AutoTable, str]:
    """A table file and the CPU it was measured on; :class:`AutoTableError` naming the file and the problem."""
    try:
        if not path.is_file():
            raise AutoTableError(f"{path}: not a regular file")
        with open(path, "rb") as file:
            data = file.read(_MAX_BYTES + 1)
    except OSError as error:
        raise AutoTableError(f"{path}: cannot read it ({error.strerror or error})") from None
    if len(data) > _MAX_BYTES:
        raise AutoTableError(f"{path}: larger than {_MAX_BYTES} bytes; a table is a few hundred")
    try:
        document = json.loads(data.decode("utf-8"), parse_int=_short_int)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise AutoTableError(f"{path}: not a table ({error})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise AutoTableError(f"{path}: not a table of format {FORMAT} (write it with 'ort-rmsnorm tune')")
    measured_on, cpu = document.get("measured_on"), document.get("cpu")
    if not isinstance(measured_on, str) or not isinstance(cpu, str):
        raise AutoTableError(f"{path}: 'measured_on' and 'cpu' must be text")
    return AutoTable(_limits(document.get("faster_up_to"), path), measured_on, str(path)), cpu


def load(shipped: AutoTable, cpu: str | None = None) -> AutoTable:
    """The table ``auto`` uses on the CPU ``cpu`` (default: this machine's, :func:`cpu_key`); see the module's
    docstring. A table file measured on another CPU is passed over, and the returned table says so."""
    named = os.environ.get(ENV, "")
    if named == SHIPPED:
        return shipped
    path = machine_table_path()
    if not named and not path.exists():
        return shipped
    table, measured_cpu = read(path)
    if measured_cpu != (cpu if cpu is not None else cpu_key()):
        return dataclasses.replace(shipped, note=f"{path} was measured on another CPU ({measured_cpu})")
    return table
