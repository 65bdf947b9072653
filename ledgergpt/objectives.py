"""
objectives.py: what the model learns to predict. The book's pretraining tasks (BOOK.md, "Pretraining objectives"):

    clm        next-token prediction at every position: the default, and exactly train.py's (x, y) = (s[:-1], s[1:])
    prefix_lm  each document fragment cut at a uniform point: the first part is given, only the second carries loss
               (attention stays causal); the end-of-text token that ends the document before it carries loss too
    fim        context-level fill-in-the-middle (Bavarian et al. 2022, "Efficient Training of Language Models to
               Fill in the Middle", appendix B.1): fim_rate of the fragments become <pre> prefix <suf> suffix
               <mid> middle (PSM), or in SPM order <pre> <suf> suffix <mid> prefix middle; every position carries
               loss, as in the paper; split at tokens, not the paper's characters (_fim says why)
    ul2        UL2's mixture of denoisers (Tay et al. 2022): each fragment gets S (prefix LM), R (15% of the tokens
               masked in spans of mean 3) or X (long spans of 64, or 50% masked), with a mode token at its start;
               a masked span is one sentinel in the input, and the targets (sentinel, span, sentinel, span ...)
               follow the input in the same sequence; only they carry loss (and the end-of-text token, as in
               prefix_lm)

The transform runs on the host per micro-batch, on the train stream's packed sequences (block_size + 1 tokens,
every document led by the end-of-text token): `objective(sequences, first_index) -> (inputs, targets)`, each
(B, block_size), a target of IGNORE_INDEX carrying no loss. It is a pure function of (the sequence's tokens, its
global index in the stream, the seed): sequence k draws from its own generator seeded by (seed, k), so a resumed
run transforms every sequence as the uninterrupted run did, and the ranks, which read disjoint sequences, draw
disjoint randomness without talking to each other.

Context-level, as the FIM paper's appendix recommends over document-level: the sequence is cut at its end-of-text
tokens into document fragments, each fragment is transformed on its own, and the results are packed back into the
sequence's block_size + 1 positions. The tokens a transform adds (3 sentinels for FIM; a mode token and 2 per span
for UL2) push the sequence's tail out: the fragment that no longer fits whole is transformed from a shorter piece
of itself, so every packed fragment is complete (no sentinel without its span, no middle without its sentinel),
and what is left over is dropped (~3 tokens a fragment for FIM; the rare gap UL2 cannot fill is padded with
end-of-text tokens that carry no loss). The special tokens' ids come from the data folder's meta.json
(config.SPECIAL_TOKENS, by name). The expected share of the positions that carry loss is the ledger's arithmetic
(sums.loss_fraction), which test_objectives.py holds to these transforms.
"""

import dataclasses

import numpy as np

from ledgergpt.config import (
    DEFAULTS,
    FIM_TOKENS,
    IGNORE_INDEX,
    NEEDS,
    OBJECTIVES,
    R_DENOISERS,
    SENTINELS,
    UL2_MODES,
    X_DENOISERS,
    ConfigError,
    DataError,
)

# The config keys are TrainConfig's (config.py: objective, fim_rate, fim_spm_rate, ul2_s_rate, ul2_r_rate,
# ul2_x_rate), with their defaults. FIM: the paper's rate 0.5 (its "FIM for free" holds up to 0.9) and half of
# those SPM (its joint PSM+SPM training). UL2: half S, as U-PaLM's decoder-only UL2R mixture, so left-to-right
# prediction stays half the diet; R and X share the rest.

STREAM = 0x6F626A  # 'obj': the generators' middle seed word, apart from the data order's ([seed, epoch, ...])


