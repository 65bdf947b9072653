"""
test_objectives.py: the pretraining objectives (objectives.py), their special tokens (prepare.py) and sample.py's
fill-in-the-middle. Each transform is invertible (the source tokens come back from the packed tokens and their loss
mask), loss falls exactly on the intended positions, the rates hold over thousands of documents (tolerances of 4
binomial standard errors: a false failure once in ~16,000 runs, and the generators are seeded, so a run is
reproducible anyway), a sequence's transform depends only on (its tokens, its index, the seed), 'clm' is train.py's
own batch, bad input is one line, and a run trained with each objective resumes bit-exactly.
"""

import json
import math

import numpy as np
import pytest
import torch
from test_train import read_metrics, run, step_losses, write_config

import prepare
import sample
from ledgergpt import bill, checkpoint, data, objectives, sums
from ledgergpt.config import EOT as END_OF_TEXT
from ledgergpt.config import IGNORE_INDEX, ConfigError, DataError, TrainConfig, load_config
from ledgergpt.processes import Cluster

# Synthetic packed sequences: text tokens 0..199, the end-of-text token 255, the special tokens from 256 on.
EOT = 255
IDS = prepare.reserve(256)
PRE, SUF, MID = (IDS[name] for name in objectives.FIM_TOKENS)
MODES = [IDS[name] for name in objectives.UL2_MODES]
SENTINELS = [IDS[name] for name in objectives.SENTINELS]


def make(name, seed=7, **rates):
    return objectives.Objective(
        name, seed, EOT, {n: IDS[n] for n in objectives.NEEDS[name]}, **rates
    )


def packed(rng, n=257, mean_doc=60):
    """n tokens of documents with geometric lengths (mean mean_doc), each led by EOT; the first is cut (the stream
    starts mid-document), and a length of 1 is an empty document."""
    tokens = rng.integers(0, 200, n)
    starts = np.cumsum(rng.geometric(1 / mean_doc, n))
    tokens[starts[starts < n]] = EOT
    return tokens


def one_document(rng, doc, n=257):
    """A sequence that starts with a document of `doc` tokens, led by EOT; another document fills the rest."""
    tokens = rng.integers(0, 200, n)
    tokens[[i for i in (0, doc + 1) if i < n]] = EOT
    return tokens


def fragments(tokens):
    """(start, end) of the packed fragments: at each end-of-text token, and the one before the first."""
    bounds = np.union1d(np.flatnonzero(tokens == EOT), [0, len(tokens)]).tolist()
    return list(zip(bounds[:-1], bounds[1:]))


def restore(name, tokens, mask):
    """The inverse of the transform, written from the formats alone: the source tokens back from the packed tokens
    and the loss mask (followed by any padding, end-of-text tokens)."""
    out = []
    for start, end in fragments(tokens):
        lead = int(tokens[start] == EOT)
        body, carries = tokens[start + lead : end].tolist(), mask[start + lead : end]
        out += tokens[start : start + lead].tolist()
        if name == 'fim' and body[:1] == [PRE]:
            if body[1] == SUF:  # SPM: <pre> <suf> suffix <mid> prefix middle
                k = body.index(MID)
                body = body[k + 1 :] + body[2:k]
            else:  # PSM: <pre> prefix <suf> suffix <mid> middle
                s, k = body.index(SUF), body.index(MID)
                body = body[1:s] + body[k + 1 :] + body[s + 1 : k]
        elif name == 'ul2' and body[:1] and body[0] in MODES:
            body, carries = body[1:], carries[1:]
            # R or X: input with sentinels, then sentinel, span, ...
            if MODES.index(tokens[start + lead]) > 0:
                first = int(np.argmax(carries))
                inputs, targets = body[:first], body[first:]
                cuts = [i for i, t in enumerate(targets) if t in SENTINELS] + [len(targets)]
                spans = iter(targets[a + 1 : b] for a, b in zip(cuts, cuts[1:]))
                body = [
                    t for token in inputs for t in (next(spans) if token in SENTINELS else [token])
                ]
        out += body
    return np.array(out)


def transformed(name, sequences, **rates):
    """transform_sequence on each sequence with its own generator, as transform() does: [(tokens, mask, used)]."""
    objective = make(name, **rates)
    return [
        objectives.transform_sequence(
            objective, s, np.random.default_rng([7, objectives.STREAM, k])
        )
        for k, s in enumerate(sequences)
    ]


