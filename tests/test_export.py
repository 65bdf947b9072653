"""
test_export.py: export.py's folder loads in transformers (LlamaForCausalLM, GPT2LMHeadModel) and computes what our
model computes: the same logits in fp32, the same greedy tokens, the same token ids for any text; for both
families, tied and untied, GQA and not, with a padded vocab. A run trained by train.py generates, in transformers,
the text sample.py prints. Bad input is one line.
"""

import base64
import dataclasses
import hashlib
import http.server
import json
import os
import re
import threading

import numpy as np
import pytest
import tiktoken
import torch
from safetensors.torch import load_file
from tiktoken_ext.openai_public import r50k_pat_str
from transformers import AutoModelForCausalLM, AutoTokenizer

import export
import sample
import train
from ledgergpt import checkpoint, data
from ledgergpt.config import ConfigError, ModelConfig, TrainConfig, UserError
from model import GPT

TINY = dict(n_layer=2, n_head=4, n_embd=64, vocab_size=512, block_size=32)
VARIANTS = {  # on the 512-token pystdlib fixture
    'llama, GQA, untied, vocab padded to 640': dict(
        arch='llama', n_kv_head=2, vocab_size=640, rope_theta=500.0, norm_eps=1e-6
    ),
    'llama, tied, multi-head': dict(arch='llama', tie_embeddings=True),
    'gpt2, tied, biases': dict(arch='gpt2', tie_embeddings=True, bias=True),
    'gpt2, untied, no biases (zeros in HF)': dict(arch='gpt2', bias=False, ffn_hidden=96),
    # parts: the Hugging Face class that holds them (config.PARTS)
    'llama, learned QK-norm, GQA (a Qwen3)': dict(arch='llama', qk_norm='learned', n_kv_head=2),
    'llama, weightless QK-norm (a Qwen3 with gains of 1)': dict(arch='llama', qk_norm='weightless'),
    'gpt2, ReLU² MLP (activation relu2)': dict(
        arch='gpt2', mlp='relu2', tie_embeddings=True, bias=True
    ),
    'llama, ReLU² MLP, GQA (an Arcee)': dict(arch='llama', mlp='relu2', n_kv_head=2),
}
TEXT = (
    "def f(x):\n\treturn x ** 2  # 12345 6789\r\n\r\n    don't I'LL we've\n"
    "héllo wörld — 日本語のテキスト 🤖🚀 ñ\u00a0é<|endoftext|>import os   \n\n\n  end"
)


def save_run(out_dir, model_config, data, seed=0):
    """A model with every tensor distinct (norm weights and biases moved off their init of 1 and 0), saved the way
    train.py saves one (checkpoint.save; step 0 holds the model alone)."""
    torch.manual_seed(seed)
    model = GPT(ModelConfig(**model_config))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    state = {
        'run': {},
        'model_config': dataclasses.asdict(model.config),
        'train_config': dataclasses.asdict(TrainConfig(data=data, out_dir=str(out_dir))),
    }
    checkpoint.save(str(out_dir), 0, model, torch.optim.AdamW(model.parameters()), state, keep=1)
    return model


@pytest.fixture(params=list(VARIANTS), scope='module')
def exported(request, tmp_path_factory, pystdlib_data):
    """(our model, the exported transformers model, its tokenizer, the export folder) per variant, in fp32."""
    tmp = tmp_path_factory.mktemp('export')
    ours = save_run(tmp / 'run', dict(TINY, **VARIANTS[request.param]), pystdlib_data)
    assert export.main([str(tmp / 'run'), str(tmp / 'hf'), '--dtype', 'float32']) == 0
    hf = AutoModelForCausalLM.from_pretrained(tmp / 'hf').eval()
    return ours, hf, AutoTokenizer.from_pretrained(tmp / 'hf'), tmp / 'hf'


