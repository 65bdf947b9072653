"""
pretrained.py: start a run from a published model. `init_from` names a Hugging Face model folder (or a Hub repo id,
fetched into a cache: fetch below), and the run fine-tunes it, or continues its pretraining, on your data:

    python prepare.py files notes.txt --out data/notes --tokenizer hf/gpt2   # the model's own tokenizer
    python train.py configs/finetune_cpu.py --init_from=hf/gpt2 --data=data/notes

The model is this project's GPT, built from the folder's config.json (GPT2LMHeadModel -> arch gpt2,
LlamaForCausalLM -> arch llama: GQA, tied or untied, rope_theta, rms_norm_eps, intermediate_size; ArceeForCausalLM
a Llama with a ReLU² MLP, Qwen3ForCausalLM one with QK-norm's learned gains), its weights read
from model.safetensors (or the shards its index names) through export.py's name mapping read backwards: export's
llama_tensors/gpt2_tensors give, for each Hugging Face name, a slice or transpose of one of our parameters, which
is a view, so copying the file's tensor into it fills our parameter. One mapping, both directions.

A model key the config sets that contradicts config.json is one line (block_size may be shorter than the model's
context: RoPE needs nothing for it, GPT-2's learned positions keep their first block_size rows, as nanoGPT's
crop_block_size). A config.json field that model.py does not implement (rope_scaling, attention or MLP biases in a
Llama, a sliding window, another activation, another architecture) is one line naming it, never dropped. The
vocabulary is the checkpoint's, ids and size, unpadded: there are no rows a tokenizer cannot produce, so none can
be sampled or scored.

A run resumed from its own checkpoints reads its weights from them (train.py loads the checkpoint over these);
init_from still gives the model its shape, so the folder (or the cache) must stay.

Standard library at import (`python ledger.py` plans a fine-tune before torch is installed); torch, safetensors
and export.py are imported where the weights are read.
"""

import hashlib
import json
import os
import re

from ledgergpt import config
from ledgergpt.config import FAMILIES, PARTS, ConfigError, DataError

# Hugging Face class -> our arch, and the parts (config.PARTS) that are not the family's own: the classes
# export.py writes for a Llama with a ReLU² MLP (Arcee) or QK-norm (Qwen3's learned gains) come back as themselves
ARCHS = {family.hf_class: (arch, {}) for arch, family in FAMILIES.items()}
ARCHS.update(
    ArceeForCausalLM=('llama', {'mlp': 'relu2'}), Qwen3ForCausalLM=('llama', {'qk_norm': 'learned'})
)


# -----------------------------------------------------------------------------------------------------
# Where the model is: a local folder, or a Hub repo id downloaded into the cache.


def is_repo_id(name):
    """'owner/name' that is not a folder here: a Hub model repo."""
    return not os.path.exists(name) and name.count('/') == 1 and not name.startswith(('.', '/'))


def folder(init_from, network=None, weights=True):
    """The local folder of `init_from`: itself, or a Hub repo id's cached copy (downloaded once, verified; without
    its weights where weights=False: the ledger and a tokenizer need only the small files)."""
    if is_repo_id(init_from):
        return fetch(init_from, network, weights)
    if not os.path.isfile(os.path.join(init_from, 'config.json')):
        raise ConfigError(
            f"init_from = {init_from!r}: no config.json there; give a Hugging Face model folder (what "
            f"save_pretrained or export.py writes) or a Hub repo id such as 'openai-community/gpt2'"
        )
    return init_from


# A Hub repo id: only the files a run reads (the config, the weights and their index, the tokenizer), downloaded
# through downloads.py (resumable, sha256 from the listing, retries, HF_ENDPOINT, HF_TOKEN) into
# $XDG_CACHE_HOME/ledgergpt/models/OWNER--NAME/COMMIT/. A file named COMPLETE there, written last, holds the commit
# and lets every later command (prepare, train, resume, the ledger) use the copy without the network.
HUB_FILES = (
    'config.json',
    'generation_config.json',
    'model.safetensors.index.json',
    'tokenizer.json',
    'tokenizer_config.json',
    'special_tokens_map.json',
    'README.md',  # the model card: the tokens it was pretrained on, for the ledger (card_tokens)
)


def cache_dir(repo):
    root = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return os.path.join(root, 'ledgergpt', 'models', repo.replace('/', '--'))


