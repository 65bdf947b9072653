"""
evals.py: a checkpoint's HellaSwag, ARC-Easy, ARC-Challenge and MMLU (0/5-shot) accuracies.

    python evals.py out/pystdlib_cpu hellaswag               # the run's latest checkpoint
    torchrun --nproc_per_node=8 evals.py out/h100x8_1b3 all  # the five tasks, sliced over ranks
    python evals.py out/pystdlib_cpu all --limit 500         # 500 items of each (on a CPU)
    python evals.py out/pystdlib_cpu mmlu_5shot              # or arc_easy, arc_challenge, mmlu

Each beside chance and the published figures of the nearest sizes: HellaSwag scored as llm.c does
(so that its GPT-2 figures compare), ARC and MMLU as lm-evaluation-harness (docs/after-training.md:
the protocols, the figures, the cache). train.py scores through the hooks of "During training".
"""

import argparse
import collections
import contextlib
import dataclasses
import functools
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ledgergpt import checkpoint, data, downloads, processes, sums
from ledgergpt.config import EVAL_TASKS, ConfigError, DataError, UserError
from ledgergpt.processes import log

HELLASWAG_URL = 'https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl'
# git's blob id of that file (never changed since 2019)
HELLASWAG_GIT_SHA1 = '0f5ee25d72216f12317d5d8a7b92deafa423d81e'
HELLASWAG_ITEMS = 10_042


# --------------------------------------------------------------------------------------------------
# The data: one download, then every line checked, so that a damaged file is one line that says so.


def cache_folder():
    # $XDG_CACHE_HOME/ledgergpt, beside the ledger's device probes
    return os.path.dirname(sums.cache_path())


def hellaswag_path(folder=None):
    return os.path.join(folder or cache_folder(), 'hellaswag_val.jsonl')


def download_hellaswag(url=None, folder=None, network=None):
    """hellaswag_val.jsonl's path in `folder`, downloaded first if missing from `url` (default:
    $HELLASWAG_URL, else HELLASWAG_URL, checked by its git blob id; a mirror's by its size)."""
    dest, url = hellaswag_path(folder), url or os.environ.get('HELLASWAG_URL', HELLASWAG_URL)
    if os.path.exists(dest):
        return dest
    # its error lines name the flags that choose this URL
    flags = dict(advice='--url or HELLASWAG_URL', not_found='--url or HELLASWAG_URL')
    hub = downloads.Hub(dataclasses.replace(network or downloads.Network(), **flags))
    hub.token = ''  # HF_TOKEN is for the Hugging Face Hub: never sent to this URL
    # identity: a server that gzips text (GitHub does) would announce the compressed size
    hub.session.headers['Accept-Encoding'] = 'identity'
    with hub.get(url, stream=True) as response:
        size = response.headers.get('Content-Length')
    if size is None:
        raise DataError(
            f"{url}: the server does not say the file's size (no Content-Length): use another URL"
        )
    git_sha1 = HELLASWAG_GIT_SHA1 if url == HELLASWAG_URL else None
    listed = {'path': 'hellaswag_val.jsonl', 'size': int(size), 'git_sha1': git_sha1}
    return downloads.download(hub, url, dest, listed, starts_with=b'{')


def choice_item(context, choices, label):
    texts = isinstance(choices, list) and all(isinstance(choice, str) for choice in choices)
    return isinstance(context, str) and texts and len(choices) >= 2 and label in range(len(choices))


def load_items(path):
    """[{'ctx', 'endings' (4 strings), 'label' (0..3)}] from a HellaSwag jsonl."""
    items = []
    with open(path, 'rb') as f:
        for number, line in enumerate(f, 1):
            try:
                item = json.loads(line)
                ctx, endings, label = item['ctx'], item['endings'], item['label']
                if not (choice_item(ctx, endings, label) and len(endings) == 4):
                    raise ValueError('not a context, 4 endings and a label 0..3')
            except (ValueError, KeyError, TypeError) as e:
                raise DataError(
                    f"{path}, line {number}: not a HellaSwag item ({type(e).__name__}: {e}): the "
                    f"file is damaged or truncated: delete it and rerun to download it again"
                ) from None
            items.append({'ctx': ctx, 'endings': endings, 'label': label})
    if not items:
        raise DataError(f"{path} holds no items: delete it and rerun to download it again")
    return items


