"""
test_plot.py: plot.py reads a synthetic run (train steps, evals, a rollback whose abandoned steps must vanish,
HellaSwag, ledger.json's P), puts every line where the metrics say, and writes a 1000 x 600 PNG that is not blank;
several runs overlay; draw_run never raises and says why once; bad input is one line.
"""

import json
import os
import sys

import matplotlib.image
import numpy as np

from ledgergpt import plot

BATCH = 1000  # tokens per step


def loss_at(step):
    return 3 + 5 * np.exp(-step / 30)


def write_run(folder, params=4000, steps=100):
    """A run as train.py writes it: log steps every step, val every 20 (no 'tokens': read from the log steps),
    steps 51-59 logged, then a spike at step 60 rolled back to the checkpoint of step 50 and steps 51.. run again,
    HellaSwag at 50 and 100; ledger.json with P = params."""
    folder.mkdir()
    noise = np.random.default_rng(0).normal(0, 0.05, steps + 1)
    entries = []
    for step in range(1, 60):
        entries.append(
            {
                'step': step,
                'tokens': step * BATCH,
                'loss': loss_at(step) + noise[step] + (step > 50),
            }
        )
        if step % 20 == 0:
            entries.append({'step': step, 'val_loss': loss_at(step) + 0.1})
        if step == 50:
            entries.append({'step': step, 'hellaswag': 0.26, 'hellaswag_stderr': 0.004})
    entries.append(
        {
            'event': 'rollback',
            'step': 60,
            'loss': 9.9,
            'to_step': 50,
            'skipped': [400, 480],
            'rollbacks': 1,
        }
    )
    for step in range(51, steps + 1):
        entries.append({'step': step, 'tokens': step * BATCH, 'loss': loss_at(step) + noise[step]})
        if step % 20 == 0:
            entries.append({'step': step, 'val_loss': loss_at(step) + 0.1})
    entries.append({'step': steps, 'hellaswag': 0.27, 'hellaswag_stderr': 0.004})
    # mid-write
    (folder / 'metrics.jsonl').write_text(
        ''.join(json.dumps(e) + '\n' for e in entries) + '{"step": 10'
    )
    (folder / 'ledger.json').write_text(json.dumps({'params': {'total': params}}))
    return str(folder)


def lines_labelled(ax, start):
    return [line for line in ax.lines if line.get_label().startswith(start)]


def test_the_run_is_read_right(tmp_path):
    run = plot.read_run(write_run(tmp_path / 'run'))
    tokens, losses = run['train']
    assert list(tokens) == [step * BATCH for step in range(1, 101)]
    # not the abandoned +1
    assert all(abs(losses[step - 1] - loss_at(step)) < 0.3 for step in range(51, 60))
    assert list(run['val'][0]) == [20_000, 40_000, 60_000, 80_000, 100_000]
    assert (list(run['rollbacks'][0]), list(run['rollbacks'][1])) == ([60_000], [9.9])
    assert list(run['hellaswag'][0]) == [50_000, 100_000] and list(run['hellaswag'][1]) == [
        0.26,
        0.27,
    ]
    assert run['chinchilla'] == 80_000 and run['name'] == 'run'


def test_the_moving_average():
    line = np.linspace(8, 3, 500)
    assert np.allclose(plot.smooth(line), line)  # centered: no lag behind a falling loss
    # 101 points a window: the noise / sqrt(101) ~ 10
    noise = np.random.default_rng(2).normal(size=5000)
    smoothed = plot.smooth(noise)
    assert (
        smoothed[100:-100].std() < noise.std() / 5
        and smoothed[0] == noise[0]
        and smoothed[-1] == noise[-1]
    )
    # 5 at least
    assert np.allclose(
        plot.smooth(noise[:9])[2:-2], np.convolve(noise[:9], np.ones(5) / 5, 'valid')
    )


