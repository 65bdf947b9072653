"""
test_eval.py: eval.py downloads a HellaSwag jsonl once from a local HTTP server (resuming a dropped connection),
scores each item by the mean loss of its endings exactly as an independent computation does, batched or not, on
one rank or sliced over several, and prints accuracy with its standard error beside the published figures. A
truncated, corrupted or damaged file is one line.
"""

import contextlib
import hashlib
import http.server
import json
import math
import pathlib
import re
import threading

import pytest
import torch
import torch.nn.functional as F

import checkpoint
import data
import downloads
import eval as hellaswag  # `eval` is also a builtin: a name of our own keeps the two apart
import train
from config import DataError

TINY = dict(
    arch='llama',
    n_layer=2,
    n_head=2,
    n_embd=64,
    vocab_size=512,
    block_size=64,
    micro_batch=8,
    batch_tokens=512,
    train_tokens=20 * 512,
    lr=3e-3,
    warmup_frac=0.1,
    compile=False,
    log_every=10,
    eval_every=1000,
    eval_tokens=1024,
    ckpt_every=1000,
)

# Checked by hand: after 20 steps on Python source, the model finds "x + 1" far likelier (mean loss ~4.8 per
# token) than three runs of letters it has hardly seen (~7 each): a margin of 2 nats.
CODE_ITEM = {'ctx': 'def f(x):\n    return', 'endings': ['x + 1', 'ᚠᚢᚦ ᚨᚱᚲ', 'ЖЖЖ ЖЖЖ', 'ḁḃḉ ḋḟḡ'], 'label': 0}
ITEMS = [
    CODE_ITEM,
    {
        'ctx': 'A man is sitting on a roof. he',
        'label': 3,
        'endings': [
            'is using wrap to wrap a pair of skis.',
            'is ripping level tiles off.',
            "is holding a rubik's cube.",
            'starts pulling up roofing on a roof.',
        ],
    },
    {
        'ctx': 'The chef cracks two eggs into a bowl. She',
        'label': 0,
        'endings': [
            'whisks them with a fork.',
            'paints the bowl blue.',
            'throws the bowl at the wall.',
            'reads a newspaper.',
        ],
    },
    {'ctx': 'import os\nimport', 'endings': ['sys', 'ᚠᚢᚦᚨᚱᚲ', 'ЖЖЖЖЖЖ', 'ḁḃḉḋḟḡ'], 'label': 0},
    {'ctx': 'for i in range(10):\n   ', 'endings': ['ḁḃḉ ḋḟḡ', 'ЖЖЖ ЖЖЖ', 'print(i)', 'ᚠᚢᚦ ᚨᚱᚲ'], 'label': 2},
]


def jsonl(items):
    """Items in HellaSwag's own format (its other keys included), one JSON object per line."""
    return ''.join(
        json.dumps(
            {
                'ind': i,
                'activity_label': 'test',
                'ctx_a': item['ctx'],
                'ctx_b': '',
                **item,
                'split': 'val',
                'split_type': 'indomain',
                'source_id': 'test',
            }
        )
        + '\n'
        for i, item in enumerate(items)
    ).encode()


GOOD = jsonl(ITEMS)


