"""Reads dtrain's TensorBoard event files back with the tensorboard package's own readers and
prints what they found as one JSON object on stdout:
  {"files": [event file names, sorted],
   "events": [[tag, step, value, wall_time], ...]   every scalar of every file, in file order,
             through event_file_loader.EventFileLoader (what TensorBoard's data loading uses:
             it turns simple_value into a scalar tensor),
   "accumulator": {tag: [[step, value], ...]}       event_accumulator.EventAccumulator's Scalars
             for the whole directory, keeping every point}
Usage: python tensorboard_scalars.py OUTPUT_DIR. Exits 3 when the tensorboard package is missing
(the test skips then)."""
import json
import os
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator, event_file_loader
    from tensorboard.util import tensor_util
except ImportError as e:
    print(f"tensorboard is not importable: {e}", file=sys.stderr)
    sys.exit(3)


def main():
    directory = sys.argv[1]
    files = sorted(f for f in os.listdir(directory) if "tfevents" in f)
    events = []
    for name in files:
        for event in event_file_loader.EventFileLoader(os.path.join(directory, name)).Load():
            for value in event.summary.value:
                scalar = tensor_util.make_ndarray(value.tensor).item()
                events.append([value.tag, event.step, scalar, event.wall_time])
    acc = event_accumulator.EventAccumulator(directory, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    accumulator = {
        tag: [[s.step, s.value] for s in acc.Scalars(tag)] for tag in acc.Tags()[event_accumulator.SCALARS]
    }
    json.dump({"files": files, "events": events, "accumulator": accumulator}, sys.stdout)


if __name__ == "__main__":
    main()
