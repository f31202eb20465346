"""The shape of a dry-run feature (features/__init__.py lists them)."""
import dataclasses
from typing import Optional

__all__ = ["Feature", "Options"]


@dataclasses.dataclass(frozen=True)
class Options:
    """The dry run's options a feature may act on."""
    out_dir: str
    weights: bool = True
    world_size: Optional[int] = None
    rank: Optional[int] = None
    gpus_per_node: int = 8
    remedies: bool = False


class Feature:
    """A feature's hooks; each left as it is does nothing."""
    name = ""

    def env(self, options):
        """Parent: the variables it adds to every child's environment."""
        return {}

    def install(self, run):
        """Child (before the script runs): installs its patches and
        returns its state (None: not on in this run). `run` is the
        child's Run: its torch, its counters."""
        return None

    def figures(self, state, run):
        """Child (as the figures are written): the RunRecord fields it fills."""
        return {}

    def summarize(self, result, runs):
        """Parent: result-wide figures, once every run ended."""

    def verdict_lines(self, result, runs, card):
        """Parent: lines of the report right after the verdict."""
        return []

    def tables(self, result):
        """Parent: a table of its own, after the needs."""
        return []

    def notes(self, result, runs):
        """Parent: its notes for the report."""
        return []

