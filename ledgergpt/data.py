"""
data.py: a prepared data folder, read: its token shards, meta.json and tokenizer, and the seeded stream of
training sequences cut from them. train.py, sample.py, evals.py and export.py read data through this file alone;
prepare.py makes the folders (and writes their shards with write_shard).

The shard format is llm.c's: a 1024-byte header of 256 little-endian int32 ([0] magic, [1] version, [2] the token
count, the rest zero), then the tokens. GPT-2's kind (magic 20240520, version 1, uint16 tokens) while every id
fits, Llama 3's (20240801, version 7, uint32) above: llm.c's and modded-nanogpt's shards read here, ours there.

A folder holds `<source>_val_000000.bin`, `<source>_train_000001.bin`, ... (the *_val_*.bin and *_train_*.bin
shards), tokenizer.json (the tokenizer the shards were made with, so that every command encodes and decodes alike)
and meta.json (the vocab, the counts and the request that made the folder; prepare.py writes it last, so a folder
without it is unfinished).

The stream: a training example is a sequence of block_size + 1 tokens, the inputs its first block_size and the
targets its last. Their order is a pure function of (seed, position): `position` counts the sequences the whole
run (all ranks) has consumed, and sequence k is found without replaying those before it. So a checkpoint needs
only that one integer, and the stream does not depend on the world size: every global batch is cut into
world_size disjoint slices, rank r taking slice r (micro_batch_arrays).

numpy and the standard library at import; tiktoken, tokenizers and torch inside the functions that use them.
"""

import base64
import dataclasses
import glob
import json
import math
import os

import numpy as np

from ledgergpt import mixture
from ledgergpt.config import EOT, SPECIAL_TOKENS, DataError, data_sources, is_mixture
from ledgergpt.files import atomic_write

# -----------------------------------------------------------------------------------------------------
# Shards: llm.c's format (dev/data/data_common.py; the module docstring has the layout). GPT-2's kind whenever every
# id fits, i.e. a vocab of up to 65,536 tokens (ids 0..65,535), Llama 3's above. Shards prepare.py wrote earlier with
# uint32 tokens under magic 20240520, version 2 still read.

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
SHARD_FORMATS = {  # (magic, version) -> token dtype
    (20240520, 1): np.dtype('<u2'),  # llm.c, GPT-2
    (20240801, 7): np.dtype('<u4'),  # llm.c, Llama 3
    (20240520, 2): np.dtype('<u4'),  # ours before we wrote Llama 3's header: read, never written
}
WRITTEN_FORMATS = {2: (20240520, 1), 4: (20240801, 7)}  # bytes per token -> (magic, version)


def token_dtype(vocab_size):
    """uint16 while every id fits (vocab <= 65,536: GPT-2's 50,257 and NeoX's 50,277 do), else uint32. The ledger
    plans the shards' bytes with the same rule (sums.token_bytes; test_data.py checks that the two agree)."""
    return np.dtype('<u2') if vocab_size <= 2**16 else np.dtype('<u4')


def write_shard(path, tokens):
    """Write one shard atomically (to a temporary file of this process, flushed to disk, then renamed: a crash never
    leaves half a shard under a shard's name); returns its largest token id. A uint16 array is written in GPT-2's
    format, uint32 in Llama 3's; other integer arrays in the smallest of the two that holds their largest id."""
    tokens = np.asarray(tokens)
    if tokens.dtype not in (np.uint16, np.uint32):
        if tokens.size and (tokens.min() < 0 or tokens.max() >= 2**32):
            raise DataError(
                f"{path}: token ids must lie in [0, 2^32), got {tokens.min()}..{tokens.max()}"
            )
        tokens = tokens.astype(token_dtype(int(tokens.max()) + 1 if tokens.size else 0))
    magic, version = WRITTEN_FORMATS[tokens.dtype.itemsize]
    header = np.zeros(HEADER_INTS, dtype='<i4')
    header[0], header[1], header[2] = magic, version, len(tokens)
    with atomic_write(path, 'wb') as f:
        f.write(header.tobytes())
        # no copy, unlike .tobytes()
        f.write(np.ascontiguousarray(tokens, dtype=SHARD_FORMATS[magic, version]).data)
    return int(tokens.max()) if tokens.size else -1


