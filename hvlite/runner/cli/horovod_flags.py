"""horovodrun's command line in hvlrun, so a migrated job script keeps its launch line: Horovod's
names for hvlrun's own flags, its ``--no-*`` switches, ``--config-file``, and its flags that
hvlite has nothing behind.

Contract:
  * :func:`add_horovod_flags` adds them to hvlrun's parser, out of ``--help``'s list (the
    hvlrun reference lists them: ``docs/reference/_horovodrun_flags.md``, which
    ``tools/docs_reference.py`` writes; ``docs/migrating.md`` says what each does). Second names that sit where hvlrun's own flags are
    made (``-cb``, ``-hostfile``, ``--min-num-proc``, ``--max-num-proc``,
    ``-prefix-timestamp``) are ``flags.py``'s.
  * :func:`apply_horovod_flags` runs after parsing and before anything reads the flags:
      - ``--config-file FILE``: Horovod's YAML file (sections ``params``, ``autotune``,
        ``timeline``, ``stall_check``, ``library_options``, ``logging``, ``controller``) sets
        every setting the command line left unset (the command line wins);
      - ``--gloo``, ``--jsrun`` and ``controller: gloo`` are refused: hvlite runs on MPI;
      - ``--binding-args`` goes to mpiexec after ``--mpi-args``; ``--disable-cache`` (Horovod:
        reuse no check of the hosts from the last hour) holds always: hvlrun keeps no cache, it
        checks the hosts at every start; ``--tcp`` keeps NCCL off InfiniBand
        (``NCCL_IB_DISABLE=1``, ``world/settings.py``) and says that MPI's transport is MPI's;
      - each flag or key of :data:`NO_EFFECT` that was given is named in one line (``say``),
        with why it changes nothing here; the job runs.
    It raises ``ValueError`` naming the file, section, key or flag that is wrong: an unreadable
    file or one that is not YAML, an unknown section or key (a typo must not pass silently), a
    value that hvlrun's own flag would refuse.
  * The switches' ``--no-*`` forms set the knob's variable to "0" (``knobs.knob_env``), so they
    also turn off a setting exported as ``HVLITE_*``/``HOROVOD_*``.
Imports no engine code; PyYAML only for ``--config-file`` (an error says to install it).
"""
import argparse
from typing import Callable, Dict, Optional, Tuple

from .knobs import KNOBS, dest

__all__ = ["NO_EFFECT", "HOROVODRUN_FLAGS", "flag_table", "add_horovod_flags", "apply_horovod_flags"]

# Every flag of horovodrun 0.28 (horovod/runner/launch.py), each accepted by hvlrun: what hvlrun
# does with it is :func:`flag_table`'s (the migration page's table is generated from it).
HOROVODRUN_FLAGS = (
    "-v", "--version", "-np", "--num-proc", "-cb", "--check-build", "--disable-cache",
    "--start-timeout", "--network-interfaces", "--network-interface", "--output-filename",
    "--verbose", "--config-file", "-p", "--ssh-port", "-i", "--ssh-identity-file",
    "--fusion-threshold-mb", "--cycle-time-ms", "--cache-capacity", "--hierarchical-allreduce",
    "--no-hierarchical-allreduce", "--hierarchical-allgather", "--no-hierarchical-allgather",
    "--torus-allreduce", "--no-torus-allreduce", "--autotune", "--no-autotune",
    "--autotune-log-file", "--autotune-warmup-samples", "--autotune-steps-per-sample",
    "--autotune-bayes-opt-max-samples", "--autotune-gaussian-process-noise", "--min-np",
    "--min-num-proc", "--max-np", "--max-num-proc", "--slots-per-host", "--elastic-timeout",
    "--reset-limit", "--blacklist-cooldown-range", "--timeline-filename",
    "--timeline-mark-cycles", "--no-timeline-mark-cycles", "--no-stall-check", "--stall-check",
    "--stall-check-warning-time-seconds", "--stall-check-shutdown-time-seconds",
    "--mpi-threads-disable", "--no-mpi-threads-disable", "--mpi-args", "--tcp", "--binding-args",
    "--num-nccl-streams", "--thread-affinity", "--gloo-timeout-seconds", "--log-level",
    "--log-with-timestamp", "--log-without-timestamp", "-prefix-timestamp",
    "--prefix-output-with-timestamp", "--log-hide-timestamp", "--no-log-hide-timestamp", "-H",
    "--hosts", "-hostfile", "--hostfile", "--host-discovery-script", "--gloo", "--mpi", "--jsrun",
)

