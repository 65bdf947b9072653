"""
checkpoint.py: a run's checkpoints on disk. train.py writes them and reads them back (resume, spike
rollback); sample.py reads the weights. One place knows the layout:

    out_dir/ckpt/step_0001000/       one checkpoint, written as tmp_step_0001000/, then renamed
        .metadata, __0_0.distcp ...  the model (and optimizer) through torch.distributed.checkpoint
        optimizer.pt                 zero1 only: the AdamW states, gathered on rank 0
        train_state.pt               step, tokens, data position, spike window, RNG states, configs
        manifest.json                written last: every file's size, its sha256 where that is cheap
    out_dir/ckpt/LATEST              the name of the newest complete checkpoint (renamed in place)

DCP writes each rank's own shards (FSDP2), a replicated tensor once (DDP, ZeRO-1), and reads them
into any world size, so sample.py reads any run's weights in one process. ZeroRedundancyOptimizer
gives its states only whole, on one rank, which DCP cannot take as sharded: zero1 writes
optimizer.pt instead.

A process killed mid-write leaves a tmp_ folder (LATEST names the previous checkpoint), or mid-prune
a step_ folder without its manifest: nothing reads either, and the next save removes both (_prune).
"""

import hashlib
import os
import pickle
import random
import shutil
import warnings

import numpy as np
import torch
import torch.distributed as dist

from ledgergpt.config import ConfigError, ModelConfig
from ledgergpt.files import load_json, save_json, write_text_atomic
from model import GPT

STATE_FILE = 'train_state.pt'
GATHERED_OPTIMIZER = 'optimizer.pt'  # zero1 only: see above
MANIFEST = 'manifest.json'
# files up to this size get a sha256 (train_state.pt, DCP's metadata, small shards); hashing a 1.3B
# run's 16 GB of shards at each save and load would cost a minute
HASHED_BYTES = 64 * 2**20


def root(out_dir):
    return os.path.join(out_dir, 'ckpt')


def complete_checkpoints(out_dir):
    """A run's complete checkpoints (step_ folders with a manifest, written last), oldest first."""
    folder = root(out_dir)
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    paths = [os.path.join(folder, name) for name in names if name.startswith('step_')]
    return [path for path in paths if os.path.isfile(os.path.join(path, MANIFEST))]


def _sha256(path):
    with open(path, 'rb') as f:
        return hashlib.file_digest(f, 'sha256').hexdigest()


def write_manifest(folder):
    entries = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        size = os.path.getsize(path)
        entries[name] = {'bytes': size, 'sha256': _sha256(path) if size <= HASHED_BYTES else None}
    save_json(os.path.join(folder, MANIFEST), entries)


def damage(path):
    """What is wrong with a checkpoint folder, in a few words; None when every file of its manifest
    is there, at its size, with its hash."""
    try:
        entries = load_json(os.path.join(path, MANIFEST))
    except FileNotFoundError:
        return f'no {MANIFEST} (an incomplete write?)'
    except ValueError:
        return f'{MANIFEST} is not JSON'
    for name, entry in entries.items():
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            return f'{name} is missing'
        if (size := os.path.getsize(file)) != entry['bytes']:
            return f"{name} has {size:,} bytes, the manifest says {entry['bytes']:,} (truncated?)"
        if entry['sha256'] and _sha256(file) != entry['sha256']:
            return f"{name} differs from the manifest's sha256 (damaged)"
    return None


def verified(path, flag=None):
    """path, once its manifest checks out; else a ConfigError naming the damage and the newest
    complete checkpoint before it (as `flag`=path where the tool takes one: '--resume')."""
    problem = damage(path)
    if problem is None:
        return path
    out_dir = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    earlier = complete_checkpoints(out_dir)
    earlier = [c for c in earlier if c < os.path.abspath(path) and damage(c) is None]
    if earlier:
        advice = f"use the newest complete one before it: {flag + '=' if flag else ''}{earlier[-1]}"
    else:  # train.py without --resume would not overwrite it (never silently)
        again = f": delete {root(out_dir)} (or set --out_dir to another folder) to start again"
        advice = 'there is no complete one before it' + (again if flag else '')
    raise ConfigError(f"checkpoint {path} is damaged: {problem}; {advice}")


def latest(out_dir, flag=None):
    """The newest checkpoint of a run: the one LATEST names, or without a LATEST the newest complete
    folder, or None. A LATEST naming no checkpoint folder while complete ones are left is a
    ConfigError naming the newest (in `flag`'s terms, as verified's); with none left (deleted by
    hand) None, so that train.py starts afresh rather than sending the user back to --resume."""
    pointer = os.path.join(root(out_dir), 'LATEST')
    found = complete_checkpoints(out_dir)
    if not os.path.isfile(pointer):  # killed between the rename and the pointer: the newest
        return found[-1] if found else None
    with open(pointer, errors='replace') as f:
        name = f.read().strip()
    path = os.path.join(root(out_dir), name)
    if name.startswith('step_') and os.path.isdir(path):
        return path
    if not found:
        return None
    newest = f'{flag}={found[-1]}' if flag else f'the newest complete checkpoint is {found[-1]}'
    raise ConfigError(
        f"{pointer} names {name[:40]!r}, which is not a checkpoint folder there: {newest}"
    )


