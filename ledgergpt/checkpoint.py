"""
checkpoint.py: a run's checkpoints on disk. train.py writes them and reads them back (resume, spike rollback);
sample.py reads the weights. One place knows the layout:

    out_dir/ckpt/step_0001000/       one checkpoint, written as tmp_step_0001000/ and renamed once complete
        .metadata, __0_0.distcp ...  the model (and the optimizer) through torch.distributed.checkpoint (DCP)
        optimizer.pt                 zero1 only: the AdamW states, gathered on rank 0
        train_state.pt               step, tokens, data position, spike-guard window, RNG states, both configs
        manifest.json                written last: every file's size, and its sha256 where that is cheap
    out_dir/ckpt/LATEST              the name of the newest complete checkpoint (replaced by a rename)

One format for the weights in every parallel mode: DCP writes each rank's own shards in parallel (FSDP2), writes
a replicated tensor once (one process, DDP, ZeRO-1), and reads them back into any world size, resharding as
needed; so sample.py reads any run's weights in one process. Two formats remain for the optimizer because
ZeroRedundancyOptimizer can give its states only whole, gathered on one rank (consolidate_state_dict), which DCP
cannot take as a sharded state: zero1 writes optimizer.pt from rank 0 and every rank reads it and keeps its part.

A process killed mid-write leaves a tmp_ folder that nothing reads, and LATEST still names the previous
complete checkpoint; one killed while pruning leaves an old step_ folder without its manifest (removed first), which
nothing reads either. The next save removes both leftovers.
"""

import contextlib
import hashlib
import json
import os
import random
import shutil
import warnings

import numpy as np
import torch
import torch.distributed as dist

from ledgergpt.config import ConfigError, ModelConfig
from ledgergpt.files import save_json, write_text_atomic
from model import GPT

STATE_FILE = 'train_state.pt'
GATHERED_OPTIMIZER = 'optimizer.pt'  # zero1 only: see above
MANIFEST = 'manifest.json'
# files up to this size get a sha256 (train_state.pt, DCP's metadata, small shards); hashing a 1.3B run's 16 GB of
# shards at each save and load would cost a minute
HASHED_BYTES = 64 * 2**20


def root(out_dir):
    return os.path.join(out_dir, 'ckpt')


def complete_checkpoints(out_dir):
    """The complete checkpoints of a run (step_ folders with a manifest: it is written last), oldest first."""
    folder = root(out_dir)
    if not os.path.isdir(folder):
        return []
    return sorted(
        os.path.join(folder, d)
        for d in os.listdir(folder)
        if d.startswith('step_') and os.path.isfile(os.path.join(folder, d, MANIFEST))
    )


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder):
    """manifest.json for every file in a checkpoint folder: its size, and its sha256 when it is small."""
    entries = {}
    for name in sorted(os.listdir(folder)):
        size = os.path.getsize(os.path.join(folder, name))
        entries[name] = {
            'bytes': size,
            'sha256': _sha256(os.path.join(folder, name)) if size <= HASHED_BYTES else None,
        }
    save_json(os.path.join(folder, MANIFEST), entries)


def damage(path):
    """What is wrong with a checkpoint folder, in a few words; None when every file the manifest lists is there,
    at its size, with its hash."""
    try:
        with open(os.path.join(path, MANIFEST)) as f:
            entries = json.load(f)
    except FileNotFoundError:
        return f'no {MANIFEST} (an incomplete write?)'
    except ValueError:
        return f'{MANIFEST} is not JSON'
    for name, entry in entries.items():
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            return f'{name} is missing'
        if os.path.getsize(file) != entry['bytes']:
            return f"{name} has {os.path.getsize(file):,} bytes, the manifest says {entry['bytes']:,} (truncated?)"
        if entry['sha256'] and _sha256(file) != entry['sha256']:
            return f"{name} differs from the manifest's sha256 (damaged)"
    return None


