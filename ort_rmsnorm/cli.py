"""The ``ort-rmsnorm`` command line: ``fuse``, ``verify``, ``demo``, ``bench``, ``info``, ``tune``, ``tool``.

Each subcommand is a :class:`Command`: a function that adds its arguments to its parser and a function that runs it
and returns the exit status (:mod:`ort_rmsnorm.command_line`: errors on one line, exit statuses). Heavy modules
are imported only by the subcommands that need them: only the subcommand named on the command line gets its
arguments added (some read their defaults from the modules that run them), so ``--help``, ``--version`` and
``fuse --help`` import neither numpy nor onnxruntime.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import Callable, Sequence

from .command_line import (
    EXIT_MISMATCH,
    EXIT_OK,
    EXIT_USAGE,
    PROG,
    Parser,
    Progress,
    UsageError,
    exit_with,
    for_cli,
    make_directory,
    printable,
    printable_lines,
    run_program,
)
from .bench.about import HELP as BENCH_HELP
from .contract import DEFAULT_TARGET, OPTIMIZATION_LEVEL_NAMES, TARGETS
from .schemas import register_schemas

__all__ = ["COMMANDS", "EXIT_MISMATCH", "EXIT_OK", "EXIT_USAGE", "Command", "build_parser", "console_main", "main"]


@dataclasses.dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


# --- options shared by fuse --verify and verify -------------------------------------------------------------------


def _name_value(text: str, option: str) -> tuple[str, str]:
    name, separator, value = text.partition("=")
    if not separator or not name or not value:
        raise UsageError(f"{option} {text!r}: expected NAME=VALUE")
    return name, value


_MAX_DIM_DIGITS = 19
"""No dim's size has more digits (numpy's largest, 2**63 - 1, has 19): a longer one is refused before it is converted
(:data:`ort_rmsnorm.feeds.MAX_DIM_SIZE` bounds the value when the inputs are made)."""


def parse_dims(items: Sequence[str]) -> dict[str, int]:
    dims = {}
    for item in items:
        name, value = _name_value(item, "--dim")
        if not (value.isascii() and value.isdigit()):
            raise UsageError(f"--dim {printable(item[:100])!r}: the size must be a non-negative integer")
        significant = value.lstrip("0") or "0"
        if len(significant) > _MAX_DIM_DIGITS:
            raise UsageError(f"--dim {printable(name[:100])}: the size has {len(significant)} digits, more than any "
                             "dim's size")
        dims[name] = int(significant)
    return dims


def _seed(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative integer")
    return int(text)


def _output_file(text: str) -> Path:
    """An output path (a file, or a folder to be made) whose directory exists: checked as the arguments are read,
    before any model is loaded."""
    path = Path(text)
    if text and not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{path}: the directory {path.parent} does not exist")
    return path


def _output_text(text: str) -> str:
    """OUT as given (:func:`_output_file`'s checks): a trailing ``/`` says a folder is meant, which a Path drops."""
    _output_file(text)
    return text


REPORT_TO_STDOUT = "-"
"""``--report -``: the report is printed on stdout (the other lines go to stderr)."""
_STDOUT_SPELLINGS = (REPORT_TO_STDOUT, "/dev/stdout", "/proc/self/fd/1")


def _report_output(text: str) -> Path | str:
    """``--report``: a file (:func:`_output_file`), or :data:`REPORT_TO_STDOUT` for ``-`` and ``/dev/stdout``, which
    name the standard output: the report is printed there, never a file renamed over the link."""
    return REPORT_TO_STDOUT if text in _STDOUT_SPELLINGS else _output_file(text)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _check_input(path: Path, what: str) -> None:
    """A missing input is said at once, before the seconds of imports and loading that precede reading it."""
    if not os.path.lexists(path):
        raise UsageError(f"{path}: no such file or folder ({what})")
    if not path.exists():
        raise UsageError(f"{path}: a symbolic link to nothing ({what})")


def add_verify_input_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("verification inputs")
    group.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                       help="size of a symbolic input dim (default: batch 2, *past* 0, others 4); repeatable")
    group.add_argument("--input", dest="inputs", action="append", default=[], metavar="NAME=FILE.npy",
                       help="use this array for an input instead of generated values; repeatable")
    group.add_argument("--seed", type=_seed, default=0, help="seed of the generated inputs (default 0)")
    group.add_argument("--optimization", choices=OPTIMIZATION_LEVEL_NAMES, default="all",
                       help="onnxruntime graph optimizations for both sessions (default all)")
    group.add_argument("--verbose", action="store_true",
                       help="print every norm's verdict (default: a summary line, and the norms that differ)")


