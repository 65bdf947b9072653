"""
test_figures.py: the numbers a user reads are the code's. The ledger and train.py refuse the same plans with the
same line; `ledger.py --book` sums in one unit and labels its rows by the formula it computes; the README's ledger
figures are what `python ledger.py CONFIG` prints today.
"""

import re

import pytest

import ledger
import ledger_report
import train
from config import load_config


@pytest.mark.parametrize(
    'overrides',
    [
        ['--batch_tokens=1000'],
        ['--n_kv_head=4', '--block_size=2048', '--micro_batch=6'],  # 42.67 accumulation steps on one process
    ],
)
def test_the_ledger_and_train_refuse_the_same_plans_with_one_line(overrides, tmp_path, capsys):
    config = 'configs/gpt2_124m.py'
    assert ledger_report.main([config, *overrides]) == 2
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
        assert ledger_report.main([config, *overrides, '--n_gpu=4']) == 2
        assert '= 6 x 2048 x 4 = 49,152 (10.67 accumulation steps)' in capsys.readouterr().err


def test_book_sums_memory_in_one_unit():
    """LLaMA-7B on 2 x A800-80G (the book): its 50.20 'GB' of model states are GiB (16P/2 = 50.205 x 2^30 bytes),
    and so are the figures added to them and the card's 80 'GB' (81,920 MiB): the sum and the spare are in GiB."""
    rows = {row['what']: row for row in ledger_report.book_examples()}
    states = rows['LLaMA-7B model states per GPU, GiB']['value']
    assert states == 16 * ledger.count_params(ledger_report.LLAMA_7B)['total'] / 2 / 2**30
    total = rows['LLaMA-7B total per GPU, GiB']
    assert total['value'] == pytest.approx(states + 6.20 + 3.91 + 6) and total['matches']
    spare = rows['LLaMA-7B spare on an 80 GB card, GiB']
    assert spare['value'] == pytest.approx(ledger.GPUS['A800'].memory_bytes / 2**30 - total['value'])
    assert ledger.GPUS['A800'].memory_bytes == 80 * 2**30 and spare['matches']
    assert not [what for what in rows if what.startswith('LLaMA-7B') and what.endswith(', GB')]


@pytest.mark.parametrize('n_kv_head', [0, 4])  # MHA (0: n_head) and GQA
@pytest.mark.parametrize('config', ['configs/gpt2_124m.py', 'configs/llama_7b.py'])
def test_the_per_layer_row_shows_the_formula_of_its_number(config, n_kv_head, capsys):
    assert ledger_report.main([config, f'--n_kv_head={n_kv_head}']) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith('per layer'))
    count, formula = re.match(r'\s*per layer\s+([\d,]+)\s+(.*)', row).groups()
    model = load_config(config, [f'--n_kv_head={n_kv_head}'])[0]
    H, F, k = model.n_embd, model.ffn_width, model.family.mlp_matrices
    kv_width = model.kv_heads * model.head_dim
    if n_kv_head:
        assert (
            formula.startswith(f"2H^2 + 2H*kv_width + {k}HH' + 2H")
            and f'kv_width = 4 kv heads x {model.head_dim}' in formula
        )
    else:
        assert formula.startswith(f"4H^2 + {k}HH' + 2H") and 'kv_width' not in formula
    weights = 2 * H * H + 2 * H * kv_width + k * H * F + 2 * H  # the formula, evaluated
    biases = 5 * H + 2 * kv_width + F if model.biases else 0  # gpt2: q, k, v, o, up, down, two LayerNorms' biases
    if model.biases:
        assert ("(+ 5H + 2kv_width + H' biases)" if n_kv_head else "(+ 7H + H' biases)") in formula
    assert int(count.replace(',', '')) == weights + biases == ledger.count_params(model)['per_layer']
