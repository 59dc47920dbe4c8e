"""FlexAttention: block masks from a mask function (``iosim.block_mask``) and the ``flex`` algorithm over them.

Held here: the blocks' kinds against a brute force over every pair; flex's outputs against float64 attention with the
mask function's element mask, on awkward shapes and every named mask; every count equal to its closed form
(Hypothesis, over random masks); against the dense algorithms where the mask is dense or causal (flash-swapped visits
the same tiles and moves the same Q, K, V and O); torch's create_block_mask and flex_attention where torch is
installed; the command line; everything else refused by name.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import relative_error
from hypothesis import given, settings
from hypothesis import strategies as st

import iosim
from iosim.cli import main as cli_main
from iosim.variants import flex as F
from iosim.variants import score_mods as S

NAMED = {
    "causal": lambda n_q, n_k: F.causal(n_q, n_k),
    "window": lambda n_q, n_k: F.window(n_q, n_k, 37),
    "prefix_lm": lambda n_q, n_k: F.prefix_lm(n_q, n_k, 20),
    "sinks_window": lambda n_q, n_k: F.sinks_window(n_q, n_k, 4, 30),
}


def brute_kinds(keep: np.ndarray, Br: int, Bc: int) -> np.ndarray:
    """Each tile's kind by looking at every element, as torch's create_block_mask pads the mask with False to whole
    blocks: 0 empty, 1 partial, 2 full (every one of its B_r·B_c entries attends, so never a ragged one)."""
    T_r, T_c = -(-keep.shape[0] // Br), -(-keep.shape[1] // Bc)
    out = np.empty((T_r, T_c), dtype=int)
    for i in range(T_r):
        for j in range(T_c):
            tile = keep[i * Br:(i + 1) * Br, j * Bc:(j + 1) * Bc]
            out[i, j] = 2 if tile.shape == (Br, Bc) and tile.all() else 1 if tile.any() else 0
    return out


@pytest.mark.parametrize("name", sorted(NAMED))
@pytest.mark.parametrize("n_q, n_k, block", [(1, 1, (128, 128)), (113, 239, (16, 32)), (239, 113, (32, 7)),
                                             (239, 239, (64, 64))])
def test_flex_matches_float64_and_its_closed_form(name, n_q, n_k, block):
    mask_mod = NAMED[name](n_q, n_k)
    bm = iosim.block_mask(mask_mod, n_q, n_k, block=block)
    keep = bm.element_mask()
    assert np.array_equal(bm.kinds, brute_kinds(keep, bm.Br, bm.Bc))
    rng = np.random.default_rng(n_q + n_k)
    q = rng.standard_normal((2, 3, n_q, 12))
    k, v = rng.standard_normal((2, 3, n_k, 12)), rng.standard_normal((2, 3, n_k, 5))
    got = iosim.simulate("flex", q, k, v, M=20_000, block_mask=bm, dropout_p=0.2, seed=7)
    ref = iosim.attention_ref(q, k, v, mask=keep, dropout_p=0.2, seed=7)
    assert relative_error(got.out, ref.out) < 1e-12
    sizes = dict(N=n_q, N_k=n_k, d=12, d_v=5, batch=2, heads=3, M=20_000, block_mask=bm, dropout_p=0.2)
    counted = iosim.count("flex", **sizes)
    assert got.traffic == counted.traffic == iosim.predict("flex", **sizes).exact
    assert got.flops == counted.flops == iosim.predict("flex", **sizes).flops
    assert (got.tiling.Br, got.tiling.Bc) == (min(bm.Br, n_q), min(bm.Bc, n_k))  # its blocks, capped to the lengths


def test_a_document_mask_reads_its_ids_on_partial_blocks_only():
    # documents of 100, 37 and 163 tokens, blocks of 64: the ids of a partial block's 64 + 64 rows are read, a full
    # block reads none
    lengths = [100, 37, 163]
    bm = iosim.block_mask(F.document(300, 300, lengths), 300, block=(64, 64), reads=("doc_ids",))
    r = iosim.count("flex", N=300, d=16, M=30_000, block_mask=bm)
    counts = bm.counts()
    partial_rows = sum((min(64, 300 - 64 * i) + min(64, 300 - 64 * j)) for i, j in zip(*np.nonzero(bm.kinds == 1)))
    assert r.traffic.tensor("doc_ids").reads == partial_rows
    assert r.traffic.tensor("kv_indices").reads == counts["partial"]
    assert r.traffic.tensor("full_kv_indices").reads == counts["full"]
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, 300, 16)) for _ in range(3))
    got = iosim.simulate("flex", q, k, v, M=30_000, block_mask=bm)
    ref = np.concatenate([iosim.attention_ref(q[:, :, a:a + L], k[:, :, a:a + L], v[:, :, a:a + L], causal=True).out
                          for a, L in zip(np.cumsum([0, *lengths]), lengths)], axis=2)
    assert relative_error(got.out, ref) < 1e-12
    assert got.traffic == iosim.count("flex", N=300, d=16, M=30_000, block_mask=bm, heads=2).traffic


@pytest.mark.parametrize("n_q, n_k", [(239, 239), (113, 239), (240, 64)])
def test_a_causal_mask_moves_what_flash_swapped_causal_moves(n_q, n_k):
    bm = iosim.block_mask(F.causal(n_q, n_k), n_q, n_k, block=(32, 16))
    flex = iosim.count("flex", N=n_q, N_k=n_k, d=16, M=20_000, block_mask=bm, heads=2).traffic
    dense = iosim.count("flash-swapped", N=n_q, N_k=n_k, d=16, M=20_000, heads=2, causal=True,
                        tiling=iosim.Tiling(32, 16)).traffic
    for name in ("Q", "K", "V", "O", "l", "m"):
        assert flex.tensor(name) == dense.tensor(name), name
    # and a mask that hides nothing moves what the dense swapped loop moves: every block full but the ragged ones,
    # which torch's padding makes partial
    full = iosim.block_mask(lambda b, h, q, kv: kv >= 0, n_q, n_k, block=(32, 16))
    T_r, T_c, ragged_q, ragged_k = -(-n_q // 32), -(-n_k // 16), n_q % 32 != 0, n_k % 16 != 0
    assert full.counts()["empty"] == 0
    assert full.counts()["partial"] == ragged_q * T_c + ragged_k * T_r - ragged_q * ragged_k
    flex = iosim.count("flex", N=n_q, N_k=n_k, d=16, M=20_000, block_mask=full).traffic
    dense = iosim.count("flash-swapped", N=n_q, N_k=n_k, d=16, M=20_000, tiling=iosim.Tiling(32, 16)).traffic
    assert all(flex.tensor(name) == dense.tensor(name) for name in ("Q", "K", "V", "O", "l", "m"))


@settings(max_examples=60, deadline=None)
@given(n_q=st.integers(1, 200), n_k=st.integers(1, 200), Br=st.integers(1, 64), Bc=st.integers(1, 64),
       density=st.floats(0.0, 1.0), seed=st.integers(0, 2**32 - 1), d=st.integers(1, 32), d_v=st.integers(1, 32),
       heads=st.sampled_from([1, 3]))
def test_flex_counts_equal_their_closed_form_on_random_masks(n_q, n_k, Br, Bc, density, seed, d, d_v, heads):
    table = np.random.default_rng(seed).random((n_q, n_k)) < density
    bm = iosim.block_mask(lambda b, h, q, kv: table[q, kv], n_q, n_k, block=(Br, Bc), reads=("ids",))
    sizes = dict(N=n_q, N_k=n_k, d=d, d_v=d_v, heads=heads, M=10**6, block_mask=bm)
    counted = iosim.count("flex", **sizes)
    assert counted.traffic == iosim.predict("flex", **sizes).exact
    assert np.array_equal(bm.kinds, brute_kinds(table, bm.Br, bm.Bc))


def test_flex_against_torch_where_installed():
    torch = pytest.importorskip("torch")
    flex_attention = pytest.importorskip("torch.nn.attention.flex_attention")
    n = 256

    def mask_mod(b, h, q, kv):
        return ((q >= kv) & ((q - kv < 100) | (kv < 4)))

    theirs = flex_attention.create_block_mask(mask_mod, None, None, n, n, device="cpu", BLOCK_SIZE=64)
    mine = iosim.block_mask(mask_mod, n, block=(64, 64))
    full = theirs.full_kv_num_blocks[0, 0].numpy() if theirs.full_kv_num_blocks is not None else 0
    assert np.array_equal((mine.kinds == 2).sum(axis=1), full)
    assert np.array_equal((mine.kinds == 1).sum(axis=1), theirs.kv_num_blocks[0, 0].numpy())
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 2, n, 16)) for _ in range(3))
    want = flex_attention.flex_attention(*(torch.from_numpy(x) for x in (q, k, v)), block_mask=theirs).numpy()
    assert relative_error(iosim.simulate("flex", q, k, v, M=30_000, block_mask=mine).out, want) < 1e-10


def test_the_command_line_takes_named_masks_and_a_users_function(tmp_path, capsys, monkeypatch):
    out = tmp_path / "sweep.json"
    assert cli_main(["sweep", "--N", "1000", "--d", "64", "--flex-mask", "sinks_window", "4", "256", "--flex-block",
                     "64", "64", "--json", str(out)]) == 0
    (record,) = json.loads(out.read_text())
    assert (record["algorithm"], record["flex_mask"], record["status"], record["ratio"]) == (
        "flex", "sinks_window 4 256, blocks 64x64", "ok", 1.0)
    assert (record["Br"], record["Bc"]) == (64, 64)
    module = tmp_path / "my_masks.py"
    module.write_text("def banded(b, h, q, kv):\n    return abs(q - kv) < 10\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    capsys.readouterr()
    assert cli_main(["run", "--algo", "flex", "--N", "113", "--d", "8", "--flex-mask", "my_masks:banded",
                     "--flex-block", "16", "16", "--M", "10k"]) == 0
    assert "max |error| against float64 reference" in capsys.readouterr().out
    assert cli_main(["sweep", "--d", "16", "--flex-mask", "document", "--seqlens", "100", "37", "163", "--flex-block",
                     "64", "64", "--json", str(out)]) == 0
    (record,) = json.loads(out.read_text())
    assert (record["N"], record["flex_mask"], record["seqlens"], record["ratio"]) == (
        300, "document 100 37 163, blocks 64x64", None, 1.0)


def test_what_does_not_fit_is_refused_by_name(capsys):
    bm = iosim.block_mask(F.causal(64, 64), 64, block=(32, 32))
    with pytest.raises(iosim.InputError, match=r"block_mask for flash, pass 'fwd'"):
        iosim.count("flash", N=64, d=8, M=10_000, block_mask=bm)
    with pytest.raises(iosim.InputError, match="flex with block_mask=None: it runs over a FlexAttention block mask "
                                               "and has none"):
        iosim.count("flex", N=64, d=8, M=10_000)
    with pytest.raises(iosim.InputError, match="its block mask is its only mask"):
        iosim.count("flex", N=64, d=8, M=10_000, block_mask=bm, causal=True)
    with pytest.raises(iosim.InputError, match="block_mask made for N_q=64, N_k=64 on a problem of N_q=65"):
        iosim.count("flex", N=65, d=8, M=10_000, block_mask=bm)
    with pytest.raises(iosim.InputError, match="it runs on its block mask's blocks"):
        iosim.count("flex", N=64, d=8, M=10_000, block_mask=bm, tiling=iosim.Tiling(16, 16))
    with pytest.raises(iosim.BlockSizeError, match="above M=100"):
        iosim.count("flex", N=64, d=8, M=100, block_mask=bm)
    with pytest.raises(iosim.InputError, match="mask_mod returned float64"):
        iosim.block_mask(lambda b, h, q, kv: q * 1.0 + kv, 8)
    with pytest.raises(iosim.InputError, match="--flex-mask window takes 1 argument"):
        F.named_mask(["window"], 64, 64)
    assert cli_main(["sweep", "--N", "64", "--d", "8", "--flex-mask", "no_such_mask"]) == 2
    assert "allowed: one of" in capsys.readouterr().err


def test_a_loop_that_passes_twice_over_its_nested_blocks_counts_both_passes():
    # Memory.loop gives each of several loops nested in one block its own weights (flex's partial, then full), and a
    # loop that passes twice over one set of nested blocks (a two-pass softmax) the same weights twice
    from iosim.core.memory import Memory
    from iosim.core.problem import CAUSAL
    from iosim.core.visits import Axis, Visits

    tiles = Visits(Axis(10, 2), Axis(10, 2), CAUSAL)

    def reads(numeric: bool) -> int:
        mem = Memory(10**6, bh=1, numeric=numeric)
        mem.add_tensor("K", 10, 1, 2)
        for i, _ in mem.loop(tiles.query_blocks()):
            for _ in range(2):
                for _, cols in mem.loop(tiles.keys_seen_by(i)):
                    mem.free(mem.load("K", cols))
        return mem.counts().tensor("K").reads

    assert reads(False) == reads(True) == 2 * (2 + 4 + 6 + 8 + 10)  # query block i sees 2(i + 1) keys, twice


def test_the_reviewed_edges_are_refused_or_counted_right(tmp_path, capsys):
    bm = iosim.block_mask(F.causal(64, 64), 64, block=(16, 16))
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 64, 8)) for _ in range(3))
    with pytest.raises(iosim.InputError, match="seqlens for flex"):
        iosim.simulate("flex", q, k, v, M=10**5, block_mask=bm, seqlens=[30, 34])
    with pytest.raises(iosim.InputError, match="splits=2 for flex"):
        iosim.count("flex", N=64, d=8, M=10**5, block_mask=bm, splits=2)
    # an all-full mask whose function declares a read takes the M of its true peak (no partial block reads it)
    full = iosim.block_mask(lambda b, h, q_, kv: kv >= 0, 64, block=(16, 16), reads=("ids",))
    peak = iosim.count("flex", N=64, d=8, M=10**5, block_mask=full).traffic.peak_sram
    assert iosim.count("flex", N=64, d=8, M=peak, block_mask=full).traffic.peak_sram == peak
    # a sweep keeps masks of one name but other blocks apart, and refuses what flex refuses, and a length too long,
    # before any row
    out = tmp_path / "s.json"
    base = ["sweep", "--N", "256", "--d", "64", "--M", "100k", "--flex-mask", "causal", "--json", str(out)]
    assert cli_main(base) == 0 and cli_main([*base, "--flex-block", "32", "32", "--resume"]) == 0
    assert sorted(r["flex_mask"] for r in json.loads(out.read_text())) == ["causal, blocks 128x128",
                                                                         "causal, blocks 32x32"]
    capsys.readouterr()
    for argv, words in ((["--N", "256", "--flex-mask", "causal", "--window", "10", "0"],
                         "no algorithm takes window, block_mask together"),
                        (["--N", "65536", "--flex-mask", "causal"], "--flex-mask at N=65,536"),
                        (["--N", "256", "--flex-mask", "os:getcwd"], "must be a function of (b, h, q_idx, kv_idx)")):
        assert cli_main(["sweep", "--d", "8", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
    assert cli_main(["run", "--algo", "flex", "--d", "8", "--seqlens", "30", "34", "--flex-mask", "causal"]) == 2
    assert "--seqlens with --flex-mask causal" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(NAMED))
@pytest.mark.parametrize("n_q, n_k, block", [(1, 1, (128, 128)), (113, 239, (16, 32)), (239, 113, (32, 7))])
def test_flex_gradients_match_float64_and_their_closed_form(name, n_q, n_k, block):
    bm = iosim.block_mask(NAMED[name](n_q, n_k), n_q, n_k, block=block)
    rng = np.random.default_rng(n_q * n_k)
    q, k = rng.standard_normal((1, 2, n_q, 6)), rng.standard_normal((1, 2, n_k, 6))
    v, do = rng.standard_normal((1, 2, n_k, 4)), rng.standard_normal((1, 2, n_q, 4))
    g = iosim.gradients("flex", q, k, v, do, M=20_000, block_mask=bm, dropout_p=0.2, seed=4)
    ref = iosim.attention_backward_ref(q, k, v, do, mask=bm.element_mask(), dropout_p=0.2, seed=4)
    for got, want in zip((g.dq, g.dk, g.dv), ref):
        assert relative_error(got, want) < 1e-12
    sizes = dict(N=n_q, N_k=n_k, d=6, d_v=4, heads=2, M=20_000, block_mask=bm, dropout_p=0.2)
    counted = iosim.count("flex", pass_="bwd", **sizes)
    assert g.traffic == counted.traffic == iosim.predict("flex", pass_="bwd", **sizes).exact
    assert g.flops == counted.flops == iosim.predict("flex", pass_="bwd", **sizes).flops
    step = dict(sizes, pass_="fwd+bwd")
    assert iosim.count("flex", **step).traffic == iosim.predict("flex", **step).exact


@settings(max_examples=40, deadline=None)
@given(n_q=st.integers(1, 150), n_k=st.integers(1, 150), Br=st.integers(1, 48), Bc=st.integers(1, 48),
       density=st.floats(0.0, 1.0), seed=st.integers(0, 2**32 - 1), d=st.integers(1, 32), d_v=st.integers(1, 32),
       modded=st.booleans())
def test_flex_backward_counts_equal_their_closed_form_on_random_masks(n_q, n_k, Br, Bc, density, seed, d, d_v,
                                                                       modded):
    table = np.random.default_rng(seed).random((n_q, n_k)) < density
    bm = iosim.block_mask(lambda b, h, q, kv: table[q, kv], n_q, n_k, block=(Br, Bc), reads=("ids",))
    mod = S.score_mod(lambda s, b, h, q, kv: s, flops=1, reads=("bias",), grad=lambda s, b, h, q, kv: 1.0,
                      grad_flops=1) if modded else None
    sizes = dict(N=n_q, N_k=n_k, d=d, d_v=d_v, M=10**6, block_mask=bm, score_mod=mod, pass_="bwd")
    assert iosim.count("flex", **sizes).traffic == iosim.predict("flex", **sizes).exact


def test_run_checks_flex_gradients_against_float64(capsys):
    assert cli_main(["run", "--algo", "flex", "--N", "113", "--d", "8", "--flex-mask", "sinks_window", "4", "30",
                     "--flex-block", "16", "16", "--M", "10k", "--pass", "fwd+bwd"]) == 0
    out = capsys.readouterr().out
    assert "backward pass" in out and "max |error| against float64 reference" in out


def test_the_block_sparse_algorithms_run_over_a_flex_masks_blocks():
    # a block-aligned mask (documents of whole blocks): block-sparse-skip over its nonempty blocks computes exactly
    # flex's output, and reads what flex reads of Q, K, V but its own way (K_j, V_j once per key block, outer)
    lengths = [64, 128, 64]
    bm = iosim.block_mask(F.document(256, 256, lengths), 256, block=(32, 32))
    sparsity = iosim.BlockSparsity.from_block_mask(bm)
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((1, 2, 256, 8)) for _ in range(3))
    tiling = iosim.Tiling(32, 32)
    got = iosim.simulate("block-sparse-skip", q, k, v, M=10**5, block_sparsity=sparsity, tiling=tiling,
                         mask=bm.element_mask())
    want = iosim.simulate("flex", q, k, v, M=10**5, block_mask=bm).out
    assert relative_error(got.out, want) < 1e-12
    count = iosim.count("block-sparse-skip", N=256, d=8, heads=2, M=10**5, block_sparsity=sparsity, tiling=tiling,
                        mask=True)
    assert got.traffic == count.traffic
    assert count.traffic.tensor("K").reads == 2 * sum(L for L in lengths) * 8  # every nonempty key block once
    with pytest.raises(iosim.InputError, match="must be an iosim.block_mask"):
        iosim.BlockSparsity.from_block_mask(sparsity)


def score_mod_reference(q, k, v, keep, mod):
    """Float64 attention with a score_mod applied to the scaled scores before the mask."""
    s = np.einsum("bhid,bhjd->bhij", q, k) / np.sqrt(q.shape[-1])
    s = np.where(keep, mod.fn(s, 0, 0, np.arange(q.shape[2])[:, None], np.arange(k.shape[2])[None, :]), -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isneginf(m), 0.0, m))
    total = e.sum(axis=-1, keepdims=True)
    return np.where(total == 0, 0.0, e / np.where(total == 0, 1.0, total)) @ v


def score_mod_backward_reference(q, k, v, do, keep, mod):
    """Float64 dQ, dK, dV of ``score_mod_reference``: the softmax's gradient in the modified scores, times the
    score_mod's derivative at the scores."""
    tau = 1 / np.sqrt(q.shape[-1])
    s = np.einsum("bhid,bhjd->bhij", q, k) * tau
    at = (s, 0, 0, np.arange(q.shape[2])[:, None], np.arange(k.shape[2])[None, :])
    modified = np.where(keep, mod.fn(*at), -np.inf)
    m = modified.max(axis=-1, keepdims=True)
    e = np.exp(modified - np.where(np.isneginf(m), 0.0, m))
    total = e.sum(axis=-1, keepdims=True)
    p = np.where(total == 0, 0.0, e / np.where(total == 0, 1.0, total))
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) * np.broadcast_to(mod.grad(*at), s.shape)
    return tau * ds @ k, tau * np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p, -1, -2) @ do


