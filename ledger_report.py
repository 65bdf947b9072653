"""
ledger_report.py: the ledger as text. ledger.py does the sums, as numbers (predict -> one JSON-able dict); this file
prints them: the whole bill (format_report: the sections of BOOK.md, each row a value and where it comes from), the
few lines train.py shows before step 1 (format_short), report.md's predicted-against-measured table
(format_comparison), the book's worked examples recomputed (book_examples, format_book), and the command line,
which `python ledger.py` runs (main). Standard library only, like ledger.py; it imports ledger, never the reverse.
"""

import json

import ledger
import pretrained
from config import ConfigError, ModelConfig, cli, sharded
from ledger import (
    BOOK_STATES,
    CHINCHILLA_FITS,
    GIB,
    GPUS,
    SECONDS_PER_DAY,
    count_params,
    gpus_for_model_states,
    model_state_bytes,
    predict,
    token_bytes,
    train_days,
)

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


NORM_NAMES = {'layernorm': 'LayerNorm', 'rmsnorm': 'RMSNorm'}
MLP_NAMES = {'gelu': 'GELU MLP', 'swiglu': 'SwiGLU'}


def report_header(p):
    m, t = p['model'], p['train']
    model = ModelConfig(**m)
    attention = 'MHA' if model.kv_heads == model.n_head else f'GQA, {model.kv_heads} kv heads'
    return [
        f"ledger: {m['arch']}, {model.n_layer} layers, H={model.n_embd}, {model.n_head} heads ({attention}), "
        f"H'={model.ffn_width}, V={model.vocab_size}, T={model.block_size}, "
        f"{'tied' if model.tie_embeddings else 'untied'}{', biases' if model.biases else ''}",
        f"plan: {si(p['tokens'])} tokens on {p['n_gpu']} x {p['gpu']['name']}, batch {t['batch_tokens']:,} tokens "
        f"= {t['micro_batch']} x {model.block_size} x {p['n_gpu']} device(s) x {p['grad_accum']:.4g} accumulation, "
        f"{p['steps']:,} steps",
    ] + ([pretrained.describe(t['init_from'])] if t.get('init_from') else [])