def find(path, flag=None):
    """A checkpoint folder, or a run's out_dir -> its latest checkpoint, verified."""
    if any(os.path.isfile(os.path.join(path, name)) for name in (MANIFEST, STATE_FILE)):
        return verified(path, flag)
    found = latest(path, flag)
    if found is None:
        raise ConfigError(
            f"no checkpoint in {path}: give a run's out_dir (with ckpt/LATEST) or a "
            f"ckpt/step_* folder"
        )
    return verified(found, flag)


def step_of(path):
    return int(os.path.basename(path).split('_')[1])


# What train_state.pt may hold besides tensors and plain values: numpy arrays, as in checkpoints
# from before the RNG states were plain lists (numpy's key was an array of 624 uint32). Rebuilding
# an array runs no code of the file's; anything else a pickle names (a function, a class) could.
_RECONSTRUCT = np.ndarray.__reduce__(np.zeros(1))[0]  # numpy._core.multiarray's on numpy 2
OLD_NAME = 'numpy.core.multiarray._reconstruct'  # its name in the files numpy 1 wrote
ARRAYS = [np.ndarray, np.dtype, type(np.dtype(np.uint32)), _RECONSTRUCT, (_RECONSTRUCT, OLD_NAME)]
ALLOWED = {'numpy.ndarray', 'numpy.dtype', OLD_NAME}
ALLOWED.add(f'{_RECONSTRUCT.__module__}.{_RECONSTRUCT.__name__}')


def read_state(path):
    """train_state.pt, read with torch.load(weights_only=True): a checkpoint someone shared runs no
    code. A file that needs more is one ConfigError line, before anything in it runs."""
    file = os.path.join(path, STATE_FILE)
    with torch.serialization.safe_globals(ARRAYS):
        try:
            return torch.load(file, weights_only=True)
        except pickle.UnpicklingError:
            needs = set(torch.serialization.get_unsafe_globals_in_checkpoint(file)) - ALLOWED
            needs = ', '.join(sorted(needs)) or 'unreadable'
            raise ConfigError(
                f"{file} holds more than tensors and plain values ({needs}), which only running "
                f"code from the file could read: this project never writes such a file; refused "
                f"(if you trust it, load it yourself with torch.load(weights_only=False))"
            ) from None


# --------------------------------------------------------------------------------------------------
# Writing and reading the states. Every rank takes part in both.


def _rank_and_world():
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def _barrier():
    if dist.is_initialized():
        dist.barrier()


def _dcp(action, state, path, **options):
    """DCP's save or load of `state` in `path`; one process is intended: its warning is dropped."""
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.filterwarnings('ignore', message='torch.distributed is disabled')
        getattr(dcp, action)(state, checkpoint_id=path, **options)


def _dcp_state(model, optimizer=None):
    """The state dicts DCP saves and loads, keyed by parameter name whatever wraps the model (DDP,
    FSDP2, torch.compile). An optimizer without state yet gets one (the load overwrites it)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        return {'model': get_model_state_dict(model)}
    return dict(zip(('model', 'optimizer'), get_state_dict(model, optimizer)))


def rng_states():
    """Every rank's RNG states (python, numpy, torch, cuda), gathered to all ranks."""
    # tensors and plain values (numpy's key as a list): what read_state's torch.load reads
    name, key, *rest = np.random.get_state()
    numpy_state = (name, key.tolist(), *rest)
    state = dict(python=random.getstate(), numpy=numpy_state, torch=torch.get_rng_state())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state()
    world = _rank_and_world()[1]
    if world == 1:
        return [state]
    gathered = [None] * world
    dist.all_gather_object(gathered, state)
    return gathered


def set_rng_states(states):
    """Restore this rank's RNG streams if the checkpoint was written by the same world size (they
    are per rank; another world size starts fresh ones: only text samples draw from them)."""
    rank, world = _rank_and_world()
    if len(states) != world:
        return
    state = states[rank]
    random.setstate(state['python'])
    name, key, *rest = state['numpy']  # key: a list (an array in checkpoints written before)
    np.random.set_state((name, np.asarray(key, dtype=np.uint32), *rest))
    torch.set_rng_state(state['torch'])
    if 'cuda' in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state['cuda'])


def save(out_dir, step, model, optimizer, train_state, keep, kept_steps=()):
    """Write step_NNNNNNN as laid out above, point LATEST at it, keep the newest `keep` up to it and
    those of kept_steps; -> its path. A failed write (a full disk, Ctrl-C) leaves no tmp_ folder."""
    rank, world = _rank_and_world()
    folder, name = root(out_dir), f'step_{step:07d}'
    final, tmp = os.path.join(folder, name), os.path.join(folder, 'tmp_' + name)
    if rank == 0:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp)
        os.makedirs(tmp)
    _barrier()
    try:
        _write(tmp, step, model, optimizer, train_state, rank, world)
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if rank == 0:
        if os.path.isdir(final):  # the same step written again (after a rollback): replace it
            shutil.rmtree(final)
        os.rename(tmp, final)
        write_text_atomic(os.path.join(folder, 'LATEST'), name + '\n')
        _prune(out_dir, final, keep, kept_steps)
    _barrier()
    return final


