"""
sample.py: text from a checkpoint that train.py wrote.

    python sample.py out/pystdlib_cpu                                  # the latest checkpoint of that run
    python sample.py out/h200_1b3/ckpt/step_0049592 --prompt "The mitochondria" --temperature 0.7 --top_k 50
    python sample.py out/pystdlib_cpu --prompt "def " --tokens 300 --num_samples 3

The checkpoint carries the model and data config; the tokenizer is the one prepare.py saved in the data folder,
so the text is decoded by the very tokenizer the model was trained on. Both checkpoint formats load in one
process: model.pt (ddp, zero1) and torch.distributed.checkpoint shards (zero2, fsdp), whatever the world size
that wrote them.
"""
import argparse
import os
import sys
import warnings
from contextlib import nullcontext

import torch

import prepare
from ledger import ConfigError, ModelConfig
from model import GPT


def find_checkpoint(path):
    """A checkpoint folder itself, or a run's out_dir whose ckpt/LATEST names one."""
    if os.path.isfile(os.path.join(path, 'train_state.pt')):
        return path
    pointer = os.path.join(path, 'ckpt', 'LATEST')
    if os.path.isfile(pointer):
        with open(pointer) as f:
            return os.path.join(path, 'ckpt', f.read().strip())
    raise ConfigError(f"no checkpoint in {path}: give a run's out_dir (with ckpt/LATEST) or a ckpt/step_* folder")


def load_model(checkpoint, device):
    # train_state.pt is ours (it holds python and numpy RNG states): a full unpickle is intended
    saved = torch.load(os.path.join(checkpoint, 'train_state.pt'), weights_only=False)
    model_cfg = ModelConfig(**saved['model_config'])
    with torch.device('meta'):
        model = GPT(model_cfg)
    model.to_empty(device=device)
    model.init_weights()  # fills the RoPE tables; every weight is overwritten below
    weights = os.path.join(checkpoint, 'model.pt')
    if os.path.isfile(weights):
        model.load_state_dict(torch.load(weights, map_location=device, weights_only=True))
    else:  # DCP shards: load only the model entries, resharded into this one process
        import torch.distributed.checkpoint as dcp
        state = {'model': model.state_dict()}
        warnings.filterwarnings('ignore', message='torch.distributed is disabled')  # one process is the intent
        dcp.load(state, checkpoint_id=checkpoint, no_dist=True)
        model.load_state_dict(state['model'])
    model.eval()
    return model, saved['train_config']


def main(argv=None):
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
    try:
        checkpoint = find_checkpoint(args.checkpoint)
        device = torch.device(args.device)
        model, train_config = load_model(checkpoint, device)
        if train_config['data'] == 'synthetic':
            raise ConfigError(f"{checkpoint} was trained on synthetic tokens: there is no text to sample")
        tokenizer = prepare.load_tokenizer(train_config['data'])
    except (ConfigError, prepare.DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    eot_id = tokenizer.eot_token
    # Every training document starts with the end-of-text token, so a prompt continues a fresh document.
    prompt = [eot_id] + tokenizer.encode(args.prompt, allowed_special='all')
    start = torch.tensor([prompt] * args.num_samples, dtype=torch.long, device=device)
    torch.manual_seed(args.seed)
    autocast = torch.autocast('cuda', dtype=torch.bfloat16) if device.type == 'cuda' else nullcontext()
    with torch.no_grad(), autocast:
        out = model.generate(start, args.tokens, temperature=args.temperature, top_k=args.top_k or None)
    print(f"# {checkpoint}: {args.num_samples} sample(s), {args.tokens} tokens, temperature {args.temperature}, "
          f"top-k {args.top_k or 'all'}", file=sys.stderr)
    for row in out.tolist():
        # the model's vocab is padded to a multiple of 128: ids past the tokenizer's are never trained targets,
        # and are dropped here if sampled
        print(tokenizer.decode([t for t in row[1:] if t < tokenizer.n_vocab]))
        print('-' * 80)
    return 0


if __name__ == '__main__':
    sys.exit(main())
