"""
test_distributed.py: ddp, zero1, zero2 and fsdp with 2 gloo processes on the CPU (torchrun) train like 1 process
with twice the gradient accumulation on the same data (with the chunked loss, the default, as with the full
logits' F.cross_entropy on one), resume exactly on the same world size and closely on another, and the ranks read
disjoint slices of the single-process batch. fp32, a 2-layer x 64 Llama, 12 steps.
"""

import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist

import helpers
import train
from ledgergpt import data, objectives, processes, sums
from ledgergpt.config import IGNORE_INDEX, load_config

# the repo's root, where train.py is
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 12
# micro_batch 4 x 32 tokens: 1 process accumulates 4 micro-steps per 512-token step, 2 processes 2 each
# a text sample at the end: under FSDP every rank runs its forwards
CONFIG = dict(
    helpers.TINY_RUN,
    batch_tokens=512,
    train_tokens=STEPS * 512,
    dtype='float32',
    ckpt_every=6,
    keep_ckpts=3,
    sample_tokens=4,
)
MODES = ['ddp', 'zero1', 'zero2', 'fsdp']


def write_config(tmp_path, data):
    return helpers.write_config(tmp_path / 'config.py', dict(CONFIG, data=data))


def torchrun(config, out_dir, *flags):
    command = [
        sys.executable,
        '-m',
        'torch.distributed.run',
        '--standalone',
        '--nproc_per_node=2',
        'train.py',
        config,
        f'--out_dir={out_dir}',
        *flags,
    ]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True)


def runs(out_dir):
    """The logged losses of each run that wrote to out_dir: a list of {step: loss}, a new dict at each resume."""
    found = [{}]
    with open(os.path.join(out_dir, 'metrics.jsonl')) as f:
        for entry in map(json.loads, f):
            if 'loss' in entry:
                if entry['step'] in found[-1]:
                    found.append({})
                found[-1][entry['step']] = entry['loss']
    return found


def assert_close(losses, reference, tolerance=1e-5):
    assert sorted(losses) and set(losses) <= set(reference)
    worst = max(abs(losses[s] - reference[s]) for s in losses)
    assert worst <= tolerance, (worst, losses, reference)


@pytest.fixture(scope='module')
def single(pystdlib_data, tmp_path_factory):
    """One process, 4 micro-steps per step: the curve every 2-process mode must follow."""
    tmp = tmp_path_factory.mktemp('single')
    config = write_config(tmp, pystdlib_data)
    assert train.main([config, f'--out_dir={tmp / "out"}']) == 0
    (reference,) = runs(tmp / 'out')
    assert sorted(reference) == list(range(1, STEPS + 1))
    return config, tmp / 'out', reference


@pytest.fixture(scope='module')
def full_loss(single, tmp_path_factory):
    """The same run with F.cross_entropy over the whole logits (--loss=full) in place of the chunked default."""
    config, _, _ = single
    out = tmp_path_factory.mktemp('full_loss') / 'out'
    assert train.main([config, f'--out_dir={out}', '--loss=full']) == 0
    (losses,) = runs(out)
    return losses


def test_the_chunked_loss_trains_as_the_full_loss(single, full_loss):
    _, _, reference = single
    assert sorted(full_loss) == sorted(reference)
    assert_close(reference, full_loss)  # fp32: 12 steps of AdamW, the loss and its gradients alike


@pytest.fixture(scope='module')
def two_process_runs(single, tmp_path_factory):
    """Each mode with 2 processes for 12 steps, then resumed from its step-6 checkpoint, also with 2."""
    config, _, _ = single
    outs = {}
    for mode in MODES:
        out = tmp_path_factory.mktemp(mode) / 'out'
        for flags in ([], [f'--resume={out}/ckpt/step_0000006']):
            result = torchrun(config, out, f'--parallel={mode}', *flags)
            assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
        outs[mode] = out
    return outs


@pytest.mark.parametrize('mode', MODES)
def test_two_processes_follow_one_process(mode, single, full_loss, two_process_runs):
    _, _, reference = single
    full, resumed = runs(two_process_runs[mode])
    assert sorted(full) == list(range(1, STEPS + 1))
    assert_close(full, reference)  # fp32: only the order of the sums differs
    # the chunked loss on 2 ranks, as F.cross_entropy over the logits on one
    assert_close(full, full_loss)


