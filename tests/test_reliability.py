"""
test_reliability.py: what happens around the training core when things go wrong. A signal ends a run with a
checkpoint and the command that resumes it (bit-exactly); a damaged checkpoint or pointer is one line that names
the damage and the checkpoint to use instead; a resume that changes the data, schedule or optimizer is refused
unless allowed; every config key's bad value is one line naming the key, the value and what is allowed.
"""

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

import helpers
import sample
import train
from ledgergpt import checkpoint, config, data
from ledgergpt.config import ConfigError, load_config

# the repo's root, where train.py is
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(helpers.TINY_RUN, eval_tokens=256, keep_ckpts=5)


def write_config(tmp_path, data, **overrides):
    return helpers.write_config(tmp_path / 'config.py', dict(TINY, data=data, **overrides))


def losses(out_dir):
    """{step: loss} of the logged steps; a step logged twice (after a resume) keeps its last loss."""
    import json

    with open(os.path.join(out_dir, 'metrics.jsonl')) as f:
        return {
            e['step']: e['loss'] for e in map(json.loads, f) if 'loss' in e and 'event' not in e
        }


# -----------------------------------------------------------------------------------------------------
# Signals.


def start_and_signal(command, signals, after='step      2/'):
    """Start train.py, wait for a line of stdout starting with `after`, send `signals`; -> (returncode, stderr)."""
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C as at a terminal: a suite started in the background (`pytest &`) hands its children SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    for line in process.stdout:
        if line.startswith(after):
            break
    for signum in signals:
        process.send_signal(signum)
        time.sleep(0.05)
    out, err = process.communicate(timeout=120)
    return process.returncode, err


def test_sigterm_writes_a_checkpoint_and_the_resume_command_continues_bit_exactly(
    pystdlib_data, tmp_path
):
    config = write_config(tmp_path, pystdlib_data, train_tokens=1000 * 256, ckpt_every=1000)
    code, err = start_and_signal(
        [sys.executable, 'train.py', config, f'--out_dir={tmp_path / "out"}'], [signal.SIGTERM]
    )
    assert code == 128 + signal.SIGTERM, err
    last = err.strip().splitlines()[-1]
    assert (
        last.startswith('stopped by SIGTERM after step ') and 'resume with: python train.py' in last
    ), err
    stopped = int(last.split('after step ')[1].split(':')[0])
    assert checkpoint.latest(tmp_path / 'out').endswith(f'step_{stopped:07d}')
    resume = shlex.split(last.split('resume with: ')[1])
    assert resume[:2] == ['python', 'train.py'] and resume[-1] == '--resume'
    assert (
        subprocess.run(
            [sys.executable] + resume[1:] + [f'--max_steps={stopped + 3}'],
            cwd=ROOT,
            capture_output=True,
        ).returncode
        == 0
    )
    # the same steps in one uninterrupted run
    assert (
        train.main([config, f'--out_dir={tmp_path / "whole"}', f'--max_steps={stopped + 3}']) == 0
    )
    whole, resumed = losses(tmp_path / 'whole'), losses(tmp_path / 'out')
    assert [resumed[s] for s in range(1, stopped + 4)] == [whole[s] for s in range(1, stopped + 4)]


def test_the_same_signal_twice_exits_at_once(pystdlib_data, tmp_path):
    config = write_config(tmp_path, pystdlib_data, train_tokens=1000 * 256, ckpt_every=1000)
    code, err = start_and_signal(
        [sys.executable, 'train.py', config, f'--out_dir={tmp_path / "out"}'],
        [signal.SIGINT, signal.SIGINT],
    )
    assert code == 128 + signal.SIGINT and 'SIGINT again: exiting now' in err, err
    # step 0 at least: what was complete stays
    assert checkpoint.latest(tmp_path / 'out') is not None


