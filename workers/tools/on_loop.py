"""Whether a small file read may run on the event loop instead of in a thread.

A file tool's work runs in a thread (``asyncio.to_thread``) so that a slow file system never
stalls the event loop, which carries every call in flight and its heartbeats. For the common
read, a small text file on the machine's own disk, that hand-off costs more CPU than the read:
the pool thread woken, the result handed back to the loop. :func:`reads_on_loop` says when the
read cannot wait on anything but the local kernel, so ``file_read`` (``FileReadTool``) runs
the *same* work (the same checks, the same confined open: nothing of the workspace's
confinement differs) on the loop:

- **Local file systems only.** Every mount whose mount point is a prefix of the path (the
  workspace's and the file's, written out without ``..``) is of a local type
  (:data:`LOCAL_FILE_SYSTEMS`: disk, memory and overlay file systems). NFS, SMB, FUSE, 9p,
  Ceph and the like, whose every lookup may wait for a server, and ``/proc``, ``/sys`` and
  device file systems, go to the thread. The mounts are the process's
  ``/proc/self/mountinfo``, read again when the kernel says the mount table changed (a poll
  of that file reports it: :class:`MountTable`).
- **No link on the path.** Each component from ``/`` down to the file is ``lstat``-ed: a
  symbolic link (which might lead to any mount) sends the read to the thread, whose own check
  follows it as before. So the checks and opens that then run on the loop touch only those
  components, all on the local mounts above.
- **A small regular file.** The last component is a regular file of at most
  :data:`LOOP_READ_BYTES`; a FIFO, socket or device (which the tool refuses anyway, opened
  without blocking), a directory, a missing name and a larger file go to the thread.

What may still wait on the loop: a local disk read of an inode, a directory block or the
file's pages not in the page cache (one to a few reads of a small file, each a fraction of a
millisecond on an SSD); a link swapped onto the path by a command in the microseconds between
this check and the tool's own (its check then follows the link, possibly onto another mount);
a file that grows meanwhile is read to its end (the whole file is hashed).
"""

from __future__ import annotations

import logging
import os
import select
import stat
from pathlib import Path

__all__ = ["LOCAL_FILE_SYSTEMS", "LOOP_READ_BYTES", "MountTable", "reads_on_loop"]

log = logging.getLogger("orga.worker.tools")

LOOP_READ_BYTES = 64 * 1024
"""The largest file read on the event loop; a larger one is read in a thread."""

LOCAL_FILE_SYSTEMS = frozenset(
    {
        "bcachefs",
        "btrfs",
        "ext2",
        "ext3",
        "ext4",
        "f2fs",
        "overlay",
        "ramfs",
        "tmpfs",
        "xfs",
        "zfs",
    }
)
"""Mount types whose lookups and reads wait for nothing but the local kernel and disk."""

_MOUNTINFO = "/proc/self/mountinfo"


def _unescape(field: str) -> str:
    r"""A mountinfo path field with its octal escapes (``\040`` for a space) decoded."""
    if "\\" not in field:
        return field
    raw = field.encode("utf-8", "surrogateescape")
    out = bytearray()
    index = 0
    while index < len(raw):
        if raw[index : index + 1] == b"\\" and raw[index + 1 : index + 4].isdigit():
            out.append(int(raw[index + 1 : index + 4], 8))
            index += 4
        else:
            out.append(raw[index])
            index += 1
    return out.decode("utf-8", "surrogateescape")


def parse_mountinfo(text: str) -> dict[str, bool]:
    """Mount point → whether every mount there is of a :data:`LOCAL_FILE_SYSTEMS` type."""
    mounts: dict[str, bool] = {}
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            separator = fields.index("-", 6)
            point, kind = _unescape(fields[4]), fields[separator + 1]
        except (ValueError, IndexError):
            continue
        mounts[point] = mounts.get(point, True) and kind in LOCAL_FILE_SYSTEMS
    return mounts


class MountTable:
    """This process's mount points and whether each is local, read from
    ``/proc/self/mountinfo`` and read again only when the kernel reports a change (``poll``
    on that file gives ``POLLPRI`` once per change to the mount table)."""

    def __init__(self, path: str = _MOUNTINFO) -> None:
        self._path = path
        self._pid = -1
        self._fd = -1
        self._poll: select.poll | None = None
        self._mounts: dict[str, bool] | None = None

    def current(self) -> dict[str, bool] | None:
        """The table, read again if the mount table changed; None when it cannot be read."""
        if self._pid != os.getpid():  # first use, or a forked child: its own descriptor
            self._open()
        if self._poll is None:
            return None
        if self._mounts is None or self._poll.poll(0):
            self._mounts = self._read()
        return self._mounts

    def _open(self) -> None:
        self._pid, self._mounts, self._poll = os.getpid(), None, None
        try:
            self._fd = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            log.info("tools.mount_table_unavailable", extra={"error": str(exc)})
            return
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLPRI | select.POLLERR)

    def _read(self) -> dict[str, bool] | None:
        chunks: list[bytes] = []
        try:
            os.lseek(self._fd, 0, os.SEEK_SET)
            while chunk := os.read(self._fd, 65536):
                chunks.append(chunk)
        except OSError:
            return None
        return parse_mountinfo(b"".join(chunks).decode("utf-8", "surrogateescape"))


_MOUNTS = MountTable()


def reads_on_loop(workspace: Path, user_path: str, mounts: MountTable | None = None) -> bool:
    """Whether reading ``user_path`` in ``workspace`` waits for nothing but the local kernel
    and disk (the module's three conditions), so that it may run on the event loop
    (``mounts``: the process's own table by default)."""
    table = (mounts or _MOUNTS).current()
    root = os.fspath(workspace)
    if table is None or "\x00" in user_path or not os.path.isabs(root):
        return False
    target = os.path.normpath(os.path.join(root, user_path))
    inside = (target + "/").startswith(os.path.normpath(root).rstrip("/") + "/")
    # Outside the workspace as written: the thread's own check says so.
    return inside and table.get("/", False) and _small_local_file(target, table)


def _small_local_file(target: str, table: dict[str, bool]) -> bool:
    """Whether every component of ``target`` (absolute, normalised) is on a local mount and
    no link, its directories directories and the last a regular file of at most
    :data:`LOOP_READ_BYTES`."""
    parts = [part for part in target.split("/") if part]
    prefix = ""
    info: os.stat_result | None = None
    for part in parts:
        if info is not None and not stat.S_ISDIR(info.st_mode):
            return False
        prefix = f"{prefix}/{part}"
        if not table.get(prefix, True):
            return False
        try:
            info = os.lstat(prefix)
        except OSError:
            return False
        if stat.S_ISLNK(info.st_mode):
            return False
    return info is not None and stat.S_ISREG(info.st_mode) and info.st_size <= LOOP_READ_BYTES
