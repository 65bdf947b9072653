"""
test_sweep.py: sweep.py's machinery on a tiny point: the calibration run, a budgeted run scored on the fixed val
sequences, and the export of our tokens in nanoGPT's format (nanoGPT itself is not here: its checkout is a path
the user passes).
"""

import pickle

import numpy as np
import pytest
import torch

import sweep
from ledgergpt import checkpoint, data, sums

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
    # start-up and the first step cost more than a step after
    assert first > 0 and 0 < per_step < first
    elapsed, val_loss, trained = sweep.run_ours(TINY, pystdlib_data, str(tmp_path / 'run'), 10)
    # the steps' own times: start-up, eval and the checkpoint are not training
    assert 0 < trained < elapsed
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
        # wall, val loss, training seconds
        return (steps * real_per_step + 5.0, 2.0, steps * real_per_step)

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


def test_the_race_takes_each_optimizers_best_lr_then_adds_parts_to_the_winner(
    tmp_path, monkeypatch
):
    """The race's order with a stand-in trainer whose val loss is known: Muon best at 2e-3; AdamW best at the grid's
    edge, 4e-3, so the grid goes on to 8e-3, better again, and to 1.6e-2, worse, where RACE_EXTEND stops it; Muon
    the winner over both seeds; each part then runs on Muon at 2e-3 at both seeds, the two that beat it (QK-norm
    and the soft cap, not ReLU²) together, and a rerun trains nothing."""
    ran = []

    def loss_of(point):
        lr_penalty = {
            'adamw': {1e-3: 0.3, 2e-3: 0.2, 4e-3: 0.1, 8e-3: 0.05, 1.6e-2: 0.15},
            'muon': {1e-3: 0.2, 2e-3: 0.0, 4e-3: 0.4},
        }
        part = {'relu2': 0.05}.get(point.get('mlp'), 0.0) - 0.02 * (point['qk_norm'] != 'none')
        part -= 0.01 * bool(point.get('logit_softcap'))
        return (
            3.0 + lr_penalty[point['optimizer']][point['lr']] + part + (point['seed'] - 1337) / 100
        )

    calibrations = []

    def run_ours(point, data, out_dir, steps=None):
        if steps is None:
            calibrations.append(point)
            return 5.0, 1.0
        ran.append(point)
        return 70.0, loss_of(point), 59.0

    def trainer(train_point, point, data, folder, seconds):
        assert seconds == 60 and point['n_embd'] == 256  # GRID's point 0
        train_point(point, data, folder + '_calibration')
        return (7, *train_point(point, data, folder, 7))

    monkeypatch.setattr(sweep, 'run_ours', run_ours)
    monkeypatch.setattr(sweep, 'budgeted_run', trainer)
    monkeypatch.setattr(sweep, 'data_folder', lambda vocab: 'data')
    monkeypatch.setattr(sweep, 'val_bytes_per_token', lambda data, block_size: 4.0)
    rows = sweep.race(60, str(tmp_path))
    parts = ('qk_norm', 'mlp', 'logit_softcap')
    # the book's recipe (BOOK_RECIPE) under the race's first ten runs, not the default's
    assert all(p['qk_norm'] == 'none' for p in ran[:10])
    off = sweep.BOOK_RECIPE['qk_norm']
    runs = [
        {k: p[k] for k in ('optimizer', 'lr', 'seed', *parts) if p.get(k, off) != off} for p in ran
    ]
    assert runs == [
        *({'optimizer': 'adamw', 'lr': lr, 'seed': 1337} for lr in (*sweep.RACE_LRS, 8e-3, 1.6e-2)),
        *({'optimizer': 'muon', 'lr': lr, 'seed': 1337} for lr in sweep.RACE_LRS),
        {'optimizer': 'adamw', 'lr': 8e-3, 'seed': 1338},
        {'optimizer': 'muon', 'lr': 2e-3, 'seed': 1338},
        *(
            {'optimizer': 'muon', 'lr': 2e-3, 'seed': s, **part}
            for part in sweep.RACE_PARTS
            for s in sweep.RACE_SEEDS
        ),
        *(
            {
                'optimizer': 'muon',
                'lr': 2e-3,
                'seed': s,
                'qk_norm': 'weightless',
                'logit_softcap': 15.0,
            }
            for s in sweep.RACE_SEEDS
        ),
    ]
    # one calibration per optimizer and part, shared by the lrs and seeds (the same step)
    assert [(p['optimizer'], *(p.get(k, off) for k in parts)) for p in calibrations] == [
        ('adamw', off, off, off),
        ('muon', off, off, off),
        ('muon', 'weightless', off, off),
        ('muon', off, 'relu2', off),
        ('muon', off, off, 15.0),
        ('muon', 'weightless', off, 15.0),
    ]
    assert [r['val_bpb'] for r in rows] == [
        round(sums.bits_per_byte(loss_of(dict(sweep.GRID[0], **r['overrides'])), 4.0), 4)
        for r in rows
    ]
    assert rows[0]['tokens'] == 7 * sweep.GRID[0]['batch_tokens'] and len(rows) == len(ran) == 18
    table = sweep.format_race(rows)
    assert '| muon | 0.002 | mlp=relu2 | 1338 | 7 | 57,344 | 972 | 59.0 |' in table
    ran.clear()
    # every row kept: nothing trains again
    assert sweep.race(60, str(tmp_path)) == rows and ran == []


def test_a_bad_option_is_one_line(capsys):
    for argv in (['--points=x'], ['--points=0,9'], ['--minutes=x'], ['--race', '--minutes=0']):
        assert sweep.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {' '.join(argv)}: expected --minutes above 0 and --points")
        assert err.count('\n') == 1