# A slow import of numpy (the first slow import of train.py and prepare.py): it says so on stdout, so a signal
# lands inside it; the script then runs as `python SCRIPT ARGS` would
SLOW_IMPORTS = """
import builtins, runpy, sys, time
real_import = builtins.__import__
def slow_import(name, *args, **kwargs):
    if name == 'numpy' and 'numpy' not in sys.modules:
        print('importing numpy', flush=True)
        time.sleep(120)
    return real_import(name, *args, **kwargs)
builtins.__import__ = slow_import
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name='__main__')
"""

# train.py with a start-up that takes a while after out_dir is locked (building the run)
SLOW_START = """
import sys, time, train
build_run = train.build_run
def slow_build_run(*args, **kwargs):
    print('building the run', flush=True)
    time.sleep(120)
    return build_run(*args, **kwargs)
train.build_run = slow_build_run
sys.exit(train.main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    'script, signum, line',
    [
        ('prepare.py', signal.SIGINT, 'interrupted (Ctrl-C)'),
        ('prepare.py', signal.SIGTERM, 'interrupted (SIGTERM)'),
        ('train.py', signal.SIGTERM, 'interrupted (SIGTERM)'),
    ],
)
def test_a_signal_during_the_imports_is_one_line(tmp_path, script, signum, line):
    args = (
        ['pystdlib', '--out', str(tmp_path / 'data')]
        if script == 'prepare.py'
        else ['configs/pystdlib_cpu.py']
    )
    code, err = start_and_signal(
        [sys.executable, '-c', SLOW_IMPORTS, script, *args], [signum], after='importing'
    )
    assert (
        code == 128 + signum
        and err == f"{line}: what was complete is kept; rerun the same command to carry on\n"
    )


def test_sigterm_during_the_start_up_is_one_line_and_releases_the_lock(pystdlib_data, tmp_path):
    config = write_config(tmp_path, pystdlib_data, train_tokens=8 * 256)
    command = [sys.executable, '-c', SLOW_START, config, f'--out_dir={tmp_path / "out"}']
    code, err = start_and_signal(command, [signal.SIGTERM], after='building the run')
    assert (
        code == 143
        and err
        == "interrupted (SIGTERM): what was complete is kept; rerun the same command to carry on\n"
    )
    assert '.lock' not in os.listdir(tmp_path / 'out')  # released on the way out


# train.py whose step probe, at its first timed step, runs two finalizers that each wait for a signal
# (as the probe's gc runs torch's weakref callbacks, where Python drops a KeyboardInterrupt), started
# as at a terminal or as a script's `python train.py &` starts it (SIGINT ignored)
PROBE_FINALIZERS = """
import runpy, signal, sys, time, weakref
from ledgergpt import live_ledger
if sys.argv[1] == 'ignored':
    signal.signal(signal.SIGINT, signal.SIG_IGN)
def wait_for_a_signal():
    print('waiting in a finalizer', flush=True)
    for _ in range(100):
        time.sleep(0.1)
class Held:
    pass
clock, waited = live_ledger.PROBE_CLOCK, []
def clock_with_finalizers():
    while len(waited) < 2:
        waited.append(weakref.finalize(Held(), wait_for_a_signal))
    return clock()
