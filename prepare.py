"""
prepare.py: text -> tokenizer -> token shards that train.py reads.

    python prepare.py pystdlib                       # the running Python's standard library, our own BPE (seconds)
    python prepare.py fineweb_edu --tokens 26e9      # FineWeb-Edu sample-100BT, GPT-2 tokens (resumable)
    python prepare.py fineweb_edu --tokenizer neox   # ... in GPT-NeoX-20B's tokens (its tokenizer.json from the Hub)
    python prepare.py hub HuggingFaceTB/finemath --config finemath-3plus --column text   # any parquet dataset
    python prepare.py files a.txt b.jsonl c.parquet  # your own text
    python prepare.py bench                          # tokens/s of the pipeline against raw tiktoken

A data folder holds `<source>_val_000000.bin`, `<source>_train_000001.bin`, ... (llm.c's shard format),
`tokenizer.json` (the tokenizer, so train.py and sample.py use the very same one) and `meta.json` (written last:
a folder without it is unfinished, and rerunning the same command carries on where it stopped). The tokenizer
reserves the special tokens of the fim and ul2 objectives (SPECIAL_TOKENS; meta.json lists them by name) unless
--no-special-tokens. One command writes a folder at a time (a `.lock` file in it); a full disk or a read-only
folder is one line, not a traceback.

Reading a folder (the shard format, meta.json, the tokenizer) is data.py's job and downloading downloads.py's:
train.py and the other commands import those, never this file. rustbpe, tqdm, tiktoken, tokenizers, pyarrow and
requests are imported inside the functions that use them, so a machine without one still runs the rest.
"""

import argparse
import base64
import contextlib
import glob
import itertools
import json
import multiprocessing
import os
import signal
import sys
import sysconfig
import threading
import time
import zlib

# standard library only: first, so that Ctrl-C or SIGTERM during the slower imports is one line
from ledgergpt import config

if __name__ == '__main__':
    config.quiet_stops()

import numpy as np

from ledgergpt import sums
from ledgergpt.config import EOT, SPECIAL_TOKENS, DataError, cli
from ledgergpt.data import (
    HEADER_BYTES,
    list_shards,
    load_meta,
    load_tokenizer,
    open_shard,
    reserved_ids,
    token_dtype,
    write_shard,
)
from ledgergpt.downloads import (
    HUB_ENDPOINT,
    Hub,
    ListingMismatch,
    Network,
    Progress,
    download,
    say,
    size_of,
)
from ledgergpt.files import (
    disk_errors,
    folder_lock,
    free_bytes,
    human_bytes,
    remove_quietly,
    save_json,
)

# -----------------------------------------------------------------------------------------------------
# Tokenizers. gpt2 and bpe:V end up as tokenizer.json: the byte sequence of every rank (base64, list index = rank),
# the pre-split regex and the end-of-text token, which is all tiktoken.Encoding needs. We write this file ourselves
# instead of tiktoken's .tiktoken loader because that loader caches by path in /tmp: rebuilding a folder with
# another vocab would silently load the old ranks. neox keeps the Hub's tokenizer.json inside ours (below). Loading
# any of them is data.py's job (load_tokenizer).


def reserve(first_id, special=True):
    """The special tokens' ids from first_id on, as {name: id} (empty when the folder is made without them)."""
    return {name: first_id + i for i, name in enumerate(SPECIAL_TOKENS)} if special else {}


def save_tokenizer(data_dir, name, pattern, mergeable_ranks, eot_id, reserved=None):
    ordered = sorted(mergeable_ranks.items(), key=lambda item: item[1])
    assert [rank for _, rank in ordered] == list(range(len(ordered))), "ranks must be 0..n-1"
    special = {**(reserved or {}), EOT: eot_id}
    save_json(
        os.path.join(data_dir, 'tokenizer.json'),
        {
            'name': name,
            'pattern': pattern,
            'special_tokens': special,
            'vocab_size': max(special.values()) + 1,
            'ranks': [base64.b64encode(token).decode('ascii') for token, _ in ordered],
        },
    )


# GPT-NeoX-20B: 50,254 BPE tokens (2 special) + 23 runs of spaces
NAMED_TOKENIZERS = {
    'gpt2': 50257,  # 50,000 merges + 256 bytes + <|endoftext|>
    'neox': 50277,
}


def parse_tokenizer(name):
    """'gpt2', 'neox', 'bpe:V' or a model's (a Hugging Face model folder or Hub repo id: pretrained.py) -> its vocab
    size, or a DataError naming what is allowed."""
    if name in NAMED_TOKENIZERS:
        return NAMED_TOKENIZERS[name]
    if name.startswith('bpe:') and name[4:].isdigit() and int(name[4:]) > 256:
        return int(name[4:])
    if is_model(name):
        from tokenizers import Tokenizer

        return Tokenizer.from_str(model_tokenizer(name)[1].decode()).get_vocab_size(
            with_added_tokens=True
        )
    raise DataError(
        f"unknown tokenizer '{name}': use gpt2, neox, bpe:V with V > 256 (e.g. bpe:8192), or a model's: a "
        f"Hugging Face model folder or Hub repo id"
    )


def make_tokenizer(out_dir, tokenizer, bpe_texts, network=None, special=True):
    """The folder's tokenizer.json for `tokenizer`, with the SPECIAL_TOKENS unless `special` is False. One already
    there is kept if it is that tokenizer with those tokens (a rerun carries on with the tokenizer its shards were
    made with) and made again if not. GPT-2's comes from tiktoken, NeoX's from the Hub (through `network`); bpe:V is
    trained on bpe_texts(), called only then (it may download)."""
    path = os.path.join(out_dir, 'tokenizer.json')
    # a model's tokenizer: its ids exactly, no reserved ones
    special = special and not is_model(tokenizer)
    if os.path.exists(path):
        try:
            with open(path, 'rb') as f:
                spec = json.loads(f.read())
            name, has_special = (
                spec.get('name'),
                any(n in spec.get('special_tokens', ()) for n in SPECIAL_TOKENS),
            )
        except (ValueError, AttributeError):
            name, has_special = 'a damaged file', special
        if name == tokenizer and has_special == special:
            return
        say(
            f"{path} is {name}{'' if has_special == special else ' with other special tokens'}, not {tokenizer}: "
            f"making it again"
        )
    if tokenizer == 'gpt2':
        make_gpt2_tokenizer(out_dir, special)
    elif tokenizer == 'neox':
        make_neox_tokenizer(out_dir, network, special)
    elif is_model(tokenizer):
        make_model_tokenizer(out_dir, tokenizer, network)
    else:
        train_bpe_tokenizer(out_dir, parse_tokenizer(tokenizer), bpe_texts(), special)


def make_gpt2_tokenizer(data_dir, special=True):
    """GPT-2's BPE from tiktoken, the special tokens in the model's padding (50,257 ...). tiktoken downloads its two
    files once (then caches them): offline, that fails."""
    from tiktoken_ext.openai_public import gpt2

    try:
        spec = gpt2()
    except Exception as e:  # requests' ConnectionError, or anything else the download raises
        raise DataError(
            f"the gpt2 tokenizer's files could not be downloaded ({type(e).__name__}): run once with "
            f"internet so tiktoken caches them, or use our own BPE with --tokenizer bpe:8192"
        ) from None
    eot_id = spec['special_tokens'][EOT]
    save_tokenizer(
        data_dir,
        'gpt2',
        spec['pat_str'],
        spec['mergeable_ranks'],
        eot_id,
        reserve(eot_id + 1, special),
    )


