"""
test_probe.py: the device probe remembers the best it has seen, not a busy moment. A fake GEMM probe plays a busy
machine, then a quiet one: the cache keeps the first until a run flags it, then keeps the better of the two (and a
later busier probe never lowers it); a run whose measured MFU is far above its prediction's flags it; the ledger
says when the peak was measured.
"""

import dataclasses
import json
import re
import time

import pytest
import torch

import helpers
import train
from ledgergpt import bill, live_ledger, processes, sums
from ledgergpt.config import ConfigError, ModelConfig, TrainConfig, load_config
from model import GPT


@pytest.fixture
def probes(tmp_path, monkeypatch):
    """A cache of its own, and a GEMM probe that answers the FLOP/s it is given (each call recorded)."""
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
    answers, calls = [], []

    def fake_gemm_flops(n, device, dtype, seconds):
        calls.append(n)
        return answers.pop(0), n

    monkeypatch.setattr(sums, 'gemm_flops', fake_gemm_flops)
    return answers, calls


def trainer():
    """What train.py hands the step probe: its build_run and train_step (as patched now)."""
    return train.build_run, train.train_step


def cached(device):
    return sums.read_probes()[device.probe_key]


def test_the_best_probe_is_kept_and_a_flagged_one_is_measured_again(probes):
    answers, calls = probes
    answers += [40e9]  # measured while the machine was busy
    busy = sums.measure_device('cpu', 'float32')
    assert busy.peak_flops == 40e9 and calls == [2048] and busy.probe_key in sums.read_probes()
    date = re.search(r'peak measured at (\S+ \S+)', busy.peak_source).group(1)
    assert date == cached(busy)['measured'] and 'the best of 1 probe(s)' in busy.peak_source
    answers += [400e9]
    # cached: no probe
    assert sums.measure_device('cpu', 'float32').peak_flops == 40e9 and len(calls) == 1
    assert sums.flag_reprobe(busy.probe_key, 'a test') and cached(busy)['reprobe'] == 'a test'
    quiet = sums.measure_device('cpu', 'float32')  # flagged: probed again, the better kept
    assert quiet.peak_flops == 400e9 and len(calls) == 2 and 'reprobe' not in cached(quiet)
    assert 'the best of 2 probe(s)' in quiet.peak_source
    first_quiet = cached(quiet)['measured']
    answers += [100e9]  # busy again: load only lowers a probe, so the best stays
    sums.flag_reprobe(busy.probe_key, 'again')
    again = sums.measure_device('cpu', 'float32')
    assert (
        again.peak_flops == 400e9 and len(calls) == 3 and cached(again)['measured'] == first_quiet
    )
    assert 'the best of 3 probe(s)' in again.peak_source and not sums.flag_reprobe(
        'no such probe', 'x'
    )


def test_a_run_far_faster_than_predicted_flags_its_probe(probes, tmp_path, capsys):
    answers, calls = probes
    answers += [40e9]
    device = sums.measure_device('cpu', 'float32')
    model = ModelConfig(n_layer=2, n_head=2, n_embd=64, vocab_size=512, block_size=32)
    train = TrainConfig(
        batch_tokens=256, micro_batch=8, train_tokens=2560, out_dir=str(tmp_path / 'out')
    )
    # as train.py holds it
    prediction = json.loads(json.dumps(sums.predict(model, train, 1, device)))
    # the ledger says when the peak was measured
    assert f"peak measured at {cached(device)['measured']}" in bill.format_short(prediction, 'x')
    metrics = live_ledger.Metrics(processes.setup_cluster(), train, prediction, 0, append=False)
    assumed = prediction['mfu']
    metrics.check_probe(1.4 * assumed)  # within the margin: a probe is not a prophecy
    assert 'reprobe' not in cached(device) and not metrics.probe_flagged
    metrics.check_probe(3 * assumed)
    assert metrics.probe_flagged and cached(device)['reprobe'].startswith(
        f'a run measured MFU {3 * assumed:.1%}'
    )
    assert 'the next run probes it again and keeps the better' in capsys.readouterr().out
    answers += [120e9]
    assert sums.measure_device('cpu', 'float32').peak_flops == 120e9 and len(calls) == 2
    # predicted from a step probe (the CPU), the peak only divides the MFU shown: flagged once that passes 100%
    assert 'reprobe' not in cached(device)  # the probe above cleared it
    stepped = dict(prediction, mfu_probe_key='no such step probe')
    learned = live_ledger.Metrics(processes.setup_cluster(), train, stepped, 0, append=False)
    learned.measured['tokens_per_s'] = 1.0
    learned.check_probe(0.99)
    assert not learned.probe_flagged and 'reprobe' not in cached(device)
    learned.check_probe(1.5)
    assert (
        learned.probe_flagged
        and cached(device)['reprobe'] == 'a run measured MFU 150.0%, above 100% of the peak'
    )
    # a peak from a datasheet has no probe to flag
    h200 = json.loads(json.dumps(sums.predict(model, train, 1, sums.GPUS['H200'])))
    assert h200['gpu']['probe_key'] == ''
    named = live_ledger.Metrics(processes.setup_cluster(), train, h200, 0, append=False)
    named.check_probe(100 * h200['mfu'])
    assert not named.probe_flagged