def open_shard(path):
    """The tokens of one shard as a read-only np.memmap, after checking the header against the file size."""
    try:
        size = os.path.getsize(path)
    except OSError:
        raise DataError(f"{path}: no such shard") from None
    if size < HEADER_BYTES:
        raise DataError(
            f"{path}: {size} bytes, shorter than the {HEADER_BYTES}-byte shard header (truncated file?)"
        )
    header = np.fromfile(path, dtype='<i4', count=HEADER_INTS)
    magic, version, n_tokens = int(header[0]), int(header[1]), int(header[2])
    if magic not in {m for m, _ in SHARD_FORMATS}:
        raise DataError(
            f"{path}: bad magic number {magic} (a token shard starts with 20240520 or 20240801): "
            f"not a shard, or a damaged one"
        )
    if (magic, version) not in SHARD_FORMATS:
        raise DataError(
            f"{path}: unknown shard version {version} for magic {magic} (llm.c writes 20240520 "
            f"version 1, uint16 tokens, and 20240801 version 7, uint32)"
        )
    dtype = SHARD_FORMATS[magic, version]
    expected = HEADER_BYTES + n_tokens * dtype.itemsize
    if n_tokens <= 0 or size != expected:
        raise DataError(
            f"{path}: the header says {n_tokens} tokens ({expected} bytes) but the file has {size} "
            f"bytes (truncated or damaged): delete it and rerun prepare.py"
        )
    return np.memmap(path, dtype=dtype, mode='r', offset=HEADER_BYTES, shape=(n_tokens,))


# -----------------------------------------------------------------------------------------------------
# The folder: its shards by split, the command that makes it, its meta.json, and a check of its token ids.

SOURCES = ('pystdlib', 'fineweb_edu', 'files', 'hub')  # prepare.py's sources, which name the shards
# what a source's command names
ARGUMENTS = {'files': ' PATH...', 'hub': ' REPO --config NAME --column TEXT'}


def list_shards(data_dir, split):
    """Sorted paths of a folder's `*_{split}_*.bin` shards; a DataError saying how to make them if none."""
    paths = sorted(glob.glob(os.path.join(glob.escape(data_dir), f'*_{split}_*.bin')))
    if not paths:
        raise DataError(
            f"no {split} shards (*_{split}_*.bin) in {data_dir}: make them with "
            f"`python prepare.py pystdlib --out {data_dir}` (or fineweb_edu, or files PATH...)"
        )
    return paths


def open_split(data_dir, meta, split):
    """The split's shards as np.memmaps (open_shard: each header's token count agrees with its file's size), after
    checking them against meta.json: as many shards as it counts and, together, as many tokens. A shard gone, cut
    short or swapped for another would otherwise go unseen: the run trains on less data, and under torchrun a rank
    with its own copy of the folder reads another stream than the others. prepare.py numbers the shards across the
    folder (val 0 .. V-1, train V ..), which names the one missing; one DataError line either way."""
    paths = list_shards(data_dir, split)
    listed, remake = (
        meta[f'{split}_shards'],
        f"remake the folder ({prepare_command(data_dir)}, same options)",
    )
    prefix = os.path.basename(paths[0]).rsplit(f'_{split}_', 1)[0]
    first = 0 if split == 'val' else meta['val_shards']
    expected = [
        os.path.join(data_dir, f'{prefix}_{split}_{first + i:06d}.bin') for i in range(listed)
    ]
    if len(paths) < listed:
        missing = next((p for p in expected if p not in paths), f"one of the {split} shards")
        raise DataError(
            f"{missing} is missing: meta.json lists {listed} {split} shards and {len(paths)} are here (a run would "
            f"train on less data): copy it back, or {remake}"
        )
    if len(paths) > listed:
        extra = next((p for p in paths if p not in expected), paths[-1])
        raise DataError(
            f"{extra} is not one of the {listed} {split} shards meta.json lists ({len(paths)} are here): delete it, "
            f"or {remake}"
        )
    shards = [open_shard(p) for p in paths]
    held = sum(len(s) for s in shards)
    if held != meta[f'{split}_tokens']:
        raise DataError(
            f"the {split} shards of {data_dir} hold {held:,} tokens, but meta.json says "
            f"{meta[f'{split}_tokens']:,}: a shard was replaced or damaged; {remake}"
        )
    return shards