live_ledger.PROBE_CLOCK = clock_with_finalizers
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name='__main__')
"""


@pytest.mark.parametrize('sigint', ['terminal', 'ignored'])
def test_ctrl_c_during_the_step_probe_is_one_line(tmp_path, sigint):
    """Ctrl-C during the step probe was swallowed (the run trained on, rc 0). Each of two
    SIGINTs lands in a finalizer of the probe: the run stops after the probe, before its first
    checkpoint, in one line, exit 130."""
    config = write_config(tmp_path, 'synthetic', train_tokens=8 * 256, dtype='float32')
    process = subprocess.Popen(
        [sys.executable, '-c', PROBE_FINALIZERS, sigint, 'train.py', config]
        + [f'--out_dir={tmp_path / "out"}'],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a fresh probe cache, so that the step probe runs; the CPU, where it runs
        env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path / 'cache'), CUDA_VISIBLE_DEVICES=''),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    for line in process.stdout:
        if line.startswith('waiting in a finalizer'):
            process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130 and err == (
        "interrupted (Ctrl-C): what was complete is kept; rerun the same command to carry on\n"
    ), err
    assert checkpoint.latest(tmp_path / 'out') is None  # stopped in the start-up, nothing trained


def test_a_reader_that_leaves_early_ends_the_command_quietly():
    # `python export.py ... | head`: head has gone when the command writes; every command's main (config.cli) ends
    # quietly with 141, as a command killed by SIGPIPE does, not with a BrokenPipeError traceback. ledger.py's
    # report is the command here: standard library only, it writes pages without a checkpoint or a probe
    process = subprocess.Popen(
        [sys.executable, 'ledger.py', 'configs/h200_1b3.py'],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    process.stdout.close()  # long before the command writes
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == 128 + signal.SIGPIPE and err == '', err


# -----------------------------------------------------------------------------------------------------
# Damaged checkpoints: one line naming the damage and the checkpoint to use instead.


@pytest.fixture
def eight_steps(pystdlib_data, tmp_path):
    """A tiny run of 8 steps with checkpoints at 0, 4 and 8; -> (config, out_dir)."""
    config = write_config(tmp_path, pystdlib_data, train_tokens=8 * 256, ckpt_every=4)
    assert train.main([config, f'--out_dir={tmp_path / "out"}']) == 0
    return config, tmp_path / 'out'


def resume_error(config, out_dir, capsys, *flags):
    capsys.readouterr()
    assert train.main([config, f'--out_dir={out_dir}', '--resume', '--max_steps=10', *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith('error: ') and '\n' not in err and 'Traceback' not in err
    return err


@pytest.mark.parametrize(
    'damage,message',
    [
        (lambda folder: os.remove(folder / 'train_state.pt'), 'train_state.pt is missing'),
        (
            lambda folder: os.truncate(folder / '__0_0.distcp', 1000),
            '__0_0.distcp has 1,000 bytes, the manifest says',
        ),
        (
            lambda folder: flip_a_byte(folder / 'train_state.pt'),
            "train_state.pt differs from the manifest's sha256",
        ),
    ],
)
def test_a_damaged_latest_checkpoint_names_the_damage_and_an_earlier_one(
    eight_steps, capsys, damage, message
):
    config, out = eight_steps
    damage(out / 'ckpt' / 'step_0000008')
    err = resume_error(config, out, capsys)
    assert f"checkpoint {out / 'ckpt' / 'step_0000008'} is damaged: {message}" in err
    advice = f"--resume={out / 'ckpt' / 'step_0000004'}"
    assert err.endswith(advice)
    assert sample.main([str(out / 'ckpt' / 'step_0000008')]) == 2  # sample.py checks it too
    assert message in capsys.readouterr().err
    # the advice works
    assert train.main([config, f'--out_dir={out}', advice, '--max_steps=10']) == 0


def flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_garbage_in_latest_is_one_line(eight_steps, capsys):
    config, out = eight_steps
    (out / 'ckpt' / 'LATEST').write_bytes(b'\x00\xffnot a checkpoint\n')
    err = resume_error(config, out, capsys)
    assert 'LATEST names' in err and "which is not a checkpoint folder there" in err
    assert err.endswith(f"--resume={out / 'ckpt' / 'step_0000008'}")


def test_latest_naming_a_deleted_folder_sends_no_one_back_and_forth(eight_steps, capsys):
    """LATEST names a checkpoint deleted by hand. With none left there is nothing to continue: --resume says to run
    without it, and without it the run starts (its first checkpoint rewrites LATEST). With one left, each tool names
    it in its own terms: train.py's --resume=, a path for sample.py, evals.py and export.py (they have no --resume)."""
    config, out = eight_steps
    newest = out / 'ckpt' / 'step_0000008'
    shutil.rmtree(newest)
    capsys.readouterr()
    assert sample.main([str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"the newest complete checkpoint is {out / 'ckpt' / 'step_0000004'}")
    assert '--resume' not in err
    assert resume_error(config, out, capsys).endswith(f"--resume={out / 'ckpt' / 'step_0000004'}")
    for step in ('step_0000000', 'step_0000004'):
        shutil.rmtree(out / 'ckpt' / step)
    assert resume_error(config, out, capsys) == (
        f"error: --resume: no complete checkpoint at {out / 'ckpt'}: run without --resume to start"
    )
    assert train.main([config, f'--out_dir={out}', '--max_steps=4']) == 0  # the advice works
    assert (out / 'ckpt' / 'LATEST').read_text() == 'step_0000004\n'


def test_a_damaged_only_checkpoint_sends_no_one_back_and_forth(eight_steps, capsys):
    """The one checkpoint left is damaged: train.py's --resume cannot use it, and a run without --resume would not
    overwrite it, so the advice is to move it out of the way; sample.py's names no option it lacks."""
    config, out = eight_steps
    for step in ('step_0000000', 'step_0000004'):
        shutil.rmtree(out / 'ckpt' / step)
    newest = out / 'ckpt' / 'step_0000008'
    os.remove(newest / 'train_state.pt')
    assert resume_error(config, out, capsys) == (
        f"error: checkpoint {newest} is damaged: train_state.pt is missing; there is no complete one before it: "
        f"delete {out / 'ckpt'} (or set --out_dir to another folder) to start again"
    )
    capsys.readouterr()
    assert sample.main([str(out)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: checkpoint {newest} is damaged: train_state.pt is missing; there is no complete one before it"
    )
    shutil.rmtree(out / 'ckpt')
    assert train.main([config, f'--out_dir={out}', '--max_steps=4']) == 0  # the advice works


def test_a_checkpoint_half_deleted_by_a_kill_during_pruning_is_reclaimed(
    pystdlib_data, tmp_path, monkeypatch
):
    """Pruning killed midway leaves step_N/ with some files: its manifest goes first, so the folder never passes for
    complete, and the next save reclaims it (at 1.3B such a folder is ~16 GB). Complete checkpoints stay."""
    config = write_config(
        tmp_path, pystdlib_data, train_tokens=16 * 256, ckpt_every=4, keep_ckpts=3
    )
    out = tmp_path / 'out'
    assert train.main([config, f'--out_dir={out}', '--max_steps=8']) == 0  # checkpoints 0, 4 and 8
    ckpt = out / 'ckpt'
    removed, rmtree = [], shutil.rmtree

    # a kill during the first prune of the run resumed below
    def killed_in_step_0(path, *args, **kwargs):
        if os.path.basename(path) == 'step_0000000' and not removed:
            removed.append(os.path.exists(os.path.join(path, checkpoint.MANIFEST)))
            os.remove(os.path.join(path, '.metadata'))
            raise KeyboardInterrupt
        return rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, 'rmtree', killed_in_step_0)
    assert train.main([config, f'--out_dir={out}', '--resume', '--max_steps=12']) == 130
    half = ckpt / 'step_0000000'
    assert removed == [False] and half.is_dir() and os.listdir(half)  # files left, no manifest
    assert checkpoint.complete_checkpoints(out) == [str(ckpt / f'step_{s:07d}') for s in (4, 8, 12)]
    monkeypatch.setattr(shutil, 'rmtree', rmtree)
    assert train.main([config, f'--out_dir={out}', '--resume', '--max_steps=16']) == 0
    assert sorted(os.listdir(ckpt)) == ['LATEST', 'step_0000008', 'step_0000012', 'step_0000016']


class Payload:
    """What a shared train_state.pt could hold: unpickling it calls a function of the file's choosing."""

    def __reduce__(self):
        return (print, ('the payload ran',))


def test_train_state_needs_no_unpickling_of_code(eight_steps, capsys):
    """train_state.pt holds tensors and plain values, read with torch.load(weights_only=True): a shared run folder
    runs no code of its own. A file that needs more is refused in one line by every tool; the RNG states round-trip
    exactly; a checkpoint written before (numpy's RNG state as an array) still resumes."""
    import random

    import numpy as np

    config, out = eight_steps
    newest = out / 'ckpt' / 'step_0000008'
    saved = torch.load(newest / 'train_state.pt', weights_only=True)
    assert saved['step'] == 8 and saved['world_size'] == 1
    # the RNG states, through the file's form, restore every stream exactly
    torch.save({'rng': checkpoint.rng_states()}, newest.parent / 'rng.pt')
    drawn = random.random(), np.random.rand(), torch.rand(1).item()
    checkpoint.set_rng_states(torch.load(newest.parent / 'rng.pt', weights_only=True)['rng'])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == drawn
    os.remove(newest.parent / 'rng.pt')
    # the form written before: numpy's state as np.random.get_state() gives it, an array among them
    old = dict(saved, rng=[dict(saved['rng'][0], numpy=np.random.get_state())])
    torch.save(old, newest / 'train_state.pt')
    os.remove(newest / checkpoint.MANIFEST)
    checkpoint.write_manifest(newest)
    checkpoint.set_rng_states(checkpoint.read_state(str(newest))['rng'])
    reference = np.random.RandomState()
    reference.set_state(old['rng'][0]['numpy'])
    assert np.random.rand() == reference.rand()
    # a file that needs more than that: refused before anything in it runs, by train.py and the tools alike
    torch.save(dict(saved, payload=Payload()), newest / 'train_state.pt')
    os.remove(newest / checkpoint.MANIFEST)
    checkpoint.write_manifest(newest)
    expected = (
        f"error: {newest / 'train_state.pt'} holds more than tensors and plain values (builtins.print), which "
        f"only running code from the file could read: this project never writes such a file; refused (if you "
        f"trust it, load it yourself with torch.load(weights_only=False))"
    )
    assert resume_error(config, out, capsys) == expected
    assert sample.main([str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == expected and 'the payload ran' not in captured.out


# -----------------------------------------------------------------------------------------------------
# A full disk during a checkpoint, and two runs on one folder.


@pytest.mark.parametrize(
    'failure',
    [
        OSError(28, 'No space left on device'),
        RuntimeError('[enforce fail at inline_container.cc:672] . unexpected pos 6 vs 4'),
    ],
)
def test_a_full_disk_during_a_checkpoint_is_one_line_and_loses_nothing(
    pystdlib_data, tmp_path, capsys, monkeypatch, failure
):
    config = write_config(tmp_path, pystdlib_data, train_tokens=12 * 256, ckpt_every=4)
    save = torch.save

    # DCP's writer and train_state.pt both go through torch.save
    def full_at_step_8(obj, path, *args, **kwargs):
        if 'tmp_step_0000008' in str(path):
            if isinstance(failure, OSError):
                raise OSError(failure.errno, failure.strerror, str(path))
            raise failure
        return save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, 'save', full_at_step_8)
    capsys.readouterr()
    assert train.main([config, f'--out_dir={tmp_path / "out"}']) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith('error: disk full writing ')
        and 'free on the filesystem of' in err
        and '\n' not in err
    )
    assert 'about 2.4 MB needed' in err  # the ledger's checkpoint size: 12 bytes per parameter
    assert sorted(os.listdir(tmp_path / 'out' / 'ckpt')) == [
        'LATEST',
        'step_0000000',
        'step_0000004',
    ]
    assert not os.path.exists(tmp_path / 'out' / '.lock')  # released on the way out
    monkeypatch.setattr(torch, 'save', save)
    assert train.main([config, f'--out_dir={tmp_path / "whole"}']) == 0
    assert train.main([config, f'--out_dir={tmp_path / "out"}', '--resume']) == 0
    # the good state resumed bit-exactly
    assert losses(tmp_path / 'out') == losses(tmp_path / 'whole')


def test_a_second_run_in_the_same_out_dir_is_one_line_naming_the_first(pystdlib_data, tmp_path):
    config = write_config(tmp_path, pystdlib_data, train_tokens=1000 * 256, ckpt_every=1000)
    out = tmp_path / 'out'
    first = subprocess.Popen(
        [sys.executable, 'train.py', config, f'--out_dir={out}'],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in first.stdout:
            if line.startswith('step '):
                break
        second = subprocess.run(
            [sys.executable, 'train.py', config, f'--out_dir={out}', '--resume'],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert second.returncode == 2 and second.stderr.count('\n') == 1, second.stderr
        assert second.stderr.startswith(
            f'error: {out} is in use by pid {first.pid} on this host (train.py '
        )
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
    # a lock left by a process that is gone (killed outright) is stale: the next run takes it over
    (out / '.lock').write_text(
        '{"pid": 999999999, "host": "%s", "command": "train.py", "since": "then"}'
        % socket.gethostname()
    )
    assert train.main([config, f'--out_dir={out}', '--resume', '--max_steps=3']) == 0


def test_an_out_dir_that_cannot_be_a_folder_is_one_line(
    pystdlib_data, tmp_path, capsys, monkeypatch
):
    config = write_config(tmp_path, pystdlib_data, train_tokens=4 * 256)
    (tmp_path / 'a_file').write_text('not a folder')
    for out_dir, culprit in (
        (tmp_path / 'a_file', tmp_path / 'a_file'),
        (tmp_path / 'a_file' / 'out', None),
    ):
        capsys.readouterr()
        assert train.main([config, f'--out_dir={out_dir}']) == 2
        err = capsys.readouterr().err
        assert (
            err.startswith(f'error: cannot make the folder {out_dir}: ') and err.count('\n') == 1
        ), err
        assert f'{culprit or out_dir} is a file, not a folder; choose another folder' in err
    real_makedirs = os.makedirs

    # what a read-only filesystem answers (root writes anywhere else)
    def read_only(name, *args, **kwargs):
        if str(name).startswith(str(tmp_path / 'ro')):
            raise OSError(30, 'Read-only file system', str(name))
        return real_makedirs(name, *args, **kwargs)

    monkeypatch.setattr(os, 'makedirs', read_only)
    capsys.readouterr()
    assert train.main([config, f'--out_dir={tmp_path / "ro" / "out"}']) == 2
    assert capsys.readouterr().err == (
        f"error: cannot write {tmp_path / 'ro' / 'out'} (read-only filesystem): {tmp_path / 'ro' / 'out'} must be "
        f"on a writable filesystem and writable by this user; choose another folder\n"
    )


def test_a_token_id_past_the_models_vocab_is_one_line_before_anything_is_written(
    pystdlib_data, tmp_path, capsys
):
    """A hand-made or foreign shard (no max_token_id in its meta.json): read once, caught before the model."""
    import json

    import numpy as np

    folder = tmp_path / 'data'
    folder.mkdir()
    # its shards' counts
    meta = dict(data.load_meta(pystdlib_data), train_tokens=2000, val_tokens=2000)
    meta.pop('max_token_id', None)
    (folder / 'meta.json').write_text(json.dumps(meta))
    tokens = np.arange(2000, dtype=np.uint16) % 512
    data.write_shard(str(folder / 'mine_val_000000.bin'), tokens)
    tokens[1234] = 600  # one id past the 512-token vocab
    data.write_shard(str(folder / 'mine_train_000001.bin'), tokens)
    config = write_config(tmp_path, str(folder), train_tokens=4 * 256)
    capsys.readouterr()
    assert train.main([config, f'--out_dir={tmp_path / "out"}']) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        f"error: {folder / 'mine_train_000001.bin'}: token id 600 at position 1,234 is outside the model's vocab of 512"
    )
    assert not os.path.exists(tmp_path / 'out' / 'ckpt')


@pytest.mark.parametrize('split', ['train', 'val'])
def test_a_damaged_shard_under_a_trusted_meta_is_one_line_naming_shard_and_position(
    pystdlib_data, tmp_path, capsys, split
):
    """meta.json's max_token_id vouches for the shards, but one was damaged since: the ids read are checked (a max
    per batch on the host), so the embedding never sees it."""
    import json
    import shutil

    import numpy as np

    folder = tmp_path / 'data'
    shutil.copytree(pystdlib_data, folder)
    meta = json.loads((folder / 'meta.json').read_text())
    assert meta['max_token_id'] < 512  # trusted: the check before training reads no shard
    paths = data.list_shards(str(folder), split)
    if split == 'train':  # in a sequence of the third step (8 sequences a step): the run gets there
        stream = data.ShardStream(
            [data.open_shard(p) for p in paths], 32, seed=TINY.get('seed', 1337)
        )
        shard, start = stream.locate(2 * 8 + 3)
        path, position = paths[shard], start + 5
    else:  # the fixed val set: the first tokens of the split
        path, position = paths[0], 777
    tokens = np.array(data.open_shard(path))
    tokens[position] = 40_000  # a flipped byte
    data.write_shard(path, tokens)
    config = write_config(tmp_path, str(folder), train_tokens=8 * 256, eval_tokens=1024)
    capsys.readouterr()
    assert train.main([config, f'--out_dir={tmp_path / "out"}']) == 2
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and err.startswith(
        f"error: {os.path.abspath(path)}: token id 40,000 at position {position:,} is outside the model's vocab of 512 "
        f"(ids 0..511), though meta.json says bpe:512 (512 tokens)"
    ), err
    assert not os.path.exists(tmp_path / 'out' / '.lock')  # the lock released on the way out


# -----------------------------------------------------------------------------------------------------
# A resume may not silently change what the run is.


def test_resume_refuses_changes_that_break_continuation_unless_allowed(eight_steps, capsys):
    config, out = eight_steps
    err = resume_error(config, out, capsys, '--lr=0.001', '--seed=7')
    assert (
        "with a changed seed 1337 -> 7, lr 0.003 -> 0.001" in err
        and "--allow_change=seed,lr" in err
    )
    capsys.readouterr()
    assert (
        train.main(
            [
                config,
                f'--out_dir={out}',
                '--resume',
                '--max_steps=10',
                '--lr=0.001',
                '--allow_change=lr',
                '--log_every=2',
            ]
        )
        == 0
    )
    out_text = capsys.readouterr().out
    assert 'resume: lr changed from 0.003 to 0.001' in out_text
    assert 'resume: log_every changed from 1 to 2' in out_text  # free to change, but said


def test_allow_change_names_only_keys_that_need_it(eight_steps, capsys):
    config, out = eight_steps
    assert 'only these keys need it' in resume_error(
        config, out, capsys, '--allow_change=log_every'
    )
    capsys.readouterr()
    assert train.main([config, f'--out_dir={out}/new', '--allow_change=lr']) == 2
    assert '--allow_change goes with --resume' in capsys.readouterr().err


# -----------------------------------------------------------------------------------------------------
# Every key's type and range, from config files and from the command line alike.

BAD = {  # a value each rule must refuse
    'arch': 'gpt3',
    'attention': 'linear',
    'norm': 'batchnorm',
    'mlp': 'relu3',
    'positions': 'alibi',
    'qk_norm': 'rms',
    'loss': 'fused',
    'optimizer': 'sgd',
    'logit_softcap': -15.0,
    'muon_lr': -0.02,
    'muon_momentum': 1.5,
    'muon_ns_steps': 100,
    'n_layer': 0,
    'n_head': -2,
    'n_embd': 0,
    'vocab_size': -3,
    'block_size': 0,
    'n_kv_head': -1,
    'ffn_hidden': -1,
    'norm_eps': 0.0,
    'rope_theta': -1.0,
    'out_dir': '',
    'data': '',
    'seed': -1,
    'train_tokens': 0,
    'max_steps': -1,
    'train_minutes': -1.0,
    'dataset_tokens': -1,
    'batch_tokens': 0,
    'micro_batch': 0,
    'batch_ramp_tokens': -1,
    'batch_ramp_start': 0,
    'lr': -0.001,
    'min_lr_ratio': 1.5,
    'schedule': 'linear',
    'warmup_frac': 1.0,
    'decay_frac': 0.0,
    'weight_decay': -0.1,
    'beta1': 2.0,
    'beta2': 1.0,
    'eps': 0.0,
    'collective_timeout_s': 0,
    'grad_clip': -1.0,
    'dtype': 'float16',
    'parallel': 'zero3',
    'log_every': 0,
    'eval_every': 0,
    'eval_tokens': 0,
    'sample_every': -1,
    'sample_tokens': -1,
    'ckpt_every': 0,
    'keep_ckpts': 0,
    'spike_factor': 0.0,
    'spike_window': 0,
    'spike_min_std': -0.1,
    'max_rollbacks': -1,
    'gpu': '',
    'n_gpu': 0,
    'mfu': 1.5,
    'usd_per_gpu_hour': -1.0,
    'hellaswag_every': -1,
    'hellaswag_items': -1,
    'eval_tasks': 'arc_easy,hellaswag',  # HellaSwag has a key of its own (hellaswag_every)
    'eval_tasks_every': -1,
    'eval_tasks_items': -1,
    'tracker': 'tensorboard,mlflow',
    'objective': 'mlm',
    'fim_rate': 1.5,
    'fim_spm_rate': -0.5,
    'ul2_s_rate': 2.0,
    'ul2_r_rate': -1.0,
    'ul2_x_rate': 1.1,
    'n_experts': -1,
    'top_k': -2,
    'expert_hidden': -64,
    'n_shared_experts': -1,
    'n_dense_layers': -1,
    'route_scale': 0.0,
    'router_bias_speed': -0.001,
    'aux_loss_coef': -0.01,
    'nodes': -2,
    'intra_node_busbw': -370.0,
    'inter_node_busbw': -48.0,
}


def test_every_rule_has_a_bad_value_here():
    assert set(BAD) == set(config.RULES)


@pytest.mark.parametrize('key', sorted(BAD))
def test_a_bad_value_is_one_line_naming_key_value_and_what_is_allowed(key, tmp_path):
    for where in ('file', 'command line'):
        with pytest.raises(ConfigError) as caught:
            if where == 'file':
                path = tmp_path / 'bad.py'
                path.write_text(f'{key} = {BAD[key]!r}\n')
                load_config(str(path))
            else:
                load_config(None, [f'--{key}={BAD[key]}'])
        message = str(caught.value)
        assert (
            message.startswith(f'{key} must be {config.RULES[key][1]}')
            and repr(BAD[key]) in message
        )
        assert '\n' not in message


@pytest.mark.parametrize(
    'line,message',
    [
        ('n_layer = 2.5', "n_layer = 2.5 in "),
        ('compile = "False"', "compile = 'False' in "),
        ('lr = "fast"', "lr = 'fast' in "),
        ('arch = 2', "arch = 2 in "),
        ('mfu = float("nan")', 'mfu = nan in '),
    ],
)
def test_a_wrong_type_in_a_config_file_is_one_line(line, message, tmp_path):
    path = tmp_path / 'bad.py'
    path.write_text(line + '\n')
    with pytest.raises(ConfigError, match='expected') as caught:
        load_config(str(path))
    assert str(caught.value).startswith(message)


def test_twenty_six_billion_written_as_a_float_is_a_whole_number():
    _, train_cfg = load_config(None, ['--train_tokens=26e9', '--batch_tokens=5.24288e5'])
    assert train_cfg.train_tokens == 26_000_000_000 and train_cfg.batch_tokens == 524_288


@pytest.mark.parametrize(
    'flags,message',
    [
        (['--temperature', '-1'], '--temperature -1.0: must be at least 0'),
        (['--tokens', '0'], '--tokens 0: must be at least 1'),
        (['--top_k', '-5'], '--top_k -5: must be at least 0'),
    ],
)
def test_sample_refuses_impossible_values(eight_steps, capsys, flags, message):
    _, out = eight_steps
    capsys.readouterr()
    assert sample.main([str(out), *flags]) == 2
    assert capsys.readouterr().err.strip() == f'error: {message}'
