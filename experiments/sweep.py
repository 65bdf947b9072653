"""
sweep.py: the best model two CPU cores train in a fixed wall-clock budget, by a recorded sweep, and
the same sweep for nanoGPT's train.py (from a checkout you pass) on the same text. The protocol and
its results: docs/measured.md (the five-minute sweep; the race).

    python experiments/sweep.py                        # our grid, 5 minutes a point
    python experiments/sweep.py --nanogpt=../nanoGPT   # nanoGPT's train.py too, point by point
    python experiments/sweep.py --minutes=1 --points=0,3   # a quick look at points 0 and 3
    python experiments/sweep.py --race     # AdamW against Muon, then the recipe's parts
"""

import functools
import json
import os
import pickle
import re
import runpy
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

# the repo's root (train.py, configs/, data/) and its modules
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import prepare
from ledgergpt import checkpoint, sums
from ledgergpt import data as data_files  # the module; `data` names a data folder below
from ledgergpt.config import ConfigError, cli, load_config

USAGE = (
    'usage: python experiments/sweep.py [--minutes=5] [--nanogpt=PATH] [--points=I,J,...] '
    '[--out=FOLDER] | --race [--minutes=5] [--out=FOLDER]'
)
EVAL_TOKENS = 131_072  # the val sequences: the first 131,072 tokens of the val split
# The grid: overrides of configs/pystdlib_cpu.py, a point each; vocab_size picks the data folder.
# Each runs the book's recipe, as nanoGPT does (AdamW, none of the race's parts).
BOOK_RECIPE = dict(optimizer='adamw', qk_norm='none')
GRID = [
    dict(BOOK_RECIPE, vocab_size=vocab, n_layer=layers, n_embd=width, n_head=width // 64)
    | dict(batch_tokens=batch, micro_batch=16, lr=lr)
    for vocab, layers, width, batch, lr in (
        (8192, 4, 256, 8192, 2e-3),
        (8192, 4, 256, 8192, 4e-3),
        (8192, 4, 256, 16384, 4e-3),
        (8192, 6, 384, 16384, 2e-3),
        (4096, 6, 384, 16384, 2e-3),
        (8192, 8, 512, 16384, 1.5e-3),
    )
]
BUDGET_TOLERANCE = 0.05  # a budgeted run's training seconds may miss the budget by this much


def data_folder(vocab):
    """data/pystdlib (the default, bpe:8192) or data/pystdlib_bpe{V}, made on first use (~10 s)."""
    folder = os.path.join(ROOT, 'data', 'pystdlib' if vocab == 8192 else f'pystdlib_bpe{vocab}')
    if not os.path.exists(os.path.join(folder, 'meta.json')):
        prepare.prepare_pystdlib(folder, tokenizer=f'bpe:{vocab}')
    return folder


def split_tokens(data, split):
    """Every token of a data folder's split, its shards in order."""
    shards = data_files.list_shards(data, split)
    return np.concatenate([np.asarray(data_files.open_shard(path)) for path in shards])


def val_sequences(data, block_size):
    """The val set both trainers are scored on: the split's first EVAL_TOKENS, windows of T + 1."""
    tokens = split_tokens(data, 'val')[: EVAL_TOKENS + 1].astype(np.int64)
    n = (len(tokens) - 1) // block_size
    return np.stack([tokens[i * block_size : (i + 1) * block_size + 1] for i in range(n)])


def val_bytes_per_token(data, block_size):
    """UTF-8 bytes per target token of the val sequences: exact bits per byte's denominator."""
    targets = val_sequences(data, block_size)[:, 1:]
    return data_files.target_bytes(data, targets) / targets.size


def score(forward, data, block_size, batch=16):
    """Mean val loss (nats per token) of `forward(x, y) -> loss` on the val set; bits per byte."""
    sequences = torch.from_numpy(val_sequences(data, block_size))
    total = 0.0
    with torch.no_grad():
        for chunk in sequences.split(batch):
            loss = forward(chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous())
            total += loss.item() * len(chunk)
    loss = total / len(sequences)
    return loss, sums.bits_per_byte(loss, val_bytes_per_token(data, block_size))


def point_config(point):
    """(ModelConfig, TrainConfig) of a grid point: configs/pystdlib_cpu.py with its overrides."""
    overrides = [f'--{k}={v}' for k, v in point.items()]
    return load_config(os.path.join(ROOT, 'configs/pystdlib_cpu.py'), overrides)


def timed(command, cwd, failed):
    """-> (wall seconds, stdout) of a trainer's command; `failed` and its last error line if not."""
    start = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode:
        raise ConfigError(f"{failed}: {result.stderr.strip().splitlines()[-1]}")
    return elapsed, result.stdout


# -------------------------------------------------------------------------------------------------
# The trainers. steps None: a calibration run -> (seconds to the first step, seconds per step); else
# -> (wall seconds, val loss of the final checkpoint, training seconds: its steps' times summed).


def run_ours(point, data, out_dir, steps=None):
    """Our train.py on the point."""
    flags = [f'--{k}={v}' for k, v in point.items()]
    flags += [f'--data={data}', f'--out_dir={out_dir}', '--sample_tokens=0', '--eval_tokens=1024']
    if steps is None:
        flags += ['--max_steps=6', '--eval_every=1000', '--ckpt_every=1000']
    else:
        tokens = steps * point_config(point)[1].batch_tokens
        flags += [f'--train_tokens={tokens}', f'--eval_every={steps}', f'--ckpt_every={steps}']
    command = [sys.executable, 'train.py', 'configs/pystdlib_cpu.py', *flags, '--log_every=1']
    elapsed, _ = timed(command, ROOT, f'train.py failed on {point}')
    with open(os.path.join(out_dir, 'metrics.jsonl')) as f:
        logged = [e for e in map(json.loads, f) if 'tokens_per_s' in e]  # every step: log_every=1
    if steps is None:
        steady = [e['batch_tokens'] / e['tokens_per_s'] for e in logged if not e['warmup']]
        per_step = statistics.fmean(steady)
        return elapsed - per_step * len(steady), per_step
    model, _ = checkpoint.load_model(out_dir, torch.device('cpu'))
    val_loss = score(lambda x, y: model(x, y)[1], data, model.config.block_size)[0]
    return elapsed, val_loss, sum(e['batch_tokens'] / e['tokens_per_s'] for e in logged)


def export_for_nanogpt(data, nanogpt):
    """Our tokens as nanoGPT's data/<name>/train.bin, val.bin (uint16, no header) and meta.pkl."""
    name = 'ledgergpt_' + os.path.basename(data)
    folder = os.path.join(nanogpt, 'data', name)
    os.makedirs(folder, exist_ok=True)
    for split in ('train', 'val'):
        path = os.path.join(folder, f'{split}.bin')
        if not os.path.exists(path):
            split_tokens(data, split).astype(np.uint16).tofile(path)
    with open(os.path.join(folder, 'meta.pkl'), 'wb') as f:
        pickle.dump({'vocab_size': data_files.load_meta(data)['vocab_size']}, f)
    return name


def run_nanogpt(point, data, out_dir, steps=None, nanogpt=None):
    """nanoGPT's train.py on the same point: its GPT-2 model (tied, learned positions, LayerNorm,
    GELU), fp32 on a CPU, where it has no autocast."""
    model_cfg, train_cfg = point_config(point)
    iters = 6 if steps is None else steps
    accumulation = train_cfg.batch_tokens // (train_cfg.micro_batch * model_cfg.block_size)
    flags = {k: getattr(model_cfg, k) for k in ('block_size', 'n_layer', 'n_head', 'n_embd')}
    flags |= {k: getattr(train_cfg, k) for k in ('compile', 'beta2', 'weight_decay')}
    flags |= dict(dataset=export_for_nanogpt(data, nanogpt), out_dir=out_dir, device='cpu')
    flags |= dict(dtype='float32', batch_size=train_cfg.micro_batch, dropout=0.0, bias=False)
    flags |= dict(gradient_accumulation_steps=accumulation, learning_rate=train_cfg.lr)
    warmup = max(1, round(train_cfg.warmup_frac * iters))
    flags |= dict(max_iters=iters, lr_decay_iters=iters, warmup_iters=warmup, eval_interval=iters)
    flags |= dict(min_lr=train_cfg.lr * train_cfg.min_lr_ratio, eval_iters=1, log_interval=1)
    flags |= dict(always_save_checkpoint=True)
    command = [sys.executable, 'train.py', *(f'--{k}={v}' for k, v in flags.items())]
    elapsed, out = timed(command, nanogpt, f"nanoGPT's train.py failed on {point}")
    logged = re.findall(r'^iter \d+: loss [\d.]+, time ([\d.]+)ms', out, re.M)
    times = [float(ms) / 1000 for ms in logged]
    if steps is None:
        per_step = statistics.fmean(times[2:])  # iter 0 and 1: compile and warm-up
        return elapsed - per_step * (len(times) - 1), per_step
    return elapsed, score_nanogpt(nanogpt, out_dir, data, model_cfg.block_size), sum(times)


def score_nanogpt(nanogpt, out_dir, data, block_size):
    """nanoGPT's checkpoint in out_dir, loaded by its own model.py, scored on our val sequences."""
    theirs = runpy.run_path(os.path.join(nanogpt, 'model.py'))  # nanoGPT's model.py, not ours
    path = os.path.join(nanogpt, out_dir, 'ckpt.pt')
    saved = torch.load(path, map_location='cpu', weights_only=False)
    model = theirs['GPT'](theirs['GPTConfig'](**saved['model_args']))
    model.load_state_dict({k.removeprefix('_orig_mod.'): v for k, v in saved['model'].items()})
    model.eval()
    return score(lambda x, y: model(x, y)[1], data, block_size)[0]


def budgeted_run(train_point, point, data, folder, seconds):
    """A trainer's run of a point with `seconds` of training: calibrated, run, and run once more
    with its steps rescaled if its training seconds miss the budget by more than BUDGET_TOLERANCE
    (nanoGPT's calibration, its early steps slow, left 40 s of 300 unused). -> (steps, wall seconds,
    val loss, training seconds)."""
    _, per_step = train_point(point, data, folder + '_calibration')
    steps = max(1, int(seconds / per_step))
    elapsed, val_loss, trained = train_point(point, data, folder, steps)
    if abs(trained - seconds) > BUDGET_TOLERANCE * seconds:
        steps = max(1, round(steps * seconds / trained))
        elapsed, val_loss, trained = train_point(point, data, folder + '_rescaled', steps)
    return steps, elapsed, val_loss, trained


def row(point, data, steps, elapsed, val_loss, trained):
    """A budgeted run as the tables show it: steps, tokens, seconds, val bits per byte."""
    model_cfg, train_cfg = point_config(point)
    bpb = sums.bits_per_byte(val_loss, val_bytes_per_token(data, model_cfg.block_size))
    timing = dict(train_seconds=round(trained, 1), seconds=round(elapsed, 1))
    return dict(steps=steps, tokens=steps * train_cfg.batch_tokens, **timing, val_bpb=round(bpb, 4))


# -------------------------------------------------------------------------------------------------
# The race (--race, docs/measured.md): AdamW against Muon on the CPU default (GRID's point 0), each
# at its best of RACE_LRS (a best on the edge is not yet a best: the LRs go on past it, doubling or
# halving, up to RACE_EXTEND more), then the recipe's parts added one at a time to the winner, then
# the parts that each beat it together; every best and part at each of RACE_SEEDS, so that the
# noise shows. Each finished row is kept in OUT/race.jsonl: a rerun goes on where it stopped.
RACE_LRS = (1e-3, 2e-3, 4e-3)
RACE_EXTEND = 2
RACE_SEEDS = (1337, 1338)
RACE_PARTS = ({'qk_norm': 'weightless'}, {'mlp': 'relu2'}, {'logit_softcap': 15.0})  # nanochat's


def race(seconds, out):
    """-> the race's rows as they ran: LRs, the bests' second seed, the parts, the gains."""
    done_path = os.path.join(out, 'race.jsonl')
    done = {}
    if os.path.exists(done_path):
        with open(done_path) as f:
            done = {json.dumps(r['overrides'], sort_keys=True): r for r in map(json.loads, f)}
    data = data_folder(GRID[0]['vocab_size'])
    rows, calibrated = [], {}

    def train_point(point, data, out_dir, steps=None):
        """run_ours, its calibration shared by the points that differ only in lr and seed."""
        same = json.dumps(dict(point, lr=None, seed=None), sort_keys=True)
        if steps is None and same not in calibrated:
            calibrated[same] = run_ours(point, data, out_dir)
        return calibrated[same] if steps is None else run_ours(point, data, out_dir, steps)

    def run(overrides):
        """The val bits per byte of GRID's point 0 with `overrides`, run now or kept."""
        key = json.dumps(overrides, sort_keys=True)
        if key not in done:
            folder = os.path.join(out, 'race_' + '_'.join(f'{k}{v}' for k, v in overrides.items()))
            point = dict(GRID[0], **overrides)
            result = budgeted_run(train_point, point, data, folder, seconds)
            done[key] = dict(overrides=overrides, **row(point, data, *result))
            os.makedirs(out, exist_ok=True)
            with open(done_path, 'a') as f:
                f.write(json.dumps(done[key]) + '\n')
        if done[key] not in rows:  # the first seed's row, asked for again for the mean
            rows.append(done[key])
            print(json.dumps(done[key]), flush=True)
        return done[key]['val_bpb']

    def mean(**overrides):
        return statistics.fmean(run(dict(overrides, seed=seed)) for seed in RACE_SEEDS)

    best = {}
    for optimizer in ('adamw', 'muon'):
        lrs = list(RACE_LRS)
        for extended in range(RACE_EXTEND + 1):
            lr = min(lrs, key=lambda lr: run(dict(optimizer=optimizer, lr=lr, seed=RACE_SEEDS[0])))
            if lr not in (lrs[0], lrs[-1]) or extended == RACE_EXTEND:
                break
            lrs = [lr / 2, *lrs] if lr == lrs[0] else [*lrs, lr * 2]
        best[optimizer] = dict(optimizer=optimizer, lr=lr)
    means = {optimizer: mean(**b) for optimizer, b in best.items()}
    winner = best[min(means, key=means.get)]
    gains = [part for part in RACE_PARTS if mean(**winner, **part) < means[winner['optimizer']]]
    if len(gains) > 1:
        mean(**winner, **{key: value for part in gains for key, value in part.items()})
    return rows


def format_race(rows):
    lines = [
        '| optimizer | lr | parts added | seed | steps | tokens | tokens/s | training s '
        '| val bpb |',
        '| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |',
    ]
    for r in rows:
        o = r['overrides']
        parts = ', '.join(f'{k}={v}' for k, v in o.items() if k not in ('optimizer', 'lr', 'seed'))
        lines.append(
            f"| {o['optimizer']} | {o['lr']:g} | {parts or '-'} | {o['seed']} | {r['steps']:,} | "
            f"{r['tokens']:,} | {r['tokens'] / r['train_seconds']:,.0f} | {r['train_seconds']} | "
            f"{r['val_bpb']:.4f} |"
        )
    return '\n'.join(lines)


def format_table(rows):
    head = (
        '| # | trainer | vocab | layers x width | batch | lr | steps | tokens | training s | wall s'
        ' | val bpb |\n| ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |'
    )
    row = (
        '| {point} | {trainer} | {vocab_size} | {n_layer} x {n_embd} | {batch_tokens:,} | {lr:g} '
        '| {steps:,} | {tokens:,} | {train_seconds} | {seconds} | {val_bpb:.4f} |'
    )
    return '\n'.join([head, *(row.format(**r) for r in rows)])


@cli
def main(argv):
    options = dict(a[2:].split('=', 1) for a in argv if a.startswith('--') and '=' in a)
    racing = '--race' in argv
    allowed = {'minutes', 'out'} if racing else {'minutes', 'out', 'nanogpt', 'points'}
    if set(options) - allowed or len(options) + racing != len(argv):
        raise ConfigError(USAGE)
    points = options.get('points', ','.join(map(str, range(len(GRID)))))
    try:
        seconds, chosen = 60 * float(options.get('minutes', 5)), [int(i) for i in points.split(',')]
    except ValueError:
        seconds, chosen = 0, []
    if not 0 < seconds < float('inf') or not set(chosen) <= set(range(len(GRID))):
        raise ConfigError(
            f"{' '.join(argv)}: expected --minutes above 0 and --points of the grid's "
            f"{len(GRID)} points (0 to {len(GRID) - 1}), comma-separated"
        )
    out = os.path.abspath(options.get('out', os.path.join(ROOT, 'out', 'sweep')))
    nanogpt = os.path.abspath(options['nanogpt']) if 'nanogpt' in options else None
    if nanogpt and not os.path.isfile(os.path.join(nanogpt, 'train.py')):
        raise ConfigError(
            f"--nanogpt={nanogpt}: no train.py there (a checkout of github.com/karpathy/nanoGPT)"
        )
    when = time.strftime('%Y-%m-%d %H:%M')
    machine = f"{torch.get_num_threads()} threads, torch {torch.__version__}, {when}"
    if racing:
        print(f"race: {seconds:.0f} s of training a run, {machine}", flush=True)
        print(format_race(race(seconds, out)))
        return 0
    print(f"sweep: {len(chosen)} points x {seconds:.0f} s of training each, {machine}", flush=True)
    trainers = {'ledgergpt': run_ours}
    if nanogpt:
        trainers['nanoGPT'] = functools.partial(run_nanogpt, nanogpt=nanogpt)
    rows = []
    for index in chosen:
        point, data = GRID[index], data_folder(GRID[index]['vocab_size'])
        for name, train_point in trainers.items():  # alternating: the machine's drift falls on both
            folder = os.path.join(out, f'{index}_{name}')
            result = budgeted_run(train_point, point, data, folder, seconds)
            measured = dict(point=index, trainer=name, **row(point, data, *result))
            rows.append(dict(measured, val_loss=round(result[2], 4), **point))
            print(json.dumps(rows[-1]), flush=True)
    print(format_table(rows))
    return 0


if __name__ == '__main__':
    sys.exit(main())
