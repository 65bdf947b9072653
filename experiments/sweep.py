"""
sweep.py: the best model two CPU cores can train in a fixed wall-clock budget, found by a small recorded sweep, and
the same sweep for another trainer (nanoGPT's train.py, from a checkout you pass) on the same text.

    python experiments/sweep.py                        # our grid, 5 minutes a point, on data/pystdlib
    python experiments/sweep.py --nanogpt=../nanoGPT   # nanoGPT's train.py too, the two alternating point by point
    python experiments/sweep.py --minutes=1 --points=0,3   # a quick look at points 0 and 3 of the grid
    python experiments/sweep.py --race                 # AdamW against Muon, then the recipe's parts (docs/measured.md)

The protocol, the same for both trainers. Each point of the grid (a shape, a vocabulary, a batch, a learning rate)
gets the same wall-clock budget for training: the seconds its steps take, each trainer's own per-step times summed
(the first step's compile included; start-up, eval and scoring not). A short calibration run of the point measures
the trainer's time per step; the point then trains for as many steps as fit the budget, its learning-rate schedule
spanning exactly those steps, and a run whose measured training seconds miss the budget by more than 5% (a
calibration that misjudged the warm-up) is run again with its steps rescaled. Each row prints the training seconds
measured. Both are then scored the same way, by
this file: the mean cross-entropy over the same fixed val sequences (the first 131,072 tokens of the val split,
in windows of the model's block size), in bits per byte of text. The grid's vocabularies each get a data folder
made by prepare.py from the same files; nanoGPT reads the same tokens, exported in its format (train.bin, val.bin,
meta.pkl) into its checkout's data/ folder. Nothing of nanoGPT's is copied here: its train.py runs as it is, and
its model.py is imported from the checkout to score its checkpoint.
"""

import functools
import json
import os
import pickle
import re
import statistics
import subprocess
import sys
import time

import numpy as np

# the repo's modules
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import prepare
from ledgergpt import data as data_files  # the module; `data` names a data folder below
from ledgergpt import sums
from ledgergpt.config import ConfigError, cli, load_config

# the repo's root: train.py, configs/, data/
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EVAL_TOKENS = 131_072
# The grid: overrides of configs/pystdlib_cpu.py, a point each; vocab_size picks the data folder (bpe:V). Each runs
# the book's recipe, as nanoGPT does (AdamW, none of the race's parts), which the default has left for the race's.
BOOK_RECIPE = dict(optimizer='adamw', qk_norm='none')
GRID = [
    dict(
        BOOK_RECIPE,
        vocab_size=vocab,
        n_layer=layers,
        n_embd=width,
        n_head=width // 64,  # head size 64
        batch_tokens=batch,
        micro_batch=16,
        lr=lr,
    )
    for vocab, layers, width, batch, lr in (
        (8192, 4, 256, 8192, 2e-3),
        (8192, 4, 256, 8192, 4e-3),
        (8192, 4, 256, 16384, 4e-3),
        (8192, 6, 384, 16384, 2e-3),
        (4096, 6, 384, 16384, 2e-3),
        (8192, 8, 512, 16384, 1.5e-3),
    )
]


def data_folder(vocab):
    """data/pystdlib (the default, bpe:8192) or data/pystdlib_bpe{V}, made on first use (~10 s)."""
    folder = os.path.join(ROOT, 'data', 'pystdlib' if vocab == 8192 else f'pystdlib_bpe{vocab}')
    if not os.path.exists(os.path.join(folder, 'meta.json')):
        prepare.prepare_pystdlib(folder, tokenizer=f'bpe:{vocab}')
    return folder


def val_sequences(data, block_size):
    """The fixed val set both trainers are scored on: the first EVAL_TOKENS of the val split, windows of T + 1."""
    tokens = np.concatenate(
        [np.asarray(data_files.open_shard(p)) for p in data_files.list_shards(data, 'val')]
    )
    tokens = tokens[: EVAL_TOKENS + 1].astype(np.int64)
    n = (len(tokens) - 1) // block_size
    return np.stack([tokens[i * block_size : i * block_size + block_size + 1] for i in range(n)])