def downloaded_once_per_machine(download, world_size):
    """download() on local rank 0 only (one writer per machine: it fills this machine's cache while
    the others wait at the all_gather), and a failure is one line on every rank."""
    error = ''
    if int(os.environ.get('LOCAL_RANK', 0)) == 0:
        try:
            download()
        except UserError as e:
            error = str(e)
    if world_size > 1:
        errors = [None] * world_size
        dist.all_gather_object(errors, error)
        error = next((e for e in errors if e), '')
    if error:
        raise DataError(error)


# --------------------------------------------------------------------------------------------------
# Scoring. A row is the context and one ending (or choice), its loss that of the ending's tokens,
# each predicted from all before it; rows too long lose context from the left. HellaSwag's pick is
# the ending of the lowest mean loss (llm.c's completion-style acc_norm). Rank r scores the r-th of
# world_size slices, topped up with uncounted copies of the first item (every rank runs the same
# forwards, as FSDP's collectives need), and the counts are all-reduced. `model` is what the caller
# runs forwards with (GPT, DDP or FSDP2); `autocast` the context of its forwards (None: none).


def cut(rows, context, length):
    """(the rows cut to their last `length` tokens, the index of each one's first ending token: 1
    or more, as the first token has nothing before it to be predicted from)."""
    cuts = [max(0, len(row) - length) for row in rows]
    return [row[cut:] for row, cut in zip(rows, cuts)], [max(1, context - cut) for cut in cuts]


def render(encoding, item, block_size):
    """HellaSwag's item -> ([4 token rows], [4 indices of the first ending token in each row])."""
    context = encoding.encode_ordinary(item['ctx'])
    # ' ': the ending continues the sentence
    rows = [context + encoding.encode_ordinary(' ' + ending) for ending in item['endings']]
    return cut(rows, len(context), block_size)


def ending_losses(model, rows, starts, device, autocast, reduction='mean'):
    """Mean (or with reduction='sum' summed) loss over the ending tokens of each row, batched: rows
    padded on the right (the causal mask keeps it from earlier positions; it is not counted)."""
    length = max(len(row) for row in rows)
    tokens = torch.zeros(len(rows), length, dtype=torch.long)
    scored = torch.zeros(len(rows), length - 1)
    for r, (row, start) in enumerate(zip(rows, starts)):
        tokens[r, : len(row)] = torch.tensor(row)
        scored[r, start - 1 : len(row) - 1] = 1  # target j is token j + 1 of the row
    tokens, scored = tokens.to(device), scored.to(device)
    with autocast:
        logits, _ = model(tokens[:, :-1])
    targets = tokens[:, 1:].flatten()
    losses = F.cross_entropy(logits.float().flatten(0, 1), targets, reduction='none')
    summed = (losses.view_as(scored) * scored).sum(1)
    return summed / scored.sum(1) if reduction == 'mean' else summed


@torch.no_grad()
def row_losses(model, items, render_item, device, autocast, batch_items, reduction):
    """[[each row's loss] per item] of render_item(item, block_size)'s rows, in eval mode."""
    autocast = autocast or contextlib.nullcontext()
    block_size = getattr(model, 'module', model).config.block_size  # DDP keeps the GPT in .module
    was_training = model.training
    model.eval()
    losses = []
    for first in range(0, len(items), batch_items):
        rendered = [render_item(item, block_size) for item in items[first : first + batch_items]]
        rows, starts = (sum(part, []) for part in zip(*rendered))
        flat = iter(ending_losses(model, rows, starts, device, autocast, reduction).tolist())
        losses += [[next(flat) for _ in item_rows] for item_rows, _ in rendered]
    model.train(was_training)
    return losses


