"""Durable writes: an output appears whole or not at all, and survives a crash once it has appeared.

Every output is first written under a temporary name next to it (``.NAME.tmp-*``, :func:`temporary_prefix`), flushed
to disk (:func:`fsync`), then renamed into place; the directory is flushed after the rename. A file goes in with one
rename (:func:`write_file`), a model and its data file with two under a lock (:func:`move_into_place`), a folder with
one rename or one exchange (:func:`publish_folder`; the folder it replaces is removed by the caller's rule). A
temporary left by a killed process stays until removed by hand: a later run cannot tell it from the temporary of a
run still writing (:func:`leftover_temporaries`).

Errors are ``OSError`` (naming the path where the system does); callers say what they were writing.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Callable, Iterator

STAGED, PREVIOUS, KEPT = ".tmp-", ".old-", ".kept-"
"""A temporary of the output ``NAME`` is named ``.NAME`` + marker + random characters, in ``NAME``'s directory:
``STAGED`` while it is written, ``PREVIOUS`` for a replaced output folder on its way out. ``KEPT`` names what a
replaced folder held beyond what its ``discard`` removes: not a temporary, it is the user's to look at."""


def temporary_prefix(output: Path, marker: str = STAGED) -> str:
    """The prefix of ``output``'s temporaries (for tempfile's ``prefix``)."""
    return f".{output.name}{marker}"


def leftover_temporaries(output: str | os.PathLike) -> list[Path]:
    """Temporaries of ``output`` in its directory: left by a run that was killed, or belonging to one still
    writing (nothing tells them apart)."""
    output = Path(output)
    with contextlib.suppress(OSError):
        return sorted(path for marker in (STAGED, PREVIOUS)
                      for path in output.parent.glob(f"{temporary_prefix(output, marker)}*"))
    return []


