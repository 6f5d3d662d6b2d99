"""The documentation stays true to the code (docs/development/docs.md says what each check holds).

Each test reads the pages' Markdown (``docs_pages.py``), not the built site, so it needs neither
Sphinx nor the network:
  * every ``HVLITE_*``/``HVLRUN_*`` name the code reads is in the settings reference;
  * every ``hvlrun`` flag is in the reference, and every flag a page names exists;
  * the generated reference pages are what ``tools/docs_reference.py`` writes now;
  * every backticked repository path exists;
  * every code block is included from ``examples/``, is a doctest, is ``hvlrun`` lines, is
    marked not runnable with a reason, or is text; the doctests run; every ``hvlrun`` line
    passes ``--dry-run``;
  * no user page carries a date or an issue number;
  * the README is at most 150 lines and keeps its two commands;
  * the errors reference lists every exception and hvlrun's exit codes;
  * every public name has a docstring a user can act on, in shapes napoleon renders as written.
"""
import ast
import concurrent.futures
import glob
import os
import re
import subprocess
import sys
import textwrap

import pytest

import docs_pages
from docs_pages import ROOT
from jobs import MULTIPLIER

sys.path.insert(0, os.path.join(ROOT, "tools"))
import docs_reference  # noqa: E402

from hvlite.runner.cli.flags import build_parser  # noqa: E402

SETTINGS = "docs/reference/settings.md"
HVLRUN_PAGE = "docs/reference/hvlrun.md"
HOROVODRUN_FLAGS = "docs/reference/_horovodrun_flags.md"

_NAME = re.compile(r"\b(?:HVLITE|HVLRUN)_[A-Z0-9_]*[A-Z0-9]\b")
_GUARD = re.compile(r"^\s*#\s*(?:ifndef|define)\s+(HVLITE_(?:\w+_)?H)\b", re.M)


def names_in_code():
    """{name: first file} of the HVLITE_*/HVLRUN_* names in hvlite/ and csrc/ (not header guards)."""
    found = {}
    files = glob.glob(os.path.join(ROOT, "hvlite", "**", "*.py"), recursive=True)
    files += glob.glob(os.path.join(ROOT, "csrc", "**", "*.[ch]"), recursive=True)
    for path in sorted(files):
        with open(path) as f:
            text = f.read()
        guards = set(_GUARD.findall(text))
        for name in _NAME.findall(text):
            if name not in guards:
                found.setdefault(name, os.path.relpath(path, ROOT))
    for row in docs_reference.param_rows():       # param.c names its settings by suffix
        found.setdefault(row["name"], "csrc/core/param.c")
    return found


def test_settings_reference_names_every_variable_the_code_reads():
    page = docs_pages.read(SETTINGS)
    missing = ["%s (%s)" % (n, where) for n, where in sorted(names_in_code().items())
               if "`%s`" % n not in page]
    assert not missing, ("read by the code but not in %s (add them to csrc/core/param.c's table "
                         "or hvlite/runner/cli/environment.py, then run python "
                         "tools/docs_reference.py): %s" % (SETTINGS, ", ".join(missing)))


def parser_flags():
    """{option string: hidden} of every flag hvlrun's parser takes."""
    import argparse
    return {option: action.help == argparse.SUPPRESS
            for action in build_parser()._actions for option in action.option_strings}


def test_every_hvlrun_flag_is_in_the_reference():
    page = docs_pages.read(HVLRUN_PAGE)
    # hvlrun's own flags: rendered from the parser itself by sphinx-argparse
    assert re.search(r"```\{argparse\}\n:module: hvlite\.runner\.cli\.flags\n:func: build_parser\n",
                     page), "%s no longer renders hvlrun's parser" % HVLRUN_PAGE
    assert "{include} %s" % os.path.basename(HOROVODRUN_FLAGS) in page
    horovod = docs_pages.read(HOROVODRUN_FLAGS)
    missing = [flag for flag, hidden in parser_flags().items()
               if hidden and "`%s`" % flag not in horovod]
    assert not missing, "hidden hvlrun flags missing from %s: %s" % (HOROVODRUN_FLAGS, missing)


# Flags of other programs that the pages name (pip, srun, sbatch, the benchmarks, ...).
OTHER_PROGRAMS_FLAGS = {
    "--index-url", "--mpi", "--nodes", "--ntasks-per-node", "--smoke", "--ddp", "--device",
    "--models", "--planes", "--pairs", "--blocks", "--null", "--json", "--repeat", "--iters",
    "--no-torch", "--max-mib", "--rounds", "--ranks", "--frameworks", "--params", "--seed",
    "--first", "--scale", "--hostid-per-rank", "--one-gpu", "--per-test", "--jobs", "--timeout",
    "--a", "--b", "--columns", "--order", "--cwd", "--out", "--epochs", "--batch-size",
    "--model", "--num-warmup-batches", "--num-batches-per-iter", "--num-iters",
    "--fp16-allreduce", "--use-adasum", "--no-cuda", "--warmup", "--bootstrap", "--ops",
    "--sizes-kib", "--csv", "--rows", "--lr", "--wait", "--no-build-isolation", "--inplace",
    "--nnodes",
}


