"""
tensorboard_picture.py: a run's TensorBoard scalars drawn as its dashboard draws them, to a PNG for the docs
(docs/after-training.md). The values are read by TensorBoard's own plugin EventAccumulator (what its server serves
the dashboard); each tag gets a card, step on the x axis, the raw values faint and TensorBoard's default smoothing
(0.6, its debiased exponential moving average) solid.

    python train.py configs/pystdlib_cpu.py --tracker=tensorboard
    python experiments/tensorboard_picture.py out/pystdlib_cpu/tensorboard docs/tensorboard_loss.png
"""

import os
import sys

# the repo's modules
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ledgergpt.files import atomic_write

# train loss (nats), val bits per byte, the schedule, speed
CARDS = ('loss', 'val_bpb', 'lr', 'tokens_per_s')
SMOOTHING = 0.6  # TensorBoard's scalar cards' default


def read_scalars(folder):
    """{tag: [(step, value)]} of the scalar tags in a TensorBoard log dir, as its dashboard reads them."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    events = EventAccumulator(str(folder), size_guidance={'tensors': 0})
    events.Reload()
    return {
        tag: [
            (e.step, tensor_util.make_ndarray(e.tensor_proto).item()) for e in events.Tensors(tag)
        ]
        for tag in events.Tags()['tensors']
        if events.SummaryMetadata(tag).plugin_data.plugin_name == 'scalars'
    }


def smoothed(values, weight=SMOOTHING):
    """TensorBoard's smoothing: an exponential moving average started at 0, divided by 1 - weight^n (debiased)."""
    last, out = 0.0, []
    for n, value in enumerate(values, 1):
        last = last * weight + (1 - weight) * value
        out.append(last / (1 - weight**n))
    return out


def draw(folder, out):
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    scalars = read_scalars(folder)
    fig, axes = plt.subplots(2, 2, figsize=(10, 6), dpi=100)
    for ax, tag in zip(axes.flat, CARDS):
        steps, values = zip(*scalars[tag]) if scalars.get(tag) else ((), ())
        ax.plot(steps, values, color='#ff7043', alpha=0.3, linewidth=1)
        ax.plot(
            steps,
            smoothed(values),
            color='#ff7043',
            linewidth=1.5,
            marker='.' if tag == 'val_bpb' else '',
        )
        ax.set_title(tag, loc='left', fontsize=10)
        ax.grid(alpha=0.3)
    fig.suptitle(f"TensorBoard scalars of {folder} (smoothing {SMOOTHING})", fontsize=10)
    fig.tight_layout()
    with atomic_write(out, 'wb') as f:
        fig.savefig(f, format='png')
    return scalars


if __name__ == '__main__':
    if len(sys.argv) != 3:
        sys.exit('usage: python experiments/tensorboard_picture.py LOGDIR OUT.png')
    draw(sys.argv[1], sys.argv[2])
    print(sys.argv[2])
