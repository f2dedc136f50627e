"""What a model folder holds, read under the folder's trust boundary.

Content is read only from regular files inside the folder. A symbolic link whose target resolves inside the folder
is followed (a link to a file is read as that file, under the link's name; a link to a folder is walked). A link
that resolves outside the folder, a device file, a FIFO, a socket, a link loop, a link to a missing file and a link
to a folder that contains it are refused, each named in one error. ``follow_symlinks=True`` allows links out of the
folder to regular files and to folders (a Hugging Face cache snapshot is made of links into ``../../blobs/``);
everything else stays refused, as do links into the kernel's ``/proc`` and ``/sys``, whose "files" are not files on
disk. A folder is walked once: a second way to the same folder (two links, or a link and the folder itself) is
refused rather than copied twice, which keeps the work linear in what the folder holds.

The walk follows no link it has not checked: each folder is opened without following a link (``O_NOFOLLOW``) and
checked to be the one classified (device and inode of the open descriptor); each file is opened the same way when it
is read, and, on Linux, the open descriptor's path must still lie where the walk allowed (``/proc/self/fd``). A file
swapped for another after the walk is refused, not read.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import stat
from pathlib import Path
from typing import Iterator

from ..model.read import ModelFileError

FOLLOW_SYMLINKS_OPTION = "--follow-symlinks"
MAX_FOLDER_DEPTH = 64
"""Folders nested deeper than this below the root are refused (model folders nest a few levels)."""
_SHOWN_PROBLEMS = 10
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO swapped in opens without waiting for a writer
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_PSEUDO_FILE_SYSTEMS = ("/proc", "/sys")


class FolderError(ModelFileError):
    """A folder cannot be fused or verified as asked; the message names the folder or file and the problem."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """A regular file of the folder that may be read."""

    relative: str
    """Its path in the folder, with ``/`` separators (a link's own name, not its target's)."""
    real: str
    """The real path of the file (links resolved)."""
    device: int
    inode: int
    size: int
    outside: bool
    """Reached through a link out of the folder (allowed by ``follow_symlinks``)."""

    @property
    def identity(self) -> tuple[int, int]:
        return self.device, self.inode


def within(path: str, folder: str) -> bool:
    """Whether the real path ``path`` is the real path ``folder`` or lies in it."""
    return os.path.commonpath([folder, path]) == folder


def _kind(mode: int) -> str:
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device file"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file or folder"


def _opened_path(descriptor: int) -> str | None:
    """Where an open descriptor really is (Linux: /proc/self/fd); None where the system does not say."""
    try:
        return os.readlink(f"/proc/self/fd/{descriptor}")
    except OSError:
        return None


def _pseudo_devices() -> set[int]:
    devices = set()
    for path in _PSEUDO_FILE_SYSTEMS:
        try:
            devices.add(os.stat(path).st_dev)
        except OSError:
            pass
    return devices


class _Changed(OSError):
    """What a path leads to is not what the walk found there."""


def _open_checked(real: str, identity: tuple[int, int], flags: int, allowed_root: str | None) -> int:
    """Opens ``real`` without following a link in its last component and checks that the descriptor is the object
    classified (``identity``) and, where the system says, that it lies in ``allowed_root`` (None: anywhere);
    :class:`_Changed` if not, or if the last component has become a link."""
    try:
        descriptor = os.open(real, flags | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ELOOP:  # O_NOFOLLOW met a link
            raise _Changed(errno.ELOOP, "changed while the folder was read", real) from None
        raise
    try:
        status = os.fstat(descriptor)
        where = _opened_path(descriptor)
        if ((status.st_dev, status.st_ino) != identity
                or (allowed_root is not None and where is not None and where.startswith("/")
                    and not within(where, allowed_root))):
            raise _Changed(errno.ESTALE, "changed while the folder was read", real)
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


@dataclasses.dataclass
class Contents:
    """The files of a folder that may be read (:func:`read_contents`), by relative path, in walk order."""

    root: Path
    """The folder as named."""
    real_root: str
    follow_symlinks: bool
    files: dict[str, Entry]

    def path(self, relative: str) -> Path:
        """The path of a file through the folder as named (through its link, for a link)."""
        return self.root / relative

    def entry(self, relative: str) -> Entry | None:
        return self.files.get(relative)

    def _changed(self, relative: str) -> FolderError:
        return FolderError(f"{self.path(relative)}: changed while the folder was read (replaced, or swapped for a "
                           "link); nothing was read from it")

    def open(self, relative: str) -> int:
        """A descriptor of the file, checked to be the regular file the walk found (O_NOFOLLOW, fstat)."""
        entry = self.files[relative]
        try:
            return _open_checked(entry.real, entry.identity, os.O_RDONLY,
                                 None if entry.outside else self.real_root)
        except _Changed:
            raise self._changed(relative) from None
        except FileNotFoundError:
            raise FolderError(f"{self.path(relative)}: no longer exists (removed while the folder was read)") from None
        except OSError as error:
            raise FolderError(f"{self.path(relative)}: cannot read it: {error.strerror or error}") from None

    def read_bytes(self, relative: str, limit: int, what: str) -> bytes:
        """The file's bytes; :class:`FolderError` when it holds more than ``limit`` bytes (``what``: what such a file
        is, for the message)."""
        descriptor = self.open(relative)
        with os.fdopen(descriptor, "rb") as file:
            os.set_blocking(descriptor, True)
            data = file.read(limit + 1)
        if len(data) > limit:
            raise FolderError(f"{self.path(relative)}: over {limit >> 20} MiB, far more than {what} holds; refusing "
                              "to read it")
        return data

    def copy(self, relative: str, destination: Path) -> None:
        """Copies the file to ``destination`` (a new file), with its permission bits and times."""
        descriptor = self.open(relative)
        with os.fdopen(descriptor, "rb") as source:
            os.set_blocking(descriptor, True)
            copy_file(source, destination)

    def check_unchanged(self, relative: str) -> None:
        """The path (through any link) still leads to the file the walk found: around a read by path (a model,
        which onnx reads by its name)."""
        entry = self.files[relative]
        try:
            status = os.stat(self.path(relative))
        except OSError:
            raise self._changed(relative) from None
        if (status.st_dev, status.st_ino) != entry.identity:
            raise self._changed(relative)

    def relative_of(self, path: Path) -> str | None:
        """The relative path of ``path`` (as a model's external data names it: its folder resolved, its name not)
        when it is one of the folder's files, else None."""
        try:
            relative = Path(os.path.realpath(path.parent), path.name).relative_to(self.real_root).as_posix()
        except ValueError:
            return None
        return relative if relative in self.files else None

    def linked_file(self, path: Path) -> str | None:
        """The real path of ``path`` when it is a link the walk allowed to one of the folder's files (as
        :func:`ort_rmsnorm.model.read.load_model` asks of a model's external data reached through a link), else None."""
        relative = self.relative_of(path)
        return self.files[relative].real if relative is not None else None


def copy_file(source, destination: Path) -> None:
    """Copies the open file ``source`` to the new file ``destination`` (never through a link), keeping its permission
    bits and times; in the kernel (copy_file_range) where the system can."""
    status = os.fstat(source.fileno())
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC
    with os.fdopen(os.open(destination, flags, 0o600), "wb") as target:
        copied = False
        if hasattr(os, "copy_file_range"):
            try:
                while os.copy_file_range(source.fileno(), target.fileno(), 1 << 30):
                    pass
                copied = True
            except OSError as error:
                if error.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EBADF):
                    raise
                os.lseek(source.fileno(), 0, os.SEEK_SET)
                os.ftruncate(target.fileno(), 0)
                os.lseek(target.fileno(), 0, os.SEEK_SET)
        if not copied:
            shutil.copyfileobj(source, target, 1 << 20)
        os.fchmod(target.fileno(), stat.S_IMODE(status.st_mode))
    os.utime(destination, ns=(status.st_atime_ns, status.st_mtime_ns), follow_symlinks=False)


