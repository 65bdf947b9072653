"""
train.py: pretrain a GPT-2 or Llama model from a config file, on one CPU or on many GPUs.

    python train.py configs/pystdlib_cpu.py                    # a small Llama on the CPU, minutes
    torchrun --nproc_per_node=1 train.py configs/h200_1b3.py   # the book's 1.3B run on one H200
    python train.py CONFIG --max_steps=100 --lr=3e-4 --resume  # overrides; on from ckpt/LATEST

--resume, --allow_change, --force, Ctrl-C, and what a run writes and survives: docs/running.md.
Its sections in the order a run happens; around them data.py, processes.py, continuation.py,
live_ledger.py and checkpoint.py, and a line of hook each for evals.py, sample.py and moe.py.
"""

import contextlib
import dataclasses
import gc
import shlex
import sys

# standard library only: first, so Ctrl-C or SIGTERM during the imports is one line
from ledgergpt import config

if __name__ == '__main__':
    config.quiet_stops()

config.set_cuda_allocator()  # before torch is imported

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

import evals
import sample
from ledgergpt import (
    checkpoint,
    continuation,
    data,
    files,
    live_ledger,
    moe,
    objectives,
    optimizers,
    pretrained,
    processes,
    schedule,
)
from ledgergpt.config import IGNORE_INDEX, sharded, tokens_per_micro_step
from ledgergpt.processes import log
from ledgergpt.schedule import batch_tokens_at, lr_at, planned_steps
from model import GPT

# --------------------------------------------------------------------------------------------------
# 1. The batch and the LR schedule (the book's training recipe): ledgergpt/schedule.py, whose
# batch_tokens_at and lr_at the step below follows, and whose law forecasts the loss they draw.


# --------------------------------------------------------------------------------------------------
# 2. Model and optimizer. The model is built on the meta device (no memory, no init) then
# materialised on the device and initialised from the seed: the same weights on every rank, whatever
# the world size, which is what makes 2 ranks train like 1 (it needs the full fp32 model on each
# device for a moment: fine up to ~30B on 80 GB GPUs). processes.parallelize spreads it; the
# optimizer is its config.OPTIMIZERS row's, built by optimizers.py from the raw model's names.


def build_model(model_cfg, train, cluster, dtype):
    """-> (model to call, raw GPT). Under FSDP the raw GPT is the sharded root itself."""
    torch.manual_seed(train.seed)
    with torch.device('meta'):
        model = GPT(model_cfg)
    model.to_empty(device=cluster.device)
    model.init_weights()
    if train.init_from:  # a published model's weights; a resumed run's checkpoint replaces them
        pretrained.load_weights(model, train.init_from)
    model.recompute = train.recompute  # activation checkpointing per block: one extra forward
    for layer in model.moe:  # MoE: the sequence-wise balance loss's coefficient (0: off)
        layer.aux_loss_coef = train.aux_loss_coef
    return processes.parallelize(model, train, cluster, dtype), model


def clip_gradients(params, max_norm):
    """Scale all gradients so their global L2 norm is at most max_norm (the book: 1.0; 0: no
    clipping). Under FSDP the gradients are DTensor shards: the norm of the shards is a partial
    sum that full_tensor() reduces over the ranks (as torchtitan does). -> the norm before
    clipping, on the device (reading it would sync)."""
    norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


# --------------------------------------------------------------------------------------------------
# 3. Eval: the val loss, the run's own measure (HellaSwag, ARC and MMLU are evals.py's, its section
# "During training"; the text samples sample.py's sample_text).


@torch.no_grad()
def evaluate(run, val, data_dir):
    """-> (mean loss over the fixed val sequences `val` (of the data in `data_dir`), UTF-8 bytes per
    token of the targets scored: bits per byte's exact denominator, None on synthetic data). Rank r
    takes the r-th of world_size equal slices (all ranks run the same number of forwards, which
    FSDP's collectives need). Whole micro-batches only: one more shape, one more compile."""
    cluster, micro_batch = run.cluster, run.train.micro_batch
    run.model.eval()
    per_rank = len(val) // cluster.world_size
    if per_rank >= micro_batch:
        per_rank -= per_rank % micro_batch
    mine = val[cluster.rank * per_rank : (cluster.rank + 1) * per_rank] if per_rank else val[:1]
    totals = torch.zeros(3, device=cluster.device, dtype=torch.float64)  # loss x rows, rows, bytes
    for i in range(0, len(mine), micro_batch):
        chunk = mine[i : i + micro_batch]
        x = data.to_device(np.ascontiguousarray(chunk[:, :-1]), cluster.device)
        y = data.to_device(np.ascontiguousarray(chunk[:, 1:]), cluster.device)
        with run.autocast:
            _, loss = run.model(x, y)
        totals[0] += loss.double() * len(chunk)
        totals[1] += len(chunk)
        totals[2] += data.target_bytes(data_dir, chunk[:, 1:]) if run.meta else 0  # on the host
    run.model.train()
    if cluster.world_size > 1:
        dist.all_reduce(totals)
    loss_rows, rows, text_bytes = totals.tolist()
    return loss_rows / rows, text_bytes / (rows * run.model_cfg.block_size) if run.meta else None


