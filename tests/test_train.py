"""
test_train.py: the training loop on the CPU with a tiny Llama (2 layers x 64 wide, T = 32) on the shared pystdlib
fixture: the loss falls, resume is bit-exact (also after a process killed mid-checkpoint), the spike guard rolls
back and skips, the schedule and the batch ramp hit their endpoints, the data order is a seeded permutation, and
bad input is one line. Runs call train.main in-process (what the CLI calls) unless the test is about the process.
"""

import dataclasses
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import helpers
import train
from ledgergpt import bill, checkpoint, data, live_ledger, optimizers, processes, sums
from ledgergpt.config import OPTIMIZERS, TrainConfig, load_config

# the repo's root, where train.py is
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# 8 sequences of 32 tokens per step: micro_batch 4 x 2 accumulation steps; 12 steps planned.
TINY = dict(
    helpers.TINY_RUN,
    train_tokens=12 * 256,
    ckpt_every=4,
    keep_ckpts=3,
    spike_window=5,
    max_rollbacks=3,
)
SEQUENCES_PER_STEP = 256 // 32


def write_config(tmp_path, data, **overrides):
    return helpers.write_config(tmp_path / 'config.py', dict(TINY, data=data, **overrides))


def run(config, out_dir, *flags):
    return train.main([config, f'--out_dir={out_dir}', *flags])


def read_metrics(out_dir):
    with open(os.path.join(out_dir, 'metrics.jsonl')) as f:
        return [json.loads(line) for line in f]


def step_losses(entries):
    """{step: loss} of the logged steps; a step logged twice (after a resume) keeps its last loss."""
    return {e['step']: e['loss'] for e in entries if 'loss' in e and 'event' not in e}


@pytest.fixture(scope='module')
def reference(pystdlib_data, tmp_path_factory):
    """One uninterrupted 12-step run: its per-step losses are what resumed runs must reproduce."""
    tmp = tmp_path_factory.mktemp('reference')
    config = write_config(tmp, pystdlib_data)
    assert run(config, tmp / 'out') == 0
    return config, step_losses(read_metrics(tmp / 'out'))


# -----------------------------------------------------------------------------------------------------
# It trains.


