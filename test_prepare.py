"""Tests for prepare.py: shards, tokenizers, pystdlib, files, and fineweb_edu against a local fake Hub (offline)."""
import http.server
import json
import os
import random
import re
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import prepare


# -----------------------------------------------------------------------------------------------------
# Shards

def test_shard_header_fields_and_round_trip(tmp_path):
    path = str(tmp_path / 'x_train_000001.bin')
    tokens = np.array([50256, 1, 2, 65535, 0], dtype=np.uint16)
    prepare.write_shard(path, tokens)
    header = np.fromfile(path, dtype='<i4', count=256)
    assert (header[0], header[1], header[2]) == (20240520, 1, 5)
    assert not header[3:].any()
    assert os.path.getsize(path) == 1024 + 2 * 5
    shard = prepare.open_shard(path)
    assert isinstance(shard, np.memmap) and shard.dtype == np.uint16 and not shard.flags.writeable
    assert shard.tolist() == tokens.tolist()
    assert not os.path.exists(path + '.tmp')


def test_uint32_when_vocab_exceeds_65535(tmp_path):
    assert prepare.token_dtype(50257) == np.uint16
    assert prepare.token_dtype(65535) == np.uint16
    assert prepare.token_dtype(65536) == np.uint32
    assert prepare.token_dtype(128256) == np.uint32  # Llama 3
    path = str(tmp_path / 'x_train_000001.bin')
    tokens = np.array([128000, 65536, 3, 128255], dtype=np.uint32)
    prepare.write_shard(path, tokens)
    header = np.fromfile(path, dtype='<i4', count=3)
    assert header.tolist() == [20240520, 2, 4]
    assert os.path.getsize(path) == 1024 + 4 * 4
    assert prepare.open_shard(path).tolist() == tokens.tolist()
    prepare.write_shard(path, [1, 70000])  # a plain list with a large id picks uint32 too
    assert prepare.open_shard(path).dtype == np.uint32


def test_llmc_written_shard_reads_as_is(tmp_path):
    """The way llm.c's dev/data/data_common.py writes a shard, byte for byte."""
    path = str(tmp_path / 'fineweb_val_000000.bin')
    tokens = np.array([50256, 464, 3290, 50256, 40], dtype=np.uint16)
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, 'wb') as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())
    assert prepare.open_shard(path).tolist() == tokens.tolist()


def test_truncated_or_bad_magic_shard_is_a_clear_error(tmp_path):
    path = str(tmp_path / 'x_train_000001.bin')
    prepare.write_shard(path, np.arange(100, dtype=np.uint16))
    with open(path, 'r+b') as f:
        f.truncate(1024 + 150)
    with pytest.raises(prepare.DataError, match=r'x_train_000001\.bin: the header says 100 tokens .* 1174 bytes'):
        prepare.open_shard(path)
    with open(path, 'r+b') as f:
        f.truncate(500)
    with pytest.raises(prepare.DataError, match=r'x_train_000001\.bin: 500 bytes, shorter than'):
        prepare.open_shard(path)
    prepare.write_shard(path, np.arange(100, dtype=np.uint16))
    with open(path, 'r+b') as f:
        f.write(np.array([1234], dtype='<i4').tobytes())
    with pytest.raises(prepare.DataError, match=r'x_train_000001\.bin: bad magic number 1234'):
        prepare.open_shard(path)


def test_list_shards_and_load_meta_say_how_to_make_them(tmp_path):
    with pytest.raises(prepare.DataError, match=r'no train shards .*python prepare.py pystdlib --out'):
        prepare.list_shards(str(tmp_path), 'train')
    with pytest.raises(prepare.DataError, match=r'no meta.json'):
        prepare.load_meta(str(tmp_path))


# -----------------------------------------------------------------------------------------------------
# pystdlib and the tokenizer (the shared fixture is in conftest.py)

def split_documents(tokens, eot):
    """Cut a token stream at its end-of-text tokens; every document must start with one."""
    assert tokens[0] == eot
    starts = np.flatnonzero(tokens == eot).tolist() + [len(tokens)]
    return [tokens[a + 1:b] for a, b in zip(starts, starts[1:])]


