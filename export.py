"""
export.py: a checkpoint -> a Hugging Face folder that transformers, vLLM, lm-evaluation-harness and
llama.cpp's converter read as they read any model (docs/after-training.md: what it holds, --push,
--gguf, and what is tested).

    python export.py out/pystdlib_cpu hf/pystdlib_cpu        # the latest checkpoint, bf16 weights
    python export.py out/h200_1b3/ckpt/step_0049592 hf/1b3 --dtype float32
    python export.py out/pystdlib_cpu hf/pystdlib_cpu --push you/pystdlib-4x256  # and a model card
    python export.py out/pystdlib_cpu hf/pystdlib_cpu --gguf --dtype float16   # and model.gguf
"""

import argparse
import importlib.util
import json
import os
import re
import shutil
import sys

import torch

from ledgergpt import checkpoint, data, files, hf
from ledgergpt.config import DEFAULTS, EOT, EVAL_TASKS, PART_KEYS, ConfigError, UserError, cli

DTYPES = {'bfloat16': torch.bfloat16, 'float32': torch.float32, 'float16': torch.float16}


# --------------------------------------------------------------------------------------------------
# The tokenizer. tiktoken keeps a byte-level BPE as ranks alone (token bytes -> id; a lower rank was
# merged earlier); HF's `tokenizers` and llama.cpp want the vocab and the merge list, in GPT-2's
# printable alphabet. With ignore_merges (a whole pre-token in the vocab is one token, as tiktoken
# does) and merges in rank order, its BPE picks tiktoken's pairs: the same ids.