def test_every_flag_a_page_names_exists():
    known = set(parser_flags()) | OTHER_PROGRAMS_FLAGS
    stale = []
    for page in docs_pages.pages():
        for span in docs_pages.inline_code(page):
            for flag in re.findall(r"(?:^|\s)(--[a-z][a-z0-9-]*)(?=$|[\s=])", span):
                if flag not in known:
                    stale.append("%s: %s" % (page, flag))
    assert not stale, "flags named in the docs that hvlrun does not take: %s" % stale


def test_generated_pages_are_current(capsys):
    assert docs_reference.main(["--check"]) == 0, capsys.readouterr().out


# Top-level folders of the repository: a backticked path starting with one must exist.
TOP = ("hvlite", "csrc", "docs", "tests", "bench", "examples", "launch", "tools", ".ci")
_PATH = re.compile(r"^[\w.*-]+(?:/[\w.*<>-]*)+$")


def test_backticked_repository_paths_exist():
    missing = []
    for page in docs_pages.pages():
        for span in docs_pages.inline_code(page):
            path = span.split("::")[0]
            if not _PATH.match(path) or path.split("/")[0] not in TOP:
                continue
            if not glob.glob(os.path.join(ROOT, re.sub(r"<[^>]*>", "*", path))):
                missing.append("%s: %s" % (page, span))
    assert not missing, "backticked paths that do not exist: %s" % missing


def examples_run_by_tests():
    """The example files a test runs (named in tests/test_examples.py)."""
    with open(os.path.join(ROOT, "tests", "test_examples.py")) as f:
        return set(re.findall(r"examples/[\w.]+\.py", f.read()))


DIRECTIVES = ("{toctree}", "{include}", "{argparse}", "{container}")   # not code
SHELLS = ("sh", "bash", "console")


def test_every_code_block_runs_or_says_why_not():
    run_by_tests = examples_run_by_tests()
    wrong = []
    for page in docs_pages.pages():
        for block in docs_pages.code_blocks(page):
            language = block.language
            if language in DIRECTIVES or language in ("text", "pycon"):
                continue
            if language == "{literalinclude}":
                target = os.path.normpath(os.path.join(os.path.dirname(page), block.info.split()[1]))
                if target not in run_by_tests:
                    wrong.append("%s includes %s, which no test runs" % (block.where, target))
                continue
            if block.norun:
                continue
            if language in SHELLS:
                commands = [l for l in block.text.split("\n")
                            if l.strip() and not l.strip().startswith("#")]
                if all(re.match(r"(\$ )?hvlrun\s", l.strip()) for l in commands):
                    continue
            if language == "python" and page == "README.md" and is_excerpt(block.text, run_by_tests):
                continue
            wrong.append("%s: a %s block that is neither run nor marked "
                         "<!-- norun: reason -->" % (block.where, language or "bare"))
    assert not wrong, "\n".join(wrong)


def is_excerpt(text, files):
    """True if text's lines are consecutive lines of one of the files (indentation aside)."""
    want = [l.strip() for l in text.strip().split("\n")]
    for name in files:
        with open(os.path.join(ROOT, name)) as f:
            have = [l.strip() for l in f.read().split("\n")]
        if any(have[i:i + len(want)] == want for i in range(len(have))):
            return True
    return False


DOCTEST = textwrap.dedent("""
    import doctest, sys
    text = sys.stdin.read()
    test = doctest.DocTestParser().get_doctest(text, {}, sys.argv[1], sys.argv[1], 0)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    sys.exit(1 if runner.failures else 0)
""")


@pytest.mark.parametrize("page", [p for p in docs_pages.pages()
                                  if any(b.language == "pycon"
                                         for b in docs_pages.code_blocks(p))])
def test_doctests_run(page):
    """A page's pycon blocks, in order, as one doctest in one process (one rank)."""
    text = "\n".join(b.text for b in docs_pages.code_blocks(page) if b.language == "pycon")
    out = subprocess.run([sys.executable, "-c", DOCTEST, page], input=text, cwd=ROOT, text=True,
                         capture_output=True, timeout=120 * MULTIPLIER,
                         env=dict(os.environ, PYTHONPATH=ROOT, HVLITE_LOG_LEVEL="warning"))
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]


