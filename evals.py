"""
evals.py: a checkpoint's HellaSwag, ARC-Easy, ARC-Challenge and MMLU (0- and 5-shot) accuracies, beside chance and
the published figures of comparable models.

    python evals.py out/pystdlib_cpu hellaswag               # the run's latest checkpoint
    torchrun --nproc_per_node=8 evals.py out/h100x8_1b3 all  # the five tasks, each rank a slice of each
    python evals.py out/pystdlib_cpu all --limit 500         # the first 500 items of each (a quick look on a CPU)
    python evals.py out/pystdlib_cpu mmlu_5shot              # one of arc_easy, arc_challenge, mmlu, mmlu_5shot

HellaSwag (Zellers et al. 2019) gives a context and four endings, one of them right; its validation set has
10,042 items. We score it as llm.c does (dev/data/hellaswag.py), so the GPT-2 figures it measured that way compare
with ours: each ending follows the context (" " + ending, no end-of-text token in front), and the one with the
lowest mean loss per ending token wins ("acc_norm", completion style). Chance is 25%; a small model trained on
code, like the CPU default, scores about that.

The jsonl is downloaded once into the cache folder (~/.cache/ledgergpt, or $XDG_CACHE_HOME/ledgergpt) from
rowanz/hellaswag on GitHub, the URL llm.c uses, through downloads.py's resumable download, and checked against the
git blob id of the published file; HELLASWAG_URL (or --url) points elsewhere, a mirror (there only the size the
server announces is checked).

train.py scores during training through the section "During training": items_for_training(run) once, then
evaluate_hellaswag(run) (hellaswag_accuracy) and evaluate_tasks(run) (score_tasks: the keys eval_tasks,
eval_tasks_every, eval_tasks_items) at their steps. ARC and MMLU are scored as lm-evaluation-harness scores them
(their section below).
"""

import argparse
import collections
import contextlib
import dataclasses
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
HELLASWAG_GIT_SHA1 = '0f5ee25d72216f12317d5d8a7b92deafa423d81e'  # git's blob id of that file (never changed since 2019)
HELLASWAG_ITEMS = 10_042

# Published zero-shot HellaSwag accuracies by parameter count: (parameters, accuracy, name).
# GPT-2: OpenAI's checkpoints scored with llm.c's completion-style acc_norm, the protocol above: the baselines that
# llm.c's dev/vislog.ipynb and build-nanogpt's play.ipynb plot (0.2945 for 124M; llm.c's hellaswag.py prints 0.2955
# for 124M and 0.4893 for 1558M; lm-evaluation-harness's multiple-choice acc_norm is higher: 31.1% and 50.9%).
GPT2 = [
    (124e6, 0.2945, 'GPT-2 124M'),
    (350e6, 0.3752, 'GPT-2 350M'),
    (774e6, 0.4320, 'GPT-2 774M'),
    (1558e6, 0.4889, 'GPT-2 1558M'),
]
# GPT-3: Brown et al. 2020, "Language Models are Few-Shot Learners", Table H.1, HellaSwag zero-shot (dev set).
GPT3 = [
    (125e6, 0.337, 'GPT-3 Small 125M'),
    (350e6, 0.436, 'GPT-3 Medium 350M'),
    (760e6, 0.510, 'GPT-3 Large 760M'),
    (1.3e9, 0.547, 'GPT-3 XL 1.3B'),
    (2.7e9, 0.628, 'GPT-3 2.7B'),
    (6.7e9, 0.674, 'GPT-3 6.7B'),
    (13e9, 0.709, 'GPT-3 13B'),
    (175e9, 0.789, 'GPT-3 175B'),
]


# -----------------------------------------------------------------------------------------------------
# The data: one download, then every line checked, so that a damaged file is one line that says so.


def cache_folder():
    # $XDG_CACHE_HOME/ledgergpt, beside the ledger's device probes
    return os.path.dirname(sums.cache_path())


def hellaswag_path(folder=None):
    return os.path.join(folder or cache_folder(), 'hellaswag_val.jsonl')