def test_pystdlib_end_to_end(pystdlib_data):
    meta = prepare.load_meta(pystdlib_data)
    enc = prepare.load_tokenizer(pystdlib_data)
    assert meta['tokenizer'] == 'bpe:512' and meta['vocab_size'] == enc.n_vocab == 512
    assert meta['eot_id'] == enc.eot_token == 511 and meta['dtype'] == 'uint16'
    assert meta['source'] == 'pystdlib' and meta['revision'].startswith('python 3.')
    val, train = prepare.list_shards(pystdlib_data, 'val'), prepare.list_shards(pystdlib_data, 'train')
    assert [os.path.basename(p) for p in val + train] == ['pystdlib_val_000000.bin', 'pystdlib_train_000001.bin']
    assert meta['val_tokens'] == len(prepare.open_shard(val[0])) > 10_000
    assert meta['train_tokens'] == len(prepare.open_shard(train[0])) > 10 * meta['val_tokens']
    # the shards hold exactly the split's files, in order, each led by the end-of-text token
    files = prepare.pystdlib_files(max_files=150)
    documents = []
    for path in val + train:
        documents += [enc.decode(doc.tolist()) for doc in split_documents(np.array(prepare.open_shard(path)), 511)]
    is_val = [prepare.zlib.crc32(name.encode()) % 100 < prepare.PYSTDLIB_VAL_PERCENT for name, _ in files]
    expected = [text for (_, text), v in zip(files, is_val) if v] + [text for (_, text), v in zip(files, is_val) if not v]
    assert documents == expected and meta['documents'] == len(files)


def test_pystdlib_is_identical_across_runs(pystdlib_data, tmp_path, capsys):
    prepare.prepare_pystdlib(str(tmp_path), tokenizer='bpe:512', workers=1, max_files=150)
    for name in ['tokenizer.json', 'pystdlib_val_000000.bin', 'pystdlib_train_000001.bin']:
        with open(os.path.join(pystdlib_data, name), 'rb') as a, open(tmp_path / name, 'rb') as b:
            assert a.read() == b.read(), name
    capsys.readouterr()
    prepare.prepare_pystdlib(str(tmp_path), tokenizer='bpe:512', workers=1, max_files=150)
    assert 'already complete' in capsys.readouterr().out
    with pytest.raises(prepare.DataError, match='already holds a dataset'):
        prepare.prepare_pystdlib(str(tmp_path), tokenizer='bpe:300', workers=1, max_files=150)


def test_encode_decode_round_trip(pystdlib_data):
    enc = prepare.load_tokenizer(pystdlib_data)
    for doc in ['def f(x):\n    return x ** 2\n', 'naïve café — 東京 🐍\r\n\ttabs', '', ' ' * 40 + 'x', '<|endoftext|>']:
        assert enc.decode(enc.encode_ordinary(doc)) == doc
    assert enc.eot_token not in enc.encode_ordinary('<|endoftext|>')  # text never turns into the special token


def test_gpt2_offline_is_a_clear_error(tmp_path, monkeypatch):
    import requests

    def offline(*args, **kwargs):
        raise requests.ConnectionError('no network')
    monkeypatch.setenv('TIKTOKEN_CACHE_DIR', str(tmp_path / 'empty_cache'))
    monkeypatch.setattr(requests, 'get', offline)
    with pytest.raises(prepare.DataError, match=r'gpt2 tokenizer.*internet.*bpe:8192'):
        prepare.make_gpt2_tokenizer(str(tmp_path))


def test_bad_tokenizer_name():
    with pytest.raises(prepare.DataError, match="unknown tokenizer 'bpe:abc'"):
        prepare.parse_tokenizer('bpe:abc')


# -----------------------------------------------------------------------------------------------------
# files: .txt, .jsonl, .parquet

WORDS = ('the of and to in is was for on are with as by at from his that be this which or an had not but '
         'data model token shard train loss step learning rate batch memory compute python tensor').split()


def make_documents(n, seed, min_words=20, max_words=200):
    rng = random.Random(seed)
    return [' '.join(rng.choice(WORDS) for _ in range(rng.randint(min_words, max_words))) + f' #{seed}-{i}'
            for i in range(n)]


def all_tokens(data_dir):
    return np.concatenate([np.array(prepare.open_shard(p)) for split in ('val', 'train')
                           for p in prepare.list_shards(data_dir, split)])


