"""
test_figures.py: the numbers a user reads are the code's. The ledger and train.py refuse the same plans with the
same line; `ledger.py --book` sums in one unit and labels its rows by the formula it computes; the README's ledger
figures are what `python ledger.py CONFIG` prints today.
"""

import os
import re

import pytest

import ledger
import train
from ledgergpt import sums
from ledgergpt.config import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


@pytest.mark.parametrize(
    'overrides',
    [
        ['--batch_tokens=1000'],
        [
            '--n_kv_head=4',
            '--block_size=2048',
            '--micro_batch=6',
        ],  # 42.67 accumulation steps on one process
    ],
)
def test_the_ledger_and_train_refuse_the_same_plans_with_one_line(overrides, tmp_path, capsys):
    config = 'configs/gpt2_124m.py'
    assert ledger.main([config, *overrides]) == 2
    ledger_says = capsys.readouterr().err
    assert train.main([config, *overrides, f'--out_dir={tmp_path / "out"}']) == 2
    train_says = capsys.readouterr().err
    assert ledger_says == train_says and ledger_says.count('\n') == 1
    assert (
        ledger_says.startswith('error: batch_tokens (')
        and 'is not a multiple of micro_batch x block_size' in ledger_says
    )
    assert not (tmp_path / 'out').exists()  # refused before anything was written
    # the ledger plans for n_gpu processes: 4 of them make 10.67 accumulation steps of the second plan
    if len(overrides) == 3:
        assert ledger.main([config, *overrides, '--n_gpu=4']) == 2
        assert '= 6 x 2048 x 4 = 49,152 (10.67 accumulation steps)' in capsys.readouterr().err


def test_book_sums_memory_in_one_unit():
    """LLaMA-7B on 2 x A800-80G (the book): its 50.20 'GB' of model states are GiB (16P/2 = 50.205 x 2^30 bytes),
    and so are the figures added to them and the card's 80 'GB' (81,920 MiB): the sum and the spare are in GiB."""
    rows = {row['what']: row for row in sums.book_examples()}
    states = rows['LLaMA-7B model states per GPU, GiB']['value']
    assert states == 16 * sums.count_params(sums.LLAMA_7B)['total'] / 2 / 2**30
    total = rows['LLaMA-7B total per GPU, GiB']
    assert total['value'] == pytest.approx(states + 6.20 + 3.91 + 6) and total['matches']
    spare = rows['LLaMA-7B spare on an 80 GB card, GiB']
    assert spare['value'] == pytest.approx(sums.GPUS['A800'].memory_bytes / 2**30 - total['value'])
    assert sums.GPUS['A800'].memory_bytes == 80 * 2**30 and spare['matches']
    assert not [what for what in rows if what.startswith('LLaMA-7B') and what.endswith(', GB')]


@pytest.mark.parametrize('n_kv_head', [0, 4])  # MHA (0: n_head) and GQA
@pytest.mark.parametrize('config', ['configs/gpt2_124m.py', 'configs/llama_7b.py'])
def test_the_per_layer_row_shows_the_formula_of_its_number(config, n_kv_head, capsys):
    assert ledger.main([config, f'--n_kv_head={n_kv_head}']) == 0
    row = next(
        line
        for line in capsys.readouterr().out.splitlines()
        if line.strip().startswith('per layer')
    )
    count, formula = re.match(r'\s*per layer\s+([\d,]+)\s+(.*)', row).groups()
    model = load_config(config, [f'--n_kv_head={n_kv_head}'])[0]
    H, F, k = model.n_embd, model.ffn_width, model.ffn_matrices
    kv_width = model.kv_heads * model.head_dim
    if n_kv_head:
        assert (
            formula.startswith(f"2H^2 + 2H*kv_width + {k}HH' + 2H")
            and f'kv_width = 4 kv heads x {model.head_dim}' in formula
        )
    else:
        assert formula.startswith(f"4H^2 + {k}HH' + 2H") and 'kv_width' not in formula
    weights = 2 * H * H + 2 * H * kv_width + k * H * F + 2 * H  # the formula, evaluated
    # gpt2: q, k, v, o, up, down, two LayerNorms' biases
    biases = 5 * H + 2 * kv_width + F if model.biases else 0
    if model.biases:
        assert ("(+ 5H + 2kv_width + H' biases)" if n_kv_head else "(+ 7H + H' biases)") in formula
    assert int(count.replace(',', '')) == weights + biases == sums.count_params(model)['per_layer']


# -----------------------------------------------------------------------------------------------------
# The README's and docs' ledger figures: each is what the ledger computes today, at the precision it is written in.


def ledger_output(config, capsys):
    assert ledger.main([os.path.join(ROOT, config)]) == 0
    return capsys.readouterr().out.splitlines()


def shown(value, text):
    """value written as `text` is: the same number of decimals (thousands separators ignored)."""
    text = text.replace(',', '')
    decimals = len(text.split('.')[1]) if '.' in text else 0
    return f'{value:.{decimals}f}' == text


def test_docs_ledger_excerpt_is_the_ledgers_output(capsys):
    """docs/ledger.md shows `python ledger.py configs/h200_1b3.py`, lines elided by '...': each shown line is in the
    output, in order."""
    doc = read('docs/ledger.md').splitlines()
    start = doc.index('    $ python ledger.py configs/h200_1b3.py') + 1
    end = next(i for i in range(start, len(doc)) if doc[i] and not doc[i].startswith('    '))
    shown_lines = [line[4:] for line in doc[start:end] if line.strip() not in ('...', '')]
    output = ledger_output('configs/h200_1b3.py', capsys)
    # ValueError: a line the ledger no longer prints
    positions = [output.index(line) for line in shown_lines]
    assert positions == sorted(positions) and len(shown_lines) > 15


