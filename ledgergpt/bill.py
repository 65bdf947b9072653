"""
ledger_report.py: the ledger as text. ledger.py does the sums, as numbers (predict -> one JSON-able dict); this file
prints them: the whole bill (format_report: the sections of BOOK.md, each row a value and where it comes from), the
few lines train.py shows before step 1 (format_short), report.md's predicted-against-measured table
(format_comparison), the book's worked examples recomputed (book_examples, format_book), and the command line,
which `python ledger.py` runs (main). Standard library only, like ledger.py; it imports ledger, never the reverse.
"""

from ledgergpt import pretrained
from ledgergpt.config import GIB, OPTIMIZERS, PART_KEYS, SECONDS_PER_DAY, ModelConfig, sharded

# -----------------------------------------------------------------------------------------------------
# The printed ledger: sections of rows (label, value, where it comes from), each value formatted from the
# prediction's numbers, in the book's order. format_report prints them all; format_short picks the few that
# train.py prints before step 1 (the whole ledger goes to out_dir/ledger.md). si and duration are public: the
# other commands name tokens and times the same way.


def si(x):
    """1336502272 -> '1.34B'; 26e9 -> '26.0B'."""
    for scale, suffix in ((1e12, 'T'), (1e9, 'B'), (1e6, 'M'), (1e3, 'K')):
        if abs(x) >= scale:
            return f'{x / scale:.3g}{suffix}'
    return f'{x:.3g}'


def _sci(x):
    return f'{x:.3g}' if abs(x) < 1e5 else f'{x:.3e}'.replace('e+', 'e')


def _days(days):
    return f'{days:,.0f}' if days >= 100 else f'{days:.3g}'


def _gib(n_bytes):
    return f'{n_bytes / GIB:,.2f} GiB'


def _gb(n_bytes):
    return f'{n_bytes / 1e12:,.2f} TB' if n_bytes >= 1e12 else f'{n_bytes / 1e9:,.1f} GB'


def _rate(flops_per_s):
    return (
        f'{flops_per_s / 1e12:,.0f} TFLOP/s'
        if flops_per_s >= 1e12
        else f'{flops_per_s / 1e9:,.0f} GFLOP/s'
    )


def duration(days):
    seconds = days * SECONDS_PER_DAY
    for unit, length in (('days', SECONDS_PER_DAY), ('h', 3600), ('min', 60)):
        if seconds >= length:
            return f'{seconds / length:.3g} {unit}'
    return f'{seconds:.3g} s'


def report_header(p):
    m, t = p['model'], p['train']
    model = ModelConfig(**m)
    attention = 'MHA' if model.kv_heads == model.n_head else f'GQA, {model.kv_heads} kv heads'
    return [
        f"ledger: {m['arch']}, {model.n_layer} layers, H={model.n_embd}, {model.n_head} heads ({attention}), "
        f"H'={model.ffn_width}, V={model.vocab_size}, T={model.block_size}, "
        f"{'tied' if model.tie_embeddings else 'untied'}{', biases' if model.biases else ''}",
        'parts: '
        + ', '.join(model.part(kind).label for kind in PART_KEYS if model.part_name(kind) != 'none')
        + f", {OPTIMIZERS[t.get('optimizer', 'adamw')].label.split()[0]} (config.PARTS)",
        f"plan: {si(p['tokens'])} tokens on {p['n_gpu']} x {p['gpu']['name']}, batch {t['batch_tokens']:,} tokens "
        f"= {t['micro_batch']} x {model.block_size} x {p['n_gpu']} device(s) x {p['grad_accum']:.4g} accumulation, "
        f"{p['steps']:,} steps",
    ] + ([pretrained.describe(t['init_from'])] if t.get('init_from') else [])