@dataclasses.dataclass
class Objective:
    """A run's objective: its name, rates, seed and the data folder's token ids. Call it on a micro-batch."""

    name: str = 'clm'
    seed: int = 0
    eot: int = -1  # the end-of-text token (-1: none, so a sequence is one fragment)
    # the special tokens this objective uses, by name
    ids: dict = dataclasses.field(default_factory=dict)
    fim_rate: float = DEFAULTS['fim_rate']
    fim_spm_rate: float = DEFAULTS['fim_spm_rate']
    # S, R, X
    ul2_rates: tuple = (DEFAULTS['ul2_s_rate'], DEFAULTS['ul2_r_rate'], DEFAULTS['ul2_x_rate'])
    record: list = None  # a list: UL2's R and X fragments append (mode, mean, rate, length, span lengths) to it

    def __post_init__(self):
        self.sentinels = np.array(
            [self.ids[name] for name in SENTINELS if name in self.ids], dtype=np.int64
        )

    def __call__(self, sequences, first_index):
        return transform(self, sequences, first_index)


CLM = Objective()  # train.py's default: next-token prediction, (s[:-1], s[1:])


def special_ids(meta, data_dir, names, user):
    """{name: id} of the special tokens `names` in a data folder's meta.json; a folder made without them (before
    prepare.py reserved them, or with --no-special-tokens) is one DataError line naming the command that makes one
    with them. `user` says who needs them, for that line."""
    have = meta.get('special_tokens', {})
    missing = [name for name in names if name not in have]
    if missing:
        # the command that made the folder (data.py reads meta.json; numpy, the shard format)
        from ledgergpt import data

        raise DataError(
            f"{data_dir} has no {missing[0]} token{' (and others)' if len(missing) > 1 else ''}, which "
            f"{user} needs: its tokenizer was made without the special tokens; make a folder with them "
            f"by rerunning `{data.prepare_command(data_dir)}` with another --out (new folders "
            f"reserve them unless --no-special-tokens)"
        )
    return {name: have[name] for name in names}


def build(train, meta):
    """The run's Objective from its TrainConfig (the keys above, seed, data) and its data folder's meta.json (None
    for synthetic data). Bad input is one line: ConfigError for the keys, DataError for a folder without the
    special tokens the objective needs."""
    name = train.objective
    if name not in OBJECTIVES:
        raise ConfigError(f"objective must be one of {', '.join(OBJECTIVES)}, not {name!r}")
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
    return Objective(
        name,
        train.seed,
        meta['eot_id'] if meta else -1,
        ids,
        train.fim_rate,
        train.fim_spm_rate,
        rates,
    )


# -----------------------------------------------------------------------------------------------------
# The transform: per sequence, per fragment. A fragment function takes (objective, fragment, lead, room, rng):
# the fragment's tokens, lead = 1 if it starts with the end-of-text token (a document's start; the sequence's
# first fragment usually continues a document from before and has none), the positions left in the sequence, and
# the sequence's generator. It returns (tokens, loss mask, source tokens used), len(tokens) <= room; it uses the
# whole fragment when the result fits, else a shorter piece from its start.


def transform(objective, sequences, first_index):
    """(B, T + 1) sequences, the first at global stream index first_index -> (inputs, targets), (B, T) each."""
    # exactly what train.py has always done, no copy of the tokens beyond it
    if objective.name == 'clm':
        return np.ascontiguousarray(sequences[:, :-1]), np.ascontiguousarray(sequences[:, 1:])
    tokens = np.empty_like(sequences)
    carries = np.empty(sequences.shape, dtype=bool)
    for row, sequence in enumerate(sequences):
        rng = np.random.default_rng([objective.seed, STREAM, first_index + row])
        tokens[row], carries[row], _ = transform_sequence(objective, sequence, rng)
    # position t predicts token t + 1: the target is IGNORE_INDEX where token t + 1 carries no loss
    return np.ascontiguousarray(tokens[:, :-1]), np.where(
        carries[:, 1:], tokens[:, 1:], IGNORE_INDEX
    )


