"""scaling.py and experiments/ladder.py: the fit recovers a known law from its losses, the compute-optimal split is
the minimum along the budget, the fit file's errors are one line, the bill's section (`ledger.py --fit`) prints what
the fit predicts with its warnings, a run given a fit writes its prediction beside the measured loss, the ladder's
grid spans its budgets and skips finished runs, and the ladder's figure is drawn."""

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

import helpers
import ledger
import train
from ledgergpt import bill, files, scaling, sums
from ledgergpt.config import ConfigError, TrainConfig, load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOFFMANN = sums.CHINCHILLA_FITS['hoffmann2022']  # E 1.69, A 406.4, B 410.7, alpha 0.34, beta 0.28


def load_ladder():
    spec = importlib.util.spec_from_file_location(
        'ladder', os.path.join(ROOT, 'experiments', 'ladder.py')
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def synthetic_runs(true, sizes, budgets):
    """IsoFLOP runs (N, D = C / 6N, L(N, D) exactly) for a law."""
    runs = [(n, c / (6 * n)) for c in budgets for n in sizes]
    return [(n, d, scaling.law(true, n, d)) for n, d in runs]


def test_fit_recovers_a_known_law_within_one_percent():
    # Hoffmann et al.'s own law on a ladder like theirs, 5 sizes x 3 budgets, losses exactly on it
    runs = synthetic_runs(HOFFMANN, [1e6 * 3**i for i in range(5)], [1e15, 4e15, 1.6e16])
    fitted = scaling.fit_law(*zip(*runs), bootstrap=4)
    for key in scaling.KEYS:
        assert fitted[key] == pytest.approx(HOFFMANN[key], rel=0.01), key
    assert len(fitted['bootstrap']) == 4 and all(len(s) == 5 for s in fitted['bootstrap'])
    # a resample of exact losses is fitted by the same law: every refit agrees too
    for sample in fitted['bootstrap']:
        for key, value in zip(scaling.KEYS, sample):
            assert value == pytest.approx(HOFFMANN[key], rel=0.01), key
    assert max(abs(r) for r in fitted['residuals']) < 1e-4 and fitted['at_bounds'] == []


def test_compute_optimal_is_the_minimum_along_the_budget():
    compute, k = 1e21, 6.3
    best = scaling.compute_optimal(HOFFMANN, compute, k)
    assert k * best['N'] * best['D'] == pytest.approx(compute)
    assert best['loss'] == pytest.approx(scaling.law(HOFFMANN, best['N'], best['D']))
    for step in (0.97, 1.03):  # either side along C = k N D is higher
        n = best['N'] * step
        assert scaling.law(HOFFMANN, n, compute / (k * n)) > best['loss']
    # at Chinchilla's own compute (5.76e23 FLOPs: 70B x 1.4T) Epoch AI's refit of the paper's data gives its ~20
    # tokens per parameter (72B x 1.3T); the paper's published, rounded approach-3 numbers give 93 (Besiroglu et al.
    # 2024: they do not fit the paper's own data)
    epoch = scaling.compute_optimal(sums.CHINCHILLA_FITS['epoch2024'], 5.76e23)
    assert 70e9 < epoch['N'] < 75e9 and 17 < epoch['tokens_per_param'] < 20
    assert 90 < scaling.compute_optimal(HOFFMANN, 5.76e23)['tokens_per_param'] < 95


def fit_file(tmp_path, data='data/pystdlib', tokenizer=None):
    """A fit file as ladder.py writes one: Hoffmann's law, a hand-made bootstrap, two grid runs and a held-out one."""
    samples = [
        [HOFFMANN[k] * (1 + 0.01 * (i - 2) * (k == 'E')) for k in scaling.KEYS] for i in range(5)
    ]
    fitted = {**HOFFMANN, 'bootstrap': samples, 'residuals': [-0.002, 0.001, 0.003]}
    runs = [
        dict(
            name=name,
            held_out=held_out,
            N=n,
            D=d,
            C=6 * n * d,
            budget=6 * n * d,
            flops_per_token=6 * n,
            val_loss=scaling.law(HOFFMANN, n, d) * (1 + 0.001 * i),
            val_bpb=None,
            val_bytes_per_token=3.8,
        )
        for i, (name, held_out, n, d) in enumerate(
            [('a', False, 1e6, 1e8), ('b', False, 4e6, 5e7), ('h', True, 2e6, 3e8)]
        )
    ]
    tokenizer = tokenizer or scaling.tokenizer_of(data)
    fit = scaling.make_fit(fitted, runs, data, tokenizer, {'lr': 2e-3}, 'test')
    path = str(tmp_path / 'fit.json')
    files.save_json(path, fit)
    return path


def test_predict_interval_and_bits_per_byte(tmp_path):
    fit = scaling.load_fit(fit_file(tmp_path))
    p = scaling.predict(fit, 2e6, 3e8)
    assert p['loss'] == pytest.approx(scaling.law(HOFFMANN, 2e6, 3e8))
    assert p['low'] < p['loss'] < p['high']
    # the grid's val bytes per token
    assert p['bpb'] == pytest.approx(p['loss'] / math.log(2) / 3.8)
    assert fit['range']['N'] == [1e6, 4e6]  # the grid's, the held-out run left out
    assert 'held out h' in scaling.format_fit(fit)


def test_fit_file_errors_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match='cannot read it'):
        scaling.load_fit(str(tmp_path / 'none.json'))
    (tmp_path / 'bad.json').write_text('{')
    with pytest.raises(ConfigError, match='not JSON'):
        scaling.load_fit(str(tmp_path / 'bad.json'))
    (tmp_path / 'other.json').write_text('{"E": 1}')
    with pytest.raises(ConfigError, match='not a fit file'):
        scaling.load_fit(str(tmp_path / 'other.json'))


