"""Hugging Face models (GPT-2, BERT, Llama, T5, ViT) on `neuron` match the CPU, with no fallback.

Each model is built from a tiny config on the CPU with a fixed seed (nothing is downloaded: no
weights, no tokenizer; token ids are random), deep-copied, and moved to `neuron`. Per model and
per mode (plain eager, adaptive eager): the forward matches the CPU, three AdamW steps give the
same losses and parameters, and not one op reaches the CPU fallback. GPT-2's greedy `generate()`
yields the same tokens.
"""

from __future__ import annotations

import contextlib
import copy
import os

import pytest
import torch

import eager_neuron

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tiny configs only: never reach the hub
transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()  # tiny vocabularies make config warnings noise

RTOL, ATOL = 1e-4, 1e-5
STEPS = 3
VOCAB, BATCH, SEQ = 97, 2, 8


# ---------------------------------------------------------------------------------------------
# tiny models: (build on the CPU from a seed, inputs from a generator)
# ---------------------------------------------------------------------------------------------

def _gpt2():
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=32,
        # NOTE: attention dropout draws inside F.scaled_dot_product_attention, where the CPU
        # (flash kernel) and neuron (math path) consume the generator differently: keep it 0;
        # residual/embedding dropout are nn.Dropout (shared generator, same masks): kept on
        attn_pdrop=0.0, resid_pdrop=0.1, embd_pdrop=0.1,
        bos_token_id=0, eos_token_id=1, pad_token_id=1))


def _bert():
    return transformers.BertForSequenceClassification(transformers.BertConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
        vocab_size=VOCAB, max_position_embeddings=32, num_labels=3,
        attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.1, pad_token_id=0))


def _llama():
    # NOTE: 4 query heads over 2 key/value heads: grouped-query attention (repeat_kv)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=32,
        bos_token_id=0, eos_token_id=1, pad_token_id=1))


def _t5():
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        num_layers=2, num_decoder_layers=2, d_model=64, d_kv=16, num_heads=4, d_ff=128,
        vocab_size=VOCAB, dropout_rate=0.1, decoder_start_token_id=0, pad_token_id=0,
        eos_token_id=1))


def _bart():
    # an encoder-decoder with learned positions and a shifted-right decoder input (the labels);
    # activation/attention dropout inside F.scaled_dot_product_attention off as for GPT-2
    return transformers.BartForConditionalGeneration(transformers.BartConfig(
        encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=VOCAB,
        max_position_embeddings=32, dropout=0.1, attention_dropout=0.0, activation_dropout=0.0,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
        forced_eos_token_id=None))


def _vit():
    return transformers.ViTForImageClassification(transformers.ViTConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
        image_size=16, patch_size=4, num_labels=3,
        attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.1))


def _ids(g, n=SEQ):
    return torch.randint(2, VOCAB, (BATCH, n), generator=g)


def _lm_inputs(g):
    ids = _ids(g)
    return {"input_ids": ids, "labels": ids}


def _bert_inputs(g):
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, -3:] = 0  # a padded row: the attention mask reaches the kernels
    return {"input_ids": _ids(g), "attention_mask": mask,
            "labels": torch.randint(0, 3, (BATCH,), generator=g)}


def _t5_inputs(g):
    return {"input_ids": _ids(g), "labels": _ids(g, 5)}


def _vit_inputs(g):
    return {"pixel_values": torch.randn(BATCH, 3, 16, 16, generator=g),
            "labels": torch.randint(0, 3, (BATCH,), generator=g)}


MODELS = {
    "gpt2": (_gpt2, _lm_inputs),
    "bert": (_bert, _bert_inputs),
    "llama": (_llama, _lm_inputs),
    "t5": (_t5, _t5_inputs),
    "bart": (_bart, _t5_inputs),
    "vit": (_vit, _vit_inputs),
}


