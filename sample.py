"""
sample.py: text from a checkpoint that train.py wrote.

    python sample.py out/pystdlib_cpu                                  # the latest checkpoint of that run
    python sample.py out/h200_1b3/ckpt/step_0049592 --prompt "The mitochondria" --temperature 0.7 --top_k 50
    python sample.py out/pystdlib_cpu --prompt "def " --tokens 300 --num_samples 3
    python sample.py out/fim --prefix $'def area(r):\n    ' --suffix $'\n    return a\n'   # fill in the middle

The checkpoint carries the model and data config; the tokenizer is the one prepare.py saved in the data folder,
so the text is decoded by the very tokenizer the model was trained on. Any run's weights load in one process,
whatever parallel mode and world size wrote them (checkpoint.load_model).

--prefix and --suffix ask a model trained with objective='fim' for the middle between them: the prompt is PSM,
<|fim_prefix|> prefix <|fim_suffix|> suffix <|fim_middle|>, and the middle it writes ends at the end-of-text token
(or after --tokens), printed alone. The model split documents at token boundaries in training, so a prefix or
suffix that ends or starts inside what would be one token (half a word) is harder for it than one that does not.

train.py's samples during training (sample_every, sample_tokens) come from sample_text(run).
"""

import argparse
import sys
from contextlib import nullcontext

import torch

from ledgergpt import checkpoint, data, objectives
from ledgergpt.config import ConfigError, cli, sharded


def fim_prompt(eot_id, ids, prefix, suffix):
    """The PSM prompt (token ids) for the middle between prefix and suffix (token ids): a fresh document, as in
    training, ids holding the data folder's FIM tokens by name (objectives.FIM_TOKENS)."""
    pre, suf, mid = (ids[name] for name in objectives.FIM_TOKENS)
    return [eot_id, pre, *prefix, suf, *suffix, mid]


def generate_until(model, idx, max_new_tokens, stop_id, temperature, top_k):
    """model.generate one token at a time until every row has written stop_id, or max_new_tokens; each row is
    returned up to (not including) its first stop_id. Without a KV cache every token reruns the context anyway,
    so stopping early costs nothing."""
    start, stopped = idx.size(1), torch.zeros(len(idx), dtype=torch.bool, device=idx.device)
    for _ in range(max_new_tokens):
        idx = model.generate(idx, 1, temperature=temperature, top_k=top_k)
        stopped |= idx[:, -1] == stop_id
        if stopped.all():
            break
    rows = idx[:, start:].tolist()
    return [row[: row.index(stop_id)] if stop_id in row else row for row in rows]


@torch.no_grad()
def sample_text(run):
    """train.py's samples: a short text from the end-of-text token (a document start), temperature 0.8, top-k 200
    (nanoGPT's defaults). Under FSDP every rank must run the forwards (they gather weights together). Eager mode:
    generation changes the sequence length every token, which would recompile a compiled model each time."""
    cluster, train = run.cluster, run.train
    if not (sharded(train.parallel, cluster.world_size) or cluster.is_master):
        return None
    devices = [cluster.device] if cluster.device.type == 'cuda' else []
    with (
        torch.random.fork_rng(devices=devices),
        torch.compiler.set_stance('force_eager'),
        run.autocast,
    ):
        # the same on every rank, so FSDP ranks stay in step
        torch.manual_seed(train.seed + run.state.step)
        start = torch.full((1, 1), run.meta['eot_id'], dtype=torch.long, device=cluster.device)
        run.raw_model.eval()
        tokens = run.raw_model.generate(start, train.sample_tokens, temperature=0.8, top_k=200)
        run.raw_model.train()
    return run.tokenizer.decode(tokens[0, 1:].tolist())


@cli
def main(argv):
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n')[1], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        'checkpoint', help="a run's out_dir (latest checkpoint) or a ckpt/step_* folder"
    )
    parser.add_argument(
        '--prompt', default='', help='text to continue (default: start a new document)'
    )
    parser.add_argument(
        '--prefix', default=None, help='fill in the middle (objective=fim): the text before the gap'
    )
    parser.add_argument(
        '--suffix', default=None, help='fill in the middle (objective=fim): the text after the gap'
    )
    parser.add_argument('--tokens', type=int, default=200, help='new tokens per sample')
    parser.add_argument('--temperature', type=float, default=0.8, help='0 is greedy')
    parser.add_argument(
        '--top_k', type=int, default=200, help='sample among the k most likely tokens (0: all)'
    )
    parser.add_argument('--num_samples', type=int, default=1)
    parser.add_argument('--seed', type=int, default=1337)
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    args = parser.parse_args(argv)
    for name, value, least in (
        ('--tokens', args.tokens, 1),
        ('--num_samples', args.num_samples, 1),
        ('--temperature', args.temperature, 0),
        ('--top_k', args.top_k, 0),
    ):
        if value < least:  # a negative temperature would sample the least likely tokens first
            raise ConfigError(f"{name} {value}: must be at least {least}")
    infill = args.prefix is not None or args.suffix is not None
    if infill and args.prompt:
        raise ConfigError(
            "--prompt continues a text, --prefix/--suffix fill in the middle: give one or the other"
        )
    device = checkpoint.device_of(args.device)
    path = checkpoint.find(args.checkpoint)
    model, train_config = checkpoint.load_model(path, device)
    if train_config['data'] == 'synthetic':
        raise ConfigError(f"{path} was trained on synthetic tokens: there is no text to sample")
    tokenizer = data.load_tokenizer(train_config['data'])
    eot_id = tokenizer.eot_token
    if infill:
        ids = objectives.special_ids(
            data.load_meta(
                data.tokenizer_folder(train_config['data'])
            ),  # a mixture's folders share the tokenizer
            train_config['data'],
            objectives.FIM_TOKENS,
            'sample.py --prefix/--suffix (fill in the middle)',
        )
        prompt = fim_prompt(
            eot_id,
            ids,
            tokenizer.encode_ordinary(args.prefix or ''),
            tokenizer.encode_ordinary(args.suffix or ''),
        )
        if len(prompt) >= model.config.block_size:
            raise ConfigError(
                f"--prefix and --suffix are {len(prompt)} tokens with the FIM tokens: the model sees "
                f"{model.config.block_size}; shorten them"
            )
    else:
        # Every training document starts with the end-of-text token, so a prompt continues a fresh document.
        prompt = [eot_id] + tokenizer.encode(args.prompt, allowed_special='all')
    start = torch.tensor([prompt] * args.num_samples, dtype=torch.long, device=device)
    torch.manual_seed(args.seed)
    autocast = (
        torch.autocast('cuda', dtype=torch.bfloat16) if device.type == 'cuda' else nullcontext()
    )
    with torch.no_grad(), autocast:
        if infill:
            rows = generate_until(
                model, start, args.tokens, eot_id, args.temperature, args.top_k or None
            )
        else:
            rows = model.generate(
                start, args.tokens, temperature=args.temperature, top_k=args.top_k or None
            )[:, 1:].tolist()
    print(
        f"# {path}: {args.num_samples} {'middle' if infill else 'sample'}(s), {'up to ' * infill}{args.tokens} "
        f"tokens, temperature {args.temperature}, top-k {args.top_k or 'all'}",
        file=sys.stderr,
    )
    for row in rows:
        # the model's vocab is padded to a multiple of 128: ids past the tokenizer's are never trained targets,
        # and are dropped here if sampled
        print(tokenizer.decode([t for t in row if t < tokenizer.n_vocab]))
        print('-' * 80)
    return 0


if __name__ == '__main__':
    sys.exit(main())
