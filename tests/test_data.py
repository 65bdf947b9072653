"""
test_data.py: data.py reads a prepared folder: llm.c's shard format (ours and llm.c's, both kinds, damaged ones as
one line), meta.json checked key by key, the token ids against the model's vocab, the tokenizer (and a damaged one),
and the stream of training sequences (the val set, each rank's slice, the vocab check). Importing it pulls in
neither prepare.py nor the ledger, the objectives or torch.
"""

import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ledgergpt import data, objectives
from ledgergpt.config import DataError, ModelConfig, TrainConfig

# -----------------------------------------------------------------------------------------------------
# Shards


def write_raw_shard(path, magic, version, tokens):
    """A shard written the way llm.c's dev/data/data_common.py writes one, byte for byte."""
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = magic, version, len(tokens)
    with open(path, 'wb') as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())


def test_shard_header_fields_and_round_trip(tmp_path):
    path = str(tmp_path / 'x_train_000001.bin')
    tokens = np.array([50256, 1, 2, 65535, 0], dtype=np.uint16)
    assert data.write_shard(path, tokens) == 65535  # the largest id, for meta.json
    header = np.fromfile(path, dtype='<i4', count=256)
    assert (header[0], header[1], header[2]) == (20240520, 1, 5)
    assert not header[3:].any()
    assert os.path.getsize(path) == 1024 + 2 * 5
    shard = data.open_shard(path)
    assert isinstance(shard, np.memmap) and shard.dtype == np.uint16 and not shard.flags.writeable
    assert shard.tolist() == tokens.tolist()
    assert os.listdir(tmp_path) == ['x_train_000001.bin']  # no temporary file left


def test_dtype_follows_the_ledger_and_uint32_uses_llama3_header(tmp_path):
    from ledgergpt import sums

    # GPT-2, NeoX, the uint16 edge, Llama 3
    for vocab in (50257, 50277, 65535, 65536, 65537, 128256):
        assert data.token_dtype(vocab).itemsize == sums.token_bytes(vocab)
    assert data.token_dtype(65536) == np.uint16  # ids 0..65,535 all fit
    assert data.token_dtype(65537) == np.uint32
    path = str(tmp_path / 'x_train_000001.bin')
    tokens = np.array([128000, 65536, 3, 128255], dtype=np.uint32)
    assert data.write_shard(path, tokens) == 128255
    # llm.c's Llama 3 header
    assert np.fromfile(path, dtype='<i4', count=3).tolist() == [20240801, 7, 4]
    assert os.path.getsize(path) == 1024 + 4 * 4
    assert data.open_shard(path).tolist() == tokens.tolist()
    data.write_shard(path, [1, 70000])  # a plain list with a large id picks uint32 too
    assert data.open_shard(path).dtype == np.uint32
    data.write_shard(path, [1, 65535])  # and one whose ids fit, uint16
    assert data.open_shard(path).dtype == np.uint16


def test_llmc_and_older_shards_read_as_is(tmp_path):
    gpt2 = np.array([50256, 464, 3290, 50256, 40], dtype=np.uint16)
    write_raw_shard(tmp_path / 'fineweb_val_000000.bin', 20240520, 1, gpt2)
    assert data.open_shard(str(tmp_path / 'fineweb_val_000000.bin')).tolist() == gpt2.tolist()
    llama3 = np.array([128000, 9906, 1917, 128001], dtype=np.uint32)
    write_raw_shard(tmp_path / 'llama_val_000000.bin', 20240801, 7, llama3)
    assert data.open_shard(str(tmp_path / 'llama_val_000000.bin')).tolist() == llama3.tolist()
    # our uint32 shards before llm.c's header
    write_raw_shard(tmp_path / 'old_val_000000.bin', 20240520, 2, llama3)
    assert data.open_shard(str(tmp_path / 'old_val_000000.bin')).tolist() == llama3.tolist()


def test_truncated_or_bad_magic_shard_is_a_clear_error(tmp_path):
    path = str(tmp_path / 'x_train_000001.bin')
    data.write_shard(path, np.arange(100, dtype=np.uint16))
    with open(path, 'r+b') as f:
        f.truncate(1024 + 150)
    with pytest.raises(
        DataError, match=r'x_train_000001\.bin: the header says 100 tokens .* 1174 bytes'
    ):
        data.open_shard(path)
    with open(path, 'r+b') as f:
        f.truncate(500)
    with pytest.raises(DataError, match=r'x_train_000001\.bin: 500 bytes, shorter than'):
        data.open_shard(path)
    data.write_shard(path, np.arange(100, dtype=np.uint16))
    with open(path, 'r+b') as f:
        f.write(np.array([1234], dtype='<i4').tobytes())
    with pytest.raises(DataError, match=r'x_train_000001\.bin: bad magic number 1234'):
        data.open_shard(path)
    write_raw_shard(path, 20240801, 1, np.arange(3, dtype=np.uint32))
    with pytest.raises(DataError, match=r'unknown shard version 1 for magic 20240801'):
        data.open_shard(path)