def prepare_command(data_dir):
    """The command that makes a data folder, as far as the folder tells: the source is in its shards' names."""
    names = [os.path.basename(p) for p in glob.glob(os.path.join(glob.escape(data_dir), '*.bin'))]
    source = next((s for s in SOURCES if any(n.startswith(s + '_') for n in names)), 'pystdlib')
    return f"python prepare.py {source}{ARGUMENTS.get(source, '')} --out {data_dir}"


# meta.json's keys that train.py and sample.py rely on, with their types; load_meta checks them all
META_KEYS = {
    'source': str,
    'tokenizer': str,
    'vocab_size': int,
    'eot_id': int,
    'dtype': str,
    'documents': int,
    'train_tokens': int,
    'val_tokens': int,
    'train_shards': int,
    'val_shards': int,
    'request': dict,
}
TYPE_NAMES = {str: 'a string', int: 'a whole number', dict: 'a JSON object'}


def load_meta(data_dir):
    """The folder's meta.json as a dict, checked: a missing file, bad JSON, a missing key or a value of the wrong
    type is one DataError line naming the file and the command that remakes it."""
    path = os.path.join(data_dir, 'meta.json')
    remake = f"rerun the command that made the folder ({prepare_command(data_dir)}, same options) to remake it"
    if not os.path.exists(path):
        raise DataError(
            f"no meta.json in {data_dir}: prepare.py has not finished there "
            f"(run `python prepare.py pystdlib --out {data_dir}`, or rerun your prepare command)"
        )
    try:
        with open(path, 'rb') as f:
            meta = json.loads(f.read())
    except ValueError as e:  # bad JSON, or bytes that are not text at all
        raise DataError(f"{path} is not valid JSON ({e}): {remake}") from None
    if not isinstance(meta, dict):
        raise DataError(f"{path} holds a JSON {type(meta).__name__}, not an object: {remake}")
    optional = {
        key: kind for key, kind in (('max_token_id', int), ('special_tokens', dict)) if key in meta
    }
    for key, kind in dict(META_KEYS, **optional).items():
        if key not in meta:
            raise DataError(f"{path} has no '{key}': {remake}")
        if not isinstance(meta[key], kind) or isinstance(meta[key], bool):
            raise DataError(f"{path}: '{key}' is {meta[key]!r}, not {TYPE_NAMES[kind]}: {remake}")
    if meta['vocab_size'] <= 0:
        raise DataError(f"{path}: 'vocab_size' is {meta['vocab_size']}, not positive: {remake}")
    return meta


def check_token_ids(data_dir, meta, vocab_size):
    """The largest token id of the folder's shards, after checking that every id is below `vocab_size` (the model's
    embedding rows): an id at or above it would index past the embedding (on a GPU, a device-side assert far from
    its cause). meta.json's max_token_id answers at once; without it (shards made by llm.c, or by an older
    prepare.py) each shard is read once with numpy. One DataError line names the first shard with an id too large."""
    largest = meta.get('max_token_id')
    if largest is not None and largest < vocab_size:
        return largest
    largest = -1
    for path in list_shards(data_dir, 'val') + list_shards(data_dir, 'train'):
        shard = open_shard(path)
        shard_max = int(shard.max())
        if shard_max >= vocab_size:
            raise id_past_vocab(shard, 0, vocab_size, meta)
        largest = max(largest, shard_max)
    return largest


