"""
model.py: GPT-2 and Llama in one file, built from parts. `arch` names a family in config.FAMILIES, a
named choice of rows of config.PARTS, and the keys norm, mlp, positions and qk_norm take any part
into any family:

    gpt2:  learned positions, LayerNorm, GELU MLP, biases, tied embeddings
    llama: RoPE, RMSNorm, SwiGLU MLP, no biases, untied
    and:   ReLU² MLP (mlp='relu2'), QK-norm (qk_norm='weightless' or 'learned')

Both are pre-norm decoder stacks, x = x + attn(norm(x)); x = x + mlp(norm(x)); logits =
lm_head(norm_f(x)), with grouped-query attention when n_kv_head < n_head. With n_experts > 0 the
blocks after the first n_dense_layers get a mixture of experts as their FFN (moe.py). Each part's
class below is found by its row's name in config.PARTS (ATTENTIONS, make_norm, MLPS, QK_NORMS;
the loss's in losses.py, LOSSES), and the row's shapes are this file's tensors: test_parts.py
holds every row to the modules built, and the ledger counts from the rows.

Speed on H100/H200: attention goes through F.scaled_dot_product_attention(is_causal=True) so the
flash/cuDNN kernel runs, GQA uses enable_gqa instead of materialising repeated K/V, the norms are
torch's own, and forward has no .item() or data-dependent Python, so torch.compile sees one graph
(test_model.py checks it).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# re-exported: `from model import ModelConfig` works
from ledgergpt.config import IGNORE_INDEX, ModelConfig
from ledgergpt.losses import LOSSES, softcap
from ledgergpt.moe import MoE

__all__ = ['ModelConfig', 'GPT', 'Block', 'IGNORE_INDEX']


# --------------------------------------------------------------------------------------------------
# Rotary position embedding (RoPE, Su et al. 2021): rotate each (x1, x2) pair of a head by t *
# theta^(-2i/d). We pair the first half of the head with the second (GPT-NeoX / HF Llama layout):
# chunk + cat, no strided views. The cos/sin tables are constants, so autograd saves only them
# (tiny), not q or k.


def rope_tables(config, device=None):
    """cos and sin of shape (block_size, head_dim // 2), in fp32."""
    head_dim = config.head_dim
    steps = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim
    positions = torch.arange(config.block_size, dtype=torch.float32, device=device)
    angles = torch.outer(positions, 1.0 / config.rope_theta**steps)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """x: (B, T, heads, head_dim); cos, sin: (T, head_dim // 2) -> rotated x, same shape, dtype."""
    cos, sin = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)  # broadcast over heads
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


# --------------------------------------------------------------------------------------------------
# Norms, by the row's name. QK-norm normalises each head of q and of k before RoPE (OLMo 2, Qwen3,
# nanochat), which keeps the attention logits bounded: weightless (nanochat) or with a learned gain
# per head dimension.


def make_norm(config):
    """The model's norm, torch's own module: LayerNorm (a bias with the model's) or RMSNorm."""
    if config.part_name('norm') == 'layernorm':
        return nn.LayerNorm(config.n_embd, eps=config.norm_eps, bias=config.biases)
    return nn.RMSNorm(config.n_embd, eps=config.norm_eps)


class QKNorm(nn.Module):
    def __init__(self, config):
        super().__init__()
        learned, width = config.qk_norm == 'learned', config.head_dim
        self.q_norm = nn.RMSNorm(width, eps=config.norm_eps, elementwise_affine=learned)
        self.k_norm = nn.RMSNorm(width, eps=config.norm_eps, elementwise_affine=learned)

    def forward(self, q, k):
        return self.q_norm(q), self.k_norm(k)


QK_NORMS = {'none': None, 'weightless': QKNorm, 'learned': QKNorm}