def test_the_backward_reference_with_a_score_mod_is_the_forward_reference_s_gradient():
    # central differences of Σ out ∘ dO, on the float64 forward reference: the reference backward is not circular
    rng = np.random.default_rng(5)
    q, k, v, do = (rng.standard_normal((1, 1, n, 3)) for n in (5, 7, 7, 5))
    keep = np.tril(np.ones((5, 7), dtype=bool), 2)
    mod = S.softcap(1.2)
    grads = score_mod_backward_reference(q, k, v, do, keep, mod)
    for x, g in zip((q, k, v), grads):
        for idx in ((0, 0, 1, 2), (0, 0, 4, 0)):
            plus, minus = x.copy(), x.copy()
            plus[idx] += 1e-6
            minus[idx] -= 1e-6
            args = [(plus if y is x else y) for y in (q, k, v)], [(minus if y is x else y) for y in (q, k, v)]
            numeric = ((score_mod_reference(*args[0], keep, mod) - score_mod_reference(*args[1], keep, mod)) * do
                       ).sum() / 2e-6
            assert abs(numeric - g[idx]) < 1e-7


@pytest.mark.parametrize("mod", [S.softcap(1.5), S.relative_bias(0.3),
                                 S.score_mod(lambda s, b, h, q, kv: 0.5 * s * s, flops=2, reads=("scale",),
                                             grad=lambda s, b, h, q, kv: s, grad_flops=0, name="half square")],
                         ids=["softcap", "relative_bias", "user"])