def within(values, expected, sd=None, extra=0.0):
    """The mean of `values` within 4 standard errors of `expected` (+ `extra` for a known rounding bias)."""
    values = np.asarray(values, dtype=float)
    sd = values.std() if sd is None else sd
    return abs(values.mean() - expected) <= 4 * sd / math.sqrt(len(values)) + extra


# -----------------------------------------------------------------------------------------------------
# The transforms: invertible, loss exactly where intended, the batch API consistent with them.


@pytest.mark.parametrize('name', ['prefix_lm', 'fim', 'ul2'])
def test_each_transform_is_invertible(name):
    rng = np.random.default_rng(1)
    sequences = [packed(rng, mean_doc=mean) for mean in (5, 40, 400) for _ in range(150)]
    for sequence, (tokens, mask, used) in zip(sequences, transformed(name, sequences)):
        assert tokens.shape == mask.shape == sequence.shape
        restored = restore(name, tokens, mask)
        # the source, up to what was used ...
        assert restored[:used].tolist() == sequence[:used].tolist()
        assert (restored[used:] == EOT).all()  # ... then only padding
        added = np.isin(tokens, [PRE, SUF, MID] + MODES + SENTINELS).sum()
        # every position is a source token, a special one or padding
        assert len(tokens) == len(restored) + added
        if name == 'prefix_lm':
            # only the loss changes
            assert used == len(sequence) and tokens.tolist() == sequence.tolist()
        if name == 'fim':  # 3 sentinels a FIM fragment push as many tokens out; FIM never pads
            assert used == len(sequence) - 3 * (tokens == PRE).sum() and len(restored) == used
        if name == 'ul2':  # UL2 pads only a gap too short for another sentinel pair or mode token
            assert len(restored) - used <= 2


def test_prefix_lm_loss_is_the_fragment_after_its_cut():
    rng = np.random.default_rng(2)
    sequences = [packed(rng) for _ in range(300)]
    for tokens, mask, _ in transformed('prefix_lm', sequences):
        for start, end in fragments(tokens):
            # it ends the document before: a target (test_the_end_of_text_...)
            lead = int(tokens[start] == EOT)
            carries = mask[start + lead : end]
            cut = int(np.argmax(carries)) if carries.any() else end - start - lead
            assert not carries[:cut].any() and carries[cut:].all()  # given, then predicted: one cut
            # a token on each side
            assert (cut + lead >= 1) and (end - start < 2 or cut < end - start - lead)


