"""
export.py: a checkpoint -> a Hugging Face folder that transformers, vLLM, lm-evaluation-harness and llama.cpp's
converter read as they read any model.

    python export.py out/pystdlib_cpu hf/pystdlib_cpu                  # the run's latest checkpoint, bf16 weights
    python export.py out/h200_1b3/ckpt/step_0049592 hf/1b3 --dtype float32
    python export.py out/pystdlib_cpu hf/pystdlib_cpu --push you/pystdlib-4x256   # and to the Hub, with a model card
    python export.py out/pystdlib_cpu hf/pystdlib_cpu --gguf --dtype float16   # also hf/pystdlib_cpu/model.gguf

The model becomes its family's Hugging Face class (config.FAMILIES: llama LlamaForCausalLM, gpt2 GPT2LMHeadModel),
or the class that holds its parts (config.PARTS: a Llama with QK-norm is a Qwen3, with a ReLU² MLP an Arcee):
the layers are the same maths, only the names and layouts differ (below). The folder holds config.json,
generation_config.json, model.safetensors and the tokenizer the run's data was made with, as a fast byte-level BPE
(tokenizer.json, tokenizer_config.json, special_tokens_map.json) that encodes any text to the same ids as ours
(GPT-NeoX's is the Hub's own file). The model keeps its vocab padded to a multiple of 128 (those rows were never a
target, and a tokenizer never produces their ids); bos, eos and pad are all our end-of-text token, which also starts
every training document: start a prompt with it, as sample.py does.

Needs safetensors and tokenizers (pip install safetensors tokenizers), imported only when a folder is written.
"""

import argparse
import json
import os
import re
import shutil
import sys

import torch

from ledgergpt import checkpoint, data, files
from ledgergpt.config import DEFAULTS, EOT, FAMILIES, PART_KEYS, ConfigError, UserError, cli

DTYPES = {'bfloat16': torch.bfloat16, 'float32': torch.float32, 'float16': torch.float16}


# -----------------------------------------------------------------------------------------------------
# Weights. Llama: our fused qkv_proj rows are the q heads, then the k heads, then the v heads (model.Attention), so
# q_proj, k_proj and v_proj are three row slices of it; gate_up_proj is gate then up (Arcee, Llama with a ReLU² MLP,
# has up_proj and down_proj alone). Our RoPE pairs the first half of each head with the second half, which is HF
# Llama's rotate_half layout: no permutation of q or k is needed.


def llama_tensors(model):
    c, ours = model.config, model.state_dict()
    q, kv = c.n_head * c.head_dim, c.kv_heads * c.head_dim
    tensors = {
        'model.embed_tokens.weight': ours['tok_emb.weight'],
        'model.norm.weight': ours['norm_f.weight'],
    }
    for i in range(c.n_layer):
        block, layer = f'blocks.{i}.', f'model.layers.{i}.'
        qkv = ours[block + 'attn.qkv_proj.weight']
        if c.part_name('mlp') == 'swiglu':
            gate, up = ours[block + 'mlp.gate_up_proj.weight'].split(c.ffn_width)
            tensors[layer + 'mlp.gate_proj.weight'] = gate
        else:  # Arcee's
            up = ours[block + 'mlp.up_proj.weight']
        tensors.update(
            {
                layer + 'input_layernorm.weight': ours[block + 'attn_norm.weight'],
                layer + 'self_attn.q_proj.weight': qkv[:q],
                layer + 'self_attn.k_proj.weight': qkv[q : q + kv],
                layer + 'self_attn.v_proj.weight': qkv[q + kv :],
                layer + 'self_attn.o_proj.weight': ours[block + 'attn.o_proj.weight'],
                layer + 'post_attention_layernorm.weight': ours[block + 'mlp_norm.weight'],
                layer + 'mlp.up_proj.weight': up,
                layer + 'mlp.down_proj.weight': ours[block + 'mlp.down_proj.weight'],
            }
        )
    if not c.tie_embeddings:  # tied: HF ties lm_head to the embedding itself (tie_word_embeddings)
        tensors['lm_head.weight'] = ours['lm_head.weight']
    return tensors


def qwen3_tensors(model):
    """Qwen3 is Llama with an RMSNorm of each head of q and k before RoPE (q_norm, k_norm: a gain per head
    dimension): QK-norm's learned gains, or gains of 1 for the weightless form, which computes the same."""
    c, ours, tensors = model.config, model.state_dict(), llama_tensors(model)
    for i in range(c.n_layer):
        for name in ('q_norm', 'k_norm'):
            gain = ours.get(f'blocks.{i}.attn.qk_norm.{name}.weight', torch.ones(c.head_dim))
            tensors[f'model.layers.{i}.self_attn.{name}.weight'] = gain
    return tensors