def hvlrun_commands():
    commands = []
    for page in docs_pages.pages():
        for block in docs_pages.code_blocks(page):
            if block.language in SHELLS:
                commands += [(block.where, words) for words in docs_pages.hvlrun_lines(block)]
    return commands


HOSTFILE = "node01 slots=4\nnode02:4\n"
DISCOVERY = "#!/bin/sh\necho node01:4\necho node02:4\n"


def test_every_hvlrun_line_passes_dry_run(tmp_path):
    """Run from a folder holding hosts.txt and discover_hosts.sh, as the pages name them."""
    (tmp_path / "hosts.txt").write_text(HOSTFILE)
    (tmp_path / "discover_hosts.sh").write_text(DISCOVERY)
    (tmp_path / "discover_hosts.sh").chmod(0o755)
    commands = hvlrun_commands()
    assert len(commands) >= 10, commands           # the pages are read at all

    def dry_run(item):
        where, words = item
        for word in words[1:]:                      # a repository file the command runs exists
            if _PATH.match(word) and word.split("/")[0] in TOP:
                if not os.path.exists(os.path.join(ROOT, word)):
                    return "%s: %s: %s does not exist" % (where, " ".join(words), word)
        cmd = [sys.executable, "-m", "hvlite.runner", "--dry-run", *words[1:]]
        env = dict(os.environ, PYTHONPATH=ROOT, HOME=str(tmp_path))
        out = subprocess.run(cmd, cwd=str(tmp_path), env=env, capture_output=True, text=True,
                             timeout=60 * MULTIPLIER, stdin=subprocess.DEVNULL)
        if out.returncode != 0:
            return "%s: %s: exit %d: %s" % (where, " ".join(words), out.returncode,
                                           out.stderr.strip().split("\n")[-1])
        return None

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        failed = [f for f in pool.map(dry_run, commands) if f]
    assert not failed, "\n".join(failed)


NOT_USER_PAGES = ("docs/benchmarks.md", "docs/changelog.md", "docs/development/benchmarks.md",
                  "bench/README.md")
_DATED = re.compile(r"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b|\b(?:January|February|March|April|May|"
                    r"June|July|August|September|October|November|December) (?:19|20)\d\d\b"
                    r"|\bissues? #?\d+|\bthis VM\b", re.I)


def test_user_pages_carry_no_dates_or_issue_numbers():
    found = []
    for page in docs_pages.pages():
        if page in NOT_USER_PAGES:
            continue
        for number, line in enumerate(docs_pages.read(page).split("\n"), 1):
            for hit in _DATED.findall(line):
                found.append("%s:%d: %s" % (page, number, hit))
    assert not found, ("history belongs in CHANGELOG.md, measurements in docs/benchmarks.md: %s"
                       % found)


TWO_COMMANDS = """```sh
make run    # sets up .venv, builds hvlite, then: hvlrun -np 2 python examples/pytorch_digits.py
make test   # sets up .venv, builds hvlite, then every test: python -m pytest -q tests
```"""


def test_readme_is_short_and_keeps_its_two_commands():
    readme = docs_pages.read("README.md")
    assert readme.count("\n") <= 150, "README.md has %d lines (at most 150)" % readme.count("\n")
    assert TWO_COMMANDS in readme


def test_errors_reference_lists_every_exception_and_exit_code():
    from hvlite.runner.elastic.driver import ELASTIC_FAILED_CODE
    from hvlite.runner.world.run import HOST_LOST_CODE, START_TIMEOUT_CODE
    page = docs_pages.read("docs/reference/errors.md")
    with open(os.path.join(ROOT, "hvlite", "errors.py")) as f:
        tree = ast.parse(f.read())
    names = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                 and any(getattr(t, "id", None) == "__all__" for t in n.targets))
    missing = [n for n in names if "| `%s` |" % n not in page]
    assert not missing, "exceptions missing from docs/reference/errors.md: %s" % missing
    for code in (ELASTIC_FAILED_CODE, HOST_LOST_CODE, START_TIMEOUT_CODE, 127, 2):
        assert re.search(r"^\| %d \|" % code, page, re.M), "exit code %d not in the table" % code


# The modules whose names the API reference shows (docs/conf.py's PUBLIC_MODULES, read here
# without Sphinx). hvlite itself re-exports the neutral modules' names at run time.
def public_modules():
    with open(os.path.join(ROOT, "docs", "conf.py")) as f:
        tree = ast.parse(f.read())
    value = next(n.value for n in tree.body if isinstance(n, ast.Assign)
                 and any(getattr(t, "id", None) == "PUBLIC_MODULES" for t in n.targets))
    return sorted(ast.literal_eval(value))


