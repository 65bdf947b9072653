"""
test_pretrained.py: init_from (pretrained.py). Random small models written by transformers' own save_pretrained
(GPT-2 tied; Llama with GQA untied, and tied; Qwen3, a Llama with QK-norm's gains; Arcee, one with a ReLU² MLP)
become our model exactly: the same logits in fp32, the same greedy
tokens; the config comes from config.json, and a contradicting key or a field model.py does not implement is one
line. Export then import gives the same tensors byte for byte; import then export loads in transformers with the
same logits. A fine-tune of a few steps from an imported model trains, checkpoints and resumes bit-exactly.
"""

import json
import os
import re
import shutil

import numpy as np
import pytest
import torch
from test_export import TINY as EXPORT_TINY
from test_export import VARIANTS as EXPORT_VARIANTS
from test_export import save_run
from test_prepare import NEOX, hub  # noqa: F401 (hub: the fake Hub fixture)
from test_train import read_metrics, step_losses
from transformers import (
    ArceeConfig,
    ArceeForCausalLM,
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import export
import helpers
import ledger
import train
from ledgergpt import data, pretrained
from ledgergpt.config import ConfigError
from ledgergpt.hf import LAYOUTS, hf_class_of
from model import GPT

VOCAB = 512  # the pystdlib fixture's: the imported models export with its tokenizer
# the Llama family's models below: 2 x 64, 4 heads, 64 positions
LLAMA_SIZE = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    vocab_size=VOCAB,
    max_position_embeddings=64,
)
HF_MODELS = {
    'gpt2, tied': lambda: GPT2LMHeadModel(
        GPT2Config(
            n_embd=64,
            n_layer=2,
            n_head=4,
            vocab_size=VOCAB,
            n_positions=64,
            layer_norm_epsilon=1e-5,
        )
    ),
    'llama, GQA, untied': lambda: LlamaForCausalLM(
        LlamaConfig(
            **LLAMA_SIZE,
            num_key_value_heads=2,
            intermediate_size=96,
            rope_theta=500.0,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
        )
    ),
    'llama, tied, multi-head': lambda: LlamaForCausalLM(
        LlamaConfig(**LLAMA_SIZE, intermediate_size=128, tie_word_embeddings=True)
    ),
    # a Llama with QK-norm's learned gains, and one with a ReLU² MLP (config.PARTS)
    'qwen3, GQA, tied': lambda: Qwen3ForCausalLM(
        Qwen3Config(
            **LLAMA_SIZE,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=96,
            tie_word_embeddings=True,
        )
    ),
    'arcee, untied': lambda: ArceeForCausalLM(
        ArceeConfig(**LLAMA_SIZE, head_dim=16, intermediate_size=256, tie_word_embeddings=False)
    ),
}


def save_hf(folder, name, seed=0):
    """A transformers model of HF_MODELS with every tensor distinct (norms and biases moved off 1 and 0), saved by
    save_pretrained in fp32; -> the model, in eval mode."""
    torch.manual_seed(seed)
    model = HF_MODELS[name]().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(folder)
    return model


def imported(folder, *overrides):
    # synthetic data: the model alone (a data/pystdlib made here has another tokenizer than the folder's)
    model_cfg, _ = pretrained.load_config(
        None, [f'--init_from={folder}', '--data=synthetic', *overrides]
    )
    return pretrained.load_weights(GPT(model_cfg), str(folder)).eval()


