"""
moe.py: the mixture of experts, the FFN that model.py's Block takes in place of the dense one in the
blocks after the first n_dense_layers (n_experts > 0), and the router-bias update train.py calls
after each optimizer step.

DeepSeekMoE's shape (n_experts small MLPs of the config's mlp row, top_k per token, n_shared_experts
every token visits, fused into one) routed as DeepSeek-V3 does (arXiv:2412.19437, sec. 2.1.2; its
inference/model.py Gate): affinities s = sigmoid(u . e_i), the top_k of s + b pick, the bias b never
weighs; gates = the chosen s summing to 1, x route_scale. Dropless (a loop over experts; the slice
sizes read back once per layer, as DeepSeek's code does), so a token costs exactly top_k experts'
matmuls. b moves outside the gradient (update_router_bias); optionally the sequence-wise balance
loss alpha * sum_i f_i P_i (eq. 17-20) joins the loss (GPT.forward adds it). ledger.py's Ledger MoE
counts its parameters, FLOPs and saved tensors; tests/test_moe.py holds the two together.
"""

import torch
import torch.distributed as dist
import torch.nn as nn


class MoE(nn.Module):
    # expert: the config's MLP row's class (model.MLPS), built as expert(config, width)
    def __init__(self, config, expert):
        super().__init__()
        self.n_experts, self.top_k = config.n_experts, config.top_k
        self.route_scale = config.route_scale
        # the experts' centroids e_i
        self.router = nn.Linear(config.n_embd, config.n_experts, bias=False)
        hidden = config.expert_hidden
        self.experts = nn.ModuleList(expert(config, hidden) for _ in range(self.n_experts))
        shared = config.n_shared_experts * hidden
        self.shared = expert(config, shared) if shared else None
        # b: in checkpoints, not trained
        self.register_buffer('router_bias', torch.zeros(config.n_experts))
        # tokens per expert, this step
        self.register_buffer('load', torch.zeros(config.n_experts), persistent=False)
        # alpha (train.py sets it) and this forward's balance loss
        self.aux_loss_coef, self.aux_loss = 0.0, None

    # GPT.init_weights: the bias and the load start at 0 (the Linears it inits itself)
    def reset_parameters(self):
        self.router_bias.zero_()
        self.load.zero_()

    # eager under torch.compile, the layer whole: its slice sizes are read to the host and change
    # every step, so a compiled expert loop would recompile on them (or break its graph each layer)
    @torch.compiler.disable
    def forward(self, x):
        B, T, H = x.shape
        x = x.reshape(B * T, H)
        scores = self.router(x).float().sigmoid()  # (tokens, n_experts) affinities, fp32
        # the bias only picks
        chosen = torch.topk(scores + self.router_bias, self.top_k, dim=-1).indices
        gates = scores.gather(1, chosen)
        gates = gates / gates.sum(-1, keepdim=True) * self.route_scale  # (tokens, top_k)
        counts = torch.bincount(chosen.flatten(), minlength=self.n_experts)
        # a training forward counts towards the bias update and has a balance loss (else None)
        self.aux_loss = None
        if self.training and torch.is_grad_enabled():
            self.load += counts
            # f_i: the share of the sequence's picks on expert i, x n_experts / top_k
            if self.aux_loss_coef:
                picked = torch.zeros_like(scores).scatter_(1, chosen, 1.0).view(B, T, -1)
                share = picked.mean(1) * (self.n_experts / self.top_k)
                affinity = (scores / scores.sum(-1, keepdim=True)).view(B, T, -1).mean(1)  # P_i
                self.aux_loss = self.aux_loss_coef * (share * affinity).sum(-1).mean()
        # Dispatch: the (token, choice) pairs sorted by expert, each token copied once per chosen
        # expert; the outputs go back to (token, choice) order, and each token sums its top_k
        # outputs weighed by its gates.
        order = chosen.flatten().argsort(stable=True)
        chunks = x[order // self.top_k].split(counts.tolist())  # the one host read: the slice sizes
        # an empty slice costs 0
        y = torch.cat([expert(chunk) for expert, chunk in zip(self.experts, chunks)])
        y = y[order.argsort()].view(B * T, self.top_k, H)
        out = (y * gates.unsqueeze(-1)).sum(1).to(x.dtype)
        if self.shared is not None:
            out = out + self.shared(x)
        return out.view(B, T, H)


@torch.no_grad()
def update_router_bias(model, speed):
    """After each optimizer step (DeepSeek-V3's auxiliary-loss-free balance): each router bias of
    the GPT `model` moves by speed (gamma) against the sign of its expert's load error, over the
    ranks' summed loads (equal biases on every rank). The step's load stays in model.expert_load for
    the metrics (live_ledger.router_stats). No host read."""
    if model.moe:
        # (MoE layers, n_experts)
        model.expert_load = torch.stack([layer.load for layer in model.moe])
        if dist.is_initialized():
            dist.all_reduce(model.expert_load)
        error = (model.expert_load.mean(-1, keepdim=True) - model.expert_load).sign()
        biases = [layer.router_bias for layer in model.moe]
        torch._foreach_add_(biases, error.unbind(0), alpha=speed)
        torch._foreach_zero_([layer.load for layer in model.moe])
