"""
test_config.py: the tables config.py keeps for the other files: the model families (a family's row is what a config
file naming it gets), the resume marks on TrainConfig's keys (CONTINUATION_KEYS comes from them), and the one test
for a run sharded by FSDP2. Pure Python, well under a second.
"""

import dataclasses
import os
import subprocess
import sys

import pytest

from ledgergpt.config import (
    CONTINUATION_KEYS,
    DEFAULTS,
    FAMILIES,
    FSDP_MODES,
    NANOGPT_NAMES,
    PARALLEL_MODES,
    ConfigError,
    ModelConfig,
    TrainConfig,
    load_config,
    sharded,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# train.py's list before the keys were marked: the keys whose change breaks an exact continuation
BREAK_A_CONTINUATION = {
    'data',
    'seed',
    'train_tokens',
    'batch_tokens',
    'batch_ramp_tokens',
    'batch_ramp_start',
    'lr',
    'min_lr_ratio',
    'schedule',
    'warmup_frac',
    'decay_frac',
    'weight_decay',
    'beta1',
    'beta2',
    'eps',
    'grad_clip',
    'dtype',
    'cooldown_from',
    'cooldown_tokens',
    'init_from',  # a resumed run's weights are its own, but from another model they are another run
    'objective',
    'fim_rate',
    'fim_spm_rate',
    'ul2_s_rate',
    'ul2_r_rate',
    'ul2_x_rate',
    'router_bias_speed',  # MoE balancing: a change moves the routing
    'aux_loss_coef',
    'optimizer',  # another optimizer's states and steps
    'muon_lr',  # Muon's update: its LR, momentum, Nesterov and Newton-Schulz steps
    'muon_momentum',
    'muon_nesterov',
    'muon_ns_steps',
}


def test_every_train_key_is_marked_exact_or_free():
    marks = {f.name: f.metadata.get('resume') for f in dataclasses.fields(TrainConfig)}
    assert set(marks.values()) == {'exact', 'free'}, {
        k: v for k, v in marks.items() if v not in ('exact', 'free')
    }
    assert (
        len(CONTINUATION_KEYS) == len(set(CONTINUATION_KEYS))
        and set(CONTINUATION_KEYS) == BREAK_A_CONTINUATION
    )
    assert {k for k, v in marks.items() if v == 'exact'} == BREAK_A_CONTINUATION


def test_defaults_survive_the_marks():
    assert (
        DEFAULTS['lr'] == TrainConfig().lr == 6e-4
        and DEFAULTS['log_every'] == 10
        and DEFAULTS['cooldowns'] == ()
    )
    assert DEFAULTS['arch'] == 'llama' and DEFAULTS['tie_embeddings'] is False
    assert load_config(None, ['--lr=1e-3', '--cooldowns=26e9,52e9'])[1].cooldowns == (
        26_000_000_000,
        52_000_000_000,
    )


def test_sharded_means_fsdp2_over_more_than_one_process():
    assert PARALLEL_MODES == ('ddp', 'zero1', 'zero2', 'fsdp') and FSDP_MODES == ('zero2', 'fsdp')
    assert [mode for mode in PARALLEL_MODES if sharded(mode, 2)] == ['zero2', 'fsdp']
    assert not any(sharded(mode, 1) for mode in PARALLEL_MODES)


# -----------------------------------------------------------------------------------------------------
# The families


def test_family_rows():
    gpt2, llama = FAMILIES['gpt2'], FAMILIES['llama']
    assert (
        gpt2.norm,
        gpt2.mlp,
        gpt2.positions,
        gpt2.bias,
        gpt2.tie_embeddings,
        ModelConfig(arch='gpt2').ffn_matrices,
    ) == ('layernorm', 'gelu', 'learned', True, True, 2)
    assert (
        llama.norm,
        llama.mlp,
        llama.positions,
        llama.bias,
        llama.tie_embeddings,
        ModelConfig(arch='llama').ffn_matrices,
    ) == ('rmsnorm', 'swiglu', 'rope', False, False, 3)
    # the default FFN widths: 4H; LLaMA's 2/3 of 4H rounded up to 256, exact where 8H/3 is a multiple of 256
    assert [ModelConfig(arch='gpt2', n_embd=H).ffn_width for H in (768, 1600)] == [3072, 6400]
    assert [
        ModelConfig(arch='llama', n_embd=H).ffn_width for H in (2048, 4096, 5120, 8192, 96 * 7)
    ] == [5632, 11008, 13824, 22016, 1792]


def test_a_config_file_gets_its_familys_biases_and_tying(tmp_path):
    config = tmp_path / 'gpt2.py'
    config.write_text("arch = 'gpt2'\n")
    model, _ = load_config(str(config))
    assert model.bias and model.tie_embeddings and model.biases  # GPT-2 as published
    model, _ = load_config(str(config), ['--bias=False', '--tie_embeddings=False'])
    assert not model.bias and not model.tie_embeddings
    model, _ = load_config(None)  # the default family: llama, untied, no biases
    assert model.arch == 'llama' and not model.bias and not model.tie_embeddings


@pytest.mark.parametrize(
    'overrides,message',
    [
        (['--arch=gpt3'], 'arch must be one of gpt2, llama'),
        (['--arch=llama', '--bias=True'], 'the llama family has no biases'),
        (['--arch=llama', '--n_embd=36', '--n_head=4'], 'RoPE needs an even head size'),
    ],
)
def test_family_rules(overrides, message):
    with pytest.raises(ConfigError) as error:
        load_config(None, overrides)
    assert message in str(error.value)
    # learned positions: odd ok
    assert load_config(None, ['--arch=gpt2', '--n_embd=36', '--n_head=4'])[0].head_dim == 9


def test_the_ledger_refuses_what_train_refuses(tmp_path):
    """One set of rules: a vocabulary of one token is refused by the ledger as by train.py, on any
    data (synthetic tokens too, where the run would "train" at a loss of 0)."""
    for command in (
        ['ledger.py', 'configs/pystdlib_cpu.py'],
        ['train.py', 'configs/pystdlib_cpu.py'],
    ):
        argv = command + ['--vocab_size=1', '--data=synthetic', f'--out_dir={tmp_path}']
        result = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True)
        assert result.returncode == 2, result.stderr[-2000:]
        assert result.stderr == 'error: vocab_size must be at least 2, got 1\n'
    assert not os.listdir(tmp_path)


