"""LLM.int8 in a dry run (python/vramguard/dryrun/features/llm_int8.py): the child
counts bitsandbytes' Linear8bitLt layers made with an outlier threshold,
and the report says, in one sentence, that their outlier buffers are sized
by values a phantom does not compute. Here with a stand-in of bitsandbytes'
module (the real one: tests/torch/test_dryrun_managed.py)."""
import sys
import textwrap

import pytest

from vramguard.dryrun.features import after_import
from vramguard.dryrun.features import llm_int8
from vramguard.dryrun import DryRunResult, format_report

SENTENCE = ("The program used LLM.int8 (bitsandbytes' Linear8bitLt with an outlier threshold: {layers}), which "
            "sizes its outlier buffers from the activations' values: a phantom does not compute them, so the "
            "figures leave out what those buffers take on a card.")

# bitsandbytes' layer as far as the counting sees it: threshold kept in self.state
FAKE = textwrap.dedent("""
    class MatmulLtState:
        threshold = 0.0

    class Linear8bitLt:
        def __init__(self, input_features, output_features, bias=True, has_fp16_weights=True,
                     threshold=0.0, index=None, device=None):
            self.state = MatmulLtState()
            self.state.threshold = threshold
            self.shape = (output_features, input_features)

    class Derived(Linear8bitLt):
        pass
""")


@pytest.fixture
def fake_bitsandbytes(tmp_path, monkeypatch):
    package = tmp_path / "bitsandbytes"
    (package / "nn").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "nn" / "__init__.py").write_text("from .modules import Linear8bitLt\n")
    (package / "nn" / "modules.py").write_text(FAKE)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("bitsandbytes", "bitsandbytes.nn", llm_int8.MODULES):
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, after_import._AfterImport)]
    for name in ("bitsandbytes", "bitsandbytes.nn", llm_int8.MODULES):
        sys.modules.pop(name, None)


def test_layers_with_a_threshold_are_counted_when_the_module_loads_later(fake_bitsandbytes):
    record = llm_int8.install()
    import bitsandbytes.nn as nn
    from bitsandbytes.nn.modules import Derived

    assert record.outlier_layers == 0
    nn.Linear8bitLt(4, 4, threshold=6.0)  # transformers' load_in_8bit: llm_int8_threshold, 6.0
    nn.Linear8bitLt(4, 4, has_fp16_weights=False, threshold=0.0)  # no decomposition: nothing depends on values
    nn.Linear8bitLt(4, 4)
    layer = Derived(4, 8, threshold=1.5)
    assert record.outlier_layers == 2
    assert layer.shape == (8, 4)  # the layer is made as before


def test_a_module_loaded_before_install_is_patched_once(fake_bitsandbytes):
    import bitsandbytes.nn as nn

    first = llm_int8.install()
    second = llm_int8.install()  # patched once: the first record counts, not both
    nn.Linear8bitLt(4, 4, threshold=6.0)
    assert (first.outlier_layers, second.outlier_layers) == (1, 0)


def _result(**figures):
    result = DryRunResult(gpu="T4", device_bytes=15828320256, context_bytes=400 << 20, script="s.py",
                          allocators=["native", "vramguard"])
    for name in result["allocators"]:
        result[name] = dict({"allocator": name, "peak_allocated_bytes": 1 << 30, "peak_reserved_bytes": 2 << 30,
                             "fits": True, "first_oom": None, "error": None, "exit_status": 0, "used_gpu": True},
                            **figures)
    return result


@pytest.mark.parametrize("figures", [{}, {"llm_int8_layers": 0}, {"llm_int8_layers": None}])
def test_no_layer_no_sentence(figures):
    text = format_report(_result(**figures))
    assert "LLM.int8" not in text and "outlier" not in text


@pytest.mark.parametrize("layers, said", [(1, "1 layer"), (224, "224 layers"), (1234, "1,234 layers")])
def test_the_sentence_at_one_and_many_layers(layers, said):
    text = format_report(_result(llm_int8_layers=layers))
    assert SENTENCE.format(layers=said) in text.splitlines()
    assert text.count("LLM.int8") == 1  # once for the dry run, not once per run
