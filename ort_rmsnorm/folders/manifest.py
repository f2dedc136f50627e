"""The manifest ``fuse`` leaves in every folder it publishes, and the rule of ``--replace`` it serves.

``ort-rmsnorm.json`` lists every file of the folder ``fuse`` wrote, with its size. ``replace=True`` replaces a
non-empty output folder only when it carries a valid manifest and holds nothing the manifest does not list (no other
file, folder or link; no listed file whose size changed): what this package wrote, and nothing the user added or
edited since. Of the folder it replaces, only the listed files, the manifest and the folders they leave empty are
removed (:func:`discard`); anything else (added while the run ran) is kept and reported.

Why a manifest and not the folder report: the report is written only when asked, and where the user says, never
inside the folders; the manifest is small, always there, and says exactly which files are the tool's.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from pathlib import Path, PurePosixPath

from .._library import package_version
from . import genai_config
from .contents import FolderError, walk_files

MANIFEST = "ort-rmsnorm.json"
WRITTEN_BY = "ort-rmsnorm fuse"
FORMAT = 1
MAX_MANIFEST_BYTES = 16 * 2**20
_SHOWN = 10


def write(folder: Path, target: str) -> None:
    """Writes the manifest of ``folder`` (complete: every other file is in it)."""
    files = {relative: status.st_size for relative, status in walk_files(folder) if relative != MANIFEST}
    manifest = {"written_by": WRITTEN_BY, "format": FORMAT, "version": package_version(), "target": target,
                "files": dict(sorted(files.items()))}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def read(folder: Path) -> dict[str, int] | None:
    """The files the folder's manifest lists (relative path -> size); None without a valid manifest."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        descriptor = os.open(folder / MANIFEST, flags)
    except OSError:
        return None
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return None
        data = file.read(MAX_MANIFEST_BYTES + 1)
    try:
        manifest = genai_config.parse(data)
    except genai_config.ConfigError:
        return None
    if (not isinstance(manifest, dict) or manifest.get("written_by") != WRITTEN_BY
            or manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), dict)):
        return None
    files = manifest["files"]
    if not all(isinstance(size, int) and not isinstance(size, bool) and _plain(relative)
               for relative, size in files.items()):
        return None
    return files


def _plain(relative: str) -> bool:
    """A relative path with ``/`` separators that names something inside the folder."""
    parts = relative.split("/")
    return "\0" not in relative and all(part not in ("", ".", "..") for part in parts)


def _folders_of(files: dict[str, int]) -> set[str]:
    return {parent.as_posix() for relative in files for parent in PurePosixPath(relative).parents} - {"."}


def check_replaceable(folder: Path) -> None:
    """Refuses (:class:`FolderError`, naming what is in the way) a non-empty folder that ``replace`` may not replace:
    one without the manifest, or holding anything the manifest does not list."""
    files = read(folder)
    if files is None:
        raise FolderError(f"{folder}: not a folder ort-rmsnorm fuse wrote (no valid {MANIFEST} in it); --replace "
                          "replaces only such a folder: choose another output folder, or remove this one yourself")
    folders = _folders_of(files)
    foreign, changed = [], []
    for relative, status in walk_files(folder, folders=True):
        if relative == MANIFEST:
            continue
        if stat.S_ISDIR(status.st_mode):
            if relative not in folders:
                foreign.append(f"{relative}/")
        elif not stat.S_ISREG(status.st_mode) or relative not in files:
            foreign.append(relative)
        elif files[relative] != status.st_size:
            changed.append(relative)
    if foreign or changed:
        parts = []
        if foreign:
            parts.append(f"{len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'} fuse did not write "
                         f"({_names(foreign)})")
        if changed:
            parts.append(f"{len(changed)} file{'' if len(changed) == 1 else 's'} changed since ({_names(changed)})")
        raise FolderError(f"{folder}: --replace replaces only what ort-rmsnorm fuse wrote, and this folder holds "
                          f"{' and '.join(parts)}; move them out, or remove the folder yourself")


def _names(names: list[str]) -> str:
    more = f", and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return ", ".join(names[:_SHOWN]) + more


def discard(folder: Path) -> None:
    """Removes, of a folder being replaced, the files its manifest lists (at their listed size), the manifest and the
    folders left empty; nothing else."""
    files = read(folder)
    if files is None:
        return
    for relative, size in files.items():
        _remove(folder, relative, size)
    _remove(folder, MANIFEST, None)
    for relative in sorted(_folders_of(files), key=lambda name: name.count("/"), reverse=True):
        _remove(folder, relative, None, directory=True)
    with contextlib.suppress(OSError):
        folder.rmdir()


def _remove(folder: Path, relative: str, size: int | None, *, directory: bool = False) -> None:
    """Removes the regular file (of ``size``, unless None) or the empty folder at ``relative``, reaching it through
    folders opened without following a link: nothing outside ``folder`` is touched. Anything else is left."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    *parents, name = relative.split("/")
    try:
        descriptor = os.open(folder, flags)
    except OSError:
        return
    try:
        for part in parents:
            inner = os.open(part, flags, dir_fd=descriptor)
            os.close(descriptor)
            descriptor = inner
        status = os.stat(name, dir_fd=descriptor, follow_symlinks=False)
        if directory and stat.S_ISDIR(status.st_mode):
            os.rmdir(name, dir_fd=descriptor)
        elif not directory and stat.S_ISREG(status.st_mode) and size in (None, status.st_size):
            os.unlink(name, dir_fd=descriptor)
    except OSError as error:  # gone, not empty, a link on the way: left as it is
        if error.errno not in (errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.ELOOP):
            raise
    finally:
        os.close(descriptor)