def test_files_txt_jsonl_parquet(tmp_path):
    docs = make_documents(60, seed=1)
    (tmp_path / 'a.txt').write_text(docs[0])
    with open(tmp_path / 'b.jsonl', 'w') as f:
        for doc in docs[1:30]:
            f.write(json.dumps({'text': doc, 'id': 7}) + '\n\n')
    pq.write_table(pa.table({'text': docs[30:], 'score': list(range(30))}), tmp_path / 'c.parquet', row_group_size=7)
    out = str(tmp_path / 'data')
    meta = prepare.prepare_files([str(tmp_path / n) for n in ('a.txt', 'b.jsonl', 'c.parquet')], out,
                                 tokenizer='bpe:300', workers=2, shard_tokens=1500, val_tokens=1000)
    enc = prepare.load_tokenizer(out)
    tokens = all_tokens(out)
    assert [enc.decode(d.tolist()) for d in split_documents(tokens, enc.eot_token)] == docs
    assert meta['documents'] == 60 and meta['val_tokens'] == 1000
    assert meta['train_tokens'] == len(tokens) - 1000 and meta['train_shards'] == len(prepare.list_shards(out, 'train'))
    assert [len(prepare.open_shard(p)) for p in prepare.list_shards(out, 'train')][:-1] == [1500] * (meta['train_shards'] - 1)


def test_parquet_batches_from_any_row(tmp_path):
    # the batches hand Arrow's bytes and offsets to the workers: every start row (inside a row group, at its
    # edges, past the end) and batch size must give exactly the documents from that row on, nulls as ''
    docs = [doc if i % 7 else None for i, doc in enumerate(make_documents(40, seed=3, min_words=1, max_words=5))]
    docs[5] = 'non-ASCII: é 我 🙂'
    path = str(tmp_path / 'a.parquet')
    for text_type in (pa.string(), pa.large_string(), pa.string_view()):
        pq.write_table(pa.table({'id': list(range(40)), 'text': pa.array(docs, text_type)}), path, row_group_size=13)
        expected = list(enumerate(doc or '' for doc in docs))
        for start in (0, 1, 12, 13, 14, 39, 40, 50):
            assert list(prepare.read_documents(path, start)) == expected[start:]
            for batch_docs in (1, 5, 64):
                batches = list(prepare.document_batches([path], [path].__getitem__, (0, start), batch_docs))
                got = [(first_row + i, text) for _, first_row, data, offsets in batches
                       for i, text in enumerate(prepare.unpack_texts(data, offsets))]
                assert got == expected[start:] and all(len(offsets) <= batch_docs + 1 for *_, offsets in batches)


def test_files_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        prepare.main(['files', str(tmp_path / 'missing.txt'), '--out', str(tmp_path / 'd')])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith('error: ') and 'missing.txt: no such file' in err and err.count('\n') == 1
    (tmp_path / 'a.csv').write_text('x')
    with pytest.raises(prepare.DataError, match=r'a\.csv: unknown file type'):
        prepare.prepare_files([str(tmp_path / 'a.csv')], str(tmp_path / 'd'))
    (tmp_path / 'b.jsonl').write_text('{"body": "no text field"}\n')
    with pytest.raises(prepare.DataError, match=r'b\.jsonl:1: not a JSON object with a "text" field'):
        list(prepare.read_documents(str(tmp_path / 'b.jsonl')))


# -----------------------------------------------------------------------------------------------------
# fineweb_edu against a fake Hub on 127.0.0.1: revision -> commit, paged tree listing, resolve with Range

SHA = '0123456789abcdef0123456789abcdef01234567'


class FakeHub(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, files):
        super().__init__(('127.0.0.1', 0), FakeHubHandler)
        self.files = files          # repo path -> bytes
        self.log = []               # (path, Range header) of every file request
        self.fail = {}              # repo path -> list of statuses to answer before the real file
        self.drop_after = {}        # repo path -> bytes to send before dropping the connection (once)
        self.url = f'http://127.0.0.1:{self.server_address[1]}'


class FakeHubHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def send_json(self, obj, headers=()):
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        for key, value in headers:
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        hub, repo = self.server, 'HuggingFaceFW/fineweb-edu'
        if self.path == f'/api/datasets/{repo}/revision/main':
            return self.send_json({'id': repo, 'sha': SHA})
        match = re.fullmatch(f'/api/datasets/{repo}/tree/{SHA}/(sample/[^?]+)(?:\\?page=(\\d+))?', self.path)
        if match:  # two entries per page, to exercise the Link header
            folder, page = match.group(1), int(match.group(2) or 0)
            entries = [{'type': 'file', 'path': p, 'size': len(b), 'oid': 'x'} for p, b in sorted(hub.files.items())
                       if p.startswith(folder + '/')] + [{'type': 'file', 'path': folder + '/README.md', 'size': 1}]
            if len(entries) == 1:  # the Hub answers 404 for a folder that does not exist
                self.send_error(404)
                return
            more = (page + 1) * 2 < len(entries)
            link = [('Link', f'<{hub.url}/api/datasets/{repo}/tree/{SHA}/{folder}?page={page + 1}>; rel="next"')]
            return self.send_json(entries[page * 2:page * 2 + 2], link if more else ())
        prefix = f'/datasets/{repo}/resolve/{SHA}/'
        path = self.path[len(prefix):]
        if not self.path.startswith(prefix) or path not in hub.files:
            self.send_error(404)
            return
        hub.log.append((path, self.headers.get('Range')))
        if hub.fail.get(path):
            self.send_error(hub.fail[path].pop(0))
            return
        body, start = hub.files[path], 0
        if self.headers.get('Range'):
            start = int(re.fullmatch(r'bytes=(\d+)-', self.headers['Range']).group(1))
            self.send_response(206)
            self.send_header('Content-Range', f'bytes {start}-{len(body) - 1}/{len(body)}')
        else:
            self.send_response(200)
        self.send_header('Content-Length', str(len(body) - start))
        self.end_headers()
        if path in hub.drop_after:  # promise the whole body, send part of it, hang up
            self.wfile.write(body[start:start + hub.drop_after.pop(path)])
            self.wfile.flush()
            self.connection.shutdown(2)
            return
        self.wfile.write(body[start:])


def parquet_bytes(docs, row_group_size=25):
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({'text': docs, 'id': [str(i) for i in range(len(docs))]}), sink,
                   row_group_size=row_group_size)
    return sink.getvalue().to_pybytes()


FINEWEB_DOCS = [make_documents(80, seed=s) for s in range(3)]


@pytest.fixture
def hub(monkeypatch):
    monkeypatch.setattr(prepare, 'RETRY_BACKOFF_S', 0.01)
    monkeypatch.setattr(prepare, 'DOWNLOAD_CHUNK_BYTES', 1024)  # the fake files are ~30 KB
    files = {f'sample/10BT/{i:03d}_00000.parquet': parquet_bytes(docs) for i, docs in enumerate(FINEWEB_DOCS)}
    server = FakeHub(files)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def fineweb(hub, out, **kwargs):
    args = dict(sample='10BT', tokenizer='bpe:300', workers=2, shard_tokens=3000, val_tokens=2000,
                endpoint=hub.url, bpe_sample_chars=20_000)
    return prepare.prepare_fineweb_edu(str(out), **dict(args, **kwargs))


def test_fineweb_end_to_end(hub, tmp_path):
    out = tmp_path / 'fw'
    meta = fineweb(hub, out)
    enc = prepare.load_tokenizer(str(out))
    tokens = all_tokens(str(out))
    assert [enc.decode(d.tolist()) for d in split_documents(tokens, enc.eot_token)] == sum(FINEWEB_DOCS, [])
    assert meta['revision'] == SHA and meta['source'] == 'fineweb_edu/sample/10BT'
    assert meta['documents'] == 240 and meta['val_tokens'] == 2000 and meta['train_tokens'] == len(tokens) - 2000
    assert len(prepare.open_shard(prepare.list_shards(str(out), 'val')[0])) == 2000
    train_sizes = [len(prepare.open_shard(p)) for p in prepare.list_shards(str(out), 'train')]
    assert train_sizes[:-1] == [3000] * (len(train_sizes) - 1) and 0 < train_sizes[-1] <= 3000
    for path, body in hub.files.items():  # downloads are byte-identical and renamed from .partial
        with open(out / 'downloads' / os.path.basename(path), 'rb') as f:
            assert f.read() == body
    assert not list((out / 'downloads').glob('*.partial'))
    assert json.load(open(out / 'files.json'))['revision'] == SHA


