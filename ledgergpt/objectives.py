"""
objectives.py: what the model learns to predict (docs/objectives.md, the seeding too; BOOK.md,
"Pretraining objectives"): clm, or prefix_lm, fim or ul2, which transform the packed sequences on
the host: `objective(sequences, first_index) -> (inputs, targets)`, IGNORE_INDEX where no loss.

Context-level, as the FIM paper's appendix recommends: a sequence is cut at its end-of-text tokens
into fragments, each transformed on its own and packed back into the block_size + 1 positions. The
tokens a transform adds (3 sentinels for FIM; a mode token and 2 a span for UL2) push the tail out:
the fragment that no longer fits is transformed from a shorter piece of itself, so every packed
fragment is whole (no sentinel without its span), and the rest is dropped (~3 tokens a fragment for
FIM; a gap UL2 cannot fill is end-of-text tokens without loss). test_objectives.py holds the share
of positions that carry loss to the ledger's sums.loss_fraction.
"""

import bisect
import dataclasses

import numpy as np

from ledgergpt import config, data
from ledgergpt.config import FIM_TOKENS, NEEDS, SENTINELS, UL2_MODES, ConfigError, DataError

# UL2's R and X denoisers, (mean span, share masked) each, by mode (0 is S, prefix LM)
DENOISERS = {1: config.R_DENOISERS, 2: config.X_DENOISERS}
STREAM = 0x6F626A  # 'obj': the generators' middle seed word, apart from the data order's


@dataclasses.dataclass
class Objective:
    """A run's objective: its name, seed, rates (TrainConfig's defaults), the data's token ids."""

    name: str = 'clm'
    seed: int = 0
    eot: int = -1  # the end-of-text token (-1: none, so a sequence is one fragment)
    ids: dict = dataclasses.field(default_factory=dict)  # the special tokens it uses, by name
    fim_rate: float = config.DEFAULTS['fim_rate']
    fim_spm_rate: float = config.DEFAULTS['fim_spm_rate']
    ul2_rates: tuple = tuple(config.DEFAULTS[f'ul2_{mode}_rate'] for mode in 'srx')
    record: list = None  # a list: UL2's R and X fragments append (mode, mean, rate, length, spans)

    def __post_init__(self):
        sentinels = [self.ids[name] for name in SENTINELS if name in self.ids]
        self.sentinels = np.array(sentinels, dtype=np.int64)

    def __call__(self, sequences, first_index):
        return transform(self, sequences, first_index)


CLM = Objective()  # train.py's default: next-token prediction, (s[:-1], s[1:])


def special_ids(meta, data_dir, names, user):
    """{name: id} of the special tokens `names` in a data folder's meta.json; a folder made without
    them is one DataError line naming the command that makes one with them, and `user`."""
    have = meta.get('special_tokens', {})
    missing = [name for name in names if name not in have]
    if missing:
        others = ' (and others)' if len(missing) > 1 else ''
        raise DataError(
            f"{data_dir} has no {missing[0]} token{others}, which {user} needs: its tokenizer was "
            f"made without the special tokens; make a folder with them by rerunning "
            f"`{data.prepare_command(data_dir)}` with another --out (new folders reserve them "
            f"unless --no-special-tokens)"
        )
    return {name: have[name] for name in names}


def build(train, meta):
    """The run's Objective from its TrainConfig and its data folder's meta.json (None for synthetic
    data). Bad input is one line: a ConfigError, or a DataError for a folder without the tokens."""
    name = train.objective
    if name not in config.OBJECTIVES:
        raise ConfigError(f"objective must be one of {', '.join(config.OBJECTIVES)}, not {name!r}")
    rates = (train.ul2_s_rate, train.ul2_r_rate, train.ul2_x_rate)
    if name == 'ul2' and abs(sum(rates) - 1) > 1e-6:
        raise ConfigError(
            f"ul2_s_rate + ul2_r_rate + ul2_x_rate must be 1 (shares of the fragments given each "
            f"denoiser), got {' + '.join(f'{r:g}' for r in rates)} = {sum(rates):g}"
        )
    if NEEDS[name] and meta is None:
        raise ConfigError(
            f"objective={name!r} needs the special tokens of a data folder made by prepare.py; "
            f"data='synthetic' has none"
        )
    if name == 'clm':
        return CLM
    ids = special_ids(meta, train.data, NEEDS[name], f'objective={name!r}') if NEEDS[name] else {}
    eot = meta['eot_id'] if meta else -1
    return Objective(name, train.seed, eot, ids, train.fim_rate, train.fim_spm_rate, rates)


# --------------------------------------------------------------------------------------------------
# The transform, per sequence, per fragment. A fragment function takes (objective, fragment, lead,
# room, rng): lead is 1 if the fragment starts with the end-of-text token (a document's start; the
# first fragment usually continues one from before), room the positions left in the sequence. It
# returns (tokens, loss mask, source tokens used), len(tokens) <= room: the whole fragment when it
# fits, else a piece from its start.


