# Runs every method of PyTorch 2.x's TCPStore client against a store and prints what each call
# returned or raised, one line per call, so that the transcripts against dlaunch's server and
# against PyTorch's own servers can be compared line by line (tcp_store_torch2_client_test.cc).
#
#   python torch2_store_transcript.py OUR_PORT OUR_OTHER_PORT
#
# prints "methods: ...", the client's public methods as dir() lists them; "uncovered: ..." (empty
# when every method is called below); then "<server>: <line>" for the server at OUR_PORT ("ours")
# and PyTorch's libuv server ("libuv"), and without the queue calls, which PyTorch's legacy
# server (use_libuv=False) does not have, for the server at OUR_OTHER_PORT ("ours-no-queues")
# and that legacy server ("legacy").
import datetime
import re
import sys
import threading
import time

import torch.distributed as d

T = datetime.timedelta

# Attributes that are no requests: what the client was made with, and Python's plumbing.
NOT_REQUESTS = {"host", "port", "timeout", "libuvBackend", "has_extended_api"}
# Every method the script below calls; the test fails when the client has one more.
CALLED = {
    "set", "get", "add", "compare_set", "check", "wait", "delete_key", "num_keys", "multi_get",
    "multi_set", "append", "queue_push", "queue_pop", "queue_len", "set_timeout", "clone",
    "list_keys", "barrier",
}


def public_methods():
    return sorted(m for m in dir(d.TCPStore) if not m.startswith("_"))


def transcript(port, queues=True):
    lines = []

    def note(name, call):
        try:
            result = call()
            lines.append(f"{name} -> {result!r}")
        except Exception as e:  # the type and the message are what is compared
            message = str(e).replace(str(port), "PORT")
            # PyTorch's messages end with a C++ stack in debug builds; the first line is the one.
            message = message.splitlines()[0] if message else ""
            lines.append(f"{name} raised {type(e).__name__}: {message}")

    def client(timeout=T(seconds=30)):
        return d.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)

    s = client()
    other = client()
    note("timeout", lambda: s.timeout)
    note("has_extended_api", s.has_extended_api)

    # Keys and values.
    note("set", lambda: s.set("k", "v"))
    note("set bytes", lambda: s.set("bin", b"\x00\xff\x01"))
    note("get", lambda: s.get("k"))
    note("get bytes", lambda: s.get("bin"))
    note("set empty", lambda: s.set("empty", ""))
    note("get empty", lambda: s.get("empty"))
    note("set again", lambda: s.set("k", "v2"))
    note("get again", lambda: s.get("k"))
    note("add new", lambda: s.add("n", 5))
    note("add", lambda: s.add("n", -7))
    note("add zero", lambda: s.add("n", 0))
    note("get counter", lambda: s.get("n"))
    note("compare_set missing, empty expected", lambda: s.compare_set("cs1", "", "first"))
    note("compare_set missing, other expected", lambda: s.compare_set("cs2", "x", "y"))
    note("check cs2", lambda: s.check(["cs2"]))
    note("compare_set match", lambda: s.compare_set("cs1", "first", "second"))
    note("compare_set mismatch", lambda: s.compare_set("cs1", "nope", "third"))
    note("compare_set bytes", lambda: s.compare_set("cs1", b"second", b"\x00"))
    note("check present", lambda: s.check(["k", "n"]))
    note("check one absent", lambda: s.check(["k", "absent"]))
    note("check none", lambda: s.check([]))
    note("num_keys", s.num_keys)
    note("delete_key", lambda: s.delete_key("k"))
    note("delete_key again", lambda: s.delete_key("k"))
    note("check deleted", lambda: s.check(["k"]))
    note("num_keys after delete", s.num_keys)
    note("multi_set", lambda: s.multi_set(["a", "b", "c"], ["1", b"2", "3"]))
    note("multi_get", lambda: s.multi_get(["c", "a", "b"]))
    note("multi_get none", lambda: s.multi_get([]))
    note("multi_set mismatched", lambda: s.multi_set(["x"], ["1", "2"]))
    note("append new", lambda: s.append("log", "ab"))
    note("append", lambda: s.append("log", b"cd"))
    note("get appended", lambda: s.get("log"))
    note("append to counter", lambda: s.append("n", "0"))
    note("get counter appended", lambda: s.get("n"))

    # Waits: present keys, a timeout, and no timeout while another client sets the key.
    note("wait present", lambda: s.wait(["a", "b"]))
    note("wait present, timeout", lambda: s.wait(["a"], T(milliseconds=300)))
    note("wait absent, timeout", lambda: s.wait(["never"], T(milliseconds=300)))
    note("set after the timed-out wait", lambda: s.set("after", "1"))
    note("get after the timed-out wait", lambda: s.get("after"))
    note("wait two absent, timeout", lambda: s.wait(["never", "nor"], T(milliseconds=300)))
    note("num_keys after timed-out waits", s.num_keys)
    # The timed-out wait's keys appearing now sends this client nothing it would misread.
    other.set("never", "late")
    other.get("never")
    note("get after the key came late", lambda: s.get("never"))
    setter = threading.Timer(0.3, lambda: client().set("soon", "here"))
    setter.start()
    note("wait without timeout for a key set meanwhile", lambda: s.wait(["soon"]))
    setter.join()
    note("get it", lambda: s.get("soon"))

    # set_timeout: get and multi_get of missing keys wait that long, then raise; the
    # connection goes on.
    note("set_timeout", lambda: s.set_timeout(T(milliseconds=300)))
    note("timeout now", lambda: s.timeout)
    note("get absent", lambda: s.get("absent"))
    note("get after the timed-out get", lambda: s.get("a"))
    note("multi_get one absent", lambda: s.multi_get(["a", "absent"]))
    note("multi_get after it", lambda: s.multi_get(["a", "b"]))
    note("wait absent, store timeout", lambda: s.wait(["absent"]))
    note("add after it", lambda: s.add("n2", 1))
    note("set_timeout back", lambda: s.set_timeout(T(seconds=30)))

    # Queues.
    if queues:
        queue_calls(s, note, client)

    note("list_keys", lambda: sorted(s.list_keys()))

    # barrier: alone; with a second client that arrives later; timed out (the client then sends
    # CANCEL_WAIT) and the connection goes on.
    note("barrier of one", lambda: s.barrier("bar1", 1))
    note("barrier of one again", lambda: s.barrier("bar1", 1))
    joined = []
    late = threading.Timer(0.3, lambda: joined.append(client().barrier("bar2", 2)))
    late.start()
    note("barrier of two", lambda: s.barrier("bar2", 2))
    late.join()
    note("the other one passed it", lambda: joined)
    joined = []
    second = threading.Timer(0.3, lambda: joined.append(client().barrier("bar4", 3)))
    third = threading.Timer(0.6, lambda: joined.append(client().barrier("bar4", 3)))
    second.start()
    third.start()
    note("barrier of three", lambda: s.barrier("bar4", 3))
    second.join()
    third.join()
    note("the other two passed it", lambda: joined)
    note("barrier counter", lambda: s.get("bar2"))
    note("barrier timed out", lambda: s.barrier("bar3", 2, T(milliseconds=300)))
    note("get after the timed-out barrier", lambda: s.get("bar3"))
    note("barrier after it", lambda: s.barrier("bar3", 2, T(seconds=5)))
    note("list_keys after barriers", lambda: sorted(s.list_keys()))

    # clone: a second connection with the same settings.
    c = s.clone()
    note("clone get", lambda: c.get("a"))
    note("clone timeout", lambda: c.timeout)
    note("clone set", lambda: c.set("from_clone", "1"))
    note("get what the clone set", lambda: s.get("from_clone"))

    # ADD and BARRIER on a value that is no number: the server closes that connection.
    bad = client(T(seconds=5))
    note("add to text", lambda: bad.add("log", 1))
    note("the same connection after it", lambda: bad.get("b"))
    bad = client(T(seconds=5))
    note("barrier on text", lambda: bad.barrier("log", 1))
    note("another connection after it", lambda: s.get("b"))
    note("num_keys at the end", s.num_keys)
    return lines