def report_sections(p):
    """-> [(title, [(label, value, note), ...]), ...] for a prediction."""
    m, t, params, flops, memory, data, device = (
        p['model'],
        p['train'],
        p['params'],
        p['flops_per_token'],
        p['memory'],
        p['data'],
        p['gpu'],
    )
    model = ModelConfig(**m)
    family, bias, tied, recompute = model.family, model.biases, model.tie_embeddings, t['recompute']
    norm_bias, k = (
        bias and family.norm == 'layernorm',
        family.mlp_matrices,
    )  # LayerNorm's bias; H x H' matrices
    mha = (
        model.kv_heads == model.n_head
    )  # else GQA: k and v are kv_width = n_kv_head x head_dim wide
    book_p = '8P' if recompute else '6P'
    fsdp2 = sharded(t['parallel'], p['n_gpu'])  # FSDP2 shards every tensor's rows
    bf16 = p['dtype'] == 'bfloat16'
    parameters = [
        ('token embedding', f"{params['embedding']:,}", 'V*H'),
        ('position embedding', f"{params['position']:,}", 'T*H (learned positions)')
        if family.positions == 'learned'
        else None,
        (
            'attention',
            f"{params['attention']:,}",
            'L*(2H^2 + 2H*kv_width' + (' + biases)' if bias else ')') + ': q, o and GQA-sized k, v',
        ),
        (
            f"ffn ({MLP_NAMES[family.mlp]})",
            f"{params['ffn']:,}",
            'the dense layers and every expert: Ledger MoE'
            if model.n_experts
            else f"L*({k}HH' + biases)"
            if bias
            else f"L*{k}HH'",
        ),
        (
            f"norms ({NORM_NAMES[family.norm]})",
            f"{params['norms']:,}",
            '(2L + 1)*H' + (' * 2 (weight, bias)' if norm_bias else ''),
        ),
        (
            'output projection',
            f"{params['output']:,}",
            'tied: shares the embedding' if tied else 'V*H',
        ),
        (
            'per layer',
            f"{params['per_layer']:,}",
            (f"4H^2 + {k}HH' + 2H" if mha else f"2H^2 + 2H*kv_width + {k}HH' + 2H")
            + (
                f" (+ {(5 if mha else 3) + 2 * norm_bias}H{'' if mha else ' + 2kv_width'}"
                f" + {'' if k == 2 else k - 1}H' biases)"
                if bias
                else ''
            )
            + ('' if mha else f", kv_width = {model.kv_heads} kv heads x {model.head_dim}"),
        ),
        ('total P', f"{params['total']:,}", si(params['total'])),
        (
            'in matmuls N_matmul',
            f"{params['matmul']:,}",
            f"{params['matmul'] / params['total']:.1%} of P: Linear weights incl. the output projection"
            + (', those a token uses (MoE)' if model.n_experts else ''),
        ),
    ]
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
            'matmul: 6N_matmul + 12LHT',
            _sci(flops['matmul']),
            'PaLM (Chowdhery et al. 2022, app. B), non-causal attention, no embedding lookup; MFU uses this',
        ),
        (
            "nanoGPT's estimate_mfu: 6N + 12LHT",
            _sci(flops['nanogpt']),
            f"N = all but the position table: norms, biases{'' if tied else ', input embedding'} as matmuls: "
            f"{nanogpt_extra:+.3%}",
        ),
        (
            'matmul, causal: 6N_matmul + 6LHT',
            _sci(flops['matmul_causal']),
            'only the unmasked half of attention',
        ),
        (
            f"executed: +{rerun}+4LHT",
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
            f"12LHT / 6N_blocks; the book's T/(6H) = {flops['attention_share_approx']:.1%}",
        ),
        (
            f"executed for {si(p['tokens'])} tokens",
            _sci(p['total_flops']),
            f"book {book_p}D: {_sci(p['book_flops'])}",
        ),
    ]
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
            + (' + the recomputed forward' if recompute else ''),
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
    per = '/N' if fsdp2 else ''
    compiled = memory['graph'] != 'eager'
    processes = device['shared_by'] or (p['n_gpu'] if device['kind'] == 'cpu' else 1)
    states = [
        (
            'fp32 weights',
            _gib(memory['weights']),
            f"4P{per}"
            + (
                ', chunks padded to equal rows (FSDP2)'
                if fsdp2
                else ': master weights, updated by AdamW'
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
            'AdamW exp_avg, exp_avg_sq',
            _gib(memory['optimizer']),
            '8P'
            + (
                "/N, each rank's rows"
                if fsdp2
                else '/N, whole tensors per rank (ZeRO-1)'
                if p['n_gpu'] > 1 and t['parallel'] == 'zero1'
                else ''
            )
            + ' + a 4-byte step count per tensor',
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
            f"the book's accounting, {BOOK_STATES[t['parallel']]} with "
            f"16-bit weights and grads: {_gib(memory['book_model_states'])}",
        ),
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
            'logits and cross-entropy',
            _gib(memory['logits']),
            f"B*T*V x {2 * (2 if bf16 else 4)} bytes: the logits "
            f"and their gradient (fused); eager: {_gib(memory['logits_eager'])}"
            if compiled and memory['graph'] == 'compiled whole'
            else "B*T*V x 12 bytes: fp32 log-softmax, its gradient, the logits' gradient"
            + (' (the loss runs eager around the compiled blocks)' if compiled else ''),
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
            f"{t['objective']} (ledger.loss_fraction); FLOPs, tokens/s and MFU count every position",
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
            '12P: fp32 weights + Adam m, v; bf16 export 2P = ' + _gb(data['export_bytes']),
        ),
    ]
    loss = [
        (
            label,
            f"{data['expected_loss'][fit]:.3f} nats",
            ', '.join(f'{k} {v}' for k, v in CHINCHILLA_FITS[fit].items()),
        )
        for fit, label in (
            ('hoffmann2022', 'Hoffmann et al. 2022'),
            ('epoch2024', 'Epoch AI 2024 replication'),
        )
    ]
    mode = f"{t['parallel']}, N={p['n_gpu']}" if p['n_gpu'] > 1 else 'one process'
    sections = [
        (
            "Ledger 1: parameters (exact, the way model.py builds them: = sum(p.numel()))",
            parameters,
        ),
        (
            'Ledger 2: compute per token, forward + backward (a matmul (n x m)(m x p) is 2nmp FLOPs)',
            compute,
        ),
        ('Ledger 3: time and money (days = FLOPs / (n_gpu * peak * MFU) / 86400)', time_and_money),
        (
            f"Ledger 4: memory per {'process' if device['kind'] == 'cpu' else 'GPU'} ({mode}, as train.py holds it; "
            f"micro-batch {t['micro_batch']} x {model.block_size}, {'bf16' if bf16 else 'fp32'} compute, "
            f"{memory['graph']}, "
            f"{'full recomputation' if recompute else 'no recomputation'}, flash attention)",
            states,
        ),
        moe_section(p),  # None for a dense model
        communication_section(p) if p['n_gpu'] > 1 else None,
        ('Data and tokens (the planning note)', tokens),
        (
            'The mixture: each source as GPT-3 tabled its datasets (Brown et al. 2020, Table 2.2); weights kept '
            'to 1/1000',
            mixture_rows(p.get('mixture')),  # no rows, no section: one folder
        ),
        (
            'Expected loss L = E + A/N^alpha + B/D^beta: THEIR fits on their data (MassiveText) and tokenizer, '
            'not ours',
            loss,
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
    params, flops, memory, t = p['params'], p['flops_per_token'], p['memory'], p['train']
    n, k, s, E = model.n_experts, model.top_k, model.n_shared_experts, model.expert_hidden
    attention = flops['attention']
    all_active = (6 * params['matmul_total'] + attention) / flops[
        'matmul'
    ]  # were every expert used by every token
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
            f"6 x active N_matmul + 12LHT (router included); every expert on every token: {all_active:.2f}x",
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
            f"from the TOTAL P ({BOOK_STATES[t['parallel']]} of it, as held): every expert's weight, gradient "
            f"and AdamW moments exist whether a token visits it or not",
        ),
        (
            "  book: 16 x active",
            _gib(book),
            f"the book's '16 x active parameters' ({BOOK_STATES[t['parallel']]}): {held / book:.2f}x too low; "
            f"compute, days and cost do scale with the active parameters",
        ),
    ]
    return (
        'Ledger MoE: a mixture of experts (total parameters for memory, active ones for compute)',
        rows,
    )


