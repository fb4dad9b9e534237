"""`python3 -m quality CONFIG ...` (with bench/ and the built module on PYTHONPATH): scripts/quality's entry."""
import sys

from .cli import main

sys.exit(main(sys.argv[1:]))