def transform(objective, sequences, first_index):
    """(B, T + 1) sequences, the first at stream index first_index -> (inputs, targets), (B, T)."""
    if objective.name == 'clm':  # exactly what train.py has always done, no copy beyond it
        return np.ascontiguousarray(sequences[:, :-1]), np.ascontiguousarray(sequences[:, 1:])
    tokens = np.empty_like(sequences)
    carries = np.empty(sequences.shape, dtype=bool)
    for row, sequence in enumerate(sequences):
        rng = np.random.default_rng([objective.seed, STREAM, first_index + row])
        tokens[row], carries[row], _ = transform_sequence(objective, sequence, rng)
    # position t predicts token t + 1: the target is IGNORE_INDEX where token t + 1 carries no loss
    targets = np.where(carries[:, 1:], tokens[:, 1:], config.IGNORE_INDEX)
    return np.ascontiguousarray(tokens[:, :-1]), targets


def transform_sequence(objective, sequence, rng):
    """One packed sequence -> (tokens, loss mask, source tokens used), of the sequence's length:
    mask[i] says token i is a target (predicted from tokens[:i]) that carries loss."""
    n, eot = len(sequence), objective.eot
    bounds = np.union1d(np.flatnonzero(sequence == eot), [0, n])  # fragment starts, and the end
    fragment_fn = FRAGMENT_FUNCTIONS[objective.name]
    pieces, masks, room, used = [], [], n, n
    for start, end in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        if room == 0:
            used = start
            break
        lead = int(sequence[start] == eot)
        tokens, mask, taken = fragment_fn(objective, sequence[start:end], lead, room, rng)
        # the end-of-text token ends the document before it: a target under every objective, or the
        # model never learns where a document ends (its own fragment's transform leaves it given)
        mask[:lead] = True
        pieces.append(tokens)
        masks.append(mask)
        room -= len(tokens)
        if taken < end - start:  # the fragment did not fit whole: the rest is left out
            used = start + taken
            break
    if room:  # only UL2 leaves a gap: end-of-text tokens that carry no loss
        pieces.append(np.full(room, eot, dtype=sequence.dtype))
        masks.append(np.zeros(room, dtype=bool))
    return np.concatenate(pieces).astype(sequence.dtype, copy=False), np.concatenate(masks), used


def _as_given(fragment, room, carries):
    """The fragment as it is, cut to the room: every token a target (fim) or none (ul2's rest)."""
    kept = fragment[:room]
    return kept, np.full(len(kept), carries), len(kept)


def _prefix_lm(objective, fragment, lead, room, rng, mode=()):
    """The fragment after its lead and `mode` tokens (UL2's S), cut to the room, then at a uniform
    point with at least one token given: the part after it carries loss."""
    head = np.array([*fragment[:lead], *mode], dtype=fragment.dtype)
    if room < len(head) + 1:  # not even one token more: the rest, given
        return _as_given(fragment, room, False)
    kept = fragment[lead : lead + room - len(head)]
    tokens = np.concatenate((head, kept)).astype(fragment.dtype, copy=False)
    first = max(1, len(head))  # the first target position
    cut = rng.integers(first, len(tokens)) if len(tokens) > first else len(tokens)
    return tokens, np.arange(len(tokens)) >= cut, lead + len(kept)


def _fim(objective, fragment, lead, room, rng):
    """PSM or SPM with probability fim_rate, split at two points drawn uniformly over the fragment's
    tokens. The paper draws them over characters, which would mean decoding and re-encoding every
    fragment on the host at every step and changing the token count the packing is built on. So a
    middle starts and ends on a token boundary (sample.py says what that means for a prompt). Every
    position carries loss, the sentinels too."""
    if rng.random() >= objective.fim_rate or room < lead + 3:
        return _as_given(fragment, room, True)
    pre, suf, mid = (objective.ids[name] for name in FIM_TOKENS)
    doc = fragment[lead : room - 3]  # the three sentinels must fit too
    i, j = np.sort(rng.integers(0, len(doc) + 1, size=2))
    prefix, middle, suffix = doc[:i], doc[i:j], doc[j:]
    if rng.random() < objective.fim_spm_rate:  # SPM, the paper's variant: prefix, middle adjacent
        parts = (fragment[:lead], [pre, suf], suffix, [mid], prefix, middle)
    else:  # PSM
        parts = (fragment[:lead], [pre], prefix, [suf], suffix, [mid], middle)
    tokens = np.concatenate(parts).astype(fragment.dtype, copy=False)
    return tokens, np.ones(len(tokens), dtype=bool), lead + len(doc)