def tally(items, mine, picks, device, world_size):
    """{'items', 'chance', 'acc', 'acc_norm' and their '_stderr'} of the (acc, acc_norm) picks for
    `mine`, summed over the ranks; with several subjects (MMLU) also their '_macro' averages."""
    subjects = sorted({item.get('subject', '') for item in items})
    # per subject: items, right, right by norm, chance
    totals = torch.zeros(len(subjects), 4, dtype=torch.float64)
    for item, (pick, pick_norm) in zip(mine, picks):
        chance = 1 / len(item.get('choices') or item['endings'])
        row = [1, pick == item['label'], pick_norm == item['label'], chance]
        totals[subjects.index(item.get('subject', ''))] += torch.tensor(row, dtype=torch.float64)
    if world_size > 1 and dist.is_initialized():
        totals = totals.to(device)
        dist.all_reduce(totals)
        totals = totals.cpu()
    n = totals[:, 0].sum().item()
    per_item = max(n, 1)  # 0 items: a rank's empty slice, read without a process group (tests)
    score = {'items': int(n), 'chance': totals[:, 3].sum().item() / per_item}
    for name, column in (('acc', 1), ('acc_norm', 2)):
        p = totals[:, column].sum().item() / per_item
        score[name], score[f'{name}_stderr'] = p, math.sqrt(p * (1 - p) / per_item)
        if len(subjects) > 1:
            score[f'{name}_macro'] = (totals[:, column] / totals[:, 0].clamp(min=1)).mean().item()
    return score


def hellaswag_accuracy(*args, **kwargs):
    """task_accuracy's arguments -> (accuracy, its standard error sqrt(p (1 - p) / n), n items)."""
    score = task_accuracy(*args, **kwargs)
    return score['acc'], score['acc_stderr'], score['items']


# --------------------------------------------------------------------------------------------------
# ARC and MMLU in the cloze formulation small models are measured with (each choice's text scored
# as the question's continuation, never shown), as lm-evaluation-harness (v0.4) scores them
# (docs/after-training.md, "ARC and MMLU"), from the Hub's parquet (--endpoint or HF_ENDPOINT).

# repo: the dataset on the Hub; folder: its config, where the split files are
# {split}-00000-of-00001.parquet; items: in the test split; title: the report's name for it;
# harness: lm-evaluation-harness's task of the same protocol; shots: examples from the dev split
# before each question; headline: the figure published comparisons use (train.py logs it under
# the task's name)
HubTask = collections.namedtuple(
    'HubTask', 'repo folder items title harness shots headline', defaults=(0, 'acc_norm')
)
ARC, MMLU, MMLU_HARNESS = 'allenai/ai2_arc', 'cais/mmlu', 'mmlu_continuation'
HUB_TASKS = {
    'arc_easy': HubTask(ARC, 'ARC-Easy', 2376, 'ARC-Easy test', 'arc_easy'),
    'arc_challenge': HubTask(ARC, 'ARC-Challenge', 1172, 'ARC-Challenge test', 'arc_challenge'),
    'mmlu': HubTask(MMLU, 'all', 14042, 'MMLU test, 0-shot', MMLU_HARNESS, headline='acc'),
    'mmlu_5shot': HubTask(
        MMLU, 'all', 14042, 'MMLU test, 5-shot', f'{MMLU_HARNESS}, num_fewshot=5', 5, 'acc'
    ),
}
# config.py validates train.py's eval_tasks against its own copy of the names
assert tuple(HUB_TASKS) == EVAL_TASKS
TASKS = ('hellaswag', *HUB_TASKS)


def sized(names, accuracies):
    """[(parameters, accuracy, name)]: the parameters are the size each name ends with ('1.3B')."""
    scale = {'M': 1e6, 'B': 1e9}
    return [(float(n.split()[-1][:-1]) * scale[n[-1]], a, n) for n, a in zip(names, accuracies)]


def fineweb(web, edu, note=''):
    models = (('FineWeb', web), ('FineWeb-Edu', edu))
    return [(FINEWEB + note, [(1.71e9, acc, f'{name} 1.71B, 350B tokens')]) for name, acc in models]


