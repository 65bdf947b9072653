"""
test_eval.py: evals.py downloads a HellaSwag jsonl once from a local HTTP server (resuming a dropped connection),
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
import socket
import threading

import pytest
import torch
import torch.nn.functional as F

import evals as hellaswag
import helpers
import train
from ledgergpt import checkpoint, data, downloads
from ledgergpt.config import DataError

TINY = dict(
    helpers.TINY_RUN,
    block_size=64,
    micro_batch=8,
    batch_tokens=512,
    train_tokens=20 * 512,
    log_every=10,
    ckpt_every=1000,
)

# Checked by hand: after 20 steps on Python source, the model finds "x + 1" far likelier (mean loss ~4.8 per
# token) than three runs of letters it has hardly seen (~7 each): a margin of 2 nats.
CODE_ITEM = {
    'ctx': 'def f(x):\n    return',
    'endings': ['x + 1', 'ᚠᚢᚦ ᚨᚱᚲ', 'ЖЖЖ ЖЖЖ', 'ḁḃḉ ḋḟḡ'],
    'label': 0,
}
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
    {
        'ctx': 'for i in range(10):\n   ',
        'endings': ['ḁḃḉ ḋḟḡ', 'ЖЖЖ ЖЖЖ', 'print(i)', 'ᚠᚢᚦ ᚨᚱᚲ'],
        'label': 2,
    },
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
    (path, Range header) of every request). drop_download: the second request (evals.py's first is a look at the
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
            part = (
                body[start:] if not (drop_download and len(seen) == 2) else body[: len(body) // 2]
            )
            # the size look closes early
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
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
    helpers.write_config(config, dict(TINY, data=pystdlib_data))
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
        losses.append(
            F.cross_entropy(logits[0, len(context) - 1 : -1], ids[0, len(context) :]).item()
        )
    return losses


@torch.no_grad()
def test_the_right_ending_wins_by_mean_loss(trained):
    _, model, encoding = trained
    expected = [independent_losses(model, encoding, item) for item in ITEMS]
    code = expected[0]
    assert code.index(min(code)) == CODE_ITEM['label'] and min(code[1:]) - code[0] > 1.0, code
    # all 5 items in one batch of 20 rows of different lengths, padded: the same losses as one ending at a time
    rows, starts = zip(
        *(hellaswag.render(encoding, item, model.config.block_size) for item in ITEMS), strict=True
    )
    batched = hellaswag.ending_losses(
        model, sum(rows, []), sum(starts, []), 'cpu', contextlib.nullcontext()
    )
    torch.testing.assert_close(batched, torch.tensor(sum(expected, [])), rtol=0, atol=1e-4)
    assert hellaswag.hellaswag_accuracy(model, encoding, [CODE_ITEM], 'cpu') == (1.0, 0.0, 1)
    right = sum(
        losses.index(min(losses)) == item['label']
        for losses, item in zip(expected, ITEMS, strict=True)
    )
    for batch_items in (1, 2, 8):
        accuracy, stderr, n = hellaswag.hellaswag_accuracy(
            model, encoding, ITEMS, 'cpu', batch_items=batch_items
        )
        assert (
            n == 5
            and accuracy == right / 5
            and stderr == pytest.approx(math.sqrt(accuracy * (1 - accuracy) / 5))
        )
    assert model.training is False  # as it was: load_model gives it in eval mode


@torch.no_grad()
def test_ranks_score_disjoint_slices(trained):
    """Without a process group each rank returns its own counts: over the ranks they add up to one process's,
    however unevenly 5 items divide (the topped-up copies are not counted)."""
    _, model, encoding = trained
    accuracy, _, n = hellaswag.hellaswag_accuracy(model, encoding, ITEMS, 'cpu')
    for world_size in (2, 3):  # 3, 2 | 2, 2, 1 (+ 1 uncounted copy)
        parts = [
            hellaswag.hellaswag_accuracy(
                model, encoding, ITEMS, 'cpu', rank=rank, world_size=world_size
            )
            for rank in range(world_size)
        ]
        counted = [part_n for _, _, part_n in parts]
        assert sum(counted) == n and sum(a * part_n for a, _, part_n in parts) == pytest.approx(
            accuracy * n
        )
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
        # the size, then the file; the second run reads the cache
        assert seen == [('/hellaswag_val.jsonl', None)] * 2
    out = capsys.readouterr().out
    assert (tmp_path / 'hellaswag_val.jsonl').read_bytes() == GOOD
    accuracy, stderr, n = hellaswag.hellaswag_accuracy(model, encoding, ITEMS, 'cpu')
    assert (
        out.count('HellaSwag validation, 5 items') == 2 and f'{accuracy:.2%} ± {stderr:.2%}' in out
    )
    assert 'not the whole validation set' in out and 'chance (1 in 4)' in out
    # a tiny model: the nearest published sizes are the smallest ones
    assert (
        'GPT-2 124M                          29.4%' in out
        and 'GPT-3 Small 125M                    33.7%' in out
    )


def test_a_dropped_download_resumes(tmp_path):
    """downloads.download writes a megabyte at a time: a file of 2+ MB dropped half way keeps its first megabyte and
    asks for the rest."""
    big = jsonl(ITEMS * (2 * downloads.DOWNLOAD_CHUNK_BYTES // len(GOOD) + 1))
    with http_server({'/h.jsonl': big}, drop_download=True) as (url, seen):
        path = hellaswag.download_hellaswag(url + '/h.jsonl', str(tmp_path), network=FAST)
    assert pathlib.Path(path).read_bytes() == big and len(hellaswag.load_items(path)) == len(
        big.splitlines()
    )
    assert seen == [('/h.jsonl', None)] * 2 + [
        ('/h.jsonl', f'bytes={downloads.DOWNLOAD_CHUNK_BYTES}-')
    ]


def test_the_published_file_is_checked_by_its_blob_id(tmp_path, monkeypatch):
    """For the published URL the download must be the very file (git's blob id): a corrupted one of the right size
    is downloaded again, then refused in one line."""
    with http_server({'/good': GOOD, '/bad': GOOD.replace(b'roof', b'ROOF')}) as (url, seen):
        monkeypatch.setattr(
            hellaswag,
            'HELLASWAG_GIT_SHA1',
            hashlib.sha1(b'blob %d\0' % len(GOOD) + GOOD).hexdigest(),
        )
        monkeypatch.setattr(hellaswag, 'HELLASWAG_URL', url + '/good')
        assert (
            pathlib.Path(
                hellaswag.download_hellaswag(url + '/good', str(tmp_path / 'a'), FAST)
            ).read_bytes()
            == GOOD
        )
        monkeypatch.setattr(hellaswag, 'HELLASWAG_URL', url + '/bad')
        with pytest.raises(DataError) as error:
            hellaswag.download_hellaswag(url + '/bad', str(tmp_path / 'b'), FAST)
    message = str(error.value)
    assert 'git sha1' in message and hellaswag.HELLASWAG_GIT_SHA1 in message and '\n' not in message
    assert not (tmp_path / 'b' / 'hellaswag_val.jsonl').exists()


def test_truncated_or_damaged_files_are_one_line(trained, tmp_path, capsys):
    run = trained[0]
    # the server sends all it has, but the file itself was cut mid-line
    truncated = GOOD[: len(GOOD) - 40]
    with http_server({'/cut.jsonl': truncated, '/page': b'<html>login</html>'}) as (url, _):
        assert (
            hellaswag.main(
                [run, 'hellaswag', '--url', url + '/cut.jsonl', '--cache', str(tmp_path / 'cut')]
            )
            == 2
        )
        assert (
            hellaswag.main(
                [run, 'hellaswag', '--url', url + '/page', '--cache', str(tmp_path / 'page')]
            )
            == 2
        )
        assert (
            hellaswag.main(
                [run, 'hellaswag', '--url', url + '/none', '--cache', str(tmp_path / 'none')]
            )
            == 2
        )
    damaged = tmp_path / 'damaged'
    damaged.mkdir()
    (damaged / 'hellaswag_val.jsonl').write_bytes(GOOD.replace(b'"label": 3', b'"label": 7'))
    assert hellaswag.main([run, 'hellaswag', '--cache', str(damaged)]) == 2
    errors = capsys.readouterr().err.strip().split('\n')
    assert len(errors) == 4 and all(line.startswith('error: ') for line in errors), errors
    assert 'line 5: not a HellaSwag item' in errors[0] and 'truncated' in errors[0]
    # the advice names the flag that chooses HellaSwag's URL (evals.py takes --url, not --endpoint)
    assert 'something else than the file' in errors[1] and '--url or HELLASWAG_URL' in errors[1]
    assert 'HTTP 404' in errors[2] and '--url or HELLASWAG_URL' in errors[2]
    assert 'line 2: not a HellaSwag item' in errors[3] and 'label 0..3' in errors[3]


# -----------------------------------------------------------------------------------------------------
# ARC and MMLU: the Hub's files in their real formats (allenai/ai2_arc's and cais/mmlu's parquet: the columns and
# types their dataset cards list), served by a fake Hub API on 127.0.0.1, scored item by item as a scorer written
# here from lm-evaluation-harness's rules scores them through transformers on the exported model.

SHA = '210d026faf9955653af8916fad021475a3f00453'
ARC_ROWS = [  # made up, in ai2_arc's shape: labels A-D, 1-4 or A-E; 3 to 5 choices
    {
        'id': 'Made_1',
        'question': 'A student rubs a balloon on her hair. The balloon then sticks to a wall. What causes this?',
        'choices': {
            'text': ['static electricity', 'magnetism', 'gravity', 'friction with the air'],
            'label': ['A', 'B', 'C', 'D'],
        },
        'answerKey': 'A',
    },
    {
        'id': 'Made_2',
        'question': 'Which word starts a function definition in Python?',
        'choices': {'text': ['def', 'ᚠᚢᚦᚨᚱᚲ', 'ЖЖЖЖ'], 'label': ['1', '2', '3']},
        'answerKey': '1',
    },
    {
        'id': 'Made_3',
        'question': 'What does the code print?\nfor i in range(3):\n    print(i)',
        'choices': {
            'text': ['0 1 2', 'ḁḃḉ ḋḟḡ', 'ЖЖЖ ЖЖЖ', 'ᚠᚢᚦ ᚨᚱᚲ', '1 2 3'],
            'label': ['A', 'B', 'C', 'D', 'E'],
        },
        'answerKey': 'A',
    },
    {
        'id': 'Made_4',
        'question': 'Which state of matter has a definite volume but no definite shape?',
        'choices': {'text': ['solid', 'liquid', 'gas', 'plasma'], 'label': ['A', 'B', 'C', 'D']},
        'answerKey': 'B',
    },
]


def mmlu_row(subject, i, answer):
    return {
        'question': f'  {subject.replace("_", " ").title()} question {i}: which import gives the {i}th module?  ',
        'subject': subject,
        'choices': [
            f'import os{i}',
            'ЖЖЖ',
            f'from sys import argv as a{i}',
            '' if i == 7 else 'ḁḃḉ',
        ],
        'answer': answer,
    }


MMLU_DEV = [
    mmlu_row(s, i, i % 4) for s in ('computer_security', 'machine_learning') for i in range(5)
]
MMLU_TEST = [
    mmlu_row(s, i, (i + 1) % 4)
    for s in ('computer_security', 'machine_learning')
    for i in range(5, 8)
]


def arc_parquet(rows):
    """ai2_arc's schema: id, question, choices (a struct of text and label lists), answerKey."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            ('id', pa.string()),
            ('question', pa.string()),
            (
                'choices',
                pa.struct([('text', pa.list_(pa.string())), ('label', pa.list_(pa.string()))]),
            ),
            ('answerKey', pa.string()),
        ]
    )
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), sink)
    return sink.getvalue().to_pybytes()


