"""
continuation.py: stopping and carrying on, so that train.py's loop reads as the training it is (the processes are
processes.py's).

- the command line: train.py's own flags (--resume, --allow_change, --force), and the command that resumes a run;
- resume checks: a checkpoint continues only its own model and parallel mode, and a key that breaks an exact
  continuation (config.CONTINUATION_KEYS) changes only when the user says so;
- the clean stop: Ctrl-C or SIGTERM finishes the step, writes a checkpoint and prints the command that resumes;
- the spike guard: a loss far above the recent window rolls back to the last checkpoint and skips the data that led
  into it (PaLM's rewind and skip).
"""

import dataclasses
import math
import os
import shlex
import signal
import statistics
import sys

import torch
import torch.distributed as dist

from ledgergpt import checkpoint, config, processes
from ledgergpt.config import CONTINUATION_KEYS, DEFAULTS, ConfigError, Terminated, UserError
from ledgergpt.processes import barrier, log

USAGE = "usage: python train.py CONFIG [--key=value ...] [--resume[=CKPT_DIR]] [--allow_change=KEY,...] [--force]"


class TrainingStopped(UserError):
    """The run cannot go on (too many loss spikes, the ledger and the model disagree): one line, exit 1."""

    exit_code = 1


def parse_args(argv):
    """argv -> (config path, overrides, resume, force, keys allowed to change on resume); resume is False, True (the
    latest) or a checkpoint folder."""
    config_path, overrides, resume, force, allowed = None, [], False, False, set()
    for arg in argv:
        if arg == '--resume':
            resume = True
        elif arg.startswith('--resume='):
            resume = arg.split('=', 1)[1]
        elif arg == '--force':
            force = True
        elif arg.startswith('--allow_change='):
            allowed |= {key for key in arg.split('=', 1)[1].split(',') if key}
            unknown = sorted(allowed - set(CONTINUATION_KEYS))
            if unknown:
                raise ConfigError(
                    f"--allow_change={','.join(unknown)}: only these keys need it: {', '.join(CONTINUATION_KEYS)}"
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


def train_command(argv, cluster, drop, *flags):
    """The command that runs train.py again, on this world size: argv less the flags named in drop (--key and
    --key=...), plus flags. With drop {'--resume'} and the flag --resume, the command that continues this run."""
    args = [a for a in argv if a.split('=', 1)[0] not in drop] + list(flags)
    if cluster.world_size == 1:
        return shlex.join(['python', 'train.py'] + args)
    nodes = cluster.world_size // int(os.environ.get('LOCAL_WORLD_SIZE', cluster.world_size))
    launcher = f"torchrun --nproc_per_node={cluster.world_size // nodes}" + (
        f" --nnodes={nodes} (and the rendezvous options you started with)" if nodes > 1 else ''
    )
    return f"{launcher} {shlex.join(['train.py'] + args)}"


def rank_lost(exception, argv):
    """config.cli's `stopped` for train.py. Under torchrun a SIGTERM, or a collective that loses its peer, most often
    means that a rank died: torchrun stops every other rank when one exits, and a rank waiting in a collective loses
    the connection. Rank 0 then said "interrupted (SIGTERM) ... rerun the same command" (which a run without --resume
    refuses) or, in a checkpoint's save, printed tracebacks. -> (the line that says so and gives the command that
    resumes, exit code), or None for anything else."""
    world = int(os.environ.get('WORLD_SIZE', 1))
    lost = isinstance(exception, dist.DistError) or (
        isinstance(exception, RuntimeError)
        and any(word in str(exception) for word in ('gloo', 'NCCL', 'Connection'))
    )
    if world == 1 or not (isinstance(exception, Terminated) or lost):
        return None
    what = 'SIGTERM' if isinstance(exception, Terminated) else str(exception).splitlines()[0][:120]
    # train_command needs the world size
    cluster = processes.Cluster(0, world, 0, torch.device('cpu'))
    return (
        f"a rank died, or the job was stopped (torchrun stops every rank when one exits; here: {what}): the "
        f"complete checkpoints are kept; resume with: {train_command(argv, cluster, {'--resume'}, '--resume')}",
        128 + signal.SIGTERM if isinstance(exception, Terminated) else 1,
    )


cli = config.cli(reports=processes.first_to_fail, stopped=rank_lost)  # train.py's error wrapper


# -----------------------------------------------------------------------------------------------------
# Resume checks.


def check_out_dir(train, resume, stop_step, cluster):
    """-> the checkpoint to resume from (None: start), or 'done' when out_dir already holds this run, complete.
    Checkpoints already in out_dir are continued only when asked, never overwritten silently."""
    if resume:
        path = carried_on_from(train, resume)
        if path is None:
            raise ConfigError(
                f"--resume: no complete checkpoint at {checkpoint.root(train.out_dir)}: run without --resume to start"
            )
        return checkpoint.verified(path, '--resume')
    found = checkpoint.latest(train.out_dir, '--resume')
    if found:
        finished = checkpoint.step_of(found)
        # like a rerun of prepare.py on a complete folder: nothing left to do
        if finished >= stop_step:
            log(
                cluster,
                f"{train.out_dir}: this run is complete (checkpoint at step {finished:,}, planned "
                f"{stop_step:,}): nothing to train; delete the folder or set --out_dir to train again",
            )
            return 'done'
        raise ConfigError(
            f"{train.out_dir} already holds checkpoints: pass --resume to continue that run, or set "
            f"--out_dir to another folder"
        )
    return None


def keep_budgeted_tokens(train, resume):
    """A run planned by train_minutes fixes its train_tokens at its start (live_ledger.spend_minutes:
    from the speed predicted then; its checkpoints hold them, and train_minutes 0): a resume, or a
    rerun of a complete run, keeps them, so its schedule and its end are those it started with."""
    if not train.train_minutes:
        return train
    if train.cooldown_from:
        raise ConfigError(
            'train_minutes plans a run of its own: a cooldown lasts cooldown_tokens; set one of them'
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
    """A run may start from another run's checkpoint (cooldown_from: its weights, AdamW states, step and data
    position) and decay the LR over cooldown_tokens: a wsd run's stable-phase checkpoint so decayed is a finished run
    of that length (Hägele et al. 2024; experiments/overtrain.py takes its branches so). -> the checkpoint's run
    state (step, tokens_seen, ...), or None for a run of its own."""
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


def carried_on(run, start_from, world_size, resumed):
    """The line a run prints once it has loaded the checkpoint it carries on from."""
    state = run.state
    return (
        f"{'resumed' if resumed else 'cooling down'} from {start_from}: step {state.step}, "
        f"{state.tokens_seen:,} tokens, data position {state.position:,} sequences (written by "
        f"{world_size} process(es), read by {run.cluster.world_size}: the position is global, the "
        f"stream continues where it stopped)"
    )


def log_cooldown(run, end_step):
    """A cooldown's first line after its checkpoint is loaded: the LR's decay, from where to where."""
    train, first = run.train, run.cooldown[0] + 1
    log(
        run.cluster,
        f"cooldown: the LR falls linearly from {train.lr:.3g} to {train.lr * train.min_lr_ratio:.3g} over "
        f"steps {first:,} to {end_step:,} ({train.cooldown_tokens:,} tokens; the ledger above "
        f"bills these), to {run.state.tokens_seen + train.cooldown_tokens:,} tokens seen",
    )


def check_resumable(path, model_cfg, train, allowed, cluster, action='resume'):
    """A checkpoint continues only the model it was written for, in its own parallel mode's format; a change to
    a CONTINUATION_KEYS key needs --allow_change=KEY (then it is logged, old and new). A key the checkpoint does not
    hold (it is older than the key) had its default, for the model's keys as for the run's: checkpoints outlive the
    code that wrote them. action: what the log lines call the continuation."""
    saved = checkpoint.read_state(path)
    model_then = {
        k: saved['model_config'].get(k, DEFAULTS[k]) for k in dataclasses.asdict(model_cfg)
    }
    changed = [k for k, v in dataclasses.asdict(model_cfg).items() if model_then[k] != v]
    if changed:
        raise ConfigError(
            f"{path} was written for another model ({', '.join(changed)} differ): resume with the "
            f"config it was trained with"
        )
    if saved['train_config']['parallel'] != train.parallel:
        raise ConfigError(
            f"{path} was written with parallel={saved['train_config']['parallel']}: resume with "
            f"--parallel={saved['train_config']['parallel']}"
        )
    then = {k: saved['train_config'].get(k, DEFAULTS[k]) for k in DEFAULTS if hasattr(train, k)}
    changes = {
        k: (then[k], v)
        for k, v in dataclasses.asdict(train).items()
        if k != 'dataset_tokens' and then[k] != v
    }
    refused = [k for k in changes if k in CONTINUATION_KEYS and k not in allowed]
    if refused:
        listed = ', '.join(f'{k} {changes[k][0]!r} -> {changes[k][1]!r}' for k in refused)
        raise ConfigError(
            f"resuming {path} with a changed {listed}: that breaks the exact continuation (data order, "
            f"schedule or optimizer); pass --allow_change={','.join(refused)} if you mean it"
        )
    for key, (old, new) in changes.items():
        fresh = ": its states start afresh" if key == 'optimizer' else ''
        log(cluster, f"{action}: {key} changed from {old!r} to {new!r}{fresh}")


def check_continuation(resume_from, cooldown, model_cfg, train, allowed, cluster):
    """setup's checks, before the model: a resumed run continues its own checkpoint, a cooldown another run's (the
    same checks, and its own keys differ); --allow_change goes only with one of the two."""
    if resume_from:
        check_resumable(resume_from, model_cfg, train, allowed, cluster)
    elif cooldown:  # continues another run: the same checks, and its own keys differ
        check_resumable(
            train.cooldown_from,
            model_cfg,
            train,
            allowed | {'cooldown_from', 'cooldown_tokens'},
            cluster,
            action='cooldown',
        )
    elif allowed:
        raise ConfigError(
            '--allow_change goes with --resume or --cooldown_from: it names the keys a continued run may change'
        )


# -----------------------------------------------------------------------------------------------------
# The clean stop.


class Stop:
    """SIGINT and SIGTERM (a cluster scheduler's preemption is a SIGTERM; torchrun passes both on to every rank) end
    the run cleanly: the current step finishes, a checkpoint is written, one line gives the command that resumes,
    and the exit code is 128 + the signal's number. The same signal again exits at once (a checkpoint being written
    then stays a tmp_ folder that nothing reads). The ranks agree on the step to stop after with a one-number
    all-reduce on the host each step (a gloo group: no device sync), so none waits in a collective for another."""

    def __init__(self, cluster):
        self.signal, self.group, self.world_size = None, None, cluster.world_size
        if cluster.world_size > 1:  # every rank creates the group at the same point (a collective)
            self.group = (
                dist.new_group(backend='gloo')
                if cluster.device.type == 'cuda'
                else dist.group.WORLD
            )
        self.previous = {s: signal.signal(s, self.receive) for s in (signal.SIGINT, signal.SIGTERM)}

    def receive(self, signum, frame):
        name = signal.Signals(signum).name
        if signum == self.signal:
            print(
                f"{name} again: exiting now, without a checkpoint of the steps since the last one",
                file=sys.stderr,
                flush=True,
            )
            os._exit(128 + signum)
        if self.signal is None:
            self.signal = signum
            if int(os.environ.get('RANK', 0)) == 0:
                print(
                    f"{name}: finishing this step, then a checkpoint ({name} again exits at once)",
                    file=sys.stderr,
                    flush=True,
                )

    def agreed(self):
        """The signal number any rank has received, else 0: every rank gets the same answer after the same step."""
        if self.world_size == 1:
            return self.signal or 0
        flag = torch.tensor([self.signal or 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return int(flag)

    def stopped(self, run, signum):
        """The run stopped by a signal, its checkpoint complete: the line that says how to resume; -> exit code."""
        barrier(run.cluster)
        if run.cluster.is_master:
            print(
                f"stopped by {signal.Signals(signum).name} after step {run.state.step}: checkpoint "
                f"{run.last_checkpoint} is complete; resume with: "
                f"{train_command(run.argv, run.cluster, {'--resume'}, '--resume')}",
                file=sys.stderr,
                flush=True,
            )
        return 128 + signum

    def restore(self):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


# -----------------------------------------------------------------------------------------------------
# The spike guard.


@dataclasses.dataclass
class RunState:
    """What a checkpoint carries besides the weights and the optimizer (checkpoint.py writes it)."""

    step: int = 0  # optimizer steps done
    tokens_seen: int = 0  # tokens trained on (skipped data not counted)
    position: int = 0  # sequences of the train stream consumed, by all ranks together
    rollbacks: int = 0
    # recent good losses, for the spike guard
    loss_window: list = dataclasses.field(default_factory=list)
    # [first, end) sequence ranges skipped after spikes
    skipped: list = dataclasses.field(default_factory=list)


def find_spike(pending, values, window, train):
    """Walk the checked steps in order. The first whose loss is not finite, or above mean + spike_factor x std of
    the window of recent good losses (std floored at spike_min_std x mean), is a spike: -> (its StepResult, loss,
    why). The good ones before it join the window (kept in checkpoints: resume decides alike)."""
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
    """The book's rule (PaLM's rewind and skip): back to the last good checkpoint, and skip the data from there to
    the end of the spiking step, so the batches that led into the spike are not seen again."""
    result, loss, why = spike
    train, rollbacks = run.train, run.state.rollbacks + 1
    if rollbacks > train.max_rollbacks:
        raise TrainingStopped(
            f"loss spike at step {result.step} (loss {loss:.4f} {why}) after {run.state.rollbacks} "
            f"rollbacks (max_rollbacks): the run is unstable; lower lr, check the data, or raise "
            f"max_rollbacks"
        )
    saved = checkpoint.load(run.last_checkpoint, run.model, run.optimizer, run.train.optimizer)
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
    run.metrics.record(
        {
            'event': 'rollback',
            'step': result.step,
            'loss': loss,
            'to_step': run.state.step,
            'skipped': skipped,
            'rollbacks': rollbacks,
        }
    )
    run.metrics.restart()
