"""LLM.int8 in a dry run: a small Llama loaded with
BitsAndBytesConfig(load_in_8bit=True) from a checkpoint of shapes only runs
forward and backward on a phantom, and the report says, once, that its
outlier buffers are sized from values a phantom does not compute, with the
number of layers that have them; with the threshold at 0 (no outlier
decomposition) or a 4-bit load, nothing depends on values and nothing is
said."""
import pytest

from test_dryrun import dryrun, report, write

# torch_version: runs in the CUDA 12 tier too (docs/development.md)
pytestmark = [pytest.mark.torch, pytest.mark.torch_version]

SCRIPT = """
    import sys, torch
    from transformers import BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM
    from vramguard.dryrun.features.weightless import sparse_checkpoint_from_config

    config = LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=64)
    folder = sparse_checkpoint_from_config(config, "model", dtype=torch.float16)
    quant = {"int8": BitsAndBytesConfig(load_in_8bit=True),
             "int8-no-threshold": BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=0.0),
             "nf4": BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")}[sys.argv[1]]
    model = LlamaForCausalLM.from_pretrained(folder, quantization_config=quant, dtype=torch.float16,
                                             device_map={"": 0})
    ids = torch.zeros(2, 32, dtype=torch.long, device="cuda")
    model(input_ids=ids, labels=ids).loss.backward()
"""
SENTENCE = ("The program used LLM.int8 (bitsandbytes' Linear8bitLt with an outlier threshold: 14 layers), which "
            "sizes its outlier buffers from the activations' values: a phantom does not compute them, so the "
            "figures leave out what those buffers take on a card.")


@pytest.mark.parametrize("quant, layers", [("int8", 14), ("int8-no-threshold", 0), ("nf4", 0)])
def test_llm_int8_is_said_when_used(tmp_path, quant, layers):
    pytest.importorskip("bitsandbytes")
    pytest.importorskip("transformers")
    write(tmp_path, "int8.py", SCRIPT)
    result, _ = dryrun(tmp_path, "--allocator", "native", "--no-snapshot", "int8.py", quant, expect=0)
    run = result["native"]
    assert run["fits"] is True and run["error"] is None
    # 2 decoder layers of 7 linear layers each; lm_head stays in 16 bits (transformers skips it)
    assert run["llm_int8_layers"] == layers
    lines = report(result).splitlines()
    said = [line for line in lines if "LLM.int8" in line]
    assert said == ([SENTENCE] if layers else [])