@dataclasses.dataclass
class _Folder:
    relative: str
    real: str
    identity: tuple[int, int]
    chain: frozenset
    """The identities of the folders from the root to this one: a link to one of them is a loop."""


def read_contents(root: str | os.PathLike, *, follow_symlinks: bool = False) -> Contents:
    """The files of the folder ``root`` that may be read (see the module docstring); :class:`FolderError` naming
    each entry refused."""
    root = Path(root)
    real_root = os.path.realpath(root)
    try:
        status = os.stat(real_root)
    except OSError:
        raise FolderError(f"{root}: no such directory") from None
    if not stat.S_ISDIR(status.st_mode):
        raise FolderError(f"{root}: not a directory")
    pseudo = _pseudo_devices()
    files: dict[str, Entry] = {}
    problems: list[str] = []
    links_out = False
    walked: dict[tuple[int, int], str] = {}
    identity = (status.st_dev, status.st_ino)
    stack = [_Folder("", real_root, identity, frozenset([identity]))]

    def shown(relative: str) -> Path:
        return root / relative

    while stack:
        folder = stack.pop()
        if folder.identity in walked:
            problems.append(f"{shown(folder.relative)}: the folder {folder.real} again, already read as "
                            f"{shown(walked[folder.identity])}; a folder is read once")
            continue
        walked[folder.identity] = folder.relative
        try:
            descriptor = _open_checked(folder.real, folder.identity, os.O_RDONLY | _O_DIRECTORY,
                                       None if not within(folder.real, real_root) else real_root)
        except OSError as error:
            reason = "changed while the folder was read" if isinstance(error, _Changed) else (
                error.strerror or str(error))
            problems.append(f"{shown(folder.relative)}: cannot read the folder: {reason}")
            continue
        try:
            names = sorted(os.listdir(descriptor))
            subfolders = []
            for name in names:
                relative = f"{folder.relative}/{name}" if folder.relative else name
                try:
                    entry_status = os.stat(name, dir_fd=descriptor, follow_symlinks=False)
                except OSError as error:
                    problems.append(f"{shown(relative)}: cannot read it: {error.strerror or error}")
                    continue
                mode = entry_status.st_mode
                if stat.S_ISLNK(mode):
                    target = _classify_link(root, real_root, os.path.join(folder.real, name), relative, folder,
                                            follow_symlinks, pseudo, problems)
                    if isinstance(target, bool):
                        links_out |= target
                        continue
                    real, target_status = target
                    if stat.S_ISDIR(target_status.st_mode):
                        subfolders.append(_Folder(relative, real, (target_status.st_dev, target_status.st_ino),
                                                  folder.chain | {(target_status.st_dev, target_status.st_ino)}))
                    else:
                        files[relative] = Entry(relative, real, target_status.st_dev, target_status.st_ino,
                                                target_status.st_size, not within(real, real_root))
                elif stat.S_ISDIR(mode):
                    real = os.path.join(folder.real, name)
                    identity = (entry_status.st_dev, entry_status.st_ino)
                    if identity in folder.chain:  # a bind mount of a folder inside itself
                        problems.append(f"{shown(relative)}: the folder {real} again, which contains it (a loop)")
                        continue
                    subfolders.append(_Folder(relative, real, identity, folder.chain | {identity}))
                elif stat.S_ISREG(mode):
                    real = os.path.join(folder.real, name)
                    files[relative] = Entry(relative, real, entry_status.st_dev, entry_status.st_ino,
                                            entry_status.st_size, not within(real, real_root))
                else:
                    problems.append(f"{shown(relative)}: {_kind(mode)}, not a regular file")
        except OSError as error:
            problems.append(f"{shown(folder.relative)}: cannot read the folder: {error.strerror or error}")
            continue
        finally:
            os.close(descriptor)
        for subfolder in reversed(subfolders):  # depth first, in name order
            if len(subfolder.chain) > MAX_FOLDER_DEPTH + 1:
                problems.append(f"{shown(subfolder.relative)}: folders nested more than {MAX_FOLDER_DEPTH} deep")
                continue
            stack.append(subfolder)
    if problems:
        raise FolderError(refusal(root, problems, links_out))
    return Contents(root, real_root, follow_symlinks, files)


