"""The examples the documentation includes run and print what the pages say they print.

  * examples/pytorch_quickstart.py at 2 ranks prints exactly the output the quickstart shows
    (docs/quickstart.md and the README: the block after the hvlrun line);
  * examples/pytorch_digits.py and examples/tensorflow_keras_digits.py train one epoch at 2 ranks
    and report their test accuracy.
Every job runs under hvlrun with a hard timeout (jobs.run_job).
"""
import re

import docs_pages
from jobs import run_job


def shown_output(page):
    """The text block that follows the quickstart's hvlrun line on a page."""
    blocks = docs_pages.code_blocks(page)
    for before, after in zip(blocks, blocks[1:]):
        if "examples/pytorch_quickstart.py" in before.text and after.language == "text":
            return after.text.strip().split("\n")
    raise AssertionError("%s shows no output for examples/pytorch_quickstart.py" % page)


def test_quickstart_prints_what_the_pages_show():
    job = run_job(2, ["python", "examples/pytorch_quickstart.py"], timeout=180)
    assert job.returncode == 0, job.stderr[-3000:]
    printed = sorted(line for line in job.stdout.strip().split("\n") if line.strip())
    for page in ("docs/quickstart.md", "README.md"):
        assert printed == sorted(shown_output(page)), (page, job.stdout)


def test_pytorch_digits_trains():
    job = run_job(2, ["python", "examples/pytorch_digits.py", "--epochs", "1"], timeout=240)
    assert job.returncode == 0, job.stderr[-3000:]
    assert re.search(r"final test accuracy \d+\.\d\d% on 2 ranks", job.stdout), job.stdout


def test_tensorflow_keras_digits_trains():
    job = run_job(2, ["python", "examples/tensorflow_keras_digits.py", "--epochs", "1"],
                  timeout=300)
    assert job.returncode == 0, job.stderr[-3000:]
    assert re.search(r"ranks 2, test accuracy \d\.\d{4}", job.stdout), job.stdout
