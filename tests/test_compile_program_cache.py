"""Compiled programs cached across compiles (eager_neuron/compile/artifact.py): a training step
compiled again after dynamo forgets it (as a new process does) takes its forward, backward and
optimizer graphs from torch's AOTAutograd cache — no AOTAutograd tracing, the same programs,
the same numbers — and only the neuron backend's own entries serve it (the key is salted)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import eager_neuron
from eager_neuron.compile import artifact


def _train(compiles: int = 1) -> list:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.GELU(),
                            torch.nn.Linear(8, 3)).to("neuron")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    x = torch.randn(4, 6).to("neuron")
    y = torch.randint(0, 3, (4,)).to("neuron")

    @torch.compile(backend="neuron")
    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return [step().item() for _ in range(2)] + [m[0].weight.sum().item()]


def _fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    counters.clear()
    eager_neuron.compile.reset_stats()


def _compile_again():
    """What a second process does: dynamo traces anew, torch's caches are on disk."""
    torch._dynamo.reset()
    counters.clear()
    eager_neuron.compile.reset_stats()
    return _train()


@pytest.fixture
def cache_on(monkeypatch):
    monkeypatch.setattr(artifact, "enabled", lambda: True)


def test_a_recompiled_training_step_loads_its_programs(monkeypatch, tmp_path, cache_on):
    import torch._inductor.codecache as cc

    _fresh(monkeypatch, tmp_path)
    # torch's key would import every inductor codegen backend first: skipped, and restored
    calls = []
    registration = lambda: calls.append(1)    # noqa: E731
    monkeypatch.setattr(cc, "init_backend_registration", registration)
    first = _train()
    assert calls == [] and cc.init_backend_registration is registration
    c = eager_neuron.compile.stats()
    saved = c["programs_saved"]
    # forward + backward of the model graph, the optimizer's graph: all written
    assert saved >= 3 and c["programs_loaded"] == 0, c
    assert counters["aot_autograd"]["autograd_cache_saved"] >= 2, dict(counters["aot_autograd"])
    assert counters["aot_autograd"]["autograd_cache_bypass"] == 0, dict(counters["aot_autograd"])
    second = _compile_again()
    c = eager_neuron.compile.stats()
    assert c["programs_loaded"] == saved and c["programs_saved"] == 0, c
    assert counters["aot_autograd"]["autograd_cache_hit"] >= 2, dict(counters["aot_autograd"])
    assert counters["aot_autograd"]["autograd_cache_miss"] == 0, dict(counters["aot_autograd"])
    assert sum(c["graph_fallbacks"].values()) == 0, c
    assert c["fused_kernel_launches"] > 0 and c["row_kernel_launches"] > 0, c
    assert second == first            # the same programs, the same kernels: the same numbers


def test_another_backend_version_never_loads_an_entry(monkeypatch, tmp_path, cache_on):
    _fresh(monkeypatch, tmp_path)
    _train()
    # a change of the graph compiler's source changes the salt: torch's key misses
    monkeypatch.setattr(artifact, "cache_salt", lambda: "eager_neuron/other")
    _compile_again()
    c = eager_neuron.compile.stats()
    assert c["programs_loaded"] == 0 and c["programs_saved"] >= 3, c
    assert counters["aot_autograd"]["autograd_cache_hit"] == 0, dict(counters["aot_autograd"])


def test_no_entries_with_the_disk_cache_off(monkeypatch, tmp_path):
    monkeypatch.setattr(artifact, "enabled", lambda: False)
    _fresh(monkeypatch, tmp_path)
    first = _train()
    second = _compile_again()
    c = eager_neuron.compile.stats()
    assert c["programs_saved"] == c["programs_loaded"] == 0, c
    assert counters["aot_autograd"]["autograd_cache_hit"] == 0
    assert second == first


def test_an_unreadable_entry_is_a_miss_not_an_error(monkeypatch, tmp_path, cache_on):
    _fresh(monkeypatch, tmp_path)
    first = _train()
    # every stored entry truncated: torch's loader fails, the graphs compile again
    n = 0
    for f in (tmp_path / "aotautograd").rglob("*"):
        if f.is_file():
            f.write_bytes(f.read_bytes()[:40])
            n += 1
    assert n >= 2
    second = _compile_again()
    c = eager_neuron.compile.stats()
    assert c["programs_loaded"] == 0 and c["graphs_compiled"] >= 3, c
    assert second == first


def test_a_dynamic_shape_graph_loads_and_serves_every_size(monkeypatch, tmp_path, cache_on):
    _fresh(monkeypatch, tmp_path)
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 4).to("neuron")
    sizes = (3, 5, 7)

    def run():
        f = torch.compile(lambda x: torch.nn.functional.gelu(lin(x)).sum(-1), backend="neuron")
        outs = []
        for n in sizes:
            x = torch.randn(n, 8, generator=torch.Generator().manual_seed(n)).to("neuron")
            torch._dynamo.mark_dynamic(x, 0)
            outs.append(f(x).cpu())
        return outs

    first = run()
    torch._dynamo.reset()
    counters.clear()
    eager_neuron.compile.reset_stats()
    second = run()
    c = eager_neuron.compile.stats()
    # one graph (forward and backward programs) loaded once, then every size runs it
    assert c["programs_loaded"] == 2 and c["programs_saved"] == 0, c
    assert counters["aot_autograd"]["autograd_cache_hit"] == 1, dict(counters["aot_autograd"])
    assert c["graph_launches"] == len(sizes), c
    w, b = lin.weight.detach().cpu().double(), lin.bias.detach().cpu().double()
    for n, a, o in zip(sizes, first, second):
        assert torch.equal(a, o)
        x = torch.randn(n, 8, generator=torch.Generator().manual_seed(n)).double()
        ref = torch.nn.functional.gelu(x @ w.T + b).sum(-1)
        torch.testing.assert_close(o.double(), ref, rtol=1e-5, atol=1e-5)