@pytest.mark.parametrize("n_q, n_k, block", [(1, 1, (128, 128)), (113, 239, (16, 32)), (239, 113, (32, 7))])
def test_flex_gradients_through_a_score_mod_match_float64_and_their_closed_form(mod, n_q, n_k, block):
    bm = iosim.block_mask(F.prefix_lm(n_q, n_k, 9), n_q, n_k, block=block)
    rng = np.random.default_rng(n_q + n_k)
    q, k = rng.standard_normal((1, 2, n_q, 6)) / 2, rng.standard_normal((1, 2, n_k, 6)) / 2
    v, do = rng.standard_normal((1, 2, n_k, 4)), rng.standard_normal((1, 2, n_q, 4))
    g = iosim.gradients("flex", q, k, v, do, M=20_000, block_mask=bm, score_mod=mod)
    for got, want in zip((g.dq, g.dk, g.dv), score_mod_backward_reference(q, k, v, do, bm.element_mask(), mod)):
        assert relative_error(got, want) < 1e-12
    sizes = dict(N=n_q, N_k=n_k, d=6, d_v=4, heads=2, M=20_000, block_mask=bm, score_mod=mod, pass_="bwd")
    counted = iosim.count("flex", **sizes)
    assert g.traffic == counted.traffic == iosim.predict("flex", **sizes).exact
    assert g.flops == counted.flops == iosim.predict("flex", **sizes).flops
    visited = F.FlexVisits(bm.kinds, n_q, n_k, iosim.Tiling(*block)).visited().pairs()
    # the function again and its derivative, in each of the two loops, on every visited score of both heads
    assert counted.flops.score == 2 * 2 * sum(b_i * b_j * n for b_i, b_j, n in visited) * (mod.flops + mod.grad_flops)
    for name in mod.reads:  # its entries for the rows of every visited tile, in each loop
        assert counted.traffic.tensor(name).reads == 2 * 2 * sum((b_i + b_j) * n for b_i, b_j, n in visited)
    plain = iosim.count("flex", **{**sizes, "score_mod": None}).traffic
    assert all(counted.traffic.tensor(t.name) == t for t in plain.tensors)


