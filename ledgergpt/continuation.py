"""
continuation.py: stopping and carrying on, so that train.py's loop reads as the training it is:
train.py's flags and the command that resumes a run; the resume checks; the clean stop; the spike
guard (a loss far above the recent window rolls back and skips the data that led into it).
"""

import contextlib
import dataclasses
import glob
import math
import os
import shlex
import signal
import statistics
import sys
import time
import traceback

import torch
import torch.distributed as dist

from ledgergpt import checkpoint, config, processes
from ledgergpt.config import CONTINUATION_KEYS, DEFAULTS, ConfigError, Terminated, UserError, say
from ledgergpt.processes import barrier, log

USAGE = (
    'usage: python train.py CONFIG [--key=value ...] [--resume[=CKPT_DIR]] '
    '[--allow_change=KEY,...] [--force]'
)


class TrainingStopped(UserError):
    """The run cannot go on (too many loss spikes, the ledger and the model disagree): exit 1."""

    exit_code = 1


def parse_args(argv):
    """argv -> (config path, overrides, resume, force, keys allowed to change on resume); resume is
    False, True (the latest) or a checkpoint folder."""
    config_path, overrides, resume, force, allowed = None, [], False, False, set()
    for arg in argv:
        flag, equals, value = arg.partition('=')
        if flag == '--resume':
            resume = value if equals else True
        elif arg == '--force':
            force = True
        elif flag == '--allow_change' and equals:
            allowed |= {key for key in value.split(',') if key}
            if unknown := sorted(allowed - set(CONTINUATION_KEYS)):
                raise ConfigError(
                    f"--allow_change={','.join(unknown)}: only these keys need it: "
                    f"{', '.join(CONTINUATION_KEYS)}"
                )
        elif arg.startswith('--'):
            overrides.append(arg)
        elif config_path is None:
            config_path = arg
        else:
            raise ConfigError(f"unexpected argument '{arg}': {USAGE}")
    if config_path is None:
        raise ConfigError(f"no config file given: {USAGE}")
    return config_path, overrides, resume, force, allowed


def resume_command(argv, world_size):
    """The command that resumes this run: train.py again on this world size, with --resume."""
    args = [a for a in argv if a.split('=', 1)[0] != '--resume'] + ['--resume']
    if world_size == 1:
        return shlex.join(['python', 'train.py'] + args)
    nodes = world_size // int(os.environ.get('LOCAL_WORLD_SIZE', world_size))
    launcher = f"torchrun --nproc_per_node={world_size // nodes}" + (
        f" --nnodes={nodes} (and the rendezvous options you started with)" if nodes > 1 else ''
    )
    return f"{launcher} {shlex.join(['train.py'] + args)}"


# where a rank's traceback goes when a collective fails (check_out_dir sets it), and since when
FAILURES = {'out_dir': None, 'since': time.time()}


def kept_tracebacks(exception):
    """A failed collective's cause, kept: this rank's traceback in out_dir/rank{R}_error.txt (not
    for a SIGTERM; a write that fails is let go) -> every such file this job's ranks wrote."""
    if FAILURES['out_dir'] is None:
        return []
    name = os.path.join(FAILURES['out_dir'], 'rank{}_error.txt')
    if not isinstance(exception, Terminated):
        with contextlib.suppress(OSError), open(name.format(os.environ.get('RANK', 0)), 'w') as f:
            f.write(''.join(traceback.format_exception(exception)))
    since = FAILURES['since']
    return sorted(path for path in glob.glob(name.format('*')) if os.stat(path).st_mtime >= since)


def rank_lost(exception, argv):
    """config.cli's `stopped`: under torchrun a SIGTERM, or a collective that loses its peer, most
    often means a rank died, where "rerun the same command" would be refused without --resume: ->
    (the line that says so and resumes, and names the ranks' tracebacks, exit code), or None."""
    world, terminated = int(os.environ.get('WORLD_SIZE', 1)), isinstance(exception, Terminated)
    words = ('gloo', 'NCCL', 'Connection')
    lost = isinstance(exception, RuntimeError) and any(word in str(exception) for word in words)
    if world == 1 or not (terminated or lost or isinstance(exception, dist.DistError)):
        return None
    what = 'SIGTERM' if terminated else str(exception).splitlines()[0][:120]
    kept = kept_tracebacks(exception)
    return (
        f"a rank died, or the job was stopped (torchrun stops every rank when one exits; here: "
        f"{what}): the complete checkpoints are kept; resume with: {resume_command(argv, world)}"
        + (f"; the failing ranks' tracebacks: {', '.join(kept)}" if kept else ''),
        128 + signal.SIGTERM if terminated else 1,
    )


