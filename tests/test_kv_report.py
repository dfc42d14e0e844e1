"""`edgekv kv-report` (edgekv/lab/kv_report.py, cli/kv_report.py; issue 14 item 2): what each K/V
cache pair costs. The KL divergences are checked against a float64 (long double) NumPy
computation from logits evaluated separately, whole chunks at once; the context that fits a
budget against the arithmetic done here from the model's hyperparameters."""

from __future__ import annotations

import re
import struct
from types import SimpleNamespace

import numpy as np
import pytest

from edgekv.cli import main
from edgekv.kv.plan import max_context
from edgekv.models import read_hparams
from edgekv.errors import EdgeKVError
from edgekv.gguf.reader import GGUFFile
from edgekv.lab.kv_report import CachePair, kl_divergence, parse_pairs, pareto_front
from edgekv.loader import load
from conftest import REFERENCE_DIR

GPL3 = REFERENCE_DIR / "gpl3.txt"
HP = SimpleNamespace(head_dim=64, head_dim_v=64, n_layers=6)  # what parse_pairs reads of a model


def test_pairs_parse_with_the_base_first_and_bad_entries_named():
    pairs = parse_pairs("q8_0, q8_0/q4_0,f16,q8_0", HP)
    assert [p.name for p in pairs] == ["f16", "q8_0", "q8_0/q4_0"]
    assert pairs[2] == CachePair("q8_0", "q4_0")
    for spec, message in (("q9_0", "q9_0"), ("q8_0/q4_0/f16", "K_TYPE/V_TYPE"), ("q8_0/", "K_TYPE/V_TYPE")):
        with pytest.raises(EdgeKVError, match=re.escape(message)):
            parse_pairs(spec, HP)
    with pytest.raises(EdgeKVError, match="head size"):
        parse_pairs("q4_0", SimpleNamespace(head_dim=48, head_dim_v=48, n_layers=4))


def test_per_layer_mixes_parse_to_canonical_names():
    pairs = parse_pairs("q8_0:2+q4_0+q8_0:1/q4_0,q8_0:3+q8_0:3,q4_0:6", HP)
    assert [p.name for p in pairs] == ["f16", "q8_0:2+q4_0:3+q8_0:1/q4_0", "q8_0", "q4_0"]  # same layers, same pair
    assert pairs[1].mixed and not pairs[2].mixed
    # the plot's label: the type most layers have, then where the others are
    assert pairs[1].label == "q8_0 (q4_0 in 2-4) / q4_0" and pairs[2].label == "q8_0"  # a tie: the first
    assert CachePair("f16:1+q8_0:2+q4_0:1", "q8_0").label == "q8_0 (f16 in 0; q4_0 in 3) / q8_0"
    for spec, message in (("q8_0:2+q4_0:2", "names 4 layers, but the model has 6"),
                          ("q8_0+q4_0", "only one segment"), ("q8_0:x", "is not TYPE or TYPE:N")):
        with pytest.raises(EdgeKVError, match=re.escape(message)):
            parse_pairs(spec, HP)


def test_mix_verdicts_say_whether_a_mix_beats_the_uniform_types():
    from edgekv.lab.kv_report import mix_verdicts

    f16, q8, q4 = (CachePair(t, t) for t in ("f16", "q8_0", "q4_0"))
    q5 = CachePair("q5_0", "q5_0")
    edges, worse = CachePair("q8_0:1+q4_0:4+q8_0:1", "q4_0"), CachePair("q8_0:3+q4_0:3", "q8_0:3+q4_0:3")
    points = {f16: (100, 0.0), q8: (53, 0.002), q5: (34, 0.03), q4: (28, 0.07), edges: (32, 0.02), worse: (40, 0.04)}
    assert mix_verdicts(points) == [
        f"{edges.name}: on the Pareto front, beats the uniform q5_0",
        f"{worse.name}: not on the Pareto front, beaten by q5_0, {edges.name} (smaller and closer to f16)"]
    points[q5] = (31, 0.03)  # smaller than the mix: it beats nothing uniform, but nothing beats it
    del points[worse]
    assert mix_verdicts(points)[0].endswith("but beats no uniform pair (it only fills a gap)")
    assert mix_verdicts({f16: (100, 0.0), q4: (28, 0.07)}) == []


def test_the_pareto_front_keeps_the_pairs_nothing_beats():
    a, b, c, d = (CachePair(t, t) for t in ("f16", "q8_0", "q5_0", "q4_0"))
    points = {a: (100, 0.0), b: (50, 0.01), c: (60, 0.02), d: (30, 0.08)}  # c: bigger and worse than b
    assert pareto_front(points) == {a, b, d}
    assert pareto_front({a: (10, 0.1), b: (10, 0.1)}) == {a, b}  # ties beat nobody


def test_point_numbers_cover_no_point_and_no_other_number():
    from edgekv.lab.kv_plot import _CHAR_W, _DOT_R, _TEXT_H, _label_offsets

    # a cluster as 4-bit types and their mixes make: markers 3 to 12 points apart
    points = [(100, 200), (110, 212), (110, 188), (122, 200), (100, 212), (300, 50)]
    labels = [str(n) for n in range(1, 7)]
    boxes = []
    for (x, y), text, (dx, dy) in zip(points, labels, _label_offsets(points, labels)):
        w = _CHAR_W * len(text)
        x0 = x + dx if dx > 0 else x + dx - w if dx < 0 else x - w / 2
        boxes.append((x0, x0 + w, y + dy, y + dy + _TEXT_H))
    for i, (x0, x1, y0, y1) in enumerate(boxes):
        assert not any(x0 - _DOT_R < px < x1 + _DOT_R and y0 - _DOT_R < py < y1 + _DOT_R for px, py in points), i
        assert not any(x0 < b1 and b0 < x1 and y0 < c1 and c0 < y1 for j, (b0, b1, c0, c1) in enumerate(boxes) if j != i)
    assert _label_offsets([(300, 50)], ["1"]) == [(6, 3)]  # alone: right of its point


def test_kl_divergence_is_float64_kl():
    rng = np.random.default_rng(0)
    base, new = rng.normal(0, 3, (5, 1000)).astype(np.float32), rng.normal(0, 3, (5, 1000)).astype(np.float32)
    b, n = base.astype(np.longdouble), new.astype(np.longdouble)
    p = np.exp(b) / np.exp(b).sum(1, keepdims=True)
    q = np.exp(n) / np.exp(n).sum(1, keepdims=True)
    expected = (p * np.log(p / q)).sum(1)
    base_logp = base.astype(np.float64) - np.log(np.exp(base.astype(np.float64)).sum(1, keepdims=True))
    np.testing.assert_allclose(kl_divergence(base_logp, new), expected.astype(np.float64), rtol=1e-9)
    assert np.allclose(kl_divergence(base_logp, base), 0, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["smollm2_path", "gemma3_path"])
def test_the_longest_context_fits_the_budget_and_one_more_step_does_not(fixture, request):
    hp = read_hparams(GGUFFile(request.getfixturevalue(fixture)))
    budget = 300 << 20
    local = tuple(hp.local_layers) or (False,) * hp.n_layers

    def kv_bytes(n, row):  # sliding layers hold window + one batch (512) at most
        return sum(min(n, hp.window + 512) if is_local and hp.window else n for is_local in local) * row

    for tk, tv in (("f16", "f16"), ("q8_0", "q4_0")):
        row = hp.n_kv_heads * (hp.head_dim * {"f16": 2, "q8_0": 34 / 32, "q4_0": 18 / 32}[tk] +
                               hp.head_dim_v * {"f16": 2, "q8_0": 34 / 32, "q4_0": 18 / 32}[tv])
        n = max_context(hp, tk, tv, budget)
        assert n % 256 == 0 and kv_bytes(n, row) <= budget < kv_bytes(n + 256, row)
    assert max_context(hp, "f16", "f16", 1000) == 0