def train_bpe_tokenizer(data_dir, vocab_size, texts, special=True):
    """Our own byte-level BPE with rustbpe (GPT-4's split pattern), used through tiktoken. The vocabulary is
    exactly `vocab_size`: 256 bytes + the merges, then the SPECIAL_TOKENS (22 ids, unless `special` is False), then
    the end-of-text token as the last id. bpe:8192: 7,913 merges, the special tokens at 8,169-8,190, eot 8,191."""
    import rustbpe

    reserved = len(SPECIAL_TOKENS) if special else 0
    if vocab_size - 1 - reserved < 256:
        raise DataError(
            f"bpe:{vocab_size} has no room for its 256 bytes, the end-of-text token and the {reserved} "
            f"special tokens: use bpe:{257 + reserved} or more (or --no-special-tokens)"
        )
    sample_chars = 0

    def counted():
        nonlocal sample_chars
        for text in texts:
            sample_chars += len(text)
            yield text

    tokenizer = rustbpe.Tokenizer()
    tokenizer.train_from_iterator(counted(), vocab_size - 1 - reserved)
    ranks = {bytes(token): rank for token, rank in tokenizer.get_mergeable_ranks()}
    if len(ranks) != vocab_size - 1 - reserved:
        raise DataError(
            f"the BPE sample ({sample_chars:,} characters) only supports {len(ranks) + 1 + reserved} "
            f"tokens, not bpe:{vocab_size}: use a smaller vocab, or more text (--tokens, "
            f"--bpe-sample-chars)"
        )
    save_tokenizer(
        data_dir,
        f'bpe:{vocab_size}',
        tokenizer.get_pattern(),
        ranks,
        vocab_size - 1,
        reserve(len(ranks), special),
    )


# GPT-NeoX-20B's tokenizer (EleutherAI/gpt-neox-20b's tokenizer.json, in the Hugging Face `tokenizers` format) is
# a byte-level BPE like GPT-2's with two settings tiktoken cannot express exactly. Its normalizer is NFC: text is
# composed before it is split (a decomposed 'é' becomes one character, so decode(encode(x)) is NFC(x)). And 23 runs
# of 2..24 spaces are added tokens, split off the text before the BPE, longest first: '    return' is [4 spaces,
# 'return'], where GPT-2 has [3 spaces, ' return']; tiktoken matches such tokens in no fixed order. So NeoX is
# used through the `tokenizers` library that defines the format (data.HFEncoding): exact by construction. Its 50,277
# ids fit uint16; a model pads them to 50,304 (a multiple of 128).

NEOX_REPO = 'EleutherAI/gpt-neox-20b'


def make_neox_tokenizer(out_dir, network=None, special=True):
    """Fetch NeoX's tokenizer.json once from the Hub, like the data (HF_ENDPOINT and HF_TOKEN, resumable, verified
    against the listing), and keep it inside the folder's tokenizer.json with the commit it came from, and the names
    of the SPECIAL_TOKENS that HFEncoding adds after its ids (50,277 ...)."""
    hub = Hub(network)
    sha, files = hub.files(NEOX_REPO, 'main', '', 'tokenizer.json', kind='models')
    listed = next((f for f in files if f['path'] == 'tokenizer.json'), None)
    if listed is None:
        raise DataError(
            f"{NEOX_REPO} has no tokenizer.json at {sha}: check --endpoint or HF_ENDPOINT"
        )
    os.makedirs(os.path.join(out_dir, 'downloads'), exist_ok=True)
    path = download(
        hub,
        hub.url('models', NEOX_REPO, sha, 'tokenizer.json'),
        os.path.join(out_dir, 'downloads', 'gpt-neox-20b-tokenizer.json'),
        listed,
        starts_with=b'{',
    )
    with open(path, 'rb') as f:
        spec = json.loads(f.read())
    save_json(
        os.path.join(out_dir, 'tokenizer.json'),
        {
            'name': 'neox',
            'source': f'{NEOX_REPO}@{sha}',
            'tokenizers': spec,
            'special_tokens': list(SPECIAL_TOKENS) if special else [],
        },
    )
    os.remove(path)


# A published model's own tokenizer (--tokenizer MODEL_FOLDER or a Hub repo id, as init_from takes): its
# tokenizer.json through the `tokenizers` library, like NeoX's, its ids exactly (no reserved tokens: the model has no
# rows for them), and its document start: the token it puts before a text (Llama's BOS '<s>', Llama 3's
# '<|begin_of_text|>') when it adds one, else its end-of-text (GPT-2's '<|endoftext|>', which separated GPT-2's
# documents). The sha256 of the model's file is kept, so train.py can tell that a data folder was made with it.


def is_model(name):
    from ledgergpt import pretrained

    return name not in NAMED_TOKENIZERS and (os.path.isdir(name) or pretrained.is_repo_id(name))


def model_tokenizer(name, network=None):
    """(the model folder, its tokenizer.json's bytes)."""
    from ledgergpt import pretrained

    folder = pretrained.folder(name, network, weights=False)
    path = os.path.join(folder, 'tokenizer.json')
    if not os.path.isfile(path):
        raise DataError(
            f"{folder} has no tokenizer.json (a fast tokenizer): --tokenizer {name} needs one"
        )
    with open(path, 'rb') as f:
        return folder, f.read()


def document_start(tokenizer, folder):
    """The token a document starts with: the one the tokenizer adds before a text, else its eos_token."""
    plain = tokenizer.encode('a', add_special_tokens=False).ids
    added = tokenizer.encode('a', add_special_tokens=True).ids
    if len(added) > len(plain) and added[len(added) - len(plain) :] == plain:
        return tokenizer.id_to_token(added[0])
    from ledgergpt import pretrained

    path = os.path.join(folder, 'tokenizer_config.json')
    eos = pretrained.read_json(path).get('eos_token') if os.path.isfile(path) else None
    eos = eos.get('content') if isinstance(eos, dict) else eos or EOT
    if tokenizer.token_to_id(eos) is None:
        raise DataError(
            f"{folder}: its tokenizer adds no BOS and has no eos_token {eos!r} to start documents with"
        )
    return eos


def make_model_tokenizer(out_dir, name, network=None):
    import hashlib

    from tokenizers import Tokenizer

    folder, text = model_tokenizer(name, network)
    start = document_start(Tokenizer.from_str(text.decode()), folder)
    save_json(
        os.path.join(out_dir, 'tokenizer.json'),
        {
            'name': name,
            'source': folder,
            'sha256': hashlib.sha256(text).hexdigest(),
            'tokenizers': json.loads(text),
            'special_tokens': [],
            'document_start': start,
        },
    )
    say(f"tokenizer: {name}'s own ({folder}), each document starting with {start!r}")


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


def worker_pool(workers, data_dir):
    """A multiprocessing.Pool of tokenizer workers, forked with SIGTERM at its default: Pool.terminate stops them with
    SIGTERM, and cli's handler (which raises, to unwind the command) would never run in a worker blocked in C."""
    in_charge = threading.current_thread() is threading.main_thread()
    handler = signal.signal(signal.SIGTERM, signal.SIG_DFL) if in_charge else None
    try:
        return multiprocessing.Pool(workers, initializer=init_worker, initargs=(data_dir,))
    finally:
        if in_charge:
            signal.signal(signal.SIGTERM, handler)


def init_worker(data_dir):
    global _worker_encoding, _worker_dtype
    # Ctrl-C reaches the whole process group: the main process
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # answers it (and stops the pool), not a traceback per worker
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
    return [str(view[start:end], 'utf-8') for start, end in itertools.pairwise(offsets.tolist())]


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
        # only if normalizing lengthened the text (NFC can, rarely: neox)
        if end + 1 + len(ids) > len(tokens):
            tokens = np.resize(tokens, 2 * (end + 1 + len(ids)))
        tokens[end] = _worker_encoding.eot_token
        tokens[end + 1 : end + 1 + len(ids)] = ids
        end += 1 + len(ids)
        doc_tokens[i] = 1 + len(ids)
    return file_index, first_row, tokens[:end], doc_tokens, np.diff(offsets)


def default_workers():
    return max(
        1, len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1
    )