def refusal(root: Path, problems: list[str], links_out: bool) -> str:
    """One line naming each entry refused (the first ones, and how many more)."""
    count = len(problems)
    shown = "; ".join(problems[:_SHOWN_PROBLEMS])
    more = f"; and {count - _SHOWN_PROBLEMS} more" if count > _SHOWN_PROBLEMS else ""
    hint = (f" (a link out of the folder is followed only with {FOLLOW_SYMLINKS_OPTION}, follow_symlinks=True in "
            "Python: what a Hugging Face cache snapshot, made of links into ../../blobs/, needs)") if links_out else ""
    return (f"{root}: refusing to read {count} entr{'y' if count == 1 else 'ies'} of the folder: {shown}{more}"
            f"{hint}")


def _classify_link(root: Path, real_root: str, link: str, relative: str, folder: _Folder, follow_symlinks: bool,
                   pseudo: set[int], problems: list[str]) -> tuple[str, os.stat_result] | bool:
    """The real path and status of a link's target when it may be read; else the reason goes to ``problems`` and
    the result is whether the link was refused only for leading out of the folder."""
    shown = root / relative
    try:
        real = os.path.realpath(link, strict=True)
        status = os.stat(real)
    except OSError as error:
        if error.errno == errno.ELOOP:
            problems.append(f"{shown}: a symbolic link loop (following its links never reaches a file)")
        elif error.errno in (errno.ENOENT, errno.ENOTDIR):
            try:
                target = os.readlink(link)
            except OSError:
                target = "?"
            problems.append(f"{shown}: a symbolic link to {target}, which does not exist")
        else:
            problems.append(f"{shown}: cannot follow the symbolic link: {error.strerror or error}")
        return False
    inside = within(real, real_root)
    if status.st_dev in pseudo:
        problems.append(f"{shown}: a symbolic link to {real}, a file of the kernel's /proc or /sys, not a file "
                        "on disk")
        return False
    is_folder = stat.S_ISDIR(status.st_mode)
    if is_folder and ((status.st_dev, status.st_ino) in folder.chain or within(real_root, real)):
        problems.append(f"{shown}: a symbolic link to {real}, a folder that contains it (a loop)")
        return False
    if not inside and not follow_symlinks:
        problems.append(f"{shown}: a symbolic link to {'a folder ' if is_folder else ''}{real}, outside the folder")
        return True
    if is_folder:
        return real, status
    if not stat.S_ISREG(status.st_mode):
        problems.append(f"{shown}: a symbolic link to {real}, {_kind(status.st_mode)}, not a regular file")
        return False
    return real, status


def walk_files(root: Path, *, folders: bool = False) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry under ``root`` (folders too with ``folders``) as ``(relative path, lstat)``, never following a
    link: for a folder this package wrote, what it holds, links included as links."""
    stack = [""]
    while stack:
        relative_folder = stack.pop()
        with os.scandir(root / relative_folder if relative_folder else root) as entries:
            children = sorted(entries, key=lambda entry: entry.name)
        subfolders = []
        for child in children:
            relative = f"{relative_folder}/{child.name}" if relative_folder else child.name
            status = child.stat(follow_symlinks=False)
            if stat.S_ISDIR(status.st_mode):
                subfolders.append(relative)
                if not folders:
                    continue
            yield relative, status
        stack.extend(reversed(subfolders))
