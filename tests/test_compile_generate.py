"""Hugging Face `generate(cache_implementation="static")` on neuron: transformers compiles the
decoding step (a static KV cache, fixed shapes); the tokens are the CPU's greedy tokens, the
step runs as compiled neuron programs, and nothing falls back to the CPU."""

from __future__ import annotations

import os
import sys

import pytest
import torch

import eager_neuron

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
pytest.importorskip("transformers")


def test_gpt2_generate_with_a_static_cache_equals_cpu():
    import test_hf_models as hf

    torch._dynamo.reset()
    model, batches = hf.build("gpt2")
    model.eval()
    ids = batches[0]["input_ids"][:1, :6]
    ref = model.generate(ids, max_new_tokens=4, do_sample=False, cache_implementation="static")
    torch._dynamo.reset()
    m = model.to("neuron")
    eager_neuron.compile.reset_stats()
    eager_neuron.reset_stats()
    out = m.generate(ids.to("neuron"), max_new_tokens=4, do_sample=False,
                     cache_implementation="static")
    assert torch.equal(out.cpu(), ref)
    assert eager_neuron.compile.stats()["graph_launches"] >= 1
    assert eager_neuron.stats()["fallbacks"] == {}
    torch._dynamo.reset()