def span_counts(length, mean, rate):
    """T5's random_spans_noise_mask arithmetic: (tokens masked, spans) for `length` >= 2 tokens, at
    least one of each and a kept token between spans. R on 200 tokens: 30 in 10 spans of mean 3."""
    masked = min(max(round(length * rate), 1), length - 1)
    return masked, min(max(round(masked / mean), 1), length - masked)


def _ul2(objective, fragment, lead, room, rng):
    s_rate, r_rate, _ = objective.ul2_rates
    draw = rng.random()
    mode = 0 if draw < s_rate else 1 if draw < s_rate + r_rate else 2
    s_mode = [objective.ids[UL2_MODES[0]]]
    if mode == 0 or room < lead + 5:  # S; or no room for a span, its two sentinels and a kept token
        return _prefix_lm(objective, fragment, lead, room, rng, s_mode)
    mean, rate = DENOISERS[mode][rng.integers(len(DENOISERS[mode]))]
    head = np.array([*fragment[:lead], objective.ids[UL2_MODES[mode]]], dtype=fragment.dtype)

    def size(length):  # packed: head, the input with a sentinel a span, then sentinels and spans
        return len(head) + length + 2 * span_counts(length, mean, rate)[1]

    length = len(fragment) - lead
    if size(length) > room:  # the longest piece that fits (size() grows with the length): bisect
        length = bisect.bisect_right(range(min(length, room) + 1), room, key=size) - 1
    if length < 2:  # nothing to mask
        return _prefix_lm(objective, fragment, lead, room, rng, s_mode)
    doc = fragment[lead : lead + length]
    masked, spans = span_counts(length, mean, rate)
    # alternate kept and masked runs, kept first; each side's lengths a uniform composition (T5)
    runs = np.empty(2 * spans, dtype=np.int64)
    runs[0::2] = _composition(length - masked, spans, rng)
    runs[1::2] = _composition(masked, spans, rng)
    is_masked = np.repeat(np.tile([False, True], spans), runs)
    span_starts, span_lengths = (np.cumsum(runs) - runs)[1::2], runs[1::2]
    sentinel = objective.sentinels[np.arange(spans) % len(objective.sentinels)]  # reused past 16
    corrupted = doc.copy()
    corrupted[span_starts] = sentinel
    keep = ~is_masked
    keep[span_starts] = True
    inputs = corrupted[keep]  # each span collapsed to its sentinel
    if objective.record is not None:
        objective.record.append((mode, mean, rate, length, span_lengths))
    # sentinel, span, sentinel, span ...
    targets = np.insert(doc[is_masked], np.cumsum(span_lengths) - span_lengths, sentinel)
    tokens = np.concatenate((head, inputs, targets)).astype(fragment.dtype, copy=False)
    return tokens, np.arange(len(tokens)) >= len(head) + len(inputs), lead + length


def _composition(total, parts, rng):
    """`total` split into `parts` positive run lengths, every split equally likely (T5's)."""
    cuts = np.sort(rng.choice(total - 1, parts - 1, replace=False)) + 1
    return np.diff(np.concatenate(([0], cuts, [total])))


FRAGMENT_FUNCTIONS = {'prefix_lm': _prefix_lm, 'fim': _fim, 'ul2': _ul2}


# --------------------------------------------------------------------------------------------------
# What a run's log says of its objective (train.py prints it at start-up).

FIM_LINE = (
    "fim: context-level FIM (Bavarian et al. 2022, appendix B.1): each document fragment of a "
    "packed sequence is rearranged on its own, split at tokens, not the paper's characters "
    "(objectives._fim says why)"
)


def describe(objective, stream, count=64):
    """The start-up line for fim (what kind of FIM it is) and ul2 (the spans its R and X denoisers
    get on the run's first `count` sequences: a fragment shorter than a setting needs gets fewer,
    shorter spans, e.g. X's span 64 at 15% on a 256-token fragment is one span of ~38)."""
    if objective.name != 'ul2':
        return FIM_LINE if objective.name == 'fim' else None
    seen = []
    dataclasses.replace(objective, record=seen)(stream.batch(0, count), 0)
    settings = []
    for mode, denoisers in DENOISERS.items():
        for mean, rate in denoisers:
            got = [(n, spans) for *drawn, n, spans in seen if drawn == [mode, mean, rate]]
            if got:
                spans = np.concatenate([s for _, s in got])
                masked = spans.sum() / sum(n for n, _ in got)
                name = f"{'RX'[mode - 1]} (span {mean}, {rate:.0%})"
                settings.append(f"{name}: {spans.mean():.1f}, {masked:.0%} masked")
    block = stream.batch(0, 1).shape[1] - 1
    drawn = '; '.join(settings) or 'no R or X fragment drawn'
    return (
        f"ul2 at block_size {block}: mean span length and share masked as drawn on the first "
        f"{count} sequences: {drawn}"
    )