def mmlu_parquet(rows):
    """cais/mmlu's schema: question, subject, choices (a list of strings), answer (its ClassLabel, an int64)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            ('question', pa.string()),
            ('subject', pa.string()),
            ('choices', pa.list_(pa.string())),
            ('answer', pa.int64()),
        ]
    )
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), sink)
    return sink.getvalue().to_pybytes()


REPO_FILES = {  # as the two repos lay them out: one folder per config, {split}-00000-of-00001.parquet
    'allenai/ai2_arc': {
        f'ARC-{level}/{split}-00000-of-00001.parquet': arc_parquet(
            ARC_ROWS if split == 'test' else ARC_ROWS[:1]
        )
        for level in ('Easy', 'Challenge')
        for split in ('train', 'validation', 'test')
    },
    'cais/mmlu': {
        'all/auxiliary_train-00000-of-00001.parquet': mmlu_parquet(MMLU_DEV),
        'all/dev-00000-of-00001.parquet': mmlu_parquet(MMLU_DEV),
        'all/test-00000-of-00001.parquet': mmlu_parquet(MMLU_TEST),
        'all/validation-00000-of-00001.parquet': mmlu_parquet(MMLU_DEV[:2]),
        'abstract_algebra/test-00000-of-00001.parquet': mmlu_parquet(MMLU_TEST[:1]),
    },
}


def fake_hub(repo_files=REPO_FILES):
    """{URL path: body} of the Hub's API and files for the repos: the revision, each folder's listing (files in LFS:
    the sha256 as the oid), and each file under /datasets/{repo}/resolve/{sha}/."""
    served = {}
    for repo, files in repo_files.items():
        served[f'/api/datasets/{repo}/revision/main'] = json.dumps({'sha': SHA}).encode()
        for folder in {path.split('/')[0] for path in files}:
            listing = [
                {
                    'type': 'file',
                    'path': path,
                    'size': 134,
                    'oid': 'git-sha1',
                    'lfs': {
                        'oid': hashlib.sha256(body).hexdigest(),
                        'size': len(body),
                        'pointerSize': 134,
                    },
                }
                for path, body in sorted(files.items())
                if path.startswith(folder + '/')
            ]
            served[f'/api/datasets/{repo}/tree/{SHA}/{folder}'] = json.dumps(listing).encode()
        for path, body in files.items():
            served[f'/datasets/{repo}/resolve/{SHA}/{path}'] = body
    return served


def test_task_files_come_from_the_hub_once(tmp_path, monkeypatch):
    """Each task's split files are listed, downloaded (sha256-checked) and kept; the others (train, validation,
    auxiliary_train) never fetched; a second call reads the cache without a request."""
    with http_server(fake_hub()) as (url, seen):
        monkeypatch.setenv('HF_ENDPOINT', url)
        items = {task: hellaswag.task_items(task, str(tmp_path)) for task in hellaswag.HUB_TASKS}
        downloads_made = sorted(
            path.rsplit('/', 2)[-2] + '/' + path.rsplit('/', 1)[-1] for path, _ in seen
        )
        seen.clear()
        again = {task: hellaswag.task_items(task, str(tmp_path)) for task in hellaswag.HUB_TASKS}
        assert seen == [] and again == items
    files = [p for p in downloads_made if p.endswith('.parquet')]
    assert files == [
        'ARC-Challenge/test-00000-of-00001.parquet',
        'ARC-Easy/test-00000-of-00001.parquet',
        'all/dev-00000-of-00001.parquet',
        'all/test-00000-of-00001.parquet',
    ]
    assert (tmp_path / 'cais--mmlu' / 'all' / 'dev.parquet').read_bytes() == REPO_FILES[
        'cais/mmlu'
    ]['all/dev-00000-of-00001.parquet']
    arc = items['arc_easy']
    assert [item['label'] for item in arc] == [0, 0, 0, 1] and [
        len(item['choices']) for item in arc
    ] == [4, 3, 5, 4]
    assert arc[2]['context'] == f"Question: {ARC_ROWS[2]['question']}\nAnswer:"
    zero, five = items['mmlu'], items['mmlu_5shot']
    assert len(zero) == len(five) == 6 and [item['label'] for item in zero] == [
        r['answer'] for r in MMLU_TEST
    ]
    first = MMLU_TEST[0]
    assert zero[0]['context'] == (
        "The following are questions (with answers) about computer security.\n\n"
        f"Question: {first['question'].strip()}\nAnswer:"
    )
    # the machine_learning dev rows, in the file's order, before a machine_learning question
    shots = ''.join(
        f"Question: {row['question'].strip()}\nAnswer: {row['choices'][row['answer']]}\n\n"
        for row in MMLU_DEV[5:]
    )
    assert five[3]['context'] == (
        "The following are questions (with answers) about machine learning.\n\n"
        + shots
        + f"Question: {MMLU_TEST[3]['question'].strip()}\nAnswer:"
    )


def test_predictions_follow_the_harness_rules():
    """acc: the highest log-likelihood; acc_norm: the highest per character of the choice (not per token); the
    first of equals wins (numpy's argmax); an empty choice never wins acc_norm (the harness divides by zero)."""
    item = {'choices': ['a', 'bbbb', 'cc', '']}
    # -2/1, -4/4 = -1, -3/2: 'bbbb'
    assert hellaswag.predictions(item, [-2.0, -4.0, -3.0, -0.5]) == (3, 1)
    assert hellaswag.predictions({'choices': ['ab', 'cd']}, [-1.0, -1.0]) == (0, 0)


@pytest.fixture(scope='module')
def task_items(tmp_path_factory):
    """{task: items} parsed from the real-format files, put where the cache keeps them."""
    cache = tmp_path_factory.mktemp('task_cache')
    for spec in hellaswag.HUB_TASKS.values():
        for split in ('test', 'dev'):
            body = REPO_FILES[spec.repo].get(f'{spec.folder}/{split}-00000-of-00001.parquet')
            path = pathlib.Path(hellaswag.hub_task_path(spec.repo, spec.folder, split, str(cache)))
            path.parent.mkdir(parents=True, exist_ok=True)
            if body:  # ARC has no dev split
                path.write_bytes(body)
    return str(cache), {
        task: hellaswag.task_items(task, str(cache)) for task in hellaswag.HUB_TASKS
    }


def harness_loglikelihoods(hf, tokenizer, context, choices, max_length):
    """Each choice's log-likelihood as lm-evaluation-harness's HFLM computes it (v0.4: _encode_pair, then
    _loglikelihood_tokens), written from its rules: the continuation is target_delimiter ' ' + the choice; trailing
    spaces of the context move to the continuation; the continuation's tokens are encode(context + continuation)
    after len(encode(context)) (no special tokens); the input is the last max_length + 1 tokens minus the last one;
    the last len(continuation) positions' log-softmax is summed at the continuation's tokens."""
    scores = []
    for choice in choices:
        continuation, spaces = ' ' + choice, len(context) - len(context.rstrip())
        ctx, continuation = (
            (context[:-spaces], context[-spaces:] + continuation)
            if spaces
            else (context, continuation)
        )
        whole = tokenizer(ctx + continuation, add_special_tokens=False).input_ids
        context_enc = tokenizer(ctx, add_special_tokens=False).input_ids
        continuation_enc = whole[len(context_enc) :]
        inp = torch.tensor([(context_enc + continuation_enc)[-(max_length + 1) :][:-1]])
        logprobs = F.log_softmax(hf(inp).logits[0].float(), dim=-1)[-len(continuation_enc) :]
        scores.append(logprobs.gather(1, torch.tensor(continuation_enc)[:, None]).sum().item())
    return scores


@torch.no_grad()
def test_choices_agree_with_a_reference_scorer(trained, task_items, tmp_path):
    """The harness's rules, run through transformers on export.py's folder, choose what evals.py chooses, item by
    item, for acc and acc_norm, on every task (MMLU 5-shot's rows are cut to the context, as the harness cuts)."""
    import numpy as np
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import export

    run, model, encoding = trained
    assert export.main([run, str(tmp_path / 'hf'), '--dtype', 'float32']) == 0
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / 'hf').eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / 'hf')
    max_length = hf.config.max_position_embeddings
    block_size = model.config.block_size
    cut = 0
    for task, items in task_items[1].items():
        ours = hellaswag.choice_logprobs(model, encoding, items, 'cpu', batch_items=3)
        for item, scores in zip(items, ours, strict=True):
            reference = harness_loglikelihoods(
                hf, tokenizer, item['context'], item['choices'], max_length
            )
            lengths = np.array([float(len(choice)) for choice in item['choices']])
            with np.errstate(divide='ignore'):
                expected = (
                    int(np.argmax(reference)),
                    int(np.argmax(np.array(reference) / lengths)),
                )
            assert hellaswag.predictions(item, scores) == expected, (task, item['context'])
            np.testing.assert_allclose(scores, reference, rtol=0, atol=2e-3)
            cut += len(tokenizer(item['context']).input_ids) > block_size
    # every 5-shot context is longer than the model's 64 tokens: the cut was compared too
    assert cut >= 6