def test_fim_carries_loss_everywhere_and_ul2_exactly_on_its_targets():
    rng = np.random.default_rng(3)
    sequences = [packed(rng) for _ in range(300)]
    for _, mask, _ in transformed('fim', sequences):
        assert mask.all()
    for tokens, mask, _ in transformed('ul2', sequences):
        for start, end in fragments(tokens):
            lead = int(tokens[start] == EOT)
            carries, body = mask[start:end], tokens[start + lead : end]
            if not len(body) or body[0] not in MODES:  # leftovers or padding: given
                assert not carries[lead:].any()
                continue
            # the end-of-text token is a target, the mode given
            assert carries[:lead].all() and not carries[lead]
            carries = carries[lead:]
            if body[0] == MODES[0]:  # S: a prefix LM after the mode token
                cut = int(np.argmax(carries)) if carries.any() else end - start - lead
                assert not carries[:cut].any() and carries[cut:].all()
            else:  # R, X: the targets start at the second half's first sentinel and run to the end
                sentinels = np.flatnonzero(np.isin(body, SENTINELS))
                assert len(sentinels) % 2 == 0 and len(sentinels) >= 2
                first = sentinels[len(sentinels) // 2]
                assert carries.tolist() == [i >= first for i in range(end - start - lead)]


@pytest.mark.parametrize('name', ['prefix_lm', 'fim', 'ul2'])
def test_the_end_of_text_token_carries_loss_as_under_clm(name):
    """Each document's end (the end-of-text token that starts the next) is a target under every objective: the
    model learns where a document ends. UL2's padding (end-of-text tokens past what was used) carries none."""
    rng = np.random.default_rng(9)
    sequences = np.stack([packed(rng) for _ in range(300)])
    ends, carried = 0, 0
    for sequence, (tokens, mask, used) in zip(sequences, transformed(name, sequences)):
        # position 0 is no target (nothing predicts it)
        ends += int((sequence[1:used] == EOT).sum())
        carried += int((mask[1:] & (tokens[1:] == EOT)).sum())
    assert carried == ends and ends > 1000
    # and through the batch API: as many end-of-text targets as under clm
    _, targets = make(name)(sequences, 0)
    _, clm_targets = objectives.CLM(sequences, 0)
    assert (targets == EOT).sum() == carried <= (clm_targets == EOT).sum()


@pytest.mark.parametrize('name', ['prefix_lm', 'fim', 'ul2'])
def test_targets_are_the_next_tokens_or_ignored(name):
    rng = np.random.default_rng(4)
    sequences = np.stack([packed(rng) for _ in range(16)])
    inputs, targets = make(name)(sequences, 1000)
    objective = make(name)
    for row in range(16):
        tokens, mask, _ = objectives.transform_sequence(
            objective, sequences[row], np.random.default_rng([7, objectives.STREAM, 1000 + row])
        )
        assert inputs[row].tolist() == tokens[:-1].tolist()
        assert targets[row].tolist() == np.where(mask[1:], tokens[1:], IGNORE_INDEX).tolist()
    assert (
        inputs.shape == targets.shape == (16, 256)
        and inputs.flags.c_contiguous
        and targets.flags.c_contiguous
    )


# -----------------------------------------------------------------------------------------------------
# The rates hold (thousands of documents; 4 standard errors).


@pytest.mark.parametrize('rate', [0.5, 0.9])
def test_fim_rate_spm_rate_and_the_papers_split(rate):
    rng = np.random.default_rng(5)
    n = 4000
    # one document of 256 tokens a sequence: FIM'd, 253 of them fit with the 3 sentinels
    first = [
        tokens
        for tokens, _, _ in transformed(
            'fim', [one_document(rng, 256) for _ in range(n)], fim_rate=rate, fim_spm_rate=0.5
        )
    ]
    is_fim = [f[1] == PRE for f in first]
    assert within(is_fim, rate, sd=math.sqrt(rate * (1 - rate)))
    fim = [f for f, flag in zip(first, is_fim) if flag]
    is_spm = [f[2] == SUF for f in fim]
    assert within(is_spm, 0.5, sd=0.5)
    # the two cut points uniform over the document's 253 tokens that fit: each piece 1/3 on average, and the
    # middle's share |U1 - U2| has standard deviation sqrt(1/18); 1/253 allows for the discrete ends
    middle = [
        (len(f) - 1 - f.tolist().index(MID)) / 253 if not spm else None
        for f, spm in zip(fim, is_spm)
    ]
    middle = [m for m in middle if m is not None]
    assert within(middle, 1 / 3, sd=math.sqrt(1 / 18), extra=1 / 253)
    prefix = [(f.tolist().index(SUF) - 2) / 253 for f, spm in zip(fim, is_spm) if not spm]
    assert within(prefix, 1 / 3, sd=math.sqrt(1 / 18), extra=1 / 253)


def test_prefix_lm_cut_is_uniform():
    rng = np.random.default_rng(6)
    results = transformed('prefix_lm', [one_document(rng, 255, n=257) for _ in range(4000)])
    # the first fragment: EOT + 255 tokens; the share of its 256 tokens after the EOT that carry loss is uniform
    # over 1/255 ... 255/255: mean 1/2 + 1/510, sd ~ 1/sqrt(12)
    shares = [mask[1:256].sum() / 255 for _, mask, _ in results]
    assert within(shares, 0.5 + 1 / 510, sd=1 / math.sqrt(12))
    assert min(shares) > 0 and max(shares) <= 1


def test_ul2_mixture_and_its_denoisers():
    rng = np.random.default_rng(7)
    n, doc = 4000, 150
    results = transformed(
        'ul2', [one_document(rng, doc) for _ in range(n)], ul2_rates=(0.5, 0.25, 0.25)
    )
    modes, x_settings = [], []
    for tokens, mask, _ in results:
        mode = MODES.index(tokens[1])
        modes.append(mode)
        end = tokens.tolist().index(EOT, 1)
        targets = tokens[1:end][mask[1:end]]
        spans = np.isin(targets, SENTINELS).sum()
        masked = len(targets) - spans
        # R: T5's 15% in spans of mean 3, exactly by its arithmetic: 22 tokens in 7 spans
        if mode == 1:
            assert (masked, spans) == (round(doc * 0.15), round(round(doc * 0.15) / 3)) == (22, 7)
        if mode == 2:  # X: the book's "spans over 12 tokens or ~50% masked"
            assert masked / spans > 12 or masked / doc >= 0.5 - 1 / doc
            x_settings.append((masked, spans))
    for mode, rate in enumerate((0.5, 0.25, 0.25)):
        assert within([m == mode for m in modes], rate, sd=math.sqrt(rate * (1 - rate)))
    # X's four settings, uniformly: (3, 0.5) -> 75 in 25 spans, (8, 0.5) -> 75 in 9, (64, 0.15) -> 22 in 1,
    # (64, 0.5) -> 75 in 1
    for setting in [(75, 25), (75, 9), (22, 1), (75, 1)]:
        assert within([s == setting for s in x_settings], 0.25, sd=math.sqrt(0.25 * 0.75))


@pytest.mark.parametrize(
    'name,rates',
    [('prefix_lm', {}), ('ul2', {}), ('ul2', {'ul2_rates': (0.2, 0.2, 0.6)})],
    ids=['prefix_lm', 'ul2', 'ul2-mostly-x'],
)
def test_loss_fraction_is_the_share_of_targets_that_carry_loss(name, rates):
    """sums.loss_fraction, the ledger's arithmetic, against the share the transform really masks."""
    rng = np.random.default_rng(8)
    objective = make(name, **rates)
    sequences = np.stack([one_document(rng, 1023, n=1025) for _ in range(1000)])
    _, targets = objective(sequences, 0)
    shares = (targets != IGNORE_INDEX).mean(axis=1)
    # 4 standard errors of the per-sequence share, + 1% for what the formula leaves out (the cut's discrete ends,
    # T5's rounding, the given end-of-text and mode tokens: a few tokens in a thousand)
    assert within(shares, sums.loss_fraction(name, objective.ul2_rates), extra=0.01)
    assert sums.loss_fraction('clm') == sums.loss_fraction('fim') == 1.0
    assert round(sums.loss_fraction('ul2'), 3) == 0.399  # the default mixture


# -----------------------------------------------------------------------------------------------------
# A pure function of (tokens, index, seed); 'clm' is train.py's own batch.


@pytest.mark.parametrize('name', ['prefix_lm', 'fim', 'ul2'])
def test_deterministic_in_index_and_seed_and_different_across_them(name):
    rng = np.random.default_rng(9)
    sequences = np.stack([packed(rng) for _ in range(32)])
    objective = make(name)
    first = objective(sequences, 500)
    again = objective(sequences.copy(), 500)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    # a rank that reads sequences 508..515 of the same step transforms them as one process reading all does
    part = objective(sequences[8:16], 508)
    assert all(np.array_equal(a[8:16], b) for a, b in zip(first, part))
    # the same tokens at other indices, or with another seed, are transformed otherwise
    same = np.repeat(sequences[:1], 32, axis=0)
    targets = objective(same, 500)[1]
    assert len({row.tobytes() for row in targets}) > 8
    assert not np.array_equal(make(name, seed=8)(sequences, 500)[1], first[1])


def test_clm_is_exactly_todays_batch(pystdlib_data):
    stream = data.ShardStream(
        [data.open_shard(p) for p in data.list_shards(pystdlib_data, 'train')], 32, seed=1337
    )
    for rank, world in [(0, 1), (1, 2)]:
        cluster = Cluster(rank, world, rank, torch.device('cpu'))
        x, y = data.micro_batch_arrays(stream, 40, 1, cluster, 4, objectives.CLM)
        first = 40 + (1 * world + rank) * 4
        cx, cy = objectives.Objective()(stream.batch(first, 4), first)
        assert (
            np.array_equal(x, cx)
            and np.array_equal(y, cy)
            and x.dtype == cx.dtype
            and y.dtype == cy.dtype
        )
        assert cx.flags.c_contiguous and cy.flags.c_contiguous and (cy != IGNORE_INDEX).all()


# -----------------------------------------------------------------------------------------------------
# The special tokens in the tokenizer, and bad input as one line.


def keys(folder, **overrides):
    return TrainConfig(data=folder, **overrides)


def test_special_tokens_are_reserved_in_our_bpe(pystdlib_data):
    meta, enc = data.load_meta(pystdlib_data), data.load_tokenizer(pystdlib_data)
    # bpe:512: 489 byte and merge ranks, the 22 special tokens at 489..510, the end-of-text token last
    assert meta['vocab_size'] == enc.n_vocab == 512 and meta['eot_id'] == enc.eot_token == 511
    assert meta['special_tokens'] == prepare.reserve(489) == data.reserved_ids(enc)
    assert len(enc._mergeable_ranks) == 489
    for name, token in meta['special_tokens'].items():
        assert enc.decode([token]) == name and enc.encode(name, allowed_special='all') == [token]
        assert token not in enc.encode_ordinary(name)  # text that spells one stays text
    shards = data.list_shards(pystdlib_data, 'val') + data.list_shards(pystdlib_data, 'train')
    assert not any(
        np.isin(data.open_shard(p), list(meta['special_tokens'].values())).any() for p in shards
    )
    objective = objectives.build(keys(pystdlib_data, objective='ul2'), meta)
    assert objective.eot == 511 and objective.sentinels.tolist() == list(range(495, 511))


def test_gpt2_reserves_them_in_the_padding(tmp_path, monkeypatch):
    from tiktoken_ext import openai_public

    # GPT-2's layout in small: ranks, then <|endoftext|>
    ranks = {bytes([i]): i for i in range(256)}
    monkeypatch.setattr(
        openai_public,
        'gpt2',
        lambda: {
            'pat_str': r'\S+|\s+',
            'mergeable_ranks': ranks,
            'special_tokens': {END_OF_TEXT: 256},
        },
    )
    prepare.make_gpt2_tokenizer(str(tmp_path))
    enc = data.load_tokenizer(str(tmp_path))
    # 50,279 for GPT-2
    assert data.reserved_ids(enc) == prepare.reserve(257) and enc.n_vocab == 257 + 22
    assert prepare.tokenizer_meta(enc)['special_tokens']['<|fim_prefix|>'] == 257


def test_a_folder_without_special_tokens(tmp_path, capsys):
    out = str(tmp_path / 'plain')
    argv = [
        'pystdlib',
        '--out',
        out,
        '--max-files',
        '150',
        '--tokenizer',
        'bpe:300',
        '--workers',
        '1',
    ]
    assert prepare.main(argv + ['--no-special-tokens']) == 0
    meta = data.load_meta(out)
    assert meta['special_tokens'] == {} and meta['vocab_size'] == 300 and meta['eot_id'] == 299
    # needs none
    assert objectives.build(keys(out, objective='prefix_lm'), meta).name == 'prefix_lm'
    with pytest.raises(DataError) as error:
        objectives.build(keys(out, objective='fim'), meta)
    assert str(error.value) == (
        f"{out} has no <|fim_prefix|> token (and others), which objective='fim' needs: its tokenizer was made "
        f"without the special tokens; make a folder with them by rerunning `python prepare.py pystdlib --out "
        f"{out}` with another --out (new folders reserve them unless --no-special-tokens)"
    )
    with pytest.raises(
        DataError, match=r"has no <\|ul2_s\|> token \(and others\), which objective='ul2' needs"
    ):
        objectives.build(keys(out, objective='ul2'), meta)
    # the folder stays what it is: a rerun with the default is refused in one line, as any other change
    capsys.readouterr()
    assert prepare.main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {out} already holds a dataset made with other settings: special_tokens=False (this run: True): "
        f"delete it or choose another --out"
    )
    # a folder made before prepare.py reserved them has no special_tokens in its request: it was made without
    meta_path = tmp_path / 'plain' / 'meta.json'
    old = json.loads(meta_path.read_text())
    del old['request']['special_tokens'], old['special_tokens']
    meta_path.write_text(json.dumps(old))
    assert (
        prepare.main(argv + ['--no-special-tokens']) == 0
        and 'already complete' in capsys.readouterr().out
    )
    with pytest.raises(DataError, match=r"has no <\|fim_prefix\|> token"):
        objectives.build(keys(out, objective='fim'), data.load_meta(out))