def test_a_score_mod_is_applied_and_counted_as_declared():
    rng = np.random.default_rng(8)
    table = rng.standard_normal((113, 239))
    mods = (S.softcap(2.0), S.relative_bias(0.3),
            S.score_mod(lambda s, b, h, q, kv: s + 0.1 * table[q, kv], flops=1, reads=("bias",), name="bias table"))
    bm = iosim.block_mask(F.causal(113, 239), 113, 239, block=(32, 16))
    q = rng.standard_normal((1, 2, 113, 8))
    k, v = rng.standard_normal((1, 2, 239, 8)), rng.standard_normal((1, 2, 239, 8))
    visited = F.FlexVisits(bm.kinds, 113, 239, iosim.Tiling(32, 16)).visited().pairs()
    area = sum(b_i * b_j * n for b_i, b_j, n in visited)
    for mod in mods:
        got = iosim.simulate("flex", q, k, v, M=10**5, block_mask=bm, score_mod=mod)
        assert relative_error(got.out, score_mod_reference(q, k, v, bm.element_mask(), mod)) < 1e-12
        sizes = dict(N=113, N_k=239, d=8, heads=2, M=10**5, block_mask=bm, score_mod=mod)
        counted = iosim.count("flex", **sizes)
        assert got.traffic == counted.traffic == iosim.predict("flex", **sizes).exact
        assert got.flops == counted.flops == iosim.predict("flex", **sizes).flops
        assert counted.flops.score == 2 * area * mod.flops  # its FLOPs per score, over every visited score
    plain = iosim.count("flex", N=113, N_k=239, d=8, heads=2, M=10**5, block_mask=bm).traffic
    # the bias table's entries for every row of every visited tile, and nothing else more
    assert counted.traffic.tensor("bias").reads == 2 * sum((b_i + b_j) * n for b_i, b_j, n in visited)
    assert all(counted.traffic.tensor(t.name) == t for t in plain.tensors)
    with pytest.raises(iosim.InputError, match="a score_mod's gradient needs its derivative, and this one has none"):
        iosim.count("flex", N=113, N_k=239, d=8, M=10**5, block_mask=bm, score_mod=mods[2], pass_="bwd")
    with pytest.raises(iosim.InputError, match="for flash, pass 'fwd': it runs no FlexAttention score_mod"):
        iosim.count("flash", N=113, N_k=239, d=8, M=10**5, score_mod=mods[0])
    with pytest.raises(iosim.InputError, match="softcap T=0"):
        S.softcap(0)


