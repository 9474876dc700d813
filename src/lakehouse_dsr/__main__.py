"""`python -m lakehouse_dsr ...` and `spark-submit .../lakehouse_dsr/__main__.py ...`: the `dsr` CLI.

spark-submit runs this file as a script, which puts the package folder first on sys.path; drop it
so our module names never shadow others."""

import sys
from pathlib import Path

if __name__ == "__main__":
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        del sys.path[0]
    from lakehouse_dsr.cli import entry

    entry()
