"""Helpers the test files share (imported as `helpers`: pytest puts tests/ on the path)."""

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

# The tiny run most training tests start from (a test's own keys on top): a 2 x 64 Llama, vocab 512, 8 sequences of
# 32 tokens a step in micro-batches of 4, eager, a log line every step, no eval but the end's
TINY_RUN = dict(
    arch='llama',
    n_layer=2,
    n_head=2,
    n_embd=64,
    vocab_size=512,
    block_size=32,
    micro_batch=4,
    batch_tokens=256,
    lr=3e-3,
    warmup_frac=0.1,
    compile=False,
    log_every=1,
    eval_every=1000,
    eval_tokens=1024,
)


def write_config(path, keys):
    """A config file at `path` as a person writes one, a `key = value` line a key; -> its path as a str."""
    path.write_text(''.join(f'{k} = {v!r}\n' for k, v in keys.items()))
    return str(path)


def tensorboard_scalars(folder):
    """{(step, tag): value} of the scalars in a TensorBoard log dir, read as its dashboard reads them (the plugin
    EventAccumulator, which drops what a restarted writer's purge step hides), and {tag: plugin} of every tag."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    events = EventAccumulator(str(folder), size_guidance={'tensors': 0})
    events.Reload()
    tags = {
        tag: events.SummaryMetadata(tag).plugin_data.plugin_name for tag in events.Tags()['tensors']
    }
    values = {
        (event.step, tag): tensor_util.make_ndarray(event.tensor_proto).item()
        for tag, plugin in tags.items()
        if plugin == 'scalars'
        for event in events.Tensors(tag)
    }
    return values, tags


def wandb_offline_runs(folder):
    """[{'id', 'config', 'rows', 'dir'}] of every offline W&B run under folder (out_dir/wandb), oldest first, read
    from its .wandb transaction log with wandb's own reader; a row is one wandb.log call, W&B's own '_' keys left
    out."""
    import glob
    import json
    import os

    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    runs = []
    for path in sorted(glob.glob(os.path.join(folder, 'offline-run-*', 'run-*.wandb'))):
        store = datastore.DataStore()
        store.open_for_scan(path)
        run = {'dir': os.path.dirname(path), 'rows': []}
        while (data := store.scan_data()) is not None:
            record = wandb_internal_pb2.Record()
            record.ParseFromString(data)
            kind = record.WhichOneof('record_type')
            if kind == 'run':
                run['id'] = record.run.run_id
                run['config'] = {
                    item.key: json.loads(item.value_json) for item in record.run.config.update
                }
            elif kind == 'history':
                items = (
                    (item.key or '/'.join(item.nested_key), item.value_json)
                    for item in record.history.item
                )
                run['rows'].append(
                    {key: json.loads(value) for key, value in items if not key.startswith('_')}
                )
        runs.append(run)
    return runs


def metrics_by_step(entries):
    """{(step, key): value} of metrics.jsonl's numbers (True/False as 1/0; a nested record's, a forecast's, by
    '/': forecast/what_if/2x/val_loss), a later record of a step replacing an earlier one: what a tracker shows of
    a run that was resumed."""

    def numbers(record, prefix=''):
        for key, value in record.items():
            if isinstance(value, dict):
                yield from numbers(value, f'{prefix}{key}/')
            elif isinstance(value, (bool, int, float)) and (prefix or key != 'step'):
                yield f'{prefix}{key}', int(value) if isinstance(value, bool) else value

    return {(entry['step'], key): value for entry in entries for key, value in numbers(entry)}


class LiveBytes(TorchDispatchMode):
    """The bytes of the tensors that ops create while it is active, alive after each op, and their peak: a CPU
    memory measurement at op granularity (a storage freed between two ops is dropped before the next op's outputs
    are counted; the tensors that existed before are not counted)."""

    def __init__(self):
        super().__init__()
        self.alive, self.peak = {}, 0  # StorageImpl address -> (weak reference, bytes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.alive = {key: ref for key, ref in self.alive.items() if not ref[0].expired()}
        inputs = {
            _storage(t).cdata for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)
        }
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and tensor.device.type != 'meta':
                ref = _storage(tensor)
                # a view or an in-place result shares an input's storage
                if ref.cdata not in inputs:
                    self.alive.setdefault(ref.cdata, (ref, tensor.untyped_storage().nbytes()))
        self.peak = max(self.peak, sum(nbytes for _, nbytes in self.alive.values()))
        return out


def _storage(tensor):
    return StorageWeakRef(tensor.untyped_storage())


def peak_live_bytes(run):
    """The peak bytes of the tensors run() creates (LiveBytes)."""
    with LiveBytes() as tracker:
        run()
    return tracker.peak
