"""
bill.py: the ledger as text, standard library only. Each section is a list of rows (label, value,
formula or source) read off sums.predict's dict and config.PARTS' and config.OPTIMIZERS' rows (no
part or optimizer is named here), for the bill (ledger.py, ledger.md), the short bill train.py
prints, report.md's predicted-against-measured table and `ledger.py --book`.
"""

from ledgergpt import config, pretrained
from ledgergpt.config import GIB, OPTIMIZERS, PART_KEYS, SECONDS_PER_DAY, ModelConfig, sharded

# --------------------------------------------------------------------------------------------------
# Units. si and duration are public: the other commands name tokens and times the same way.


def si(x):
    """1336502272 -> '1.34B'; 26e9 -> '26.0B'."""
    for scale, suffix in ((1e12, 'T'), (1e9, 'B'), (1e6, 'M'), (1e3, 'K')):
        if abs(x) >= scale:
            return f'{x / scale:.3g}{suffix}'
    return f'{x:.3g}'


def duration(days):
    seconds = days * SECONDS_PER_DAY
    for unit, length in (('days', SECONDS_PER_DAY), ('h', 3600), ('min', 60)):
        if seconds >= length:
            return f'{seconds / length:.3g} {unit}'
    return f'{seconds:.3g} s'


def sci(x):
    return f'{x:.3g}' if abs(x) < 1e5 else f'{x:.3e}'.replace('e+', 'e')


def days_text(days):
    return f'{days:,.0f}' if days >= 100 else f'{days:.3g}'


def gib(n_bytes):
    return f'{n_bytes / GIB:,.2f} GiB'


def gb(n_bytes):
    return f'{n_bytes / 1e12:,.2f} TB' if n_bytes >= 1e12 else f'{n_bytes / 1e9:,.1f} GB'


def size(n_bytes):
    if n_bytes >= 1e8:
        return gb(n_bytes)
    return f'{n_bytes / 1e6:,.3g} MB' if n_bytes >= 1e5 else f'{n_bytes:,.0f} B'


def rate(flops_per_s):
    tera = flops_per_s >= 1e12
    return f'{flops_per_s / (1e12 if tera else 1e9):,.0f} {"T" if tera else "G"}FLOP/s'


def ms(seconds):
    return f'{seconds * 1e3:,.3g} ms' if seconds < 1 else f'{seconds:,.3g} s'


def line(label, value, note=''):
    """A row (label, value, note) as text, an int value with thousands separators. A section lists
    an optional row as `condition and row`: its callers leave out a row that is None or False."""
    value = f'{value:,}' if isinstance(value, int) else value
    return f'  {label:<34} {value:>18}   {note}'.rstrip()


# --------------------------------------------------------------------------------------------------
# The sections, in the book's order.


def optimizer_rows(train):
    """The optimizer's row, the row of the tensors it leaves to another (or None), their states."""
    row = OPTIMIZERS[train['optimizer']]
    rest = OPTIMIZERS[row.rest] if row.rest else None
    return row, rest, row.label + (f' + {rest.label}' if rest else '')


def header(p):
    m, t, model = p['model'], p['train'], ModelConfig(**p['model'])
    heads = 'MHA' if model.kv_heads == model.n_head else f'GQA, {model.kv_heads} kv heads'
    parts = [model.part(kind).label for kind in PART_KEYS if model.part_name(kind) != 'none']
    return [
        f"ledger: {m['arch']}, {model.n_layer} layers, H={model.n_embd}, {model.n_head} heads "
        f"({heads}), H'={model.ffn_width}, V={model.vocab_size}, T={model.block_size}, "
        f"{'tied' if model.tie_embeddings else 'untied'}{', biases' if model.biases else ''}",
        f"parts: {', '.join(parts)}, {optimizer_rows(t)[0].name} (config.PARTS)",
        f"plan: {si(p['tokens'])} tokens on {p['n_gpu']} x {p['gpu']['name']}, batch "
        f"{t['batch_tokens']:,} tokens = {t['micro_batch']} x {model.block_size} x {p['n_gpu']} "
        f"device(s) x {p['grad_accum']:.4g} accumulation, {p['steps']:,} steps",
    ] + ([pretrained.describe(t['init_from'])] if t.get('init_from') else [])


def per_layer_formula(model):
    """A layer's parameters as a formula that evaluates to its count (test_figures.py holds it so):
    the attention row's 2H^2 + 2H*kv_width is 4H^2 with every head's k and v; the biases are q,
    k, v, o, the FFN's matrices' and, with LayerNorm's, the norms'."""
    mha, k, qk = model.kv_heads == model.n_head, model.ffn_matrices, model.part('qk_norm')
    formula = f"4H^2 + {k}HH' + 2H" if mha else f"2H^2 + 2H*kv_width + {k}HH' + 2H"
    formula += '' if qk.formula == 'none' else f' + {qk.formula} ({qk.label})'
    if model.biases:
        norm_biases = 2 * (len(model.part('norm').shapes(model)) == 2)
        formula += f" (+ {(5 if mha else 3) + norm_biases}H{'' if mha else ' + 2kv_width'}"
        formula += f" + {'' if k == 2 else k - 1}H' biases)"
    if not mha:
        formula += f', kv_width = {model.kv_heads} kv heads x {model.head_dim}'
    return formula