def test_loss_falls_and_outputs_are_written(pystdlib_data, tmp_path, capsys):
    config = write_config(
        tmp_path,
        pystdlib_data,
        train_tokens=60 * 512,
        batch_tokens=512,
        log_every=5,
        eval_every=30,
        ckpt_every=30,
        sample_tokens=20,
    )
    assert run(config, tmp_path / 'out') == 0
    out = capsys.readouterr().out
    entries = read_metrics(tmp_path / 'out')
    losses = [e['loss'] for e in entries if 'loss' in e]
    val = [e['val_loss'] for e in entries if 'val_loss' in e]
    assert losses[0] > 5.5 and losses[-1] < losses[0] - 1.0, losses  # ln 512 = 6.24 at the start
    # evals every 30 steps and at 25% and 50% of the run (the loss forecast's past the 6 warm-up steps)
    assert [e['step'] for e in entries if 'val_loss' in e] == [15, 30, 60] and val[-1] < val[0]
    # MFU against the CPU's measured GEMM peak
    assert all(
        0 < e['mfu'] < 1 and e['tokens_per_s'] > 0 and e['peak_memory_bytes'] > 0
        for e in entries
        if 'loss' in e
    )
    # a short ledger; the rest in ledger.md
    assert 'ledger (the whole bill: ' in out and 'Ledger 1' not in out
    # dtype 'auto' takes whichever of fp32 and bf16 this CPU's probe found faster, and says which
    assert re.search(
        r'precision: (float32|bfloat16) compute \(the faster on this CPU, measured\)', out
    ), out
    assert 'sample after 60 steps' in out and 'attention: SDPA runs flash attention' in out
    # bits per byte beside every loss: the train loss's at the data's mean bytes per token, the val loss's at the
    # bytes of the val targets scored (eval_tokens 1024 = 32 sequences of 32, 4 at a time: all of them), exact
    bytes_per_token = data.load_meta(pystdlib_data)['bytes_per_token']
    assert all(
        e['bpb'] == pytest.approx(e['loss'] / math.log(2) / bytes_per_token)
        for e in entries
        if 'loss' in e
    )
    scored = data.open_data(*load_config(config))[1][:, 1:]
    enc = data.load_tokenizer(pystdlib_data)
    val_bytes_per_token = (
        len(enc.decode_bytes([t for t in scored.ravel().tolist() if t != enc.eot_token])) / 1024
    )
    assert scored.size == 1024 and val_bytes_per_token != pytest.approx(bytes_per_token, abs=1e-3)
    assert [e['val_bpb'] for e in entries if 'val_bpb' in e] == pytest.approx(
        [v / math.log(2) / val_bytes_per_token for v in val], rel=1e-12
    )
    prediction = json.loads((tmp_path / 'out' / 'ledger.json').read_text())
    assert prediction['params']['total'] == sums.count_params(load_config(config)[0])['total']
    assert prediction['gpu']['kind'] == 'cpu' and 'GEMM probe' in prediction['gpu']['peak_source']
    # predicted and measured are both about this CPU: summary.json holds both, report.md renders it
    summary = json.loads((tmp_path / 'out' / 'summary.json').read_text())
    assert summary['step'] == 60 and summary['val_loss'] == val[-1]
    assert summary['val_bpb'] == pytest.approx(
        val[-1] / math.log(2) / val_bytes_per_token, rel=1e-12
    )
    assert summary['params_predicted'] == summary['params_built'] == prediction['params']['total']
    assert (
        summary['tokens_per_s_predicted'] == prediction['tokens_per_s']
        and summary['tokens_per_s_measured'] > 0
    )
    assert summary['mfu_measured'] == pytest.approx(
        prediction['flops_per_token']['matmul']
        * summary['tokens_per_s_measured']
        / prediction['gpu']['peak_flops']
    )
    assert summary['days_projected'] == pytest.approx(
        60 * 512 / summary['tokens_per_s_measured'] / 86400
    )
    assert (
        summary['memory_predicted_bytes'] == prediction['memory']['total']
        and summary['memory_measured_bytes'] > 0
    )
    report = (tmp_path / 'out' / 'report.md').read_text()
    assert (
        report
        == bill.format_comparison(summary)
        + '\n\n![train and val loss against tokens seen](loss.png)\n'
    )
    assert (tmp_path / 'out' / 'loss.png').read_bytes().startswith(b'\x89PNG')
    assert (
        report.startswith('Predicted by ledger.py for 1 x CPU (')
        and 'measured on 1 x the CPU' in report
    )
    assert '| quantity | predicted | measured |' in report and 'parameters' in report
    assert (tmp_path / 'out' / 'ledger.md').read_text().startswith('ledger: llama, 2 layers')
    assert 'Ledger 1' in (tmp_path / 'out' / 'ledger.md').read_text() and 'bits per byte' in report
    assert (tmp_path / 'out' / 'ckpt' / 'LATEST').read_text().strip() == 'step_0000060'


def test_synthetic_data_trains_without_a_dataset(tmp_path):
    config = write_config(tmp_path, 'synthetic', train_tokens=4 * 256)
    assert run(config, tmp_path / 'out') == 0
    losses = step_losses(read_metrics(tmp_path / 'out'))
    assert sorted(losses) == [1, 2, 3, 4] and all(
        abs(v - math.log(512)) < 0.3 for v in losses.values()
    )


def test_chinchilla_point_is_logged(tmp_path, capsys):
    # a model of P = 920 parameters (V 16, H 8, H' 16, one layer): 20 x P = 18,400 tokens pass during step 3
    config = write_config(
        tmp_path,
        'synthetic',
        vocab_size=16,
        n_embd=8,
        n_head=1,
        ffn_hidden=16,
        n_layer=1,
        batch_tokens=8192,
        micro_batch=256,
        train_tokens=4 * 8192,
    )
    assert run(config, tmp_path / 'out') == 0
    assert sums.count_params(load_config(config)[0])['total'] == 920
    assert (
        "step 3: 24,576 tokens seen passes the Chinchilla point 20 x P = 18,400"
        in capsys.readouterr().out
    )