# --------------------------------------------------------------------------------------------------
# 4. Setup: config, processes, data, the live ledger, model, optimizer, resume. Every input check
# comes before the process group and the model, so bad input costs a second.


@dataclasses.dataclass
class Run:
    """What the loop works with. bench.py builds one too (synthetic data, no outputs)."""

    model_cfg: object
    train: object
    cluster: processes.Cluster
    autocast: object  # bf16 autocast, or a null context (fp32, or FSDP2's own mixed precision)
    stream: object  # the train data: data.ShardStream or data.SyntheticStream
    model: torch.nn.Module  # what the loop calls: DDP, FSDP2 or the model itself
    raw_model: GPT  # the GPT inside (for samples and checkpoints)
    optimizer: torch.optim.Optimizer
    params: list  # the trainable parameters, listed once: no per-step walk over the modules
    micro_step_tokens: int  # tokens of one micro-step on all ranks together
    total_steps: int  # the steps the schedule spans (train_tokens)
    stop_step: int  # where this run stops (max_steps, or where a cooldown ends)
    state: continuation.RunState = dataclasses.field(default_factory=continuation.RunState)
    val: np.ndarray = None  # the val sequences, (n, block_size + 1); a mixture's: {source: them}
    meta: dict = None  # the data folder's meta.json (None for synthetic data)
    metrics: live_ledger.Metrics = None
    last_checkpoint: str = None  # the rollback target
    tokenizer: object = None  # for text samples and HellaSwag, when the run makes them
    hellaswag: list = None  # HellaSwag's items (evals.py), when hellaswag_every is set
    eval_tasks: dict = None  # {task: its items} (evals.py), when eval_tasks_every is set
    objective: objectives.Objective = dataclasses.field(default_factory=lambda: objectives.CLM)
    cooldown: tuple = None  # (first step, steps) of the LR's decay when cooling down another run
    argv: list = dataclasses.field(default_factory=list)  # for the commands it prints
    forecast_steps: dict = dataclasses.field(default_factory=dict)  # {step: '25%'}: an eval each


def build_run(model_cfg, train, cluster, dtype, stream, total_steps, stop_step, **fields):
    """The model, its parallel wrapper, the optimizer and the autocast (bf16 matmuls, fp32 weights
    and reductions: FSDP2 gets the same from its policy) as a Run, other fields as keywords."""
    bf16 = dtype == 'bfloat16' and not sharded(train.parallel, cluster.world_size)
    autocast = contextlib.nullcontext()
    if bf16:
        autocast = torch.autocast(cluster.device.type, dtype=torch.bfloat16)
    model, raw_model = build_model(model_cfg, train, cluster, dtype)
    optimizer = optimizers.build(raw_model, train, cluster.world_size, dtype)  # its row's
    params = [p for p in model.parameters() if p.requires_grad]
    micro_step_tokens = train.micro_batch * model_cfg.block_size * cluster.world_size
    parts = (model_cfg, train, cluster, autocast, stream, model)
    steps = (micro_step_tokens, total_steps, stop_step)
    return Run(*parts, raw_model, optimizer, params, *steps, **fields)