def download_hellaswag(url=None, folder=None, network=None):
    """The path of hellaswag_val.jsonl in `folder` (default: cache_folder()), downloaded there first if missing, from
    `url` (default: $HELLASWAG_URL, else HELLASWAG_URL). downloads.download resumes after drops and renames the file
    into place only once its size is the one the server announced and, for the published URL, its git blob id is
    HELLASWAG_GIT_SHA1."""
    dest, url = hellaswag_path(folder), url or os.environ.get('HELLASWAG_URL', HELLASWAG_URL)
    if os.path.exists(dest):
        return dest
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    hub = downloads.Hub(network)
    hub.token = ''  # HF_TOKEN is for the Hugging Face Hub: never sent to this URL
    # identity: a server that gzips text (GitHub does) would announce the compressed size, not the file's
    hub.session.headers['Accept-Encoding'] = 'identity'
    with hub.get(url, stream=True) as response:
        size = response.headers.get('Content-Length')
    if size is None:
        raise DataError(
            f"{url}: the server does not say the file's size (no Content-Length): use another URL"
        )
    listed = {'path': 'hellaswag_val.jsonl', 'size': int(size)}
    if url == HELLASWAG_URL:
        listed['git_sha1'] = HELLASWAG_GIT_SHA1
    return downloads.download(hub, url, dest, listed, starts_with=b'{')


def load_items(path):
    """[{'ctx', 'endings' (4 strings), 'label' (0..3)}] from a HellaSwag jsonl; a line that is not such an item
    (a truncated or damaged file) is one DataError line."""
    items = []
    with open(path, 'rb') as f:
        for number, line in enumerate(f, 1):
            try:
                item = json.loads(line)
                ctx, endings, label = item['ctx'], item['endings'], item['label']
                if not (
                    isinstance(ctx, str)
                    and isinstance(endings, list)
                    and len(endings) == 4
                    and all(isinstance(e, str) for e in endings)
                    and label in range(4)
                ):
                    raise ValueError('not a context, 4 endings and a label 0..3')
            except (ValueError, KeyError, TypeError) as e:
                raise DataError(
                    f"{path}, line {number}: not a HellaSwag item ({type(e).__name__}: {e}): the file "
                    f"is damaged or truncated: delete it and rerun to download it again"
                ) from None
            items.append({'ctx': ctx, 'endings': endings, 'label': label})
    if not items:
        raise DataError(f"{path} holds no items: delete it and rerun to download it again")
    return items


def downloaded_once_per_machine(download, world_size):
    """download() on local rank 0 only (one writer per machine: it fills this machine's cache while the others
    wait at the all_gather), and a failure is one line on every rank."""
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


def hellaswag_items(url=None, folder=None, world_size=1):
    """The items on every rank, downloaded once per machine."""
    downloaded_once_per_machine(lambda: download_hellaswag(url, folder), world_size)
    return load_items(hellaswag_path(folder))


# -----------------------------------------------------------------------------------------------------
# Scoring. A row is context + one ending; its score is the mean cross-entropy of the ending's tokens, each
# predicted from everything before it. Rows longer than block_size lose context from the left.


def render(encoding, item, block_size):
    """-> ([4 token rows], [4 indices of the first ending token in each row])."""
    context = encoding.encode_ordinary(item['ctx'])
    rows, starts = [], []
    for ending in item['endings']:
        # ' ': the ending continues the sentence
        row = context + encoding.encode_ordinary(' ' + ending)
        cut = max(0, len(row) - block_size)
        rows.append(row[cut:])
        # the first token has nothing before it to be predicted from
        starts.append(max(1, len(context) - cut))
    return rows, starts


def ending_losses(model, rows, starts, device, autocast, reduction='mean'):
    """Mean (or with reduction='sum' summed) loss over the ending tokens of each row, batched: rows padded on the
    right (the causal mask keeps the padding from reaching earlier positions, and the padded positions are not
    counted)."""
    length = max(len(row) for row in rows) - 1
    inputs = torch.zeros(len(rows), length, dtype=torch.long)
    targets = torch.zeros(len(rows), length, dtype=torch.long)
    scored = torch.zeros(len(rows), length)
    for r, (row, start) in enumerate(zip(rows, starts, strict=True)):
        inputs[r, : len(row) - 1] = torch.tensor(row[:-1])
        targets[r, : len(row) - 1] = torch.tensor(row[1:])
        scored[r, start - 1 : len(row) - 1] = 1  # target j is token j + 1 of the row
    inputs, targets, scored = inputs.to(device), targets.to(device), scored.to(device)
    with autocast:
        logits, _ = model(inputs)
    losses = F.cross_entropy(
        logits.float().flatten(0, 1), targets.flatten(), reduction='none'
    ).view_as(scored)
    summed = (losses * scored).sum(1)
    return summed / scored.sum(1) if reduction == 'mean' else summed