@torch.no_grad()
def test_task_scores_count_right_on_any_number_of_ranks(trained, task_items):
    _, model, encoding = trained
    for task, items in task_items[1].items():
        chosen = [
            hellaswag.predictions(item, scores)
            for item, scores in zip(
                items, hellaswag.choice_logprobs(model, encoding, items, 'cpu'), strict=True
            )
        ]
        score = hellaswag.task_accuracy(model, encoding, items, 'cpu', batch_items=2)
        n = len(items)
        acc = sum(pred == item['label'] for (pred, _), item in zip(chosen, items, strict=True)) / n
        acc_norm = (
            sum(pred == item['label'] for (_, pred), item in zip(chosen, items, strict=True)) / n
        )
        assert (
            score['items'] == n
            and score['acc'] == pytest.approx(acc)
            and score['acc_norm'] == pytest.approx(acc_norm)
        )
        assert score['acc_stderr'] == pytest.approx(math.sqrt(acc * (1 - acc) / n))
        assert score['chance'] == pytest.approx(sum(1 / len(item['choices']) for item in items) / n)
        # two subjects of 3 items: the macro average is the micro one here
        if task.startswith('mmlu'):
            right = [pred == item['label'] for (pred, _), item in zip(chosen, items, strict=True)]
            assert score['acc_macro'] == pytest.approx(
                (sum(right[:3]) / 3 + sum(right[3:]) / 3) / 2
            )
        else:
            assert 'acc_macro' not in score and score['chance'] == pytest.approx(
                (1 / 4 + 1 / 3 + 1 / 5 + 1 / 4) / 4
            )
        for world_size in (2, 3):  # ARC's 4 items over 3 ranks: 2, 2 and none
            parts = [
                hellaswag.task_accuracy(
                    model, encoding, items, 'cpu', rank=rank, world_size=world_size
                )
                for rank in range(world_size)
            ]
            assert sum(part['items'] for part in parts) == n
            assert sum(part['acc'] * part['items'] for part in parts) == pytest.approx(acc * n)
            assert sum(part['acc_norm'] * part['items'] for part in parts) == pytest.approx(
                acc_norm * n
            )