def test_bad_keys_are_one_line(pystdlib_data):
    meta = data.load_meta(pystdlib_data)
    cases = [
        (dict(objective='mlm'), "objective must be one of clm, prefix_lm, fim, ul2, not 'mlm'"),
        (
            dict(objective='ul2', ul2_x_rate=0.5),
            "ul2_s_rate + ul2_r_rate + ul2_x_rate must be 1 (shares of "
            "the fragments given each denoiser), got 0.5 + 0.25 + 0.5 = 1.25",
        ),
    ]
    for overrides, message in cases:
        with pytest.raises(ConfigError) as error:
            objectives.build(keys(pystdlib_data, **overrides), meta)
        assert str(error.value) == message
    with pytest.raises(
        ConfigError,
        match=r"^objective='fim' needs the special tokens of a data folder made by "
        r"prepare.py; data='synthetic' has none$",
    ):
        objectives.build(keys('synthetic', objective='fim'), None)
    # one fragment a sequence
    assert objectives.build(keys('synthetic', objective='prefix_lm'), None).eot == -1


# -----------------------------------------------------------------------------------------------------
# train.py trains on the objective its config names and resumes bit-exactly; sample.py fills in the middle.

STEPS = 6


def recording(monkeypatch):
    """Spy on train.py's micro-batches: -> the list of (inputs, targets) data.micro_batch_arrays returns."""
    made, made_by = [], data.micro_batch_arrays

    def micro_batch_arrays(*args):
        made.append(made_by(*args))
        return made[-1]

    monkeypatch.setattr(data, 'micro_batch_arrays', micro_batch_arrays)
    return made


