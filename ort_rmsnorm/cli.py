"""The ``ort-rmsnorm`` command line: ``fuse``, ``verify``, ``demo``, ``bench``, ``info``, ``tool``.

Each subcommand is a :class:`Command`: a function that adds its arguments to its parser and a function that runs it
and returns the exit status (:mod:`ort_rmsnorm.command_line`: errors on one line, exit statuses). Heavy modules
are imported only by the subcommands that need them: only the subcommand named on the command line gets its
arguments added (some read their defaults from the modules that run them), so ``--help``, ``--version`` and
``fuse --help`` import neither numpy nor onnxruntime.
"""

from __future__ import annotations

import argparse
import dataclasses
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


def parse_dims(items: Sequence[str]) -> dict[str, int]:
    dims = {}
    for item in items:
        name, value = _name_value(item, "--dim")
        if not value.isdigit():
            raise UsageError(f"--dim {item!r}: the size must be a non-negative integer")
        dims[name] = int(value)
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


def run_verification(original: Path, fused: Path, inputs: VerificationInputs, args: argparse.Namespace) -> int:
    from . import verify

    if original.is_dir():
        return run_folder_verification(original, fused, inputs, args)
    try:
        result = verify.verify(original, fused, dims=inputs.dims, inputs=inputs.arrays, seed=args.seed,
                               optimization=args.optimization)
    except verify.FusedModelError as error:
        print(printable_lines(f"verify: MISMATCH: {error}"))
        return EXIT_MISMATCH
    print(printable_lines(result.describe(args.verbose)))
    return EXIT_OK if result.ok else EXIT_MISMATCH


def run_folder_verification(original: Path, fused: Path, inputs: VerificationInputs, args: argparse.Namespace) -> int:
    from .folders import verify_folder

    result = verify_folder(original, fused, dims=inputs.dims, inputs=inputs.arrays, seed=args.seed,
                           optimization=args.optimization, follow_symlinks=args.follow_symlinks,
                           progress=Progress(args.quiet).stage)
    print(printable_lines(result.describe(args.verbose)))
    return EXIT_OK if result.ok else EXIT_MISMATCH


# --- fuse ---------------------------------------------------------------------------------------------------------


def add_fuse_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", type=Path, metavar="IN",
                        help="model to fuse (IN.onnx), or a folder of models: an onnxruntime-genai folder or any "
                             "folder of .onnx files (never modified)")
    parser.add_argument("destination", type=_output_file, metavar="OUT",
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
    parser.add_argument("--report", type=_output_file, metavar="REPORT.json",
                        help="write the fusion report as JSON (for a folder: one report, per model)")
    parser.add_argument("--replace", action="store_true",
                        help="for a folder: replace an output folder that fuse wrote (it carries ort-rmsnorm.json "
                             "and nothing else was added to it); any other non-empty folder is refused")
    add_follow_symlinks_argument(parser)
    parser.add_argument("--verify", action="store_true",
                        help="then run IN and OUT on the same inputs and compare (as `verify`)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    add_verify_input_arguments(parser)


def run_fuse(args: argparse.Namespace) -> int:
    if not args.verify and (args.dim or args.inputs):
        raise UsageError("--dim and --input only set the inputs of --verify: add --verify, or leave them out")
    if args.verify and args.through_qdq:
        raise UsageError("--verify compares OUT with IN within float tolerances, and --through-qdq drops roundings "
                         "that IN makes (quantization steps): compare OUT with the model before quantization "
                         "instead (docs/fusion.md, \"Quantized models\")")
    verification_inputs = read_verification_inputs(args) if args.verify else None
    if args.source.is_dir():
        return run_fuse_folder(args, verification_inputs)
    if args.replace:
        raise UsageError("--replace is for folders (IN is a folder); an existing OUT.onnx is replaced anyway")
    if args.follow_symlinks:
        raise UsageError("--follow-symlinks is for folders (IN is a folder); a model file is read through its links")
    from .fusion import fuse_file  # the pass (onnxscript) is imported after the input checks, which fail fast

    note_leftover_temporaries(args.destination)
    progress = Progress(args.quiet)
    fused = fuse_file(args.source, args.destination, args.target, report_path=args.report,
                      allow_opset_upgrade=args.convert_opset, through_qdq=args.through_qdq,
                      progress=progress.stage, on_tensor_written=progress.tensors_written, wording=for_cli)
    progress.stage("done")

    print(printable_lines(for_cli(fused.report.summary())))
    print(f"wrote {args.destination}" + (f" (external data: {fused.data_file})" if fused.data_file else "")
          + (f", report {args.report}" if args.report is not None else ""))
    if not args.verify:
        return EXIT_OK
    progress.stage(f"verifying {args.destination} against {args.source}")
    return run_verification(args.source, args.destination, verification_inputs, args)


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


def run_fuse_folder(args: argparse.Namespace, verification_inputs: VerificationInputs | None) -> int:
    from . import folders, model_io

    if args.report is not None:
        for folder in (args.source, args.destination):
            if folders.inside(args.report.resolve(), folder.resolve()):
                raise UsageError(f"--report {args.report}: may not be inside the input or output folder {folder}")
        model_io.check_output_path(args.report, [], external_data=False)
    note_leftover_temporaries(args.destination)
    progress = Progress(args.quiet)
    report = folders.fuse_folder(args.source, args.destination, args.target, replace=args.replace,
                                 follow_symlinks=args.follow_symlinks, allow_opset_upgrade=args.convert_opset,
                                 through_qdq=args.through_qdq,
                                 progress=progress.stage, on_tensor_written=progress.tensors_written)
    if args.report is not None:
        model_io.write_text_atomically(args.report, for_cli(report.to_json()))
    print(printable_lines(for_cli(report.summary())))
    print(printable_lines(f"wrote {args.destination}" + (f", report {args.report}" if args.report is not None
                                                          else "")))
    if not args.verify:
        return EXIT_OK
    progress.stage(f"verifying {args.destination} against {args.source}")
    return run_folder_verification(args.source, args.destination, verification_inputs, args)


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
    if args.follow_symlinks and not args.original.is_dir():
        raise UsageError("--follow-symlinks is for folders (ORIGINAL is a folder)")
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
    if args.keep is not None:
        make_directory("--keep", args.keep)
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

    return run_checked(args)


COMMANDS = [
    Command("fuse", "fuse the decomposed RMSNorms of a model", add_fuse_arguments, run_fuse),
    Command("verify", "compare a fused model's outputs with the original's", add_verify_arguments, run_verify),
    Command("demo", "a small int4 Llama-style model: fuse, verify, time and profile it before and after",
            add_demo_arguments, run_demo),
    Command("bench", BENCH_HELP, add_bench_arguments, run_bench),
    Command("info", "library path, build info, the kernels in use, versions", add_info_arguments, run_info),
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
