"""How long dlaunch takes to exit on SIGTERM when its worker is blocked in a collective with a lost
peer (the chaos soak's link cut / SIGSTOP case), with the dtrain under test against another
dtrain binary (the peer: a build without the stop watchdog) in the same session.

Two agents on this host (c10d, 127.0.0.1 and 127.0.0.2), one dtrain worker each; rank 1 SIGSTOPs
itself after step 6 (DTRAIN_FAIL_SIGNAL=STOP), so rank 0 blocks in its next gradient all-reduce.
One second later the survivor's agent gets SIGTERM; the figure is the time until it exits. The
lost node's agent is then SIGKILLed (its stopped worker dies with it).
Usage: bench/chaos/blocked_stop.py build/bin/dlaunch build/bin/dtrain [--peer_dtrain OLD]
       [--runs 3] [--shutdown_grace 5]
"""
import argparse
import os
import signal
import socket
import statistics
import subprocess
import tempfile
import time

STOPPED = "fault injection: stopping rank 1 after step 6"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


def one_run(dlaunch, dtrain, grace):
    """Seconds from SIGTERM to the survivor agent's exit, its exit code, the watchdog's line."""
    with tempfile.TemporaryDirectory() as tmp:
        endpoint = "127.0.0.1:%d" % free_port()
        env = dict(os.environ, DTRAIN_FAIL_AT_STEP="6", DTRAIN_FAIL_RANK="1",
                   DTRAIN_FAIL_SIGNAL="STOP", DTRAIN_LIMIT_TRAIN_SAMPLES="512",
                   DTRAIN_LIMIT_TEST_SAMPLES="200", OMP_NUM_THREADS="1",
                   DLAUNCH_CONV_CACHE=os.path.join(tmp, "conv.txt"))
        agents, logs = [], []
        for k, addr in enumerate(["127.0.0.1", "127.0.0.2"]):
            logs.append(os.path.join(tmp, "agent%d.log" % k))
            with open(logs[-1], "w") as out:
                agents.append(subprocess.Popen(
                    [dlaunch, "--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=" + endpoint,
                     "--rdzv_id=blocked_stop", "--local_addr=" + addr, "--max_restarts=0",
                     "--hang_timeout=0", "--shutdown_grace=%g" % grace,
                     "--log_dir=" + os.path.join(tmp, "logs"), dtrain, "--flash_every=0",
                     "--width=16", "--batch_size=32", "--epochs=3", "--log_every=4",
                     "--output_dir=" + os.path.join(tmp, "out")],
                    stdout=out, stderr=subprocess.STDOUT, env=env))
            if k == 0:  # the first agent hosts the store
                deadline = time.time() + 60
                while "hosting the job's store" not in read(logs[0]) and time.time() < deadline:
                    time.sleep(0.05)
        try:
            deadline = time.time() + 240
            lost = None
            while lost is None and time.time() < deadline:
                for k in range(2):
                    if STOPPED in read(logs[k]):
                        lost = k
                time.sleep(0.05)
            if lost is None:
                raise SystemExit("rank 1 never stopped:\n" + read(logs[0]) + read(logs[1]))
            survivor = 1 - lost
            time.sleep(1)  # the survivor blocks in step 7's all-reduce
            t0 = time.monotonic()
            agents[survivor].send_signal(signal.SIGTERM)
            code = agents[survivor].wait(timeout=grace + 60)
            took = time.monotonic() - t0
            watchdog = "stop watchdog:" in read(logs[survivor])
        finally:
            for a in agents:
                if a.poll() is None:
                    a.kill()
                    a.wait()
        return took, code, watchdog


def series(name, dlaunch, dtrain, runs, grace):
    times = []
    for i in range(runs):
        took, code, watchdog = one_run(dlaunch, dtrain, grace)
        times.append(took)
        print("%s run %d: SIGTERM -> dlaunch exit %.2f s, exit code %d, watchdog line: %s"
              % (name, i + 1, took, code, "yes" if watchdog else "no"), flush=True)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dlaunch")
    parser.add_argument("dtrain")
    parser.add_argument("--peer_dtrain", help="the dtrain to compare with (e.g. one without the watchdog)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--shutdown_grace", type=float, default=5)
    args = parser.parse_args()
    print("load average at start: %.2f %.2f %.2f" % os.getloadavg(), flush=True)
    ours = series("dtrain", args.dlaunch, args.dtrain, args.runs, args.shutdown_grace)
    peer = None
    if args.peer_dtrain:
        peer = series("peer", args.dlaunch, args.peer_dtrain, args.runs, args.shutdown_grace)
    print("load average at end: %.2f %.2f %.2f" % os.getloadavg())
    print("median SIGTERM -> exit with --shutdown_grace %g: dtrain %.2f s" % (args.shutdown_grace, ours))
    if peer is not None:
        print("median peer %.2f s; ratio peer / dtrain %.1fx" % (peer, peer / ours))


if __name__ == "__main__":
    main()
