"""
objectives_bench.py: the pretraining objectives side by side on the CPU default (a benchmark, not a test).

    python prepare.py pystdlib --out data/pystdlib_special     # once: the stdlib, our BPE with the special tokens
    python experiments/objectives_bench.py                     # ~25 minutes on 2 cores; results in out/objectives
    python experiments/objectives_bench.py --seeds=1337,1338 --examples=300

The same model, data order and seed (configs/pystdlib_cpu.py) trained once per objective: clm, prefix_lm, fim at
rates 0.5 and 0.9, ul2. For each it reports what the papers claim about:

- the plain left-to-right validation loss, in bits per byte, over --val_tokens of the held-out stdlib files: the
  FIM paper's "FIM for free" (Bavarian et al. 2022: FIM training leaves it nearly unchanged) and the book's "prefix
  LM slightly inferior";
- infilling on held-out stdlib functions: one single-line statement of a function masked (the tokens its text
  touches), the model asked for it with the PSM prompt, greedy, up to the end-of-text token: exact match of the
  line; beside it the left-to-right baseline, the same model given only the text before the line (its greedy
  continuation counts if it starts with the line: lenient, it need not stop);
- the transform's host time per micro-batch (16 x 257 tokens), against the run's measured time for a micro-step.

A run already complete in out/objectives is not trained again (train.py sees it), so a rerun only evaluates.
"""

import argparse
import ast
import json
import math
import os
import sys
import time
import zlib

import numpy as np
import torch

# the repo's modules
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import prepare
import sample
import sweep
import train
from ledgergpt import checkpoint, objectives, sums
from ledgergpt import data as data_files  # the module; `data` names a data folder below
from ledgergpt.config import cli, load_config

CASES = {
    'clm': {},
    'prefix_lm': {},
    'fim_0.5': {'fim_rate': 0.5},
    'fim_0.9': {'fim_rate': 0.9},
    'ul2': {},
}
SIMPLE = (
    ast.Assign,
    ast.AugAssign,
    ast.AnnAssign,
    ast.Return,
    ast.Expr,
    ast.Raise,
    ast.Assert,
    ast.Delete,
    ast.Import,
    ast.ImportFrom,
)


def objective_flags(case):
    """train.py's flags for a case: --objective=fim --fim_rate=0.9."""
    return [f"--objective={case.split('_0.')[0]}"] + [
        f'--{key}={value}' for key, value in CASES[case].items()
    ]


# -----------------------------------------------------------------------------------------------------
# Infilling examples: held-out functions (the val split's files: the model and the BPE never saw them).


def token_spans(encoding, ids):
    """Byte offset where each token starts and ends in the decoded text."""
    ends = np.cumsum([len(encoding.decode_single_token_bytes(t)) for t in ids])
    return ends - [len(encoding.decode_single_token_bytes(t)) for t in ids], ends


def infilling_examples(encoding, block_size, count, seed):
    """[(prefix ids, middle ids, suffix ids)]: per function at most one single-line statement, its middle the
    tokens that touch the statement's text (a token boundary on both sides, as FIM training splits), the whole
    prompt and middle within block_size."""
    val = [
        text
        for path, text in prepare.pystdlib_files()
        if zlib.crc32(path.encode()) % 100 < prepare.PYSTDLIB_VAL_PERCENT
    ]
    rng = np.random.default_rng(seed)
    found = []
    for text in val:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines(keepends=True)
        for function in (
            n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        ):
            # the one-line statements of its body, its docstring not one of them
            statements = [
                s
                for s in ast.walk(function)
                if isinstance(s, SIMPLE)
                and s.lineno == s.end_lineno
                and s.lineno > function.lineno
                and not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
            ]
            if not statements:
                continue
            first, line = function.lineno - 1, statements[rng.integers(len(statements))].lineno - 1
            source = ''.join(lines[first : function.end_lineno])
            ids = encoding.encode_ordinary(source)
            if not 32 <= len(ids) <= block_size - 48:
                continue
            before = len(''.join(lines[first:line]).encode())
            content = lines[line].rstrip().encode()
            start = before + len(content) - len(content.lstrip())
            starts, ends = token_spans(encoding, ids)
            touched = np.flatnonzero((ends > start) & (starts < before + len(content)))
            found.append(
                (ids[: touched[0]], ids[touched[0] : touched[-1] + 1], ids[touched[-1] + 1 :])
            )
    picked = rng.permutation(len(found))[:count]
    return [found[i] for i in sorted(picked)]


@torch.no_grad()
def infilling_accuracy(model, encoding, fim_ids, examples):
    """(FIM exact match, left-to-right prefix match) over the examples, greedy."""
    eot, fim_hits, l2r_hits = encoding.eot_token, 0, 0
    for prefix, middle, suffix in examples:
        truth = encoding.decode(middle)
        prompt = torch.tensor([sample.fim_prompt(eot, fim_ids, prefix, suffix)])
        (tokens,) = sample.generate_until(
            model, prompt, len(middle) + 8, eot, temperature=0, top_k=None
        )
        fim_hits += encoding.decode([t for t in tokens if t < encoding.n_vocab]) == truth
        start = torch.tensor([[eot, *prefix]])
        tokens = model.generate(start, len(middle) + 2, temperature=0)[0, start.size(1) :].tolist()
        l2r_hits += encoding.decode([t for t in tokens if t < encoding.n_vocab]).startswith(truth)
    return fim_hits / len(examples), l2r_hits / len(examples)