def verified(path, flag=None):
    """path, once its manifest checks out; else a ConfigError that names the damage and the newest complete
    checkpoint before it (the one to use instead). flag: the tool's option that takes a checkpoint (train.py's
    '--resume'), in which the advice is given; sample.py, evals.py and export.py take a path, and are given one."""
    problem = damage(path)
    if problem is None:
        return path
    out_dir = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    earlier = [
        c for c in complete_checkpoints(out_dir) if c < os.path.abspath(path) and damage(c) is None
    ]
    if earlier:
        advice = f"use the newest complete one before it: {flag + '=' if flag else ''}{earlier[-1]}"
    else:  # train.py without --resume would not overwrite it (never silently): it goes out of the way first
        advice = 'there is no complete one before it' + (
            f": delete {root(out_dir)} (or set --out_dir to another folder) to start again"
            if flag
            else ''
        )
    raise ConfigError(f"checkpoint {path} is damaged: {problem}; {advice}")


def latest(out_dir, flag=None):
    """The newest checkpoint of a run: the one LATEST names (validated), or without a LATEST the newest complete
    folder, or None when the run has none. A LATEST that names no checkpoint folder while complete ones are left is
    a ConfigError naming the newest (in `flag`'s terms, as verified's). With none left (the folders deleted by hand)
    the run has no checkpoint: None, so that train.py starts (its first save rewrites LATEST) rather than sending
    the user between --resume and a run without it."""
    pointer = os.path.join(root(out_dir), 'LATEST')
    found = complete_checkpoints(out_dir)
    # killed between the rename and the pointer: the newest complete one
    if not os.path.isfile(pointer):
        return found[-1] if found else None
    with open(pointer, errors='replace') as f:
        name = f.read().strip()
    path = os.path.join(root(out_dir), name)
    if not (name.startswith('step_') and os.path.isdir(path)):
        if not found:
            return None
        newest = f'{flag}={found[-1]}' if flag else f'the newest complete checkpoint is {found[-1]}'
        raise ConfigError(
            f"{pointer} names {name[:40]!r}, which is not a checkpoint folder there: {newest}"
        )
    return path


def find(path, flag=None):
    """A checkpoint folder itself, or a run's out_dir -> its latest checkpoint, verified; ConfigError if neither.
    flag: as verified's."""
    if os.path.isfile(os.path.join(path, MANIFEST)) or os.path.isfile(
        os.path.join(path, STATE_FILE)
    ):
        return verified(path, flag)
    found = latest(path, flag)
    if found is None:
        raise ConfigError(
            f"no checkpoint in {path}: give a run's out_dir (with ckpt/LATEST) or a ckpt/step_* folder"
        )
    return verified(found, flag)


def step_of(path):
    return int(os.path.basename(path).split('_')[1])


# What train_state.pt may hold besides tensors and plain values: numpy arrays, as in checkpoints written before the
# RNG states were kept as plain lists (numpy's state was np.random.get_state(), its key an array of 624 uint32). An
# array's reconstruction runs no code of the file's; anything else a pickle names (a function, a class) could.
# numpy._core.multiarray._reconstruct on numpy 2
_RECONSTRUCT = np.ndarray.__reduce__(np.zeros(1))[0]
ARRAYS = [
    np.ndarray,
    np.dtype,
    type(np.dtype(np.uint32)),  # numpy.dtypes.UInt32DType: the key's dtype
    _RECONSTRUCT,
    (_RECONSTRUCT, 'numpy.core.multiarray._reconstruct'),  # its name in files numpy 1 wrote
]


def read_state(path):
    """train_state.pt, read with torch.load(weights_only=True) (tensors, numbers, strings, lists, dicts; numpy arrays
    in older ones): a checkpoint someone shared runs no code. A file that needs more is one ConfigError line, before
    anything in it runs."""
    import pickle

    file = os.path.join(path, STATE_FILE)
    with torch.serialization.safe_globals(ARRAYS):
        try:
            return torch.load(file, weights_only=True)
        except pickle.UnpicklingError:
            allowed = {'numpy.ndarray', 'numpy.dtype', 'numpy.core.multiarray._reconstruct'}
            allowed.add(f'{_RECONSTRUCT.__module__}.{_RECONSTRUCT.__name__}')
            needs = sorted(
                set(torch.serialization.get_unsafe_globals_in_checkpoint(file)) - allowed
            )
            raise ConfigError(
                f"{file} holds more than tensors and plain values ({', '.join(needs) or 'unreadable'}), which only "
                f"running code from the file could read: this project never writes such a file; refused (if you "
                f"trust it, load it yourself with torch.load(weights_only=False))"
            ) from None