def mean_loss(forward, sequences, batch=16):
    """The mean of `forward(x, y) -> loss` (nats per token) over a (n, T + 1) tensor of token sequences, `batch`
    rows at a time, each row weighted alike."""
    import torch

    total = 0.0
    with torch.no_grad():
        for i in range(0, len(sequences), batch):
            chunk = sequences[i : i + batch]
            total += forward(chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()).item() * len(
                chunk
            )
    return total / len(sequences)


def score(forward, data, block_size, batch=16):
    """Mean val loss (nats per token) of `forward(x, y) -> loss` over the fixed val sequences, and bits per byte."""
    import torch

    loss = mean_loss(forward, torch.from_numpy(val_sequences(data, block_size)), batch)
    return loss, sums.bits_per_byte(loss, val_bytes_per_token(data, block_size))


def val_bytes_per_token(data, block_size):
    """UTF-8 bytes per target token of the fixed val sequences: exact bits per byte's denominator."""
    targets = val_sequences(data, block_size)[:, 1:]
    return data_files.target_bytes(data, targets) / targets.size


# -----------------------------------------------------------------------------------------------------
# Our train.py.


def point_config(point):
    """(ModelConfig, TrainConfig) of a grid point: configs/pystdlib_cpu.py with the point's overrides."""
    return load_config(
        os.path.join(ROOT, 'configs/pystdlib_cpu.py'), [f'--{k}={v}' for k, v in point.items()]
    )


def run_ours(point, data, out_dir, steps=None):
    """train.py on the point. steps None: a calibration run -> (seconds to the first step, seconds per step);
    else -> (wall seconds, val loss of the final checkpoint, training seconds: its steps' times summed)."""
    flags = [f'--{k}={v}' for k, v in point.items()] + [
        f'--data={data}',
        f'--out_dir={out_dir}',
        '--sample_tokens=0',
        '--eval_tokens=1024',
        '--log_every=1',
    ]
    if steps is None:
        flags += ['--max_steps=6', '--eval_every=1000', '--ckpt_every=1000']
    else:
        flags += [
            f'--train_tokens={steps * point_config(point)[1].batch_tokens}',
            f'--eval_every={steps}',
            f'--ckpt_every={steps}',
        ]
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, 'train.py', 'configs/pystdlib_cpu.py', *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    elapsed = time.perf_counter() - start
    if result.returncode:
        raise ConfigError(f"train.py failed on {point}: {result.stderr.strip().splitlines()[-1]}")
    with open(os.path.join(out_dir, 'metrics.jsonl')) as f:
        timed = [e for e in map(json.loads, f) if 'tokens_per_s' in e]  # every step: log_every=1
    if steps is None:
        steady = [e for e in timed if not e['warmup']]
        per_step = statistics.fmean(e['batch_tokens'] / e['tokens_per_s'] for e in steady)
        return elapsed - per_step * len(steady), per_step
    import torch

    from ledgergpt import checkpoint

    model, _ = checkpoint.load_model(out_dir, torch.device('cpu'))
    trained = sum(e['batch_tokens'] / e['tokens_per_s'] for e in timed)
    return elapsed, score(lambda x, y: model(x, y)[1], data, model.config.block_size)[0], trained


# -----------------------------------------------------------------------------------------------------
# nanoGPT's train.py, run as it is from its checkout.


def export_for_nanogpt(data, nanogpt):
    """Our tokens in nanoGPT's format: data/<name>/train.bin and val.bin (uint16, no header), meta.pkl (vocab)."""
    name = 'ledgergpt_' + os.path.basename(data)
    folder = os.path.join(nanogpt, 'data', name)
    os.makedirs(folder, exist_ok=True)
    for split in ('train', 'val'):
        path = os.path.join(folder, f'{split}.bin')
        if not os.path.exists(path):
            tokens = np.concatenate(
                [np.asarray(data_files.open_shard(p)) for p in data_files.list_shards(data, split)]
            )
            tokens.astype(np.uint16).tofile(path)
    with open(os.path.join(folder, 'meta.pkl'), 'wb') as f:
        pickle.dump({'vocab_size': data_files.load_meta(data)['vocab_size']}, f)
    return name