def parameter_rows(model, params):
    """Ledger 1's rows, each part named and its formula given by its row of config.PARTS."""
    bias, tied, k = model.biases, model.tie_embeddings, model.ffn_matrices  # k: H x H' matrices
    norm, mlp, qk_norm = model.part('norm'), model.part('mlp'), model.part('qk_norm')
    norm_bias = len(norm.shapes(model)) == 2  # LayerNorm with the model's biases
    # else GQA: k and v are kv_width = n_kv_head x head_dim wide
    mha = model.kv_heads == model.n_head
    qk = '' if qk_norm.formula == 'none' else f" + {qk_norm.formula} ({qk_norm.label})"
    per_layer = (f"4H^2 + {k}HH' + 2H" if mha else f"2H^2 + 2H*kv_width + {k}HH' + 2H") + qk
    if bias:
        per_layer += f" (+ {(5 if mha else 3) + 2 * norm_bias}H{'' if mha else ' + 2kv_width'}"
        per_layer += f" + {'' if k == 2 else k - 1}H' biases)"
    if not mha:
        per_layer += f", kv_width = {model.kv_heads} kv heads x {model.head_dim}"
    position = model.part('positions')
    rows = [
        ('token embedding', f"{params['embedding']:,}", 'V*H'),
        ('position embedding', f"{params['position']:,}", f'{position.formula} ({position.label})')
        if params['position']
        else None,
        (
            'attention' + (f' ({qk_norm.label})' if qk else ''),
            f"{params['attention']:,}",
            'L*(2H^2 + 2H*kv_width'
            + (' + biases' if bias else '')
            + (f' + {qk_norm.formula}' if qk else '')
            + '): q, o and GQA-sized k, v',
        ),
        (
            f"ffn ({mlp.label})",
            f"{params['ffn']:,}",
            'the dense layers and every expert: Ledger MoE'
            if model.n_experts
            else f"L*({mlp.formula} + biases)"
            if bias
            else f"L*{mlp.formula}",
        ),
        (
            f"norms ({norm.label})",
            f"{params['norms']:,}",
            '(2L + 1)*H' + (' * 2 (weight, bias)' if norm_bias else ''),
        ),
        (
            'output projection',
            f"{params['output']:,}",
            'tied: shares the embedding' if tied else 'V*H',
        ),
        ('per layer', f"{params['per_layer']:,}", per_layer),
        ('total P', f"{params['total']:,}", si(params['total'])),
        (
            'in matmuls N_matmul',
            f"{params['matmul']:,}",
            f"{params['matmul'] / params['total']:.1%} of P: Linear weights incl. the output projection"
            + (', those a token uses (MoE)' if model.n_experts else ''),
        ),
    ]
    return [row for row in rows if row]


def compute_rows(p):
    """Ledger 2's rows: the FLOPs a token by each convention."""
    t, flops, model = p['train'], p['flops_per_token'], ModelConfig(**p['model'])
    recompute, tied, k = t['recompute'], model.tie_embeddings, flops['keys_symbol']
    book_p = '8P' if recompute else '6P'
    nanogpt_extra = flops['nanogpt'] / flops['matmul'] - 1
    rerun = '2N_blocks' if p['compiled_blocks'] else "2(N_blocks-LHH')"
    compute = [
        (
            f"book: {book_p}" + (' (recompute)' if recompute else ''),
            _sci(flops['book']),
            "the book's ledger 2: forward 2P + backward 4P"
            + (' + one recomputed forward 2P' if recompute else ''),
        ),
        (
            f'matmul: 6N_matmul + 12LH{k}',
            _sci(flops['matmul']),
            'PaLM (Chowdhery et al. 2022, app. B), non-causal attention, no embedding lookup; MFU uses this',
        ),
        (
            f"nanoGPT's estimate_mfu: 6N + 12LH{k}",
            _sci(flops['nanogpt']),
            f"N = all but the position table: norms, biases{'' if tied else ', input embedding'} as matmuls: "
            f"{nanogpt_extra:+.3%}",
        ),
        (
            f'matmul, causal: 6N_matmul + 6LH{k}',
            _sci(flops['matmul_causal']),
            'only the unmasked half of attention',
        ),
        (
            f"executed: +{rerun}+4LH{k}",
            _sci(flops['hardware']),
            'matmul + the blocks rerun in backward: '
            + (
                'whole (each block compiled on its own)'
                if p['compiled_blocks']
                else "all but down_proj (H'H), never lm_head"
            ),
        )
        if recompute
        else None,
        (
            'attention share of block matmuls',
            f"{flops['attention_share']:.1%}",
            f"12LH{k} / 6N_blocks; the book's {k}/(6H) = {flops['attention_share_approx']:.1%}",
        ),
        (
            'optimizer step (Newton-Schulz)',
            _sci(p['optimizer_flops_per_step']),
            f"FLOPs a step on the busiest device: {t['muon_ns_steps']} steps x (4m^2 n + 2m^3) per m x n block "
            f"matrix (Muon), {_sci(p['optimizer_flops_per_step'] / t['batch_tokens'])} a token",
        )
        if p.get('optimizer_flops_per_step')
        else None,
        (
            f"executed for {si(p['tokens'])} tokens",
            _sci(p['total_flops']),
            f"book {book_p}D: {_sci(p['book_flops'])}"
            + (", with every device's optimizer steps" if p.get('optimizer_flops') else ''),
        ),
    ]
    return [row for row in compute if row]


