"""
test_schedule.py: the batch and LR schedule hit their endpoints, and the loss forecast: Tissue et al.'s law
fitted to a curve drawn from it with noise gives back its parameters and the end of the run from a quarter of it;
what-ifs, cooldowns and branches are the schedules they name; a run forecasts at its evals, keeps those at 10%,
25% and 50% for summary.json, report.md and loss.png, and `ledger.py --forecast` reads what it wrote.
"""

import json
import math

import numpy as np
import pytest

import helpers
import ledger
import train
from ledgergpt import plot, schedule
from ledgergpt.config import TrainConfig


def test_lr_schedule_endpoints():
    cfg = TrainConfig(lr=1e-3, warmup_frac=0.01, min_lr_ratio=0.1)
    total = 1000  # 10 warmup steps
    assert schedule.lr_at(0, total, cfg) == pytest.approx(1e-4)  # warmup starts at lr / warmup
    assert schedule.lr_at(9, total, cfg) == pytest.approx(1e-3)  # the peak, on the last warmup step
    # 10% of the peak on the last step
    assert schedule.lr_at(total - 1, total, cfg) == pytest.approx(1e-4)
    middle = 9 + (total - 10) // 2 + 1  # half-way through the decay: the mean
    assert schedule.lr_at(middle, total, cfg) == pytest.approx(5.5e-4, rel=1e-2)
    lrs = [schedule.lr_at(s, total, cfg) for s in range(total)]
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))  # cosine decays monotonically
    wsd = TrainConfig(lr=1e-3, warmup_frac=0.01, schedule='wsd', decay_frac=0.2)
    # stable
    assert schedule.lr_at(9, total, wsd) == schedule.lr_at(799, total, wsd) == pytest.approx(1e-3)
    # half-way down the linear decay
    assert schedule.lr_at(899, total, wsd) == pytest.approx(5.5e-4)
    assert schedule.lr_at(total - 1, total, wsd) == pytest.approx(1e-4)
    assert np.allclose(
        schedule.lrs(total, wsd),
        np.array([schedule.lr_at(s, total, wsd) for s in range(total)]) / 1e-3,
    )


def test_batch_ramp():
    step_tokens = 8 * 1024  # one micro-step
    cfg = TrainConfig(
        batch_tokens=524_288,
        batch_ramp_start=32_768,
        batch_ramp_tokens=10_000_000,
        train_tokens=20_000_000,
    )
    assert schedule.batch_tokens_at(0, cfg, step_tokens) == 32_768
    assert (
        schedule.batch_tokens_at(5_000_000, cfg, step_tokens)
        == 278_528 // step_tokens * step_tokens
    )
    assert schedule.batch_tokens_at(10_000_000, cfg, step_tokens) == 524_288
    seen, steps, batches = 0, 0, []
    while seen < cfg.train_tokens:
        batches.append(schedule.batch_tokens_at(seen, cfg, step_tokens))
        seen, steps = seen + batches[-1], steps + 1
    assert schedule.planned_steps(cfg, step_tokens) == steps
    assert batches == sorted(batches) and all(b % step_tokens == 0 for b in batches)
    book_run = TrainConfig(batch_tokens=524_288, train_tokens=26_000_000_000)
    assert schedule.planned_steps(book_run, step_tokens) == 49_592  # ceil(26e9 / 524,288)


# -----------------------------------------------------------------------------------------------------
# The forecast.

TRUE = dict(L0=2.0, A=3.0, alpha=0.3, C=0.003)  # L = L0 + A S1^-alpha - C S2
# the val loss's offset from the train law; val bits per byte over the val loss
GAP, BITS_PER_NAT = 0.1, 0.4


def drawn_curve(lrs, memory):
    """(S1, S2) after k updates by the paper's recursion, written out: m_i = lam m_(i-1) + (lr_(i-1) - lr_i)."""
    lam, m, s1, s2 = 1 - 1 / memory, 0.0, [0.0], [0.0]
    for i, lr in enumerate(lrs):
        m = lam * m + ((lrs[i - 1] if i else lr) - lr)
        s1.append(s1[-1] + lr)
        s2.append(s2[-1] + m)
    s1, s2 = np.array(s1), np.array(s2)
    with np.errstate(divide='ignore'):  # S1 = 0 before the first update
        return TRUE['L0'] + TRUE['A'] * s1 ** -TRUE['alpha'] - TRUE['C'] * s2