def module_file(module):
    path = os.path.join(ROOT, *module.split("."))
    return path + "/__init__.py" if os.path.isdir(path) else path + ".py"


def documented(tree, name):
    """(file-level node defining name, its docstring or None); None if not defined there."""
    body = tree.body
    for i, node in enumerate(body):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return node, ast.get_docstring(node)
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name
                                                for t in node.targets):
            after = body[i + 1] if i + 1 < len(body) else None
            doc = after.value.value if (isinstance(after, ast.Expr) and isinstance(
                after.value, ast.Constant) and isinstance(after.value.value, str)) else None
            return node, doc
    return None


def definition(module, name, seen=()):
    """(file, node, docstring) where ``module``'s public ``name`` is defined."""
    path = module_file(module)
    if not os.path.exists(path) or (module, name) in seen:
        return None
    with open(path) as f:
        tree = ast.parse(f.read())
    found = documented(tree, name)
    if found:
        return (os.path.relpath(path, ROOT),) + found
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                    if node.module is None or os.path.isdir(os.path.join(ROOT, *source.split("."),
                                                                          alias.name)):
                        return None          # a submodule, documented as a module
                    return definition(source, alias.name, seen + ((module, name),))
    return None


_ROLES = re.compile(r":\w+:`[^`]*`|``[^`]*``")


def _section(doc, title):
    """The lines of a Google-style section of ``doc`` (empty if it has none)."""
    lines, inside = [], False
    for line in doc.split("\n"):
        if re.match(r"\s*%s:\s*$" % title, line):
            inside = True
        elif inside and (not line.strip() or re.match(r"\s*[A-Z]\w+:\s*$", line)):
            break
        elif inside:
            lines.append(line)
    return lines


def rendering_faults(node, doc):
    """What napoleon would render otherwise than written (see docs/development/docs.md)."""
    faults = []
    if isinstance(node, ast.Assign):            # an attribute: "X: ..." first is read as a type
        if ":" in _ROLES.sub("", doc.strip().split("\n")[0]):
            faults.append("a colon in the first line (napoleon reads what precedes it as a type)")
        return faults
    for title, entry in (("Args", r"\**\w+(, \**\w+)*: "), ("Raises", r"[A-Za-z_][\w.]*: ")):
        lines = _section(doc, title)
        indent = min((len(l) - len(l.lstrip()) for l in lines), default=0)
        for line in lines:
            if len(line) - len(line.lstrip()) == indent and not re.match(entry, line.strip() + " "):
                faults.append("%s entry %r is not '%s'" % (
                    title, line.strip()[:40], "name: ..." if title == "Args" else "Class: ..."))
    return faults


def test_public_docstrings_render_as_written():
    """The docstrings of the public names use the shapes napoleon reads as written: an Args
    entry starts with its names on one line, a Raises entry with the exception's class, and an
    attribute's first line holds no colon."""
    wrong = []
    for module in public_modules():
        path = module_file(module)
        if not os.path.exists(path):
            continue
        with open(path) as f:
            tree = ast.parse(f.read())
        names = [ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                 and any(getattr(t, "id", None) == "__all__" for t in n.targets)]
        for name in (names[0] if names else []):
            found = definition(module, name)
            if found and found[2]:
                wrong += ["%s.%s (%s): %s" % (module, name, found[0], fault)
                          for fault in rendering_faults(found[1], found[2])]
    assert not wrong, "\n".join(sorted(set(wrong)))


def test_public_names_have_docstrings_a_user_can_act_on():
    """Every name of a public module's __all__ has a docstring; a function with arguments
    says what they are (an Args section) or which function it follows ("As :func:`x`")."""
    wrong = []
    for module in public_modules():
        path = module_file(module)
        if not os.path.exists(path):
            continue                          # hvlite.ray, hvlite.spark: not in this tree yet
        with open(path) as f:
            tree = ast.parse(f.read())
        names = [ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                 and any(getattr(t, "id", None) == "__all__" for t in n.targets)]
        for name in (names[0] if names else []):
            found = definition(module, name)
            if found is None:
                continue
            where, node, doc = found
            if not doc:
                wrong.append("%s.%s (%s): no docstring" % (module, name, where))
            elif (isinstance(node, ast.FunctionDef) and len(node.args.args) > 0
                  and "Args:" not in doc and not re.match(r"As :\w+:`", doc)):
                wrong.append("%s.%s (%s): no Args section and no 'As :func:`...`'"
                             % (module, name, where))
    assert not wrong, "\n".join(sorted(set(wrong)))