@torch.no_grad()
def hellaswag_accuracy(
    model, encoding, items, device, autocast=None, rank=0, world_size=1, batch_items=8
):
    """-> (accuracy, its standard error sqrt(p (1 - p) / n), n items) over `items`, the model in eval mode meanwhile.
    Rank r scores the r-th of world_size slices and the counts are all-reduced, so every rank returns the same.
    Every rank runs the same number of forwards (FSDP's collectives need it): a shorter slice is topped up with
    uncounted copies of the first item. `model` is what the caller runs forwards with (GPT, DDP or FSDP2);
    `autocast` the context its forwards run in (None: none)."""
    autocast = autocast or contextlib.nullcontext()
    per_rank = math.ceil(len(items) / world_size)
    mine = items[rank * per_rank : (rank + 1) * per_rank]
    counted = len(mine)
    mine = mine + [items[0]] * (per_rank - counted)
    block_size = getattr(model, 'module', model).config.block_size  # DDP keeps the GPT in .module
    was_training = model.training
    model.eval()
    correct = 0
    for first in range(0, per_rank, batch_items):
        batch = mine[first : first + batch_items]
        rows, starts = zip(*(render(encoding, item, block_size) for item in batch), strict=True)
        losses = ending_losses(model, sum(rows, []), sum(starts, []), device, autocast).view(
            len(batch), 4
        )
        right = losses.argmin(dim=1).cpu() == torch.tensor([item['label'] for item in batch])
        correct += int(right[: max(0, counted - first)].sum())
    model.train(was_training)
    totals = torch.tensor([correct, counted], dtype=torch.float64, device=device)
    if world_size > 1 and dist.is_initialized():
        dist.all_reduce(totals)
    correct, n = totals.tolist()
    accuracy = correct / n
    return accuracy, math.sqrt(accuracy * (1 - accuracy) / n), int(n)


# -----------------------------------------------------------------------------------------------------
# ARC and MMLU, in the cloze formulation small models are measured with: the question as context, each choice's
# text as its continuation, scored by log-likelihood; the choices are never shown. The prompts, the tokenization and
# the two figures are lm-evaluation-harness's (v0.4) tasks arc_easy, arc_challenge and mmlu_continuation (its
# cloze-style MMLU), so that a figure here is the harness's figure for the same model:
#   context  ARC "Question: {question}\nAnswer:"; MMLU "The following are questions (with answers) about
#            {subject}.\n\n" + its k shots "Question: {q}\nAnswer: {answer}\n\n" + "Question: {question}\nAnswer:"
#            (the question stripped; the shots the first k of the subject's dev split, as the harness's first_n)
#   choice   " " + its text; its tokens are those of encode(context + choice) after the len(encode(context)) first
#   acc      the choice with the highest summed log-likelihood wins
#   acc_norm the highest log-likelihood per character of the choice's text wins: the harness's acc_norm divides by
#            len(text) (its docs say "byte length"; its acc_bytes divides by UTF-8 bytes: the same on ASCII text)
# A row longer than block_size + 1 tokens loses context from the left, as the harness's does.
# Chance is the mean over the items of 1 / (their number of choices). MMLU's score is the micro average over all
# 14,042 test items, as the harness's mmlu group (weight_by_size) and Hendrycks et al.'s evaluate.py; the macro
# average over its 57 subjects is printed beside it. Standard errors: sqrt(p (1 - p) / n) over the items.
# The files come from the Hub through downloads.py (the listing's sha256, HF_ENDPOINT, HF_TOKEN, resumable), once
# per machine into the cache folder: allenai/ai2_arc's and cais/mmlu's parquet, as their repos keep them.


@dataclasses.dataclass(frozen=True)
class HubTask:
    repo: str  # the dataset on the Hub
    folder: str  # its folder (a config): the split files are {split}-00000-of-00001.parquet there
    items: int  # in the test split
    title: str  # how the report names it
    harness: str  # lm-evaluation-harness's task of the same protocol
    shots: int = 0  # examples from the dev split before each question (MMLU)
    # the figure published comparisons use: train.py logs it under the task's name
    headline: str = 'acc_norm'


HUB_TASKS = {
    'arc_easy': HubTask('allenai/ai2_arc', 'ARC-Easy', 2376, 'ARC-Easy test', 'arc_easy'),
    'arc_challenge': HubTask(
        'allenai/ai2_arc', 'ARC-Challenge', 1172, 'ARC-Challenge test', 'arc_challenge'
    ),
    'mmlu': HubTask(
        'cais/mmlu', 'all', 14042, 'MMLU test, 0-shot', 'mmlu_continuation', headline='acc'
    ),
    'mmlu_5shot': HubTask(
        'cais/mmlu',
        'all',
        14042,
        'MMLU test, 5-shot',
        'mmlu_continuation, num_fewshot=5',
        shots=5,
        headline='acc',
    ),
}
# config.py validates train.py's eval_tasks against its own copy of the names
assert tuple(HUB_TASKS) == EVAL_TASKS
TASKS = ('hellaswag', *HUB_TASKS)

