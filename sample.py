"""
sample.py: text from a checkpoint that train.py wrote.

    python sample.py out/pystdlib_cpu                                  # the latest checkpoint of that run
    python sample.py out/h200_1b3/ckpt/step_0049592 --prompt "The mitochondria" --temperature 0.7 --top_k 50
    python sample.py out/pystdlib_cpu --prompt "def " --tokens 300 --num_samples 3

The checkpoint carries the model and data config; the tokenizer is the one prepare.py saved in the data folder,
so the text is decoded by the very tokenizer the model was trained on. Any run's weights load in one process,
whatever parallel mode and world size wrote them (checkpoint.load_model).
"""
import argparse
import sys
from contextlib import nullcontext

import torch

import checkpoint
import prepare
from config import ConfigError, cli


@cli
def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[1], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument('checkpoint', help="a run's out_dir (latest checkpoint) or a ckpt/step_* folder")
    parser.add_argument('--prompt', default='', help='text to continue (default: start a new document)')
    parser.add_argument('--tokens', type=int, default=200, help='new tokens per sample')
    parser.add_argument('--temperature', type=float, default=0.8, help='0 is greedy')
    parser.add_argument('--top_k', type=int, default=200, help='sample among the k most likely tokens (0: all)')
    parser.add_argument('--num_samples', type=int, default=1)
    parser.add_argument('--seed', type=int, default=1337)
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    args = parser.parse_args(argv)
    for name, value, least in (('--tokens', args.tokens, 1), ('--num_samples', args.num_samples, 1),
                               ('--temperature', args.temperature, 0), ('--top_k', args.top_k, 0)):
        if value < least:  # a negative temperature would sample the least likely tokens first
            raise ConfigError(f"{name} {value}: must be at least {least}")
    path = checkpoint.find(args.checkpoint)
    device = torch.device(args.device)
    model, train_config = checkpoint.load_model(path, device)
    if train_config['data'] == 'synthetic':
        raise ConfigError(f"{path} was trained on synthetic tokens: there is no text to sample")
    tokenizer = prepare.load_tokenizer(train_config['data'])
    eot_id = tokenizer.eot_token
    # Every training document starts with the end-of-text token, so a prompt continues a fresh document.
    prompt = [eot_id] + tokenizer.encode(args.prompt, allowed_special='all')
    start = torch.tensor([prompt] * args.num_samples, dtype=torch.long, device=device)
    torch.manual_seed(args.seed)
    autocast = torch.autocast('cuda', dtype=torch.bfloat16) if device.type == 'cuda' else nullcontext()
    with torch.no_grad(), autocast:
        out = model.generate(start, args.tokens, temperature=args.temperature, top_k=args.top_k or None)
    print(f"# {path}: {args.num_samples} sample(s), {args.tokens} tokens, temperature {args.temperature}, "
          f"top-k {args.top_k or 'all'}", file=sys.stderr)
    for row in out.tolist():
        # the model's vocab is padded to a multiple of 128: ids past the tokenizer's are never trained targets,
        # and are dropped here if sampled
        print(tokenizer.decode([t for t in row[1:] if t < tokenizer.n_vocab]))
        print('-' * 80)
    return 0


if __name__ == '__main__':
    sys.exit(main())
