"""The layouts of model folders this package knows, and the ONNX files to fuse in each.

- an **onnxruntime-genai folder** (it has ``genai_config.json``, as onnxruntime-genai's model builder writes it):
  every ONNX file the config names (``model.decoder.filename``, and the ``filename`` of the embedding, vision,
  speech, encoder and pipeline sections where present) is fused; any other file is copied as it is;
- any other **folder of ``.onnx`` files** (an optimum-onnx export: ``model.onnx``, ``decoder_model_merged.onnx``,
  ...): every ``.onnx`` file in the folder or below it is fused, everything else copied.

In a genai folder each section's session options are its own, or the decoder's, which onnxruntime-genai uses for a
section without its own (:meth:`Layout.session_options_key`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

from ..model_io import ModelFileError

GENAI_CONFIG = "genai_config.json"
LIBRARY_KEY = "custom_ops_library"
SESSION_OPTIONS = "session_options"
DECODER_KEY = "model.decoder"
KIND_GENAI = "onnxruntime-genai"
KIND_ONNX = "onnx"
ONNX_SUFFIX = ".onnx"


class FolderError(ModelFileError):
    """A folder cannot be fused or verified as asked; the message names the folder or file and the problem."""


@dataclasses.dataclass
class Component:
    """One ONNX file of a folder that is fused."""

    path: str
    """Relative to the folder, with ``/`` separators."""
    config_keys: list[str] = dataclasses.field(default_factory=list)
    """Genai folders: the config sections naming the file (``model.decoder``, ``model.vision``,
    ``model.decoder.pipeline[0]``)."""


@dataclasses.dataclass
class Layout:
    kind: str
    """:data:`KIND_GENAI` or :data:`KIND_ONNX`."""
    root: Path
    components: list[Component]
    config: dict | None = None
    """The parsed ``genai_config.json`` of a genai folder."""

    def session_options_key(self, config_key: str) -> str:
        """Where the session options of the section ``config_key`` are: its own, or the decoder's that
        onnxruntime-genai uses for a section without its own."""
        own = section(self.config, config_key)
        if config_key == DECODER_KEY or isinstance(own.get(SESSION_OPTIONS), dict):
            return f"{config_key}.{SESSION_OPTIONS}"
        return f"{DECODER_KEY}.{SESSION_OPTIONS}"


def section(config: dict, key: str) -> dict:
    """The object at a key such as ``model.decoder.pipeline[0]``."""
    node: Any = config
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", key):
        node = node[int(part[1:-1])] if part.startswith("[") else node[part]
    return node


def _relative_name(root: Path, name: str, where: str) -> str:
    """A file name from a config, checked to stay inside the folder."""
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise FolderError(f"{root / GENAI_CONFIG}: {where} is {name!r}, not a file name inside the folder")
    return str(path)


def _genai_components(root: Path, config: Any) -> list[Component]:
    config_path = root / GENAI_CONFIG
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise FolderError(f"{config_path}: no \"model\" object: not an onnxruntime-genai config")
    by_path: dict[str, Component] = {}

    def visit(node: Any, key: str) -> None:
        if isinstance(node, dict):
            filename = node.get("filename")
            if isinstance(filename, str) and filename.lower().endswith(ONNX_SUFFIX):
                name = _relative_name(root, filename, f"{key}.filename")
                by_path.setdefault(name, Component(name)).config_keys.append(key)
            for name, value in node.items():
                if name != SESSION_OPTIONS:
                    visit(value, f"{key}.{name}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                visit(value, f"{key}[{index}]")

    visit(config["model"], "model")
    if not by_path:
        raise FolderError(f"{config_path}: names no .onnx file (model.decoder.filename and the like)")
    for component in by_path.values():
        path = root / component.path
        if not path.is_file():
            raise FolderError(f"{config_path}: {component.config_keys[0]}.filename is {component.path!r}, but "
                              f"{path} {'is not a regular file' if path.exists() else 'does not exist'}")
    return list(by_path.values())


def read_layout(directory: str | os.PathLike) -> Layout:
    """The layout of a model folder and the ONNX files to fuse; :class:`FolderError` for a layout not known."""
    root = Path(directory)
    if not root.is_dir():
        raise FolderError(f"{root}: {'not a directory' if root.exists() else 'no such directory'}")
    config_path = root / GENAI_CONFIG
    if config_path.exists():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as error:
            raise FolderError(f"{config_path}: cannot read it: {error}") from None
        except json.JSONDecodeError as error:
            raise FolderError(f"{config_path}: not valid JSON: {error}") from None
        return Layout(KIND_GENAI, root, _genai_components(root, config), config)
    models = sorted(path for path in files_under(root) if path.lower().endswith(ONNX_SUFFIX))
    if not models:
        raise FolderError(f"{root}: neither an onnxruntime-genai folder (no {GENAI_CONFIG}) nor a folder of .onnx "
                          "models (no .onnx file in it or below it): no layout this command knows")
    return Layout(KIND_ONNX, root, [Component(path) for path in models])


def files_under(root: Path) -> Iterator[str]:
    """Relative paths of the regular files under ``root`` (symbolic links followed, each directory once)."""
    seen: set[Path] = set()
    for directory, subdirectories, names in os.walk(root, followlinks=True):
        real = Path(directory).resolve()
        if real in seen:
            subdirectories[:] = []
            continue
        seen.add(real)
        subdirectories.sort()
        for name in sorted(names):
            path = Path(directory, name)
            if path.is_file():
                yield path.relative_to(root).as_posix()
