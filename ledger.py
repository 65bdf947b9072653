"""
ledger.py: the book's four sums (parameters, FLOPs, days, memory, plus data and cost) for a config,
and a fifth: the communication of a multi-GPU run (Ledger 5: the bytes of each collective, their
seconds, the verdict).

    python ledger.py configs/h200_1b3.py                 # the bill for the config's device
    python ledger.py configs/h200_1b3.py --gpu=H100 --n_gpu=8 --parallel=zero2
    python ledger.py configs/pystdlib_cpu.py --gpu=auto  # this machine: its GPU, or its CPU
    python ledger.py configs/h100x8_1b3.py --n_gpu=16 --nodes=2 --inter_node_busbw=100
    python ledger.py --book                              # BOOK.md's worked examples, recomputed
    python ledger.py configs/pystdlib_cpu.py --forecast out/pystdlib_cpu --train_tokens=5_406_720

The sums are ledgergpt/sums.py's (predict: one JSON-able dict), the text ledgergpt/bill.py's;
BOOK.md lists every formula with its source. Standard library only: a bill for a named GPU needs
nothing installed. --forecast RUN_DIR: that run's final val loss, and under CONFIG's schedule and
length, from its curve so far (ledgergpt/schedule.py's law; numpy).
"""

import json
import os
import sys

from ledgergpt.config import ConfigError, cli
from ledgergpt.sums import book_examples, predict

USAGE = (
    'usage: python ledger.py CONFIG [--key=value ...] [--fit=FIT] [--forecast=RUN_DIR] [--json] '
    '| ledger.py --book'
)


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
    for key in ('--fit', '--forecast'):  # --fit FIT as --fit=FIT (the config's `fit` key)
        if key in argv[:-1]:
            at = argv.index(key)
            argv = [*argv[:at], f'{key}={argv[at + 1]}', *argv[at + 2 :]]
    run_dir = next((a.split('=', 1)[1] for a in argv if a.startswith('--forecast=')), None)
    args = [a for a in argv if a != '--json' and not a.startswith('--forecast=')]
    if not args:
        raise ConfigError(f'no config given ({USAGE})')
    path = None if args[0].startswith('--') else args[0]
    model, train = pretrained.load_config(path, args[1:] if path else args)
    if run_dir:
        print(forecast(run_dir, model, train))
        return 0
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


def forecast(run_dir, model, train):
    """The run's final val loss by the law fitted to its curve so far, and the same law under the
    config's schedule and length (another train_tokens, schedule or decay_frac)."""
    try:
        from ledgergpt import bill, schedule  # the fit needs numpy
    except ImportError as e:
        raise ConfigError(f"--forecast needs {e.name}: pip install -r requirements.txt") from None
    from ledgergpt.config import TrainConfig, tokens_per_micro_step
    from ledgergpt.files import load_json

    planned = os.path.join(run_dir, 'ledger.json')  # what the run planned
    if not os.path.isfile(planned):
        raise ConfigError(f"no ledger.json in {run_dir}: --forecast takes a train.py run's out_dir")
    ran = load_json(planned)
    ran_train = TrainConfig(**ran['train'])
    if ran_train.cooldown_from:
        raise ConfigError(f"{run_dir} is a cooldown branch: give its main run to --forecast")
    step_tokens = ran_train.micro_batch * ran['model']['block_size'] * ran['n_gpu']
    end = schedule.planned_steps(ran_train, step_tokens)
    end = min(end, ran_train.max_steps) if ran_train.max_steps else end
    try:
        law = schedule.fit_run(os.path.join(run_dir, 'metrics.jsonl'), ran_train, end)
    except schedule.NotYet as e:
        raise ConfigError(f"{run_dir} cannot be forecast yet: {e}") from None
    steps = schedule.planned_steps(train, tokens_per_micro_step(model, train, train.n_gpu))
    return '\n'.join(
        f"{what} (step {e['steps']:,}): val loss {bill.estimate_text(e)}"
        for what, e in (
            (
                f'{run_dir} at its planned end, fitted to its curve to step {law.step:,}',
                schedule.estimate(law, schedule.areas(end, ran_train, law.memory)),
            ),
            (
                f"under this config: {train.schedule}, {train.train_tokens:,} tokens",
                schedule.estimate(law, schedule.areas(steps, train, law.memory)),
            ),
        )
    )


if __name__ == '__main__':
    sys.exit(main())