def parameter_rows(p):
    """Ledger 1: each part named, its formula given by its row of config.PARTS."""
    model, n = ModelConfig(**p['model']), p['params']
    attn, mlp, norm, qk, pos = map(model.part, 'attention mlp norm qk_norm positions'.split())
    qk_formula = '' if qk.formula == 'none' else f' + {qk.formula}'
    biases = ' + biases' if model.biases else ''
    ffn = f'L*({mlp.formula}{biases})' if biases else f'L*{mlp.formula}'
    matmuls = f"{n['matmul'] / n['total']:.1%} of P: Linear weights incl. the output projection"
    return [
        ('token embedding', n['embedding'], 'V*H'),
        n['position'] and ('position embedding', n['position'], f'{pos.formula} ({pos.label})'),
        (f"attention{f' ({qk.label})' if qk_formula else ''}", n['attention'],
         f'L*({attn.formula}{biases}{qk_formula}): q, o and GQA-sized k, v'),
        (f'ffn ({mlp.label})', n['ffn'],
         'the dense layers and every expert: Ledger MoE' if model.n_experts else ffn),
        (f'norms ({norm.label})', n['norms'],
         '(2L + 1)*H' + (' * 2 (weight, bias)' if len(norm.shapes(model)) == 2 else '')),
        ('output projection', n['output'],
         'tied: shares the embedding' if model.tie_embeddings else 'V*H'),
        ('per layer', n['per_layer'], per_layer_formula(model)),
        ('total P', n['total'], si(n['total'])),
        ('in matmuls N_matmul', n['matmul'],
         matmuls + (', those a token uses (MoE)' if model.n_experts else '')),
    ]


def compute_rows(p):
    """Ledger 2: the FLOPs a token by each convention, the optimizer's step, the run's total."""
    t, f, k = p['train'], p['flops_per_token'], p['flops_per_token']['keys_symbol']
    recompute, optimizer = t['recompute'], optimizer_rows(t)[0]
    book = '8P' if recompute else '6P'
    rerun, blocks = (('2N_blocks', 'whole (each block compiled on its own)') if p['compiled_blocks']
                     else ("2(N_blocks-LHH')", "all but down_proj (H'H), never lm_head"))
    step = p.get('optimizer_flops_per_step')
    embedding = '' if p['model']['tie_embeddings'] else ', input embedding'
    nanogpt = f"{f['nanogpt'] / f['matmul'] - 1:+.3%}"
    return [
        (f"book: {book}{' (recompute)' if recompute else ''}", sci(f['book']),
         "the book's ledger 2: forward 2P + backward 4P"
         + (' + one recomputed forward 2P' if recompute else '')),
        (f'matmul: 6N_matmul + 12LH{k}', sci(f['matmul']),
         'PaLM (Chowdhery et al. 2022, app. B), non-causal attention, no embedding lookup; '
         'MFU uses this'),
        (f"nanoGPT's estimate_mfu: 6N + 12LH{k}", sci(f['nanogpt']),
         f'N = all but the position table: norms, biases{embedding} as matmuls: {nanogpt}'),
        (f'matmul, causal: 6N_matmul + 6LH{k}', sci(f['matmul_causal']),
         'only the unmasked half of attention'),
        recompute and (f'executed: +{rerun}+4LH{k}', sci(f['hardware']),
                       f'matmul + the blocks rerun in backward: {blocks}'),
        ('attention share of block matmuls', f"{f['attention_share']:.1%}",
         f"12LH{k} / 6N_blocks; the book's {k}/(6H) = {f['attention_share_approx']:.1%}"),
        *loss_term_rows(p),
        step and ('optimizer step', sci(step),
                  f'FLOPs a step on the busiest device: {optimizer.step_formula.format(**t)} '
                  f"({optimizer.name}), {sci(step / t['batch_tokens'])} a token"),
        (f"executed for {si(p['tokens'])} tokens", sci(p['total_flops']),
         f"book {book}D: {sci(p['book_flops'])}"
         + (", with every device's optimizer steps" if step else '')),
    ]


def loss_term_rows(p):
    """The terms the run adds to the cross-entropy (config.LOSS_TERMS), each with its weight."""
    keys = {**p['model'], **p['train']}
    return [
        (f'loss term: {term.label}', f'{keys[term.key]:g}', f'{term.formula}; {term.key}')
        for term in config.LOSS_TERMS.values() if keys.get(term.key)
    ]