# GPT-2: HF keeps OpenAI's TensorFlow layout, Conv1D, which computes x @ W + b with W of shape (in, out): the
# transpose of nn.Linear's (out, in). c_attn is the fused qkv in our order (q, k, v, each n_embd wide: no GQA).
# GPT2LMHeadModel always has biases; a model trained with bias=False gets zeros, which compute the same thing.
GPT2_NORMS = {'attn_norm': 'ln_1', 'mlp_norm': 'ln_2'}
GPT2_LINEARS = {
    'attn.qkv_proj': 'attn.c_attn',
    'attn.o_proj': 'attn.c_proj',
    'mlp.up_proj': 'mlp.c_fc',
    'mlp.down_proj': 'mlp.c_proj',
}


def gpt2_tensors(model):
    c, ours = model.config, model.state_dict()

    def bias(name, width):
        return ours.get(name, torch.zeros(width))

    tensors = {
        'transformer.wte.weight': ours['tok_emb.weight'],
        'transformer.wpe.weight': ours['pos_emb.weight'],
        'transformer.ln_f.weight': ours['norm_f.weight'],
        'transformer.ln_f.bias': bias('norm_f.bias', c.n_embd),
    }
    for i in range(c.n_layer):
        block, layer = f'blocks.{i}.', f'transformer.h.{i}.'
        for norm, hf in GPT2_NORMS.items():
            tensors[layer + hf + '.weight'] = ours[block + norm + '.weight']
            tensors[layer + hf + '.bias'] = bias(block + norm + '.bias', c.n_embd)
        for linear, hf in GPT2_LINEARS.items():
            weight = ours[block + linear + '.weight']
            tensors[layer + hf + '.weight'] = weight.t()
            tensors[layer + hf + '.bias'] = bias(block + linear + '.bias', weight.shape[0])
    if not c.tie_embeddings:
        tensors['lm_head.weight'] = ours['lm_head.weight']
    return tensors


# -----------------------------------------------------------------------------------------------------
# config.json in the classic format (rope_theta at the top level, torch_dtype): transformers 4 and 5, vLLM and
# llama.cpp's convert_hf_to_gguf.py all read it. max_position_embeddings is the trained context, block_size.


def llama_config(c):
    return {
        'model_type': 'llama',
        'vocab_size': c.vocab_size,
        'hidden_size': c.n_embd,
        'intermediate_size': c.ffn_width,
        'num_hidden_layers': c.n_layer,
        'num_attention_heads': c.n_head,
        'num_key_value_heads': c.kv_heads,
        'head_dim': c.head_dim,
        'hidden_act': c.part('mlp').hf_act,
        'max_position_embeddings': c.block_size,
        'rms_norm_eps': c.norm_eps,
        'rope_theta': c.rope_theta,
        'attention_bias': False,
        'mlp_bias': False,
    }


def qwen3_config(c):
    return {
        **llama_config(c),
        'model_type': 'qwen3',
        'use_sliding_window': False,
        'sliding_window': None,
    }


def arcee_config(c):
    return {**llama_config(c), 'model_type': 'arcee'}  # hidden_act 'relu2'


def gpt2_config(c):
    return {
        'model_type': 'gpt2',
        'vocab_size': c.vocab_size,
        'n_embd': c.n_embd,
        'n_inner': c.ffn_width,
        'n_layer': c.n_layer,
        'n_head': c.n_head,
        'n_positions': c.block_size,
        'n_ctx': c.block_size,
        'activation_function': c.part('mlp').hf_act,  # GELU: 'gelu_new', the tanh approximation
        'layer_norm_epsilon': c.norm_eps,
        'resid_pdrop': 0.0,
        'embd_pdrop': 0.0,
        'attn_pdrop': 0.0,
    }


# A Hugging Face class -> (its weights, its config.json, whether it has grouped-query attention).
LAYOUTS = {
    'LlamaForCausalLM': (llama_tensors, llama_config, True),
    'Qwen3ForCausalLM': (qwen3_tensors, qwen3_config, True),
    'ArceeForCausalLM': (llama_tensors, arcee_config, True),
    'GPT2LMHeadModel': (gpt2_tensors, gpt2_config, False),  # one key/value head per query head
}
assert {family.hf_class for family in FAMILIES.values()} <= set(LAYOUTS)


