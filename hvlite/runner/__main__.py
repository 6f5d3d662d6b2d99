"""``python -m hvlite.runner``: the same as the ``hvlrun`` console script."""

from .cli.launch import run

if __name__ == "__main__":
    run()
