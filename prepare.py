"""
prepare.py: text -> tokenizer -> token shards that train.py reads.

    python prepare.py pystdlib                      # the running Python's stdlib, our BPE (seconds)
    python prepare.py fineweb_edu --tokens 26e9     # FineWeb-Edu sample-100BT in GPT-2 tokens
    python prepare.py fineweb_edu --tokenizer neox  # ... in GPT-NeoX-20B's tokens (from the Hub)
    python prepare.py hub HuggingFaceTB/finemath --config finemath-3plus   # any parquet dataset
    python prepare.py files a.txt b.jsonl c.parquet # your own text

The folder it writes (shards, tokenizer.json, meta.json last) is docs/data.md's; reading it is
data.py's job, downloading downloads.py's. rustbpe, tiktoken, tokenizers and pyarrow are imported
where they are used.
"""

import argparse
import base64
import bisect
import collections
import contextlib
import dataclasses
import glob
import hashlib
import itertools
import json
import os
import pathlib
import signal
import sys
import sysconfig
import time
import zlib
from concurrent.futures import BrokenExecutor, ProcessPoolExecutor

# standard library only: first, so that Ctrl-C or SIGTERM during the slower imports is one line
from ledgergpt import config

if __name__ == '__main__':
    config.quiet_stops()

import numpy as np

from ledgergpt import data, downloads, files, pretrained, sums
from ledgergpt.config import EOT, SPECIAL_TOKENS, DataError, cli
from ledgergpt.downloads import Hub, Network, Progress, download, say, size_of
from ledgergpt.files import free_bytes, human_bytes, load_json, remove_quietly, save_json

# --------------------------------------------------------------------------------------------------
# Tokenizers, written as data.load_tokenizer reads them (its comment says how); gpt2's ranks are
# copied into ours, as tiktoken's own loader caches by path in /tmp: a folder rebuilt with another
# vocab would load the old ranks.

# gpt2: 50,000 merges + 256 bytes + <|endoftext|>; neox: 50,254 BPE tokens + 23 runs of spaces
NAMED_TOKENIZERS = {'gpt2': 50257, 'neox': 50277}
NEOX_REPO = 'EleutherAI/gpt-neox-20b'


def reserve(first_id, special=True):
    """The special tokens' ids from first_id on, as {name: id} (none without special tokens)."""
    return {name: first_id + i for i, name in enumerate(SPECIAL_TOKENS)} if special else {}


def save_tokenizer(data_dir, name, pattern, ranks, eot_id, reserved):
    ordered = sorted(ranks, key=ranks.get)
    assert [ranks[token] for token in ordered] == list(range(len(ordered))), "ranks must be 0..n-1"
    special = {**reserved, EOT: eot_id}
    encoded = [base64.b64encode(token).decode('ascii') for token in ordered]
    spec = {'name': name, 'pattern': pattern, 'special_tokens': special}
    spec.update(vocab_size=max(special.values()) + 1, ranks=encoded)
    save_json(os.path.join(data_dir, 'tokenizer.json'), spec)


def parse_tokenizer(name):
    """gpt2, neox, bpe:V or a model's folder or Hub repo id -> its vocab size, or a DataError."""
    if name in NAMED_TOKENIZERS:
        return NAMED_TOKENIZERS[name]
    if name.startswith('bpe:') and name[4:].isdigit() and int(name[4:]) > 256:
        return int(name[4:])
    if is_model(name):
        return model_tokenizer(name)[2].get_vocab_size(with_added_tokens=True)
    raise DataError(
        f"unknown tokenizer '{name}': use gpt2, neox, bpe:V with V > 256 (e.g. bpe:8192), or a "
        f"model's: a Hugging Face model folder or Hub repo id"
    )


def make_tokenizer(out_dir, tokenizer, bpe_texts, network=None, special=True):
    """The folder's tokenizer.json, with the SPECIAL_TOKENS if `special`. One already there is kept
    if it is that tokenizer with those tokens (a rerun carries on with its shards' tokenizer). bpe:V
    trains on bpe_texts(), called only then (it may download)."""
    path = os.path.join(out_dir, 'tokenizer.json')
    # a model's tokenizer: its ids exactly, no reserved ones
    special = special and not is_model(tokenizer)
    if os.path.exists(path):
        try:
            spec = load_json(path)
            name = spec.get('name')
            has_special = any(n in spec.get('special_tokens', ()) for n in SPECIAL_TOKENS)
        except (ValueError, AttributeError):
            name, has_special = 'a damaged file', special
        if name == tokenizer and has_special == special:
            return
        other = '' if has_special == special else ' with other special tokens'
        say(f"{path} is {name}{other}, not {tokenizer}: making it again")
    if tokenizer == 'gpt2':
        make_gpt2_tokenizer(out_dir, special)
    elif tokenizer == 'neox':
        make_neox_tokenizer(out_dir, network, special)
    elif is_model(tokenizer):
        make_model_tokenizer(out_dir, tokenizer, network)
    else:
        train_bpe_tokenizer(out_dir, parse_tokenizer(tokenizer), bpe_texts(), special)


def make_gpt2_tokenizer(data_dir, special=True):
    """GPT-2's BPE from tiktoken, the special tokens in the model's padding (50,257 ...)."""
    from tiktoken_ext.openai_public import gpt2

    try:
        spec = gpt2()
    except Exception as e:  # requests' ConnectionError, or anything else the download raises
        raise DataError(
            f"the gpt2 tokenizer's files could not be downloaded ({type(e).__name__}): run once "
            f"with internet so tiktoken caches them, or use our own BPE with --tokenizer bpe:8192"
        ) from None
    eot_id, ranks = spec['special_tokens'][EOT], spec['mergeable_ranks']
    save_tokenizer(data_dir, 'gpt2', spec['pat_str'], ranks, eot_id, reserve(eot_id + 1, special))


def train_bpe_tokenizer(data_dir, vocab_size, texts, special=True):
    """Our own byte-level BPE (rustbpe, GPT-4's split pattern), used through tiktoken: 256 bytes +
    the merges, the 22 SPECIAL_TOKENS (if `special`), the end-of-text token last. bpe:8192: 7,913
    merges, the special tokens at 8,169-8,190, eot 8,191."""
    import rustbpe

    reserved = len(SPECIAL_TOKENS) if special else 0
    wanted = vocab_size - 1 - reserved
    if wanted < 256:
        raise DataError(
            f"bpe:{vocab_size} has no room for its 256 bytes, the end-of-text token and the "
            f"{reserved} special tokens: use bpe:{257 + reserved} or more (or --no-special-tokens)"
        )
    sample_chars = 0

    def counted():
        nonlocal sample_chars
        for text in texts:
            sample_chars += len(text)
            yield text

    tokenizer = rustbpe.Tokenizer()
    tokenizer.train_from_iterator(counted(), wanted)
    ranks = {bytes(token): rank for token, rank in tokenizer.get_mergeable_ranks()}
    if len(ranks) != wanted:
        raise DataError(
            f"the BPE sample ({sample_chars:,} characters) only supports "
            f"{len(ranks) + 1 + reserved} tokens, not bpe:{vocab_size}: use a smaller vocab, or "
            "more text (--tokens, --bpe-sample-chars)"
        )
    pattern, reserved_ids = tokenizer.get_pattern(), reserve(len(ranks), special)
    save_tokenizer(data_dir, f'bpe:{vocab_size}', pattern, ranks, vocab_size - 1, reserved_ids)


