"""The table of Horovod's HOROVOD_* variables (hvlite/horovod_env.py): every alias it calls
honoured is a setting of the engine's table (csrc/core/param.c, which reads HOROVOD_<suffix>
for it), the lines rank 0 prints name what is not used (once, not at log level error), and a
whole init in one process prints them, leaves HOROVOD_TIMELINE=DYNAMIC's file unmade and still
starts a timeline from code."""
import os
import re
import subprocess
import sys

from hvlite import horovod_env
from hvlite.horovod_env import BUILD, HONOURED, UNUSED, VARIABLES, notes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def param_suffixes():
    with open(os.path.join(ROOT, "csrc", "core", "param.c")) as f:
        text = f.read()
    table = text[text.index("static const param_def table[]"):]
    return set(re.findall(r'^\s*\{"([A-Z0-9_]+)",', table[:table.index("};")], re.M))


def test_every_alias_is_a_setting_of_the_engine():
    suffixes = param_suffixes()
    aliases = [(name, v.alias) for name, v in VARIABLES.items() if v.alias]
    assert len(aliases) >= 20, aliases
    for name, alias in aliases:
        assert VARIABLES[name].status == HONOURED, name
        assert alias.startswith("HVLITE_") and alias[len("HVLITE_"):] == name[len("HOROVOD_"):], name
        assert alias[len("HVLITE_"):] in suffixes, "%s: %s is not in param.c's table" % (name, alias)


def test_every_entry_says_something():
    for name, variable in VARIABLES.items():
        assert name.startswith("HOROVOD_") and variable.status in (HONOURED, UNUSED, BUILD), name
        assert variable.text, name


def test_notes_name_what_is_not_used_and_nothing_else():
    environ = {"HOROVOD_FUSION_THRESHOLD": "1", "HOROVOD_CONTROLLER": "gloo",
               "HOROVOD_CPU_OPERATIONS": "MPI", "HOROVOD_TORUS_ALLREDUCE": "1",
               "HOROVOD_GPU_OPERATIONS": "NCCL", "HOROVOD_WITH_PYTORCH": "1",
               "HOROVOD_FUSION_TRESHOLD": "1", "HOROVOD_NCCL_LIB": "/usr/lib", "PATH": "/bin"}
    lines = notes(environ)
    assert lines[0].startswith("HOROVOD_CONTROLLER=gloo is not used by hvlite: hvlite has no Gloo")
    assert lines[1].startswith("HOROVOD_TORUS_ALLREDUCE is not used by hvlite: hvlite has no torus")
    assert lines[2].startswith("HOROVOD_GPU_OPERATIONS, HOROVOD_WITH_PYTORCH are not used by hvlite: "
                               "Horovod's pip install reads them to choose what it compiles")
    assert lines[3].startswith("HOROVOD_FUSION_TRESHOLD is not used by hvlite: Horovod 0.28 reads "
                               "no such variable either")
    assert len(lines) == 4, lines      # honoured ones, and CPU_OPERATIONS=mpi, are not named


def test_said_once_and_not_at_level_error(monkeypatch):
    said = []
    monkeypatch.setattr(horovod_env, "_said", False)
    horovod_env.say_once({"HOROVOD_HOSTNAME": "a", "HVLITE_LOG_LEVEL": "error"}, said.append)
    assert said == []
    monkeypatch.setattr(horovod_env, "_said", False)
    horovod_env.say_once({"HOROVOD_HOSTNAME": "a"}, said.append)
    horovod_env.say_once({"HOROVOD_HOSTNAME": "a"}, said.append)
    assert said == ["hvlite: HOROVOD_HOSTNAME is not used by hvlite: hvlite learns each rank's "
                    "host from the rank itself (hvlrun's -H names the hosts to start on)\n"]


def test_an_init_names_them_and_timeline_dynamic_starts_none(tmp_path):
    code = ("from mpi4py import MPI\nimport numpy, hvlite\nhvlite.init()\nhvlite.start_timeline('later.json')\n"
            "hvlite.allreduce(numpy.ones(1), name='x')\nhvlite.stop_timeline()\nhvlite.shutdown()\n"
            "hvlite.init()\nhvlite.shutdown()\n")
    env = dict(os.environ, PYTHONPATH=ROOT, HOROVOD_TIMELINE="DYNAMIC", HOROVOD_TORUS_ALLREDUCE="1")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("hvlite: HOROVOD_TORUS_ALLREDUCE is not used by hvlite") == 1, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["later.json"], os.listdir(tmp_path)
    assert '"x"' in (tmp_path / "later.json").read_text()
