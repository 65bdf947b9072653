"""
gguf_in_llama_cpp.py: export.py's GGUF file run by llama.cpp itself (llama-cpp-python), against our own model on the
same prompt ids: the greedy tokens (sample.py at temperature 0) and the last position's logits.

    pip install llama-cpp-python               # builds llama.cpp from source (minutes on 2 cores)
    python experiments/gguf_in_llama_cpp.py    # tiny runs on data/pystdlib: Llama, GPT-2, Arcee, Qwen3

Each variant trains a tiny model for a few steps (fp32, eager), exports it with `export.py RUN OUT --gguf --dtype
float32`, and feeds llama.cpp and model.generate the same ids (the end-of-text token, then `def main(`); then both
score PROMPT, a few lines of Python, at every position (the logits' largest difference, against their spread, and
whether the top token agrees at each position), and llama.cpp's own tokenizer encodes TEXT (and the prompt, its
special token included) to our ids. Not in the test suite: building llama.cpp is too slow for CI; tests/test_export.py
reads every tensor back with gguf's GGUFReader. The result is in docs/measured.md.
"""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch

from ledgergpt import checkpoint, data

VARIANTS = {  # train.py overrides of configs/pystdlib_cpu.py, after BASE
    'llama, GQA, untied': ['--arch=llama', '--n_kv_head=1'],
    'llama, tied': ['--arch=llama', '--tie_embeddings=True'],
    'gpt2': ['--arch=gpt2'],
    'llama, ReLU² MLP (an Arcee)': ['--arch=llama', '--mlp=relu2'],
    'llama, weightless QK-norm (a Qwen3)': ['--arch=llama', '--qk_norm=weightless'],
    'llama, learned QK-norm, GQA (a Qwen3)': ['--arch=llama', '--qk_norm=learned', '--n_kv_head=1'],
}
# the default's QK-norm off: a plain Llama unless the variant says otherwise
BASE = ['--qk_norm=none']
TINY = ['--n_layer=2', '--n_head=2', '--n_embd=128', '--block_size=64', '--micro_batch=8']
RUN = ['--batch_tokens=512', '--train_tokens=51200', '--compile=False', '--dtype=float32']
QUIET = ['--sample_tokens=0', '--eval_tokens=1024', '--eval_every=1000', '--ckpt_every=1000']
NEW_TOKENS = 24
PROMPT = 'def main(argv=None):\n    parser = argparse.ArgumentParser(description=__doc__)\n    return parser'
TEXT = "def f(x):\n\treturn x ** 2  # 12345 6789\r\n  don't I'LL we've héllo wörld — 日本語 🤖\u00a0é   \n\n end"


def check(name, flags, out):
    from llama_cpp import Llama

    run, folder = os.path.join(out, name.replace(', ', '_')), os.path.join(out, 'hf')
    for command in (
        [
            'train.py',
            'configs/pystdlib_cpu.py',
            *BASE,
            *flags,
            *TINY,
            *RUN,
            *QUIET,
            f'--out_dir={run}',
        ],
        ['export.py', run, folder, '--gguf', '--dtype', 'float32'],
    ):
        subprocess.run([sys.executable, *command], cwd=ROOT, check=True, capture_output=True)
    model, train_config = checkpoint.load_model(checkpoint.find(run), torch.device('cpu'))
    tokenizer = data.load_tokenizer(train_config['data'])
    ids = [tokenizer.eot_token] + tokenizer.encode_ordinary('def main(')
    with torch.no_grad():
        ours = model.generate(torch.tensor([ids]), NEW_TOKENS, temperature=0)[
            0, len(ids) :
        ].tolist()
        our_logits = model(torch.tensor([ids]))[0][0, -1]
    llm = Llama(
        os.path.join(folder, 'model.gguf'), n_ctx=64, logits_all=True, verbose=False, n_threads=2
    )
    theirs = []
    for token in llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0):
        theirs.append(token)
        if len(theirs) == NEW_TOKENS:
            break
    llm.reset()
    llm.eval(ids)
    gap = (torch.tensor(llm.scores[len(ids) - 1]) - our_logits).abs().max().item()
    scored = [tokenizer.eot_token] + tokenizer.encode_ordinary(PROMPT)
    with torch.no_grad():
        our_all = model(torch.tensor([scored]))[0][0]
    llm.reset()
    llm.eval(scored)
    their_all = torch.tensor(llm.scores[: len(scored)])
    gap_all = (their_all - our_all).abs().max().item()
    top = (their_all.argmax(-1) == our_all.argmax(-1)).sum().item()
    # llama.cpp's own tokenizer, from the file's vocab, merges and pre-tokenizer, on text: our ids?
    tokenized = llm.tokenize(TEXT.encode(), add_bos=False) == tokenizer.encode_ordinary(TEXT)
    tokenized &= llm.tokenize(b'<|endoftext|>def main(', add_bos=False, special=True) == ids
    same = theirs == ours and top == len(scored) and tokenized
    print(
        f"{name}: greedy tokens {'equal' if theirs == ours else 'DIFFER'} ({NEW_TOKENS} new), "
        f"last logits max |difference| {gap:.2e}; PROMPT's {len(scored)} positions: logits max |difference| "
        f"{gap_all:.2e} (their std {our_all.std().item():.2f}), top token the same at {top}; llama.cpp's "
        f"tokenizer gives our ids: {tokenized}"
    )
    print(f"  ours   {ours}\n  theirs {theirs}\n  text   {tokenizer.decode(ours)!r}")
    return same


def main():
    import llama_cpp

    out = os.path.join(ROOT, 'out', 'gguf_in_llama_cpp')
    print(f"llama-cpp-python {llama_cpp.__version__}, torch {torch.__version__}")
    results = [check(name, flags, out) for name, flags in VARIANTS.items()]
    return 0 if all(results) else 1


if __name__ == '__main__':
    sys.exit(main())
