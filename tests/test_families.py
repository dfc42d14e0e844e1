"""The model families on llama's graph (qwen2, qwen3, phi3, Mistral-style llama) and the
RoPE scalings, end to end on tiny random models against the float64 NumPy reference
(tests/numpy_reference.py: its own split of fused tensors, biases, Q/K norms, partial
rotary, YaRN, LongRoPE factors and sliding windows). Against llama.cpp itself:
test_families_llama_cpp.py."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from edgekv.errors import UnsupportedModelError
from edgekv.loader import load
from numpy_reference import ReferenceModel, ReferenceSession

# head size 32: every cache type's blocks fit a head
DIMS = dict(dim=128, n_heads=4, n_kv_heads=2, head_dim=32, ff=256)
YARN = {"qwen2.rope.scaling.type": "yarn", "qwen2.rope.scaling.factor": 4.0,
        "qwen2.rope.scaling.original_context_length": 32}
FAMILIES = {
    "qwen2": dict(arch="qwen2"),  # Q/K/V biases
    "qwen3": dict(arch="qwen3", head_dim=64),  # Q/K norms, head size != dim / n_heads
    "phi3": dict(arch="phi3", rope_dims=24),  # fused qkv and gate+up, partial rotary
    "phi3-longrope": dict(arch="phi3", rope_dims=24, longrope=32),  # LongRoPE factors + attn_factor
    "mistral": dict(arch="mistral"),  # a llama GGUF with an 8-token sliding window
    "qwen2-yarn": dict(arch="qwen2", metadata=YARN),
    "llama-linear": dict(arch="llama", metadata={"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0}),
}
CACHE_TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "iq4_cal"]
TOKENS = [5, 17, 42, 3, 99, 7, 64, 12, 8, 30, 2, 77, 51, 9, 14, 33, 21, 60, 11, 4]
# F32 weights and an f32 cache leave float32 arithmetic: measured <= 1e-6 of the logit scale.
PREFILL_TOL = 1e-5
# The cache types round K/V as the reference does, but a value on a rounding boundary can
# go the other way in float32 and stays so until its token is discarded: measured worst
# 1.9e-3 (bf16) and 1.5e-2 (q4_1, one 4-bit code: 1/15 of a block's range); f16 softmax
# weights add ~4e-4 at every step. So: a bound on the worst step per type, and most steps
# at rounding noise. A missing bias, norm, window, factor or re-rotation moves every step
# after it by 1e-2 to 1.
RING_TOL = {"q4_0": 3e-2, "q4_1": 3e-2, "q5_0": 3e-2, "q5_1": 3e-2, "iq4_nl": 3e-2, "iq4_cal": 3e-2}  # else 5e-3
RING_MEDIAN_TOL = 1e-3


def _rel_err(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def _family(tiny_model, name: str):
    return tiny_model(weight_type="F32", **{**DIMS, **FAMILIES[name]})


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_prefill_matches_numpy_reference(tiny_model, family):
    path = _family(tiny_model, family)
    ours = load(path).session(n_ctx=64, n_batch=64, cache_type_k="f32", cache_type_v="f32").eval(
        TOKENS, all_logits=True)
    ref = ReferenceModel(path, n_ctx=64).logits(TOKENS)
    assert _rel_err(ours, ref) < PREFILL_TOL
    assert (ours.argmax(1) == ref.argmax(1)).all()


@pytest.mark.parametrize("cache_type", CACHE_TYPES)
@pytest.mark.parametrize("family", ["qwen2", "qwen3", "phi3-longrope", "mistral", "qwen2-yarn"])
def test_ring_wraps_with_every_cache_type(tiny_model, family, cache_type):
    """Decode 50 tokens one at a time into a context of 20 under the shift policy: the ring
    wraps twice, keys are re-rotated on the way (with the model's RoPE scaling and factors),
    and every step's logits follow the reference applying the same discards."""
    path = _family(tiny_model, family)
    model = load(path)
    keep, n_ctx = 2, 20
    s = model.session(n_ctx=n_ctx, n_batch=1, cache_type_k=cache_type, cache_type_v=cache_type,
                      context_shift="shift", n_keep=keep)
    m = s.cache.key_map  # iq4_cal's calibrated map: a parameter of its format, as the rotation is
    ref = ReferenceSession(ReferenceModel(path, cache_type, cache_type, n_ctx=n_ctx,
                                          key_map=None if m is None else (m.mean, m.scale)))
    errs, shifts = [], 0
    for t in np.random.default_rng(3).integers(0, model.hp.n_vocab, 50):
        before = s.n_tokens
        s.eval([int(t)])
        dropped = before + 1 - s.n_tokens
        if dropped:
            ref.discard(keep, dropped)
            shifts += 1
        errs.append(_rel_err(s.logits, ref.step(int(t))))
    assert shifts >= 2
    assert max(errs) < RING_TOL.get(cache_type, 5e-3), f"worst step {int(np.argmax(errs))}: {max(errs):.2e}"
    assert np.median(errs) < RING_MEDIAN_TOL


def test_longrope_factors_follow_the_context_size(tiny_model):
    # original context 300: llama.cpp's get_rope_factors takes the long factors when its
    # context, n_ctx padded to a multiple of 256, exceeds it: 256 stays short, 257 (512)
    # is long. (The reference pads too; tiny_families.json's phi3-longrope-padded is
    # llama.cpp's own word on a session of 64 over an original context of 128.)
    path = tiny_model(weight_type="F32", n_ctx=1024, **{**DIMS, **FAMILIES["phi3-longrope"], "longrope": 300})
    model = load(path)
    assert model.hp.rope_scaling.n_ctx_orig == 300 and model.hp.rope_scaling.attn_factor > 1
    for n_ctx in (256, 257):
        ours = model.session(n_ctx=n_ctx, cache_type_k="f32", cache_type_v="f32").eval(TOKENS[:16], all_logits=True)
        assert _rel_err(ours, ReferenceModel(path, n_ctx=n_ctx).logits(TOKENS[:16])) < PREFILL_TOL
        other = 257 if n_ctx == 256 else 256
        assert _rel_err(ours, ReferenceModel(path, n_ctx=other).logits(TOKENS[:16])) > 1e-2


def test_mistral_window_masks_old_positions(tiny_model):
    # the window (8) is honoured on every layer: beyond it the logits differ from a model
    # that attends to everything, and match the reference that masks
    path = _family(tiny_model, "mistral")
    model = load(path)
    assert model.hp.window == 8 and all(model.hp.local_layers)
    assert model.network.__class__.__name__ == "LlamaModel"
    ours = model.session(n_ctx=64, cache_type_k="f32", cache_type_v="f32").eval(TOKENS, all_logits=True)
    ref = ReferenceModel(path)
    np.testing.assert_allclose(ours[:8], ref.logits(TOKENS)[:8], atol=PREFILL_TOL * np.abs(ours).max())
    ref.hp = dataclasses.replace(ref.hp, local_layers=(False,) * ref.hp.n_layers)  # the reference without the window
    assert _rel_err(ours[-4:], ref.logits(TOKENS)[-4:]) > 1e-2


def test_unknown_rope_scaling_is_refused_with_the_known_ones(tiny_model):
    path = tiny_model("llama", metadata={"llama.rope.scaling.type": "llama3"})
    with pytest.raises(UnsupportedModelError, match=r"'llama3'.*none, linear, yarn, longrope"):
        load(path)


def test_unsupported_architecture_names_the_supported_ones(tiny_model, tmp_path):
    data = bytearray(tiny_model("llama").read_bytes())
    at = data.index(b"llama", data.index(b"general.architecture"))
    data[at : at + 5] = b"rwkv6"
    path = tmp_path / "rwkv.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(UnsupportedModelError) as err:
        load(path)
    message = str(err.value)
    assert "'rwkv6' is not supported" in message
    for arch in ("gemma3", "llama", "phi3", "qwen2", "qwen3"):
        assert arch in message


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "phi3", "mistral"])
def test_edgekv_run_and_chat_work_for_each_family(tiny_model, capsys, arch):
    from edgekv import Llama
    from edgekv.cli import main

    path = str(tiny_model(arch, "Q8_0", **DIMS))
    assert main(["run", "-m", path, "-p", "The quick", "-n", "6", "--temp", "0", "-c", "64"]) == 0
    out, _ = capsys.readouterr()
    expected = Llama(path, n_ctx=64)("The quick", max_tokens=6, temperature=0.0)["choices"][0]["text"]
    assert out == expected + "\n" and expected
    import io
    import sys

    stdin, sys.stdin = sys.stdin, io.StringIO("Hello there\n")
    try:
        rc = main(["chat", "-m", path, "-n", "4", "--temp", "0", "-c", "128",
                   "--chat-template-kwargs", '{"enable_thinking": false}'])
    finally:
        sys.stdin = stdin
    out, err = capsys.readouterr()
    assert rc == 0 and "error" not in err and "tokens/s" in err, err  # an answer was generated and timed


@pytest.mark.parametrize("arch, n_layers, head_dim, scaled_by", [
    ("phi3", 2, 96, 96),  # 1/sqrtf(96) is one float32 below the float64 value, rounded
    ("gemma3", 26, 32, 32),  # Gemma 3 scales Q by its head size...
    ("gemma3", 62, 32, 16),  # ...except the 27B (62 layers): 1/sqrt(dim / heads) = 1/sqrt(64 / 4)
])
def test_attention_scale_is_llama_cpps_float32(tiny_model, arch, n_layers, head_dim, scaled_by):
    # llama.cpp: 1.0f/sqrtf(float(n)) (gemma3: its f_attention_scale), so float32 throughout
    path = tiny_model(arch=arch, n_layers=n_layers, **{**DIMS, "dim": 64, "head_dim": head_dim})
    assert load(path).hp.attn_scale == float(np.float32(1) / np.sqrt(np.float32(scaled_by)))
