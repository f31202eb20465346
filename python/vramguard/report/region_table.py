"""The table vramguard.regions() returns: a RegionRow per region name, as
text and as HTML. Figures only; regions.py fills them in."""
import html

from .._units import format_size

__all__ = ["RegionRow", "RegionTable"]


class RegionRow:
    """A region's figures over its completed calls: `peak` the highest
    allocated bytes while it was open (any call), `live_at_exit` allocated
    bytes at its last exit, `allocated` bytes allocated inside it (all
    calls, freed or not)."""

    __slots__ = ("name", "calls", "peak", "live_at_exit", "allocated")

    def __init__(self, name):
        self.name = name
        self.calls = 0
        self.peak = 0
        self.live_at_exit = 0
        self.allocated = 0

    def __repr__(self):
        return (f"RegionRow({self.name!r}, calls={self.calls}, peak={format_size(self.peak)}, "
                f"live_at_exit={format_size(self.live_at_exit)}, allocated={format_size(self.allocated)})")


class RegionTable:
    """vramguard.regions(): one row per region name, in order of first exit."""

    def __init__(self, rows, open_names, device):
        self.rows = rows
        self.open = open_names
        self.device = device

    def __getitem__(self, name):
        for row in self.rows:
            if row.name == name:
                return row
        raise KeyError(name)

    def __iter__(self):
        return iter(self.rows)

    def __len__(self):
        return len(self.rows)

    def _cells(self):
        return [(r.name, str(r.calls), format_size(r.peak), format_size(r.live_at_exit), format_size(r.allocated))
                for r in self.rows]

    _HEADER = ("Region", "Calls", "Peak", "Live at exit", "Allocated")

    def __str__(self):
        text = self._table_text() if self.rows else \
            "No region has closed yet: wrap code in `with vramguard.track(\"name\"):`."
        if self.open:
            text += "\nOpen now: " + ", ".join(self.open)
        return text

    def _table_text(self):
        """The rows under the header, names left-aligned, figures right."""
        cells = [self._HEADER] + self._cells()
        widths = [max(len(row[i]) for row in cells) for i in range(len(self._HEADER))]
        lines = []
        for n, row in enumerate(cells):
            lines.append("  ".join([row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]))
            if n == 0:
                lines.append("  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def __repr__(self):
        return str(self)

    def _repr_html_(self):
        if not self.rows:
            return f"<p>{html.escape(str(self))}</p>"
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self._HEADER)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in self._cells())
        extra = f"<p>Open now: {html.escape(', '.join(self.open))}</p>" if self.open else ""
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{extra}"
