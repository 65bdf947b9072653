"""
schedule.py: the batch and LR schedule of a run (train.py's step follows it), and the loss curve it
draws: the run's final val loss forecast from its own curve so far and the schedule still ahead.

    python ledger.py configs/pystdlib_cpu.py --forecast out/pystdlib_cpu --train_tokens=5_406_720

The forecast is Tissue et al. 2024's law (arXiv 2408.11029), fitted to the run's train loss at each
eval (train.py prints it, summary.json and report.md keep those made at 10%, 25% and 50% of the run
beside the val loss measured at the end); docs/measured.md has how far it was off on real runs.
"""

import dataclasses
import functools
import itertools
import math
import types

import numpy as np

# One micro-step is a forward/backward of micro_batch sequences of block_size tokens on every rank,
# so it covers micro_batch x block_size x world_size tokens; gradient accumulation repeats it until
# batch_tokens, the global batch, is reached. The global batch is fixed by the config: more ranks
# means fewer micro-steps, not a bigger batch. config.tokens_per_micro_step checks that it is a
# whole number of them, for train.py and the ledger alike.


def batch_tokens_at(tokens_seen, train, micro_step_tokens):
    """The global batch for the next step. GPT-3 style ramp: linear in tokens seen from
    batch_ramp_start to batch_tokens over the first batch_ramp_tokens, rounded down to whole
    micro-steps (GPT-3 went 32K -> 3.2M tokens over its first 4-12B tokens). A small early batch
    is enough while the gradient is large and coherent."""
    if train.batch_ramp_tokens <= 0 or tokens_seen >= train.batch_ramp_tokens:
        return train.batch_tokens
    start, full = train.batch_ramp_start, train.batch_tokens
    ramped = start + (full - start) * tokens_seen / train.batch_ramp_tokens
    return max(micro_step_tokens, int(ramped) // micro_step_tokens * micro_step_tokens)


def planned_steps(train, micro_step_tokens):
    """Optimizer steps to see train_tokens: the length the schedule spans (max_steps may stop the
    run earlier). The ramp is walked step by step (thousands of steps at most)."""
    steps, tokens = 0, 0
    while tokens < min(train.train_tokens, train.batch_ramp_tokens):
        tokens += batch_tokens_at(tokens, train, micro_step_tokens)
        steps += 1
    return steps + max(0, math.ceil((train.train_tokens - tokens) / train.batch_tokens))


def warmup_steps(total_steps, train):
    return max(1, round(train.warmup_frac * total_steps))


def wsd_decay(total_steps, train):
    """wsd: (the first decayed step, the steps of the decay): the last decay_frac of total_steps."""
    decay = max(1, round(train.decay_frac * total_steps))
    return total_steps - decay, decay


def lr_at(step, total_steps, train, cooldown=None):
    """LR for 0-based step `step` of `total_steps`. Linear warmup over warmup_frac of the steps
    (the book: 0.1-0.5%) from lr/warmup to the peak at step warmup-1; then cosine decay (GPT-3,
    LLaMA) or warmup-stable-decay (constant, then a linear decay over the last decay_frac of the
    steps), both ending at min_lr_ratio x peak (10%) on the last step. cooldown: (first step,
    steps) of a cooldown's own linear decay from the peak, whatever the schedule."""
    warmup = warmup_steps(total_steps, train)
    peak, floor = train.lr, train.lr * train.min_lr_ratio
    if step < warmup:
        return peak * (step + 1) / warmup
    if cooldown or train.schedule == 'wsd':
        decay_start, decay = cooldown or wsd_decay(total_steps, train)  # the last step: the floor
        if step < decay_start:
            return peak
        return peak + (floor - peak) * min(1.0, (step - decay_start + 1) / decay)
    progress = min(1.0, (step - warmup + 1) / max(1, total_steps - warmup))  # 1.0 on the last step
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))


# --------------------------------------------------------------------------------------------------
# The loss the schedule draws (Tissue et al. 2024, arXiv 2408.11029): L = L0 + A S1^-alpha - C S2,
# S1 the LRs summed so far (the forward area, in steps at the peak LR), S2 the annealing area: the
# sum of m_i = lam m_(i-1) + (lr_(i-1) - lr_i), each fall of the LR remembered with decay lam. The
# paper's lam = 0.999 remembers ~1,000 steps, short beside its runs; here the memory is 5% of the
# run's steps, at most 1,000 (the CPU default's 330: lam = 0.94; there 0.999 put the forecasts from
# half-way 14% high on two seeds: docs/measured.md). The law is fitted to each log interval's mean
# train loss after warm-up; the val loss is the law plus the evals' mean gap to it.
FORECAST_AT = (0.1, 0.25, 0.5)  # of the run's steps: an eval each, its forecast kept to the end
WHAT_IF = (0.5, 2, 4)  # x the planned tokens, the schedule's shape kept: "26B or 100B?"
MIN_POINTS = 8  # log intervals after warm-up before a fit of the law's 4 parameters
MIN_FALL = 0.1  # of the peak LR, over the points fitted
TOO_WIDE = 0.1  # a 95% interval wider than +-10% of the forecast is said as "not yet"
MEMORY, MEMORY_FRACTION = 1000, 0.05
GOLDEN = (1 + 5**0.5) / 2
SHAPE = ('warmup_frac', 'min_lr_ratio', 'schedule', 'decay_frac')  # what lr_at reads