def test_a_list_key_that_is_not_numbers_is_one_line_saying_what_it_takes():
    with pytest.raises(
        ConfigError,
        match=r'^--keep_steps=abc: expected whole numbers, comma-separated \(1000,2000\)$',
    ):
        load_config(None, ['--keep_steps=abc'])


# -----------------------------------------------------------------------------------------------------
# nanoGPT's names: its users type them first; the hint maps each to ours, not to the nearest spelling


@pytest.mark.parametrize(
    'name, ours',
    [
        ('learning_rate', "use 'lr'"),
        ('batch_size', "use 'micro_batch'"),
        ('gradient_accumulation_steps', "use 'batch_tokens'"),
        ('max_iters', "use 'max_steps'"),
        ('lr_decay_iters', "use 'train_tokens'"),
        ('eval_iters', "use 'eval_tokens'"),
        ('warmup_iters', "use 'warmup_frac'"),
        ('min_lr', "use 'min_lr_ratio'"),
    ],
)
def test_nanogpt_names_are_mapped_to_ours(tmp_path, name, ours):
    with pytest.raises(ConfigError) as flag:
        load_config(None, [f'--{name}=1'])
    assert str(flag.value).startswith(
        f"unknown config key '{name}' in the command line: nanoGPT's '{name}': {ours}"
    )
    config_file = tmp_path / 'nanogpt_style.py'
    config_file.write_text(f'{name} = 1\n')  # a nanoGPT config file: the same hint, naming the file
    with pytest.raises(ConfigError, match=f"in {config_file}: nanoGPT's '{name}': {ours}"):
        load_config(str(config_file))
    # a typo of ours still gets the spelling hint
    with pytest.raises(ConfigError, match="did you mean 'n_layer'"):
        load_config(None, ['--n_layr=2'])
    # a name both projects use (init_from) is ours, never a hint
    assert not set(NANOGPT_NAMES) & set(DEFAULTS)


@pytest.mark.parametrize(
    'line, why',
    [
        ('import sys\nsys.exit(0)\n', 'calls sys.exit(0)'),
        ('raise SystemExit("stop")\n', "calls sys.exit('stop')"),
        ('import sys\nsys.exit()\n', 'calls sys.exit()'),
        ('raise KeyboardInterrupt\n', 'raises KeyboardInterrupt'),
    ],
)
def test_a_config_file_that_exits_or_interrupts_is_one_line_naming_it(tmp_path, line, why):
    """sys.exit(0) in a config ended the command silently with rc 0, nothing trained; a KeyboardInterrupt it raised
    read as a Ctrl-C. Both are the file's doing: one line naming it."""
    config_file = tmp_path / 'exits.py'
    config_file.write_text('n_layer = 2\n' + line)
    with pytest.raises(ConfigError) as e:
        load_config(str(config_file))
    assert str(e.value) == (
        f"{config_file} {why}: a config file sets keys (`key = value` lines); it may not end the command"
    )


def test_a_ctrl_c_while_a_config_file_runs_is_still_a_ctrl_c(tmp_path):
    import signal

    config_file = tmp_path / 'slow.py'
    config_file.write_text('import os, signal\nos.kill(os.getpid(), signal.SIGINT)\nn_layer = 2\n')
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            load_config(str(config_file))
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_config_that_is_not_python_is_one_line(tmp_path):
    bad = tmp_path / 'bad.py'
    bad.write_text('n_layer = 2\nn_embd = \n')
    with pytest.raises(ConfigError) as error:
        load_config(str(bad))
    assert str(error.value).startswith(f'{bad}:2: invalid syntax: a config file is `key = value`')