@pytest.mark.parametrize('mode', MODES)
def test_resume_on_the_same_world_size_is_exact(mode, two_process_runs):
    full, resumed = runs(two_process_runs[mode])
    assert sorted(resumed) == list(range(7, STEPS + 1))
    assert [resumed[s] for s in resumed] == [full[s] for s in resumed]


@pytest.mark.parametrize('mode', MODES)
def test_two_processes_are_predicted_from_their_own_steps(mode, two_process_runs):
    """A CPU run under torchrun is predicted from its model's own training step, timed on every rank
    at once with each rank's threads (live_ledger.step_probe), not from the config's assumed MFU: that
    was 2.4x below what ddp measured on a 2-core EPYC. The resumed run is predicted from the speed the
    first one reached, per process, in an entry of this mode and world size (the median of the one run)."""
    prediction = json.loads((two_process_runs[mode] / 'ledger.json').read_text())
    key = prediction['mfu_probe_key']
    assert key.endswith(f' | 2 processes, {mode}')
    assert prediction['mfu_source'].startswith(
        'reached by runs of this config on this machine: the median of the last 1, '
    )
    entry = sums.read_probes()[key]
    assert entry['probes'] == 1 and entry['tokens_per_s'] > 0
    # timed in the run's own step, its wrapper and its collectives, at its 2 micro-steps a step of 256 tokens a
    # process (a probe of the bare model left them out: zero2 and fsdp measured 0.81x and 0.76x its prediction)
    wrapper = 'DistributedDataParallel' if mode in ('ddp', 'zero1') else 'FSDPGPT'
    ((micro_steps, seconds),) = entry['step_seconds']
    assert entry['wrapper'] == wrapper and micro_steps == 2
    assert entry['tokens_per_s'] == pytest.approx(256 / seconds, rel=1e-9)
    first = list(entry['reached_runs'].values())[-2]  # the full run's place, then the resumed one's
    assert prediction['tokens_per_s_compute'] / 2 == pytest.approx(first, rel=1e-6)
    assert entry['reached'] == statistics.median(entry['reached_runs'].values())


@pytest.mark.parametrize('mode', MODES)
def test_summary_holds_the_communication_of_a_step(mode, single, two_process_runs):
    """summary.json has Ledger 5's bytes of a step (test_communication.py counts them on the wire), the all-reduce
    bandwidth of the run's own probe, and on gloo no seconds: they are not meaningful on a CPU."""
    config, _, _ = single
    summary = json.loads((two_process_runs[mode] / 'summary.json').read_text())
    model_cfg, _ = load_config(config)
    # 512 tokens = 4 x 32 x 2 processes x 2
    items = sums.collectives(model_cfg, mode, 2, 2, 'float32')
    assert summary['comm_bytes_per_step'] == sum(item['bytes'] for item in items) > 0
    assert summary['comm_bus_bytes_per_step'] == sum(item['bus_bytes'] for item in items)
    assert summary['comm_busbw_measured'] > 0 and summary['comm_seconds_measured'] is None
    assert (
        summary['comm_seconds_predicted'] is None
        and 'not meaningful' in summary['comm_seconds_note']
    )


def test_fsdp_and_zero1_checkpoints_resume_on_one_process(single, two_process_runs, tmp_path):
    # DCP reshards fsdp's 2 shards into one full model; ZeRO-1's states were consolidated on rank 0
    config, _, reference = single
    for mode in ('fsdp', 'zero1'):
        out = tmp_path / mode
        step6 = two_process_runs[mode] / 'ckpt' / 'step_0000006'
        assert (
            train.main([config, f'--out_dir={out}', f'--parallel={mode}', f'--resume={step6}']) == 0
        )
        (resumed,) = runs(out)
        assert sorted(resumed) == list(range(7, STEPS + 1))
        assert_close(resumed, reference)


def test_one_process_checkpoint_resumes_on_two(single, tmp_path):
    config, single_out, reference = single
    result = torchrun(config, tmp_path / 'out', f'--resume={single_out}/ckpt/step_0000006')
    assert result.returncode == 0, result.stderr[-3000:]
    (resumed,) = runs(tmp_path / 'out')
    assert sorted(resumed) == list(range(7, STEPS + 1))
    assert_close(resumed, reference)