def id_past_vocab(tokens, start, vocab_size, meta):
    """The DataError for tokens read from a shard (an np.memmap's slice from `start`) that hold an id at or above
    vocab_size: it names the shard, the first such id and its position in the shard."""
    index = int(np.argmax(np.asarray(tokens) >= vocab_size))
    path = tokens.filename
    return DataError(
        f"{path}: token id {int(tokens[index]):,} at position {start + index:,} is outside the model's vocab of "
        f"{vocab_size:,} (ids 0..{vocab_size - 1:,}), though meta.json says {meta['tokenizer']} "
        f"({meta['vocab_size']:,} tokens): the shard was made with another tokenizer, or is damaged; remake the "
        f"folder ({prepare_command(os.path.dirname(path))}), or raise vocab_size if the data is right"
    )


# -----------------------------------------------------------------------------------------------------
# The tokenizer: tokenizer.json, as prepare.py wrote it. gpt2 and bpe:V are the byte sequence of every rank
# (base64, list index = rank), the pre-split regex and the special tokens, which is all tiktoken.Encoding needs;
# neox keeps the Hub's own tokenizer.json inside ours, read through the `tokenizers` library (HFEncoding).


def load_tokenizer(data_dir):
    """The data folder's tokenizer as a tiktoken.Encoding (an HFEncoding for neox), from its tokenizer.json (no
    download, no cache). A mixture's data key reads its first folder's (all share one: open_mixture)."""
    data_dir = tokenizer_folder(data_dir)
    path = os.path.join(data_dir, 'tokenizer.json')
    if not os.path.exists(path):
        raise DataError(f"no tokenizer.json in {data_dir}: make the folder with prepare.py")
    try:
        with open(path, 'rb') as f:
            spec = json.loads(f.read())
        if 'tokenizers' not in spec:
            import tiktoken

            ranks = {base64.b64decode(token): rank for rank, token in enumerate(spec['ranks'])}
            return tiktoken.Encoding(
                spec['name'],
                pat_str=spec['pattern'],
                mergeable_ranks=ranks,
                special_tokens=spec['special_tokens'],
            )
        # neox, a model's: the Hub's file, kept whole
        name, hub_file = (spec['name'], json.dumps(spec['tokenizers']))
        reserved, start = spec.get('special_tokens', ()), spec.get('document_start', EOT)
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(
            f"{path} is damaged ({type(e).__name__}: {e}): delete the folder and rerun {prepare_command(data_dir)}"
        ) from None
    try:
        return HFEncoding(name, hub_file, reserved, start)
    except ImportError:
        raise DataError(
            f"{path} is {name}'s tokenizer, which needs the tokenizers package: pip install tokenizers "
            f"(it is in requirements.txt)"
        ) from None


class HFEncoding:
    """A `tokenizers` tokenizer behind the part of tiktoken.Encoding this project uses (name, n_vocab, eot_token,
    encode_ordinary, encode, encode_to_numpy, decode). As with tiktoken, '<|endoftext|>' written in a text is
    plain text, unless encode() is given allowed_special (sample.py's prompts). eot_token is the token every
    document starts with: '<|endoftext|>', or a model's own document start (a Llama's BOS: prepare.py)."""

    def __init__(self, name, spec_text, reserved=(), document_start=EOT):
        from tokenizers import AddedToken, Tokenizer

        self.name = name
        # special tokens written in a text are special tokens
        self.special = Tokenizer.from_str(spec_text)
        self.plain = Tokenizer.from_str(spec_text)
        # ... and here they are text (the added runs of spaces stay)
        self.plain.encode_special_tokens = True
        first = self.plain.get_vocab_size(with_added_tokens=True)
        # the reserved tokens (SPECIAL_TOKENS) after the Hub's ids
        for tokenizer in (self.special, self.plain):
            tokenizer.add_special_tokens(
                [AddedToken(t, special=True, normalized=False) for t in reserved]
            )
        self.reserved = {t: self.plain.token_to_id(t) for t in reserved}
        if list(self.reserved.values()) != list(range(first, first + len(reserved))):
            raise DataError(
                f"the tokenizers library put {name}'s special tokens at ids {self.reserved}, not from "
                f"{first} on: remake the folder with --no-special-tokens"
            )
        self.n_vocab = self.plain.get_vocab_size(with_added_tokens=True)
        self.eot_token = self.plain.token_to_id(document_start)

    def encode_ordinary(self, text):
        return self.plain.encode(text, add_special_tokens=False).ids

    def encode(self, text, allowed_special=(), disallowed_special=()):
        return (
            (self.special if allowed_special else self.plain)
            .encode(text, add_special_tokens=False)
            .ids
        )

    def encode_to_numpy(self, text, disallowed_special=()):
        return np.array(self.encode_ordinary(text), dtype=np.uint32)

    def decode(self, tokens):
        return self.plain.decode(list(tokens), skip_special_tokens=False)


