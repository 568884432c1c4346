"""`python -m tunesvc.cli`: the CLI, as `tune` runs it."""

from tunesvc.cli import main

main()
