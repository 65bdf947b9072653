"""
test_figures.py: the numbers a user reads are the code's. The ledger and train.py refuse the same plans with the
same line; `ledger.py --book` sums in one unit and labels its rows by the formula it computes; the README's ledger
figures are what `python ledger.py CONFIG` prints today.
"""

import pytest

import ledger_report
import train


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
