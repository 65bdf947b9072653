"""
files.py: writes that lose nothing (atomic_write), a full disk or read-only folder as one line
(disk_errors), and folders with one writer at a time (folder_lock). Standard library only.
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
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


@contextlib.contextmanager
def atomic_write(path, mode='w'):
    """Yield a temporary file opened with `mode`, flushed and renamed to `path` when the block ends:
    a reader (or a rerun after a crash) sees the old file or the new, never half. The pid in its
    name keeps processes apart; a failed write (Ctrl-C too) removes it."""
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


def load_json(path):
    """A JSON file's value (bytes in, so a file that is not text at all is a ValueError too)."""
    with open(path, 'rb') as f:
        return json.loads(f.read())


# --------------------------------------------------------------------------------------------------
# Full disks and read-only folders. A write short of space raises OSError ENOSPC (EDQUOT over a
# quota); torch.save raises RuntimeError from its zip writer instead ("... file write failed", or
# "unexpected pos N vs M" when a short write shows up as a wrong offset).

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
    """Free bytes for this user on the filesystem of `folder` (or of its nearest parent)."""
    folder = os.path.abspath(folder)
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    return shutil.disk_usage(folder).free


@contextlib.contextmanager
def disk_errors(folder, needed_bytes=None):
    """A full disk or a folder that cannot be written, inside the block, as one UserError naming the
    folder and its free space, not a traceback from deep inside a write (the block's writes clean up
    after themselves: atomic_write does)."""
    try:
        yield
    except OSError as e:
        # a file elsewhere that cannot be read (an input) is not ours to explain
        if not (e.errno in FULL or e.errno in NOT_WRITABLE and on_the_way(e.filename, folder)):
            raise
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
    """Whether writing `folder` can fail at `path`: the folder, a file in it, or a parent."""
    if not path:
        return True
    path, folder = os.path.abspath(path), os.path.abspath(folder)
    return os.path.commonpath([path, folder]) in (path, folder)


def full_disk_message(folder, where, needed_bytes):
    needed = f", about {human_bytes(needed_bytes)} needed" if needed_bytes else ''
    return (
        f"disk full writing {where}: {human_bytes(free_bytes(folder))} free on the filesystem of "
        f"{folder}{needed}: free some space or choose another folder, then rerun (what was "
        f"complete is kept)"
    )


# --------------------------------------------------------------------------------------------------
# One writer per folder: `.lock` in the folder, a JSON file with its owner's pid, host, command and
# start time. It is created whole or not at all (written to a file of our own, then hard-linked to
# `.lock`: link fails if the name exists, on local disks and NFS alike) and removed when the block
# ends, by an exception too. A process killed outright leaves it behind: on this host a lock whose
# pid no longer runs is stale and taken over; a live one, or one from another host (whose processes
# we cannot see), is one line naming its owner.
def process_alive(pid):
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


def read_lock(path):
    """A lock file's owner; None if it vanished meanwhile (released), {} if unreadable."""
    try:
        owner = load_json(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


@contextlib.contextmanager
def folder_lock(folder, command):
    """Hold `folder`/.lock for the block (the folder is made if needed) and yield its path. Another
    live holder, or a folder that cannot be made or written, is one UserError line."""
    path = os.path.join(folder, '.lock')
    me = dict(pid=os.getpid(), host=socket.gethostname(), command=command)
    me['since'] = time.strftime('%Y-%m-%d %H:%M:%S')
    mine = f'{path}.{me["pid"]}'
    with disk_errors(folder):
        try:
            os.makedirs(folder, exist_ok=True)
        # the folder's name, or a parent's, is a file
        except (FileExistsError, NotADirectoryError) as e:
            raise UserError(
                f"cannot make the folder {folder}: {e.filename or folder} is a file, not a folder; "
                f"choose another folder"
            ) from None
        save_json(mine, me)
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
            pid = owner.get('pid')
            if owner.get('host') != me['host'] or not isinstance(pid, int) or process_alive(pid):
                raise UserError(lock_message(folder, path, owner))
            take_over(path, owner)
        else:
            raise UserError(f"could not take {path}: other processes keep taking it; try again")
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
        return (
            f"{folder} is locked by {path}, which cannot be read: if no other command uses the "
            f"folder, delete it"
        )
    host, pid, command, since = (owner.get(key) for key in ('host', 'pid', 'command', 'since'))
    where = 'this host' if host == socket.gethostname() else f"host {host}"
    return (
        f"{folder} is in use by pid {pid} on {where} ({command}, since {since}): wait for it to "
        f"finish or stop it; if it is not running, delete {path}"
    )
