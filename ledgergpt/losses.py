"""
losses.py: the training loss, by the name of its row in config.PARTS['loss'] (model.py's LOSSES).
Each takes the final hidden states h (B, T, H), lm_head's weight (V, H) and the targets (B, T), and
returns the cross-entropy of the targets that are not IGNORE_INDEX: their sum, or their mean.

    full:    F.cross_entropy over the whole fp32 logits, B x T x V of them (12 bytes a logit eager).
    chunked: the same sum, CHUNK_ROWS rows at a time, each chunk's gradients with respect to h and
             to the weight taken in the same forward pass (Liger's fused linear cross-entropy; Cut
             Cross-Entropy, Wijmans et al. 2024): one chunk's logits exist at a time, and backward
             multiplies two saved gradients by the loss's scalar gradient. At nanochat's 32 x 2048 x
             65,536 the full loss holds 48 GiB, this one CHUNK_ROWS x V x 6 bytes in bf16 (0.75 GiB;
             compiled, 8 bytes in three buffers: 1 GiB) and two gradients (0.3 GiB each).

The numerics are the full loss's: the logits in the compute dtype (autocast's, else h's), then fp32
for the softmax; the gradients leave in that dtype for the two matmuls, as lm_head's backward runs
them. A soft cap (logit_softcap, the chunked loss's alone: config.validate) makes the fp32 logits z
into cap * tanh(z / cap) and multiplies their gradient by its slope, 1 - tanh(z / cap)^2.
"""

import torch
import torch.nn.functional as F

# Rows of h per chunk (config's, where the ledger reads it too): large enough that the chunk's GEMMs
# run as fast as the whole one (docs/measured.md, the paired bench: no slower on the CPU).
from ledgergpt.config import CHUNK_ROWS, IGNORE_INDEX


def softcap(logits, cap):
    """cap * tanh(logits / cap) (Gemma 2; nanochat): model.py's logits, bounded to (-cap, cap)."""
    return cap * torch.tanh(logits / cap) if cap else logits


def full_cross_entropy(h, weight, targets, reduction, config=None):
    assert not (config and config.logit_softcap), "config.validate: the cap is the chunked loss's"
    logits = F.linear(h, weight).float()  # a bf16 log-softmax over 50K classes loses digits: fp32
    return F.cross_entropy(
        logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX, reduction=reduction
    )


class ChunkedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, targets, mean, grads, cap):
        device = h.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else h.dtype
        keep = targets != IGNORE_INDEX
        count = keep.sum()
        with torch.autocast(device, enabled=False):  # the casts are explicit below
            w = weight.to(dtype)
            grad_h, grad_w = torch.empty_like(h), torch.zeros_like(weight, dtype=torch.float32)
            loss = torch.zeros((), dtype=torch.float32, device=h.device)
            for start in range(0, h.shape[0], CHUNK_ROWS):
                rows = slice(start, start + CHUNK_ROWS)
                hc, t, kc = h[rows].to(dtype), targets[rows].clamp_min(0), keep[rows]
                logits, slope, grad = (hc @ w.t()).float(), None, None
                # cap * tanh(z / cap) in place, and its slope for the gradient: one more fp32 chunk
                if cap:
                    logits.div_(cap).tanh_()
                    slope = logits.square().neg_().add_(1) if grads else None
                    logits.mul_(cap)
                # the softmax in place, in the chunk's one fp32 buffer: exp(z - max) / sum
                picked = logits.gather(1, t[:, None]).squeeze(1)
                top = logits.amax(1, keepdim=True)
                probs = logits.sub_(top).exp_()
                total = probs.sum(1, keepdim=True)
                loss += ((total.log() + top).squeeze(1) - picked).masked_fill(~kc, 0).sum()
                if grads:  # (eval, no_grad: the loss alone)
                    # d loss / d logits = softmax - one-hot, none from an ignored target
                    probs.div_(total).scatter_add_(1, t[:, None], -kc[:, None].to(probs.dtype))
                    grad = probs.mul_(kc[:, None] if slope is None else slope.mul_(kc[:, None]))
                    grad = grad.to(dtype)
                    grad_h[rows] = grad @ w
                    grad_w += grad.t() @ hc
                del logits, probs, slope, grad  # freed before the next chunk's: one chunk at a time
        if mean:  # F.cross_entropy's mean: over the carried targets (0 of them: nan, as it gives)
            loss, grad_h, grad_w = loss / count, grad_h / count, grad_w / count
        ctx.save_for_backward(grad_h, grad_w)
        # bf16 under FSDP2's mixed precision: its gradient's dtype too
        ctx.weight_dtype = weight.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_h, grad_w = ctx.saved_tensors
        # the loss's gradient is a scalar (train.py's scale): the saved gradients times it
        grad_weight = (grad_w * grad_loss).to(ctx.weight_dtype)
        return grad_h * grad_loss.to(grad_h.dtype), grad_weight, None, None, None, None


def chunked_cross_entropy(h, weight, targets, reduction, config=None):
    grads = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    flat, cap = (h.flatten(0, 1), weight, targets.flatten()), config and config.logit_softcap
    return ChunkedCrossEntropy.apply(*flat, reduction == 'mean', grads, cap or 0.0)


LOSSES = {'full': full_cross_entropy, 'chunked': chunked_cross_entropy}