# Published zero-shot figures, (parameters, accuracy, name), and what each one is: none is our protocol exactly.
PUBLISHED = {
    # Brown et al. 2020, Table H.1, zero-shot, test set. GPT-3 normalised each choice's likelihood by its likelihood
    # after "Answer: " alone (section 2.4: "normalizing by the unconditional probability of each completion" for
    # ARC, OpenBookQA and RACE): neither our acc nor acc_norm.
    'arc_easy': [
        (
            'GPT-3 zero-shot, unconditional norm. (Brown et al. 2020, Table H.1)',
            [
                (125e6, 0.436, 'GPT-3 Small 125M'),
                (350e6, 0.465, 'GPT-3 Medium 350M'),
                (760e6, 0.530, 'GPT-3 Large 760M'),
                (1.3e9, 0.538, 'GPT-3 XL 1.3B'),
                (2.7e9, 0.582, 'GPT-3 2.7B'),
                (6.7e9, 0.602, 'GPT-3 6.7B'),
                (13e9, 0.638, 'GPT-3 13B'),
                (175e9, 0.688, 'GPT-3 175B'),
            ],
        )
    ],
    'arc_challenge': [
        (
            'GPT-3 zero-shot, unconditional norm. (Brown et al. 2020, Table H.1)',
            [
                (125e6, 0.266, 'GPT-3 Small 125M'),
                (350e6, 0.295, 'GPT-3 Medium 350M'),
                (760e6, 0.318, 'GPT-3 Large 760M'),
                (1.3e9, 0.355, 'GPT-3 XL 1.3B'),
                (2.7e9, 0.380, 'GPT-3 2.7B'),
                (6.7e9, 0.414, 'GPT-3 6.7B'),
                (13e9, 0.437, 'GPT-3 13B'),
                (175e9, 0.514, 'GPT-3 175B'),
            ],
        )
    ],
    # Hendrycks et al. 2021 (ICLR), Table 1: GPT-3 few-shot (5 dev examples), the letter formulation (the choices
    # shown as A-D, the answer a letter), where the smaller GPT-3 models score near chance; sizes as that paper gives.
    'mmlu_5shot': [
        (
            'GPT-3 5-shot, letter answers (Hendrycks et al. 2021, Table 1)',
            [
                (2.7e9, 0.259, 'GPT-3 Small 2.7B'),
                (6.7e9, 0.249, 'GPT-3 Medium 6.7B'),
                (13e9, 0.260, 'GPT-3 Large 13B'),
                (175e9, 0.439, 'GPT-3 X-Large 175B'),
            ],
        )
    ],
}
# The FineWeb paper (Penedo et al. 2024, sections 3.1 and 4): 1.71B Llama-style models (GPT-2 tokenizer) trained on
# 350B tokens, scored with lighteval (its own cloze prompts) on benchmarks truncated to 1,000 items; its "ARC" is not
# split into Easy and Challenge: FineWeb 33% MMLU and 46% ARC, FineWeb-Edu 37% and 57%.
FINEWEB = {'arc_easy': (0.46, 0.57), 'arc_challenge': (0.46, 0.57), 'mmlu': (0.33, 0.37)}
FINEWEB_SOURCE = "Penedo et al. 2024, section 4: lighteval's cloze, benchmarks cut to 1,000 items"


def hub_task_path(repo, folder, split, cache=None):
    return os.path.join(
        cache or cache_folder(), repo.replace('/', '--'), folder, f'{split}.parquet'
    )


def download_hub_split(repo, folder, split, cache=None, network=None):
    """The path of a split's parquet file of a Hub dataset (the one file in `folder` whose name starts with
    '{split}-'), downloaded into the cache first if missing: listed through the Hub's API, checked against the
    listing's sha256 and renamed into place only then (downloads.download), so a file under its name is whole."""
    dest = hub_task_path(repo, folder, split, cache)
    if os.path.exists(dest):
        return dest
    hub = downloads.Hub(network)
    sha, listed = hub.files(repo, 'main', folder, '.parquet')
    mine = [f for f in listed if os.path.basename(f['path']).startswith(f'{split}-')]
    if len(mine) != 1:
        raise DataError(
            f"{repo}/{folder} at {sha[:12]} holds {len(mine)} parquet files of its {split} split, not one: the "
            f"dataset has changed its layout; check --endpoint or HF_ENDPOINT, or report it"
        )
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    return downloads.download(hub, hub.url('datasets', repo, sha, mine[0]['path']), dest, mine[0])