@contextlib.contextmanager
def http_server(files, drop_download=False):
    """Serve {path: bytes} on 127.0.0.1, answering Range requests with 206 as GitHub does; yields (base URL, the
    (path, Range header) of every request). drop_download: the second request (eval.py's first is a look at the
    size) sends half of the file, then closes the connection."""
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get('Range')))
            body = files.get(self.path)
            if body is None:
                return self.send_error(404)
            ranged = re.fullmatch(r'bytes=(\d+)-', self.headers.get('Range') or '')
            start = int(ranged[1]) if ranged else 0
            self.send_response(206 if ranged else 200)
            if ranged:
                self.send_header('Content-Range', f'bytes {start}-{len(body) - 1}/{len(body)}')
            self.send_header('Content-Length', str(len(body) - start))
            self.end_headers()
            part = body[start:] if not (drop_download and len(seen) == 2) else body[: len(body) // 2]
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the size look closes early
                self.wfile.write(part)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f'http://127.0.0.1:{server.server_address[1]}', seen
    finally:
        server.shutdown()
        server.server_close()


FAST = downloads.Network(backoff_s=0.01)  # retries without the real second of waiting


@pytest.fixture(scope='module')
def trained(tmp_path_factory, pystdlib_data):
    """(run folder, model, encoding): a tiny Llama trained for 20 steps by train.py on the pystdlib fixture."""
    tmp = tmp_path_factory.mktemp('hellaswag_run')
    config = tmp / 'tiny.py'
    config.write_text(''.join(f'{k} = {v!r}\n' for k, v in dict(TINY, data=pystdlib_data).items()))
    assert train.main([str(config), f'--out_dir={tmp / "run"}']) == 0
    model, _ = checkpoint.load_model(str(tmp / 'run'), torch.device('cpu'))
    return str(tmp / 'run'), model, data.load_tokenizer(pystdlib_data)


def independent_losses(model, encoding, item):
    """Each ending's mean cross-entropy, one ending at a time, straight from the definition."""
    context = encoding.encode_ordinary(item['ctx'])
    losses = []
    for ending in item['endings']:
        ids = torch.tensor([context + encoding.encode_ordinary(' ' + ending)])
        logits, _ = model(ids)
        losses.append(F.cross_entropy(logits[0, len(context) - 1 : -1], ids[0, len(context) :]).item())
    return losses


@torch.no_grad()
def test_the_right_ending_wins_by_mean_loss(trained):
    _, model, encoding = trained
    expected = [independent_losses(model, encoding, item) for item in ITEMS]
    code = expected[0]
    assert code.index(min(code)) == CODE_ITEM['label'] and min(code[1:]) - code[0] > 1.0, code
    # all 5 items in one batch of 20 rows of different lengths, padded: the same losses as one ending at a time
    rows, starts = zip(*(hellaswag.render(encoding, item, model.config.block_size) for item in ITEMS), strict=True)
    batched = hellaswag.ending_losses(model, sum(rows, []), sum(starts, []), 'cpu', contextlib.nullcontext())
    torch.testing.assert_close(batched, torch.tensor(sum(expected, [])), rtol=0, atol=1e-4)
    assert hellaswag.hellaswag_accuracy(model, encoding, [CODE_ITEM], 'cpu') == (1.0, 0.0, 1)
    right = sum(losses.index(min(losses)) == item['label'] for losses, item in zip(expected, ITEMS, strict=True))
    for batch_items in (1, 2, 8):
        accuracy, stderr, n = hellaswag.hellaswag_accuracy(model, encoding, ITEMS, 'cpu', batch_items=batch_items)
        assert n == 5 and accuracy == right / 5 and stderr == pytest.approx(math.sqrt(accuracy * (1 - accuracy) / 5))
    assert model.training is False  # as it was: load_model gives it in eval mode


@torch.no_grad()
def test_ranks_score_disjoint_slices(trained):
    """Without a process group each rank returns its own counts: over the ranks they add up to one process's,
    however unevenly 5 items divide (the topped-up copies are not counted)."""
    _, model, encoding = trained
    accuracy, _, n = hellaswag.hellaswag_accuracy(model, encoding, ITEMS, 'cpu')
    for world_size in (2, 3):  # 3, 2 | 2, 2, 1 (+ 1 uncounted copy)
        parts = [
            hellaswag.hellaswag_accuracy(model, encoding, ITEMS, 'cpu', rank=rank, world_size=world_size)
            for rank in range(world_size)
        ]
        counted = [part_n for _, _, part_n in parts]
        assert sum(counted) == n and sum(a * part_n for a, _, part_n in parts) == pytest.approx(accuracy * n)
        assert counted[0] == math.ceil(n / world_size)


def test_long_rows_lose_context_from_the_left(trained):
    _, _, encoding = trained
    item = ITEMS[1]
    rows, starts = hellaswag.render(encoding, item, block_size=8)
    context = encoding.encode_ordinary(item['ctx'])
    for row, start, ending in zip(rows, starts, item['endings'], strict=True):
        whole = context + encoding.encode_ordinary(' ' + ending)
        assert row == whole[-8:] and start == max(1, len(context) - (len(whole) - 8))


def test_command_downloads_once_and_reports(trained, tmp_path, capsys, monkeypatch):
    run, model, encoding = trained
    with http_server({'/hellaswag_val.jsonl': GOOD}) as (url, seen):
        monkeypatch.setenv('HELLASWAG_URL', url + '/hellaswag_val.jsonl')
        for _ in range(2):
            assert hellaswag.main([run, 'hellaswag', '--cache', str(tmp_path), '--batch', '3']) == 0
        assert seen == [('/hellaswag_val.jsonl', None)] * 2  # the size, then the file; the second run reads the cache
    out = capsys.readouterr().out
    assert (tmp_path / 'hellaswag_val.jsonl').read_bytes() == GOOD
    accuracy, stderr, n = hellaswag.hellaswag_accuracy(model, encoding, ITEMS, 'cpu')
    assert out.count('HellaSwag validation, 5 items') == 2 and f'{accuracy:.2%} ± {stderr:.2%}' in out
    assert 'not the whole validation set' in out and 'chance (1 in 4)' in out
    # a tiny model: the nearest published sizes are the smallest ones
    assert 'GPT-2 124M                          29.4%' in out and 'GPT-3 Small 125M                    33.7%' in out


def test_a_dropped_download_resumes(tmp_path):
    """downloads.download writes a megabyte at a time: a file of 2+ MB dropped half way keeps its first megabyte and
    asks for the rest."""
    big = jsonl(ITEMS * (2 * downloads.DOWNLOAD_CHUNK_BYTES // len(GOOD) + 1))
    with http_server({'/h.jsonl': big}, drop_download=True) as (url, seen):
        path = hellaswag.download_hellaswag(url + '/h.jsonl', str(tmp_path), network=FAST)
    assert pathlib.Path(path).read_bytes() == big and len(hellaswag.load_items(path)) == len(big.splitlines())
    assert seen == [('/h.jsonl', None)] * 2 + [('/h.jsonl', f'bytes={downloads.DOWNLOAD_CHUNK_BYTES}-')]


def test_the_published_file_is_checked_by_its_blob_id(tmp_path, monkeypatch):
    """For the published URL the download must be the very file (git's blob id): a corrupted one of the right size
    is downloaded again, then refused in one line."""
    with http_server({'/good': GOOD, '/bad': GOOD.replace(b'roof', b'ROOF')}) as (url, seen):
        monkeypatch.setattr(hellaswag, 'HELLASWAG_GIT_SHA1', hashlib.sha1(b'blob %d\0' % len(GOOD) + GOOD).hexdigest())
        monkeypatch.setattr(hellaswag, 'HELLASWAG_URL', url + '/good')
        assert pathlib.Path(hellaswag.download_hellaswag(url + '/good', str(tmp_path / 'a'), FAST)).read_bytes() == GOOD
        monkeypatch.setattr(hellaswag, 'HELLASWAG_URL', url + '/bad')
        with pytest.raises(DataError) as error:
            hellaswag.download_hellaswag(url + '/bad', str(tmp_path / 'b'), FAST)
    message = str(error.value)
    assert 'git sha1' in message and hellaswag.HELLASWAG_GIT_SHA1 in message and '\n' not in message
    assert not (tmp_path / 'b' / 'hellaswag_val.jsonl').exists()


def test_truncated_or_damaged_files_are_one_line(trained, tmp_path, capsys):
    run = trained[0]
    truncated = GOOD[: len(GOOD) - 40]  # the server sends all it has, but the file itself was cut mid-line
    with http_server({'/cut.jsonl': truncated, '/page': b'<html>login</html>'}) as (url, _):
        assert hellaswag.main([run, 'hellaswag', '--url', url + '/cut.jsonl', '--cache', str(tmp_path / 'cut')]) == 2
        assert hellaswag.main([run, 'hellaswag', '--url', url + '/page', '--cache', str(tmp_path / 'page')]) == 2
        assert hellaswag.main([run, 'hellaswag', '--url', url + '/none', '--cache', str(tmp_path / 'none')]) == 2
    damaged = tmp_path / 'damaged'
    damaged.mkdir()
    (damaged / 'hellaswag_val.jsonl').write_bytes(GOOD.replace(b'"label": 3', b'"label": 7'))
    assert hellaswag.main([run, 'hellaswag', '--cache', str(damaged)]) == 2
    errors = capsys.readouterr().err.strip().split('\n')
    assert len(errors) == 4 and all(line.startswith('error: ') for line in errors), errors
    assert 'line 5: not a HellaSwag item' in errors[0] and 'truncated' in errors[0]
    assert 'something else than the file' in errors[1]
    assert 'HTTP 404' in errors[2]
    assert 'line 2: not a HellaSwag item' in errors[3] and 'label 0..3' in errors[3]
