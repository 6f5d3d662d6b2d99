"""The ``mpiexec`` command line for each MPI flavour.

Contract:
  * Flavours are ``"mpich"`` (hydra), ``"openmpi"`` (mpirun/prterun) and ``"unknown"``, which is
    launched like ``"mpich"``. :func:`flavour_from_version` maps ``mpiexec --version`` output to a
    flavour; :func:`query_flavour` runs that command once.
  * :func:`build_command` is pure: it returns the argv list and starts nothing. Every rank runs
    ``<python> -m hvlite.runner.world.rank_exec -- <command...>``.
  * hydra gets ``-genv NAME VALUE`` per variable (it also passes the whole environment by
    default); Open MPI gets ``-x NAME`` per variable, so those variables must also be set in the
    environment ``mpirun`` itself runs with (:func:`launcher_env` adds what ``mpirun`` needs).
  * Remote hosts: with MPICH, hydra starts each remote proxy through ``hosts/remote_shell.py``
    (which runs the host guard there; :func:`launcher_options`); with Open MPI, ``plm_rsh_agent``
    is the remote shell itself (no guard: each rank's wrapper still stops on its own when hvlrun
    is lost). See :func:`remote_options`. :func:`interface_options` pins MPI's traffic to named
    interfaces.
  * Hosts always go on the command line in the flavour's own syntax (``-hosts a:2,b:4`` or
    ``-H a:2,b:4``), because hostfile syntaxes differ between flavours; an all-localhost list
    adds no host option at all.
"""

import shlex
import subprocess
import sys
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..control.names import ENV_RSH, RANK_EXEC_MODULE, REMOTE_SHELL_MODULE
from ..hosts.hostlist import Host

__all__ = ["flavour_from_version", "query_flavour", "build_command", "launcher_env",
           "format_command", "launcher_options", "remote_options", "interface_options"]


def flavour_from_version(text: str) -> str:
    """Name the MPI flavour from ``mpiexec --version`` output.

    Args:
        text: stdout and stderr of ``mpiexec --version``.

    Returns:
        ``"mpich"`` (output mentions HYDRA), ``"openmpi"`` (Open MPI, OpenRTE or PRRTE) or
        ``"unknown"``.
    """
    if "HYDRA" in text.upper():
        return "mpich"
    if any(word in text for word in ("Open MPI", "OpenRTE", "PRRTE")):
        return "openmpi"
    return "unknown"