# -----------------------------------------------------------------------------------------------------
# Writing and reading the states. Every rank takes part in both.


def _rank_and_world():
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def _barrier():
    if dist.is_initialized():
        dist.barrier()


@contextlib.contextmanager
def _quiet_single_process_dcp():
    # DCP in one process warns that it assumes one process: that is the intent
    with warnings.catch_warnings():
        warnings.filterwarnings('ignore', message='torch.distributed is disabled')
        yield


@contextlib.contextmanager
def _dcp_failures_as_their_cause():
    """DCP reports a failed write as a CheckpointException (a BaseException, holding each failed rank's exception):
    raise the first rank's own exception instead (a full disk is then an OSError or torch.save's RuntimeError, which
    files.disk_errors turns into one line)."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as e:
        failed_rank = min(e.failures)
        raise e.failures[failed_rank][0] from None


def _dcp_state(model, optimizer=None):
    """The state dicts DCP saves and loads, keyed by parameter name whatever wraps the model (DDP, FSDP2,
    torch.compile). With an optimizer that has no state yet, get_state_dict creates it (the load overwrites it)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        return {'model': get_model_state_dict(model)}
    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {'model': model_state, 'optimizer': optimizer_state}


def rng_states():
    """Every rank's RNG states (python, numpy, torch, cuda), gathered to all ranks."""
    name, key, position, has_gauss, gauss = np.random.get_state()
    state = {  # tensors and plain values: what read_state's torch.load(weights_only=True) reads
        'python': random.getstate(),
        'numpy': (name, key.tolist(), position, has_gauss, gauss),
        'torch': torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state()
    rank, world = _rank_and_world()
    if world == 1:
        return [state]
    gathered = [None] * world
    dist.all_gather_object(gathered, state)
    return gathered


def set_rng_states(states):
    """Restore this rank's RNG streams, when the checkpoint was written by the same world size (the streams are
    per rank; another world size starts fresh ones: nothing in training draws from them, only text samples do)."""
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
    """Write step_NNNNNNN (the model, the optimizer, train_state plus every rank's RNG states, the manifest last),
    point LATEST at it, keep the newest `keep` up to it and those of kept_steps; return its path. A write that fails
    (a full disk, Ctrl-C) leaves no tmp_ folder behind, and LATEST still names the last complete checkpoint."""
    rank, world = _rank_and_world()
    folder = root(out_dir)
    name = f'step_{step:07d}'
    final, tmp = os.path.join(folder, name), os.path.join(folder, 'tmp_' + name)
    if rank == 0:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp)
        os.makedirs(tmp)
    _barrier()
    try:
        with _dcp_failures_as_their_cause():
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
        # keep the newest `keep` up to this one; newer ones (left by a run this one resumed from an earlier
        # checkpoint) stay until this run writes their steps again
        for old in [c for c in complete_checkpoints(out_dir) if c <= final][:-keep]:
            if step_of(old) not in kept_steps:
                # first: killed in what follows, it is no checkpoint
                os.remove(os.path.join(old, MANIFEST))
                shutil.rmtree(old)
        # what kills left: tmp_ folders of writes, and step_ folders older than this one that a prune had begun (no
        # manifest: a write renames its folder only once the manifest is in, so nothing else leaves one so)
        for leftover in os.listdir(folder):
            path = os.path.join(folder, leftover)
            begun = leftover.startswith('step_') and path < final and os.path.isdir(path)
            if leftover.startswith('tmp_') or (
                begun and not os.path.isfile(os.path.join(path, MANIFEST))
            ):
                shutil.rmtree(path)
    _barrier()
    return final


