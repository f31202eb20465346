"""The dry run's features, each in one shape (Feature) and listed once
(FEATURES): what it adds to a child's environment, what it installs in the
child before the script runs, the fields it adds to the child's record,
and what it says in the report.

Adding a feature is its own file here, with a Feature subclass, and one
entry in FEATURES. The parent (dryrun/run.py, dryrun/report.py) and the
child (dryrun/child/run.py) go through the list; neither names a feature.
"""

from . import accelerate, compile_cache, extensions, fake_world, llm_int8, managed, remedies, weightless, work
from .base import Feature, Options

__all__ = ["FEATURES", "Feature", "Options"]

#: In the order their notes come in the report.
FEATURES = (accelerate.FEATURE, llm_int8.FEATURE, extensions.FEATURE, weightless.FEATURE, fake_world.FEATURE,
            managed.FEATURE, compile_cache.FEATURE, work.FEATURE, remedies.FEATURE)