HONOURED, NO_EFFECT_STATUS, REFUSED = "honoured", "no effect", "refused"

# What a few honoured flags do where it is not hvlrun's flag of the same name.
_HONOURED_AS = {
    "--disable-cache": "always so: hvlrun keeps no cache of host checks, it checks the hosts at "
                       "every start",
    "--config-file": "Horovod's YAML sections and keys set the flags they name (the command line "
                     "wins); a key hvlite has nothing behind is named like its flag",
    "--binding-args": "passed to mpiexec after --mpi-args",
    "--tcp": "keeps NCCL off InfiniBand (NCCL_IB_DISABLE=1); MPI's transport is MPI's (for "
             "MPICH: FI_PROVIDER=tcp, or --mpi-args), which hvlrun says",
    "--mpi": "hvlrun always runs MPI",
    "-v": "prints hvlrun's version", "--version": "prints hvlrun's version",
    "--network-interface": "every time given; the names of all are used",
    "--network-interfaces": "as --network-interface",
}

# Horovod's name -> hvlrun's knob flag of the same meaning and type.
_SECOND_NAMES = {
    "--stall-check-warning-time-seconds": "--stall-check-seconds",
    "--stall-check-shutdown-time-seconds": "--stall-shutdown-seconds",
}

# Horovod's on/off flags over hvlrun's switches: flag -> (hvlrun's switch, the value it sets).
_SWITCHES = {
    "--no-autotune": ("--autotune", False),
    "--no-hierarchical-allreduce": ("--hierarchical-allreduce", False),
    "--no-timeline-mark-cycles": ("--timeline-mark-cycles", False),
    "--stall-check": ("--no-stall-check", False),
    "--no-mpi-threads-disable": ("--mpi-threads-disable", False),
    "--log-with-timestamp": ("--log-without-timestamp", False),
    "--log-hide-timestamp": ("--log-without-timestamp", True),      # Horovod's older names
    "--no-log-hide-timestamp": ("--log-without-timestamp", False),
}

# Horovod flags with nothing behind them in hvlite: flag -> (argparse kind, why). A kind of None
# is an on/off switch whose ``--no-`` form is accepted too.
NO_EFFECT = {
    "--hierarchical-allgather": (None, "hvlite has no hierarchical allgather (on one host, "
                                       "allgather already runs in shared memory)"),
    "--torus-allreduce": (None, "hvlite has no torus allreduce (--hierarchical-allreduce is its "
                                "two-level one)"),
    "--num-nccl-streams": (int, "hvlite's NCCL plane runs on one stream per GPU"),
    "--gloo-timeout-seconds": (int, "hvlite has no Gloo (its bound on waits for other ranks is "
                                    "HVLITE_PEER_TIMEOUT_SECONDS)"),
}
_TCP_NOTE = ("note: --tcp keeps NCCL off InfiniBand (NCCL_IB_DISABLE=1); MPI picks its own transport: "
             "choose it with the MPI's settings (for MPICH, FI_PROVIDER=tcp) or --mpi-args")

_REFUSED = {
    "use_gloo": "--gloo: hvlite has no Gloo controller; it runs on MPI, which hvlrun starts "
                "(drop --gloo)",
    "use_jsrun": "--jsrun: hvlrun does not start jobs with LSF's jsrun; inside an LSF allocation "
                 "run hvlrun with -H/--hostfile, or the site's mpirun",
}