def test_list_shards_and_load_meta_say_how_to_make_them(tmp_path):
    with pytest.raises(DataError, match=r'no train shards .*python prepare.py pystdlib --out'):
        data.list_shards(str(tmp_path), 'train')
    with pytest.raises(DataError, match=r'no meta.json'):
        data.load_meta(str(tmp_path))


def test_load_meta_checks_every_key(pystdlib_data, tmp_path):
    good = data.load_meta(pystdlib_data)
    path = tmp_path / 'meta.json'
    # the source is in the shard names
    data.write_shard(str(tmp_path / 'fineweb_edu_train_000001.bin'), [1, 2])
    remake = rf'rerun the command that made the folder \(python prepare.py fineweb_edu --out {tmp_path}, same options\)'
    cases = [
        ('{"vocab_size": 512,', r'is not valid JSON \(Expecting'),
        (b'\xff\xfe\x00garbage', r'is not valid JSON'),
        ('[1, 2]', r'holds a JSON list, not an object'),
        (json.dumps({k: v for k, v in good.items() if k != 'eot_id'}), r"has no 'eot_id'"),
        (json.dumps(dict(good, vocab_size='512')), r"'vocab_size' is '512', not a whole number"),
        (json.dumps(dict(good, train_tokens=True)), r"'train_tokens' is True, not a whole number"),
        (json.dumps(dict(good, max_token_id=1.5)), r"'max_token_id' is 1.5, not a whole number"),
        (json.dumps(dict(good, vocab_size=0)), r"'vocab_size' is 0, not positive"),
    ]
    for text, problem in cases:
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        with pytest.raises(DataError, match=re.escape(str(path)) + '.*' + problem + '.*' + remake):
            data.load_meta(str(tmp_path))
    path.write_text(json.dumps(good))
    assert data.load_meta(str(tmp_path)) == good


def test_check_token_ids(tmp_path):
    out = str(tmp_path)
    data.write_shard(os.path.join(out, 'x_val_000000.bin'), np.array([5, 9, 2], dtype=np.uint16))
    data.write_shard(
        os.path.join(out, 'x_train_000001.bin'), np.array([7, 511, 3], dtype=np.uint16)
    )
    meta = {'tokenizer': 'bpe:512', 'vocab_size': 512}  # no max_token_id: an llm.c-made folder, say
    assert data.check_token_ids(out, meta, 512) == 511  # read from the shards
    # meta.json's value, no reading
    assert data.check_token_ids(out, dict(meta, max_token_id=300), 512) == 300
    with pytest.raises(
        DataError,
        match=r'x_train_000001\.bin: token id 511 at position 1 is outside the model\'s vocab of '
        r'500 \(ids 0\.\.499\), though meta.json says bpe:512',
    ):
        data.check_token_ids(out, meta, 500)
    # a cached max too large
    with pytest.raises(DataError, match=r'x_train_000001\.bin: token id 511'):
        data.check_token_ids(out, dict(meta, max_token_id=511), 300)
    # the first
    with pytest.raises(
        DataError, match=r'x_val_000000\.bin: token id 9 at position 1 .* vocab of 8'
    ):
        data.check_token_ids(out, meta, 8)


def test_the_stream_checks_the_ids_it_reads(tmp_path):
    # meta.json's max_token_id may vouch for a shard damaged since: each batch read is checked on the host
    tokens = np.arange(1000, dtype=np.uint16) % 500
    tokens[613] = 40_000
    path = os.path.join(str(tmp_path), 'x_train_000001.bin')
    data.write_shard(path, tokens)
    meta = {'tokenizer': 'bpe:512', 'vocab_size': 512}
    stream = data.ShardStream([data.open_shard(path)], 16, seed=3, vocab_size=512, meta=meta)
    bad = next(
        k for k in range(stream.per_epoch) if stream.locate(k)[1] <= 613 <= stream.locate(k)[1] + 16
    )
    assert stream.batch(bad + 1, 3).max() < 512  # batches without it go through
    with pytest.raises(DataError) as error:
        stream.batch(bad - 1 if bad else bad, 4)
    assert str(error.value).startswith(
        f"{path}: token id 40,000 at position 613 is outside the model's vocab of 512 (ids 0..511), though "
        f"meta.json says bpe:512 (512 tokens)"
    )


# -----------------------------------------------------------------------------------------------------
# The tokenizer (the shared pystdlib fixture is in conftest.py)