def fetch(repo, network=None, weights=True):
    """The cached folder of a Hub model repo (its main branch), downloaded once: the files of HUB_FILES it has and,
    unless weights=False, its *.safetensors, each verified against the listing. A marker written last says what is
    there: COMPLETE (everything) or FILES (all but the weights, whose commit the weights are then fetched at)."""
    from ledgergpt.downloads import Hub, download, say
    from ledgergpt.files import write_text_atomic

    markers = {name: os.path.join(cache_dir(repo), name) for name in ('COMPLETE', 'FILES')}
    pinned = {}
    for name, path in markers.items():
        if os.path.isfile(path):
            with open(path) as f:
                pinned[name] = f.read().strip()
    if 'COMPLETE' in pinned or ('FILES' in pinned and not weights):
        return os.path.join(cache_dir(repo), pinned.get('COMPLETE') or pinned['FILES'])
    say(f"{repo}: not a folder here, so a Hugging Face Hub repo id: asking the Hub for it")
    hub = Hub(network)
    try:
        sha, listed = hub.files(repo, pinned.get('FILES', 'main'), '', '', kind='models')
    except DataError as e:  # a mistyped or not yet made folder reads as a repo id too: say so
        raise DataError(
            f"{repo} (not a folder here, so asked of the Hub as a repo id): {e}"
        ) from None
    wanted = [
        f
        for f in listed
        if f['path'] in HUB_FILES or (weights and f['path'].endswith('.safetensors'))
    ]
    if not any(f['path'] == 'config.json' for f in wanted):
        raise DataError(f"{repo} has no config.json at {sha}: not a transformers model repo")
    model_dir = os.path.join(cache_dir(repo), sha)
    os.makedirs(model_dir, exist_ok=True)
    what = 'files' if weights else 'files (not the weights: the first run fetches them)'
    say(f"init_from {repo}@{sha[:12]}: {len(wanted)} {what} into {model_dir}")
    for entry in wanted:
        download(
            hub,
            hub.url('models', repo, sha, entry['path']),
            os.path.join(model_dir, entry['path']),
            entry,
            b'',
        )
    write_text_atomic(markers['COMPLETE' if weights else 'FILES'], sha + '\n')
    return model_dir


def read_json(path):
    try:
        with open(path, 'rb') as f:
            return json.loads(f.read())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except ValueError as e:
        raise ConfigError(f"{path} is not valid JSON ({e})") from None


# -----------------------------------------------------------------------------------------------------
# config.json -> our model keys. Every field that changes what the model computes is either mapped or must have the
# value model.py implements; UNSUPPORTED lists the second kind, per class, with the value that is supported.

LLAMA_UNSUPPORTED = {
    'rope_scaling': None,  # Llama 3.1's, YaRN, linear or dynamic NTK scaling: our RoPE is plain
    'attention_bias': False,
    'mlp_bias': False,
    'sliding_window': None,
    'hidden_act': 'silu',
}
UNSUPPORTED = {
    'LlamaForCausalLM': LLAMA_UNSUPPORTED,
    'ArceeForCausalLM': {**LLAMA_UNSUPPORTED, 'hidden_act': 'relu2'},
    # Qwen3 writes a sliding_window it uses only where use_sliding_window is true
    'Qwen3ForCausalLM': {
        **{field: v for field, v in LLAMA_UNSUPPORTED.items() if field != 'sliding_window'},
        'use_sliding_window': False,
    },
    'GPT2LMHeadModel': {
        'scale_attn_weights': True,  # scores / sqrt(head_dim), as SDPA does
        'scale_attn_by_inverse_layer_idx': False,
        'add_cross_attention': False,
    },
}
GELU_TANH = ('gelu_new', 'gelu_pytorch_tanh')  # GPT-2's GELU, the tanh approximation model.py uses


def refuse(path, field, value, supported):
    raise ConfigError(
        f"{path}: {field} = {value!r} is not implemented by model.py (it supports {supported}): "
        f"init_from cannot start from this model"
    )