# --config-file: section -> key -> the flag it sets (for enabled/with_timestamp: the value is
# turned around where the flag says the opposite).
_CONFIG = {
    "params": {"fusion_threshold_mb": "--fusion-threshold-mb", "cycle_time_ms": "--cycle-time-ms",
               "cache_capacity": "--cache-capacity",
               "hierarchical_allreduce": "--hierarchical-allreduce",
               "hierarchical_allgather": "--hierarchical-allgather",
               "torus_allreduce": "--torus-allreduce"},
    "autotune": {"enabled": "--autotune", "log_file": "--autotune-log-file",
                 "warmup_samples": "--autotune-warmup-samples",
                 "steps_per_sample": "--autotune-steps-per-sample",
                 "bayes_opt_max_samples": "--autotune-bayes-opt-max-samples",
                 "gaussian_process_noise": "--autotune-gaussian-process-noise"},
    "timeline": {"filename": "--timeline-filename", "mark_cycles": "--timeline-mark-cycles"},
    "stall_check": {"enabled": "--no-stall-check",
                    "warning_time_seconds": "--stall-check-seconds",
                    "shutdown_time_seconds": "--stall-shutdown-seconds"},
    "library_options": {"mpi_threads_disable": "--mpi-threads-disable",
                        "num_nccl_streams": "--num-nccl-streams",
                        "thread_affinity": "--thread-affinity",
                        "gloo_timeout_seconds": "--gloo-timeout-seconds"},
    "logging": {"level": "--log-level", "with_timestamp": "--log-without-timestamp",
                "hide_timestamp": "--log-without-timestamp"},
}
_TURNED_AROUND = {("stall_check", "enabled"), ("logging", "with_timestamp")}

_KINDS = {option: kind for option, _, kind, _ in KNOBS}
_KINDS.update((option, kind) for option, (kind, _) in NO_EFFECT.items())


def flag_table():
    """[(flag, status, text)] for every flag of :data:`HOROVODRUN_FLAGS`, in its order: status
    is ``honoured`` (text: as what, where not hvlrun's flag of the same name), ``no effect``
    (hvlrun names it at launch; text: why) or ``refused`` (hvlrun exits; text: why)."""
    refused = {"--gloo": _REFUSED["use_gloo"], "--jsrun": _REFUSED["use_jsrun"]}
    table = []
    for flag in HOROVODRUN_FLAGS:
        base = "--" + flag[5:] if flag.startswith("--no-") and "--" + flag[5:] in NO_EFFECT else flag
        if flag in refused:
            table.append((flag, REFUSED, refused[flag].split(": ", 1)[1]))
        elif base in NO_EFFECT:
            table.append((flag, NO_EFFECT_STATUS if base == flag else HONOURED,
                          NO_EFFECT[base][1] if base == flag else "off is what hvlite does"))
        elif flag in _HONOURED_AS:
            table.append((flag, HONOURED, _HONOURED_AS[flag]))
        elif flag in _SECOND_NAMES:
            table.append((flag, HONOURED, "as %s" % _SECOND_NAMES[flag]))
        elif flag in _SWITCHES:
            switch, value = _SWITCHES[flag]
            table.append((flag, HONOURED, "as %s%s" % (switch, "" if value else " off")))
        else:
            table.append((flag, HONOURED, ""))
    return table


def add_horovod_flags(parser: argparse.ArgumentParser) -> None:
    """Add horovodrun's flags that hvlrun has no own name for (see the module contract)."""
    hidden = argparse.SUPPRESS
    for name, knob in _SECOND_NAMES.items():
        parser.add_argument(name, dest=dest(knob), type=_KINDS[knob], help=hidden)
    for name, (switch, value) in _SWITCHES.items():
        parser.add_argument(name, dest=dest(switch), action="store_const", const=value,
                            default=None, help=hidden)
    for flag, (kind, _) in NO_EFFECT.items():
        if kind is None:
            parser.add_argument(flag, action="store_true", default=None, help=hidden)
            parser.add_argument("--no-" + flag[2:], dest=dest(flag), action="store_false",
                                default=None, help=hidden)
        else:
            parser.add_argument(flag, type=kind, help=hidden)
    parser.add_argument("--config-file", metavar="FILE", help=hidden)
    parser.add_argument("--disable-cache", action="store_true", help=hidden)
    parser.add_argument("--binding-args", metavar="ARGS", help=hidden)
    parser.add_argument("--tcp", action="store_true", help=hidden)
    parser.add_argument("--mpi", dest="use_mpi", action="store_true", help=hidden)
    parser.add_argument("--gloo", dest="use_gloo", action="store_true", help=hidden)
    parser.add_argument("--jsrun", dest="use_jsrun", action="store_true", help=hidden)