def _table(out: str) -> dict[str, dict[str, str]]:
    """The pairs' table (after the layer scan's, if any): K/V name -> column -> cell."""
    out = out[out.index("| K | V |"):]
    lines = [line for line in out.splitlines() if line.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [dict(zip(head, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]
    return {r["K"] if r["K"] == r["V"] else f'{r["K"]}/{r["V"]}': r for r in rows}


def _independent_kld(model_path, chunks: list[list[int]], type_k: str, type_v: str) -> float:
    """Mean KL(f16 || pair) over the scored half of each chunk, in long double. The chunks are
    cut as the method cuts them (256, then 128 and 127 tokens): the logits of a batch depend
    on how the text is cut (evaluated whole, SmolLM2's f16 rows differ from these by a mean
    KLD of 0.003, a noise floor to keep in mind when reading the report)."""
    model = load(str(model_path))
    sessions = [model.session(512, 512, "f16", "f16"), model.session(512, 512, type_k, type_v)]
    total, count = np.longdouble(0), 0
    for chunk in chunks:
        rows = []
        for s in sessions:
            s.reset()
            s.eval(chunk[:256])
            scored = [s.eval(chunk[a:b], all_logits=True) for a, b in ((256, 384), (384, 511))]
            rows.append(np.concatenate(scored).astype(np.longdouble))
        p, q = (np.exp(r - r.max(1, keepdims=True)) for r in rows)
        p, q = p / p.sum(1, keepdims=True), q / q.sum(1, keepdims=True)
        total += (p * np.log(p / q)).sum()
        count += len(p)
    return float(total / count)


@pytest.mark.slow
def test_kv_report_on_smollm2(smollm2_path, tmp_path, capsys):
    png = tmp_path / "kv.png"
    code = main(["kv-report", "-m", str(smollm2_path), "-f", str(GPL3), "--chunks", "2", "--types",
                 "q8_0,q8_0/q4_0,q8_0:2+q4_0+q8_0:2/q4_0", "--depth", "256", "--n-gen", "4", "--mem-budget", "64M", "--png", str(png)])
    out = capsys.readouterr().out
    assert code == 0, out
    table = _table(out)
    edges = "q8_0:2+q4_0:26+q8_0:2/q4_0"  # per-layer K: the first and last two layers q8_0
    assert list(table) == ["f16", "q8_0", "q8_0/q4_0", edges]
    base, q8, mixed, by_layer = table.values()
    assert base["mean KLD"].startswith("0.00000") and base["same top"] == "100.00%" and base["Pareto"] == "yes"
    assert base["bits/value"] == "16.00" and q8["bits/value"] == "8.50" and mixed["bits/value"] == "6.50"
    assert base["KV bytes/token"] == f"{30 * 3 * 64 * 2 * 2:,}"  # 30 layers, 3 KV heads, 64 values, K and V
    # K: 4 layers of q8_0 (34 bytes a block of 32) and 26 of q4_0 (18); V: 30 of q4_0
    assert by_layer["KV bytes/token"] == f"{3 * 2 * (4 * 34 + 26 * 18 + 30 * 18):,}"
    assert by_layer["bits/value"] == f"{(8 * (4 * 34 + 26 * 18) / (30 * 32) + 4.5) / 2:.2f}"
    assert re.search(rf"^- {re.escape(edges)}: (not )?on the Pareto front", out, re.M)
    assert base["max ctx in 64.00 MiB"] == f"{(64 << 20) // (30 * 3 * 64 * 4) // 256 * 256:,}"
    assert all(float(r["tg4 t/s @ d256"]) > 0 for r in table.values())

    tok = load(str(smollm2_path)).tokenizer
    tokens = tok.encode(GPL3.read_bytes(), add_bos=None)
    chunks = [([tok.bos_id] if tok.add_bos else tokens[i * 512:i * 512 + 1]) + tokens[i * 512 + 1:(i + 1) * 512]
              for i in range(2)]
    for row, (tk, tv) in ((q8, ("q8_0", "q8_0")), (mixed, ("q8_0", "q4_0")), (by_layer, edges.split("/"))):
        reported = float(row["mean KLD"].split()[0])
        assert reported == pytest.approx(_independent_kld(smollm2_path, chunks, tk, tv), rel=2e-3, abs=1e-5)
    assert 0 < float(q8["mean KLD"].split()[0]) < float(mixed["mean KLD"].split()[0])

    header = png.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", header[16:24]) == (1320, 780)


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["--types", "q9_0"], "q9_0"),
    (["--png", "out.jpg"], "ending in .png"),
    (["-c", "4096"], "you need at least 8192 tokens"),
])
def test_bad_kv_report_requests_say_what_to_do(smollm2_path, capsys, args, message):
    code = main(["kv-report", "-m", str(smollm2_path), "-f", str(GPL3), "--depth", "0"] + args)
    assert code == 1 and message in capsys.readouterr().err


def test_layer_scan_measures_each_layer_and_mixes_the_costliest(tiny_model, capsys):
    """--layer-scan's per-layer costs against the float64 reference rounding one layer's K
    (tests/numpy_reference.py), and the mix it adds: q8_0 K in the two costliest layers."""
    from edgekv.lab.layer_scan import per_layer
    from numpy_reference import ReferenceModel

    path = tiny_model("llama", n_layers=4, dim=256, n_heads=4, n_kv_heads=2, head_dim=64, ff=256)
    code = main(["kv-report", "-m", str(path), "-f", str(GPL3), "-c", "64", "--chunks", "2", "--types", "q8_0",
                 "--depth", "0", "--layer-scan", "--scan-chunks", "2", "--scan-type", "q4_0"])
    out = capsys.readouterr().out
    assert code == 0, out
    costs = [float(c) for c in re.findall(r"^\| \d \| ([0-9.e-]+) \|$", out, re.M)]
    assert len(costs) == 4

    tok = load(str(path)).tokenizer
    tokens = tok.encode(GPL3.read_text(), add_bos=None, special=False)
    chunks = [tokens[i * 64:(i + 1) * 64] for i in range(2)]
    if tok.add_bos:
        chunks = [[tok.bos_id] + c[1:] for c in chunks]

    def logp(types):  # the scored rows (positions 32..62) of each chunk, log-softmaxed in long double
        rows = np.concatenate([ReferenceModel(path, types, "f32").logits(c)[32:63] for c in chunks])
        rows = rows.astype(np.longdouble)
        return rows - np.log(np.exp(rows - rows.max(1, keepdims=True)).sum(1, keepdims=True)) - rows.max(1, keepdims=True)

    base = logp("f32")
    for i in range(4):
        types = ["f32"] * 4
        types[i] = "q4_0"
        want = float((np.exp(base) * (base - logp(types))).sum(1).mean())
        assert costs[i] == pytest.approx(want, rel=0.02, abs=1e-7), (i, costs, want)
    top = sorted(range(4), key=lambda i: -costs[i])[:2]
    mix = per_layer(["q8_0" if i in top else "q4_0" for i in range(4)])
    assert f"{mix}/q4_0" in _table(out)