def byte_alphabet():
    """GPT-2's byte -> character map: printable Latin-1 bytes stand for themselves, the other 68 (controls, space,
    ...) for chr(256), chr(257), ... in byte order, so that a space is 'Ġ' and a newline 'Ċ'."""
    printable = [
        *range(ord('!'), ord('~') + 1),
        *range(ord('¡'), ord('¬') + 1),
        *range(ord('®'), ord('ÿ') + 1),
    ]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


def reserved_ids(encoding):
    """{name: id} of the special tokens (SPECIAL_TOKENS) a loaded tokenizer holds besides the end-of-text token."""
    if isinstance(encoding, HFEncoding):
        return dict(encoding.reserved)
    return {
        name: encoding.encode_single_token(name)
        for name in SPECIAL_TOKENS
        if name in encoding.special_tokens_set
    }


# -----------------------------------------------------------------------------------------------------
# Bits per byte, exact: the loss over some targets divided by the UTF-8 bytes of those very targets. A folder-wide
# ratio is not that: the pystdlib folder's 3.837 bytes per token (meta.json, train and val together) is 3.796 on its
# val split and 3.867 on the targets train.py scores. Each token's bytes come from the tokenizer; special tokens
# (end-of-text, FIM's markers) are no text and have none, though their loss counts (it is the cost of the
# document boundaries, part of compressing the text).


def token_byte_lengths(encoding):
    """int64 array: the UTF-8 bytes of each token id's text, 0 for special tokens. `encoding` is load_tokenizer's
    (tiktoken: the bytes of each rank; neox: the byte-level BPE's token strings through GPT-2's byte alphabet,
    added tokens such as runs of spaces as their text)."""
    lengths = np.zeros(encoding.n_vocab, dtype=np.int64)
    if isinstance(encoding, HFEncoding):
        from_char = {c: b for b, c in byte_alphabet().items()}
        added = encoding.plain.get_added_tokens_decoder()
        for token_id in range(encoding.n_vocab):
            if token_id in added:
                lengths[token_id] = (
                    0 if added[token_id].special else len(added[token_id].content.encode())
                )
            elif (text := encoding.plain.id_to_token(token_id)) is not None:
                lengths[token_id] = (
                    len(text) if all(c in from_char for c in text) else len(text.encode())
                )
        return lengths
    special = {encoding.encode_single_token(name) for name in encoding.special_tokens_set}
    for token_id in range(encoding.n_vocab):
        if token_id not in special:
            try:
                lengths[token_id] = len(encoding.decode_single_token_bytes(token_id))
            except KeyError:  # an id between the ranks and the special tokens: never in a shard
                pass
    return lengths


_byte_lengths = {}  # data folder -> its tokenizer's token_byte_lengths, built once per process


def target_bytes(data_dir, targets):
    """The UTF-8 bytes of the text of `targets` (an int array of token ids of the folder's data; IGNORE_INDEX and
    other negative entries, which carry no loss, skipped): the denominator of exact bits per byte."""
    if data_dir not in _byte_lengths:
        _byte_lengths[data_dir] = token_byte_lengths(load_tokenizer(data_dir))
    targets = np.asarray(targets)
    return int(_byte_lengths[data_dir][targets[targets >= 0]].sum())