def fsync(path: Path) -> None:
    """Flushes a file, or a directory's entries, to disk."""
    descriptor = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if path.is_dir() else 0))
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_tree(root: Path) -> None:
    """Flushes every file and directory under ``root`` (``root`` included)."""
    for directory, _subdirectories, names in os.walk(root):
        for name in names:
            fsync(Path(directory, name))
        fsync(Path(directory))


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def staging_folder(output: Path) -> Path:
    """A new temporary folder next to ``output``, with the permissions a plain mkdir gives (mkdtemp's are 0700,
    which a folder published from it would keep)."""
    staging = Path(tempfile.mkdtemp(dir=output.parent, prefix=temporary_prefix(output)))
    os.chmod(staging, 0o777 & ~_umask())
    return staging


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def output_problem(path: Path) -> str | None:
    """Why no file may be renamed over ``path``, or None: nothing there, or a regular file. Anything else would be
    replaced by the rename or written through: a device such as ``/dev/null``, a FIFO, a socket, a directory, and a
    symbolic link of any kind (``/dev/stdout``, a link into ``/proc/self/fd``, a link to a file elsewhere, which
    the rename would turn into a file here); the answer says what it is."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISREG(mode):
        return None
    if not stat.S_ISLNK(mode):
        return f"is {_kind(mode)}, not a regular file"
    try:
        target_mode = os.stat(path).st_mode
        target = "a regular file" if stat.S_ISREG(target_mode) else _kind(target_mode)
    except OSError:
        target = "nothing"
    return f"is a symbolic link to {target} ({os.readlink(path)}), not a regular file"


class NotAFileError(OSError):
    """The output path names something other than a regular file (:func:`output_problem`): nothing was renamed over
    it."""

    def __init__(self, path: Path, problem: str):
        super().__init__(errno.EEXIST, f"{problem}; an output is a new file renamed into place, which would replace it",
                         str(path))


def check_replaceable_by_file(path: Path) -> None:
    """Raises :class:`NotAFileError` when ``path`` may not be replaced by a file (:func:`output_problem`); checked
    again just before each rename, since what a path names may change while a run works."""
    problem = output_problem(path)
    if problem is not None:
        raise NotAFileError(path, problem)


def stage_file(path: Path, write: Callable[[Path], None]) -> Path:
    """A complete, flushed temporary file next to ``path`` written by ``write(temporary)``, with the permissions a
    plain open() gives (mkstemp's are 0600); :func:`commit_file` renames it to ``path``. Nothing is left on failure."""
    descriptor, name = tempfile.mkstemp(dir=path.parent, prefix=temporary_prefix(path))
    os.close(descriptor)
    temporary = Path(name)
    try:
        write(temporary)
        os.chmod(temporary, 0o666 & ~_umask())
        fsync(temporary)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        raise
    return temporary


def commit_file(temporary: Path, path: Path) -> None:
    """Renames the staged ``temporary`` to ``path`` (never over anything but a regular file or a link:
    :func:`check_replaceable_by_file`)."""
    check_replaceable_by_file(path)
    os.replace(temporary, path)


def write_file(path: Path, write: Callable[[Path], None]) -> None:
    """Writes ``path`` with ``write(temporary)``, a file in the same directory renamed to ``path`` once complete and
    flushed: a reader never sees a partial file, and a failure leaves an existing ``path`` as it was."""
    check_replaceable_by_file(path)
    temporary = stage_file(path, write)
    try:
        commit_file(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()


@contextlib.contextmanager
def directory_lock(directory: Path) -> Iterator[None]:
    """An exclusive lock on ``directory`` (flock(2), released by the kernel when the process dies): two processes
    renaming their model and data files into the same directory do so one after the other, never interleaved into
    one's model next to the other's data. No lock where the platform or the file system has none."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    descriptor = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        except OSError as error:  # a file system without locks (some network ones): rename unlocked
            if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                raise
        yield
    finally:
        os.close(descriptor)  # releases the lock


def move_into_place(staged_files: list[Path], directory: Path) -> None:
    """Renames the staged files (flushed here first) into ``directory`` in order, the last one last: whoever sees it
    finds the others complete (a model after its data). If a rename fails, the files already moved are removed again
    so that no partial output remains.

    Several files cannot be renamed in one step, so with several files a previous file of the last one's name is
    removed first: a process killed between the renames leaves no model rather than the previous model next to the
    new data, which it would read at the wrong offsets."""
    for staged in staged_files:
        fsync(staged)
    moved: list[Path] = []
    with directory_lock(directory):
        try:
            for staged in staged_files:
                check_replaceable_by_file(directory / staged.name)
            if len(staged_files) > 1:
                with contextlib.suppress(FileNotFoundError):
                    (directory / staged_files[-1].name).unlink()
            for staged in staged_files:
                os.replace(staged, directory / staged.name)
                moved.append(directory / staged.name)
            fsync(directory)
        except BaseException:
            for path in moved:
                with contextlib.suppress(OSError):
                    path.unlink()
            raise


_RENAME_EXCHANGE = 2  # renameat2(2)'s flag: swap two paths atomically (Linux 3.15, glibc 2.28)
_AT_FDCWD = -100


def exchange(first: Path, second: Path) -> bool:
    """Swaps two existing paths in one step; False where the system cannot (then nothing changed)."""
    renameat2 = getattr(ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    error = ctypes.get_errno()
    if error in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # the kernel or the file system cannot swap
        return False
    raise OSError(error, os.strerror(error), str(second))


class NotEmptyError(FileExistsError):
    """The destination folder is not empty (and was not to be replaced)."""


def publish_folder(staging: Path, destination: Path, *, replace: bool,
                   discard: Callable[[Path], None] = shutil.rmtree) -> Path | None:
    """Moves the complete (flushed) staging folder to ``destination``. An absent or empty ``destination`` is replaced
    by the rename; a non-empty one only with ``replace`` (else :class:`NotEmptyError`), swapped out in one step where
    the system can (:func:`exchange`), else moved aside first; then ``discard(previous folder)`` removes what it may
    of it. Whatever it leaves (all of it, if interrupted) is moved to a ``.NAME.kept-*`` folder next to
    ``destination``, which is returned (None when nothing was left)."""
    kept = None
    if not destination.exists() or not any(destination.iterdir()):
        try:
            os.replace(staging, destination)  # rename(2) replaces an empty directory
        except OSError as error:
            if error.errno not in (errno.ENOTEMPTY, errno.EEXIST) or replace:
                raise
            raise NotEmptyError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY), str(destination)) from None
    elif not replace:
        raise NotEmptyError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY), str(destination))
    elif exchange(staging, destination):
        kept = _retire(staging, destination, discard, aside=None)  # staging now holds the previous folder
    else:
        previous = Path(tempfile.mkdtemp(dir=destination.parent, prefix=temporary_prefix(destination, PREVIOUS)))
        os.replace(destination, previous / "folder")
        try:
            os.replace(staging, destination)
        except BaseException:
            os.replace(previous / "folder", destination)
            shutil.rmtree(previous, ignore_errors=True)
            raise
        kept = _retire(previous / "folder", destination, discard, aside=previous)
        if kept is None:
            os.rmdir(previous)
        else:
            kept = Path(tempfile.mkdtemp(dir=destination.parent, prefix=temporary_prefix(destination, KEPT)))
            os.replace(previous / "folder", kept / "folder")
            os.rmdir(previous)
    fsync(destination.parent)
    return kept


def _retire(previous: Path, destination: Path, discard: Callable[[Path], None], *, aside: Path | None) -> Path | None:
    """Removes the replaced folder ``previous`` with ``discard``; what is left (all of it when interrupted) stays in
    the ``.NAME.old-*`` folder ``aside`` (the caller moves it on) or is moved to a ``.NAME.kept-*`` folder; returns
    that folder."""
    try:
        discard(previous)
    finally:
        kept = None
        if os.path.lexists(previous):
            kept = aside
            if kept is None:
                kept = Path(tempfile.mkdtemp(dir=destination.parent, prefix=temporary_prefix(destination, KEPT)))
                os.replace(previous, kept / "folder")
    return kept