def transform_sequence(objective, sequence, rng):
    """One packed sequence -> (tokens, loss mask, source tokens used), tokens and mask of the sequence's length:
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
        # the end-of-text token ends the document before it: a target under every objective, as under clm, or the
        # model never learns where a document ends (its own fragment's transform leaves it given)
        mask[:lead] = True
        pieces.append(tokens)
        masks.append(mask)
        room -= len(tokens)
        # the fragment did not fit whole: the rest of the sequence is left out
        if taken < end - start:
            used = start + taken
            break
    if room:  # only UL2 leaves a gap: end-of-text tokens that carry no loss
        pieces.append(np.full(room, eot, dtype=sequence.dtype))
        masks.append(np.zeros(room, dtype=bool))
    return np.concatenate(pieces).astype(sequence.dtype, copy=False), np.concatenate(masks), used


def _as_given(fragment, room, carries):
    """The fragment as it is, cut to the room: every token a target (fim) or none (ul2's leftovers)."""
    kept = fragment[:room]
    return kept, np.full(len(kept), carries), len(kept)


def _split(head, body, room, rng):
    """Prefix LM on head + body (head: the lead and mode tokens, always given): the body cut to the room, then at a
    uniform point with at least one token on each side (the head counts as given): the part after carries loss."""
    kept = body[: max(0, room - len(head))]
    tokens = np.concatenate((head, kept)).astype(body.dtype, copy=False)
    first = max(1, len(head))  # the first target position: at least one token is given
    mask = np.zeros(len(tokens), dtype=bool)
    if len(tokens) > first:
        mask[rng.integers(first, len(tokens)) :] = True
    return tokens, mask, len(kept)


def _prefix_lm(objective, fragment, lead, room, rng):
    tokens, mask, taken = _split(fragment[:lead], fragment[lead:], room, rng)
    return tokens, mask, lead + taken


def _fim(objective, fragment, lead, room, rng):
    """PSM or SPM with probability fim_rate, split at two points drawn uniformly over the fragment's tokens. The
    paper draws them over characters; here the transform stays on the shards' token ids, because splitting at
    characters means decoding and re-encoding every fragment on the host at every step (a tokenizer in the hot
    loop) and changes its token count, which the packing into block_size + 1 positions is built on. So a middle
    starts and ends on a token boundary of the whole document's tokenization (sample.py says what that means for
    a prompt). Every position carries loss, the sentinels too."""
    if rng.random() >= objective.fim_rate or room < lead + 3:
        return _as_given(fragment, room, True)
    pre, suf, mid = (objective.ids[name] for name in FIM_TOKENS)
    doc = fragment[lead : room - 3]  # the three sentinels must fit too
    i, j = np.sort(rng.integers(0, len(doc) + 1, size=2))
    prefix, middle, suffix = doc[:i], doc[i:j], doc[j:]
    # SPM, the paper's variant: prefix and middle stay adjacent
    if rng.random() < objective.fim_spm_rate:
        parts = (fragment[:lead], [pre, suf], suffix, [mid], prefix, middle)
    else:  # PSM
        parts = (fragment[:lead], [pre], prefix, [suf], suffix, [mid], middle)
    tokens = np.concatenate(parts).astype(fragment.dtype, copy=False)
    return tokens, np.ones(len(tokens), dtype=bool), lead + len(doc)


def span_counts(length, mean, rate):
    """T5's random_spans_noise_mask arithmetic: (tokens masked, spans) for a piece of `length` >= 2 tokens, at
    least one of each and one unmasked token between spans. R on 200 tokens: 30 masked in 10 spans of mean 3."""
    masked = min(max(round(length * rate), 1), length - 1)
    return masked, min(max(round(masked / mean), 1), length - masked)


def _ul2(objective, fragment, lead, room, rng):
    s_rate, r_rate, _ = objective.ul2_rates
    draw = rng.random()
    mode = 0 if draw < s_rate else 1 if draw < s_rate + r_rate else 2
    head = np.array([*fragment[:lead], objective.ids[UL2_MODES[mode]]], dtype=fragment.dtype)
    # S; or too little room for a span, its two sentinels and a kept token
    if mode == 0 or room < len(head) + 4:
        return _s_denoiser(objective, fragment, lead, room, rng)
    denoisers = R_DENOISERS if mode == 1 else X_DENOISERS
    mean, rate = denoisers[rng.integers(len(denoisers))]

    # the packed fragment: head, the input with one sentinel per span, then sentinels and spans
    def size(length):
        return len(head) + length + 2 * span_counts(length, mean, rate)[1]

    doc, length = fragment[lead:], len(fragment) - lead
    if size(length) > room:  # the longest piece that fits (size() grows with the length): bisect
        low, high = 0, min(length, room)
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if size(middle) <= room else (low, middle - 1)
        length = low
    if length < 2:  # nothing to mask
        return _s_denoiser(objective, fragment, lead, room, rng)
    doc = doc[:length]
    masked, spans = span_counts(length, mean, rate)
    # alternate kept and masked runs, kept first; each side's run lengths a uniform random composition (T5)
    runs = np.empty(2 * spans, dtype=np.int64)
    runs[0::2] = _composition(length - masked, spans, rng)
    runs[1::2] = _composition(masked, spans, rng)
    is_masked = np.repeat(np.tile([False, True], spans), runs)
    span_starts = (np.cumsum(runs) - runs)[1::2]
    # reused in order past 16
    sentinel = objective.sentinels[np.arange(spans) % len(objective.sentinels)]
    corrupted = doc.copy()
    corrupted[span_starts] = sentinel
    keep = ~is_masked
    keep[span_starts] = True
    inputs = corrupted[keep]  # each span collapsed to its sentinel
    span_lengths = runs[1::2]
    if objective.record is not None:
        objective.record.append((mode, mean, rate, length, span_lengths))
    # sentinel, span, ...
    targets = np.insert(doc[is_masked], np.cumsum(span_lengths) - span_lengths, sentinel)
    tokens = np.concatenate((head, inputs, targets)).astype(fragment.dtype, copy=False)
    mask = np.zeros(len(tokens), dtype=bool)
    mask[len(head) + len(inputs) :] = True
    return tokens, mask, lead + length


def _s_denoiser(objective, fragment, lead, room, rng):
    """UL2's S: prefix LM after the [S] mode token (or, with no room for even that, the leftover tokens, given)."""
    head = np.array([*fragment[:lead], objective.ids[UL2_MODES[0]]], dtype=fragment.dtype)
    if room < len(head) + 1:
        return _as_given(fragment, room, False)
    tokens, mask, taken = _split(head, fragment[lead:], room, rng)
    return tokens, mask, lead + taken


def _composition(total, parts, rng):
    """`total` split into `parts` positive run lengths, every split equally likely (T5's _random_segmentation)."""
    cuts = np.sort(rng.choice(total - 1, parts - 1, replace=False)) + 1
    return np.diff(np.concatenate(([0], cuts, [total])))


FRAGMENT_FUNCTIONS = {'prefix_lm': _prefix_lm, 'fim': _fim, 'ul2': _ul2}


# -----------------------------------------------------------------------------------------------------
# What a run's log says of its objective (train.py prints it at start-up).

FIM_LINE = (
    "fim: context-level FIM (Bavarian et al. 2022, appendix B.1): each document fragment of a packed sequence is "
    "rearranged on its own, split at tokens, not the paper's characters (objectives._fim says why)"
)


def describe(objective, stream, count=64):
    """The start-up line for fim (what kind of FIM it is) and ul2 (the spans its R and X denoisers really get on
    the run's first `count` sequences: a fragment shorter than a setting needs gets fewer, shorter spans, e.g. X's
    span 64 at 15% on a 256-token fragment is one span of ~38); None for the others."""
    if objective.name == 'fim':
        return FIM_LINE
    if objective.name != 'ul2':
        return None
    seen = []
    dataclasses.replace(objective, record=seen)(stream.batch(0, count), 0)
    settings = []
    for mode, denoisers in ((1, R_DENOISERS), (2, X_DENOISERS)):
        for mean, rate in denoisers:
            got = [
                (length, spans)
                for m, mu, r, length, spans in seen
                if (m, mu, r) == (mode, mean, rate)
            ]
            if got:
                spans = np.concatenate([s for _, s in got])
                masked = spans.sum() / sum(length for length, _ in got)
                settings.append(
                    f"{'RX'[mode - 1]} (span {mean}, {rate:.0%}): {spans.mean():.1f}, {masked:.0%} masked"
                )
    block = stream.batch(0, 1).shape[1] - 1
    return (
        f"ul2 at block_size {block}: mean span length and share masked as drawn on the first {count} sequences: "
        + ('; '.join(settings) or 'no R or X fragment drawn')
    )
