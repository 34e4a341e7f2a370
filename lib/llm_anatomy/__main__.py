"""`python -m llm_anatomy ...`: the command line's entry point (the commands live in llm_anatomy.cli)."""

import sys

from .cli.main import main

if __name__ == "__main__":
    sys.exit(main())