@contextlib.contextmanager
def interruptible():
    """Ctrl-C stops the block (or the function it decorates) in one line wherever it lands, even
    with SIGINT inherited ignored. Python drops a KeyboardInterrupt raised in a finalizer (the step
    probe's gc runs torch's weakref callbacks) and the run trained on: it is raised at the end."""
    raised, unraisable = [], sys.unraisablehook

    def interrupt(signum, frame):
        raised.append(KeyboardInterrupt())
        raise raised[-1]

    def report(event):
        if event.exc_value not in raised:
            unraisable(event)

    previous, sys.unraisablehook = signal.signal(signal.SIGINT, interrupt), report
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.unraisablehook = unraisable
    if raised:
        raise raised[-1]


def cli(main):
    """train.py's error wrapper: config.cli's with rank_lost's lines, its main interruptible."""
    return config.cli(interruptible()(main), reports=processes.first_to_fail, stopped=rank_lost)


# --------------------------------------------------------------------------------------------------
# Resume checks.


def check_out_dir(train, resume, stop_step, cluster):
    """-> the checkpoint to resume from (None: start), or 'done' when out_dir holds this run,
    complete. Checkpoints are continued only when asked, never overwritten."""
    FAILURES['out_dir'] = train.out_dir
    found = carried_on_from(train, resume)
    if resume and found is None:
        raise ConfigError(
            f"--resume: no complete checkpoint at {checkpoint.root(train.out_dir)}: run without "
            f"--resume to start"
        )
    if resume:
        return checkpoint.verified(found, '--resume')
    if not found:
        return None
    finished = checkpoint.step_of(found)
    if finished < stop_step:
        raise ConfigError(
            f"{train.out_dir} already holds checkpoints: pass --resume to continue that run, or "
            f"set --out_dir to another folder"
        )
    # like a rerun of prepare.py on a complete folder: nothing left to do
    log(
        cluster,
        f"{train.out_dir}: this run is complete (checkpoint at step {finished:,}, planned "
        f"{stop_step:,}): nothing to train; delete the folder or set --out_dir to train again",
    )
    return 'done'


def keep_budgeted_tokens(train, resume):
    """A run planned by train_minutes fixes its train_tokens at its start (its checkpoints hold
    them): a resume, or a rerun of a complete run, keeps them, and so its schedule."""
    if not train.train_minutes:
        return train
    if train.cooldown_from:
        raise ConfigError(
            'train_minutes plans a run of its own: a cooldown lasts cooldown_tokens; set one of '
            'them'
        )
    path = carried_on_from(train, resume)
    if path is None:
        return train
    saved = checkpoint.read_state(path)['train_config']['train_tokens']
    return dataclasses.replace(train, train_tokens=saved, train_minutes=0.0)


def carried_on_from(train, resume):
    """The checkpoint a run would carry on: --resume's path, else out_dir's latest (or None)."""
    if isinstance(resume, str):
        return checkpoint.find(resume, '--resume')
    return checkpoint.latest(train.out_dir, '--resume')


def cooldown_start(train):
    """A run may start from another run's checkpoint (cooldown_from) and decay the LR over
    cooldown_tokens (docs/overtraining.md): -> that checkpoint's run state, or None."""
    if not train.cooldown_from:
        if train.cooldown_tokens:
            raise ConfigError(
                'cooldown_tokens goes with --cooldown_from: the checkpoint whose LR it decays'
            )
        return None
    if train.cooldown_tokens <= 0:
        raise ConfigError(
            f"cooldown_tokens must be positive for a cooldown, got {train.cooldown_tokens:,}: the "
            f"tokens of its decay (10-20% of those seen at its start: Hägele et al. 2024)"
        )
    if not os.path.isfile(os.path.join(train.cooldown_from, checkpoint.MANIFEST)):
        raise ConfigError(
            f"--cooldown_from={train.cooldown_from} is not a checkpoint folder (with a "
            f"{checkpoint.MANIFEST}): give one of a run's out_dir/ckpt/step_N"
        )
    return checkpoint.read_state(checkpoint.verified(train.cooldown_from))['run']


