"""Tests for files.py: atomic writes, full disks and read-only folders as one line, one writer per folder."""

import errno
import json
import os
import socket
import subprocess
import sys

import pytest

from ledgergpt import files
from ledgergpt.config import UserError


def test_write_text_atomic_uses_a_file_of_this_process_and_cleans_up(tmp_path, monkeypatch):
    path = str(tmp_path / 'a.json')
    files.save_json(path, {'x': 1})
    assert json.load(open(path)) == {'x': 1} and os.listdir(tmp_path) == ['a.json']
    renames = []
    real_replace = os.replace

    def replace_then_fail(src, dst):
        renames.append(src)
        raise OSError(errno.EIO, 'Input/output error')

    monkeypatch.setattr(os, 'replace', replace_then_fail)
    with pytest.raises(OSError):
        files.write_text_atomic(path, 'new text')
    # two processes writing one file never share a temporary name
    assert renames == [f'{path}.tmp{os.getpid()}']
    # the old file, untouched
    assert os.listdir(tmp_path) == ['a.json'] and json.load(open(path)) == {'x': 1}
    monkeypatch.setattr(os, 'replace', real_replace)


def test_human_bytes():
    assert [files.human_bytes(n) for n in (0, 999, 1000, 1_234_567, 52e9, 3.2e12, 4.5e15)] == [
        '0 bytes',
        '999 bytes',
        '1.0 KB',
        '1.2 MB',
        '52.0 GB',
        '3.2 TB',
        '4,500.0 TB',
    ]


def through_disk_errors(folder, error, **kwargs):
    """What comes out of files.disk_errors(folder) when `error` is raised inside it."""
    with pytest.raises(Exception) as info:
        with files.disk_errors(folder, **kwargs):
            raise error
    return info.value


def test_disk_errors_turn_a_full_disk_into_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(files, 'free_bytes', lambda folder: 1_234_567)
    folder = str(tmp_path)
    error = through_disk_errors(
        folder, OSError(errno.ENOSPC, 'No space left on device', f'{folder}/x.bin')
    )
    assert type(error) is UserError and str(error) == (
        f"disk full writing {folder}/x.bin: 1.2 MB free on the filesystem of {folder}: free some space or choose "
        f"another folder, then rerun (what was complete is kept)"
    )
    error = through_disk_errors(
        folder, OSError(errno.EDQUOT, 'Disk quota exceeded'), needed_bytes=2e9
    )
    assert str(error).startswith(
        f"disk full writing {folder}: 1.2 MB free on the filesystem of {folder}, about 2.0 GB needed: "
    )
    # torch.save reports a full disk as a RuntimeError from its zip writer
    for message in (
        '[enforce fail at inline_container.cc:603] . unexpected pos 1536 vs 1445',
        'PytorchStreamWriter failed writing file data/0: file write failed',
    ):
        error = through_disk_errors(folder, RuntimeError(message))
        assert type(error) is UserError and str(error).startswith(
            f"disk full writing {folder}: 1.2 MB free"
        )


def test_disk_errors_read_only_and_what_is_not_theirs(tmp_path):
    folder = str(tmp_path / 'out')
    error = through_disk_errors(
        folder, OSError(errno.EROFS, 'Read-only file system', f'{folder}/ckpt.pt')
    )
    assert type(error) is UserError and str(error) == (
        f"cannot write {folder}/ckpt.pt (read-only filesystem): {folder} must be on a writable filesystem and "
        f"writable by this user; choose another folder"
    )
    for path in (folder, str(tmp_path)):  # the folder, or a parent it is made in
        error = through_disk_errors(
            folder, PermissionError(errno.EACCES, 'Permission denied', path)
        )
        assert type(error) is UserError and str(error).startswith(
            f"cannot write {path} (permission denied): "
        )
    # errors that are not about writing the folder go through unchanged
    for error in (
        FileNotFoundError(errno.ENOENT, 'No such file or directory', f'{folder}/x'),
        PermissionError(errno.EACCES, 'Permission denied', str(tmp_path / 'input.txt')),  # an input
        RuntimeError('CUDA out of memory'),
    ):
        assert through_disk_errors(folder, error) is error


def dead_pid():
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, '-c', 'pass'])
    child.wait()
    return child.pid


def test_folder_lock(tmp_path):
    folder = str(tmp_path / 'new' / 'out')
    with files.folder_lock(folder, 'prepare.py pystdlib') as path:
        # the folder is made too
        assert path == os.path.join(folder, '.lock') and os.listdir(folder) == ['.lock']
        owner = json.load(open(path))
        assert (owner['pid'], owner['host'], owner['command']) == (
            os.getpid(),
            socket.gethostname(),
            'prepare.py pystdlib',
        )
        with pytest.raises(
            UserError,
            match=f'^{folder} is in use by pid {os.getpid()} on this host '
            r'\(prepare.py pystdlib, since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\): '
            f'wait for it to finish or stop it; if it is not running, delete {path}$',
        ):
            with files.folder_lock(folder, 'train.py'):
                pass
    assert os.listdir(folder) == []  # released
    with pytest.raises(KeyError):
        with files.folder_lock(folder, 'x'):
            raise KeyError('released on an error too')
    assert os.listdir(folder) == []


def test_folder_lock_stale_foreign_and_unreadable(tmp_path):
    folder = str(tmp_path)
    path = os.path.join(folder, '.lock')
    stale = {
        'pid': dead_pid(),
        'host': socket.gethostname(),
        'command': 'prepare.py fineweb_edu',
        'since': '-',
    }
    json.dump(stale, open(path, 'w'))
    with files.folder_lock(folder, 'prepare.py pystdlib'):  # its owner is gone: taken over
        assert json.load(open(path))['pid'] == os.getpid()
    assert os.listdir(folder) == []
    # a process on another host: we cannot tell
    json.dump(dict(stale, host='gpu-node-7'), open(path, 'w'))
    with pytest.raises(
        UserError, match=r'is in use by pid \d+ on host gpu-node-7 \(prepare.py fineweb_edu'
    ):
        with files.folder_lock(folder, 'prepare.py pystdlib'):
            pass
    open(path, 'w').write('{"pid": 12')
    with pytest.raises(
        UserError,
        match=f'^{folder} is locked by {path}, which cannot be read: if no other command uses the folder, delete it$',
    ):
        with files.folder_lock(folder, 'prepare.py pystdlib'):
            pass
    assert os.listdir(folder) == ['.lock']  # someone else's lock is never removed


def test_folder_lock_keeps_a_lock_that_was_replaced(tmp_path):
    folder = str(tmp_path)
    with files.folder_lock(folder, 'a') as path:
        other = {'pid': 1, 'host': 'elsewhere', 'command': 'b', 'since': '-'}
        # e.g. the user deleted ours and another command took the folder
        json.dump(other, open(path, 'w'))
    assert json.load(open(path)) == other
