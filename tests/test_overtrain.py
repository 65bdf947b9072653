"""
test_overtrain.py: the over-training experiment (overtrain.py) and the cooldown runs it takes from train.py. The
main wsd run keeps its checkpoint at each branch's start past keep_ckpts (--keep_steps); a branch
(--cooldown_from, --cooldown_tokens) starts from its weights, AdamW states and data position, decays the LR linearly
from the peak to the floor on its last step, writes only its own out_dir and resumes bit-exactly. Bad input is one
line: train.py's own checks through train.main, the experiment's (a branch starts in the stable phase of a wsd run)
through overtrain. overtrain.py runs the wsd run, its branch and cosine runs and tabulates their val bits per byte;
plot.py draws them with the published fit on its own axis.
"""

import contextlib
import io
import json
import os

import numpy as np
import pytest
from test_plot import lines_labelled
from test_train import read_metrics, step_losses, write_config

import overtrain
import train
from ledgergpt import bill, checkpoint, config, continuation, plot, processes, sums
from ledgergpt.config import ConfigError, load_config

# The main run: 24 steps of 256 tokens (8 sequences of 32), wsd: warmup 2 steps, the peak to step 18, a decay over
# steps 19-23 (0-based) to 10%. Its branch of 15 steps' tokens starts after step 12 (0.8 x 3,840 = 3,072 tokens)
# and decays over 3 steps (768 tokens), steps 13-15 as logged.
STEP_TOKENS, PEAK, FLOOR = 256, 3e-3, 3e-4
MAIN = dict(
    schedule='wsd',
    train_tokens=24 * STEP_TOKENS,
    decay_frac=0.2,
    cooldowns=(15 * STEP_TOKENS,),
    ckpt_every=4,
    keep_ckpts=1,
)