# -----------------------------------------------------------------------------------------------------
# A one-process CPU run is predicted from its model's own micro-steps (live_ledger.step_probe), then from what a run of
# the config reached on this machine (live_ledger.learn_speed).

CPU_RUN = dict(
    arch='llama',
    n_layer=2,
    n_head=4,
    n_embd=128,
    vocab_size=512,
    block_size=64,
    micro_batch=8,
    batch_tokens=1024,  # 2 accumulation steps
    train_tokens=100 * 1024,
    data='synthetic',
    dtype='float32',
    compile=False,
    mfu=0.05,  # the config's assumption: far off on purpose
    log_every=1000,
    eval_every=1000,
    ckpt_every=1000,
    sample_tokens=0,
)


def timed_steps(run, steps, clock):
    for _ in range(2):  # warm-up
        train.train_step(run)
    started = clock()
    for _ in range(steps):
        train.train_step(run)
    return steps * run.train.batch_tokens / (clock() - started)


def test_the_cpu_prediction_holds_on_this_cpu(tmp_path, monkeypatch, capsys):
    """The predicted tokens/s of a one-process CPU run, against the run's own train_step, within 0.5x-2x. Both are
    timed in CPU time of one thread (torch.set_num_threads(1), time.thread_time): other processes' load on the
    machine stretches wall time, not the CPU time of this thread, so the band holds on a busy machine too."""
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
    monkeypatch.setattr(live_ledger, 'PROBE_CLOCK', time.thread_time)
    config = tmp_path / 'config.py'
    helpers.write_config(config, CPU_RUN)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run = train.setup([str(config), f'--out_dir={tmp_path / "out"}'])
        prediction = run.metrics.prediction
        assert prediction['mfu_source'].startswith(
            "measured on this CPU at this model's shapes, eager as the run (best of 1"
        )
        assert (
            prediction['mfu_source'].endswith('the config says 5%')
            and prediction['mfu_assumed'] != 0.05
        )
        assert f"MFU, {prediction['mfu_source']}" in capsys.readouterr().out
        # the run's own step was timed (train_step on the run's module), at its own 2 micro-steps
        probe = sums.read_probes()[prediction['mfu_probe_key']]
        assert probe['wrapper'] == type(run.model).__name__ == 'GPT'
        ((micro_steps, seconds),) = probe['step_seconds']
        assert micro_steps == 2 and probe['tokens_per_s'] == pytest.approx(1024 / seconds, rel=1e-9)
        measured = timed_steps(run, 6, time.thread_time)
        ratio = measured / prediction['tokens_per_s']
        print(f'measured / predicted tokens/s on this CPU: {ratio:.3f}')
        assert 0.5 < ratio < 2, ratio
        # the run's speed is learned: the next run of this config here is predicted from it, and says so
        run.metrics.measured['tokens_per_s'] = measured
        run.metrics.check_probe(run.metrics.mfu(measured))
        again = train.setup([str(config), f'--out_dir={tmp_path / "again"}']).metrics.prediction
        assert again['mfu_source'].startswith(
            'reached by runs of this config on this machine: the median of the last 1, '
        )
        assert again['tokens_per_s'] == pytest.approx(measured, rel=1e-9)
    finally:
        torch.set_num_threads(threads)


def test_a_slow_dtype_is_probed_at_a_small_size(monkeypatch):
    """The probe's matmuls grow from 256 only while one takes under 0.1 s: a dtype the CPU emulates (bf16 without
    bf16 units: a minute per 2048-square matmul) stops at the first slow size instead of running 2048s for minutes."""
    mm, sizes = torch.mm, []

    def slow_from_512(a, b, **kwargs):  # plays an emulated dtype: a 512-square matmul takes 0.2 s
        sizes.append(a.shape[0])
        if a.shape[0] >= 512:
            time.sleep(0.2)
        return mm(a, b, **kwargs)

    monkeypatch.setattr(torch, 'mm', slow_from_512)
    flops, n = sums.gemm_flops(2048, torch.device('cpu'), 'float32', seconds=0.3)
    assert n == 512 and max(sizes) == 512 and sizes[:4] == [256, 256, 512, 512]
    assert flops <= 2 * 512**3 / 0.2
    sizes.clear()
    monkeypatch.setattr(torch, 'mm', mm)
    # n_max caps it
    assert sums.gemm_flops(256, torch.device('cpu'), 'float32', seconds=0.0)[1] == 256