# -----------------------------------------------------------------------------------------------------
# Every shipped config starts: its own arch, tying, bias, recompute and parallel mode, sizes shrunk, synthetic data.

CONFIG_FILES = sorted(
    os.path.join('configs', name)
    for name in os.listdir(os.path.join(ROOT, 'configs'))
    if name.endswith('.py')
)
SHRUNK = [
    '--init_from=',  # a fine-tune's config trains its shrunk model from scratch here (test_pretrained.py: init_from)
    '--data=synthetic',
    '--n_layer=2',
    '--n_embd=64',
    '--n_head=2',
    '--n_kv_head=2',
    '--ffn_hidden=0',
    '--vocab_size=512',
    '--block_size=32',
    '--micro_batch=2',
    '--batch_tokens=128',
    '--max_steps=2',
    '--compile=False',
    '--eval_every=1000',
    '--eval_tokens=128',
    '--ckpt_every=1000',
    '--sample_tokens=0',
    '--n_gpu=1',
]


@pytest.mark.parametrize('path', CONFIG_FILES)
def test_every_config_trains_two_steps(path, tmp_path):
    own, _ = load_config(os.path.join(ROOT, path))
    assert train.main([os.path.join(ROOT, path), *SHRUNK, f'--out_dir={tmp_path / "out"}']) == 0
    summary = json.loads((tmp_path / 'out' / 'summary.json').read_text())
    assert summary['step'] == 2 and summary['params_built'] == summary['params_predicted']
    built = json.loads((tmp_path / 'out' / 'ledger.json').read_text())['model']
    assert (built['arch'], built['tie_embeddings'], built['bias']) == (
        own.arch,
        own.tie_embeddings,
        own.bias,
    )


def test_tied_run_resumes_bit_exactly_and_stays_tied(pystdlib_data, tmp_path):
    config = write_config(tmp_path, pystdlib_data, arch='gpt2', bias=True, tie_embeddings=True)
    assert run(config, tmp_path / 'full') == 0
    expected = step_losses(read_metrics(tmp_path / 'full'))
    assert run(config, tmp_path / 'out', '--max_steps=6') == 0
    resumed = train.setup([config, f'--out_dir={tmp_path / "out"}', '--resume'])
    model = resumed.raw_model
    assert model.lm_head.weight is model.tok_emb.weight and resumed.state.step == 6
    assert (
        sum(p.numel() for p in model.parameters()) == sums.count_params(resumed.model_cfg)['total']
    )
    assert run(config, tmp_path / 'out', '--resume') == 0
    losses = step_losses(read_metrics(tmp_path / 'out'))
    assert [losses[s] for s in range(7, 13)] == [expected[s] for s in range(7, 13)]  # exactly equal


# -----------------------------------------------------------------------------------------------------
# Resume is exact; a kill during a checkpoint write loses nothing.


def test_resume_continues_bit_exactly(reference, tmp_path):
    config, expected = reference
    assert run(config, tmp_path / 'out', '--max_steps=6') == 0
    assert (tmp_path / 'out' / 'ckpt' / 'LATEST').read_text().strip() == 'step_0000006'
    assert run(config, tmp_path / 'out', '--resume') == 0
    resumed = [e for e in read_metrics(tmp_path / 'out') if 'loss' in e][6:]
    assert [e['step'] for e in resumed] == list(range(7, 13))
    # exactly equal, not close
    assert [e['loss'] for e in resumed] == [expected[s] for s in range(7, 13)]


