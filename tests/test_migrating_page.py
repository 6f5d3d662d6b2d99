"""docs/migrating.md against the code: its two tables are what tools/migrating_tables.py makes
from the code's tables (every horovodrun flag, every HOROVOD_* variable, each with what hvlite
does with it), and every one of them is on the page."""
import os
import subprocess
import sys

from hvlite.horovod_env import VARIABLES
from hvlite.runner.cli.horovod_flags import HOROVODRUN_FLAGS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_generated_tables_are_current():
    r = subprocess.run([sys.executable, "tools/migrating_tables.py", "--check"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def generated(page, name):
    """The text of the page's generated block ``name``."""
    return page.split("<!-- generated: %s -->" % name, 1)[1].split("<!-- end: %s -->" % name, 1)[0]


def test_every_flag_and_variable_is_on_the_page():
    with open(os.path.join(ROOT, "docs", "migrating.md")) as f:
        page = f.read()
    flags, variables = generated(page, "horovodrun-flags"), generated(page, "horovod-variables")
    missing = [flag for flag in HOROVODRUN_FLAGS if "`%s`" % flag not in flags]
    missing += [name for name in VARIABLES if "`%s`" % name not in variables]
    assert not missing, missing
