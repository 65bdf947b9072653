"""
test_mixture.py: a weighted mixture of data folders. The schedule holds the weights over every window of a few
hundred sequences and is a pure function of (seed, position); the config key reads both forms and refuses bad ones
in one line; the folders must share a tokenizer; a mixture trains, resumes bit-exactly, scores each source's val
set, and 2 gloo processes read the same sequences as 1. The second source is English prose: the topics of Python's
own documentation (pydoc_data), tokenized with the pystdlib fixture's tokenizer.
"""

import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from test_train import TINY, read_metrics, run, step_losses

import ledger
import prepare
from ledgergpt import data, mixture, plot, sums
from ledgergpt.config import ConfigError, DataError, load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WEIGHTINGS = [
    'a:0.6,b:0.15,c:0.1,d:0.05,e:0.05,f:0.05',  # the 60/15/10/5/5/5 of configs/mixture_1b3.py
    'a:0.333,b:0.667',
    'a:0.5,b:0.3,c:0.2',
    'a:0.123,b:0.456,c:0.421',  # a period of 1000
    'a:0.01,b:0.99',
]


@pytest.mark.parametrize('weights', WEIGHTINGS)
def test_every_window_holds_the_weights(weights):
    schedule = mixture.Schedule(weights, seed=7)
    sources = np.array([schedule.locate(k)[0] for k in range(3000)])
    counts = np.stack(
        [np.concatenate([[0], np.cumsum(sources == s)]) for s in range(len(schedule.units))]
    )
    for n in (200, 256, 300, 500):  # every window of n consecutive sequences, at every start
        in_window = counts[:, n:] - counts[:, :-n]
        error = np.abs(in_window - n * np.array(schedule.weights)[:, None]).max()
        # iid draws would wander by sqrt(n w) ~ 7-11 at n = 300
        assert error <= 2.0, (weights, n, error)
    given = [float(part.split(':')[1]) for part in weights.split(',')]
    assert np.allclose(schedule.weights, given, atol=5e-4)  # kept to 1/1000
    # exact over whole periods
    assert schedule.drawn(schedule.period * 7) == [7 * unit for unit in schedule.units]


def test_the_schedule_is_a_pure_function_of_seed_and_position():
    weights = WEIGHTINGS[0]
    schedule = mixture.Schedule(weights, seed=1337)
    seen = [0] * 6
    # sequence k is the j-th turn of its source: every source's sequences in order, no gaps
    for k in range(2000):
        source, j = schedule.locate(k)
        assert j == seen[source]
        seen[source] += 1
    assert schedule.drawn(2000) == seen
    # a fresh schedule (a resumed run) finds k without the ones before
    later = mixture.Schedule(weights, seed=1337)
    assert [later.locate(k) for k in (1999, 5, 123_456_789)] == [
        schedule.locate(k) for k in (1999, 5, 123_456_789)
    ]
    phases = {
        tuple(mixture.Schedule(weights, seed).locate(k)[0] for k in range(20)) for seed in range(10)
    }
    assert len(phases) > 1  # the seed turns the pattern


def test_the_data_key_reads_a_dict_or_the_command_line_form(tmp_path):
    config = tmp_path / 'c.py'
    config.write_text("data = {'data/web': 3, 'data/code': 1}\n")
    _, from_file = load_config(str(config))
    _, from_cli = load_config(None, ['--data=data/web:0.75,data/code:0.25'])
    assert from_file.data == from_cli.data == 'data/web:0.75,data/code:0.25'
    # one folder stays a folder
    assert load_config(None, ['--data=data/pystdlib'])[1].data == 'data/pystdlib'
    (tmp_path / 'web:2').mkdir()  # a folder whose name reads as FOLDER:WEIGHT is still that folder
    assert load_config(None, [f'--data={tmp_path}/web:2'])[1].data == f'{tmp_path}/web:2'
    for bad, says in (
        ('--data=a:0.5,b', "cannot read 'b' as FOLDER:WEIGHT"),
        ('--data=a:0,b:1', "a's weight in the command line must be a positive number"),
        ('--data=a:1,a:2', 'names each folder once'),
        ('--data=a:0.0001,b:1', 'rounds to 0'),
    ):
        with pytest.raises(ConfigError, match=says):
            load_config(None, [bad])


@pytest.fixture(scope='module')
def prose_data(pystdlib_data, tmp_path_factory):
    """English prose in the pystdlib fixture's tokenizer: its tokenizer.json copied in first, which prepare.py
    keeps (it is the tokenizer asked for)."""
    import pydoc_data.topics

    tmp = tmp_path_factory.mktemp('prose')
    text = tmp / 'topics.txt'
    text.write_text(
        '\n\n'.join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))
    )
    out = tmp / 'prose'
    out.mkdir()
    shutil.copy(os.path.join(pystdlib_data, 'tokenizer.json'), out / 'tokenizer.json')
    prepare.prepare_files([str(text)], str(out), tokenizer='bpe:512', workers=1, val_tokens=8192)
    return str(out)