def test_a_run_says_which_tokens_carry_loss(pystdlib_data, tmp_path, capsys):
    config = write_config(tmp_path, pystdlib_data, train_tokens=2 * 256, objective='prefix_lm')
    assert run(config, tmp_path / 'out') == 0
    out = capsys.readouterr().out
    assert (
        "objective: prefix_lm: about 50% of the positions carry loss (the others' targets are -1: given, not "
        "predicted); tokens/s and MFU count every position"
    ) in out
    assert (
        bill.line(
            'tokens that carry loss',
            '256',
            '50%: objective prefix_lm; tokens/s and MFU count every position',
        )
        in out
    )
    prediction = json.loads((tmp_path / 'out' / 'ledger.json').read_text())
    assert prediction['data']['loss_tokens'] == 256 and prediction['data']['loss_fraction'] == 0.5
    # unchanged
    assert prediction['flops_per_token'] == sums.predict(*load_config(config))['flops_per_token']


@pytest.mark.parametrize(
    'flags, message',
    [
        (['--objective=mlm'], "objective must be one of clm, prefix_lm, fim, ul2, not 'mlm'"),
        (['--objective=ul2', '--ul2_x_rate=0.5'], "ul2_s_rate + ul2_r_rate + ul2_x_rate must be 1"),
        (
            ['--objective=fim', '--data=synthetic'],
            "objective='fim' needs the special tokens of a data folder made by prepare.py; data='synthetic' has none",
        ),
        (['--fim_rate=1.5'], "fim_rate must be in [0, 1]"),
    ],
)
def test_bad_objective_keys_through_train_py_are_one_line(
    pystdlib_data, tmp_path, capsys, flags, message
):
    config = write_config(tmp_path, pystdlib_data, train_tokens=2 * 256)
    capsys.readouterr()
    assert run(config, tmp_path / 'out', *flags) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and err.startswith('error: ') and '\n' not in err, err
    assert not (tmp_path / 'out' / 'ckpt').exists()