@pytest.mark.parametrize("spec, message", [
    (["math:sqrt"], "--score-mod math:sqrt: <built-in function sqrt> takes arguments"),  # was a TypeError
    (["softcap", "inf"], "softcap T=inf must be a finite number > 0"),  # was blamed on --scale
    (["relative_bias", "nan"], "relative_bias w=nan must be a finite number"),
    (["relative_bias", "inf"], "relative_bias w=inf must be a finite number"),
])
def test_a_score_mod_that_cannot_run_is_refused_in_one_line(capsys, spec, message):
    for argv in (["sweep", "--N", "64", "--d", "8"], ["run", "--N", "64", "--d", "8", "--algo", "flex"]):
        assert cli_main([*argv, "--flex-mask", "causal", "--score-mod", *spec]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


def test_the_command_line_applies_a_score_mod_in_both_passes_and_records_it(tmp_path, monkeypatch, capsys):
    out = tmp_path / "rows.json"
    assert cli_main(["sweep", "--N", "300", "--d", "16", "--flex-mask", "causal", "--flex-block", "64", "64",
                     "--score-mod", "softcap", "30", "--pass", "fwd+bwd", "--json", str(out)]) == 0
    (record,) = json.loads(out.read_text())
    mod = S.softcap(30.0)
    counted = iosim.count("flex", N=300, d=16, M="100k", pass_="fwd+bwd", score_mod=mod,
                          block_mask=iosim.block_mask(F.causal(300, 300), 300, block=(64, 64)))
    assert (record["score_mod"], record["score_flops"], record["total"]) == (
        "softcap 30", counted.flops.score, counted.traffic.total)
    module = tmp_path / "my_mods.py"
    module.write_text("import numpy as np\nfrom iosim.variants.score_mods import score_mod\n"
                      "def cube():\n    return score_mod(lambda s, b, h, q, kv: s - s ** 3 / 30, flops=3, "
                      "grad=lambda s, b, h, q, kv: 1 - s ** 2 / 10, grad_flops=2, name='cube')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    capsys.readouterr()
    assert cli_main(["run", "--algo", "flex", "--N", "113", "--N-k", "70", "--d", "8", "--flex-mask", "window", "40",
                     "--flex-block", "16", "16", "--M", "10k", "--score-mod", "my_mods:cube", "--pass", "bwd"]) == 0
    text = capsys.readouterr().out
    assert "score_mod cube" in text
    error = float(text.split("max |error| against float64 reference: ")[1].split()[0])
    assert error < 1e-12
    for argv, words in ((["--score-mod", "softcap", "3"], "without --flex-mask"),
                        (["--flex-mask", "causal", "--score-mod", "softcap"], "takes one argument (T)"),
                        (["--flex-mask", "causal", "--score-mod", "tanh", "2"], "allowed: one of ['relative_bias'"),
                        (["--flex-mask", "causal", "--score-mod", "my_mods:np"], "is not an iosim.variants.score_mods"),
                        (["--algo", "flash", "--flex-mask", "causal", "--score-mod", "softcap", "3"],
                         "it runs over no FlexAttention block mask")):
        assert cli_main(["sweep", "--N", "64", "--d", "8", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err


def test_a_score_mod_and_its_gradients_against_torch_where_installed():
    # the forward against flex_attention; the gradients against torch's autograd through the same attention written
    # out (FlexAttention has no backward on the CPU)
    torch = pytest.importorskip("torch")
    flex_attention = pytest.importorskip("torch.nn.attention.flex_attention")
    n = 128

    def mask_mod(b, h, q, kv):
        return q >= kv

    def softcap(score, b, h, q_idx, kv_idx):
        return 2.0 * torch.tanh(score / 2.0)

    theirs = flex_attention.create_block_mask(mask_mod, None, None, n, n, device="cpu", BLOCK_SIZE=64)
    mine = iosim.block_mask(mask_mod, n, block=(64, 64))
    rng = np.random.default_rng(3)
    q, k, v, do = (rng.standard_normal((1, 2, n, 16)) for _ in range(4))
    want = flex_attention.flex_attention(*(torch.from_numpy(x) for x in (q, k, v)), score_mod=softcap,
                                         block_mask=theirs).numpy()
    got = iosim.simulate("flex", q, k, v, M=30_000, block_mask=mine, score_mod=S.softcap(2.0)).out
    assert relative_error(got, want) < 1e-10
    tq, tk, tv = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
    scores = softcap(tq @ tk.transpose(-1, -2) / 4.0, None, None, None, None)
    keep = torch.from_numpy(mine.element_mask())
    out = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1) @ tv
    out.backward(torch.from_numpy(do))
    g = iosim.gradients("flex", q, k, v, do, M=30_000, block_mask=mine, score_mod=S.softcap(2.0))
    for mine_grad, torch_grad in zip((g.dq, g.dk, g.dv), (tq.grad, tk.grad, tv.grad)):
        assert relative_error(mine_grad, torch_grad.numpy()) < 1e-10


WINDOWS = np.array([[3, 50, 3, 200], [10, 10, 64, 1]])  # a sliding window of each (batch entry, head)


def per_head_window(b, h, q, kv):
    return (kv <= q) & (q - kv < WINDOWS[b, h])


def one_head(b, h):
    """The mask of one (batch entry, head) alone, as a mask of every head."""
    return lambda _b, _h, q, kv: per_head_window(b, h, q, kv)


@pytest.mark.parametrize("n_q, n_k, block", [(113, 113, (16, 32)), (1, 1, (8, 8)), (239, 239, (32, 7)),
                                              (70, 130, (16, 32)), (130, 70, (32, 16)), (1, 90, (8, 16))])
def test_a_per_head_mask_runs_each_head_over_its_own_blocks(n_q, n_k, block):
    bm = iosim.block_mask(per_head_window, n_q, n_k, block=block, B=2, H=4)
    assert bm.kinds.shape[:2] == (2, 4) and "each of 2×4 (batch, head)" in bm.label
    distinct = {bm.kinds[b, h].tobytes() for b in range(2) for h in range(4)}
    assert len(bm.groups(2, 4)) == len(distinct)  # heads of equal blocks run as one part
    rng = np.random.default_rng(n_q + n_k)
    q, k, v = rng.standard_normal((2, 4, n_q, 8)), rng.standard_normal((2, 4, n_k, 8)), rng.standard_normal(
        (2, 4, n_k, 6))
    do = rng.standard_normal((2, 4, n_q, 6))
    r = iosim.simulate("flex", q, k, v, M=10**5, block_mask=bm)
    assert relative_error(r.out, iosim.attention_ref(q, k, v, mask=bm.element_mask()).out) < 1e-12
    g = iosim.gradients("flex", q, k, v, do, M=10**5, block_mask=bm)
    for got, want in zip((g.dq, g.dk, g.dv), iosim.attention_backward_ref(q, k, v, do, mask=bm.element_mask())):
        assert relative_error(got, want) < 1e-12
    for pass_, result in (("fwd", r), ("bwd", g)):
        sizes = dict(N=n_q, N_k=n_k, d=8, d_v=6, batch=2, heads=4, M=10**5, block_mask=bm, pass_=pass_)
        counted = iosim.count("flex", **sizes)
        assert result.traffic == counted.traffic == iosim.predict("flex", **sizes).exact
        assert result.flops == counted.flops == iosim.predict("flex", **sizes).flops
        # the sum of every head counted alone over its own mask
        alone = [iosim.count("flex", N=n_q, N_k=n_k, d=8, d_v=6, M=10**5, pass_=pass_,
                             block_mask=iosim.block_mask(one_head(b, h), n_q, n_k, block=block))
                 for b in range(2) for h in range(4)]
        assert counted.traffic.total == sum(a.traffic.total for a in alone)
        for t in counted.traffic.tensors:
            assert t.reads == sum(a.traffic.tensor(t.name).reads for a in alone), t.name


@settings(max_examples=30, deadline=None)
@given(n_q=st.integers(1, 90), n_k=st.integers(1, 90), Br=st.integers(1, 40), Bc=st.integers(1, 40),
       B=st.sampled_from([None, 1, 2]), H=st.sampled_from([None, 3]), seed=st.integers(0, 2**32 - 1),
       pass_=st.sampled_from(["fwd", "bwd"]))
def test_per_head_counts_equal_their_closed_form_and_the_sum_of_their_heads(n_q, n_k, Br, Bc, B, H, seed, pass_):
    tables = np.random.default_rng(seed).random((2, 3, n_q, n_k)) < np.random.default_rng(seed + 1).random((2, 3, 1, 1))
    bm = iosim.block_mask(lambda b, h, q, kv: tables[b, h, q, kv], n_q, n_k, block=(Br, Bc), B=B, H=H,
                          reads=("ids",))
    sizes = dict(N=n_q, N_k=n_k, d=4, batch=2, heads=3, M=10**6, block_mask=bm, pass_=pass_)
    counted = iosim.count("flex", **sizes).traffic
    assert counted == iosim.predict("flex", **sizes).exact
    total = 0
    for b in range(2):
        for h in range(3):
            at = (b if B == 2 else 0, h if H == 3 else 0)  # a B or H of None or 1 is one mask for all
            one = iosim.block_mask(lambda _b, _h, q, kv, at=at: tables[at][q, kv], n_q, n_k, block=(Br, Bc),
                                   reads=("ids",))
            total += iosim.count("flex", **{**sizes, "batch": 1, "heads": 1, "block_mask": one}).traffic.total
    assert counted.total == total


def test_a_per_head_mask_over_grouped_heads_reads_each_head_s_k_v_head():
    # heads 4 over 2 K/V heads: flex reads K and V for every query head, so the counts are those without grouping;
    # each head's output is its own mask's over its K/V head's keys
    n = 113
    bm = iosim.block_mask(per_head_window, n, block=(16, 32), B=2, H=4)
    rng = np.random.default_rng(11)
    q, k, v = rng.standard_normal((2, 4, n, 8)), rng.standard_normal((2, 2, n, 8)), rng.standard_normal((2, 2, n, 6))
    r = iosim.simulate("flex", q, k, v, M=10**5, block_mask=bm)
    assert relative_error(r.out, iosim.attention_ref(q, k, v, mask=bm.element_mask()).out) < 1e-12
    sizes = dict(N=n, d=8, d_v=6, batch=2, heads=4, M=10**5, block_mask=bm)
    grouped = iosim.count("flex", kv_heads=2, **sizes).traffic
    assert r.traffic == grouped == iosim.predict("flex", kv_heads=2, **sizes).exact
    assert grouped == iosim.count("flex", **sizes).traffic


def test_a_per_head_mask_is_refused_where_it_does_not_fit_by_name(tmp_path, monkeypatch, capsys):
    bm = iosim.block_mask(per_head_window, 64, block=(16, 16), B=2, H=4)
    with pytest.raises(iosim.InputError, match=r"block_mask made with H=4 on a problem of 2 heads"):
        iosim.count("flex", N=64, d=8, batch=2, heads=2, M=10**5, block_mask=bm)
    with pytest.raises(iosim.InputError, match=r"block_mask made with B=2 on a problem of 3 batch entries"):
        iosim.count("flex", N=64, d=8, batch=3, heads=4, M=10**5, block_mask=bm)
    with pytest.raises(iosim.InputError, match="the block-sparse algorithms take one block mask for every head"):
        iosim.BlockSparsity.from_block_mask(bm)
    module = tmp_path / "head_masks.py"
    module.write_text("import numpy as np\nW = np.array([4, 16, 64])\n"
                      "def windows(b, h, q, kv):\n    return (kv <= q) & (q - kv < W[h])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "rows.json"
    assert cli_main(["sweep", "--N", "200", "--d", "8", "--heads", "3", "--flex-mask", "head_masks:windows",
                     "--flex-heads", "--flex-block", "32", "32", "--json", str(out)]) == 0
    (record,) = json.loads(out.read_text())
    mine = iosim.block_mask(lambda b, h, q, kv: (kv <= q) & (q - kv < np.array([4, 16, 64])[h]), 200,
                            block=(32, 32), H=3)
    assert record["flex_mask"].endswith("each of 1×3 (batch, head)")
    assert record["total"] == iosim.count("flex", N=200, d=8, heads=3, M="100k", block_mask=mine).traffic.total
    capsys.readouterr()
    assert cli_main(["run", "--algo", "flex", "--N", "113", "--d", "8", "--heads", "3", "--flex-mask",
                     "head_masks:windows", "--flex-heads", "--flex-block", "16", "16", "--pass", "fwd+bwd"]) == 0
    error = float(capsys.readouterr().out.split("max |error| against float64 reference: ")[1].split()[0])
    assert error < 1e-12
    for argv, words in ((["--flex-heads"], "--flex-heads without --flex-mask"),
                        (["--flex-mask", "causal", "--flex-heads"], "a named mask is one for every head")):
        assert cli_main(["sweep", "--N", "64", "--d", "8", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err


def test_a_per_head_block_mask_against_torch_where_installed():
    torch = pytest.importorskip("torch")
    flex_attention = pytest.importorskip("torch.nn.attention.flex_attention")
    n, windows = 256, torch.tensor([[8, 100, 30, 256], [64, 1, 200, 16]])

    def mask_mod(b, h, q, kv):
        return (q >= kv) & (q - kv < windows[b, h])

    theirs = flex_attention.create_block_mask(mask_mod, 2, 4, n, n, device="cpu", BLOCK_SIZE=64)
    np_windows = windows.numpy()
    mine = iosim.block_mask(lambda b, h, q, kv: (q >= kv) & (q - kv < np_windows[b, h]), n, block=(64, 64), B=2, H=4)
    full = theirs.full_kv_num_blocks.numpy() if theirs.full_kv_num_blocks is not None else 0
    assert np.array_equal((mine.kinds == 2).sum(axis=-1), full)
    assert np.array_equal((mine.kinds == 1).sum(axis=-1), theirs.kv_num_blocks.numpy())
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((2, 4, n, 16)) for _ in range(3))
    want = flex_attention.flex_attention(*(torch.from_numpy(x) for x in (q, k, v)), block_mask=theirs).numpy()
    assert relative_error(iosim.simulate("flex", q, k, v, M=30_000, block_mask=mine).out, want) < 1e-10


@pytest.mark.parametrize("B, H", [(None, 3), (2, None), (1, 3), (2, 1)])
def test_a_dimension_left_none_is_evaluated_at_zero_as_its_blocks_were_made(B, H):
    # the function depends on both b and h; along a B or H left None (or 1) the mask is that of index 0, for the
    # blocks, the partial tiles' elements and the reference mask alike
    def mask_mod(b, h, q, kv):
        return (kv <= q + 3 * h) | (kv % (2 + b) == 0)

    bm = iosim.block_mask(mask_mod, 70, block=(16, 16), B=B, H=H)
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 3, 70, 8)) for _ in range(3))
    got = iosim.simulate("flex", q, k, v, M=10**5, block_mask=bm).out
    b_at = (lambda b: b) if B == 2 else (lambda b: 0)
    h_at = (lambda h: h) if H == 3 else (lambda h: 0)
    keep = np.stack([np.stack([mask_mod(b_at(b), h_at(h), np.arange(70)[:, None], np.arange(70)[None, :])
                               for h in range(3)]) for b in range(2)])
    assert relative_error(got, iosim.attention_ref(q, k, v, mask=keep).out) < 1e-12


@pytest.mark.parametrize("per_head", [False, True])
def test_a_score_mod_sees_each_head_s_batch_entry_and_head(per_head):
    # an ALiBi-like score_mod whose slope and scale depend on b and h, forward and backward, against float64 computed
    # head by head here; with a mask of each head too, whose groups hold their heads out of batch-major order
    mod = S.score_mod(lambda s, b, h, q, kv: s * (b + 1) - 0.5 * (h + 1) * np.abs(q - kv), flops=5,
                      grad=lambda s, b, h, q, kv: np.broadcast_to(b + 1.0, np.broadcast_shapes(
                          np.shape(s), np.shape(b))), grad_flops=0, name="alibi by head")
    n = 50

    def mask_mod(b, h, q, kv):
        return kv <= q + (h if per_head else 0)

    bm = iosim.block_mask(mask_mod, n, block=(16, 16), **({"B": 2, "H": 2} if per_head else {}))
    rng = np.random.default_rng(9)
    q, k, v, do = (rng.standard_normal((2, 2, n, 4)) / 2 for _ in range(4))
    out = iosim.simulate("flex", q, k, v, M=10**5, block_mask=bm, score_mod=mod).out
    g = iosim.gradients("flex", q, k, v, do, M=10**5, block_mask=bm, score_mod=mod)
    for b in range(2):
        for h in range(2):
            at = dict(mask=mask_mod(b, h, np.arange(n)[:, None], np.arange(n)[None, :]))
            one = S.score_mod(lambda s, _b, _h, i, j, b=b, h=h: s * (b + 1) - 0.5 * (h + 1) * np.abs(i - j), flops=5,
                              grad=lambda s, _b, _h, i, j, b=b: np.full(np.shape(s), b + 1.0), name="one head")
            x = [y[b:b + 1, h:h + 1] for y in (q, k, v, do)]
            assert relative_error(out[b, h], iosim.attention_ref(*x[:3], score_mod=one, **at).out[0, 0]) < 1e-12
            want = iosim.attention_backward_ref(*x, score_mod=one, **at)
            for got, w in zip((g.dq, g.dk, g.dv), want):
                assert relative_error(got[b, h], w[0, 0]) < 1e-12
