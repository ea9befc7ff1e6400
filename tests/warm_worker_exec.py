"""The Ray worker command of a run attached to the test session's cluster (:mod:`tests.warm_workers`): asks the
session's server for a forked process that becomes the worker, and stands in for it towards Ray.

Ray starts this as ``<python> warm_worker_exec.py default_worker.py <Ray's arguments>``. It sends the server its
arguments, environment, working directory and standard streams, plus the read end of a pipe whose write end only
it holds (the worker ends when this program is killed); passes the signals it gets to the worker; and ends with
the worker's exit status. Without a server (none answering) it runs the worker itself, as Ray would have.

Standard library only, and nothing else: it runs once per worker process.
"""

import json
import os
import signal
import socket
import sys


def _run_here() -> None:
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])


def main() -> None:
    path = os.environ.get("GRPO_DIST_TEST_WARM_SOCKET", "")
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:
        _run_here()
    lifeline_r, lifeline_w = os.pipe()
    request = json.dumps({"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    socket.send_fds(conn, [len(request).to_bytes(8, "big")], [0, 1, 2, lifeline_r])
    conn.sendall(request)
    os.close(lifeline_r)
    pid_bytes = b""
    while len(pid_bytes) < 8:
        chunk = conn.recv(8 - len(pid_bytes))
        if not chunk:
            sys.exit(1)  # the server is gone (the session ends)
        pid_bytes += chunk
    pid = int.from_bytes(pid_bytes, "big")

    def forward(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    status = b""
    while len(status) < 8:
        try:
            chunk = conn.recv(8 - len(status))
        except InterruptedError:
            continue
        if not chunk:
            sys.exit(1)
        status += chunk
    code = os.waitstatus_to_exitcode(int.from_bytes(status, "big", signed=True))
    if code < 0:  # ended by a signal: end by the same one
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main()