def test_encode_decode_round_trip(pystdlib_data):
    enc = data.load_tokenizer(pystdlib_data)
    for doc in [
        'def f(x):\n    return x ** 2\n',
        'naïve café — 東京 🐍\r\n\ttabs',
        '',
        ' ' * 40 + 'x',
        '<|endoftext|>',
    ]:
        assert enc.decode(enc.encode_ordinary(doc)) == doc
    # text never turns into the special token
    assert enc.eot_token not in enc.encode_ordinary('<|endoftext|>')


def test_damaged_tokenizer_or_missing_package_is_one_line(tmp_path, monkeypatch):
    (tmp_path / 'tokenizer.json').write_text('{"name": 1')
    with pytest.raises(
        DataError,
        match=r'tokenizer.json is damaged \(JSONDecodeError: .*\): delete the folder '
        r'and rerun python prepare.py pystdlib --out',
    ):
        data.load_tokenizer(str(tmp_path))
    (tmp_path / 'tokenizer.json').write_text(json.dumps({'name': 'neox', 'tokenizers': {}}))
    monkeypatch.setitem(sys.modules, 'tokenizers', None)  # a machine without the package
    with pytest.raises(
        DataError,
        match=r"tokenizer.json is neox's tokenizer, which needs the tokenizers "
        r"package: pip install tokenizers",
    ):
        data.load_tokenizer(str(tmp_path))


# -----------------------------------------------------------------------------------------------------
# Streams (ShardStream's seeded order itself: test_train.py; several real processes: test_distributed.py)


def test_open_data_reads_the_folder_the_model_fits(pystdlib_data):
    model, train = (
        ModelConfig(vocab_size=512, block_size=32),
        TrainConfig(data=pystdlib_data, seed=1, eval_tokens=1000),
    )
    stream, val, meta = data.open_data(model, train)
    assert (
        meta == data.load_meta(pystdlib_data)
        and stream.per_epoch == (meta['train_tokens'] - 1) // 32
    )
    # the val set: the first eval_tokens of the val split, cut into consecutive sequences of T + 1 tokens
    first = np.asarray(
        data.open_shard(data.list_shards(pystdlib_data, 'val')[0])[:1001], dtype=np.int64
    )
    assert val.shape == (31, 33) and all(
        (val[i] == first[32 * i : 32 * i + 33]).all() for i in range(31)
    )
    # a model's vocab is the data's, or padded up to a multiple of 128: another size is one line
    assert data.padded_vocab(512) == 512 and data.padded_vocab(513) == 640
    with pytest.raises(
        DataError,
        match=r'vocab mismatch: .* bpe:512 \(512 tokens\) but the model has '
        r'vocab_size=1,024: set vocab_size = 512, .*`python prepare.py pystdlib --out',
    ):
        data.open_data(ModelConfig(vocab_size=1024, block_size=32), train)
    synthetic = TrainConfig(data='synthetic', seed=1, eval_tokens=64)
    stream, val, meta = data.open_data(model, synthetic)
    assert meta is None and val.shape == (2, 33) and 0 <= val.min() and val.max() < 512
    assert (
        stream.batch(4, 3)[1:] == data.open_data(model, synthetic)[0].batch(5, 2)
    ).all()  # any slice, reproduced


def split_train_shard(source, folder, pieces):
    """A copy of the prepared folder `source` whose train split is `pieces` shards (indices 1..pieces after the val
    shard 0, as prepare.py numbers them), meta.json saying so; -> the train shards' paths."""
    import shutil

    shutil.copytree(source, folder)
    (path,) = data.list_shards(str(folder), 'train')
    tokens = np.array(data.open_shard(path))
    os.remove(path)
    prefix = os.path.basename(path).rsplit('_train_', 1)[0]
    paths = [str(folder / f'{prefix}_train_{1 + i:06d}.bin') for i in range(pieces)]
    for p, part in zip(paths, np.array_split(tokens, pieces)):
        data.write_shard(p, part)
    meta = json.loads((folder / 'meta.json').read_text())
    (folder / 'meta.json').write_text(json.dumps(dict(meta, train_shards=pieces)))
    return paths


