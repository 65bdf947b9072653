"""
test_sample.py: sample.py reads the weights of runs in every checkpoint layout (one process writing whole tensors,
FSDP2 writing shards) into the same trained model, decodes with the data folder's tokenizer, and fails with one
line on a bad path.
"""

import torch

import helpers
import sample
import train
from ledgergpt import checkpoint, data

TINY = dict(helpers.TINY_RUN, train_tokens=3 * 256, ckpt_every=1000)


def train_tiny(tmp_path, data, parallel):
    config = tmp_path / 'tiny.py'
    helpers.write_config(config, dict(TINY, data=data))
    out_dir = str(tmp_path / parallel)
    assert train.main([str(config), f'--out_dir={out_dir}', f'--parallel={parallel}']) == 0
    return out_dir


def test_both_checkpoint_formats_give_the_trained_weights(tmp_path, pystdlib_data, capsys):
    ddp_out = train_tiny(tmp_path, pystdlib_data, 'ddp')
    fsdp_out = train_tiny(tmp_path, pystdlib_data, 'fsdp')
    path = checkpoint.find(ddp_out)
    assert path.endswith('step_0000003') and checkpoint.find(path) == path
    ddp_model, train_config = checkpoint.load_model(path, torch.device('cpu'))
    fsdp_model, _ = checkpoint.load_model(fsdp_out, torch.device('cpu'))
    # the weights are the trained ones: a resumed run's model, loaded through train.py's own path, is identical
    run = train.setup([str(tmp_path / 'tiny.py'), f'--out_dir={ddp_out}', '--resume'])
    for name, tensor in ddp_model.state_dict().items():
        assert torch.equal(tensor, run.raw_model.state_dict()[name]), name
    # trained, not as initialised
    assert not torch.equal(
        ddp_model.tok_emb.weight,
        train.build_model(run.model_cfg, run.train, run.cluster, 'float32')[1].tok_emb.weight,
    )
    # one process trains the same way in both modes, so the weights agree to float rounding
    for (name, a), b in zip(ddp_model.state_dict().items(), fsdp_model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    assert train_config['data'] == pystdlib_data

    capsys.readouterr()  # drop what training printed
    assert sample.main([ddp_out, '--prompt', 'def ', '--tokens', '20', '--temperature', '0']) == 0
    text = capsys.readouterr().out.split('\n' + '-' * 80)[0]
    tokenizer = data.load_tokenizer(pystdlib_data)
    assert text.startswith('def ')
    # greedy: the text is the argmax continuation of the trained model
    ids = [tokenizer.eot_token] + tokenizer.encode('def ')
    expected = ddp_model.generate(torch.tensor([ids]), 20, temperature=0)[0, 1:].tolist()
    assert text == tokenizer.decode([t for t in expected if t < tokenizer.n_vocab])


def test_bad_path_is_one_line(tmp_path, capsys):
    assert sample.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith('error: no checkpoint in') and '\n' not in err


def test_a_device_this_machine_lacks_is_one_line(tmp_path, capsys):
    import evals as hellaswag

    if torch.cuda.is_available():  # a GPU past the last one
        name, why = (
            f'cuda:{torch.cuda.device_count()}',
            f'{torch.cuda.device_count()} CUDA device(s) here',
        )
    else:  # a torch built without CUDA (or with it, on a machine without a GPU)
        name = 'cuda'
        why = (
            'this torch is built without CUDA'
            if torch.version.cuda is None
            else '0 CUDA device(s) here'
        )
    for main, args in (
        (sample.main, [str(tmp_path)]),
        (hellaswag.main, [str(tmp_path), 'hellaswag']),
    ):
        assert main([*args, f'--device={name}']) == 2
        assert capsys.readouterr().err == f"error: --device={name}: {why}; use --device=cpu\n"
    assert sample.main([str(tmp_path), '--device=gpu']) == 2
    assert (
        capsys.readouterr().err
        == "error: --device=gpu: not a device name (cpu, cuda, cuda:1, ...)\n"
    )


def test_a_temperature_that_is_not_a_finite_number_is_one_line(tmp_path, capsys):
    """nan would end in torch.multinomial's RuntimeError, inf sample uniformly: both are refused."""
    for value in ('nan', 'inf'):
        assert sample.main([str(tmp_path), '--temperature', value]) == 2
        assert capsys.readouterr().err == f"error: --temperature {value}: must be a finite number\n"


def test_fill_in_the_middle_of_a_model_not_trained_for_it_warns(tmp_path, pystdlib_data, capsys):
    """A model trained with another objective still writes, with one warning line."""
    from test_export import TINY as EXPORT_TINY
    from test_export import save_run

    save_run(tmp_path / 'run', dict(EXPORT_TINY, arch='llama'), pystdlib_data)
    argv = [str(tmp_path / 'run'), '--prefix', 'def f(', '--suffix', ')', '--tokens', '4']
    assert sample.main(argv) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith('warning: ')]
    assert len(warnings) == 1 and "trained with objective='clm', not 'fim'" in warnings[0], err