def build(name: str, seed: int = 0):
    """The CPU model (same weights for a given seed) and STEPS batches of inputs.

    >>> model, batches = build("gpt2"); sorted(batches[0])
    ['input_ids', 'labels']
    """
    make_model, make_inputs = MODELS[name]
    torch.manual_seed(seed)
    model = make_model()
    g = torch.Generator().manual_seed(seed + 1)
    return model, [make_inputs(g) for _ in range(STEPS)]


def to_device(inputs: dict, device: str) -> dict:
    return {k: v.to(device) for k, v in inputs.items()}


def train(model, batches, device: str, seed: int = 0, eps: float = 1e-4):
    """STEPS AdamW steps on `device` (model moved there); returns (losses, model).

    NOTE: eps=1e-4, not 1e-8: a weight whose gradient is almost zero (an embedding row seen only
    through the tied LM head, a key bias) gets rounding noise of ~1e-9 on either device, and
    AdamW divides by sqrt(v)+eps, turning noise into lr-sized steps of random sign.
    """
    model = model.to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01, eps=eps)
    torch.manual_seed(seed)  # dropout masks come from the shared CPU generator
    losses = []
    for inputs in batches:
        opt.zero_grad()
        loss = model(**to_device(inputs, device)).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


# ---------------------------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------------------------