# --------------------------------------------------------------------------------------------------
# Attention: one fused qkv projection (k and v have n_kv_head heads: GQA when n_kv_head < n_head).
# Fused, as in nanoGPT: one big GEMM is faster than three, and under bf16 autocast each Linear casts
# its fp32 input to bf16 separately (activation casts are not cached), so three projections would
# save three bf16 copies.


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.kv_heads, config.head_dim
        self.use_rope = config.part_name('positions') == 'rope'
        width = (self.n_head + 2 * self.n_kv_head) * self.head_dim
        self.qkv_proj = nn.Linear(config.n_embd, width, bias=config.biases)
        self.o_proj = nn.Linear(self.n_head * self.head_dim, config.n_embd, bias=config.biases)
        qk_norm = QK_NORMS[config.qk_norm]
        self.qk_norm = qk_norm(config) if qk_norm else None

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        qkv = self.qkv_proj(x).view(B, T, self.n_head + 2 * self.n_kv_head, self.head_dim)
        q, k, v = qkv.split((self.n_head, self.n_kv_head, self.n_kv_head), dim=2)
        if self.qk_norm is not None:
            q, k = self.qk_norm(q, k)
        if self.use_rope:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # SDPA wants (B, heads, T, head_dim); transposes are free views. enable_gqa lets each group
        # of n_head / n_kv_head query heads read one K/V head without a repeat_interleave copy.
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        gqa = self.n_kv_head != self.n_head
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim))


ATTENTIONS = {'causal': Attention}


# --------------------------------------------------------------------------------------------------
# MLPs, by the row's name. GELU (GPT-2): up (H -> 4H), GELU (tanh approximation, as GPT-2 trained),
# down. SwiGLU (Llama; Shazeer 2020): down(silu(gate(x)) * up(x)), H' ~ 8H/3 so three matrices cost
# what two do. ReLU² (Primer, So et al. 2021; modded-nanogpt, nanochat): down(relu(up(x))^2),
# cheaper than GELU and sparse.


# width: an expert's (moe.py builds its experts from the same row); else the config's H'
class GeluMLP(nn.Module):
    def __init__(self, config, width=None):
        super().__init__()
        width = width or config.ffn_width
        self.up_proj = nn.Linear(config.n_embd, width, bias=config.biases)
        self.down_proj = nn.Linear(width, config.n_embd, bias=config.biases)

    def forward(self, x):
        return self.down_proj(F.gelu(self.up_proj(x), approximate='tanh'))


class ReluSquaredMLP(GeluMLP):  # the same two matrices
    def forward(self, x):
        h = F.relu(self.up_proj(x))
        return self.down_proj(h * h)


class SwiGLU(nn.Module):
    def __init__(self, config, width=None):
        super().__init__()
        self.width = width or config.ffn_width
        self.gate_up_proj = nn.Linear(config.n_embd, 2 * self.width, bias=config.biases)  # fused
        self.down_proj = nn.Linear(self.width, config.n_embd, bias=config.biases)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).split(self.width, dim=-1)
        return self.down_proj(F.silu(gate) * up)


MLPS = {'gelu': GeluMLP, 'swiglu': SwiGLU, 'relu2': ReluSquaredMLP}


class Block(nn.Module):
    def __init__(self, config, moe=False):
        super().__init__()
        self.attn_norm = make_norm(config)
        self.attn = ATTENTIONS[config.attention](config)
        self.mlp_norm = make_norm(config)
        mlp = MLPS[config.part_name('mlp')]  # the dense FFN, or each expert of an MoE
        self.mlp = MoE(config, mlp) if moe else mlp(config)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


