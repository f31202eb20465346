"""A dry run's result: the dict of the --json object, its keys read as
attributes too, printed as the text report and shown in a notebook as an
HTML table (report.py)."""
import json

from .contract import runs_of
from .report import format_report, report_html

__all__ = ["DryRunResult"]


class DryRunResult(dict):
    """A dry run's figures: a dict (the --json object) whose keys read as
    attributes too (result.vramguard["fits"], result.fits), printed as the
    text report and shown in a notebook as a table."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __str__(self):
        return format_report(self)

    def __repr__(self):
        return format_report(self)

    def _repr_html_(self):
        return report_html(self)

    @property
    def runs(self):
        return runs_of(self)

    def to_json(self):
        return json.dumps(dict(self), sort_keys=True, default=repr)
