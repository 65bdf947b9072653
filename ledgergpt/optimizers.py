"""
optimizers.py: the optimizer train.py steps, from the row of config.OPTIMIZERS its key `optimizer`
names. One optimizer object in every case, whose param groups carry their kind ('adamw' or 'muon'),
so that train.py's loop (the LR set on every group), clipping, checkpoint.py (DCP's state dicts,
ZeRO-1's gathered optimizer.pt) and ZeroRedundancyOptimizer(optimizer_class=...) see one optimizer
whatever it holds. The groups come from the raw model's parameter names (config.param_groups, which
the ledger reads too): no wrapper's prefix decides.

    adamw: torch.optim.AdamW, decay on matrices only (the book's recipe).
    muon:  MuonAdamW, torch.optim.Muon's update on the blocks' matrices and AdamW on the rest, its
           Newton-Schulz in the run's compute dtype; under ZeRO-2 and FSDP2 each matrix once, on its
           owner rank (BOOK.md, Derivations: Muon's model states and step).
"""

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.optim import _muon

from ledgergpt import config


def adamw_options(train, world_size):
    """The book's betas 0.9/0.95 and eps 1e-8; the fused kernel (5x the per-tensor loop on a 2-core
    CPU, measured), but foreach under ZeRO-1, whose load_state_dict moves the step counts to the
    CPU, where the fused CUDA kernel fails on mixed devices (pytorch #124133)."""
    zero1 = train.parallel == 'zero1' and world_size > 1
    betas = (train.beta1, train.beta2)
    return dict(lr=train.lr, betas=betas, eps=train.eps, fused=not zero1, foreach=zero1)


def muon_options(train, world_size, dtype):
    """AdamW's options and torch.optim.Muon's settings from the muon_ keys. muon_lr 0: AdamW's lr
    with the match_rms_adamw scaling (lr_ratio 1); else Muon's own peak, the ratio to lr applied at
    each step, so that one schedule drives both. dtype: the run's compute dtype ('bfloat16' or
    'float32'), which Newton-Schulz runs in."""
    own = train.muon_lr > 0
    options = adamw_options(train, world_size) | dict(ns_dtype=getattr(torch, dtype))
    options.update(momentum=train.muon_momentum, nesterov=train.muon_nesterov, muon_eps=_muon.EPS)
    coefficients = (_muon.DEFAULT_A, _muon.DEFAULT_B, _muon.DEFAULT_C)
    options.update(ns_steps=train.muon_ns_steps, ns_coefficients=coefficients)
    lr_ratio = train.muon_lr / train.lr if own else 1.0
    return options | dict(adjust_lr_fn='original' if own else 'match_rms_adamw', lr_ratio=lr_ratio)


def build(raw_model, train, world_size, dtype):
    """The run's optimizer over raw_model's trainable parameters, grouped by config.param_groups,
    for a run that computes in dtype. ZeRO-1 shards its states over the ranks, whole tensors each
    (sums.zero1_partition follows its assignment)."""
    named = dict(raw_model.named_parameters())
    shapes = [(name, tuple(p.shape)) for name, p in named.items() if p.requires_grad]
    groups = []
    for kind, decayed, names in config.param_groups(train.optimizer, shapes):
        decay = train.weight_decay if decayed else 0.0
        groups.append(dict(params=[named[name] for name in names], kind=kind, weight_decay=decay))
    cls, options = BUILDERS[train.optimizer](train, world_size, dtype)
    if train.parallel == 'zero1' and world_size > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer  # its import warns 67 times

        return ZeroRedundancyOptimizer(groups, optimizer_class=cls, **options)
    return cls(groups, **options)