def run_nanogpt(point, data, out_dir, steps=None, nanogpt=None):
    """nanoGPT's train.py on the same point (its GPT-2 model: tied, learned positions, LayerNorm, GELU; fp32 on a
    CPU, where it has no autocast). steps None: calibration -> (seconds to the first step, seconds per step)."""
    model_cfg, train_cfg = point_config(point)
    accumulation = train_cfg.batch_tokens // (train_cfg.micro_batch * model_cfg.block_size)
    iters = 6 if steps is None else steps
    warmup = max(1, round(train_cfg.warmup_frac * iters))
    flags = dict(
        dataset=export_for_nanogpt(data, nanogpt),
        out_dir=out_dir,
        device='cpu',
        dtype='float32',
        compile=train_cfg.compile,
        batch_size=train_cfg.micro_batch,
        block_size=model_cfg.block_size,
        gradient_accumulation_steps=accumulation,
        n_layer=model_cfg.n_layer,
        n_head=model_cfg.n_head,
        n_embd=model_cfg.n_embd,
        dropout=0.0,
        bias=False,
        learning_rate=train_cfg.lr,
        max_iters=iters,
        lr_decay_iters=iters,
        warmup_iters=warmup,
        min_lr=train_cfg.lr * train_cfg.min_lr_ratio,
        weight_decay=train_cfg.weight_decay,
        beta2=train_cfg.beta2,
        eval_interval=iters,
        eval_iters=1,
        log_interval=1,
        always_save_checkpoint=True,
    )
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, 'train.py'] + [f'--{k}={v}' for k, v in flags.items()],
        cwd=nanogpt,
        capture_output=True,
        text=True,
    )
    elapsed = time.perf_counter() - start
    if result.returncode:
        raise ConfigError(
            f"nanoGPT's train.py failed on {point}: {result.stderr.strip().splitlines()[-1]}"
        )
    times = [
        float(t) / 1000
        for t in re.findall(r'^iter \d+: loss [\d.]+, time ([\d.]+)ms', result.stdout, re.M)
    ]
    if steps is None:
        per_step = statistics.fmean(times[2:])  # iter 0 and 1: compile and warm-up
        return elapsed - per_step * (len(times) - 1), per_step
    scored = score_nanogpt(
        nanogpt, os.path.join(nanogpt, out_dir, 'ckpt.pt'), data, model_cfg.block_size
    )
    return elapsed, scored, sum(times)


def score_nanogpt(nanogpt, path, data, block_size):
    """nanoGPT's checkpoint, loaded with its own model.py, scored on our val sequences."""
    import importlib.util

    import torch

    # nanoGPT's model.py, not ours
    spec = importlib.util.spec_from_file_location(
        'nanogpt_model', os.path.join(nanogpt, 'model.py')
    )
    nanogpt_model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nanogpt_model)
    saved = torch.load(path, map_location='cpu', weights_only=False)
    model = nanogpt_model.GPT(nanogpt_model.GPTConfig(**saved['model_args']))
    model.load_state_dict({k.removeprefix('_orig_mod.'): v for k, v in saved['model'].items()})
    model.eval()
    return score(lambda x, y: model(x, y)[1], data, block_size)[0]


# -----------------------------------------------------------------------------------------------------


BUDGET_TOLERANCE = 0.05  # a budgeted run's training seconds may miss the budget by this much


def budgeted_run(train_point, point, data, folder, seconds):
    """A trainer's run of a point with `seconds` of training: calibrated, run, and run once more with its steps
    rescaled if the training seconds it measured miss the budget by more than BUDGET_TOLERANCE (nanoGPT's
    calibration, its early steps slow, left 40 s of 300 unused). -> (steps, wall seconds, val loss, training
    seconds)."""
    first, per_step = train_point(point, data, folder + '_calibration')
    steps = max(1, int(seconds / per_step))
    elapsed, val_loss, trained = train_point(point, data, folder, steps)
    if abs(trained - seconds) > BUDGET_TOLERANCE * seconds:
        steps = max(1, round(steps * seconds / trained))
        elapsed, val_loss, trained = train_point(point, data, folder + '_rescaled', steps)
    return steps, elapsed, val_loss, trained