# Published figures; none is our protocol exactly. GPT-2: OpenAI's checkpoints scored with llm.c's
# completion-style acc_norm, HellaSwag's protocol here: the baselines that llm.c's dev/vislog.ipynb
# and build-nanogpt's play.ipynb plot (0.2945 for 124M; llm.c's hellaswag.py prints 0.2955 for 124M
# and 0.4893 for 1558M; lm-evaluation-harness's multiple-choice acc_norm is higher: 31.1%, 50.9%).
GPT2 = [f'GPT-2 {size}' for size in ('124M', '350M', '774M', '1558M')]
GPT3_SIZES = ('Small 125M', 'Medium 350M', 'Large 760M', 'XL 1.3B', '2.7B', '6.7B', '13B', '175B')
GPT3 = [f'GPT-3 {size}' for size in GPT3_SIZES]
# Brown et al.'s are of HellaSwag's dev set and ARC's test set; the protocol of each source below:
# docs/after-training.md's table.
TABLE_H1 = {
    'hellaswag': (0.337, 0.436, 0.510, 0.547, 0.628, 0.674, 0.709, 0.789),
    'arc_easy': (0.436, 0.465, 0.530, 0.538, 0.582, 0.602, 0.638, 0.688),
    'arc_challenge': (0.266, 0.295, 0.318, 0.355, 0.380, 0.414, 0.437, 0.514),
}
BROWN_ARC = 'GPT-3 zero-shot, unconditional norm. (Brown et al. 2020, Table H.1)'
HENDRYCKS = [f'GPT-3 {size}' for size in 'Small 2.7B,Medium 6.7B,Large 13B,X-Large 175B'.split(',')]
HENDRYCKS_SOURCE = 'GPT-3 5-shot, letter answers (Hendrycks et al. 2021, Table 1)'
FINEWEB = "Penedo et al. 2024, section 4: lighteval's cloze, benchmarks cut to 1,000 items"
ARC_FINEWEB = fineweb(0.46, 0.57, '; its ARC is Easy and Challenge together')
# task: [(source, [(parameters, accuracy, name)])]: the nearest size of each is printed
PUBLISHED = {
    'hellaswag': [
        ("OpenAI's checkpoint, llm.c's scoring", sized(GPT2, (0.2945, 0.3752, 0.4320, 0.4889))),
        ('Brown et al. 2020, Table H.1, zero-shot', sized(GPT3, TABLE_H1['hellaswag'])),
    ],
    'arc_easy': [(BROWN_ARC, sized(GPT3, TABLE_H1['arc_easy'])), *ARC_FINEWEB],
    'arc_challenge': [(BROWN_ARC, sized(GPT3, TABLE_H1['arc_challenge'])), *ARC_FINEWEB],
    'mmlu': fineweb(0.33, 0.37),
    'mmlu_5shot': [(HENDRYCKS_SOURCE, sized(HENDRYCKS, (0.259, 0.249, 0.260, 0.439)))],
}


def hub_task_path(repo, folder, split, cache=None):
    folder = os.path.join(cache or cache_folder(), repo.replace('/', '--'), folder)
    return os.path.join(folder, f'{split}.parquet')


def download_hub_split(repo, folder, split, cache=None, network=None):
    """The path of a split's parquet file of a Hub dataset (the one file in `folder` whose name
    starts with '{split}-'), downloaded into the cache first if missing."""
    dest = hub_task_path(repo, folder, split, cache)
    if os.path.exists(dest):
        return dest
    hub = downloads.Hub(network)
    sha, listed = hub.files(repo, 'main', folder, '.parquet')
    mine = [f for f in listed if os.path.basename(f['path']).startswith(f'{split}-')]
    if len(mine) != 1:
        raise DataError(
            f"{repo}/{folder} at {sha[:12]} holds {len(mine)} parquet files of its {split} split, "
            f"not one: the dataset has changed its layout; check --endpoint or HF_ENDPOINT, or "
            f"report it"
        )
    return downloads.download(hub, hub.url('datasets', repo, sha, mine[0]['path']), dest, mine[0])


def parquet_rows(path, columns):
    """The rows of a parquet file as dicts of `columns`; any other file is one DataError line."""
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path, columns=columns).to_pylist()
    except Exception as e:  # pyarrow's own errors (ArrowInvalid, ...) or a missing column
        raise DataError(
            f"{path}: not a parquet file with the columns {', '.join(columns)} "
            f"({type(e).__name__}: {e}): delete it and rerun to download it again"
        ) from None


def arc_items(path):
    """[{'context', 'choices', 'label'}] from ai2_arc's parquet (question, choices {text, label},
    answerKey: one of choices.label, 'A'-'E' or '1'-'5')."""
    items = []
    for number, row in enumerate(parquet_rows(path, ['question', 'choices', 'answerKey']), 1):
        try:
            texts, labels = row['choices']['text'], row['choices']['label']
            label = labels.index(row['answerKey'])
            if not (choice_item(row['question'], texts, label) and len(texts) == len(labels)):
                raise ValueError('not a question with 2 or more labelled choices')
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(
                f"{path}, row {number}: not an ARC item ({type(e).__name__}: {e})"
            ) from None
        context = f"Question: {row['question']}\nAnswer:"
        items.append({'context': context, 'choices': texts, 'label': label})
    return items