def newton_schulz(update, group, dtype):
    """torch.optim.Muon's quintic Newton-Schulz iteration on one matrix (its coefficients, steps and
    eps, its orientation: the short side first), in dtype: in bf16 it is torch's own to the bit
    (test_optimizers.py); fp32 serves a run that computes fp32, where bf16 matmuls may be emulated
    (3.3x the step on a 2-core AVX2 EPYC)."""
    a, b, c = group['ns_coefficients']
    x = update.to(dtype)
    tall = x.size(0) > x.size(1)
    x = x.T if tall else x
    x = x / x.norm().clamp(min=group['muon_eps'])  # spectral norm at most 1
    for _ in range(group['ns_steps']):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def to_local(tensor):
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def orthogonalise_sharded(params, updates, group, dtype):
    """Newton-Schulz on FSDP2's Shard(0) matrices, each once: -> this rank's rows of each result.
    In blocks of one shape (config.muon_blocks), an all-to-all in dtype sends each matrix's rows to
    its owner (ceil(rows / N) a rank, zero-padded as FSDP2 pads), which orthogonalises it, and a
    second sends each rank its rows back (sums.collectives counts both)."""
    mesh = params[0].device_mesh
    pg, ranks, rank = mesh.get_group(), mesh.size(), mesh.get_local_rank()
    results = [None] * len(params)
    for (rows, *cols), block in config.muon_blocks([p.shape for p in params], ranks):
        chunk = -(-rows // ranks)
        # send[owner]: my rows of the matrix that rank owns; got[r]: rank r's rows of mine
        send = updates[block[0][0]].new_zeros((ranks, chunk, *cols), dtype=dtype)
        for i, owner in block:
            send[owner, : len(updates[i])] = updates[i]
        got = torch.empty_like(send)
        dist.all_to_all_single(got, send, group=pg)
        if rank in (owner for _, owner in block):
            whole = got.view(ranks * chunk, *cols)
            whole[:rows] = newton_schulz(whole[:rows], group, dtype)
        dist.all_to_all_single(send, got, group=pg)  # each rank's rows back
        for i, owner in block:
            results[i] = send[owner, : len(updates[i])]
    return results


def _adamw_groups(groups):
    return [group for group in groups if group.get('kind') != 'muon']


class MuonAdamW(torch.optim.AdamW):
    """AdamW whose 'muon' groups take torch.optim.Muon's update instead: per matrix, the momentum
    buffer lerps towards the gradient, the Nesterov update is orthogonalised by Newton-Schulz, the
    weight decays by lr x wd and moves by lr scaled to the matrix's shape (adjust_lr_fn). One
    momentum buffer a matrix, no step count: what config.OPTIMIZERS['muon'] bills.
    test_optimizers.py holds it to torch.optim.Muon plus AdamW, to the bit, in bf16."""

    def __init__(self, params, *, ns_dtype, momentum, nesterov, ns_steps, ns_coefficients, muon_eps,
                 adjust_lr_fn, lr_ratio, **adamw):  # fmt: skip
        super().__init__(params, **adamw)
        # the run's, not the checkpoint's: not in the param groups a resume loads
        self.ns_dtype = ns_dtype
        muon = dict(momentum=momentum, nesterov=nesterov, ns_steps=ns_steps, muon_eps=muon_eps)
        muon.update(ns_coefficients=ns_coefficients, adjust_lr_fn=adjust_lr_fn, lr_ratio=lr_ratio)
        self.defaults.update(muon)
        for group in self.param_groups:
            for key, value in muon.items():
                group.setdefault(key, value)

    @torch.no_grad()
    def step(self, closure=None):
        groups = self.param_groups
        for group in groups:
            if group['kind'] == 'muon':
                self._muon_step(group)
        self.param_groups = _adamw_groups(groups)
        try:  # AdamW's own step (fused or foreach) over its groups alone
            return super().step(closure)
        finally:
            self.param_groups = groups

    def __setstate__(self, state):
        """load_state_dict's: AdamW's fix-ups (its step counts as tensors) over its groups alone."""
        super().__setstate__(dict(state, param_groups=_adamw_groups(state['param_groups'])))
        self.param_groups = state['param_groups']

    def _muon_step(self, group):
        lr, momentum = group['lr'] * group['lr_ratio'], group['momentum']
        params = [param for param in group['params'] if param.grad is not None]
        updates = []
        for param in params:
            state = self.state[param]
            if 'momentum_buffer' not in state:
                state['momentum_buffer'] = torch.zeros_like(param.grad)
            buf, grad = to_local(state['momentum_buffer']), to_local(param.grad)
            buf.lerp_(grad, 1 - momentum)
            updates.append(grad.lerp(buf, momentum) if group['nesterov'] else buf)
        if params and isinstance(params[0], DTensor):  # FSDP2, ZeRO-2: each matrix on its owner
            updates = orthogonalise_sharded(params, updates, group, self.ns_dtype)
        else:
            updates = [newton_schulz(update, group, self.ns_dtype) for update in updates]
        for param, update in zip(params, updates):
            weight = to_local(param)
            weight.mul_(1 - lr * group['weight_decay'])
            weight.add_(update, alpha=-_muon._adjust_lr(lr, group['adjust_lr_fn'], param.shape))


# One builder a row of config.OPTIMIZERS, by its name: (train, world_size, dtype) -> (the
# optimizer's class, its options). A fork's optimizer adds its row, its builder here and a test.
BUILDERS = {
    'adamw': lambda train, world_size, dtype: (torch.optim.AdamW, adamw_options(train, world_size)),
    'muon': lambda train, world_size, dtype: (MuonAdamW, muon_options(train, world_size, dtype)),
}