def test_kill_while_writing_a_checkpoint_keeps_the_previous_one(reference, tmp_path):
    """Also with both trackers on: the resumed run continues the same TensorBoard log and W&B run, whose values,
    read back by the libraries' own readers, are metrics.jsonl's."""
    config, expected = reference
    out = tmp_path / 'out'
    trackers = '--tracker=tensorboard,wandb'
    # A real SIGKILL in the middle of the step-8 checkpoint: after model.pt, before optimizer.pt and the rename.
    script = (
        "import os, signal, sys, torch, train\n"
        "save = torch.save\n"
        "def save_then_die(obj, path, *args, **kwargs):\n"
        "    save(obj, path, *args, **kwargs)\n"
        "    if 'tmp_step_0000008' in str(path):\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "torch.save = save_then_die\n"
        f"sys.exit(train.main([{config!r}, '--out_dir={out}', '{trackers}']))\n"
    )
    killed = subprocess.run(
        [sys.executable, '-c', script], cwd=ROOT, capture_output=True, text=True
    )
    assert killed.returncode == -9, killed.stderr
    assert sorted(os.listdir(out / 'ckpt')) == [
        'LATEST',
        'step_0000000',
        'step_0000004',
        'tmp_step_0000008',
    ]
    assert (out / 'ckpt' / 'LATEST').read_text().strip() == 'step_0000004'
    assert run(config, out, '--resume', trackers) == 0
    check_trackers(out)
    # the forecast made at step 3 by the killed process, at 6 again by the resumed one (10%: in warm-up)
    summary = json.loads((out / 'summary.json').read_text())
    assert sorted(summary['forecasts']) == ['25%', '50%']
    resumed = [e for e in read_metrics(out) if 'loss' in e]
    assert [e['step'] for e in resumed[-8:]] == list(range(5, 13))
    assert [e['loss'] for e in resumed[-8:]] == [expected[s] for s in range(5, 13)]
    assert sorted(os.listdir(out / 'ckpt')) == [
        'LATEST',
        'step_0000004',
        'step_0000008',
        'step_0000012',
    ]


def check_trackers(out):
    """A run killed after step 8 and resumed from step 4: TensorBoard's log and the two offline W&B runs (one id)
    hold metrics.jsonl's numbers, steps 5-8 as the resumed run logged them; config, ledger and report beside."""
    entries = read_metrics(out)
    # 5-8 logged twice
    assert [e['step'] for e in entries if 'loss' in e] == [*range(1, 9), *range(5, 13)]
    expected = helpers.metrics_by_step(entries)
    scalars, tags = helpers.tensorboard_scalars(out / 'tensorboard')
    assert scalars == expected  # every value exact (float64), the killed run's steps 5-8 purged
    assert {
        tags[t] for t in ('config/text_summary', 'ledger/text_summary', 'report/text_summary')
    } == {'text'}
    assert tags['loss.png'] == 'images'
    # W&B: the killed run's offline folder and the resumed run's, one id (`wandb sync` joins them). The killed
    # process's last records die with it in W&B's service, which had not written them yet (a SIGTERM stops cleanly)
    killed, resumed = helpers.wandb_offline_runs(out / 'wandb')
    run_id = json.loads((out / 'trackers.json').read_text())['wandb_id']
    assert [r['dir'].rsplit('-', 1)[1] for r in (killed, resumed)] == [run_id, run_id]
    assert resumed['id'] == run_id
    assert [row['step'] for row in resumed['rows'] if 'loss' in row] == list(range(5, 13))
    logged = {(row['step'], k): v for row in resumed['rows'] for k, v in row.items() if k != 'step'}
    assert logged == {key: value for key, value in expected.items() if key[0] >= 5}
    assert resumed['config']['n_layer'] == 2 and resumed['config']['ledger']['params']['total'] > 0
    assert {'report.md', 'loss.png'} <= set(os.listdir(os.path.join(resumed['dir'], 'files')))


def test_checkpoint_state_dict_has_no_compile_prefix(pystdlib_data, tmp_path):
    model_cfg, train_cfg = load_config(write_config(tmp_path, pystdlib_data, compile=True))
    cluster = processes.Cluster(0, 1, 0, torch.device('cpu'))
    _, raw_model = train.build_model(model_cfg, train_cfg, cluster, torch.float32)
    # compiled in place, names unchanged
    assert not any('_orig_mod' in key for key in raw_model.state_dict())


# -----------------------------------------------------------------------------------------------------
# The paths a GPU takes, run on the CPU: bf16 autocast, torch.compile (inductor), fused AdamW (resume and rollback
# above run through it), and the guards against what would only fail on a GPU.