# -----------------------------------------------------------------------------------------------------
# Streams: the train split as an endless seeded stream of sequences (or synthetic tokens), the fixed val set,
# and each rank's slice of a micro-step (the module docstring says why the order is a function of the position).


class ShardStream:
    """The train split as an endless stream of sequences in a fixed order from the seed.

    A shard of n tokens holds (n - 1) // T sequences starting at multiples of T; neighbours share one token (the
    last target of one is the first input of the next, as in llm.c), so no token is wasted. Epoch e visits the
    shards in a seeded permutation and each shard's sequences in their own seeded permutation (llm.c's
    shuffle); the permutations are O(shard) memory, never O(dataset), even for 100B tokens.

    vocab_size and meta: every batch read is checked for ids past the model's vocab (a damaged or foreign shard
    would index past the embedding: a traceback far from its cause, on a GPU a device-side assert). A max over the
    batch on the host, before it goes to the device: no sync, nothing that grows with the model."""

    def __init__(self, shards, block_size, seed, vocab_size=None, meta=None):
        self.shards, self.block_size, self.seed = shards, block_size, seed
        self.vocab_size, self.meta = vocab_size, meta
        self.counts = np.array([(len(s) - 1) // block_size for s in shards], dtype=np.int64)
        self.per_epoch = int(self.counts.sum())
        self._epoch_plans, self._permutations = {}, {}

    def _epoch_plan(self, epoch):
        if epoch not in self._epoch_plans:
            self._epoch_plans = {}  # keep one epoch's plan: the stream only moves forward
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.shards))
            self._epoch_plans[epoch] = order, np.cumsum(self.counts[order])
        return self._epoch_plans[epoch]

    def _permutation(self, epoch, shard):
        key = (epoch, shard)
        if key not in self._permutations:
            if len(self._permutations) >= 4:
                self._permutations.clear()
            self._permutations[key] = np.random.default_rng(
                [self.seed, epoch, shard + 1]
            ).permutation(int(self.counts[shard]))
        return self._permutations[key]

    def locate(self, k):
        """(shard index, first token) of sequence k of the stream."""
        epoch, index = divmod(k, self.per_epoch)
        order, ends = self._epoch_plan(epoch)
        j = int(np.searchsorted(ends, index, side='right'))  # the j-th shard of this epoch holds it
        shard = int(order[j])
        local = index - (int(ends[j - 1]) if j else 0)
        return shard, int(self._permutation(epoch, shard)[local]) * self.block_size

    def sequence(self, k):
        shard, start = self.locate(k)
        return self.shards[shard][start : start + self.block_size + 1]

    def batch(self, first, count):
        """Sequences first .. first+count-1 of the stream, as an int64 array (count, block_size + 1)."""
        sequences = np.stack([self.sequence(k) for k in range(first, first + count)]).astype(
            np.int64
        )
        if self.vocab_size is not None and sequences.max() >= self.vocab_size:
            k = first + int(np.argmax((sequences >= self.vocab_size).any(axis=1)))
            shard, start = self.locate(k)
            raise id_past_vocab(self.sequence(k), start, self.vocab_size, self.meta)
        return sequences


class SyntheticStream:
    """data = 'synthetic': uniform random tokens, sequence k drawn from its own generator seeded by (seed, k), so
    any slice of the stream is reproducible. For benchmarks without a dataset (the loss stays near ln V)."""

    def __init__(self, vocab_size, block_size, seed, split):
        self.vocab_size, self.block_size, self.seed, self.split = (
            vocab_size,
            block_size,
            seed,
            split,
        )

    def batch(self, first, count):
        return np.stack(
            [
                np.random.default_rng([self.seed, self.split, k]).integers(
                    0, self.vocab_size, self.block_size + 1, dtype=np.int64
                )
                for k in range(first, first + count)
            ]
        )


def padded_vocab(vocab_size):
    """The data's vocab rounded up to a multiple of 128, the largest vocab_size a model of that data may have."""
    return 128 * math.ceil(vocab_size / 128)


