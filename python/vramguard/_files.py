"""Files that appear whole or not at all: the one way this package writes
a file another process reads (a dry run's figures, a memory snapshot, a
kernel spec, a built library).

The data goes to a new temporary file beside the target (O_EXCL: never
one that was there), is synced to disk, and only then renamed over the
target: a reader sees the old file or the new one, never half of it, and
a crash or a full disk mid-write leaves the old one. A symbolic link at
the target is replaced, not followed (callers that want its target
resolve it first, as dump_snapshot does)."""
import os
import secrets
import stat

__all__ = ["commit_file", "write_atomically"]


def _temporary_beside(path):
    directory = os.path.dirname(os.path.abspath(path))
    return os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")


def _unlink_quietly(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def write_atomically(path, data):
    """Writes `data` (bytes, or str as UTF-8) to `path`, whole or not at
    all. A file it replaces keeps its permission bits; a new one gets the
    umask's. An error names `path`, not the temporary file."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    path = os.fspath(path)
    tmp = _temporary_beside(path)
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = None
    # 0o600 until written when a file's bits are to be kept: they are set after
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                     0o600 if mode is not None else 0o666)
    except OSError as exc:
        raise type(exc)(exc.errno, exc.strerror, path) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())  # the data is on disk before the name points at it
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise


def commit_file(tmp, path):
    """Renames `tmp`, a finished file another program wrote (a compiler's
    output), over `path` once its data is on disk."""
    fd = os.open(tmp, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