class NotYet(Exception):
    """Why the run cannot be forecast yet (too few points, in warm-up, no eval, no fit)."""


@dataclasses.dataclass
class Law:
    params: object  # L0, A, alpha, C
    covariance: object
    memory: float  # steps
    gap: float  # the val loss minus the law at the latest eval
    gap_variance: float  # how far the gap moved between evals (their spread), squared
    bits_per_nat: float  # the latest eval's val bits per byte over its val loss (None: no bytes)
    step: int  # the latest eval's


def lrs(total_steps, train, cooldown=None, steps=None):
    """The LRs of steps 0 .. steps-1 (default: all of total_steps) over the peak LR."""
    steps = range(steps or total_steps)
    return np.array([lr_at(s, total_steps, train, cooldown) for s in steps]) / train.lr


def areas(total_steps, train, memory, cooldown=None, steps=None):
    """(S1, S2) after k updates, k = 0 .. steps (entry 0: 0, 0) of lrs' schedule, cached: a
    190K-step run's 4x is 760K calls of lr_at, a second, made once."""
    shape = tuple(getattr(train, key) for key in SHAPE)
    return shape_areas(total_steps, shape, memory, cooldown, steps or total_steps)


@functools.lru_cache(maxsize=16)
def shape_areas(total_steps, shape, memory, cooldown, steps):
    lr = lrs(total_steps, types.SimpleNamespace(lr=1.0, **dict(zip(SHAPE, shape))), cooldown, steps)
    lam, falls = 1 - 1 / memory, -np.diff(lr, prepend=lr[0])  # lr_(i-1) - lr_i
    m = np.fromiter(itertools.accumulate(falls, lambda m, fall: lam * m + fall), float, len(lr))
    return np.concatenate(([0.0], np.cumsum(lr))), np.concatenate(([0.0], np.cumsum(m)))


def law_at(params, s1, s2):
    l0, a, alpha, c = params
    return l0 + a * s1**-alpha - c * s2


def fit_law(ks, y, s1, s2):
    """The law's least squares to the mean losses y of intervals ks (updates done before each step's
    loss) -> (L0, A, alpha, C), their covariance (Gauss-Newton's, as scipy's curve_fit gives it),
    the mean squared residual.
    Given alpha the law is linear in L0, A and C, solved exactly (variable projection): alpha is
    searched, on a grid and then by golden section (numpy only: scipy held 77 MB more)."""
    flat, counts = np.concatenate(ks), np.array([len(k) for k in ks])
    starts = np.cumsum(counts) - counts

    def mean(values):  # over each interval
        return np.add.reduceat(values, starts) / counts

    def solve(alpha):
        design = np.stack([np.ones_like(y), mean(s1[flat] ** -alpha), -mean(s2[flat])], 1)
        coef = np.linalg.lstsq(design, y, rcond=None)[0]
        return float(((design @ coef - y) ** 2).sum()), coef

    grid = np.arange(1, 300) * 0.01  # alpha 0.01 to 2.99
    best = grid[np.argmin([solve(alpha)[0] for alpha in grid])]
    low, high = max(best - 0.01, 1e-3), best + 0.01
    for _ in range(30):  # golden section: the bracket shrinks by 0.618 a step
        left, right = high - (high - low) / GOLDEN, low + (high - low) / GOLDEN
        low, high = (low, right) if solve(left)[0] < solve(right)[0] else (left, high)
    alpha = (low + high) / 2
    ssr, (l0, a, c) = solve(alpha)
    power = s1[flat] ** -alpha
    jacobian = np.stack(
        [np.ones_like(y), mean(power), -a * mean(power * np.log(s1[flat])), -mean(s2[flat])], 1
    )
    covariance = ssr / (len(y) - 4) * np.linalg.inv(jacobian.T @ jacobian)
    return (l0, a, alpha, c), covariance, ssr / len(y)


