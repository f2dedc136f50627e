"""The layouts of model folders this package knows, and the ONNX files to fuse in each.

- an **onnxruntime-genai folder** (it has ``genai_config.json``, as onnxruntime-genai's model builder writes it):
  every ONNX file the config names (``model.decoder.filename``, and the ``filename`` of the embedding, vision,
  speech, encoder and pipeline sections where present) is fused; any other file is copied as it is;
- any other **folder of ``.onnx`` files** (an optimum-onnx export: ``model.onnx``, ``decoder_model_merged.onnx``,
  ...): every ``.onnx`` file in the folder or below it is fused, everything else copied.

A folder is read under its trust boundary (:mod:`~ort_rmsnorm.folders.contents`): only regular files inside it,
links out of it only with ``follow_symlinks``; a file the config names is one of those files or refused. The config
is read with bounds (:mod:`~ort_rmsnorm.folders.genai_config`). In a genai folder each section's session options
are its own, or the decoder's, which onnxruntime-genai uses for a section without its own
(:meth:`Layout.session_options_path`).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path, PurePosixPath
from typing import Any

from . import genai_config
from .contents import Contents, FolderError, read_contents
from .genai_config import ConfigPath, path_text

GENAI_CONFIG = "genai_config.json"
LIBRARY_KEY = "custom_ops_library"
SESSION_OPTIONS = "session_options"
DECODER_PATH: ConfigPath = ("model", "decoder")
DECODER_KEY = path_text(DECODER_PATH)
KIND_GENAI = "onnxruntime-genai"
KIND_ONNX = "onnx"
ONNX_SUFFIX = ".onnx"

__all__ = ["DECODER_KEY", "DECODER_PATH", "GENAI_CONFIG", "KIND_GENAI", "KIND_ONNX", "LIBRARY_KEY", "SESSION_OPTIONS",
           "Component", "FolderError", "Layout", "read_config", "read_layout"]


@dataclasses.dataclass
class Component:
    """One ONNX file of a folder that is fused."""

    path: str
    """Relative to the folder, with ``/`` separators."""
    config_paths: list[ConfigPath] = dataclasses.field(default_factory=list)
    """Genai folders: the config sections naming the file, as keys taken literally (``("model", "decoder")``)."""

    @property
    def config_keys(self) -> list[str]:
        """The sections as text (``model.decoder``, ``model.decoder.pipeline[0]``)."""
        return [path_text(path) for path in self.config_paths]


@dataclasses.dataclass
class Layout:
    kind: str
    """:data:`KIND_GENAI` or :data:`KIND_ONNX`."""
    root: Path
    components: list[Component]
    config: dict | None = None
    """The parsed ``genai_config.json`` of a genai folder."""
    contents: Contents | None = None
    """The files of the folder that may be read."""
    config_text: str | None = None
    """The config's text, as the folder holds it."""

    def session_options_path(self, config_path: ConfigPath) -> ConfigPath:
        """Where the session options of the section at ``config_path`` are: its own, or the decoder's that
        onnxruntime-genai uses for a section without its own. A ``session_options`` that is not an object is a
        :class:`FolderError`."""
        own = genai_config.get(self.config, config_path, None)
        if config_path == DECODER_PATH or (isinstance(own, dict) and SESSION_OPTIONS in own):
            where = (*config_path, SESSION_OPTIONS)
        else:
            where = (*DECODER_PATH, SESSION_OPTIONS)
        section = genai_config.get(self.config, where[:-1], None)
        if not isinstance(section, dict):
            raise FolderError(f"{self.root / GENAI_CONFIG}: {path_text(where[:-1])} is "
                              f"{_kind(section) if section is not None else 'missing'}, where onnxruntime-genai "
                              "reads the session options of the fused models from an object")
        options = section.get(SESSION_OPTIONS)
        if SESSION_OPTIONS in section and not isinstance(options, dict):
            raise FolderError(f"{self.root / GENAI_CONFIG}: {path_text(where)} is {_kind(options)}, not an object")
        return where


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(type(value), "a number")


def _relative_name(root: Path, name: str, where: str) -> str:
    """A file name from a config, checked to stay inside the folder."""
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or not path.parts or "\0" in name:
        raise FolderError(f"{root / GENAI_CONFIG}: {where} is {name!r}, not a file name inside the folder")
    return str(path)


def _genai_components(contents: Contents, config: Any) -> list[Component]:
    root = contents.root
    config_path = root / GENAI_CONFIG
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise FolderError(f"{config_path}: no \"model\" object: not an onnxruntime-genai config")
    by_path: dict[str, Component] = {}
    stack: list[tuple[Any, ConfigPath]] = [(config["model"], ("model",))]
    while stack:  # in document order
        node, where = stack.pop()
        if isinstance(node, dict):
            filename = node.get("filename")
            if isinstance(filename, str) and filename.lower().endswith(ONNX_SUFFIX):
                name = _relative_name(root, filename, f"{path_text(where)}.filename")
                by_path.setdefault(name, Component(name)).config_paths.append(where)
            stack.extend(reversed([(value, (*where, key)) for key, value in node.items() if key != SESSION_OPTIONS]))
        elif isinstance(node, list):
            stack.extend(reversed([(value, (*where, index)) for index, value in enumerate(node)]))
    if not by_path:
        raise FolderError(f"{config_path}: names no .onnx file (model.decoder.filename and the like)")
    for component in by_path.values():
        if contents.entry(component.path) is None:
            path = contents.path(component.path)
            problem = "is not a regular file" if os.path.lexists(path) else "does not exist"
            raise FolderError(f"{config_path}: {component.config_keys[0]}.filename is {component.path!r}, but "
                              f"{path} {problem}")
    return list(by_path.values())


def read_config(contents: Contents) -> tuple[Any, str]:
    """The folder's ``genai_config.json``, parsed with bounds, and its text."""
    config_path = contents.path(GENAI_CONFIG)
    data = contents.read_bytes(GENAI_CONFIG, genai_config.MAX_CONFIG_BYTES, "an onnxruntime-genai config")
    try:
        value = genai_config.parse(data)
    except genai_config.ConfigError as error:
        raise FolderError(f"{config_path}: {error}") from None
    return value, data.decode("utf-8")


def read_layout(directory: str | os.PathLike, *, follow_symlinks: bool = False) -> Layout:
    """The layout of a model folder and the ONNX files to fuse; :class:`FolderError` for a layout not known, or a
    folder holding what may not be read (:func:`~ort_rmsnorm.folders.contents.read_contents`)."""
    root = Path(directory)
    contents = read_contents(root, follow_symlinks=follow_symlinks)
    if contents.entry(GENAI_CONFIG) is not None:
        config, text = read_config(contents)
        return Layout(KIND_GENAI, root, _genai_components(contents, config), config, contents, text)
    if os.path.lexists(root / GENAI_CONFIG):
        raise FolderError(f"{root / GENAI_CONFIG}: not a regular file")
    models = sorted(path for path in contents.files if path.lower().endswith(ONNX_SUFFIX))
    if not models:
        raise FolderError(f"{root}: neither an onnxruntime-genai folder (no {GENAI_CONFIG}) nor a folder of .onnx "
                          "models (no .onnx file in it or below it): no layout this command knows")
    return Layout(KIND_ONNX, root, [Component(path) for path in models], contents=contents)
