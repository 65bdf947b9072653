"""
trackers.py: every record live_ledger.Metrics writes to metrics.jsonl also goes to TensorBoard
and/or W&B (the key tracker = 'tensorboard', 'wandb' or both; nanoGPT's wandb_log = True adds W&B),
offline first, from rank 0; a tracker missing or failing is one warning line and the run goes on
without it. The commands that watch a run: docs/after-training.md, "Watching a run".
"""

import functools
import json
import os
import pathlib
import secrets
import shutil
import sys

from ledgergpt import files


def scalars(entry, prefix=''):
    """A metrics.jsonl record -> {name: number}: nested dicts and lists by '/' (val_sources/web/loss
    and an MoE's expert_load[1][3] -> 'expert_load/1/3'), True/False as 1/0; None and text left out.
    'step' stays a value: the trackers' x axis."""
    items = entry.items() if isinstance(entry, dict) else enumerate(entry)
    flat = {}
    for key, value in items:
        name = f'{prefix}{key}'
        if isinstance(value, (dict, list, tuple)):
            flat.update(scalars(value, name + '/'))
        elif isinstance(value, (bool, int, float)):
            flat[name] = int(value) if isinstance(value, bool) else value
    return flat


def values(entry):
    """A record's scalars but its step; an event's (a rollback's) under 'event/'."""
    prefix = f"{entry['event']}/" if 'event' in entry else ''
    return scalars({k: v for k, v in entry.items() if k not in ('step', 'event')}, prefix)


def names(train):
    """The trackers a TrainConfig asks for, in order, each once."""
    asked = [name for name in train.tracker.split(',') if name]
    return list(dict.fromkeys(asked + (['wandb'] if train.wandb_log else [])))


def warn(text):
    print(f"warning: {text}; the run goes on without it", flush=True)


class TensorBoard:
    """Event files in out_dir/tensorboard, every value a float64 scalar (new-style summaries: what
    metrics.jsonl holds, exactly)."""

    def __init__(self, train, prediction, ledger_text, resume):
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self.SummaryWriter, self.folder = SummaryWriter, os.path.join(train.out_dir, 'tensorboard')
        os.makedirs(self.folder, exist_ok=True)
        # an unwritable folder fails here, one warning; in the writer's thread, with a traceback too
        probe = os.path.join(self.folder, f'.probe{os.getpid()}')
        open(probe, 'w').close()
        os.remove(probe)
        self.writer, self.step = None, 0
        config = json.dumps({**prediction['model'], **prediction['train']}, indent=2)
        self.texts = {'config': f'```\n{config}\n```', 'ledger': ledger_text}
        said = f"tracker tensorboard: {self.folder} (tensorboard --logdir {self.folder})"
        print(said, flush=True)

    def open(self, step):
        """A writer whose first event says 'started at step': TensorBoard drops what earlier files
        logged from that step on (the steps a killed run or a rolled-back one did again)."""
        if self.writer is not None:
            self.writer.close()
        self.writer = self.SummaryWriter(self.folder, purge_step=step)

    def log(self, entry):
        step = entry['step']
        if self.writer is None:
            self.open(step)
            for tag, text in self.texts.items():
                self.writer.add_text(tag, text, step)
        # the steps after the checkpoint it went back to are done again
        elif entry.get('event') == 'rollback':
            self.open(entry['to_step'] + 1)
        for tag, value in values(entry).items():
            self.writer.add_scalar(tag, value, step, new_style=True, double_precision=True)
        # on the disk now (log steps only): the dashboard is live, a killed run loses nothing
        self.writer.flush()
        self.step = step

    def finish(self, out_dir):
        if self.writer is None:
            return
        report, picture = os.path.join(out_dir, 'report.md'), os.path.join(out_dir, 'loss.png')
        if os.path.exists(report):
            self.writer.add_text('report', pathlib.Path(report).read_text(), self.step)
        if os.path.exists(picture):
            import matplotlib.image

            image = matplotlib.image.imread(picture)
            self.writer.add_image('loss.png', image, self.step, dataformats='HWC')
        self.writer.close()


class WandB:
    """A W&B run (docs/after-training.md: where, and how a resume continues it). 'step' is the x
    axis of every chart (define_metric): W&B's own _step counts calls, so a step logged again after
    a resume is kept, not refused as out of order."""

    def __init__(self, train, prediction, ledger_text, resume):
        import wandb

        path = os.path.join(train.out_dir, 'trackers.json')
        saved = files.load_json(path) if resume and os.path.exists(path) else {}
        run_id = saved.get('wandb_id') or secrets.token_hex(4)  # 8 characters, as wandb's own ids
        mode = os.environ.get('WANDB_MODE', 'offline')
        # wandb.init hooks it (its hook exits 0 for sys.exit()): finish gives it back
        self.exit = sys.exit
        self.run = wandb.init(
            project=train.wandb_project,
            name=train.wandb_run_name or os.path.basename(os.path.abspath(train.out_dir)),
            id=run_id,
            # offline: `wandb sync` joins the runs of one id
            resume='allow' if mode != 'offline' else None,
            dir=train.out_dir,
            mode=mode,
            config={**prediction['model'], **prediction['train'], 'ledger': prediction},
            # train.py's output is the run's log, untouched
            settings=wandb.Settings(console='off', silent=True),
        )
        self.run.define_metric('step')
        self.run.define_metric('*', step_metric='step')
        files.save_json(path, {**saved, 'wandb_id': run_id})
        where = self.run.dir.rsplit(os.sep + 'files', 1)[0]
        sync = ' (wandb sync DIR uploads it)' if mode == 'offline' else ''
        print(f"tracker wandb: {mode} run {run_id} in {where}{sync}", flush=True)

    def log(self, entry):
        self.run.log({'step': entry['step'], **values(entry)})

    def finish(self, out_dir):
        path = os.path.join(out_dir, 'summary.json')
        if os.path.exists(path):
            self.run.summary['ledger'] = files.load_json(path)
        for name in ('report.md', 'loss.png'):  # the run's files folder is uploaded with it
            if os.path.exists(os.path.join(out_dir, name)):
                shutil.copyfile(os.path.join(out_dir, name), os.path.join(self.run.dir, name))
        self.run.finish()
        sys.exit = self.exit


# name -> class; its pip package has the same name
KINDS = {'tensorboard': TensorBoard, 'wandb': WandB}


class Trackers:
    """The trackers a run asks for, started on rank 0; each call to one that fails is a warning and
    drops it."""

    def __init__(self, train, prediction, ledger_text, resume):
        self.running = {}
        for name in names(train):
            try:
                self.running[name] = KINDS[name](train, prediction, ledger_text, resume)
            except ImportError:
                warn(f"tracker={name} needs {name} (pip install {name})")
            except Exception as e:  # a tracker never stops the run
                warn(f"tracker {name} did not start ({type(e).__name__}: {e})")

    def call(self, method, *args):
        for name, tracker in list(self.running.items()):
            try:
                getattr(tracker, method)(*args)
            except Exception as e:
                warn(f"tracker {name} failed to {method} ({type(e).__name__}: {e})")
                del self.running[name]

    log = functools.partialmethod(call, 'log')

    def finish(self, out_dir):
        self.call('finish', out_dir)
        self.running = {}
