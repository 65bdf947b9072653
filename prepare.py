"""
prepare.py: text -> tokenizer -> token shards that train.py reads.

    python prepare.py pystdlib                       # the running Python's standard library, our own BPE (seconds)
    python prepare.py fineweb_edu --tokens 26e9      # FineWeb-Edu sample-100BT, GPT-2 tokens (resumable)
    python prepare.py files a.txt b.jsonl c.parquet  # your own text
    python prepare.py bench                          # tokens/s of the pipeline against raw tiktoken

A data folder holds `<source>_val_000000.bin`, `<source>_train_000001.bin`, ... (llm.c's shard format, below),
`tokenizer.json` (the tokenizer, so train.py and sample.py use the very same one) and `meta.json` (written last:
a folder without it is unfinished, and rerunning the same command carries on where it stopped).

The reading side (DataError, open_shard, list_shards, load_meta, load_tokenizer) needs only numpy and the
standard library: train.py imports this file on machines without tiktoken, pyarrow, requests or rustbpe, so
those are imported inside the functions that use them.
"""
import argparse
import base64
import glob
import json
import multiprocessing
import os
import sys
import sysconfig
import time
import zlib

import numpy as np

from config import UserError
from files import save_json

# -----------------------------------------------------------------------------------------------------
# Shards (llm.c's format, DESIGN.md): a 1024-byte header of 256 little-endian int32, [0] magic 20240520,
# [1] version (1: uint16 tokens, 2: uint32 tokens), [2] token count, the rest zero; then the tokens.
# llm.c's dev/data/*.py and modded-nanogpt write exactly this, so their shards read as-is.

SHARD_MAGIC = 20240520
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
TOKEN_DTYPES = {1: np.dtype('<u2'), 2: np.dtype('<u4')}  # shard version -> token dtype


class DataError(UserError, ValueError):
    """Bad or missing data: the message is one line that says what is wrong and what to do."""


def token_dtype(vocab_size):
    """uint16 (2 bytes/token) while every id fits, i.e. vocab < 65,536 (GPT-2's 50,257 does); else uint32."""
    return np.dtype('<u2') if vocab_size < 2**16 else np.dtype('<u4')


def write_shard(path, tokens):
    """Write one shard atomically: to `path.tmp`, flushed to disk, then renamed, so a crash never leaves a
    half-written file under a shard's name. The version follows the dtype (uint16 -> 1, uint32 -> 2); other
    integer arrays are stored in the smallest of the two that holds their largest id."""
    tokens = np.asarray(tokens)
    if tokens.dtype not in (np.uint16, np.uint32):
        if tokens.size and (tokens.min() < 0 or tokens.max() >= 2**32):
            raise DataError(f"{path}: token ids must lie in [0, 2^32), got {tokens.min()}..{tokens.max()}")
        tokens = tokens.astype(token_dtype(int(tokens.max()) + 1 if tokens.size else 0))
    version = 1 if tokens.dtype == np.uint16 else 2
    header = np.zeros(HEADER_INTS, dtype='<i4')
    header[0], header[1], header[2] = SHARD_MAGIC, version, len(tokens)
    tmp = path + '.tmp'
    with open(tmp, 'wb') as f:
        f.write(header.tobytes())
        f.write(np.ascontiguousarray(tokens, dtype=TOKEN_DTYPES[version]).data)  # no copy: .tobytes() makes one
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def open_shard(path):
    """The tokens of one shard as a read-only np.memmap, after checking the header against the file size."""
    try:
        size = os.path.getsize(path)
    except OSError:
        raise DataError(f"{path}: no such shard") from None
    if size < HEADER_BYTES:
        raise DataError(f"{path}: {size} bytes, shorter than the {HEADER_BYTES}-byte shard header (truncated file?)")
    header = np.fromfile(path, dtype='<i4', count=HEADER_INTS)
    magic, version, n_tokens = int(header[0]), int(header[1]), int(header[2])
    if magic != SHARD_MAGIC:
        raise DataError(f"{path}: bad magic number {magic} (a token shard starts with {SHARD_MAGIC}): "
                        f"not a shard, or a damaged one")
    if version not in TOKEN_DTYPES:
        raise DataError(f"{path}: unknown shard version {version} (1 = uint16 tokens, 2 = uint32)")
    dtype = TOKEN_DTYPES[version]
    expected = HEADER_BYTES + n_tokens * dtype.itemsize
    if n_tokens <= 0 or size != expected:
        raise DataError(f"{path}: the header says {n_tokens} tokens ({expected} bytes) but the file has {size} "
                        f"bytes (truncated or damaged): delete it and rerun prepare.py")
    return np.memmap(path, dtype=dtype, mode='r', offset=HEADER_BYTES, shape=(n_tokens,))


def list_shards(data_dir, split):
    """Sorted paths of a folder's `*_{split}_*.bin` shards; a DataError saying how to make them if none."""
    paths = sorted(glob.glob(os.path.join(glob.escape(data_dir), f'*_{split}_*.bin')))
    if not paths:
        raise DataError(f"no {split} shards (*_{split}_*.bin) in {data_dir}: make them with "
                        f"`python prepare.py pystdlib --out {data_dir}` (or fineweb_edu, or files PATH...)")
    return paths


def load_meta(data_dir):
    path = os.path.join(data_dir, 'meta.json')
    if not os.path.exists(path):
        raise DataError(f"no meta.json in {data_dir}: prepare.py has not finished there "
                        f"(run `python prepare.py pystdlib --out {data_dir}`, or rerun your prepare command)")
    with open(path) as f:
        return json.load(f)


def load_tokenizer(data_dir):
    """The data folder's tokenizer as a tiktoken.Encoding, from its tokenizer.json (no download, no cache)."""
    import tiktoken
    path = os.path.join(data_dir, 'tokenizer.json')
    if not os.path.exists(path):
        raise DataError(f"no tokenizer.json in {data_dir}: make the folder with prepare.py")
    with open(path) as f:
        spec = json.load(f)
    ranks = {base64.b64decode(token): rank for rank, token in enumerate(spec['ranks'])}
    return tiktoken.Encoding(spec['name'], pat_str=spec['pattern'], mergeable_ranks=ranks,
                             special_tokens=spec['special_tokens'])