def llama_values(hf, path):
    rope = hf.get('rope_parameters') or {}  # transformers 5 keeps rope_theta (and the scaling) here
    if rope.get('rope_type', 'default') != 'default':
        refuse(path, 'rope_parameters.rope_type', rope['rope_type'], "'default'")
    heads, width = hf['num_attention_heads'], hf['hidden_size']
    if hf.get('head_dim') not in (None, width // heads):
        refuse(
            path,
            'head_dim',
            hf['head_dim'],
            f'hidden_size / num_attention_heads = {width // heads}',
        )
    return dict(
        arch='llama',
        n_layer=hf['num_hidden_layers'],
        n_head=heads,
        n_kv_head=hf.get('num_key_value_heads') or heads,
        n_embd=width,
        ffn_hidden=hf['intermediate_size'],
        vocab_size=hf['vocab_size'],
        block_size=hf.get('max_position_embeddings', 2048),
        tie_embeddings=hf.get('tie_word_embeddings', False),
        bias=False,
        norm_eps=float(hf.get('rms_norm_eps', 1e-6)),
        rope_theta=float(hf.get('rope_theta', rope.get('rope_theta', 10000.0))),
    )


def gpt2_values(hf, path):
    # the MLP rows GPT2LMHeadModel holds, by their Hugging Face activation (config.PARTS): GELU, ReLU²
    mlps = {row.hf_act: name for name, row in PARTS['mlp'].items() if 'GPT2LMHeadModel' in row.hf}
    mlps.update(dict.fromkeys(GELU_TANH, mlps['gelu_new']))
    act = hf.get('activation_function', 'gelu_new')
    if act not in mlps:
        refuse(path, 'activation_function', act, ' or '.join(map(repr, mlps)))
    width = hf.get('n_embd', 768)
    return dict(
        arch='gpt2',
        mlp='' if mlps[act] == FAMILIES['gpt2'].mlp else mlps[act],
        n_layer=hf.get('n_layer', 12),
        n_head=hf.get('n_head', 12),
        n_kv_head=0,
        n_embd=width,
        ffn_hidden=hf.get('n_inner') or 4 * width,
        vocab_size=hf.get('vocab_size', 50257),
        block_size=hf.get('n_positions', 1024),
        tie_embeddings=hf.get('tie_word_embeddings', True),
        bias=True,
        norm_eps=float(hf.get('layer_norm_epsilon', 1e-5)),
    )


VALUES = {'llama': llama_values, 'gpt2': gpt2_values}
assert set(ARCHS) == set(UNSUPPORTED)


def model_values(model_dir):
    """(Hugging Face class, our model keys) from a model folder's config.json; ConfigError naming the first field
    model.py does not implement."""
    path = os.path.join(model_dir, 'config.json')
    hf = read_json(path)
    classes = hf.get('architectures') or []
    if len(classes) != 1 or classes[0] not in ARCHS:
        refuse(path, 'architectures', classes, ' or '.join(f'[{name!r}]' for name in ARCHS))
    hf_class = classes[0]
    for field, supported in UNSUPPORTED[hf_class].items():
        if hf.get(field, supported) != supported:
            refuse(path, field, hf[field], repr(supported))
    arch, parts = ARCHS[hf_class]
    try:
        return hf_class, {**VALUES[arch](hf, path), **parts}
    except KeyError as e:
        raise ConfigError(f"{path} has no {e}: not a complete {hf_class} config") from None


def load_config(path=None, overrides=()):
    """config.load_config, and with init_from the model keys from the model's config.json. A model key the config
    file or the command line sets to another value is one line (block_size may be shorter than the model's)."""
    model_cfg, train = config.load_config(path, overrides)
    if not train.init_from:
        return model_cfg, train
    model_dir = folder(train.init_from, weights=False)
    hf_class, ours = model_values(model_dir)
    given, where = config.read_values(path, overrides)
    for key, value in given.items():
        if key in ours and value != ours[key] and not (key == 'block_size' and value <= ours[key]):
            raise ConfigError(
                f"{key} = {value!r} in {where[key]} contradicts init_from's config.json ({hf_class}: {key} = "
                f"{ours[key]!r}): leave {key} out, the model's shape comes from the checkpoint"
                + (" (block_size may be shorter than its context)" if key == 'block_size' else '')
            )
    if 'block_size' in given:
        ours.pop('block_size')
    check_tokenizer(train, model_dir)
    return config.load_config(
        path, [*overrides, *(f'--{key}={value}' for key, value in ours.items())]
    )


def check_tokenizer(train, model_dir):
    """A data folder tokenized with anything but the model's own tokenizer (prepare.py --tokenizer MODEL) is one
    line: its ids would name other tokens to the model. Checked by the sha256 of the model's tokenizer.json, which
    prepare.py keeps in the folder's (a model folder without one cannot be checked)."""
    ours, theirs = (
        os.path.join(model_dir, 'tokenizer.json'),
        os.path.join(train.data, 'tokenizer.json'),
    )
    if train.data == 'synthetic' or not (os.path.isfile(ours) and os.path.isfile(theirs)):
        return  # no data there yet: open_data says how to make it
    with open(ours, 'rb') as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    spec = read_json(theirs)
    if spec.get('sha256') != sha:
        raise DataError(
            f"{train.data} was tokenized with {spec.get('name')!r}, not with init_from's own tokenizer "
            f"({ours}): make the data with `python prepare.py files PATH... --out {train.data} --tokenizer "
            f"{train.init_from}` (or fineweb_edu, pystdlib)"
        )


def card_tokens(model_dir):
    """The tokens the model was pretrained on as its card (README.md) states them ('trained on 2 trillion tokens',
    '3T tokens'), or None where it does not say. The first such phrase counts: a card's summary comes first."""
    path = os.path.join(model_dir, 'README.md')
    if not os.path.isfile(path):
        return None
    with open(path, encoding='utf-8', errors='replace') as f:
        found = re.search(
            r'(\d+(?:\.\d+)?)\s*(trillion|billion|T|B)\s+tokens', f.read(), re.IGNORECASE
        )
    if not found:
        return None
    return round(float(found[1]) * (1e12 if found[2].lower() in ('t', 'trillion') else 1e9))


def describe(init_from):
    """The ledger's line for a run that starts from a checkpoint."""
    model_dir = folder(init_from, weights=False)
    hf_class, _ = model_values(model_dir)
    tokens = card_tokens(model_dir)
    seen = (
        f"{tokens / 1e9:,.4g}B tokens (its card)"
        if tokens
        else 'unknown tokens (no count in a model card)'
    )
    return (
        f"from: {init_from} ({hf_class}), pretrained on {seen}; full fine-tuning: every weight trains, so the "
        f"memory is a pretraining run's (weights, gradients, AdamW states, activations); the data and loss "
        f"sums below count this run's tokens only"
    )


# -----------------------------------------------------------------------------------------------------
# The weights. Names a file may hold besides the weights: GPT-2's causal-mask buffers and old Llama files' RoPE
# frequencies, constants our model computes itself; and lm_head.weight beside a tied embedding (the same tensor).

BUFFERS = ('.attn.bias', '.attn.masked_bias', '.rotary_emb.inv_freq')


def weight_files(model_dir):
    """model.safetensors, or the shards model.safetensors.index.json names, in order."""
    index = os.path.join(model_dir, 'model.safetensors.index.json')
    if os.path.isfile(index):
        names = sorted(set(read_json(index)['weight_map'].values()))
        return [os.path.join(model_dir, name) for name in names]
    single = os.path.join(model_dir, 'model.safetensors')
    if not os.path.isfile(single):
        raise ConfigError(
            f"{model_dir} has no model.safetensors (nor its index): init_from reads safetensors weights; "
            f"save the model with transformers' save_pretrained (safe_serialization, its default)"
        )
    return [single]


def hf_name(name, hf_class):
    """The name export.py gives a tensor of the file; None for what is not a weight of ours. GPT-2's original files
    (openai-community/gpt2) name the body's tensors without the 'transformer.' prefix."""
    if name.endswith(BUFFERS):
        return None
    if hf_class == 'GPT2LMHeadModel' and not name.startswith(('transformer.', 'lm_head.')):
        return 'transformer.' + name
    return name


def load_weights(model, init_from):
    """Copy the model folder's weights into `model` (a GPT built from its config, on any device, not yet wrapped or
    sharded): every tensor of ours from exactly one of the file's, converted to our dtype (exact from bf16 or fp32).
    A tensor missing, left over or of another shape is one ConfigError line."""
    import torch
    from safetensors import safe_open

    import export

    model_dir, c = folder(init_from), model.config
    # Hugging Face name -> a view of our parameter (see the docstring)
    hf_class = export.hf_class_of(c)
    targets = export.hf_tensors(model, hf_class)
    loaded = set()
    with torch.no_grad():
        for path in weight_files(model_dir):
            with safe_open(path, framework='pt') as f:
                for stored in f.keys():
                    name = hf_name(stored, hf_class)
                    if name is None or (name == 'lm_head.weight' and c.tie_embeddings):
                        continue
                    if name not in targets:
                        raise ConfigError(
                            f"{path}: tensor {stored} is not part of a {hf_class} as model.py builds it"
                        )
                    tensor, target = f.get_tensor(stored), targets[name]
                    # learned positions: the first block_size of them
                    if name == 'transformer.wpe.weight':
                        tensor = tensor[: c.block_size]
                    if tensor.shape != target.shape:
                        raise ConfigError(
                            f"{path}: {stored} has shape {tuple(tensor.shape)}, config.json makes it "
                            f"{tuple(target.shape)}: the weights and config.json disagree"
                        )
                    target.copy_(tensor)
                    loaded.add(name)
    missing = sorted(set(targets) - loaded)
    if missing:
        raise ConfigError(
            f"{model_dir}: the weights lack {missing[0]} ({len(missing)} tensor(s) missing)"
        )
    return model
