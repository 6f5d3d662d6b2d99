"""What a job's parsed hvlrun flags mean for launching a world: the ranks' variables, which
hosts are remote and through which shell, the network interfaces, the control channel's address,
and the launcher options that follow (``start.py`` uses them for every world).

Contract: pure functions of the parsed ``args``, the host list and the knob flags' variables
(plus this machine's environment); ValueError on a bad ``--network-interface``.
"""
import argparse
import os
import re
import shutil
import socket
import sys
from typing import Dict, List, Mapping, Sequence, Tuple

from ..hosts import hostlist as hostlib
from ..control.names import ENV_OMP_AUTO, ENV_OUTPUT_DIR, ENV_PREFIX_TIME
from .mpi_command import interface_options, launcher_env, remote_options
from ..hosts.remote_shell import srun_template, ssh_template

__all__ = ["openmpi_exports", "rank_env", "remote_hosts", "rsh_template", "interface_names",
           "control_address", "job_settings"]

# Open MPI forwards only what -x names, hydra the whole environment: Open MPI gets every
# variable but these, which describe this host, this shell or a launcher's own ranks (as
# Horovod's runner skips shell functions, OLDPWD and *CUDA_VISIBLE_DEVICES).
_NOT_FORWARDED = re.compile(r"(HOSTNAME|HOST|PWD|OLDPWD|SHLVL|_|BASH_FUNC_.*|SSH_.*|"
                            r".*CUDA_VISIBLE_DEVICES|OMPI_(?!MCA_).*|PMIX_.*|PMI_.*|HYDRA_.*)")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def openmpi_exports(environ: Mapping[str, str]) -> List[str]:
    """The names Open MPI's ``mpirun`` forwards to every rank with ``-x`` (sorted): every
    variable of ``environ`` with a plain name that is not host- or launcher-specific."""
    return sorted(n for n in environ if _NAME.fullmatch(n) and not _NOT_FORWARDED.fullmatch(n))


def rank_env(args: argparse.Namespace, hosts: Sequence[hostlib.Host],
             knobs: Mapping[str, str]) -> Dict[str, str]:
    """Return the variables hvlrun sets for every rank (knobs, threads, output directory, time
    prefix, ``--tcp``)."""
    variables = dict(knobs)
    if "OMP_NUM_THREADS" not in os.environ:
        # this host's value; each rank's wrapper works out its own host's (ENV_OMP_AUTO)
        local = hostlib.local_rank_count(hosts, args.np)
        variables["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // local))
        variables[ENV_OMP_AUTO] = "1"
    if args.output_filename:
        variables[ENV_OUTPUT_DIR] = os.path.abspath(args.output_filename)
    if args.prefix_output_with_timestamp:
        variables[ENV_PREFIX_TIME] = "1"
    if args.tcp:                        # horovodrun's --tcp: no InfiniBand for NCCL either
        variables["NCCL_IB_DISABLE"] = "1"
    return variables


def remote_hosts(hosts: Sequence[hostlib.Host], np: int) -> List[str]:
    """Return the names of the hosts that get a rank and are not this machine."""
    counts = hostlib.ranks_per_host(hosts, np)
    return [h.name for h, c in zip(hosts, counts) if c and not hostlib.is_local(h.name)]


def rsh_template(args: argparse.Namespace) -> str:
    """Return the remote shell the flags and the environment ask for."""
    if args.ssh_command:
        return args.ssh_command
    in_slurm = bool(os.environ.get("SLURM_JOB_ID")) and shutil.which("srun") is not None
    if args.remote_shell == "srun" or (args.remote_shell == "auto" and in_slurm):
        return srun_template()
    return ssh_template(args.ssh_port, args.ssh_identity_file)


def interface_names(args: argparse.Namespace) -> List[str]:
    """Return the ``--network-interface`` names, of every time the flag was given, in order,
    each once (ValueError on an empty entry)."""
    given = args.network_interface or []
    if isinstance(given, str):          # one value set by hand, not by the parser
        given = [given]
    names = []
    for value in given:
        parts = [n.strip() for n in value.split(",")]
        if not all(parts):
            raise ValueError("empty name in --network-interface %r" % value)
        names += [n for n in parts if n not in names]
    return names


def control_address(remote: Sequence[str], names: Sequence[str]) -> Tuple[str, str]:
    """Return ``(bind, advertise)`` for the control server, given the remote hosts and the
    ``--network-interface`` names (ValueError on a bad interface)."""
    if not remote:
        return "127.0.0.1", "127.0.0.1"
    if names:
        address = hostlib.interface_ipv4(names[0])
        return address, address
    return "0.0.0.0", socket.gethostname()


def job_settings(args: argparse.Namespace, hosts: Sequence[hostlib.Host], flavour: str,
                 knobs: Mapping[str, str]) -> Tuple[List[str], Dict[str, str], Dict[str, str]]:
    """Return the launch options, the rank variables (``knobs``: the knob flags' ``HVLITE_*``
    variables, first) and the launcher's variables."""
    variables = rank_env(args, hosts, knobs)
    options, launcher_vars = [], launcher_env(flavour, os.geteuid())
    if remote_hosts(hosts, args.np):
        more, env = remote_options(flavour, sys.executable, rsh_template(args))
        options += more
        launcher_vars.update(env)
    more, env = interface_options(flavour, interface_names(args))
    options += more
    variables.update({k: v for k, v in env.items() if k not in os.environ})
    return options, variables, launcher_vars