# -----------------------------------------------------------------------------------------------------
# Tokenizers. Both end up as tokenizer.json: the byte sequence of every rank (base64, list index = rank), the
# pre-split regex and the end-of-text token, which is all tiktoken.Encoding needs. We write this file ourselves
# instead of tiktoken's .tiktoken loader because that loader caches by path in /tmp: rebuilding a folder with
# another vocab would silently load the old ranks.

EOT = '<|endoftext|>'


def save_tokenizer(data_dir, name, pattern, mergeable_ranks, eot_id):
    ordered = sorted(mergeable_ranks.items(), key=lambda item: item[1])
    assert [rank for _, rank in ordered] == list(range(len(ordered))), "ranks must be 0..n-1"
    save_json(os.path.join(data_dir, 'tokenizer.json'), {
        'name': name, 'pattern': pattern, 'special_tokens': {EOT: eot_id}, 'vocab_size': eot_id + 1,
        'ranks': [base64.b64encode(token).decode('ascii') for token, _ in ordered]})


def parse_tokenizer(name):
    """'gpt2' or 'bpe:V' -> the vocab size asked for (None for gpt2)."""
    if name == 'gpt2':
        return None
    if name.startswith('bpe:') and name[4:].isdigit() and int(name[4:]) > 256:
        return int(name[4:])
    raise DataError(f"unknown tokenizer '{name}': use gpt2 or bpe:V with V > 256 (e.g. bpe:8192)")


def make_gpt2_tokenizer(data_dir):
    """GPT-2's BPE from tiktoken. tiktoken downloads its two files once (then caches them): offline, that fails."""
    from tiktoken_ext.openai_public import gpt2
    try:
        spec = gpt2()
    except Exception as e:  # requests' ConnectionError, or anything else the download raises
        raise DataError(f"the gpt2 tokenizer's files could not be downloaded ({type(e).__name__}): run once with "
                        f"internet so tiktoken caches them, or use our own BPE with --tokenizer bpe:8192") from None
    save_tokenizer(data_dir, 'gpt2', spec['pat_str'], spec['mergeable_ranks'], spec['special_tokens'][EOT])


def train_bpe_tokenizer(data_dir, vocab_size, texts):
    """Our own byte-level BPE with rustbpe (GPT-4's split pattern), used through tiktoken. The vocabulary is
    exactly `vocab_size`: 256 bytes + (vocab_size - 257) merges + the end-of-text token as the last id."""
    import rustbpe
    tokenizer = rustbpe.Tokenizer()
    tokenizer.train_from_iterator(iter(texts), vocab_size - 1)
    ranks = {bytes(token): rank for token, rank in tokenizer.get_mergeable_ranks()}
    if len(ranks) != vocab_size - 1:
        raise DataError(f"the BPE sample only supports {len(ranks) + 1} tokens, not bpe:{vocab_size}: "
                        f"use a smaller vocab or more text")
    save_tokenizer(data_dir, f'bpe:{vocab_size}', tokenizer.get_pattern(), ranks, vocab_size - 1)


# -----------------------------------------------------------------------------------------------------
# Tokenizing in a process pool. Each worker loads tokenizer.json once; a task is a batch of documents from one
# file, batch = (file index, first row, data, offsets): the documents' UTF-8 bytes back to back and where each
# begins (offsets[i]:offsets[i + 1], so len(offsets) = documents + 1). Bytes and offsets are what a parquet
# column already holds, so the main process hands a slice of it over without making a Python string per
# document (with 2 cores, every cycle the main process spends is taken from a worker). The answer is their
# tokens with the end-of-text token FIRST in every document (GPT-2/llm.c convention: a sequence that starts
# mid-stream still sees where documents begin), the token count per document and its UTF-8 byte count (for
# bytes per token, and to carry on after a stop).

_worker_encoding = None
_worker_dtype = None


def init_worker(data_dir):
    global _worker_encoding, _worker_dtype
    _worker_encoding = load_tokenizer(data_dir)
    _worker_dtype = token_dtype(_worker_encoding.n_vocab)


def pack_texts(texts):
    """Texts -> (UTF-8 bytes back to back, offsets), the batch layout above."""
    encoded = [text.encode('utf-8') for text in texts]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    return b''.join(encoded), offsets


def unpack_texts(data, offsets):
    """(bytes, offsets) -> the texts; a memoryview slice decodes without copying the bytes first."""
    view = memoryview(data)
    return [str(view[start:end], 'utf-8') for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist())]


def tokenize_batch(batch):
    file_index, first_row, data, offsets = batch
    texts = unpack_texts(data, offsets)
    doc_tokens = np.empty(len(texts), dtype=np.int64)
    # one array for the whole batch, each document encoded straight into its place: no list of pieces to
    # concatenate. A document of n bytes has at most n tokens (every token is at least one byte), + 1 eot.
    tokens = np.empty(int(offsets[-1] - offsets[0]) + len(texts), dtype=_worker_dtype)
    end = 0
    for i, text in enumerate(texts):
        # encode_to_numpy skips building a Python list of ints; with no special tokens allowed or disallowed it
        # is encode_ordinary: '<|endoftext|>' written in a document stays plain text
        ids = _worker_encoding.encode_to_numpy(text, disallowed_special=())
        tokens[end] = _worker_encoding.eot_token
        tokens[end + 1:end + 1 + len(ids)] = ids
        end += 1 + len(ids)
        doc_tokens[i] = 1 + len(ids)
    return file_index, first_row, tokens[:end], doc_tokens, np.diff(offsets)


def default_workers():
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1)


# -----------------------------------------------------------------------------------------------------
# Writing a data folder: shards, meta.json last, and a summary.

def shard_path(out_dir, prefix, split, index):
    return os.path.join(out_dir, f'{prefix}_{split}_{index:06d}.bin')


def remove_shards(out_dir, prefix, keep=()):
    """Delete the prefix's shards (and .tmp leftovers) not in `keep`: old ones must not be read as part of the new set."""
    for path in glob.glob(os.path.join(glob.escape(out_dir), f'{prefix}_*.bin*')):
        if path not in keep:
            os.remove(path)