def test_same_logits_in_fp32(exported):
    ours, hf, _, folder = exported
    expected = {'gpt2': 'GPT2LMHeadModel', 'llama': 'LlamaForCausalLM'}[ours.config.arch]
    if ours.config.qk_norm != 'none':
        expected = 'Qwen3ForCausalLM'
    if ours.config.arch == 'llama' and ours.config.mlp == 'relu2':
        expected = 'ArceeForCausalLM'
    assert type(hf).__name__ == expected and hf.dtype == torch.float32
    assert hf.config.vocab_size == ours.config.vocab_size  # padded rows kept
    tied = (
        hf.get_output_embeddings().weight.data_ptr() == hf.get_input_embeddings().weight.data_ptr()
    )
    assert tied == ours.config.tie_embeddings
    generator = torch.Generator().manual_seed(1)
    idx = torch.randint(0, ours.config.vocab_size, (2, ours.config.block_size), generator=generator)
    with torch.no_grad():
        ours_logits, _ = ours(idx)
        hf_logits = hf(idx).logits
    assert (ours_logits - hf_logits).abs().max().item() < 1e-4
    assert ours_logits.std().item() > 0.1  # not a trivial agreement of two flat outputs


def test_same_greedy_tokens(exported):
    ours, hf, tokenizer, _ = exported
    prompt = torch.tensor(
        [
            [tokenizer.eos_token_id]
            + tokenizer('def main(argv):', add_special_tokens=False).input_ids
        ]
    )
    expected = ours.generate(prompt, 12, temperature=0)
    # min_new_tokens: ours never stops at end-of-text; HF would (it is eos)
    got = hf.generate(prompt, max_new_tokens=12, min_new_tokens=12, do_sample=False)
    assert got.tolist() == expected.tolist()
    # the random model does not repeat one token
    assert len(set(expected[0, prompt.shape[1] :].tolist())) > 1


def test_tokenizer_gives_our_ids(exported, pystdlib_data):
    ours, hf, tokenizer, folder = exported
    encoding = data.load_tokenizer(pystdlib_data)
    ids = encoding.encode(TEXT, allowed_special='all')
    assert tokenizer(TEXT).input_ids == ids  # nothing added: GPT-2's convention
    assert tokenizer.decode(ids) == TEXT == encoding.decode(ids)
    eot = encoding.eot_token
    assert ids.count(eot) == 1 and tokenizer.convert_tokens_to_ids('<|endoftext|>') == eot
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (
        eot,
        eot,
        eot,
    )
    assert (hf.config.bos_token_id, hf.config.eos_token_id, hf.config.pad_token_id) == (
        eot,
        eot,
        eot,
    )
    assert (
        hf.generation_config.eos_token_id == eot
        and len(tokenizer) == encoding.n_vocab <= hf.config.vocab_size
    )
    assert not [name for name in os.listdir(folder.parent) if '.tmp' in name or '.old' in name]


def test_gpt2_regex_converts_too():
    """GPT-2's pre-split regex (with its (?!\\S) look-ahead) over a small vocab: the same ids as tiktoken's."""
    ranks = {bytes([b]): b for b in range(256)}
    for text in (b'th', b'the', b' the', b'in', b' in', b'  ', b'er', b' t', b'ing', b' th'):
        ranks.setdefault(text, len(ranks))
    encoding = tiktoken.Encoding(
        'small',
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={'<|endoftext|>': len(ranks)},
    )
    tokenizer = export.hf_tokenizer(encoding)
    for text in (TEXT, 'the thing   in the  string\n\n  they\'re ' * 3):
        assert tokenizer.encode(text).ids == encoding.encode(text, allowed_special='all')
    assert export.bpe_merges(ranks)[:2] == [(b't', b'h'), (b'th', b'e')]