def mmlu_rows(path):
    rows = parquet_rows(path, ['question', 'subject', 'choices', 'answer'])
    for number, row in enumerate(rows, 1):
        question, subject = row['question'], row['subject']
        if not (choice_item(question, row['choices'], row['answer']) and isinstance(subject, str)):
            raise DataError(
                f"{path}, row {number}: not an MMLU item (a question, subject, choices and answer)"
            )
    return rows


def mmlu_items(test_path, dev_path, shots):
    """MMLU's test items, each after `shots` examples of its subject (the dev split's first)."""

    def question(row):
        return f"Question: {row['question'].strip()}\nAnswer:"

    examples = collections.defaultdict(list)  # subject -> its dev rows, in the file's order
    for row in mmlu_rows(dev_path) if shots else ():
        examples[row['subject']].append(row)
    items = []
    for row in mmlu_rows(test_path):
        subject, shown = row['subject'], examples[row['subject']][:shots]
        if len(shown) < shots:
            raise DataError(
                f"{dev_path} has {len(shown)} {subject} examples, fewer than the {shots} shots "
                f"asked for"
            )
        context = (
            f"The following are questions (with answers) about {subject.replace('_', ' ')}.\n\n"
            + ''.join(f"{question(e)} {e['choices'][e['answer']]}\n\n" for e in shown)
            + question(row)
        )
        choices, label = row['choices'], row['answer']
        items.append({'context': context, 'choices': choices, 'label': label, 'subject': subject})
    return items


def task_items(task, cache=None, world_size=1, network=None, url=None):
    """A task's items, its files downloaded once per machine (url: HellaSwag's)."""
    if task == 'hellaswag':
        downloaded_once_per_machine(lambda: download_hellaswag(url, cache, network), world_size)
        return load_items(hellaswag_path(cache))
    spec = HUB_TASKS[task]
    splits = ['test'] + (['dev'] if spec.shots else [])
    where = spec.repo, spec.folder
    fetch = functools.partial(download_hub_split, *where, cache=cache, network=network)
    downloaded_once_per_machine(lambda: [fetch(split) for split in splits], world_size)
    test, dev = (hub_task_path(*where, split, cache) for split in ('test', 'dev'))
    return arc_items(test) if spec.repo == ARC else mmlu_items(test, dev, spec.shots)


def render_choices(encoding, item, block_size):
    """-> ([a token row per choice], [index of each row's first choice token]), as the harness:
    encode(context + ' ' + choice), the choice's tokens those after the context's, the rows cut to
    their last block_size + 1 tokens (a forward sees block_size)."""
    context = len(encoding.encode_ordinary(item['context']))
    rows = [encoding.encode_ordinary(item['context'] + ' ' + choice) for choice in item['choices']]
    return cut(rows, context, block_size + 1)


def choice_logprobs(model, encoding, items, device, autocast=None, batch_items=8):
    """[[each choice's summed log-likelihood] per item]."""
    render_item = functools.partial(render_choices, encoding)
    losses = row_losses(model, items, render_item, device, autocast, batch_items, 'sum')
    return [[-loss for loss in item] for item in losses]


def predictions(item, logprobs):
    """(acc's choice, acc_norm's choice): the first highest log-likelihood (as numpy's argmax), and
    the first highest per character of its text (an empty choice never: the harness's -inf)."""
    choices = range(len(logprobs))
    per_char = [
        lp / len(text) if text else -math.inf for lp, text in zip(logprobs, item['choices'])
    ]
    return max(choices, key=logprobs.__getitem__), max(choices, key=per_char.__getitem__)


