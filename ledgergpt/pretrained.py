"""
pretrained.py: start a run from a published model: `init_from` names a Hugging Face model folder or
a Hub repo id (fetched into a cache), and the run fine-tunes it or continues its pretraining. Our
GPT, its keys from config.json and its weights through hf.py's tables read backwards
(docs/finetuning.md: what is checked).

    python prepare.py files notes.txt --out data/notes --tokenizer hf/gpt2   # the model's tokenizer
    python train.py configs/finetune_cpu.py --init_from=hf/gpt2 --data=data/notes

Standard library at import: `python ledger.py` plans a fine-tune before torch is installed.
"""

import hashlib
import os
import pathlib
import re

from ledgergpt import config, sums
from ledgergpt.config import FAMILIES, PARTS, ConfigError, DataError
from ledgergpt.files import load_json, write_text_atomic
from ledgergpt.hf import CLASSES, FIELDS, hf_class_of, hf_tensors

# GPT-2's GELU, the tanh approximation, by either name
GELU_TANH = {'gelu_pytorch_tanh': 'gelu_new'}


# --------------------------------------------------------------------------------------------------
# Where the model is: a local folder, or a Hub repo id downloaded into the cache.


def is_repo_id(name):
    """'owner/name' that is not a folder here: a Hub model repo."""
    return not os.path.exists(name) and name.count('/') == 1 and not name.startswith(('.', '/'))


def folder(init_from, network=None, weights=True):
    """The local folder of `init_from`: itself, or a Hub repo id's cached copy (downloaded once,
    verified; without its weights where weights=False: a ledger or a tokenizer needs the rest)."""
    if is_repo_id(init_from):
        return fetch(init_from, network, weights)
    if not os.path.isfile(os.path.join(init_from, 'config.json')):
        raise ConfigError(
            f"init_from = {init_from!r}: no config.json there; give a Hugging Face model folder "
            f"(what save_pretrained or export.py writes) or a Hub repo id such as "
            f"'openai-community/gpt2'"
        )
    return init_from


# A Hub repo id: HUB_FILES and the weights into $XDG_CACHE_HOME/ledgergpt/models/OWNER--NAME/SHA/
# (docs/finetuning.md). A marker written last, COMPLETE (everything) or FILES (all but the weights,
# fetched later at its commit), holds the commit: later commands need no network. The model card
# (README.md) gives the ledger the tokens the model was pretrained on (card_tokens).
HUB_FILES = ('config.json', 'generation_config.json', 'model.safetensors.index.json')
HUB_FILES += ('tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json', 'README.md')


def cache_dir(repo):
    return os.path.join(os.path.dirname(sums.cache_path()), 'models', repo.replace('/', '--'))


def fetch(repo, network=None, weights=True):
    """The cached folder of a Hub model repo (its main branch): the files of HUB_FILES it has and,
    unless weights=False, its *.safetensors, each verified against the listing."""
    from ledgergpt.downloads import Hub, download, say

    root = cache_dir(repo)
    markers = {marker: pathlib.Path(root, marker) for marker in ('COMPLETE', 'FILES')}
    pinned = {marker: p.read_text().strip() for marker, p in markers.items() if p.is_file()}
    if 'COMPLETE' in pinned or ('FILES' in pinned and not weights):
        return os.path.join(root, pinned.get('COMPLETE') or pinned['FILES'])
    say(f"{repo}: not a folder here, so a Hugging Face Hub repo id: asking the Hub for it")
    hub = Hub(network)
    try:
        sha, listed = hub.files(repo, pinned.get('FILES', 'main'), '', '', kind='models')
    except DataError as e:  # a mistyped or not yet made folder reads as a repo id too: say so
        asked = f"{repo} (not a folder here, so asked of the Hub as a repo id)"
        raise DataError(f"{asked}: {e}") from None
    suffixes = ('.safetensors',) if weights else ()
    wanted = [f for f in listed if f['path'] in HUB_FILES or f['path'].endswith(suffixes)]
    if not any(f['path'] == 'config.json' for f in wanted):
        raise DataError(f"{repo} has no config.json at {sha}: not a transformers model repo")
    model_dir = os.path.join(root, sha)
    what = 'files' if weights else 'files (not the weights: the first run fetches them)'
    say(f"init_from {repo}@{sha[:12]}: {len(wanted)} {what} into {model_dir}")
    for entry in wanted:
        path = entry['path']
        download(hub, hub.url('models', repo, sha, path), os.path.join(model_dir, path), entry, b'')
    write_text_atomic(os.path.join(root, 'COMPLETE' if weights else 'FILES'), sha + '\n')
    return model_dir


