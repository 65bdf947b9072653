"""Tests for prepare.py: making tokenizers and data folders from pystdlib, files, and fineweb_edu against a local fake
Hub (offline) that can fail in every way a real network does (downloads.py). Reading a folder: test_data.py."""

import hashlib
import http.server
import itertools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import prepare
from ledgergpt import config, data, downloads, files
from ledgergpt.config import DataError

# -----------------------------------------------------------------------------------------------------
# pystdlib and the tokenizer (the shared fixture is in conftest.py; reading a tokenizer: test_data.py)


def split_documents(tokens, eot):
    """Cut a token stream at its end-of-text tokens; every document must start with one."""
    assert tokens[0] == eot
    starts = np.flatnonzero(tokens == eot).tolist() + [len(tokens)]
    return [tokens[a + 1 : b] for a, b in itertools.pairwise(starts)]


def test_pystdlib_end_to_end(pystdlib_data):
    meta = data.load_meta(pystdlib_data)
    enc = data.load_tokenizer(pystdlib_data)
    assert meta['tokenizer'] == 'bpe:512' and meta['vocab_size'] == enc.n_vocab == 512
    assert meta['eot_id'] == enc.eot_token == 511 and meta['dtype'] == 'uint16'
    assert meta['source'] == 'pystdlib' and meta['revision'].startswith('python 3.')
    val, train = data.list_shards(pystdlib_data, 'val'), data.list_shards(pystdlib_data, 'train')
    assert [os.path.basename(p) for p in val + train] == [
        'pystdlib_val_000000.bin',
        'pystdlib_train_000001.bin',
    ]
    assert meta['val_tokens'] == len(data.open_shard(val[0])) > 10_000
    assert meta['train_tokens'] == len(data.open_shard(train[0])) > 10 * meta['val_tokens']
    # eot
    assert meta['max_token_id'] == max(int(data.open_shard(p).max()) for p in val + train) == 511
    # the shards hold exactly the split's files, in order, each led by the end-of-text token
    files = prepare.pystdlib_files(max_files=150)
    documents = []
    for path in val + train:
        documents += [
            enc.decode(doc.tolist())
            for doc in split_documents(np.array(data.open_shard(path)), 511)
        ]
    is_val = [
        prepare.zlib.crc32(name.encode()) % 100 < prepare.PYSTDLIB_VAL_PERCENT for name, _ in files
    ]
    expected = [text for (_, text), v in zip(files, is_val, strict=True) if v] + [
        text for (_, text), v in zip(files, is_val, strict=True) if not v
    ]
    assert documents == expected and meta['documents'] == len(files)
    assert not os.path.exists(os.path.join(pystdlib_data, '.lock'))  # released


def test_pystdlib_is_identical_across_runs(pystdlib_data, tmp_path, capsys):
    prepare.prepare_pystdlib(str(tmp_path), tokenizer='bpe:512', workers=1, max_files=150)
    for name in ['tokenizer.json', 'pystdlib_val_000000.bin', 'pystdlib_train_000001.bin']:
        with open(os.path.join(pystdlib_data, name), 'rb') as a, open(tmp_path / name, 'rb') as b:
            assert a.read() == b.read(), name
    capsys.readouterr()
    prepare.prepare_pystdlib(str(tmp_path), tokenizer='bpe:512', workers=1, max_files=150)
    assert 'already complete' in capsys.readouterr().out
    with pytest.raises(
        DataError,
        match="already holds a dataset made with other settings: tokenizer='bpe:512' \\(this run: 'bpe:300'\\)",
    ):
        prepare.prepare_pystdlib(str(tmp_path), tokenizer='bpe:300', workers=1, max_files=150)
    # damaged: the rerun makes the folder again
    (tmp_path / 'meta.json').write_text('{"vocab_size": ')
    assert prepare.prepare_pystdlib(
        str(tmp_path), tokenizer='bpe:512', workers=1, max_files=150
    ) == data.load_meta(pystdlib_data)
    assert 'meta.json is damaged: finishing the folder again' in capsys.readouterr().out


def test_gpt2_offline_is_a_clear_error(tmp_path, monkeypatch):
    import requests

    def offline(*args, **kwargs):
        raise requests.ConnectionError('no network')

    monkeypatch.setenv('TIKTOKEN_CACHE_DIR', str(tmp_path / 'empty_cache'))
    monkeypatch.setattr(requests, 'get', offline)
    with pytest.raises(DataError, match=r'gpt2 tokenizer.*internet.*bpe:8192'):
        prepare.make_gpt2_tokenizer(str(tmp_path))


def test_bad_tokenizer_name(tmp_path):
    with pytest.raises(DataError, match="unknown tokenizer 'bpe:abc'"):
        prepare.parse_tokenizer('bpe:abc')
    assert prepare.parse_tokenizer('gpt2') == 50257 and prepare.parse_tokenizer('bpe:300') == 300
    with pytest.raises(DataError, match="unknown tokenizer 'gpt3'"):
        prepare.prepare_pystdlib(str(tmp_path / 'new'), tokenizer='gpt3')
    assert not (tmp_path / 'new').exists()  # refused before anything is written


# -----------------------------------------------------------------------------------------------------
# files: .txt, .jsonl, .parquet

WORDS = (
    'the of and to in is was for on are with as by at from his that be this which or an had not but '
    'data model token shard train loss step learning rate batch memory compute python tensor'
).split()


def make_documents(n, seed, min_words=20, max_words=200):
    rng = random.Random(seed)
    return [
        ' '.join(rng.choice(WORDS) for _ in range(rng.randint(min_words, max_words)))
        + f' #{seed}-{i}'
        for i in range(n)
    ]


def all_tokens(data_dir):
    return np.concatenate(
        [
            np.array(data.open_shard(p))
            for split in ('val', 'train')
            for p in data.list_shards(data_dir, split)
        ]
    )


def shard_bytes(data_dir):
    """{name: bytes} of a folder's shards and tokenizer: what must be identical between two runs."""
    names = [n for n in os.listdir(data_dir) if n.endswith('.bin') or n == 'tokenizer.json']
    return {name: open(os.path.join(data_dir, name), 'rb').read() for name in sorted(names)}


def test_files_txt_jsonl_parquet(tmp_path):
    docs = make_documents(60, seed=1)
    (tmp_path / 'a.txt').write_text(docs[0])
    with open(tmp_path / 'b.jsonl', 'w') as f:
        for doc in docs[1:30]:
            f.write(json.dumps({'text': doc, 'id': 7}) + '\n\n')
    pq.write_table(
        pa.table({'text': docs[30:], 'score': list(range(30))}),
        tmp_path / 'c.parquet',
        row_group_size=7,
    )
    out = str(tmp_path / 'data')
    meta = prepare.prepare_files(
        [str(tmp_path / n) for n in ('a.txt', 'b.jsonl', 'c.parquet')],
        out,
        tokenizer='bpe:300',
        workers=2,
        shard_tokens=1500,
        val_tokens=1000,
    )
    enc = data.load_tokenizer(out)
    tokens = all_tokens(out)
    assert [enc.decode(d.tolist()) for d in split_documents(tokens, enc.eot_token)] == docs
    assert (
        meta['documents'] == 60
        and meta['val_tokens'] == 1000
        and meta['max_token_id'] == tokens.max()
    )
    assert meta['train_tokens'] == len(tokens) - 1000 and meta['train_shards'] == len(
        data.list_shards(out, 'train')
    )
    sizes = [len(data.open_shard(p)) for p in data.list_shards(out, 'train')]
    assert sizes[:-1] == [1500] * (meta['train_shards'] - 1)
    assert meta == data.load_meta(out)