def test_neox_tokenizer_is_written_as_it_is(tmp_path, pystdlib_data):
    """A data folder in GPT-NeoX's tokens keeps the Hub's tokenizer.json (here a stand-in with NeoX's NFC
    normalizer and an added run of spaces); the export is that file, and gives the ids data.HFEncoding gives."""
    spec = json.loads(export.hf_tokenizer(data.load_tokenizer(pystdlib_data)).to_str())
    spec['normalizer'] = {'type': 'NFC'}
    spec['added_tokens'].append(
        {
            'id': 512,
            'content': '    ',
            'single_word': False,
            'lstrip': False,
            'rstrip': False,
            'normalized': False,
            'special': False,
        }
    )
    folder = tmp_path / 'neox_data'
    folder.mkdir()
    (folder / 'tokenizer.json').write_text(
        json.dumps({'name': 'neox', 'source': 'a stand-in', 'tokenizers': spec})
    )
    save_run(
        tmp_path / 'run', dict(TINY, arch='gpt2', tie_embeddings=True, vocab_size=640), str(folder)
    )
    assert export.main([str(tmp_path / 'run'), str(tmp_path / 'hf')]) == 0
    encoding, tokenizer = (
        data.load_tokenizer(str(folder)),
        AutoTokenizer.from_pretrained(tmp_path / 'hf'),
    )
    text = TEXT + ' cafe\u0301 = café'  # a decomposed é: NFC makes it the composed one
    ids = encoding.encode(text, allowed_special='all')
    assert tokenizer(text).input_ids == ids and ids.count(512) == 1  # TEXT's one run of 4 spaces
    assert tokenizer.decode(tokenizer(text).input_ids).endswith(' café = café')


def test_bfloat16_by_default(tmp_path, pystdlib_data):
    ours = save_run(tmp_path / 'run', dict(TINY, arch='llama', tie_embeddings=True), pystdlib_data)
    assert export.main([str(tmp_path / 'run'), str(tmp_path / 'hf')]) == 0
    tensors = load_file(tmp_path / 'hf' / 'model.safetensors')
    assert 'lm_head.weight' not in tensors  # tied: stored once, tied again by transformers
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    assert torch.equal(tensors['model.embed_tokens.weight'], ours.tok_emb.weight.to(torch.bfloat16))
    qkv = ours.blocks[1].attn.qkv_proj.weight
    assert torch.equal(
        tensors['model.layers.1.self_attn.v_proj.weight'], qkv[-64:].to(torch.bfloat16)
    )
    config = json.loads((tmp_path / 'hf' / 'config.json').read_text())
    assert config['torch_dtype'] == 'bfloat16' and config['max_position_embeddings'] == 32
    assert AutoModelForCausalLM.from_pretrained(tmp_path / 'hf').dtype == torch.bfloat16


@pytest.fixture(scope='module')
def trained_run(tmp_path_factory, pystdlib_data):
    """configs/pystdlib_cpu.py's model (4 x 256 Llama) on the 512-token fixture, trained for 2 steps by train.py."""
    out = str(tmp_path_factory.mktemp('trained') / 'run')
    assert (
        train.main(
            [
                os.path.join(
                    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    'configs',
                    'pystdlib_cpu.py',
                ),
                f'--data={pystdlib_data}',
                '--vocab_size=512',
                f'--out_dir={out}',
                '--max_steps=2',
                '--batch_tokens=1024',
                '--micro_batch=4',
                '--eval_tokens=1024',
                '--sample_tokens=0',
                '--dtype=float32',  # pinned: 'auto' picks bf16 or fp32 by a timing, and so the weights
            ]
        )
        == 0
    )
    return out


def test_trained_run_generates_what_sample_prints(trained_run, tmp_path, capsys):
    """The trained run exported in fp32: transformers' greedy text is sample.py's --temperature 0 text."""
    out = trained_run
    assert export.main([out, str(tmp_path / 'hf'), '--dtype=float32']) == 0
    printed = capsys.readouterr().out
    assert 'Qwen3ForCausalLM, ' in printed and 'step_0000002' in printed
    assert sample.main([out, '--prompt', 'import ', '--tokens', '16', '--temperature', '0']) == 0
    text = capsys.readouterr().out.split('\n' + '-' * 80)[0]
    model = AutoModelForCausalLM.from_pretrained(tmp_path / 'hf')
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / 'hf')
    prompt = [tokenizer.bos_token_id] + tokenizer('import ', add_special_tokens=False).input_ids
    tokens = torch.tensor([prompt])
    # greedy by hand: sample.py goes on past <|endoftext|>, where generate() stops
    for _ in range(16):
        with torch.no_grad():
            tokens = torch.cat([tokens, model(tokens).logits[:, -1:].argmax(-1)], dim=1)
    assert text.startswith('import ') and text == tokenizer.decode(tokens[0, 1:])