def test_adamw_is_fused_except_under_zero1(tmp_path):
    for parallel, world_size, fused in (
        ('ddp', 1, True),
        ('ddp', 2, True),
        ('fsdp', 2, True),
        ('zero1', 1, True),
        ('zero1', 2, False),
    ):
        options = optimizers.adamw_options(TrainConfig(parallel=parallel), world_size)
        assert (options['fused'], options['foreach']) == (fused, not fused), (parallel, world_size)
    run_state = train.setup([write_config(tmp_path, 'synthetic'), f'--out_dir={tmp_path / "out"}'])
    # the one-process CPU run uses the fused kernel too
    assert run_state.optimizer.defaults['fused'] is True


def test_rope_tables_reach_each_block_in_its_dtype_also_when_recomputed():
    """Under FSDP2's bf16 policy the residual stream is bf16; the tables must arrive in bf16 in the forward and in
    checkpoint()'s recompute alike (older torch skips FSDP2's input cast in the recompute)."""
    from model import GPT, ModelConfig

    model = GPT(ModelConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=64, block_size=16)).to(
        torch.bfloat16
    )
    model.recompute = True
    seen = []
    model.blocks[0].register_forward_pre_hook(
        lambda block, args: seen.append((args[0].dtype, args[1].dtype, args[2].dtype))
    )
    idx = torch.randint(0, 64, (2, 16))
    model(idx, idx)[1].backward()
    assert seen == [(torch.bfloat16,) * 3] * 2  # the forward, then the recompute in backward


def test_bf16_autocast_trains_like_fp32(pystdlib_data, tmp_path):
    losses = {}
    for dtype in ('float32', 'bfloat16'):
        config = write_config(tmp_path, pystdlib_data, dtype=dtype, train_tokens=20 * 256)
        assert run(config, tmp_path / dtype) == 0
        losses[dtype] = step_losses(read_metrics(tmp_path / dtype))
    assert losses['bfloat16'][20] < losses['bfloat16'][1] - 0.5  # it learns
    for step in (1, 10, 20):  # and follows fp32 within bf16's precision
        assert losses['bfloat16'][step] == pytest.approx(losses['float32'][step], rel=0.02), step


def test_compiled_model_trains_like_eager_on_the_cpu(pystdlib_data, tmp_path):
    """torch.compile with inductor's CPU backend (a C++ compiler builds the kernels): the same losses as eager."""
    losses = {}
    for compile_model in (False, True):
        config = write_config(tmp_path, pystdlib_data, compile=compile_model)
        run_state = train.setup([config, f'--out_dir={tmp_path / str(compile_model)}'])
        losses[compile_model] = [train.train_step(run_state).loss.item() for _ in range(2)]
    assert losses[True] == pytest.approx(losses[False], rel=1e-4)


# -----------------------------------------------------------------------------------------------------
# The loss-spike guard: roll back to the last checkpoint, skip the data window, go on; give up after max_rollbacks.


def test_corrupted_batch_rolls_back_and_skips_its_window(pystdlib_data, tmp_path, monkeypatch):
    config = write_config(tmp_path, pystdlib_data)
    batch = data.ShardStream.batch
    # the sequences of step 12
    bad_first, bad_end = (11 * SEQUENCES_PER_STEP, 12 * SEQUENCES_PER_STEP)

    def corrupted(self, first, count):
        if bad_first <= first < bad_end:  # garbage data: uniformly random tokens
            return np.random.default_rng(first).integers(0, 512, (count, self.block_size + 1))
        return batch(self, first, count)

    monkeypatch.setattr(data.ShardStream, 'batch', corrupted)
    assert run(config, tmp_path / 'out', f'--train_tokens={16 * 256}') == 0
    entries = read_metrics(tmp_path / 'out')
    rollbacks = [e for e in entries if e.get('event') == 'rollback']
    # back to the step-8 checkpoint; skipped: what steps 9-12 read, so the garbage is never seen again
    assert [(e['step'], e['to_step'], e['skipped']) for e in rollbacks] == [
        (12, 8, [8 * SEQUENCES_PER_STEP, bad_end])
    ]
    assert rollbacks[0]['loss'] > math.log(512)
    assert max(step_losses(entries)) == 16