def test_the_picture(tmp_path):
    run = write_run(tmp_path / 'run')
    fig = plot.figure([run])
    ax, scores = fig.axes
    [chinchilla] = lines_labelled(ax, 'run 20 x P = 80K tokens (Chinchilla)')
    assert list(chinchilla.get_xdata()) == [80_000, 80_000]  # 20 x 4,000 parameters
    [rollback] = lines_labelled(ax, 'run rollback')
    assert list(rollback.get_xdata()) == [60_000, 60_000]
    # steep start cut
    assert ax.get_ylim()[1] < loss_at(1) and ax.get_ylim()[0] < min(plot.read_run(run)['train'][1])
    [average] = lines_labelled(ax, 'run train (moving average)')
    assert list(average.get_ydata()) == list(plot.smooth(plot.read_run(run)['train'][1]))
    [errorbars] = scores.containers
    hellaswag = errorbars.lines[0]
    assert errorbars.get_label() == 'run HellaSwag'
    assert list(hellaswag.get_xdata()) == [50_000, 100_000] and list(hellaswag.get_ydata()) == [
        26,
        27,
    ]
    assert ax.get_xlabel() == 'tokens seen' and scores.get_ylabel() == 'HellaSwag accuracy (%)'

    path = plot.draw([run], str(tmp_path / 'loss.png'))
    image = matplotlib.image.imread(path)
    assert image.shape == (600, 1000, 4)
    ink = (image[:, :, :3] < 0.9).any(axis=2)
    assert 0.02 < ink.mean() < 0.5  # lines and text on a white page
    # the dotted Chinchilla line: in the picture, the column at x = 80K tokens is inked over much of the plot's height
    # the layout is settled when drawn: the axes' transforms hold from here
    fig.savefig(tmp_path / 'same.png')
    ink = (matplotlib.image.imread(tmp_path / 'same.png')[:, :, :3] < 0.9).any(axis=2)
    x = int(round(ax.transData.transform((80_000, 0))[0]))
    top, bottom = (600 - ax.transAxes.transform(corner)[1] for corner in ((0, 1), (0, 0)))
    assert ink[int(top) + 5 : int(bottom) - 5, x - 1 : x + 2].any(axis=1).mean() > 0.4
    # beside it: mostly white
    assert ink[int(top) + 5 : int(bottom) - 5, x + 20 : x + 23].any(axis=1).mean() < 0.2


def test_runs_overlay(tmp_path, capsys):
    short = write_run(tmp_path / 'short', params=4000)
    big = write_run(tmp_path / 'big', params=10**7)  # 20 x P = 200M tokens, far past the run's 100K
    assert plot.main([short, big, '--out', str(tmp_path / 'both.png')]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / 'both.png')
    fig = plot.figure([short, big])
    ax = fig.axes[0]
    colors = (
        {line.get_color() for line in lines_labelled(ax, 'short')},
        {line.get_color() for line in lines_labelled(ax, 'big')},
    )
    assert colors == ({'C0'}, {'C1'})
    # not stretched to 200M
    assert not lines_labelled(ax, 'big 20 x P') and ax.get_xlim()[1] < 200_000
    legend = [text.get_text() for text in fig.legends[0].get_texts()]
    assert 'short val' in legend and 'big val' in legend and 'HellaSwag chance (25%)' in legend
    assert 'big: 20 x P = 200M tokens (Chinchilla), 2,000 x its tokens' in legend


def test_draw_run_never_raises(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(plot, 'NOT_DRAWN', set())
    run = write_run(tmp_path / 'run')
    assert plot.draw_run(run) == os.path.join(run, 'loss.png') and os.path.isfile(
        os.path.join(run, 'loss.png')
    )
    fresh = tmp_path / 'fresh'
    fresh.mkdir()
    (fresh / 'metrics.jsonl').write_text('')
    assert plot.draw_run(str(fresh)) is None and plot.draw_run(str(fresh)) is None
    # as if matplotlib were not installed
    monkeypatch.setitem(sys.modules, 'matplotlib.figure', None)
    assert plot.draw_run(run) is None and plot.draw_run(run) is None
    said = capsys.readouterr().err.strip().split('\n')
    assert (
        len(said) == 2
        and 'has no logged step yet' in said[0]
        and 'pip install matplotlib' in said[1]
    ), said


def test_a_run_of_one_logged_step_shows(tmp_path):
    """configs/pystdlib_cpu.py --max_steps=5 logs step 5 alone (log_every = 5): one point, which a line alone hides."""
    folder = tmp_path / 'short'
    folder.mkdir()
    (folder / 'metrics.jsonl').write_text(
        '{"step": 5, "tokens": 40960, "loss": 8.13}\n{"step": 5, "val_loss": 8.11}\n'
    )
    [average] = lines_labelled(plot.figure([str(folder)]).axes[0], 'short train')
    assert average.get_marker() == '.' and list(average.get_xdata()) == [40960]


def test_bad_input_is_one_line(tmp_path, capsys):
    assert plot.main([str(tmp_path / 'nothing')]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith('error: no metrics.jsonl in') and '\n' not in err
