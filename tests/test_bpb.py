"""
test_bpb.py: bits per byte divide by the UTF-8 bytes of the very targets scored, to the byte: each token's bytes
from the tokenizer (ours through tiktoken, NeoX's through the `tokenizers` library), special tokens none; and
train.py's evaluate, the sweep and the objectives bench count them so.
"""

import json
import math

import numpy as np
import pytest
import torch

import export
import sweep
from ledgergpt import data, sums


def val_tokens(folder):
    return np.concatenate(
        [np.asarray(data.open_shard(p), dtype=np.int64) for p in data.list_shards(folder, 'val')]
    )


def test_target_bytes_are_the_decoded_texts_bytes(pystdlib_data):
    enc = data.load_tokenizer(pystdlib_data)
    tokens = val_tokens(pystdlib_data)
    eot = enc.eot_token
    assert (tokens == eot).sum() > 1  # documents: the end-of-text tokens have no bytes
    decoded = enc.decode_bytes([t for t in tokens.tolist() if t != eot])
    assert data.target_bytes(pystdlib_data, tokens) == len(decoded)
    # any slice, in any shape, with IGNORE_INDEX targets skipped
    rows = tokens[1 : 1 + 40 * 32].reshape(40, 32).copy()
    rows[::3, 5:9] = -100
    kept = [t for t in rows.ravel().tolist() if t >= 0 and t != eot]
    assert data.target_bytes(pystdlib_data, rows) == len(enc.decode_bytes(kept))
    # the folder-wide ratio (meta.json: train and val together) is not the val's: the reason it is not used
    meta = data.load_meta(pystdlib_data)
    assert len(decoded) / len(tokens) != pytest.approx(meta['bytes_per_token'], abs=5e-4)


def test_neox_token_bytes_through_the_tokenizers_library(pystdlib_data, tmp_path):
    """Our BPE written as a `tokenizers` byte-level tokenizer (export.hf_tokenizer) with an added run of spaces and
    a special token: the same bytes per id as tiktoken's, 4 for the run, 0 for the special tokens."""
    enc = data.load_tokenizer(pystdlib_data)
    spec = json.loads(export.hf_tokenizer(enc).to_str())
    spec['added_tokens'].append(
        dict(spec['added_tokens'][0], id=512, content='    ', special=False)
    )
    folder = tmp_path / 'neox_data'
    folder.mkdir()
    (folder / 'tokenizer.json').write_text(json.dumps({'name': 'neox', 'tokenizers': spec}))
    hf = data.load_tokenizer(str(folder))
    assert isinstance(hf, data.HFEncoding)
    ours, theirs = data.token_byte_lengths(enc), data.token_byte_lengths(hf)
    assert (
        theirs[:512].tolist() == ours[:512].tolist()
        and theirs[512] == 4
        and ours[enc.eot_token] == 0
    )
    text = 'def f(x):\n    return "café 東京 🐍"  # a comment\n'
    ids = hf.encode_ordinary(text)
    assert 512 in ids and data.target_bytes(str(folder), np.array(ids)) == len(text.encode())


def test_sweep_scores_in_the_val_targets_own_bytes(pystdlib_data):
    rows = sweep.val_sequences(pystdlib_data, 32)
    enc = data.load_tokenizer(pystdlib_data)
    text_bytes = len(
        enc.decode_bytes([t for t in rows[:, 1:].ravel().tolist() if t != enc.eot_token])
    )
    assert sweep.val_bytes_per_token(pystdlib_data, 32) == text_bytes / rows[:, 1:].size
    torch.manual_seed(0)

    def forward(x, y):  # any model: a fixed random one
        return torch.nn.functional.cross_entropy(torch.randn(*x.shape, 512).transpose(1, 2), y)

    loss, bits = sweep.score(forward, pystdlib_data, 32)
    assert bits == pytest.approx(loss * rows[:, 1:].size / math.log(2) / text_bytes)
    assert bits == sums.bits_per_byte(loss, text_bytes / rows[:, 1:].size)
