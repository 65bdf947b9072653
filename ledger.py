"""
ledger.py: the book's four sums (parameters, FLOPs, days, memory, plus data and cost) for a config,
and a fifth: the communication of a multi-GPU run (Ledger 5: the bytes of each collective, their
seconds, the verdict).

    python ledger.py configs/h200_1b3.py                 # the bill for the config's device
    python ledger.py configs/h200_1b3.py --gpu=H100 --n_gpu=8 --parallel=zero2
    python ledger.py configs/pystdlib_cpu.py --gpu=auto  # this machine: its GPU, or its CPU
    python ledger.py configs/h100x8_1b3.py --n_gpu=16 --nodes=2 --inter_node_busbw=100
    python ledger.py --book                              # BOOK.md's worked examples, recomputed

The sums are ledgergpt/sums.py's (predict: one JSON-able dict), the text ledgergpt/bill.py's;
BOOK.md lists every formula with its source. Standard library only: a bill for a named GPU needs
nothing installed.
"""

import json
import sys

from ledgergpt.config import ConfigError, cli
from ledgergpt.sums import book_examples, predict

USAGE = 'usage: python ledger.py CONFIG [--key=value ...] [--fit=FIT] [--json] | ledger.py --book'


@cli
def main(argv):
    from ledgergpt import bill, pretrained  # init_from: the model's shape from its config.json

    if argv and argv[0] in ('-h', '--help'):
        print(__doc__.strip() + '\n\n' + USAGE)
        return 0
    if '--book' in argv:
        if argv != ['--book']:
            raise ConfigError('--book takes no other arguments')
        print(bill.format_book(book_examples()))
        return 0
    as_json = '--json' in argv
    if '--fit' in argv[:-1]:  # --fit FIT, as --fit=FIT: the config's `fit` key
        at = argv.index('--fit')
        argv = [*argv[:at], f'--fit={argv[at + 1]}', *argv[at + 2 :]]
    args = [a for a in argv if a != '--json']
    if not args:
        raise ConfigError(f'no config given ({USAGE})')
    path = None if args[0].startswith('--') else args[0]
    model, train = pretrained.load_config(path, args[1:] if path else args)
    prediction = predict(model, train)
    text = bill.format_report(prediction)
    if train.fit:  # the loss the plan buys, by a scaling law fitted to our own runs (scaling.py)
        from ledgergpt import scaling

        fitted = scaling.load_fit(train.fit)
        title, rows = scaling.bill_section(fitted, prediction)
        warnings = scaling.warnings(
            fitted, prediction, train.data, scaling.tokenizer_of(train.data)
        )
        prediction['fit'] = {**scaling.check(fitted, prediction), 'warnings': warnings}
        text += '\n'.join(['', '', title, *(bill.line(*row) for row in rows), *warnings])
    print(json.dumps(prediction, indent=2) if as_json else text)
    return 0


if __name__ == '__main__':
    sys.exit(main())