def numbers(text):
    """The report's lines without their rates (items/s differ from run to run)."""
    return [re.sub(r', [\d,]+ items/s on \d+ x \w+', '', line) for line in text.splitlines()]


def test_all_runs_the_suite_against_the_hub(trained, task_items, tmp_path, capsys, monkeypatch):
    """`evals.py RUN all`: HellaSwag from its URL, ARC and MMLU from the (fake) Hub, each downloaded once; every
    task's report holds what task_accuracy computes, the chance, and the published figures with their sources."""
    run, model, encoding = trained
    served = dict(fake_hub(), **{'/hellaswag_val.jsonl': GOOD})
    with http_server(served) as (url, seen):
        monkeypatch.setenv('HF_ENDPOINT', url)
        monkeypatch.setenv('HELLASWAG_URL', url + '/hellaswag_val.jsonl')
        assert hellaswag.main([run, 'all', '--cache', str(tmp_path), '--batch', '3']) == 0
        first, downloaded = len(seen), capsys.readouterr().out
        assert hellaswag.main([run, 'all', '--cache', str(tmp_path)]) == 0
        assert len(seen) == first  # the second run reads the cache only
    out = capsys.readouterr().out
    said = re.compile(r'\S+: [\d.]+ \w*B in \d+ s')  # downloads.py's line for each file downloaded
    # batched or not
    assert [line for line in numbers(downloaded) if not said.match(line)] == numbers(out)
    assert 'HellaSwag validation, 5 items' in out
    path = checkpoint.find(run)
    for task, items in task_items[1].items():
        score = hellaswag.task_accuracy(model, encoding, items, 'cpu')
        spec = hellaswag.HUB_TASKS[task]
        assert (
            f"{spec.title}, {len(items)} items (lm-evaluation-harness's {spec.harness}, cloze), {path}: "
            f"acc {score['acc']:.2%} ± {score['acc_stderr']:.2%}, acc_norm {score['acc_norm']:.2%} ± "
            f"{score['acc_norm_stderr']:.2%} (standard errors)"
        ) in out
        assert f"{'chance (1 in its choices)':<34} {score['chance']:6.1%}" in out
    assert out.count('not the whole test split') == 4
    assert (
        f"{'GPT-3 Small 125M':<34}  43.6%   (GPT-3 zero-shot, unconditional norm. (Brown et al. 2020, Table H.1))"
        in out
    )
    assert (
        f"{'GPT-3 Small 2.7B':<34}  25.9%   (GPT-3 5-shot, letter answers (Hendrycks et al. 2021, Table 1))"
        in out
    )
    assert (
        f"{'FineWeb-Edu 1.71B, 350B tokens':<34}  37.0%" in out
        and 'over its subjects (macro)' in out
    )


