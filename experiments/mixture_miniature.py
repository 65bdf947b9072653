"""
mixture_miniature.py: the data-mixture experiment in miniature, on the CPU and on local text only. Two sources: Python's
standard library (code: data/pystdlib) and the English prose of Python's own documentation (the pydoc topics that
ship inside Python as pydoc_data.topics: data/pydoc_prose, tokenized with the stdlib folder's tokenizer, as a
mixture's folders must be). The CPU default's recipe (configs/pystdlib_cpu.py) at 2 layers x 128 trains at a few
weightings for the same tokens; each source's val set is scored on its own. The markdown table it prints is the
README's.

    python experiments/mixture_miniature.py                            # code shares 0.9, 0.5, 0.1; 0.5M tokens each
    python experiments/mixture_miniature.py --code=0.5 --tokens=2e6    # one weighting, longer

The prose is small (~0.1M tokens): at a 90% prose share it is repeated for several epochs, which the ledger
(`python ledger.py configs/pystdlib_cpu.py --data=...`) flags past 4 (Muennighoff et al. 2023).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys

# the repo's modules
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import prepare
from ledgergpt.config import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODE, PROSE = os.path.join('data', 'pystdlib'), os.path.join('data', 'pydoc_prose')
# the CPU default's recipe, a quarter of its FLOPs per token
SHAPE = ['--n_layer=2', '--n_embd=128', '--n_head=2']
# the first topics (alphabetically), held out; eval_tokens gives each source 8,192
PROSE_VAL_TOKENS = 16_384


def make_folders(code=CODE, prose=PROSE):
    """The two data folders, made once: the stdlib with prepare.py's default bpe:8192, then the pydoc topics (one
    document each, a JSON line each) in the very same tokenizer: its tokenizer.json is copied in first, and
    prepare.py keeps a tokenizer.json that is already the one asked for."""
    code_meta = prepare.prepare_pystdlib(code)
    if not os.path.exists(os.path.join(prose, 'meta.json')):
        import pydoc_data.topics

        os.makedirs(prose, exist_ok=True)
        shutil.copy(os.path.join(code, 'tokenizer.json'), os.path.join(prose, 'tokenizer.json'))
        topics = os.path.join(prose, 'pydoc_topics.jsonl')
        with open(topics, 'w') as f:
            for name in sorted(pydoc_data.topics.topics):
                f.write(json.dumps({'text': pydoc_data.topics.topics[name]}) + '\n')
        prepare.prepare_files(
            [topics], prose, tokenizer=code_meta['tokenizer'], val_tokens=PROSE_VAL_TOKENS
        )
    return code, prose


def run_dir(code_share):
    return os.path.join('out', f'mixture_code{round(100 * code_share)}')


def train(code_share, tokens, code=CODE, prose=PROSE):
    """train.py on the CPU default at this weighting, two evals (half-way and at the end)."""
    steps = tokens // 8192
    command = [
        sys.executable,
        'train.py',
        'configs/pystdlib_cpu.py',
        f'--data={code}:{code_share:g},{prose}:{1 - code_share:g}',
        f'--out_dir={run_dir(code_share)}',
        f'--train_tokens={steps * 8192}',
        f'--eval_every={max(1, steps // 2)}',
        '--eval_tokens=16384',
        f'--ckpt_every={steps}',
        '--sample_tokens=0',
        *SHAPE,
        '--dtype=float32',  # pinned, not 'auto' (a start-up measurement): every weighting computes alike
        '--compile=False',  # a short run: compiling would cost more than it saves
    ]
    print('$ ' + ' '.join(command), flush=True)
    subprocess.run(command, cwd=ROOT, check=True)


def finished(out_dir, tokens):
    try:
        with open(os.path.join(out_dir, 'summary.json')) as f:
            return json.load(f)['tokens_seen'] >= tokens // 8192 * 8192
    except (OSError, ValueError, KeyError, TypeError):
        return False


def results(out_dir):
    """A finished run's row: {'weights', 'sources': {name: {weight, bpb, epochs}}, 'val_bpb'} from its summary.json
    (the last eval's per-source bits per byte and their total) and ledger.json (each source's epochs)."""
    with open(os.path.join(out_dir, 'summary.json')) as f:
        summary = json.load(f)
    with open(os.path.join(out_dir, 'ledger.json')) as f:
        planned = {source['name']: source for source in json.load(f)['mixture']['sources']}
    sources = {
        name: {'weight': scored['weight'], 'bpb': scored['bpb'], 'epochs': planned[name]['epochs']}
        for name, scored in summary['val_sources'].items()
    }
    return {'sources': sources, 'val_bpb': summary['val_bpb'], 'tokens': summary['tokens_seen']}


def table(out_dirs):
    """The markdown table of the runs: weights, each source's val bits per byte (and epochs), the weighted total."""
    rows = [results(out_dir) for out_dir in out_dirs]
    names = list(rows[0]['sources'])
    lines = [
        '| weights ('
        + ' / '.join(names)
        + ') | tokens | '
        + ' | '.join(f'{name} val bits/byte (epochs planned)' for name in names)
        + ' | mixture val bits/byte |',
        '| --- | ---: |' + ' ---: |' * (len(names) + 1),
    ]
    for row in rows:
        sources = row['sources']
        lines.append(
            '| '
            + ' / '.join(format(sources[n]['weight'], '.0%') for n in names)
            + f" | {row['tokens']:,} | "
            + ' | '.join(f"{sources[n]['bpb']:.3f} ({sources[n]['epochs']:.2g})" for n in names)
            + f" | {row['val_bpb']:.3f} |"
        )
    return '\n'.join(lines)


@cli
def main(argv):
    parser = argparse.ArgumentParser(
        prog="experiments/mixture_miniature.py", description=__doc__.split('\n\n')[0]
    )
    parser.add_argument(
        '--code',
        default='0.9,0.5,0.1',
        help="the code's shares, comma-separated (default 0.9,0.5,0.1)",
    )
    parser.add_argument(
        '--tokens', type=float, default=524_288, help='tokens per run (default 524,288)'
    )
    args = parser.parse_args(argv)
    shares = [float(part) for part in args.code.split(',')]
    os.chdir(ROOT)
    make_folders()
    for share in shares:
        if not finished(run_dir(share), int(args.tokens)):
            train(share, int(args.tokens))
    print(table([run_dir(share) for share in shares]))
    return 0


if __name__ == '__main__':
    sys.exit(main())