def setup(argv, held=None):
    """-> a Run, or None when there is nothing to do. `held` (an ExitStack) keeps, for the run,
    rank 0's lock on out_dir and the translation of a full disk into one line; without it (a tool
    or a test that inspects a run's state), neither."""
    locking = held is not None
    held = held or contextlib.ExitStack()  # a tool's own, never closed: so no lock goes into it
    config_path, overrides, resume, force, allowed = continuation.parse_args(argv)
    model_cfg, train = pretrained.load_config(config_path, overrides)  # init_from: its config.json
    train = continuation.keep_budgeted_tokens(train, resume)  # train_minutes: the plan it made
    cluster = processes.setup_cluster()
    micro_step_tokens = tokens_per_micro_step(model_cfg, train, cluster.world_size)
    cooldown, start = None, continuation.cooldown_start(train)  # its checkpoint's step and tokens
    if start:  # the LR falls from the peak to the floor over cooldown_tokens (Hägele et al. 2024)
        end = dataclasses.replace(train, train_tokens=start['tokens_seen'] + train.cooldown_tokens)
        cooldown = start['step'], planned_steps(end, micro_step_tokens) - start['step']
    if cluster.is_master and locking:  # under torchrun, a rank that stops here stops them all
        held.enter_context(files.folder_lock(train.out_dir, shlex.join(['train.py', *argv])))
    total_steps = planned_steps(train, micro_step_tokens)
    end_step = sum(cooldown) if cooldown else total_steps
    stop_step = min(end_step, train.max_steps) if train.max_steps else end_step
    stream, val, meta = data.open_data(model_cfg, train)
    if meta:  # bits per byte's token bytes, built now: a missing package stops the first seconds,
        # not the first eval 250 steps in
        for source in meta.get('sources', {}).values() or [dict(folder=train.data)]:
            data.byte_lengths(source['folder'])
    objective = objectives.build(train, meta)  # its keys and the folder's special tokens checked
    # the ledger's "is the dataset big enough": the real count
    if meta and not train.dataset_tokens:
        train = dataclasses.replace(train, dataset_tokens=meta['train_tokens'])
    resume_from = continuation.check_out_dir(train, resume, stop_step, cluster)
    if resume_from == 'done':
        return None
    continuation.check_continuation(resume_from, cooldown, model_cfg, train, allowed, cluster)
    processes.join_process_group(cluster, train.collective_timeout_s)
    torch.manual_seed(train.seed)
    if cluster.device.type == 'cuda':
        torch.set_float32_matmul_precision('high')  # fp32 matmuls (outside autocast) may use TF32

    # The ledger for this exact run (this device, world size and model), printed short.
    trainer = (build_run, train_step)  # the step probe times the run's own step
    prediction, dtype = live_ledger.predict(
        config_path, model_cfg, train, cluster, force, cooldown, trainer
    )
    if train.train_minutes:  # the tokens its minutes buy at the predicted speed, fixed from now on
        train = live_ledger.spend_minutes(train, prediction, cluster)
        total_steps = end_step = planned_steps(train, micro_step_tokens)
        stop_step = min(end_step, train.max_steps) if train.max_steps else end_step
    if cluster.is_master and (line := objectives.describe(objective, stream)):  # fim, ul2's spans
        log(cluster, line)
    held.enter_context(files.disk_errors(train.out_dir, prediction['data']['checkpoint_bytes']))
    fields = dict(val=val, meta=meta, last_checkpoint=resume_from, cooldown=cooldown)
    fields.update(objective=objective, argv=list(argv))
    fields.update(forecast_steps=schedule.forecast_steps(train, total_steps, stop_step))
    run = build_run(model_cfg, train, cluster, dtype, stream, total_steps, stop_step, **fields)
    return first_state(run, prediction, resume_from, end_step, force, locking)


def first_state(run, prediction, resume_from, end_step, force, locking):
    """The live ledger's checks of the built model and its first step (each a one-line stop, or
    --force); the run's first state: its own checkpoint's, or a cooldown's start from another's, or
    a step-0 checkpoint to roll back to; the tokenizer and the evals' items it will need."""
    train, cluster = run.train, run.cluster
    built = live_ledger.params_built(run.raw_model, prediction, force, cluster)  # or it stops here
    bytes_per_token = run.meta.get('bytes_per_token') if run.meta else None
    # the loss forecast's: the run's schedule, and the steps whose forecasts summary.json keeps
    plan = dict(plan=(run.stop_step, run.micro_step_tokens, run.cooldown), kept=run.forecast_steps)
    run.metrics = live_ledger.Metrics(
        cluster, train, prediction, built, bool(resume_from), bytes_per_token, **plan
    )
    live_ledger.measure_first_step(run, force)  # its FLOPs and model states, for report.md
    if cluster.is_master and locking:
        live_ledger.record_code(train.out_dir)
    continuation.carry_on(run, resume_from, end_step)  # a resume, or a cooldown of another run
    if not resume_from:  # something to roll back to in this run's own folder
        save_checkpoint(run)
    if (train.sample_tokens or train.hellaswag_every or train.eval_tasks_every) and run.meta:
        run.tokenizer = data.load_tokenizer(train.data)
    evals.items_for_training(run)  # HellaSwag's, ARC's and MMLU's, when the run scores them
    log(cluster, live_ledger.plan_line(run))
    return run