def test_bad_task_files_are_one_line(trained, tmp_path, capsys, monkeypatch):
    run = trained[0]
    # 'E' is not among its labels 1-3
    bad_answer = [dict(ARC_ROWS[0]), dict(ARC_ROWS[1], answerKey='E')]
    cases = {
        'answer': arc_parquet(bad_answer),
        'damaged': REPO_FILES['allenai/ai2_arc']['ARC-Easy/test-00000-of-00001.parquet'][:-100],
    }
    for name, body in cases.items():
        path = pathlib.Path(
            hellaswag.hub_task_path('allenai/ai2_arc', 'ARC-Easy', 'test', str(tmp_path / name))
        )
        path.parent.mkdir(parents=True)
        path.write_bytes(body)
        assert hellaswag.main([run, 'arc_easy', '--cache', str(tmp_path / name)]) == 2
    with http_server(fake_hub({'cais/mmlu': {'other/test-00000-of-00001.parquet': b'PAR1'}})) as (
        url,
        _,
    ):
        monkeypatch.setenv('HF_ENDPOINT', url)  # the Hub has no folder 'all' in cais/mmlu
        assert hellaswag.main([run, 'mmlu', '--cache', str(tmp_path / 'none')]) == 2
    errors = capsys.readouterr().err.strip().split('\n')
    assert len(errors) == 3 and all(line.startswith('error: ') for line in errors), errors
    assert 'row 2: not an ARC item' in errors[0]
    assert 'not a parquet file' in errors[1] and 'delete it and rerun' in errors[1]
    assert 'HTTP 404' in errors[2] and errors[2].endswith('check --endpoint')  # evals.py's flag