def _prune(out_dir, final, keep, kept_steps):
    """Keep the newest `keep` checkpoints up to `final` (newer ones, left by a run this one resumed
    from an earlier one, stay until this run writes their steps again); remove what kills left."""
    for old in [c for c in complete_checkpoints(out_dir) if c <= final][:-keep]:
        if step_of(old) not in kept_steps:
            # the manifest first: killed in what follows, it is no checkpoint
            os.remove(os.path.join(old, MANIFEST))
            shutil.rmtree(old)
    # a begun prune's step_ folders: a write renames its folder only once the manifest is in
    for leftover in os.listdir(root(out_dir)):
        path = os.path.join(root(out_dir), leftover)
        begun = leftover.startswith('step_') and path < final and os.path.isdir(path)
        begun = begun and not os.path.isfile(os.path.join(path, MANIFEST))
        if leftover.startswith('tmp_') or begun:
            shutil.rmtree(path)


def _write(tmp, step, model, optimizer, train_state, rank, world):
    from torch.distributed.checkpoint.api import CheckpointException

    # Before the first step AdamW has no state, and saving it would create one with a zero-lr step
    # (its step count 1 changes the bias correction): the step-0 checkpoint holds the model alone.
    gathered, with_optimizer = train_state['train_config']['parallel'] == 'zero1', step > 0
    state = _dcp_state(model, optimizer if with_optimizer and not gathered else None)
    try:
        _dcp('save', state, tmp)
    # each failed rank's own exception inside: raise the first (a full disk is then an OSError or
    # torch.save's RuntimeError, which files.disk_errors turns into one line)
    except CheckpointException as e:
        raise e.failures[min(e.failures)][0] from None
    if gathered and with_optimizer:
        if hasattr(optimizer, 'consolidate_state_dict'):
            optimizer.consolidate_state_dict(to=0)  # ZeRO-1: every rank sends its part to rank 0
        if rank == 0:
            torch.save(optimizer.state_dict(), os.path.join(tmp, GATHERED_OPTIMIZER))
    rngs = rng_states()
    if rank == 0:
        state = dict(train_state, step=step, rng=rngs, world_size=world)
        torch.save(state, os.path.join(tmp, STATE_FILE))
        write_manifest(tmp)


def load(path, model, optimizer, kind='adamw'):
    """Restore the model, the optimizer (as built where the checkpoint holds none: step 0, or
    another optimizer's than `kind`, which a resume allowed to change it starts afresh) and this
    rank's RNG streams in place; -> the saved train_state dict."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    saved = read_state(path)
    own = saved['step'] > 0 and saved['train_config'].get('optimizer', 'adamw') == kind
    gathered = os.path.join(path, GATHERED_OPTIMIZER)
    gathered = gathered if own and os.path.isfile(gathered) else None
    sharded = own and not gathered  # the optimizer is in DCP's files
    state = _dcp_state(model, optimizer if sharded else None)
    _dcp('load', state, path)
    if sharded:
        set_state_dict(
            model, optimizer, model_state_dict=state['model'], optim_state_dict=state['optimizer']
        )
    else:
        set_model_state_dict(model, state['model'])
        if gathered:
            # every rank reads the whole gathered state (to the CPU: load_state_dict moves it to the
            # parameters' device); ZeRO-1 keeps its own part
            optimizer.load_state_dict(torch.load(gathered, map_location='cpu'))
        else:  # step 0 (or another optimizer's): as built, it creates its state on the first step
            optimizer.state.clear()
            if hasattr(optimizer, 'optim'):
                optimizer.optim.state.clear()  # the rank's own AdamW, which holds ZeRO-1's states
    set_rng_states(saved['rng'])
    return saved


# --------------------------------------------------------------------------------------------------
# The weights alone, in one process, for sample.py (and any tool that reads a trained model).


def device_of(name):
    """A tool's --device as a torch.device this machine has; one ConfigError line otherwise (a CUDA
    device on a torch without CUDA, or past the GPUs there are, fails deep inside a tensor)."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"--device={name}: not a device name (cpu, cuda, cuda:1, ...)") from None
    if device.type == 'cuda':
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            built = torch.version.cuda
            why = f'{count} CUDA device(s) here' if built else 'this torch is built without CUDA'
            raise ConfigError(f"--device={name}: {why}; use --device=cpu")
    return device


def load_model(path, device):
    """-> (GPT in eval mode on `device`, its saved train config) from a checkpoint or out_dir."""
    path = find(path)
    saved = read_state(path)
    with torch.device('meta'):
        model = GPT(ModelConfig(**saved['model_config']))
    model.to_empty(device=device)
    model.init_weights()  # fills the RoPE tables; every weight is overwritten below
    state = {'model': model.state_dict()}
    _dcp('load', state, path, no_dist=True)
    model.load_state_dict(state['model'])
    model.eval()
    return model, saved['train_config']