def open_data(model_cfg, train):
    """-> (train stream, val sequences (n, T+1), meta or None). Missing data, or data whose vocabulary does not
    match the model, is one DataError line that names the prepare command."""
    if is_mixture(train.data):  # several folders with weights: the Mixtures section below
        return open_mixture(model_cfg, train)
    if train.data == 'synthetic':
        val = SyntheticStream(model_cfg.vocab_size, model_cfg.block_size, train.seed, split=1)
        n_val = max(1, train.eval_tokens // model_cfg.block_size)
        stream = SyntheticStream(model_cfg.vocab_size, model_cfg.block_size, train.seed, split=0)
        return stream, val.batch(0, n_val), None
    list_shards(train.data, 'train')  # DataError naming `python prepare.py ...` when none
    meta = load_meta(train.data)
    train_shards, val_shards = (
        open_split(train.data, meta, 'train'),
        open_split(train.data, meta, 'val'),
    )
    data_vocab = meta['vocab_size']
    # The model's vocab may be the data's padded up to a multiple of 128 (the spare rows are never targets);
    # smaller cannot hold the tokens, larger means the data was made with another tokenizer.
    if not data_vocab <= model_cfg.vocab_size <= padded_vocab(data_vocab):
        raise DataError(
            f"vocab mismatch: {train.data} was tokenized with {meta['tokenizer']} ({data_vocab:,} tokens) but the "
            f"model has vocab_size={model_cfg.vocab_size:,}: set vocab_size = {padded_vocab(data_vocab)}, or make "
            f"another folder with a tokenizer of the model's size (--tokenizer gpt2, neox or bpe:V; this one came "
            f"from `{prepare_command(train.data)}`)"
        )
    # an id past the embedding is one line here
    check_token_ids(train.data, meta, model_cfg.vocab_size)
    stream = ShardStream(train_shards, model_cfg.block_size, train.seed, model_cfg.vocab_size, meta)
    if stream.per_epoch == 0:
        raise DataError(
            f"the train shards in {train.data} hold fewer than block_size + 1 = "
            f"{model_cfg.block_size + 1} tokens each: prepare more data or lower block_size"
        )
    # The val set is fixed: the first eval_tokens of the val split, cut into consecutive sequences.
    needed, parts = train.eval_tokens + 1, []
    for shard in val_shards:
        shard = shard[: needed - sum(len(p) for p in parts)]
        if shard.max() >= model_cfg.vocab_size:  # the val set is read once: checked once
            raise id_past_vocab(shard, 0, model_cfg.vocab_size, meta)
        parts.append(np.asarray(shard, dtype=np.int64))
        if sum(len(p) for p in parts) >= needed:
            break
    tokens = np.concatenate(parts)
    T = model_cfg.block_size
    n_val = (len(tokens) - 1) // T
    if n_val == 0:
        # the split's own size (open_split checked it); eval_tokens may take fewer
        held = meta['val_tokens']
        if held > T:
            raise DataError(
                f"eval_tokens = {train.eval_tokens:,} takes {len(tokens):,} tokens of the val split of "
                f"{train.data} (which holds {held:,}), fewer than block_size + 1 = {T + 1:,}: raise eval_tokens to "
                f"at least {T:,}"
            )
        raise DataError(
            f"the val split of {train.data} holds {held:,} tokens, fewer than block_size + 1 = "
            f"{T + 1:,}: prepare more data or lower block_size"
        )
    val = np.stack([tokens[i * T : i * T + T + 1] for i in range(n_val)])
    return stream, val, meta


# -----------------------------------------------------------------------------------------------------
# Mixtures: `data` names several folders with weights (config.data_sources). mixture.py's Schedule says which
# source each global sequence comes from and which of that source's own sequences it is, so the mixture is, like one
# folder, a pure function of (seed, position). Each source keeps its own stream (its seed, epochs and shards) and its
# own val set, scored separately (train.py's eval, live_ledger.Metrics.record_sources). The folders share one tokenizer.


class MixtureStream:
    """Several ShardStreams interleaved by a mixture.Schedule: global sequence k is sequence j of source s, where
    (s, j) = schedule.locate(k)."""

    def __init__(self, streams, schedule):
        self.streams, self.schedule = streams, schedule

    def sequence(self, k):
        source, j = self.schedule.locate(k)
        return self.streams[source].sequence(j)

    def batch(self, first, count):
        return np.stack([self.sequence(k) for k in range(first, first + count)]).astype(np.int64)


def tokenizer_folder(data):
    """The folder whose tokenizer.json a run reads: `data`, or a mixture's first folder (they share one)."""
    return data_sources(data)[0][0]


def open_mixture(model_cfg, train):
    """open_data for a mixture: -> (MixtureStream, {source name: val sequences}, meta). Each folder is opened and
    checked as one (open_data), its val set the first eval_tokens / sources of its val split; the folders must hold
    the same tokenizer.json. meta is the first folder's, with the mixture's train_tokens (summed), its bytes per
    token (the weighted mean: the loss per token of the mixture divided by it is bits per mixture byte) and
    'sources' {name: {folder, weight, bytes_per_token, train_tokens}}."""
    schedule = mixture.Schedule(train.data, train.seed)
    per_source = dataclasses.replace(
        train, eval_tokens=max(1, train.eval_tokens // len(schedule.folders))
    )
    streams, vals, metas, tokenizers = [], {}, [], []
    for name, folder in zip(schedule.names, schedule.folders):
        stream, val, meta = open_data(model_cfg, dataclasses.replace(per_source, data=folder))
        streams.append(stream)
        vals[name] = val
        metas.append(meta)
        with open(
            os.path.join(folder, 'tokenizer.json'), 'rb'
        ) as f:  # load_tokenizer read it: valid JSON
            tokenizers.append(json.loads(f.read()))
    for folder, tokenizer in zip(schedule.folders[1:], tokenizers[1:]):
        if tokenizer != tokenizers[0]:
            raise DataError(
                f"the mixture's folders must share one tokenizer, but {folder}/tokenizer.json differs from "
                f"{schedule.folders[0]}/tokenizer.json: copy the latter into a new folder and prepare it there "
                f"(prepare.py keeps a tokenizer.json that is already the one asked for)"
            )
    bytes_per_token = [m.get('bytes_per_token') for m in metas]
    sources = {
        name: dict(folder=folder, weight=weight, bytes_per_token=b, train_tokens=m['train_tokens'])
        for name, folder, weight, b, m in zip(
            schedule.names, schedule.folders, schedule.weights, bytes_per_token, metas
        )
    }
    meta = dict(
        metas[0],
        train_tokens=sum(m['train_tokens'] for m in metas),
        bytes_per_token=sum(w * b for w, b in zip(schedule.weights, bytes_per_token))
        if all(bytes_per_token)
        else None,
        sources=sources,
    )
    return MixtureStream(streams, schedule), vals, meta


# -----------------------------------------------------------------------------------------------------


def micro_batch_arrays(stream, position, micro_step, cluster, micro_batch, objective):
    """Rank r's inputs and targets for micro-step m of the step that starts at stream `position`. The step's
    sequences are position .. position + accum x world x micro_batch - 1; micro-step m, rank r takes the slice
    (m x world + r) x micro_batch of length micro_batch. So the ranks' slices are disjoint and together are
    exactly what one process with world x the accumulation reads (test_distributed.py checks it). `objective`
    (objectives.py; objectives.CLM for plain next-token prediction, (s[:-1], s[1:])) makes (inputs, targets) of each
    sequence from its tokens and its index in the stream alone: a resumed run and any world size transform every
    sequence alike."""
    first = position + (micro_step * cluster.world_size + cluster.rank) * micro_batch
    return objective(stream.batch(first, micro_batch), first)


def to_device(array, device):
    """A numpy batch as a tensor on `device`."""
    import torch

    tensor = torch.from_numpy(array)
    # pinned host memory lets the copy run asynchronously with the GPU's work
    if device.type == 'cuda':
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor
