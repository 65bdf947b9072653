"""
eval.py: a checkpoint's HellaSwag accuracy, beside the published figures of GPT-2 and GPT-3 at the nearest sizes.

    python eval.py out/pystdlib_cpu hellaswag                      # the run's latest checkpoint
    torchrun --nproc_per_node=8 eval.py out/h100x8_1b3 hellaswag   # each rank scores a slice of the items
    python eval.py out/pystdlib_cpu hellaswag --limit 500          # the first 500 items (a quick look on a CPU)

HellaSwag (Zellers et al. 2019) gives a context and four endings, one of them right; its validation set has
10,042 items. We score it as llm.c does (dev/data/hellaswag.py), so the GPT-2 figures it measured that way compare
with ours: each ending follows the context (" " + ending, no end-of-text token in front), and the one with the
lowest mean loss per ending token wins ("acc_norm", completion style). Chance is 25%; a small model trained on
code, like the CPU default, scores about that.

The jsonl is downloaded once into the cache folder (~/.cache/ledgergpt, or $XDG_CACHE_HOME/ledgergpt) from
rowanz/hellaswag on GitHub, the URL llm.c uses, through downloads.py's resumable download, and checked against the
git blob id of the published file; HELLASWAG_URL (or --url) points elsewhere, a mirror (there only the size the
server announces is checked).

train.py can score during training: items = hellaswag_items(world_size=...) once, then hellaswag_accuracy(model,
encoding, items, device, autocast, rank, world_size) at each evaluation.
"""

import argparse
import contextlib
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import checkpoint
import data
import downloads
import ledger
from config import ConfigError, DataError, UserError, cli

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
    return os.path.dirname(ledger.cache_path())  # $XDG_CACHE_HOME/ledgergpt, beside the ledger's device probes


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
        raise DataError(f"{url}: the server does not say the file's size (no Content-Length): use another URL")
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


def hellaswag_items(url=None, folder=None, world_size=1):
    """The items on every rank: one writer per machine (local rank 0 downloads into this machine's cache while the
    others wait at the all_gather), and a failure is one line on every rank."""
    error = ''
    if int(os.environ.get('LOCAL_RANK', 0)) == 0:
        try:
            download_hellaswag(url, folder)
        except UserError as e:
            error = str(e)
    if world_size > 1:
        errors = [None] * world_size
        dist.all_gather_object(errors, error)
        error = next((e for e in errors if e), '')
    if error:
        raise DataError(error)
    return load_items(hellaswag_path(folder))


# -----------------------------------------------------------------------------------------------------
# Scoring. A row is context + one ending; its score is the mean cross-entropy of the ending's tokens, each
# predicted from everything before it. Rows longer than block_size lose context from the left.


def render(encoding, item, block_size):
    """-> ([4 token rows], [4 indices of the first ending token in each row])."""
    context = encoding.encode_ordinary(item['ctx'])
    rows, starts = [], []
    for ending in item['endings']:
        row = context + encoding.encode_ordinary(' ' + ending)  # ' ': the ending continues the sentence
        cut = max(0, len(row) - block_size)
        rows.append(row[cut:])
        starts.append(max(1, len(context) - cut))  # the first token has nothing before it to be predicted from
    return rows, starts


def ending_losses(model, rows, starts, device, autocast):
    """Mean loss over the ending tokens of each row, batched: rows padded on the right (the causal mask keeps the
    padding from reaching earlier positions, and the padded positions are not counted)."""
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
    losses = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction='none').view_as(scored)
    return (losses * scored).sum(1) / scored.sum(1)


@torch.no_grad()
def hellaswag_accuracy(model, encoding, items, device, autocast=None, rank=0, world_size=1, batch_items=8):
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
        losses = ending_losses(model, sum(rows, []), sum(starts, []), device, autocast).view(len(batch), 4)
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


@cli
def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[1], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument('checkpoint', help="a run's out_dir (latest checkpoint) or a ckpt/step_* folder")
    parser.add_argument('task', choices=['hellaswag'])
    parser.add_argument(
        '--url',
        help='where hellaswag_val.jsonl is downloaded from (default: $HELLASWAG_URL, else '
        "rowanz/hellaswag's file on GitHub)",
    )
    parser.add_argument('--cache', default=cache_folder(), help='the folder it is kept in (default: %(default)s)')
    parser.add_argument('--limit', type=int, default=0, help='score only the first N items (0: all 10,042)')
    parser.add_argument('--batch', type=int, default=8, help='items per forward (4 rows each)')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    args = parser.parse_args(argv)
    if args.limit < 0 or args.batch < 1:
        raise ConfigError(f"--limit must be 0 or more and --batch 1 or more, got {args.limit} and {args.batch}")
    try:
        rank, world_size, device = join_ranks(checkpoint.device_of(args.device))
        path = checkpoint.find(args.checkpoint)
        model, train_config = checkpoint.load_model(path, device)
        if train_config['data'] == 'synthetic':
            raise ConfigError(f"{path} was trained on synthetic tokens: it has no tokenizer to read HellaSwag with")
        encoding = data.load_tokenizer(train_config['data'])
        items = hellaswag_items(args.url, args.cache, world_size)[: args.limit or None]
        autocast = torch.autocast('cuda', dtype=torch.bfloat16) if device.type == 'cuda' else contextlib.nullcontext()
        started = time.perf_counter()
        accuracy, stderr, n = hellaswag_accuracy(model, encoding, items, device, autocast, rank, world_size, args.batch)
        seconds = time.perf_counter() - started
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(
            f"HellaSwag validation, {n:,} items (llm.c's completion-style acc_norm), {path}: "
            f"{accuracy:.2%} ± {stderr:.2%} (standard error), {n / seconds:,.0f} items/s on {world_size} x {device}"
        )
        if n != HELLASWAG_ITEMS:
            print(
                f"  not the whole validation set ({HELLASWAG_ITEMS:,} items): a figure of its own, not the "
                f"published kind"
            )
        print(f"  {f'this model, {params:,} parameters':<34} {accuracy:6.1%}\n  {'chance (1 in 4)':<34} {0.25:6.1%}")
        for figures, source in (
            (GPT2, "OpenAI's checkpoint, llm.c's scoring"),
            (GPT3, 'Brown et al. 2020, Table H.1, zero-shot'),
        ):
            _, published, name = nearest(figures, params)
            print(f"  {name:<34} {published:6.1%}   ({source})")
    return 0


if __name__ == '__main__':
    sys.exit(main())