def parquet_rows(path, columns):
    """The rows of a parquet file as dicts of `columns`; a file that is not such a parquet is one DataError line."""
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path, columns=columns).to_pylist()
    except Exception as e:  # pyarrow's own errors (ArrowInvalid, ...) or a missing column
        raise DataError(
            f"{path}: not a parquet file with the columns {', '.join(columns)} ({type(e).__name__}: {e}): "
            f"delete it and rerun to download it again"
        ) from None


def arc_items(path):
    """[{'context', 'choices', 'label', 'subject'}] from ai2_arc's parquet (id, question, choices {text, label},
    answerKey: 'A'-'E' or '1'-'5', an index into choices.label); a row that is not such an item is one line."""
    items = []
    for number, row in enumerate(parquet_rows(path, ['question', 'choices', 'answerKey']), 1):
        try:
            texts, labels = row['choices']['text'], row['choices']['label']
            if not (isinstance(row['question'], str) and len(texts) == len(labels) >= 2):
                raise ValueError('not a question with 2 or more labelled choices')
            label = labels.index(row['answerKey'])
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(
                f"{path}, row {number}: not an ARC item ({type(e).__name__}: {e})"
            ) from None
        items.append(
            {'context': f"Question: {row['question']}\nAnswer:", 'choices': texts, 'label': label}
        )
    return items


def mmlu_items(test_path, dev_path, shots):
    """MMLU's test items (question, subject, choices, answer 0..3) with `shots` examples of their subject from the
    dev split before each, the harness's mmlu_continuation prompt; a row that is not such an item is one line."""
    columns = ['question', 'subject', 'choices', 'answer']

    def checked(path):
        rows = parquet_rows(path, columns)
        for number, row in enumerate(rows, 1):
            if not (
                isinstance(row['question'], str)
                and isinstance(row['subject'], str)
                and isinstance(row['choices'], list)
                and len(row['choices']) >= 2
                and row['answer'] in range(len(row['choices']))
            ):
                raise DataError(
                    f"{path}, row {number}: not an MMLU item (a question, subject, choices and answer)"
                )
        return rows

    def question(row):
        return f"Question: {row['question'].strip()}\nAnswer:"

    examples = collections.defaultdict(list)  # subject -> its dev rows, in the file's order
    for row in checked(dev_path) if shots else ():
        examples[row['subject']].append(row)
    items = []
    for row in checked(test_path):
        subject, shown = row['subject'], examples[row['subject']][:shots]
        if len(shown) < shots:
            raise DataError(
                f"{dev_path} has {len(shown)} {subject} examples, fewer than the {shots} shots asked for"
            )
        context = (
            f"The following are questions (with answers) about {subject.replace('_', ' ')}.\n\n"
            + ''.join(f"{question(e)} {e['choices'][e['answer']]}\n\n" for e in shown)
            + question(row)
        )
        items.append(
            {
                'context': context,
                'choices': row['choices'],
                'label': row['answer'],
                'subject': subject,
            }
        )
    return items


def task_items(task, cache=None, world_size=1, network=None):
    """A Hub task's items on every rank, its files downloaded once per machine (network: downloads.Network)."""
    spec = HUB_TASKS[task]
    splits = ['test'] + (['dev'] if spec.shots else [])
    paths = [hub_task_path(spec.repo, spec.folder, split, cache) for split in splits]
    downloaded_once_per_machine(
        lambda: [
            download_hub_split(spec.repo, spec.folder, split, cache, network) for split in splits
        ],
        world_size,
    )
    if spec.repo == 'allenai/ai2_arc':
        return arc_items(paths[0])
    return mmlu_items(paths[0], paths[-1], spec.shots)


def render_choices(encoding, item, block_size):
    """-> ([a token row per choice], [index of each row's first choice token]), tokenized as the harness does:
    encode(context + ' ' + choice), the choice's tokens being those after len(encode(context)); the rows cut to
    their last block_size + 1 tokens (a forward then sees block_size)."""
    context = len(encoding.encode_ordinary(item['context']))
    rows, starts = [], []
    for choice in item['choices']:
        row = encoding.encode_ordinary(item['context'] + ' ' + choice)
        cut = max(0, len(row) - block_size - 1)
        rows.append(row[cut:])
        starts.append(max(1, context - cut))
    return rows, starts