# GPT-NeoX-20B's tokenizer.json is a byte-level BPE with two settings tiktoken cannot express: NFC
# (decode(encode(x)) is NFC(x)), and 23 runs of 2..24 spaces split off first, longest first: 4
# spaces + 'return' is [4 spaces, 'return'], GPT-2's [3 spaces, ' return']. So it goes through
# `tokenizers` (data.HFEncoding): exact by construction. A model pads its 50,277 ids to 50,304.
def make_neox_tokenizer(out_dir, network=None, special=True):
    """NeoX's tokenizer.json, fetched once from the Hub like the data (HF_ENDPOINT, HF_TOKEN,
    verified), kept in ours with its commit and the SPECIAL_TOKENS HFEncoding adds after its ids."""
    hub = Hub(network)
    sha, listing = hub.files(NEOX_REPO, 'main', '', 'tokenizer.json', kind='models')
    listed = next((f for f in listing if f['path'] == 'tokenizer.json'), None)
    if listed is None:
        raise DataError(f"{NEOX_REPO}@{sha} has no tokenizer.json: check --endpoint or HF_ENDPOINT")
    path = os.path.join(out_dir, 'downloads', 'gpt-neox-20b-tokenizer.json')
    url = hub.url('models', NEOX_REPO, sha, 'tokenizer.json')
    hub_spec = load_json(download(hub, url, path, listed, starts_with=b'{'))
    spec = {'name': 'neox', 'source': f'{NEOX_REPO}@{sha}', 'tokenizers': hub_spec}
    spec['special_tokens'] = list(SPECIAL_TOKENS) if special else []
    save_json(os.path.join(out_dir, 'tokenizer.json'), spec)
    os.remove(path)


# A model's own tokenizer (--tokenizer MODEL_FOLDER or a Hub repo id, as init_from takes): its ids,
# document start and sha256 as docs/finetuning.md ("The data is in the model's tokens") says.
def is_model(name):
    return name not in NAMED_TOKENIZERS and (os.path.isdir(name) or pretrained.is_repo_id(name))


def model_tokenizer(name, network=None):
    """(the model folder, its tokenizer.json's bytes, that tokenizers.Tokenizer)."""
    from tokenizers import Tokenizer

    folder = pretrained.folder(name, network, weights=False)
    path = os.path.join(folder, 'tokenizer.json')
    if not os.path.isfile(path):
        raise DataError(f"{folder} has no tokenizer.json (a fast tokenizer): --tokenizer needs one")
    text = pathlib.Path(path).read_bytes()
    return folder, text, Tokenizer.from_str(text.decode())


def make_model_tokenizer(out_dir, name, network=None):
    folder, text, tokenizer = model_tokenizer(name, network)
    plain, added = (tokenizer.encode('a', add_special_tokens=s).ids for s in (False, True))
    if len(added) > len(plain) and added[len(added) - len(plain) :] == plain:
        start = tokenizer.id_to_token(added[0])
    else:
        path = os.path.join(folder, 'tokenizer_config.json')
        eos = pretrained.read_json(path).get('eos_token') if os.path.isfile(path) else None
        start = eos.get('content') if isinstance(eos, dict) else eos or EOT
        if tokenizer.token_to_id(start) is None:
            raise DataError(
                f"{folder}: its tokenizer adds no BOS and has no eos_token {start!r} to start "
                f"documents with"
            )
    spec = {'name': name, 'source': folder, 'sha256': hashlib.sha256(text).hexdigest()}
    spec.update(tokenizers=json.loads(text), special_tokens=[], document_start=start)
    save_json(os.path.join(out_dir, 'tokenizer.json'), spec)
    say(f"tokenizer: {name}'s own ({folder}), each document starting with {start!r}")


# --------------------------------------------------------------------------------------------------
# Tokenizing in a process pool. Each worker loads tokenizer.json once; a task is a batch of one
# file's documents, (file index, first row, data, offsets): their UTF-8 bytes back to back, document
# i at offsets[i]:offsets[i + 1]. That is what a parquet column holds, so no Python string is made
# per document in the main process (with 2 cores, its every cycle is taken from a worker). The
# answer: the tokens, the end-of-text token FIRST in every document (GPT-2/llm.c: a sequence that
# starts mid-stream still sees where documents begin), and each document's tokens and bytes.

_worker_encoding = None


@contextlib.contextmanager
def worker_pool(workers, data_dir):
    """Tokenizer processes. The pool comes apart without killing a worker: the few batches out
    (pooled keeps them few) are finished, the rest cancelled, the workers joined. Pool.terminate
    killed workers while its task thread could be writing a batch into their pipe, then waited on
    that write for ever (one run in 44 hung)."""
    pool = ProcessPoolExecutor(workers, initializer=init_worker, initargs=(data_dir,))
    try:
        yield pool
    finally:
        pool.shutdown(cancel_futures=True)


def init_worker(data_dir):
    global _worker_encoding
    # Ctrl-C reaches the whole process group: the main process answers it, not a traceback per
    # worker. SIGTERM kills a worker as by default: cli's handler, forked with it, raises to unwind
    # a command, which a worker blocked in C never runs.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _worker_encoding = data.load_tokenizer(data_dir)


def pooled(pool, function, items, in_flight):
    """function(item) of each item in order, with at most `in_flight` items out at once. An item
    None is a barrier: every result before it is yielded before the next item is read. A worker that
    dies (the kernel's out-of-memory killer) is one DataError, not a hang."""
    pending = collections.deque()
    try:
        for item in itertools.chain(items, [None]):
            if item is not None:
                pending.append(pool.submit(function, item))
            while pending and (item is None or len(pending) >= in_flight):
                yield pending.popleft().result()
    except BrokenExecutor:
        raise DataError("a tokenizer process died (out of memory?): rerun to carry on") from None


def pack_texts(texts):
    encoded = [text.encode('utf-8') for text in texts]
    return b''.join(encoded), np.cumsum([0, *map(len, encoded)], dtype=np.int64)


def unpack_texts(joined, offsets):
    """(bytes, offsets) -> the texts; a memoryview slice decodes without copying the bytes first."""
    view = memoryview(joined)
    return [str(view[start:end], 'utf-8') for start, end in itertools.pairwise(offsets.tolist())]