def test_bad_input_is_one_line(tmp_path, pystdlib_data, capsys):
    save_run(tmp_path / 'gqa', dict(TINY, arch='gpt2', n_kv_head=2), pystdlib_data)
    (tmp_path / 'taken').mkdir()
    (tmp_path / 'taken' / 'notes.txt').write_text('mine')
    synthetic = tmp_path / 'synthetic'
    save_run(synthetic, dict(TINY, arch='llama'), 'synthetic')
    cases = [
        ([str(tmp_path / 'gqa'), str(tmp_path / 'hf')], 'has no Hugging Face class'),
        ([str(tmp_path / 'gqa'), str(tmp_path / 'taken')], 'is not an export'),
        ([str(tmp_path / 'nothing'), str(tmp_path / 'hf')], 'no checkpoint in'),
        ([str(synthetic), str(tmp_path / 'hf')], 'synthetic tokens'),
    ]
    for argv, words in cases:
        assert export.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith('error: ') and words in err and '\n' not in err, err
    assert os.listdir(tmp_path / 'taken') == ['notes.txt'] and not os.path.exists(tmp_path / 'hf')


def test_a_file_in_the_way_is_one_line(tmp_path, pystdlib_data, capsys):
    save_run(tmp_path / 'run', dict(TINY, arch='llama'), pystdlib_data)
    (tmp_path / 'taken').write_text('mine')
    assert export.main([str(tmp_path / 'run'), str(tmp_path / 'taken')]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith('error: ') and 'is not an export' in err and '\n' not in err, err
    assert (tmp_path / 'taken').read_text() == 'mine'
    assert sorted(os.listdir(tmp_path)) == ['run', 'taken']


def test_export_replaces_an_earlier_one(tmp_path, pystdlib_data):
    first = save_run(tmp_path / 'a', dict(TINY, arch='llama'), pystdlib_data, seed=1)
    second = save_run(tmp_path / 'b', dict(TINY, arch='llama'), pystdlib_data, seed=2)
    for run, model in (('a', first), ('b', second)):
        assert export.main([str(tmp_path / run), str(tmp_path / 'hf'), '--dtype=float32']) == 0
        tensors = load_file(tmp_path / 'hf' / 'model.safetensors')
        assert torch.equal(tensors['model.norm.weight'], model.norm_f.weight)
    assert sorted(os.listdir(tmp_path)) == ['a', 'b', 'hf']
    assert sorted(os.listdir(tmp_path / 'hf')) == sorted(export.FILES)


# -----------------------------------------------------------------------------------------------------
# --push, against a Hub on 127.0.0.1 that implements what huggingface_hub's own client calls: create a repo,
# preupload (which files go to LFS), the LFS batch and its basic PUT, the commit (NDJSON), and for the download the
# revision listing and resolve. hf_xet is switched off (HF_HUB_DISABLE_XET), so large files take the LFS path.


def git_blob_id(content):
    return hashlib.sha1(b'blob %d\0' % len(content) + content).hexdigest()


class FakeHub(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(('127.0.0.1', 0), FakeHubHandler)
        self.url = f'http://127.0.0.1:{self.server_address[1]}'
        self.repos, self.lfs, self.files = set(), {}, {}  # repo ids; sha256 -> bytes; path -> bytes
        self.log = []  # (method, path, Authorization) of every request
        self.fail_commits = 0  # commits to refuse (500) before one succeeds
        # an HTTP status for every repo create (a 4xx: the id or the token)
        self.refuse_repos = None
        self.sha = '0' * 40


class FakeHubHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, body=b'', headers=()):
        body = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
        self.send_response(status)
        for key, value in (('Content-Length', str(len(body))), *headers):
            self.send_header(key, value)
        self.end_headers()
        if self.command != 'HEAD':
            self.wfile.write(body)

    def handle_request(self):
        hub, path = self.server, self.path.split('?')[0]
        hub.log.append((self.command, path, self.headers.get('Authorization')))
        body = self.rfile.read(int(self.headers.get('Content-Length') or 0))
        if path == '/api/validate-yaml':  # the model card's metadata block
            return self.reply(200, {'errors': [], 'warnings': []})
        if path == '/api/repos/create' and hub.refuse_repos:
            return self.reply(
                hub.refuse_repos, {'error': 'You are not allowed to create this repo'}
            )
        if path == '/api/repos/create':
            request = json.loads(body)
            hub.repos.add(f"{request['organization']}/{request['name']}")
            return self.reply(
                200, {'url': f"{hub.url}/{request['organization']}/{request['name']}"}
            )
        if re.fullmatch(r'/api/models/[^/]+/[^/]+/preupload/main', path):
            return self.reply(
                200,
                {
                    'files': [
                        {
                            'path': f['path'],
                            'uploadMode': 'lfs'
                            if f['path'].endswith(('.safetensors', '.png'))
                            else 'regular',
                            'shouldIgnore': False,
                        }
                        for f in json.loads(body)['files']
                    ]
                },
            )
        # an object the Hub has already is not asked for again
        if path.endswith('.git/info/lfs/objects/batch'):
            objects = [
                {'oid': o['oid'], 'size': o['size']}
                | (
                    {}
                    if o['oid'] in hub.lfs
                    else {'actions': {'upload': {'href': f"{hub.url}/lfs/{o['oid']}"}}}
                )
                for o in json.loads(body)['objects']
            ]
            return self.reply(200, {'transfer': 'basic', 'objects': objects})
        if self.command == 'PUT' and path.startswith('/lfs/'):
            assert hashlib.sha256(body).hexdigest() == path[5:]
            hub.lfs[path[5:]] = body
            return self.reply(200)
        if re.fullmatch(r'/api/models/[^/]+/[^/]+/commit/main', path):
            if hub.fail_commits:
                hub.fail_commits -= 1
                return self.reply(500, {'error': 'the commit failed'})
            for line in body.decode().splitlines():
                item = json.loads(line)
                value = item['value']
                if item['key'] == 'file':
                    hub.files[value['path']] = base64.b64decode(value['content'])
                elif item['key'] == 'lfsFile':
                    hub.files[value['path']] = hub.lfs[value['oid']]
            hub.sha = hashlib.sha1(json.dumps(sorted(hub.files)).encode()).hexdigest()
            return self.reply(
                200, {'commitUrl': f'{hub.url}/me/tiny/commit/{hub.sha}', 'commitOid': hub.sha}
            )
        if re.fullmatch(r'/api/models/[^/]+/[^/]+(/revision/main)?', path):
            siblings = [{'rfilename': name} for name in sorted(hub.files)]
            return self.reply(200, {'id': 'me/tiny', 'sha': hub.sha, 'siblings': siblings})
        if re.fullmatch(r'/api/models/[^/]+/[^/]+/tree/[^/]+', path):  # the download's listing
            listing = [
                {'type': 'file', 'path': name, 'size': len(content), 'oid': git_blob_id(content)}
                for name, content in sorted(hub.files.items())
            ]
            return self.reply(200, listing)
        resolved = re.fullmatch(r'/[^/]+/[^/]+/resolve/[^/]+/(.+)', path)
        if resolved and resolved[1] in hub.files:
            content = hub.files[resolved[1]]
            etag = f'"{hashlib.sha256(content).hexdigest()}"'
            return self.reply(200, content, [('ETag', etag), ('X-Repo-Commit', hub.sha)])
        return self.reply(404, {'error': f'{self.command} {path} is not served here'})

    do_GET = do_POST = do_PUT = do_HEAD = handle_request


@pytest.fixture
def hub(monkeypatch):
    import huggingface_hub.constants

    server = FakeHub()
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    monkeypatch.setenv('HF_ENDPOINT', server.url)
    monkeypatch.setenv('HF_TOKEN', 'hf_test')
    monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_DISABLE_XET', True)
    yield server
    server.shutdown()
    server.server_close()


def test_push_uploads_a_folder_that_transformers_loads(trained_run, hub, tmp_path, capsys):
    """A push whose commit fails is one line and leaves the repo empty; the same command again completes it without
    sending the weights again; what the Hub then holds is the folder, card included, and loads in transformers."""
    argv = [trained_run, str(tmp_path / 'hf'), '--dtype=float32', '--push', 'me/tiny']
    hub.fail_commits = 1
    assert export.main(argv) == 2
    err = capsys.readouterr().err.strip().split('\n')[-1]  # after huggingface_hub's progress bars
    assert err.startswith('error: the push to me/tiny failed (HfHubHTTPError: ')
    assert 'run the same command again to complete it' in err and hub.files == {}
    assert len(hub.lfs) == 2  # it failed at the commit: the weights and loss.png were uploaded
    assert export.main(argv) == 0
    assert 'pushed to me/tiny: ' in capsys.readouterr().out
    puts = [p for method, p, _ in hub.log if method == 'PUT']
    assert len(puts) == len(set(puts)) == 2  # model.safetensors and loss.png, once each
    assert all(auth == 'Bearer hf_test' for _, p, auth in hub.log if p.startswith('/api/'))
    local = {name: (tmp_path / 'hf' / name).read_bytes() for name in os.listdir(tmp_path / 'hf')}
    assert hub.files == local and set(local) == {*export.FILES, 'README.md', 'loss.png'}
    card = local['README.md'].decode()
    model = checkpoint.load_model(trained_run, torch.device('cpu'))[0]
    params = sum(p.numel() for p in model.parameters())
    summary = json.loads(open(os.path.join(trained_run, 'summary.json')).read())
    for words in (
        f'Qwen3ForCausalLM) pretrained from scratch by ledgergpt\'s train.py: {params:,} parameters',
        '| quantity | predicted | measured | measured / predicted |',
        f"{summary['val_bpb']:.4f} bits per byte",
        '2,048 tokens seen in 2 steps',
        'python train.py --n_layer=4 --n_head=4 --n_embd=256',
        '--max_steps=2',
        "from_pretrained('me/tiny')",
    ):
        assert words in card, words
    from huggingface_hub import snapshot_download

    folder = snapshot_download('me/tiny', cache_dir=tmp_path / 'cache', endpoint=hub.url)
    downloaded = AutoModelForCausalLM.from_pretrained(folder)
    prompt = torch.tensor([[AutoTokenizer.from_pretrained(folder).bos_token_id, 5, 6]])
    expected = model.generate(prompt, 8, temperature=0)
    got = downloaded.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert got.tolist() == expected.tolist()


def test_a_refused_push_says_what_to_fix_not_to_run_it_again(trained_run, hub, tmp_path, capsys):
    """An id huggingface_hub refuses itself, and one the Hub refuses (a 4xx): the same command again
    would fail the same way, so the line says what to fix instead."""
    hub.refuse_repos = 400  # what the Hub answers an id it will not make
    for repo_id, error in (
        ('bad id with spaces', 'HFValidationError'),
        ('me/tiny', 'BadRequestError'),
    ):
        assert export.main([trained_run, str(tmp_path / 'hf'), '--push', repo_id]) == 2
        err = capsys.readouterr().err.strip().split('\n')[-1]
        assert err.startswith(f'error: the push to {repo_id} failed ({error}: '), err
        assert 'run the same command again' not in err and 'fix the repo id' in err, err
    # the Hub's own reason, below huggingface_hub's status line
    assert 'Bad request: You are not allowed to create this repo): ' in err, err
    assert hub.files == {} and not hub.repos


# -----------------------------------------------------------------------------------------------------
# --gguf: model.gguf read back with llama.cpp's own gguf package (GGUFReader), every tensor the checkpoint's under
# llama.cpp's name and layout, in each dtype; the hyperparameters and the tokenizer as llama.cpp's loader reads them.


def gguf_expected(model):
    """{llama.cpp name: tensor} written out from our own state dict: the layouts convert_hf_to_gguf.py writes."""
    c, ours = model.config, model.state_dict()
    hd = c.head_dim

    def rotary_rows(weight, heads):
        """HF's halves of each head -> llama.cpp's adjacent pairs (row 2j <- j); llama.cpp's qwen3 (a Llama with
        QK-norm) rotates the halves, as HF does, so its rows stay."""
        if c.qk_norm != 'none':
            return weight
        order = [h * hd + j // 2 + (j % 2) * (hd // 2) for h in range(heads) for j in range(hd)]
        return weight[order]

    def zeros_if_none(name, width):
        return ours.get(name, torch.zeros(width))

    tensors = {
        'token_embd.weight': ours['tok_emb.weight'],
        'output_norm.weight': ours['norm_f.weight'],
    }
    if c.arch == 'llama':
        q, kv = c.n_head * hd, c.kv_heads * hd
        if not c.tie_embeddings:
            tensors['output.weight'] = ours['lm_head.weight']
        for i in range(c.n_layer):
            b, g = f'blocks.{i}.', f'blk.{i}.'
            qkv = ours[b + 'attn.qkv_proj.weight']
            for name in ('q', 'k') if c.qk_norm != 'none' else ():  # Qwen3's gains (1: weightless)
                gain = ours.get(b + f'attn.qk_norm.{name}_norm.weight', torch.ones(hd))
                tensors[g + f'attn_{name}_norm.weight'] = gain
            if c.mlp == 'relu2':  # Arcee's: up and down alone
                tensors[g + 'ffn_up.weight'] = ours[b + 'mlp.up_proj.weight']
            else:
                gate_up = ours[b + 'mlp.gate_up_proj.weight']
                tensors[g + 'ffn_gate.weight'] = gate_up[: c.ffn_width]
                tensors[g + 'ffn_up.weight'] = gate_up[c.ffn_width :]
            tensors.update(
                {
                    g + 'attn_norm.weight': ours[b + 'attn_norm.weight'],
                    g + 'attn_q.weight': rotary_rows(qkv[:q], c.n_head),
                    g + 'attn_k.weight': rotary_rows(qkv[q : q + kv], c.kv_heads),
                    g + 'attn_v.weight': qkv[q + kv :],
                    g + 'attn_output.weight': ours[b + 'attn.o_proj.weight'],
                    g + 'ffn_norm.weight': ours[b + 'mlp_norm.weight'],
                    g + 'ffn_down.weight': ours[b + 'mlp.down_proj.weight'],
                }
            )
        return tensors
    tensors['position_embd.weight'] = ours['pos_emb.weight']
    tensors['output_norm.bias'] = zeros_if_none('norm_f.bias', c.n_embd)
    tensors['output.weight'] = ours['tok_emb.weight' if c.tie_embeddings else 'lm_head.weight']
    for i in range(c.n_layer):
        b, g = f'blocks.{i}.', f'blk.{i}.'
        for ours_name, name in (
            ('attn_norm', 'attn_norm'),
            ('attn.qkv_proj', 'attn_qkv'),
            ('attn.o_proj', 'attn_output'),
            ('mlp_norm', 'ffn_norm'),
            ('mlp.up_proj', 'ffn_up'),
            ('mlp.down_proj', 'ffn_down'),
        ):
            weight = ours[b + ours_name + '.weight']
            tensors[g + name + '.weight'] = weight
            tensors[g + name + '.bias'] = zeros_if_none(b + ours_name + '.bias', weight.shape[0])
    return tensors


def gguf_tensor(tensor):
    """A GGUFReader tensor as torch, in its own dtype (bf16 comes back as its bytes)."""
    data = np.ascontiguousarray(tensor.data)
    if tensor.tensor_type.name == 'BF16':
        return torch.from_numpy(data.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(data)


# llama.cpp's llama, gpt2, qwen3 and arcee
GGUF_VARIANTS = [*list(VARIANTS)[:6], 'llama, ReLU² MLP, GQA (an Arcee)']
GGUF_DTYPES = ('float32', 'bfloat16', 'float16', 'float32', 'bfloat16', 'float16', 'bfloat16')


@pytest.mark.parametrize('variant, dtype', list(zip(GGUF_VARIANTS, GGUF_DTYPES)))
def test_gguf_holds_every_tensor_under_llama_cpp_names(variant, dtype, tmp_path, pystdlib_data):
    from gguf import GGUFReader

    ours = save_run(tmp_path / 'run', dict(TINY, **VARIANTS[variant]), pystdlib_data)
    assert (
        export.main([str(tmp_path / 'run'), str(tmp_path / 'hf'), f'--dtype={dtype}', '--gguf'])
        == 0
    )
    reader = GGUFReader(tmp_path / 'hf' / 'model.gguf')
    expected = gguf_expected(ours)
    got = {t.name: t for t in reader.tensors}
    assert set(got) == set(expected)
    for name, tensor in expected.items():
        stored = gguf_tensor(got[name])
        want = tensor.float() if tensor.dim() == 1 else tensor.to(export.DTYPES[dtype])
        assert stored.dtype == want.dtype and torch.equal(stored, want), name

    def field(key):
        return reader.fields[key].contents()

    c = ours.config
    arch = {'relu2': 'arcee'}.get(c.mlp, 'qwen3' if c.qk_norm != 'none' else c.arch)
    encoding = data.load_tokenizer(pystdlib_data)
    assert field('general.architecture') == arch and field(f'{arch}.block_count') == c.n_layer
    assert field('general.name') == 'hf'  # the folder's name, not the one it was written under
    assert field(f'{arch}.context_length') == 32 and field(f'{arch}.attention.head_count') == 4
    if c.arch == 'llama':
        assert field(f'{arch}.attention.head_count_kv') == c.kv_heads
        assert field(f'{arch}.rope.freq_base') == c.rope_theta
        assert field(f'{arch}.rope.dimension_count') == 16
    tokens = field('tokenizer.ggml.tokens')
    # our BPE's split
    assert len(tokens) == c.vocab_size and field('tokenizer.ggml.pre') == 'llama-bpe'
    assert (
        tokens[encoding.eot_token]
        == '<|endoftext|>'
        == tokens[field('tokenizer.ggml.bos_token_id')]
    )
    # GPT-2's alphabet: space is Ġ
    assert tokens[encoding.encode_single_token(b' return')] == '\u0120return'
    assert len(field('tokenizer.ggml.merges')) == encoding.n_vocab - 256 - len(
        encoding._special_tokens
    )
    assert tokens[-1] == f'[PAD{c.vocab_size - 1}]' or c.vocab_size == encoding.n_vocab


def test_gguf_refuses_moe_and_an_unknown_split_in_one_line(tmp_path, pystdlib_data, capsys):
    save_run(
        tmp_path / 'moe',
        dict(TINY, arch='llama', n_experts=4, top_k=2, expert_hidden=32),
        pystdlib_data,
    )
    assert export.main([str(tmp_path / 'moe'), str(tmp_path / 'hf'), '--gguf']) == 2
    err = capsys.readouterr().err.strip()
    assert (
        'a mixture-of-experts model (n_experts=4) has no Hugging Face export' in err
        and '\n' not in err
    )
    odd = tiktoken.Encoding(
        'odd',
        pat_str=r'\S+|\s+',
        mergeable_ranks={bytes([b]): b for b in range(256)},
        special_tokens={},
    )
    with pytest.raises(UserError, match='llama.cpp has no pre-tokenizer known to export.py'):
        export.gguf_pre_tokenizer(odd)
    gpt2 = tiktoken.Encoding(
        'gpt2',
        pat_str=r50k_pat_str,
        mergeable_ranks={bytes([b]): b for b in range(256)},
        special_tokens={},
    )
    assert export.gguf_pre_tokenizer(gpt2) == 'gpt-2'  # llama.cpp's name for GPT-2's split
    # parts llama.cpp's architecture for the class does not compute: the Hugging Face folder alone
    message = "llama.cpp's gpt2 architecture has no mlp = 'relu2'"
    with pytest.raises(ConfigError, match=re.escape(message) + '.*without --gguf'):
        export.gguf_class(ModelConfig(**TINY, arch='gpt2', mlp='relu2'))
    assert export.gguf_class(ModelConfig(**TINY, arch='llama', mlp='relu2')) == 'ArceeForCausalLM'
    assert (
        export.gguf_class(ModelConfig(**TINY, arch='llama', qk_norm='learned'))
        == 'Qwen3ForCausalLM'
    )