def save_checkpoint(run):
    saved = {'run': run.state, 'model_config': run.model_cfg, 'train_config': run.train}
    train_state = {key: dataclasses.asdict(value) for key, value in saved.items()}
    keep = dict(keep=run.train.keep_ckpts, kept_steps=run.train.keep_steps)
    run.last_checkpoint = checkpoint.save(
        run.train.out_dir, run.state.step, run.model, run.optimizer, train_state, **keep
    )


# --------------------------------------------------------------------------------------------------
# 5. The step: accumulate gradients over micro-steps, clip, update. Nothing is read back from the
# device: the loss and the gradient norm stay there until the loop next needs them.


@dataclasses.dataclass
class StepResult:
    step: int
    loss: torch.Tensor  # the step's mean loss (this rank's share x world size: the ranks' mean)
    grad_norm: torch.Tensor
    position: int  # the data position after this step
    lr: float
    batch_tokens: int


def train_step(run):
    state, train, cluster = run.state, run.train, run.cluster
    lr = lr_at(state.step, run.total_steps, train, run.cooldown)
    for group in run.optimizer.param_groups:
        group['lr'] = lr
    batch_tokens = batch_tokens_at(state.tokens_seen, train, run.micro_step_tokens)
    accumulation = batch_tokens // run.micro_step_tokens
    rows, objective = train.micro_batch, run.objective
    batches = [
        data.micro_batch_arrays(run.stream, state.position, i, cluster, rows, objective)
        for i in range(accumulation)
    ]
    # The loss is the mean over every target that carries loss in the step, on all ranks together
    # (torchtitan's normalisation): under prefix_lm or ul2 the micro-batches carry different counts,
    # and a mean of per-micro-batch means would weigh a target by its micro-batch. Counted on the
    # host, summed over ranks on the device (no sync); DDP and FSDP average the gradients over the
    # ranks, so each rank's sum is scaled by world size / count.
    carrying = sum(int((y != IGNORE_INDEX).sum()) for _, y in batches)
    carrying = data.to_device(np.array(carrying), cluster.device)
    if cluster.world_size > 1:
        dist.all_reduce(carrying)
    scale = cluster.world_size / carrying.float()
    loss_sum = torch.zeros((), device=cluster.device)
    for micro_step, (x, y) in enumerate(batches):
        x, y = data.to_device(x, cluster.device), data.to_device(y, cluster.device)
        # DDP all-reduces gradients on every backward unless told not to: only the last micro-step
        # syncs. (FSDP2 reduce-scatters every micro-step and accumulates sharded gradients.)
        last = micro_step == accumulation - 1
        syncs = not hasattr(run.model, 'no_sync') or last
        with contextlib.nullcontext() if syncs else run.model.no_sync():
            with run.autocast:
                _, loss = run.model(x, y, reduction='sum')  # no logits back: none stay alive
            loss = loss * scale
            loss.backward()
        loss_sum += loss.detach()
    grad_norm = clip_gradients(run.params, train.grad_clip)
    run.optimizer.step()
    moe.update_router_bias(run.raw_model, train.router_bias_speed)  # MoE: outside the gradient
    run.optimizer.zero_grad(set_to_none=True)
    state.position += accumulation * cluster.world_size * train.micro_batch
    state.tokens_seen += batch_tokens
    state.step += 1
    return StepResult(state.step, loss_sum, grad_norm, state.position, lr, batch_tokens)


# --------------------------------------------------------------------------------------------------
# 6. The loop: the step, then what it calls for. Only log, eval, checkpoint and sample steps read
# the losses back from the device (the one host-device sync), guard them against spikes and act;
# the other steps go straight on.


