"""
data.py: a prepared data folder, read: its token shards, meta.json and tokenizer, and the seeded
stream of training sequences cut from them. The commands read data through this file alone;
prepare.py makes the folders (docs/data.md: the shard format and what a folder holds), writing
their shards with write_shard.

The stream: sequence k (block_size + 1 tokens: the inputs its first block_size, the targets its
last) is a pure function of (seed, k), k counting the sequences all ranks have consumed. So a
checkpoint holds that one integer, and any world size reads the same stream (micro_batch_arrays).
numpy and the standard library at import; tiktoken, tokenizers and torch where they are used.
"""

import base64
import contextlib
import dataclasses
import glob
import json
import math
import os

import numpy as np

from ledgergpt import mixture
from ledgergpt.config import EOT, SPECIAL_TOKENS, DataError, data_sources, is_mixture
from ledgergpt.files import atomic_write, load_json

# --------------------------------------------------------------------------------------------------
# Shards (llm.c's dev/data/data_common.py): a 1024-byte header of 256 little-endian int32 (magic,
# version, token count, the rest zero), then the tokens.

HEADER_BYTES = 1024
SHARD_FORMATS = {  # (magic, version) -> token dtype
    (20240520, 1): np.dtype('<u2'),  # llm.c, GPT-2
    (20240801, 7): np.dtype('<u4'),  # llm.c, Llama 3
    (20240520, 2): np.dtype('<u4'),  # ours before we wrote Llama 3's header: read, never written
}
WRITTEN_FORMATS = {2: (20240520, 1), 4: (20240801, 7)}  # bytes per token -> (magic, version)


def token_dtype(vocab_size):
    """uint16 while every id fits (vocab <= 65,536: GPT-2's 50,257, NeoX's 50,277), else uint32: the
    ledger's sums.token_bytes, which test_data.py holds to it."""
    return np.dtype('<u2') if vocab_size <= 2**16 else np.dtype('<u4')