def finish_meta(out_dir, meta):
    """meta.json is written last: its presence says the folder is complete."""
    meta['bytes_per_token'] = round(meta['text_bytes'] / max(1, meta['train_tokens'] + meta['val_tokens']), 3)
    save_json(os.path.join(out_dir, 'meta.json'), meta)
    shard_bytes = sum(os.path.getsize(p) for split in ('val', 'train') for p in list_shards(out_dir, split))
    print(f"done: {out_dir}: {meta['documents']:,} documents, {meta['train_tokens']:,} train + "
          f"{meta['val_tokens']:,} val tokens in {meta['train_shards']} + {meta['val_shards']} shards "
          f"({shard_bytes / 1e6:,.1f} MB, {meta['dtype']}), {meta['bytes_per_token']} text bytes per token, "
          f"tokenizer {meta['tokenizer']} (vocab {meta['vocab_size']:,})")
    return meta


def complete_meta(out_dir, request, carry_on_keys=()):
    """A rerun of a finished folder with the same request is a fast no-op: returns its meta (None when there is
    work to do). If only `carry_on_keys` differ (a larger --tokens), the folder is marked unfinished and the
    caller carries on; any other difference is refused rather than mixed with the old shards."""
    path = os.path.join(out_dir, 'meta.json')
    if not os.path.exists(path):
        return None
    meta = load_meta(out_dir)
    if meta.get('request') == request:
        print(f"already complete: {out_dir} ({meta['train_tokens']:,} train + {meta['val_tokens']:,} val tokens, "
              f"{meta['tokenizer']}); delete the folder to rebuild it")
        return meta
    if {k: v for k, v in meta.get('request', {}).items() if k not in carry_on_keys} != \
            {k: v for k, v in request.items() if k not in carry_on_keys}:
        raise DataError(f"{out_dir} already holds a dataset made with {meta.get('request')}: "
                        f"delete it or choose another --out")
    os.remove(path)
    return None


# -----------------------------------------------------------------------------------------------------
# Source 1: pystdlib, the embedded default. The .py files of the running Python's standard library: about
# 30 MB of real text on every machine, no download. Installed third-party packages (site-packages,
# dist-packages) are left out because they differ between machines; the stdlib's own test suite stays in
# (it is real Python too, and a third of the text). Split by file with a hash of the relative path, so a
# file's side never changes when other files come and go; about 5% of the files go to val.

PYSTDLIB_VAL_PERCENT = 5


