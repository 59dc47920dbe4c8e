"""Input arrays are real and finite, the scale a real number; nothing is coerced without a word."""

import warnings

import numpy as np
import pytest
from helpers import random_qkv

import iosim

QKV = random_qkv(np.random.default_rng(0), 1, 2, 9, 7, 4)


def with_k(k):
    q, _, v = QKV
    return q, k, v


@pytest.mark.parametrize("k, dtype", [(QKV[1] + 1j, "complex128"), (QKV[1].astype(object), "object"),
                                      (QKV[1].astype(str), "<U"), (np.full(QKV[1].shape, "x"), "<U1")])
@pytest.mark.parametrize("call", ["simulate", "attention_ref", "gradients"])
def test_complex_object_and_string_arrays_are_refused_by_name(call, k, dtype):
    q, k, v = with_k(k)
    runs = {"simulate": lambda: iosim.simulate("flash", q, k, v, M=1000),
            "attention_ref": lambda: iosim.attention_ref(q, k, v),
            "gradients": lambda: iosim.gradients("flash", q, k, v, np.ones_like(QKV[0]), M=1000)}
    with pytest.raises(iosim.InputTypeError, match=f"k has dtype {dtype}.*must be real numeric"):
        runs[call]()


@pytest.mark.parametrize("dtype", [bool, np.int32, np.uint8, np.float16, np.float32])
def test_real_arrays_of_every_kind_are_taken(dtype):
    q, k, v = (x.astype(dtype) for x in QKV)
    out = iosim.simulate("flash", q, k, v, M=1000).out
    assert np.allclose(out, iosim.attention_ref(q, k, v).out, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("value, count", [(np.inf, 1), (-np.inf, 1), (np.nan, 3)])
def test_non_finite_values_are_refused_unless_asked_for(value, count):
    k = QKV[1].copy()
    k.flat[:count] = value
    q, k, v = with_k(k)
    noun = "value" if count == 1 else "values"
    for run in (lambda **kw: iosim.simulate("flash", q, k, v, M=1000, **kw),
                lambda **kw: iosim.attention_ref(q, k, v, **kw)):
        with pytest.raises(iosim.InputError, match=f"k contains {count} non-finite {noun}"):
            run()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # inf − inf in the softmax: the user asked for it
        propagated = iosim.simulate("flash", q, k, v, M=1000, allow_nonfinite=True).out
        reference = iosim.attention_ref(q, k, v, allow_nonfinite=True).out
    assert not np.isfinite(propagated).all()
    assert np.array_equal(np.isnan(propagated), np.isnan(reference))


def test_a_non_finite_upstream_gradient_is_refused():
    q, k, v = QKV
    do = np.ones_like(q)
    do[0, 0, 0, 0] = np.nan
    with pytest.raises(iosim.InputError, match="do contains 1 non-finite value"):
        iosim.gradients("flash", q, k, v, do, M=1000)
    with pytest.raises(iosim.InputError, match="dout contains 1 non-finite value"):
        iosim.attention_backward_ref(q, k, v, do)


@pytest.mark.parametrize("scale", ["1", "abc", 1j, True, [1.0]])
def test_scale_must_be_a_real_number(scale):
    with pytest.raises(iosim.InputTypeError, match="scale=.* must be a real number"):
        iosim.simulate("flash", *QKV, M=1000, scale=scale)


@pytest.mark.parametrize("scale", [2, np.float32(0.5), np.int64(3)])
def test_scale_of_any_real_type_is_taken(scale):
    out = iosim.simulate("flash", *QKV, M=1000, scale=scale).out
    assert np.allclose(out, iosim.attention_ref(*QKV, scale=float(scale)).out, rtol=1e-12, atol=1e-14)


def test_scale_overflow_warns_once_and_by_name_without_numpy_warnings():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        iosim.simulate("flash", *QKV, M=1000, scale=1e308)
    assert [str(w.message).split(":")[0] for w in caught] == ["scale=1e+308"]