def time_rows(p):
    """Ledger 3: the device, the speed, the days and the cost."""
    t, device, recompute = p['train'], p['gpu'], p['train']['recompute']
    book, optimizer = '8P' if recompute else '6P', p.get('optimizer_step_seconds')
    cost_book = p['cost_usd'] * p['days_book'] / p['days']
    return [
        ('device', f"{p['n_gpu']} x {device['name'].split(' (')[0].split()[0]}",
         f"{device['name']}: peak {rate(device['peak_flops'])} each ({device['peak_source']})"),
        ('assumed utilisation', f"{p['mfu_assumed']:.0%}",
         'of peak (the planning note: 40% for a tuned Llama with flash attention and '
         'torch.compile; real runs 30-70%)'),
        ('throughput', f"{p['tokens_per_s']:,.0f} tok/s",
         f"n_gpu * peak * MFU / executed FLOPs per token; {p['step_seconds']:.3g} s per step"),
        ('time for this run', duration(p['days']),
         'executed FLOPs: the matmul count (with attention)'
         + (' + the recomputed forward' if recompute else '')
         + (f" + the optimizer's, {optimizer:.3g} s a step" if optimizer else '')),
        ('days', days_text(p['days']), 'time / 86400 s'),
        (f'days, book {book}D', days_text(p['days_book']),
         "FLOPs by the book's convention (the planning note's table)"),
        ('GPU-hours', f"{p['gpu_hours']:,.0f}", 'days x 24 x n_gpu'),
        ('cost', f"${p['cost_usd']:,.0f}",
         f"at ${t['usd_per_gpu_hour']}/GPU-hour (book {book}D: ${cost_book:,.0f}; the planning "
         'note: $3-4 per H200-hour)'),
        recompute and ('predicted MFU (PaLM)', f"{p['mfu']:.1%}",
                       'assumed x matmul / executed: recomputation is work MFU does not count'),
    ]


def state_rows(p):
    """Ledger 4's model states: weights, gradients, the optimizer's states (what a row holds for an
    empty tensor is what it holds per tensor: AdamW's step count), FSDP2's gathered weights."""
    t, memory, n_gpu = p['train'], p['memory'], p['n_gpu']
    fsdp2 = sharded(t['parallel'], n_gpu)
    optimizer, rest, states = optimizer_rows(t)
    per_tensor = (rest or optimizer).state_bytes((0,))
    formula = f'({optimizer.formula} + {rest.formula}_rest)' if rest else optimizer.formula
    formula += "/N, each rank's rows" if fsdp2 else ''
    if n_gpu > 1 and t['parallel'] == 'zero1':
        formula += '/N, whole tensors per rank (ZeRO-1)'
    if per_tensor:
        formula += f" + a {per_tensor}-byte step count per {rest.name + ' ' if rest else ''}tensor"
    grads = '/N, reduce-scattered (FSDP2)' if fsdp2 else ''
    if n_gpu > 1 and not fsdp2:
        grads = ": DDP's buckets, the .grad tensors are views of them"
    gathered = ('all blocks, forward to backward (zero2)' if t['parallel'] == 'zero2'
                else 'embeddings, lm_head and 2 blocks at a time (fsdp), + one block of gradients')
    return [
        ('fp32 weights', gib(memory['weights']),
         '4P/N, chunks padded to equal rows (FSDP2)' if fsdp2
         else f'4P: master weights, updated by {optimizer.name}'),
        ('fp32 gradients', gib(memory['grads']), f'4P{grads}'),
        (states, gib(memory['optimizer']), formula),
        fsdp2 and (f"gathered {'bf16' if p['dtype'] == 'bfloat16' else 'fp32'} weights",
                   gib(memory['gathered']), gathered),
        ('model states', gib(memory['model_states']),
         f"the book's accounting, {memory['book_formula']} with 16-bit weights and grads: "
         f"{gib(memory['book_model_states'])}"),
    ]


def memory_notes(p):
    """Ledger 4's notes on the activations, the loss's buffers and the total."""
    memory, device, model = p['memory'], p['gpu'], ModelConfig(**p['model'])
    compiled, whole = memory['graph'] != 'eager', memory['graph'] == 'compiled whole'
    activations = (
        'counted eager: the MoE routing breaks the compiled graph' if compiled and model.n_experts
        else 'what the compiled graph saves (min-cut partitioner)' if compiled
        else 'what autograd saves for backward, eager mode'
    )
    if p['train']['recompute']:
        activations += ', block inputs and one block rerun (recompute)'
    buffers = model.part('loss').buffers_formula(whole, 2 if p['dtype'] == 'bfloat16' else 4)
    if compiled:
        activations += f"; eager: {gib(memory['activations_eager'])}"
        buffers += (f"; eager: {gib(memory['logits_eager'])}" if whole
                    else ' (the loss runs eager around the compiled blocks)')
    if model.logit_softcap:
        buffers += (f'; logits soft-capped at {model.logit_softcap:g}: + one chunk x V x 4, '
                    "the cap's slope")
    processes = device['shared_by'] or (p['n_gpu'] if device['kind'] == 'cpu' else 1)
    total = (
        f"of {gib(memory['gpu_memory'])} ({device['memory_source']}"
        + (f', shared by {processes} processes' if processes > 1 else '')
        + f"): {'fits' if memory['fits'] else 'DOES NOT FIT'}, headroom {gib(memory['headroom'])} "
        f"(a fit keeps {memory['headroom_needed'] / memory['gpu_memory']:.0%}, "
        f"{gib(memory['headroom_needed'])}: the ledger's error band)"
    )
    if device['kind'] == 'cpu':
        total += ("; glibc's malloc keeps freed blocks for reuse, so the peak RSS runs up to "
                  '~1.35x this (measured, docs/ledger.md)')
    return activations, buffers, total