def time_rows(p):
    """Ledger 3's rows: the device, the speed, the days and the cost."""
    t, device = p['train'], p['gpu']
    recompute = t['recompute']
    book_p = '8P' if recompute else '6P'
    time_and_money = [
        (
            'device',
            f"{p['n_gpu']} x {device['name'].split(' (')[0].split()[0]}",
            f"{device['name']}: peak {_rate(device['peak_flops'])} each ({device['peak_source']})",
        ),
        (
            'assumed utilisation',
            f"{p['mfu_assumed']:.0%}",
            'of peak (the planning note: 40% for a tuned Llama with '
            'flash attention and torch.compile; real runs 30-70%)',
        ),
        (
            'throughput',
            f"{p['tokens_per_s']:,.0f} tok/s",
            f"n_gpu * peak * MFU / executed FLOPs per token; {p['step_seconds']:.3g} s per step",
        ),
        (
            'time for this run',
            duration(p['days']),
            'executed FLOPs: the matmul count (with attention)'
            + (' + the recomputed forward' if recompute else '')
            + (
                f" + the optimizer's, {p['optimizer_step_seconds']:.3g} s a step"
                if p.get('optimizer_step_seconds')
                else ''
            ),
        ),
        ('days', _days(p['days']), 'time / 86400 s'),
        (
            f"days, book {book_p}D",
            _days(p['days_book']),
            "FLOPs by the book's convention (the planning note's table)",
        ),
        ('GPU-hours', f"{p['gpu_hours']:,.0f}", 'days x 24 x n_gpu'),
        (
            'cost',
            f"${p['cost_usd']:,.0f}",
            f"at ${t['usd_per_gpu_hour']}/GPU-hour (book {book_p}D: "
            f"${p['cost_usd'] * p['days_book'] / p['days']:,.0f}; the planning note: $3-4 per H200-hour)",
        ),
        (
            'predicted MFU (PaLM)',
            f"{p['mfu']:.1%}",
            'assumed x matmul / executed: recomputation is work MFU does not count',
        )
        if recompute
        else None,
    ]
    return [row for row in time_and_money if row]


def state_rows(p):
    """Ledger 4's model states: weights, gradients, the optimizer's states, FSDP2's gathered weights."""
    t, memory = p['train'], p['memory']
    fsdp2 = sharded(t['parallel'], p['n_gpu'])  # FSDP2 shards every tensor's rows
    per, bf16 = '/N' if fsdp2 else '', p['dtype'] == 'bfloat16'
    optimizer = OPTIMIZERS[t.get('optimizer', 'adamw')]
    # the row for the tensors it does not take
    rest = OPTIMIZERS[optimizer.rest] if optimizer.rest else None
    states = [
        (
            'fp32 weights',
            _gib(memory['weights']),
            f"4P{per}"
            + (
                ', chunks padded to equal rows (FSDP2)'
                if fsdp2
                else f": master weights, updated by {optimizer.label.split()[0]}"
            ),
        ),
        (
            'fp32 gradients',
            _gib(memory['grads']),
            '4P'
            + (
                '/N, reduce-scattered (FSDP2)'
                if fsdp2
                else ": DDP's buckets, the .grad tensors are views of them"
                if p['n_gpu'] > 1
                else ''
            ),
        ),
        (
            optimizer.label + (f' + {rest.label}' if rest else ''),
            _gib(memory['optimizer']),
            (f'({optimizer.formula} + {rest.formula}_rest)' if rest else optimizer.formula)
            + (
                "/N, each rank's rows"
                if fsdp2
                else '/N, whole tensors per rank (ZeRO-1)'
                if p['n_gpu'] > 1 and t['parallel'] == 'zero1'
                else ''
            )
            + (
                f' + a {(rest or optimizer).tensor_bytes}-byte step count per '
                + (f'{rest.label.split()[0]} ' if rest else '')
                + 'tensor'
                if (rest or optimizer).tensor_bytes
                else ''
            ),
        ),
        (
            f"gathered {'bf16' if bf16 else 'fp32'} weights",
            _gib(memory['gathered']),
            'all blocks, forward to backward (zero2)'
            if t['parallel'] == 'zero2'
            else 'embeddings, lm_head and 2 blocks at a time (fsdp), + one block of gradients',
        )
        if fsdp2
        else None,
        (
            'model states',
            _gib(memory['model_states']),
            f"the book's accounting, {memory['book_formula']} with "
            f"16-bit weights and grads: {_gib(memory['book_model_states'])}",
        ),
    ]
    return [row for row in states if row]


