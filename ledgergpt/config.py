"""
config.py: the config vocabulary of every ledgergpt command, and the one way bad input is reported.

A config file is plain Python that assigns keys (see configs/); `--key=value` after it overrides one
key. Every value's type and range is checked before anything is built: a typo or an impossible value
is one line naming the key, the value and what is allowed. The tables the other files read live here
too (PARTS, OPTIMIZERS, FAMILIES, CONTINUATION_KEYS, ...). Standard library only: `python ledger.py
CONFIG` runs before torch is installed.
"""

import dataclasses
import difflib
import functools
import importlib.metadata
import math
import os
import select
import signal
import sys
import threading
from dataclasses import dataclass
from fractions import Fraction

# Units shared by the ledger and its printed text.
MIB, GIB = 2**20, 2**30
SECONDS_PER_DAY = 86400


class UserError(Exception):
    """Bad input or a state the user can fix: one line on stderr ('error: ...'), no traceback."""

    exit_code = 2


class ConfigError(UserError, ValueError):
    """A bad config key or value, flag or path."""


class DataError(UserError, ValueError):
    """Bad or missing data: the message is one line that says what is wrong and what to do."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so that the blocks around it unwind: a folder's lock is
    released, a temporary file removed. A training loop handles it itself (continuation.Stop)."""


def _stop_line(interrupt):
    """(the one line, the exit code) for Ctrl-C or SIGTERM."""
    sigterm = isinstance(interrupt, Terminated)
    name, code = ('SIGTERM', 128 + signal.SIGTERM) if sigterm else ('Ctrl-C', 130)
    line = f'interrupted ({name}): what was complete is kept; rerun the same command to carry on'
    return line, code


_COMMAND_PID = os.getpid()  # a forked worker inherits the handler below, and this number


def _terminate(signum, frame):
    # a forked worker (a multiprocessing pool's, stopped with SIGTERM): as by default
    if os.getpid() != _COMMAND_PID:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
    raise Terminated()


def _stdout_gone():
    """Whether stdout is a pipe whose reader has left (`| head`), not a broken socket elsewhere."""
    poller = select.poll()
    poller.register(sys.stdout.fileno(), select.POLLOUT)
    return any(event & select.POLLERR for _, event in poller.poll(0))


def quiet_stops():
    """For a command's `if __name__ == '__main__'` start, before its slow imports (torch's): Ctrl-C
    or SIGTERM while they run is one line and exit 130 or 143, not a traceback or a silent exit."""
    signal.signal(signal.SIGTERM, _terminate)
    python_hook = sys.excepthook

    def one_line(kind, value, traceback):
        if not issubclass(kind, KeyboardInterrupt):
            return python_hook(kind, value, traceback)
        os._exit(say(*_stop_line(value)))  # outside main(), nothing is left to unwind

    sys.excepthook = one_line


def set_cuda_allocator():
    """The CUDA caching allocator's settings, which it reads once: so a command sets them before it
    imports torch. Expandable segments let freed blocks grow and merge instead of fragmenting: at
    h200_1b3's 86 of 141 GiB, with multi-GB loss buffers of changing shapes, fragmentation is what
    turns a fit into an out-of-memory (nanochat and torchtitan set it too). torch 2.10 renamed the
    variable; 2.9 still ignored the new name for this setting (pytorch #183387)."""
    if not (os.environ.get('PYTORCH_ALLOC_CONF') or os.environ.get('PYTORCH_CUDA_ALLOC_CONF')):
        release = tuple(int(part) for part in importlib.metadata.version('torch').split('.')[:2])
        name = 'PYTORCH_ALLOC_CONF' if release >= (2, 10) else 'PYTORCH_CUDA_ALLOC_CONF'
        os.environ[name] = 'expandable_segments:True'


def cli(function=None, *, reports=None, stopped=None):
    """The one error wrapper of every command's main(argv): a UserError is one 'error: ...' line on
    stderr and its exit code; Ctrl-C and SIGTERM one line and exit 130 or 143; a reader of stdout
    that leaves early (`| head`) ends the command quietly. Under torchrun rank 0 says the line, or
    with `reports` (processes.cli's: whether this rank is the job's first to fail) the first rank
    that fails, named. `stopped` (continuation.rank_lost): (exception, argv) -> (line, exit code)
    for a stop or an error it knows better, or None."""
    if function is None:  # @cli(reports=..., stopped=...)
        return functools.partial(cli, reports=reports, stopped=stopped)

    @functools.wraps(function)
    def main(argv=None):
        in_charge = threading.current_thread() is threading.main_thread()
        previous = signal.getsignal(signal.SIGTERM) if in_charge else None
        if previous == signal.SIG_DFL:  # SIGTERM unwinds like Ctrl-C (another's handler is kept)
            signal.signal(signal.SIGTERM, _terminate)
        args = sys.argv[1:] if argv is None else list(argv)
        rank, world = int(os.environ.get('RANK', 0)), int(os.environ.get('WORLD_SIZE', 1))
        try:
            code = function(args)
            sys.stdout.flush()  # here, where a closed pipe is caught, not at exit
            return code
        except UserError as e:
            message, code = f'error: {e}', e.exit_code
            if reports is not None and world > 1:
                return say(f'error: rank {rank} of {world}: {e}', code) if reports() else code
        # `| head` read what it wanted: no traceback, and none from the flush at exit
        except BrokenPipeError:
            if not _stdout_gone():
                raise
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 128 + signal.SIGPIPE  # what a command killed by SIGPIPE exits with
        except (KeyboardInterrupt, Exception) as e:
            known = stopped and stopped(e, args)
            if not known and not isinstance(e, KeyboardInterrupt):
                raise
            message, code = known or _stop_line(e)
        finally:
            if previous == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, previous)
        return say(message, code) if rank == 0 else code

    return main


def say(message, code=None):
    print(message, file=sys.stderr, flush=True)
    return code


# --------------------------------------------------------------------------------------------------
# Parts. Each part of a model is one row of PARTS, all the other files know of it (docs/forking.md:
# a model part): the ledger counts its parameters and matmul FLOPs from its tensors. Shapes are
# (out, in) as nn.Linear holds them; H is n_embd, H' the FFN width, d the head size, a and r the
# bytes of an activation and of the residual stream. Each `saved` is derived term by term in BOOK.md
# (Derivations: Ledger 4b) and measured exact by tests/test_parts.py and tests/test_model.py.


@dataclass(frozen=True, kw_only=True)
class Part:
    label: str  # its name in the bill
    formula: str  # its parameters as the bill prints them
    # (ModelConfig) -> [(name, shape)] of its tensors inside its module, in model.py's order
    shapes: object = lambda c: []
    # (ModelConfig, a, r, compiled) -> the bytes it saves for backward per token (Ledger 4b)
    saved: object = lambda c, a, r, compiled: 0
    hf: tuple = ()  # the Hugging Face classes that hold it (export.py); () is "not exportable"
    hf_act: str = ''  # an MLP's activation as Hugging Face names it (config.json's hidden_act)
    gguf: tuple = ('*',)  # hf's classes whose llama.cpp architecture computes it (--gguf); '*': all
    # an FFN's default width H' (ffn_hidden = 0): ffn_ratio x H, rounded up to ffn_multiple
    ffn_ratio: Fraction = Fraction(0)
    ffn_multiple: int = 1
    # attention's keys a query attends to, for its FLOPs (12 x L x H x keys, PaLM's convention):
    # (ModelConfig) -> {'model': counted by MFU, 'kernel': what the kernel computes, 'causal': the
    # unmasked mean}, and their symbol in the bill's formulas
    keys: object = None
    keys_symbol: str = ''
    # a loss's buffers at their peak: (ModelConfig, tokens, a, compiled) -> {name: bytes}, and the
    # bill's formula for them: (compiled, a) -> str
    buffers: object = None
    buffers_formula: object = None