def test_a_gpu_config_on_a_small_cpu_stops_before_building_anything(
    probes, monkeypatch, tmp_path, capsys
):
    """configs/h200_1b3.py on a 24 GiB CPU machine: the ledger's memory, known before any tensor exists, is one
    line within seconds (with --force to try anyway), before the step probe would build 1.3B parameters (minutes,
    then the kernel's OOM kill)."""
    answers, _ = probes
    answers += [50e9, 5e9]  # the GEMM probes, fp32 and bf16
    monkeypatch.setattr(sums, 'machine_memory', lambda: (24 * 2**30, 'physical RAM (sysconf)'))

    def no_model(*args, **kwargs):
        raise AssertionError('the step probe built the model')

    monkeypatch.setattr(live_ledger, '_time_steps', no_model)
    argv = [
        'configs/h200_1b3.py',
        '--data=synthetic',
        '--max_steps=2',
        f'--out_dir={tmp_path / "out"}',
    ]
    assert train.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert re.fullmatch(
        r"error: the ledger predicts \d+\.\d GiB per process \(\d+\.\d GiB of weights, gradients and optimizer "
        r"states\) but this machine's physical RAM \(sysconf\) holds 24\.0 GiB, of which a plan leaves "
        r"1\.2 GiB free \(the ledger's error band\): lower micro_batch, set "
        r"recompute=True or parallel=fsdp, choose a smaller model, or pass --force to start anyway",
        err,
    ), err


def test_the_step_probe_says_so_before_it_builds_the_model(probes, monkeypatch, capsys):
    """The step probe builds the model and times its steps: a line says so first (a big model takes a while); a
    cached probe says nothing."""
    monkeypatch.setattr(live_ledger, '_time_steps', lambda *args: {'tokens_per_s': 1234.0})
    model_cfg, cfg = (
        ModelConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=256, block_size=16),
        TrainConfig(),
    )
    device = sums.Device('CPU (a test)', 1e9, 2**30, kind='cpu')
    cluster = processes.Cluster(0, 1, 0, torch.device('cpu'))
    with torch.device('meta'):
        params = sum(p.numel() for p in GPT(model_cfg).parameters())
    capsys.readouterr()
    assert (
        live_ledger.step_probe(model_cfg, cfg, 'float32', device, cluster, trainer())[0][
            'tokens_per_s'
        ]
        == 1234.0
    )
    assert capsys.readouterr().out == (
        f"step probe: building the model ({params:,} parameters) on this CPU and timing its training step, "
        "once for this machine (cached)\n"
    )
    assert (
        live_ledger.step_probe(model_cfg, cfg, 'float32', device, cluster, trainer())[0][
            'tokens_per_s'
        ]
        == 1234.0
    )
    assert capsys.readouterr().out == ''


def test_a_big_model_says_it_is_being_built(probes, monkeypatch, tmp_path, capsys):
    """Materialising 1.3B parameters takes minutes on a CPU: the last line before it says what is being built."""
    answers, _ = probes
    answers += [50e9, 5e9]
    monkeypatch.setattr(sums, 'machine_memory', lambda: (2**40, 'physical RAM (sysconf)'))
    monkeypatch.setattr(live_ledger, '_time_steps', lambda *args: {'tokens_per_s': 1000.0})

    def stop(*args, **kwargs):
        raise ConfigError('stopped where the model would be built')

    monkeypatch.setattr(train, 'build_run', stop)
    argv = [
        'configs/h200_1b3.py',
        '--data=synthetic',
        '--max_steps=2',
        f'--out_dir={tmp_path / "out"}',
    ]
    assert train.main(argv) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(
        r"building the model: 1,\d{3},\d{3},\d{3} parameters, \d+\.\d GiB of weights, gradients and optimizer "
        r"states per process",
        out[-1],
    ), out[-1]