def due_after(run, stopping):
    """What the step just done calls for (a set of names); after a signal: log and checkpoint."""
    step, train, done = run.state.step, run.train, run.state.step == run.stop_step
    if stopping:
        saved = checkpoint.step_of(run.last_checkpoint) == step
        return {'log'} | (set() if saved else {'checkpoint'})
    every = dict(log=train.log_every, eval=train.eval_every, checkpoint=train.ckpt_every)
    every.update(hellaswag=train.hellaswag_every, tasks=train.eval_tasks_every)
    due = {what for what, n in every.items() if n and (step % n == 0 or done)}
    if train.eval_every and step in run.forecast_steps:
        due.add('eval')  # the forecasts the run keeps to check at its end
    if step in train.keep_steps:
        due.add('checkpoint')
    if train.sample_every and step % train.sample_every == 0 and run.tokenizer and not done:
        due.add('sample')
    return due


def eval_step(run, step, tokens):
    """The val loss (a mixture's: each source's val set alone, then their weighted total) into
    metrics.jsonl, the log and summary.json."""
    if isinstance(run.val, dict):
        sources = run.meta['sources']
        scored = {
            name: evaluate(run, val, sources[name]['folder']) for name, val in run.val.items()
        }
        val_loss, val_bytes_per_token = run.metrics.record_sources(step, tokens, scored, sources)
    else:
        val_loss, val_bytes_per_token = evaluate(run, run.val, run.train.data)
    run.metrics.log_val(step, tokens, val_loss, val_bytes_per_token)


def loop(run):
    stop = continuation.Stop(run.cluster)  # from here SIGINT and SIGTERM end with a checkpoint
    try:
        gc.collect()
        gc.freeze()  # the start-up objects live all run: keep the collector from scanning them
        pending = []  # the steps not read back yet: their losses and norms are still on the device
        run.metrics.start_clock()
        while run.state.step < run.stop_step:
            pending.append(train_step(run))
            run.metrics.count(pending[-1], run.state.tokens_seen)
            stopping = stop.agreed()  # a signal on any rank: every rank stops after this step
            due = due_after(run, stopping)
            if not due:
                continue  # the hot path: nothing read back from the device
            run.metrics.stop_clock()
            values = torch.stack([torch.stack((r.loss, r.grad_norm.float())) for r in pending])
            values = processes.reduce_mean(values, run.cluster).tolist()  # [(loss, grad norm)]
            spike = continuation.find_spike(pending, values, run.state.loss_window, run.train)
            step, tokens, (loss, grad_norm) = run.state.step, run.state.tokens_seen, values[-1]
            if spike:  # back to the last checkpoint, the data that led into the spike skipped
                continuation.roll_back(run, spike)
                due = set()
            if 'log' in due:
                steps = run.stop_step if run.cooldown else run.total_steps
                # the mean loss of the steps read back now: the forecast's fit's point
                mean = (sum(loss for loss, _ in values) / len(values), pending[0].step)
                run.metrics.log_step(pending[-1], steps, tokens, loss, grad_norm, mean)
                if run.raw_model.moe:  # MoE: each expert's load, its CV and the router biases
                    moe_stats = live_ledger.router_stats(run.raw_model)
                    run.metrics.record({'step': step, 'tokens': tokens, **moe_stats})
            if 'hellaswag' in due:
                evals.evaluate_hellaswag(run)
            if 'tasks' in due:
                evals.evaluate_tasks(run)
            if 'eval' in due:
                eval_step(run, step, tokens)
            if 'checkpoint' in due:
                save_checkpoint(run)
            if 'sample' in due:
                log(run.cluster, f"step {step} sample:\n{sample.sample_text(run)}")
            pending = []
            if stopping:
                run.metrics.write_summary(run.state.step, run.state.tokens_seen)
                return stop.stopped(run, stopping)
            run.metrics.start_clock()
        run.metrics.stop_clock()
        if run.tokenizer is not None:
            log(run.cluster, f"sample after {run.state.step} steps:\n{sample.sample_text(run)}")
        log(
            run.cluster,
            f"done: {run.state.step} steps, {run.state.tokens_seen:,} tokens; "
            f"{run.train.out_dir}/report.md has the predicted-vs-measured table",
        )
        processes.barrier(run.cluster)  # no rank tears the group down while another talks (gloo)
        return 0
    finally:
        stop.restore()
        run.metrics.close()  # the trackers get report.md and loss.png, and close


@continuation.cli
def main(argv):
    run = None
    try:
        with contextlib.ExitStack() as held:  # rank 0's lock on out_dir; a full disk as one line
            run = setup(argv, held)
            return 0 if run is None else loop(run)
    finally:
        del run  # the model, its DDP reducer and the optimizer go first (leave_process_group: why)
        processes.leave_process_group()


if __name__ == '__main__':
    sys.exit(main())
