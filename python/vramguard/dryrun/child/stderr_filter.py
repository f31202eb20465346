"""Lines left out of the child's stderr (a warning the dry run's own
adjustment causes, not the script), by a filter process of its own."""
import os
import sys

__all__ = ["drop_from_stderr"]


#: A filter process between this run's stderr and the dry run: every line
#: (ended by \n or \r) copied on, but those holding argv[1]. A process of its
#: own, so that what a crash writes last still reaches the dry run.
_STDERR_FILTER = r"""
import os, re, sys
drop, pending = sys.argv[1].encode(), b""
while True:
    chunk = os.read(0, 65536)
    if not chunk:
        break
    pending += chunk
    ends = [m.end() for m in re.finditer(rb"[\r\n]", pending)]
    if not ends:
        continue
    lines = re.findall(rb"[^\r\n]*[\r\n]", pending[:ends[-1]])
    pending = pending[ends[-1]:]
    out = b"".join(line for line in lines if drop not in line)
    if out:
        os.write(1, out)
if pending and drop not in pending:
    os.write(1, pending)
"""


def drop_from_stderr(text):
    """Lines of this process's stderr (fd 2: Python's and C++'s) holding
    `text` are left out from now on. True when the filter runs."""
    import subprocess

    try:
        sys.stderr.flush()
        read, write = os.pipe()
        subprocess.Popen([sys.executable, "-c", _STDERR_FILTER, text], stdin=read, stdout=2,
                         close_fds=True)
        os.dup2(write, 2)
        os.close(read)
        os.close(write)
    except OSError:
        return False
    return True