# -----------------------------------------------------------------------------------------------------
# The race (--race): AdamW against Muon on the CPU default (GRID's point 0), each at its best of RACE_LRS (a best on
# the grid's edge is not yet a best: the grid goes on past it, doubling or halving, up to RACE_EXTEND more LRs), then
# the recipe's parts added one at a time to the winner, then the parts that each beat it (over the seeds) together,
# every best and every part at each of RACE_SEEDS so that the noise is visible. Each finished row is kept in
# OUT/race.jsonl: a rerun goes on where it stopped.
RACE_LRS = (1e-3, 2e-3, 4e-3)
RACE_EXTEND = 2
RACE_SEEDS = (1337, 1338)
# nanochat's three
RACE_PARTS = ({'qk_norm': 'weightless'}, {'mlp': 'relu2'}, {'logit_softcap': 15.0})


def race(seconds, out):
    """-> the race's rows, in the order they ran: LRs (first seed), the bests' second seed, the parts, the gains."""
    done_path = os.path.join(out, 'race.jsonl')
    done = {}
    if os.path.exists(done_path):
        with open(done_path) as f:
            done = {json.dumps(r['overrides'], sort_keys=True): r for r in map(json.loads, f)}
    data = data_folder(GRID[0]['vocab_size'])
    rows, calibrated = [], {}

    def train_point(point, data, out_dir, steps=None):
        """run_ours, its calibration shared by the points that differ only in lr and seed (the same steps)."""
        if steps is not None:
            return run_ours(point, data, out_dir, steps)
        key = json.dumps(
            {k: v for k, v in point.items() if k not in ('lr', 'seed')}, sort_keys=True
        )
        if key not in calibrated:
            calibrated[key] = run_ours(point, data, out_dir)
        return calibrated[key]

    def run(overrides):
        key = json.dumps(overrides, sort_keys=True)
        if key not in done:
            folder = os.path.join(out, 'race_' + '_'.join(f'{k}{v}' for k, v in overrides.items()))
            point = dict(GRID[0], **overrides)
            steps, elapsed, val_loss, trained = budgeted_run(
                train_point, point, data, folder, seconds
            )
            block_size = point_config(point)[0].block_size
            done[key] = dict(
                overrides=overrides,
                steps=steps,
                tokens=steps * point_config(point)[1].batch_tokens,
                train_seconds=round(trained, 1),
                seconds=round(elapsed, 1),
                val_bpb=round(
                    sums.bits_per_byte(val_loss, val_bytes_per_token(data, block_size)), 4
                ),
            )
            os.makedirs(out, exist_ok=True)
            with open(done_path, 'a') as f:
                f.write(json.dumps(done[key]) + '\n')
        if done[key] not in rows:  # the first seed's row, asked for again for the mean
            rows.append(done[key])
            print(json.dumps(done[key]), flush=True)
        return done[key]['val_bpb']

    first, second = RACE_SEEDS
    best = {}
    for optimizer in ('adamw', 'muon'):
        lrs = list(RACE_LRS)
        for _ in range(RACE_EXTEND):
            lr = min(lrs, key=lambda lr: run(dict(optimizer=optimizer, lr=lr, seed=first)))
            if lr not in (lrs[0], lrs[-1]):
                break
            lrs = [lr / 2, *lrs] if lr == lrs[0] else [*lrs, lr * 2]
        lr = min(lrs, key=lambda lr: run(dict(optimizer=optimizer, lr=lr, seed=first)))
        best[optimizer] = dict(optimizer=optimizer, lr=lr)
    mean = {o: statistics.fmean(run(dict(b, seed=s)) for s in RACE_SEEDS) for o, b in best.items()}
    winner = best[min(mean, key=mean.get)]
    gains = [
        part
        for part in RACE_PARTS
        if statistics.fmean(run(dict(winner, **part, seed=s)) for s in RACE_SEEDS)
        < mean[winner['optimizer']]
    ]
    if len(gains) > 1:
        together = {key: value for part in gains for key, value in part.items()}
        for seed in RACE_SEEDS:
            run(dict(winner, **together, seed=seed))
    return rows


