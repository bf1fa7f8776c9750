#!/usr/bin/env python3
"""Where the time of a rank-level recovery goes, from a kept chaos soak's logs.

  DLAUNCH_LOG_LEVEL=debug python3 bench/chaos/soak.py ... --faults worker_kill --restart_scope rank --keep
  python3 bench/chaos/recovery_breakdown.py /tmp/dlaunch_soak_XXXX/soak_rank [more dirs]

For each worker SIGKILL of the soak (summary_rank.json next to the directory: its `at` is the
kill's wall time) it lines up, in milliseconds after the kill, the agent's lines (the exit seen,
the replacement spawned), the replacement's start-up phases (worker/train/startup_phases.h), the
survivors' re-form (the failure seen, the verdict, the join, the state exchange, the redone step;
the last survivor's, which the others wait for) and rank 0's next step record in metrics.jsonl.
It prints each kill's row and the median of each milestone over all the kills given. The log
stamps are wall-clock milliseconds; the processes share one clock (network namespaces on one
host). Needs the debug level: the phase lines are debug lines.
"""
import datetime
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from soak import read_steps  # noqa: E402  (rank 0's step records, as the soak reads them)

LINE = re.compile(r"^(?:\[default\d+\]:)?\[(dlaunch|dtrain rank (\d+)) (\d\d):(\d\d):(\d\d)\.(\d\d\d) ([DIWE])\] (.*)$")

# (label, who, pattern): who is "agent", "new" (the replacement) or "survivors" (the last one).
MILESTONES = [
    ("agent saw the exit", "agent", r"pid {pid}\) failed: .*replaced in process"),
    ("replacement spawned", "agent", r"started as pid"),
    ("replacement main()", "new", r"start-up: main\(\) of a replacement"),
    ("replacement device opened", "new", r"start-up: device opened"),
    ("replacement store connected", "new", r"start-up: connected to the store"),
    ("survivors saw the failure", "survivors", r"was interrupted and is rolled back|was complete when the peer failed"),
    ("survivors saw the verdict", "survivors", r"verdict replace for generation"),
    ("replacement joined the group", "new", r"start-up: joined the group"),
    ("survivors joined the group", "survivors", r"^joined generation"),
    ("replacement data ready", "new", r"start-up: data ready"),
    ("replacement model built", "new", r"start-up: model built"),
    ("replacement kernels warmed up", "new", r"start-up: kernels warmed up"),
    ("replacement took the state", "new", r"start-up: training state in place"),
    ("survivors re-formed", "survivors", r"re-formed the group at generation"),
    ("replacement redid the step", "new", r"start-up: step \d+ done"),
    ("survivors redid the step", "survivors", r"step \d+ done \d+ ms after the failure"),
]


def read_lines(path, day):
    """(wall time, rank or None for the agent, text) of each stamped line."""
    out = []
    try:
        with open(path, errors="replace") as f:
            for raw in f:
                m = LINE.match(raw.rstrip("\n"))
                if not m:
                    continue
                h, mi, s, ms = (int(x) for x in m.group(3, 4, 5, 6))
                t = day + datetime.timedelta(hours=h, minutes=mi, seconds=s, milliseconds=ms)
                rank = int(m.group(2)) if m.group(2) is not None else None
                out.append((t.timestamp(), rank, m.group(8)))
    except OSError:
        pass
    return out


def breakdown(soak_dir):
    parent = os.path.dirname(os.path.abspath(soak_dir))
    scope = os.path.basename(os.path.abspath(soak_dir)).replace("soak_", "")
    with open(os.path.join(parent, f"summary_{scope}.json")) as f:
        summary = json.load(f)
    steps = [(t, step) for t, _, step in read_steps(os.path.join(soak_dir, "out"))]
    rows = []
    for fault in summary["faults"]:
        if fault.get("kind") != "worker_kill" or "at" not in fault or not fault.get("recovered"):
            continue
        at = fault["at"]
        day = datetime.datetime.fromtimestamp(at).replace(hour=0, minute=0, second=0, microsecond=0)
        agent_log = os.path.join(soak_dir, f"agent{fault['host']}.log")
        lines = []
        for name in sorted(os.listdir(soak_dir)):
            if name.startswith("agent") and name.endswith(".log"):
                lines += [(t, r, x, os.path.join(soak_dir, name) == agent_log)
                          for t, r, x in read_lines(os.path.join(soak_dir, name), day)]
        lines.sort(key=lambda l: l[0])
        after = [l for l in lines if l[0] >= at - 0.002]
        row = {"kill": at}
        seen = next((l for l in after if l[1] is None and l[3] and
                     re.search(MILESTONES[0][2].format(pid=fault["pid"]), l[2])), None)
        if seen is None:
            continue
        rank = int(re.search(r"rank (\d+) \(local", seen[2]).group(1))
        row["agent saw the exit"] = seen[0]
        spawn = next((l for l in after if l[1] is None and l[3] and l[0] >= seen[0] and
                      re.search(r"started as pid", l[2])), None)
        if spawn:
            row["replacement spawned"] = spawn[0]
        start = spawn[0] if spawn else seen[0]
        # Until the next kill: the next fault's lines are not this one's.
        later = [f["at"] for f in summary["faults"] if f.get("at", 0) > at]
        end = min(later) if later else float("inf")
        window = [l for l in after if l[0] < end]
        for label, who, pattern in MILESTONES[2:]:
            if who == "new":
                hit = next((l[0] for l in window if l[1] == rank and l[0] >= start and re.search(pattern, l[2])), None)
                if hit is not None:
                    row[label] = hit
            else:
                firsts = {}
                for t, r, x, _ in window:
                    if r is not None and r != rank and r not in firsts and re.search(pattern, x):
                        firsts[r] = t
                if firsts:
                    row[label] = max(firsts.values())
        nxt = next((t for t, s in steps if t > at), None)
        if nxt is not None:
            row["rank 0 logged the next step"] = nxt
        row["soak's recovery_s"] = at + fault["recovery_s"]
        rows.append(row)
    return rows


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    rows = []
    for d in sys.argv[1:]:
        rows += breakdown(d)
    labels = [m[0] for m in MILESTONES] + ["rank 0 logged the next step", "soak's recovery_s"]
    print(f"{len(rows)} worker SIGKILLs; milliseconds after the kill")
    print(f"{'milestone':34s} {'median':>7s}  each")
    for label in labels:
        vals = [1e3 * (r[label] - r["kill"]) for r in rows if label in r]
        if not vals:
            continue
        each = " ".join(f"{v:5.0f}" for v in vals)
        print(f"{label:34s} {statistics.median(vals):7.0f}  {each}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