def val_bits_per_byte(model, data, block_size, val_tokens):
    """Plain next-token loss over the first val_tokens of the val split, in bits per byte (of the targets' own
    text, data.target_bytes) and nats."""
    shard = np.concatenate(
        [
            np.asarray(data_files.open_shard(p), dtype=np.int64)
            for p in data_files.list_shards(data, 'val')
        ]
    )[: val_tokens + 1]
    n = (len(shard) - 1) // block_size
    # each with its next token
    rows = np.stack([shard[k * block_size : (k + 1) * block_size + 1] for k in range(n)])
    loss = sweep.mean_loss(lambda x, y: model(x, y)[1], torch.from_numpy(rows))
    bytes_per_token = data_files.target_bytes(data, rows[:, 1:]) / rows[:, 1:].size
    return sums.bits_per_byte(loss, bytes_per_token), loss, n * block_size


def transform_ms(objective, stream, micro_batch, repeats=200):
    """Median host milliseconds of the transform of one micro-batch of the train stream."""
    times = []
    for k in range(repeats):
        sequences = stream.batch(k * micro_batch, micro_batch)
        started = time.perf_counter()
        objective(sequences, k * micro_batch)
        times.append(time.perf_counter() - started)
    return 1000 * float(np.median(times))


@cli
def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0].strip())
    parser.add_argument('--config', default='configs/pystdlib_cpu.py')
    parser.add_argument(
        '--data', default='data/pystdlib_special', help='a pystdlib folder with the special tokens'
    )
    parser.add_argument('--out', default='out/objectives')
    parser.add_argument('--cases', default=','.join(CASES), help=f"any of {', '.join(CASES)}")
    parser.add_argument(
        '--seeds', default='1337', help='comma-separated: one run per case and seed'
    )
    parser.add_argument(
        '--val_tokens', type=int, default=262_144, help='val tokens for the bits per byte'
    )
    parser.add_argument('--examples', type=int, default=300, help='held-out infilling examples')
    parser.add_argument('overrides', nargs='*', help='--key=value for train.py, after a --')
    args = parser.parse_args(argv)
    meta = data_files.load_meta(args.data)
    encoding = data_files.load_tokenizer(args.data)
    fim_ids = objectives.special_ids(meta, args.data, objectives.FIM_TOKENS, 'objectives_bench.py')
    results = []
    for seed in [int(s) for s in args.seeds.split(',')]:
        for case in args.cases.split(','):
            out_dir = os.path.join(args.out, f'{case}_seed{seed}')
            started = time.time()
            flags = [
                args.config,
                f'--out_dir={out_dir}',
                f'--data={args.data}',
                f'--seed={seed}',
                '--eval_every=1000000',
                *objective_flags(case),
                *args.overrides,
            ]
            if train.main(flags) != 0:
                return 1
            model_cfg, train_cfg = load_config(args.config, flags[1:])
            objective = objectives.build(train_cfg, meta)
            model, _ = checkpoint.load_model(out_dir, torch.device('cpu'))
            bpb, loss, counted = val_bits_per_byte(
                model, args.data, model_cfg.block_size, args.val_tokens
            )
            examples = infilling_examples(encoding, model_cfg.block_size, args.examples, seed=0)
            fim_match, l2r_match = infilling_accuracy(model, encoding, fim_ids, examples)
            with open(os.path.join(out_dir, 'summary.json')) as f:
                summary = json.load(f)
            step_ms = (
                1000
                * train_cfg.micro_batch
                * model_cfg.block_size
                / summary['tokens_per_s_measured']
            )
            stream = data_files.open_data(model_cfg, train_cfg)[0]
            host_ms = transform_ms(objective, stream, train_cfg.micro_batch)
            results.append(
                {
                    'case': case,
                    'seed': seed,
                    'val_bpb': bpb,
                    'val_loss': loss,
                    'val_tokens': counted,
                    'fim_exact': fim_match,
                    'l2r_prefix_match': l2r_match,
                    'examples': len(examples),
                    'loss_fraction': sums.loss_fraction(objective.name, objective.ul2_rates),
                    'transform_ms': host_ms,
                    'micro_step_ms': step_ms,
                    'tokens_per_s': summary['tokens_per_s_measured'],
                    'train_tokens': summary['tokens_seen'],
                    'seconds': time.time() - started,
                }
            )
            print(json.dumps(results[-1]), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, 'results.jsonl'), 'w') as f:
        f.writelines(json.dumps(r) + '\n' for r in results)
    print(table(results, args.examples))
    return 0


def table(results, examples):
    """A markdown table: per case the mean over seeds (and the spread when there are several)."""
    lines = [
        '| objective | loss-carrying share | val bits/byte | vs clm | FIM exact match | L2R prefix match | '
        'transform ms / micro-step ms |',
        '| --- | ---: | ---: | ---: | ---: | ---: | ---: |',
    ]
    by_case = {}
    for r in results:
        by_case.setdefault(r['case'], []).append(r)
    clm = np.mean([r['val_bpb'] for r in by_case.get('clm', [])]) if 'clm' in by_case else math.nan
    for case, rows in by_case.items():
        bpb = [r['val_bpb'] for r in rows]
        spread = f" ± {np.std(bpb, ddof=1):.4f}" if len(rows) > 1 else ''
        fim, l2r = (
            np.mean([r['fim_exact'] for r in rows]),
            np.mean([r['l2r_prefix_match'] for r in rows]),
        )
        se = math.sqrt(max(fim * (1 - fim), 1e-12) / (examples * len(rows)))
        lines.append(
            f"| {case} | {rows[0]['loss_fraction']:.2f} | {np.mean(bpb):.4f}{spread} | "
            f"{np.mean(bpb) - clm:+.4f} | {fim:.1%} ± {se:.1%} | {l2r:.1%} | "
            f"{np.mean([r['transform_ms'] for r in rows]):.2f} / "
            f"{np.mean([r['micro_step_ms'] for r in rows]):.0f} |"
        )
    return '\n'.join(lines)


if __name__ == '__main__':
    sys.exit(main())