def test_nan_loss_rolls_back_and_the_run_completes(pystdlib_data, tmp_path, monkeypatch):
    config = write_config(tmp_path, pystdlib_data)
    forward, calls = train.GPT.forward, [0]

    def nan_once(self, idx, targets=None, reduction='mean'):
        logits, loss = forward(self, idx, targets, reduction)
        calls[0] += self.training  # the steps' forwards, not the evals'
        return logits, loss * float('nan') if calls[
            0
        ] == 2 * 6 + 1 else loss  # step 7, first micro-step

    monkeypatch.setattr(train.GPT, 'forward', nan_once)
    assert run(config, tmp_path / 'out') == 0
    entries = read_metrics(tmp_path / 'out')
    rollbacks = [e for e in entries if e.get('event') == 'rollback']
    assert [(e['step'], e['to_step'], e['skipped']) for e in rollbacks] == [
        (7, 4, [4 * SEQUENCES_PER_STEP, 7 * SEQUENCES_PER_STEP])
    ]
    assert math.isnan(rollbacks[0]['loss'])
    final = step_losses(entries)
    assert max(final) == 12 and all(math.isfinite(v) for v in final.values())


def test_too_many_spikes_stop_the_run_with_one_line(pystdlib_data, tmp_path, monkeypatch, capsys):
    config = write_config(tmp_path, pystdlib_data)
    forward, calls = train.GPT.forward, [0]

    def nan_from_step_7(self, idx, targets=None, reduction='mean'):
        logits, loss = forward(self, idx, targets, reduction)
        calls[0] += 1
        return logits, loss * float('nan') if calls[0] > 2 * 6 else loss

    monkeypatch.setattr(train.GPT, 'forward', nan_from_step_7)
    assert run(config, tmp_path / 'out') == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1 and err[0].startswith('error: loss spike') and 'after 3 rollbacks' in err[0]
    )
    assert len([e for e in read_metrics(tmp_path / 'out') if e.get('event') == 'rollback']) == 3


# -----------------------------------------------------------------------------------------------------
# The batch ramp in a run, data order (the schedule's sums: test_schedule.py).


def test_batch_ramp_in_a_run(pystdlib_data, tmp_path):
    # micro-steps of 1 x 32 tokens; the batch grows 64 -> 256 over the first 1024 tokens, rounded down to 32
    config = write_config(
        tmp_path, pystdlib_data, micro_batch=1, batch_ramp_start=64, batch_ramp_tokens=1024
    )
    assert run(config, tmp_path / 'out') == 0
    batches = [e['batch_tokens'] for e in read_metrics(tmp_path / 'out') if 'loss' in e]
    assert batches == [64, 64, 64, 96, 96, 128, 160, 160, 192] + [256] * 8


def test_shard_stream_is_a_seeded_permutation_of_whole_sequences(tmp_path):
    T = 10
    # 5 sequences
    data.write_shard(str(tmp_path / 'a_train_000.bin'), np.arange(0, 51, dtype=np.uint16))
    data.write_shard(str(tmp_path / 'a_train_001.bin'), np.arange(100, 131, dtype=np.uint16))  # 3
    shards = [data.open_shard(str(tmp_path / f'a_train_00{i}.bin')) for i in range(2)]
    stream = data.ShardStream(shards, T, seed=1)
    epoch = stream.batch(0, 8)
    starts = sorted(int(s[0]) for s in epoch)
    assert starts == [0, 10, 20, 30, 40, 100, 110, 120]  # each sequence once per epoch
    # T + 1 consecutive tokens
    assert all((s == np.arange(s[0], s[0] + T + 1)).all() for s in epoch)
    assert (stream.batch(3, 4) == epoch[3:7]).all()  # random access = replay
    assert (data.ShardStream(shards, T, seed=1).batch(0, 16) == stream.batch(0, 16)).all()
    assert sorted(int(s[0]) for s in stream.batch(8, 8)) == starts  # epoch 2: the same set again,
    assert not (stream.batch(8, 8) == epoch).all()  # in another order
    assert not (data.ShardStream(shards, T, seed=2).batch(0, 8) == epoch).all()