@pytest.mark.parametrize('fp32, bf16, chosen', [(50e9, 5e9, 'float32'), (20e9, 120e9, 'bfloat16')])
def test_dtype_auto_takes_the_faster_probe_on_a_cpu(probes, fp32, bf16, chosen):
    """dtype 'auto' on a CPU: both GEMM probes run and the faster dtype is the run's (bf16 ~6x fp32 on a Xeon with
    AMX, ~200x slower on an AVX2-only EPYC). The probes' answers are given here, so the choice is tested without
    timing anything; the tests that measure memory or speed pin dtype instead."""
    answers, calls = probes
    answers += [fp32, bf16]  # measure_device probes float32, then bfloat16
    device = sums.measure_device('cpu', 'auto')
    assert len(calls) == 2 and device.dtype == chosen and device.peak_flops == max(fp32, bf16)
    assert sums.run_dtype(TrainConfig(dtype='auto'), device) == chosen
    # a pinned dtype stays
    assert sums.run_dtype(TrainConfig(dtype='float32'), device) == 'float32'


# train_minutes: the tokens a run is planned for follow from the speed its ledger predicts, fixed at its start.


def test_train_minutes_buy_the_tokens_of_the_predicted_speed(tmp_path, monkeypatch, capsys):
    """A run planned by minutes trains the whole batches that fit them at the step probe's tokens/s
    (here a fixed 4,200: 12,600 tokens in 3 s, 12 batches and a part, not a whole number, which the
    measured GEMM peak's round trip through the MFU could move by a batch); its checkpoints hold those
    tokens (and train_minutes 0), so its resume and a rerun of the finished run keep them though the
    speed learned since is another."""
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
    monkeypatch.setattr(live_ledger, '_time_steps', lambda *args: {'tokens_per_s': 4200.0})
    config = tmp_path / 'config.py'
    helpers.write_config(config, dict(CPU_RUN, train_minutes=0.05, ckpt_every=3, eval_tokens=1024))
    out = f'--out_dir={tmp_path / "out"}'
    run = train.setup([str(config), f'--out_dir={tmp_path / "look"}'])
    tokens = int(0.05 * 60 * run.metrics.prediction['tokens_per_s'] // 1024) * 1024
    assert run.metrics.prediction['tokens_per_s'] == pytest.approx(4200.0)  # no communication
    assert run.train.train_tokens == tokens == 12 * 1024 and run.total_steps == 12
    assert run.train.train_minutes == 0 and run.metrics.prediction['tokens'] == tokens
    assert 'train_minutes=0.05: 12,288 tokens in 12 steps at the predicted 4,200 tokens/s' in (
        capsys.readouterr().out
    )
    del run
    assert train.main([str(config), out, '--max_steps=6']) == 0
    (key,) = [k for k in sums.read_probes() if ' | train_step | ' in k]
    for run in ('one', 'two'):  # two faster runs since: the median of the three is theirs
        live_ledger.learn_speed(key, 8192.0, run)
    resumed = train.setup([str(config), out, '--resume'])
    assert resumed.train.train_tokens == tokens and resumed.total_steps == 12
    assert resumed.metrics.prediction['tokens_per_s'] == pytest.approx(8192.0)
    assert resumed.metrics.prediction['tokens'] == tokens and resumed.state.step == 6
    del resumed
    assert train.main([str(config), out, '--resume']) == 0
    assert train.main([str(config), out]) == 0  # complete: nothing to do
    assert 'this run is complete (checkpoint at step 12, planned 12)' in capsys.readouterr().out


def test_the_median_of_the_last_runs_is_learned(probes, monkeypatch):
    """The next run is predicted from the median of the last REACHED_KEPT runs' speeds: one fast run (or one on a
    busy machine) does not set the plan by itself, and an old speed leaves the window."""
    monkeypatch.setattr(live_ledger, '_time_steps', lambda *args: {'tokens_per_s': 1000.0})
    model_cfg = ModelConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=256, block_size=16)
    device = sums.Device('CPU (a test)', 1e9, 2**30, kind='cpu')
    cluster = processes.Cluster(0, 1, 0, torch.device('cpu'))
    _, key = live_ledger.step_probe(model_cfg, TrainConfig(), 'float32', device, cluster, trainer())
    live_ledger.learn_speed(key, 2000, 'a')  # run a's first log step: a run updates its own place
    for run, speed, median in [
        ('a', 3000, 3000),
        ('b', 9000, 6000),
        ('c', 3100, 3100),
        ('d', 2900, 3050),
    ]:
        live_ledger.learn_speed(key, speed, run)
        assert sums.read_probes()[key]['reached'] == median
    live_ledger.learn_speed(key, 3000, 'e')
    live_ledger.learn_speed(key, 2800, 'f')  # the first, a, leaves: 9000, 3100, 2900, 3000, 2800
    assert sums.read_probes()[key]['reached_runs'] == dict(b=9000, c=3100, d=2900, e=3000, f=2800)
    assert sums.read_probes()[key]['reached'] == 3000