def memory_rows(p):
    """Ledger 4's rows: what each process holds, as train.py holds it."""
    t, memory, device, model = p['train'], p['memory'], p['gpu'], ModelConfig(**p['model'])
    recompute, bf16 = t['recompute'], p['dtype'] == 'bfloat16'
    compiled = memory['graph'] != 'eager'
    loss = model.part('loss')  # its label and the formula of its buffers (config.PARTS['loss'])
    processes = device['shared_by'] or (p['n_gpu'] if device['kind'] == 'cpu' else 1)
    states = state_rows(p) + [
        (
            'activations',
            _gib(memory['activations']),
            (
                'counted eager: the MoE routing breaks the compiled graph'
                if compiled and model.n_experts
                else 'what the compiled graph saves (min-cut partitioner)'
                if compiled
                else 'what autograd saves for backward, eager mode'
            )
            + (', block inputs and one block rerun (recompute)' if recompute else '')
            + (f"; eager: {_gib(memory['activations_eager'])}" if compiled else ''),
        ),
        (
            f"logits and {loss.label}",
            _gib(memory['logits']),
            (
                loss.buffers_formula(True, 2 if bf16 else 4)
                + f"; eager: {_gib(memory['logits_eager'])}"
                if compiled and memory['graph'] == 'compiled whole'
                else loss.buffers_formula(False, 2 if bf16 else 4)
                + (' (the loss runs eager around the compiled blocks)' if compiled else '')
            )
            + (
                f"; logits soft-capped at {model.logit_softcap:g}: + one chunk x V x 4, the cap's slope"
                if model.logit_softcap
                else ''
            ),
        ),
        ('runtime overhead', _gib(memory['overhead']), device['overhead_source']),
        (
            'torch.compile on the CPU',
            _gib(memory['compile_host']),
            "ESTIMATE: inductor's modules, graphs and generated kernels, resident (measured, ledger.py)",
        )
        if memory['compile_host']
        else None,
        (
            'total',
            _gib(memory['total']),
            f"of {_gib(memory['gpu_memory'])} ({device['memory_source']}"
            + (f', shared by {processes} processes' if processes > 1 else '')
            + f"): {'fits' if memory['fits'] else 'DOES NOT FIT'}, headroom {_gib(memory['headroom'])}"
            + f" (a fit keeps {memory['headroom_needed'] / memory['gpu_memory']:.0%}, "
            f"{_gib(memory['headroom_needed'])}: the ledger's error band)"
            + (
                "; glibc's malloc keeps freed blocks for reuse, so the peak RSS runs up to ~1.35x this (measured, "
                "docs/ledger.md)"
                if device['kind'] == 'cpu'
                else ''
            ),
        ),
        (
            'largest micro-batch that fits',
            f"{p['max_micro_batch']}",
            f"sequences of {model.block_size} tokens per "
            'device'
            + (
                ''
                if memory['fits']
                else f": try --micro_batch={p['max_micro_batch']}"
                if p['max_micro_batch']
                else ': not even one; try --recompute=1, or --parallel=fsdp over more GPUs'
            ),
        ),
    ]
    return [row for row in states if row]


def data_rows(p):
    """The planning note's rows: tokens against Chinchilla, the dataset, the bytes it takes."""
    t, data = p['train'], p['data']
    stored = 'dataset' if data['dataset_tokens'] else 'training tokens'
    tokens = [
        (
            'Chinchilla-optimal tokens',
            si(data['chinchilla_tokens']),
            '20 x P (Hoffmann et al. 2022)',
        ),
        (
            'this plan',
            f"{data['tokens_per_param']:.3g} tok/param",
            f"{data['chinchilla_multiple']:.2g} x Chinchilla; {si(data['train_tokens'])} tokens are optimal for "
            f"{si(data['chinchilla_params_for_tokens'])} params",
        ),
        (
            'tokens that carry loss',
            si(data['loss_tokens']),
            f"{data['loss_fraction']:.0%} of them: objective "
            f"{t['objective']} (sums.loss_fraction); FLOPs, tokens/s and MFU count every position",
        )
        if data['loss_fraction'] < 1
        else None,
        (
            'dataset',
            si(data['dataset_tokens']) + ' tokens',
            f"{'enough' if data['enough_data'] else 'NOT enough'}: {data['epochs']:.3g} epochs",
        )
        if data['dataset_tokens']
        else None,
        (
            'token shards',
            _gb(data['shard_bytes']),
            f"{data['token_bytes']} bytes/token "
            f"({'uint16: vocab <= 65,536' if data['token_bytes'] == 2 else 'uint32: vocab > 65,536'}), the {stored}",
        ),
        (
            'source parquet',
            _gb(data['parquet_bytes_high']),
            f"~3-4 bytes/token compressed (FineWeb-Edu): "
            f"{_gb(data['parquet_bytes_low'])} to {_gb(data['parquet_bytes_high'])}",
        ),
        (
            'checkpoint',
            _gb(data['checkpoint_bytes']),
            (
                '12P: fp32 weights + Adam m, v'
                if t.get('optimizer', 'adamw') == 'adamw'
                else "4P fp32 weights + the optimizer's states (Muon's momentum, AdamW's m, v)"
            )
            + '; bf16 export 2P = '
            + _gb(data['export_bytes']),
        ),
    ]
    return [row for row in tokens if row]


def loss_rows(p):
    """The published loss fits' predictions for this plan (their data, not ours)."""
    data = p['data']
    loss = [
        (
            label,
            f"{data['expected_loss'][fit]:.3f} nats",
            ', '.join(f'{k} {v}' for k, v in data['fits'][fit].items()),
        )
        for fit, label in (
            ('hoffmann2022', 'Hoffmann et al. 2022'),
            ('epoch2024', 'Epoch AI 2024 replication'),
        )
    ]
    return [row for row in loss if row]