def test_parquet_batches_from_any_row(tmp_path):
    # the batches hand Arrow's bytes and offsets to the workers: every start row (inside a row group, at its
    # edges, past the end) and batch size must give exactly the documents from that row on, nulls as ''
    docs = [
        doc if i % 7 else None
        for i, doc in enumerate(make_documents(40, seed=3, min_words=1, max_words=5))
    ]
    docs[5] = 'non-ASCII: é 我 🙂'
    path = str(tmp_path / 'a.parquet')
    for text_type in (pa.string(), pa.large_string(), pa.string_view()):
        pq.write_table(
            pa.table({'id': list(range(40)), 'text': pa.array(docs, text_type)}),
            path,
            row_group_size=13,
        )
        expected = list(enumerate(doc or '' for doc in docs))
        for start in (0, 1, 12, 13, 14, 39, 40, 50):
            assert list(prepare.read_documents(path, start)) == expected[start:]
            for batch_docs in (1, 5, 64):
                batches = list(
                    prepare.document_batches([path], [path].__getitem__, (0, start), batch_docs)
                )
                got = [
                    (first_row + i, text)
                    for _, first_row, packed, offsets in batches
                    for i, text in enumerate(prepare.unpack_texts(packed, offsets))
                ]
                assert got == expected[start:] and all(
                    len(offsets) <= batch_docs + 1 for *_, offsets in batches
                )


def run_main(argv, capsys):
    """prepare.py's exit code and stderr, as a user at a terminal sees them."""
    capsys.readouterr()
    code = prepare.main(argv)
    return code, capsys.readouterr().err


def test_files_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    out = str(tmp_path / 'd')
    good = tmp_path / 'good.txt'
    good.write_text(' '.join(make_documents(5, seed=4)))
    (tmp_path / 'latin1.txt').write_bytes('caf\xe9 au lait'.encode('latin-1'))
    (tmp_path / 'image.txt').write_bytes(b'\x89PNG\r\n\x1a\n' + bytes(range(256)))
    (tmp_path / 'nul.txt').write_bytes(b'text\0with a NUL')
    (tmp_path / 'b.jsonl').write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    (tmp_path / 'c.jsonl').write_text('{"body": "no text field"}\n')
    (tmp_path / 'd.jsonl').write_text('{"text": 42}\n')
    (tmp_path / 'bad.parquet').write_bytes(b'PAR1 this is not really parquet')
    (tmp_path / 'empty.txt').write_text('')
    (tmp_path / 'blank.jsonl').write_text('{"text": ""}\n' * 3)
    (tmp_path / 'a.csv').write_text('x')
    cases = [
        ('missing.txt', r'missing\.txt: no such file'),
        ('.', r': a folder; give the files in it \(e\.g\. '),
        ('a.csv', r'a\.csv: unknown file type'),
        ('latin1.txt', r'latin1\.txt: not UTF-8 text \(byte 0xe9 at byte 3\): convert it to UTF-8'),
        ('image.txt', r'image\.txt: a binary file \(NUL bytes at byte 8\), not text: leave it out'),
        ('nul.txt', r'nul\.txt: a binary file \(NUL bytes at byte 4\)'),
        ('b.jsonl', r'b\.jsonl:2: not UTF-8 text \(byte 0xe9 at byte 13 of the line\)'),
        ('c.jsonl', r'c\.jsonl:1: not a JSON object with a "text" string'),
        ('d.jsonl', r'd\.jsonl:1: not a JSON object with a "text" string'),
        (
            'bad.parquet',
            r'bad\.parquet: not a readable parquet file \(.*\): if it is a download, delete it',
        ),
        ('empty.txt', r'the input is empty \(.*empty\.txt: 0 bytes\): give files with text'),
        ('blank.jsonl', r'there is no text in the input \(every document is empty\)'),
    ]
    for i, (name, message) in enumerate(cases):
        code, err = run_main(
            ['files', str(tmp_path / name), '--out', f'{out}{i}', '--workers', '1'], capsys
        )
        assert code == 2 and re.fullmatch(f'error: .*{message}.*\n', err), (name, err)
    # too large a val part for the text: the line says how large it may be
    code, err = run_main(
        ['files', str(good), '--out', out, '--val-tokens', '1e6', '--tokenizer', 'bpe:300'], capsys
    )
    assert code == 2 and re.fullmatch(
        r"error: no text left for the BPE to learn from: the text has [\d,]+ characters "
        r"and the first 8,000,000 are held out .* lower --val-tokens \(about [\d,]+ "
        r"would leave half the text\).*\n",
        err,
    ), err
    assert sorted(os.listdir(out)) == ['progress.json']  # the refused run wrote nothing else
    capsys.readouterr()
    assert (
        prepare.main(['files', str(good), '--out', out, '--tokenizer', 'bpe:300', '--workers', '1'])
        == 0
    )
    assert 'starting over (a run with other settings, val_tokens=1000000' in capsys.readouterr().out


# -----------------------------------------------------------------------------------------------------
# fineweb_edu against a fake Hub on 127.0.0.1: revision -> commit, paged tree listing with sizes and sha256,
# resolve with Range and If-Range, and every fault a real network has, injected per file.

SHA = '0123456789abcdef0123456789abcdef01234567'
REPO = 'HuggingFaceFW/fineweb-edu'
NEOX = 'EleutherAI/gpt-neox-20b'


class FakeHub(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, files, host='127.0.0.1'):
        super().__init__((host, 0), FakeHubHandler)
        self.files = files  # repo path -> bytes of the dataset (in LFS)
        self.repo = REPO  # the dataset repo it serves
        self.model_files = {}  # repo path -> bytes of the model repo NEOX (kept in git, not LFS)
        self.log = []  # {'path', 'range', 'if_range', 'auth'} of every file request
        self.api_auth = []  # Authorization header of every API request
        self.fail = {}  # repo path -> statuses (or (status, headers)) to answer before the real file
        self.drop_after = {}  # repo path -> bytes to send before dropping the connection (once)
        self.body = {}  # repo path -> (bytes, Content-Type) sent instead of the file
        self.corrupt = {}  # repo path -> how many answers flip one byte of the file
        self.stall = {}  # repo path -> seconds of silence after half the body, one per answer
        self.silent = {}  # repo path -> seconds of silence before every answer (a hung server)
        self.etag = {}  # repo path -> ETags, one per answer, the last one kept (default: the sha256)
        self.token = None  # a token every request must carry (a gated dataset)
        self.redirect = None  # base URL of a CDN that file requests are redirected to (302)
        self.portal = None  # a web page answered (200) to every request: a captive portal
        self.url = f'http://{host}:{self.server_address[1]}'


def sha256(content):
    return hashlib.sha256(content).hexdigest()