def test_every_shard_meta_json_lists_is_there_with_its_size(pystdlib_data, tmp_path):
    """A shard gone or cut short would silently train on less data (under torchrun, on one rank another stream than
    the others'): each split's shards must be the ones meta.json counts, holding the tokens it counts."""
    model, folder = ModelConfig(vocab_size=512, block_size=32), tmp_path / 'data'
    paths = split_train_shard(pystdlib_data, folder, 4)
    train = TrainConfig(data=str(folder), seed=1, eval_tokens=1000)
    stream, _, meta = data.open_data(model, train)
    assert stream.per_epoch == sum((len(data.open_shard(p)) - 1) // 32 for p in paths)
    kept = open(paths[2], 'rb').read()
    os.remove(paths[2])
    with pytest.raises(DataError) as e:
        data.open_data(model, train)
    assert str(e.value) == (
        f"{paths[2]} is missing: meta.json lists 4 train shards and 3 are here (a run would train on less data): "
        f"copy it back, or remake the folder ({data.prepare_command(str(folder))}, same options)"
    )
    # a shard of another length (a valid header, fewer tokens): the split's total is not meta.json's
    tokens = np.frombuffer(kept[data.HEADER_BYTES :], dtype=np.uint16)
    data.write_shard(paths[2], tokens[:-10])
    with pytest.raises(DataError) as e:
        data.open_data(model, train)
    assert str(e.value) == (
        f"the train shards of {folder} hold {meta['train_tokens'] - 10:,} tokens, but meta.json says "
        f"{meta['train_tokens']:,}: a shard was replaced or damaged; remake the folder "
        f"({data.prepare_command(str(folder))}, same options)"
    )
    # cut short (the header's count no longer fits the file): open_shard's line names it
    with open(paths[2], 'wb') as f:
        f.write(kept[:-6])
    with pytest.raises(DataError, match=re.escape(f"{paths[2]}: the header says")):
        data.open_data(model, train)
    # one shard more than meta.json lists: named too
    with open(paths[2], 'wb') as f:
        f.write(kept)
    extra = str(folder / os.path.basename(paths[0]).replace('000001', '000005'))
    data.write_shard(extra, tokens)
    with pytest.raises(DataError) as e:
        data.open_data(model, train)
    assert str(e.value).startswith(
        f"{extra} is not one of the 4 train shards meta.json lists (5 are here): delete it"
    )
    os.remove(extra)
    assert data.open_data(model, train)[0].per_epoch == stream.per_epoch


def test_a_val_set_too_small_names_eval_tokens_or_the_splits_real_size(pystdlib_data):
    meta = data.load_meta(pystdlib_data)
    limited = TrainConfig(data=pystdlib_data, seed=1, eval_tokens=100)
    with pytest.raises(DataError) as e:
        data.open_data(ModelConfig(vocab_size=512, block_size=256), limited)
    assert str(e.value) == (
        f"eval_tokens = 100 takes 101 tokens of the val split of {pystdlib_data} (which holds "
        f"{meta['val_tokens']:,}), fewer than block_size + 1 = 257: raise eval_tokens to at least 256"
    )
    whole = TrainConfig(data=pystdlib_data, seed=1, eval_tokens=10**6)
    with pytest.raises(DataError) as e:
        data.open_data(ModelConfig(vocab_size=512, block_size=65536), whole)
    assert str(e.value) == (
        f"the val split of {pystdlib_data} holds {meta['val_tokens']:,} tokens, fewer than block_size + 1 = "
        f"65,537: prepare more data or lower block_size"
    )


def test_micro_batches_are_disjoint_rank_slices_of_one_stream(pystdlib_data):
    train = TrainConfig(data=pystdlib_data, seed=1, eval_tokens=64)
    stream = data.open_data(ModelConfig(vocab_size=512, block_size=32), train)[0]

    def inputs_and_targets(micro_steps, world_size):  # every micro-step's slices, rank by rank
        slices = [
            data.micro_batch_arrays(
                stream, 40, m, SimpleNamespace(rank=r, world_size=world_size), 4, objectives.CLM
            )
            for m in range(micro_steps)
            for r in range(world_size)
        ]
        return np.concatenate([x for x, _ in slices]), np.concatenate([y for _, y in slices])

    x, y = inputs_and_targets(4, 1)
    sequences = stream.batch(40, 16)
    assert (x == sequences[:, :-1]).all() and (y == sequences[:, 1:]).all()  # clm: (s[:-1], s[1:])
    # 2 ranks x 2 micro-steps: the same 16
    for ranks, single in zip(inputs_and_targets(2, 2), (x, y), strict=True):
        assert (ranks == single).all()
    tensor = data.to_device(x, torch.device('cpu'))
    assert tensor.dtype == torch.int64 and (tensor.numpy() == x).all()


def test_data_imports_neither_prepare_nor_the_training_side():
    """train.py, sample.py, evals.py and export.py read data without the 1,000 lines that make it."""
    code = (
        "import sys; from ledgergpt import data; print(sorted({'prepare', 'ledgergpt.downloads', "
        "'ledgergpt.sums', 'ledgergpt.objectives', 'train', 'torch', 'tiktoken', 'tokenizers'} & "
        "set(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, '-c', code],
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(data.__file__))),
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == '[]'