def report_sections(p):
    """-> [(title, [(label, value, note), ...]), ...] for a prediction, in the book's order."""
    t, memory, device, model = p['train'], p['memory'], p['gpu'], ModelConfig(**p['model'])
    recompute, bf16 = t['recompute'], p['dtype'] == 'bfloat16'
    mode = f"{t['parallel']}, N={p['n_gpu']}" if p['n_gpu'] > 1 else 'one process'
    sections = [
        (
            "Ledger 1: parameters (exact, the way model.py builds them: = sum(p.numel()))",
            parameter_rows(ModelConfig(**p['model']), p['params']),
        ),
        (
            'Ledger 2: compute per token, forward + backward (a matmul (n x m)(m x p) is 2nmp FLOPs)',
            compute_rows(p),
        ),
        ('Ledger 3: time and money (days = FLOPs / (n_gpu * peak * MFU) / 86400)', time_rows(p)),
        (
            f"Ledger 4: memory per {'process' if device['kind'] == 'cpu' else 'GPU'} ({mode}, as train.py holds it; "
            f"micro-batch {t['micro_batch']} x {model.block_size}, {'bf16' if bf16 else 'fp32'} compute, "
            f"{memory['graph']}, "
            f"{'full recomputation' if recompute else 'no recomputation'}, flash attention)",
            memory_rows(p),
        ),
        moe_section(p),  # None for a dense model
        communication_section(p) if p['n_gpu'] > 1 else None,
        ('Data and tokens (the planning note)', data_rows(p)),
        (
            'The mixture: each source as GPT-3 tabled its datasets (Brown et al. 2020, Table 2.2); weights kept '
            'to 1/1000',
            mixture_rows(p.get('mixture')),  # no rows, no section: one folder
        ),
        (
            'Expected loss L = E + A/N^alpha + B/D^beta: THEIR fits on their data (MassiveText) and tokenizer, '
            'not ours',
            loss_rows(p),
        ),
    ]
    return [
        (title, [row for row in rows if row]) for title, rows in filter(None, sections) if title
    ]


# -----------------------------------------------------------------------------------------------------
# Ledger MoE (ledger.py's section of that name): what scales with the active parameters and what with the total.


def moe_section(p):
    """(title, rows) for a mixture of experts; (None, []) for a dense model."""
    model = ModelConfig(**p['model'])
    if not model.n_experts:
        return None, []
    params, flops, memory = p['params'], p['flops_per_token'], p['memory']
    n, k, s, E = model.n_experts, model.top_k, model.n_shared_experts, model.expert_hidden
    attention = flops['attention']
    # were every expert used by every token
    all_active = (6 * params['matmul_total'] + attention) / flops['matmul']
    book, held = memory['book_active_model_states'], memory['model_states']
    rows = [
        (
            'layers with experts',
            f"{model.moe_layers} of {model.n_layer}",
            f"{n} routed experts of {E}, {k} per token, {s} shared; the first {model.n_dense_layers} dense; "
            f"sigmoid router, gates x {model.route_scale:g} (DeepSeek-V3)",
        ),
        (
            'MoE layer FFN',
            f"{params['moe_layer']:,}",
            f"router {n}H + ({n} + {s}) x 3HE: every expert",
        ),
        (
            '  used by a token',
            f"{params['moe_layer_active']:,}",
            f"router {n}H + ({k} + {s}) x 3HE",
        ),
        ('total P', f"{params['total']:,}", f"{si(params['total'])}: what model.py builds"),
        (
            'active P per token',
            f"{params['active']:,}",
            f"{si(params['active'])}, {params['active'] / params['total']:.1%} of P: all but the {n - k} routed "
            f"experts a token skips",
        ),
        (
            'FLOPs per token',
            _sci(flops['matmul']),
            f"6 x active N_matmul + 12LH{flops['keys_symbol']} (router included); every expert on every "
            f"token: {all_active:.2f}x",
        ),
        (
            'routing buffers',
            _gib(memory['routing_buffers']),
            f"of the activations (counted eager: the routing breaks a compiled graph): each token copied to its "
            f"{k} experts, and their {k} outputs",
        ),
        (
            'model states, held',
            _gib(held),
            f"from the TOTAL P ({memory['book_formula']} of it, as held): every expert's weight, gradient "
            f"and AdamW moments exist whether a token visits it or not",
        ),
        (
            "  book: 16 x active",
            _gib(book),
            f"the book's '16 x active parameters' ({memory['book_formula']}): {held / book:.2f}x too low; "
            f"compute, days and cost do scale with the active parameters",
        ),
    ]
    return (
        'Ledger MoE: a mixture of experts (total parameters for memory, active ones for compute)',
        rows,
    )


def mixture_rows(mix):
    """One row per source of a mixture (sums.mixture_ledger): weight, tokens drawn, epochs, shards; none without."""
    rows = []
    for source in (mix or {}).get('sources', ()):
        if source['epochs'] is None:
            epochs = f"{source['folder']} not prepared yet: epochs unknown"
        else:
            epochs = f"{source['epochs']:.3g} epochs of its {si(source['dataset_tokens'])}" + (
                f"; REPEATS past {mix['repeat_epochs']} epochs, where repeated tokens are worth much less than new "
                f"ones (Muennighoff et al. 2023): add data or lower its weight"
                if source['repeats_too_often']
                else ''
            )
        rows.append(
            (
                f"{source['name']} ({source['weight']:.1%})",
                si(source['tokens']) + ' tokens',
                f"{epochs}; shards {_gb(source['shard_bytes'])}",
            )
        )
    return rows