def memory_rows(p):
    """Ledger 4: what each process holds, as train.py holds it."""
    memory, model, largest = p['memory'], ModelConfig(**p['model']), p['max_micro_batch']
    activations, buffers, total = memory_notes(p)
    advice = ('' if memory['fits'] else f': try --micro_batch={largest}' if largest
              else ': not even one; try --recompute=1, or --parallel=fsdp over more GPUs')
    return state_rows(p) + [
        ('activations', gib(memory['activations']), activations),
        (f"logits and {model.part('loss').label}", gib(memory['logits']), buffers),
        ('runtime overhead', gib(memory['overhead']), p['gpu']['overhead_source']),
        memory['compile_host'] and ('torch.compile on the CPU', gib(memory['compile_host']),
                                    "ESTIMATE: inductor's modules, graphs and generated kernels, "
                                    'resident (measured, sums.py)'),
        ('total', gib(memory['total']), total),
        ('largest micro-batch that fits', str(largest),
         f'sequences of {model.block_size} tokens per device{advice}'),
    ]


def data_rows(p):
    """The planning note's rows: tokens against Chinchilla, the dataset, the bytes it takes."""
    t, d, states = p['train'], p['data'], optimizer_rows(p['train'])[2]
    # the book's 12P, the optimizer's states 8P (sums.data_ledger), or what they hold
    weights = '12P: fp32 weights + ' if d['checkpoint_bytes'] == 12 * p['params']['total'] else (
        "4P fp32 weights + the optimizer's states: ")
    uint = 'uint16: vocab <= 65,536' if d['token_bytes'] == 2 else 'uint32: vocab > 65,536'
    stored = 'dataset' if d['dataset_tokens'] else 'training tokens'
    return [
        ('Chinchilla-optimal tokens', si(d['chinchilla_tokens']), '20 x P (Hoffmann et al. 2022)'),
        ('this plan', f"{d['tokens_per_param']:.3g} tok/param",
         f"{d['chinchilla_multiple']:.2g} x Chinchilla; {si(d['train_tokens'])} tokens are optimal "
         f"for {si(d['chinchilla_params_for_tokens'])} params"),
        d['loss_fraction'] < 1 and (
            'tokens that carry loss', si(d['loss_tokens']),
            f"{d['loss_fraction']:.0%} of them: objective {t['objective']} (sums.loss_fraction); "
            'FLOPs, tokens/s and MFU count every position'),
        d['dataset_tokens'] and (
            'dataset', si(d['dataset_tokens']) + ' tokens',
            f"{'enough' if d['enough_data'] else 'NOT enough'}: {d['epochs']:.3g} epochs"),
        ('token shards', gb(d['shard_bytes']),
         f"{d['token_bytes']} bytes/token ({uint}), the {stored}"),
        ('source parquet', gb(d['parquet_bytes_high']),
         f"~3-4 bytes/token compressed (FineWeb-Edu): {gb(d['parquet_bytes_low'])} to "
         f"{gb(d['parquet_bytes_high'])}"),
        ('checkpoint', gb(d['checkpoint_bytes']),
         f"{weights}{states}; bf16 export 2P = {gb(d['export_bytes'])}"),
    ]


def loss_rows(p):
    """The published loss fits' predictions for this plan (their data, not ours)."""
    d = p['data']
    names = {'hoffmann2022': 'Hoffmann et al. 2022', 'epoch2024': 'Epoch AI 2024 replication'}
    return [
        (name, f"{d['expected_loss'][fit]:.3f} nats",
         ', '.join(f'{k} {v}' for k, v in d['fits'][fit].items()))
        for fit, name in names.items()
    ]


