"""The report's lines on the accelerate adjustments of a dry run
(python/vramguard/dryrun/features/accelerate.py), and the adjustments
themselves on stand-in modules (no accelerate, no PyTorch needed)."""
import sys
import types

import pytest

from vramguard.dryrun.features import after_import
from vramguard.dryrun.features import accelerate as adjust_accelerate
from vramguard.dryrun.features.accelerate import notes

PAD = ("accelerate's pad_across_processes reads tensor sizes back from the device (zeros here): the dry run left "
       "its {} unpadded ({}).")
ONE = "one process has nothing to pad"
MANY = "each rank's tensors taken as the largest; a card pads a short last batch by a few rows"


def run(unpadded=0, tried=(), settled=None, allocator="native"):
    return {"allocator": allocator, "accelerate_unpadded": unpadded, "auto_batch_sizes": list(tried),
            "auto_batch_size": settled}


def test_no_adjustment_no_line():
    assert notes([run(), run(allocator="expandable")], 1) == []
    assert notes([{"allocator": "native"}], 1) == []  # a result written before these keys existed


@pytest.mark.parametrize("count, nproc, text", [
    (1, 1, PAD.format("1 call", ONE)),
    (8, 1, PAD.format("8 calls", ONE)),
    (1200, 2, PAD.format("1,200 calls", MANY)),
])
def test_unpadded_calls_counted(count, nproc, text):
    assert notes([run(count), run(count - 1, allocator="vramguard")], nproc) == [text]


def test_auto_find_batch_size_lines():
    runs = [run(tried=[4], settled=4), run(tried=[16, 14], settled=14, allocator="expandable"),
            run(tried=[16, 14, 12], settled=12, allocator="vramguard"), run(tried=[2], allocator="a"),
            run(tried=[2, 1], allocator="b")]
    assert notes(runs, 1) == [
        "native: auto_find_batch_size kept its starting batch size, 4.",
        "expandable: auto_find_batch_size settled on batch size 14 (tried 16, 14; the out-of-memory error at 16 "
        "was caught by it).",
        "vramguard: auto_find_batch_size settled on batch size 12 (tried 16, 14, 12; the out-of-memory errors at "
        "16, 14 were caught by it).",
        "a: auto_find_batch_size tried batch size 2; none ran to its end.",
        "b: auto_find_batch_size tried batch sizes 2, 1; none ran to its end.",
    ]


@pytest.fixture
def fake_accelerate(monkeypatch):
    """accelerate's three modules, as already imported, with the two functions."""
    operations = types.ModuleType("accelerate.utils.operations")
    memory = types.ModuleType("accelerate.utils.memory")

    def pad_across_processes(tensor, dim=0, pad_index=0, pad_first=False):
        raise AssertionError("the real padding reads sizes back")

    def find_executable_batch_size(function=None, starting_batch_size=128, reduce_batch_size_fn=None):
        def retry():
            size = starting_batch_size
            while True:
                try:
                    return function(size)
                except MemoryError:
                    size //= 2
        return retry

    operations.pad_across_processes = pad_across_processes
    memory.find_executable_batch_size = find_executable_batch_size
    utils = types.ModuleType("accelerate.utils")
    utils.pad_across_processes, utils.find_executable_batch_size = pad_across_processes, find_executable_batch_size
    accelerator = types.ModuleType("accelerate.accelerator")
    accelerator.pad_across_processes = pad_across_processes
    for module in (operations, memory, utils, accelerator):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    yield utils, accelerator
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, after_import._AfterImport)]


def test_adjustments_on_loaded_modules(fake_accelerate):
    utils, accelerator = fake_accelerate
    record = adjust_accelerate.install()
    tensor = object()
    assert accelerator.pad_across_processes(tensor, dim=1, pad_index=-100) is tensor
    assert utils.pad_across_processes(tensor) is tensor
    assert record.unpadded == 2

    def train(batch_size):
        if batch_size > 8:
            raise MemoryError
        return batch_size * 10

    assert utils.find_executable_batch_size(function=train, starting_batch_size=32)() == 80
    assert (record.batch_sizes, record.batch_size) == ([32, 16, 8], 8)
    decorated = utils.find_executable_batch_size(starting_batch_size=4)(train)  # the decorator form
    assert decorated() == 40 and (record.batch_sizes[-1], record.batch_size) == (4, 4)