@pytest.fixture(scope='module')
def fim_run(pystdlib_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp('fim')
    config = write_config(
        tmp, pystdlib_data, train_tokens=STEPS * 256, ckpt_every=3, objective='fim'
    )
    assert run(config, tmp / 'out') == 0
    return config, tmp / 'out'


@pytest.mark.parametrize('name', ['prefix_lm', 'fim', 'ul2'])
def test_each_objective_resumes_bit_exactly(name, pystdlib_data, fim_run, tmp_path, monkeypatch):
    if name == 'fim':
        config, full = fim_run
    else:
        config = write_config(
            tmp_path, pystdlib_data, train_tokens=STEPS * 256, ckpt_every=3, objective=name
        )
        full = tmp_path / 'full'
        assert run(config, full) == 0
    made = recording(monkeypatch)
    expected = step_losses(read_metrics(full))
    assert run(config, tmp_path / 'out', f'--max_steps={STEPS // 2}') == 0
    assert run(config, tmp_path / 'out', '--resume') == 0
    losses = step_losses(read_metrics(tmp_path / 'out'))
    assert sorted(expected) == list(range(1, STEPS + 1)) and all(
        math.isfinite(v) for v in expected.values()
    )
    # exactly
    assert [losses[s] for s in range(1, STEPS + 1)] == [expected[s] for s in range(1, STEPS + 1)]
    # and the runs trained on the objective: FIM's sentinels in the inputs, or part of the targets ignored
    inputs, targets = (np.concatenate(arrays) for arrays in zip(*made))
    carrying = (targets != IGNORE_INDEX).mean()
    if name == 'fim':
        assert (
            carrying == 1
            and (inputs == data.load_meta(pystdlib_data)['special_tokens']['<|fim_prefix|>']).any()
        )
    else:
        assert 0.2 < carrying < 0.8


def test_sample_fills_in_the_middle(pystdlib_data, fim_run, capsys, monkeypatch):
    _, out = fim_run
    prefix, suffix = 'def f(x):\n    ', '\n    return y\n'
    capsys.readouterr()
    assert (
        sample.main(
            [
                str(out),
                '--prefix',
                prefix,
                '--suffix',
                suffix,
                '--temperature',
                '0',
                '--tokens',
                '12',
            ]
        )
        == 0
    )
    middle = capsys.readouterr().out.split('\n' + '-' * 80)[0]
    # greedy: the model's own argmax after the PSM prompt, token by token, up to the end-of-text token
    model, _ = checkpoint.load_model(checkpoint.find(str(out)), torch.device('cpu'))
    enc, meta = data.load_tokenizer(pystdlib_data), data.load_meta(pystdlib_data)
    ids = meta['special_tokens']
    prompt = [
        enc.eot_token,
        ids['<|fim_prefix|>'],
        *enc.encode_ordinary(prefix),
        ids['<|fim_suffix|>'],
        *enc.encode_ordinary(suffix),
        ids['<|fim_middle|>'],
    ]
    tokens = model.generate(torch.tensor([prompt]), 12, temperature=0)[0, len(prompt) :].tolist()
    tokens = tokens[: tokens.index(enc.eot_token)] if enc.eot_token in tokens else tokens
    assert middle == enc.decode([t for t in tokens if t < enc.n_vocab])
    # bad input: a prompt and a gap at once; a data folder without the FIM tokens
    assert sample.main([str(out), '--prompt', 'x', '--prefix', 'y']) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --prompt continues a text, --prefix/--suffix fill in the middle: give one or the other"
    )
    load_meta = data.load_meta
    monkeypatch.setattr(data, 'load_meta', lambda d: dict(load_meta(d), special_tokens={}))
    assert sample.main([str(out), '--suffix', 'y']) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith(
            f"error: {pystdlib_data} has no <|fim_prefix|> token (and others), which sample.py "
            f"--prefix/--suffix (fill in the middle) needs"
        )
        and '\n' not in err
    )