def moe_rows(p):
    """Ledger MoE: what scales with the active parameters (compute), what with the total."""
    model, n, f, memory = ModelConfig(**p['model']), p['params'], p['flops_per_token'], p['memory']
    if not model.n_experts:
        return []
    e, k, s, width = model.n_experts, model.top_k, model.n_shared_experts, model.expert_hidden
    expert = model.part('mlp').formula.replace("H'", 'E')  # an expert's: the mlp row's at H' = E
    every = (6 * n['matmul_total'] + f['attention']) / f['matmul']
    book, held = memory['book_active_model_states'], memory['model_states']
    states = memory['book_formula']
    return [
        ('layers with experts', f'{model.moe_layers} of {model.n_layer}',
         f'{e} routed experts of {width}, {k} per token, {s} shared; the first '
         f'{model.n_dense_layers} dense; sigmoid router, gates x {model.route_scale:g} '
         '(DeepSeek-V3)'),
        ('MoE layer FFN', n['moe_layer'], f'router {e}H + ({e} + {s}) x {expert}: every expert'),
        ('  used by a token', n['moe_layer_active'], f'router {e}H + ({k} + {s}) x {expert}'),
        ('total P', n['total'], f"{si(n['total'])}: what model.py builds"),
        ('active P per token', n['active'],
         f"{si(n['active'])}, {n['active'] / n['total']:.1%} of P: all but the {e - k} routed "
         'experts a token skips'),
        ('FLOPs per token', sci(f['matmul']),
         f"6 x active N_matmul + 12LH{f['keys_symbol']} (router included); every expert on every "
         f'token: {every:.2f}x'),
        ('routing buffers', gib(memory['routing_buffers']),
         'of the activations (counted eager: the routing breaks a compiled graph): each token '
         f'copied to its {k} experts, and their {k} outputs'),
        ('model states, held', gib(held),
         f"from the TOTAL P ({states} of it, as held): every expert's weight, gradient and "
         'optimizer states exist whether a token visits it or not'),
        ('  book: 16 x active', gib(book),
         f"the book's '16 x active parameters' ({states}): {held / book:.2f}x too low; compute, "
         'days and cost do scale with the active parameters'),
    ]


def mixture_rows(mix):
    """One row per source of a mixture (sums.mixture_ledger): weight, tokens, epochs, shards."""
    rows = []
    for source in (mix or {}).get('sources', ()):
        epochs = f"{source['folder']} not prepared yet: epochs unknown"
        if source['epochs'] is not None:
            epochs = f"{source['epochs']:.3g} epochs of its {si(source['dataset_tokens'])}"
        if source['repeats_too_often']:
            epochs += (f"; REPEATS past {mix['repeat_epochs']} epochs, where repeated tokens are "
                       'worth much less than new ones (Muennighoff et al. 2023): add data or lower '
                       'its weight')
        rows.append((f"{source['name']} ({source['weight']:.1%})", si(source['tokens']) + ' tokens',
                     f"{epochs}; shards {gb(source['shard_bytes'])}"))
    return rows


# --------------------------------------------------------------------------------------------------
# Ledger 5: the collectives of a step (DDP's buckets and ZeRO-1's broadcasts as one row each),
# their bytes and bus bytes, the seconds and what hides (ESTIMATES, labelled), the verdict.


def collective_rows(comm):
    """One row per kind of collective, DDP's buckets and same-named calls summed."""
    groups = {}
    for item in comm['collectives']:
        bucket = 'DDP bucket' in item['what']
        name = item['what'].split(', DDP bucket')[0] + (', DDP buckets' if bucket else '')
        groups.setdefault(name, []).append(item)
    rows, keys = [], 'bytes bus_bytes calls seconds'.split()  # keys: summed over a group
    for name, items in groups.items():
        g = dict(items[0], count=len(items), **{k: sum(i.get(k) or 0 for i in items) for k in keys})
        sizes = (
            f"{g['count']} buckets (caps 1 MiB, then 25 MiB; the first {g['elements']:,} elements)"
            if g['count'] > 1 and 'DDP' in name
            else f"{g['calls']} tensors" if g['op'] == 'broadcast'
            else f"{g['calls']} x {g['elements']:,} elements"
        )
        timed = comm['seconds'] is not None and g['bytes'] >= 1e6
        rows.append((name, size(g['bytes']),
                     f"{g['op']} {g['dtype']}, {sizes}; {g['phase']}; bus {size(g['bus_bytes'])}"
                     + (f", {ms(g['seconds'])}" if timed else '')))
    return rows