@pytest.mark.parametrize('mode', ['ddp', 'fsdp'])
def test_tied_embeddings_train_alike_on_two_processes(mode, pystdlib_data, tmp_path):
    """GPT-2's tied embedding stays one tensor under DDP and FSDP2 (one unit with both its users): 2 processes
    follow 1 process step for step, the chunked loss's gradient of lm_head joining the embedding's."""
    config = tmp_path / 'tied.py'
    config.write_text(
        ''.join(
            f'{k} = {v!r}\n'
            for k, v in dict(
                CONFIG, data=pystdlib_data, arch='gpt2', tie_embeddings=True, bias=True, max_steps=4
            ).items()
        )
    )
    # the reference takes F.cross_entropy over the full logits; the 2 processes the chunked loss (the default)
    assert train.main([str(config), f'--out_dir={tmp_path / "one"}', '--loss=full']) == 0
    (reference,) = runs(tmp_path / 'one')
    result = torchrun(str(config), tmp_path / 'two', f'--parallel={mode}')
    assert result.returncode == 0, result.stderr[-3000:]
    (losses,) = runs(tmp_path / 'two')
    assert sorted(losses) == [1, 2, 3, 4]
    assert_close(losses, reference)


@pytest.mark.parametrize('mode', ['zero2', 'fsdp'])
def test_fsdp2_bf16_mixed_precision_with_recompute_trains_like_autocast(mode, single, tmp_path):
    """FSDP2's bf16 MixedPrecisionPolicy (bf16 weights for the matmuls, fp32 gradient reduction) with activation
    recomputation, on gloo: close to one process under bf16 autocast, within bf16's precision."""
    config, _, _ = single
    flags = ['--dtype=bfloat16', '--recompute=True', '--max_steps=6']
    # the reference with the full logits' F.cross_entropy, the 2 processes with the chunked loss
    assert train.main([config, f'--out_dir={tmp_path / "one"}', '--loss=full', *flags]) == 0
    (reference,) = runs(tmp_path / 'one')
    result = torchrun(config, tmp_path / 'two', f'--parallel={mode}', *flags)
    assert result.returncode == 0, result.stderr[-3000:]
    (losses,) = runs(tmp_path / 'two')
    assert sorted(losses) == list(range(1, 7)) and losses[6] < losses[1]
    assert_close(losses, reference, tolerance=0.03)


# -----------------------------------------------------------------------------------------------------
# Muon (optimizers.py): every mode trains like one process; ZeRO-1 keeps whole matrices, ZeRO-2 and FSDP2 gather
# each update's rows for Newton-Schulz. Its state resumes exactly on the same world size and on another.


@pytest.fixture(scope='module')
def muon_runs(single, tmp_path_factory):
    """Muon for 12 steps in one process and in each mode with 2; zero1's and fsdp's resumed from step 6 with 2."""
    config, _, _ = single
    tmp = tmp_path_factory.mktemp('muon')
    assert train.main([config, f'--out_dir={tmp / "single"}', '--optimizer=muon']) == 0
    outs = {'single': tmp / 'single'}
    for mode in MODES:
        out = outs[mode] = tmp / mode
        resumes = [f'--resume={out}/ckpt/step_0000006'] if mode in ('zero1', 'fsdp') else []
        for flags in ([], *([r] for r in resumes)):
            result = torchrun(config, out, f'--parallel={mode}', '--optimizer=muon', *flags)
            assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return config, outs


@pytest.mark.parametrize('mode', MODES)
def test_muon_on_two_processes_follows_one_process(mode, muon_runs):
    """fp32 gradients summed in another order, then cast to bf16 for Newton-Schulz: a rounding apart at most in
    a few elements of an update, close, not equal."""
    _, outs = muon_runs
    (reference,) = runs(outs['single'])
    full = runs(outs[mode])[0]
    assert sorted(full) == list(range(1, STEPS + 1)) and full[STEPS] < full[1]
    assert_close(full, reference, tolerance=1e-3)


@pytest.mark.parametrize('mode', ['zero1', 'fsdp'])
def test_muon_resumes_exactly_and_on_another_world_size(mode, muon_runs, tmp_path):
    config, outs = muon_runs
    full, resumed = runs(outs[mode])
    assert sorted(resumed) == list(range(7, STEPS + 1))
    assert [resumed[s] for s in resumed] == [full[s] for s in resumed]
    # one process from the 2 processes' step 6: DCP reshards FSDP2's momentum rows, ZeRO-1's optimizer.pt is whole
    step6 = f'--resume={outs[mode]}/ckpt/step_0000006'
    flags = [f'--out_dir={tmp_path}', f'--parallel={mode}', '--optimizer=muon', step6]
    assert train.main([config, *flags]) == 0
    (alone,) = runs(tmp_path)
    assert sorted(alone) == list(range(7, STEPS + 1))
    assert_close(alone, full, tolerance=1e-3)