@pytest.fixture(autouse=True, scope="module")
def _one_cpu_thread():
    """The CPU reference on one thread: tiny ops on OpenMP's spinning threads are ~100x slower
    on a shared 2-core machine (measured: an MLP step 650 ms on 2 threads, 2 ms on 1)."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


@pytest.fixture(params=["plain", "adaptive"])
def eager_mode(request):
    """Plain eager and adaptive eager (which must not change results)."""
    return contextlib.nullcontext if request.param == "plain" else eager_neuron.adaptive


def _assert_no_fallbacks(stats, what):
    assert stats["launches"] > 0, what
    assert not stats["fallbacks"], f"{what}: CPU fallbacks {stats['fallbacks']}"


@pytest.mark.models
@pytest.mark.parametrize("name", list(MODELS))
def test_forward_matches_cpu(name, stats_delta, eager_mode):
    model, batches = build(name)
    model.eval()
    neuron_model = copy.deepcopy(model).to("neuron")
    with torch.no_grad():
        ref = model(**batches[0]).logits
        eager_neuron.reset_stats()
        with eager_mode():
            got = neuron_model(**to_device(batches[0], "neuron")).logits
        stats = stats_delta()
    assert got.device.type == "neuron"
    torch.testing.assert_close(got.cpu(), ref, rtol=RTOL, atol=ATOL)
    _assert_no_fallbacks(stats, f"{name} forward")


@pytest.mark.models
@pytest.mark.parametrize("name", list(MODELS))
def test_adamw_steps_match_cpu(name, stats_delta, eager_mode):
    model, batches = build(name)
    cpu_losses, cpu_model = train(copy.deepcopy(model), batches, "cpu")
    eager_neuron.reset_stats()
    with eager_mode():
        n_losses, n_model = train(model, batches, "neuron")
    stats = stats_delta()
    torch.testing.assert_close(torch.tensor(n_losses), torch.tensor(cpu_losses), rtol=RTOL,
                               atol=ATOL)
    n_state, c_state = n_model.state_dict(), cpu_model.state_dict()
    assert n_state.keys() == c_state.keys()
    for key, ref in c_state.items():
        got = n_state[key]
        assert got.device.type == "neuron", key
        torch.testing.assert_close(got.cpu(), ref, rtol=RTOL, atol=ATOL,
                                   msg=lambda m, key=key: f"{name} {key}: {m}")
    _assert_no_fallbacks(stats, f"{name} training")


@pytest.mark.models
def test_tied_embeddings_stay_tied():
    # GPT-2's lm_head shares wte's weight: after .to("neuron") it must still be one parameter,
    # or the two copies train apart (the CPU updates one tensor with the summed gradient)
    model, _ = build("gpt2")
    n_model = copy.deepcopy(model).to("neuron")
    assert n_model.lm_head.weight is n_model.transformer.wte.weight
    assert len(list(n_model.parameters())) == len(list(model.parameters()))


@pytest.mark.models
def test_gpt2_greedy_generate_matches_cpu(stats_delta, eager_mode):
    model, batches = build("gpt2")
    model.eval()
    n_model = copy.deepcopy(model).to("neuron")
    prompt = batches[0]["input_ids"][:, :4]
    mask = torch.ones_like(prompt)
    kwargs = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 1}
    ref = model.generate(prompt, attention_mask=mask, **kwargs)
    eager_neuron.reset_stats()
    with eager_mode():
        got = n_model.generate(prompt.to("neuron"), attention_mask=mask.to("neuron"), **kwargs)
    stats = stats_delta()
    assert got.shape == ref.shape == (BATCH, 10)
    assert got.cpu().tolist() == ref.tolist()
    _assert_no_fallbacks(stats, "gpt2 generate")


# ---------------------------------------------------------------------------------------------
# pipeline(...) on "neuron": a tiny word-level tokenizer built in memory, nothing downloaded
# ---------------------------------------------------------------------------------------------

_WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + "the cat sat on a mat dog ran far".split() + [
    f"w{i}" for i in range(40)]


def _tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(
        {w: i for i, w in enumerate(_WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", eos_token="[SEP]")


@pytest.fixture(scope="module")
def saved_pipeline_models(tmp_path_factory):
    """A tiny GPT-2 and a tiny BERT classifier saved with their tokenizer, as from the hub."""
    tok = _tokenizer()
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=len(_WORDS), n_positions=32,
        bos_token_id=2, eos_token_id=3, pad_token_id=0))
    bert = transformers.BertForSequenceClassification(transformers.BertConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
        vocab_size=len(_WORDS), max_position_embeddings=32, num_labels=3, pad_token_id=0))
    paths = {}
    for name, model in (("gpt2", gpt2), ("bert", bert)):
        paths[name] = str(tmp_path_factory.mktemp(name))
        model.save_pretrained(paths[name])
        tok.save_pretrained(paths[name])
    return paths


@pytest.mark.models
@pytest.mark.parametrize("placement", [{"device": "neuron"}, {"device_map": "neuron"}])
def test_text_generation_pipeline_on_neuron(saved_pipeline_models, placement, stats_delta):
    path = saved_pipeline_models["gpt2"]
    want = transformers.pipeline("text-generation", model=path, device="cpu")
    pipe = transformers.pipeline("text-generation", model=path, **placement)
    assert all(p.device.type == "neuron" for p in pipe.model.parameters())
    assert pipe.device.type == "neuron"
    for prompt in ("the cat sat", "a dog ran far on the"):
        got = pipe(prompt, max_new_tokens=6, do_sample=False)
        assert got == want(prompt, max_new_tokens=6, do_sample=False)
        assert got[0]["generated_text"].startswith(prompt)
    _assert_no_fallbacks(stats_delta(), "text-generation pipeline")


@pytest.mark.models
def test_text_classification_pipeline_on_neuron(saved_pipeline_models, stats_delta):
    path = saved_pipeline_models["bert"]
    texts = ["the cat sat on a mat", "dog ran", "w3 w7 the far"]
    want = transformers.pipeline("text-classification", model=path, device="cpu", top_k=None)
    pipe = transformers.pipeline("text-classification", model=path, device="neuron", top_k=None)
    assert next(pipe.model.parameters()).device.type == "neuron"
    got = pipe(texts)
    ref = want(texts)
    for g, w in zip(got, ref):
        gs, ws = sorted(g, key=lambda d: d["label"]), sorted(w, key=lambda d: d["label"])
        assert [d["label"] for d in gs] == [d["label"] for d in ws]
        for a, b in zip(gs, ws):
            assert a["score"] == pytest.approx(b["score"], rel=1e-4, abs=1e-6)
    _assert_no_fallbacks(stats_delta(), "text-classification pipeline")