def task_accuracy(
    model, encoding, items, device, autocast=None, rank=0, world_size=1, batch_items=8
):
    """tally's score of a task's items: HellaSwag's ('endings') picked by the lowest mean loss,
    the Hub tasks' by predictions."""
    per_rank = math.ceil(len(items) / world_size)
    mine = items[rank * per_rank : (rank + 1) * per_rank]
    counted, mine = len(mine), mine + [items[0]] * (per_rank - len(mine))
    if 'endings' in items[0]:
        render_item = functools.partial(render, encoding)
        losses = row_losses(model, mine, render_item, device, autocast, batch_items, 'mean')
        picks = [2 * (row.index(min(row)),) for row in losses[:counted]]
    else:
        logprobs = choice_logprobs(model, encoding, mine, device, autocast, batch_items)
        picks = [predictions(item, scores) for item, scores in zip(mine, logprobs[:counted])]
    return tally(items, mine[:counted], picks, device, world_size)


# --------------------------------------------------------------------------------------------------
# During training: train.py's hooks. Its setup calls items_for_training once; its loop calls
# evaluate_hellaswag and evaluate_tasks at the steps hellaswag_every and eval_tasks_every name, each
# into metrics.jsonl and the log. Eager: rows of every length, no recompiles.


def items_for_training(run):
    """run.hellaswag and run.eval_tasks ({task: items}): the first hellaswag_items and
    eval_tasks_items (0: all) of the tasks it scores, downloaded in setup."""
    train, items = run.train, functools.partial(task_items, world_size=run.cluster.world_size)
    for key in ('hellaswag_every', 'eval_tasks_every'):
        if getattr(train, key) and run.tokenizer is None:
            raise ConfigError(
                f'{key} needs text: a data folder made by prepare.py, not synthetic tokens'
            )
    if train.hellaswag_every:
        run.hellaswag = items('hellaswag')[: train.hellaswag_items or None]
    if train.eval_tasks_every:
        names = [task for task in train.eval_tasks.split(',') if task]
        run.eval_tasks = {task: items(task)[: train.eval_tasks_items or None] for task in names}


def scored(run, scorer, items):
    cluster, model = run.cluster, run.raw_model
    ranks = cluster.rank, cluster.world_size
    with torch.compiler.set_stance('force_eager'):
        return scorer(model, run.tokenizer, items, cluster.device, run.autocast, *ranks)


def recorded(run, entry, line):
    run.metrics.record({'step': run.state.step, 'tokens': run.state.tokens_seen, **entry})
    log(run.cluster, f"step {run.state.step}: {line}")


def evaluate_hellaswag(run):
    accuracy, stderr, items = scored(run, hellaswag_accuracy, run.hellaswag)
    entry = {'hellaswag': accuracy, 'hellaswag_stderr': stderr, 'hellaswag_items': items}
    line = f"HellaSwag {accuracy:.2%} +- {stderr:.2%} over {items:,} items (chance: 25%)"
    recorded(run, entry, line)


def evaluate_tasks(run):
    """ARC and MMLU (the key eval_tasks): each task's headline figure under its name (as
    'hellaswag'), with its standard error and items, and both figures by name."""
    entry, parts = {}, []
    for task, items in run.eval_tasks.items():
        score, headline = scored(run, task_accuracy, items), HUB_TASKS[task].headline
        entry[task], entry[f'{task}_stderr'] = score[headline], score[f'{headline}_stderr']
        entry[f'{task}_items'] = score['items']
        entry[f'{task}_acc'], entry[f'{task}_acc_norm'] = score['acc'], score['acc_norm']
        parts.append(
            f"{task} acc {score['acc']:.2%}, acc_norm {score['acc_norm']:.2%} +- "
            f"{score['acc_norm_stderr']:.2%} (chance {score['chance']:.0%})"
        )
    counts = ', '.join(f'{len(items):,}' for items in run.eval_tasks.values())
    recorded(run, entry, f"over {counts} items: " + '; '.join(parts))


# --------------------------------------------------------------------------------------------------
# The command: under torchrun a process per GPU (NCCL) or per CPU process (gloo).