SPIKE = """
import sys, numpy as np, train
from ledgergpt import data
batch = data.ShardStream.batch
def corrupted(self, first, count):  # the sequences of step 11 are garbage: uniformly random tokens
    if 10 * 16 <= first < 11 * 16:
        return np.random.default_rng(first).integers(0, 512, (count, self.block_size + 1))
    return batch(self, first, count)
data.ShardStream.batch = corrupted
sys.exit(train.main(sys.argv[1:]))
"""


def test_zero1_rolls_back_a_spike_like_one_process(single, tmp_path):
    """A spike under zero1: back to the step-6 checkpoint (its optimizer.pt gathered from both ranks), the bad
    window skipped, the same losses as one process doing the same."""
    config, _, _ = single
    script = tmp_path / 'spike.py'
    script.write_text(SPIKE)
    outs = {}
    for n_proc in (1, 2):
        outs[n_proc] = tmp_path / f'out{n_proc}'
        launcher = [sys.executable] + (
            ['-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2']
            if n_proc == 2
            else []
        )
        result = subprocess.run(
            launcher
            + [
                str(script),
                config,
                f'--out_dir={outs[n_proc]}',
                '--parallel=zero1',
                '--spike_window=5',
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONPATH=ROOT),
        )
        assert result.returncode == 0, result.stderr[-3000:]
    events = {}
    for n_proc, out in outs.items():
        with open(out / 'metrics.jsonl') as f:
            events[n_proc] = [e for e in map(json.loads, f) if e.get('event') == 'rollback']
    assert [(e['step'], e['to_step'], e['skipped']) for e in events[2]] == [
        (11, 6, [6 * 16, 11 * 16])
    ]
    assert [(e['step'], e['to_step']) for e in events[1]] == [(11, 6)]
    one, two = runs(outs[1])[-1], runs(outs[2])[-1]
    assert sorted(two) == list(range(7, STEPS + 1))
    assert_close(two, one)


def test_a_missing_fsdp_shard_is_one_line(single, two_process_runs, tmp_path, capsys):
    config, _, _ = single
    damaged = tmp_path / 'step_0000006'
    shutil.copytree(two_process_runs['fsdp'] / 'ckpt' / 'step_0000006', damaged)
    os.remove(damaged / '__1_0.distcp')  # rank 1's shard
    capsys.readouterr()
    assert (
        train.main(
            [config, f'--out_dir={tmp_path / "out"}', '--parallel=fsdp', f'--resume={damaged}']
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith(f'error: checkpoint {damaged} is damaged: __1_0.distcp is missing')
        and '\n' not in err
    )


class IndexStream:
    """A stream whose sequence k is k repeated: batches show which sequences a rank read."""

    block_size = 8

    def batch(self, first, count):
        return np.repeat(np.arange(first, first + count)[:, None], self.block_size + 1, axis=1)


def test_ranks_read_disjoint_slices_of_the_single_process_batch():
    stream, micro_batch, position = IndexStream(), 4, 96
    one = processes.Cluster(0, 1, 0, torch.device('cpu'))
    single = [
        data.micro_batch_arrays(stream, position, m, one, micro_batch, objectives.CLM)[0][:, 0]
        for m in range(4)
    ]
    per_rank = [
        np.concatenate(
            [
                data.micro_batch_arrays(
                    stream,
                    position,
                    m,
                    processes.Cluster(r, 2, r, one.device),
                    micro_batch,
                    objectives.CLM,
                )[0][:, 0]
                for m in range(2)
            ]
        )
        for r in range(2)
    ]
    assert not set(per_rank[0]) & set(per_rank[1])
    assert (
        sorted(np.concatenate(per_rank)) == sorted(np.concatenate(single)) == list(range(96, 112))
    )


def test_bad_parallel_and_indivisible_batch_are_one_line(single, tmp_path, capsys):
    config, _, _ = single
    assert train.main([config, f'--out_dir={tmp_path}/a', '--parallel=zero3']) == 2
    assert (
        capsys.readouterr().err.strip()
        == "error: parallel must be one of ddp, zero1, zero2, fsdp, not 'zero3'"
    )
    # 384 tokens = 3 micro-steps of 4 x 32: fine for 1 process, impossible to split over 2
    result = torchrun(config, tmp_path / 'b', '--batch_tokens=384')
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith('error:')]
    # both ranks reach it: the first to fail says it, with its rank
    assert [re.sub(r'^error: rank [01] of 2: ', 'error: ', line) for line in errors] == [
        "error: batch_tokens (384) is not a multiple of micro_batch x block_size x processes = "
        "4 x 32 x 2 = 256 (1.5 accumulation steps): change batch_tokens, micro_batch or the number of processes "
        "(n_gpu in the ledger)"
    ]