def test_an_unreachable_hub_is_one_line_naming_a_flag_evals_takes(
    trained, tmp_path, capsys, monkeypatch
):
    """The Hub unreachable: downloads.py's tries, then one line whose advice names what evals.py
    takes: --endpoint (over HF_ENDPOINT), not a flag of another command."""
    monkeypatch.setattr(downloads.time, 'sleep', lambda seconds: None)  # the waits between tries
    monkeypatch.delenv('HF_ENDPOINT', raising=False)
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(('127.0.0.1', 0))
        dead = f'http://127.0.0.1:{closed.getsockname()[1]}'
    args = [trained[0], 'arc_easy', '--cache', str(tmp_path), '--endpoint', dead]
    assert hellaswag.main(args) == 2
    [error] = capsys.readouterr().err.strip().splitlines()
    assert error.startswith(f'error: {dead}/api/datasets/allenai/ai2_arc/') and 'refused' in error
    assert re.findall(r'--[a-z-]+', error) == ['--endpoint']


def test_torchrun_slices_the_suite_over_ranks(trained, task_items, capsys):
    """Two gloo processes, each scoring its slice of every task, print what one process prints."""
    import os
    import subprocess
    import sys

    run, cache = trained[0], task_items[0]
    pathlib.Path(hellaswag.hellaswag_path(cache)).write_bytes(GOOD)
    assert hellaswag.main([run, 'all', '--cache', cache, '--device', 'cpu']) == 0
    one = capsys.readouterr().out
    result = subprocess.run(
        [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2']
        + ['evals.py', run, 'all', '--cache', cache, '--device', 'cpu'],
        cwd=str(pathlib.Path(__file__).resolve().parent.parent),
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS='1'),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'on 2 x cpu' in result.stdout and result.stdout.count('(standard error') == 5
    assert numbers(one) == numbers(result.stdout)


def test_training_scores_the_tasks_into_metrics_and_the_plot(pystdlib_data, tmp_path, monkeypatch):
    """eval_tasks_every and hellaswag_every: train.py scores the named tasks at those steps and at the end, on their
    first eval_tasks_items (hellaswag_items) items, into metrics.jsonl (each task's headline figure under its name,
    as 'hellaswag'), and plot.py draws them on the scores' axis."""
    from ledgergpt import plot

    config = tmp_path / 'tiny.py'
    helpers.write_config(config, dict(TINY, data=pystdlib_data))
    with http_server({**fake_hub(), '/hellaswag_val.jsonl': GOOD}) as (url, _):
        monkeypatch.setenv('HF_ENDPOINT', url)
        monkeypatch.setenv('HELLASWAG_URL', url + '/hellaswag_val.jsonl')
        # HellaSwag's file: downloaded here
        monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
        flags = [
            '--max_steps=3',
            '--dtype=float32',
            '--eval_tasks=arc_challenge,mmlu_5shot',
            '--eval_tasks_every=2',
        ]
        flags += ['--eval_tasks_items=3', '--hellaswag_every=2', '--hellaswag_items=4']
        assert train.main([str(config), f'--out_dir={tmp_path / "run"}', *flags]) == 0
    with open(tmp_path / 'run' / 'metrics.jsonl') as f:
        entries = list(map(json.loads, f))
    scored = [e for e in entries if 'arc_challenge' in e]
    assert [e['step'] for e in scored] == [2, 3] and all(e['mmlu_5shot_items'] == 3 for e in scored)
    # the step-3 model: its score
    model, _ = checkpoint.load_model(str(tmp_path / 'run'), torch.device('cpu'))
    accuracy, _, _ = hellaswag.hellaswag_accuracy(
        model, data.load_tokenizer(pystdlib_data), ITEMS[:4], 'cpu'
    )
    swag = [e for e in entries if 'hellaswag' in e]
    assert [(e['step'], e['hellaswag_items']) for e in swag] == [(2, 4), (3, 4)] and swag[-1][
        'hellaswag'
    ] == accuracy
    last = scored[-1]
    assert (
        last['arc_challenge'] == last['arc_challenge_acc_norm']
        and last['mmlu_5shot'] == last['mmlu_5shot_acc']
    )
    assert last['arc_challenge_stderr'] == pytest.approx(
        math.sqrt(last['arc_challenge'] * (1 - last['arc_challenge']) / 3)
    )
    run = plot.read_run(str(tmp_path / 'run'))
    assert sorted(run['scores']) == ['arc_challenge', 'hellaswag', 'mmlu_5shot'] and list(
        run['scores']['mmlu_5shot'][0]
    ) == [2 * 512, 3 * 512]
    labels = [
        container.get_label()
        for container in plot.figure([str(tmp_path / 'run')]).axes[1].containers
    ]
    assert labels == ['run HellaSwag', 'run ARC-Challenge acc_norm', 'run MMLU 5-shot acc']


def test_the_command_frees_its_model_before_it_leaves_the_process_group(
    trained, tmp_path, monkeypatch
):
    """gloo work left to the interpreter's teardown can abort a process at exit (SIGABRT, "terminate called without
    an active exception": rank 1 of the torchrun test above, on a loaded machine). evals.py ends as train.py does
    (processes.leave_process_group): its model dropped and collected first, then the process group."""
    import weakref

    from ledgergpt import processes

    run = trained[0]
    (tmp_path / 'hellaswag_val.jsonl').write_bytes(GOOD)
    models, load_model = [], checkpoint.load_model

    def remembered(path, device):
        model, train_config = load_model(path, device)
        models.append(weakref.ref(model))
        return model, train_config

    alive, leave = [], processes.leave_process_group

    def leaving():
        leave()
        alive.append(models[0]() is not None)  # collected by then, or still held by evals.py

    monkeypatch.setattr(checkpoint, 'load_model', remembered)
    monkeypatch.setattr(processes, 'leave_process_group', leaving)
    assert hellaswag.main([run, 'hellaswag', '--cache', str(tmp_path)]) == 0
    assert alive == [False]