# -----------------------------------------------------------------------------------------------------
# Bad input: one line on stderr, exit 2, no traceback.


def test_what_the_evals_need_is_built_before_the_first_step(
    pystdlib_data, tmp_path, monkeypatch, capsys
):
    """Bits per byte's table of token bytes needs the tokenizer's package: without it the run
    stops before its first step, not at its first eval."""
    monkeypatch.setitem(sys.modules, 'tiktoken', None)  # `import tiktoken` raises ImportError
    monkeypatch.setattr(data, '_byte_lengths', {})
    config = write_config(tmp_path, pystdlib_data)
    assert run(config, tmp_path / 'out', '--eval_every=1000') == 2
    error = capsys.readouterr().err
    assert (
        error.endswith(
            "tokenizer, which needs the tiktoken package: pip install tiktoken (it is in "
            "requirements.txt)\n"
        )
        and error.count('\n') == 1
    )
    assert not os.path.exists(tmp_path / 'out' / 'metrics.jsonl')


def test_cli_config_typo_is_one_line(pystdlib_data, tmp_path):
    config = write_config(tmp_path, pystdlib_data)
    result = subprocess.run(
        [sys.executable, 'train.py', config, '--lrr=1e-3', f'--out_dir={tmp_path}/out'],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == "error: unknown config key 'lrr' in the command line: did you mean 'lr'?"
    )


@pytest.mark.parametrize(
    'flags, message',
    [
        (['--data=/nonexistent/pystdlib'], 'python prepare.py pystdlib'),
        (['--vocab_size=1024'], 'vocab mismatch'),
        (
            ['--batch_tokens=200'],
            'batch_tokens (200) is not a multiple of micro_batch x block_size x processes',
        ),
        (['--resume'], 'no complete checkpoint'),
        (['--parallel=zero4'], "parallel must be one of"),
        (['--block_size=32', 'extra.py'], "unexpected argument 'extra.py'"),
    ],
)
def test_bad_input_is_one_line(pystdlib_data, tmp_path, capsys, flags, message):
    config = write_config(tmp_path, pystdlib_data)
    assert run(config, tmp_path / 'out', *flags) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('error: ') and message in err[0], err


def test_existing_checkpoints_need_resume(reference, tmp_path, capsys):
    config, _ = reference
    assert run(config, tmp_path / 'out', '--max_steps=1') == 0
    capsys.readouterr()
    assert run(config, tmp_path / 'out', '--max_steps=2') == 2
    assert 'already holds checkpoints: pass --resume' in capsys.readouterr().err
    # the same command again, its run complete: nothing to do, said so, nothing written
    metrics = (tmp_path / 'out' / 'metrics.jsonl').read_text()
    assert run(config, tmp_path / 'out', '--max_steps=1') == 0
    assert 'this run is complete (checkpoint at step 1, planned 1)' in capsys.readouterr().out
    assert (tmp_path / 'out' / 'metrics.jsonl').read_text() == metrics


def test_memory_check_refuses_unless_forced(pystdlib_data, tmp_path, monkeypatch, capsys):
    # a million processes on this machine leave each RAM / 10^6, less than the ledger's fixed 2 GiB overhead
    monkeypatch.setenv('LOCAL_WORLD_SIZE', '1000000')
    config = write_config(tmp_path, pystdlib_data, train_tokens=256)
    assert run(config, tmp_path / 'out') == 2
    err = capsys.readouterr().err
    assert 'the ledger predicts' in err and '--force' in err
    assert run(config, tmp_path / 'out', '--force') == 0


