"""
hf.py: the Hugging Face mapping, one table read both ways: export.py writes a model's config.json
and weights through it, pretrained.py (init_from) reads them back. CLASSES and FIELDS are
config.json's side, LAYOUTS the weights' (each a view of one of our tensors). Standard library at
import: the ledger plans a fine-tune (pretrained.load_config) before torch is installed.
"""

import dataclasses

from ledgergpt.config import FAMILIES, PART_KEYS, ConfigError

# --------------------------------------------------------------------------------------------------
# The Hugging Face classes: our arch, config.json's model_type, the parts beyond the family's own
# (config.PARTS; the MLP is read off the activation: mlp_key), and the fields whose one value
# model.py implements (transformers' default where config.json has none). rope_scaling: Llama
# 3.1's, YaRN, linear or dynamic NTK; our RoPE is plain. Qwen3 writes a sliding_window it uses only
# where use_sliding_window is true. GPT-2's scale_attn_weights: scores / sqrt(head_dim), as SDPA.
NO_BIAS = {'attention_bias': False, 'mlp_bias': False}
LLAMA_ONLY = {'rope_scaling': None, **NO_BIAS}
QWEN3_ONLY = {**LLAMA_ONLY, 'use_sliding_window': False}
GPT2_ONLY = {'scale_attn_weights': True, 'scale_attn_by_inverse_layer_idx': False}
CLASSES = {
    'LlamaForCausalLM': ('llama', 'llama', {}, {**LLAMA_ONLY, 'sliding_window': None}),
    'ArceeForCausalLM': ('llama', 'arcee', {}, {**LLAMA_ONLY, 'sliding_window': None}),
    'Qwen3ForCausalLM': ('llama', 'qwen3', {'qk_norm': 'learned'}, QWEN3_ONLY),
    'GPT2LMHeadModel': ('gpt2', 'gpt2', {}, {**GPT2_ONLY, 'add_cross_attention': False}),
}
assert {family.hf_class for family in FAMILIES.values()} <= set(CLASSES)

