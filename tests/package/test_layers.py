"""The package's layers, read from the installed package's sources (imports inside functions included):

    leaf modules  <-  the pass (rewrites)  <-  the public API  <-  model builders  <-  tools

A module imports only from its own layer or lower ones, never from a package's face (``__init__``) when it is inside
that package, and no modules import each other in a loop. A new module must be placed in ``LAYERS`` first.
The command line's cheap subcommands must not import the pass or torch (checked in a fresh interpreter).

Each constant has one home: the targets are named in ``contract.TARGETS`` and defined once in the pass, which
alone compares target names (``rewrites/_target_list.py``).
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = "ort_rmsnorm"
LEAF, PASS, API, BUILDERS, TOOLS = range(5)
LAYERS = {
    "ort_rmsnorm.contract": LEAF,
    "ort_rmsnorm._library": LEAF,
    "ort_rmsnorm._logs": LEAF,
    "ort_rmsnorm.runtime": LEAF,
    "ort_rmsnorm.durable": LEAF,
    "ort_rmsnorm.model": LEAF,
    "ort_rmsnorm.schemas": LEAF,
    "ort_rmsnorm.auto_table": LEAF,
    "ort_rmsnorm.rewrites": PASS,
    "ort_rmsnorm.fusion": API,
    "ort_rmsnorm.folders": API,
    "ort_rmsnorm.feeds": API,
    "ort_rmsnorm.verify": API,
    "ort_rmsnorm.norm_checks": API,
    "ort_rmsnorm.tooling": API,
    "ort_rmsnorm.builders": BUILDERS,  # the demo's, bench's, benchmarks/' and the tests' models
    "ort_rmsnorm.command_line": TOOLS,
    "ort_rmsnorm.cli": TOOLS,
    "ort_rmsnorm.__main__": TOOLS,
    "ort_rmsnorm.demo": TOOLS,
    "ort_rmsnorm.bench": TOOLS,
}
LAYER_NAMES = ("leaf", "pass", "public API", "model builders", "tools")


def _layer(module: str) -> int | None:
    """The layer of a module: its own entry, or that of the nearest package above it that has one."""
    parts = module.split(".")
    for end in range(len(parts), 1, -1):
        layer = LAYERS.get(".".join(parts[:end]))
        if layer is not None:
            return layer
    return None


def _installed_modules() -> dict[str, Path]:
    spec = importlib.util.find_spec(PACKAGE)
    assert spec is not None and spec.submodule_search_locations, "the package is not installed"
    modules = {}
    for root in map(Path, spec.submodule_search_locations):
        for path in sorted(root.rglob("*.py")):
            parts = [PACKAGE, *path.relative_to(root).with_suffix("").parts]
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _imports(module: str, path: Path, known: set[str]) -> list[tuple[str, int, bool]]:
    """(imported module of ours, line, whether it names the face of the importer's own package) for every import
    statement in the file, wherever it stands."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno, False) for alias in node.names if alias.name.split(".")[0] == PACKAGE]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                if submodule in known:
                    found.append((submodule, node.lineno, False))
                else:
                    # A name from a package's face: fine from outside that package, not from inside it.
                    inside = module.startswith(target + ".") and target in known
                    found.append((target, node.lineno, inside))
    return found


@pytest.fixture(scope="module")
def import_graph() -> dict[str, list[tuple[str, int, bool]]]:
    modules = _installed_modules()
    known = set(modules)
    return {module: _imports(module, path, known) for module, path in modules.items()}


def test_every_module_has_a_layer(import_graph):
    unplaced = [module for module in import_graph if module != PACKAGE and _layer(module) is None]
    assert not unplaced, f"place these modules in LAYERS: {unplaced}"


def test_no_import_from_a_higher_layer(import_graph):
    wrong = []
    for module, imports in import_graph.items():
        if module == PACKAGE:
            continue  # the package's face hands names on (lazily for the pass)
        for target, line, from_face in imports:
            if target == PACKAGE:
                wrong.append(f"{module}:{line} imports from the package's face; import from the defining module")
            elif from_face:
                wrong.append(f"{module}:{line} imports from its package's face {target}; import the module itself")
            elif None not in (_layer(target), _layer(module)) and _layer(target) > _layer(module):
                wrong.append(
                    f"{module}:{line} ({LAYER_NAMES[_layer(module)]}) imports {target} "
                    f"({LAYER_NAMES[_layer(target)]})"
                )
    assert not wrong, "\n".join(dict.fromkeys(wrong))


def test_no_import_cycles(import_graph):
    edges = {
        module: sorted({target for target, _, _ in imports if target != module and target in import_graph})
        for module, imports in import_graph.items()
        if module != PACKAGE
    }
    cycles, state, stack = [], {}, []

    def visit(module: str) -> None:
        state[module] = "open"
        stack.append(module)
        for target in edges.get(module, ()):
            if target == PACKAGE:
                continue
            if state.get(target) == "open":
                cycles.append(" -> ".join(stack[stack.index(target):] + [target]))
            elif target not in state:
                visit(target)
        stack.pop()
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_one_list_of_targets():
    from fuzz.checks import TARGETS as FUZZED
    from ort_rmsnorm import contract
    from ort_rmsnorm.rewrites import TARGETS

    assert tuple(TARGETS) == contract.TARGETS == tuple(FUZZED)
    assert all(target.name == name for name, target in TARGETS.items())
    known = {*contract.NORM_OPS, *contract.SKIP_NORM_OPS}
    for target in TARGETS.values():
        assert set(target.emits) <= known and set(target.converts) <= known, target.name
        # A target converts only ops it does not write, but auto, which chooses between them per norm.
        assert target.name == contract.AUTO or not set(target.converts) & set(target.emits), target.name


def test_target_names_are_compared_only_where_targets_are_defined():
    """The rules ask their target (``Target.skip``, ``converts``, ``opset``...), never its name."""
    from ort_rmsnorm import contract

    names = set(contract.TARGETS)
    spellings = {"CUSTOM", "ONNX", "ORT", "TARGETS"}
    wrong = []
    for module, path in _installed_modules().items():
        if module == f"{PACKAGE}.rewrites._target_list" or module == f"{PACKAGE}.contract":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Compare):
                continue
            operands = [node.left, *node.comparators]
            if any(isinstance(operand, ast.Constant) and operand.value in names for operand in operands) and any(
                isinstance(operand, ast.Attribute) and operand.attr in ("name", "target") for operand in operands
            ) or any(isinstance(operand, ast.Name) and operand.id in spellings for operand in operands):
                wrong.append(f"{module}:{node.lineno}")
    assert not wrong, f"target names compared outside rewrites/_target_list.py: {wrong}"


_IMPORTED_BY = """
import sys
from ort_rmsnorm.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
heavy = sorted(name for name in ("onnxscript", "torch", "transformers", "matplotlib") if name in sys.modules)
print("imported:", *heavy)
"""


@pytest.mark.parametrize("args", [["--help"], ["info"], ["fuse", "--help"], ["verify", "--help"]])
def test_cheap_commands_import_neither_the_pass_nor_torch(args, tmp_path):
    completed = subprocess.run([sys.executable, "-c", _IMPORTED_BY, *args], capture_output=True, text=True,
                               cwd=tmp_path, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines()[-1] == "imported:", completed.stdout