def linear(name, fan_in, fan_out, bias):
    """An nn.Linear's tensors: weight (out, in), and its bias when the model has biases."""
    biases = [(f'{name}.bias', (fan_out,))] if bias else []
    return [(f'{name}.weight', (fan_out, fan_in))] + biases


def up_down_shapes(c):
    """An FFN of two matrices, up (H -> H') and down (H' -> H): GELU's and ReLU²'s."""
    up = linear('up_proj', c.n_embd, c.ffn_width, c.biases)
    return up + linear('down_proj', c.ffn_width, c.n_embd, c.biases)


def layernorm_shapes(c):
    return [('weight', (c.n_embd,))] + ([('bias', (c.n_embd,))] if c.biases else [])


def norm_saved(stats, composite):
    """A norm's bytes a token, with `stats` bytes of fp32 statistics; composite: x/rms too where
    torch runs it as several ops (RMSNorm on the CPU)."""

    def saved(c, a, r, compiled, fused=True):
        if compiled:
            return stats + a * c.n_embd
        return r * c.n_embd + stats + (r * c.n_embd if composite and not fused else 0)

    return saved


def mlp_saved(eager, compiled):
    """An FFN's bytes a token: its input a*H and `eager` H'-wide tensors; compiled, `compiled`."""
    return lambda c, a, r, is_compiled: (
        compiled * a * c.ffn_width if is_compiled else a * c.n_embd + eager * a * c.ffn_width
    )


def qk_norm_saved(learned):
    """QK-norm's bytes a token: each head's fp32 1/rms; under autocast (a < r) its fp32 copy of q
    and k; a learned gain's normalised q and k; without RoPE (whose row counts the rotated ones) the
    normalised q and k attention keeps. Compiled: as eager (not measured)."""

    def saved(c, a, r, compiled):
        heads = c.n_head + c.kv_heads
        autocast, width = a < r, heads * c.head_dim
        learned_bytes = (4 if autocast else a) * width if learned else 0
        normalised = 0 if c.part_name('positions') == 'rope' else a * width
        return 4 * heads + (4 * width if autocast else 0) + learned_bytes + normalised

    return saved


def flash_attention_saved(c, a, r, compiled):
    """Attention's bytes a token with a flash kernel (the math kernel's: sums.activation_bytes)."""
    qkv = a * (c.n_head + 2 * c.kv_heads) * c.head_dim
    return (0 if compiled else a * c.n_embd) + qkv + 4 * c.n_head + a * c.n_embd


def full_loss_buffers(c, tokens, a, compiled):
    """The full loss's buffers at the start of the backward, tokens x V elements each (measured on
    the CPU: 11.9 bytes a logit in fp32, 12.1 under bf16 autocast)."""
    elements = tokens * c.vocab_size
    if compiled:
        return {'logits': elements * a, 'grad_logits': elements * a}
    names = ('log_softmax', 'grad_log_softmax', 'grad_logits')
    return dict.fromkeys(names, elements * 4)


CHUNK_ROWS = 2048  # losses.py's rows a chunk (docs/measured.md: the paired bench that chose it)


def chunk_logit_bytes(a, compiled):
    """Bytes a logit of the chunk holds: compiled, three buffers (a + 4 + a: inductor's graph is
    functional); eager, the fp32 softmax's in place, beside the matmul's output when a is not 4."""
    return 2 * a + 4 if compiled else 4 if a == 4 else 4 + a