def read_json(path):
    try:
        return load_json(path)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except ValueError as e:
        raise ConfigError(f"{path} is not valid JSON ({e})") from None


# --------------------------------------------------------------------------------------------------
# config.json -> our model keys: every field that changes what the model computes is read (FIELDS)
# or must have the value model.py implements (CLASSES).


def refuse(path, field, value, supported):
    raise ConfigError(
        f"{path}: {field} = {value!r} is not implemented by model.py (it supports {supported}): "
        f"init_from cannot start from this model"
    )


def field_value(hf, field, default):
    """config.json's value of field, or transformers' default (FIELDS); KeyError if it has none."""
    if hf.get(field) is not None:
        return hf[field]
    if default is None:
        raise KeyError(field)
    return default(hf) if callable(default) else default


def mlp_key(path, hf_class, field, act):
    """Our mlp key for config.json's activation: the row of PARTS['mlp'] that holds the class and
    computes it, '' for the family's own (config.json's '': the class's first)."""
    acts = {row.hf_act: name for name, row in PARTS['mlp'].items() if hf_class in row.hf}
    act = GELU_TANH.get(act, act) or next(iter(acts))
    if act not in acts:
        refuse(path, field, act, ' or '.join(map(repr, acts)))
    return '' if acts[act] == FAMILIES[CLASSES[hf_class][0]].mlp else acts[act]