def carry_on(run, resumed, end_step):
    """A resumed run's state from its own checkpoint, or a cooldown's from another run's, and the
    lines that say so (a cooldown's: its LR's decay)."""
    start_from, train = resumed or run.train.cooldown_from, run.train
    if not start_from:
        return
    saved = checkpoint.load(start_from, run.model, run.optimizer, train.optimizer)
    run.state = state = RunState(**saved['run'])
    log(
        run.cluster,
        f"{'resumed' if resumed else 'cooling down'} from {start_from}: step {state.step}, "
        f"{state.tokens_seen:,} tokens, data position {state.position:,} sequences (written by "
        f"{saved['world_size']} process(es), read by {run.cluster.world_size}: the position is "
        f"global, the stream continues where it stopped)",
    )
    if not resumed:
        log(
            run.cluster,
            f"cooldown: the LR falls linearly from {train.lr:.3g} to "
            f"{train.lr * train.min_lr_ratio:.3g} over steps {run.cooldown[0] + 1:,} to "
            f"{end_step:,} ({train.cooldown_tokens:,} tokens; the ledger above bills these), to "
            f"{state.tokens_seen + train.cooldown_tokens:,} tokens seen",
        )


def check_resumable(path, model_cfg, train, allowed, cluster, action='resume'):
    """A checkpoint continues only its own model, in its parallel mode's format; a changed
    CONTINUATION_KEYS key needs --allow_change=KEY (every change is logged). A key the checkpoint
    lacks (older than the key) had its default. action: what the lines call it."""
    saved = checkpoint.read_state(path)
    now = dataclasses.asdict(model_cfg)
    changed = [k for k, v in now.items() if saved['model_config'].get(k, DEFAULTS[k]) != v]
    if changed:
        raise ConfigError(
            f"{path} was written for another model ({', '.join(changed)} differ): resume with the "
            f"config it was trained with"
        )
    parallel = saved['train_config']['parallel']
    if parallel != train.parallel:
        raise ConfigError(
            f"{path} was written with parallel={parallel}: resume with --parallel={parallel}"
        )
    then = saved['train_config']
    changes = {k: (then.get(k, DEFAULTS[k]), v) for k, v in dataclasses.asdict(train).items()}
    changes = {k: (old, new) for k, (old, new) in changes.items() if old != new}
    changes.pop('dataset_tokens', None)
    refused = [k for k in changes if k in CONTINUATION_KEYS and k not in allowed]
    if refused:
        listed = ', '.join(f'{k} {changes[k][0]!r} -> {changes[k][1]!r}' for k in refused)
        raise ConfigError(
            f"resuming {path} with a changed {listed}: that breaks the exact continuation (data "
            f"order, schedule or optimizer); pass --allow_change={','.join(refused)} if you mean it"
        )
    for key, (old, new) in changes.items():
        fresh = ": its states start afresh" if key == 'optimizer' else ''
        log(cluster, f"{action}: {key} changed from {old!r} to {new!r}{fresh}")


def check_continuation(resume_from, cooldown, model_cfg, train, allowed, cluster):
    """A resumed run continues its own checkpoint, a cooldown another run's (its own keys differ);
    --allow_change goes only with one of the two."""
    if resume_from:
        check_resumable(resume_from, model_cfg, train, allowed, cluster)
    elif cooldown:
        allowed = allowed | {'cooldown_from', 'cooldown_tokens'}
        check_resumable(train.cooldown_from, model_cfg, train, allowed, cluster, 'cooldown')
    elif allowed:
        raise ConfigError(
            '--allow_change goes with --resume or --cooldown_from: it names the keys a continued '
            'run may change'
        )


# --------------------------------------------------------------------------------------------------
# The clean stop.