def quietly(function, *args):
    """-> (function's return value, what it printed)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = function(*args)
    return code, printed.getvalue()


def files_of(folder):
    """{path: (size, modification time)} of every file under folder."""
    return {
        os.path.join(root, name): (
            os.path.getsize(os.path.join(root, name)),
            os.stat(os.path.join(root, name)).st_mtime_ns,
        )
        for root, _, names in os.walk(folder)
        for name in names
    }


@pytest.fixture(scope='module')
def main_run(pystdlib_data, tmp_path_factory):
    """-> (config, out_dir, the experiment's plan) after the 24-step wsd run, run with the flags the plan gives it."""
    tmp = tmp_path_factory.mktemp('main')
    config_path = write_config(tmp, pystdlib_data, out_dir=str(tmp / 'main'), **MAIN)
    runs = overtrain.plan(*load_config(config_path))
    assert quietly(train.main, [config_path, *runs[0].flags])[0] == 0
    return config_path, str(tmp / 'main'), runs


@pytest.fixture(scope='module')
def branch(main_run):
    """-> (out_dir, stdout) of the branch, run with the flags the plan gives it."""
    config_path, main, runs = main_run
    before = files_of(main)
    code, out = quietly(train.main, [config_path, *runs[1].flags])
    assert code == 0
    assert files_of(main) == before  # not a byte of the main run written, nothing removed
    return runs[1].out_dir, out


def test_the_main_run_keeps_the_start_of_its_branch(main_run):
    config_path, main, runs = main_run
    kept = os.path.join(main, 'ckpt', 'step_0000012')
    assert runs[0].flags == ['--keep_steps=12']
    assert runs[1].start == kept and runs[1].flags == [
        f'--cooldown_from={kept}',
        '--cooldown_tokens=768',
        f'--out_dir={main}_cooldown_3.84K',
    ]
    # keep_ckpts = 1 pruned steps 0, 4, 8, 16 and 20; step 12 stays, complete
    assert sorted(os.listdir(os.path.join(main, 'ckpt'))) == [
        'LATEST',
        'step_0000012',
        'step_0000024',
    ]
    assert checkpoint.damage(kept) is None
    state = checkpoint.read_state(kept)['run']
    assert (state['step'], state['tokens_seen'], state['position']) == (
        12,
        12 * STEP_TOKENS,
        12 * 8,
    )
    # in the stable phase: a branch may start there
    overtrain.check_branch_start(kept, *load_config(config_path))
    lrs = {e['step']: e['lr'] for e in read_metrics(main) if 'lr' in e}
    # the main run: stable at 13
    assert lrs[12] == lrs[13] == lrs[19] == PEAK and lrs[24] == pytest.approx(FLOOR)


def test_a_branch_continues_the_main_run_and_decays_to_the_floor(main_run, branch):
    _, main, _ = main_run
    out_dir, printed = branch
    assert out_dir == f'{main}_cooldown_3.84K'
    entries = read_metrics(out_dir)
    steps = [e for e in entries if 'lr' in e]
    assert [e['step'] for e in steps] == [13, 14, 15]
    assert [e['lr'] for e in steps] == pytest.approx(
        [PEAK + (FLOOR - PEAK) * k / 3 for k in (1, 2, 3)]
    )
    assert steps[-1]['lr'] == pytest.approx(FLOOR) and [e['tokens'] for e in steps] == [
        3328,
        3584,
        3840,
    ]
    # step 13's loss is measured before its update, on the weights of step 12 and the data after position 96:
    # the main run's own step 13, to the bit, if the branch took both over
    assert steps[0]['loss'] == step_losses(read_metrics(main))[13]
    # from there a lower LR: another run
    assert steps[1]['loss'] != step_losses(read_metrics(main))[14]
    end = checkpoint.read_state(checkpoint.latest(out_dir))['run']
    assert (end['step'], end['tokens_seen'], end['position']) == (15, 15 * STEP_TOKENS, 15 * 8)
    assert sorted(os.listdir(os.path.join(out_dir, 'ckpt'))) == ['LATEST', 'step_0000015']
    summary = json.loads(open(os.path.join(out_dir, 'summary.json')).read())
    assert summary['step'] == 15 and summary['val_bpb'] > 0
    assert (
        f"cooling down from {main}/ckpt/step_0000012: step 12, 3,072 tokens, data position 96"
        in printed
    )
    assert 'steps 13 to 15 (768 tokens' in printed and 'cooldown: out_dir changed' in printed


def test_a_branch_resumes_bit_exactly(main_run, branch, tmp_path, capsys):
    config_path, main, _ = main_run
    flags = [
        config_path,
        f'--cooldown_from={main}/ckpt/step_0000012',
        '--cooldown_tokens=768',
        f'--out_dir={tmp_path / "b"}',
    ]
    assert train.main(flags + ['--max_steps=14']) == 0
    assert checkpoint.step_of(checkpoint.latest(tmp_path / 'b')) == 14
    assert train.main(flags) == 2  # its folder holds a branch now: the same rule as any run's
    assert 'already holds checkpoints: pass --resume' in capsys.readouterr().err
    assert train.main(flags + ['--resume']) == 0
    # exactly equal
    assert step_losses(read_metrics(tmp_path / 'b')) == step_losses(read_metrics(branch[0]))
    # its own decay may not change silently
    assert train.main(flags + ['--resume', '--cooldown_tokens=1024']) == 2
    assert 'with a changed cooldown_tokens 768 -> 1024' in capsys.readouterr().err


@pytest.fixture(scope='module')
def other_checkpoints(pystdlib_data, tmp_path_factory):
    """Checkpoints no branch may start from: {'cosine': step 1 of a cosine run, 'warmup': step 1 of a wsd run}."""
    tmp = tmp_path_factory.mktemp('others')
    found = {}
    for schedule in ('cosine', 'wsd'):
        config_path = write_config(
            tmp,
            pystdlib_data,
            schedule=schedule,
            out_dir=str(tmp / schedule),
            max_steps=1,
            train_tokens=24 * STEP_TOKENS,
        )
        assert quietly(train.main, [config_path])[0] == 0
        found['warmup' if schedule == 'wsd' else schedule] = checkpoint.latest(tmp / schedule)
    return found


@pytest.mark.parametrize(
    'flags, message',
    [
        (
            ['--cooldown_from={tmp}/nothing', '--cooldown_tokens=768'],
            'nothing is not a checkpoint folder',
        ),
        (['--cooldown_from={main}', '--cooldown_tokens=768'], 'main is not a checkpoint folder'),
        (
            ['--cooldown_from={kept}', '--cooldown_tokens=0'],
            'cooldown_tokens must be positive for a cooldown, got 0',
        ),
        (
            ['--cooldown_from={kept}', '--cooldown_tokens=-5'],
            'cooldown_tokens must be positive for a cooldown, got -5',
        ),
        (['--cooldown_tokens=768'], 'cooldown_tokens goes with --cooldown_from'),
        (
            ['--cooldown_from={kept}', '--cooldown_tokens=768', '--n_layer=3'],
            'was written for another model (n_layer',
        ),
        (
            ['--cooldown_from={kept}', '--cooldown_tokens=768', '--lr=0.001'],
            'with a changed lr 0.003 -> 0.001',
        ),
    ],
)
def test_a_bad_cooldown_is_one_line(main_run, tmp_path, capsys, flags, message):
    """train.py's own checks: any cooldown, of this experiment or not."""
    config_path, main, _ = main_run
    places = dict(tmp=tmp_path, main=main, kept=f'{main}/ckpt/step_0000012')
    args = [config_path, f'--out_dir={tmp_path / "out"}'] + [
        flag.format(**places) for flag in flags
    ]
    capsys.readouterr()
    assert train.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('error: ') and message in err[0], err


@pytest.mark.parametrize(
    'start, message',
    [
        (
            '{tmp}/nothing',
            'nothing is not a complete checkpoint: the main run keeps one at each branch',
        ),
        ('{cosine}', 'was written by a cosine run: a branch starts from'),
        (
            '{warmup}',
            'is step 1 of a wsd run that holds the peak LR from step 2 to 18: at step 1 it is still warming up',
        ),
        ('{main}/ckpt/step_0000024', 'at step 24 it is already decaying'),
        (
            '{main}_cooldown_3.84K/ckpt/step_0000015',
            "is a cooldown branch's checkpoint, already decaying",
        ),
    ],
)
def test_a_branch_starts_in_the_stable_phase_of_a_wsd_run(
    main_run, branch, other_checkpoints, tmp_path, start, message
):
    """The experiment's own check: train.py would cool any of these down, but none makes a finished run."""
    config_path, main, _ = main_run
    with pytest.raises(ConfigError) as refused:
        overtrain.check_branch_start(
            start.format(tmp=tmp_path, main=main, **other_checkpoints), *load_config(config_path)
        )
    assert message in str(refused.value) and '\n' not in str(refused.value)


@pytest.mark.parametrize(
    'flags, message',
    [
        (['--schedule=cosine'], "cooldowns need schedule = 'wsd'"),
        (
            ['--cooldowns=6144'],
            'the branch of 6,144 tokens would start at step 20 (4,915 tokens), outside this '
            "run's stable phase (steps 2 to 18)",
        ),
    ],
)
def test_a_plan_without_stable_branch_points_is_one_line(main_run, capsys, flags, message):
    config_path, _, _ = main_run
    capsys.readouterr()
    assert overtrain.main([config_path, *flags, '--plan']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('error: ') and message in err[0], err


def test_the_schedule_of_a_branch():
    cfg = config.TrainConfig(
        lr=1e-3, warmup_frac=0.01, schedule='wsd', decay_frac=0.2, min_lr_ratio=0.1
    )
    total = 1000  # 10 warmup steps, the peak to step 799; a branch of 100 steps from step 400
    assert list(overtrain.stable_steps(total, cfg)) == list(range(10, 800))
    lrs = [train.lr_at(step, total, cfg, cooldown=(400, 100)) for step in range(398, 500)]
    # the first step decays
    assert lrs[:2] == [1e-3, 1e-3] and lrs[2] == pytest.approx(1e-3 - 9e-4 / 100)
    # half-way; the floor
    assert lrs[51] == pytest.approx(5.5e-4) and lrs[-1] == pytest.approx(1e-4)
    assert all(np.diff(lrs[1:]) < 0)  # falling at every step


def test_the_overtrain_config_branches_at_one_and_two_chinchillas():
    model_cfg, train_cfg = load_config('configs/h200_1b3_overtrain.py')
    step_tokens = train.tokens_per_micro_step(model_cfg, train_cfg, 1)
    total = train.planned_steps(train_cfg, step_tokens)  # ceil(100e9 / 524,288)
    assert total == 190_735 and overtrain.stable_steps(total, train_cfg) == range(572, 152_588)
    # ceil(0.8 x 26e9 / 524,288) and ceil(0.8 x 52e9 / ...)
    points = overtrain.branch_points(train_cfg, step_tokens)
    assert points == {39_673: 26_000_000_000, 79_346: 52_000_000_000}
    runs = overtrain.plan(model_cfg, train_cfg)
    assert [(r.schedule, r.length, r.tokens) for r in runs] == [
        ('wsd', 100e9, 100e9),
        ('cooldown', 26e9, 26e9 - 39_673 * 524_288),
        ('cooldown', 52e9, 52e9 - 79_346 * 524_288),
        ('cosine', 26e9, 26e9),
        ('cosine', 52e9, 52e9),
        ('cosine', 100e9, 100e9),
    ]
    # the branches' starts outlive keep_ckpts = 3
    assert runs[0].flags == ['--keep_steps=39673,79346']
    assert runs[1].out_dir == 'out/h200_1b3_overtrain_cooldown_26B' and runs[1].flags == [
        '--cooldown_from=out/h200_1b3_overtrain/ckpt/step_0039673',
        '--cooldown_tokens=5199922176',
        '--out_dir=out/h200_1b3_overtrain_cooldown_26B',
    ]
    assert runs[3].out_dir == 'out/h200_1b3_overtrain_cosine_26B'
    rows, prediction = overtrain.plan_bill(model_cfg, train_cfg, runs)
    share = 5_199_922_176 / 100e9  # the main run's 24.9 days and $2,091, shared out by tokens
    assert rows[3].endswith(
        f"| {bill.duration(prediction['days'] * share)} | ${prediction['cost_usd'] * share:,.0f} |"
    )
    assert rows[-2].startswith('| wsd and its branches | | 116B |')  # 100B + 5.2B + 10.4B
    assert rows[-1].startswith('| the cosine runs | | 178B |')  # 26B + 52B + 100B


def test_cooldowns_and_keep_steps_read_as_whole_numbers(tmp_path):
    assert load_config(None, ['--cooldowns=26e9,52e9'])[1].cooldowns == (
        26_000_000_000,
        52_000_000_000,
    )
    assert load_config(None, ['--cooldowns='])[1].cooldowns == ()
    assert load_config(None, ['--keep_steps=39673,79346'])[1].keep_steps == (39_673, 79_346)
    (tmp_path / 'list.py').write_text('cooldowns = [1e3, 2000]\n')
    assert load_config(str(tmp_path / 'list.py'))[1].cooldowns == (1000, 2000)
    for bad in (
        'cooldowns = (1.5,)',
        "cooldowns = '26e9'",
        'cooldowns = (True,)',
        'keep_steps = (12.5,)',
    ):
        (tmp_path / 'bad.py').write_text(bad + '\n')
        with pytest.raises(ConfigError, match='expected a list of whole numbers'):
            load_config(str(tmp_path / 'bad.py'))


def test_a_checkpoint_older_than_the_experiments_keys_still_resumes(main_run, monkeypatch, capsys):
    config_path, main, _ = main_run
    read_state = checkpoint.read_state

    def from_before(path):  # as a checkpoint written before the keys existed holds it
        state = read_state(path)
        for key in ('cooldowns', 'cooldown_from', 'cooldown_tokens', 'keep_steps'):
            del state['train_config'][key]
        return state

    monkeypatch.setattr(checkpoint, 'read_state', from_before)
    model_cfg, train_cfg = load_config(config_path, ['--cooldowns='])
    continuation.check_resumable(
        checkpoint.latest(main), model_cfg, train_cfg, set(), processes.setup_cluster()
    )
    # each missing key had its default: nothing changed
    assert 'changed' not in capsys.readouterr().out


# -----------------------------------------------------------------------------------------------------
# The experiment in one command, and its picture.


def test_overtrain_runs_the_experiment_and_tabulates_it(pystdlib_data, tmp_path, capsys):
    config_path = write_config(
        tmp_path, pystdlib_data, out_dir=str(tmp_path / 'x'), eval_every=6, **MAIN
    )
    assert overtrain.main([config_path]) == 0
    out = capsys.readouterr().out
    folders = [
        str(tmp_path / name)
        for name in ('x', 'x_cooldown_3.84K', 'x_cosine_3.84K', 'x_cosine_6.14K')
    ]
    assert [
        line.split(' ', 3)[3] for line in out.splitlines() if line.startswith('python train.py ')
    ] == [
        '--keep_steps=12',
        f'--cooldown_from={folders[0]}/ckpt/step_0000012 --cooldown_tokens=768 --out_dir={folders[1]}',
        f'--schedule=cosine --train_tokens=3840 --out_dir={folders[2]}',
        f'--schedule=cosine --train_tokens=6144 --out_dir={folders[3]}',
    ]
    assert sorted(os.listdir(tmp_path / 'x' / 'ckpt')) == ['LATEST', 'step_0000012', 'step_0000024']
    bpb = {
        folder: json.loads(open(os.path.join(folder, 'summary.json')).read())['val_bpb']
        for folder in folders
    }
    chinchilla = (
        sums.CHINCHILLA_TOKENS_PER_PARAM * sums.count_params(load_config(config_path)[0])['total']
    )
    table = out.split('final val loss, bits per byte:\n')[1].splitlines()
    pairs = [(folders[1], folders[2], 3840), (folders[0], folders[3], 6144)]
    for row, (wsd, cosine, length) in zip(table[2:4], pairs, strict=True):
        assert row == (
            f"| {bill.si(length)} | {length / chinchilla:.2f} | {bpb[wsd]:.4f} | "
            f"{bpb[cosine]:.4f} | {bpb[wsd] - bpb[cosine]:+.4f} |"
        )
    assert os.path.isfile(tmp_path / 'x' / 'branches.png')
    # cosine, 15 steps
    assert [e['lr'] for e in read_metrics(folders[2]) if 'lr' in e][-1] == pytest.approx(FLOOR)
    # the same command again: every run is complete, nothing is trained or logged again
    metrics = [open(os.path.join(folder, 'metrics.jsonl')).read() for folder in folders]
    assert overtrain.main([config_path]) == 0
    assert [open(os.path.join(folder, 'metrics.jsonl')).read() for folder in folders] == metrics


def test_overtrain_needs_a_wsd_run_with_branches(tmp_path, capsys):
    assert overtrain.main(['configs/h200_1b3.py', '--plan']) == 2
    assert "overtrain.py needs a wsd run with cooldown branches" in capsys.readouterr().err


def write_metrics(folder, first, last, val, params=1000):
    """A run's metrics.jsonl: steps first..last of 1,000 tokens, a loss of 3 + 5 e^(-step / 30), and its final val."""
    os.makedirs(folder)
    lines = [
        {'step': s, 'tokens': 1000 * s, 'loss': 3 + 5 * np.exp(-s / 30)}
        for s in range(first, last + 1)
    ]
    lines.append({'step': last, 'tokens': 1000 * last, 'val_loss': val})
    with open(os.path.join(folder, 'metrics.jsonl'), 'w') as f:
        f.write(''.join(json.dumps(line) + '\n' for line in lines))
    with open(os.path.join(folder, 'ledger.json'), 'w') as f:
        json.dump({'params': {'total': params}}, f)
    return str(folder)


def test_the_branch_picture(tmp_path, capsys):
    main = write_metrics(tmp_path / 'run', 1, 100, 3.2)  # P = 1,000: 20 x P = 20K tokens
    write_metrics(tmp_path / 'run_cooldown_50K', 41, 50, 3.3)  # a branch from step 40
    write_metrics(tmp_path / 'run_cosine_50K', 1, 50, 3.35)
    write_metrics(tmp_path / 'run_cosine_100K', 1, 100, 3.25)
    fig = plot.branch_figure(main)
    ax, fit = fig.axes
    [branch] = lines_labelled(ax, 'run_cooldown_50K (cooldown) train')
    assert branch.get_xdata()[0] == 41_000 and branch.get_xdata()[-1] == 50_000
    [final] = lines_labelled(ax, 'run_cooldown_50K (cooldown): final val 3.3000 at 50K')
    assert (list(final.get_xdata()), list(final.get_ydata())) == ([50_000], [3.3])
    assert len(lines_labelled(ax, 'run_cosine_')) == 4  # two curves, two final vals
    [cosine] = lines_labelled(ax, 'run_cosine_100K (cosine): final val 3.2500 at 100K')
    assert cosine.get_marker() == 'X' and final.get_marker() == '*'
    [chinchilla] = lines_labelled(ax, '20 x P = 20K tokens (Chinchilla)')
    assert list(chinchilla.get_xdata()) == [20_000, 20_000]
    [published] = fit.lines
    assert np.allclose(published.get_ydata(), sums.chinchilla_loss(1000, published.get_xdata()))
    assert 'THEIR data' in published.get_label() and 'THEIR token' in fit.get_ylabel()
    assert plot.main([main, '--branches']) == 0
    assert capsys.readouterr().out.strip() == os.path.join(main, 'branches.png')
    assert plot.main([main, main, '--branches']) == 2
    assert '--branches draws one run' in capsys.readouterr().err


# -----------------------------------------------------------------------------------------------------
# The LR sweep: each schedule compared at its own best peak LR


def test_an_lr_sweep_runs_the_experiment_at_each_lr(pystdlib_data, tmp_path, capsys):
    config_path = write_config(tmp_path, pystdlib_data, out_dir=str(tmp_path / 'x'), **MAIN)
    assert overtrain.main([config_path, '--lrs=1e-3,3e-3', '--plan']) == 0
    commands = [
        line.split(' ', 3)[3]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith('python ')
    ]
    for lr in ('0.001', '0.003'):
        main = f'{tmp_path / "x"}_lr{lr}'
        assert f'--lr={lr} --out_dir={main} --keep_steps=12' in commands
        assert (
            f'--lr={lr} --out_dir={main} --schedule=cosine --train_tokens=3840 --out_dir={main}_cosine_3.84K'
            in (commands)
        )
    assert len(commands) == 8 and not os.path.exists(tmp_path / 'x_lr0.001')  # planned, nothing run
    assert overtrain.main([config_path, '--lrs=3e-3,x', '--plan']) == 2
    assert 'expected peak LRs, comma-separated' in capsys.readouterr().err


def test_each_schedule_is_compared_at_its_best_lr(pystdlib_data, tmp_path):
    config_path = write_config(tmp_path, pystdlib_data, out_dir=str(tmp_path / 'x'), **MAIN)
    sweep = {
        lr: overtrain.plan(*load_config(config_path, [f'--out_dir={tmp_path}/x_lr{lr:g}']))
        for lr in (1e-3, 3e-3)
    }
    # final val bpb as the runs would write them: wsd does best at 3e-3, cosine at 1e-3 (the short one) and 3e-3
    scores = {
        1e-3: {'wsd': 2.30, 'cooldown': 2.50, 'cosine': [2.45, 2.31]},
        3e-3: {'wsd': 2.20, 'cooldown': 2.40},
    }
    scores[3e-3]['cosine'] = [2.48, 2.25]
    for lr, runs in sweep.items():
        cosine = iter(scores[lr]['cosine'])
        for run in runs:
            bpb = next(cosine) if run.schedule == 'cosine' else scores[lr][run.schedule]
            os.makedirs(run.out_dir, exist_ok=True)
            with open(os.path.join(run.out_dir, 'summary.json'), 'w') as f:
                json.dump({'val_bpb': bpb}, f)
    rows = overtrain.at_best_lr(sweep, chinchilla=3840)
    assert rows[2:] == [
        '| 3.84K | 1.00 | 2.4000 | 0.003 | 2.4500 | 0.001 | -0.0500 |',
        '| 6.14K | 1.60 | 2.2000 | 0.003 | 2.2500 | 0.003 | -0.0500 |',
    ]