def mixture_rows(mix):
    """One row per source of a mixture (ledger.mixture_ledger): weight, tokens drawn, epochs, shards; none without."""
    rows = []
    for source in (mix or {}).get('sources', ()):
        if source['epochs'] is None:
            epochs = f"{source['folder']} not prepared yet: epochs unknown"
        else:
            epochs = f"{source['epochs']:.3g} epochs of its {si(source['dataset_tokens'])}" + (
                f"; REPEATS past {ledger.REPEAT_EPOCHS} epochs, where repeated tokens are worth much less than new "
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


def communication_section(p):
    """-> (title, rows) of Ledger 5 for a prediction on more than one device."""
    comm, t, n = p['comm'], p['train'], p['n_gpu']
    topo, verdict = comm['topology'], p['parallelism']
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
                f"compute while at most {ledger.COMM_EXPOSED_LIMIT:.0%} of a step waits on communication, else "
                f"the slowest link",
            ),
            (
                'days with communication',
                _days(p['days']),
                f"compute {_days(p['days_compute'])} + exposed communication (Ledger 3 counts both)",
            ),
        ]
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
        bubble = ledger.pipeline_bubble(4, comm['accumulation'])
        rows.append(
            (
                'pipeline bubble (p-1)/(m+p-1)',
                f'{bubble:.0%}',
                f"for planning: p = 4 stages over m = {comm['accumulation']} micro-batches idle this share "
                "(GPipe, Huang et al. 2019)",
            )
        )
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
            f"6N_matmul + 12LHT{' + the recomputed forward' if p['train']['recompute'] else ''}; "
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
    lines = [line for line in lines if line]
    lines += [
        _row(*row) for row in mixture_rows(p.get('mixture'))
    ]  # a mixture: each source's tokens and epochs
    comm = p['comm']
    if comm['collectives']:  # Ledger 5: more than one process
        lines.append(
            _row(
                'communication per step',
                _bytes(comm['bytes']),
                f"{comm['accumulation']} micro-steps, {p['train']['parallel']}; "
                + (
                    f"ESTIMATE {_ms(comm['seconds'])} at {comm['topology']['busbw'] / 1e9:,.0f} GB/s, "
                    f"{comm['exposed_fraction']:.1%} of a step exposed; {p['parallelism']['verdict']}"
                    if comm['seconds'] is not None
                    else 'gloo on the CPU: seconds not meaningful'
                    if p['gpu']['kind'] == 'cpu'
                    else 'seconds not estimated (no link figures for this device)'
                ),
            )
        )
    if data['loss_fraction'] < 1:
        lines.append(
            _row(
                'tokens that carry loss',
                si(data['loss_tokens']),
                f"{data['loss_fraction']:.0%}: objective {p['train']['objective']}; tokens/s and MFU count "
                f"every position",
            )
        )
    return '\n'.join(lines)


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
            'MFU (6N_matmul + 12LHT per token)',
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