def fit_run(path, train, end_step, cooldown=None):
    """The law fitted to a run's metrics.jsonl (plot.logged's view: a rolled-back or resumed step's
    later entries dropped) at its latest eval, the run's schedule planned to end_step -> Law."""
    from ledgergpt.plot import logged

    logs, evals, _ = logged(path)
    warmup = warmup_steps(end_step, train)
    evals = [e for e in evals if 'val_loss' in e and e['step'] > warmup]
    steps = sorted(logs)
    # (first step, last step, mean train loss) of each log interval; a loss at step s is that of
    # the weights after s - 1 updates, an eval's after s
    points = []
    for before, step in zip([0, *steps], steps):
        mean = logs[step].get('loss_mean')  # None in older runs: the step's own loss then
        first = step if mean is None else logs[step].get('mean_from') or before + 1
        if first > warmup:
            points.append((first, step, logs[step]['loss'] if mean is None else mean))
    if len(points) < MIN_POINTS:
        raise NotYet(f"{len(points)} log intervals after warm-up, {MIN_POINTS} needed")
    if not evals:
        raise NotYet('no eval after warm-up yet')
    memory = max(1.0, min(MEMORY, MEMORY_FRACTION * end_step))
    s1, s2 = areas(end_step, train, memory, cooldown)
    # C is measured only where the LR fell: a wsd run's stable phase leaves it to any value
    fallen = 1 - np.diff(s1)[points[0][0] - 1 : points[-1][1]].min()  # the LRs over the peak
    if fallen < MIN_FALL:
        raise NotYet(
            f"the LR has fallen {fallen:.0%} from its peak, {MIN_FALL:.0%} needed to "
            "measure what its decay buys"
        )
    ks = [np.arange(first - 1, last) for first, last, _ in points]
    y = np.array([loss for *_, loss in points])
    try:
        params, covariance, mean_square = fit_law(ks, y, s1, s2)
    except np.linalg.LinAlgError as e:
        raise NotYet(f"the law did not fit ({e})") from None
    # the gap at the latest eval; how far it moved between evals, its uncertainty at the end
    gaps = [e['val_loss'] - law_at(params, s1[e['step']], s2[e['step']]) for e in evals]
    spread = np.std(gaps, ddof=1) if len(gaps) > 1 else np.sqrt(mean_square)
    last = evals[-1]
    per_nat = last['val_bpb'] / last['val_loss'] if last.get('val_bpb') else None
    return Law(params, covariance, memory, float(gaps[-1]), spread**2, per_nat, last['step'])


def estimate(law, curve):
    """The val loss the law gives at the end of a schedule's (S1, S2) (areas'): {'steps',
    'val_loss', 'low', 'high' (95%: the fit's covariance by the delta method, and the gap's
    variance), 'val_bpb'}."""
    s1, s2 = (float(area[-1]) for area in curve)
    _, a, alpha, _ = law.params
    gradient = np.array([1.0, s1**-alpha, -a * s1**-alpha * math.log(s1), -s2])
    sigma = math.sqrt(max(0.0, gradient @ law.covariance @ gradient) + law.gap_variance)
    loss = float(law_at(law.params, s1, s2)) + law.gap
    bpb = loss * law.bits_per_nat if law.bits_per_nat else None
    low, high = loss - 1.96 * sigma, loss + 1.96 * sigma
    return dict(steps=len(curve[0]) - 1, val_loss=loss, low=low, high=high, val_bpb=bpb)


def forecast_steps(train, total_steps, stop_step):
    """{step: '25%'} of FORECAST_AT of the run, past warm-up: an eval each, its forecast kept."""
    warmup = warmup_steps(total_steps, train)
    steps = {round(at * stop_step): f'{at:.0%}' for at in FORECAST_AT}
    return {step: at for step, at in steps.items() if step > warmup}


def steps_for(train, tokens, micro_step_tokens):
    return planned_steps(dataclasses.replace(train, train_tokens=int(tokens)), micro_step_tokens)


def forecast(path, train, end_step, micro_step_tokens, cooldown=None):
    """train.py's forecast at its latest eval: the run's end, and for a run that is not a cooldown
    branch its length x WHAT_IF and each branch its `cooldowns` plan (a wsd run: once its own
    decay has begun, MIN_FALL) -> {'step', 'at', 'end_step', the run's end as estimate's,
    'what_if': {'2x': ...}, 'branches': {tokens: ...}, 'not_yet' (why, when too wide)}; or only
    {'not_yet': why} when it cannot be fitted yet."""
    try:
        law = fit_run(path, train, end_step, cooldown)
    except NotYet as e:
        return {'not_yet': str(e)}
    now = law.step
    result = dict(step=now, at=now / end_step, end_step=end_step)
    result.update(estimate(law, areas(end_step, train, law.memory, cooldown)))
    if result['high'] - result['val_loss'] > TOO_WIDE * result['val_loss']:
        wide = result['high'] - result['val_loss']
        result['not_yet'] = f"its 95% interval, +-{wide:.3f} nats, is over {TOO_WIDE:.0%} of it"
    if cooldown:
        return result

    def branch(end, cooldown=None):  # a run of the same shape to `end` steps, or a cooldown of it
        return estimate(
            law, areas(end if cooldown is None else end_step, train, law.memory, cooldown, end)
        )

    result['what_if'] = {
        f'{times:g}x': branch(steps_for(train, times * train.train_tokens, micro_step_tokens))
        for times in WHAT_IF
    }
    result['branches'] = {}
    for tokens in train.cooldowns:
        end = steps_for(train, tokens, micro_step_tokens)
        decay = max(1, round(train.decay_frac * end))
        result['branches'][tokens] = branch(end, (end - decay, decay))
    return result