def comm_time_rows(p):
    """Ledger 5's seconds (an ESTIMATE from the link table), what hides, the bound; or why none."""
    comm, t, topo = p['comm'], p['train'], p['comm']['topology']
    if comm['seconds'] is None:
        return [('time', 'not estimated', 'gloo on a CPU: seconds are not meaningful'
                 if p['gpu']['kind'] == 'cpu' else 'this GPU has no link figures: set '
                 'intra_node_busbw (and inter_node_busbw), GB/s')]
    hides = (
        'FSDP2 hides gathers under forward and reduce-scatters under backward, every micro-step, '
        "all but the root unit's" if sharded(t['parallel'], p['n_gpu'])
        else "DDP hides its buckets under the last micro-step's backward, all but the last"
        + ('; ZeRO-1 broadcasts after the update' if t['parallel'] == 'zero1' else '')
    )
    return [
        ('time per step, ESTIMATE', ms(comm['seconds']), f"bus bytes / {topo['busbw'] / 1e9:,.0f} "
         f"GB/s busbw ({topo['link']} sets it); latency left out"),
        ('exposed per step, ESTIMATE', ms(comm['exposed_seconds']),
         f"{comm['exposed_fraction']:.1%} of a step: {hides}; step {p['step_seconds']:.3g} s"),
        ('bound, ESTIMATE', comm['bound'],
         f"compute while at most {comm['exposed_limit']:.0%} of a step waits on communication, "
         'else the slowest link'),
        ('days with communication', days_text(p['days']),
         f"compute {days_text(p['days_compute'])} + exposed communication (Ledger 3 counts both)"),
    ]


def communication_rows(p):
    """Ledger 5 for a prediction on more than one device; none on one."""
    comm, t, n, verdict = p['comm'], p['train'], p['n_gpu'], p['parallelism']
    if n == 1:
        return []
    topo, sequences = comm['topology'], t['batch_tokens'] // p['model']['block_size']
    inside = f"{topo['intra_busbw'] / 1e9:,.0f} GB/s" if topo['intra_busbw'] else '?'
    between = topo['inter_busbw'] and (
        f"; between nodes {topo['inter_busbw'] / 1e9:,.0f} GB/s per node ({topo['inter_source']})")
    factors = '2(N-1)/N all-reduce, (N-1)/N all-gather, reduce-scatter and all-to-all, 1 broadcast'
    return [
        ('topology', f"{topo['nodes']} x {topo['gpus_per_node']} GPUs",
         f"{topo['nodes']} node(s); inside a node {topo['fabric'] or 'an unknown fabric'}, busbw "
         f"{inside} ({topo['intra_source']}){between or ''}"),
        *collective_rows(comm),
        ('per step, per GPU', gb(comm['bytes']),
         "algorithm bytes (NCCL-tests' S: the buffer, the gathered output, the scattered input); "
         f"bus bytes {gb(comm['bus_bytes'])} ({factors}, N={n}); {comm['accumulation']} "
         'micro-steps'),
        *comm_time_rows(p),
        ('data parallelism stops at', f'{sequences:,} GPUs',
         "one sequence of the global batch each: there this plan's compute takes "
         f"{days_text(p['days_compute'] * n / sequences)} days"),
        ('verdict', 'DP is enough' if verdict['enough'] else 'needs TP/PP', verdict['verdict']),
        *(('', '', reason) for reason in verdict['reasons']),
        not verdict['enough'] and (
            'pipeline bubble (p-1)/(m+p-1)', f"{verdict['bubble']:.0%}",
            f"for planning: p = 4 stages over m = {comm['accumulation']} micro-batches idle this "
            'share (GPipe, Huang et al. 2019)'),
    ]


# --------------------------------------------------------------------------------------------------
# The bill, the short bill, report.md's table, the book.


def sections(p):
    """-> [(title, rows)] of a prediction, in the book's order."""
    t, memory, model = p['train'], p['memory'], ModelConfig(**p['model'])
    mode = f"{t['parallel']}, N={p['n_gpu']}" if p['n_gpu'] > 1 else 'one process'
    return [
        ('Ledger 1: parameters (exact, the way model.py builds them: = sum(p.numel()))',
         parameter_rows(p)),
        ('Ledger 2: compute per token, forward + backward (a matmul (n x m)(m x p) is 2nmp FLOPs)',
         compute_rows(p)),
        ('Ledger 3: time and money (days = FLOPs / (n_gpu * peak * MFU) / 86400)', time_rows(p)),
        (f"Ledger 4: memory per {'process' if p['gpu']['kind'] == 'cpu' else 'GPU'} ({mode}, as "
         f"train.py holds it; micro-batch {t['micro_batch']} x {model.block_size}, "
         f"{'bf16' if p['dtype'] == 'bfloat16' else 'fp32'} compute, {memory['graph']}, "
         f"{'full' if t['recompute'] else 'no'} recomputation, flash attention)", memory_rows(p)),
        ('Ledger MoE: a mixture of experts (total parameters for memory, active ones for compute)',
         moe_rows(p)),
        (f"Ledger 5: communication per optimizer step ({t['parallel']}, N={p['n_gpu']}, as "
         "train.py's collectives; bytes exact, seconds an ESTIMATE)", communication_rows(p)),
        ('Data and tokens (the planning note)', data_rows(p)),
        ('The mixture: each source as GPT-3 tabled its datasets (Brown et al. 2020, Table 2.2); '
         'weights kept to 1/1000', mixture_rows(p.get('mixture'))),
        ('Expected loss L = E + A/N^alpha + B/D^beta: THEIR fits on their data (MassiveText) and '
         'tokenizer, not ours', loss_rows(p)),
    ]