def apply_horovod_flags(args: argparse.Namespace, say: Callable[[str], None]) -> None:
    """Fold horovodrun's flags and ``--config-file`` into ``args`` (see the module contract).

    Raises:
        ValueError: naming what is wrong.
    """
    if args.config_file:
        _apply_config(args, _read_config(args.config_file))
    for attribute, why in _REFUSED.items():
        if getattr(args, attribute):
            raise ValueError(why)
    if args.binding_args:
        args.mpi_args = (args.mpi_args + " " + args.binding_args).strip()
    for flag, (_, why) in NO_EFFECT.items():
        value = getattr(args, dest(flag))
        if value is not None and value is not False:            # "off" is what hvlite does
            say("note: %s has no effect in hvlite: %s" % (flag, why))
    if args.tcp:
        say(_TCP_NOTE)


def _read_config(path: str) -> dict:
    """The parsed file: a mapping (ValueError otherwise)."""
    try:
        import yaml
    except ImportError:
        raise ValueError("--config-file needs PyYAML: pip install pyyaml") from None
    try:
        with open(path) as f:
            config = yaml.safe_load(f)
    except OSError as e:
        raise ValueError("--config-file %s: %s" % (path, e.strerror or e)) from None
    except yaml.YAMLError as e:
        raise ValueError("--config-file %s is not YAML: %s" % (path, e)) from None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ValueError("--config-file %s: expected sections (params, autotune, ...), got a %s"
                         % (path, type(config).__name__))
    return config


def _apply_config(args: argparse.Namespace, config: dict) -> None:
    """Set what the command line left unset from a parsed config file."""
    for section, entries in config.items():
        if section == "controller":
            if entries is None or args.use_mpi or args.use_gloo:    # the command line wins
                continue
            if str(entries).lower() != "mpi":
                raise ValueError("--config-file: controller %s: hvlite has no such controller; it "
                                 "runs on MPI (write controller: mpi, or leave it out)" % (entries,))
            continue
        keys = _CONFIG.get(section)
        if keys is None:
            raise ValueError("--config-file: unknown section %r (known: controller, %s)"
                             % (section, ", ".join(_CONFIG)))
        if entries is None:
            continue
        if not isinstance(entries, dict):
            raise ValueError("--config-file: section %s must hold key: value lines" % section)
        for key, value in entries.items():
            flag = keys.get(key)
            if flag is None:
                raise ValueError("--config-file: unknown key %s.%s (known: %s)"
                                 % (section, key, ", ".join(keys)))
            if getattr(args, dest(flag)) is None and value is not None:
                setattr(args, dest(flag), _config_value(section, key, flag, value))


def _config_value(section: str, key: str, flag: str, value) -> object:
    """``value`` as parsing ``flag`` on the command line would give it (ValueError if bad).
    As Horovod reads its file: 0 and 1 are also off and on, a whole float is also an integer."""
    kind = _KINDS.get(flag)
    if kind is None:
        if value not in (True, False):          # 0 and 1 compare equal to them
            raise ValueError("--config-file: %s.%s must be true or false, not %r"
                             % (section, key, value))
        return (not value) if (section, key) in _TURNED_AROUND else bool(value)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError("--config-file: %s.%s: %r is not a %s" % (section, key, value,
                                                                   "name" if kind is str else "number"))
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    try:
        return kind(str(value))
    except (argparse.ArgumentTypeError, ValueError) as e:
        raise ValueError("--config-file: %s.%s: %s" % (section, key, e)) from None