def hf_class_of(c):
    """The Hugging Face class that holds every part of the model (config.PARTS' rows say which do): the family's
    own when it can, else the first that can (a Llama with QK-norm is a Qwen3); ConfigError when none can."""
    if c.logit_softcap:
        raise ConfigError(
            f"logit_softcap = {c.logit_softcap:g} has no Hugging Face export: none of {', '.join(LAYOUTS)} caps "
            f"its logits (Gemma 2's final_logit_softcapping comes with its own norms and MLP): sample it with "
            f"sample.py"
        )
    parts = [(kind, c.part(kind)) for kind in PART_KEYS]
    holds = [
        name for name in LAYOUTS if all(name in part.hf or '*' in part.hf for _, part in parts)
    ]
    if c.family.hf_class in holds:
        return c.family.hf_class
    if holds:
        return holds[0]
    kind, lacking = next(
        (k, p) for k, p in parts if c.family.hf_class not in p.hf and '*' not in p.hf
    )
    where = ', '.join(lacking.hf) or 'none'
    raise ConfigError(
        f"a {c.arch} model with {kind} = {c.part_name(kind)!r} ({lacking.label}) has no Hugging Face export: "
        f"the classes that hold it are {where}, and none holds the rest of this model (config.PARTS)"
    )


def check_exportable(c, n_vocab):
    # no tested HF layout for moe.py's MoE (DeepseekV3's differs: grouped routing, MLA)
    if c.n_experts:
        raise ConfigError(
            f"a mixture-of-experts model (n_experts={c.n_experts}) has no Hugging Face export: sample it "
            f"with sample.py"
        )
    hf_class = hf_class_of(c)
    if c.kv_heads != c.n_head and not LAYOUTS[hf_class][2]:
        raise ConfigError(
            f"a {c.arch} model with n_kv_head={c.n_kv_head} (grouped-query attention) has no Hugging "
            f"Face class: {hf_class} has one key/value head per query head"
        )
    if c.vocab_size < n_vocab:
        raise ConfigError(
            f"the model has vocab_size={c.vocab_size} but its tokenizer {n_vocab} tokens: this "
            f"checkpoint was not trained on that data folder's tokens"
        )
    return hf_class


def hf_tensors(model, hf_class):
    """Our weights under their Hugging Face names (views of ours: pretrained.py copies into them), every one of
    them: a tensor of ours that the layout does not name is one line (a part added to model.py without its export
    in export.py), never a silent drop."""
    tensors = LAYOUTS[hf_class][0](model)
    exported = {t.untyped_storage().data_ptr() for t in tensors.values()}
    for name, param in model.named_parameters():
        if param.untyped_storage().data_ptr() not in exported:
            raise ConfigError(
                f"{name} has no {hf_class} name in export.py: add it to the layout, or mark its part's row in "
                f"config.PARTS as not exportable (hf=())"
            )
    return tensors


# -----------------------------------------------------------------------------------------------------
# The tokenizer. tiktoken keeps a byte-level BPE as ranks alone (token bytes -> id; a lower rank was merged
# earlier); HF's `tokenizers` wants the vocab and the merge list, with bytes spelled in GPT-2's printable alphabet.
# With ignore_merges (a whole pre-token that is in the vocab is one token, as tiktoken does) and merges in rank
# order, its BPE picks the same pairs as tiktoken's, so the ids are the same; test_export.py checks them.


