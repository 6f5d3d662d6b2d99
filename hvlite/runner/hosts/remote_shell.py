"""How hvlrun reaches other hosts: the remote shell, and MPICH's launcher hook.

Contract:
  * A remote shell is a command template (``HVLRUN_RSH``, split like a shell would): it is run
    as ``TEMPLATE... HOST COMMAND``, or, when a word holds ``{host}``, with the host put there and
    ``COMMAND`` appended. ``COMMAND`` is one string the far side's shell runs, as with
    ``ssh HOST COMMAND``. :func:`ssh_template` and :func:`srun_template` build the built-in ones;
    ``hvlrun --ssh-command`` gives any other (a site wrapper, a test stand-in).
  * ``python -m hvlite.runner.hosts.remote_shell HOST PROXY-WORDS...`` is what MPICH's mpiexec
    runs for every host that is not this machine (``world/mpi_command.py``'s
    ``launcher_options``; hydra passes the proxy
    command already quoted for a remote shell). It replaces itself (exec) with the remote shell
    running the host guard (``host_guard.py``) around the proxy and feeds the job secret to the
    guard's standard input through a pipe. Without ``HVLRUN_CONTROL_ADDR`` it runs the proxy
    without a guard. Errors (no ``HVLRUN_RSH``, remote shell not found) exit 255 with a message.
  * The far side uses the same Python and ``PYTHONPATH`` as hvlrun: hosts share one software
    layout, as MPI itself requires.
"""

import os
import shlex
import sys
from typing import List, Mapping, Optional, Sequence

from ...protocol.wire import ENV_SECRET
from ..control.names import (ENV_CONTROL_ADDR, ENV_HEARTBEAT, ENV_RSH, HOST_GUARD_MODULE,
                            REMOTE_SHELL_MODULE)

__all__ = ["ssh_template", "srun_template", "transport_argv", "guard_command", "main"]


def ssh_template(port: Optional[int] = None, identity_file: Optional[str] = None,
                 connect_timeout: float = 10.0) -> str:
    """Return the ssh remote shell: never prompts (BatchMode), gives up connecting after
    ``connect_timeout`` seconds. Cannot fail."""
    words = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=%d" % max(1, round(connect_timeout))]
    if port:
        words += ["-p", str(port)]
    if identity_file:
        words += ["-i", identity_file]
    return " ".join(shlex.quote(w) for w in words)


def srun_template() -> str:
    """Return the remote shell used inside a Slurm allocation: one step per host, with all of
    the allocation's CPUs on it (``--whole``), beside the other steps (``--overlap``), without
    Slurm's MPI plugin (hydra's proxy brings its own PMI). Cannot fail."""
    return ("srun --nodes=1 --ntasks=1 --nodelist={host} --whole --overlap --mpi=none "
            "--cpu-bind=none --kill-on-bad-exit=1 /bin/sh -c")


def transport_argv(template: str, host: str, command: str) -> List[str]:
    """Return the argv that runs ``command`` on ``host`` through ``template``.

    Raises:
        ValueError: if the template is empty or has unbalanced quotes.
    """
    words = shlex.split(template)
    if not words:
        raise ValueError("empty remote shell command")
    if any("{host}" in w for w in words):
        return [w.replace("{host}", host) for w in words] + [command]
    return words + [host, command]


def guard_command(host: str, control_addr: str, heartbeat_timeout: float, python: str,
                  pythonpath: Optional[str], proxy_words: Sequence[str] = (),
                  check: bool = False) -> str:
    """Return the far side's command line: the host guard around ``proxy_words``.

    ``proxy_words`` are passed as they came (hydra already quoted them for a remote shell); every
    other word is quoted here. Cannot fail.
    """
    words = [python, "-m", HOST_GUARD_MODULE, "--control", control_addr, "--host", host,
             "--heartbeat-timeout", "%g" % heartbeat_timeout]
    if check:
        words.append("--check")
    line = " ".join(shlex.quote(w) for w in words)
    if pythonpath:
        line = "env PYTHONPATH=%s %s" % (shlex.quote(pythonpath), line)
    if proxy_words:
        line += " -- " + " ".join(proxy_words)
    return "exec " + line


def _remote_command(host: str, proxy_words: Sequence[str], environ: Mapping[str, str]) -> str:
    addr = environ.get(ENV_CONTROL_ADDR)
    if not addr:
        return " ".join(proxy_words)
    timeout = float(environ.get(ENV_HEARTBEAT, "0") or 0)
    return guard_command(host, addr, timeout, sys.executable, environ.get("PYTHONPATH"),
                         proxy_words)


def _exec_with_input(argv: List[str], first_line: str) -> None:
    """Replace this process with ``argv``, its standard input a pipe holding ``first_line``."""
    read_end, write_end = os.pipe()
    os.write(write_end, first_line.encode("ascii") + b"\n")  # far below a pipe's capacity
    os.close(write_end)
    os.dup2(read_end, 0)
    os.close(read_end)
    os.execvp(argv[0], argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point (hydra's launcher); returns only on error, with 255."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        sys.stderr.write("usage: python -m %s HOST COMMAND...\n" % REMOTE_SHELL_MODULE)
        return 255
    host, proxy_words = args[0], args[1:]
    template = os.environ.get(ENV_RSH)
    if not template:
        sys.stderr.write("hvlrun: %s is not set: no way to reach host %s\n" % (ENV_RSH, host))
        return 255
    try:
        command = transport_argv(template, host, _remote_command(host, proxy_words, os.environ))
        if os.environ.get(ENV_CONTROL_ADDR):
            _exec_with_input(command, os.environ.get(ENV_SECRET, ""))
        os.execvp(command[0], command)      # no guard, no secret to pass
    except (OSError, ValueError) as e:
        sys.stderr.write("hvlrun: cannot reach host %s with %r: %s\n" % (host, template, e))
    return 255


if __name__ == "__main__":
    sys.exit(main())