# -----------------------------------------------------------------------------------------------------
# Ledger 5, printed: the collectives of a step (DDP's buckets and ZeRO-1's broadcasts as one row each), their bytes
# and bus bytes, the seconds and what hides (ESTIMATES, labelled), the bound and the verdict.


def _bytes(n_bytes):
    return (
        _gb(n_bytes)
        if n_bytes >= 1e8
        else f'{n_bytes / 1e6:,.3g} MB'
        if n_bytes >= 1e5
        else f'{n_bytes:,.0f} B'
    )


def _ms(seconds):
    return f'{seconds * 1e3:,.3g} ms' if seconds < 1 else f'{seconds:,.3g} s'


def comm_time_rows(p):
    """Ledger 5's seconds (an ESTIMATE from the link table), what hides, the bound; or why there are none."""
    comm, t, n, topo = p['comm'], p['train'], p['n_gpu'], p['comm']['topology']
    rows = []
    timed = comm['seconds'] is not None
    if not timed:
        rows.append(
            (
                'time',
                'not estimated',
                'gloo on a CPU: seconds are not meaningful'
                if p['gpu']['kind'] == 'cpu'
                else 'this GPU has no link figures: set intra_node_busbw (and inter_node_busbw), GB/s',
            )
        )
    else:
        share = comm['exposed_fraction']
        rows += [
            (
                'time per step, ESTIMATE',
                _ms(comm['seconds']),
                f"bus bytes / {topo['busbw'] / 1e9:,.0f} GB/s busbw ({topo['link']} sets it); latency left out",
            ),
            (
                'exposed per step, ESTIMATE',
                _ms(comm['exposed_seconds']),
                f"{share:.1%} of a step: "
                + (
                    "FSDP2 hides gathers under forward and reduce-scatters under backward, every micro-step, "
                    "all but the root unit's"
                    if sharded(t['parallel'], n)
                    else "DDP hides its buckets under the last micro-step's backward, all but the last"
                    + ('; ZeRO-1 broadcasts after the update' if t['parallel'] == 'zero1' else '')
                )
                + f"; step {p['step_seconds']:.3g} s",
            ),
            (
                'bound, ESTIMATE',
                comm['bound'],
                f"compute while at most {comm['exposed_limit']:.0%} of a step waits on communication, else "
                f"the slowest link",
            ),
            (
                'days with communication',
                _days(p['days']),
                f"compute {_days(p['days_compute'])} + exposed communication (Ledger 3 counts both)",
            ),
        ]
    return rows


def verdict_rows(p):
    """Ledger 5c: where data parallelism stops, the verdict and its reasons, and a pipeline's bubble."""
    comm, t, n, verdict = p['comm'], p['train'], p['n_gpu'], p['parallelism']
    rows = []
    sequences = t['batch_tokens'] // p['model']['block_size']
    rows.append(
        (
            'data parallelism stops at',
            f'{sequences:,} GPUs',
            f"one sequence of the global batch each: there this plan's compute takes "
            f"{_days(p['days_compute'] * n / sequences)} days",
        )
    )
    rows.append(
        ('verdict', 'DP is enough' if verdict['enough'] else 'needs TP/PP', verdict['verdict'])
    )
    rows += [('', '', reason) for reason in verdict['reasons']]
    if not verdict['enough']:
        bubble = verdict['bubble']
        rows.append(
            (
                'pipeline bubble (p-1)/(m+p-1)',
                f'{bubble:.0%}',
                f"for planning: p = 4 stages over m = {comm['accumulation']} micro-batches idle this share "
                "(GPipe, Huang et al. 2019)",
            )
        )
    return rows


def communication_section(p):
    """-> (title, rows) of Ledger 5 for a prediction on more than one device."""
    comm, t, n = p['comm'], p['train'], p['n_gpu']
    topo = comm['topology']
    groups = {}
    for item in comm['collectives']:
        name = item['what'].split(', DDP bucket')[0] + (
            ', DDP buckets' if 'DDP bucket' in item['what'] else ''
        )
        group = groups.setdefault(
            name, dict(item, count=0, bytes=0, bus_bytes=0, seconds=0.0, calls=0)
        )
        for key in ('bytes', 'bus_bytes', 'calls'):
            group[key] += item[key]
        group['seconds'] += item.get('seconds') or 0.0
        group['count'] += 1
    timed = comm['seconds'] is not None
    rows = [
        (
            'topology',
            f"{topo['nodes']} x {topo['gpus_per_node']} GPUs",
            f"{topo['nodes']} node(s); inside a node {topo['fabric'] or 'an unknown fabric'}, busbw "
            + (f"{topo['intra_busbw'] / 1e9:,.0f} GB/s" if topo['intra_busbw'] else '?')
            + f" ({topo['intra_source']})"
            + (
                f"; between nodes {topo['inter_busbw'] / 1e9:,.0f} GB/s per node ({topo['inter_source']})"
                if topo['inter_busbw']
                else ''
            ),
        )
    ]
    for name, g in groups.items():
        sizes = (
            f"{g['count']} buckets (caps 1 MiB, then 25 MiB; the first {g['elements']:,} elements)"
            if g['count'] > 1 and 'DDP' in name
            else f"{g['calls']} tensors"
            if g['op'] == 'broadcast'
            else f"{g['calls']} x {g['elements']:,} elements"
        )
        rows.append(
            (
                name,
                _bytes(g['bytes']),
                f"{g['op']} {g['dtype']}, {sizes}; {g['phase']}; bus {_bytes(g['bus_bytes'])}"
                + (f", {_ms(g['seconds'])}" if timed and g['bytes'] >= 1e6 else ''),
            )
        )
    factors = '2(N-1)/N all-reduce, (N-1)/N all-gather and reduce-scatter, 1 broadcast'
    rows += [
        (
            'per step, per GPU',
            _gb(comm['bytes']),
            f"algorithm bytes (NCCL-tests' S: the buffer, the gathered output, the scattered input); bus bytes "
            f"{_gb(comm['bus_bytes'])} ({factors}, N={n}); {comm['accumulation']} micro-steps",
        )
    ]
    rows += comm_time_rows(p) + verdict_rows(p)
    title = (
        f"Ledger 5: communication per optimizer step ({t['parallel']}, N={n}, as train.py's collectives; "
        'bytes exact, seconds an ESTIMATE)'
    )
    return title, rows