GRADIENTS = """
import sys, torch, train
from ledgergpt import processes
run = train.setup(sys.argv[2:])
grads = []  # the step's gradients, caught where AdamW would use them
run.optimizer.step = lambda: grads.extend(p.grad.detach().flatten().clone() for p in run.raw_model.parameters())
train.train_step(run)
if run.cluster.is_master:
    torch.save(torch.cat(grads), sys.argv[1])
del run  # torchrun's commands' teardown (processes.leave_process_group): the model before the group
processes.leave_process_group()
"""


def test_the_loss_is_normalised_by_every_carrying_target_of_the_step(pystdlib_data, tmp_path):
    """ul2's micro-batches carry different numbers of loss-carrying targets: the step's gradient is the mean over all
    of them on all ranks, so 1 process x 4 micro-steps, 2 processes x 2 and one micro-batch of 4x agree to 1e-5."""
    config = write_config(tmp_path, pystdlib_data)
    flags = ['--objective=ul2', '--micro_batch=2', '--batch_tokens=256', '--grad_clip=0']
    model_cfg, train_cfg = load_config(config, flags)
    stream, _, meta = data.open_data(model_cfg, train_cfg)
    objective = objectives.build(train_cfg, meta)
    one = processes.Cluster(0, 1, 0, torch.device('cpu'))
    counts = [
        int((data.micro_batch_arrays(stream, 0, m, one, 2, objective)[1] != IGNORE_INDEX).sum())
        for m in range(4)
    ]
    assert len(set(counts)) > 1, counts  # else a mean of micro-batch means would be the same thing
    (
        tmp_path / 'script'
    ).mkdir()  # not beside config.py: the script's folder comes first on sys.path
    script = tmp_path / 'script' / 'gradients.py'
    script.write_text(GRADIENTS)
    gradients = {}
    for name, n_proc, micro_batch in (
        ('4 micro-steps', 1, 2),
        ('2 x 2', 2, 2),
        ('one 4x micro-batch', 1, 8),
    ):
        launcher = [sys.executable] + (
            ['-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2']
            if n_proc == 2
            else []
        )
        saved = tmp_path / f'{n_proc}_{micro_batch}.pt'
        result = subprocess.run(
            launcher
            + [
                str(script),
                str(saved),
                config,
                *flags,
                f'--micro_batch={micro_batch}',
                f'--out_dir={tmp_path / saved.stem}',
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONPATH=ROOT),
        )
        assert result.returncode == 0, result.stderr[-3000:]
        gradients[name] = torch.load(saved)
    reference = gradients['4 micro-steps']
    assert reference.abs().max() > 0
    for name, gradient in gradients.items():
        assert (gradient - reference).abs().max() <= 1e-5 * reference.abs().max(), name


def test_the_first_rank_that_fails_says_so_with_its_rank(pystdlib_data, tmp_path):
    """Per-node copies of the data, rank 1's without its val shard: rank 1's DataError is the one line (rank 0 only
    printed before, so the run ended in torchrun's lines with no `error:` at all), and rank 0, waiting for rank 1 at
    the rendezvous, stops at torchrun's SIGTERM (it ignored it for 30 s, until torchrun's SIGKILL)."""
    for rank in (0, 1):
        shutil.copytree(pystdlib_data, tmp_path / f'data{rank}')
    (val,) = data.list_shards(str(tmp_path / 'data1'), 'val')
    os.remove(val)
    config = tmp_path / 'config.py'
    keys = ''.join(f'{k} = {v!r}\n' for k, v in CONFIG.items())
    config.write_text(
        f"import os\n{keys}data = {str(tmp_path / 'data')!r} + os.environ.get('RANK', '0')\n"
    )
    result = torchrun(str(config), tmp_path / 'out')
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith('error:')]
    assert errors == [
        f"error: rank 1 of 2: no val shards (*_val_*.bin) in {tmp_path / 'data1'}: make them with "
        f"`python prepare.py pystdlib --out {tmp_path / 'data1'}` (or fineweb_edu, or files PATH...)"
    ], result.stderr
    assert 'forcefully exiting' not in result.stderr, result.stderr  # rank 0 ended at the SIGTERM


