"""hvlrun's remote shell on a cluster engine: ``python -m hvlite.cluster.rsh [-x...] HOST COMMAND``.

hvlrun runs it (``--ssh-command``) as it would run ssh: for its check of each host and, through
MPICH's launcher hook, to start the host guard and MPI's proxy there. It asks the node agent
(``agent.py``) of HOST's first slot to run COMMAND, and plays the ssh client: the bytes on its
standard input go along (the job secret the host guard reads), the command's output comes back
on its own stdout/stderr, and it exits with the command's exit code.

Contract:
  * ``HVLRUN_CLUSTER_HOSTS`` names the host table the driver keeps (JSON ``{"hosts": {HOST:
    [agent address of each slot, in slot order]}}``, rewritten whole, atomically, as hosts come
    and go); ``HVLRUN_CLUSTER_KEY`` is the key the agents check. Both come from the
    environment only.
  * The command runs with ``HVLRUN_CLUSTER_SLOTS`` set to HOST's agent addresses, so that the
    rank process of each local rank finds the agent of its slot (``worker.py``).
  * Leading words starting with ``-`` are dropped, as hydra's ``-x`` is meant for ssh.
  * Exit code 255 (as ssh) with one line on stderr when HOST is not in the table, the table or
    the key is missing, or its agent cannot be reached or goes away.
  * When this process ends first (hvlrun ended the launcher), the agent ends the command.
"""
import base64
import json
import os
import stat
import sys
from typing import List, Optional, Sequence

from .frames import ChannelError, connect
from .names import ENV_HOSTS, ENV_KEY, ENV_SLOTS

__all__ = ["read_table", "main"]
_MAX_STDIN = 1 << 16


def read_table(path: str) -> dict:
    """Return ``{host: [agent address, ...]}`` from the table at ``path``.

    Raises:
        OSError, ValueError: it cannot be read or is not a table.
    """
    with open(path, encoding="utf-8") as f:
        table = json.load(f)
    hosts = table["hosts"]
    if not isinstance(hosts, dict):
        raise ValueError("%s: no host table" % path)
    return hosts


def _stdin_bytes() -> bytes:
    """Everything on standard input when it is a pipe or a file (hvlrun's secret line)."""
    try:
        mode = os.fstat(0).st_mode
    except OSError:
        return b""
    if not (stat.S_ISFIFO(mode) or stat.S_ISREG(mode)):
        return b""
    data = b""
    while len(data) < _MAX_STDIN:
        chunk = os.read(0, _MAX_STDIN - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _fail(host: str, message: str) -> int:
    sys.stderr.write("hvlite rsh: host %s: %s\n" % (host, message))
    sys.stderr.flush()
    return 255


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point; returns the exit code (see the module contract)."""
    args: List[str] = list(sys.argv[1:] if argv is None else argv)
    while args and args[0].startswith("-"):
        args.pop(0)
    if len(args) < 2:
        sys.stderr.write("usage: python -m hvlite.cluster.rsh HOST COMMAND...\n")
        return 255
    host, command = args[0], " ".join(args[1:])
    key, path = os.environ.get(ENV_KEY, ""), os.environ.get(ENV_HOSTS, "")
    if not key or not path:
        return _fail(host, "%s and %s must be set" % (ENV_KEY, ENV_HOSTS))
    try:
        slots = read_table(path).get(host)
    except (OSError, ValueError, KeyError) as e:
        return _fail(host, "cannot read the host table %s: %s" % (path, e))
    if not slots:
        return _fail(host, "not in the cluster's host table (%s)" % path)
    request = {"command": command, "env": {ENV_SLOTS: ",".join(slots)},
               "stdin": base64.b64encode(_stdin_bytes()).decode("ascii")}
    try:
        channel = connect(slots[0], key)
        channel.send("run", json.dumps(request).encode("utf-8"))
        while True:
            kind, data = channel.recv()
            if kind in ("out", "err"):
                stream = sys.stdout.buffer if kind == "out" else sys.stderr.buffer
                stream.write(data)
                stream.flush()
            elif kind == "exit":
                channel.close()
                return int(data.decode("ascii"))
    except (ChannelError, ValueError) as e:
        return _fail(host, "agent at %s: %s" % (slots[0], e))


if __name__ == "__main__":
    sys.exit(main())