def _row(label, value, note=''):
    return f'  {label:<34} {value:>18}   {note}'.rstrip()


def format_report(prediction):
    """The whole ledger as text: parameters, compute, time and money, memory, data, expected loss."""
    lines = report_header(prediction)
    for title, rows in report_sections(prediction):
        lines += ['', title] + [_row(*row) for row in rows] if rows else []
    return '\n'.join(lines)


def format_short(prediction, full):
    """The few lines train.py prints before step 1: the model, its FLOPs, the device, the predicted speed and time,
    memory against what the device has, and the data against Chinchilla. `full` says where the whole bill is."""
    p, memory, data, device = (
        prediction,
        prediction['memory'],
        prediction['data'],
        prediction['gpu'],
    )
    model = ModelConfig(**p['model'])
    shape = f"{model.arch} {model.n_layer} x {model.n_embd}, V {model.vocab_size:,}, T {model.block_size:,}"
    epochs = (
        f"; {data['epochs']:.3g} epochs of {si(data['dataset_tokens'])} tokens"
        if data['dataset_tokens']
        else ''
    )
    lines = [
        f"ledger (the whole bill: {full}):",
        _row(
            'parameters',
            f"{p['params']['total']:,}",
            f"{shape}; {p['params']['matmul']:,} in matmuls",
        ),
        _row(
            'active per token',
            f"{p['params']['active']:,}",
            'MoE: the FLOPs count these, memory the total',
        )
        if model.n_experts
        else None,
        _row(
            'FLOPs per token',
            _sci(p['flops_per_token']['hardware']),
            f"6N_matmul + 12LH{p['flops_per_token']['keys_symbol']}"
            f"{' + the recomputed forward' if p['train']['recompute'] else ''}; "
            f"{_sci(p['total_flops'])} for {si(p['tokens'])} tokens",
        ),
        _row(
            'device',
            f"{p['n_gpu']} x {_rate(device['peak_flops'])}",
            f"{device['name']}, {p['dtype']} peak ({device['peak_source'].split(' (cache')[0]})",
        ),
        _row(
            'throughput',
            f"{p['tokens_per_s']:,.0f} tok/s",
            f"at {p['mfu_assumed']:.0%} MFU, {p.get('mfu_source', 'assumed')}; "
            f"{p['step_seconds']:.3g} s per step of {p['train']['batch_tokens']:,} tokens",
        ),
        _row(
            'time for this run',
            duration(p['days']),
            f"{p['steps']:,} steps"
            + (
                f"; ${p['cost_usd']:,.0f} at ${p['train']['usd_per_gpu_hour']}/GPU-hour"
                if device['kind'] == 'gpu'
                else ''
            ),
        ),
        _row(
            'memory per process',
            _gib(memory['total']),
            f"of {_gib(memory['gpu_memory'])}: "
            f"{'fits' if memory['fits'] else 'DOES NOT FIT'} (states {_gib(memory['model_states'])}, activations "
            f"{_gib(memory['activations'])}, loss {_gib(memory['logits'])}, runtime {_gib(memory['overhead'])}"
            + (f", compile {_gib(memory['compile_host'])})" if memory['compile_host'] else ')'),
        ),
        _row(
            'tokens per parameter',
            f"{data['tokens_per_param']:.3g}",
            f"{data['chinchilla_multiple']:.2g} x Chinchilla (20){epochs}",
        ),
    ]
    lines = [line for line in lines if line] + [_row(*row) for row in short_extra_rows(p)]
    return '\n'.join(lines)