def model_values(model_dir):
    """(Hugging Face class, our model keys) from a model folder's config.json; ConfigError naming
    the first field model.py does not implement."""
    path = os.path.join(model_dir, 'config.json')
    hf = read_json(path)
    classes = hf.get('architectures') or []
    if len(classes) != 1 or classes[0] not in CLASSES:
        refuse(path, 'architectures', classes, ' or '.join(f'[{name!r}]' for name in CLASSES))
    hf_class = classes[0]
    arch, _, parts, fixed = CLASSES[hf_class]
    for field, supported in fixed.items():
        if hf.get(field, supported) != supported:
            refuse(path, field, hf[field], repr(supported))
    hf = {**(hf.get('rope_parameters') or {}), **hf}  # transformers 5 keeps rope_theta there
    if hf.get('rope_type', 'default') != 'default':
        refuse(path, 'rope_parameters.rope_type', hf['rope_type'], "'default'")
    ours = {'arch': arch}
    try:
        for field, (key, default) in FIELDS[arch].items():
            value = field_value(hf, field, default)
            if key == 'head_dim' and value != (width := ours['n_embd'] // ours['n_head']):
                refuse(path, field, value, f'hidden_size / num_attention_heads = {width}')
            ours.setdefault(key, mlp_key(path, hf_class, field, value) if key == 'mlp' else value)
    except KeyError as e:
        raise ConfigError(f"{path} has no {e}: not a complete {hf_class} config") from None
    ours.pop('head_dim', None)
    ours.setdefault('n_kv_head', 0)  # GPT-2's: one key/value head per query head
    family = FAMILIES[arch]
    tie = hf.get('tie_word_embeddings', family.tie_embeddings)
    return hf_class, {**ours, 'tie_embeddings': tie, 'bias': family.bias, **parts}


def load_config(path=None, overrides=()):
    """config.load_config, and with init_from the model keys from its config.json. A key the config
    or the command line sets to another value is one line (block_size may be shorter)."""
    model_cfg, train = config.load_config(path, overrides)
    if not train.init_from:
        return model_cfg, train
    model_dir = folder(train.init_from, weights=False)
    hf_class, ours = model_values(model_dir)
    given, where = config.read_values(path, overrides)
    for key, value in given.items():
        if key in ours and value != ours[key] and not (key == 'block_size' and value <= ours[key]):
            raise ConfigError(
                f"{key} = {value!r} in {where[key]} contradicts init_from's config.json "
                f"({hf_class}: {key} = {ours[key]!r}): leave {key} out, the model's shape comes "
                f"from the checkpoint"
                + (" (block_size may be shorter than its context)" if key == 'block_size' else '')
            )
    if 'block_size' in given:
        ours.pop('block_size')
    check_tokenizer(train, model_dir)
    overrides = [*overrides, *(f'--{key}={value}' for key, value in ours.items())]
    return config.load_config(path, overrides)


def check_tokenizer(train, model_dir):
    """Data tokenized with anything but the model's own tokenizer (prepare.py --tokenizer MODEL) is
    one line: its ids would name other tokens to the model. Checked by the sha256 of the model's
    tokenizer.json, which prepare.py keeps in the folder's (a model without one goes unchecked)."""
    ours = os.path.join(model_dir, 'tokenizer.json')
    theirs = os.path.join(train.data, 'tokenizer.json')
    if train.data == 'synthetic' or not (os.path.isfile(ours) and os.path.isfile(theirs)):
        return  # no data there yet: open_data says how to make it
    sha = hashlib.sha256(pathlib.Path(ours).read_bytes()).hexdigest()
    spec = read_json(theirs)
    if spec.get('sha256') != sha:
        raise DataError(
            f"{train.data} was tokenized with {spec.get('name')!r}, not with init_from's own "
            f"tokenizer ({ours}): make the data with `python prepare.py files PATH... --out "
            f"{train.data} --tokenizer {train.init_from}` (or fineweb_edu, pystdlib)"
        )


def card_tokens(model_dir):
    """The tokens the model was pretrained on as its card (README.md) states them ('trained on 2
    trillion tokens', '3T tokens'), or None. The first such phrase counts: a summary comes first."""
    path = pathlib.Path(model_dir, 'README.md')
    card = path.read_text(encoding='utf-8', errors='replace') if path.is_file() else ''
    found = re.search(r'(\d+(?:\.\d+)?)\s*(trillion|billion|T|B)\s+tokens', card, re.I)
    scale = {'t': 1e12, 'trillion': 1e12, 'b': 1e9, 'billion': 1e9}
    return round(float(found[1]) * scale[found[2].lower()]) if found else None


def describe(init_from):
    """The ledger's line for a run that starts from a checkpoint."""
    model_dir = folder(init_from, weights=False)
    hf_class, _ = model_values(model_dir)
    seen = 'unknown tokens (no count in a model card)'
    if tokens := card_tokens(model_dir):
        seen = f"{tokens / 1e9:,.4g}B tokens (its card)"
    return (
        f"from: {init_from} ({hf_class}), pretrained on {seen}; full fine-tuning: every weight "
        f"trains, so the memory is a pretraining run's (weights, gradients, AdamW states, "
        f"activations); the data and loss sums below count this run's tokens only"
    )


# --------------------------------------------------------------------------------------------------
# The weights. A file may hold besides them GPT-2's causal-mask buffers and old Llama files' RoPE
# frequencies, which our model computes itself, and lm_head.weight beside a tied embedding.

BUFFERS = ('.attn.bias', '.attn.masked_bias', '.rotary_emb.inv_freq')


def weight_files(model_dir):
    """model.safetensors, or the shards model.safetensors.index.json names, in order."""
    index = os.path.join(model_dir, 'model.safetensors.index.json')
    if os.path.isfile(index):
        names = sorted(set(read_json(index)['weight_map'].values()))
        return [os.path.join(model_dir, name) for name in names]
    if not os.path.isfile(os.path.join(model_dir, 'model.safetensors')):
        raise ConfigError(
            f"{model_dir} has no model.safetensors (nor its index): init_from reads safetensors "
            f"weights; save the model with transformers' save_pretrained (safe_serialization)"
        )
    return [os.path.join(model_dir, 'model.safetensors')]


def hf_name(name, hf_class):
    """The name export.py gives a tensor of the file; None for what is not a weight of ours. GPT-2's
    original files (openai-community/gpt2) name the body's tensors without 'transformer.'."""
    if name.endswith(BUFFERS):
        return None
    if hf_class == 'GPT2LMHeadModel' and not name.startswith(('transformer.', 'lm_head.')):
        return 'transformer.' + name
    return name


def load_weights(model, init_from):
    """Copy the model folder's weights into `model` (a GPT built from its config, on any device, not
    yet wrapped or sharded): every tensor of ours from exactly one of the file's, in our dtype
    (exact from bf16 or fp32). A tensor missing, left over or of another shape is one line."""
    from safetensors import safe_open

    model_dir, c, hf_class = folder(init_from), model.config, hf_class_of(model.config)
    # Hugging Face name -> a view of our parameter (detached: copy_ into it needs no no_grad)
    targets = hf_tensors(model, hf_class)
    loaded = set()
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
                if name == 'transformer.wpe.weight':  # learned positions: the first block_size
                    tensor = tensor[: c.block_size]
                if tensor.shape != target.shape:
                    raise ConfigError(
                        f"{path}: {stored} has shape {tuple(tensor.shape)}, config.json makes "
                        f"it {tuple(target.shape)}: the weights and config.json disagree"
                    )
                target.copy_(tensor)
                loaded.add(name)
    missing = sorted(set(targets) - loaded)
    if missing:
        raise ConfigError(
            f"{model_dir}: the weights lack {missing[0]} ({len(missing)} tensor(s) missing)"
        )
    return model