def bpe_parts(ranks, token, below_rank):
    """token's bytes merged by BPE using only the tokens of rank < below_rank: the lowest-ranked
    adjacent pair first, as tiktoken does."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while True:
        pairs = [(ranks.get(parts[i] + parts[i + 1], below_rank), i) for i in range(len(parts) - 1)]
        rank, i = min(pairs, default=(below_rank, None))
        if rank >= below_rank:
            return parts
        parts[i : i + 2] = [parts[i] + parts[i + 1]]


def bpe_merges(ranks):
    """The merge list that made the vocab, in rank order: the token of rank r is the two parts BPE
    stops at when allowed only the merges before it (as transformers' tiktoken converter does)."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) > 1:
            parts = bpe_parts(ranks, token, rank)
            if len(parts) != 2:
                raise UserError(
                    f"token {token!r} (id {rank}) is not one merge of two earlier tokens: the "
                    f"vocab is not a BPE merge sequence, which a Hugging Face BPE tokenizer needs"
                )
            merges.append(tuple(parts))
    return merges


def byte_level(ranks):
    """(vocab {spelled token: id}, merges [(left, right)]) in GPT-2's printable alphabet."""
    alphabet = data.byte_alphabet()
    spell = {token: ''.join(alphabet[b] for b in token) for token in ranks}
    vocab = {spell[token]: rank for token, rank in ranks.items()}
    return vocab, [(spell[left], spell[right]) for left, right in bpe_merges(ranks)]


def hf_tokenizer(encoding):
    """A tokenizers.Tokenizer that splits text with our regex, then runs our BPE on each piece's
    UTF-8 bytes; for neox (a data.HFEncoding) the Hub's own tokenizer, as it is."""
    if isinstance(encoding, data.HFEncoding):
        return encoding.special
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab, merges = byte_level(encoding._mergeable_ranks)
    special = encoding._special_tokens
    tokenizer = Tokenizer(models.BPE({**vocab, **special}, merges, ignore_merges=True))
    # our regex, pieces kept whole; then bytes -> GPT-2's alphabet, with no second split
    split = pre_tokenizers.Split(Regex(encoding._pat_str), behavior='isolated')
    to_alphabet = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([split, to_alphabet])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    return tokenizer


SPECIAL_TOKENS = ('bos_token', 'eos_token', 'pad_token')  # all our end-of-text token


def tokenizer_config(eot, block_size):
    """No token is added to the text (GPT-2's convention: the ids are ours); decode keeps spaces."""
    return {
        'tokenizer_class': 'PreTrainedTokenizerFast',
        **dict.fromkeys(SPECIAL_TOKENS, eot),
        'add_bos_token': False,
        'add_eos_token': False,
        'clean_up_tokenization_spaces': False,
        'model_max_length': block_size,
    }


# --------------------------------------------------------------------------------------------------
# The folder, written as OUT_DIR.tmp<pid> and renamed to OUT_DIR once complete: an earlier export
# there goes once the new one is in place; any other folder (or a file) is left alone.

FILES = ('config.json', 'generation_config.json', 'model.safetensors', 'tokenizer.json')
FILES += ('tokenizer_config.json', 'special_tokens_map.json')


def write_folder(folder, model, encoding, dtype):
    """Write the export's FILES into `folder` (which exists and is empty)."""
    from safetensors.torch import save_file

    c, eot_id, hf_class = model.config, encoding.eot_token, hf.hf_class_of(model.config)

    def write_json(name, obj):
        files.write_text_atomic(os.path.join(folder, name), json.dumps(obj, indent=2) + '\n')

    # the token every document starts with by its name: EOT, or a Hub tokenizer's (a Llama's '<s>')
    eot = encoding.plain.id_to_token(eot_id) if isinstance(encoding, data.HFEncoding) else EOT
    tensors = hf.hf_tensors(model, hf_class)
    tensors = {name: t.to(DTYPES[dtype]).contiguous() for name, t in tensors.items()}
    save_file(tensors, os.path.join(folder, 'model.safetensors'), metadata={'format': 'pt'})
    ids = dict.fromkeys((f'{name}_id' for name in SPECIAL_TOKENS), eot_id)
    config = {**hf.hf_config(c, hf_class), 'tie_word_embeddings': c.tie_embeddings, **ids}
    write_json('config.json', {**config, 'torch_dtype': dtype})
    write_json('generation_config.json', ids)
    hf_tokenizer(encoding).save(os.path.join(folder, 'tokenizer.json'))
    write_json('tokenizer_config.json', tokenizer_config(eot, c.block_size))
    write_json('special_tokens_map.json', dict.fromkeys(SPECIAL_TOKENS, eot))


def require(why, *modules):
    """UserError naming the pip command where a package is missing (imported where used)."""
    if not all(importlib.util.find_spec(module) for module in modules):
        raise UserError(f"{why}: pip install {' '.join(modules)}")


def export(path, out_dir, dtype='bfloat16', card=None, gguf=False):
    """The checkpoint at `path` (a run's out_dir or a ckpt/step_*) to out_dir; -> (checkpoint,
    model). card: a Hub repo id for README.md, the model card; gguf: model.gguf too."""
    require('export.py needs safetensors and tokenizers', 'safetensors', 'tokenizers')
    if gguf:
        require("export.py --gguf needs llama.cpp's gguf package", 'gguf')
    taken = os.path.exists(out_dir) and not os.path.isfile(os.path.join(out_dir, 'config.json'))
    if taken and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise ConfigError(
            f"{out_dir} exists and is not an export (no config.json): choose a new folder"
        )
    path = checkpoint.find(path)
    model, train_config = checkpoint.load_model(path, torch.device('cpu'))
    if train_config['data'] == 'synthetic':
        raise ConfigError(
            f"{path} was trained on synthetic tokens: there is no tokenizer to export with it"
        )
    encoding = data.load_tokenizer(train_config['data'])
    hf.check_exportable(model.config, encoding.n_vocab)
    if gguf:
        gguf_class(model.config)  # before anything is written
    out_dir = os.path.abspath(out_dir)
    tmp, old = f'{out_dir}.tmp{os.getpid()}', f'{out_dir}.old{os.getpid()}'
    loss_png = os.path.join(os.path.dirname(os.path.dirname(path)), 'loss.png')  # RUN/ckpt/step_*
    size = sum(p.numel() for p in model.parameters()) * DTYPES[dtype].itemsize
    with files.disk_errors(os.path.dirname(out_dir), needed_bytes=size):
        os.makedirs(tmp)
        try:
            write_folder(tmp, model, encoding, dtype)
            if gguf:
                write_gguf(os.path.join(tmp, 'model.gguf'), model, encoding, dtype, out_dir)
            if card:
                readme = model_card(path, model, train_config, dtype, card)
                files.write_text_atomic(os.path.join(tmp, 'README.md'), readme)
                if os.path.exists(loss_png):
                    shutil.copyfile(loss_png, os.path.join(tmp, 'loss.png'))
            if os.path.exists(out_dir):
                os.rename(out_dir, old)
            os.rename(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return path, model


# --------------------------------------------------------------------------------------------------
# GGUF, llama.cpp's file, from the Hugging Face tensors (the layouts stay in one place) with
# llama.cpp's gguf package: renamed by its map, changed as convert_hf_to_gguf.py changes them
# (LlamaModel.permute: a head's row j of 64 goes to 2j for j < 32, to 2(j - 32) + 1 after, for an
# adjacent-pair RoPE), the tokenizer named for llama.cpp (llama-vocab.cpp: GPT-2's split is 'gpt-2',
# ours, GPT-4's cl100k, 'llama-bpe'); docs/after-training.md says what else and what is tested.

GGUF_FILE_TYPES = {'float32': 'ALL_F32', 'float16': 'MOSTLY_F16', 'bfloat16': 'MOSTLY_BF16'}
CL100K = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|"""
    r"""\s*[\r\n]|\s+(?!\S)|\s+"""
)


def gguf_class(c):
    """The Hugging Face class whose llama.cpp architecture computes this model (each part's row
    names the classes whose does: config.PARTS' gguf), else one line."""
    hf_class = hf.hf_class_of(c)
    arch = hf.LAYOUTS[hf_class][2].lower()
    for kind in PART_KEYS:
        if not {hf_class, '*'} & set(c.part(kind).gguf):
            raise ConfigError(
                f"--gguf: llama.cpp's {arch} architecture has no {kind} = "
                f"{c.part_name(kind)!r}: export the Hugging Face folder alone (without --gguf)"
            )
    return hf_class


def gguf_pre_tokenizer(encoding):
    """llama.cpp's name for the encoding's regex split, or UserError."""
    from tiktoken_ext.openai_public import r50k_pat_str

    if isinstance(encoding, data.HFEncoding):
        raise UserError(
            "a GGUF file of a Hub tokenizer's data (GPT-NeoX's) is not written by export.py: "
            "convert the Hugging Face folder with llama.cpp's convert_hf_to_gguf.py"
        )
    names = {r50k_pat_str: 'gpt-2', CL100K: 'llama-bpe'}
    if encoding._pat_str not in names:
        raise UserError(
            f"llama.cpp has no pre-tokenizer known to export.py for this tokenizer's regex "
            f"{encoding._pat_str!r}: no GGUF file (the Hugging Face folder is written)"
        )
    return names[encoding._pat_str]


def gguf_vocab(writer, encoding, vocab_size, pre):
    """The tokenizer: every id below vocab_size named, ours first, then the padding."""
    import gguf

    vocab, merges = byte_level(encoding._mergeable_ranks)
    tokens = [f'[PAD{i}]' for i in range(vocab_size)]
    types = [gguf.TokenType.UNUSED] * vocab_size
    normal, control = gguf.TokenType.NORMAL, gguf.TokenType.CONTROL
    for kind, words in ((normal, vocab), (control, encoding._special_tokens)):
        for text, rank in words.items():
            tokens[rank], types[rank] = text, kind
    writer.add_tokenizer_model('gpt2')
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([f'{left} {right}' for left, right in merges])
    for add in (writer.add_bos_token_id, writer.add_eos_token_id, writer.add_pad_token_id):
        add(encoding.eot_token)
    writer.add_add_bos_token(False)  # a prompt starts with end-of-text as its ids say (sample.py's)


# our config's value under each llama.cpp key (GGUFWriter.add_KEY), in the order written: every
# model's, then Llama's (arcee, qwen3 too) or GPT-2's
GGUF_KEYS = 'context_length:block_size embedding_length:n_embd feed_forward_length:ffn_width '
GGUF_KEYS += 'block_count:n_layer head_count:n_head '
LLAMA_GGUF_KEYS = 'head_count_kv:kv_heads rope_freq_base:rope_theta layer_norm_rms_eps:norm_eps '
LLAMA_GGUF_KEYS += 'rope_dimension_count:head_dim key_length:head_dim value_length:head_dim '
LLAMA_GGUF_KEYS += 'vocab_size:vocab_size'


def write_gguf(path, model, encoding, dtype, out_dir):
    """model.gguf: the hyperparameters, the tokenizer, the weights in dtype; named for out_dir."""
    import gguf

    c, hf_class, pre = model.config, gguf_class(model.config), gguf_pre_tokenizer(encoding)
    _, _, arch, adjacent_pairs = hf.LAYOUTS[hf_class]
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[getattr(gguf.MODEL_ARCH, arch)])
    writer.add_name(os.path.basename(out_dir))
    conv1d = hf_class == 'GPT2LMHeadModel'
    keys = GGUF_KEYS + ('layer_norm_eps:norm_eps' if conv1d else LLAMA_GGUF_KEYS)
    for key, attr in (pair.split(':') for pair in keys.split()):
        getattr(writer, f'add_{key}')(getattr(c, attr))
    writer.add_file_type(getattr(gguf.LlamaFileType, GGUF_FILE_TYPES[dtype]))
    gguf_vocab(writer, encoding, c.vocab_size, pre)
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch), c.n_layer)
    tensors = hf.hf_tensors(model, hf_class)
    if conv1d:
        tensors.setdefault('lm_head.weight', tensors['transformer.wte.weight'])
    for hf_name, tensor in tensors.items():
        name = names.get_name(hf_name, try_suffixes=('.weight', '.bias'))
        if adjacent_pairs and hf_name.endswith(('q_proj.weight', 'k_proj.weight')):
            heads = c.n_head if 'q_proj' in hf_name else c.kv_heads
            halves = tensor.reshape(heads, 2, tensor.shape[0] // heads // 2, -1)
            tensor = halves.transpose(1, 2).reshape(tensor.shape)
        if conv1d and tensor.dim() == 2 and '.h.' in hf_name:
            tensor = tensor.t()  # Conv1D (in, out) -> (out, in)
        if tensor.dim() > 1 and dtype == 'bfloat16':
            # numpy has no bfloat16: its bits, typed by the header
            bits = tensor.to(torch.bfloat16).contiguous().view(torch.int16).numpy()
            writer.add_tensor(name, bits, raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:  # 1-D tensors (norms, biases) stay float32
            as_type = torch.float32 if tensor.dim() == 1 else DTYPES[dtype]
            writer.add_tensor(name, tensor.to(as_type).contiguous().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# --------------------------------------------------------------------------------------------------
# The Hub: the folder and a model card made from the run, pushed in one commit (a failed push leaves
# the repo as it was; rerun, the files the Hub has by their sha256 are not sent again).

EVAL_KEYS = ('hellaswag', *EVAL_TASKS)  # evals.py's headline figures, as train.py records them
USE = """## Use

Every training document started with the end-of-text token: start a prompt with it.

```python
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained('{repo}')
tokenizer = AutoTokenizer.from_pretrained('{repo}')
ids = [tokenizer.bos_token_id] + tokenizer('def main(', add_special_tokens=False).input_ids
print(tokenizer.decode(model.generate(torch.tensor([ids]), max_new_tokens=32)[0, 1:]))
```"""


def train_command(model_config, train_config):
    """`python train.py --key=value ...` with every key the run set away from config.py's defaults:
    the command that makes this model again (its config file folded in)."""
    keys = {**model_config, **train_config}
    changed = {k: v for k, v in keys.items() if k in DEFAULTS and v != DEFAULTS[k]}

    def text(value):
        return ','.join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)

    return 'python train.py ' + ' '.join(f'--{k}={text(v)}' for k, v in changed.items())


def card_scores(summary, records):
    """The card's scores: the val loss, and evals.py's latest of each headline task."""
    scores = []
    if summary.get('val_bpb') is not None:
        loss, bpb = summary['val_loss'], summary['val_bpb']
        scores.append(f"- val loss {loss:.4f} nats per token, {bpb:.4f} bits per byte")
    for key in EVAL_KEYS:
        for r in [r for r in records if r.get(key) is not None][-1:]:
            scores.append(
                f"- {key} {r[key]:.2%} +- {r[key + '_stderr']:.2%} over {r[key + '_items']:,} "
                f"items (step {r['step']:,})"
            )
    return ['', '## Scores', '', *scores] if scores else []


def model_card(path, model, train_config, dtype, repo_id):
    """README.md, from the checkpoint and its run's folder (summary.json, report.md, metrics.jsonl,
    code.json: all optional)."""
    c, state = model.config, checkpoint.read_state(path)
    run_dir = os.path.dirname(os.path.dirname(path))  # RUN/ckpt/step_*

    def read(name):
        where = os.path.join(run_dir, name)
        return open(where).read() if os.path.exists(where) else ''

    params = sum(p.numel() for p in model.parameters())
    meta = data.load_meta(train_config['data']) if os.path.isdir(train_config['data']) else {}
    kv = f' ({c.kv_heads} key/value heads)' if c.kv_heads != c.n_head else ''
    lines = ['---', 'library_name: transformers', 'pipeline_tag: text-generation']
    lines += ['tags: [ledgergpt, pretrained-from-scratch]', '---', f'# {os.path.basename(run_dir)}']
    lines += [
        '',
        f"A {c.arch} model ({hf.hf_class_of(c)}) pretrained from scratch by ledgergpt's train.py: "
        f"{params:,} parameters, {c.n_layer} layers, width {c.n_embd}, {c.n_head} heads{kv}, FFN "
        f"width {c.ffn_width}, context {c.block_size} tokens, vocab {c.vocab_size:,}, embeddings "
        f"{'tied' if c.tie_embeddings else 'untied'}; weights in {dtype}.",
        '',
        '## Data and tokens',
        '',
        f"{os.path.basename(os.path.normpath(train_config['data']))}"
        + (f" ({meta['source']}, tokenizer {meta['tokenizer']})" if meta else '')
        + f": {state['run']['tokens_seen']:,} tokens seen in {state['run']['step']:,} steps "
        f"(planned: {train_config['train_tokens']:,}).",
    ]
    if read('report.md'):
        table = read('report.md').split('\n![')[0].split('\n(no loss.png')[0].strip()
        table = re.sub(r' \(cache: [^)]*\)', '', table)  # this machine's probe cache is its own
        lines += ['', "## The ledger's prediction and what the run measured", '', table]
        if os.path.exists(os.path.join(run_dir, 'loss.png')):
            lines += ['', '![train and val loss against tokens seen](loss.png)']
    records = [json.loads(line) for line in read('metrics.jsonl').splitlines() if line]
    lines += card_scores(json.loads(read('summary.json') or '{}'), records)
    command = train_command(state['model_config'], train_config)
    lines += ['', '## How it was made', '', '```', command, '```']
    code = json.loads(read('code.json') or '{}')
    if code.get('commit'):
        dirty = ' with local changes' if code['dirty'] else ''
        lines.append(f"at ledgergpt commit {code['commit']}{dirty}")
    return '\n'.join([*lines, '', USE.format(repo=repo_id)]) + '\n'


def push(folder, repo_id, private=False):
    """Upload the export folder to the Hub repo repo_id (made if new) in one commit; -> its URL."""
    require('export.py --push needs huggingface_hub', 'huggingface_hub')
    from huggingface_hub import HfApi

    # HF_ENDPOINT and HF_TOKEN read now, not when huggingface_hub was imported; none: a saved login
    env = {'endpoint': os.environ.get('HF_ENDPOINT'), 'token': os.environ.get('HF_TOKEN')}
    api = HfApi(**{key: value or None for key, value in env.items()})
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        message = 'ledgergpt export.py'
        commit = api.upload_folder(repo_id=repo_id, folder_path=folder, commit_message=message)
    # any failure, an HTTP status or a network error of whichever HTTP client huggingface_hub has
    except Exception as e:
        # no answer (the network), or the Hub's 429 or 5xx, may pass; a 4xx, or an id that
        # huggingface_hub refuses itself (HFValidationError, a ValueError), fails again
        status = getattr(getattr(e, 'response', None), 'status_code', None)
        transient = (status == 429 or status >= 500) if status else not isinstance(e, ValueError)
        advice = (
            'run the same command again to complete it'
            if transient
            else "the Hub refused it: fix the repo id (owner/name: letters, digits, '-', '_', '.') "
            "or the token (HF_TOKEN or `hf auth login`, one that may write there), then run again"
        )
        # the error's first line, and the Hub's own reason, which huggingface_hub puts below it
        first, server = str(e).split('\n')[0], (getattr(e, 'server_message', None) or '').strip()
        reason = f"{first} {server.splitlines()[0]}" if server else first
        raise UserError(
            f"the push to {repo_id} failed ({type(e).__name__}: {reason}): the repo is as it "
            f"was (one commit or none); {advice}"
        ) from None
    return commit.commit_url


@cli
def main(argv):
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n')[1], formatter_class=argparse.RawTextHelpFormatter
    )
    add = parser.add_argument
    add('checkpoint', help="a run's out_dir (latest checkpoint) or a ckpt/step_* folder")
    add('out_dir', help='the folder to write (an earlier export there is replaced)')
    add('--dtype', default='bfloat16', choices=list(DTYPES), help='weight dtype (default bfloat16)')
    to_hub = 'also upload the folder, with a model card, to this Hub repo (HF_TOKEN, HF_ENDPOINT)'
    add('--push', metavar='REPO_ID', help=to_hub)
    add('--private', action='store_true', help='with --push: a new repo is private')
    add('--gguf', action='store_true', help='also model.gguf, for llama.cpp (pip install gguf)')
    args = parser.parse_args(argv)
    path, model = export(args.checkpoint, args.out_dir, args.dtype, card=args.push, gguf=args.gguf)
    if args.push:
        print(f"pushed to {args.push}: {push(args.out_dir, args.push, args.private)}")
    params = sum(p.numel() for p in model.parameters())
    print(
        f"{args.out_dir}: {hf.hf_class_of(model.config)}, {params:,} parameters in {args.dtype}, "
        f"from {path}\n"
        f"  from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        f"  model = AutoModelForCausalLM.from_pretrained('{args.out_dir}')\n"
        f"  tokenizer = AutoTokenizer.from_pretrained('{args.out_dir}')"
    )
    return 0


if __name__ == '__main__':
    sys.exit(main())
