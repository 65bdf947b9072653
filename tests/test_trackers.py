"""
test_trackers.py: trackers.py without a training run (test_train.py's killed-and-resumed run checks TensorBoard's
and W&B's logs of a real run against metrics.jsonl): nanoGPT's W&B keys, the records as scalars, a rollback's
steps hidden in TensorBoard, and a tracker that is missing or fails is one warning line while the run goes on.
"""

import builtins
import dataclasses
import io
import os
import sys
import threading

import helpers
from ledgergpt import trackers
from ledgergpt.config import load_config

PREDICTION = {'model': {'n_layer': 2}, 'train': {'lr': 3e-3}}


def test_nanogpt_wandb_keys_are_accepted(tmp_path):
    config = helpers.write_config(
        tmp_path / 'c.py', dict(wandb_log=True, wandb_project='owt', wandb_run_name='gpt2-124M')
    )
    _, train = load_config(config)
    assert trackers.names(train) == ['wandb'] and train.wandb_project == 'owt'
    _, train = load_config(config, ['--tracker=wandb,tensorboard'])
    assert trackers.names(train) == ['wandb', 'tensorboard']  # each once


def test_a_record_becomes_scalars():
    entry = {
        'step': 7,
        'loss': 2.5,
        'warmup': False,
        'bpb': None,
        'val_sources': {'web': {'weight': 0.6, 'loss': 2.1, 'bpb': None}},
        'expert_load': [[1.5, 0.5]],
        'note': 'text',
    }
    assert trackers.scalars(entry) == {
        'step': 7,
        'loss': 2.5,
        'warmup': 0,
        'val_sources/web/weight': 0.6,
        'val_sources/web/loss': 2.1,
        'expert_load/0/0': 1.5,
        'expert_load/0/1': 0.5,
    }


def test_a_rollback_hides_the_steps_done_again(tmp_path):
    train = dataclasses.replace(load_config()[1], out_dir=str(tmp_path), tracker='tensorboard')
    board = trackers.Trackers(train, PREDICTION, 'the ledger', resume=False)
    for step in range(1, 7):
        board.log({'step': step, 'loss': 10.0 + step})
    board.log({'event': 'rollback', 'step': 6, 'loss': 99.0, 'to_step': 4, 'skipped': [32, 48]})
    for step in range(5, 9):
        board.log({'step': step, 'loss': 20.0 + step})
    board.finish(str(tmp_path))
    scalars, tags = helpers.tensorboard_scalars(tmp_path / 'tensorboard')
    losses = {step: value for (step, tag), value in scalars.items() if tag == 'loss'}
    assert losses == {1: 11.0, 2: 12.0, 3: 13.0, 4: 14.0, 5: 25.0, 6: 26.0, 7: 27.0, 8: 28.0}
    assert scalars[6, 'rollback/loss'] == 99.0 and scalars[6, 'rollback/skipped/1'] == 48
    assert tags['config/text_summary'] == tags['ledger/text_summary'] == 'text'


def test_a_missing_or_failing_tracker_is_one_line_and_the_run_goes_on(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, 'wandb', None)  # `import wandb` raises ImportError
    train = dataclasses.replace(
        load_config()[1], out_dir=str(tmp_path), tracker='tensorboard,wandb'
    )
    board = trackers.Trackers(train, PREDICTION, 'the ledger', resume=False)
    out = capsys.readouterr().out
    assert 'warning: tracker=wandb needs wandb (pip install wandb); the run goes on' in out
    assert list(board.running) == ['tensorboard']
    board.log({'step': 1, 'loss': 3.0})

    def full_disk(*args, **kwargs):
        raise OSError(28, 'No space left on device')

    monkeypatch.setattr(board.running['tensorboard'].writer, 'add_scalar', full_disk)
    board.log({'step': 2, 'loss': 2.0})
    board.log({'step': 3, 'loss': 1.0})  # dropped: no second warning
    warnings = capsys.readouterr().out.strip().splitlines()
    assert warnings == [
        'warning: tracker tensorboard failed to log (OSError: [Errno 28] No space left on device); the run '
        'goes on without it'
    ]
    assert board.running == {}
    board.finish(str(tmp_path))


def test_a_tracker_that_fails_to_start_is_one_line(tmp_path, monkeypatch, capsys):
    def refuse(*args):
        raise PermissionError(13, 'Permission denied', str(tmp_path / 'tensorboard'))

    monkeypatch.setattr(trackers.TensorBoard, '__init__', refuse)
    train = dataclasses.replace(load_config()[1], out_dir=str(tmp_path), tracker='tensorboard')
    board = trackers.Trackers(train, PREDICTION, 'the ledger', resume=False)
    assert board.running == {}
    assert capsys.readouterr().out == (
        f"warning: tracker tensorboard did not start (PermissionError: [Errno 13] Permission denied: "
        f"'{tmp_path / 'tensorboard'}'); the run goes on without it\n"
    )
    board.log({'step': 1, 'loss': 3.0})  # nothing to log to, nothing raised


def test_a_read_only_folder_is_one_line_without_a_traceback(tmp_path, monkeypatch, capsys):
    """out_dir/tensorboard read-only (here every file opened for writing in it is refused: root
    writes anywhere): the warning line alone, no traceback from TensorBoard's writer thread."""
    folder, real_open = str(tmp_path / 'tensorboard'), io.open

    def read_only(file, mode='r', *args, **kwargs):
        name = '' if isinstance(file, int) else os.fsdecode(file)
        if name.startswith(folder) and set(mode) & set('wax+'):
            raise PermissionError(13, 'Permission denied', name)
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(io, 'open', read_only)
    monkeypatch.setattr(builtins, 'open', read_only)
    thread_errors, before = [], set(threading.enumerate())
    monkeypatch.setattr(threading, 'excepthook', thread_errors.append)
    train = dataclasses.replace(load_config()[1], out_dir=str(tmp_path), tracker='tensorboard')
    board = trackers.Trackers(train, PREDICTION, 'the ledger', resume=False)
    for step in range(1, 4):
        board.log({'step': step, 'loss': 3.0})
    board.finish(str(tmp_path))
    # a writer thread that failed reports, then ends
    for thread in set(threading.enumerate()) - before:
        thread.join(timeout=10)
    [warning] = capsys.readouterr().out.splitlines()
    assert warning.startswith('warning: tracker tensorboard ') and 'Permission denied' in warning
    assert thread_errors == []