def git_blob_id(content):
    return hashlib.sha1(b'blob %d\0' % len(content) + content).hexdigest()


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
        try:
            self.answer()
        except (BrokenPipeError, ConnectionResetError):  # the client gave up on a stalled answer
            pass

    def answer(self):
        hub = self.server
        if hub.portal:
            self.send_response(200)
            self.send_header('Content-Type', 'text/html')
            self.send_header('Content-Length', str(len(hub.portal)))
            self.end_headers()
            self.wfile.write(hub.portal)
            return
        if hub.token and self.headers.get('Authorization') != f'Bearer {hub.token}':
            self.send_error(401)
            return
        if self.path.startswith('/api/'):
            hub.api_auth.append(self.headers.get('Authorization'))
        if self.path.startswith(
            (f'/api/datasets/{hub.repo}/revision/', f'/api/models/{NEOX}/revision/')
        ):
            revision = self.path.rsplit('/', 1)[1]
            return (
                self.send_json({'sha': SHA}) if revision in ('main', SHA) else self.send_error(404)
            )
        # a file kept in git has its blob id as oid
        if self.path == f'/api/models/{NEOX}/tree/{SHA}':
            return self.send_json(
                [
                    {'type': 'file', 'path': p, 'size': len(b), 'oid': git_blob_id(b)}
                    for p, b in sorted(hub.model_files.items())
                ]
            )
        match = re.fullmatch(
            f'/api/datasets/{hub.repo}/tree/{SHA}/([^?]+)(?:\\?page=(\\d+))?', self.path
        )
        # two entries per page, to exercise the Link header; LFS files carry size and sha256
        if match:
            folder, page = match.group(1), int(match.group(2) or 0)
            entries = [
                {
                    'type': 'file',
                    'path': p,
                    'size': 134,
                    'oid': 'git-sha1',
                    'lfs': {'oid': sha256(b), 'size': len(b), 'pointerSize': 134},
                }
                for p, b in sorted(hub.files.items())
                if p.startswith(folder + '/')
            ]
            entries += [
                {'type': 'file', 'path': folder + '/README.md', 'size': 1, 'oid': 'git-sha1'}
            ]
            if len(entries) == 1:  # the Hub answers 404 for a folder that does not exist
                self.send_error(404)
                return
            more = (page + 1) * 2 < len(entries)
            link = [
                (
                    'Link',
                    f'<{hub.url}/api/datasets/{hub.repo}/tree/{SHA}/{folder}?page={page + 1}>; rel="next"',
                )
            ]
            return self.send_json(entries[page * 2 : page * 2 + 2], link if more else ())
        prefix = next(
            (
                p
                for p in (f'/datasets/{hub.repo}/resolve/{SHA}/', f'/{NEOX}/resolve/{SHA}/')
                if self.path.startswith(p)
            ),
            '',
        )
        path, store = (
            self.path[len(prefix) :],
            hub.model_files if prefix.startswith(f'/{NEOX}') else hub.files,
        )
        if not prefix or path not in store:
            self.send_error(404)
            return
        hub.log.append(
            {
                'path': path,
                'range': self.headers.get('Range'),
                'if_range': self.headers.get('If-Range'),
                'auth': self.headers.get('Authorization'),
            }
        )
        time.sleep(hub.silent.get(path, 0))
        if hub.fail.get(path):
            status, headers = (lambda s: s if isinstance(s, tuple) else (s, {}))(
                hub.fail[path].pop(0)
            )
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header('Content-Length', '0')
            self.end_headers()
            return
        if hub.redirect:
            self.send_response(302)
            self.send_header('Location', hub.redirect + self.path)
            self.send_header('Content-Length', '0')
            self.end_headers()
            return
        body, content_type = hub.body.get(path, (store[path], 'application/octet-stream'))
        if hub.corrupt.get(path):
            hub.corrupt[path] -= 1
            body = (
                body[: len(body) // 2]
                + bytes([body[len(body) // 2] ^ 1])
                + body[len(body) // 2 + 1 :]
            )
        etags = hub.etag.get(path, [f'"{sha256(store[path])}"'])
        etag = etags.pop(0) if len(etags) > 1 else etags[0]
        start = 0
        # If-Range: only if unchanged
        if self.headers.get('Range') and self.headers.get('If-Range', etag) == etag:
            start = int(re.fullmatch(r'bytes=(\d+)-', self.headers['Range']).group(1))
            self.send_response(206)
            self.send_header('Content-Range', f'bytes {start}-{len(body) - 1}/{len(body)}')
        else:
            self.send_response(200)
        self.send_header('Content-Length', str(len(body) - start))
        self.send_header('Content-Type', content_type)
        self.send_header('ETag', etag)
        self.end_headers()
        if path in hub.drop_after:  # promise the whole body, send part of it, hang up
            self.wfile.write(body[start : start + hub.drop_after.pop(path)])
            self.wfile.flush()
            self.connection.shutdown(2)
            return
        if hub.stall.get(path):  # half the body, then silence
            half = start + (len(body) - start) // 2
            self.wfile.write(body[start:half])
            self.wfile.flush()
            time.sleep(hub.stall[path].pop(0))
            start = half
        self.wfile.write(body[start:])


def parquet_bytes(docs, row_group_size=25):
    sink = pa.BufferOutputStream()
    pq.write_table(
        pa.table({'text': docs, 'id': [str(i) for i in range(len(docs))]}),
        sink,
        row_group_size=row_group_size,
    )
    return sink.getvalue().to_pybytes()


FINEWEB_DOCS = [make_documents(80, seed=s) for s in range(3)]
FINEWEB_FILES = {
    f'sample/10BT/{i:03d}_00000.parquet': parquet_bytes(docs) for i, docs in enumerate(FINEWEB_DOCS)
}
LAST = 'sample/10BT/002_00000.parquet'


def serve(files, host='127.0.0.1'):
    server = FakeHub(dict(files), host)
    threading.Thread(
        target=server.serve_forever, args=(0.05,), daemon=True
    ).start()  # a quick shutdown()
    return server


@pytest.fixture
def hub(monkeypatch):
    monkeypatch.setattr(downloads, 'DOWNLOAD_CHUNK_BYTES', 1024)  # the fake files are ~30 KB
    server = serve(FINEWEB_FILES)
    yield server
    server.shutdown()
    server.server_close()


def fineweb(hub, out, network=None, **kwargs):
    """prepare_fineweb_edu against the fake Hub, with time-outs and waits small enough for a test: every fault
    below ends in seconds."""
    network = network or downloads.Network(
        hub.url, connect_timeout_s=2, read_timeout_s=0.3, retry_budget_s=5, backoff_s=0.001
    )
    args = dict(
        sample='10BT',
        tokenizer='bpe:300',
        workers=2,
        shard_tokens=3000,
        val_tokens=2000,
        bpe_sample_chars=20_000,
        network=network,
    )
    return prepare.prepare_fineweb_edu(str(out), **dict(args, **kwargs))


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
    """A clean run's folder: every fault test that recovers must end in the very same shards and tokenizer."""
    server = serve(FINEWEB_FILES)
    out = tmp_path_factory.mktemp('reference')
    fineweb(server, out, keep_downloads=True)
    server.shutdown()
    server.server_close()
    return out


def test_fineweb_end_to_end(reference):
    out = reference
    enc = data.load_tokenizer(str(out))
    tokens = all_tokens(str(out))
    meta = data.load_meta(str(out))
    assert [enc.decode(d.tolist()) for d in split_documents(tokens, enc.eot_token)] == sum(
        FINEWEB_DOCS, []
    )
    assert meta['revision'] == SHA and meta['source'] == 'fineweb_edu/sample/10BT'
    assert (
        meta['documents'] == 240
        and meta['val_tokens'] == 2000
        and meta['train_tokens'] == len(tokens) - 2000
    )
    assert meta['max_token_id'] == tokens.max() == 299
    assert len(data.open_shard(data.list_shards(str(out), 'val')[0])) == 2000
    train_sizes = [len(data.open_shard(p)) for p in data.list_shards(str(out), 'train')]
    assert train_sizes[:-1] == [3000] * (len(train_sizes) - 1) and 0 < train_sizes[-1] <= 3000
    for (
        path,
        body,
    ) in FINEWEB_FILES.items():  # --keep-downloads: byte-identical, renamed from .partial
        assert (out / 'downloads' / os.path.basename(path)).read_bytes() == body
    assert sorted(os.listdir(out / 'downloads')) == [
        '000_00000.parquet',
        '001_00000.parquet',
        '002_00000.parquet',
    ]
    manifest = json.load(open(out / 'files.json'))
    assert manifest['revision'] == SHA
    assert manifest['files'] == [
        {'path': p, 'size': len(b), 'sha256': sha256(b)} for p, b in FINEWEB_FILES.items()
    ]


def test_fineweb_deletes_each_download_once_tokenized(hub, reference, tmp_path, capsys):
    fineweb(hub, tmp_path / 'fw')
    assert shard_bytes(tmp_path / 'fw') == shard_bytes(reference)
    assert os.listdir(tmp_path / 'fw' / 'downloads') == []
    out = capsys.readouterr().out
    total = sum(len(b) for b in FINEWEB_FILES.values())
    assert (
        f"plan: 3 of 3 parquet files, {files.human_bytes(total)} to download, each deleted once tokenized"
        in out
    )


def test_fineweb_stops_at_tokens_without_extra_downloads(hub, tmp_path):
    out = tmp_path / 'fw'
    # a small sample with our own BPE and the default val part (10% of --tokens): the BPE sample and the shards
    # read file 0 only (it alone holds ~22K tokens)
    meta = fineweb(hub, out, tokens=5000, val_tokens=0)
    assert meta['val_tokens'] == 500 and meta['val_tokens'] + meta['train_tokens'] == 5000 == len(
        all_tokens(str(out))
    )
    assert {r['path'] for r in hub.log} == {'sample/10BT/000_00000.parquet'}
    # a larger --tokens carries on into the next file
    meta = fineweb(hub, out, tokens=30_000, val_tokens=500)
    tokens = all_tokens(str(out))
    assert meta['val_tokens'] + meta['train_tokens'] == 30_000 == len(tokens)
    enc = data.load_tokenizer(str(out))
    documents = [enc.decode(d.tolist()) for d in split_documents(tokens, enc.eot_token)]
    assert documents[:-1] == sum(FINEWEB_DOCS, [])[: len(documents) - 1] and len(documents) > 80


def test_fineweb_resumes_a_dropped_download_with_range_and_if_range(hub, reference, tmp_path):
    path = 'sample/10BT/001_00000.parquet'
    hub.drop_after[path] = len(hub.files[path]) // 2
    fineweb(hub, tmp_path / 'fw')
    half = len(hub.files[path]) // 2 // 1024 * 1024  # the chunks that arrived whole before the drop
    etag = f'"{sha256(hub.files[path])}"'
    requests = [(r['range'], r['if_range']) for r in hub.log if r['path'] == path]
    assert requests == [(None, None), (f'bytes={half}-', etag)]
    assert shard_bytes(tmp_path / 'fw') == shard_bytes(reference)


def test_fineweb_changed_etag_restarts_the_file(hub, reference, tmp_path, capsys):
    # the server's copy changed between the drop and the resume (a new ETag): If-Range makes it send the whole
    # file (200) instead of the rest of another one, and the download starts over
    path = 'sample/10BT/001_00000.parquet'
    hub.drop_after[path] = len(hub.files[path]) // 2
    hub.etag[path] = ['"first"', '"second"']
    fineweb(hub, tmp_path / 'fw')
    assert [r['if_range'] for r in hub.log if r['path'] == path] == [None, '"first"']
    assert (
        'the server sent the whole file again (it changed, or ignores ranges): starting over'
        in capsys.readouterr().out
    )
    assert shard_bytes(tmp_path / 'fw') == shard_bytes(reference)


def test_fineweb_retries_server_errors(hub, reference, tmp_path):
    hub.fail[LAST] = [500, 503]
    fineweb(hub, tmp_path / 'fw')
    assert [r['range'] for r in hub.log if r['path'] == LAST] == [None, None, None]
    assert shard_bytes(tmp_path / 'fw') == shard_bytes(reference)


def test_fineweb_flipped_byte_is_downloaded_again(hub, reference, tmp_path, capsys):
    hub.corrupt[LAST] = 1
    fineweb(hub, tmp_path / 'fw')
    assert [r['range'] for r in hub.log if r['path'] == LAST] == [None, None]
    good = sha256(hub.files[LAST])
    assert re.search(
        f'002_00000.parquet: sha256 [0-9a-f]{{64}} differs from the listing\'s {good}: downloading it '
        f'again \\(2 of 3\\)',
        capsys.readouterr().out,
    )
    assert shard_bytes(tmp_path / 'fw') == shard_bytes(reference)


def test_fineweb_always_damaged_file_is_one_line(hub, tmp_path):
    hub.corrupt[LAST] = 99
    body = hub.files[LAST]
    flipped = (
        body[: len(body) // 2] + bytes([body[len(body) // 2] ^ 1]) + body[len(body) // 2 + 1 :]
    )
    with pytest.raises(
        DataError,
        match=f'002_00000.parquet: sha256 {sha256(flipped)} after 3 downloads, but the listing says {sha256(body)}',
    ):
        fineweb(hub, tmp_path / 'fw')
    # nothing damaged kept
    assert not [n for n in os.listdir(tmp_path / 'fw' / 'downloads') if n.startswith('002')]


def test_fineweb_damaged_file_on_disk_is_downloaded_again(hub, reference, tmp_path, capsys):
    out = tmp_path / 'fw'
    os.makedirs(out / 'downloads')
    # e.g. from an older, damaged run
    (out / 'downloads' / '000_00000.parquet').write_bytes(b'PAR1' + bytes(100))
    fineweb(hub, out)
    size = len(hub.files['sample/10BT/000_00000.parquet'])
    assert (
        f'000_00000.parquet does not match the listing (104 bytes, not {size:,})'
        in capsys.readouterr().out
    )
    assert shard_bytes(out) == shard_bytes(reference)


def test_fineweb_size_disagreeing_with_the_listing_is_one_line(hub, tmp_path):
    hub.body[LAST] = (hub.files[LAST] + b'more', 'application/octet-stream')
    size = len(hub.files[LAST])
    with pytest.raises(
        DataError,
        match=f'002_00000.parquet: the server sends {size + 4:,} bytes but the '
        f'Hub\'s listing says {size:,}: a proxy or mirror',
    ):
        fineweb(hub, tmp_path / 'fw')
    assert len([r for r in hub.log if r['path'] == LAST]) == 1  # an error, not a restart


def test_fineweb_html_page_is_named(hub, tmp_path):
    portal = b'<!DOCTYPE html>\n<html><body>Please sign in to the airport Wi-Fi</body></html>'
    hub.portal = portal  # on every request, the Hub's API too
    with pytest.raises(
        DataError,
        match=r"/revision/main: not an answer of the Hub's API \(text/html: "
        r"'<!DOCTYPE html> <html><body>Please sign in",
    ):
        fineweb(hub, tmp_path / 'fw0')
    hub.portal = None
    hub.body[LAST] = (portal, 'text/html; charset=utf-8')
    with pytest.raises(
        DataError,
        match=r"002_00000.parquet: the server answered with a web page \(text/html; "
        r"charset=utf-8: '<!DOCTYPE html> <html><body>Please sign in",
    ):
        fineweb(hub, tmp_path / 'fw')
    hub.body[LAST] = (
        b'{"error": "Access denied"}' + bytes(len(hub.files[LAST]) - 26),
        'application/json',
    )
    with pytest.raises(
        DataError,
        match=r"002_00000.parquet: the server sent something else than the file "
        r"\(application/json: '\{\"error\": \"Access denied\"\}",
    ):
        fineweb(hub, tmp_path / 'fw')


def test_fineweb_rate_limit_waits_as_asked(hub, reference, tmp_path, capsys):
    hub.fail[LAST] = [(429, {'Retry-After': '1'})]
    fineweb(hub, tmp_path / 'fw')
    assert (
        'rate-limited by the Hub (HTTP 429): try 2 of at most 10 in 1 s' in capsys.readouterr().out
    )
    assert shard_bytes(tmp_path / 'fw') == shard_bytes(reference)
    hub.fail[LAST] = [(429, {'Retry-After': '3600'})]
    with pytest.raises(
        DataError,
        match=r'rate-limited by the Hub \(HTTP 429\): the Hub asks to wait 3600 s, '
        r'more than the retry budget of 5 s',
    ):
        fineweb(hub, tmp_path / 'fw2')


def test_fineweb_stalled_server(hub, reference, tmp_path, capsys):
    # once: silence longer than the read time-out (0.3 s) half way, then a resumed download
    hub.stall[LAST] = [2]
    fineweb(hub, tmp_path / 'fw')
    assert (
        'sample/10BT/002_00000.parquet: no data for 0.3 s (read time-out): try 2 of at most 10 in 0.001 s'
        in capsys.readouterr().out
    )
    assert [r['range'] is not None for r in hub.log if r['path'] == LAST] == [False, True]
    assert shard_bytes(tmp_path / 'fw') == shard_bytes(reference)
    hub.silent[LAST] = 2  # a hung server, every time: given up within the retry budget
    with pytest.raises(
        DataError,
        match=r'^sample/10BT/002_00000.parquet: no data for 0.2 s \(read time-out\), '
        r'still after \d+ tries in \d+ s: check the network',
    ):
        fineweb(
            hub,
            tmp_path / 'fw2',
            network=downloads.Network(
                hub.url, read_timeout_s=0.2, retry_budget_s=1, backoff_s=0.01
            ),
        )


def test_fineweb_gated_dataset_and_token(hub, reference, tmp_path, capsys, monkeypatch):
    hub.token = 'hf_secret'
    # another host: the token must not follow the redirect there
    cdn = serve(FINEWEB_FILES, host='localhost')
    hub.redirect = cdn.url
    monkeypatch.delenv('HF_TOKEN', raising=False)
    monkeypatch.setenv('HF_ENDPOINT', hub.url)  # the Hub's own variable: no --endpoint needed
    argv = [
        'fineweb_edu',
        '--sample',
        '10BT',
        '--out',
        str(tmp_path / 'fw'),
        '--tokenizer',
        'bpe:300',
        '--shard-tokens',
        '3000',
        '--val-tokens',
        '2000',
        '--bpe-sample-chars',
        '20000',
        '--workers',
        '2',
    ]
    code, err = run_main(argv, capsys)
    assert code == 2 and re.fullmatch(
        r'error: .*/revision/main: HTTP 401: the dataset is gated or private .* '
        r'HF_TOKEN=hf_\.\.\. python prepare\.py \.\.\.\n',
        err,
    ), err
    monkeypatch.setenv('HF_TOKEN', 'hf_wrong')
    code, err = run_main(argv, capsys)
    assert (
        code == 2 and 'HTTP 401 with the token in HF_TOKEN: it has no access to this dataset' in err
    )
    monkeypatch.setenv('HF_TOKEN', 'hf_secret')
    code, err = run_main(argv, capsys)
    assert code == 0 and err == ''
    assert set(hub.api_auth) == {'Bearer hf_secret'} and {r['auth'] for r in hub.log} == {
        'Bearer hf_secret'
    }
    # the CDN never saw the token
    assert len(cdn.log) == 3 and {r['auth'] for r in cdn.log} == {None}
    assert shard_bytes(tmp_path / 'fw') == shard_bytes(reference)
    cdn.shutdown()
    cdn.server_close()


def test_fineweb_disk_plan_refuses_what_cannot_fit(hub, tmp_path, monkeypatch):
    monkeypatch.setattr(prepare, 'free_bytes', lambda folder: 50_000)
    with pytest.raises(
        DataError,
        match=r'not enough disk space in .*fw: this run needs up to about [\d.]+ KB '
        r'more \(~.* of shards, ~.* of parquet at once\) and 50\.0 KB is free: '
        r'free some space, choose another --out or lower --tokens',
    ):
        fineweb(hub, tmp_path / 'fw')
    assert hub.log == []  # refused before any download


def test_disk_plan_of_the_26b_token_run(tmp_path, monkeypatch, capsys):
    # sample/100BT-like files of 2.15 GB; 26.1e9 GPT-2 tokens at 3-4 bytes of parquet per token
    files = [
        {'path': f'sample/100BT/{i:03d}_00000.parquet', 'size': 2_150_000_000} for i in range(140)
    ]
    paths = [str(tmp_path / f"{i:03d}_00000.parquet") for i in range(140)]
    monkeypatch.setattr(prepare, 'free_bytes', lambda folder: 100_000_000_000)
    prepare.disk_plan(
        str(tmp_path), files, paths, int(26.1e9), 100_000_000, 50257, keep_downloads=False
    )
    assert capsys.readouterr().out == (
        f"plan: 37 to 49 of 140 parquet files, 79.5 GB to 105.3 GB to download, each deleted once tokenized "
        f"(--keep-downloads keeps them); ~52.2 GB of shards (26,100,000,000 tokens x 2 bytes); at most ~56.9 GB more "
        f"on disk, 100.0 GB free in {tmp_path}\n"
    )
    with pytest.raises(
        DataError,
        match=r'needs up to about 157.6 GB more \(~52.2 GB of shards, ~105.3 GB '
        r'of parquet at once\) and 100.0 GB is free: .*, or drop --keep-downl',
    ):
        prepare.disk_plan(
            str(tmp_path), files, paths, int(26.1e9), 100_000_000, 50257, keep_downloads=True
        )


def test_fineweb_404_is_a_clear_error(hub, tmp_path, capsys):
    with pytest.raises(
        DataError, match=r'tree/.*/sample/350BT: not found \(HTTP 404\): check --sample'
    ):
        fineweb(hub, tmp_path / 'fw', sample='350BT')
    hub.fail['sample/10BT/000_00000.parquet'] = [404]
    with pytest.raises(DataError, match=r'resolve/.*/000_00000.parquet: not found \(HTTP 404\)'):
        fineweb(hub, tmp_path / 'fw1')
    code, err = run_main(
        [
            'fineweb_edu',
            '--out',
            str(tmp_path / 'fw2'),
            '--endpoint',
            hub.url,
            '--revision',
            'nope',
        ],
        capsys,
    )
    assert code == 2 and err.startswith('error: ') and 'revision/nope: not found (HTTP 404)' in err
    assert err.count('\n') == 1


def test_fineweb_rerun_skips_finished_work(hub, reference, tmp_path, capsys):
    # an interrupted run: the last file cannot be had (HTTP 500 until the tries run out)
    hub.fail[LAST] = [500] * downloads.HTTP_ATTEMPTS
    out = tmp_path / 'fw'
    with pytest.raises(DataError, match=r'HTTP 500 Internal Server Error, still after 10 tries'):
        fineweb(hub, out)
    progress = json.load(open(out / 'progress.json'))
    assert progress['shards'] >= 3 and progress['file'] == 1 and not (out / 'meta.json').exists()
    # file 0 is in finished shards only: deleted; file 1 is still needed by the next shard: kept
    assert os.listdir(out / 'downloads') == ['001_00000.parquet']
    finished = {
        p: os.stat(p).st_mtime_ns
        for p in [
            data.shard_path(str(out), 'fineweb_edu', 'val' if i == 0 else 'train', i)
            for i in range(progress['shards'])
        ]
    }
    hub.log.clear()
    capsys.readouterr()
    fineweb(hub, out)  # the rerun carries on: nothing finished is downloaded or written again
    assert 'carrying on after' in capsys.readouterr().out
    assert {r['path'] for r in hub.log} == {LAST}
    assert all(os.stat(p).st_mtime_ns == t for p, t in finished.items())
    assert shard_bytes(out) == shard_bytes(reference)
    assert (
        json.load(open(out / 'meta.json'))['documents']
        == json.load(open(reference / 'meta.json'))['documents']
    )
    hub.log.clear()
    fineweb(hub, out)  # a finished folder: a no-op that says so
    assert 'already complete' in capsys.readouterr().out and hub.log == []
    with pytest.raises(DataError, match='already holds a dataset'):  # another tokenizer: refused
        fineweb(hub, out, tokenizer='bpe:400')


def test_fineweb_interrupted_run_and_another_tokenizer(hub, tmp_path, capsys):
    out = tmp_path / 'fw'
    hub.fail[LAST] = [500] * downloads.HTTP_ATTEMPTS
    with pytest.raises(DataError, match='still after'):
        fineweb(hub, out)  # stopped with shards written: another tokenizer must not be mixed in
    with pytest.raises(
        DataError,
        match=r"holds an unfinished dataset made with other settings: tokenizer="
        r"'bpe:300' \(this run: 'bpe:400'\): rerun with its settings",
    ):
        fineweb(hub, out, tokenizer='bpe:400')
    # stopped before its first shard (here: the first file cannot be had): another tokenizer starts over cleanly
    out = tmp_path / 'fw2'
    hub.fail['sample/10BT/000_00000.parquet'] = [500] * downloads.HTTP_ATTEMPTS
    with pytest.raises(DataError, match='still after'):
        fineweb(hub, out, tokenizer='bpe:400')
    meta = fineweb(hub, out, tokenizer='bpe:300')
    assert 'starting over (a run with other settings' in capsys.readouterr().out
    assert (
        meta['tokenizer'] == 'bpe:300'
        and meta['vocab_size'] == data.load_tokenizer(str(out)).n_vocab == 300
    )


def test_progress_is_plain_lines_in_a_log(hub, tmp_path, capsys, monkeypatch):
    # a line at every update (stdout here is not a terminal)
    monkeypatch.setattr(downloads, 'PROGRESS_EVERY_S', 0)
    fineweb(hub, tmp_path / 'fw', tokens=10_000)
    out = capsys.readouterr().out
    assert '\r' not in out
    # bytes and their rate
    assert re.search(r'^000_00000.parquet: +\d+% [\d.]+k?/[\d.]+k \[.*B/s\]$', out, re.M)
    # ETA
    assert re.search(
        r'^fineweb_edu: +\d+% [\d.]+k?/10.0k \[\d\d:\d\d<\d\d:\d\d, .* tokens/s\]$', out, re.M
    )


# -----------------------------------------------------------------------------------------------------
# One writer per folder, and full disks


def test_second_prepare_into_one_folder_is_refused(tmp_path, capsys):
    out = str(tmp_path / 'data')
    holder = subprocess.Popen(
        [
            sys.executable,
            '-c',
            'import sys, time\nfrom ledgergpt import files\n'
            'with files.folder_lock(sys.argv[1], "prepare.py pystdlib"):\n'
            '    print("locked", flush=True)\n'
            '    time.sleep(60)\n',
            out,
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.getcwd(),
    )
    try:
        assert holder.stdout.readline() == 'locked\n'
        code, err = run_main(
            ['pystdlib', '--out', out, '--max-files', '150', '--tokenizer', 'bpe:300'], capsys
        )
        assert code == 2 and re.fullmatch(
            f'error: {out} is in use by pid {holder.pid} on this host \\(prepare.py '
            f'pystdlib, since .*\\): wait for it to finish .*delete {out}/.lock\n',
            err,
        )
    finally:
        holder.kill()
        holder.wait()
    # killed outright, it left its lock behind: a stale lock (its pid is gone), taken over
    assert os.path.exists(os.path.join(out, '.lock'))
    assert (
        prepare.main(['pystdlib', '--out', out, '--max-files', '150', '--tokenizer', 'bpe:300'])
        == 0
    )
    assert not os.path.exists(os.path.join(out, '.lock'))


def test_full_disk_is_one_line_and_loses_nothing(tmp_path, capsys, monkeypatch):
    docs = make_documents(60, seed=5)
    (tmp_path / 'a.jsonl').write_text(''.join(json.dumps({'text': d}) + '\n' for d in docs))
    args = dict(tokenizer='bpe:300', workers=1, shard_tokens=1500, val_tokens=1000)
    reference = str(tmp_path / 'reference')
    prepare.prepare_files([str(tmp_path / 'a.jsonl')], reference, **args)
    out = str(tmp_path / 'data')
    real_fsync, calls = os.fsync, []

    # the 6th flushed write finds the disk full (a shard's or progress.json's)
    def fsync_then_full(fd):
        calls.append(fd)
        if len(calls) == 6:
            raise OSError(28, 'No space left on device')
        real_fsync(fd)

    monkeypatch.setattr(os, 'fsync', fsync_then_full)
    capsys.readouterr()
    assert (
        prepare.main(
            [
                'files',
                str(tmp_path / 'a.jsonl'),
                '--out',
                out,
                '--tokenizer',
                'bpe:300',
                '--workers',
                '1',
                '--shard-tokens',
                '1500',
                '--val-tokens',
                '1000',
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert re.fullmatch(
        f'error: disk full writing {out}(/.*)?: [\\d.,]+ [KMGT]?B free on the filesystem of {out}: '
        f'free some space or choose another folder, then rerun \\(what was complete is kept\\)\n',
        err,
    ), err
    left = os.listdir(out)
    assert not [n for n in left if '.tmp' in n] and '.lock' not in left and 'meta.json' not in left
    monkeypatch.setattr(os, 'fsync', real_fsync)
    # space again: the rerun carries on
    prepare.prepare_files([str(tmp_path / 'a.jsonl')], out, **args)
    assert shard_bytes(out) == shard_bytes(reference)


def test_read_only_folder_is_one_line(tmp_path, capsys, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(30, 'Read-only file system', str(tmp_path / 'ro' / '.lock.1'))

    monkeypatch.setattr(os, 'link', read_only)
    code, err = run_main(['pystdlib', '--out', str(tmp_path / 'ro')], capsys)
    assert code == 2 and err == (
        f"error: cannot write {tmp_path / 'ro' / '.lock.1'} (read-only filesystem): "
        f"{tmp_path / 'ro'} must be on a writable filesystem and writable by this user; "
        f"choose another folder\n"
    )


def test_ctrl_c_is_one_line_and_leaves_no_debris(tmp_path):
    # Ctrl-C reaches the whole process group, tokenizing workers included: one line and exit 130, no traceback
    line = json.dumps({'text': ' '.join(make_documents(1, seed=7, min_words=200))}) + '\n'
    # ~125 MB: tokenizing takes far longer than the 0.5 s below
    (tmp_path / 'big.jsonl').write_text(line * 100_000)
    out = tmp_path / 'data'
    run = subprocess.Popen(
        [
            sys.executable,
            'prepare.py',
            'files',
            str(tmp_path / 'big.jsonl'),
            '--out',
            str(out),
            '--tokenizer',
            'bpe:300',
            '--workers',
            '2',
            '--bpe-sample-chars',
            '100000',
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=os.path.dirname(os.path.abspath(prepare.__file__)),
        # as from a terminal: a shell's background job (CI's, maybe) inherits SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    while not (out / 'tokenizer.json').exists() and run.poll() is None:
        time.sleep(0.05)
    time.sleep(0.5)  # the pool's workers are running
    os.killpg(run.pid, signal.SIGINT)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 130 and err == (
        'interrupted (Ctrl-C): what was complete is kept; rerun the same command to carry on\n'
    ), err
    assert (
        not [n for n in os.listdir(out) if '.tmp' in n or n == '.lock']
        and (out / 'progress.json').exists()
    )


# -----------------------------------------------------------------------------------------------------
# --tokenizer neox: GPT-NeoX-20B's tokenizer.json from the Hub, used through the `tokenizers` library


def neox_format_tokenizer(texts):
    """A small tokenizer.json in GPT-NeoX-20B's format, trained here: byte-level BPE without a prefix space, NFC,
    <|endoftext|> = 0 and <|padding|> = 1, then the runs of 24 down to 2 spaces as added tokens after the BPE's
    ids (the real file: 50,254 + 23 = 50,277)."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=600,
            special_tokens=['<|endoftext|>', '<|padding|>'],
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tokenizer.add_tokens([AddedToken(' ' * n, normalized=True) for n in range(24, 1, -1)])
    return tokenizer.to_str().encode()


def test_neox_tokenizer_from_the_hub(hub, tmp_path, monkeypatch, capsys):
    import unicodedata

    from tokenizers import Tokenizer

    docs = make_documents(40, seed=8) + [
        'def f(x):\n    return x  # two  spaces' + ' ' * 30 + 'end\n',
        'café or cafe\u0301, 東京 🐍\t\ttabs',
        'plain <|endoftext|> text',
    ]
    hub.model_files['tokenizer.json'] = neox_format_tokenizer(docs)
    reference = Tokenizer.from_str(hub.model_files['tokenizer.json'].decode())
    # '<|endoftext|>' in a document is text, as everywhere in prepare.py
    reference.encode_special_tokens = True
    (tmp_path / 'a.jsonl').write_text(''.join(json.dumps({'text': doc}) + '\n' for doc in docs))
    out = tmp_path / 'data'
    # a damaged copy of the right size from an earlier run: checked, fetched again
    os.makedirs(out / 'downloads')
    (out / 'downloads' / 'gpt-neox-20b-tokenizer.json').write_bytes(
        bytes(len(hub.model_files['tokenizer.json']))
    )
    monkeypatch.setenv('HF_ENDPOINT', hub.url)
    meta = prepare.prepare_files(
        [str(tmp_path / 'a.jsonl')], str(out), tokenizer='neox', workers=2, shard_tokens=2000
    )
    assert re.search(
        r'gpt-neox-20b-tokenizer.json does not match the listing \(git sha1 [0-9a-f]{40}, not '
        f'{git_blob_id(hub.model_files["tokenizer.json"])}\\)',
        capsys.readouterr().out,
    )
    enc = data.load_tokenizer(str(out))
    # NeoX's ids, then the objectives' special tokens (by default) in the model's padding after them
    assert (
        meta['tokenizer'] == 'neox'
        and meta['vocab_size'] == enc.n_vocab == reference.get_vocab_size() + 22
    )
    assert (
        meta['special_tokens']
        == prepare.reserve(reference.get_vocab_size())
        == data.reserved_ids(enc)
    )
    assert enc.decode([meta['special_tokens']['<|fim_middle|>']]) == '<|fim_middle|>'
    assert meta['special_tokens']['<|fim_middle|>'] not in enc.encode_ordinary('<|fim_middle|>')
    assert meta['eot_id'] == enc.eot_token == 0 and meta['dtype'] == 'uint16'
    # the shards hold the reference library's ids of every document, each led by <|endoftext|>
    expected = sum(([0] + reference.encode(doc, add_special_tokens=False).ids for doc in docs), [])
    assert all_tokens(str(out)).tolist() == expected
    # NeoX's settings hold: runs of spaces are added tokens split off first (30 = 24 + 6), text is NFC, and
    # '<|endoftext|>' in a text stays text unless a prompt allows it
    spaces = {n: reference.token_to_id(' ' * n) for n in (4, 6, 24)}
    assert (
        enc.encode_ordinary('    return')[:1] == [spaces[4]]
        and enc.decode(enc.encode_ordinary('    return')[1:]) == 'return'
    )
    assert [spaces[24], spaces[6]] == enc.encode_ordinary(' ' * 30)
    for doc in docs:
        assert enc.decode(enc.encode_ordinary(doc)) == unicodedata.normalize('NFC', doc)
    assert unicodedata.normalize('NFC', docs[-2]) != docs[-2]
    assert 0 not in enc.encode_ordinary(docs[-1]) and enc.encode(
        '<|endoftext|>', allowed_special='all'
    ) == [0]
    # fetched once through HF_ENDPOINT, kept in the folder with its commit, the download removed
    assert [r['path'] for r in hub.log] == ['tokenizer.json']
    spec = json.load(open(out / 'tokenizer.json'))
    assert spec['name'] == 'neox' and spec['source'] == f'{NEOX}@{SHA}'
    assert (
        spec['tokenizers'] == json.loads(hub.model_files['tokenizer.json'])
        and os.listdir(out / 'downloads') == []
    )


# -----------------------------------------------------------------------------------------------------
# hub: any parquet dataset on the Hub, its subset (--config), text column, split; a gated one


def test_hub_any_parquet_dataset_its_config_column_and_split(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(downloads, 'DOWNLOAD_CHUNK_BYTES', 1024)
    docs = [make_documents(60, seed=10 + s) for s in range(3)]

    def content(texts):  # the text in a column called 'content', as code datasets name it
        sink = pa.BufferOutputStream()
        pq.write_table(
            pa.table({'content': texts, 'score': [1.0] * len(texts)}), sink, row_group_size=25
        )
        return sink.getvalue().to_pybytes()

    hub_files = {
        'finemath-3plus/train-00000-of-00002.parquet': content(docs[0]),
        'finemath-3plus/train-00001-of-00002.parquet': content(docs[1]),
        'finemath-3plus/test-00000-of-00001.parquet': content(docs[2]),  # another split: left out
        'finemath-4plus/train-00000-of-00001.parquet': content(
            docs[2]
        ),  # another subset: never listed
    }
    server = serve(hub_files)
    server.repo, server.token = 'HuggingFaceTB/finemath', 'hf_secret'  # gated
    monkeypatch.delenv('HF_TOKEN', raising=False)
    out = tmp_path / 'math'
    argv = [
        'hub',
        'HuggingFaceTB/finemath',
        '--config',
        'finemath-3plus',
        '--out',
        str(out),
        '--endpoint',
        server.url,
    ]
    argv += [
        '--tokenizer',
        'bpe:300',
        '--shard-tokens',
        '3000',
        '--val-tokens',
        '2000',
        '--bpe-sample-chars',
        '20000',
    ]
    argv += ['--workers', '2', '--split', 'train']
    code, err = run_main(argv, capsys)
    assert code == 2 and re.fullmatch(
        r'error: .*HTTP 401: the dataset is gated .* HF_TOKEN=hf_\.\.\. .*\n', err
    ), err
    monkeypatch.setenv('HF_TOKEN', 'hf_secret')
    code, err = run_main(argv + ['--column', 'text'], capsys)
    assert code == 2 and re.fullmatch(
        r"error: .*train-00000-of-00002.parquet: no 'text' column .*--column\n", err
    )
    code, err = run_main(argv + ['--column', 'score'], capsys)
    assert code == 2 and "the 'score' column holds double, not text" in err
    shutil.rmtree(out)
    code, err = run_main(argv + ['--column', 'content'], capsys)
    assert code == 0 and err == ''
    enc, meta = data.load_tokenizer(str(out)), data.load_meta(str(out))
    documents = [
        enc.decode(d.tolist()) for d in split_documents(all_tokens(str(out)), enc.eot_token)
    ]
    assert documents == docs[0] + docs[1]  # the train split of the subset, in order
    assert meta['source'] == 'HuggingFaceTB/finemath/finemath-3plus' and meta['revision'] == SHA
    assert meta['request']['column'] == 'content' and meta['val_tokens'] == 2000
    manifest = json.load(open(out / 'files.json'))
    expected = [p for p in sorted(hub_files) if p.startswith('finemath-3plus/train')]
    assert manifest['files'] == [
        {'path': p, 'size': len(hub_files[p]), 'sha256': sha256(hub_files[p])} for p in expected
    ]
    assert os.listdir(out / 'downloads') == []  # each deleted once tokenized
    assert {r['path'] for r in server.log} == set(expected)  # nothing else downloaded
    assert data.prepare_command(str(out)).startswith('python prepare.py hub REPO')
    code, err = run_main(
        argv[:-2] + ['--split', 'validation', '--out', str(tmp_path / 'none')], capsys
    )
    assert (
        code == 2
        and 'none of the 3 parquet files in HuggingFaceTB/finemath/finemath-3plus is named validation*'
        in err
    )
    server.shutdown()
    server.server_close()


# A listing pinned wrong, an impossible val shard, and the rate of a download that waited


def test_fineweb_wrong_sha256_pinned_in_files_json_is_listed_again(
    hub, reference, tmp_path, capsys
):
    out = tmp_path / 'fw'
    out.mkdir()
    network = downloads.Network(hub.url, backoff_s=0.001)
    sha, listed = downloads.Hub(network).files(REPO, 'main', 'sample/10BT', '.parquet')
    # a listing wrong once
    pinned = [dict(f, sha256='0' * 64) if f['path'] == LAST else f for f in listed]
    (out / 'files.json').write_text(json.dumps({'repo': REPO, 'revision': sha, 'files': pinned}))
    fineweb(hub, out)
    assert (
        f"fineweb_edu: files.json pinned {LAST} as sha256 {'0' * 64}, the Hub lists {sha256(hub.files[LAST])}: "
        f"files.json listed again at {SHA}" in capsys.readouterr().out
    )
    assert json.loads((out / 'files.json').read_text())['files'] == listed
    assert shard_bytes(out) == shard_bytes(reference)


def test_fineweb_impossible_val_tokens_is_refused_from_the_listing(hub, tmp_path):
    with pytest.raises(
        DataError, match=r'--val-tokens 5,000 is all of --tokens 5,000: nothing would be left'
    ):
        fineweb(hub, tmp_path / 'a', tokens=5000, val_tokens=5000)
    parquet = sum(len(b) for b in FINEWEB_FILES.values())
    with pytest.raises(
        DataError, match=f'--val-tokens {parquet + 1:,} is more than the 3 listed files can hold'
    ):
        fineweb(hub, tmp_path / 'b', val_tokens=parquet + 1)
    assert hub.log == []  # refused before any file was downloaded


def test_a_wait_between_tries_is_not_download_time(monkeypatch, capsys):
    now = [0.0]
    monkeypatch.setattr(downloads.time, 'monotonic', lambda: now[0])
    monkeypatch.setattr(downloads.time, 'sleep', lambda s: now.__setitem__(0, now[0] + s))
    monkeypatch.setattr(downloads, 'PROGRESS_EVERY_S', 0)
    retries = downloads.Retries('x.parquet', downloads.Network('http://127.0.0.1:9'))
    with downloads.Progress('x.parquet', 4000, unit='B') as progress:
        retries.after_wait = progress.waited_for  # as download() wires them
        now[0] += 1
        progress.update(1000)  # 1,000 bytes in 1 s
        # the server asks for a minute
        retries.wait('rate-limited by the Hub (HTTP 429)', retry_after=60)
        now[0] += 1
        progress.update(1000)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith('x.parquet:')]
    assert lines[-1].endswith('1.00kB/s]'), lines  # 2,000 bytes in 2 s of downloading, not in 62 s


def test_pool_workers_die_on_the_sigterm_pool_terminate_sends(pystdlib_data):
    """cli's SIGTERM handler raises, to unwind a command; a forked tokenizer worker must not inherit it: one blocked in
    C never runs a Python handler, and Pool.terminate's SIGTERM would then wait on it for ever."""
    # as cli sets it while a command runs
    previous = signal.signal(signal.SIGTERM, config._terminate)
    try:
        with prepare.worker_pool(1, pystdlib_data) as pool:
            assert pool.submit(signal.getsignal, signal.SIGTERM).result() == signal.SIG_DFL
        # the command's own handler is back
        assert signal.getsignal(signal.SIGTERM) is config._terminate
    finally:
        signal.signal(signal.SIGTERM, previous)


TEARDOWN_ROUNDS = """
import os, sys
import prepare
from ledgergpt.config import DataError

batch = (0, 0, *prepare.pack_texts(['word ' * 40_000] * 2))  # 400 KB: more than a pipe holds
for round in range(60):
    try:
        with prepare.worker_pool(2, sys.argv[1]) as pool:
            if round % 3 == 2:  # a worker dies
                next(prepare.pooled(pool, os._exit, [1], 1))
            results = prepare.pooled(pool, prepare.tokenize_batch, [batch] * 100, 8)
            next(results)  # the consumer stops with work out: a run's target reached
            if round % 3 == 1:
                raise ValueError('stopped')  # ... or a failure (a full disk) while work is out
    except (ValueError, DataError) as e:  # only the rounds that fail, each with its own line
        expected = {1: 'stopped', 2: 'a tokenizer process died'}.get(round % 3, 'no error')
        assert str(e).startswith(expected), (round, e)
print('rounds done', flush=True)
"""


def test_pool_comes_apart_with_work_in_flight(pystdlib_data):
    """One `prepare.py fineweb_edu` run in 44 wrote its last shard and then hung. Its
    pool was a multiprocessing.Pool, torn down with terminate(), which kills the workers while the
    pool's task thread may still be writing a batch into their pipe, and then joins that thread,
    whose write never ends. Each round here leaves the pool as a run does when it reaches --tokens
    or fails: batches larger than a pipe holds still out; every third round a worker has died too,
    a task a Pool never answers. With Pool.imap and terminate in place of the pool, this loop hung
    at the first dead worker every time, and without those rounds in 3 of 9 runs (at rounds 15 and
    54, say). The pool must come apart every round, and a dead worker is one DataError. The rounds
    run in a process of their own, so that a hang fails the test when the generous limit runs out
    (nothing is timed) instead of stalling the suite."""
    rounds = subprocess.run(
        [sys.executable, '-c', TEARDOWN_ROUNDS, pystdlib_data],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=os.path.dirname(os.path.abspath(prepare.__file__)),
    )
    assert rounds.returncode == 0 and rounds.stdout == 'rounds done\n', rounds.stderr