def bad_fit(tmp_path, key, value):
    """A fit file as ladder.py writes one, but for one key's value."""
    fit = json.loads(open(fit_file(tmp_path)).read())
    fit[key] = value(fit) if callable(value) else value
    path = tmp_path / 'bad.json'
    path.write_text(json.dumps(fit))
    return str(path)


@pytest.mark.parametrize(
    'key, value, message',
    [
        ('E', 'abc', 'E is "abc", not a positive number'),
        ('alpha', None, 'alpha is null, not a number above 0, at most 3'),
        ('bootstrap', [], 'bootstrap is [], not a non-empty list of [E, A, B, alpha, beta]'),
        ('range', lambda fit: dict(fit['range'], N=[0, 0]), 'range is {"N": [0, 0], '),
        ('runs', [{'held_out': 'no'}], 'runs is [{"held_out": "no"}], not a list of runs'),
    ],
)
def test_a_malformed_fit_file_is_one_line(tmp_path, key, value, message):
    """Each once ended in a TypeError, IndexError or ZeroDivisionError traceback."""
    path = bad_fit(tmp_path, key, value)
    command = [
        sys.executable,
        'ledger.py',
        'configs/pystdlib_cpu.py',
        f'--fit={path}',
        '--gpu=H100',
    ]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2 and 'Traceback' not in result.stderr, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith(f'error: fit {path}: ') and message in line, line


def test_a_run_given_a_malformed_fit_stops_before_training(tmp_path, capsys):
    path = bad_fit(tmp_path, 'bootstrap', [])
    config = helpers.write_config(
        tmp_path / 'config.py',
        dict(
            n_layer=1,
            n_head=2,
            n_embd=32,
            vocab_size=256,
            block_size=32,
            micro_batch=4,
            batch_tokens=128,
            train_tokens=256,
            compile=False,
            dtype='float32',
            data='synthetic',
            fit=path,
        ),
    )
    assert train.main([config, f'--out_dir={tmp_path / "out"}']) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert 'bootstrap is [], not a non-empty list' in line
    assert not (tmp_path / 'out' / 'metrics.jsonl').exists()


def test_the_bill_prints_the_fit_and_its_warnings(tmp_path, capsys, pystdlib_data):
    """The fit of a prepared folder (its tokenizer from its meta.json), billed for a plan on that folder, then
    for the H200 plan on another, unprepared one."""
    path = fit_file(tmp_path, data=pystdlib_data)
    fit = scaling.load_fit(path)
    assert fit['tokenizer'] == scaling.tokenizer_of(pystdlib_data) is not None
    flags = ['--gpu=H200', f'--data={pystdlib_data}', '--vocab_size=512']
    assert ledger.main(['configs/pystdlib_cpu.py', *flags, f'--fit={path}']) == 0
    out = capsys.readouterr().out
    prediction = sums.predict(*load_config('configs/pystdlib_cpu.py', flags))
    n_params, tokens = prediction['params']['matmul'], prediction['tokens']
    assert 'fitted to OUR runs' in out
    for multiple in (0.5, 1, 2, 4):
        loss = scaling.predict(fit, n_params, multiple * tokens)['loss']
        assert f"{multiple:g}x the tokens: {bill.si(multiple * tokens)}" in out
        assert f'{loss:.3f} nats' in out
    # the same: no warning
    assert 'this plan trains on' not in out and "the fit's tokenizer" not in out
    # the H200 plan: other data, other tokenizer, far past the fit's compute
    assert ledger.main(['configs/h200_1b3.py', '--fit', path, '--json']) == 0
    checked = json.loads(capsys.readouterr().out)['fit']
    warnings = '\n'.join(checked['warnings'])
    assert 'this plan trains on data/fineweb_edu' in warnings
    assert "this plan's C" in warnings and 'tokenizer' in warnings
    h200 = sums.predict(*load_config('configs/h200_1b3.py'))
    assert checked['val_loss_predicted'] == pytest.approx(
        scaling.law(fit, h200['params']['matmul'], h200['tokens'])
    )


