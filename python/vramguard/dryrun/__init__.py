"""Will it fit? A dry run of a training script (or notebook) on a phantom GPU.

    python -m vramguard dryrun --gpu T4 train.py --batch 32
    vramguard.dryrun("train.py", "--batch", "32", gpu="T4")     # in a notebook

The script runs unchanged, once per allocator (PyTorch's own, PyTorch's
with expandable segments, vramguard's), each in a child process whose CUDA
is the phantom GPU (vramguard.phantom: kernels succeed and compute nothing,
device memory costs no host memory), so it makes on a CPU the allocations
it would make on the card.

The package, top down (docs/design.md draws it):

  run.py        dryrun(): the orchestration, the verdict and exit status
  checks.py     the input, refused with one line each
  runner.py     one run on a phantom of a size; --min-memory and --sweep
  launch.py     the child process: its output, its end, its record read back
  ranks.py      the ranks of a torchrun run, one run's figures
  need.py       a run's need, from a replay of its own recording
  result.py     DryRunResult; report.py, table.py, verdict.py, notes.py its report
  outcome.py    what a run's figures say (never used the GPU, phantom failed)
  contract.py   what the parent and its children agree on: names, the record
  features/     each feature in one shape, listed once
  child/        the child: `python -m vramguard.dryrun.child`
"""
from .checks import DryRunInputError, parse_allocators, parse_sweep
from .contract import (ALLOCATORS, EXIT_DOES_NOT_FIT, EXIT_FITS, EXIT_NEVER_USED_GPU, EXIT_PHANTOM_FAILED,
                       EXIT_SCRIPT_FAILED, EXIT_TIMED_OUT, VERDICTS)
from .outcome import exit_status
from .report import format_report, report_html
from .result import DryRunResult
from .run import dryrun

__all__ = ["ALLOCATORS", "DryRunInputError", "DryRunResult", "EXIT_DOES_NOT_FIT", "EXIT_FITS",
           "EXIT_NEVER_USED_GPU", "EXIT_PHANTOM_FAILED", "EXIT_SCRIPT_FAILED", "EXIT_TIMED_OUT", "VERDICTS",
           "dryrun", "exit_status", "format_report", "parse_allocators", "parse_sweep", "report_html"]