def format_report(p):
    """The header's lines, then each section that has rows: a blank line, its title, its rows."""
    lines = header(p)
    for title, rows in sections(p):
        rows = [line(*row) for row in rows if row]
        lines += ['', title, *rows] if rows else []
    return '\n'.join(lines)


def short_notes(p):
    """format_short's longer notes: the memory held, and the communication's seconds."""
    memory, comm, device = p['memory'], p['comm'], p['gpu']
    held = (f"states {gib(memory['model_states'])}, activations {gib(memory['activations'])}, loss "
            f"{gib(memory['logits'])}, runtime {gib(memory['overhead'])}"
            + (f", compile {gib(memory['compile_host'])}" if memory['compile_host'] else ''))
    seconds = ('gloo on the CPU: seconds not meaningful' if device['kind'] == 'cpu'
               else 'seconds not estimated (no link figures for this device)')
    if comm['seconds'] is not None:
        busbw = comm['topology']['busbw'] / 1e9
        exposed = comm['exposed_fraction']
        seconds = (f"ESTIMATE {ms(comm['seconds'])} at {busbw:,.0f} GB/s, {exposed:.1%} of a step "
                   f"exposed; {p['parallelism']['verdict']}")
    return held, seconds


def format_short(p, full):
    """The rows train.py prints before step 1, and where the whole bill is (`full`)."""
    memory, d, device, comm = p['memory'], p['data'], p['gpu'], p['comm']
    model, t, flops = ModelConfig(**p['model']), p['train'], p['flops_per_token']
    held, seconds = short_notes(p)
    recomputed = ' + the recomputed forward' if t['recompute'] else ''
    shape = f'{model.arch} {model.n_layer} x {model.n_embd}, V {model.vocab_size:,}'
    shape += f', T {model.block_size:,}'
    epochs = d['dataset_tokens'] and f"; {d['epochs']:.3g} epochs of {si(d['dataset_tokens'])}"
    epochs = f'{epochs} tokens' if epochs else ''
    cost = f"; ${p['cost_usd']:,.0f} at ${t['usd_per_gpu_hour']}/GPU-hour"
    fits = 'fits' if memory['fits'] else 'DOES NOT FIT'
    rows = [
        ('parameters', p['params']['total'], f"{shape}; {p['params']['matmul']:,} in matmuls"),
        model.n_experts and ('active per token', p['params']['active'],
                             'MoE: the FLOPs count these, memory the total'),
        ('FLOPs per token', sci(flops['hardware']),
         f"6N_matmul + 12LH{flops['keys_symbol']}{recomputed}; "
         f"{sci(p['total_flops'])} for {si(p['tokens'])} tokens"),
        ('device', f"{p['n_gpu']} x {rate(device['peak_flops'])}",
         f"{device['name']}, {p['dtype']} peak ({device['peak_source'].split(' (cache')[0]})"),
        ('throughput', f"{p['tokens_per_s']:,.0f} tok/s",
         f"at {p['mfu_assumed']:.0%} MFU, {p.get('mfu_source', 'assumed')}; "
         f"{p['step_seconds']:.3g} s per step of {t['batch_tokens']:,} tokens"),
        ('time for this run', duration(p['days']),
         f"{p['steps']:,} steps{cost if device['kind'] == 'gpu' else ''}"),
        ('memory per process', gib(memory['total']),
         f"of {gib(memory['gpu_memory'])}: {fits} ({held})"),
        ('tokens per parameter', f"{d['tokens_per_param']:.3g}",
         f"{d['chinchilla_multiple']:.2g} x Chinchilla (20){epochs}"),
        *mixture_rows(p.get('mixture')),
        comm['collectives'] and ('communication per step', size(comm['bytes']),
                                 f"{comm['accumulation']} micro-steps, {t['parallel']}; {seconds}"),
        d['loss_fraction'] < 1 and ('tokens that carry loss', si(d['loss_tokens']),
                                    f"{d['loss_fraction']:.0%}: objective {t['objective']}; "
                                    'tokens/s and MFU count every position'),
    ]
    return '\n'.join([f'ledger (the whole bill: {full}):'] + [line(*row) for row in rows if row])