def test_fineweb_stops_at_tokens_without_extra_downloads(hub, tmp_path):
    out = tmp_path / 'fw'
    meta = fineweb(hub, out, tokens=5000)  # file 0 alone holds ~22K tokens
    assert meta['val_tokens'] + meta['train_tokens'] == 5000 == len(all_tokens(str(out)))
    assert {path for path, _ in hub.log} == {'sample/10BT/000_00000.parquet'}
    meta = fineweb(hub, out, tokens=30_000)  # a larger --tokens carries on into the next file
    tokens = all_tokens(str(out))
    assert meta['val_tokens'] + meta['train_tokens'] == 30_000 == len(tokens)
    enc = prepare.load_tokenizer(str(out))
    documents = [enc.decode(d.tolist()) for d in split_documents(tokens, enc.eot_token)]
    assert documents[:-1] == sum(FINEWEB_DOCS, [])[:len(documents) - 1] and len(documents) > 80


def test_fineweb_resumes_a_dropped_download_with_range(hub, tmp_path):
    path = 'sample/10BT/001_00000.parquet'
    hub.drop_after[path] = len(hub.files[path]) // 2
    fineweb(hub, tmp_path / 'fw')
    half = len(hub.files[path]) // 2 // 1024 * 1024  # the chunks that arrived whole before the drop
    assert [r for p, r in hub.log if p == path] == [None, f'bytes={half}-']
    with open(tmp_path / 'fw' / 'downloads' / os.path.basename(path), 'rb') as f:
        assert f.read() == hub.files[path]


def test_fineweb_retries_server_errors(hub, tmp_path):
    path = 'sample/10BT/002_00000.parquet'
    hub.fail[path] = [500, 503]
    fineweb(hub, tmp_path / 'fw')
    assert [r for p, r in hub.log if p == path] == [None, None, None]
    with open(tmp_path / 'fw' / 'downloads' / os.path.basename(path), 'rb') as f:
        assert f.read() == hub.files[path]


def test_fineweb_404_is_a_clear_error(hub, tmp_path, capsys):
    with pytest.raises(prepare.DataError, match=r'tree/.*/sample/350BT: not found \(HTTP 404\): check --sample'):
        fineweb(hub, tmp_path / 'fw', sample='350BT')
    hub.fail['sample/10BT/000_00000.parquet'] = [404]
    with pytest.raises(prepare.DataError, match=r'resolve/.*/000_00000.parquet: not found \(HTTP 404\)'):
        fineweb(hub, tmp_path / 'fw1')
    with pytest.raises(SystemExit) as exit_info:
        prepare.main(['fineweb_edu', '--out', str(tmp_path / 'fw2'), '--endpoint', hub.url, '--revision', 'nope'])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith('error: ') and 'revision/nope: not found (HTTP 404)' in err and err.count('\n') == 1


def test_fineweb_rerun_skips_finished_work(hub, tmp_path, capsys):
    reference = tmp_path / 'reference'
    fineweb(hub, reference)
    # an interrupted run: the last file cannot be had (HTTP 500 until the tries run out)
    last = 'sample/10BT/002_00000.parquet'
    hub.fail[last] = [500] * prepare.HTTP_ATTEMPTS
    hub.log.clear()
    out = tmp_path / 'fw'
    with pytest.raises(prepare.DataError, match='still failing after'):
        fineweb(hub, out)
    progress = json.load(open(out / 'progress.json'))
    assert progress['shards'] >= 3 and progress['file'] == 1 and not (out / 'meta.json').exists()
    finished = {p: os.stat(p).st_mtime_ns for p in [str(out / 'downloads' / '000_00000.parquet')] +
                [prepare.shard_path(str(out), 'fineweb_edu', 'val' if i == 0 else 'train', i)
                 for i in range(progress['shards'])]}
    hub.log.clear()
    fineweb(hub, out)  # the rerun carries on: nothing finished is downloaded or written again
    assert 'carrying on after' in capsys.readouterr().out
    assert {p for p, _ in hub.log} == {last}
    assert all(os.stat(p).st_mtime_ns == t for p, t in finished.items())
    names = sorted(os.listdir(reference))
    assert sorted(os.listdir(out)) == names
    for name in names:
        if name.endswith('.bin') or name == 'tokenizer.json':
            assert (out / name).read_bytes() == (reference / name).read_bytes(), name
    assert json.load(open(out / 'meta.json'))['documents'] == json.load(open(reference / 'meta.json'))['documents']
    hub.log.clear()
    fineweb(hub, out)  # a finished folder: a no-op that says so
    assert 'already complete' in capsys.readouterr().out and hub.log == []
    with pytest.raises(prepare.DataError, match='already holds a dataset'):  # another tokenizer: refused
        fineweb(hub, out, tokenizer='bpe:400')
