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

# -----------------------------------------------------------------------------------------------------
# Shards (llm.c's format, DESIGN.md): a 1024-byte header of 256 little-endian int32, [0] magic 20240520,
# [1] version (1: uint16 tokens, 2: uint32 tokens), [2] token count, the rest zero; then the tokens.
# llm.c's dev/data/*.py and modded-nanogpt write exactly this, so their shards read as-is.

SHARD_MAGIC = 20240520
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
TOKEN_DTYPES = {1: np.dtype('<u2'), 2: np.dtype('<u4')}  # shard version -> token dtype


class DataError(ValueError):
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
        f.write(tokens.astype(TOKEN_DTYPES[version], copy=False).tobytes())
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


def save_json(path, obj):
    tmp = path + '.tmp'
    with open(tmp, 'w') as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


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
# file (batch = (file index, first row, texts)); the answer is their tokens with the end-of-text token FIRST in
# every document (GPT-2/llm.c convention: a sequence that starts mid-stream still sees where documents begin),
# the token count per document and its UTF-8 byte count (for bytes per token, and to carry on after a stop).

_worker_encoding = None
_worker_dtype = None


def init_worker(data_dir):
    global _worker_encoding, _worker_dtype
    _worker_encoding = load_tokenizer(data_dir)
    _worker_dtype = token_dtype(_worker_encoding.n_vocab)


def tokenize_batch(batch):
    file_index, first_row, texts = batch
    eot = _worker_encoding.eot_token
    tokens, doc_tokens, doc_bytes = [], [], []
    for text in texts:
        ids = _worker_encoding.encode_ordinary(text)
        tokens.append(eot)
        tokens.extend(ids)
        doc_tokens.append(len(ids) + 1)
        doc_bytes.append(len(text.encode('utf-8')))
    return (file_index, first_row, np.array(tokens, dtype=_worker_dtype),
            np.array(doc_tokens, dtype=np.int64), np.array(doc_bytes, dtype=np.int64))


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


def complete_meta(out_dir, request):
    """A rerun of a finished folder with the same request is a fast no-op: returns its meta (None when the
    folder is unfinished). A finished folder made with another request is refused, not mixed with new shards."""
    if not os.path.exists(os.path.join(out_dir, 'meta.json')):
        return None
    meta = load_meta(out_dir)
    if meta.get('request') != request:
        raise DataError(f"{out_dir} already holds a dataset made with {meta.get('request')}: "
                        f"delete it or choose another --out")
    print(f"already complete: {out_dir} ({meta['train_tokens']:,} train + {meta['val_tokens']:,} val tokens, "
          f"{meta['tokenizer']}); delete the folder to rebuild it")
    return meta


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
    """Tokenize a list of documents with the pool; returns (tokens, document count, text bytes)."""
    batches = [(0, i, texts[i:i + batch_docs]) for i in range(0, len(texts), batch_docs)]
    with multiprocessing.Pool(workers, initializer=init_worker, initargs=(out_dir,)) as pool:
        results = pool.map(tokenize_batch, batches)
    tokens = np.concatenate([r[2] for r in results]) if results else np.zeros(0, np.uint16)
    return tokens, len(texts), int(sum(r[4].sum() for r in results))


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
        tokens, _, text_bytes = tokenize_all(out_dir, texts[split], workers or default_workers())
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

    args = parser.parse_args(argv)
    try:
        if args.source == 'pystdlib':
            prepare_pystdlib(args.out, args.tokenizer, args.workers, args.shard_tokens, args.max_files)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == '__main__':
    main()