@torch.no_grad()
def choice_logprobs(model, encoding, items, device, autocast=None, batch_items=8):
    """[[each choice's summed log-likelihood] per item], batch_items items per forward."""
    autocast = autocast or contextlib.nullcontext()
    block_size = getattr(model, 'module', model).config.block_size
    scores = []
    for first in range(0, len(items), batch_items):
        batch = items[first : first + batch_items]
        rows, starts = zip(
            *(render_choices(encoding, item, block_size) for item in batch), strict=True
        )
        losses = ending_losses(
            model, sum(rows, []), sum(starts, []), device, autocast, reduction='sum'
        )
        flat = (-losses).tolist()
        for item in batch:
            scores.append(flat[: len(item['choices'])])
            flat = flat[len(item['choices']) :]
    return scores


def predictions(item, logprobs):
    """(acc's choice, acc_norm's choice): the first highest log-likelihood (as numpy's argmax), and the first highest
    per character of the choice's text (an empty choice is never chosen: the harness divides by 0, -inf)."""
    choices = range(len(logprobs))
    per_char = [
        lp / len(text) if text else -math.inf
        for lp, text in zip(logprobs, item['choices'], strict=True)
    ]
    return max(choices, key=logprobs.__getitem__), max(choices, key=per_char.__getitem__)


@torch.no_grad()
def task_accuracy(
    model, encoding, items, device, autocast=None, rank=0, world_size=1, batch_items=8
):
    """{'items', 'acc', 'acc_stderr', 'acc_norm', 'acc_norm_stderr', 'chance'} over `items`, plus the macro averages
    'acc_macro' and 'acc_norm_macro' over the subjects when they have several (MMLU). Sliced over ranks as
    hellaswag_accuracy is (the same number of forwards on every rank, the counts all-reduced per subject)."""
    per_rank = math.ceil(len(items) / world_size)
    mine = items[rank * per_rank : (rank + 1) * per_rank]
    counted = len(mine)
    mine = mine + [items[0]] * (per_rank - counted)
    subjects = sorted({item.get('subject', '') for item in items})
    # per subject: items, right, right by norm, chance
    totals = torch.zeros(len(subjects), 4, dtype=torch.float64)
    was_training = model.training
    model.eval()
    logprobs = choice_logprobs(model, encoding, mine, device, autocast, batch_items)
    model.train(was_training)
    for item, scores in zip(mine[:counted], logprobs[:counted], strict=True):
        pred, pred_norm = predictions(item, scores)
        row = totals[subjects.index(item.get('subject', ''))]
        row += torch.tensor(
            [1.0, pred == item['label'], pred_norm == item['label'], 1 / len(item['choices'])]
        )
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


def metrics_entry(task, score):
    """The metrics.jsonl keys of a task's score: its headline figure under the task's name (as 'hellaswag'), with
    its standard error and items, and both figures by name."""
    headline = HUB_TASKS[task].headline
    return {
        task: score[headline],
        f'{task}_stderr': score[f'{headline}_stderr'],
        f'{task}_items': score['items'],
        f'{task}_acc': score['acc'],
        f'{task}_acc_norm': score['acc_norm'],
    }


def tasks_for_training(tokenizer, names, limit, cluster):
    """train.py's eval_tasks: {task: its first `limit` items (0: all)}, downloaded before the first step."""
    if tokenizer is None:
        raise ConfigError(
            'eval_tasks_every needs text: a data folder made by prepare.py, not synthetic tokens'
        )
    return {
        task: task_items(task, world_size=cluster.world_size)[: limit or None]
        for task in names.split(',')
        if task
    }


def score_tasks(model, encoding, tasks, autocast, cluster):
    """(metrics.jsonl entry, log line) of the tasks {task: items} scored during training."""
    entry, parts = {}, []
    for task, items in tasks.items():
        score = task_accuracy(
            model, encoding, items, cluster.device, autocast, cluster.rank, cluster.world_size
        )
        entry.update(metrics_entry(task, score))
        parts.append(
            f"{task} acc {score['acc']:.2%}, acc_norm {score['acc_norm']:.2%} +- {score['acc_norm_stderr']:.2%} "
            f"(chance {score['chance']:.0%})"
        )
    return (
        entry,
        f"over {', '.join(f'{len(items):,}' for items in tasks.values())} items: "
        + '; '.join(parts),
    )