def format_race(rows):
    lines = [
        '| optimizer | lr | parts added | seed | steps | tokens | tokens/s | training s | val bpb |',
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


@cli
def main(argv):
    options = dict(a[2:].split('=', 1) for a in argv if a.startswith('--') and '=' in a)
    race_flag = '--race' in argv
    unknown = set(options) - {'minutes', 'nanogpt', 'points', 'out'}
    if (
        unknown
        or len(options) + race_flag != len(argv)
        or (race_flag and options.keys() - {'minutes', 'out'})
    ):
        raise ConfigError(
            'usage: python experiments/sweep.py [--minutes=5] [--nanogpt=PATH] [--points=I,J,...] [--out=FOLDER]'
            ' | --race [--minutes=5] [--out=FOLDER]'
        )
    seconds = 60 * float(options.get('minutes', 5))
    chosen = (
        [int(i) for i in options['points'].split(',')] if 'points' in options else range(len(GRID))
    )
    points = [(index, GRID[index]) for index in chosen]
    out = os.path.abspath(options.get('out', os.path.join(ROOT, 'out', 'sweep')))
    nanogpt = os.path.abspath(options['nanogpt']) if 'nanogpt' in options else None
    if race_flag:
        import torch

        print(
            f"race: {seconds:.0f} s of training a run, {torch.get_num_threads()} threads, torch {torch.__version__}, "
            f"{time.strftime('%Y-%m-%d %H:%M')}",
            flush=True,
        )
        print(format_race(race(seconds, out)))
        return 0
    if nanogpt and not os.path.isfile(os.path.join(nanogpt, 'train.py')):
        raise ConfigError(
            f"--nanogpt={nanogpt}: no train.py there (a checkout of github.com/karpathy/nanoGPT)"
        )
    import torch

    print(
        f"sweep: {len(points)} points x {seconds:.0f} s of training each, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}",
        flush=True,
    )
    rows = []
    for index, point in points:
        data = data_folder(point['vocab_size'])
        trainers = {'ledgergpt': run_ours}
        if nanogpt:
            trainers['nanoGPT'] = functools.partial(run_nanogpt, nanogpt=nanogpt)
        for name, train_point in trainers.items():  # alternating: the machine's drift falls on both
            folder = os.path.join(out, f'{index}_{name}')
            steps, elapsed, val_loss, trained = budgeted_run(
                train_point, point, data, folder, seconds
            )
            row = dict(
                point=index,
                trainer=name,
                steps=steps,
                tokens=steps * point_config(point)[1].batch_tokens,
                seconds=round(elapsed, 1),
                train_seconds=round(trained, 1),
                val_loss=round(val_loss, 4),
                val_bpb=round(
                    sums.bits_per_byte(
                        val_loss, val_bytes_per_token(data, point_config(point)[0].block_size)
                    ),
                    4,
                ),
                **point,
            )
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(format_table(rows))
    return 0


def format_table(rows):
    lines = [
        '| # | trainer | vocab | layers x width | batch | lr | steps | tokens | training s | wall s | val bpb |',
        '| ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |',
    ]
    for r in rows:
        lines.append(
            f"| {r['point']} | {r['trainer']} | {r['vocab_size']} | {r['n_layer']} x {r['n_embd']} | "
            f"{r['batch_tokens']:,} | {r['lr']:g} | {r['steps']:,} | {r['tokens']:,} | {r.get('train_seconds', '-')} "
            f"| {r['seconds']} | {r['val_bpb']:.4f} |"
        )
    return '\n'.join(lines)


if __name__ == '__main__':
    sys.exit(main())