def test_optimizer_states_the_row_does_not_bill_stop_the_run_or_leave_it_unverified(
    pystdlib_data, tmp_path, monkeypatch, capsys
):
    """After its first step a run measures rank 0's optimizer states: a row (config.OPTIMIZERS) whose
    state_bytes is off by a byte a tensor stops it in one line naming both numbers and the row; with
    --force it trains, report.md marking the ledger unverified."""
    row = OPTIMIZERS['adamw']
    off = dataclasses.replace(row, state_bytes=lambda shape: row.state_bytes(shape) + 1)
    monkeypatch.setitem(OPTIMIZERS, 'adamw', off)
    cfg = write_config(tmp_path, pystdlib_data, train_tokens=4 * 256)
    assert run(cfg, tmp_path / 'a') == 1
    err = capsys.readouterr().err.strip()
    found = re.fullmatch(
        r"error: the ledger predicts ([\d,]+) bytes of optimizer states on rank 0 \(its row, "
        r"config\.OPTIMIZERS\['adamw'\]: AdamW m, v, 8P\) but the first step left ([\d,]+): fix "
        r"the row's state_bytes, or run with --force to train anyway, the ledger marked unverified",
        err,
    )
    assert found, err
    tensors = len(sums.parameter_shapes(load_config(cfg)[0]))
    predicted, measured = (int(n.replace(',', '')) for n in found.groups())
    assert predicted - measured == tensors
    assert run(cfg, tmp_path / 'b', '--force') == 0
    assert 'LEDGER UNVERIFIED (--force)' in (tmp_path / 'b' / 'report.md').read_text()
    summary = json.loads((tmp_path / 'b' / 'summary.json').read_text())
    assert "config.OPTIMIZERS['adamw']" in summary['ledger_unverified']


# -----------------------------------------------------------------------------------------------------
# Checkpoints outlive the code; a run records its code.


def test_a_checkpoint_older_than_a_model_key_resumes_with_its_default(
    reference, tmp_path, monkeypatch, capsys
):
    """A model key added after a checkpoint was written takes its default on resume (rope_theta stands in for the
    new key: the checkpoint below does not hold it); a value other than the default is another model."""
    config, losses = reference
    assert run(config, tmp_path / 'out', '--max_steps=8') == 0
    read_state = checkpoint.read_state

    def from_before(path):  # as a checkpoint written before the key existed holds it
        state = read_state(path)
        del state['model_config']['rope_theta']
        return state

    monkeypatch.setattr(checkpoint, 'read_state', from_before)
    capsys.readouterr()
    assert run(config, tmp_path / 'out', '--resume', '--rope_theta=500000.0') == 2
    assert 'was written for another model (rope_theta differ)' in capsys.readouterr().err
    assert run(config, tmp_path / 'out', '--resume') == 0
    assert step_losses(read_metrics(tmp_path / 'out')) == losses  # the exact continuation


def git(folder, *args):
    return subprocess.run(
        ['git', '-C', str(folder), '-c', 'user.name=t', '-c', 'user.email=t@t', *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_a_run_records_its_code(reference, tmp_path):
    """out_dir gets the commit of the checkout train.py runs from and its uncommitted diff (modded-nanogpt's habit):
    here the repo's own, then a checkout with a change and a new file, then no checkout at all."""
    config, _ = reference
    assert run(config, tmp_path / 'out', '--max_steps=1') == 0
    recorded = json.loads((tmp_path / 'out' / 'code.json').read_text())
    assert recorded['commit'] == git(ROOT, 'rev-parse', 'HEAD').strip()
    assert (tmp_path / 'out' / 'code.diff').read_text() == git(ROOT, 'diff', 'HEAD')
    fork = tmp_path / 'fork'
    fork.mkdir()
    git(fork, 'init', '-q')
    (fork / 'model.py').write_text('window = 0\n')
    git(fork, 'add', 'model.py')
    git(fork, 'commit', '-qm', 'a fork')
    (fork / 'model.py').write_text('window = 256\n')
    (fork / 'new.py').write_text('')
    recorded = live_ledger.record_code(str(tmp_path / 'fork_out'), source=str(fork))
    assert recorded == {
        'commit': git(fork, 'rev-parse', 'HEAD').strip(),
        'dirty': True,
        'diff': 'code.diff',
        'untracked': ['new.py'],
    }
    assert '-window = 0\n+window = 256' in (tmp_path / 'fork_out' / 'code.diff').read_text()
    assert live_ledger.record_code(str(tmp_path / 'none'), source=str(tmp_path / 'out')) is None
    assert not (tmp_path / 'none').exists()
