"""Writes the two tables of docs/migrating.md that come from the code, or checks they are current.

  python tools/migrating_tables.py           # rewrite them in place
  python tools/migrating_tables.py --check   # exit 1, saying which, if either differs

  * horovodrun's flags: every flag of ``hvlite/runner/cli/horovod_flags.HOROVODRUN_FLAGS`` with
    what hvlrun does with it (``flag_table()``): honoured, no effect (hvlrun names it at
    launch) or refused.
  * Horovod's variables: every ``HOROVOD_*`` of ``hvlite/horovod_env.VARIABLES``: honoured, no
    effect (rank 0 names it at init) or a build setting (named at init, all in one line).
Each table sits between ``<!-- generated: NAME -->`` and ``<!-- end: NAME -->`` lines in the page;
the prose around them is the page's own. Imports nothing that needs the engine;
``tests/test_migrating_page.py`` runs ``--check``.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hvlite import horovod_env  # noqa: E402
from hvlite.runner.cli.horovod_flags import flag_table  # noqa: E402

PAGE = os.path.join(ROOT, "docs", "migrating.md")
NOTE = "<!-- Written by tools/migrating_tables.py from %s: edit that, then run it. -->\n"
STATUS = {horovod_env.HONOURED: "honoured", horovod_env.UNUSED: "no effect (named at init)",
          horovod_env.BUILD: "build setting (named at init)"}
FLAG_STATUS = {"honoured": "honoured", "no effect": "no effect (named at launch)",
               "refused": "refused (exit 2)"}


def _cell(text):
    return text.replace("|", "\\|").replace("\n", " ")


def flags_table():
    rows = [NOTE % "hvlite/runner/cli/horovod_flags.py",
            "| horovodrun flag | in hvlrun | how, or why not |\n", "|---|---|---|\n"]
    for flag, status, text in flag_table():
        rows.append("| `%s` | %s | %s |\n" % (flag, FLAG_STATUS[status], _cell(text) or "the same flag"))
    return "".join(rows)


def variables_table():
    rows = [NOTE % "hvlite/horovod_env.py",
            "| variable | in hvlite | how, or why not and what instead |\n", "|---|---|---|\n"]
    # The build settings share one reason: said once under the table, not in each row.
    build_texts = {v.text for v in horovod_env.VARIABLES.values() if v.status == horovod_env.BUILD}
    shared = build_texts.pop() if len(build_texts) == 1 else None
    for name in sorted(horovod_env.VARIABLES):
        variable = horovod_env.VARIABLES[name]
        text = variable.text
        if variable.status == horovod_env.BUILD and shared is not None:
            text = "Horovod's build (below)"
        if variable.honoured_values:
            text = "%s=%s asks for what hvlite does; any other value: %s" % (
                name, "/".join(variable.honoured_values), text)
        rows.append("| `%s` | %s | %s |\n" % (name, STATUS[variable.status], _cell(text)))
    if shared is not None:
        rows.append("\nThe build settings are %s.\n" % shared)
    return "".join(rows)


TABLES = {"horovodrun-flags": flags_table, "horovod-variables": variables_table}


def render(page):
    """``page`` with each table replaced by the code's (ValueError if a marker is missing)."""
    for name, make in TABLES.items():
        start, end = "<!-- generated: %s -->\n" % name, "<!-- end: %s -->" % name
        if start not in page or end not in page:
            raise ValueError("docs/migrating.md has no %r ... %r markers" % (start.strip(), end))
        head, rest = page.split(start, 1)
        _, tail = rest.split(end, 1)
        page = head + start + make() + end + tail
    return page


def main(argv=None):
    check = "--check" in (sys.argv[1:] if argv is None else argv)
    with open(PAGE) as f:
        page = f.read()
    fresh = render(page)
    if check:
        if fresh != page:
            print("docs/migrating.md: its generated tables are stale; run python tools/migrating_tables.py")
            return 1
        return 0
    if fresh != page:
        with open(PAGE, "w") as f:
            f.write(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