@dataclasses.dataclass
class VerificationInputs:
    dims: dict[str, int]
    arrays: dict  # input name -> numpy array


def read_verification_inputs(args: argparse.Namespace) -> VerificationInputs:
    """Parses --dim and reads --input files; done before any other work, so that mistakes show at once."""
    from .feeds import load_npy_inputs

    return VerificationInputs(parse_dims(args.dim),
                              load_npy_inputs(dict(_name_value(item, "--input") for item in args.inputs)))


def run_verification(original: Path, fused: Path, inputs: VerificationInputs, args: argparse.Namespace,
                     out=None) -> int:
    """Compares and prints the result on ``out`` (default stdout)."""
    from . import verify

    if original.is_dir():
        return run_folder_verification(original, fused, inputs, args, out)
    try:
        result = verify.verify(original, fused, dims=inputs.dims, inputs=inputs.arrays, seed=args.seed,
                               optimization=args.optimization)
    except verify.FusedModelError as error:
        print(printable_lines(f"verify: MISMATCH: {error}"), file=out)
        return EXIT_MISMATCH
    print(printable_lines(result.describe(args.verbose)), file=out)
    return EXIT_OK if result.ok else EXIT_MISMATCH


def run_folder_verification(original: Path, fused: Path, inputs: VerificationInputs, args: argparse.Namespace,
                            out=None) -> int:
    from .folders import verify_folder

    result = verify_folder(original, fused, dims=inputs.dims, inputs=inputs.arrays, seed=args.seed,
                           optimization=args.optimization, follow_symlinks=args.follow_symlinks,
                           progress=Progress(args.quiet).stage)
    print(printable_lines(result.describe(args.verbose)), file=out)
    return EXIT_OK if result.ok else EXIT_MISMATCH


# --- fuse ---------------------------------------------------------------------------------------------------------