def comparison_rows(s):
    """report.md's rows: (quantity, predicted, measured, how to write them); None: not measured."""
    count, gauge = (lambda x: f'{x:,.0f}'), (lambda x: f'{x:.3g}')
    return [
        ('parameters', s['params_predicted'], s['params_built'], count),
        ('throughput, tokens/s (all devices)', s['tokens_per_s_predicted'],
         s['tokens_per_s_measured'], count),
        (f"MFU (6N_matmul + 12LH{s.get('keys_symbol', 'T')} per token)", s['mfu_predicted'],
         s['mfu_measured'], lambda x: f'{x:.1%}'),
        (f"memory per device: {s['memory_kind']}; activations as {s['memory_graph']}",
         s['memory_predicted_bytes'], s['memory_measured_bytes'], gib),
        s['reserved_predicted_bytes'] is not None and (
            'memory per device: peak reserved (+ overhead)', s['reserved_predicted_bytes'],
            s['reserved_measured_bytes'], gib),
        ('days for the planned tokens', s['days_predicted'], s['days_projected'], gauge),
        s.get('model_states_predicted_bytes') is not None and (
            "model states on rank 0 after its first step: weights, gradients, the optimizer's "
            'states', s['model_states_predicted_bytes'], s.get('model_states_measured_bytes'),
            lambda x: f'{x:,.0f} B'),
        s.get('optimizer_flops_predicted') and (
            "optimizer step's matmul FLOPs on rank 0 (FlopCounterMode)",
            s['optimizer_flops_predicted'], s.get('optimizer_flops_measured'), count),
    ]


def estimate_text(e):
    """A forecast's val loss, its 95% interval and bits per byte (schedule.estimate's dict)."""
    bpb = f", {e['val_bpb']:.4f} bpb" if e.get('val_bpb') else ''
    return f"{e['val_loss']:.4f} (95%: {e['low']:.4f} to {e['high']:.4f}){bpb}"


def forecast_line(f):
    """train.py's line for schedule.forecast's dict: the run's end, then the what-ifs."""
    if 'not_yet' in f:
        return f"no forecast of the final val loss yet: {f['not_yet']}"
    others = [(f'{name} the tokens', e) for name, e in f.get('what_if', {}).items()]
    others += [(f'the branch to {int(t):,} tokens', e) for t, e in f.get('branches', {}).items()]
    return f"forecast at step {f['end_step']:,}: val loss {estimate_text(f)}" + ''.join(
        f"; {name} (step {e['steps']:,}): {e['val_loss']:.3f}" for name, e in others)


def forecast_rows(s):
    """report.md's rows of the forecasts made at 10%, 25% and 50% of the run, each against the val
    loss measured at the step it forecast (None before)."""
    return [
        (f"final val loss, forecast at {at} of the run (step {f['step']:,}; 95%: "
         f"{f['low']:.4f} to {f['high']:.4f}{'; said not yet' if 'not_yet' in f else ''})",
         f['val_loss'], s['val_loss'] if s['step'] == f['end_step'] else None,
         lambda x: f'{x:.4f}')
        for at, f in s.get('forecasts', {}).items() if 'val_loss' in f
    ]


def format_comparison(s):
    """report.md's table from a summary (sums.summarize): what, predicted, measured, ratio."""
    cells = [
        (what, fmt(predicted), '-' if value is None else fmt(value),
         f'{value / predicted:.3f}' if value is not None and predicted else '-')
        for what, predicted, value, fmt in filter(None, comparison_rows(s) + forecast_rows(s))
    ]
    mfu = (f"{s['mfu_assumed']:.0%} MFU ({s['mfu_source']})" if s.get('mfu_source')
           else f"an assumed {s['mfu_assumed']:.0%} MFU")
    heading = (
        f"Predicted by ledger.py for {s['predicted_for']} (peak: {s['peak_source']}) at {mfu}; "
        f"measured on {s['device'] or 'an unnamed device'}"
        + (f", torch {s['torch']}" if s['torch'] else '')
        + (f", step {s['step']:,}" if s['step'] else '') + '.'
    )
    lines = [heading, '']
    if s.get('ledger_unverified'):
        lines[1:1] = ['', f"LEDGER UNVERIFIED (--force): {s['ledger_unverified']}"]
    head = ('quantity', 'predicted', 'measured', 'measured / predicted'), ('---', *['---:'] * 3)
    lines += ['| ' + ' | '.join(row) + ' |' for row in (*head, *cells)]
    if s['val_loss'] is not None:
        bpb = s['val_bpb'] is not None and (
            f" = {s['val_bpb']:.4f} bits per byte (at {s['val_bytes_per_token']:.4f} text bytes "
            'per token: those of the val targets scored)')
        lines += ['', f"val loss {s['val_loss']:.4f} nats per token{bpb or ''}"]
    return '\n'.join(lines)


def format_book(examples):
    """sums.book_examples() as the table `python ledger.py --book` prints."""
    lines = ["BOOK.md's worked examples, recomputed by the ledger (book's figure | ledger's | "
             "agree at the book's precision)"]
    section = None
    for e in examples:
        if e['section'] != section:
            section = e['section']
            lines += ['', section]
        verdict = 'ok' if e['matches'] else 'DIFFERS'
        lines.append(f"  {e['what']:<46} {e['book']:>14} | {e['shown']:>14} | {verdict}   "
                     f"{e['formula']}   [{e['source']}]")
    return '\n'.join(lines)
