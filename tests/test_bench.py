"""
test_bench.py: bench.py, the device script, end to end on the CPU at a tiny size (as CI runs it), and its loop
benchmark. Figures are not asserted (speed is a benchmark's business): what each line holds is.
"""

import gc
import json
import os
import subprocess
import sys
import weakref

import pytest

import bench
import train

# the repo's root, where train.py is
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_device_script_runs_every_default_case_at_a_tiny_size(tmp_path):
    out = tmp_path / 'out'
    result = subprocess.run(
        [sys.executable, 'bench.py', '--tiny', '--steps=3', '--warmup=1'],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, OUT=str(out)),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in (out / 'bench.jsonl').read_text().splitlines()]
    assert [line['case'] for line in lines] == bench.DEFAULT_CASES
    for line in lines:
        assert (
            line['device'].startswith('CPU (')
            and line['torch']
            and line['sdpa'] == 'flash attention'
        )
        assert line['steps_timed'] == 3 and line['tokens_per_s'] > 0 and 0 < line['mfu'] < 1
        assert (
            line['tokens_per_s_predicted'] > 0
            and line['peak_bytes'] > 0
            and line['peak_bytes_predicted'] > 0
        )
        assert line['compile'] is False and line['loss'] > 0  # tiny: eager, a real loss
        assert line['optimizer_step_s'] > 0  # timed on its own, beside the ledger's
    assert [(line['recompute'], line['micro_batch'], line['loss_part']) for line in lines] == [
        (False, 2, 'chunked'),
        (False, 2, 'chunked'),  # Muon
        (False, 2, 'chunked'),
        (True, 2, 'chunked'),  # tiny: its micro-batch
        (False, bench.TINY_MAX_MICRO_BATCH, 'full'),  # the full loss beside the chunked default
    ]
    # AdamW's update has no matmul; Muon's Newton-Schulz is billed at the assumed MFU
    adamw, muon = lines[:1] + lines[2:], lines[1]
    assert [line['optimizer_step_s_predicted'] for line in adamw] == [0, 0, 0, 0]
    assert muon['optimizer_flops_predicted'] > 0
    assert muon['optimizer_step_s_predicted'] == (
        muon['optimizer_flops_predicted'] / (muon['mfu_assumed'] * muon['peak_flops'])
    )
    assert '| case | SDPA | tokens/s (predicted) |' in result.stdout  # the table a person reads


def fake_clock(monkeypatch, build_s, step_s):
    """bench's budget clock as a counter: a build takes build_s, a step step_s (no real time)."""
    now = [0.0]
    build, step = bench.build, train.train_step

    def built(*args):
        now[0] += build_s
        return build(*args)

    def stepped(run):
        now[0] += step_s
        return step(run)

    monkeypatch.setattr(bench, 'CLOCK', lambda: now[0])
    monkeypatch.setattr(bench, 'build', built)
    monkeypatch.setattr(train, 'train_step', stepped)
    return now


@pytest.mark.parametrize('budget_s', [24, 200])
def test_the_script_ends_within_its_budget_every_second_counted(monkeypatch, budget_s):
    """Builds of 5 s and steps of 1 s on the budget's clock: the cases take their shares, each timed
    for at least MIN_TIMED steps or skipped, and the script ends within its budget."""
    now = fake_clock(monkeypatch, build_s=5, step_s=1)
    results = bench.run_device_script(bench.DEFAULT_CASES, 5, 2, budget_s, tiny=True)
    assert now[0] <= budget_s and len(results) == len(bench.DEFAULT_CASES)
    timed = [r for r in results if 'error' not in r]
    assert all(r['steps_timed'] >= bench.MIN_TIMED for r in timed)
    assert all(r['error'].startswith('skipped') for r in results if r not in timed)
    assert results[0] in timed or budget_s < 5 + 1 + bench.MIN_TIMED  # by value: the seed's first
    if budget_s == 200:  # room for all: each of its share, 40 s
        assert timed == results and max(r['setup_s'] for r in results) <= 40
    else:  # room for some: the first ones, by value
        assert 1 <= len(timed) < len(results) and results[: len(timed)] == timed


def test_a_failing_case_is_recorded_and_the_next_runs_on_a_freed_device(monkeypatch):
    """A RuntimeError inside a step (a cuBLAS or inductor failure on a GPU) is the case's line with
    its traceback; every case's model is freed (gc) before the next is built."""
    models, step, build = [], train.train_step, bench.build

    def built(*args):
        assert all(model() is None for model in models)  # the earlier cases' models are gone
        run, *rest = build(*args)
        models.append(weakref.ref(run.model))
        return (run, *rest)

    def failing(run):
        if len(models) == 2:
            raise RuntimeError('CUBLAS_STATUS_EXECUTION_FAILED when calling cublasGemmEx\nmore')
        return step(run)

    monkeypatch.setattr(bench, 'build', built)
    monkeypatch.setattr(train, 'train_step', failing)
    cases = bench.DEFAULT_CASES[:3]
    results = bench.run_device_script(cases, 3, 1, 600, tiny=True)
    assert [r['case'] for r in results] == cases and 'error' not in results[0]
    assert (
        results[1]['error']
        == 'RuntimeError: CUBLAS_STATUS_EXECUTION_FAILED when calling cublasGemmEx'
    )
    assert 'in failing' in results[1]['traceback'] and results[2]['steps_timed'] == 3
    gc.collect()
    assert all(model() is None for model in models)


def test_a_bad_case_is_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, 'bench.py', '--tiny', '--stepz=2'],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and result.stderr.startswith('error: unknown option --stepz=2')
    assert result.stderr.count('\n') == 1


def test_loop_benchmark_times_both_loops(pystdlib_data, tmp_path, capsys):
    config = tmp_path / 'tiny.py'
    config.write_text(
        f"n_layer = 2\nn_head = 2\nn_embd = 64\nvocab_size = 512\nblock_size = 32\nmicro_batch = 4\n"
        f"batch_tokens = 256\ncompile = False\ndata = {pystdlib_data!r}\n"
    )
    best = bench.run_loop_bench(str(config), [], steps=2, rounds=1)
    assert best['train.py'] > 0 and best['plain loop'] > 0
    assert 'train.py / plain loop:' in capsys.readouterr().out


@pytest.mark.parametrize('command', ['bench', 'train'])
def test_the_allocators_settings_are_made_before_torch_is_imported(command):
    """The CUDA caching allocator reads its settings once, when torch starts it: bench.py, the
    first device script, makes train.py's (expandable segments) before it imports torch."""
    script = (
        'import os, sys; from ledgergpt import config; seen = []; set = config.set_cuda_allocator\n'
        "config.set_cuda_allocator = lambda: seen.append('torch' in sys.modules) or set()\n"
        f'import {command}\n'
        "print(seen[0], os.environ.get('PYTORCH_ALLOC_CONF'))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith('PYTORCH_')}
    result = subprocess.run(
        [sys.executable, '-c', script], cwd=ROOT, capture_output=True, text=True, env=env
    )
    # the first call (bench's, then train's again when bench imports it) saw no torch yet
    assert result.stdout.strip() == 'False expandable_segments:True', result.stderr[-2000:]