def query_flavour(mpiexec: str, timeout: float = 10.0) -> str:
    """Run ``<mpiexec> --version`` once and name its flavour.

    Args:
        mpiexec: the executable.
        timeout: seconds to wait for it.

    Returns:
        As :func:`flavour_from_version`; ``"unknown"`` if it cannot be run or times out.
    """
    try:
        done = subprocess.run([mpiexec, "--version"], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return flavour_from_version(done.stdout.decode("utf-8", "replace"))


def _host_list(hosts: Optional[Sequence[Host]]) -> Optional[str]:
    """Return ``a:2,b:4``, or None when there are no hosts or only ``localhost``."""
    if not hosts or all(h.name == "localhost" for h in hosts):
        return None
    return ",".join("%s:%d" % (h.name, h.slots) for h in hosts)


def launcher_options(python: str) -> Tuple[List[str], Dict[str, str]]:
    """Return the mpiexec (hydra) options and environment that make it start remote proxies
    through ``hosts/remote_shell.py``: hydra's rsh launcher runs ``<launcher-exec> <extra args>
    HOST <proxy command>``, which becomes ``python -m hvlite.runner.hosts.remote_shell HOST ...``.
    Cannot fail."""
    return (["-launcher", "rsh", "-launcher-exec", python],
            {"HYDRA_LAUNCHER_EXTRA_ARGS": "-m " + REMOTE_SHELL_MODULE})


def remote_options(flavour: str, python: str, rsh_template: str) -> Tuple[List[str], Dict[str, str]]:
    """Return the launcher options and launcher environment that reach remote hosts.

    Args:
        flavour: the MPI flavour.
        python: the interpreter hydra runs ``remote_shell`` with (hvlrun's own).
        rsh_template: the remote shell (``remote_shell.transport_argv``); Open MPI gets it as
            its ``plm_rsh_agent`` unless it holds ``{host}`` (srun: Open MPI's own Slurm
            support starts its daemons then).

    Returns:
        ``(options, env)``. Cannot fail.
    """
    if flavour == "openmpi":
        if "{host}" in rsh_template:  # e.g. srun: Open MPI launches through Slurm by itself
            return [], {}
        return ["--mca", "plm_rsh_agent", rsh_template], {}
    options, env = launcher_options(python)
    env[ENV_RSH] = rsh_template
    return options, env


def interface_options(flavour: str, interfaces: Sequence[str]) -> Tuple[List[str], Dict[str, str]]:
    """Return the launcher options and rank variables that keep MPI's (and NCCL's) traffic on
    ``interfaces`` (hydra's ``-iface`` takes the first; OFI's TCP provider and NCCL take the
    first and the list). Cannot fail."""
    if not interfaces:
        return [], {}
    env = {"NCCL_SOCKET_IFNAME": ",".join(interfaces), "FI_TCP_IFACE": interfaces[0]}
    if flavour == "openmpi":
        names = ",".join(interfaces)
        return ["--mca", "btl_tcp_if_include", names, "--mca", "oob_tcp_if_include", names], env
    return ["-iface", interfaces[0]], env


def build_command(flavour: str, mpiexec: str, np: int, hosts: Optional[Sequence[Host]],
                  rank_env: Mapping[str, str], mpi_args: str, command: Sequence[str],
                  python: Optional[str] = None, export_names: Sequence[str] = (),
                  launch_options: Sequence[str] = ()) -> List[str]:
    """Build the launch command. Pure: starts nothing.

    Args:
        flavour: ``"mpich"``, ``"openmpi"`` or ``"unknown"`` (launched like mpich).
        mpiexec: the launcher executable.
        np: number of ranks.
        hosts: the host list, or None for all ranks on this machine.
        rank_env: variables hvlrun sets for every rank (name to value).
        mpi_args: extra launcher arguments as one string, split with ``shlex``.
        command: the user's command.
        python: the interpreter that runs the per-rank wrapper; ``sys.executable`` if None.
        export_names: more variables for Open MPI to forward from ``mpirun``'s environment
            (``-x NAME``); ignored for hydra, which forwards the whole environment.
        launch_options: launcher options placed before ``mpi_args`` (from
            :func:`remote_options` and :func:`interface_options`).

    Returns:
        The argv list.

    Raises:
        ValueError: if ``command`` is empty or ``mpi_args`` has unbalanced quotes.
    """
    if not command:
        raise ValueError("no command to run")
    extra = shlex.split(mpi_args or "")
    host_list = _host_list(hosts)
    if flavour == "openmpi":
        argv = [mpiexec, "--allow-run-as-root", "--oversubscribe", "-np", str(np)]
        if host_list:
            argv += ["-H", host_list]
        for name in list(rank_env) + [n for n in export_names if n not in rank_env]:
            argv += ["-x", name]
    else:
        argv = [mpiexec, "-n", str(np)]
        if host_list:
            argv += ["-hosts", host_list]
        for name, value in rank_env.items():
            argv += ["-genv", name, str(value)]
    wrapper = [python or sys.executable, "-m", RANK_EXEC_MODULE, "--"]
    return argv + list(launch_options) + extra + wrapper + list(command)


def launcher_env(flavour: str, euid: int) -> dict:
    """Variables the launcher process itself needs.

    Args:
        flavour: the MPI flavour.
        euid: the effective user id hvlrun runs as (``os.geteuid()``).

    Returns:
        ``OMPI_ALLOW_RUN_AS_ROOT`` and ``OMPI_ALLOW_RUN_AS_ROOT_CONFIRM`` set to ``"1"`` for Open
        MPI run as root; otherwise an empty dict.
    """
    if flavour == "openmpi" and euid == 0:
        return {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    return {}


def format_command(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """Render a command and the variables hvlrun adds as a runnable shell snippet.

    Args:
        argv: the command.
        env: the variables hvlrun adds to the launcher's environment.

    Returns:
        ``export NAME=value`` lines (sorted) followed by the shell-quoted command, ending in a
        newline.
    """
    lines = ["export %s=%s" % (name, shlex.quote(str(env[name]))) for name in sorted(env)]
    lines.append(" ".join(shlex.quote(str(a)) for a in argv))
    return "\n".join(lines) + "\n"