def test_the_step_probe_compiles_as_the_run_and_the_run_reuses_its_graphs(monkeypatch):
    """A compiled run is timed compiled (an eager probe read a compiled run 1.5-1.7x slow on a Xeon, under ddp and
    zero1 alike), the same modules as the run compiles in each mode; the run's own compile, next in this process,
    then compiles no graph of its own."""
    compiled = []
    compile_module = torch.nn.Module.compile
    monkeypatch.setattr(
        torch.nn.Module,
        'compile',
        lambda self, *a, **k: (compiled.append(type(self).__name__), compile_module(self, *a, **k)),
    )
    model_cfg = ModelConfig(
        arch='llama', n_layer=2, n_head=2, n_embd=32, vocab_size=256, block_size=16
    )
    eager = TrainConfig(compile=False, batch_tokens=64, micro_batch=2, dtype='float32')
    one = processes.setup_cluster()
    assert (
        live_ledger._time_steps(model_cfg, eager, 'float32', one, trainer())['tokens_per_s'] > 0
        and compiled == []
    )
    for mode, world_size, modules in [
        ('ddp', 1, ['GPT']),
        ('ddp', 2, ['GPT']),
        ('zero1', 2, ['GPT']),
        ('zero2', 2, ['Block', 'Block']),
        ('fsdp', 2, ['Block', 'Block']),
    ]:
        cfg = dataclasses.replace(eager, compile=True, parallel=mode)
        compiled.clear()
        processes.compile_as_run(GPT(model_cfg), cfg, world_size)
        assert compiled == modules
    torch._dynamo.reset()
    cfg = dataclasses.replace(eager, compile=True)
    compiled.clear()
    assert live_ledger._time_steps(model_cfg, cfg, 'float32', one, trainer())[
        'tokens_per_s'
    ] > 0 and compiled == ['GPT']
    graphs = torch._dynamo.utils.counters['stats']['unique_graphs']
    model = GPT(model_cfg)
    model.init_weights()
    processes.compile_as_run(model, cfg, 1)
    x, y = (torch.randint(256, (2, 16)) for _ in range(2))
    model(x, y, reduction='sum')[1].backward()
    assert graphs > 0 and torch._dynamo.utils.counters['stats']['unique_graphs'] == graphs


def test_a_long_step_is_probed_at_1_and_4_micro_steps_and_extrapolated(monkeypatch):
    """8 micro-steps a step: timed at 1 and 4, a step is t1 + 7 micro-steps (exact for a step of fixed + 8 x micro
    seconds: here train_step's seconds are set, on a clock of its own); a t4 under t1 (noise on a tiny model) gives
    no micro-step, not a negative step."""
    model_cfg = ModelConfig(
        arch='llama', n_layer=1, n_head=2, n_embd=32, vocab_size=256, block_size=16
    )
    cfg = TrainConfig(compile=False, batch_tokens=256, micro_batch=2, dtype='float32')
    now, step_of = [0.0], {}
    real_step = train.train_step

    def timed_step(run):
        real_step(run)
        now[0] += step_of[run.train.batch_tokens // run.micro_step_tokens]

    monkeypatch.setattr(train, 'train_step', timed_step)
    monkeypatch.setattr(live_ledger, 'PROBE_CLOCK', lambda: now[0])
    one = processes.setup_cluster()
    step_of.update({1: 0.5 + 0.25, 4: 0.5 + 4 * 0.25})  # fixed 0.5 s, 0.25 s a micro-step
    entry = live_ledger._time_steps(model_cfg, cfg, 'float32', one, trainer())
    assert entry['step_seconds'] == [[1, 0.75], [4, 1.5]]
    assert entry['tokens_per_s'] == pytest.approx(256 / (0.5 + 8 * 0.25), rel=1e-12)
    step_of.update({1: 0.75, 4: 0.7})
    assert (
        live_ledger._time_steps(model_cfg, cfg, 'float32', one, trainer())['tokens_per_s']
        == 256 / 0.75
    )


def test_train_tokens_on_the_command_line_plan_by_tokens():
    _, by_minutes = load_config('configs/pystdlib_cpu.py')
    _, by_tokens = load_config('configs/pystdlib_cpu.py', ['--train_tokens=81920'])
    assert by_minutes.train_minutes == 4 and by_tokens.train_minutes == 0
    _, both = load_config('configs/pystdlib_cpu.py', ['--train_tokens=81920', '--train_minutes=1'])
    assert both.train_minutes == 1
    with pytest.raises(ConfigError, match=r'train_minutes must be positive \(or 0\), got -1'):
        load_config('configs/pystdlib_cpu.py', ['--train_minutes=-1'])