# -----------------------------------------------------------------------------------------------------
# The book's worked examples (BOOK.md), recomputed: the book's figure beside the ledger's, compared at the
# book's precision (a format spec; '>' for a bound). test_ledger.py checks every one; `ledger.py --book` prints them.

LLAMA_7B = ModelConfig(
    arch='llama',
    n_layer=32,
    n_head=32,
    n_embd=4096,
    ffn_hidden=11008,
    vocab_size=32000,
    block_size=2048,
)
BOOK = 'the book, BOOK.md'
NOTE = 'the planning note, BOOK.md'


def book_examples():
    """A list of dicts: section, what, formula, book (as written), book_value, value (the ledger's), precision
    (the format spec the two agree at), source, shown, matches."""
    h200, a800 = GPUS['H200'], GPUS['A800']
    p7b = count_params(LLAMA_7B)

    def seed_days(params, tokens):  # the planning note: 6ND on one H200 at MFU 0.40
        return train_days(6 * params * tokens, 1, h200.peak_flops, 0.40)

    flops_65b = 8 * 1.4e12 * 6.5e10
    memory_7b = model_state_bytes(p7b['total'], 'fsdp', 2)['total'] / GIB
    total_7b = (
        memory_7b + 6.20 + 3.91 + 6
    )  # the book's activations, softmax intermediates, other: taken as given
    cost_low, cost_high = (seed_days(1.3e9, 26e9) * 24 * usd for usd in (3, 4))
    rows = [  # section, what, formula, book's figure as written, its value, the ledger's value, precision, source
        (
            'Ledger 1',
            'LLaMA-7B parameters',
            "2VH + H + L(4H^2 + 3HH' + 2H), V 32000, L 32, H 4096, H' 11008",
            '6,738,415,616',
            6738415616,
            p7b['total'],
            ',d',
            BOOK + '; LLaMA, Touvron et al. 2023',
        ),
        (
            'Ledger 1',
            'LLaMA-7B: share of params in linear layers',
            'N_matmul / P (book: > 95%)',
            '> 95%',
            0.95,
            p7b['matmul'] / p7b['total'],
            '>',
            BOOK,
        ),
        (
            'Ledger 2',
            'LLaMA-7B on 1B tokens',
            '6 x P x C',
            '4.04e19',
            4.04e19,
            6 * p7b['total'] * 1e9,
            '.3g',
            BOOK,
        ),
        (
            'Ledger 3',
            'LLaMA-65B training FLOPs',
            '8CP, C 1.4e12, P 6.5e10 (recompute)',
            '7.28e23',
            7.28e23,
            flops_65b,
            '.3g',
            BOOK,
        ),
        (
            'Ledger 3',
            'LLaMA-65B seconds',
            '8CP / (2048 x 2e14 effective)',
            '1.78e6',
            1.78e6,
            flops_65b / (2048 * 2e14),
            '.3g',
            BOOK,
        ),
        (
            'Ledger 3',
            'LLaMA-65B days (paper: 21)',
            'seconds / 86400',
            '20.6',
            20.6,
            train_days(flops_65b, 2048, GPUS['A100'].peak_flops, 2e14 / GPUS['A100'].peak_flops),
            '.3g',
            BOOK + '; LLaMA, Touvron et al. 2023: 21 days',
        ),
        (
            'Ledger 3',
            'one H200: 0.76B params, 25B tokens',
            '6ND / (989e12 x 0.40) / 86400',
            '~3.3',
            3.3,
            seed_days(0.76e9, 25e9),
            '.2g',
            NOTE,
        ),
        (
            'Ledger 3',
            'one H200: 1.3B params, 26B tokens',
            '6ND / (989e12 x 0.40) / 86400',
            '5.93 (~6)',
            5.93,
            seed_days(1.3e9, 26e9),
            '.3g',
            NOTE,
        ),
        (
            'Ledger 3',
            'one H200: 1.3B params, 50B tokens',
            '6ND / (989e12 x 0.40) / 86400',
            '11.4 (~11)',
            11.4,
            seed_days(1.3e9, 50e9),
            '.3g',
            NOTE,
        ),
        (
            'Ledger 3',
            'one H200: 7B params, 140B tokens',
            '6ND / (989e12 x 0.40) / 86400',
            '~172',
            172,
            seed_days(7e9, 140e9),
            '.3g',
            NOTE,
        ),
        (
            'Ledger 3',
            'one H200: 13B params, 260B tokens',
            '6ND / (989e12 x 0.40) / 86400',
            '593 (~590)',
            593,
            seed_days(13e9, 260e9),
            '.3g',
            NOTE,
        ),
        (
            'Ledger 3',
            'cost of the 1.3B/26B run, USD',
            f'days x 24 x $3.5/H200-hour ($3-4: {cost_low:.0f}-{cost_high:.0f})',
            '~$500',
            500,
            seed_days(1.3e9, 26e9) * 24 * 3.5,
            '.1g',
            NOTE,
        ),
        (
            'Ledger 4',
            'LLaMA-7B model states per GPU, GiB',
            '16P/2 (ZeRO-3 on 2 x A800-80G); 50.205, the book truncates',
            '50.20',
            50.20,
            memory_7b,
            '.3g',
            BOOK,
        ),
        (
            'Ledger 4',
            'LLaMA-7B total per GPU, GiB',
            "16P/2 + the book's 6.20 + 3.91 + ~6 (its GB are GiB, as its 50.20 is)",
            '~66',
            66,
            total_7b,
            '.2g',
            BOOK,
        ),
        (
            'Ledger 4',
            'LLaMA-7B spare on an 80 GB card, GiB',
            'A800: 81,920 MiB = 80 GiB, - total',
            '~14',
            14,
            a800.memory_bytes / GIB - total_7b,
            '.2g',
            BOOK,
        ),
        ('Ledger 4', '13B: model states, GB', '16P', '208', 208, 16 * 13e9 / 1e9, '.3g', BOOK),
        (
            'Ledger 4',
            '13B: fewest 80 GB GPUs',
            'ceil(16P / 80 GB)',
            '3',
            3,
            gpus_for_model_states(13e9, a800.memory_bytes)[0],
            'd',
            BOOK,
        ),
        (
            'Ledger 4',
            '13B: recommended GPUs',
            'rounded up to a power of two',
            '4',
            4,
            gpus_for_model_states(13e9, a800.memory_bytes)[1],
            'd',
            BOOK,
        ),
        (
            'Ledger 4',
            '30B: recommended GPUs',
            'ceil(16P / 80 GB) = 6, to a power of two',
            '8',
            8,
            gpus_for_model_states(30e9, a800.memory_bytes)[1],
            'd',
            BOOK,
        ),
        (
            'Ledger 4',
            '65B: recommended GPUs',
            'ceil(16P / 80 GB) = 13, to a power of two',
            '16',
            16,
            gpus_for_model_states(65e9, a800.memory_bytes)[1],
            'd',
            BOOK,
        ),
        (
            'Ledger 4',
            '175B: model states alone, TB',
            '16P',
            '~2.8',
            2.8,
            16 * 175e9 / 1e12,
            '.2g',
            BOOK,
        ),
        (
            'Data',
            '175B: Chinchilla-optimal tokens, T',
            '20 x P',
            '3.5',
            3.5,
            20 * 175e9 / 1e12,
            '.2g',
            NOTE + '; Chinchilla, Hoffmann et al. 2022',
        ),
        (
            'Data',
            'GPT-3 tokens per parameter',
            '300B / 175B',
            '~1.7',
            1.7,
            300e9 / 175e9,
            '.2g',
            NOTE + '; GPT-3, Brown et al. 2020',
        ),
        (
            'Data',
            '25B tokens are optimal for, B params',
            'D / 20',
            '~1.25',
            1.25,
            25e9 / 20 / 1e9,
            '.3g',
            NOTE,
        ),
        (
            'Data',
            '0.76B params: optimal tokens, B',
            '20 x P',
            '15.2',
            15.2,
            20 * 0.76e9 / 1e9,
            '.3g',
            NOTE,
        ),
        (
            'Data',
            'Llama-3-8B tokens per parameter',
            '15T / 8B (~95x Chinchilla from the rounded 1,900)',
            '~1,900',
            1900,
            15e12 / 8e9,
            '.2g',
            NOTE + '; Llama 3, Meta 2024',
        ),
        (
            'Data',
            'bytes per token, vocab 50,257 (GPT-2)',
            'uint16 while vocab <= 65,536',
            '2',
            2,
            token_bytes(50257),
            'd',
            NOTE,
        ),
        (
            'Data',
            'bytes per token, vocab 128,256 (Llama 3)',
            'uint32 above',
            '4',
            4,
            token_bytes(128256),
            'd',
            NOTE,
        ),
        (
            'Data',
            '250B tokens at 2 bytes/token, GB',
            'D x 2',
            '500',
            500,
            250e9 * token_bytes(50257) / 1e9,
            '.3g',
            NOTE,
        ),
        (
            'Data',
            '25B tokens as parquet, GB',
            'D x ~4 bytes/token (3-4)',
            '~100',
            100,
            25e9 * 4 / 1e9,
            '.2g',
            NOTE,
        ),
        (
            'Data',
            '1.3B Adam checkpoint, GB',
            '12P: fp32 weights + Adam m, v',
            '~16',
            16,
            12 * 1.3e9 / 1e9,
            '.2g',
            NOTE,
        ),
    ]
    examples = []
    for section, what, formula, book, book_value, value, precision, source in rows:
        if precision == '>':
            matches, shown = value > book_value, f'{value:.1%}'
        else:
            whole = precision in ('d', ',d')
            matches = format(round(value) if whole else value, precision) == format(
                book_value, precision
            )
            shown = format(round(value), precision) if whole else f'{value:.4g}'
        examples.append(
            dict(
                section=section,
                what=what,
                formula=formula,
                book=book,
                book_value=book_value,
                value=value,
                precision=precision,
                source=source,
                shown=shown,
                matches=matches,
            )
        )
    return examples