def test_mixture_stream_interleaves_the_sources_own_streams(pystdlib_data, prose_data):
    spec = f'--data={pystdlib_data}:0.7,{prose_data}:0.3'
    model_cfg, cfg = load_config(
        None, [spec, '--vocab_size=512', '--block_size=32', '--eval_tokens=1024']
    )
    stream, vals, meta = data.open_data(model_cfg, cfg)
    code, _, _ = data.open_data(
        model_cfg, load_config(None, [f'--data={pystdlib_data}', '--block_size=32'])[1]
    )
    prose, _, _ = data.open_data(
        model_cfg, load_config(None, [f'--data={prose_data}', '--block_size=32'])[1]
    )
    batch = stream.batch(100, 40)
    for i, k in enumerate(range(100, 140)):
        source, j = stream.schedule.locate(k)
        assert np.array_equal(batch[i], (code, prose)[source].sequence(j))
    names = [os.path.basename(pystdlib_data), os.path.basename(prose_data)]
    assert list(vals) == names and all(v.shape[1] == 33 for v in vals.values())
    assert sum(len(v) for v in vals.values()) * 32 <= 1024  # eval_tokens shared between the sources
    assert [meta['sources'][n]['weight'] for n in names] == [0.7, 0.3]
    expected = (
        0.7 * meta['sources'][names[0]]['bytes_per_token']
        + 0.3 * meta['sources'][names[1]]['bytes_per_token']
    )
    assert meta['bytes_per_token'] == pytest.approx(expected)
    one, _, _ = data.open_data(
        model_cfg, load_config(None, [f'--data={pystdlib_data}:1', '--block_size=32'])[1]
    )
    # a mixture of one folder is that folder
    assert np.array_equal(one.batch(0, 50), code.batch(0, 50))
    assert data.load_tokenizer(cfg.data).n_vocab == data.load_tokenizer(pystdlib_data).n_vocab


def test_folders_with_another_tokenizer_are_one_line(pystdlib_data, prose_data, tmp_path):
    other = tmp_path / 'other'
    shutil.copytree(prose_data, other)
    spec = json.loads((other / 'tokenizer.json').read_text())
    # another BPE of the same size
    spec['ranks'][300], spec['ranks'][301] = (spec['ranks'][301], spec['ranks'][300])
    (other / 'tokenizer.json').write_text(json.dumps(spec))
    model_cfg, cfg = load_config(
        None, [f'--data={pystdlib_data}:0.5,{other}:0.5', '--vocab_size=512']
    )
    with pytest.raises(DataError, match='must share one tokenizer'):
        data.open_data(model_cfg, cfg)


# -----------------------------------------------------------------------------------------------------
# Training on a mixture.


def write_mixture_config(tmp_path, code, prose, **overrides):
    keys = dict(TINY, train_tokens=8 * 256, eval_every=4, dtype='float32', **overrides)
    path = tmp_path / 'config.py'
    path.write_text(
        ''.join(f'{k} = {v!r}\n' for k, v in keys.items())
        + f'data = {{{code!r}: 0.7, {prose!r}: 0.3}}\n'
    )
    return str(path)