class Stream:
    """A train stream of the given sequences (ShardStream's batch API)."""

    def __init__(self, sequences):
        self.sequences = np.stack(sequences)

    def batch(self, first, count):
        return self.sequences[first : first + count]


def test_the_log_names_context_level_fim_and_ul2s_real_spans():
    rng = np.random.default_rng(10)
    # one 255-token document a sequence
    stream = Stream([one_document(rng, 255, n=257) for _ in range(64)])
    assert objectives.describe(make('fim'), stream).startswith(
        'fim: context-level FIM (Bavarian et al. 2022'
    )
    assert objectives.describe(objectives.CLM, stream) is None
    line = objectives.describe(make('ul2', ul2_rates=(0.0, 0.0, 1.0)), stream)
    # the document fills the sequence: X keeps the longest piece that fits with its head and sentinels (bisected as
    # the transform does), where span 64 at 15% is one span of all the masked tokens
    length = max(n for n in range(256) if 2 + n + 2 * objectives.span_counts(n, 64, 0.15)[1] <= 257)
    masked, spans = objectives.span_counts(length, 64, 0.15)
    assert spans == 1 and masked == 38
    assert line.startswith(
        'ul2 at block_size 256: mean span length and share masked as drawn on the first 64 '
    )
    assert f'X (span 64, 15%): {masked:.1f}, {masked / length:.0%} masked' in line
    # no R fragment drawn at these rates
    assert 'X (span 3, 50%): 3.0' in line and 'R (' not in line