def short_extra_rows(p):
    """format_short's rows for what only some runs have: a mixture's sources, communication, a partial loss."""
    comm, data = p['comm'], p['data']
    rows = mixture_rows(p.get('mixture'))  # a mixture: each source's tokens and epochs
    if comm['collectives']:  # Ledger 5: more than one process
        seconds = (
            f"ESTIMATE {_ms(comm['seconds'])} at {comm['topology']['busbw'] / 1e9:,.0f} GB/s, "
            f"{comm['exposed_fraction']:.1%} of a step exposed; {p['parallelism']['verdict']}"
            if comm['seconds'] is not None
            else 'gloo on the CPU: seconds not meaningful'
            if p['gpu']['kind'] == 'cpu'
            else 'seconds not estimated (no link figures for this device)'
        )
        where = f"{comm['accumulation']} micro-steps, {p['train']['parallel']}; "
        rows.append(('communication per step', _bytes(comm['bytes']), where + seconds))
    if data['loss_fraction'] < 1:
        rows.append(
            (
                'tokens that carry loss',
                si(data['loss_tokens']),
                f"{data['loss_fraction']:.0%}: objective {p['train']['objective']}; tokens/s and MFU "
                f"count every position",
            )
        )
    return rows


def format_comparison(summary):
    """report.md's table, rendered from a summary (summarize): quantity | predicted | measured | ratio."""
    s = summary
    rows = [  # (what, predicted, measured, format)
        ('parameters', s['params_predicted'], s['params_built'], lambda x: f'{x:,.0f}'),
        (
            'throughput, tokens/s (all devices)',
            s['tokens_per_s_predicted'],
            s['tokens_per_s_measured'],
            lambda x: f'{x:,.0f}',
        ),
        (
            f"MFU (6N_matmul + 12LH{s.get('keys_symbol', 'T')} per token)",
            s['mfu_predicted'],
            s['mfu_measured'],
            lambda x: f'{x:.1%}',
        ),
        (
            f"memory per device: {s['memory_kind']}; activations as {s['memory_graph']}",
            s['memory_predicted_bytes'],
            s['memory_measured_bytes'],
            _gib,
        ),
        (
            'memory per device: peak reserved (+ overhead)',
            s['reserved_predicted_bytes'],
            s['reserved_measured_bytes'],
            _gib,
        )
        if s['reserved_predicted_bytes'] is not None
        else None,
        (
            'days for the planned tokens',
            s['days_predicted'],
            s['days_projected'],
            lambda x: f'{x:.3g}',
        ),
        (
            "model states on rank 0 after its first step: weights, gradients, the optimizer's states",
            s.get('model_states_predicted_bytes'),
            s.get('model_states_measured_bytes'),
            lambda x: f'{x:,.0f} B',
        )
        if s.get('model_states_predicted_bytes') is not None
        else None,
        (
            "optimizer step's matmul FLOPs on rank 0 (FlopCounterMode; Muon's Newton-Schulz)",
            s.get('optimizer_flops_predicted'),
            s.get('optimizer_flops_measured'),
            lambda x: f'{x:,.0f}',
        )
        if s.get('optimizer_flops_predicted')
        else None,
    ]
    lines = [
        f"Predicted by ledger.py for {s['predicted_for']} (peak: {s['peak_source']}) at "
        + (
            f"{s['mfu_assumed']:.0%} MFU ({s['mfu_source']})"
            if s.get('mfu_source')
            else f"an assumed {s['mfu_assumed']:.0%} MFU"
        )
        + f"; measured on {s['device'] or 'an unnamed device'}"
        + (f", torch {s['torch']}" if s['torch'] else '')
        + (f", step {s['step']:,}" if s['step'] else '')
        + '.',
        '',
        '| quantity | predicted | measured | measured / predicted |',
        '| --- | ---: | ---: | ---: |',
    ]
    if s.get('ledger_unverified'):
        lines[1:1] = ['', f"LEDGER UNVERIFIED (--force): {s['ledger_unverified']}"]
    for what, predicted, value, fmt in filter(None, rows):
        ratio = f'{value / predicted:.3f}' if value is not None and predicted else '-'
        lines.append(
            f"| {what} | {fmt(predicted)} | {'-' if value is None else fmt(value)} | {ratio} |"
        )
    if s['val_loss'] is not None:
        lines += [
            '',
            f"val loss {s['val_loss']:.4f} nats per token"
            + (
                f" = {s['val_bpb']:.4f} bits per byte (at {s['val_bytes_per_token']:.4f} text bytes per token: "
                "those of the val targets scored)"
                if s['val_bpb'] is not None
                else ''
            ),
        ]
    return '\n'.join(lines)


def format_book(examples):
    """sums.book_examples() as the table `python ledger.py --book` prints."""
    lines = [
        "BOOK.md's worked examples, recomputed by the ledger (book's figure | ledger's | agree at the book's precision)"
    ]
    section = None
    for example in examples:
        if example['section'] != section:
            section = example['section']
            lines += ['', section]
        lines.append(
            f"  {example['what']:<46} {example['book']:>14} | {example['shown']:>14} | "
            f"{'ok' if example['matches'] else 'DIFFERS'}   {example['formula']}   [{example['source']}]"
        )
    return '\n'.join(lines)