def queue_calls(s, note, client):
    note("queue_len unknown", lambda: s.queue_len("q"))
    note("queue_pop empty, not blocking", lambda: s.queue_pop("q", False))
    note("queue_push", lambda: s.queue_push("q", "one"))
    note("queue_push bytes", lambda: s.queue_push("q", b"two"))
    note("queue_len", lambda: s.queue_len("q"))
    note("check queue", lambda: s.check(["q"]))
    note("num_keys with a queue", s.num_keys)
    note("queue_pop", lambda: s.queue_pop("q"))
    note("queue_pop not blocking", lambda: s.queue_pop("q", False))
    note("queue_len emptied", lambda: s.queue_len("q"))
    note("check emptied queue", lambda: s.check(["q"]))
    note("set_timeout short", lambda: s.set_timeout(T(milliseconds=300)))
    note("queue_pop empty, blocking", lambda: s.queue_pop("q"))
    note("queue_len after it", lambda: s.queue_len("q"))
    pusher = threading.Timer(0.3, lambda: client().queue_push("q2", "pushed"))
    note("set_timeout longer", lambda: s.set_timeout(T(seconds=30)))
    pusher.start()
    note("queue_pop blocking until a push", lambda: s.queue_pop("q2"))
    pusher.join()
    note("queue on a plain key", lambda: s.queue_len("a"))


def main():
    print("methods:", " ".join(public_methods()))
    uncovered = [m for m in public_methods() if m not in CALLED and m not in NOT_REQUESTS]
    print("uncovered:", " ".join(uncovered))
    ours, ours_again = int(sys.argv[1]), int(sys.argv[2])
    libuv = d.TCPStore("127.0.0.1", 0, is_master=True, timeout=T(seconds=30), use_libuv=True)
    legacy = d.TCPStore("127.0.0.1", 0, is_master=True, timeout=T(seconds=30), use_libuv=False)
    for tag, port, queues in [("ours", ours, True), ("libuv", libuv.port, True),
                              ("ours-no-queues", ours_again, False),
                              ("legacy", legacy.port, False)]:
        for line in transcript(port, queues):
            print(f"{tag}: {line}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