# -----------------------------------------------------------------------------------------------------
# Writing a data folder. One command at a time (a lock), a full disk or read-only folder as one line; the
# request the folder is made for is recorded first (progress.json) and checked by every rerun; shards are
# written whole; meta.json last, so its presence says the folder is complete.


@contextlib.contextmanager
def writing(out_dir, command):
    """The block is out_dir's one writer (files.folder_lock), and a full disk or read-only folder in it is one line
    naming the folder and its free space (files.disk_errors)."""
    with disk_errors(out_dir), folder_lock(out_dir, command):
        yield


def shard_path(out_dir, prefix, split, index):
    return os.path.join(out_dir, f'{prefix}_{split}_{index:06d}.bin')


def remove_shards(out_dir, prefix, keep=()):
    """Delete the prefix's shards (and temporary leftovers) not in `keep`: old ones must not be read as part of the
    new set."""
    for path in glob.glob(os.path.join(glob.escape(out_dir), f'{prefix}_*.bin*')):
        if path not in keep:
            os.remove(path)


def finish_meta(out_dir, meta):
    """meta.json is written last: its presence says the folder is complete."""
    meta['bytes_per_token'] = round(
        meta['text_bytes'] / max(1, meta['train_tokens'] + meta['val_tokens']), 3
    )
    save_json(os.path.join(out_dir, 'meta.json'), meta)
    shard_bytes = sum(
        os.path.getsize(p) for split in ('val', 'train') for p in list_shards(out_dir, split)
    )
    say(
        f"done: {out_dir}: {meta['documents']:,} documents, {meta['train_tokens']:,} train + "
        f"{meta['val_tokens']:,} val tokens in {meta['train_shards']} + {meta['val_shards']} shards "
        f"({shard_bytes / 1e6:,.1f} MB, {meta['dtype']}), {meta['bytes_per_token']} text bytes per token, "
        f"tokenizer {meta['tokenizer']} (vocab {meta['vocab_size']:,})"
    )
    return meta


# Request keys that folders made by an earlier prepare.py lack, and what those folders were made with
REQUEST_BEFORE = {'special_tokens': False}


def request_change(old, new):
    """The settings of `new` that differ from `old`, as a phrase: "tokenizer='gpt2' (this run: 'bpe:400')"."""
    old = dict(REQUEST_BEFORE, **old)
    return ', '.join(
        f"{key}={old.get(key)!r} (this run: {value!r})"
        for key, value in new.items()
        if old.get(key) != value
    )


def tokenizer_meta(encoding):
    """meta.json's entries that describe the folder's tokenizer: vocab_size counts every id, the special tokens
    (SPECIAL_TOKENS, by name, for train.py's objectives and sample.py) included."""
    return {
        'vocab_size': encoding.n_vocab,
        'eot_id': encoding.eot_token,
        'dtype': token_dtype(encoding.n_vocab).name,
        'special_tokens': reserved_ids(encoding),
    }


def complete_meta(out_dir, request, carry_on_keys=()):
    """A rerun of a finished folder with the same request is a fast no-op: returns its meta (None when there is
    work to do). If only `carry_on_keys` differ (a larger --tokens), the folder is marked unfinished and the
    caller carries on; any other difference is refused rather than mixed with the old shards. A damaged meta.json
    is removed: finishing the folder again writes it anew."""
    path = os.path.join(out_dir, 'meta.json')
    if not os.path.exists(path):
        return None
    try:
        meta = load_meta(out_dir)
    except DataError:
        say(f"{path} is damaged: finishing the folder again, which rewrites it")
        os.remove(path)
        return None
    if not request_change(meta['request'], request):
        say(
            f"already complete: {out_dir} ({meta['train_tokens']:,} train + {meta['val_tokens']:,} val tokens, "
            f"{meta['tokenizer']}); delete the folder to rebuild it"
        )
        return meta
    change = request_change(
        meta['request'], {k: v for k, v in request.items() if k not in carry_on_keys}
    )
    if change:
        raise DataError(
            f"{out_dir} already holds a dataset made with other settings: {change}: delete it or choose another --out"
        )
    os.remove(path)
    return None


def start_progress(out_dir, request):
    """The folder's progress.json, written before anything else in it: the request the folder is being made for,
    and where the shards stand (tokenize_stream). Returns the state. A folder left unfinished by a run with other
    settings starts over if that run wrote no shard yet (its tokenizer and file listing are made again; downloads
    stay, each verified before use), and is refused otherwise: its shards belong to those settings."""
    path = os.path.join(out_dir, 'progress.json')
    if os.path.exists(path):
        try:
            with open(path, 'rb') as f:
                state = json.loads(f.read())
            change = request_change(state['request'], request)
        except (ValueError, KeyError, TypeError, AttributeError):
            raise DataError(
                f"{path} is damaged: delete it to start the folder over, and rerun"
            ) from None
        if not change:
            return state
        if state.get('shards'):
            raise DataError(
                f"{out_dir} holds an unfinished dataset made with other settings: {change}: rerun "
                f"with its settings to finish it, or delete the folder or choose another --out"
            )
        say(
            f"{out_dir}: starting over (a run with other settings, {change}, stopped before its first shard)"
        )
        for name in ('tokenizer.json', 'files.json'):
            remove_quietly(os.path.join(out_dir, name))
    state = {
        'request': request,
        'shards': 0,
        'file': 0,
        'row': 0,
        'skip': 0,
        'documents': 0,
        'text_bytes': 0,
        'max_token_id': -1,
    }
    save_json(path, state)
    return state


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
    paths = [
        p
        for p in paths
        if not {'site-packages', 'dist-packages'} & set(os.path.relpath(p, root).split(os.sep))
    ]
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
        raise DataError(
            f"no .py files found under {root}: this Python has no standard library sources; "
            f"use `prepare.py files PATH...` instead"
        )
    return files


def tokenize_all(out_dir, texts, workers, batch_docs=64):
    """Tokenize a list of documents with the pool; returns (tokens, text bytes)."""
    batches = [
        (0, i, *pack_texts(texts[i : i + batch_docs])) for i in range(0, len(texts), batch_docs)
    ]
    with worker_pool(workers, out_dir) as pool:
        results = pool.map(tokenize_batch, batches)
    tokens = np.concatenate([r[2] for r in results]) if results else np.zeros(0, np.uint16)
    return tokens, int(sum(r[4].sum() for r in results))


def prepare_pystdlib(
    out_dir='data/pystdlib',
    tokenizer='bpe:8192',
    workers=0,
    shard_tokens=100_000_000,
    max_files=0,
    special=True,
):
    """Build (or find complete) the pystdlib data folder; returns its meta dict."""
    request = {
        'source': 'pystdlib',
        'tokenizer': tokenizer,
        'shard_tokens': shard_tokens,
        'max_files': max_files,
        'special_tokens': special,
    }
    parse_tokenizer(tokenizer)  # a bad name is one line before anything is written
    with writing(out_dir, 'prepare.py pystdlib'):
        meta = complete_meta(out_dir, request)
        if meta is not None:
            return meta
        start_progress(out_dir, request)
        started = time.time()
        files = pystdlib_files(max_files)
        split_of = {
            path: 'val' if zlib.crc32(path.encode()) % 100 < PYSTDLIB_VAL_PERCENT else 'train'
            for path, _ in files
        }
        texts = {
            split: [text for path, text in files if split_of[path] == split]
            for split in ('val', 'train')
        }
        if not texts['val'] or not texts['train']:
            raise DataError(
                f"{len(files)} stdlib files leave one split empty: use more files (--max-files)"
            )
        say(
            f"pystdlib: {len(texts['train'])} train + {len(texts['val'])} val files from "
            f"{sysconfig.get_paths()['stdlib']} (Python {sys.version.split()[0]})"
        )
        # the BPE learns from train files: val stays unseen
        make_tokenizer(out_dir, tokenizer, lambda: texts['train'], special=special)
        meta = {
            'source': 'pystdlib',
            'revision': f"python {sys.version.split()[0]}",
            'tokenizer': tokenizer,
            **tokenizer_meta(load_tokenizer(out_dir)),
            'shard_tokens': shard_tokens,
            'documents': len(files),
            'text_bytes': 0,
            'max_token_id': -1,
            'request': request,
        }
        written, index = [], 0
        for split in ('val', 'train'):
            tokens, text_bytes = tokenize_all(out_dir, texts[split], workers or default_workers())
            meta['text_bytes'] += text_bytes
            meta[f'{split}_tokens'] = len(tokens)
            meta[f'{split}_shards'] = 0
            for start in range(0, len(tokens), shard_tokens):
                written.append(shard_path(out_dir, 'pystdlib', split, index))
                largest = write_shard(written[-1], tokens[start : start + shard_tokens])
                meta['max_token_id'] = max(meta['max_token_id'], largest)
                meta[f'{split}_shards'] += 1
                index += 1
        remove_shards(out_dir, 'pystdlib', keep=written)
        say(f"pystdlib: tokenized in {time.time() - started:.1f} s")
        return finish_meta(out_dir, meta)