def tokenize_batch(batch):
    file_index, first_row, joined, offsets = batch
    encoding, texts = _worker_encoding, unpack_texts(joined, offsets)
    # encode_to_numpy makes no list of ints; with no special tokens allowed or disallowed it is
    # encode_ordinary: '<|endoftext|>' written in a document stays plain text
    docs = [encoding.encode_to_numpy(text, disallowed_special=()) for text in texts]
    # each document after its end-of-text token, in the shards' dtype
    eot = np.array([encoding.eot_token], dtype=data.token_dtype(encoding.n_vocab))
    tokens = np.concatenate([part for ids in docs for part in (eot, ids)], dtype=eot.dtype)
    doc_tokens = np.array([1 + len(ids) for ids in docs], dtype=np.int64)
    return file_index, first_row, tokens, doc_tokens, np.diff(offsets)


def default_workers():
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1


# --------------------------------------------------------------------------------------------------
# Writing a data folder: the request it is made for first (progress.json), checked by every rerun;
# shards written whole; meta.json last: it says the folder is done.

# request keys an older prepare.py's folders lack, and what those folders were made with
REQUEST_BEFORE = {'special_tokens': False}
# a fresh progress.json's position and counts
START = dict(shards=0, file=0, row=0, skip=0, documents=0, text_bytes=0, max_token_id=-1)


def build(out_dir, request, make, tokens=None):
    """Make the folder for `request`, or find it complete; returns its meta. make(state) does the
    work from start_progress's state and returns meta.json's (source, revision, counts). --tokens is
    in meta.json's request, not progress.json's: a larger one carries on."""
    parse_tokenizer(request['tokenizer'])  # a bad name is one line before anything is written
    whole = request if tokens is None else dict(request, tokens=tokens)
    with files.disk_errors(out_dir), files.folder_lock(out_dir, f"prepare.py {request['source']}"):
        if (meta := complete_meta(out_dir, whole)) is not None:
            return meta
        source, revision, counts = make(start_progress(out_dir, request))
        meta = {'source': source, 'revision': revision, 'tokenizer': request['tokenizer']}
        meta.update(tokenizer_meta(data.load_tokenizer(out_dir)))
        meta.update(shard_tokens=request['shard_tokens'], request=whole, **counts)
        total = meta['train_tokens'] + meta['val_tokens']
        meta['bytes_per_token'] = round(meta['text_bytes'] / max(1, total), 3)
        save_json(os.path.join(out_dir, 'meta.json'), meta)
        shards = [p for split in ('val', 'train') for p in data.list_shards(out_dir, split)]
        megabytes = sum(os.path.getsize(p) for p in shards) / 1e6
        say(
            f"done: {out_dir}: {meta['documents']:,} documents, {meta['train_tokens']:,} train + "
            f"{meta['val_tokens']:,} val tokens in {meta['train_shards']} + {meta['val_shards']} "
            f"shards ({megabytes:,.1f} MB, {meta['dtype']}), {meta['bytes_per_token']} text bytes "
            f"per token, tokenizer {meta['tokenizer']} (vocab {meta['vocab_size']:,})"
        )
        return meta


def remove_shards(out_dir, prefix, keep):
    """Delete the prefix's shards (and leftovers) not in `keep`: none may pass for the new set."""
    for path in set(glob.glob(os.path.join(glob.escape(out_dir), f'{prefix}_*.bin*'))) - set(keep):
        os.remove(path)


def request_change(old, new):
    """The settings of `new` that differ from `old`, as "tokenizer='gpt2' (this run: 'bpe:400')"."""
    old = dict(REQUEST_BEFORE, **old)
    changes = (f"{k}={old.get(k)!r} (this run: {v!r})" for k, v in new.items() if old.get(k) != v)
    return ', '.join(changes)


def tokenizer_meta(encoding):
    """meta.json's tokenizer entries; vocab_size counts every id, the SPECIAL_TOKENS too."""
    vocab, eot = encoding.n_vocab, encoding.eot_token
    dtype, special = data.token_dtype(vocab).name, data.reserved_ids(encoding)
    return dict(vocab_size=vocab, eot_id=eot, dtype=dtype, special_tokens=special)


def complete_meta(out_dir, request):
    """A finished folder's meta for the same request (a rerun is a no-op), else None. If only
    --tokens differs (a larger one), the folder is marked unfinished; any other difference is
    refused rather than mixed with the old shards. A damaged meta.json is made again."""
    path = os.path.join(out_dir, 'meta.json')
    if not os.path.exists(path):
        return None
    try:
        meta = data.load_meta(out_dir)
    except DataError:
        say(f"{path} is damaged: finishing the folder again, which rewrites it")
        os.remove(path)
        return None
    if not request_change(meta['request'], request):
        say(
            f"already complete: {out_dir} ({meta['train_tokens']:,} train + {meta['val_tokens']:,} "
            f"val tokens, {meta['tokenizer']}); delete the folder to rebuild it"
        )
        return meta
    change = request_change(meta['request'], {k: v for k, v in request.items() if k != 'tokens'})
    if change:
        raise DataError(
            f"{out_dir} already holds a dataset made with other settings: {change}: delete it or "
            f"choose another --out"
        )
    os.remove(path)
    return None


def start_progress(out_dir, request):
    """progress.json, written first: the request, and where the shards stand (Shards); returns it. A
    folder a run with other settings left starts over if that run wrote no shard (its tokenizer and
    listing are made again; downloads stay, verified before use), and is refused otherwise."""
    path = os.path.join(out_dir, 'progress.json')
    if os.path.exists(path):
        try:
            state = load_json(path)
            change = request_change(state['request'], request)
        except (ValueError, KeyError, TypeError, AttributeError):
            raise DataError(f"{path} is damaged: delete it and rerun to start over") from None
        if not change:
            return state
        if state.get('shards'):
            raise DataError(
                f"{out_dir} holds an unfinished dataset made with other settings: {change}: rerun "
                f"with its settings to finish it, or delete the folder or choose another --out"
            )
        say(f"{out_dir}: starting over (a run with other settings, {change}, wrote no shard)")
        for name in ('tokenizer.json', 'files.json'):
            remove_quietly(os.path.join(out_dir, name))
    state = dict(request=request, **START)
    save_json(path, state)
    return state


# --------------------------------------------------------------------------------------------------
# Source 1: pystdlib, the running Python's standard library: ~30 MB of real text on every machine,
# no download. Installed packages (site-packages, dist-packages) differ between machines and are
# left out; the stdlib's own tests (a third of the text) stay. A hash of the file's path sends ~5%
# of the files to val, so a file's side never changes when others come and go.

PYSTDLIB_VAL_PERCENT = 5