def bpe_parts(ranks, token, below_rank):
    """token's bytes merged by BPE using only the tokens of rank < below_rank: the lowest-ranked adjacent pair
    first, as tiktoken does."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while True:
        pairs = [(ranks.get(parts[i] + parts[i + 1], below_rank), i) for i in range(len(parts) - 1)]
        rank, i = min(pairs, default=(below_rank, None))
        if rank >= below_rank:
            return parts
        parts[i : i + 2] = [parts[i] + parts[i + 1]]


def bpe_merges(ranks):
    """The merge list that made the vocab, in rank order: the token of rank r was made from the two parts BPE
    stops at when allowed only the merges before it (transformers' tiktoken converter does the same)."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) > 1:
            parts = bpe_parts(ranks, token, rank)
            if len(parts) != 2:
                raise UserError(
                    f"token {token!r} (id {rank}) is not one merge of two earlier tokens: the vocab is "
                    f"not a BPE merge sequence, which a Hugging Face BPE tokenizer needs"
                )
            merges.append(tuple(parts))
    return merges


def hf_tokenizer(encoding):
    """A tokenizers.Tokenizer that splits text with our regex, then runs our BPE on each piece's UTF-8 bytes.
    `encoding` is data.load_tokenizer's: a tiktoken.Encoding (its ranks, pattern and special tokens), or for
    neox a data.HFEncoding, which is already the Hub's `tokenizers` tokenizer and is written as it is."""
    if isinstance(encoding, data.HFEncoding):
        return encoding.special
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    ranks, pattern, special = encoding._mergeable_ranks, encoding._pat_str, encoding._special_tokens
    alphabet = data.byte_alphabet()

    def spell(token):
        return ''.join(alphabet[b] for b in token)

    vocab = {spell(token): rank for token, rank in ranks.items()}
    vocab.update(special)  # <|endoftext|> keeps our id
    merges = [(spell(left), spell(right)) for left, right in bpe_merges(ranks)]
    tokenizer = Tokenizer(models.BPE(vocab, merges, ignore_merges=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(
                Regex(pattern), behavior='isolated'
            ),  # our regex, pieces kept whole
            pre_tokenizers.ByteLevel(
                add_prefix_space=False, use_regex=False
            ),  # bytes -> GPT-2's alphabet, no 2nd split
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [AddedToken(text, special=True, normalized=False) for text in special]
    )
    return tokenizer


def tokenizer_config(eot, block_size):
    """No special token is added to the text (GPT-2's convention, so ids are ours exactly); decode keeps spaces."""
    return {
        'tokenizer_class': 'PreTrainedTokenizerFast',
        'bos_token': eot,
        'eos_token': eot,
        'pad_token': eot,
        'add_bos_token': False,
        'add_eos_token': False,
        'clean_up_tokenization_spaces': False,
        'model_max_length': block_size,
    }


# -----------------------------------------------------------------------------------------------------
# The folder, written as OUT_DIR.tmp<pid> and renamed to OUT_DIR once complete. An earlier export there is replaced;
# any other folder is left alone.

FILES = (
    'config.json',
    'generation_config.json',
    'model.safetensors',
    'tokenizer.json',
    'tokenizer_config.json',
    'special_tokens_map.json',
)


def write_json(folder, name, obj):
    with open(os.path.join(folder, name), 'w') as f:
        json.dump(obj, f, indent=2)
        f.write('\n')


def write_folder(folder, model, encoding, dtype):
    """Write the export's FILES into `folder` (which exists and is empty)."""
    from safetensors.torch import save_file

    c, eot_id = model.config, encoding.eot_token
    # the token every document starts with, by its own name: '<|endoftext|>', or a Hub tokenizer's (a Llama's '<s>')
    eot = encoding.plain.id_to_token(eot_id) if isinstance(encoding, data.HFEncoding) else EOT
    hf_class = hf_class_of(c)
    to_config = LAYOUTS[hf_class][1]
    tensors = {
        name: t.to(DTYPES[dtype]).contiguous() for name, t in hf_tensors(model, hf_class).items()
    }
    save_file(tensors, os.path.join(folder, 'model.safetensors'), metadata={'format': 'pt'})
    special_ids = {'bos_token_id': eot_id, 'eos_token_id': eot_id, 'pad_token_id': eot_id}
    write_json(
        folder,
        'config.json',
        {
            'architectures': [hf_class],
            **to_config(c),
            'tie_word_embeddings': c.tie_embeddings,
            **special_ids,
            'torch_dtype': dtype,
        },
    )
    write_json(folder, 'generation_config.json', special_ids)
    hf_tokenizer(encoding).save(os.path.join(folder, 'tokenizer.json'))
    write_json(folder, 'tokenizer_config.json', tokenizer_config(eot, c.block_size))
    write_json(
        folder, 'special_tokens_map.json', {'bos_token': eot, 'eos_token': eot, 'pad_token': eot}
    )


def replace_folder(tmp, out_dir):
    """Rename tmp to out_dir; an earlier export at out_dir goes away only once the new one is in place."""
    if not os.path.exists(out_dir):
        os.rename(tmp, out_dir)
        return
    old = f'{out_dir}.old{os.getpid()}'
    os.rename(out_dir, old)
    os.rename(tmp, out_dir)
    shutil.rmtree(old)


def export(path, out_dir, dtype='bfloat16', card=None, gguf=False):
    """Export the checkpoint at `path` (a run's out_dir or a ckpt/step_* folder) to out_dir; -> (checkpoint, model).
    card: a Hub repo id; the folder then also gets README.md, the model card (model_card), and the run's loss.png.
    gguf: the folder also gets model.gguf, for llama.cpp (write_gguf)."""
    try:
        import safetensors  # noqa: F401  (both are imported where used; checked here, before any work)
        import tokenizers  # noqa: F401
    except ImportError:
        raise UserError(
            "export.py needs safetensors and tokenizers: pip install safetensors tokenizers"
        ) from None
    if gguf:
        try:
            import gguf as _  # noqa: F401  (llama.cpp's package, imported where used)
        except ImportError:
            raise UserError(
                "export.py --gguf needs llama.cpp's gguf package: pip install gguf"
            ) from None
    if (
        os.path.exists(out_dir)
        and os.listdir(out_dir)
        and not os.path.isfile(os.path.join(out_dir, 'config.json'))
    ):
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
    check_exportable(model.config, encoding.n_vocab)
    if gguf:
        gguf_class(model.config)  # before anything is written
    out_dir = os.path.abspath(out_dir)
    tmp = f'{out_dir}.tmp{os.getpid()}'
    size = sum(p.numel() for p in model.parameters()) * DTYPES[dtype].itemsize
    with files.disk_errors(os.path.dirname(out_dir), needed_bytes=size):
        os.makedirs(tmp)
        try:
            write_folder(tmp, model, encoding, dtype)
            if gguf:
                write_gguf(os.path.join(tmp, 'model.gguf'), model, encoding, dtype)
            if card:
                run_dir = os.path.dirname(os.path.dirname(path))  # RUN/ckpt/step_*
                files.write_text_atomic(
                    os.path.join(tmp, 'README.md'),
                    model_card(path, model, train_config, dtype, card),
                )
                if os.path.exists(os.path.join(run_dir, 'loss.png')):
                    shutil.copyfile(
                        os.path.join(run_dir, 'loss.png'), os.path.join(tmp, 'loss.png')
                    )
            replace_folder(tmp, out_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return path, model


# -----------------------------------------------------------------------------------------------------
# GGUF, llama.cpp's file, written with llama.cpp's own gguf package from the Hugging Face tensors above (so the
# layouts stay in one place), renamed by gguf's own map (TensorNameMap: model.layers.0.self_attn.q_proj.weight ->
# blk.0.attn_q.weight), changed where llama.cpp's convert_hf_to_gguf.py changes them: Llama's and Arcee's q and k rows
# permuted (llama.cpp's llama rotates adjacent pairs, HF's rotate_half the two halves of a head: a head's row j of 64
# goes to 2j for j < 32, to 2(j - 32) + 1 after; its qwen3 rotates the halves, as HF does, so Qwen3's stay), GPT-2's
# Conv1D weights transposed back to (out, in), and a GPT-2's output matrix written even when tied (as the converter
# does). 1-D tensors (norms, biases) stay float32, as there.
# The tokenizer: byte-level BPE ('gpt2' model) with its tokens in GPT-2's printable alphabet, the merges, and the
# pre-tokenizer llama.cpp knows by name for the regex (llama-vocab.cpp): GPT-2's is 'gpt-2'; our BPE's (GPT-4's
# cl100k split) is 'llama-bpe', Llama 3's, the same split, whose whole-word lookup (ignore_merges)
# tiktoken does too. The padded rows of the vocab get [PAD<id>] tokens of type UNUSED.

# a Hugging Face class -> its llama.cpp architecture (a gguf.MODEL_ARCH member), the MLP it computes, and whether
# it rotates adjacent pairs (llama_model_rope_type's NORM: q and k permuted)
GGUF_ARCHS = {
    'LlamaForCausalLM': ('LLAMA', 'swiglu', True),
    'ArceeForCausalLM': ('ARCEE', 'relu2', True),
    'Qwen3ForCausalLM': ('QWEN3', 'swiglu', False),
    'GPT2LMHeadModel': ('GPT2', 'gelu', False),
}
GGUF_FILE_TYPES = {'float32': 'ALL_F32', 'float16': 'MOSTLY_F16', 'bfloat16': 'MOSTLY_BF16'}


def gguf_class(c):
    """The Hugging Face class whose llama.cpp architecture (GGUF_ARCHS) computes this model, else one line
    (llama.cpp's gpt2 has a GELU only, Qwen3's and Llama's a SwiGLU)."""
    hf_class = hf_class_of(c)
    arch, mlp, _ = GGUF_ARCHS[hf_class]
    if c.part_name('mlp') != mlp:
        raise ConfigError(
            f"--gguf: llama.cpp's {arch.lower()} architecture has no mlp = {c.part_name('mlp')!r}: export the "
            f"Hugging Face folder alone (without --gguf)"
        )
    return hf_class


def gguf_pre_tokenizer(encoding):
    """llama.cpp's name for the encoding's regex split, or UserError."""
    from tiktoken_ext.openai_public import r50k_pat_str

    if isinstance(encoding, data.HFEncoding):
        raise UserError(
            "a GGUF file of a Hub tokenizer's data (GPT-NeoX's) is not written by export.py: convert the "
            "Hugging Face folder with llama.cpp's convert_hf_to_gguf.py"
        )
    cl100k = (
        r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|"""
        r"""\s+(?!\S)|\s+"""
    )
    names = {r50k_pat_str: 'gpt-2', cl100k: 'llama-bpe'}
    if encoding._pat_str not in names:
        raise UserError(
            f"llama.cpp has no pre-tokenizer known to export.py for this tokenizer's regex "
            f"{encoding._pat_str!r}: no GGUF file (the Hugging Face folder is written)"
        )
    return names[encoding._pat_str]


def permute_rotary(weight, heads):
    """HF's rotate_half rows of each head -> llama.cpp's adjacent pairs (convert_hf_to_gguf.py's LlamaModel.permute)."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, -1)
        .transpose(1, 2)
        .reshape(weight.shape)
    )


def gguf_tensors(model):
    """{llama.cpp name: tensor} from the Hugging Face tensors (LAYOUTS)."""
    import gguf

    c = model.config
    hf_class = gguf_class(c)
    arch, _, adjacent_pairs = GGUF_ARCHS[hf_class]
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch), c.n_layer)
    hf = hf_tensors(model, hf_class)
    if hf_class == 'GPT2LMHeadModel' and 'lm_head.weight' not in hf:
        hf['lm_head.weight'] = hf['transformer.wte.weight']
    tensors = {}
    for hf_name, tensor in hf.items():
        if adjacent_pairs and hf_name.endswith(('q_proj.weight', 'k_proj.weight')):
            tensor = permute_rotary(tensor, c.n_head if 'q_proj' in hf_name else c.kv_heads)
        if hf_class == 'GPT2LMHeadModel' and tensor.dim() == 2 and '.h.' in hf_name:
            tensor = tensor.t()  # Conv1D (in, out) -> (out, in)
        tensors[names.get_name(hf_name, try_suffixes=('.weight', '.bias'))] = tensor
    return tensors


def write_gguf(path, model, encoding, dtype):
    """model.gguf: the weights in dtype (1-D tensors in float32), the hyperparameters and the tokenizer."""
    import gguf

    c = model.config
    pre = gguf_pre_tokenizer(encoding)
    hf_class = gguf_class(c)
    arch = gguf.MODEL_ARCH_NAMES[getattr(gguf.MODEL_ARCH, GGUF_ARCHS[hf_class][0])]
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(os.path.basename(os.path.dirname(path)))
    writer.add_context_length(c.block_size)
    writer.add_embedding_length(c.n_embd)
    writer.add_feed_forward_length(c.ffn_width)
    writer.add_block_count(c.n_layer)
    writer.add_head_count(c.n_head)
    if hf_class != 'GPT2LMHeadModel':  # llama, arcee, qwen3
        writer.add_head_count_kv(c.kv_heads)
        writer.add_rope_freq_base(c.rope_theta)
        writer.add_layer_norm_rms_eps(c.norm_eps)
        writer.add_rope_dimension_count(c.head_dim)
        writer.add_key_length(c.head_dim)
        writer.add_value_length(c.head_dim)
        writer.add_vocab_size(c.vocab_size)
    else:
        writer.add_layer_norm_eps(c.norm_eps)
    writer.add_file_type(getattr(gguf.LlamaFileType, GGUF_FILE_TYPES[dtype]))
    # the tokenizer: every id below vocab_size named, ours first, then the padding
    alphabet = data.byte_alphabet()
    tokens = [None] * c.vocab_size
    types = [gguf.TokenType.UNUSED] * c.vocab_size
    for token, rank in encoding._mergeable_ranks.items():
        tokens[rank], types[rank] = ''.join(alphabet[b] for b in token), gguf.TokenType.NORMAL
    for text, rank in encoding._special_tokens.items():
        tokens[rank], types[rank] = text, gguf.TokenType.CONTROL
    tokens = [token if token is not None else f'[PAD{i}]' for i, token in enumerate(tokens)]
    writer.add_tokenizer_model('gpt2')
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    spell = {token: tokens[rank] for token, rank in encoding._mergeable_ranks.items()}
    writer.add_token_merges(
        [f'{spell[a]} {spell[b]}' for a, b in bpe_merges(encoding._mergeable_ranks)]
    )
    for add in (writer.add_bos_token_id, writer.add_eos_token_id, writer.add_pad_token_id):
        add(encoding.eot_token)
    # a prompt starts with end-of-text as its ids say, as sample.py's does
    writer.add_add_bos_token(False)
    for name, tensor in gguf_tensors(model).items():
        if tensor.dim() == 1 or dtype == 'float32':
            writer.add_tensor(name, tensor.float().contiguous().numpy())
        elif dtype == 'float16':
            writer.add_tensor(name, tensor.half().contiguous().numpy())
        else:  # numpy has no bfloat16: its bits, typed by the header
            bits = tensor.to(torch.bfloat16).contiguous().view(torch.int16).numpy()
            writer.add_tensor(name, bits, raw_dtype=gguf.GGMLQuantizationType.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# -----------------------------------------------------------------------------------------------------
# The Hub: the folder with a model card made from the run (README.md: what the model is, what it was trained on, the
# ledger's prediction beside what the run measured, its scores, the command that made it), pushed with
# huggingface_hub (HfApi.create_repo + upload_folder; HF_TOKEN or a saved `hf auth login`, HF_ENDPOINT for another
# Hub). The upload is one commit: a push that fails leaves the repo as it was, and the same command again completes
# it (the large files already uploaded are not sent again: the Hub has them by their sha256).

# evals.py's headline scores
EVAL_KEYS = ('hellaswag', 'arc_easy', 'arc_challenge', 'mmlu', 'mmlu_5shot')


def train_command(model_config, train_config):
    """`python train.py --key=value ...` with every key the run set away from config.py's defaults: the command that
    makes this model again (the config file it came from is folded into it)."""
    keys = {**model_config, **train_config}
    changed = {k: v for k, v in keys.items() if k in DEFAULTS and v != DEFAULTS[k]}

    def text(value):
        return ','.join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)

    return 'python train.py ' + ' '.join(f'--{k}={text(v)}' for k, v in changed.items())


def model_card(path, model, train_config, dtype, repo_id):
    """README.md for the Hub, from the checkpoint and its run's folder (summary.json, report.md, metrics.jsonl,
    code.json, all optional but the checkpoint)."""
    c, run_dir = model.config, os.path.dirname(os.path.dirname(path))
    state = checkpoint.read_state(path)
    params = sum(p.numel() for p in model.parameters())

    def read(name):
        where = os.path.join(run_dir, name)
        return open(where).read() if os.path.exists(where) else None

    summary = json.loads(read('summary.json') or '{}')
    records = [json.loads(line) for line in (read('metrics.jsonl') or '').splitlines() if line]
    code = json.loads(read('code.json') or '{}')
    meta = data.load_meta(train_config['data']) if os.path.isdir(train_config['data']) else {}
    heads = f'{c.n_head} heads' + (
        f' ({c.kv_heads} key/value heads)' if c.kv_heads != c.n_head else ''
    )
    lines = [
        '---',
        'library_name: transformers',
        'pipeline_tag: text-generation',
        'tags: [ledgergpt, pretrained-from-scratch]',
        '---',
        f'# {os.path.basename(run_dir)}',
        '',
        f"A {c.arch} model ({hf_class_of(c)}) pretrained from scratch by ledgergpt's train.py: {params:,} "
        f"parameters, {c.n_layer} layers, width {c.n_embd}, {heads}, FFN width {c.ffn_width}, context "
        f"{c.block_size} tokens, vocab {c.vocab_size:,}, embeddings {'tied' if c.tie_embeddings else 'untied'}; "
        f"weights in {dtype}.",
        '',
        '## Data and tokens',
        '',
        f"{os.path.basename(os.path.normpath(train_config['data']))}"
        + (f" ({meta['source']}, tokenizer {meta['tokenizer']})" if meta else '')
        + f": {state['run']['tokens_seen']:,} tokens seen in {state['run']['step']:,} steps "
        f"(planned: {train_config['train_tokens']:,}).",
    ]
    report = read('report.md')
    if report:
        table = report.split('\n![')[0].split('\n(no loss.png')[0].strip()
        # this machine's probe cache is no one else's business
        table = re.sub(r' \(cache: [^)]*\)', '', table)
        lines += ['', "## The ledger's prediction and what the run measured", '', table]
        if os.path.exists(os.path.join(run_dir, 'loss.png')):
            lines += ['', '![train and val loss against tokens seen](loss.png)']
    scores = []
    if summary.get('val_bpb') is not None:
        scores.append(
            f"- val loss {summary['val_loss']:.4f} nats per token, {summary['val_bpb']:.4f} bits per byte"
        )
    for key in EVAL_KEYS:
        last = [r for r in records if r.get(key) is not None]
        if last:
            r = last[-1]
            scores.append(
                f"- {key} {r[key]:.2%} +- {r[key + '_stderr']:.2%} over {r[key + '_items']:,} items "
                f"(step {r['step']:,})"
            )
    if scores:
        lines += ['', '## Scores', '', *scores]
    lines += [
        '',
        '## How it was made',
        '',
        '```',
        train_command(state['model_config'], train_config),
        '```',
    ]
    if code.get('commit'):
        lines.append(
            f"at ledgergpt commit {code['commit']}"
            + (' with local changes' if code['dirty'] else '')
        )
    lines += [
        '',
        '## Use',
        '',
        'Every training document started with the end-of-text token: start a prompt with it.',
        '',
        '```python',
        'import torch',
        'from transformers import AutoModelForCausalLM, AutoTokenizer',
        f"model = AutoModelForCausalLM.from_pretrained('{repo_id}')",
        f"tokenizer = AutoTokenizer.from_pretrained('{repo_id}')",
        "ids = [tokenizer.bos_token_id] + tokenizer('def main(', add_special_tokens=False).input_ids",
        'print(tokenizer.decode(model.generate(torch.tensor([ids]), max_new_tokens=32)[0, 1:]))',
        '```',
    ]
    return '\n'.join(lines) + '\n'


def push(folder, repo_id, private=False):
    """Upload the export folder to the Hub repo repo_id (made if new) in one commit; -> the commit's URL."""
    try:
        from huggingface_hub import HfApi
    except ImportError:
        raise UserError(
            'export.py --push needs huggingface_hub: pip install huggingface_hub'
        ) from None
    # HF_ENDPOINT and HF_TOKEN are read now, not when huggingface_hub was imported; no token: a saved login
    api = HfApi(
        endpoint=os.environ.get('HF_ENDPOINT') or None, token=os.environ.get('HF_TOKEN') or None
    )
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        commit = api.upload_folder(
            repo_id=repo_id, folder_path=folder, commit_message='ledgergpt export.py'
        )
    # any failure, an HTTP status or a network error of whichever HTTP client huggingface_hub has, is one line
    except Exception as e:
        raise UserError(
            f"the push to {repo_id} failed ({type(e).__name__}: {str(e).splitlines()[0]}): the repo is as it was "
            f"(one commit or none); run the same command again to complete it"
        ) from None
    return commit.commit_url


@cli
def main(argv):
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n')[1], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        'checkpoint', help="a run's out_dir (latest checkpoint) or a ckpt/step_* folder"
    )
    parser.add_argument('out_dir', help='the folder to write (an earlier export there is replaced)')
    parser.add_argument(
        '--dtype', default='bfloat16', choices=list(DTYPES), help='weight dtype (default bfloat16)'
    )
    parser.add_argument(
        '--push',
        metavar='REPO_ID',
        help='also upload the folder, with a model card (README.md), to this Hub repo (HF_TOKEN, HF_ENDPOINT)',
    )
    parser.add_argument('--private', action='store_true', help='with --push: a new repo is private')
    parser.add_argument(
        '--gguf',
        action='store_true',
        help="also OUT_DIR/model.gguf for llama.cpp (pip install gguf)",
    )
    args = parser.parse_args(argv)
    path, model = export(args.checkpoint, args.out_dir, args.dtype, card=args.push, gguf=args.gguf)
    if args.push:
        print(f"pushed to {args.push}: {push(args.out_dir, args.push, args.private)}")
    params = sum(p.numel() for p in model.parameters())
    print(
        f"{args.out_dir}: {hf_class_of(model.config)}, {params:,} parameters in {args.dtype}, from {path}\n"
        f"  from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        f"  model = AutoModelForCausalLM.from_pretrained('{args.out_dir}')\n"
        f"  tokenizer = AutoTokenizer.from_pretrained('{args.out_dir}')"
    )
    return 0


if __name__ == '__main__':
    sys.exit(main())