# -----------------------------------------------------------------------------------------------------
# Streams: sources too big for memory (fineweb_edu, files) are read one batch of documents at a time, in a
# fixed order (file by file, row by row), and cut into shards at fixed stream offsets: the val shard holds
# stream tokens [0, V), train shard k >= 1 holds [V + (k-1)S, V + kS). The cuts depend only on the documents
# and the tokenizer, so after each full shard we record where the next one starts (file, row, tokens of that
# document already written) in progress.json; a rerun skips the finished shards' documents without reading
# them (whole files, then whole parquet row groups) and carries on, writing exactly the same shards.


def parquet_batches(path, start_row=0, batch_docs=1024, column='text'):
    """Yield (first row, data, offsets) batches of a parquet file's text `column` from `start_row` on, in the
    batch layout above: the UTF-8 bytes (a memoryview of Arrow's buffer, not copied) and int64 offsets. No
    Python object per document, and only the row groups from `start_row` on are read. Record batches of
    `batch_docs` rows (pyarrow's iter_batches, one thread) hold one batch of decoded text at a time, not a
    row group, and cost less CPU: on `prepare.py bench`'s 126 MB row group 0.16 s against 0.6-0.9 s for
    read_row_group with pyarrow's thread pool, CPU taken from the tokenizing workers. A file pyarrow cannot read
    (truncated, damaged, not parquet) is one DataError naming it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
        schema = parquet.schema_arrow
        if column not in schema.names:
            raise DataError(
                f"{path}: no '{column}' column (it has {', '.join(schema.names)}): name it with --column"
            )
        kind = schema.field(column).type
        if not any(
            getattr(pa.types, f'is_{t}', lambda _: False)(kind)
            for t in ('string', 'large_string', 'string_view')
        ):
            raise DataError(
                f"{path}: the '{column}' column holds {schema.field(column).type}, not text: --column"
            )
        first_group, row = 0, 0  # the first row group to read, and its first row
        group_rows = [
            parquet.metadata.row_group(group).num_rows for group in range(parquet.num_row_groups)
        ]
        while first_group < len(group_rows) and row + group_rows[first_group] <= start_row:
            row += group_rows[first_group]
            first_group += 1
        groups = range(first_group, len(group_rows))
        for batch in parquet.iter_batches(
            batch_docs, row_groups=groups, columns=[column], use_threads=False
        ):
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
            offsets = np.frombuffer(
                offsets, dtype=np.int32 if column.type == pa.string() else np.int64
            )
            offsets = offsets[column.offset : column.offset + len(column) + 1].astype(np.int64)
            if len(column):
                yield row, memoryview(data if data is not None else b''), offsets
            row += len(column)
    except pa.ArrowException as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(
            f"{path}: not a readable parquet file ({reason}): if it is a download, delete it and "
            f"rerun to fetch it again"
        ) from None


def not_utf8(path, error, where=''):
    """The DataError for text that does not decode as UTF-8 (a binary file, or another encoding such as Latin-1)."""
    return DataError(
        f"{path}{where}: not UTF-8 text (byte {error.object[error.start]:#04x} at byte "
        f"{error.start:,}{' of the line' if where else ''}): convert it to UTF-8 "
        f"(e.g. iconv -f latin1 -t utf-8) or leave it out"
    )


def read_documents(path, start_row=0, column='text'):
    """Yield (row, text) of one local file from `start_row` on: .parquet (its text `column`), .jsonl (the
    "text" field of each non-blank line) or .txt (one document). Text that is not UTF-8, or has NUL bytes (a
    binary file), is one DataError naming the file."""
    if path.endswith('.parquet'):
        for first_row, data, offsets in parquet_batches(path, start_row, column=column):
            yield from enumerate(unpack_texts(data, offsets), first_row)
    elif path.endswith('.jsonl'):
        with open(path, 'rb') as f:
            row = 0
            for line_number, line in enumerate(f, 1):
                try:
                    line = line.decode('utf-8')
                except UnicodeDecodeError as e:
                    raise not_utf8(path, e, f':{line_number}') from None
                if not line.strip():
                    continue
                if row >= start_row:
                    try:
                        text = json.loads(line)['text']
                    except (ValueError, KeyError, TypeError):
                        text = None
                    if not isinstance(text, str):
                        raise DataError(
                            f"{path}:{line_number}: not a JSON object with a \"text\" string"
                        )
                    yield row, text
                row += 1
    elif start_row == 0:
        with open(path, 'rb') as f:
            raw = f.read()
        if 0 in raw:  # text has no NUL bytes; executables, images and archives are full of them
            raise DataError(
                f"{path}: a binary file (NUL bytes at byte {raw.index(0):,}), not text: leave it out"
            )
        try:
            text = raw.decode('utf-8')
        except UnicodeDecodeError as e:
            raise not_utf8(path, e) from None
        yield 0, text


def document_batches(paths, fetch, position, batch_docs, wait_for_file=None, column='text'):
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
            for row, data, offsets in parquet_batches(path, first_row, batch_docs, column):
                yield file_index, row, bytes(data[offsets[0] : offsets[-1]]), offsets - offsets[0]
            continue
        texts = []
        for row, text in read_documents(path, first_row):
            texts.append(text)
            if len(texts) == batch_docs:
                yield file_index, row + 1 - len(texts), *pack_texts(texts)
                texts = []
        if texts:
            yield file_index, row + 1 - len(texts), *pack_texts(texts)


def bpe_sample(documents, val_tokens, sample_chars, tokens=0):
    """Texts for training the BPE from a stream of documents. The first 8 characters per val token are skipped:
    the val shard's documents are there (BPE packs ~4-5 characters into a token, so 8 is a safe margin), and val
    text stays unseen by the tokenizer too. Then at most `sample_chars` are taken, and with --tokens at most one
    per token: a BPE packs more than one character into a token on average, so the sample never reaches text
    (or downloads a file) that the shards will not use. No text left after the skip is one DataError line."""
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
    first = next(texts, None)
    if first is None:
        if not seen:
            raise DataError(
                "there is no text in the input (every document is empty): give files with text"
            )
        raise DataError(
            f"no text left for the BPE to learn from: the text has {seen:,} characters and the first "
            f"{skip:,} are held out for the {val_tokens:,}-token val shard (8 per token): lower "
            f"--val-tokens (about {seen // 16:,} would leave half the text), or give more text"
        )
    return itertools.chain([first], texts)


def tokenize_stream(
    out_dir,
    prefix,
    paths,
    fetch,
    state,
    workers,
    val_tokens,
    shard_tokens,
    max_tokens,
    done_with_files=None,
    batch_docs=256,
    column='text',
):
    """Tokenize the documents of `paths` in order into shards, carrying on from `state` (start_progress); returns
    the meta fields for the counts. `max_tokens` = 0 reads everything. `done_with_files(n)` is called whenever
    files 0..n-1 are no longer needed, not even by a rerun (every shard that holds their tokens is written).
    `column`: the text column of parquet files."""
    import threading

    progress_path = os.path.join(out_dir, 'progress.json')
    target = max_tokens or float('inf')

    def shard_end(index):  # stream offset where shard `index` ends
        return val_tokens + index * shard_tokens

    shard = state['shards']
    # stream offset of the first buffered token
    stream_offset = shard_end(shard - 1) if shard else 0
    if stream_offset >= target:
        stream_offset, shard = 0, 0  # a smaller --tokens than a finished run's: start over
        state.update(shards=0, file=0, row=0, skip=0, documents=0, text_bytes=0, max_token_id=-1)
    written = [shard_path(out_dir, prefix, 'val' if i == 0 else 'train', i) for i in range(shard)]
    # progress.json of an older prepare.py: read the finished shards once
    if 'max_token_id' not in state:
        state['max_token_id'] = max([int(open_shard(p).max()) for p in written], default=-1)
    if shard:
        say(f"{prefix}: carrying on after {shard} complete shards ({stream_offset:,} tokens)")
    buffer, buffered = [], 0
    documents, text_bytes, largest = state['documents'], state['text_bytes'], state['max_token_id']

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
        position = (state['file'], state['row'])
        for batch in document_batches(paths, fetch, position, batch_docs, wait_for_file, column):
            slots.acquire()
            if stop.is_set():
                return
            yield batch

    started, started_offset, skip = time.time(), stream_offset, state['skip']
    done = False
    with (
        worker_pool(workers, out_dir) as pool,
        Progress(prefix, max_tokens or None, initial=stream_offset) as progress,
    ):
        try:
            for file_index, first_row, tokens, doc_tokens, doc_bytes in pool.imap(
                tokenize_batch, feed()
            ):
                counted = np.ones(len(doc_tokens), dtype=np.int64)
                if skip:  # the first document was partly written before the stop: drop those tokens
                    tokens, doc_tokens[0], counted[0], doc_bytes[0], skip = (
                        tokens[skip:],
                        doc_tokens[0] - skip,
                        0,
                        0,
                        0,
                    )
                doc_starts = (
                    stream_offset + buffered + np.concatenate([[0], np.cumsum(doc_tokens)[:-1]])
                )
                buffer.append(tokens)
                buffered += len(tokens)
                progress.update(min(len(tokens), target - progress.n))
                while stream_offset + buffered >= min(shard_end(shard), target):
                    end = min(shard_end(shard), target)
                    data = np.concatenate(buffer)
                    written.append(
                        shard_path(out_dir, prefix, 'val' if shard == 0 else 'train', shard)
                    )
                    largest = max(largest, write_shard(written[-1], data[: end - stream_offset]))
                    buffer, buffered = [data[end - stream_offset :]], stream_offset + buffered - end
                    stream_offset, shard = end, shard + 1
                    # the document holding stream token `end`, and how many of its tokens are written
                    inside = np.searchsorted(doc_starts, end, side='right') - 1
                    # documents that began before `end`
                    before = np.searchsorted(doc_starts, end, side='left')
                    if end == shard_end(shard - 1):
                        state.update(
                            shards=shard,
                            file=file_index,
                            row=first_row + int(inside),
                            skip=int(end - doc_starts[inside]),
                            documents=documents + int(counted[:before].sum()),
                            text_bytes=text_bytes + int((doc_bytes * counted)[:before].sum()),
                            max_token_id=largest,
                        )
                        save_json(progress_path, state)
                        if done_with_files:
                            done_with_files(state['file'])
                    if end == target:
                        documents += int(counted[:before].sum())
                        text_bytes += int((doc_bytes * counted)[:before].sum())
                        done = True
                        break
                if done:
                    break
                documents += int(counted.sum())
                text_bytes += int((doc_bytes * counted).sum())
                slots.release()  # only now: a batch counts as out until its tokens are in the buffer
        finally:
            stop.set()
            for _ in range(in_flight):
                slots.release()
    if not done and buffered:  # the documents ran out: the rest is the last (shorter) shard
        if shard == 0:
            raise DataError(
                f"only {buffered:,} tokens in all, fewer than the {val_tokens:,} of the val shard: lower --val-tokens"
            )
        written.append(shard_path(out_dir, prefix, 'train', shard))
        largest = max(largest, write_shard(written[-1], np.concatenate(buffer)))
        stream_offset, shard = stream_offset + buffered, shard + 1
    if shard < 2:
        raise DataError(f"all {stream_offset:,} tokens went to the val shard: lower --val-tokens")
    remove_shards(out_dir, prefix, keep=written)
    if done_with_files:
        done_with_files(len(paths))
    elapsed = time.time() - started
    say(
        f"{prefix}: {stream_offset - started_offset:,} tokens in {elapsed:.1f} s "
        f"({(stream_offset - started_offset) / max(elapsed, 1e-9) / 1e6:.2f}M tokens/s)"
    )
    return {
        'documents': documents,
        'text_bytes': text_bytes,
        'val_tokens': min(val_tokens, stream_offset),
        'train_tokens': stream_offset - val_tokens,
        'val_shards': 1,
        'train_shards': shard - 1,
        'max_token_id': largest,
    }


# -----------------------------------------------------------------------------------------------------
# Source 2: fineweb_edu. The parquet files of a FineWeb-Edu sample (HuggingFaceFW/fineweb-edu, folder
# sample/10BT, sample/100BT or sample/350BT) over plain HTTP from the Hub (downloads.py: resumable, every file
# checked against the listing's sha256): the revision ("main" by default) is resolved to its commit once and
# pinned, with every file's size and sha256, in files.json (the manifest), so a rerun weeks later reads the same
# files.

FINEWEB_EDU = 'HuggingFaceFW/fineweb-edu'
# FineWeb-Edu parquet per GPT-2 token, low and high: the book's ~3-4 (ledger.py's)
PARQUET_BYTES_PER_TOKEN = (3, 4)


def default_val_tokens(shard_tokens, expected_tokens):
    """The val shard when --val-tokens is not given: ~10% of the tokens expected (0: unknown, many), at most one
    shard (llm.c's convention for a large dataset: the first shard is val). 10% leaves the BPE sample, which skips
    8 characters per val token, most of the text."""
    return max(1, min(shard_tokens, expected_tokens // 10)) if expected_tokens else shard_tokens


def disk_plan(
    out_dir, files, paths, tokens, shard_tokens, vocab_size, keep_downloads, prefix='fineweb_edu'
):
    """Print what the run will download and write, and refuse with one line if the free space cannot hold it. With
    --tokens the files read are those whose sizes add up to 3-4 bytes per token (all of them without); the shards
    are counted whole (--tokens, or the listing at 3 bytes per token); the parquet as what is on disk at once: all
    of it with --keep-downloads, else about a shard's worth plus two files, since a file is deleted once every
    shard that holds its tokens is written. The check counts the high end of each range."""
    sizes = [f['size'] for f in files]

    def files_for(bytes_per_token):
        return (
            next(
                (
                    i + 1
                    for i, total in enumerate(itertools.accumulate(sizes))
                    if total >= tokens * bytes_per_token
                ),
                len(files),
            )
            if tokens
            else len(files)
        )

    low, high = (files_for(b) for b in PARQUET_BYTES_PER_TOKEN)
    here = sum(size_of(p) + size_of(p + '.partial') for p in paths)
    planned_tokens = tokens or sum(sizes) // PARQUET_BYTES_PER_TOKEN[0]
    shard_bytes = planned_tokens * sums.token_bytes(vocab_size) + HEADER_BYTES * (
        planned_tokens // shard_tokens + 2
    )
    shards_here = sum(
        size_of(p) for p in glob.glob(os.path.join(glob.escape(out_dir), f'{prefix}_*.bin'))
    )
    at_once = (
        sum(sizes[:high])
        if keep_downloads
        else min(
            sum(sizes[:high]), shard_tokens * PARQUET_BYTES_PER_TOKEN[1] + 2 * max(sizes[:high])
        )
    )
    more = max(0, shard_bytes - shards_here) + max(0, at_once - here)
    free = free_bytes(out_dir)
    to_fetch = [human_bytes(max(0, sum(sizes[:n]) - here)) for n in sorted({low, high})]
    kept = (
        'kept (--keep-downloads)'
        if keep_downloads
        else 'each deleted once tokenized (--keep-downloads keeps them)'
    )
    say(
        f"plan: {' to '.join(map(str, sorted({low, high})))} of {len(files)} parquet files, {' to '.join(to_fetch)} to "
        f"download, {kept}; ~{human_bytes(shard_bytes)} of shards ({planned_tokens:,} tokens x "
        f"{sums.token_bytes(vocab_size)} bytes); at most ~{human_bytes(more)} more on disk, {human_bytes(free)} "
        f"free in {out_dir}"
    )
    if more > free:
        raise DataError(
            f"not enough disk space in {out_dir}: this run needs up to about {human_bytes(more)} more "
            f"(~{human_bytes(shard_bytes)} of shards, ~{human_bytes(at_once)} of parquet at once) and "
            f"{human_bytes(free)} is free: free some space, choose another --out or lower --tokens"
            f"{', or drop --keep-downloads' if keep_downloads else ''}"
        )


def check_val_tokens(val_tokens, tokens, files):
    """An impossible --val-tokens, refused from the listing before anything is downloaded: with --tokens, a val shard
    that leaves the train split nothing; without, one larger than the files could hold even at one token per byte
    of parquet (FineWeb-Edu's is ~0.3: text compresses 2-4x there, and a byte-level BPE token is at least a byte)."""
    parquet = sum(f['size'] for f in files)
    if tokens and val_tokens >= tokens:
        raise DataError(
            f"--val-tokens {val_tokens:,} is all of --tokens {tokens:,}: nothing would be left to train on; lower "
            f"--val-tokens (the default is 10% of --tokens)"
        )
    if not tokens and val_tokens > parquet:
        raise DataError(
            f"--val-tokens {val_tokens:,} is more than the {len(files)} listed files can hold ({human_bytes(parquet)} "
            f"of parquet, ~{parquet // PARQUET_BYTES_PER_TOKEN[1]:,}-{parquet // PARQUET_BYTES_PER_TOKEN[0]:,} "
            f"GPT-2 tokens): lower --val-tokens"
        )


def hub_manifest(hub, out_dir, repo, folder, revision, split='', relist=False):
    """files.json: the commit the revision resolved to, and the size and sha256 of every parquet file of `folder` in the
    dataset `repo` (those named `split`* where a split is given), listed on the first run and pinned for the reruns
    (a manifest from an older prepare.py, without sha256, is listed again at its commit). relist: list the files
    again at the pinned commit and pin that (a listing that was wrong once)."""
    path = os.path.join(out_dir, 'files.json')
    manifest = None
    if os.path.exists(path):
        try:
            with open(path, 'rb') as f:
                manifest = json.loads(f.read())
            if all('sha256' in f for f in manifest['files']) and not relist:
                return manifest
        except (ValueError, KeyError, TypeError):
            raise DataError(
                f"{path} is damaged: the shards made so far came from the files it listed, so delete "
                f"the folder and rerun"
            ) from None
    sha, files = hub.files(repo, manifest['revision'] if manifest else revision, folder, '.parquet')
    chosen = [f for f in files if os.path.basename(f['path']).startswith(split)]
    if not chosen:
        raise DataError(
            f"none of the {len(files)} parquet files in {repo}/{folder} is named {split}*: check --split "
            f"(the first is {os.path.basename(files[0]['path'])})"
        )
    manifest = {'repo': repo, 'revision': sha, 'files': chosen}
    save_json(path, manifest)
    return manifest


def prepare_fineweb_edu(out_dir='data/fineweb_edu', sample='100BT', **options):
    """Build (or carry on, or find complete) a FineWeb-Edu data folder; returns its meta dict. options: those of
    parquet_from_hub (tokens, tokenizer, workers, ..., network: a Network, the endpoint, time-outs, retry budget)."""
    if sample not in ('10BT', '100BT', '350BT'):
        raise DataError(f"unknown sample '{sample}': use 10BT, 100BT or 350BT")
    head = {'source': 'fineweb_edu', 'sample': sample}
    folder = f'sample/{sample}'
    return parquet_from_hub(
        out_dir, head, FINEWEB_EDU, folder, 'fineweb_edu', f'fineweb_edu/{folder}', **options
    )


def parquet_from_hub(
    out_dir,
    head,
    repo,
    folder,
    prefix,
    source,
    column='text',
    split='',
    tokens=0,
    tokenizer='gpt2',
    workers=0,
    shard_tokens=100_000_000,
    val_tokens=0,
    revision='main',
    bpe_sample_chars=1_000_000_000,
    keep_downloads=False,
    network=None,
    special=True,
):
    """The body of fineweb_edu and hub, inside the folder's lock (`prepare.py PREFIX`): the parquet files of `folder`
    in a dataset repo (those named `split`* where split is given) -> the tokenizer -> shards named `prefix`;
    meta.json's source is `source`, its request `head` (what names the source) and the options. Returns the meta."""
    parse_tokenizer(tokenizer)
    val_tokens = val_tokens or default_val_tokens(shard_tokens, tokens)
    request = dict(
        head,
        tokenizer=tokenizer,
        shard_tokens=shard_tokens,
        val_tokens=val_tokens,
        revision=revision,
    )
    request['special_tokens'] = special
    with writing(out_dir, f'prepare.py {prefix}'):
        meta = complete_meta(out_dir, dict(request, tokens=tokens), carry_on_keys=('tokens',))
        if meta is not None:
            return meta
        state = start_progress(out_dir, request)
        hub = Hub(network)
        manifest = hub_manifest(hub, out_dir, repo, folder, request['revision'], split)
        files, sha = manifest['files'], manifest['revision']
        os.makedirs(os.path.join(out_dir, 'downloads'), exist_ok=True)
        paths = [os.path.join(out_dir, 'downloads', os.path.basename(f['path'])) for f in files]
        say(
            f"{prefix}: {repo}/{folder} at {sha} from {hub.endpoint}: {len(files)} parquet files, "
            f"{human_bytes(sum(f['size'] for f in files))}"
        )
        check_val_tokens(val_tokens, tokens, files)
        disk_plan(
            out_dir,
            files,
            paths,
            tokens,
            shard_tokens,
            parse_tokenizer(tokenizer),
            keep_downloads,
            prefix,
        )
        verified, relisted = set(), []

        def fetch(index):  # file `index`, downloaded (or found on disk) and verified, once per run
            if index not in verified:
                if not os.path.exists(paths[index]):
                    say(
                        f"{prefix}: downloading {files[index]['path']} ({human_bytes(files[index]['size'])})"
                    )
                url = hub.url('datasets', repo, sha, files[index]['path'])
                try:
                    download(hub, url, paths[index], files[index])
                except (
                    ListingMismatch
                ) as e:  # every download disagreed with files.json: is files.json wrong?
                    if relisted:
                        raise
                    # once per run: list the files again at the pinned commit
                    relisted.append(index)
                    fresh = hub_manifest(
                        hub, out_dir, repo, folder, request['revision'], split, relist=True
                    )['files']
                    if fresh[index] == files[index]:
                        raise DataError(f"{e} (the Hub lists it so again today)") from None
                    say(
                        f"{prefix}: files.json pinned {files[index]['path']} as sha256 {files[index]['sha256']}, "
                        f"the Hub lists {fresh[index]['sha256']}: files.json listed again at {sha}"
                    )
                    files[:] = fresh
                    download(hub, url, paths[index], files[index])
                verified.add(index)
            return paths[index]

        def done_with_files(n):
            if not keep_downloads:
                for path in paths[:n]:
                    remove_quietly(path)

        make_tokenizer(
            out_dir,
            tokenizer,
            lambda: bpe_sample(
                (
                    text
                    for i in range(len(paths))
                    for _, text in read_documents(fetch(i), column=column)
                ),
                val_tokens,
                bpe_sample_chars,
                tokens,
            ),
            network,
            request['special_tokens'],
        )
        counts = tokenize_stream(
            out_dir,
            prefix,
            paths,
            fetch,
            state,
            workers or default_workers(),
            val_tokens,
            shard_tokens,
            tokens,
            done_with_files,
            column=column,
        )
        return finish_meta(
            out_dir,
            dataset_meta(
                out_dir, source, sha, tokenizer, shard_tokens, dict(request, tokens=tokens), counts
            ),
        )


# -----------------------------------------------------------------------------------------------------
# Source 4: hub, any parquet dataset on the Hub (FineMath, a StarCoder-style code set, Cosmopedia, ...) through the
# same verified downloads, manifest and disk plan as fineweb_edu. --config names the subset: the folder of the repo
# its parquet files are in, as the Hub's datasets lay their configs out (HuggingFaceTB/finemath: finemath-3plus;
# HuggingFaceTB/cosmopedia: data/stories); --column the text column; --split keeps the files whose names start with
# it (train-00000-of-00064.parquet). A gated dataset is one line saying how to pass HF_TOKEN (downloads.Hub).


def prepare_hub(repo, out_dir='data/hub', config='', column='text', split='', **options):
    """Build (or carry on, or find complete) a data folder from a parquet dataset on the Hub; returns its meta.
    options: those of parquet_from_hub."""
    if repo.count('/') != 1 or not all(repo.split('/')):
        raise DataError(
            f"hub: '{repo}' is not a dataset repo: name it OWNER/NAME (e.g. HuggingFaceTB/finemath)"
        )
    head = {'source': 'hub', 'repo': repo, 'config': config, 'column': column, 'split': split}
    source = '/'.join(part for part in (repo, config) if part)
    return parquet_from_hub(out_dir, head, repo, config, 'hub', source, column, split, **options)


# -----------------------------------------------------------------------------------------------------
# Source 3: files, your own text: .txt (a file is one document), .jsonl (a "text" field per line) or .parquet
# (a "text" column), in the order given.

FILE_TYPES = ('.txt', '.jsonl', '.parquet')


def prepare_files(
    paths,
    out_dir='data/files',
    tokenizer='bpe:8192',
    workers=0,
    shard_tokens=100_000_000,
    val_tokens=0,
    tokens=0,
    bpe_sample_chars=1_000_000_000,
    special=True,
):
    """Build (or carry on, or find complete) a data folder from local files; returns its meta dict."""
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
    input_bytes = sum(os.path.getsize(p) for p in paths)
    if not input_bytes:
        raise DataError(f"the input is empty ({', '.join(paths)}: 0 bytes): give files with text")
    parse_tokenizer(tokenizer)
    # ~4 bytes of file per token: text and jsonl ~4-5, parquet ~3-4 compressed
    val_tokens = val_tokens or default_val_tokens(shard_tokens, tokens or input_bytes // 4)
    request = {
        'source': 'files',
        'paths': paths,
        'tokenizer': tokenizer,
        'shard_tokens': shard_tokens,
        'val_tokens': val_tokens,
        'special_tokens': special,
    }
    with writing(out_dir, 'prepare.py files'):
        meta = complete_meta(out_dir, dict(request, tokens=tokens), carry_on_keys=('tokens',))
        if meta is not None:
            return meta
        state = start_progress(out_dir, request)
        make_tokenizer(
            out_dir,
            tokenizer,
            lambda: bpe_sample(
                (text for path in paths for _, text in read_documents(path)),
                val_tokens,
                bpe_sample_chars,
                tokens,
            ),
            special=special,
        )
        counts = tokenize_stream(
            out_dir,
            'files',
            paths,
            paths.__getitem__,
            state,
            workers or default_workers(),
            val_tokens,
            shard_tokens,
            tokens,
        )
        return finish_meta(
            out_dir,
            dataset_meta(
                out_dir,
                'files',
                None,
                tokenizer,
                shard_tokens,
                dict(request, tokens=tokens),
                counts,
            ),
        )


def dataset_meta(out_dir, source, revision, tokenizer, shard_tokens, request, counts):
    return dict(
        {
            'source': source,
            'revision': revision,
            'tokenizer': tokenizer,
            **tokenizer_meta(load_tokenizer(out_dir)),
            'shard_tokens': shard_tokens,
            'request': request,
        },
        **counts,
    )


# -----------------------------------------------------------------------------------------------------
# Benchmark (not a test): tokens/s of the whole pipeline (read parquet -> pool -> shards -> meta.json) against
# raw tiktoken (the same encode_to_numpy calls in the same number of processes, text already in memory,
# nothing written), on the same text with the same tokenizer. Offline-friendly: the text is the stdlib sources
# repeated into a parquet file, the tokenizer our bpe:8192 (or gpt2 where tiktoken has its files).


def count_tokens(texts):
    return sum(len(_worker_encoding.encode_to_numpy(text, disallowed_special=())) for text in texts)


def cpu_seconds():
    """CPU time of this process and its finished children (the pool's workers once they are joined)."""
    import resource

    return sum(
        usage.ru_utime + usage.ru_stime
        for usage in (
            resource.getrusage(resource.RUSAGE_SELF),
            resource.getrusage(resource.RUSAGE_CHILDREN),
        )
    )


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
        batches = [texts[i : i + 256] for i in range(0, len(texts), 256)]
        raw, pipeline = [], []  # (tokens/s, CPU seconds) per round
        for _ in range(rounds):
            # both sides start their pool from scratch
            started, cpu_started = (time.time(), cpu_seconds())
            with worker_pool(workers, tmp) as pool:
                raw_tokens = sum(pool.imap(count_tokens, batches))
                raw_rate = raw_tokens / (time.time() - started)
            raw.append((raw_rate, cpu_seconds() - cpu_started))
            out = os.path.join(tmp, 'pipeline')
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(out)
            # the same tokenizer, not trained again
            shutil.copy(os.path.join(tmp, 'tokenizer.json'), out)
            started, cpu_started = time.time(), cpu_seconds()
            meta = prepare_files([parquet], out, tokenizer, workers, shard_tokens=100_000_000)
            pipeline_tokens = meta['train_tokens'] + meta['val_tokens']
            pipeline.append(
                (pipeline_tokens / (time.time() - started), cpu_seconds() - cpu_started)
            )
    raw_rate, pipeline_rate = max(r for r, _ in raw), max(r for r, _ in pipeline)
    raw_cpu, pipeline_cpu = (
        min(c for _, c in raw) / raw_tokens,
        min(c for _, c in pipeline) / pipeline_tokens,
    )
    print(
        f"bench: {size / 1e6:.0f} MB of text (the stdlib sources repeated), {len(texts):,} documents, "
        f"{tokenizer}, {workers} workers, best of {rounds} alternating rounds; tiktoken {tiktoken.__version__}, "
        f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs"
    )
    for name, rounds_, tokens_, cpu in (
        ('raw tiktoken', raw, raw_tokens, raw_cpu),
        ('pipeline    ', pipeline, pipeline_tokens, pipeline_cpu),
    ):
        print(
            f"bench: {name} {tokens_:,} tokens, {max(r for r, _ in rounds_) / 1e6:.2f}M tokens/s "
            f"(rounds: {', '.join(f'{r / 1e6:.2f}' for r, _ in rounds_)}), {cpu * 1e9:.0f} CPU ns/token"
        )
    print(
        f"bench: pipeline / raw = {pipeline_rate / raw_rate:.1%} in tokens/s, "
        f"{raw_cpu / pipeline_cpu:.1%} in CPU time per token"
    )
    return raw_rate, pipeline_rate


# -----------------------------------------------------------------------------------------------------
# Command line


def number(text):
    """26e9 or 26000000000 -> 26000000000 (argparse type for token counts)."""
    return int(float(text))


@cli
def main(argv):
    parser = argparse.ArgumentParser(
        prog='prepare.py',
        description=__doc__.split('\n\n')[0].strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sources = parser.add_subparsers(dest='source', required=True)

    def common(sub, out, tokenizer, shard_tokens=100_000_000):
        sub.add_argument('--out', default=out, help=f'data folder (default {out})')
        sub.add_argument(
            '--tokenizer',
            default=tokenizer,
            help=f'gpt2, neox (GPT-NeoX-20B, from the Hub), bpe:V, our own, or a model folder or Hub repo id: the '
            f'model\'s own, for init_from (default {tokenizer})',
        )
        sub.add_argument(
            '--workers', type=int, default=0, help='tokenizer processes (default: all cores)'
        )
        sub.add_argument(
            '--shard-tokens',
            type=number,
            default=shard_tokens,
            help=f'tokens per shard (default {shard_tokens:,})',
        )
        sub.add_argument(
            '--no-special-tokens',
            dest='special',
            action='store_false',
            help="reserve no ids for the fim and ul2 objectives' special tokens (a bpe:V learns 22 more merges)",
        )

    # pystdlib: 8,192 tokens is enough for ~30 MB of code (each merge still seen thousands of times), keeps a
    # small CPU model's embedding and output layer cheap (8192 x 256 = 2.1M params each at n_embd 256), is a
    # multiple of 128 (fast matmuls) and fits uint16.
    sub = sources.add_parser(
        'pystdlib', help="the running Python's standard library sources (no download)"
    )
    common(sub, 'data/pystdlib', 'bpe:8192')
    sub.add_argument(
        '--max-files', type=int, default=0, help='an evenly spread subset of the files (0: all)'
    )

    defaults = Network()

    def hub_options(sub):  # fineweb_edu's and hub's: what to take, and how to talk to the Hub
        sub.add_argument(
            '--tokens',
            type=number,
            default=0,
            help='stop after this many tokens, val included (e.g. 26e9; default: the whole sample)',
        )
        sub.add_argument(
            '--val-tokens',
            type=number,
            default=0,
            help='tokens in the val shard (default: 10%% of --tokens, at most one shard)',
        )
        sub.add_argument(
            '--endpoint',
            default='',
            help=f'Hub base URL (default: $HF_ENDPOINT, else {HUB_ENDPOINT})',
        )
        sub.add_argument(
            '--revision',
            default='main',
            help='dataset revision (branch, tag or commit; default main)',
        )
        sub.add_argument(
            '--bpe-sample-chars',
            type=number,
            default=1_000_000_000,
            help='characters the bpe:V tokenizer trains on (default 1e9)',
        )
        sub.add_argument(
            '--keep-downloads',
            action='store_true',
            help='keep the parquet files (by default each is deleted once its tokens are in shards)',
        )
        sub.add_argument(
            '--connect-timeout',
            type=float,
            default=defaults.connect_timeout_s,
            help=f'seconds to open a connection (default {defaults.connect_timeout_s:g})',
        )
        sub.add_argument(
            '--read-timeout',
            type=float,
            default=defaults.read_timeout_s,
            help=f'seconds of silence from a server before retrying (default {defaults.read_timeout_s:g})',
        )
        sub.add_argument(
            '--retry-budget',
            type=float,
            default=defaults.retry_budget_s,
            help=f'seconds one request may keep failing before giving up (default {defaults.retry_budget_s:g})',
        )

    sub = sources.add_parser(
        'fineweb_edu',
        help='a FineWeb-Edu sample from the Hugging Face Hub (resumable)',
        epilog='environment: HF_ENDPOINT (a Hub mirror; --endpoint overrides it), HF_TOKEN '
        '(a read token, sent to that host only)',
    )
    common(sub, 'data/fineweb_edu', 'gpt2')
    sub.add_argument('--sample', default='100BT', help='10BT, 100BT or 350BT (default 100BT)')
    hub_options(sub)

    sub = sources.add_parser(
        'hub',
        help='any parquet dataset on the Hugging Face Hub (resumable), e.g. hub HuggingFaceTB/finemath --config '
        'finemath-3plus',
        epilog='environment: HF_ENDPOINT (a Hub mirror; --endpoint overrides it), HF_TOKEN '
        '(a read token, sent to that host only; a gated dataset needs it)',
    )
    sub.add_argument('repo', metavar='REPO', help='the dataset repo, OWNER/NAME')
    common(sub, 'data/hub', 'gpt2')
    sub.add_argument(
        '--config',
        default='',
        help="the subset: the repo's folder of its parquet files (default: the top)",
    )
    sub.add_argument('--column', default='text', help='the text column (default text)')
    sub.add_argument(
        '--split', default='', help='only the parquet files named SPLIT* (e.g. train; default: all)'
    )
    hub_options(sub)

    sub = sources.add_parser(
        'files', help='your own .txt, .jsonl ("text" field) or .parquet ("text" column) files'
    )
    sub.add_argument('paths', nargs='+', metavar='PATH')
    common(sub, 'data/files', 'bpe:8192')
    sub.add_argument('--tokens', type=number, default=0, help='stop after this many tokens')
    sub.add_argument(
        '--val-tokens',
        type=number,
        default=0,
        help='tokens in the val shard (default: ~10%% of the estimated total, at most one shard)',
    )
    sub.add_argument(
        '--bpe-sample-chars',
        type=number,
        default=1_000_000_000,
        help='characters the bpe:V tokenizer trains on (default 1e9)',
    )

    sub = sources.add_parser(
        'bench', help='tokens/s of the pipeline against raw tiktoken (a benchmark, not a test)'
    )
    sub.add_argument(
        '--workers', type=int, default=0, help='processes for both (default: all cores)'
    )
    sub.add_argument('--megabytes', type=int, default=100, help='MB of text (default 100)')
    sub.add_argument(
        '--rounds', type=int, default=3, help='alternating rounds, best of each kept (default 3)'
    )
    sub.add_argument(
        '--tokenizer', default='bpe:8192', help='bpe:V (trained on the stdlib) or gpt2'
    )

    args = parser.parse_args(argv)
    if args.source == 'pystdlib':
        prepare_pystdlib(
            args.out, args.tokenizer, args.workers, args.shard_tokens, args.max_files, args.special
        )
    elif args.source in ('fineweb_edu', 'hub'):
        options = dict(
            tokens=args.tokens,
            tokenizer=args.tokenizer,
            workers=args.workers,
            shard_tokens=args.shard_tokens,
            val_tokens=args.val_tokens,
            revision=args.revision,
            bpe_sample_chars=args.bpe_sample_chars,
            keep_downloads=args.keep_downloads,
            network=Network(
                args.endpoint, args.connect_timeout, args.read_timeout, args.retry_budget
            ),
            special=args.special,
        )
        if args.source == 'fineweb_edu':
            prepare_fineweb_edu(args.out, args.sample, **options)
        else:
            prepare_hub(args.repo, args.out, args.config, args.column, args.split, **options)
    elif args.source == 'files':
        prepare_files(
            args.paths,
            args.out,
            args.tokenizer,
            args.workers,
            args.shard_tokens,
            args.val_tokens,
            args.tokens,
            args.bpe_sample_chars,
            args.special,
        )
    else:
        bench(args.workers, args.megabytes, args.tokenizer, args.rounds)
    return 0


if __name__ == '__main__':
    sys.exit(main())
