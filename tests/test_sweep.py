"""
test_sweep.py: sweep.py's machinery on a tiny point: the calibration run, a budgeted run scored on the fixed val
sequences, and the export of our tokens in nanoGPT's format (nanoGPT itself is not here: its checkout is a path
the user passes).
"""

import pickle

import numpy as np
import pytest
import torch

import checkpoint
import data
import sweep

TINY = dict(
    vocab_size=512,
    n_layer=2,
    n_embd=64,
    n_head=2,
    batch_tokens=256,
    micro_batch=4,
    lr=3e-3,
    block_size=32,
    compile=False,
)


def test_calibration_then_a_budgeted_run_scored_on_the_fixed_val_set(pystdlib_data, tmp_path):
    first, per_step = sweep.run_ours(TINY, pystdlib_data, str(tmp_path / 'calibration'))
    assert (
        first > 0 and 0 < per_step < first
    )  # start-up and the first step cost more than a step after
    elapsed, val_loss, trained = sweep.run_ours(TINY, pystdlib_data, str(tmp_path / 'run'), 10)
    assert (
        0 < trained < elapsed
    )  # the steps' own times: start-up, eval and the checkpoint are not training
    model, _ = checkpoint.load_model(str(tmp_path / 'run'), torch.device('cpu'))
    assert checkpoint.step_of(checkpoint.find(str(tmp_path / 'run'))) == 10
    again, bits = sweep.score(lambda x, y: model(x, y)[1], pystdlib_data, 32)
    assert val_loss == again and 0 < val_loss < np.log(512)  # it learned something in 10 steps
    assert bits == pytest.approx(
        val_loss / np.log(2) / sweep.val_bytes_per_token(pystdlib_data, 32)
    )
    val_tokens = data.load_meta(pystdlib_data)['val_tokens']
    assert (
        len(sweep.val_sequences(pystdlib_data, 32))
        == (min(sweep.EVAL_TOKENS + 1, val_tokens) - 1) // 32
    )


def test_our_tokens_in_nanogpts_format(pystdlib_data, tmp_path):
    name = sweep.export_for_nanogpt(pystdlib_data, str(tmp_path))
    folder = tmp_path / 'data' / name
    for split in ('train', 'val'):
        ours = np.concatenate(
            [np.asarray(data.open_shard(p)) for p in data.list_shards(pystdlib_data, split)]
        )
        theirs = np.fromfile(folder / f'{split}.bin', dtype=np.uint16)
        assert (theirs == ours).all()
    with open(folder / 'meta.pkl', 'rb') as f:
        assert pickle.load(f) == {'vocab_size': 512}


def test_each_trainer_gets_the_same_training_seconds():
    """A trainer whose calibration overestimates its step time (slow early steps: nanoGPT's, 110 steps in 300 s
    where 130 fit) is run again with its steps rescaled, until its measured training seconds meet the budget."""
    runs = []

    def trainer(point, data, out_dir, steps=None, per_step=1.0, real_per_step=0.8):
        if steps is None:
            return 5.0, per_step  # calibration: start-up, and the time per step it saw
        runs.append((out_dir, steps))
        return (
            steps * real_per_step + 5.0,
            2.0,
            steps * real_per_step,
        )  # wall, val loss, training seconds

    assert sweep.budgeted_run(trainer, {}, 'data', 'out/0_nanoGPT', 300) == (375, 305.0, 2.0, 300.0)
    assert runs == [('out/0_nanoGPT', 300), ('out/0_nanoGPT_rescaled', 375)]
    runs.clear()  # a calibration that was right: one run
    steps, _, _, trained = sweep.budgeted_run(
        lambda point, data, out_dir, steps=None: (
            (5.0, 1.0) if steps is None else (steps + 5.0, 2.0, steps * 1.02)
        ),
        {},
        '',
        'o',
        300,
    )
    assert (steps, trained) == (300, 306.0)