def test_the_config_tables_figures_are_the_ledgers():
    """docs/running.md's table of configs: params, days, the book's days, cost, memory per device of each config
    the ledger plans (not the CPU ones, measured; not the over-training plan, experiments/overtrain.py's)."""
    rows = re.findall(
        r'^\| `(configs/\w+\.py)` \| [^|]+ \| ([^|]+) \| ([^|]+) \|$', read('docs/running.md'), re.M
    )
    checked = 0
    for config, params, bill in rows:
        if 'pystdlib' in config or 'overtrain' in config:
            continue
        p = sums.predict(*load_config(os.path.join(ROOT, config)))
        # "1.34B", or an MoE's "1.05B (0.25B active)"
        number, unit, active, active_unit = re.fullmatch(
            r'([\d.]+)([KMB])(?: \(([\d.]+)([KMB]) active\))?', params.strip()
        ).groups()
        scale = {'K': 1e3, 'M': 1e6, 'B': 1e9, None: None}
        assert shown(p['params']['total'] / scale[unit], number), config
        assert active is None or shown(p['params']['active'] / scale[active_unit], active), config
        figures = {
            r'^([\d.]+) days': p['days'],
            r'book 6ND: ([\d.]+)': p['days_book'],
            r'\$([\d,]+)': p['cost_usd'],
            r'([\d.]+) of \d+ GiB': p['memory']['total'] / 2**30,
            r'[\d.]+ of (\d+) GiB': p['memory']['gpu_memory'] / 2**30,
            r'^([\d.]+) GiB per GPU': p['memory']['total'] / 2**30,
            r'\(([\d.]+) of compute': p['days_compute'],
            r'([\d.]+)% of a step waits on communication': 100
            * (p['comm']['exposed_fraction'] or 0),
            r'model states ([\d.]+) GiB from the total': p['memory']['model_states'] / 2**30,
            r"the book's 16 x active: ([\d.]+)": p['memory'].get('book_active_model_states', 0)
            / 2**30,
        }
        found = [
            (pattern, m.group(1))
            for pattern in figures
            for m in [re.search(pattern, bill.strip())]
            if m
        ]
        assert found, (config, bill)
        for pattern, text in found:
            assert shown(figures[pattern], text), (config, pattern, text, figures[pattern])
        checked += 1
    assert checked == 8


def test_the_muon_configs_bill_is_the_ledgers():
    """configs/h200_1b3_muon.py's comment: its model states beside AdamW's, the Newton-Schulz FLOPs and seconds
    of a step, the days, cost and memory, all the ledger's."""
    muon = sums.predict(*load_config(os.path.join(ROOT, 'configs/h200_1b3_muon.py')))
    adamw = sums.predict(*load_config(os.path.join(ROOT, 'configs/h200_1b3.py')))
    text = read('configs/h200_1b3_muon.py')
    pattern = (
        r'model states ([\d.]+) GiB, not ([\d.]+):.*Newton-Schulz ([\d.e]+) FLOPs a step \(([\d.]+)% of the '
        r"step's ([\d.e]+)\), ~([\d.]+) s of its ([\d.]+) s at (\d+)% MFU;.*#   ([\d.]+) days and \$(\d+) for "
        r'the same 26B tokens \(AdamW: ([\d.]+) days, \$(\d+)\), (\d+) of (\d+) GiB'
    )
    found = re.search(pattern, text, re.S).groups()
    step_flops = muon['total_flops'] / muon['steps']
    figures = [
        muon['memory']['model_states'] / 2**30,
        adamw['memory']['model_states'] / 2**30,
        muon['optimizer_flops_per_step'],
        100 * muon['optimizer_flops_per_step'] / step_flops,
        step_flops,
        muon['optimizer_step_seconds'],
        muon['step_seconds'],
        100 * muon['mfu_assumed'],
        muon['days'],
        muon['cost_usd'],
        adamw['days'],
        adamw['cost_usd'],
        muon['memory']['total'] / 2**30,
        muon['memory']['gpu_memory'] / 2**30,
    ]
    for figure, text in zip(figures, found):
        if 'e' in text:  # 5.39e13: its mantissa's decimals
            decimals = len(text.split('e')[0].split('.')[1])
            assert f'{figure:.{decimals}e}'.replace('e+', 'e') == text, (figure, text)
        else:
            assert shown(figure, text), (figure, text)


def test_the_readme_bill_of_the_real_run_is_the_ledgers():
    p = sums.predict(*load_config(os.path.join(ROOT, 'configs/h200_1b3.py')))
    days, cost = re.search(r'~([\d.]+) days and ~\$(\d+) on one H200', read('README.md')).groups()
    assert shown(p['days'], days) and cost == f"{round(p['cost_usd'], -1):.0f}"
    days, cost, memory, gpu = re.search(
        r'configs/h200_1b3.py +# the bill first: ~([\d.]+) days, ~\$(\d+), (\d+) of (\d+) GiB',
        read('docs/running.md'),
    ).groups()
    assert shown(p['days'], days) and cost == f"{round(p['cost_usd'], -1):.0f}"
    assert shown(p['memory']['total'] / 2**30, memory) and shown(
        p['memory']['gpu_memory'] / 2**30, gpu
    )
    # the configs' own comments about what fits
    p8 = sums.predict(*load_config(os.path.join(ROOT, 'configs/h100x8_1b3.py')))
    largest = re.search(
        r"the ledger's largest that fits is (\d+)", read('configs/h100x8_1b3.py')
    ).group(1)
    assert int(largest) == p8['max_micro_batch']
    days = re.search(
        r'the bill first: ~([\d.]+) days on 8 GPUs', read('configs/h100x8_1b3.py')
    ).group(1)
    assert shown(p8['days'], days)