# -----------------------------------------------------------------------------------------------------
# During training: train.py's hooks. Its setup calls items_for_training once; its loop calls evaluate_hellaswag
# and evaluate_tasks at the steps hellaswag_every and eval_tasks_every name, each into metrics.jsonl and the log.


def items_for_training(run):
    """run.hellaswag and run.eval_tasks: the items that hellaswag_every and eval_tasks_every score (the first
    hellaswag_items and eval_tasks_items of them; 0: all), downloaded in setup, before the first step."""
    train, cluster = run.train, run.cluster
    if train.hellaswag_every:
        if run.tokenizer is None:
            raise ConfigError(
                'hellaswag_every needs text: a data folder made by prepare.py, not synthetic tokens'
            )
        run.hellaswag = hellaswag_items(world_size=cluster.world_size)[
            : train.hellaswag_items or None
        ]
    if train.eval_tasks_every:
        run.eval_tasks = tasks_for_training(
            run.tokenizer, train.eval_tasks, train.eval_tasks_items, cluster
        )


def evaluate_hellaswag(run):
    """HellaSwag accuracy, into metrics.jsonl and the log. Eager: rows of every length, no recompiles."""
    cluster, state = run.cluster, run.state
    with torch.compiler.set_stance('force_eager'):
        accuracy, stderr, items = hellaswag_accuracy(
            run.raw_model,
            run.tokenizer,
            run.hellaswag,
            cluster.device,
            run.autocast,
            cluster.rank,
            cluster.world_size,
        )
    entry = {'hellaswag': accuracy, 'hellaswag_stderr': stderr, 'hellaswag_items': items}
    run.metrics.record({'step': state.step, 'tokens': state.tokens_seen, **entry})
    log(
        cluster,
        f"step {state.step}: HellaSwag {accuracy:.2%} +- {stderr:.2%} over {items:,} items (chance: 25%)",
    )


def evaluate_tasks(run):
    """ARC and MMLU (the key eval_tasks), into metrics.jsonl and the log. Eager, as HellaSwag."""
    cluster, state = run.cluster, run.state
    with torch.compiler.set_stance('force_eager'):
        entry, line = score_tasks(
            run.raw_model, run.tokenizer, run.eval_tasks, run.autocast, cluster
        )
    run.metrics.record({'step': state.step, 'tokens': state.tokens_seen, **entry})
    log(cluster, f"step {state.step}: {line}")


# -----------------------------------------------------------------------------------------------------
# The command.


def nearest(figures, params):
    """The published figure whose model size is nearest to `params`, on a log scale."""
    return min(figures, key=lambda figure: abs(math.log(figure[0] / params)))


def join_ranks(device):
    """(rank, world_size, device): under torchrun one process per GPU (NCCL), or per CPU process (gloo)."""
    rank, world_size = int(os.environ.get('RANK', 0)), int(os.environ.get('WORLD_SIZE', 1))
    if world_size > 1:
        if device.type == 'cuda':
            device = torch.device('cuda', int(os.environ.get('LOCAL_RANK', 0)))
            torch.cuda.set_device(device)
        dist.init_process_group('nccl' if device.type == 'cuda' else 'gloo')
    return rank, world_size, device


def report_hellaswag(accuracy, stderr, n, seconds, params, path, world_size, device):
    print(
        f"HellaSwag validation, {n:,} items (llm.c's completion-style acc_norm), {path}: "
        f"{accuracy:.2%} ± {stderr:.2%} (standard error), {n / seconds:,.0f} items/s on {world_size} x {device}"
    )
    if n != HELLASWAG_ITEMS:
        print(
            f"  not the whole validation set ({HELLASWAG_ITEMS:,} items): a figure of its own, not the published kind"
        )
    print(
        f"  {f'this model, {params:,} parameters':<34} {accuracy:6.1%}\n  {'chance (1 in 4)':<34} {0.25:6.1%}"
    )
    for figures, source in (
        (GPT2, "OpenAI's checkpoint, llm.c's scoring"),
        (GPT3, 'Brown et al. 2020, Table H.1, zero-shot'),
    ):
        _, published, name = nearest(figures, params)
        print(f"  {name:<34} {published:6.1%}   ({source})")