def pystdlib_files(max_files=0):
    """(relative path, text) of the stdlib's .py files, sorted; `max_files` > 0: an evenly spread
    subset (the tests'). Files that are not UTF-8 (a few deliberate test cases) are skipped."""
    root = sysconfig.get_paths()['stdlib']
    paths = sorted(glob.glob(os.path.join(glob.escape(root), '**', '*.py'), recursive=True))
    third_party = {'site-packages', 'dist-packages'}
    paths = [p for p in paths if not third_party & set(os.path.relpath(p, root).split(os.sep))]
    if max_files and len(paths) > max_files:
        paths = [paths[i * len(paths) // max_files] for i in range(max_files)]
    sources = []
    for path in paths:
        with open(path, 'rb') as f, contextlib.suppress(UnicodeDecodeError):
            name = os.path.relpath(path, root).replace(os.sep, '/')
            sources.append((name, f.read().decode('utf-8')))
    if not sources:
        raise DataError(
            f"no .py files found under {root}: this Python has no standard library sources; "
            f"use `prepare.py files PATH...` instead"
        )
    return sources


def prepare_pystdlib(
    out_dir, tokenizer='bpe:8192', workers=0, shard_tokens=100_000_000, max_files=0, special=True
):
    """Build (or find complete) the pystdlib data folder; returns its meta."""
    request = {'source': 'pystdlib', 'tokenizer': tokenizer, 'shard_tokens': shard_tokens}
    request.update(max_files=max_files, special_tokens=special)
    return build(out_dir, request, lambda state: tokenize_pystdlib(out_dir, request, workers))


def tokenize_pystdlib(out_dir, request, workers, batch_docs=64):
    started, version = time.time(), sys.version.split()[0]
    sources, stdlib = pystdlib_files(request['max_files']), sysconfig.get_paths()['stdlib']
    val, train = [], []
    for path, text in sources:
        in_val = zlib.crc32(path.encode()) % 100 < PYSTDLIB_VAL_PERCENT
        (val if in_val else train).append(text)
    if not val or not train:
        raise DataError(f"{len(sources)} stdlib files leave a split empty: raise --max-files")
    say(f"pystdlib: {len(train)} train + {len(val)} val files from {stdlib} (Python {version})")
    # the BPE learns from train files: val stays unseen
    make_tokenizer(out_dir, request['tokenizer'], lambda: train, None, request['special_tokens'])
    counts, written = dict(documents=len(sources), text_bytes=0, max_token_id=-1), []
    workers, shard_tokens = workers or default_workers(), request['shard_tokens']
    with worker_pool(workers, out_dir) as pool:
        for split, docs in (('val', val), ('train', train)):
            starts = range(0, len(docs), batch_docs)
            batches = ((0, i, *pack_texts(docs[i : i + batch_docs])) for i in starts)
            results = list(pooled(pool, tokenize_batch, batches, 4 * workers))
            tokens = np.concatenate([result[2] for result in results])
            counts['text_bytes'] += int(sum(result[4].sum() for result in results))
            counts[f'{split}_tokens'], counts[f'{split}_shards'] = len(tokens), 0
            for start in range(0, len(tokens), shard_tokens):
                written.append(data.shard_path(out_dir, 'pystdlib', split, len(written)))
                largest = data.write_shard(written[-1], tokens[start : start + shard_tokens])
                counts['max_token_id'] = max(counts['max_token_id'], largest)
                counts[f'{split}_shards'] += 1
    remove_shards(out_dir, 'pystdlib', keep=written)
    say(f"pystdlib: tokenized in {time.time() - started:.1f} s")
    return 'pystdlib', f"python {version}", counts


# --------------------------------------------------------------------------------------------------
# Streams: the sources too big for memory (files, fineweb_edu, hub) are read a batch at a time, file
# by file, row by row, and cut into shards at fixed stream offsets: val holds stream tokens [0, V),
# train shard k >= 1 [V + (k-1)S, V + kS). The cuts depend only on the documents and the tokenizer,
# so progress.json records after each full shard where the next one starts (file, row, tokens of
# that document already written); a rerun skips the finished shards' documents unread (whole files,
# whole parquet row groups) and carries on, writing exactly the same shards.

TEXT_TYPES = ('string', 'large_string', 'string_view')  # pyarrow.types.is_*: a text column's


def parquet_batches(path, start_row=0, batch_docs=1024, column='text'):
    """Yield (first row, data, offsets) batches of a parquet file's text `column` from `start_row`
    on: Arrow's UTF-8 buffer (a memoryview) and int64 offsets. iter_batches, one thread, costs
    0.16 s of CPU on `prepare.py bench`'s 126 MB row group, read_row_group's thread pool 0.6-0.9 s
    taken from the tokenizing workers. A file pyarrow cannot read is one DataError naming it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
        schema = parquet.schema_arrow
        if column not in schema.names:
            raise DataError(f"{path}: no '{column}' column (it has {schema.names}): use --column")
        kind = schema.field(column).type
        if not any(getattr(pa.types, f'is_{t}', lambda _: False)(kind) for t in TEXT_TYPES):
            raise DataError(f"{path}: the '{column}' column holds {kind}, not text: --column")
        # read from the first row group that ends after start_row
        rows = (parquet.metadata.row_group(g).num_rows for g in range(parquet.num_row_groups))
        ends = list(itertools.accumulate(rows))
        first = bisect.bisect_right(ends, start_row)
        row = ends[first - 1] if first else 0
        groups = range(first, len(ends))
        for batch in parquet.iter_batches(batch_docs, groups, [column], use_threads=False):
            texts = batch.column(0)
            if row < start_row:  # the first row group's rows before start_row
                skip = min(len(texts), start_row - row)
                texts, row = texts.slice(skip), row + skip
            if texts.type not in (pa.string(), pa.large_string()):
                texts = texts.cast(pa.large_string())
            texts = texts.fill_null('') if texts.null_count else texts
            _, offsets, joined = texts.buffers()
            offsets = np.frombuffer(offsets, np.int32 if texts.type == pa.string() else np.int64)
            offsets = offsets[texts.offset : texts.offset + len(texts) + 1].astype(np.int64)
            if len(texts):
                yield row, memoryview(joined if joined is not None else b''), offsets
            row += len(texts)
    except pa.ArrowException as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(
            f"{path}: not a readable parquet file ({reason}): if it is a download, delete it and "
            f"rerun to fetch it again"
        ) from None


def not_utf8(path, error, where=''):
    return DataError(
        f"{path}{where}: not UTF-8 text (byte {error.object[error.start]:#04x} at byte "
        f"{error.start:,}{' of the line' if where else ''}): convert it to UTF-8 "
        f"(e.g. iconv -f latin1 -t utf-8) or leave it out"
    )


def read_documents(path, start_row=0, column='text'):
    """Yield (row, text) of a .parquet (its `column`), .jsonl (each non-blank line's "text") or .txt
    file from `start_row` on. Text not UTF-8, or a binary file, is one DataError naming the file."""
    if path.endswith('.parquet'):
        for first_row, joined, offsets in parquet_batches(path, start_row, column=column):
            yield from enumerate(unpack_texts(joined, offsets), first_row)
    elif path.endswith('.jsonl'):
        with open(path, 'rb') as f:
            row = 0
            for lineno, line in enumerate(f, 1):
                try:
                    line = line.decode('utf-8')
                except UnicodeDecodeError as e:
                    raise not_utf8(path, e, f':{lineno}') from None
                if not line.strip():
                    continue
                if row >= start_row:
                    text = None
                    with contextlib.suppress(ValueError, KeyError, TypeError):
                        text = json.loads(line)['text']
                    if not isinstance(text, str):
                        raise DataError(f'{path}:{lineno}: not a JSON object with a "text" string')
                    yield row, text
                row += 1
    elif start_row == 0:
        raw = pathlib.Path(path).read_bytes()
        if 0 in raw:  # text has no NUL bytes; executables, images and archives are full of them
            raise DataError(
                f"{path}: a binary file (NUL bytes at byte {raw.index(0):,}), not text: leave it "
                "out"
            )
        try:
            text = raw.decode('utf-8')
        except UnicodeDecodeError as e:
            raise not_utf8(path, e) from None
        yield 0, text


def document_batches(paths, fetch, position, batch_docs, column='text'):
    """Yield batches of `batch_docs` documents from `position` = (file, row) on, none spanning two
    files, and a None before each file after the first: pooled's barrier, so a run that reaches its
    target fetches (downloads) no file the shards do not use. fetch(i): file i's local path."""
    start_file, start_row = position
    for index in range(start_file, len(paths)):
        if index > start_file:
            yield None
        path, first_row = fetch(index), start_row if index == start_file else 0
        if path.endswith('.parquet'):
            # Arrow's bytes, copied once (to pickle)
            for row, joined, offsets in parquet_batches(path, first_row, batch_docs, column):
                yield index, row, bytes(joined[offsets[0] : offsets[-1]]), offsets - offsets[0]
            continue
        documents = read_documents(path, first_row)
        while batch := list(itertools.islice(documents, batch_docs)):
            yield index, batch[0][0], *pack_texts([text for _, text in batch])


def bpe_sample(documents, val_tokens, sample_chars, tokens=0):
    """The BPE's texts from a stream of documents. The first 8 characters per val token are skipped:
    the val shard's documents are there (a BPE packs ~4-5 characters into a token), unseen by the
    tokenizer too. Then at most `sample_chars`, and with --tokens at most one per token, so the
    sample reads (downloads) no text the shards will not use. No text left is one DataError."""
    skip, limit, seen = 8 * val_tokens, min(sample_chars, tokens) if tokens else sample_chars, 0

    def sample():
        nonlocal seen
        taken = 0
        for text in documents:
            seen += len(text)
            if seen <= skip:
                continue
            yield text
            taken += len(text)
            if taken >= limit:
                return

    texts = sample()
    if (first := next(texts, None)) is None:
        if not seen:
            raise DataError(
                "there is no text in the input (every document is empty): give files with text"
            )
        raise DataError(
            f"no text left for the BPE to learn from: the text has {seen:,} characters and the "
            f"first {skip:,} are held out for the {val_tokens:,}-token val shard (8 per token): "
            f"lower --val-tokens (about {seen // 16:,} would leave half the text) or add text"
        )
    return itertools.chain([first], texts)


class Shards:
    """A run's token stream cut into shards at the offsets above, the last at the target (--tokens)
    or where the documents end; done_with_files(n) hears that no rerun will read files 0..n-1."""

    def __init__(self, job, prefix, state, done_with_files):
        self.job, self.prefix, self.state = job, prefix, state
        self.done_with_files = done_with_files
        self.target, self.shard = job.tokens or float('inf'), state['shards']
        # the stream offset of the first buffered token
        self.offset = self.end_of(self.shard - 1) if self.shard else 0
        if self.offset >= self.target:  # a smaller --tokens than a finished run's: start over
            self.offset = self.shard = 0
            state.update(START)
        self.written = [self.path(i) for i in range(self.shard)]
        if 'max_token_id' not in state:  # progress.json of an older prepare.py: read its shards
            largest = (int(data.open_shard(p).max()) for p in self.written)
            state['max_token_id'] = max(largest, default=-1)
        self.buffer, self.buffered, self.skip = [], 0, state['skip']
        self.documents, self.text_bytes = state['documents'], state['text_bytes']
        self.largest = state['max_token_id']

    def end_of(self, index):
        return self.job.val_tokens + index * self.job.shard_tokens

    def path(self, index):
        return data.shard_path(self.job.out_dir, self.prefix, 'train' if index else 'val', index)

    def add(self, file_index, first_row, tokens, doc_tokens, doc_bytes):
        """Buffer a tokenized batch and write the shards it completes; True once at the target."""
        counted = np.ones(len(doc_tokens), dtype=np.int64)
        if self.skip:  # the first document was partly written before the stop: drop those tokens
            tokens, doc_tokens[0] = tokens[self.skip :], doc_tokens[0] - self.skip
            counted[0] = doc_bytes[0] = self.skip = 0
        # where each document starts in the stream
        starts = self.offset + self.buffered + np.cumsum(doc_tokens) - doc_tokens
        self.buffer.append(tokens)
        self.buffered += len(tokens)
        while self.offset + self.buffered >= (end := min(self.end_of(self.shard), self.target)):
            self.write(end)
            # the documents begun before `end`, and the one holding stream token `end`
            before = np.searchsorted(starts, end, side='left')
            inside = np.searchsorted(starts, end, side='right') - 1
            documents = self.documents + int(counted[:before].sum())
            text_bytes = self.text_bytes + int((doc_bytes * counted)[:before].sum())
            if end == self.end_of(self.shard - 1):  # a full shard
                row, skip = first_row + int(inside), int(end - starts[inside])
                counts = dict(documents=documents, text_bytes=text_bytes, max_token_id=self.largest)
                self.state.update(shards=self.shard, file=file_index, row=row, skip=skip, **counts)
                save_json(os.path.join(self.job.out_dir, 'progress.json'), self.state)
                self.done_with_files(file_index)
            if end == self.target:
                self.documents, self.text_bytes = documents, text_bytes
                return True
        self.documents += int(counted.sum())
        self.text_bytes += int((doc_bytes * counted).sum())
        return False

    def write(self, end):
        """Stream tokens [offset, end) as the next shard."""
        joined, cut = np.concatenate(self.buffer), end - self.offset
        self.written.append(self.path(self.shard))
        self.largest = max(self.largest, data.write_shard(self.written[-1], joined[:cut]))
        self.buffer, self.buffered = [joined[cut:]], self.buffered - cut
        self.offset, self.shard = end, self.shard + 1

    def finish(self):
        """The last (shorter) shard if the documents ended before the target; meta.json's counts."""
        val = self.job.val_tokens
        if self.buffered and self.offset < self.target:
            if self.shard == 0:
                raise DataError(
                    f"only {self.buffered:,} tokens in all, fewer than the {val:,} of the "
                    "val shard: lower --val-tokens"
                )
            self.write(self.offset + self.buffered)
        if self.shard < 2:
            raise DataError(f"all {self.offset:,} tokens went to the val shard: lower --val-tokens")
        remove_shards(self.job.out_dir, self.prefix, keep=self.written)
        counts = dict(documents=self.documents, text_bytes=self.text_bytes)
        counts.update(val_tokens=min(val, self.offset), train_tokens=self.offset - val)
        return dict(counts, val_shards=1, train_shards=self.shard - 1, max_token_id=self.largest)


@dataclasses.dataclass
class Job:
    """A run of a streamed source (files, fineweb_edu, hub): the command line's options."""

    out_dir: str
    tokenizer: str
    workers: int = 0
    shard_tokens: int = 100_000_000
    val_tokens: int = 0
    tokens: int = 0  # 0: every document
    bpe_sample_chars: int = 1_000_000_000
    special: bool = True
    revision: str = 'main'
    keep_downloads: bool = False
    network: Network = None

    def request(self, head, expected_tokens):
        """The request the folder is made for (meta.json's adds --tokens). --val-tokens defaults to
        ~10% of the tokens expected (0: unknown, many), at most a shard (llm.c's first shard is
        val): most of the text is left to the BPE sample, which skips 8 characters per val token."""
        default = max(1, min(self.shard_tokens, expected_tokens // 10))
        self.val_tokens = self.val_tokens or (default if expected_tokens else self.shard_tokens)
        settings = dict(tokenizer=self.tokenizer, shard_tokens=self.shard_tokens)
        return dict(head, **settings, val_tokens=self.val_tokens, special_tokens=self.special)

    def tokenize(self, request, state, paths, fetch, done_with_files=lambda n: None, column='text'):
        """The work from `state` on: the tokenizer (a BPE learns from the text after the val
        shard's), then the shards; returns meta.json's counts. fetch(i): file i's local path."""
        prefix, workers = request['source'], self.workers or default_workers()

        def bpe_texts():
            per_file = (read_documents(fetch(i), column=column) for i in range(len(paths)))
            documents = (text for rows in per_file for _, text in rows)
            return bpe_sample(documents, self.val_tokens, self.bpe_sample_chars, self.tokens)

        make_tokenizer(self.out_dir, self.tokenizer, bpe_texts, self.network, self.special)
        shards, started = Shards(self, prefix, state, done_with_files), time.time()
        if first := shards.offset:
            say(f"{prefix}: carrying on after {shards.shard} complete shards ({first:,} tokens)")
        batches = document_batches(paths, fetch, (state['file'], state['row']), 256, column)
        with worker_pool(workers, self.out_dir) as pool:
            with Progress(prefix, self.tokens or None, initial=first) as progress:
                for result in pooled(pool, tokenize_batch, batches, 4 * workers):
                    progress.update(min(len(result[2]) - shards.skip, shards.target - progress.n))
                    if shards.add(*result):
                        break
        counts = shards.finish()
        done_with_files(len(paths))
        tokens, elapsed = shards.offset - first, time.time() - started
        rate = tokens / max(elapsed, 1e-9) / 1e6
        say(f"{prefix}: {tokens:,} tokens in {elapsed:.1f} s ({rate:.2f}M tokens/s)")
        return counts


# --------------------------------------------------------------------------------------------------
# Source 2: files, your own text: .txt (one document), .jsonl (a "text" field per line) or .parquet
# (a "text" column), in the order given.

FILE_TYPES = ('.txt', '.jsonl', '.parquet')


def prepare_files(paths, out_dir, tokenizer='bpe:8192', **options):
    """Build (or carry on, or find complete) a folder of local files -> its meta. options: Job's."""
    for path in paths:
        if os.path.isdir(path):
            raise DataError(
                f"{path}: a folder; give the files in it (e.g. {os.path.join(path, '*.txt')})"
            )
        if not os.path.isfile(path):
            raise DataError(f"{path}: no such file")
        if not path.endswith(FILE_TYPES):
            raise DataError(f"{path}: unknown file type (use {', '.join(FILE_TYPES)})")
        if not os.access(path, os.R_OK):
            raise DataError(f"{path}: not readable by this user")
    paths = [os.path.abspath(p) for p in paths]
    if not (input_bytes := sum(os.path.getsize(p) for p in paths)):
        raise DataError(f"the input is empty ({', '.join(paths)}: 0 bytes): give files with text")
    job = Job(out_dir, tokenizer, **options)
    # ~4 bytes of file per token: text and jsonl ~4-5, parquet ~3-4 compressed
    request = job.request({'source': 'files', 'paths': paths}, job.tokens or input_bytes // 4)

    def make(state):
        return 'files', None, job.tokenize(request, state, paths, paths.__getitem__)

    return build(out_dir, request, make, job.tokens)


# --------------------------------------------------------------------------------------------------
# Sources 3 and 4: parquet files from the Hub (docs/data.md), fineweb_edu (a FineWeb-Edu sample:
# sample/10BT, 100BT or 350BT) and hub (any parquet dataset, --config its folder). The revision is
# pinned in files.json with each file's size and sha256: a rerun weeks later reads the same files.

FINEWEB_EDU = 'HuggingFaceFW/fineweb-edu'
# FineWeb-Edu parquet per GPT-2 token, low and high: the book's ~3-4 (ledger.py's)
PARQUET_BYTES_PER_TOKEN = (3, 4)


def disk_plan(
    out_dir, listed, paths, tokens, shard_tokens, vocab_size, keep_downloads, prefix='fineweb_edu'
):
    """Say what the run will download and write (docs/data.md, "FineWeb-Edu: disk"); one line
    refuses it if the free space cannot hold the high end: the shards, whole, and the parquet on
    disk at once: all of it with --keep-downloads, else a shard's worth plus two files."""
    sizes = [f['size'] for f in listed]
    totals = list(itertools.accumulate(sizes))  # the bytes of files 0..i
    reach = [bisect.bisect_left(totals, tokens * b) + 1 for b in PARQUET_BYTES_PER_TOKEN]
    low, high = (min(n, len(sizes)) if tokens else len(sizes) for n in reach)
    here = sum(size_of(p) + size_of(p + '.partial') for p in paths)
    planned = tokens or totals[-1] // PARQUET_BYTES_PER_TOKEN[0]
    token_bytes = sums.token_bytes(vocab_size)
    shard_bytes = planned * token_bytes + data.HEADER_BYTES * (planned // shard_tokens + 2)
    shards_here = glob.glob(os.path.join(glob.escape(out_dir), f'{prefix}_*.bin'))
    at_once = totals[high - 1]
    if not keep_downloads:
        at_once = min(at_once, shard_tokens * PARQUET_BYTES_PER_TOKEN[1] + 2 * max(sizes[:high]))
    more = max(0, shard_bytes - sum(map(size_of, shards_here))) + max(0, at_once - here)
    free, reads = free_bytes(out_dir), sorted({low, high})
    fetched = ' to '.join(human_bytes(max(0, totals[n - 1] - here)) for n in reads)
    kept = 'each deleted once tokenized (--keep-downloads keeps them)'
    kept = 'kept (--keep-downloads)' if keep_downloads else kept
    say(
        f"plan: {' to '.join(map(str, reads))} of {len(sizes)} parquet files, {fetched} to "
        f"download, {kept}; ~{human_bytes(shard_bytes)} of shards ({planned:,} tokens x "
        f"{token_bytes} bytes); at most ~{human_bytes(more)} more on disk, {human_bytes(free)} "
        f"free in {out_dir}"
    )
    if more > free:
        raise DataError(
            f"not enough disk space in {out_dir}: this run needs up to about {human_bytes(more)} "
            f"more (~{human_bytes(shard_bytes)} of shards, ~{human_bytes(at_once)} of parquet at "
            f"once) and {human_bytes(free)} is free: free some space, choose another --out or "
            f"lower --tokens{', or drop --keep-downloads' if keep_downloads else ''}"
        )


class HubFiles:
    """The parquet files of `folder` in a dataset repo (those named `split`*), pinned in files.json,
    each downloaded into downloads/ when first needed (the BPE sample's or the shards')."""

    def __init__(self, job, prefix, repo, folder, split):
        self.job, self.prefix, self.repo, self.folder, self.split = job, prefix, repo, folder, split
        self.hub, self.verified, self.relisted = Hub(job.network), set(), False
        self.listed, self.revision = self.pin()
        names = [os.path.basename(f['path']) for f in self.listed]
        self.paths = [os.path.join(job.out_dir, 'downloads', name) for name in names]
        parquet = sum(f['size'] for f in self.listed)
        say(
            f"{prefix}: {repo}/{folder} at {self.revision} from {self.hub.endpoint}: {len(names)} "
            f"parquet files, {human_bytes(parquet)}"
        )
        # an impossible --val-tokens, refused before any download: all of --tokens, or more than
        # the files hold at one token per byte of parquet (FineWeb-Edu's ~0.3: a token is a byte
        # or more of text, and parquet compresses text 2-4x)
        if job.tokens and job.val_tokens >= job.tokens:
            raise DataError(
                f"--val-tokens {job.val_tokens:,} is all of --tokens {job.tokens:,}: nothing would "
                "be left to train on; lower --val-tokens (the default is 10% of --tokens)"
            )
        low, high = (parquet // b for b in reversed(PARQUET_BYTES_PER_TOKEN))
        if not job.tokens and job.val_tokens > parquet:
            raise DataError(
                f"--val-tokens {job.val_tokens:,} is more than the {len(names)} listed files can "
                f"hold ({human_bytes(parquet)} of parquet, ~{low:,}-{high:,} GPT-2 tokens): lower "
                "--val-tokens"
            )
        plan = (job.tokens, job.shard_tokens, parse_tokenizer(job.tokenizer), job.keep_downloads)
        disk_plan(job.out_dir, self.listed, self.paths, *plan, prefix)

    def pin(self, relist=False):
        """(files, commit) from files.json, else listed and pinned there; listed again at the commit
        for an older prepare.py's files.json (no sha256), or to relist a listing wrong once."""
        path = os.path.join(self.job.out_dir, 'files.json')
        manifest = None
        if os.path.exists(path):
            try:
                manifest = load_json(path)
                if all('sha256' in f for f in manifest['files']) and not relist:
                    return manifest['files'], manifest['revision']
            except (ValueError, KeyError, TypeError):
                raise DataError(
                    f"{path} is damaged: the shards made so far came from the files it listed, so "
                    f"delete the folder and rerun"
                ) from None
        revision = manifest['revision'] if manifest else self.job.revision
        sha, listing = self.hub.files(self.repo, revision, self.folder, '.parquet')
        chosen = [f for f in listing if os.path.basename(f['path']).startswith(self.split)]
        if not chosen:
            raise DataError(
                f"none of the {len(listing)} parquet files in {self.repo}/{self.folder} is named "
                f"{self.split}*: check --split (the first is "
                f"{os.path.basename(listing[0]['path'])})"
            )
        save_json(path, {'repo': self.repo, 'revision': sha, 'files': chosen})
        return chosen, sha

    def fetch(self, index):
        """File `index`, downloaded (or found) and verified, once a run. If every download disagrees
        with files.json, the files are listed again (once a run): files.json may be wrong."""
        listed, path = self.listed[index], self.paths[index]
        if index in self.verified:
            return path
        if not os.path.exists(path):
            say(f"{self.prefix}: downloading {listed['path']} ({human_bytes(listed['size'])})")
        url = self.hub.url('datasets', self.repo, self.revision, listed['path'])
        try:
            download(self.hub, url, path, listed)
        except downloads.ListingMismatch as e:
            if self.relisted:
                raise
            self.relisted = True
            self.listed = self.pin(relist=True)[0]
            if self.listed[index] == listed:
                raise DataError(f"{e} (the Hub lists it so again today)") from None
            say(
                f"{self.prefix}: files.json pinned {listed['path']} as sha256 {listed['sha256']}, "
                f"the Hub lists {self.listed[index]['sha256']}: files.json listed again at "
                f"{self.revision}"
            )
            download(self.hub, url, path, self.listed[index])
        self.verified.add(index)
        return path

    def done_with(self, n):
        for path in [] if self.job.keep_downloads else self.paths[:n]:
            remove_quietly(path)


def prepare_fineweb_edu(out_dir, sample='100BT', **options):
    """Build (or carry on, or find complete) a FineWeb-Edu data folder; returns its meta. options:
    Job's (tokens, tokenizer, workers, ..., network: a Network, the endpoint, time-outs, ...)."""
    if sample not in ('10BT', '100BT', '350BT'):
        raise DataError(f"unknown sample '{sample}': use 10BT, 100BT or 350BT")
    head, folder = {'source': 'fineweb_edu', 'sample': sample}, f'sample/{sample}'
    return from_hub(out_dir, head, FINEWEB_EDU, folder, f'fineweb_edu/{folder}', **options)


def prepare_hub(repo, out_dir, config='', column='text', split='', **options):
    """prepare_fineweb_edu's work for any parquet dataset on the Hub, `config` naming its folder."""
    if repo.count('/') != 1 or not all(repo.split('/')):
        raise DataError(
            f"hub: '{repo}' is not a dataset repo: name it OWNER/NAME (e.g. HuggingFaceTB/finemath)"
        )
    head = {'source': 'hub', 'repo': repo, 'config': config, 'column': column, 'split': split}
    source = '/'.join(part for part in (repo, config) if part)
    return from_hub(out_dir, head, repo, config, source, **options)


def from_hub(out_dir, head, repo, folder, source, tokenizer='gpt2', **options):
    """fineweb_edu's and hub's work: shards named head['source'] of the files of `folder` in `repo`;
    meta.json's source is `source`, its request `head` (what names the source) and the options."""
    job, prefix = Job(out_dir, tokenizer, **options), head['source']
    column, split = head.get('column', 'text'), head.get('split', '')
    request = job.request(dict(head, revision=job.revision), job.tokens)

    def make(state):
        hub = HubFiles(job, prefix, repo, folder, split)
        counts = job.tokenize(request, state, hub.paths, hub.fetch, hub.done_with, column)
        return source, hub.revision, counts

    return build(out_dir, request, make, job.tokens)


# --------------------------------------------------------------------------------------------------
# Command line: every option once, as its flag and add_argument's settings; a source takes the ones
# it lists, as (flag, changes) where its help or default differs, and --out data/SOURCE.
def number(text):
    """26e9 or 26000000000 -> 26000000000 (argparse type for token counts)."""
    return int(float(text))


# fmt: off
OPTIONS = {
    '--out': dict(dest='out_dir', metavar='OUT', help='data folder (default %(default)s)'),
    '--tokenizer': dict(help="gpt2, neox (GPT-NeoX-20B, from the Hub), bpe:V, our own, or a model "
                        "folder or Hub repo id: its own, for init_from (default %(default)s)"),
    '--workers': dict(type=int, default=0, help='tokenizer processes (default: all cores)'),
    '--shard-tokens': dict(type=number, default=100_000_000,
                           help='tokens per shard (default 100,000,000)'),
    '--no-special-tokens': dict(dest='special', action='store_false', help="reserve no ids for the "
                                "fim and ul2 special tokens (a bpe:V learns 22 more merges)"),
    '--max-files': dict(type=int, default=0, help='an evenly spread subset of the files (0: all)'),
    '--sample': dict(default='100BT', help='10BT, 100BT or 350BT (default 100BT)'),
    'repo': dict(metavar='REPO', help='the dataset repo, OWNER/NAME'),
    '--config': dict(default='',
                     help="the subset: the repo's folder of its parquet files (default: the top)"),
    '--column': dict(default='text', help='the text column (default text)'),
    '--split': dict(default='',
                    help='only the parquet files named SPLIT* (e.g. train; default: all)'),
    'paths': dict(nargs='+', metavar='PATH'),
    '--tokens': dict(type=number, default=0, help='stop after this many tokens, val included (e.g. '
                     '26e9; default: the whole sample)'),
    '--val-tokens': dict(type=number, default=0, help='tokens in the val shard (default: 10%% of '
                         '--tokens, at most one shard)'),
    '--endpoint': dict(default='',
                       help=f'Hub base URL (default: $HF_ENDPOINT, else {downloads.HUB_ENDPOINT})'),
    '--revision': dict(default='main',
                       help='dataset revision (branch, tag or commit; default main)'),
    '--bpe-sample-chars': dict(type=number, default=1_000_000_000,
                               help='characters the bpe:V tokenizer trains on (default 1e9)'),
    '--keep-downloads': dict(action='store_true', help='keep the parquet files (by default each is '
                             'deleted once its tokens are in shards)'),
    '--connect-timeout': dict(type=float, default=Network.connect_timeout_s,
                              help='seconds to open a connection (default %(default)g)'),
    '--read-timeout': dict(type=float, default=Network.read_timeout_s, help='seconds of silence '
                           'from a server before retrying (default %(default)g)'),
    '--retry-budget': dict(type=float, default=Network.retry_budget_s, help='seconds one request '
                           'may keep failing before giving up (default %(default)g)'),
}
COMMON = ['--out', '--tokenizer', '--workers', '--shard-tokens', '--no-special-tokens']
HUB_OPTIONS = ['--tokens', '--val-tokens', '--endpoint', '--revision', '--bpe-sample-chars',
               '--keep-downloads', '--connect-timeout', '--read-timeout', '--retry-budget']
HUB_EPILOG = ('environment: HF_ENDPOINT (a Hub mirror; --endpoint overrides it), HF_TOKEN (a read '
              'token, sent to that host only')
# pystdlib's bpe:8192: enough for ~30 MB of code (each merge still seen thousands of times), cheap
# embedding and output layers for a small CPU model (8192 x 256 = 2.1M params each at n_embd 256),
# a multiple of 128 (fast matmuls), and it fits uint16.
SOURCES = {  # name: (the function, help, --tokenizer's default, options, epilog)
    'pystdlib': (prepare_pystdlib, "the running Python's standard library sources (no download)",
                 'bpe:8192', COMMON + ['--max-files'], None),
    'fineweb_edu': (prepare_fineweb_edu,
                    'a FineWeb-Edu sample from the Hugging Face Hub (resumable)', 'gpt2',
                    COMMON + ['--sample'] + HUB_OPTIONS, HUB_EPILOG + ')'),
    'hub': (prepare_hub, 'any parquet dataset on the Hugging Face Hub (resumable), e.g. hub '
            'HuggingFaceTB/finemath --config finemath-3plus', 'gpt2',
            ['repo'] + COMMON + ['--config', '--column', '--split'] + HUB_OPTIONS,
            HUB_EPILOG + '; a gated dataset needs it)'),
    'files': (prepare_files,
              'your own .txt, .jsonl ("text" field) or .parquet ("text" column) files', 'bpe:8192',
              ['paths'] + COMMON + [('--tokens', {'help': 'stop after this many tokens'}),
               ('--val-tokens', {'help': 'tokens in the val shard (default: ~10%% of the estimated '
                                 'total, at most one shard)'}), '--bpe-sample-chars'], None),
}
# fmt: on


def make_parser():
    about, layout = __doc__.split('\n\n')[0].strip(), argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser('prepare.py', description=about, formatter_class=layout)
    sources = parser.add_subparsers(dest='source', required=True)
    for name, (_, help, tokenizer, options, epilog) in SOURCES.items():
        sub = sources.add_parser(name, help=help, epilog=epilog)
        for option in options:
            flag, changes = option if isinstance(option, tuple) else (option, {})
            sub.add_argument(flag, **dict(OPTIONS[flag], **changes))
        sub.set_defaults(tokenizer=tokenizer, out_dir=f'data/{name}')
    return parser


@cli
def main(argv):
    args = vars(make_parser().parse_args(argv))
    function = SOURCES[args.pop('source')][0]
    if 'endpoint' in args:  # a Hub source
        timeouts = [args.pop(key) for key in ('connect_timeout', 'read_timeout', 'retry_budget')]
        args['network'] = Network(args.pop('endpoint'), *timeouts)
    function(**args)
    return 0


if __name__ == '__main__':
    sys.exit(main())