def write_metrics(path, law, until, seed=0, log_every=10, eval_every=200, noise=0.01):
    """metrics.jsonl as train.py writes it, to step `until`: each log step's interval mean train loss (noise
    0.01), each eval's val loss (the law after its updates + GAP, noise 0.002)."""
    rng = np.random.default_rng(seed)
    with open(path, 'w') as f:
        for step in range(log_every, until + 1, log_every):
            # the mean of the losses of steps step-9 .. step
            mean = law[step - log_every : step].mean() + rng.normal(0, noise)
            f.write(
                json.dumps(dict(step=step, tokens=256 * step, loss=mean + 0.05, loss_mean=mean))
                + '\n'
            )
            if step % eval_every == 0:
                val = law[step] + GAP + rng.normal(0, 0.002)
                f.write(
                    json.dumps(
                        dict(step=step, tokens=256 * step, val_loss=val, val_bpb=val * BITS_PER_NAT)
                    )
                    + '\n'
                )
    return str(path)


def test_the_law_fitted_to_its_own_curve_gives_back_its_parameters(tmp_path):
    cfg = TrainConfig(
        lr=1e-3, warmup_frac=0.01, train_tokens=2000 * 256, batch_tokens=256, micro_batch=8
    )
    end = schedule.planned_steps(cfg, 256)
    assert end == 2000
    # the run's memory: 5% of its steps
    law = drawn_curve(schedule.lrs(end, cfg), memory=0.05 * end)
    fitted = schedule.fit_run(write_metrics(tmp_path / 'metrics.jsonl', law, end), cfg, end)
    assert fitted.memory == 100 and fitted.step == 2000
    assert fitted.params == pytest.approx(list(TRUE.values()), rel=0.1)
    assert fitted.gap == pytest.approx(GAP, abs=0.01)
    # from a quarter of the run the end's val loss inside its 95% interval (+-3%); from half of it within 1%
    final = law[end] + GAP
    for until, within in ((500, 0.03), (1000, 0.01)):
        made = schedule.forecast(
            write_metrics(tmp_path / 'part.jsonl', law, until, eval_every=100), cfg, end, 256
        )
        assert made['step'] == until and made['at'] == until / end and made['end_step'] == end
        assert made['val_loss'] == pytest.approx(final, rel=within) and 'not_yet' not in made
        assert (
            made['low'] < final < made['high'] and made['high'] - made['val_loss'] < within * final
        )
        assert made['val_bpb'] == pytest.approx(made['val_loss'] * BITS_PER_NAT, rel=0.01)
    # the same schedule's shape at other lengths: what the law drawn on them gives
    for times, other in made['what_if'].items():
        steps = round(float(times[:-1]) * end)
        assert other['steps'] == steps
        truth = drawn_curve(schedule.lrs(steps, cfg), memory=100)[steps] + GAP
        assert other['val_loss'] == pytest.approx(truth, rel=0.01)