KILLED = """
import os, signal, sys
sys.path.insert(0, os.getcwd())
import train
step = train.train_step
def dying(run):  # rank 1 killed before its fourth step, as an OOM kill or a lost node would
    if run.cluster.rank == 1 and run.state.step == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return step(run)
def failing(run):  # rank 1's collective fails before its fourth step, as an NCCL error would
    if run.cluster.rank == 1 and run.state.step == 3:
        raise RuntimeError('[gloo] Connection closed by peer [injected]')
    return step(run)
train.train_step = failing if os.environ.get('FAIL') else dying
sys.exit(train.main(sys.argv[1:]))
"""


def run_killed(data, tmp_path, *flags, **env):
    """KILLED's script on 2 processes (env FAIL=1: rank 1's collective fails, else rank 1 is
    killed): -> (config, out_dir, the finished process), which failed."""
    config = write_config(tmp_path, data)
    script = tmp_path / 'killed.py'
    script.write_text(KILLED)
    out = tmp_path / 'out'
    command = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2']
    result = subprocess.run(
        command + [str(script), config, f'--out_dir={out}', *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, **env),
    )
    assert result.returncode != 0
    return config, out, result


def test_a_rank_killed_under_fsdp_is_one_line_with_the_resume_command(pystdlib_data, tmp_path):
    """torchrun stops the other ranks with SIGTERM when one dies: rank 0 says a rank died and gives the command
    that resumes (it said "interrupted (SIGTERM) ... rerun the same command", which without --resume is refused)."""
    config, out, result = run_killed(pystdlib_data, tmp_path, '--parallel=fsdp')
    ours = [
        line for line in result.stderr.splitlines() if 'rank died' in line or 'interrupted' in line
    ]
    # here: the SIGTERM, or the collective that lost rank 1 when rank 0 was in one
    assert len(ours) == 1 and re.fullmatch(
        r"a rank died, or the job was stopped \(torchrun stops every rank when one exits; here: .+\): the complete "
        r"checkpoints are kept; resume with: "
        + re.escape(
            f"torchrun --nproc_per_node=2 train.py {config} --out_dir={out} --parallel=fsdp --resume"
        )
        + r"(; the failing ranks' tracebacks: .+)?",  # rank 0's own, when a collective failed it
        ours[0],
    ), result.stderr[-3000:]


def test_a_failed_collective_keeps_each_failing_ranks_traceback(pystdlib_data, tmp_path):
    """An NCCL error (here gloo's, injected on rank 1) ends in rank 0's one line, which names the
    file where each failing rank wrote its traceback: the cause is not lost to the summary."""
    _, out, result = run_killed(pystdlib_data, tmp_path, FAIL='1')
    (line,) = [line for line in result.stderr.splitlines() if 'rank died' in line]
    assert line.split("; the failing ranks' tracebacks: ")[1].split(', ')[-1] == str(
        out / 'rank1_error.txt'
    )
    kept = (out / 'rank1_error.txt').read_text()
    assert kept.startswith('Traceback') and 'in failing' in kept
    assert kept.endswith('RuntimeError: [gloo] Connection closed by peer [injected]\n')


def test_the_process_group_waits_the_configs_collective_timeout(monkeypatch):
    """NCCL's default 10 minutes would fail a job whose ranks wait legitimately longer (8 compiling
    before the first all-reduce; rank 0 writing an 11 GB optimizer.pt)."""
    joined = {}
    monkeypatch.setattr(dist, 'is_initialized', lambda: False)
    monkeypatch.setattr(
        dist, 'init_process_group', lambda backend, **options: joined.update(options)
    )
    cluster = processes.Cluster(0, 2, 0, torch.device('cpu'))
    _, train_cfg = load_config(None, ['--collective_timeout_s=2700'])
    processes.join_process_group(cluster, train_cfg.collective_timeout_s)
    assert joined['timeout'] == datetime.timedelta(minutes=45)
    assert load_config(None)[1].collective_timeout_s == 1800