def chunked_loss_buffers(c, tokens, a, compiled):
    """The chunked loss's buffers at its peak, the last chunk of its forward (BOOK.md, Derivations:
    Ledger 4b; measured by test_memory.py and test_losses.py)."""
    rows, V, H = min(tokens, CHUNK_ROWS), c.vocab_size, c.n_embd
    chunks = -(-tokens // CHUNK_ROWS)
    return {
        'chunk_logits': rows * V * chunk_logit_bytes(a, compiled),
        'grad_weight': V * H * (min(4, a * chunks) if compiled else 4),
        'grad_weight_chunk': V * H * a,
        # the slope 1 - tanh^2 of the cap, fp32 beside the chunk (compiled: counted as eager)
        **({'softcap_slope': rows * V * 4} if c.logit_softcap else {}),
    }


# fmt: off
PARTS = {
    'attention': {
        # causal self-attention over the whole context: a query attends to T keys (non-causal
        # count, as PaLM and nanoGPT count it: the masked half counted as done), T/2 unmasked on
        # average; q, k, v fused, k and v n_kv_head heads wide (GQA), then o_proj
        'causal': Part(
            label='causal self-attention', formula='2H^2 + 2H*kv_width',
            shapes=lambda c: (
                linear('qkv_proj', c.n_embd, (c.n_head + 2 * c.kv_heads) * c.head_dim, c.biases)
                + linear('o_proj', c.n_embd, c.n_embd, c.biases)),
            saved=flash_attention_saved, hf=('*',), keys_symbol='T',
            keys=lambda c: {'model': c.block_size, 'kernel': c.block_size,
                            'causal': c.block_size / 2}),
    },
    'norm': {
        # LayerNorm (Ba et al. 2016): weight, and a bias with the model's; fp32 mean and 1/std
        'layernorm': Part(label='LayerNorm', formula='H (+ H bias)', shapes=layernorm_shapes,
                          saved=norm_saved(8, False), hf=('GPT2LMHeadModel',)),
        # RMSNorm (Zhang and Sennrich 2019): weight only; fp32 1/rms
        'rmsnorm': Part(label='RMSNorm', formula='H', shapes=lambda c: [('weight', (c.n_embd,))],
                        saved=norm_saved(4, True),
                        hf=('LlamaForCausalLM', 'Qwen3ForCausalLM', 'ArceeForCausalLM')),
    },
    'mlp': {
        # GPT-2: up (H -> 4H), GELU (tanh approximation), down: an H'-tensor each side of the GELU
        'gelu': Part(label='GELU MLP', formula="2HH'", shapes=up_down_shapes, saved=mlp_saved(2, 2),
                     hf=('GPT2LMHeadModel',), hf_act='gelu_new', ffn_ratio=Fraction(4)),
        # Llama (Shazeer 2020): down(silu(gate(x)) * up(x)), gate and up fused; H' = 8H/3 rounded
        # up to 256, so that three matrices cost what GPT-2's two do (4096 -> 11008)
        'swiglu': Part(
            label='SwiGLU', formula="3HH'",
            shapes=lambda c: (linear('gate_up_proj', c.n_embd, 2 * c.ffn_width, c.biases)
                              + linear('down_proj', c.ffn_width, c.n_embd, c.biases)),
            saved=mlp_saved(4, 3), hf=('LlamaForCausalLM', 'Qwen3ForCausalLM'), hf_act='silu',
            ffn_ratio=Fraction(8, 3), ffn_multiple=256),
        # ReLU squared (So et al. 2021, Primer; modded-nanogpt, nanochat): down(relu(up(x))^2), 4H
        # wide. A Llama with it is Arcee's AFM (ArceeForCausalLM: Llama's attention and norms); a
        # GGUF only as Arcee (llama.cpp's gpt2 has a GELU only)
        'relu2': Part(label='ReLU² MLP', formula="2HH'", shapes=up_down_shapes,
                      saved=mlp_saved(2, 2), hf=('GPT2LMHeadModel', 'ArceeForCausalLM'),
                      gguf=('ArceeForCausalLM',), hf_act='relu2', ffn_ratio=Fraction(4)),
    },
    'positions': {
        # GPT-2: a block_size x H table added to the embedding (its position ids saved, eager)
        'learned': Part(label='learned positions', formula='T*H', hf=('GPT2LMHeadModel',),
                        shapes=lambda c: [('weight', (c.block_size, c.n_embd))]),
        # RoPE (Su et al. 2021): q and k rotated in each block; no parameters, rotated q and k saved
        'rope': Part(label='RoPE', formula='none',
                     saved=lambda c, a, r, compiled: a * (c.n_head + c.kv_heads) * c.head_dim,
                     hf=('LlamaForCausalLM', 'Qwen3ForCausalLM', 'ArceeForCausalLM')),
    },
    # an RMSNorm of each head of q and k before RoPE (Dehghani et al. 2023; OLMo 2, Qwen3, nanochat)
    'qk_norm': {
        'none': Part(label='no QK-norm', formula='none', hf=('*',)),
        # nanochat's: no parameters (exported with gains of 1)
        'weightless': Part(label='QK-norm (weightless)', formula='none',
                           saved=qk_norm_saved(False), hf=('Qwen3ForCausalLM',)),
        # a learned gain per head dimension, one for q and one for k (Qwen3's q_norm, k_norm)
        'learned': Part(
            label='QK-norm (learned gains)', formula='2d', saved=qk_norm_saved(True),
            shapes=lambda c: [('q_norm.weight', (c.head_dim,)), ('k_norm.weight', (c.head_dim,))],
            hf=('Qwen3ForCausalLM',)),
    },
    # the training loss (losses.py): what it saves for backward a token beyond the final norm's,
    # and its buffers at their peak (sums.logits_bytes)
    'loss': {
        # F.cross_entropy over the whole fp32 logits: lm_head keeps its input a*H; compiled
        # (inductor fuses the softmax's gradient) the log-sum-exp's 8 bytes a token
        'full': Part(
            label='cross-entropy over the full logits', formula='none', buffers=full_loss_buffers,
            saved=lambda c, a, r, compiled: 8 if compiled else a * c.n_embd, hf=('*',),
            buffers_formula=lambda compiled, a: (
                f'B*T*V x {2 * a} bytes: the logits and their gradient (fused)' if compiled
                else "B*T*V x 12 bytes: fp32 log-softmax, its gradient, the logits' gradient")),
        # the same sum a chunk of rows at a time, each chunk's gradients taken in its forward
        # (Liger's fused linear cross-entropy; Cut Cross-Entropy, Wijmans et al. 2024): it keeps
        # h's gradient, r*H a token (compiled: a*H, in the place of the final norm's output)
        'chunked': Part(
            label='chunked cross-entropy', formula='none', buffers=chunked_loss_buffers,
            saved=lambda c, a, r, compiled: 0 if compiled else r * c.n_embd, hf=('*',),
            buffers_formula=lambda compiled, a: (
                f"min(B*T, {CHUNK_ROWS}) x V x {chunk_logit_bytes(a, compiled)} bytes: one chunk's "
                f"logits; V*H x {4 + a}: lm_head's gradient")),
    },
}
# fmt: on
# the model keys that name a part: attention, norm, mlp, positions, qk_norm, loss
PART_KEYS = tuple(PARTS)


@dataclass(frozen=True, kw_only=True)
class Optimizer:
    name: str  # its name in the bill
    label: str  # its states in the bill
    formula: str  # their bytes as the bill prints them (P: the parameters of the tensors it takes)
    # (shape) -> the bytes of state it holds for a tensor (a rank's rows of it under FSDP2)
    state_bytes: object
    # (shape, TrainConfig) -> matmul FLOPs of one step on one tensor it takes: 0 for an elementwise
    # update; and the bill's formula for them (the train keys fill it in)
    step_flops: object
    step_formula: str = ''
    takes: object = None  # (name, shape) -> whether it updates it (None: all); `rest`'s the others
    rest: str = ''
    # the bill's name for the traffic that puts each tensor whole on an owner rank and back under
    # FSDP2, for its update (Muon's Newton-Schulz; muon_blocks)
    gathers: str = ''


def newton_schulz_flops(shape, train):
    """Muon's Newton-Schulz FLOPs on an A x B matrix (BOOK.md, Derivations: Muon's model states and
    step). A 2048-square matrix at 5 steps: 5 x 6 x 2048^3 = 2.6e11 FLOPs."""
    m, n = sorted(shape)
    return train.muon_ns_steps * (4 * m * m * n + 2 * m**3)


def muon_takes(name, shape):
    """Muon's tensors: the blocks' 2-D weights (attention's and the FFN's matrices, every expert's
    too). The MoE router, a classifier over experts as lm_head is over tokens, stays on AdamW with
    the embeddings, norms and biases, as Muon's authors keep the input and output layers."""
    return name.startswith('blocks.') and len(shape) == 2 and '.router.' not in name


def muon_blocks(shapes, ranks):
    """Muon's matrices under FSDP2 and ZeRO-2 (optimizers.py) in blocks of up to `ranks` of one
    shape, each matrix with an owner rank that orthogonalises it: -> [(shape, [(matrix's index,
    owner)])]. Owners go round the ranks across blocks, so that a shape's last, partial block does
    not always load the first ranks: h200_1b3_muon's 88 matrices (4 shapes x 22) over 8 ranks are
    12 blocks, 11 matrices a rank."""
    indices, blocks, turn = {}, [], 0
    for index, shape in enumerate(shapes):
        indices.setdefault(tuple(shape), []).append(index)
    for shape, same in indices.items():
        for first in range(0, len(same), ranks):
            block = same[first : first + ranks]
            blocks.append((shape, [(i, (turn + j) % ranks) for j, i in enumerate(block)]))
            turn += len(block)
    return blocks


# An optimizer is a row as a part is (docs/forking.md: an optimizer).
# fmt: off
OPTIMIZERS = {
    # AdamW (Loshchilov and Hutter 2019): exp_avg and exp_avg_sq in fp32, and a 4-byte step count
    # per tensor; its update is elementwise, ~10 FLOPs a parameter, no matmul (MFU leaves it out)
    'adamw': Optimizer(name='AdamW', label='AdamW m, v', formula='8P',
                       state_bytes=lambda shape: 8 * math.prod(shape) + 4,
                       step_flops=lambda shape, train: 0),
    # Muon (Jordan et al. 2024; torch.optim.Muon): one fp32 momentum buffer for the blocks'
    # matrices, no step count; its update orthogonalises it by Newton-Schulz (matmuls, counted)
    'muon': Optimizer(
        name='Muon', label='Muon momentum', formula='4P_muon',
        state_bytes=lambda shape: 4 * math.prod(shape), step_flops=newton_schulz_flops,
        step_formula='Newton-Schulz, {muon_ns_steps} steps x (4m^2 n + 2m^3) per m x n matrix',
        takes=muon_takes, rest='adamw', gathers='Muon: rows to owners and back'),
}
# fmt: on


def param_groups(optimizer, shapes):
    """train.py's param groups for the optimizer row `optimizer` over (name, shape) pairs, in its
    order (ZeRO-1's assignment follows it): -> [(kind, weight decay on, [names])], empty groups left
    out. The row's own tensors first (Muon's matrices), then its rest's (AdamW's) matrices, decayed,
    then their vectors, not decayed: decaying gains and biases pulls them to zero for no benefit."""
    row = OPTIMIZERS[optimizer]
    own = [name for name, shape in shapes if row.takes and row.takes(name, shape)]
    rest = [(name, shape) for name, shape in shapes if name not in own]
    groups = [(optimizer, True, own)] if row.takes else []
    groups += [
        (row.rest or optimizer, True, [name for name, shape in rest if len(shape) >= 2]),
        (row.rest or optimizer, False, [name for name, shape in rest if len(shape) < 2]),
    ]
    return [group for group in groups if group[2]]


# --------------------------------------------------------------------------------------------------
# Terms added to the cross-entropy, each weighed by a key (0: off; docs/forking.md: a loss term).


@dataclass(frozen=True, kw_only=True)
class LossTerm:
    label: str  # its name in the bill
    formula: str  # what it adds, per token or per sequence, and its source
    key: str  # the config key that weighs it


LOSS_TERMS = {
    'balance': LossTerm(
        label='balance loss (MoE)',
        key='aux_loss_coef',
        formula='alpha x sum_i f_i P_i over the routed experts, per sequence (DeepSeek-V3, 2.1.2)',
    )
}


# --------------------------------------------------------------------------------------------------
# The model families: named choices of parts, with the family's biases, tying and Hugging Face
# class. A new family is a row here (and, for a part the others lack, that part's row and class).


@dataclass(frozen=True, kw_only=True)
class Family:
    norm: str  # a row of PARTS['norm']
    mlp: str  # a row of PARTS['mlp']
    positions: str  # a row of PARTS['positions']
    # the family has biases (Linear layers, norms): a config file gets them unless it says
    # bias = False; a family without them refuses bias = True
    bias: bool
    tie_embeddings: bool  # the family's published tying: a config file's default
    hf_class: str  # the Hugging Face class export.py writes the model as

    def __post_init__(self):
        assert all(getattr(self, kind) in PARTS[kind] for kind in ('norm', 'mlp', 'positions'))


# fmt: off
FAMILIES = {
    # GPT-2 (Radford et al. 2019): LayerNorm, a 4H GELU MLP, learned positions, biases, tied
    'gpt2': Family(norm='layernorm', mlp='gelu', positions='learned', bias=True,
                   tie_embeddings=True, hf_class='GPT2LMHeadModel'),
    # LLaMA (Touvron et al. 2023): RMSNorm, SwiGLU, RoPE, no biases, untied
    'llama': Family(norm='rmsnorm', mlp='swiglu', positions='rope', bias=False,
                    tie_embeddings=False, hf_class='LlamaForCausalLM'),
}
# fmt: on


# --------------------------------------------------------------------------------------------------
# The keys. Model keys use nanoGPT's names. Each breaks a continuation: a checkpoint is for one
# model (train.py refuses to resume it with another), so unlike TrainConfig's they carry no mark.


@dataclass
class ModelConfig:
    arch: str = 'llama'  # the model family, a key of FAMILIES: 'llama' or 'gpt2'
    n_layer: int = 12
    n_head: int = 12
    n_kv_head: int = 0  # key/value heads for GQA; 0 means n_head (plain multi-head attention)
    n_embd: int = 768
    ffn_hidden: int = 0  # FFN width H' (0: the family's, gpt2 4H, llama 8H/3 rounded up to 256)
    vocab_size: int = 50304  # padded to a multiple of 128 in the configs, for speed
    block_size: int = 1024  # context length T (training sequence length)
    # the family's in a config file (load_config), llama's in code (FAMILIES: GPT-2 has both)
    tie_embeddings: bool = False  # the input embedding shared with the output projection
    bias: bool = False  # biases in the Linear layers and norms
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # parts (PARTS above) in place of the family's: '' is the family's own
    attention: str = 'causal'  # the attention's row (one today: the slot a fork's attention takes)
    norm: str = ''  # 'layernorm' or 'rmsnorm'
    mlp: str = ''  # 'gelu', 'swiglu' or 'relu2'
    positions: str = ''  # 'learned' or 'rope'
    qk_norm: str = 'none'  # 'none', 'weightless' (nanochat) or 'learned' (gains per dim: Qwen3)
    loss: str = 'chunked'  # 'chunked' (one chunk of the logits at a time) or 'full' (B x T x V)
    # cap * tanh(logits / cap) on the output logits (Gemma 2's 30, nanochat's 15); 0: none. The
    # chunked loss keeps its slope, one more fp32 chunk (chunked_loss_buffers)
    logit_softcap: float = 0.0
    # mixture of experts (DeepSeekMoE, moe.py; llama family). n_experts = 0: every FFN dense
    n_experts: int = 0  # routed experts in each MoE layer
    top_k: int = 0  # routed experts each token visits (1..n_experts)
    expert_hidden: int = 0  # each expert's width (routed and shared alike), an MLP of the mlp row
    n_shared_experts: int = 0  # experts every token visits, one MLP of n_shared x expert_hidden
    n_dense_layers: int = 0  # the first layers keep the dense FFN (DeepSeek-V3: 3 of 61)
    route_scale: float = 1.0  # the routed scaling factor on the normalised gates (DeepSeek-V3: 2.5)

    @property
    def family(self):
        return FAMILIES[self.arch]

    def part_name(self, kind):
        return getattr(self, kind) or getattr(self.family, kind)

    def part(self, kind):
        return PARTS[kind][self.part_name(kind)]

    @property
    def biases(self):
        return self.bias and self.family.bias

    @property
    def kv_heads(self):
        return self.n_kv_head or self.n_head

    @property
    def head_dim(self):
        return self.n_embd // self.n_head

    @property
    def ffn_width(self):
        if self.ffn_hidden:
            return self.ffn_hidden
        mlp = self.part('mlp')  # exact: a Fraction
        return mlp.ffn_multiple * math.ceil(mlp.ffn_ratio * self.n_embd / mlp.ffn_multiple)

    @property
    def ffn_matrices(self):
        """H x H' matrices in the FFN, from its row: up and down (GELU, ReLU²); SwiGLU's three."""
        shapes = self.part('mlp').shapes(self)
        weights = sum(math.prod(shape) for _, shape in shapes if len(shape) == 2)
        return weights // (self.n_embd * self.ffn_width)

    @property
    def moe_layers(self):
        return self.n_layer - self.n_dense_layers if self.n_experts else 0


# TrainConfig's keys are marked by what their change does to a resumed run. exact(): it breaks the
# exact continuation (the data and its order, the schedule, the optimizer, the numerics), so
# train.py refuses it without --allow_change=KEY. free(): it may change on resume (the run's length
# cap, logging, evals and checkpoints, the spike guard, the ledger's assumptions, micro_batch and
# the world size: the same global batch); train.py logs the change.


def exact(default):
    return dataclasses.field(default=default, metadata={'resume': 'exact'})


def free(default):
    return dataclasses.field(default=default, metadata={'resume': 'free'})


@dataclass
class TrainConfig:
    # --- run and data
    out_dir: str = free('out')
    # a folder made by prepare.py, 'synthetic' (random tokens, for benchmarks) or a weighted
    # mixture of folders: {'data/web': 0.6, 'data/code': 0.4} (--data=data/web:0.6,data/code:0.4)
    data: str = exact('data/pystdlib')
    seed: int = exact(1337)
    train_tokens: int = exact(26_000_000_000)  # tokens the run is planned to see (sets the steps)
    max_steps: int = free(0)  # stop after this many steps (0: train_tokens, the schedule's span)
    # minutes of training steps the run is planned for (0: train_tokens plans it): the tokens they
    # buy at the ledger's predicted tokens/s, fixed at the start and kept by a resume (start-up,
    # compiling, evals and checkpoints come on top); --train_tokens on the command line wins
    train_minutes: float = free(0.0)
    dataset_tokens: int = free(0)  # tokens in the dataset, for the ledger's "is it enough" (0: ?)
    # --- batch: the global batch in tokens, micro_batch sequences x accumulation x world size
    batch_tokens: int = exact(524_288)
    micro_batch: int = free(16)  # sequences per GPU per forward/backward
    # ramp the batch from batch_ramp_start to batch_tokens over batch_ramp_tokens tokens (0: none)
    batch_ramp_tokens: int = exact(0)
    batch_ramp_start: int = exact(32_768)
    # --- optimizer and schedule (the book: AdamW 0.9/0.95/1e-8, wd 0.1 on matrices, clip 1.0,
    # warmup 0.1-0.5%, decay to 10%)
    lr: float = exact(6e-4)
    min_lr_ratio: float = exact(0.1)
    schedule: str = exact('cosine')  # 'cosine' or 'wsd' (warmup-stable-decay)
    warmup_frac: float = exact(0.003)  # fraction of steps spent in linear warmup
    decay_frac: float = exact(0.2)  # wsd only: fraction of steps spent in the final linear decay
    # a wsd run's cooldown branches, their lengths in tokens, e.g. (26e9, 52e9), for
    # experiments/overtrain.py (train.py does not read it; docs/overtraining.md)
    cooldowns: tuple = free(())
    # a cooldown decays the LR from the peak to the floor over cooldown_tokens from another run's
    # checkpoint folder (its weights, optimizer states, step and data position)
    cooldown_from: str = exact('')
    cooldown_tokens: int = exact(0)
    # start from a published model (pretrained.py): a Hugging Face model folder or Hub repo id; the
    # model keys come from its config.json. A resumed run reads its own checkpoints
    init_from: str = exact('')
    # what the model learns to predict (objectives.py; docs/objectives.md): 'clm', 'prefix_lm',
    # 'fim' or 'ul2' (the last two need the special tokens prepare.py reserves)
    objective: str = exact('clm')
    fim_rate: float = exact(0.5)  # fim: the share of documents rearranged ("FIM for free": to 0.9)
    fim_spm_rate: float = exact(0.5)  # fim: the share of those in SPM order, the rest PSM
    # ul2: the shares of documents given the S (prefix LM), R (short spans, 15%) and X (long spans
    # or 50%) denoisers, summing to 1; half S, as U-PaLM's UL2R mixture
    ul2_s_rate: float = exact(0.5)
    ul2_r_rate: float = exact(0.25)
    ul2_x_rate: float = exact(0.25)
    optimizer: str = exact('adamw')  # a row of OPTIMIZERS
    # Muon's peak LR (0: AdamW's lr, scaled per matrix by torch's match_rms_adamw rule,
    # 0.2 sqrt(max(A, B)), so lr and weight_decay carry over (Liu et al. 2025); else Muon's own,
    # e.g. 0.02, scaled by Keller Jordan's sqrt(max(1, A/B)))
    muon_lr: float = exact(0.0)
    muon_momentum: float = exact(0.95)  # this and the next two: torch.optim.Muon's defaults
    muon_nesterov: bool = exact(True)
    muon_ns_steps: int = exact(5)
    weight_decay: float = exact(0.1)
    beta1: float = exact(0.9)
    beta2: float = exact(0.95)
    eps: float = exact(1e-8)
    grad_clip: float = exact(1.0)  # clip the global gradient norm to this (0: no clipping)
    # --- precision, speed, memory, parallelism
    dtype: str = exact('auto')  # 'auto' (bf16 on CUDA; on a CPU the faster, measured) or a dtype
    compile: bool = free(True)
    recompute: bool = free(False)  # activation recomputation per block (the ledger's 8P)
    parallel: str = free('ddp')  # ddp, zero1, zero2 or fsdp; a checkpoint resumes in its own mode
    # how long a collective waits for every rank before the job fails (NCCL's default: 10 minutes):
    # the longest waits are legitimate ones, 8 ranks compiling before the first all-reduce, or rank
    # 0 writing h200_1b3's 11 GB ZeRO-1 optimizer.pt while the others wait at a barrier
    collective_timeout_s: int = free(1800)
    # --- logging, evals, samples, checkpoints, spike guard
    log_every: int = free(10)
    eval_every: int = free(250)
    eval_tokens: int = free(1_048_576)
    # HellaSwag (evals.py) every this many steps and at the end (0: never), on its first
    # hellaswag_items of 10,042 (0: all)
    hellaswag_every: int = free(0)
    hellaswag_items: int = free(0)
    # ARC and MMLU (evals.py), names from EVAL_TASKS, likewise
    eval_tasks: str = free('arc_easy,arc_challenge,mmlu')
    eval_tasks_every: int = free(0)
    eval_tasks_items: int = free(0)
    sample_every: int = free(0)  # 0: no samples during training
    sample_tokens: int = free(0)  # tokens per sample, at sample_every and at the end (0: none)
    ckpt_every: int = free(1000)
    keep_ckpts: int = free(3)
    keep_steps: tuple = free(())  # steps whose checkpoints are never pruned, e.g. (1000, 2000)
    # the spike guard (continuation.find_spike); the std has a floor, a fraction of the mean:
    # late in a run the loss is so steady (std ~0.01) that 3 std would read ordinary noise as spikes
    spike_factor: float = free(3.0)
    spike_window: int = free(50)
    spike_min_std: float = free(0.02)
    max_rollbacks: int = free(5)
    # every metrics.jsonl record also to 'tensorboard' (out_dir/tensorboard) and/or 'wandb'
    # (offline in out_dir/wandb unless WANDB_MODE=online); nanoGPT's wandb_log=True adds 'wandb'
    tracker: str = free('')
    wandb_log: bool = free(False)
    wandb_project: str = free('ledgergpt')
    wandb_run_name: str = free('')  # '': the out_dir's name
    # --- MoE load balancing (DeepSeek-V3, arXiv:2412.19437, 2.1.2): each router bias moves this
    # much a step against its expert's load error (gamma 0.001); the sequence-wise balance loss's
    # alpha (0: off; DeepSeek-V3: 0.0001)
    router_bias_speed: float = exact(0.001)
    aux_loss_coef: float = exact(0.0)
    # --- the ledger's assumptions: the device (a name in sums.GPUS such as 'H200', 'cpu', or
    # 'auto': this machine's GPU, else its CPU, measured by a short GEMM probe), how many, at what
    # model FLOPs utilisation (the seed's 40%)
    gpu: str = free('auto')
    n_gpu: int = free(1)  # train.py uses the real world size
    mfu: float = free(0.40)
    # Ledger 5's topology: the nodes the n_gpu devices span (0: 8 per node), and the bus bandwidths
    # inside a node (per GPU) and between nodes (per node), GB/s (0: the table's)
    nodes: int = free(0)
    intra_node_busbw: float = free(0.0)
    inter_node_busbw: float = free(0.0)
    usd_per_gpu_hour: float = free(3.5)
    # a scaling law fitted to our own runs (experiments/ladder.py's fit.json): the ledger bills the
    # loss it predicts, report.md and summary.json set it beside the measured final val loss
    fit: str = free('')


CONFIG_CLASSES = (ModelConfig, TrainConfig)
DEFAULTS = {f.name: f.default for cls in CONFIG_CLASSES for f in dataclasses.fields(cls)}
# the keys whose change breaks an exact continuation on resume (train.py's --allow_change)
CONTINUATION_KEYS = tuple(
    f.name for f in dataclasses.fields(TrainConfig) if f.metadata['resume'] == 'exact'
)


# --------------------------------------------------------------------------------------------------
# Parallel modes (train.py's; the ledger counts what each holds): 'ddp' replicates everything,
# 'zero1' shards the optimizer's states (ZeroRedundancyOptimizer), 'zero2' and 'fsdp' (ZeRO-3) are
# FSDP2's fully_shard and shard the weights and gradients too. One process is whole in every mode.

PARALLEL_MODES = ('ddp', 'zero1', 'zero2', 'fsdp')
FSDP_MODES = ('zero2', 'fsdp')


def sharded(parallel, world_size):
    """Whether FSDP2 shards the run: a mode built on it, over more than one process."""
    return world_size > 1 and parallel in FSDP_MODES


TRACKERS = ('tensorboard', 'wandb')  # trackers.py's, the names the key tracker takes
EVAL_TASKS = ('arc_easy', 'arc_challenge', 'mmlu', 'mmlu_5shot')  # evals.py's Hub tasks


# --------------------------------------------------------------------------------------------------
# The objectives' vocabulary (objectives.py transforms sequences with it, prepare.py reserves the
# tokens, the ledger counts the positions that carry loss).

OBJECTIVES = ('clm', 'prefix_lm', 'fim', 'ul2')
EOT = '<|endoftext|>'  # every document starts with it (the shard format's rule)

# The special tokens, reserved in every new data folder (docs/objectives.md): FIM's three (spelled
# as tiktoken's cl100k_base), UL2's mode tokens and 16 span sentinels (T5's <extra_id_N>, reused in
# order past 16). Never in the shards: a document's text '<|fim_prefix|>' is plain text, like
# '<|endoftext|>'; the objective inserts the ids as it packs a batch.
FIM_TOKENS = ('<|fim_prefix|>', '<|fim_suffix|>', '<|fim_middle|>')
UL2_MODES = ('<|ul2_s|>', '<|ul2_r|>', '<|ul2_x|>')
SENTINELS = tuple(f'<|sentinel_{i}|>' for i in range(16))
SPECIAL_TOKENS = ('<|fim_prefix|>', '<|fim_middle|>', '<|fim_suffix|>', *UL2_MODES, *SENTINELS)
NEEDS = {'clm': (), 'prefix_lm': (), 'fim': FIM_TOKENS, 'ul2': UL2_MODES + SENTINELS}

# UL2's denoisers (Tay et al. 2022, 3.1.2) as (mean span length, share of tokens masked): R is T5's
# span corruption (the book: ~15% in spans of 3-5), X the extreme ones (spans over 12 tokens or ~50%
# masked). A fragment given R or X takes one of its settings uniformly.
R_DENOISERS = ((3, 0.15),)
X_DENOISERS = ((3, 0.5), (8, 0.5), (64, 0.15), (64, 0.5))

# A target of IGNORE_INDEX carries no loss: prefix LM and UL2 set it where the input is given.
IGNORE_INDEX = -1


# --------------------------------------------------------------------------------------------------
# What each key allows beyond its type: (test, the words an error uses). Keys not listed take any
# value of their type. Shapes that tie two keys (n_embd divisible by n_head, ...) are checked after.


def _one_of(*choices):
    return lambda v: v in choices, 'one of ' + ', '.join(choices)


def _part_rule(kind):
    names = tuple(PARTS[kind])
    if kind in ('attention', 'qk_norm', 'loss'):  # not a family's: every family takes any
        return _one_of(*names)
    return lambda v: v in ('', *names), f"one of {', '.join(names)} (or '' for the family's)"


def _names_among(names):
    allowed = 'comma-separated names among ' + ', '.join(names)
    return lambda v: all(name in names for name in v.split(',') if name), allowed


def _or_0(meaning):
    return lambda v: v >= 0, f'positive (or 0: {meaning})'


RULES = {
    **dict.fromkeys(
        'n_layer n_head n_embd block_size norm_eps rope_theta route_scale train_tokens '
        'batch_tokens micro_batch batch_ramp_start lr eps collective_timeout_s log_every '
        'eval_every eval_tokens ckpt_every keep_ckpts spike_factor spike_window n_gpu'.split(),
        (lambda v: v > 0, 'positive'),
    ),
    **dict.fromkeys(
        'n_experts top_k expert_hidden n_shared_experts n_dense_layers router_bias_speed '
        'aux_loss_coef seed max_steps train_minutes dataset_tokens batch_ramp_tokens weight_decay '
        'sample_every hellaswag_every hellaswag_items eval_tasks_every eval_tasks_items '
        'sample_tokens spike_min_std max_rollbacks usd_per_gpu_hour'.split(),
        (lambda v: v >= 0, 'positive (or 0)'),
    ),
    **dict.fromkeys(
        'min_lr_ratio fim_rate fim_spm_rate ul2_s_rate ul2_r_rate ul2_x_rate'.split(),
        (lambda v: 0 <= v <= 1, 'in [0, 1]'),
    ),
    **dict.fromkeys(('decay_frac', 'mfu'), (lambda v: 0 < v <= 1, 'in (0, 1]')),
    **dict.fromkeys(
        'warmup_frac muon_momentum beta1 beta2'.split(), (lambda v: 0 <= v < 1, 'in [0, 1)')
    ),
    # one token: nothing to predict (the loss 0 from the first step), whatever the data
    'vocab_size': (lambda v: v >= 2, 'at least 2'),
    'arch': _one_of(*FAMILIES),
    **{kind: _part_rule(kind) for kind in PARTS},
    **dict.fromkeys(('n_kv_head', 'ffn_hidden'), _or_0('the default')),
    'logit_softcap': _or_0('none'),
    'out_dir': (bool, 'a folder name'),
    'data': (bool, "a folder made by prepare.py, a weighted mixture of them, or 'synthetic'"),
    'schedule': _one_of('cosine', 'wsd'),
    'objective': _one_of(*OBJECTIVES),
    'optimizer': _one_of(*OPTIMIZERS),
    'muon_lr': _or_0("AdamW's lr, match_rms_adamw"),
    'muon_ns_steps': (lambda v: 0 < v < 100, 'in 1..99 (torch.optim.Muon)'),
    'grad_clip': _or_0('off'),
    'dtype': _one_of('auto', 'bfloat16', 'float32'),
    'parallel': _one_of(*PARALLEL_MODES),
    'eval_tasks': _names_among(EVAL_TASKS),
    'tracker': _names_among(TRACKERS),
    'gpu': (bool, "a name in sums.py's GPU table, 'cpu' or 'auto'"),
    'nodes': _or_0('8 devices per node'),
    'intra_node_busbw': (lambda v: v >= 0, "positive GB/s (or 0: sums.py's table)"),
    'inter_node_busbw': (lambda v: v >= 0, "positive GB/s per node (or 0: sums.py's table)"),
}
assert set(RULES) <= set(DEFAULTS)

# nanoGPT's config names (its train.py globals) that differ from ours, with what to write instead: a
# nanoGPT user types them first, and a spelling hint would answer --learning_rate with 'ul2_r_rate'.
NANOGPT_NAMES = {
    'learning_rate': "use 'lr'",
    'min_lr': "use 'min_lr_ratio' (the floor as a fraction of lr: nanoGPT's 6e-5 of 6e-4 is 0.1)",
    'batch_size': "use 'micro_batch' (sequences per forward/backward)",
    'gradient_accumulation_steps': "use 'batch_tokens' (the global batch in tokens; the "
    "accumulation follows from it)",
    'max_iters': "use 'max_steps' (or 'train_tokens', which sets the steps the schedule spans)",
    'lr_decay_iters': "use 'train_tokens' (the schedule spans the run's tokens)",
    'warmup_iters': "use 'warmup_frac' (warmup as a fraction of the steps)",
    'decay_lr': "use 'schedule' ('cosine' or 'wsd')",
    'eval_iters': "use 'eval_tokens' (the val tokens scored per eval)",
    'eval_interval': "use 'eval_every'",
    'log_interval': "use 'log_every'",
    'always_save_checkpoint': "use 'ckpt_every'",
    'eval_only': "not a key here: evals.py scores a checkpoint (HellaSwag), sample.py writes "
    "from one",
    'dataset': "use 'data' (a folder made by prepare.py)",
    'device': "not a key here: train.py takes the GPU of its rank under torchrun, else the CPU",
    'backend': "not a key here: NCCL on GPUs, gloo on the CPU",
    'dropout': "not a key here: ledgergpt pretrains without dropout",
}


def _unknown_key_error(key, where):
    close = difflib.get_close_matches(key, list(DEFAULTS), n=1, cutoff=0.5)
    hint = "the keys are ModelConfig's and TrainConfig's in config.py"
    if close:
        hint = f"did you mean '{close[0]}'?"
    if key in NANOGPT_NAMES:
        hint = f"nanoGPT's '{key}': {NANOGPT_NAMES[key]}"
    return ConfigError(f"unknown config key '{key}' in {where}: {hint}")


def _number(value):
    """An int or a finite float; not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _whole(value):
    """An int, or a float that is whole (26e9); not a bool."""
    return _number(value) and value == int(value)


_BOOLEANS = {'1': True, 'true': True, 'yes': True, 'on': True}
_BOOLEANS |= {'0': False, 'false': False, 'no': False, 'off': False}
# What a key takes, by the type of its default: (accepts, converts, the words an error uses, reads
# --key=VALUE's text). Whole floats pass for ints (26e9, 1e6); ints for floats; bools only as
# True/False (a string 'False' would read as true); a list or tuple of whole numbers for a tuple.
# fmt: off
_TYPES = {
    bool: (lambda v: isinstance(v, bool), bool, 'True or False',
           lambda text: _BOOLEANS[text.lower()]),
    int: (_whole, int, 'a whole number',
          lambda text: int(text) if text.lstrip('+-').isdigit() else float(text)),  # 26e9 too
    float: (_number, float, 'a finite number', float),
    tuple: (lambda v: isinstance(v, (tuple, list)) and all(map(_whole, v)),
            lambda v: tuple(map(int, v)), 'a list of whole numbers',
            lambda text: tuple(float(part) for part in text.split(',') if part)),  # 26e9,52e9
    str: (lambda v: isinstance(v, str), str, 'a string', str),
}
# fmt: on


def _parse_value(key, text):
    kind = type(DEFAULTS[key])
    try:
        return _TYPES[kind][3](text)  # the type's reader
    except (KeyError, ValueError):
        expected = f'a value of type {kind.__name__}'
        if kind is tuple:
            expected = 'whole numbers, comma-separated (1000,2000)'
        raise ConfigError(f"--{key}={text}: expected {expected}") from None


def _typed(key, value, where):
    """value with the type of the key's default (_TYPES), or ConfigError. The data key's mixture
    (a dict in a config file) is kept as its text."""
    if key == 'data' and isinstance(value, dict):
        return mixture_text(value.items(), where)
    accepts, convert, expected, _ = _TYPES[type(DEFAULTS[key])]
    if not accepts(value):
        raise ConfigError(f"{key} = {value!r} in {where}: expected {expected}")
    if key == 'data' and is_mixture(value):
        return mixture_text(data_sources(value), where)
    return convert(value)


# --------------------------------------------------------------------------------------------------
# The data key: one folder, or a weighted mixture of folders (mixture.py's schedule, data.py's
# MixtureStream), kept in the command line's text with the weights normalised to sum to 1, so a
# resumed run compares one string and every tool reads one form.

MIXTURE_UNITS = 1000  # mixture weights are kept to multiples of 1/1000 (mixture.py)


def is_mixture(data):
    """'a:0.6,b:0.4', 'a:1': a mixture; a folder that exists is one, whatever its name ('x:2')."""
    return not os.path.isdir(data) and (',' in data or _weight(data.rpartition(':')[2]) is not None)


def _weight(text):
    try:
        weight = float(text)
    except ValueError:
        return None
    return weight if math.isfinite(weight) else None


def data_sources(data):
    """The data key's (folder, weight) pairs: [(data, 1.0)] for one folder."""
    if not is_mixture(data):
        return [(data, 1.0)]
    sources = []
    for part in data.split(','):
        folder, _, text = part.rpartition(':')
        if not folder or _weight(text) is None:
            raise ConfigError(
                f"data={data}: cannot read '{part}' as FOLDER:WEIGHT (a mixture is written "
                f"data/web:0.6,data/code:0.4, or as a dict in a config file)"
            )
        sources.append((folder, _weight(text)))
    return sources


def mixture_text(sources, where):
    """(folder, weight) pairs, checked -> 'folder:weight,...', the weights normalised to sum 1."""
    sources = list(sources)
    for folder, weight in sources:
        if not isinstance(folder, str) or not folder or ',' in folder:
            raise ConfigError(
                f"data: {folder!r} in {where} is not a folder name (a string without commas)"
            )
        if not (_number(weight) and weight > 0):
            raise ConfigError(
                f"data: {folder}'s weight in {where} must be a positive number, got {weight!r}"
            )
    folders = [folder for folder, _ in sources]
    if not sources or len(set(folders)) < len(folders):
        raise ConfigError(
            f"data in {where}: a mixture names each folder once, at least one, got {folders}"
        )
    total = sum(weight for _, weight in sources)
    for folder, weight in sources:
        if round(weight / total * MIXTURE_UNITS) == 0:
            raise ConfigError(
                f"data: {folder}'s weight {weight / total:.2g} in {where} rounds to 0 (mixture "
                f"weights are kept to 1/{MIXTURE_UNITS}): raise it or drop the folder"
            )
    return ','.join(f'{folder}:{weight / total:.6g}' for folder, weight in sources)


def _run_config(path):
    """The names a config file sets, run in a fresh namespace, never in our globals. An exception it
    raises is bad input too, one line, no traceback; so are its own sys.exit() (which ended the
    command silently, rc 0 for sys.exit(0)) and a KeyboardInterrupt it raises itself (read as a
    Ctrl-C). A real Ctrl-C meanwhile stays one: the SIGINT handler notes that it came."""
    try:
        with open(path) as f:
            code = compile(f.read(), path, 'exec')
    except SyntaxError as e:  # `n_layer = `: the file and the line, not a traceback
        line = f'{path}:{e.lineno}'
        raise ConfigError(f"{line}: {e.msg}: a config file is `key = value` lines") from None
    ended = ": a config file sets keys (`key = value` lines); it may not end the command"
    signalled, previous, namespace = [], None, {}

    def interrupted(signum, frame):
        signalled.append(signum)
        raise KeyboardInterrupt

    in_charge = threading.current_thread() is threading.main_thread()
    # not an ignored SIGINT
    if in_charge and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        previous = signal.signal(signal.SIGINT, interrupted)
    try:
        exec(code, namespace)
        return namespace
    except Exception as e:  # a typo in a config file, say
        raise ConfigError(f"{path} does not run: {type(e).__name__}: {e}") from None
    except SystemExit as e:
        status = '' if e.code is None else repr(e.code)
        raise ConfigError(f"{path} calls sys.exit({status}){ended}") from None
    except KeyboardInterrupt:
        if signalled or isinstance(sys.exc_info()[1], Terminated):  # Ctrl-C or SIGTERM: the user's
            raise
        raise ConfigError(f"{path} raises KeyboardInterrupt{ended}") from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def read_values(path=None, overrides=()):
    """The keys a config file (plain Python assignments) and `--key=value` overrides set, typed:
    (values, where each was set). A file's names starting with '_' and modules are ignored."""
    values, where = {}, {}
    if path:
        if not os.path.isfile(path):
            raise ConfigError(f"config file not found: {path} (the configs are in configs/)")
        for key, value in _run_config(path).items():
            if key.startswith('_') or type(value).__name__ == 'module':
                continue
            if key not in DEFAULTS:
                raise _unknown_key_error(key, path)
            values[key], where[key] = value, path
    for item in overrides:
        if not item.startswith('--') or '=' not in item:
            raise ConfigError(f"cannot read argument '{item}': overrides are written --key=value")
        key, text = item[2:].split('=', 1)
        if key not in DEFAULTS:
            raise _unknown_key_error(key, 'the command line')
        values[key], where[key] = _parse_value(key, text), 'the command line'
    return {key: _typed(key, value, where[key]) for key, value in values.items()}, where


def load_config(path=None, overrides=()):
    """Read a config file and `--key=value` overrides (read_values) into (ModelConfig, TrainConfig),
    checked."""
    values, where = read_values(path, overrides)
    if where.get('train_tokens') == 'the command line' != where.get('train_minutes'):
        values['train_minutes'] = 0.0  # --train_tokens plans the run, over the file's minutes
    # the family's bias and tying unless the config sets them (an unknown arch: validate says)
    if family := FAMILIES.get(values.get('arch', DEFAULTS['arch'])):
        values = {'bias': family.bias, 'tie_embeddings': family.tie_embeddings} | values
    model, train = (
        cls(**{k: v for k, v in values.items() if k in {f.name for f in dataclasses.fields(cls)}})
        for cls in CONFIG_CLASSES
    )
    validate(model, train)
    return model, train


def validate(model, train):
    """Every key's range (RULES), then the shapes that tie keys together; each failure is one
    ConfigError line naming the key, the value and what is allowed."""
    for key, value in (vars(model) | vars(train)).items():
        test, allowed = RULES.get(key, (None, None))
        if test is not None and not test(value):
            said = 'not' if allowed.startswith('one of') else 'got'
            raise ConfigError(f"{key} must be {allowed}, {said} {value!r}")
    # the shapes that tie keys together, each (broken, its line), checked in order
    # fmt: off
    shapes = (
        (model.n_embd % model.n_head,
         f"n_embd ({model.n_embd}) must be divisible by n_head ({model.n_head})"),
        (model.n_head % model.kv_heads,
         f"n_head ({model.n_head}) must be divisible by n_kv_head ({model.kv_heads})"),
        (model.part_name('positions') == 'rope' and model.head_dim % 2,
         f"RoPE needs an even head size, got n_embd/n_head = {model.head_dim}"),
        (model.bias and not model.family.bias,
         f"bias = True: the {model.arch} family has no biases (FAMILIES in config.py)"),
        (model.logit_softcap and model.loss != 'chunked',
         f"logit_softcap = {model.logit_softcap:g} needs loss = 'chunked', not {model.loss!r}: "
         "the full loss would hold the capped logits' tanh too, which the ledger does not count"),
        # tanh(z / cap) saturates: every logit +-cap, no gradient
        (0 < model.logit_softcap < 1,
         f"logit_softcap = {model.logit_softcap:g} is below 1: the model cannot learn through it "
         "(Gemma 2 caps at 30, nanochat at 15)"),
        # a mixture of experts needs the rest of an MoE layer's shape
        (model.n_experts and not 1 <= model.top_k <= model.n_experts,
         f"top_k must be in 1..n_experts ({model.n_experts}), got {model.top_k}"),
        (model.n_experts and not model.expert_hidden,
         f"n_experts = {model.n_experts} needs expert_hidden, each expert's width (e.g. H'/top_k)"),
        (model.n_experts and model.n_dense_layers >= model.n_layer,
         f"n_dense_layers ({model.n_dense_layers}) must be below n_layer ({model.n_layer}): no "
         "layer has experts"),
    )
    # fmt: on
    for broken, line in shapes:
        if broken:
            raise ConfigError(line)
    # without experts, the MoE keys keep their defaults
    for key in ('top_k', 'expert_hidden', 'n_shared_experts', 'n_dense_layers', 'route_scale'):
        if not model.n_experts and (value := getattr(model, key)) != DEFAULTS[key]:
            raise ConfigError(f"{key} = {value!r} is for a mixture of experts: set n_experts too")
    for key, value in vars(train).items():  # an optimizer's own keys (muon_lr, ...) only with it
        owner = key.split('_')[0]
        if owner in OPTIMIZERS and owner != train.optimizer and value != DEFAULTS[key]:
            drop = f'set it too, or drop {key}'
            raise ConfigError(f"{key} = {value!r} is for optimizer = {owner!r}: {drop}")
    if train.batch_ramp_tokens and train.batch_ramp_start > train.batch_tokens:
        raise ConfigError(
            f"batch_ramp_start ({train.batch_ramp_start:,}) must be at most batch_tokens "
            f"({train.batch_tokens:,})"
        )


def tokens_per_micro_step(model, train, world_size):
    """Tokens one micro-step covers on all processes; ConfigError if the global batch is not a whole
    number of them. The one check of a plan's batch: train.py makes it with its world size, the
    ledger with n_gpu, so the ledger never prints a plan that train.py refuses."""
    tokens = train.micro_batch * model.block_size * world_size
    if train.batch_tokens % tokens:
        raise ConfigError(
            f"batch_tokens ({train.batch_tokens:,}) is not a multiple of micro_batch x block_size "
            f"x processes = {train.micro_batch} x {model.block_size} x {world_size} = {tokens:,} "
            f"({train.batch_tokens / tokens:.4g} accumulation steps): change batch_tokens, "
            "micro_batch or the number of processes (n_gpu in the ledger)"
        )
    return tokens
