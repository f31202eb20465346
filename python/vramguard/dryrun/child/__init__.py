"""The child of a dry run: one run of the user's program on a phantom GPU,
in a process of its own (`python -m vramguard.dryrun.child`).

  main.py           its command line, signals and end
  run.py            Run: the set-up, the script, the record it writes
  hooks.py          what the child adjusts in PyTorch (DDP, GradScaler, the history)
  first_oom.py      the run's first out-of-memory: its line and its request
  frames.py         whose code a frame is, and the user's line
  cells.py          a notebook's cells; notebook_shell.py, in IPython
  ending.py         every way the process can end leaves the record; signals
  figures.py        what it reads from the process and its libraries
  stderr_filter.py  a line of stderr left out
"""