# --------------------------------------------------------------------------------------------------
# The model.


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        # True: keep each block's input only, rerun it in backward (book: 8P)
        self.recompute = False
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.learned_positions = config.part_name('positions') == 'learned'  # else RoPE
        if self.learned_positions:
            self.pos_emb = nn.Embedding(config.block_size, config.n_embd)
        moe_from = config.n_layer - config.moe_layers
        self.blocks = nn.ModuleList(Block(config, i >= moe_from) for i in range(config.n_layer))
        self.moe = [b.mlp for b in self.blocks if isinstance(b.mlp, MoE)]  # a list: no new names
        self.norm_f = make_norm(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.tie_weights()
        # RoPE tables: derived constants, not state (not in checkpoints), rebuilt by init_weights.
        if not self.learned_positions:
            cos, sin = rope_tables(config)
            self.register_buffer('rope_cos', cos, persistent=False)
            self.register_buffer('rope_sin', sin, persistent=False)
        if self.tok_emb.weight.device.type != 'meta':
            self.init_weights()

    def tie_weights(self):
        """GPT-2's tied embeddings: the output projection IS the input embedding, one tensor
        (parameters() and the ledger count it once; FSDP2 keeps it in the root's unit with both
        users)."""
        if self.config.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    def _apply(self, fn, recurse=True):
        # Moving the model (to_empty from the meta device, .to, .cuda) gives each module its own new
        # tensor, which would untie the shared weight: 163M parameters instead of GPT-2's 124M. Tie
        # them again.
        super()._apply(fn, recurse)
        self.tie_weights()
        return self

    @torch.no_grad()
    def init_weights(self):
        """GPT-2 initialisation: every weight N(0, 0.02), biases 0, norms 1; the two residual
        projections per block get std 0.02 / sqrt(2 * n_layer), so the residual stream's variance
        does not grow with depth (each of the 2L branches adds its output to it). Deterministic from
        torch's RNG, in module order. Call after `to_empty(device=...)` when the model was built on
        the meta device."""
        std, residual_std = 0.02, 0.02 / math.sqrt(2 * self.config.n_layer)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if getattr(module, 'bias', None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.LayerNorm, nn.RMSNorm, MoE)):  # an MoE's router bias, load
                module.reset_parameters()
        # o_proj and the FFN's down_proj (every expert's)
        for name, param in self.named_parameters():
            if name.endswith(('o_proj.weight', 'down_proj.weight')):
                nn.init.normal_(param, mean=0.0, std=residual_std)
        if not self.learned_positions:
            cos, sin = rope_tables(self.config, device=self.rope_cos.device)
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)

    def forward(self, idx, targets=None, reduction='mean'):
        """idx, targets: (B, T), T <= block_size -> (logits (B, T, V), None) without targets, else
        (None, loss): the cross-entropy of the targets that are not IGNORE_INDEX (losses.py, by the
        `loss` row: fp32, chunked by default), their mean, or their sum for a trainer that divides
        by the step's loss-carrying targets (all micro-batches and ranks), so that every target
        weighs the same. Training gets no logits back: a caller holding them keeps B x T x V alive
        into the next micro-step (3.3 GB at h200_1b3's 16 x 2048 x 50304 in bf16); compiled, the
        graph need not write them out."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(
                f"sequence length {T} exceeds block_size {self.config.block_size}: crop it"
            )
        x = self.tok_emb(idx)
        cos = sin = None
        if self.learned_positions:
            x = x + self.pos_emb(torch.arange(T, device=idx.device))
        else:
            # The tables go to the blocks in the residual stream's dtype: before torch 2.13 FSDP2
            # did not cast a block's inputs when checkpoint() recomputed it (pytorch #159359), so
            # fp32 tables would reach the recomputed block in another dtype than its first forward.
            cos, sin = self.rope_cos[:T].to(x.dtype), self.rope_sin[:T].to(x.dtype)
        for block in self.blocks:
            if self.recompute and torch.is_grad_enabled():
                x = checkpoint(block, x, cos, sin, use_reentrant=False)
            else:
                x = block(x, cos, sin)
        x = self.norm_f(x)
        if targets is None:
            return softcap(self.lm_head(x), self.config.logit_softcap), None
        loss = LOSSES[self.config.loss](x, self.lm_head.weight, targets, reduction, self.config)
        # MoE: this forward's balance loss (a training one's), weighed per target as the loss
        if self.moe and self.moe[0].aux_loss is not None:
            balance = sum(layer.aux_loss for layer in self.moe)
            if reduction == 'sum':
                balance = balance * (targets != IGNORE_INDEX).sum()
            loss = loss + balance
        return None, loss

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Append max_new_tokens sampled tokens to idx (B, T) and return it. temperature scales the
        logits (0 means greedy); top_k keeps only the k most likely tokens. No KV cache: each step
        reruns the (cropped) context, which is simple and fast enough for samples during
        training."""
        for _ in range(max_new_tokens):
            logits, _ = self(idx[:, -self.config.block_size :])
            logits = logits[:, -1, :].float()
            if temperature == 0:
                next_token = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float('-inf'))
                next_token = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, next_token), dim=1)
        return idx