@pytest.fixture(params=list(HF_MODELS), scope='module')
def hf_folder(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp('hf') / 'model'
    return save_hf(folder, request.param), folder


def test_imported_model_computes_what_transformers_does(hf_folder):
    hf, folder = hf_folder
    ours = imported(folder)
    c, hc = ours.config, hf.config
    assert (c.vocab_size, c.block_size, c.n_layer) == (VOCAB, 64, 2)
    assert c.tie_embeddings == hc.tie_word_embeddings
    assert (ours.lm_head.weight is ours.tok_emb.weight) == c.tie_embeddings
    if c.arch == 'llama':
        assert (c.kv_heads, c.ffn_width, c.norm_eps) == (
            hc.num_key_value_heads,
            hc.intermediate_size,
            hc.rms_norm_eps,
        )
        assert c.rope_theta == hc.rope_parameters['rope_theta']
    idx = torch.randint(0, VOCAB, (2, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours_logits, hf_logits = ours(idx)[0], hf(idx).logits
    assert (ours_logits - hf_logits).abs().max() < 1e-4
    prompt = idx[:1, :5]
    hf_tokens = hf.generate(
        prompt, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    assert torch.equal(ours.generate(prompt, 12, temperature=0), hf_tokens)


def test_shorter_block_size_is_allowed_and_a_contradicting_key_is_one_line(hf_folder):
    hf, folder = hf_folder
    ours = imported(folder, '--block_size=16')
    idx = torch.randint(0, VOCAB, (1, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (ours(idx)[0] - hf(idx).logits).abs().max() < 1e-4
    for flag, key in (
        ('--n_layer=3', 'n_layer'),
        ('--block_size=128', 'block_size'),
        ('--vocab_size=640', 'vocab'),
    ):
        with pytest.raises(ConfigError, match=f"{key}.* contradicts init_from's config.json"):
            pretrained.load_config(None, [f'--init_from={folder}', flag])


# Each unsupported field, as it would be in a Hub config.json: (class, field, value).
UNSUPPORTED = [
    ('llama, GQA, untied', 'rope_scaling', {'rope_type': 'llama3', 'factor': 8.0}),
    (
        'llama, GQA, untied',
        'rope_parameters',
        {'rope_type': 'yarn', 'rope_theta': 1e4, 'factor': 4.0},
    ),
    ('llama, GQA, untied', 'attention_bias', True),
    ('llama, GQA, untied', 'mlp_bias', True),
    ('llama, GQA, untied', 'sliding_window', 4096),
    ('llama, GQA, untied', 'hidden_act', 'gelu'),
    ('llama, GQA, untied', 'head_dim', 32),
    ('llama, GQA, untied', 'architectures', ['MistralForCausalLM']),
    ('qwen3, GQA, tied', 'use_sliding_window', True),
    ('qwen3, GQA, tied', 'head_dim', 128),  # Qwen3's own models' (wider than hidden_size / heads)
    ('arcee, untied', 'hidden_act', 'silu'),
    ('gpt2, tied', 'activation_function', 'relu'),
    ('gpt2, tied', 'scale_attn_by_inverse_layer_idx', True),
]


@pytest.mark.parametrize(
    'name, field, value', UNSUPPORTED, ids=[f'{n}: {f}' for n, f, _ in UNSUPPORTED]
)
def test_an_unsupported_field_is_one_line_naming_it(tmp_path, name, field, value):
    folder = tmp_path / 'model'
    model = HF_MODELS[name]()
    model.config.save_pretrained(folder)  # config.json only: refused before any weight is read
    config = dict(
        json.loads((folder / 'config.json').read_text()), architectures=[type(model).__name__]
    )
    config[field] = value
    (folder / 'config.json').write_text(json.dumps(config))
    with pytest.raises(ConfigError) as error:
        pretrained.load_config(None, [f'--init_from={folder}'])
    message = str(error.value)
    assert (
        '\n' not in message
        and field in message.split(':')[1]
        and 'init_from cannot start' in message
    )


def test_a_model_saved_with_biases_is_refused(tmp_path):
    """Not an edited file: transformers' own Llama with attention and MLP biases, as save_pretrained writes it."""
    config = HF_MODELS['llama, GQA, untied']().config
    config.attention_bias = config.mlp_bias = True
    LlamaForCausalLM(config).save_pretrained(tmp_path / 'model')
    with pytest.raises(ConfigError, match=r"attention_bias = True is not implemented by model.py"):
        pretrained.load_config(None, [f'--init_from={tmp_path / "model"}'])


def test_missing_or_extra_weights_are_one_line(hf_folder, tmp_path):
    from safetensors.torch import load_file, save_file

    _, folder = hf_folder
    copy = tmp_path / 'model'
    shutil.copytree(folder, copy)
    tensors = load_file(copy / 'model.safetensors')
    name = next(n for n in tensors if 'layers.1.' in n or '.h.1.' in n)
    save_file({k: v for k, v in tensors.items() if k != name}, copy / 'model.safetensors')
    with pytest.raises(ConfigError, match=f'the weights lack {name}'):
        imported(copy)
    save_file({**tensors, 'model.extra.weight': torch.zeros(2)}, copy / 'model.safetensors')
    with pytest.raises(ConfigError, match='tensor model.extra.weight is not part of'):
        imported(copy)
    (copy / 'model.safetensors').unlink()
    with pytest.raises(ConfigError, match='has no model.safetensors'):
        imported(copy)


# -----------------------------------------------------------------------------------------------------
# Round trip.


@pytest.mark.parametrize('variant', list(EXPORT_VARIANTS))
def test_export_then_import_gives_the_same_tensors_byte_for_byte(variant, pystdlib_data, tmp_path):
    ours = save_run(tmp_path / 'run', dict(EXPORT_TINY, **EXPORT_VARIANTS[variant]), pystdlib_data)
    assert export.main([str(tmp_path / 'run'), str(tmp_path / 'hf'), '--dtype', 'float32']) == 0
    back = imported(tmp_path / 'hf')
    for kind in ('mlp', 'qk_norm'):  # ReLU² comes back as itself, QK-norm as its learned gains
        expected = {'weightless': 'learned'}.get(
            ours.config.part_name(kind), ours.config.part_name(kind)
        )
        assert back.config.part_name(kind) == expected, kind
    assert hf_class_of(back.config) == hf_class_of(ours.config)
    assert (
        back.config.tie_embeddings == ours.config.tie_embeddings
        and back.config.kv_heads == ours.config.kv_heads
    )
    mine, theirs = ours.state_dict(), back.state_dict()
    for name, tensor in theirs.items():
        if name in mine:
            assert mine[name].dtype == tensor.dtype and torch.equal(mine[name], tensor), name
        elif name.endswith(('q_norm.weight', 'k_norm.weight')):  # weightless: gains of 1
            assert torch.equal(tensor, torch.ones_like(tensor)), name
        else:  # gpt2 without biases: GPT2LMHeadModel has them, as zeros
            assert name.endswith('.bias') and not tensor.any(), name
    assert set(mine) <= set(theirs)


def test_import_then_export_loads_in_transformers_with_the_same_logits(
    hf_folder, pystdlib_data, tmp_path
):
    hf, folder = hf_folder
    ours = imported(folder)
    out = tmp_path / 'exported'
    out.mkdir()
    export.write_folder(str(out), ours, data.load_tokenizer(pystdlib_data), 'float32')
    again = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(again) is type(hf)
    idx = torch.randint(0, VOCAB, (2, 64), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (again(idx).logits - hf(idx).logits).abs().max() < 1e-4


# -----------------------------------------------------------------------------------------------------
# Fine-tuning: a few steps from an imported model train, checkpoint and resume bit-exactly.

FINETUNE = dict(
    data='synthetic',
    block_size=32,
    micro_batch=4,
    batch_tokens=256,
    train_tokens=8 * 256,
    lr=1e-3,
    compile=False,
    log_every=1,
    eval_every=1000,
    eval_tokens=256,
    ckpt_every=4,
    gpu='cpu',
)


def test_finetune_trains_checkpoints_and_resumes_bit_exactly(tmp_path):
    hf = save_hf(tmp_path / 'hf', 'llama, GQA, untied')
    config = tmp_path / 'finetune.py'
    helpers.write_config(config, dict(FINETUNE, init_from=str(tmp_path / 'hf')))
    # step 0: the imported weights, exactly
    run = train.setup([str(config), f'--out_dir={tmp_path / "probe"}'])
    hf_tensors = LAYOUTS['LlamaForCausalLM'][0](run.raw_model)
    assert all(torch.equal(t, hf.state_dict()[n]) for n, t in hf_tensors.items())
    assert run.model_cfg.n_kv_head == 2 and run.model_cfg.block_size == 32
    del run
    assert train.main([str(config), f'--out_dir={tmp_path / "full"}']) == 0
    expected = step_losses(read_metrics(tmp_path / 'full'))
    assert expected[8] < expected[1]  # it learns (the synthetic stream's unigram, at least)
    assert train.main([str(config), f'--out_dir={tmp_path / "out"}', '--max_steps=4']) == 0
    assert train.main([str(config), f'--out_dir={tmp_path / "out"}', '--resume']) == 0
    losses = step_losses(read_metrics(tmp_path / 'out'))
    assert [losses[s] for s in range(5, 9)] == [expected[s] for s in range(5, 9)]  # exactly equal


# -----------------------------------------------------------------------------------------------------
# The model's tokenizer: prepare.py --tokenizer MODEL_FOLDER gives transformers' ids, each document starting with the
# model's own document start (a Llama's BOS, GPT-2's end-of-text); train.py refuses data made with another one.


def llama_tokenizer(folder, texts):
    """A Llama-style tokenizer as a Hub model folder holds one: SentencePiece-like BPE ('▁' for spaces), BOS '<s>'
    added before every text by its post-processor, eos '</s>'."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token='<unk>'))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme='first')
    tokenizer.decoder = decoders.Metaspace(prepend_scheme='first')
    special = ['<unk>', '<s>', '</s>']
    tokenizer.train_from_iterator(
        texts, trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=special)
    )
    tokenizer.post_processor = processors.TemplateProcessing(
        single='<s> $A', pair='<s> $A <s> $B', special_tokens=[('<s>', 1)]
    )
    tokenizer.save(str(folder / 'tokenizer.json'))
    (folder / 'tokenizer_config.json').write_text(
        json.dumps(
            {'tokenizer_class': 'PreTrainedTokenizerFast', 'bos_token': '<s>', 'eos_token': '</s>'}
        )
    )
    assert tokenizer.get_vocab_size() == VOCAB


@pytest.fixture(scope='module')
def text_file(tmp_path_factory):
    """~100 KB of Python sources as one .jsonl of documents."""
    import prepare

    path = tmp_path_factory.mktemp('text') / 'docs.jsonl'
    documents = [text for _, text in prepare.pystdlib_files(max_files=20)]
    path.write_text(''.join(json.dumps({'text': text}) + '\n' for text in documents))
    return path, documents


@pytest.fixture(params=['gpt2, tied', 'llama, GQA, untied'], scope='module')
def model_with_tokenizer(request, tmp_path_factory, text_file, pystdlib_data):
    """(HF model folder with its own tokenizer, its prepared data folder, the texts)."""
    import prepare

    tmp = tmp_path_factory.mktemp('tok')
    folder = tmp / 'model'
    save_hf(folder, request.param)
    # GPT-2's kind: byte-level BPE, no BOS, documents split by <|endoftext|>
    if request.param.startswith('gpt2'):
        encoding = data.load_tokenizer(pystdlib_data)
        export.hf_tokenizer(encoding).save(str(folder / 'tokenizer.json'))
        (folder / 'tokenizer_config.json').write_text(
            json.dumps(export.tokenizer_config('<|endoftext|>', 64))
        )
    else:
        llama_tokenizer(folder, text_file[1])
    prepare.prepare_files(
        [str(text_file[0])], str(tmp / 'data'), tokenizer=str(folder), workers=1, val_tokens=2000
    )
    return folder, str(tmp / 'data'), text_file[1]


def test_model_tokenizer_gives_transformers_ids_and_its_document_start(model_with_tokenizer):
    from transformers import AutoTokenizer

    folder, data_dir, texts = model_with_tokenizer
    hf = AutoTokenizer.from_pretrained(folder)
    ours, meta = data.load_tokenizer(data_dir), data.load_meta(data_dir)
    llama = (folder / 'config.json').read_text().count('LlamaForCausalLM') > 0
    start = hf.convert_tokens_to_ids('<s>' if llama else '<|endoftext|>')
    assert meta['eot_id'] == ours.eot_token == start and meta['vocab_size'] == VOCAB == ours.n_vocab
    for text in texts[:5] + [TEXT_SAMPLE]:
        # a Llama tokenizer adds its BOS itself; GPT-2's adds nothing
        expected = hf(text)['input_ids']
        assert [start] * (not llama) + expected == [start] + ours.encode_ordinary(text)
    tokens = np.concatenate(
        [np.asarray(data.open_shard(p)) for p in data.list_shards(data_dir, 'val')]
    )
    # the val shard: the first document
    first = ([start] * (not llama) + hf(texts[0])['input_ids'])[: len(tokens)]
    assert tokens[0] == start and tokens[: len(first)].tolist() == first


TEXT_SAMPLE = "def f(x):\n\treturn x ** 2  # 12345\r\n\n    don't héllo wörld 日本語 🤖 end"


def test_finetune_on_the_model_tokens_and_refuse_other_data(
    model_with_tokenizer, pystdlib_data, tmp_path, capsys
):
    from transformers import AutoTokenizer

    folder, data_dir, _ = model_with_tokenizer
    keys = dict(
        FINETUNE, data=data_dir, init_from=str(folder), train_tokens=2 * 256, sample_tokens=8
    )
    config = tmp_path / 'finetune.py'
    helpers.write_config(config, keys)
    assert train.main([str(config), f'--out_dir={tmp_path / "out"}']) == 0
    assert 'sample after 2 steps' in capsys.readouterr().out
    # exported, the document start keeps its own name and id ('<s>' for the Llama tokenizer), no token added
    assert export.main([str(tmp_path / 'out'), str(tmp_path / 'hf'), '--dtype', 'float32']) == 0
    exported, start = (
        AutoTokenizer.from_pretrained(tmp_path / 'hf'),
        data.load_meta(data_dir)['eot_id'],
    )
    assert len(exported) == VOCAB and exported.bos_token_id == exported.eos_token_id == start
    assert json.loads((tmp_path / 'hf' / 'config.json').read_text())['eos_token_id'] == start
    assert (
        train.main([str(config), f'--out_dir={tmp_path / "other"}', f'--data={pystdlib_data}']) == 2
    )
    error = capsys.readouterr().err.strip()
    assert (
        '\n' not in error
        and "not with init_from's own tokenizer" in error
        and f'--tokenizer {folder}' in error
    )


# -----------------------------------------------------------------------------------------------------
# A Hub repo id: only the files a run needs, through downloads.py (verified against the listing), into the cache.


def test_hub_repo_id_downloads_only_what_is_needed_into_the_cache(hub, tmp_path, monkeypatch):  # noqa: F811
    hf = save_hf(tmp_path / 'hf', 'gpt2, tied')
    (tmp_path / 'hf' / 'README.md').write_text(
        'A test model, pretrained on 1.5 trillion tokens of nothing.\n'
    )
    hub.model_files.update({p.name: p.read_bytes() for p in (tmp_path / 'hf').iterdir()})
    hub.model_files.update(
        {'pytorch_model.bin': b'not wanted', 'flax_model.msgpack': b'not wanted'}
    )
    # one damaged answer: verified against the listing, fetched again
    hub.corrupt['model.safetensors'] = 1
    monkeypatch.setenv('HF_ENDPOINT', hub.url)
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
    # the ledger's line and the config: the small files only, no weights
    assert '1,500B tokens (its card)' in pretrained.describe(NEOX)
    assert sorted({r['path'] for r in hub.log}) == [
        'README.md',
        'config.json',
        'generation_config.json',
    ]
    # the weights now, at the same commit; the small files are not fetched again
    ours = imported(NEOX)
    wanted = ['README.md', 'config.json', 'generation_config.json', 'model.safetensors']
    assert sorted({r['path'] for r in hub.log}) == wanted and len(hub.log) == len(wanted) + 1
    idx = torch.randint(0, VOCAB, (1, 64), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert (ours(idx)[0] - hf(idx).logits).abs().max() < 1e-4
    hub.log.clear()
    # the cache, no network
    assert pretrained.folder(NEOX).startswith(str(tmp_path / 'cache')) and hub.log == []
    assert '1,500B tokens (its card)' in pretrained.describe(NEOX)


# -----------------------------------------------------------------------------------------------------
# The ledger of a fine-tune: `python ledger.py configs/h200_finetune_1b.py`, from TinyLlama's config.json.


def test_ledger_bills_a_finetune_from_the_model_config(capsys, monkeypatch):

    # the repo's root: init_from
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert ledger.main(['configs/h200_finetune_1b.py']) == 0
    report = capsys.readouterr().out
    # transformers' own count of the 1.1B model configs/tinyllama_1b describes
    with torch.device('meta'):
        tiny_llama = AutoModelForCausalLM.from_config(
            LlamaConfig.from_pretrained('configs/tinyllama_1b')
        )
    params = sum(p.numel() for p in tiny_llama.parameters())
    assert params == 1_100_048_384 and re.search(r'total P +1,100,048,384 ', report)
    assert 'from: configs/tinyllama_1b (LlamaForCausalLM), pretrained on unknown tokens' in report
    assert (
        'ledger: llama, 22 layers, H=2048, 32 heads (GQA, 4 kv heads), H\'=5632, V=32000, T=2048, untied'
        in report
    )
    # the README's figures: full fine-tuning of 1.1B on 2B tokens, one H200
    assert re.search(r'time for this run +10\.3 h', report) and re.search(r'cost +\$36 ', report)
    assert re.search(r'total +70\.11 GiB +of 140\.40 GiB \(nvidia-smi total\): fits', report)
    readme = open('README.md').read()
    assert '1,100,048,384 parameters: ~10.3 h, ~$36, 70.11 GiB of 140.40' in readme


def test_a_folder_not_made_yet_is_named_as_the_repo_id_it_was_taken_for(
    tmp_path, monkeypatch, capsys
):
    """`--tokenizer hf/pystdlib_cpu` before export.py wrote that folder reads as a Hub repo id: the Hub is asked
    (here a port that refuses), and the one line that gives up says what the name was taken for."""
    from ledgergpt import downloads
    from ledgergpt.config import DataError

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
    network = downloads.Network('http://127.0.0.1:9', backoff_s=0.001, retry_budget_s=0.05)
    with pytest.raises(DataError) as error:
        pretrained.folder('hf/pystdlib_cpu', network, weights=False)
    assert str(error.value).startswith(
        'hf/pystdlib_cpu (not a folder here, so asked of the Hub as a repo id): '
        'http://127.0.0.1:9/api/models/hf/pystdlib_cpu/revision/main: '
    )
    out = capsys.readouterr().out
    assert out.startswith(
        'hf/pystdlib_cpu: not a folder here, so a Hugging Face Hub repo id: asking the Hub'
    )