def test_a_run_given_a_fit_reports_its_prediction_beside_the_measured_loss(tmp_path):
    assert TrainConfig.__dataclass_fields__['fit'].metadata['resume'] == 'free'
    path = fit_file(tmp_path, data='synthetic', tokenizer='none')
    config = helpers.write_config(
        tmp_path / 'config.py',
        dict(
            arch='llama',
            n_layer=1,
            n_head=2,
            n_embd=32,
            vocab_size=256,
            block_size=32,
            micro_batch=4,
            batch_tokens=128,
            train_tokens=2 * 128,
            compile=False,
            dtype='float32',
            eval_tokens=256,
            data='synthetic',
            fit=path,
        ),
    )
    out = tmp_path / 'out'
    assert train.main([config, f'--out_dir={out}']) == 0
    summary = json.loads((out / 'summary.json').read_text())
    prediction = json.loads((out / 'ledger.json').read_text())
    expected = scaling.predict(scaling.load_fit(path), prediction['params']['matmul'], 256)
    assert summary['val_loss_predicted'] == pytest.approx(expected['loss'])
    assert summary['val_loss_predicted_low'] == pytest.approx(expected['low'])
    report = (out / 'report.md').read_text()
    assert f"predicted final val loss (fit {path}): {expected['loss']:.4f}" in report
    assert f"measured {summary['val_loss']:.4f} at step 2" in report


def test_ladder_grid_spans_its_budgets_and_skips_finished_runs(tmp_path):
    ladder = load_ladder()
    spec = ladder.PRESETS['cpu']
    rungs = ladder.plan('cpu', str(tmp_path))
    held_out = len(spec['held_out_shapes'])
    assert len(rungs) == len(spec['budgets']) * len(spec['shapes']) + held_out
    batch = spec['overrides']['batch_tokens']
    for rung in rungs:
        model_cfg, train_cfg = load_config(rung.flags[0], rung.flags[1:])
        assert train_cfg.train_tokens == rung.tokens and rung.tokens % batch == 0  # whole batches
        assert rung.n_params == sums.count_params(model_cfg)['matmul']
        # C within half a batch of the budget
        assert (
            abs(rung.flops_per_token * rung.tokens - rung.budget)
            <= rung.flops_per_token * batch / 2
        )
    for rung in rungs[-held_out:]:  # after the grid
        assert rung.held_out and rung.budget == spec['held_out_factor'] * max(spec['budgets'])
    rung = rungs[0]
    assert ladder.finished(rung) is None
    os.makedirs(rung.out_dir)
    summary = {'tokens_seen': rung.tokens - batch, 'val_loss': 7.0, 'val_bpb': 2.6}
    (tmp_path / rung.name / 'summary.json').write_text(json.dumps(summary))
    assert ladder.finished(rung) is None  # stopped short: it resumes
    summary.update(tokens_seen=rung.tokens, val_bytes_per_token=3.8, device='cpu', torch='2')
    (tmp_path / rung.name / 'summary.json').write_text(json.dumps(summary))
    assert ladder.finished(rung)['val_loss'] == 7.0
    assert ladder.run_all(rungs[:1]) == 0  # finished: nothing runs
    assert ladder.record(rung, summary)['C'] == rung.flops_per_token * rung.tokens


def test_the_ladder_figure_is_drawn(tmp_path):
    pytest.importorskip('matplotlib')
    from ledgergpt import plot

    out = plot.draw_ladder(fit_file(tmp_path), str(tmp_path / 'ladder.png'))
    assert open(out, 'rb').read(8) == b'\x89PNG\r\n\x1a\n'


def test_the_fit_beside_the_branches(tmp_path):
    pytest.importorskip('matplotlib')
    from ledgergpt import plot

    run = tmp_path / 'run'
    run.mkdir()
    (run / 'ledger.json').write_text(json.dumps({'params': {'matmul': 2_000_000}}))
    fit = scaling.load_fit(fit_file(tmp_path))
    ax = plot.blank_figure().add_subplot()
    plot.fitted_loss(ax, fit, str(run), 1e9)
    [line] = ax.lines
    tokens = line.get_xdata()
    assert tokens[0] == pytest.approx(plot.STEEP_START * 1e9) and tokens[-1] == 1e9
    assert line.get_ydata() == pytest.approx([scaling.law(fit, 2e6, d) for d in tokens])
    assert 'our fit' in line.get_label()


def test_bad_input_is_one_line(tmp_path, capsys):
    ladder = load_ladder()
    assert ladder.main(['--preset=tpu']) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith('error: usage: python experiments/ladder.py --preset=cpu|gpu')
        and '\n' not in err
    )
    assert ladder.main(['--preset=cpu', '--plan', f'--out={tmp_path}']) == 0  # plans, runs nothing
    assert '| heldout_c1.5e13_L2_H64 |' in capsys.readouterr().out and not os.listdir(tmp_path)
    assert ledger.main(['configs/pystdlib_cpu.py', f'--fit={tmp_path / "none.json"}']) == 2
    assert 'cannot read it' in capsys.readouterr().err