@pytest.fixture(scope='module')
def mixture_run(pystdlib_data, prose_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp('mixture_run')
    config = write_mixture_config(tmp, pystdlib_data, prose_data)
    assert run(config, tmp / 'full') == 0
    return config, tmp / 'full'


def test_a_mixture_trains_and_scores_each_source(mixture_run):
    config, out = mixture_run
    entries = read_metrics(out)
    scored = [e for e in entries if 'val_sources' in e]
    totals = [e for e in entries if 'val_loss' in e]
    # every 4 steps, and at 25% of the run (the loss forecast's eval)
    assert [e['step'] for e in scored] == [e['step'] for e in totals] == [2, 4, 8]
    for by_source, total in zip(scored, totals):
        sources = by_source['val_sources']
        assert [s['weight'] for s in sources.values()] == [0.7, 0.3]
        assert total['val_loss'] == pytest.approx(
            sum(s['weight'] * s['loss'] for s in sources.values())
        )
        assert all(0 < s['bpb'] < s['loss'] for s in sources.values())
    summary = json.loads((out / 'summary.json').read_text())
    assert summary['val_sources'] == scored[-1]['val_sources']
    assert summary['val_loss'] == totals[-1]['val_loss']
    curves = plot.read_run(str(out))['sources']  # loss.png draws each source's val loss
    for name, (tokens, losses) in curves.items():
        assert list(tokens) == [2 * 256, 4 * 256, 8 * 256] and list(losses) == [
            e['val_sources'][name]['loss'] for e in scored
        ]
    assert list(curves) == list(scored[-1]['val_sources']) and (out / 'loss.png').exists()


def test_a_mixture_resumes_bit_exactly(mixture_run, tmp_path):
    config, full = mixture_run
    expected = step_losses(read_metrics(full))
    assert run(config, tmp_path / 'out', '--max_steps=3') == 0
    assert run(config, tmp_path / 'out', '--resume') == 0
    losses = step_losses(read_metrics(tmp_path / 'out'))
    assert [losses[s] for s in range(3, 9)] == [expected[s] for s in range(3, 9)]  # exactly equal


def test_two_processes_read_the_mixture_like_one(mixture_run, tmp_path):
    config, full = mixture_run
    command = [
        sys.executable,
        '-m',
        'torch.distributed.run',
        '--standalone',
        '--nproc_per_node=2',
        'train.py',
    ]
    result = subprocess.run(
        command + [config, f'--out_dir={tmp_path / "out"}', '--micro_batch=2'],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    reference, losses = step_losses(read_metrics(full)), step_losses(read_metrics(tmp_path / 'out'))
    assert sorted(losses) == sorted(reference)
    # fp32: only the order of the sums differs
    assert max(abs(losses[s] - reference[s]) for s in losses) < 1e-5


# -----------------------------------------------------------------------------------------------------
# The ledger for a mixture.


def test_the_ledger_counts_what_the_run_drew_from_each_source(
    mixture_run, pystdlib_data, prose_data
):
    config, out = mixture_run
    sources = json.loads((out / 'ledger.json').read_text())['mixture']['sources']
    model_cfg, cfg = load_config(config)
    stream, _, _ = data.open_data(model_cfg, cfg)
    position = 8 * 256 // 32  # 8 steps of 8 sequences
    drawn = [0, 0]
    # which stream each sequence the run read came from, found by its tokens
    for k in range(position):
        sequence = stream.sequence(k)
        matches = [
            s for s in (0, 1) if np.array_equal(sequence, stream.streams[s].sequence(drawn[s]))
        ]
        assert len(matches) >= 1
        drawn[matches[0]] += 1
    assert [s['sequences'] for s in sources] == drawn and sum(drawn) == position
    for source, folder in zip(sources, (pystdlib_data, prose_data)):
        meta = data.load_meta(folder)
        assert source['tokens'] == source['sequences'] * 32
        assert source['epochs'] == source['tokens'] / meta['train_tokens']
        assert source['shard_bytes'] == (meta['train_tokens'] + meta['val_tokens']) * 2  # uint16
        assert not source['repeats_too_often']


def test_the_ledger_warns_past_four_epochs_and_plans_unmade_folders(
    pystdlib_data, prose_data, tmp_path, capsys
):
    prose_tokens = data.load_meta(prose_data)['train_tokens']
    # 5 epochs of the prose at 30%: tokens = 5 x its train tokens / 0.3
    train_tokens = math.ceil(5 * prose_tokens / 0.3 / 256) * 256
    spec = f'--data={pystdlib_data}:0.7,{prose_data}:0.3,{tmp_path / "unmade"}:0.001'
    flags = [
        spec,
        '--vocab_size=512',
        '--block_size=32',
        '--batch_tokens=256',
        '--micro_batch=8',
        f'--train_tokens={train_tokens}',
    ]
    assert ledger.main([*flags, '--gpu=H100']) == 0
    text = capsys.readouterr().out
    prose_line = next(
        line for line in text.splitlines() if line.strip().startswith(os.path.basename(prose_data))
    )
    assert 'REPEATS past 4 epochs' in prose_line and 'Muennighoff' in prose_line
    assert 'not prepared yet' in next(
        line for line in text.splitlines() if line.strip().startswith('unmade')
    )
    prediction = sums.predict(*load_config(None, [*flags, '--gpu=H100']))
    prose = prediction['mixture']['sources'][1]
    assert prose['repeats_too_often'] and 4.9 < prose['epochs'] < 5.1
    assert sum(source['weight'] for source in prediction['mixture']['sources']) == pytest.approx(1)


def test_the_tools_read_a_mixture_runs_tokenizer(mixture_run, capsys):
    import sample

    _, out = mixture_run
    for flags in (
        ['--prompt', 'def main():'],
        ['--prefix', 'def f(x):\n    return ', '--suffix', '\n'],
    ):
        capsys.readouterr()
        assert sample.main([str(out), *flags, '--tokens=4', '--device=cpu']) == 0
        assert capsys.readouterr().out.strip()