def add_fuse_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", type=Path, metavar="IN",
                        help="model to fuse (IN.onnx), or a folder of models: an onnxruntime-genai folder or any "
                             "folder of .onnx files (never modified)")
    parser.add_argument("destination", type=_output_text, metavar="OUT",
                        help="fused model, written atomically, external data going to OUT.onnx.data; for a folder, "
                             "the output folder, written atomically, which must not exist or be empty (or, with "
                             "--replace, be a folder fuse wrote)")
    parser.add_argument("--target", choices=TARGETS, default=DEFAULT_TARGET,
                        help="custom: ort_rmsnorm.RMSNorm/SkipRMSNorm (default); onnx: RMSNormalization (opset 23); "
                             "ort: onnxruntime's SimplifiedLayerNormalization; auto: per norm the faster of ours and "
                             "onnxruntime's; decomposed: plain ONNX ops (undoes a fusion)")
    parser.add_argument("--convert-opset", action="store_true",
                        help="with --target onnx: convert a model below opset 23 to opset 23")
    parser.add_argument("--through-qdq", action="store_true",
                        help="fuse norms across the QuantizeLinear/DequantizeLinear pairs inside them (int8 QDQ "
                             "models), dropping those roundings; the pairs at a norm's input and output stay")
    parser.add_argument("--report", type=_report_output, metavar="REPORT.json",
                        help="write the fusion report as JSON (for a folder: one report, per model); `-` or "
                             "/dev/stdout: print it on stdout, the other lines going to stderr")
    parser.add_argument("--replace", action="store_true",
                        help="for a folder: replace an output folder that fuse wrote (it carries ort-rmsnorm.json "
                             "and nothing else was added to it); any other non-empty folder is refused")
    add_follow_symlinks_argument(parser)
    parser.add_argument("--verify", action="store_true",
                        help="then run IN and OUT on the same inputs and compare (as `verify`)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    add_verify_input_arguments(parser)


def check_forced_cpu_isa() -> None:
    """A forced kernel set the library refuses, named as such before any work or output (sessions would fail on it
    with the first model's name)."""
    from ._library import CPU_ISA_ENV, forced_cpu_isa_problem

    problem = forced_cpu_isa_problem()
    if problem is not None:
        raise UsageError(f"{problem}: unset {CPU_ISA_ENV} to let the library choose, or force a set "
                         f"`{PROG} info` lists (docs/ops.md)")


def run_fuse(args: argparse.Namespace) -> int:
    if not args.verify and (args.dim or args.inputs):
        raise UsageError("--dim and --input only set the inputs of --verify: add --verify, or leave them out")
    if args.verify and args.through_qdq:
        raise UsageError("--verify compares OUT with IN within float tolerances, and --through-qdq drops roundings "
                         "that IN makes (quantization steps): compare OUT with the model before quantization "
                         "instead (docs/fusion.md, \"Quantized models\")")
    parse_dims(args.dim)  # its mistakes first, then the input's
    _check_input(args.source, "IN")
    destination_text = args.destination
    args.destination = Path(destination_text)
    if args.source.is_dir():
        if args.destination.suffix.lower() == ".onnx":
            raise UsageError(f"{args.destination}: IN is a folder, so OUT is the output folder, and this names a "
                             f".onnx file; name a folder (e.g. {args.destination.with_suffix('')}-fused)")
    elif os.path.basename(destination_text) in ("", ".", ".."):  # a trailing / (which Path drops), . or ..
        raise UsageError(f"{destination_text}: IN is a model file, so OUT is the fused model file, and this names a "
                         f"folder; name a file (e.g. {args.destination / args.source.name})")
    from .durable import output_problem  # a leaf: no onnx, so these are said at once too

    for option, path in (("OUT", None if args.source.is_dir() else args.destination),
                         ("--report", args.report if args.report != REPORT_TO_STDOUT else None)):
        problem = output_problem(path) if path is not None and not _same_file(path, args.source) else None
        if problem is not None:  # (one that is the input is refused as such, later)
            raise UsageError(f"{option} {path}: {problem}; an output is written as a new file renamed into place, "
                             "which would replace it: name a regular file or a new path")
    register_schemas()
    verification_inputs = read_verification_inputs(args) if args.verify else None
    if args.verify:
        check_forced_cpu_isa()
    out = sys.stderr if args.report == REPORT_TO_STDOUT else sys.stdout
    if args.source.is_dir():
        return run_fuse_folder(args, verification_inputs, out)
    if args.replace:
        raise UsageError("--replace is for folders (IN is a folder); an existing OUT.onnx is replaced anyway")
    if args.follow_symlinks:
        raise UsageError("--follow-symlinks is for folders (IN is a folder); a model file is read through its links")
    from .fusion import fuse_file  # the pass (onnxscript) is imported after the input checks, which fail fast

    note_leftover_temporaries(args.destination)
    progress = Progress(args.quiet)
    report_file = args.report if args.report != REPORT_TO_STDOUT else None
    fused = fuse_file(args.source, args.destination, args.target, report_path=report_file,
                      allow_opset_upgrade=args.convert_opset, through_qdq=args.through_qdq,
                      progress=progress.stage, on_tensor_written=progress.tensors_written, wording=for_cli)
    progress.stage("done")

    if args.report == REPORT_TO_STDOUT:
        print(for_cli(fused.report.to_json()), flush=True)
    print(printable_lines(for_cli(fused.report.summary())), file=out)
    print(printable(f"wrote {args.destination}" + (f" (external data: {fused.data_file})" if fused.data_file else "")
                    + (f", report {report_file}" if report_file is not None else "")), file=out)
    if not args.verify:
        return EXIT_OK
    progress.stage(f"verifying {args.destination} against {args.source}")
    return run_verification(args.source, args.destination, verification_inputs, args, out)


def add_follow_symlinks_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--follow-symlinks", action="store_true",
                        help="for a folder: also read through symbolic links that lead out of it to regular files "
                             "or folders (a Hugging Face cache snapshot, whose files link to ../../blobs/); without "
                             "it such links are refused, and device files, FIFOs, sockets and link loops always are")


def note_leftover_temporaries(destination: Path) -> None:
    """A note on stderr for each temporary of ``destination`` already there. They are not removed: one left by a
    killed run looks the same as one a run writing the same output right now is using."""
    from .durable import leftover_temporaries

    for path in leftover_temporaries(destination):
        print(printable(f"{PROG} fuse: note: {path}: a temporary left by an interrupted run (or one writing "
                        f"{destination} now); remove it when no run is writing there"), file=sys.stderr)