def _write(tmp, step, model, optimizer, train_state, rank, world):
    """The files of one checkpoint, into the folder tmp."""
    import torch.distributed.checkpoint as dcp

    # Before the first step AdamW has no state, and saving it would create one with a zero-lr step (its step
    # count becomes 1, changing the bias correction): the step-0 checkpoint holds the model alone. zero1 runs keep
    # the optimizer gathered in optimizer.pt, on any world size, so that one process and many read each other's.
    gathered, with_optimizer = train_state['train_config']['parallel'] == 'zero1', step > 0
    with _quiet_single_process_dcp():
        dcp.save(
            _dcp_state(model, optimizer if with_optimizer and not gathered else None),
            checkpoint_id=tmp,
        )
    if gathered and with_optimizer:
        if hasattr(optimizer, 'consolidate_state_dict'):
            # ZeRO-1: every rank sends its part of the states to rank 0
            optimizer.consolidate_state_dict(to=0)
        if rank == 0:
            torch.save(optimizer.state_dict(), os.path.join(tmp, GATHERED_OPTIMIZER))
    rngs = rng_states()
    if rank == 0:
        torch.save(
            dict(train_state, step=step, rng=rngs, world_size=world), os.path.join(tmp, STATE_FILE)
        )
        write_manifest(tmp)


def load(path, model, optimizer, kind='adamw'):
    """Restore the model, the optimizer (as built when the checkpoint holds none: step 0, or another optimizer's
    states than `kind`, the run's row, which a resume allowed to change it starts afresh) and this rank's RNG
    streams in place; return the saved train_state dict."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    saved = read_state(path)
    own = saved['step'] > 0 and saved['train_config'].get('optimizer', 'adamw') == kind
    gathered = os.path.join(path, GATHERED_OPTIMIZER)
    gathered = gathered if own and os.path.isfile(gathered) else None
    sharded = own and not gathered  # the optimizer is in DCP's files
    state = _dcp_state(model, optimizer if sharded else None)
    with _quiet_single_process_dcp():
        dcp.load(state, checkpoint_id=path)
    if sharded:
        set_state_dict(
            model, optimizer, model_state_dict=state['model'], optim_state_dict=state['optimizer']
        )
    else:
        set_model_state_dict(model, state['model'])
        if gathered:
            # every rank reads the whole gathered state (to the CPU: load_state_dict moves it to the parameters'
            # device); ZeRO-1 keeps its own part
            optimizer.load_state_dict(torch.load(gathered, map_location='cpu'))
        else:  # step 0 (or another optimizer's): as built, it creates its state on the first step
            optimizer.state.clear()
            if hasattr(optimizer, 'optim'):
                optimizer.optim.state.clear()  # the rank's own AdamW, which holds ZeRO-1's states
    set_rng_states(saved['rng'])
    return saved


# -----------------------------------------------------------------------------------------------------
# The weights alone, in one process, for sample.py (and any tool that reads a trained model).


def device_of(name):
    """A tool's --device value as a torch.device this machine has; one ConfigError line otherwise (a CUDA device
    on a torch built without CUDA, or past the GPUs there are, fails deep inside the first tensor moved there)."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"--device={name}: not a device name (cpu, cuda, cuda:1, ...)") from None
    if device.type == 'cuda':
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            why = (
                'this torch is built without CUDA'
                if torch.version.cuda is None
                else f'{count} CUDA device(s) here'
            )
            raise ConfigError(f"--device={name}: {why}; use --device=cpu")
    return device


def load_model(path, device):
    """-> (GPT in eval mode on `device`, the saved train config dict) from a checkpoint folder or out_dir."""
    import torch.distributed.checkpoint as dcp

    path = find(path)
    saved = read_state(path)
    with torch.device('meta'):
        model = GPT(ModelConfig(**saved['model_config']))
    model.to_empty(device=device)
    model.init_weights()  # fills the RoPE tables; every weight is overwritten below
    state = {'model': model.state_dict()}
    with _quiet_single_process_dcp():
        dcp.load(state, checkpoint_id=path, no_dist=True)
    model.load_state_dict(state['model'])
    model.eval()
    return model, saved['train_config']