def report(task, score, seconds, params, path, world_size, device):
    n, acc, acc_norm = score['items'], score['acc'], score['acc_norm']
    rate = f"{n / seconds:,.0f} items/s on {world_size} x {device}"
    if task == 'hellaswag':
        print(
            f"HellaSwag validation, {n:,} items (llm.c's completion-style acc_norm), {path}: "
            f"{acc:.2%} ± {score['acc_stderr']:.2%} (standard error), {rate}"
        )
        whole, items, chance, measured = 'validation set', HELLASWAG_ITEMS, '1 in 4', f'{acc:6.1%}'
    else:
        spec = HUB_TASKS[task]
        print(
            f"{spec.title}, {n:,} items (lm-evaluation-harness's {spec.harness}, cloze), {path}: "
            f"acc {acc:.2%} ± {score['acc_stderr']:.2%}, acc_norm {acc_norm:.2%} ± "
            f"{score['acc_norm_stderr']:.2%} (standard errors), {rate}"
        )
        whole, items, chance = 'test split', spec.items, '1 in its choices'
        measured = f'{acc:6.1%} acc, {acc_norm:.1%} acc_norm'
    if n != items:
        print(
            f"  not the whole {whole} ({items:,} items): a figure of its own, not the "
            f"published kind"
        )
    if 'acc_macro' in score:
        print(
            f"  acc and acc_norm are over all its items (micro, as the harness's mmlu group); over "
            f"its subjects (macro): {score['acc_macro']:.2%} and {score['acc_norm_macro']:.2%}"
        )
    print(f"  {f'this model, {params:,} parameters':<34} {measured}")
    print(f"  {f'chance ({chance})':<34} {score['chance']:6.1%}")
    for source, figures in PUBLISHED[task]:
        # the nearest size, on a log scale
        _, published, name = min(figures, key=lambda figure: abs(math.log(figure[0] / params)))
        print(f"  {name:<34} {published:6.1%}   ({source})")


def arguments(argv):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[1])
    add = parser.add_argument
    add('checkpoint', help="a run's out_dir (latest checkpoint) or a ckpt/step_* folder")
    add('task', choices=[*TASKS, 'all'], help='one task, or all: ' + ', '.join(TASKS))
    add('--url', help="where hellaswag_val.jsonl comes from (default: $HELLASWAG_URL, else GitHub)")
    add('--endpoint', help='the Hub of ARC and MMLU (default: $HF_ENDPOINT, else huggingface.co)')
    add('--cache', default=cache_folder(), help='the folder they are kept in (%(default)s)')
    add('--limit', type=int, default=0, help='score the first N items of each task (0: all)')
    add('--batch', type=int, default=8, help='items per forward (a row per choice)')
    add('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    args = parser.parse_args(argv)
    if args.limit < 0 or args.batch < 1:
        raise ConfigError(
            f"--limit must be 0 or more and --batch 1 or more, got {args.limit} and {args.batch}"
        )
    return args


@processes.cli
def main(argv):
    args = arguments(argv)
    results, model = {}, None
    try:
        rank, world_size = int(os.environ.get('RANK', 0)), int(os.environ.get('WORLD_SIZE', 1))
        local_rank, device = int(os.environ.get('LOCAL_RANK', 0)), checkpoint.device_of(args.device)
        if world_size > 1 and device.type == 'cuda':
            device = torch.device('cuda', local_rank)
            torch.cuda.set_device(device)
        processes.join_process_group(processes.Cluster(rank, world_size, local_rank, device))
        path = checkpoint.find(args.checkpoint)
        model, train_config = checkpoint.load_model(path, device)
        params = sum(p.numel() for p in model.parameters())
        if train_config['data'] == 'synthetic':
            raise ConfigError(
                f"{path} was trained on synthetic tokens: it has no tokenizer to read the "
                f"questions with"
            )
        encoding = data.load_tokenizer(train_config['data'])
        autocast = torch.autocast('cuda', dtype=torch.bfloat16) if device.type == 'cuda' else None
        network = downloads.Network(endpoint=args.endpoint, not_found='--endpoint')
        limit, batch = args.limit or None, args.batch
        for task in TASKS if args.task == 'all' else (args.task,):
            items = task_items(task, args.cache, world_size, network, args.url)[:limit]
            started = time.perf_counter()
            score = task_accuracy(model, encoding, items, device, autocast, rank, world_size, batch)
            results[task] = score, time.perf_counter() - started
    finally:
        model = None  # before the process group goes (processes.leave_process_group)
        processes.leave_process_group()
    for task, (score, seconds) in results.items() if rank == 0 else ():
        report(task, score, seconds, params, path, world_size, device)
    return 0


if __name__ == '__main__':
    sys.exit(main())