def run_fuse_folder(args: argparse.Namespace, verification_inputs: VerificationInputs | None, out) -> int:
    from . import folders
    from .model.write import check_output_path

    report_file = args.report if args.report != REPORT_TO_STDOUT else None
    if report_file is not None:
        for folder in (args.source, args.destination):
            if folders.inside(report_file.resolve(), folder.resolve()):
                raise UsageError(f"--report {report_file}: may not be inside the input or output folder {folder}")
        check_output_path(report_file, [], external_data=False)
    if args.verify:  # the sizes verify takes from the config, checked before anything is written
        from .folders.verify import check_verification_config

        check_verification_config(args.source, follow_symlinks=args.follow_symlinks)
    note_leftover_temporaries(args.destination)
    progress = Progress(args.quiet)
    report = folders.fuse_folder(args.source, args.destination, args.target, replace=args.replace,
                                 follow_symlinks=args.follow_symlinks, allow_opset_upgrade=args.convert_opset,
                                 through_qdq=args.through_qdq,
                                 progress=progress.stage, on_tensor_written=progress.tensors_written,
                                 report_path=report_file, wording=for_cli)
    if args.report == REPORT_TO_STDOUT:
        print(for_cli(report.to_json()), flush=True)
    print(printable_lines(for_cli(report.summary())), file=out)
    print(printable_lines(f"wrote {args.destination}" + (f", report {report_file}" if report_file is not None
                                                          else "")), file=out)
    if not args.verify:
        return EXIT_OK
    progress.stage(f"verifying {args.destination} against {args.source}")
    return run_folder_verification(args.source, args.destination, verification_inputs, args, out)


# --- verify -------------------------------------------------------------------------------------------------------


def add_verify_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("original", type=Path, metavar="ORIGINAL",
                        help="the original model (ORIGINAL.onnx), or the original folder")
    parser.add_argument("fused", type=Path, metavar="FUSED",
                        help="the fused model, or the folder `fuse` wrote: each of its models is compared")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr (folders)")
    add_follow_symlinks_argument(parser)
    add_verify_input_arguments(parser)


def run_verify(args: argparse.Namespace) -> int:
    parse_dims(args.dim)  # its mistakes first, then the inputs'
    _check_input(args.original, "ORIGINAL")
    _check_input(args.fused, "FUSED")
    if args.follow_symlinks and not args.original.is_dir():
        raise UsageError("--follow-symlinks is for folders (ORIGINAL is a folder)")
    check_forced_cpu_isa()
    register_schemas()
    return run_verification(args.original, args.fused, read_verification_inputs(args), args)