def write_shard(path, tokens):
    """Write a shard atomically, -> its largest id: uint16 arrays in GPT-2's format, uint32 in Llama
    3's, other integers in the smaller that holds them."""
    tokens = np.asarray(tokens)
    largest = int(tokens.max()) if tokens.size else -1
    if tokens.dtype not in (np.uint16, np.uint32):
        if tokens.size and (tokens.min() < 0 or largest >= 2**32):
            raise DataError(f"{path}: token ids {tokens.min()}..{largest} are not all in [0, 2^32)")
        tokens = tokens.astype(token_dtype(largest + 1))
    magic, version = WRITTEN_FORMATS[tokens.dtype.itemsize]
    header = np.zeros(HEADER_BYTES // 4, dtype='<i4')
    header[:3] = magic, version, len(tokens)
    with atomic_write(path, 'wb') as f:
        f.write(header.tobytes())
        # no copy, unlike .tobytes()
        f.write(np.ascontiguousarray(tokens, dtype=SHARD_FORMATS[magic, version]).data)
    return largest


def open_shard(path):
    """One shard's tokens as a read-only np.memmap, its header checked against the file's size."""
    try:
        size = os.path.getsize(path)
    except OSError:
        raise DataError(f"{path}: no such shard") from None
    if size < HEADER_BYTES:
        raise DataError(
            f"{path}: {size} bytes, shorter than the {HEADER_BYTES}-byte shard header (truncated?)"
        )
    magic, version, n_tokens = np.fromfile(path, dtype='<i4', count=3).tolist()
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


# --------------------------------------------------------------------------------------------------
# The folder: its shards by split, the command that makes it, meta.json, its largest token id.

# prepare.py's sources (which name the shards) -> the arguments their command takes
SOURCES = dict(pystdlib='', fineweb_edu='', files=' PATH...')
SOURCES['hub'] = ' REPO --config NAME --column TEXT'


def shard_path(data_dir, prefix, split, index):
    return os.path.join(data_dir, f'{prefix}_{split}_{index:06d}.bin')


def list_shards(data_dir, split):
    if not (paths := sorted(glob.glob(os.path.join(glob.escape(data_dir), f'*_{split}_*.bin')))):
        raise DataError(
            f"no {split} shards (*_{split}_*.bin) in {data_dir}: make them with "
            f"`python prepare.py pystdlib --out {data_dir}` (or fineweb_edu, or files PATH...)"
        )
    return paths


def open_split(data_dir, meta, split):
    """The split's shards, checked against meta.json's counts of shards and tokens: one gone, cut
    short or swapped would train on less data (under torchrun, one rank on another stream). The
    shards are numbered across the folder (val 0 .. V-1, train V ..): that names the one missing."""
    paths, listed = list_shards(data_dir, split), meta[f'{split}_shards']
    remake = f"remake the folder ({prepare_command(data_dir)}, same options)"
    prefix = os.path.basename(paths[0]).rsplit(f'_{split}_', 1)[0]
    first = 0 if split == 'val' else meta['val_shards']
    expected = [shard_path(data_dir, prefix, split, i) for i in range(first, first + listed)]
    if len(paths) < listed:
        missing = next((p for p in expected if p not in paths), f"one of the {split} shards")
        raise DataError(
            f"{missing} is missing: meta.json lists {listed} {split} shards and {len(paths)} are "
            f"here (a run would train on less data): copy it back, or {remake}"
        )
    if len(paths) > listed:
        extra = next((p for p in paths if p not in expected), paths[-1])
        raise DataError(
            f"{extra} is not one of the {listed} {split} shards meta.json lists ({len(paths)} are "
            f"here): delete it, or {remake}"
        )
    shards = [open_shard(p) for p in paths]
    if (held := sum(len(s) for s in shards)) != meta[f'{split}_tokens']:
        raise DataError(
            f"the {split} shards of {data_dir} hold {held:,} tokens, but meta.json says "
            f"{meta[f'{split}_tokens']:,}: a shard was replaced or damaged; {remake}"
        )
    return shards


def prepare_command(data_dir):
    """The command that makes the folder, as far as its shards' names tell the source."""
    names = [os.path.basename(p) for p in glob.glob(os.path.join(glob.escape(data_dir), '*.bin'))]
    source = next((s for s in SOURCES if any(n.startswith(s + '_') for n in names)), 'pystdlib')
    return f"python prepare.py {source}{SOURCES[source]} --out {data_dir}"


# meta.json's keys that train.py and sample.py rely on, with their types; load_meta checks them all
META_KEYS = dict(source=str, tokenizer=str, vocab_size=int, eot_id=int, dtype=str, documents=int)
META_KEYS.update(train_tokens=int, val_tokens=int, train_shards=int, val_shards=int, request=dict)
OPTIONAL_META_KEYS = dict(max_token_id=int, special_tokens=dict)
TYPE_NAMES = {str: 'a string', int: 'a whole number', dict: 'a JSON object'}


def load_meta(data_dir):
    """The folder's meta.json, each key checked: one DataError line names the file and remake."""
    path = os.path.join(data_dir, 'meta.json')
    command = prepare_command(data_dir)
    remake = f"rerun the command that made the folder ({command}, same options) to remake it"
    if not os.path.exists(path):
        raise DataError(
            f"no meta.json in {data_dir}: prepare.py has not finished there "
            f"(run `python prepare.py pystdlib --out {data_dir}`, or rerun your prepare command)"
        )
    try:
        meta = load_json(path)
    except ValueError as e:  # bad JSON, or bytes that are not text at all
        raise DataError(f"{path} is not valid JSON ({e}): {remake}") from None
    if not isinstance(meta, dict):
        raise DataError(f"{path} holds a JSON {type(meta).__name__}, not an object: {remake}")
    optional = {key: kind for key, kind in OPTIONAL_META_KEYS.items() if key in meta}
    for key, kind in (META_KEYS | optional).items():
        if key not in meta:
            raise DataError(f"{path} has no '{key}': {remake}")
        if not isinstance(meta[key], kind) or isinstance(meta[key], bool):
            raise DataError(f"{path}: '{key}' is {meta[key]!r}, not {TYPE_NAMES[kind]}: {remake}")
    if meta['vocab_size'] <= 0:
        raise DataError(f"{path}: 'vocab_size' is {meta['vocab_size']}, not positive: {remake}")
    return meta


def check_token_ids(data_dir, meta, vocab_size):
    """The largest token id of the folder's shards, checked below `vocab_size`: past the embedding
    an id fails far from its cause (a GPU's device-side assert). meta.json's max_token_id answers at
    once; without it (llm.c's shards) each shard is read once."""
    if (largest := meta.get('max_token_id')) is not None and largest < vocab_size:
        return largest
    largest = -1
    for shard in map(open_shard, list_shards(data_dir, 'val') + list_shards(data_dir, 'train')):
        largest = max(largest, int(shard.max()))
        if largest >= vocab_size:
            raise id_past_vocab(shard, 0, vocab_size, meta)
    return largest


def id_past_vocab(tokens, start, vocab_size, meta):
    """The DataError for the first id of `tokens` (a shard's memmap from `start`) >= vocab_size."""
    index = int(np.argmax(np.asarray(tokens) >= vocab_size))
    path = tokens.filename
    return DataError(
        f"{path}: token id {int(tokens[index]):,} at position {start + index:,} is outside the "
        f"model's vocab of {vocab_size:,} (ids 0..{vocab_size - 1:,}), though meta.json says "
        f"{meta['tokenizer']} ({meta['vocab_size']:,} tokens): the shard was made with another "
        f"tokenizer, or is damaged; remake the folder ({prepare_command(os.path.dirname(path))}), "
        f"or raise vocab_size if the data is right"
    )


# --------------------------------------------------------------------------------------------------
# The tokenizer, as prepare.py wrote it. gpt2's and bpe:V's tokenizer.json is what tiktoken.Encoding
# needs: every rank's bytes (base64, list index = rank), the pre-split regex, the special tokens.
# neox's holds the Hub's own tokenizer.json, read through the `tokenizers` library (HFEncoding).
def load_tokenizer(data_dir):
    """The folder's tokenizer.json as a tiktoken.Encoding (an HFEncoding for neox): no download, no
    cache. A mixture reads its first folder's (all share one)."""
    data_dir = tokenizer_folder(data_dir)
    path = os.path.join(data_dir, 'tokenizer.json')
    if not os.path.exists(path):
        raise DataError(f"no tokenizer.json in {data_dir}: make the folder with prepare.py")
    try:
        spec = load_json(path)
        name = spec['name']
        if 'tokenizers' not in spec:
            import tiktoken

            ranks = {base64.b64decode(token): rank for rank, token in enumerate(spec['ranks'])}
            special = spec['special_tokens']
            return tiktoken.Encoding(
                name, pat_str=spec['pattern'], mergeable_ranks=ranks, special_tokens=special
            )
        hub = (json.dumps(spec['tokenizers']), spec.get('special_tokens', ()))
        return HFEncoding(name, *hub, spec.get('document_start', EOT))
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(
            f"{path} is damaged ({type(e).__name__}: {e}): delete the folder and rerun "
            f"{prepare_command(data_dir)}"
        ) from None
    except ImportError as e:
        raise DataError(
            f"{path} is {name}'s tokenizer, which needs the {e.name} package: pip install "
            f"{e.name} (it is in requirements.txt)"
        ) from None


class HFEncoding:
    """A `tokenizers` tokenizer as the part of tiktoken.Encoding this project uses: '<|endoftext|>'
    in a text is text unless encode() is given allowed_special (sample.py's prompts). eot_token
    starts each document: '<|endoftext|>' or a model's own (a Llama's BOS)."""

    def __init__(self, name, spec_text, reserved=(), document_start=EOT):
        from tokenizers import AddedToken, Tokenizer

        self.name = name
        # special tokens written in a text are special tokens here, and text in `plain`
        self.special, self.plain = Tokenizer.from_str(spec_text), Tokenizer.from_str(spec_text)
        self.plain.encode_special_tokens = True  # (the added runs of spaces stay)
        first = self.plain.get_vocab_size(with_added_tokens=True)
        # the reserved tokens (SPECIAL_TOKENS) after the Hub's ids
        added = [AddedToken(t, special=True, normalized=False) for t in reserved]
        self.special.add_special_tokens(added)
        self.plain.add_special_tokens(added)
        self.reserved = {t: self.plain.token_to_id(t) for t in reserved}
        if list(self.reserved.values()) != list(range(first, first + len(reserved))):
            raise DataError(
                f"the tokenizers library put {name}'s special tokens at ids {self.reserved}, not "
                f"from {first} on: remake the folder with --no-special-tokens"
            )
        self.n_vocab, self.eot_token = first + len(reserved), self.plain.token_to_id(document_start)

    def encode(self, text, allowed_special=(), disallowed_special=()):
        tokenizer = self.special if allowed_special else self.plain
        return tokenizer.encode(text, add_special_tokens=False).ids

    encode_ordinary = encode  # nothing allowed: '<|endoftext|>' in the text is text

    def encode_to_numpy(self, text, disallowed_special=()):
        return np.array(self.encode(text), dtype=np.uint32)

    def decode(self, tokens):
        return self.plain.decode(list(tokens), skip_special_tokens=False)


def byte_alphabet():
    """GPT-2's byte -> character map: printable Latin-1 bytes stand for themselves, the other 68 for
    chr(256), chr(257), ... in byte order (a space is 'Ġ', a newline 'Ċ')."""
    printable = [*range(ord('!'), ord('~') + 1), *range(ord('¡'), ord('¬') + 1)]
    printable += range(ord('®'), ord('ÿ') + 1)
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


def reserved_ids(encoding):
    """{name: id} of the SPECIAL_TOKENS the tokenizer holds besides the end-of-text token."""
    if isinstance(encoding, HFEncoding):
        return dict(encoding.reserved)
    held = encoding.special_tokens_set
    return {name: encoding.encode_single_token(name) for name in SPECIAL_TOKENS if name in held}


# --------------------------------------------------------------------------------------------------
# Bits per byte, exact: the loss over some targets divided by the UTF-8 bytes of those very targets.
# A folder-wide ratio is not that: the pystdlib folder's 3.837 bytes per token (meta.json) is 3.796
# on its val split and 3.867 on the targets train.py scores. Special tokens are no text, though
# their loss counts (the cost of the document boundaries, part of compressing the text).
def token_byte_lengths(encoding):
    """Each token id's UTF-8 bytes, 0 for special tokens (neox: byte-level token strings through
    GPT-2's byte alphabet, added tokens as their text)."""
    lengths = np.zeros(encoding.n_vocab, dtype=np.int64)
    if isinstance(encoding, HFEncoding):
        byte_chars = set(byte_alphabet().values())
        added = encoding.plain.get_added_tokens_decoder()
        for token_id in range(encoding.n_vocab):
            if (token := added.get(token_id)) is not None:
                lengths[token_id] = 0 if token.special else len(token.content.encode())
            elif (text := encoding.plain.id_to_token(token_id)) is not None:
                lengths[token_id] = len(text) if set(text) <= byte_chars else len(text.encode())
        return lengths
    special = {encoding.encode_single_token(name) for name in encoding.special_tokens_set}
    for token_id in set(range(encoding.n_vocab)) - special:
        # KeyError: an id between the ranks and the special tokens, never in a shard
        with contextlib.suppress(KeyError):
            lengths[token_id] = len(encoding.decode_single_token_bytes(token_id))
    return lengths


_byte_lengths = {}  # data folder -> its tokenizer's token_byte_lengths


def byte_lengths(data_dir):
    """The folder's tokenizer's token_byte_lengths, built once per process."""
    if data_dir not in _byte_lengths:
        _byte_lengths[data_dir] = token_byte_lengths(load_tokenizer(data_dir))
    return _byte_lengths[data_dir]


def target_bytes(data_dir, targets):
    """The UTF-8 bytes of the text of `targets`, negative ones (IGNORE_INDEX: no loss) skipped."""
    targets = np.asarray(targets)
    return int(byte_lengths(data_dir)[targets[targets >= 0]].sum())


# --------------------------------------------------------------------------------------------------
# Streams: the train split as an endless seeded stream of sequences (or synthetic tokens), the fixed
# val set, a mixture's streams interleaved, and each rank's slice of a micro-step.
class Stream:
    """sequence(k) is the k-th sequence; batch(first, count) stacks count of them as int64."""

    def batch(self, first, count):
        return np.stack([self.sequence(k) for k in range(first, first + count)], dtype=np.int64)


class ShardStream(Stream):
    """The train split as an endless stream of sequences in a fixed order from the seed. A shard of
    n tokens holds (n - 1) // T sequences at multiples of T; neighbours share a token (the last
    target of one is the next one's first input, as in llm.c). Epoch e visits the shards in a seeded
    permutation, and each shard's sequences in their own (llm.c's shuffle): O(shard) memory, never
    O(dataset). Each batch is checked for ids past vocab_size (a damaged or foreign shard): a max on
    the host, before the device, so no sync."""

    def __init__(self, shards, block_size, seed, vocab_size=None, meta=None):
        self.shards, self.block_size, self.seed = shards, block_size, seed
        self.vocab_size, self.meta = vocab_size, meta
        self.counts = np.array([(len(s) - 1) // block_size for s in shards], dtype=np.int64)
        self.per_epoch = int(self.counts.sum())
        self._plans, self._permutations = {}, {}

    def locate(self, k):
        epoch, index = divmod(k, self.per_epoch)
        if epoch not in self._plans:  # one epoch's plan is kept: the stream only moves forward
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.shards))
            self._plans = {epoch: (order, np.cumsum(self.counts[order]))}
        order, ends = self._plans[epoch]
        j = int(np.searchsorted(ends, index, side='right'))  # the j-th shard of this epoch holds it
        shard, local = int(order[j]), index - (int(ends[j - 1]) if j else 0)
        if (epoch, shard) not in self._permutations:
            if len(self._permutations) >= 4:
                self._permutations.clear()
            rng = np.random.default_rng([self.seed, epoch, shard + 1])
            self._permutations[epoch, shard] = rng.permutation(int(self.counts[shard]))
        return shard, int(self._permutations[epoch, shard][local]) * self.block_size

    def sequence(self, k):
        shard, start = self.locate(k)
        return self.shards[shard][start : start + self.block_size + 1]

    def batch(self, first, count):
        sequences = super().batch(first, count)
        if self.vocab_size is not None and sequences.max() >= self.vocab_size:
            k = first + int(np.argmax((sequences >= self.vocab_size).any(axis=1)))
            raise id_past_vocab(self.sequence(k), self.locate(k)[1], self.vocab_size, self.meta)
        return sequences


class SyntheticStream(Stream):
    """data = 'synthetic': uniform random tokens, sequence k drawn by its own generator (seed,
    split, k). For benchmarks without a dataset (the loss stays near ln V)."""

    def __init__(self, vocab_size, block_size, seed, split):
        self.vocab_size, self.block_size, self.seed = vocab_size, block_size, seed
        self.split = split

    def sequence(self, k):
        rng = np.random.default_rng([self.seed, self.split, k])
        return rng.integers(0, self.vocab_size, self.block_size + 1, dtype=np.int64)


class MixtureStream(Stream):
    """ShardStreams interleaved by schedule.locate(k) -> (source, sequence j of its stream)."""

    def __init__(self, streams, schedule):
        self.streams, self.schedule = streams, schedule

    def sequence(self, k):
        source, j = self.schedule.locate(k)
        return self.streams[source].sequence(j)


def padded_vocab(vocab_size):
    """The data's vocab rounded up to a multiple of 128: the largest vocab_size a model may have."""
    return 128 * math.ceil(vocab_size / 128)


def open_data(model_cfg, train):
    """-> (train stream, val sequences (n, T+1), meta or None). Missing data, or data whose vocab
    does not fit the model, is one DataError line naming the prepare command."""
    if is_mixture(train.data):
        return open_mixture(model_cfg, train)
    T, V = model_cfg.block_size, model_cfg.vocab_size
    if train.data == 'synthetic':
        val = SyntheticStream(V, T, train.seed, split=1).batch(0, max(1, train.eval_tokens // T))
        return SyntheticStream(V, T, train.seed, split=0), val, None
    list_shards(train.data, 'train')  # DataError naming `python prepare.py ...` when none
    meta = load_meta(train.data)
    train_shards, val_shards = (open_split(train.data, meta, split) for split in ('train', 'val'))
    data_vocab, padded = meta['vocab_size'], padded_vocab(meta['vocab_size'])
    # The model's vocab may be the data's padded up to a multiple of 128 (the spare rows are never
    # targets); smaller cannot hold the tokens, larger means another tokenizer made the data.
    if not data_vocab <= V <= padded:
        raise DataError(
            f"vocab mismatch: {train.data} was tokenized with {meta['tokenizer']} ({data_vocab:,} "
            f"tokens) but the model has vocab_size={V:,}: set vocab_size = {padded}, or make "
            "another folder with a tokenizer of the model's size (--tokenizer gpt2, neox or "
            f"bpe:V; this one came from `{prepare_command(train.data)}`)"
        )
    check_token_ids(train.data, meta, V)
    if (stream := ShardStream(train_shards, T, train.seed, V, meta)).per_epoch == 0:
        raise DataError(
            f"the train shards in {train.data} hold fewer than block_size + 1 = {T + 1} tokens "
            f"each: prepare more data or lower block_size"
        )
    return stream, val_set(val_shards, meta, T, V, train), meta


def val_set(shards, meta, T, V, train):
    """The first eval_tokens of the val split, cut into consecutive sequences of T + 1."""
    parts, left = [], train.eval_tokens + 1
    for shard in shards:
        part = shard[:left]
        if part.max() >= V:  # the val set is read once: checked once
            raise id_past_vocab(part, 0, V, meta)
        parts.append(np.asarray(part, dtype=np.int64))
        left -= len(part)
        if left == 0:
            break
    tokens = np.concatenate(parts)
    n_val = (len(tokens) - 1) // T
    held = meta['val_tokens']  # the split's own size (open_split checked it)
    if n_val == 0 and held > T:
        raise DataError(
            f"eval_tokens = {train.eval_tokens:,} takes {len(tokens):,} tokens of the val split of "
            f"{train.data} (which holds {held:,}), fewer than block_size + 1 = {T + 1:,}: raise "
            f"eval_tokens to at least {T:,}"
        )
    if n_val == 0:
        raise DataError(
            f"the val split of {train.data} holds {held:,} tokens, fewer than block_size + 1 = "
            f"{T + 1:,}: prepare more data or lower block_size"
        )
    return np.stack([tokens[i * T : i * T + T + 1] for i in range(n_val)])


def tokenizer_folder(data):
    """The folder whose tokenizer.json a run reads: `data`, or a mixture's first folder."""
    return data_sources(data)[0][0]


def open_mixture(model_cfg, train):
    """open_data for a mixture -> (MixtureStream, {source name: val sequences}, meta). Each source
    keeps its own stream and val set (eval_tokens / sources), scored on its own. meta is the first
    folder's with the mixture's train_tokens (summed), bytes per token (the weighted mean: bits per
    mixture byte) and 'sources' {name: {folder, weight, bytes_per_token, train_tokens}}."""
    schedule = mixture.Schedule(train.data, train.seed)
    eval_tokens = max(1, train.eval_tokens // len(schedule.folders))
    streams, vals, metas, sources = [], {}, [], {}
    for name, folder, weight in zip(schedule.names, schedule.folders, schedule.weights):
        one = dataclasses.replace(train, data=folder, eval_tokens=eval_tokens)
        stream, vals[name], meta = open_data(model_cfg, one)
        streams.append(stream)
        metas.append(meta)
        held = dict(bytes_per_token=meta.get('bytes_per_token'), train_tokens=meta['train_tokens'])
        sources[name] = dict(folder=folder, weight=weight, **held)
    first, *others = (load_json(os.path.join(f, 'tokenizer.json')) for f in schedule.folders)
    for folder, tokenizer in zip(schedule.folders[1:], others):
        if tokenizer != first:
            raise DataError(
                f"the mixture's folders must share one tokenizer, but {folder}/tokenizer.json "
                f"differs from {schedule.folders[0]}/tokenizer.json: copy the latter into a new "
                f"folder and prepare it there (prepare.py keeps a tokenizer.json that is already "
                f"the one asked for)"
            )
    per_token = [source['bytes_per_token'] for source in sources.values()]
    mean = sum(w * b for w, b in zip(schedule.weights, per_token)) if all(per_token) else None
    train_tokens = sum(m['train_tokens'] for m in metas)
    meta = dict(metas[0], train_tokens=train_tokens, bytes_per_token=mean, sources=sources)
    return MixtureStream(streams, schedule), vals, meta


def micro_batch_arrays(stream, position, micro_step, cluster, micro_batch, objective):
    """Rank r's (inputs, targets) of micro-step m of the step at stream `position`: slice (m x world
    + r) x micro_batch of the step's sequences, so that the ranks' slices are disjoint and together
    one process's (test_distributed.py); `objective` transforms each sequence on its own."""
    first = position + (micro_step * cluster.world_size + cluster.rank) * micro_batch
    return objective(stream.batch(first, micro_batch), first)


def to_device(array, device):
    import torch

    tensor = torch.from_numpy(array)
    # pinned host memory lets the copy run asynchronously with the GPU's work
    return tensor.pin_memory().to(device, non_blocking=True) if device.type == 'cuda' else tensor