def pystdlib_files(max_files=0):
    """(relative path, text) of the stdlib's .py files, sorted; `max_files` > 0 keeps an evenly spread subset
    (used by the tests). Files that are not valid UTF-8 (a few deliberate test cases) are skipped."""
    root = sysconfig.get_paths()['stdlib']
    paths = sorted(glob.glob(os.path.join(glob.escape(root), '**', '*.py'), recursive=True))
    paths = [p for p in paths if not {'site-packages', 'dist-packages'} & set(os.path.relpath(p, root).split(os.sep))]
    if max_files and len(paths) > max_files:
        paths = [paths[i * len(paths) // max_files] for i in range(max_files)]
    files = []
    for path in paths:
        with open(path, 'rb') as f:
            raw = f.read()
        try:
            files.append((os.path.relpath(path, root).replace(os.sep, '/'), raw.decode('utf-8')))
        except UnicodeDecodeError:
            continue
    if not files:
        raise DataError(f"no .py files found under {root}: this Python has no standard library sources; "
                        f"use `prepare.py files PATH...` instead")
    return files


def tokenize_all(out_dir, texts, workers, batch_docs=64):
    """Tokenize a list of documents with the pool; returns (tokens, text bytes)."""
    batches = [(0, i, *pack_texts(texts[i:i + batch_docs])) for i in range(0, len(texts), batch_docs)]
    with multiprocessing.Pool(workers, initializer=init_worker, initargs=(out_dir,)) as pool:
        results = pool.map(tokenize_batch, batches)
    tokens = np.concatenate([r[2] for r in results]) if results else np.zeros(0, np.uint16)
    return tokens, int(sum(r[4].sum() for r in results))


def prepare_pystdlib(out_dir='data/pystdlib', tokenizer='bpe:8192', workers=0, shard_tokens=100_000_000,
                     max_files=0):
    """Build (or find complete) the pystdlib data folder; returns its meta dict."""
    request = {'source': 'pystdlib', 'tokenizer': tokenizer, 'shard_tokens': shard_tokens, 'max_files': max_files}
    meta = complete_meta(out_dir, request)
    if meta is not None:
        return meta
    vocab_size = parse_tokenizer(tokenizer)
    started = time.time()
    files = pystdlib_files(max_files)
    split_of = {path: 'val' if zlib.crc32(path.encode()) % 100 < PYSTDLIB_VAL_PERCENT else 'train'
                for path, _ in files}
    texts = {split: [text for path, text in files if split_of[path] == split] for split in ('val', 'train')}
    if not texts['val'] or not texts['train']:
        raise DataError(f"{len(files)} stdlib files leave one split empty: use more files (--max-files)")
    os.makedirs(out_dir, exist_ok=True)
    print(f"pystdlib: {len(texts['train'])} train + {len(texts['val'])} val files from "
          f"{sysconfig.get_paths()['stdlib']} (Python {sys.version.split()[0]})")
    if vocab_size is None:
        make_gpt2_tokenizer(out_dir)
    else:  # the BPE learns from the train files only, so val text stays unseen
        train_bpe_tokenizer(out_dir, vocab_size, texts['train'])
    encoding = load_tokenizer(out_dir)
    meta = {'source': 'pystdlib', 'revision': f"python {sys.version.split()[0]}", 'tokenizer': tokenizer,
            'vocab_size': encoding.n_vocab, 'eot_id': encoding.eot_token,
            'dtype': token_dtype(encoding.n_vocab).name, 'shard_tokens': shard_tokens,
            'documents': len(files), 'text_bytes': 0, 'request': request}
    written, index = [], 0
    for split in ('val', 'train'):
        tokens, text_bytes = tokenize_all(out_dir, texts[split], workers or default_workers())
        meta['text_bytes'] += text_bytes
        meta[f'{split}_tokens'] = len(tokens)
        meta[f'{split}_shards'] = 0
        for start in range(0, len(tokens), shard_tokens):
            written.append(shard_path(out_dir, 'pystdlib', split, index))
            write_shard(written[-1], tokens[start:start + shard_tokens])
            meta[f'{split}_shards'] += 1
            index += 1
    remove_shards(out_dir, 'pystdlib', keep=written)
    print(f"pystdlib: tokenized in {time.time() - started:.1f} s")
    return finish_meta(out_dir, meta)


# -----------------------------------------------------------------------------------------------------
# Streams: sources too big for memory (fineweb_edu, files) are read one batch of documents at a time, in a
# fixed order (file by file, row by row), and cut into shards at fixed stream offsets: the val shard holds
# stream tokens [0, V), train shard k >= 1 holds [V + (k-1)S, V + kS). The cuts depend only on the documents
# and the tokenizer, so after each full shard we record where the next one starts (file, row, tokens of that
# document already written) in progress.json; a rerun skips the finished shards' documents without reading
# them (whole files, then whole parquet row groups) and carries on, writing exactly the same shards.

def parquet_batches(path, start_row=0, batch_docs=1024):
    """Yield (first row, data, offsets) batches of a parquet file's `text` column from `start_row` on, in the
    batch layout above: the UTF-8 bytes (a memoryview of Arrow's buffer, not copied) and int64 offsets. No
    Python object per document, and only the row groups from `start_row` on are read. Record batches of
    `batch_docs` rows (pyarrow's iter_batches, one thread) hold one batch of decoded text at a time, not a
    row group, and cost less CPU: on `prepare.py bench`'s 126 MB row group 0.16 s against 0.6-0.9 s for
    read_row_group with pyarrow's thread pool, CPU taken from the tokenizing workers."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    parquet = pq.ParquetFile(path)
    if 'text' not in parquet.schema_arrow.names:
        raise DataError(f"{path}: no 'text' column (it has {', '.join(parquet.schema_arrow.names)})")
    first_group, row = 0, 0  # the first row group to read, and its first row
    group_rows = [parquet.metadata.row_group(group).num_rows for group in range(parquet.num_row_groups)]
    while first_group < len(group_rows) and row + group_rows[first_group] <= start_row:
        row += group_rows[first_group]
        first_group += 1
    groups = range(first_group, len(group_rows))
    for batch in parquet.iter_batches(batch_docs, row_groups=groups, columns=['text'], use_threads=False):
        column = batch.column(0)
        if row + len(column) <= start_row:  # the first row group's rows before start_row
            row += len(column)
            continue
        if row < start_row:
            column, row = column.slice(start_row - row), start_row
        if column.type not in (pa.string(), pa.large_string()):
            column = column.cast(pa.large_string())
        if column.null_count:
            column = column.fill_null('')
        _, offsets, data = column.buffers()
        offsets = np.frombuffer(offsets, dtype=np.int32 if column.type == pa.string() else np.int64)
        offsets = offsets[column.offset:column.offset + len(column) + 1].astype(np.int64)
        if len(column):
            yield row, memoryview(data if data is not None else b''), offsets
        row += len(column)


def read_documents(path, start_row=0):
    """Yield (row, text) of one local file from `start_row` on: .parquet (its `text` column), .jsonl (the
    "text" field of each non-blank line) or .txt (one document)."""
    if path.endswith('.parquet'):
        for first_row, data, offsets in parquet_batches(path, start_row):
            yield from enumerate(unpack_texts(data, offsets), first_row)
    elif path.endswith('.jsonl'):
        with open(path, encoding='utf-8') as f:
            row = 0
            for line_number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                if row >= start_row:
                    try:
                        text = json.loads(line)['text']
                    except (ValueError, KeyError, TypeError):
                        raise DataError(f"{path}:{line_number}: not a JSON object with a \"text\" field") from None
                    yield row, text
                row += 1
    elif start_row == 0:
        with open(path, encoding='utf-8') as f:
            yield 0, f.read()


def document_batches(paths, fetch, position, batch_docs, wait_for_file=None):
    """Yield (file index, first row, data, offsets) batches of `batch_docs` documents from `position` =
    (file, row) on; batches never span two files. A parquet batch is Arrow's bytes (copied once, to pickle);
    other files' texts are packed. `fetch(i)` returns file i's local path
    (downloading it if needed); `wait_for_file(i)` is called first and returns False when file i is not
    needed after all (the token target was reached)."""
    start_file, start_row = position
    for file_index in range(start_file, len(paths)):
        if wait_for_file is not None and file_index > start_file and not wait_for_file(file_index):
            return
        path, first_row = fetch(file_index), start_row if file_index == start_file else 0
        if path.endswith('.parquet'):
            for first_row, data, offsets in parquet_batches(path, first_row, batch_docs):
                yield file_index, first_row, bytes(data[offsets[0]:offsets[-1]]), offsets - offsets[0]
            continue
        texts = []
        for row, text in read_documents(path, first_row):
            texts.append(text)
            if len(texts) == batch_docs:
                yield file_index, row + 1 - len(texts), *pack_texts(texts)
                texts = []
        if texts:
            yield file_index, row + 1 - len(texts), *pack_texts(texts)


def bpe_sample(documents, skip_chars, sample_chars):
    """Texts for training the BPE: skip the first `skip_chars` characters of the stream (where the val shard's
    documents are: BPE packs text into ~4-5 characters per token, so 8 characters per val token is a safe
    margin) and take the next `sample_chars`, so val text stays unseen by the tokenizer too."""
    seen = taken = 0
    for text in documents:
        seen += len(text)
        if seen <= skip_chars:
            continue
        yield text
        taken += len(text)
        if taken >= sample_chars:
            return


def format_duration(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def tokenize_stream(out_dir, prefix, paths, fetch, request, workers, val_tokens, shard_tokens, max_tokens,
                    batch_docs=256):
    """Tokenize the documents of `paths` in order into shards, carrying on from progress.json; returns the meta
    fields for the counts. `max_tokens` = 0 reads everything."""
    import threading
    progress_path = os.path.join(out_dir, 'progress.json')
    state = {'request': request, 'shards': 0, 'file': 0, 'row': 0, 'skip': 0, 'documents': 0, 'text_bytes': 0}
    if os.path.exists(progress_path):
        with open(progress_path) as f:
            state = json.load(f)
        if state['request'] != request:
            raise DataError(f"{out_dir} holds an unfinished dataset made with {state['request']}: rerun that "
                            f"command to finish it, or delete the folder or choose another --out")
    target = max_tokens or float('inf')

    def shard_end(index):  # stream offset where shard `index` ends
        return val_tokens + index * shard_tokens

    shard = state['shards']
    stream_offset = shard_end(shard - 1) if shard else 0  # stream offset of the first buffered token
    if stream_offset >= target:
        stream_offset, shard = 0, 0  # a smaller --tokens than a finished run's: start over
        state.update(shards=0, file=0, row=0, skip=0, documents=0, text_bytes=0)
    if shard:
        print(f"{prefix}: carrying on after {shard} complete shards ({stream_offset:,} tokens)")
    buffer, buffered = [], 0
    documents, text_bytes = state['documents'], state['text_bytes']
    written = [shard_path(out_dir, prefix, 'val' if i == 0 else 'train', i) for i in range(shard)]

    # At most `in_flight` batches are out with the workers: the feeding thread blocks on `slots`, so files are
    # downloaded as the tokenizer needs them. Before opening another file it waits until every batch out is
    # written, and stops if the target has been reached: no file is fetched that the shards do not use.
    in_flight = 4 * workers
    slots, stop = threading.Semaphore(in_flight), threading.Event()

    def wait_for_file(file_index):
        for _ in range(in_flight):
            slots.acquire()
        for _ in range(in_flight):
            slots.release()
        return not stop.is_set()

    def feed():
        for batch in document_batches(paths, fetch, (state['file'], state['row']), batch_docs, wait_for_file):
            slots.acquire()
            if stop.is_set():
                return
            yield batch

    started, started_offset, skip = time.time(), stream_offset, state['skip']
    last_report = started
    done = False
    with multiprocessing.Pool(workers, initializer=init_worker, initargs=(out_dir,)) as pool:
        try:
            for file_index, first_row, tokens, doc_tokens, doc_bytes in pool.imap(tokenize_batch, feed()):
                counted = np.ones(len(doc_tokens), dtype=np.int64)
                if skip:  # the first document was partly written before the stop: drop those tokens
                    tokens, doc_tokens[0], counted[0], doc_bytes[0], skip = tokens[skip:], doc_tokens[0] - skip, 0, 0, 0
                doc_starts = stream_offset + buffered + np.concatenate([[0], np.cumsum(doc_tokens)[:-1]])
                buffer.append(tokens)
                buffered += len(tokens)
                while stream_offset + buffered >= min(shard_end(shard), target):
                    end = min(shard_end(shard), target)
                    data = np.concatenate(buffer)
                    written.append(shard_path(out_dir, prefix, 'val' if shard == 0 else 'train', shard))
                    write_shard(written[-1], data[:end - stream_offset])
                    buffer, buffered = [data[end - stream_offset:]], stream_offset + buffered - end
                    stream_offset, shard = end, shard + 1
                    # the document holding stream token `end`, and how many of its tokens are written
                    inside = np.searchsorted(doc_starts, end, side='right') - 1
                    before = np.searchsorted(doc_starts, end, side='left')  # documents that began before `end`
                    if end == shard_end(shard - 1):
                        state.update(shards=shard, file=file_index, row=first_row + int(inside),
                                     skip=int(end - doc_starts[inside]),
                                     documents=documents + int(counted[:before].sum()),
                                     text_bytes=text_bytes + int((doc_bytes * counted)[:before].sum()))
                        save_json(progress_path, state)
                    if end == target:
                        documents += int(counted[:before].sum())
                        text_bytes += int((doc_bytes * counted)[:before].sum())
                        done = True
                        break
                if done:
                    break
                documents += int(counted.sum())
                text_bytes += int((doc_bytes * counted).sum())
                now = time.time()
                if now - last_report > (1 if sys.stderr.isatty() else 30):
                    last_report, total = now, stream_offset + buffered
                    rate = (total - started_offset) / (now - started)
                    eta = f" | ETA {format_duration((target - total) / rate)}" if max_tokens and rate else ''
                    goal = f" / {max_tokens:,}" if max_tokens else ''
                    line = (f"{prefix}: {total:,}{goal} tokens | {rate / 1e6:.2f}M tokens/s | shard {shard} | "
                            f"file {file_index + 1}/{len(paths)}{eta}")
                    if sys.stderr.isatty():  # one line redrawn in place
                        print('\r' + line + '   ', end='', file=sys.stderr, flush=True)
                    else:
                        print(line, file=sys.stderr, flush=True)
                slots.release()  # only now: a batch counts as out until its tokens are in the buffer
        finally:
            stop.set()
            for _ in range(in_flight):
                slots.release()
    if sys.stderr.isatty():
        print(file=sys.stderr)
    if not done and buffered:  # the documents ran out: the rest is the last (shorter) shard
        if shard == 0:
            raise DataError(f"only {buffered:,} tokens in all, fewer than the {val_tokens:,} of the val shard: "
                            f"lower --val-tokens")
        written.append(shard_path(out_dir, prefix, 'train', shard))
        write_shard(written[-1], np.concatenate(buffer))
        stream_offset, shard = stream_offset + buffered, shard + 1
    if shard < 2:
        raise DataError(f"all {stream_offset:,} tokens went to the val shard: lower --val-tokens")
    remove_shards(out_dir, prefix, keep=written)
    elapsed = time.time() - started
    print(f"{prefix}: {stream_offset - started_offset:,} tokens in {elapsed:.1f} s "
          f"({(stream_offset - started_offset) / max(elapsed, 1e-9) / 1e6:.2f}M tokens/s)")
    return {'documents': documents, 'text_bytes': text_bytes, 'val_tokens': min(val_tokens, stream_offset),
            'train_tokens': stream_offset - val_tokens, 'val_shards': 1, 'train_shards': shard - 1}


# -----------------------------------------------------------------------------------------------------
# Source 2: fineweb_edu. The parquet files of a FineWeb-Edu sample (HuggingFaceFW/fineweb-edu, folder
# sample/10BT, sample/100BT or sample/350BT) over plain HTTP from the Hub: the revision ("main" by default) is
# resolved to its commit once and pinned in progress.json and meta.json, so a rerun weeks later reads the same
# files. Hub API: GET {endpoint}/api/datasets/{repo}/revision/{rev} -> {"sha": ...};
# GET {endpoint}/api/datasets/{repo}/tree/{sha}/{folder} -> [{"type": "file", "path": ..., "size": ...}, ...]
# (paged with a Link: <next>; rel="next" header); files at {endpoint}/datasets/{repo}/resolve/{sha}/{path}.

HUB_ENDPOINT = 'https://huggingface.co'
FINEWEB_EDU = 'HuggingFaceFW/fineweb-edu'
HTTP_ATTEMPTS = 8          # tries per request before giving up (a download's count restarts when bytes arrive)
RETRY_BACKOFF_S = 2.0      # waits 2, 4, 8, ... s (capped at 60) between tries
HTTP_TIMEOUT_S = (10, 60)  # (connect, read between bytes)
DOWNLOAD_CHUNK_BYTES = 1 << 20  # written to .partial chunk by chunk: a drop loses at most the chunk in flight


def http_get(session, url, headers=None, stream=False):
    """GET with retries on 5xx/429, time-outs and dropped connections, with exponential backoff. A 4xx answer
    is a DataError naming the URL (404: wrong sample, revision or endpoint)."""
    import requests
    for attempt in range(HTTP_ATTEMPTS):
        try:
            response = session.get(url, headers=headers, stream=stream, timeout=HTTP_TIMEOUT_S)
        except (requests.ConnectionError, requests.Timeout) as e:
            problem = type(e).__name__
        else:
            if response.status_code < 400:
                return response
            problem = f"HTTP {response.status_code}"
            response.close()
            if response.status_code == 404:
                raise DataError(f"{url}: not found (HTTP 404): check --sample, --revision and --endpoint")
            if response.status_code < 500 and response.status_code != 429:
                raise DataError(f"{url}: HTTP {response.status_code} {response.reason}")
        if attempt + 1 < HTTP_ATTEMPTS:
            wait = min(60.0, RETRY_BACKOFF_S * 2**attempt)
            print(f"{url}: {problem}, retrying in {wait:g} s ({attempt + 1}/{HTTP_ATTEMPTS})", file=sys.stderr)
            time.sleep(wait)
    raise DataError(f"{url}: still failing after {HTTP_ATTEMPTS} tries ({problem}): check the network and rerun "
                    f"(finished work is kept)")


def hub_files(session, endpoint, repo, revision, folder):
    """(commit sha, sorted [{'path', 'size'}] of the folder's .parquet files) at a revision."""
    sha = http_get(session, f"{endpoint}/api/datasets/{repo}/revision/{revision}").json()['sha']
    files, url = [], f"{endpoint}/api/datasets/{repo}/tree/{sha}/{folder}"
    while url:
        response = http_get(session, url)
        files += [{'path': item['path'], 'size': item['size']} for item in response.json()
                  if item['type'] == 'file' and item['path'].endswith('.parquet')]
        url = response.links.get('next', {}).get('url')
    if not files:
        raise DataError(f"no parquet files in {repo}/{folder} at {revision}: check --sample")
    return sha, sorted(files, key=lambda item: item['path'])


def download(session, url, dest, size):
    """Stream `url` to `dest`.partial, carrying on with an HTTP Range request after a dropped connection, check
    the size, and rename to `dest` when complete. A complete `dest` is kept as it is."""
    import requests
    if os.path.exists(dest) and os.path.getsize(dest) == size:
        return dest
    partial, attempt = dest + '.partial', 0
    while True:
        have = os.path.getsize(partial) if os.path.exists(partial) else 0
        if have == size:
            break
        if have > size:  # damaged: start over
            os.remove(partial)
            have = 0
        response = http_get(session, url, headers={'Range': f'bytes={have}-'} if have else None, stream=True)
        if have and response.status_code != 206:  # the server ignored the Range: take the whole file again
            have = 0
        try:
            with response, open(partial, 'ab' if have else 'wb') as f:
                for chunk in response.iter_content(chunk_size=DOWNLOAD_CHUNK_BYTES):
                    f.write(chunk)
        except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError):
            pass  # dropped half way: the next round asks for the rest
        got = os.path.getsize(partial)
        attempt = 0 if got > have else attempt + 1
        if got != size and attempt >= HTTP_ATTEMPTS:
            raise DataError(f"{url}: download stuck at {got:,} of {size:,} bytes after {HTTP_ATTEMPTS} tries: "
                            f"rerun to carry on")
        if got < size and got == have:
            time.sleep(min(60.0, RETRY_BACKOFF_S * 2**attempt))
    os.replace(partial, dest)
    return dest


def prepare_fineweb_edu(out_dir='data/fineweb_edu', sample='100BT', tokens=0, tokenizer='gpt2', workers=0,
                        shard_tokens=100_000_000, val_tokens=0, endpoint=HUB_ENDPOINT, revision='main',
                        bpe_sample_chars=1_000_000_000, delete_downloads=False):
    """Build (or carry on, or find complete) a FineWeb-Edu data folder; returns its meta dict."""
    import requests
    if sample not in ('10BT', '100BT', '350BT'):
        raise DataError(f"unknown sample '{sample}': use 10BT, 100BT or 350BT")
    val_tokens = val_tokens or shard_tokens  # llm.c's convention: the first shard is val
    request = {'source': 'fineweb_edu', 'sample': sample, 'tokenizer': tokenizer, 'shard_tokens': shard_tokens,
               'val_tokens': val_tokens, 'endpoint': endpoint, 'revision': revision}
    meta = complete_meta(out_dir, dict(request, tokens=tokens), carry_on_keys=('tokens',))
    if meta is not None:
        return meta
    vocab_size = parse_tokenizer(tokenizer)
    os.makedirs(os.path.join(out_dir, 'downloads'), exist_ok=True)
    session = requests.Session()
    manifest_path = os.path.join(out_dir, 'files.json')
    if os.path.exists(manifest_path):  # pinned by the first run: same commit, same files, no listing needed
        with open(manifest_path) as f:
            manifest = json.load(f)
    else:
        sha, files = hub_files(session, endpoint, FINEWEB_EDU, revision, f'sample/{sample}')
        manifest = {'repo': FINEWEB_EDU, 'revision': sha, 'files': files}
        save_json(manifest_path, manifest)
    files, sha = manifest['files'], manifest['revision']
    print(f"fineweb_edu: sample/{sample} at {sha}: {len(files)} parquet files, "
          f"{sum(f['size'] for f in files) / 1e9:,.1f} GB")
    paths = [os.path.join(out_dir, 'downloads', os.path.basename(f['path'])) for f in files]

    def fetch(index):
        if not os.path.exists(paths[index]):
            print(f"fineweb_edu: downloading {files[index]['path']} ({files[index]['size'] / 1e9:.2f} GB)")
        return download(session, f"{endpoint}/datasets/{FINEWEB_EDU}/resolve/{sha}/{files[index]['path']}",
                        paths[index], files[index]['size'])

    def fetch_for_shards(index):
        if delete_downloads:  # the earlier files have been read (a rerun downloads again what it still needs)
            for old in paths[:index]:
                if os.path.exists(old):
                    os.remove(old)
        return fetch(index)

    if not os.path.exists(os.path.join(out_dir, 'tokenizer.json')):
        if vocab_size is None:
            make_gpt2_tokenizer(out_dir)
        else:
            texts = (text for path in map(fetch, range(len(paths))) for _, text in read_documents(path))
            train_bpe_tokenizer(out_dir, vocab_size, bpe_sample(texts, 8 * val_tokens, bpe_sample_chars))
    counts = tokenize_stream(out_dir, 'fineweb_edu', paths, fetch_for_shards, request, workers or default_workers(),
                             val_tokens, shard_tokens, tokens)
    return finish_meta(out_dir, dataset_meta(out_dir, f'fineweb_edu/sample/{sample}', sha, tokenizer,
                                             shard_tokens, dict(request, tokens=tokens), counts))


# -----------------------------------------------------------------------------------------------------
# Source 3: files, your own text: .txt (a file is one document), .jsonl (a "text" field per line) or .parquet
# (a "text" column), in the order given.

FILE_TYPES = ('.txt', '.jsonl', '.parquet')


def prepare_files(paths, out_dir='data/files', tokenizer='bpe:8192', workers=0, shard_tokens=100_000_000,
                  val_tokens=0, tokens=0, bpe_sample_chars=1_000_000_000):
    """Build (or carry on, or find complete) a data folder from local files; returns its meta dict."""
    for path in paths:
        if not os.path.isfile(path):
            raise DataError(f"{path}: no such file")
        if not path.endswith(FILE_TYPES):
            raise DataError(f"{path}: unknown file type (use {', '.join(FILE_TYPES)})")
    paths = [os.path.abspath(p) for p in paths]
    # Default val: ~10% of the tokens, estimated at ~4 bytes of file per token (text and jsonl ~4-5, parquet
    # ~3-4 compressed), at most one shard.
    val_tokens = val_tokens or max(1, min(shard_tokens, sum(os.path.getsize(p) for p in paths) // 40))
    request = {'source': 'files', 'paths': paths, 'tokenizer': tokenizer, 'shard_tokens': shard_tokens,
               'val_tokens': val_tokens}
    meta = complete_meta(out_dir, dict(request, tokens=tokens), carry_on_keys=('tokens',))
    if meta is not None:
        return meta
    vocab_size = parse_tokenizer(tokenizer)
    os.makedirs(out_dir, exist_ok=True)
    if not os.path.exists(os.path.join(out_dir, 'tokenizer.json')):
        if vocab_size is None:
            make_gpt2_tokenizer(out_dir)
        else:
            texts = (text for path in paths for _, text in read_documents(path))
            sample = list(bpe_sample(texts, 8 * val_tokens, bpe_sample_chars))
            if not sample:
                raise DataError(f"no text left to train the BPE on after the val part: lower --val-tokens "
                                f"(now {val_tokens:,})")
            train_bpe_tokenizer(out_dir, vocab_size, sample)
    counts = tokenize_stream(out_dir, 'files', paths, paths.__getitem__, request, workers or default_workers(),
                             val_tokens, shard_tokens, tokens)
    return finish_meta(out_dir, dataset_meta(out_dir, 'files', None, tokenizer, shard_tokens,
                                             dict(request, tokens=tokens), counts))


def dataset_meta(out_dir, source, revision, tokenizer, shard_tokens, request, counts):
    encoding = load_tokenizer(out_dir)
    return dict({'source': source, 'revision': revision, 'tokenizer': tokenizer, 'vocab_size': encoding.n_vocab,
                 'eot_id': encoding.eot_token, 'dtype': token_dtype(encoding.n_vocab).name,
                 'shard_tokens': shard_tokens, 'request': request}, **counts)


# -----------------------------------------------------------------------------------------------------
# Benchmark (not a test): tokens/s of the whole pipeline (read parquet -> pool -> shards -> meta.json) against
# raw tiktoken (the same encode_to_numpy calls in the same number of processes, text already in memory,
# nothing written), on the same text with the same tokenizer. Offline-friendly: the text is the stdlib sources repeated into a
# parquet file, the tokenizer our bpe:8192 (or gpt2 where tiktoken has its files).

def count_tokens(texts):
    return sum(len(_worker_encoding.encode_to_numpy(text, disallowed_special=())) for text in texts)


def cpu_seconds():
    """CPU time of this process and its finished children (the pool's workers once they are joined)."""
    import resource
    return sum(usage.ru_utime + usage.ru_stime
               for usage in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))


def bench(workers=0, megabytes=100, tokenizer='bpe:8192', rounds=3):
    """Alternate raw and pipeline runs `rounds` times and keep the best of each, so a busy machine hurts both
    sides alike. CPU seconds per token are measured too: unlike wall time, they do not depend on what else
    the machine runs. Returns (raw, pipeline) tokens/s."""
    import shutil
    import tempfile

    import pyarrow as pa
    import pyarrow.parquet as pq
    import tiktoken
    workers = workers or default_workers()
    with tempfile.TemporaryDirectory() as tmp:
        stdlib = [text for _, text in pystdlib_files()]
        texts, size = [], 0
        while size < megabytes * 1e6:
            texts += stdlib
            size += sum(len(t.encode('utf-8')) for t in stdlib)
        parquet = os.path.join(tmp, 'bench.parquet')
        pq.write_table(pa.table({'text': texts}), parquet, row_group_size=10_000)
        if tokenizer == 'gpt2':
            make_gpt2_tokenizer(tmp)
        else:
            train_bpe_tokenizer(tmp, parse_tokenizer(tokenizer), stdlib)
        batches = [texts[i:i + 256] for i in range(0, len(texts), 256)]
        raw, pipeline = [], []  # (tokens/s, CPU seconds) per round
        for _ in range(rounds):
            started, cpu_started = time.time(), cpu_seconds()  # both sides start their pool from scratch
            with multiprocessing.Pool(workers, initializer=init_worker, initargs=(tmp,)) as pool:
                raw_tokens = sum(pool.imap(count_tokens, batches))
                raw_rate = raw_tokens / (time.time() - started)
            raw.append((raw_rate, cpu_seconds() - cpu_started))
            out = os.path.join(tmp, 'pipeline')
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(out)
            shutil.copy(os.path.join(tmp, 'tokenizer.json'), out)  # the same tokenizer, not trained again
            started, cpu_started = time.time(), cpu_seconds()
            meta = prepare_files([parquet], out, tokenizer, workers, shard_tokens=100_000_000)
            pipeline_tokens = meta['train_tokens'] + meta['val_tokens']
            pipeline.append((pipeline_tokens / (time.time() - started), cpu_seconds() - cpu_started))
    raw_rate, pipeline_rate = max(r for r, _ in raw), max(r for r, _ in pipeline)
    raw_cpu, pipeline_cpu = min(c for _, c in raw) / raw_tokens, min(c for _, c in pipeline) / pipeline_tokens
    print(f"bench: {size / 1e6:.0f} MB of text (the stdlib sources repeated), {len(texts):,} documents, "
          f"{tokenizer}, {workers} workers, best of {rounds} alternating rounds; tiktoken {tiktoken.__version__}, "
          f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    for name, rounds_, tokens_, cpu in (('raw tiktoken', raw, raw_tokens, raw_cpu),
                                        ('pipeline    ', pipeline, pipeline_tokens, pipeline_cpu)):
        print(f"bench: {name} {tokens_:,} tokens, {max(r for r, _ in rounds_) / 1e6:.2f}M tokens/s "
              f"(rounds: {', '.join(f'{r / 1e6:.2f}' for r, _ in rounds_)}), {cpu * 1e9:.0f} CPU ns/token")
    print(f"bench: pipeline / raw = {pipeline_rate / raw_rate:.1%} in tokens/s, "
          f"{raw_cpu / pipeline_cpu:.1%} in CPU time per token")
    return raw_rate, pipeline_rate


# -----------------------------------------------------------------------------------------------------
# Command line

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0].strip(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sources = parser.add_subparsers(dest='source', required=True)

    def common(sub, out, tokenizer, shard_tokens=100_000_000):
        sub.add_argument('--out', default=out, help=f'data folder (default {out})')
        sub.add_argument('--tokenizer', default=tokenizer, help=f'gpt2 or bpe:V (default {tokenizer})')
        sub.add_argument('--workers', type=int, default=0, help='tokenizer processes (default: all cores)')
        sub.add_argument('--shard-tokens', type=lambda s: int(float(s)), default=shard_tokens,
                         help=f'tokens per shard (default {shard_tokens:,})')

    # pystdlib: 8,192 tokens is enough for ~30 MB of code (each merge still seen thousands of times), keeps a
    # small CPU model's embedding and output layer cheap (8192 x 256 = 2.1M params each at n_embd 256), is a
    # multiple of 128 (fast matmuls) and fits uint16.
    sub = sources.add_parser('pystdlib', help="the running Python's standard library sources (no download)")
    common(sub, 'data/pystdlib', 'bpe:8192')
    sub.add_argument('--max-files', type=int, default=0, help='an evenly spread subset of the files (0: all)')

    sub = sources.add_parser('fineweb_edu', help='a FineWeb-Edu sample from the Hugging Face Hub (resumable)')
    common(sub, 'data/fineweb_edu', 'gpt2')
    sub.add_argument('--sample', default='100BT', help='10BT, 100BT or 350BT (default 100BT)')
    sub.add_argument('--tokens', type=lambda s: int(float(s)), default=0,
                     help='stop after this many tokens, val included (e.g. 26e9; default: the whole sample)')
    sub.add_argument('--val-tokens', type=lambda s: int(float(s)), default=0,
                     help='tokens in the val shard (default: one shard)')
    sub.add_argument('--endpoint', default=HUB_ENDPOINT, help=f'Hub base URL (default {HUB_ENDPOINT})')
    sub.add_argument('--revision', default='main', help='dataset revision (branch, tag or commit; default main)')
    sub.add_argument('--bpe-sample-chars', type=lambda s: int(float(s)), default=1_000_000_000,
                     help='characters the bpe:V tokenizer trains on (default 1e9)')
    sub.add_argument('--delete-downloads', action='store_true',
                     help='delete each parquet file once it has been read (saves disk; a rerun may download again)')

    sub = sources.add_parser('files', help='your own .txt, .jsonl ("text" field) or .parquet ("text" column) files')
    sub.add_argument('paths', nargs='+', metavar='PATH')
    common(sub, 'data/files', 'bpe:8192')
    sub.add_argument('--tokens', type=lambda s: int(float(s)), default=0, help='stop after this many tokens')
    sub.add_argument('--val-tokens', type=lambda s: int(float(s)), default=0,
                     help='tokens in the val shard (default: ~10%% of the estimated total, at most one shard)')
    sub.add_argument('--bpe-sample-chars', type=lambda s: int(float(s)), default=1_000_000_000,
                     help='characters the bpe:V tokenizer trains on (default 1e9)')

    sub = sources.add_parser('bench', help='tokens/s of the pipeline against raw tiktoken (a benchmark, not a test)')
    sub.add_argument('--workers', type=int, default=0, help='processes for both (default: all cores)')
    sub.add_argument('--megabytes', type=int, default=100, help='MB of text (default 100)')
    sub.add_argument('--rounds', type=int, default=3, help='alternating rounds, best of each kept (default 3)')
    sub.add_argument('--tokenizer', default='bpe:8192', help='bpe:V (trained on the stdlib) or gpt2')

    args = parser.parse_args(argv)
    try:
        if args.source == 'pystdlib':
            prepare_pystdlib(args.out, args.tokenizer, args.workers, args.shard_tokens, args.max_files)
        elif args.source == 'fineweb_edu':
            prepare_fineweb_edu(args.out, args.sample, args.tokens, args.tokenizer, args.workers, args.shard_tokens,
                                args.val_tokens, args.endpoint.rstrip('/'), args.revision, args.bpe_sample_chars,
                                args.delete_downloads)
        elif args.source == 'files':
            prepare_files(args.paths, args.out, args.tokenizer, args.workers, args.shard_tokens, args.val_tokens,
                          args.tokens, args.bpe_sample_chars)
        else:
            bench(args.workers, args.megabytes, args.tokenizer, args.rounds)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == '__main__':
    main()