def report_task(task, score, seconds, params, path, world_size, device):
    spec, n = HUB_TASKS[task], score['items']
    print(
        f"{spec.title}, {n:,} items (lm-evaluation-harness's {spec.harness}, cloze), {path}: "
        f"acc {score['acc']:.2%} ± {score['acc_stderr']:.2%}, acc_norm {score['acc_norm']:.2%} ± "
        f"{score['acc_norm_stderr']:.2%} (standard errors), {n / seconds:,.0f} items/s on {world_size} x {device}"
    )
    if n != spec.items:
        print(
            f"  not the whole test split ({spec.items:,} items): a figure of its own, not the published kind"
        )
    if 'acc_macro' in score:
        print(
            f"  acc and acc_norm are over all its items (micro, as the harness's mmlu group); over its subjects "
            f"(macro): {score['acc_macro']:.2%} and {score['acc_norm_macro']:.2%}"
        )
    print(
        f"  {f'this model, {params:,} parameters':<34} {score['acc']:6.1%} acc, {score['acc_norm']:.1%} acc_norm\n"
        f"  {'chance (1 in its choices)':<34} {score['chance']:6.1%}"
    )
    for source, figures in PUBLISHED.get(task, []):
        _, published, name = nearest(figures, params)
        print(f"  {name:<34} {published:6.1%}   ({source})")
    for dataset, published in zip(('FineWeb', 'FineWeb-Edu'), FINEWEB.get(task, ()), strict=False):
        unsplit = '; its ARC is Easy and Challenge together' if task.startswith('arc') else ''
        print(
            f"  {f'{dataset} 1.71B, 350B tokens':<34} {published:6.1%}   ({FINEWEB_SOURCE}{unsplit})"
        )


@processes.cli
def main(argv):
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n')[1], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        'checkpoint', help="a run's out_dir (latest checkpoint) or a ckpt/step_* folder"
    )
    parser.add_argument(
        'task', choices=[*TASKS, 'all'], help='one task, or all: ' + ', '.join(TASKS)
    )
    parser.add_argument(
        '--url',
        help='where hellaswag_val.jsonl is downloaded from (default: $HELLASWAG_URL, else '
        "rowanz/hellaswag's file on GitHub)",
    )
    parser.add_argument(
        '--endpoint',
        default='',
        help='the Hub ARC and MMLU come from (default: $HF_ENDPOINT, else huggingface.co)',
    )
    parser.add_argument(
        '--cache', default=cache_folder(), help='the folder they are kept in (default: %(default)s)'
    )
    parser.add_argument(
        '--limit', type=int, default=0, help='score only the first N items of each task (0: all)'
    )
    parser.add_argument(
        '--batch', type=int, default=8, help='items per forward (one row per choice)'
    )
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    args = parser.parse_args(argv)
    if args.limit < 0 or args.batch < 1:
        raise ConfigError(
            f"--limit must be 0 or more and --batch 1 or more, got {args.limit} and {args.batch}"
        )
    tasks = TASKS if args.task == 'all' else (args.task,)
    results, model = {}, None
    try:
        rank, world_size, device = join_ranks(checkpoint.device_of(args.device))
        path = checkpoint.find(args.checkpoint)
        model, train_config = checkpoint.load_model(path, device)
        params = sum(p.numel() for p in model.parameters())
        if train_config['data'] == 'synthetic':
            raise ConfigError(
                f"{path} was trained on synthetic tokens: it has no tokenizer to read the questions with"
            )
        encoding = data.load_tokenizer(train_config['data'])
        autocast = (
            torch.autocast('cuda', dtype=torch.bfloat16)
            if device.type == 'cuda'
            else contextlib.nullcontext()
        )
        for task in tasks:
            if task == 'hellaswag':
                items = hellaswag_items(args.url, args.cache, world_size)[: args.limit or None]
                started = time.perf_counter()
                score = hellaswag_accuracy(
                    model, encoding, items, device, autocast, rank, world_size, args.batch
                )
            else:
                network = downloads.Network(endpoint=args.endpoint)
                items = task_items(task, args.cache, world_size, network)[: args.limit or None]
                started = time.perf_counter()
                score = task_accuracy(
                    model, encoding, items, device, autocast, rank, world_size, args.batch
                )
            results[task] = score, time.perf_counter() - started
    finally:
        model = None  # before the process group goes (processes.leave_process_group)
        processes.leave_process_group()
    if rank == 0:
        for task, (score, seconds) in results.items():
            if task == 'hellaswag':
                report_hellaswag(*score, seconds, params, path, world_size, device)
            else:
                report_task(task, score, seconds, params, path, world_size, device)
    return 0


if __name__ == '__main__':
    sys.exit(main())