def format_book():
    lines = [
        "BOOK.md's worked examples, recomputed by the ledger (book's figure | ledger's | agree at the book's precision)"
    ]
    section = None
    for example in book_examples():
        if example['section'] != section:
            section = example['section']
            lines += ['', section]
        lines.append(
            f"  {example['what']:<46} {example['book']:>14} | {example['shown']:>14} | "
            f"{'ok' if example['matches'] else 'DIFFERS'}   {example['formula']}   [{example['source']}]"
        )
    return '\n'.join(lines)


# -----------------------------------------------------------------------------------------------------
# CLI: python ledger.py CONFIG [--key=value ...] [--json] | python ledger.py --book

USAGE = 'usage: python ledger.py CONFIG [--key=value ...] [--fit=FIT] [--json]   or   python ledger.py --book'


@cli
def main(argv):
    if argv and argv[0] in ('-h', '--help'):
        print(ledger.__doc__.strip() + '\n\n' + USAGE)
        return 0
    if '--book' in argv:
        if argv != ['--book']:
            raise ConfigError('--book takes no other arguments')
        print(format_book())
        return 0
    as_json = '--json' in argv
    if '--fit' in argv[:-1]:  # --fit FIT, as --fit=FIT: the config's `fit` key
        at = argv.index('--fit')
        argv = [*argv[:at], f'--fit={argv[at + 1]}', *argv[at + 2 :]]
    args = [a for a in argv if a != '--json']
    if not args:
        raise ConfigError(f'no config given ({USAGE})')
    path = None if args[0].startswith('--') else args[0]
    model, train = pretrained.load_config(
        path, args[1:] if path else args
    )  # init_from: the model's config.json
    prediction = predict(model, train)
    text = format_report(prediction)
    if train.fit:  # the loss the plan buys, by a scaling law fitted to our own runs (scaling.py)
        import scaling

        fitted = scaling.load_fit(train.fit)
        title, rows = scaling.bill_section(fitted, prediction)
        warnings = scaling.warnings(
            fitted, prediction, train.data, scaling.tokenizer_of(train.data)
        )
        prediction['fit'] = {**scaling.check(fitted, prediction), 'warnings': warnings}
        text += '\n'.join(['', '', title, *(_row(*row) for row in rows), *warnings])
    print(json.dumps(prediction, indent=2) if as_json else text)
    return 0
