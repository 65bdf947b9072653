"""
sample.py: text from a checkpoint that train.py wrote.

    python sample.py out/pystdlib_cpu                          # the latest checkpoint of that run
    python sample.py out/h200_1b3/ckpt/step_0049592 --prompt "The cell" --temperature 0.7 --top_k 50
    python sample.py out/pystdlib_cpu --prompt "def " --tokens 300 --num_samples 3
    python sample.py out/fim --prefix $'def area(r):\n    ' --suffix $'\n    return a\n'   # FIM

--prefix and --suffix ask a model trained with objective='fim' for the middle between them
(docs/objectives.md): the prompt is PSM, <|fim_prefix|> prefix <|fim_suffix|> suffix <|fim_middle|>,
and the middle ends at the end-of-text token (or after --tokens). A prefix or suffix that cuts what
would be one token (half a word) is harder for it: training split documents at token boundaries.
"""

import argparse
import math
import sys

import torch

from ledgergpt import checkpoint, data, objectives
from ledgergpt.config import ConfigError, cli, sharded


def generate_until(model, idx, max_new_tokens, stop_id, temperature, top_k):
    """model.generate one token at a time until every row has written stop_id, or max_new_tokens;
    each row up to (not including) its first stop_id. Without a KV cache every token reruns the
    context anyway, so stopping early costs nothing."""
    start, stopped = idx.size(1), torch.zeros(len(idx), dtype=torch.bool, device=idx.device)
    for _ in range(max_new_tokens):
        idx = model.generate(idx, 1, temperature=temperature, top_k=top_k)
        stopped |= idx[:, -1] == stop_id
        if stopped.all():
            break
    rows = idx[:, start:].tolist()
    return [row[: row.index(stop_id)] if stop_id in row else row for row in rows]


def sample_text(run):
    """train.py's samples: a short text from the end-of-text token (a document start), temperature
    0.8, top-k 200 (nanoGPT's defaults). Under FSDP every rank runs the forwards (they gather the
    weights together). Eager: generation changes the sequence length every token (a recompile)."""
    cluster, train = run.cluster, run.train
    if not (sharded(train.parallel, cluster.world_size) or cluster.is_master):
        return None
    rng = torch.random.fork_rng([cluster.device] if cluster.device.type == 'cuda' else [])
    with rng, torch.compiler.set_stance('force_eager'), run.autocast:
        torch.manual_seed(train.seed + run.state.step)  # the same on every rank: FSDP stays in step
        start = torch.full((1, 1), run.meta['eot_id'], dtype=torch.long, device=cluster.device)
        run.raw_model.eval()
        tokens = run.raw_model.generate(start, train.sample_tokens, temperature=0.8, top_k=200)
        run.raw_model.train()
    return run.tokenizer.decode(tokens[0, 1:].tolist())


def parse(argv):
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n')[1], formatter_class=argparse.RawTextHelpFormatter
    )
    add = parser.add_argument
    add('checkpoint', help="a run's out_dir (latest checkpoint) or a ckpt/step_* folder")
    add('--prompt', default='', help='text to continue (default: start a new document)')
    add('--prefix', help='fill in the middle (objective=fim): the text before the gap')
    add('--suffix', help='fill in the middle (objective=fim): the text after the gap')
    add('--tokens', type=int, default=200, help='new tokens per sample')
    add('--temperature', type=float, default=0.8, help='0 is greedy')
    add('--top_k', type=int, default=200, help='sample among the k most likely tokens (0: all)')
    add('--num_samples', type=int, default=1)
    add('--seed', type=int, default=1337)
    add('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    args = parser.parse_args(argv)
    if not math.isfinite(args.temperature):  # nan or inf: no distribution to sample from
        raise ConfigError(f"--temperature {args.temperature}: must be a finite number")
    for name, least in (('tokens', 1), ('num_samples', 1), ('temperature', 0), ('top_k', 0)):
        # a negative temperature would sample the least likely tokens first
        if getattr(args, name) < least:
            raise ConfigError(f"--{name} {getattr(args, name)}: must be at least {least}")
    if args.prompt and (args.prefix is not None or args.suffix is not None):
        raise ConfigError(
            "--prompt continues a text, --prefix/--suffix fill in the middle: give one or the other"
        )
    return args


def infill_prompt(args, path, train_config, tokenizer, block_size):
    """The FIM prompt for --prefix/--suffix, and a warning where the model never learned it."""
    # a mixture's folders share the tokenizer
    meta = data.load_meta(data.tokenizer_folder(train_config['data']))
    user = 'sample.py --prefix/--suffix (fill in the middle)'
    ids = objectives.special_ids(meta, train_config['data'], objectives.FIM_TOKENS, user)
    prefix, suffix = (tokenizer.encode_ordinary(text or '') for text in (args.prefix, args.suffix))
    pre, suf, mid = (ids[name] for name in objectives.FIM_TOKENS)
    # PSM, as a fresh document in training
    prompt = [tokenizer.eot_token, pre, *prefix, suf, *suffix, mid]
    if len(prompt) >= block_size:
        raise ConfigError(
            f"--prefix and --suffix are {len(prompt)} tokens with the FIM tokens: the model sees "
            f"{block_size}; shorten them"
        )
    objective = train_config.get('objective', 'clm')
    if objective != 'fim':
        print(
            f"warning: {path} was trained with objective={objective!r}, not 'fim': it never "
            f"learned to fill in the middle, so its text may ignore the suffix",
            file=sys.stderr,
        )
    return prompt


@cli
def main(argv):
    args = parse(argv)
    infill = args.prefix is not None or args.suffix is not None
    device = checkpoint.device_of(args.device)
    path = checkpoint.find(args.checkpoint)
    model, train_config = checkpoint.load_model(path, device)
    if train_config['data'] == 'synthetic':
        raise ConfigError(f"{path} was trained on synthetic tokens: there is no text to sample")
    tokenizer = data.load_tokenizer(train_config['data'])
    if infill:
        prompt = infill_prompt(args, path, train_config, tokenizer, model.config.block_size)
    else:  # every training document starts with end-of-text: a prompt continues a fresh one
        prompt = [tokenizer.eot_token] + tokenizer.encode(args.prompt, allowed_special='all')
    start = torch.tensor([prompt] * args.num_samples, dtype=torch.long, device=device)
    torch.manual_seed(args.seed)
    autocast = torch.autocast(device.type, torch.bfloat16, enabled=device.type == 'cuda')
    top_k = args.top_k or None
    with autocast:  # model.generate runs without autograd
        if infill:
            eot = tokenizer.eot_token
            rows = generate_until(model, start, args.tokens, eot, args.temperature, top_k)
        else:
            tokens = model.generate(start, args.tokens, temperature=args.temperature, top_k=top_k)
            rows = tokens[:, 1:].tolist()
    print(
        f"# {path}: {args.num_samples} {'middle' if infill else 'sample'}(s), "
        f"{'up to ' * infill}{args.tokens} tokens, temperature {args.temperature}, "
        f"top-k {args.top_k or 'all'}",
        file=sys.stderr,
    )
    for row in rows:
        # the vocab is padded to a multiple of 128: ids past the tokenizer's were never trained
        # targets, and are dropped here if sampled
        print(tokenizer.decode([t for t in row if t < tokenizer.n_vocab]))
        print('-' * 80)
    return 0


if __name__ == '__main__':
    sys.exit(main())