# config.json's fields <-> our model keys, in the order export.py writes them: {field: (our key,
# the value transformers assumes where config.json has none: a value, a function of config.json, or
# None: needed)}. export.py writes the model's own (ffn_hidden: its FFN width, n_kv_head: its
# key/value heads, mlp: its activation); init_from reads a key from its first field (n_ctx: for old
# readers).
FIELDS = {
    'llama': {
        'vocab_size': ('vocab_size', None),
        'hidden_size': ('n_embd', None),
        'intermediate_size': ('ffn_hidden', None),
        'num_hidden_layers': ('n_layer', None),
        'num_attention_heads': ('n_head', None),
        'num_key_value_heads': ('n_kv_head', lambda hf: hf['num_attention_heads']),
        # model.py's head size is hidden_size / num_attention_heads: config.json may not say another
        'head_dim': ('head_dim', lambda hf: hf['hidden_size'] // hf['num_attention_heads']),
        'hidden_act': ('mlp', ''),
        'max_position_embeddings': ('block_size', 2048),
        'rms_norm_eps': ('norm_eps', 1e-6),
        'rope_theta': ('rope_theta', 1e4),
    },
    'gpt2': {
        'vocab_size': ('vocab_size', 50257),
        'n_embd': ('n_embd', 768),
        'n_inner': ('ffn_hidden', lambda hf: 4 * hf.get('n_embd', 768)),
        'n_layer': ('n_layer', 12),
        'n_head': ('n_head', 12),
        'n_positions': ('block_size', 1024),
        'n_ctx': ('block_size', 1024),
        'activation_function': ('mlp', ''),
        'layer_norm_epsilon': ('norm_eps', 1e-5),
    },
}


# --------------------------------------------------------------------------------------------------
# Weights, as views of ours (pretrained.py copies into them, export.py writes them). Llama: our
# fused qkv_proj rows are the q heads, then the k heads, then the v heads (model.Attention). Our
# RoPE pairs the first half of each head with the second half, HF Llama's rotate_half layout: no
# permutation is needed.


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
        gate_up = ours.get(block + 'mlp.gate_up_proj.weight')  # a gated MLP's: gate, then up
        if gate_up is not None:
            tensors[layer + 'mlp.gate_proj.weight'], up = gate_up.split(c.ffn_width)
        else:  # an MLP of two matrices (Arcee's)
            up = ours[block + 'mlp.up_proj.weight']
        names = {
            'input_layernorm.weight': ours[block + 'attn_norm.weight'],
            'self_attn.q_proj.weight': qkv[:q],
            'self_attn.k_proj.weight': qkv[q : q + kv],
            'self_attn.v_proj.weight': qkv[q + kv :],
            'self_attn.o_proj.weight': ours[block + 'attn.o_proj.weight'],
            'post_attention_layernorm.weight': ours[block + 'mlp_norm.weight'],
            'mlp.up_proj.weight': up,
            'mlp.down_proj.weight': ours[block + 'mlp.down_proj.weight'],
        }
        tensors.update({layer + name: tensor for name, tensor in names.items()})
    if not c.tie_embeddings:  # tied: HF ties lm_head to the embedding itself (tie_word_embeddings)
        tensors['lm_head.weight'] = ours['lm_head.weight']
    return tensors


def qwen3_tensors(model):
    """Llama's, and Qwen3's RMSNorm of each head of q and k before RoPE (q_norm, k_norm: a gain per
    head dimension): QK-norm's gains, or gains of 1 for a QK-norm without them (the same maths)."""
    c, ours, tensors = model.config, model.state_dict(), llama_tensors(model)
    for i in range(c.n_layer):
        for name in ('q_norm', 'k_norm'):
            gain = ours.get(f'blocks.{i}.attn.qk_norm.{name}.weight')
            gain = ours['norm_f.weight'].new_ones(c.head_dim) if gain is None else gain
            tensors[f'model.layers.{i}.self_attn.{name}.weight'] = gain
    return tensors


# GPT-2: HF keeps OpenAI's TensorFlow layout, Conv1D, which computes x @ W + b with W of shape
# (in, out): the transpose of nn.Linear's (out, in). c_attn is the fused qkv in our order (no GQA).
# GPT2LMHeadModel always has biases: a model trained without them gets zeros (the same maths).
GPT2_NAMES = {
    'attn_norm': 'ln_1',
    'mlp_norm': 'ln_2',
    'attn.qkv_proj': 'attn.c_attn',
    'attn.o_proj': 'attn.c_proj',
    'mlp.up_proj': 'mlp.c_fc',
    'mlp.down_proj': 'mlp.c_proj',
}


def gpt2_tensors(model):
    c, ours = model.config, model.state_dict()
    tensors = {
        'transformer.wte.weight': ours['tok_emb.weight'],
        'transformer.wpe.weight': ours['pos_emb.weight'],
        'transformer.ln_f.weight': ours['norm_f.weight'],
        'transformer.ln_f.bias': ours.get('norm_f.bias', ours['norm_f.weight'].new_zeros(c.n_embd)),
    }
    for i in range(c.n_layer):
        for name, hf in GPT2_NAMES.items():
            weight, layer = ours[f'blocks.{i}.{name}.weight'], f'transformer.h.{i}.{hf}'
            tensors[layer + '.weight'] = weight.t() if weight.dim() == 2 else weight
            bias = ours.get(f'blocks.{i}.{name}.bias', weight.new_zeros(weight.shape[0]))
            tensors[layer + '.bias'] = bias
    if not c.tie_embeddings:
        tensors['lm_head.weight'] = ours['lm_head.weight']
    return tensors


QWEN3_WRITTEN = {**NO_BIAS, 'use_sliding_window': False, 'sliding_window': None}
GPT2_WRITTEN = {'resid_pdrop': 0.0, 'embd_pdrop': 0.0, 'attn_pdrop': 0.0}
# A Hugging Face class (CLASSES) -> its weights, config.json's values beside FIELDS (the
# ones model.py implements), its llama.cpp architecture (gguf.MODEL_ARCH) and whether that rotates
# adjacent pairs of q and k (llama_model_rope_type's NORM; HF's rotate_half, as llama.cpp's qwen3,
# rotates a head's halves)
LAYOUTS = {
    'LlamaForCausalLM': (llama_tensors, NO_BIAS, 'LLAMA', True),
    'Qwen3ForCausalLM': (qwen3_tensors, QWEN3_WRITTEN, 'QWEN3', False),
    'ArceeForCausalLM': (llama_tensors, NO_BIAS, 'ARCEE', True),
    'GPT2LMHeadModel': (gpt2_tensors, GPT2_WRITTEN, 'GPT2', False),
}


def hf_config(c, hf_class):
    """config.json in the classic format (rope_theta at the top level, torch_dtype) that
    transformers 4 and 5, vLLM and llama.cpp's converter read: FIELDS from the model."""
    arch, model_type, _, _ = CLASSES[hf_class]
    widths = dict(ffn_hidden=c.ffn_width, n_kv_head=c.kv_heads, head_dim=c.head_dim)
    ours = {**dataclasses.asdict(c), **widths, 'mlp': c.part('mlp').hf_act}
    fields = {field: ours[key] for field, (key, _) in FIELDS[arch].items()}
    return {'architectures': [hf_class], 'model_type': model_type, **fields, **LAYOUTS[hf_class][1]}


def hf_class_of(c):
    """The class that holds every part (config.PARTS' rows say which do): the family's if it can,
    else the first that can; else ConfigError."""
    if c.logit_softcap:
        raise ConfigError(
            f"logit_softcap = {c.logit_softcap:g} has no Hugging Face export: none of "
            f"{', '.join(LAYOUTS)} caps its logits (Gemma 2's final_logit_softcapping comes with "
            f"its own norms and MLP): sample it with sample.py"
        )
    parts = [(kind, c.part(kind)) for kind in PART_KEYS]
    holds = [name for name in LAYOUTS if all({name, '*'} & set(part.hf) for _, part in parts)]
    if holds:
        return c.family.hf_class if c.family.hf_class in holds else holds[0]
    kind, lacking = next((k, p) for k, p in parts if not {c.family.hf_class, '*'} & set(p.hf))
    raise ConfigError(
        f"a {c.arch} model with {kind} = {c.part_name(kind)!r} ({lacking.label}) has no Hugging "
        f"Face export: the classes that hold it are {', '.join(lacking.hf) or 'none'}, and none "
        f"holds the rest of this model (config.PARTS)"
    )


def check_exportable(c, n_vocab):
    # no tested HF layout for moe.py's MoE (DeepseekV3's differs: grouped routing, MLA)
    if c.n_experts:
        raise ConfigError(
            f"a mixture-of-experts model (n_experts={c.n_experts}) has no Hugging Face export: "
            f"sample it with sample.py"
        )
    hf_class = hf_class_of(c)
    if c.kv_heads != c.n_head and 'num_key_value_heads' not in FIELDS[CLASSES[hf_class][0]]:
        raise ConfigError(
            f"a {c.arch} model with n_kv_head={c.n_kv_head} (grouped-query attention) has no "
            f"Hugging Face class: {hf_class} has one key/value head per query head"
        )
    if c.vocab_size < n_vocab:
        raise ConfigError(
            f"the model has vocab_size={c.vocab_size} but its tokenizer {n_vocab} tokens: this "
            f"checkpoint was not trained on that data folder's tokens"
        )


def hf_tensors(model, hf_class):
    """Our weights under their Hugging Face names, every one: a tensor of ours the layout does not
    name (a part added to model.py without its export) is one line, never a silent drop."""
    tensors = LAYOUTS[hf_class][0](model)
    exported = {t.untyped_storage().data_ptr() for t in tensors.values()}
    for name, param in model.named_parameters():
        if param.untyped_storage().data_ptr() not in exported:
            raise ConfigError(
                f"{name} has no {hf_class} name in export.py: add it to the layout, or mark its "
                f"part's row in config.PARTS as not exportable (hf=())"
            )
    return tensors