# --- demo ---------------------------------------------------------------------------------------------------------


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    from .demo import BUILDERS, DEMO_CONFIG, QUANTIZATIONS  # imports neither torch nor onnxscript

    parser.add_argument("--builder", choices=BUILDERS, default="auto",
                        help="torch: export with torch's dynamo exporter; onnx: build with onnx.helper in the same "
                             "spelling; auto (default): torch when it is installed")
    parser.add_argument("--dtype", choices=["float32", "float16"], default="float32")
    parser.add_argument("--quantize", choices=QUANTIZATIONS, default="int4",
                        help="int4 (default): quantize the MatMuls with onnxruntime's MatMulNBitsQuantizer before "
                             "fusing; none: time the float model")
    parser.add_argument("--layers", type=int, default=DEMO_CONFIG.num_layers,
                        help=f"decoder layers (default {DEMO_CONFIG.num_layers})")
    parser.add_argument("--hidden", type=int, default=DEMO_CONFIG.hidden_size,
                        help=f"hidden size (default {DEMO_CONFIG.hidden_size})")
    parser.add_argument("--sequence", type=int, default=256, help="prefill length timed (default 256)")
    parser.add_argument("--runs", type=int, default=15, help="timed prefill runs per model (default 15)")
    parser.add_argument("--decode-runs", type=int, default=300, help="timed decode runs per model (default 300)")
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads (default 1: timed with the calling thread's CPU time)")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="write the models to DIR and keep them")


def run_demo(args: argparse.Namespace) -> int:
    from . import demo

    for option in ("layers", "hidden", "sequence", "runs", "decode_runs", "threads"):
        if getattr(args, option) < 1:
            raise UsageError(f"--{option.replace('_', '-')} must be at least 1")
    if args.builder == "torch" and not demo.torch_available():
        raise UsageError("--builder torch: torch is not installed (pip install torch), or use --builder onnx")
    defaults = demo.DEMO_CONFIG
    if args.hidden % defaults.num_heads:
        raise UsageError(f"--hidden must be a multiple of the {defaults.num_heads} attention heads")
    check_forced_cpu_isa()
    if args.keep is not None:
        make_directory("--keep", args.keep)
    register_schemas()
    config = dataclasses.replace(defaults, num_layers=args.layers, hidden_size=args.hidden,
                                 intermediate_size=args.hidden * defaults.intermediate_size // defaults.hidden_size)
    return demo.run_demo(config, dtype=args.dtype, builder=args.builder, quantization=args.quantize,
                         sequence=args.sequence, runs=args.runs, decode_runs=args.decode_runs, threads=args.threads,
                         directory=args.keep)


# --- info ---------------------------------------------------------------------------------------------------------


def add_info_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # no options


def run_info(args: argparse.Namespace) -> int:
    import importlib.metadata
    import platform

    import onnxruntime

    from ._library import build_info, cpu_kernel_set, get_library_path, package_version

    version = package_version()
    print(f"ort-rmsnorm {version}")
    print(f"library: {get_library_path()}")
    info = build_info()
    for key, value in info.items():
        print(f"  {key}: {value}")
    if info.get("version") != version:
        print(f"  (this library was built as version {info.get('version')}, not the package's {version})")
    kernels, how = cpu_kernel_set()
    print(f"CPU kernels in use: {kernels} ({how})" if kernels else f"CPU kernels in use: none: {how}")
    providers = onnxruntime.get_available_providers()
    print(_cuda_line(bool(info.get("cuda")), "CUDAExecutionProvider" in providers, info.get("cuda_architectures")))
    print(f"onnxruntime {onnxruntime.__version__} (providers: {', '.join(providers)})")
    for package in ("onnx", "onnxscript", "onnx-ir", "numpy", "torch"):
        try:
            print(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            print(f"{package}: not installed")
    print(f"python {platform.python_version()} ({sys.executable})")
    from .schemas import schema_note

    print(f"onnx schemas: {schema_note()}")
    return EXIT_OK


# --- tune ---------------------------------------------------------------------------------------------------------


def _sizes(text: str) -> list[int]:
    sizes = [item.strip() for item in text.split(",")]
    if not all(item.isdigit() and 0 < int(item) <= 1 << 20 for item in sizes):
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated row lengths from 1 to {1 << 20}")
    return [int(item) for item in sizes]


def _dtypes(text: str) -> list[str]:
    dtypes = [item.strip() for item in text.split(",")]
    if not all(item in ("float32", "float16") for item in dtypes):
        raise argparse.ArgumentTypeError(f"{text!r}: expected float32, float16 or both, comma-separated")
    return dtypes


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def add_tune_arguments(parser: argparse.ArgumentParser) -> None:
    from .auto_table import ENV

    parser.add_argument("--output", metavar="PATH",
                        help="where to write the table (default: $XDG_CONFIG_HOME/ort-rmsnorm/auto-table.json, or "
                             f"${ENV}); '-' prints it only")
    parser.add_argument("--hidden", type=_sizes, metavar="H,H,...",
                        help="row lengths to measure, shortest first (default 64 ... 8192; --quick: 64,256,576,1024,"
                             "2048)")
    parser.add_argument("--dtypes", type=_dtypes, default=["float32", "float16"], metavar="TYPES",
                        help="float32, float16 or both (default both)")
    parser.add_argument("--quick", action="store_true", help="fewer lengths and rounds: about half a minute")
    parser.add_argument("--rounds", type=_positive, default=None, help="rounds per length (default 7; --quick 5)")
    parser.add_argument("--runs", type=_positive, default=10, help="runs per round and contender (default 10)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def run_tune(args: argparse.Namespace) -> int:
    from .auto_table import machine_table_path
    from .bench import tune

    from .durable import output_problem

    destination = None if args.output == "-" else Path(args.output) if args.output else machine_table_path()
    if destination is not None and (problem := output_problem(destination)) is not None:
        raise UsageError(f"--output {destination}: {problem}; the table is written as a new file renamed into place")
    register_schemas()
    hidden = args.hidden or (tune.QUICK_HIDDEN if args.quick else tune.DEFAULT_HIDDEN)
    rounds = args.rounds or (5 if args.quick else 7)
    progress = Progress(args.quiet)
    progress.stage(f"tune: our ops against onnxruntime's, cold after a MatMul, one thread ({tune.load_line()})")
    table, _cells = tune.measure(hidden, args.dtypes, rounds=rounds, runs=args.runs,
                                 weight_mib=tune.DEFAULT_WEIGHT_MIB, progress=progress.stage)
    progress.stage(f"tune: done ({tune.load_line()})")
    print(f"auto's table, {table.measured_on}:")
    print("\n".join(tune.describe(table)))
    if destination is None:
        print(tune.text(table).rstrip())
        return EXIT_OK
    try:
        tune.write(table, destination)
    except OSError as error:
        raise UsageError(f"--output {destination}: cannot write it: {error.strerror or error}") from None
    print(f"wrote {destination}: the auto target reads it from now on (ORT_RMSNORM_AUTO_TABLE=shipped ignores it)")
    return EXIT_OK


# --- tool ---------------------------------------------------------------------------------------------------------


def add_tool_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("module", metavar="MODULE",
                        help="the tool's module, run as `python -m MODULE`, e.g. onnxruntime.quantization.preprocess")
    parser.add_argument("args", nargs=argparse.REMAINDER, metavar="ARG", help="the tool's arguments")


def run_tool(args: argparse.Namespace) -> int:
    from .tooling import run_tool as run

    try:
        return run(args.module, args.args)
    except ModuleNotFoundError as error:
        if error.name != args.module:
            raise  # the tool's own missing import: its traceback tells what to install
        raise UsageError(str(error)) from None


def _cuda_line(built: bool, provider: bool, architectures: str | None) -> str:
    """Whether the CUDA kernels can run here: they need both a CUDA build of the library and onnxruntime-gpu."""
    if built and provider:
        return (f"CUDA kernels: built (architectures {architectures}); this onnxruntime has CUDAExecutionProvider, so "
                "sessions using it run them (a GPU and a driver for the library's CUDA version are needed)")
    if built:
        return (f"CUDA kernels: built (architectures {architectures}), but this onnxruntime has no "
                "CUDAExecutionProvider: they cannot run here (that needs onnxruntime-gpu instead of onnxruntime)")
    if provider:
        return ("CUDA kernels: not built, though this onnxruntime has CUDAExecutionProvider: the norms of sessions "
                "on the GPU run on the CPU (reinstall with onnxruntime-gpu installed, or with "
                "CMAKE_ARGS=-DORT_RMSNORM_CUDA=ON)")
    return "CUDA kernels: not built (this onnxruntime has no CUDAExecutionProvider to run them either)"


# --- bench --------------------------------------------------------------------------------------------------------


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    from .bench.arguments import add_bench_arguments as add  # imports neither torch nor onnxscript

    add(parser)


def run_bench(args: argparse.Namespace) -> int:
    from .bench.command import run_checked

    check_forced_cpu_isa()
    return run_checked(args)


COMMANDS = [
    Command("fuse", "fuse the decomposed RMSNorms of a model", add_fuse_arguments, run_fuse),
    Command("verify", "compare a fused model's outputs with the original's", add_verify_arguments, run_verify),
    Command("demo", "a small int4 Llama-style model: fuse, verify, time and profile it before and after",
            add_demo_arguments, run_demo),
    Command("bench", BENCH_HELP, add_bench_arguments, run_bench),
    Command("info", "library path, build info, the kernels in use, versions", add_info_arguments, run_info),
    Command("tune", "measure where onnxruntime's norm ops beat ours on this CPU, for the auto target",
            add_tune_arguments, run_tune),
    Command("tool", "run a Python tool (python -m MODULE) with the library in every onnxruntime session it opens",
            add_tool_arguments, run_tool),
    # A new subcommand is one more entry here: Command(name, help, add_<name>_arguments, run_<name>).
]


# --- the parser ---------------------------------------------------------------------------------------------------


class _VersionAction(argparse.Action):
    """``--version``: the package's version, looked up only when asked."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from ._library import package_version

        print(f"{PROG} {package_version()}")
        parser.exit()


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser. With ``argv``, only the subcommand it names gets its arguments: adding them imports what that
    subcommand's defaults come from, which ``--help`` and the other subcommands need not pay for."""
    parser = Parser(prog=PROG, description="Fused RMSNorm for ONNX Runtime.")
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # Top-level options take no values, so the first word that is no option names the subcommand.
    named = next((word for word in argv if not str(word).startswith("-")), None) if argv is not None else None
    for command in COMMANDS:
        subparser = subparsers.add_parser(command.name, help=command.help, description=command.help)
        if argv is None or command.name == named:
            command.add_arguments(subparser)
        subparser.set_defaults(run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_program(build_parser, argv, PROG, lambda args: f"{PROG} {args.command}")


def console_main() -> None:
    """The program's entry point (``ort-rmsnorm``, ``python -m ort_rmsnorm.cli``): :func:`main`'s status as the
    process's (:func:`ort_rmsnorm.command_line.exit_with`)."""
    exit_with(main())


if __name__ == "__main__":
    console_main()