class Stop:
    """SIGINT and SIGTERM end the run cleanly (docs/running.md), exit 128 + the signal. The ranks
    agree on the step with a one-number host all-reduce a step (gloo)."""

    def __init__(self, cluster):
        self.signal, self.group, self.world_size = None, None, cluster.world_size
        if cluster.world_size > 1:  # every rank creates the group at the same point (a collective)
            on_gpu = cluster.device.type == 'cuda'
            self.group = dist.new_group(backend='gloo') if on_gpu else dist.group.WORLD
        self.previous = {s: signal.signal(s, self.receive) for s in (signal.SIGINT, signal.SIGTERM)}

    def receive(self, signum, frame):
        name = signal.Signals(signum).name
        if signum == self.signal:
            say(f"{name} again: exiting now, without a checkpoint of the steps since the last one")
            os._exit(128 + signum)
        if self.signal is None:
            self.signal = signum
            if int(os.environ.get('RANK', 0)) == 0:
                say(f"{name}: finishing this step, then a checkpoint ({name} again exits at once)")

    def agreed(self):
        """The signal any rank has received, else 0, on every rank after the same step."""
        if self.world_size == 1:
            return self.signal or 0
        flag = torch.tensor([self.signal or 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return int(flag)

    def stopped(self, run, signum):
        """The run stopped, its checkpoint complete: the line that resumes; -> exit code."""
        barrier(run.cluster)
        if run.cluster.is_master:
            say(
                f"stopped by {signal.Signals(signum).name} after step {run.state.step}: checkpoint "
                f"{run.last_checkpoint} is complete; resume with: "
                f"{resume_command(run.argv, run.cluster.world_size)}"
            )
        return 128 + signum

    def restore(self):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


# --------------------------------------------------------------------------------------------------
# The spike guard.


@dataclasses.dataclass
class RunState:
    """What a checkpoint carries besides the weights and the optimizer (checkpoint.py writes it)."""

    step: int = 0  # optimizer steps done
    tokens_seen: int = 0  # tokens trained on (skipped data not counted)
    position: int = 0  # sequences of the train stream consumed, by all ranks together
    rollbacks: int = 0
    loss_window: list = dataclasses.field(default_factory=list)  # recent good losses
    skipped: list = dataclasses.field(default_factory=list)  # [first, end) sequences skipped


def find_spike(pending, values, window, train):
    """The first checked step whose loss is not finite, or above mean + spike_factor x std of the
    window of recent good losses (std at least spike_min_std x mean): -> (its StepResult, loss,
    why). The good ones before it join the window (checkpoints keep it: a resume decides alike)."""
    for result, (loss, _) in zip(pending, values):
        if not math.isfinite(loss):
            return result, loss, 'not finite'
        if len(window) >= train.spike_window:
            mean = statistics.fmean(window)
            std = max(statistics.pstdev(window), train.spike_min_std * mean)
            if loss > mean + train.spike_factor * std:
                return result, loss, f'> mean {mean:.4f} + {train.spike_factor} x std {std:.4f}'
        window.append(loss)
        del window[: -train.spike_window]
    return None


def roll_back(run, spike):
    """PaLM's rewind and skip: back to the last checkpoint, skipping the data from there to the end
    of the spiking step, so the batches that led into it are not seen again."""
    result, loss, why = spike
    train, rollbacks = run.train, run.state.rollbacks + 1
    if rollbacks > train.max_rollbacks:
        raise TrainingStopped(
            f"loss spike at step {result.step} (loss {loss:.4f} {why}) after {run.state.rollbacks} "
            f"rollbacks (max_rollbacks): the run is unstable; lower lr, check the data, or raise "
            f"max_rollbacks"
        )
    saved = checkpoint.load(run.last_checkpoint, run.model, run.optimizer, train.optimizer)
    run.state = RunState(**saved['run'])
    skipped = [run.state.position, result.position]
    run.state.rollbacks, run.state.position = rollbacks, result.position
    run.state.skipped.append(skipped)
    log(
        run.cluster,
        f"step {result.step}: loss spike (loss {loss:.4f} {why}): rollback {rollbacks}/"
        f"{train.max_rollbacks} to {os.path.basename(run.last_checkpoint)}, skipping sequences "
        f"[{skipped[0]:,}, {skipped[1]:,}) of the data stream",
    )
    record = dict(event='rollback', step=result.step, loss=loss, to_step=run.state.step)
    run.metrics.record(record | dict(skipped=skipped, rollbacks=rollbacks))
    run.metrics.restart()
