"""
files.py: writes that lose nothing, and folders with one writer at a time. Standard library only.

- atomic_write / write_text_atomic / save_json: a file is written under a temporary name of this process and
  renamed when complete, so a reader (or a rerun after a crash) sees the old file or the new one, never half of one.
- disk_errors(folder): a full disk or a read-only folder becomes one UserError line that names the folder and the
  free space, instead of a traceback from deep inside a write.
- folder_lock(folder, command): a lock file in the folder, so two commands never write one folder at once.
"""

import contextlib
import errno
import json
import os
import shutil
import socket
import time

from ledgergpt.config import UserError


def remove_quietly(path):
    """Delete a file if it is there (a temporary file a failed write leaves behind)."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


@contextlib.contextmanager
def atomic_write(path, mode='w'):
    """Yield a temporary file of this process, opened with `mode`; when the block ends it is flushed to disk and
    renamed to `path`, so a reader sees the old file or the new one, never half of one. The pid in the temporary
    name keeps two processes writing the same file apart (each renames a whole file of its own); a failed write
    (an exception, Ctrl-C) removes its temporary file."""
    tmp = f'{path}.tmp{os.getpid()}'
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise


def write_text_atomic(path, text):
    with atomic_write(path) as f:
        f.write(text)


def save_json(path, obj):
    write_text_atomic(path, json.dumps(obj, indent=1))


# -----------------------------------------------------------------------------------------------------
# Full disks and read-only folders. A write that fails for want of space raises OSError ENOSPC (EDQUOT over a
# quota) wherever it happens; torch.save raises RuntimeError instead, from its zip writer ("PytorchStreamWriter
# failed writing file ...: file write failed", or "unexpected pos N vs M" when a short write shows up as a wrong
# offset). disk_errors turns each into one line that says what happened, where, and how much space is left.

FULL = {errno.ENOSPC, errno.EDQUOT}
NOT_WRITABLE = {errno.EROFS, errno.EACCES, errno.EPERM}
TORCH_FULL_DISK = ('unexpected pos', 'file write failed')


def human_bytes(n):
    """1234567890 -> '1.2 GB' (decimal units, as disks are sold and df -H shows them)."""
    for unit in ('bytes', 'KB', 'MB', 'GB', 'TB'):
        if abs(n) < 1000 or unit == 'TB':
            return f"{n:,.0f} {unit}" if unit == 'bytes' else f"{n:,.1f} {unit}"
        n /= 1000


def free_bytes(folder):
    """Free bytes for this user on the filesystem that holds `folder` (or would: its nearest existing parent)."""
    folder = os.path.abspath(folder)
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    return shutil.disk_usage(folder).free


@contextlib.contextmanager
def disk_errors(folder, needed_bytes=None):
    """Turn a full disk (ENOSPC, EDQUOT, torch.save's zip-writer errors) or a folder that cannot be written (EROFS,
    EACCES, EPERM) inside the block into one UserError naming the folder and the free space on its filesystem.
    The writes in the block are expected to clean up after themselves (write_text_atomic does), so what was there
    before stays as it was."""
    try:
        yield
    except OSError as e:
        if (
            e.errno not in FULL | NOT_WRITABLE
            or e.errno in NOT_WRITABLE
            and not on_the_way(e.filename, folder)
        ):
            raise  # not about space, or a file elsewhere that cannot be read (an input): not ours to explain
        where = e.filename or folder
        if e.errno in FULL:
            raise UserError(full_disk_message(folder, where, needed_bytes)) from None
        read_only = 'read-only filesystem' if e.errno == errno.EROFS else 'permission denied'
        raise UserError(
            f"cannot write {where} ({read_only}): {folder} must be on a writable filesystem and "
            f"writable by this user; choose another folder"
        ) from None
    except RuntimeError as e:
        if not any(text in str(e) for text in TORCH_FULL_DISK):
            raise
        raise UserError(full_disk_message(folder, folder, needed_bytes)) from None


def on_the_way(path, folder):
    """Whether writing `folder` can fail at `path`: the folder, a file in it, or a parent it is made in."""
    if not path:
        return True
    path, folder = os.path.abspath(path), os.path.abspath(folder)
    return os.path.commonpath([path, folder]) in (path, folder)


def full_disk_message(folder, where, needed_bytes):
    needed = f", about {human_bytes(needed_bytes)} needed" if needed_bytes else ''
    return (
        f"disk full writing {where}: {human_bytes(free_bytes(folder))} free on the filesystem of {folder}{needed}: "
        f"free some space or choose another folder, then rerun (what was complete is kept)"
    )


# -----------------------------------------------------------------------------------------------------
# One writer per folder. The lock is a small JSON file, `.lock` in the folder, holding the pid, host, command and
# start time of its owner. It is created whole or not at all (written to a file of our own, then hard-linked to
# `.lock`: link fails if the name exists, on local disks and NFS alike), and removed when the block ends, by an
# exception or Ctrl-C too. A process killed outright (SIGKILL, a power cut) leaves it behind: on the same host a
# lock whose pid no longer runs is stale and taken over; a live one, or one from another host (whose processes we
# cannot see), is one line naming its owner.

LOCK_NAME = '.lock'


def process_alive(pid):
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


def read_lock(path):
    """The owner recorded in a lock file, or None if it vanished meanwhile (released); {} if unreadable."""
    try:
        with open(path) as f:
            owner = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


@contextlib.contextmanager
def folder_lock(folder, command):
    """Hold `folder`/.lock for the block (the folder is created if needed); a UserError naming the other process if
    another live process holds it; a folder that cannot be made or written (a file of that name, a read-only
    filesystem) is one UserError line too. Yields the lock file's path."""
    path = os.path.join(folder, LOCK_NAME)
    me = {
        'pid': os.getpid(),
        'host': socket.gethostname(),
        'command': command,
        'since': time.strftime('%Y-%m-%d %H:%M:%S'),
    }
    mine = f'{path}.{me["pid"]}'
    with disk_errors(folder):  # read-only or full: one line
        try:
            os.makedirs(folder, exist_ok=True)
        except (
            FileExistsError,
            NotADirectoryError,
        ) as e:  # the folder's name, or a parent's, is a file
            raise UserError(
                f"cannot make the folder {folder}: {e.filename or folder} is a file, not a folder; choose another "
                f"folder"
            ) from None
        with open(mine, 'w') as f:
            json.dump(me, f)
    try:
        # another process may take over a stale lock at the same moment: look again
        for _ in range(3):
            try:
                os.link(mine, path)
                break
            except FileExistsError:
                owner = read_lock(path)
            if owner is None:
                continue
            if (
                owner.get('host') == me['host']
                and isinstance(owner.get('pid'), int)
                and not process_alive(owner['pid'])
            ):
                take_over(path, owner)
                continue
            raise UserError(lock_message(folder, path, owner))
        else:
            raise UserError(
                f"could not take the lock {path}: other processes keep taking it; try again"
            )
    finally:
        remove_quietly(mine)
    try:
        yield path
    finally:
        if read_lock(path) == me:
            remove_quietly(path)


def take_over(path, stale):
    """Remove a stale lock, unless another process replaced it with its own since we read it."""
    aside = f'{path}.stale{os.getpid()}'
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    # not the one we judged stale: put it back (if the name is still free)
    if read_lock(aside) != stale:
        with contextlib.suppress(FileExistsError):
            os.link(aside, path)
    remove_quietly(aside)


def lock_message(folder, path, owner):
    if not owner:
        return f"{folder} is locked by {path}, which cannot be read: if no other command uses the folder, delete it"
    where = (
        'this host' if owner.get('host') == socket.gethostname() else f"host {owner.get('host')}"
    )
    return (
        f"{folder} is in use by pid {owner.get('pid')} on {where} ({owner.get('command')}, since "
        f"{owner.get('since')}): wait for it to finish or stop it; if it is not running, delete {path}"
    )