def test_a_wsd_run_forecasts_its_branches_once_its_own_decay_has_begun(tmp_path):
    cfg = TrainConfig(
        lr=1e-3,
        warmup_frac=0.01,
        schedule='wsd',
        decay_frac=0.2,
        train_tokens=2000 * 256,
        batch_tokens=256,
        micro_batch=8,
        cooldowns=(500 * 256, 1000 * 256),
    )
    law = drawn_curve(schedule.lrs(2000, cfg), memory=100)
    # in the stable phase the decay's gain C is any value: said, not guessed
    stable = schedule.forecast(write_metrics(tmp_path / 'stable.jsonl', law, 1600), cfg, 2000, 256)
    assert stable == {
        'not_yet': 'the LR has fallen 0% from its peak, 10% needed to measure what its decay buys'
    }
    # 200 steps into its decay (from step 1600: the LR at 55% of the peak), the branches ending at 500 and 1000
    # steps, each its last 20% a decay: what the law drawn on them gives, before they run
    made = schedule.forecast(write_metrics(tmp_path / 'decaying.jsonl', law, 1800), cfg, 2000, 256)
    assert made['val_loss'] == pytest.approx(law[2000] + GAP, rel=0.01)
    assert sorted(made['branches']) == [500 * 256, 1000 * 256]
    for tokens, made_branch in made['branches'].items():
        steps = tokens // 256
        assert made_branch['steps'] == steps
        cooldown = (steps - steps // 5, steps // 5)
        truth = drawn_curve(schedule.lrs(2000, cfg, cooldown, steps), memory=100)[steps] + GAP
        assert made_branch['val_loss'] == pytest.approx(truth, rel=0.01)
        assert made_branch['low'] < truth < made_branch['high']


def test_a_forecast_says_why_it_is_not_made_yet(tmp_path):
    cfg = TrainConfig(
        lr=1e-3, warmup_frac=0.01, train_tokens=2000 * 256, batch_tokens=256, micro_batch=8
    )
    law = drawn_curve(schedule.lrs(2000, cfg), memory=100)
    # 9 log steps, the first in warm-up (20 steps)
    few = write_metrics(tmp_path / 'few.jsonl', law, 90)
    assert schedule.forecast(few, cfg, 2000, 256) == {
        'not_yet': '7 log intervals after warm-up, 8 needed'
    }
    no_eval = write_metrics(tmp_path / 'no_eval.jsonl', law, 190)
    assert schedule.forecast(no_eval, cfg, 2000, 256) == {'not_yet': 'no eval after warm-up yet'}
    early = write_metrics(tmp_path / 'early.jsonl', law, 200, eval_every=20)
    assert schedule.forecast(early, cfg, 2000, 256) == {
        'not_yet': 'the LR has fallen 2% from its peak, 10% needed to measure what its decay buys'
    }
    # a quarter of a cosine run, its losses 30 times as noisy: an interval too wide to stand behind
    noisy = write_metrics(tmp_path / 'noisy.jsonl', law, 500, eval_every=100, noise=0.3)
    wide = schedule.forecast(noisy, cfg, 2000, 256)
    assert wide['not_yet'].startswith('its 95% interval, +-')
    assert wide['high'] - wide['val_loss'] > 0.1 * wide['val_loss']


def test_a_run_forecasts_at_its_evals_and_checks_them_at_the_end(
    pystdlib_data, tmp_path, monkeypatch, capsys
):
    config = helpers.write_config(
        tmp_path / 'config.py',
        dict(helpers.TINY_RUN, data=pystdlib_data, train_tokens=60 * 256, eval_every=20),
    )
    out = tmp_path / 'out'
    real, calls = schedule.forecast, []

    def failing_once(*args):  # a forecast that raises costs its line, not the run
        calls.append(args)
        if len(calls) == 1:
            raise RuntimeError('injected')
        return real(*args)

    monkeypatch.setattr(schedule, 'forecast', failing_once)
    assert train.main([config, f'--out_dir={out}']) == 0
    log = capsys.readouterr().out
    assert 'step 15: no forecast of the final val loss yet: RuntimeError: injected' in log
    entries = [json.loads(line) for line in open(out / 'metrics.jsonl')]
    # a log every step: each interval the step alone (its mean: the loss; from: itself)
    assert all(
        e['loss_mean'] == e['loss'] and e['mean_from'] == e['step'] for e in entries if 'loss' in e
    )
    evals = [e['step'] for e in entries if 'val_loss' in e]
    made = {e['step']: e['forecast'] for e in entries if 'forecast' in e}
    # 25% and 50% of 60 steps (10% is the last warm-up step: no forecast), and every 20
    assert evals == sorted(made) == [15, 20, 30, 40, 60]
    summary = json.load(open(out / 'summary.json'))
    assert sorted(summary['forecasts']) == ['25%', '50%']
    assert summary['forecasts']['25%'] == made[15] and summary['forecasts']['50%'] == made[30]
    assert made[30]['end_step'] == 60 and made[30]['kept'] == '50%'
    report = open(out / 'report.md').read()
    row = f"| final val loss, forecast at 50% of the run (step 30; 95%: {made[30]['low']:.4f}"
    assert row in report and f"| {made[30]['val_loss']:.4f} | {summary['val_loss']:.4f} |" in report
    # loss.png's error bars
    drawn = [at for at, f in summary['forecasts'].items() if 'val_loss' in f]
    assert '50%' in drawn and [f[0] for f in plot.read_run(str(out))['forecasts']] == drawn
    # a folder that is not a run: one line
    assert ledger.main([config, f'--forecast={tmp_path}']) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: no ledger.json in {tmp_path}: --forecast takes a train.py run's out_dir"
    )
    # the ledger reads the same curve: at the run's end, and twice as long
    assert ledger.main([config, f'--forecast={out}', f'--train_tokens={120 * 256}']) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(
        f'{out} at its planned end, fitted to its curve to step 60 (step 60): val loss '
    )
    assert lines[1].startswith('under this config: cosine, 30,720 tokens (step 120): val loss ')
    assert float(lines[1].split('val loss ')[1].split()[0]) < float(
        lines[0].split('val loss ')[1].split()[0]
    )
    assert math.isfinite(float(lines[0].split('val loss ')[1].split()[0]))
