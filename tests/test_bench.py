"""
test_bench.py: bench.py, the device script, end to end on the CPU at a tiny size (as CI runs it), and its loop
benchmark. Figures are not asserted (speed is a benchmark's business): what each line holds is.
"""

import json
import os
import subprocess
import sys

import bench

# the repo's root, where train.py is
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_device_script_runs_every_default_case_at_a_tiny_size(tmp_path):
    out = tmp_path / 'out'
    result = subprocess.run(
        [sys.executable, 'bench.py', '--tiny', '--steps=2', '--warmup=1'],
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
        assert line['steps_timed'] == 2 and line['tokens_per_s'] > 0 and 0 < line['mfu'] < 1
        assert (
            line['tokens_per_s_predicted'] > 0
            and line['peak_bytes'] > 0
            and line['peak_bytes_predicted'] > 0
        )
        assert line['compile'] is False and line['loss'] > 0  # tiny: eager, a real loss
        assert line['optimizer_step_s'] > 0  # timed on its own, beside the ledger's
    assert [(line['recompute'], line['micro_batch'], line['loss_part']) for line in lines] == [
        (False, 2, 'chunked'),
        (False, 2, 'chunked'),
        (True, bench.TINY_MAX_MICRO_BATCH, 'chunked'),
        (False, 2, 'chunked'),  # Muon
        (False, bench.TINY_MAX_MICRO_BATCH, 'full'),  # the full loss beside the chunked default
    ]
    # AdamW's update has no matmul; Muon's Newton-Schulz is billed at the assumed MFU
    adamw, muon = lines[:3] + lines[4:], lines[3]
    assert [line['optimizer_step_s_predicted'] for line in adamw] == [0, 0, 0, 0]
    assert muon['optimizer_flops_predicted'] > 0
    assert muon['optimizer_step_s_predicted'] == (
        muon['optimizer_flops_predicted'] / (muon['mfu_assumed'] * muon['peak_flops'])
    )
    assert '| case | SDPA | tokens/s (predicted) |' in result.stdout  # the table a person reads


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
