"""Shape ops (pad, transpose, reshape, concat, flatten, squeeze) and batch norm against numpy."""
import numpy as np
import pytest

from tether import ops, te


@pytest.mark.parametrize("shape,before,after,value", [((5, 7), (1, 2), (3, 0), 0.0),
                                                      ((2, 3, 9), (0, 1, 4), None, -1.5)])
def test_pad(run_ops, rng, shape, before, after, value):
    x = rng.standard_normal(shape).astype("float32")
    X = te.placeholder(shape, "float32", name="X")
    (out,) = run_ops([(X, x)], [ops.pad(X, before, after, value)])
    widths = list(zip(before, after if after is not None else before))
    np.testing.assert_array_equal(out, np.pad(x, widths, constant_values=value))


@pytest.mark.parametrize("shape,axes", [((5, 7), None), ((2, 3, 9), (1, 2, 0)), ((2, 3, 4, 5), (0, 2, 3, 1)),
                                        # large ones run in 16x16 tiles (ops/schedules.py _tile_transpose): partial
                                        # tiles on both axes, and an axis between the two swapped
                                        ((1, 131, 1, 517), (0, 2, 3, 1)), ((3, 200, 7, 150), (0, 3, 2, 1))])
def test_transpose(run_ops, rng, shape, axes):
    x = rng.standard_normal(shape).astype("float32")
    X = te.placeholder(shape, "float32", name="X")
    (out,) = run_ops([(X, x)], [ops.transpose(X, axes)])
    np.testing.assert_array_equal(out, np.transpose(x, axes))


def test_strided_transposes_load_with_gathers_on_avx512():
    """On AVX-512 a transpose's strided loads are vectorized by the schedule (one gather per vector), tiled or
    not, rather than left to LLVM's loop vectorizer; elsewhere they stay scalar loops."""
    import tether
    from tether.target import Target

    avx512 = Target("x86_64-linux-gnu -mattr=+avx2,+fma,+avx512f")
    avx2 = Target("x86_64-linux-gnu -mattr=+avx2,+fma")
    for shape, axes in [((256, 50, 38), (1, 2, 0)), ((96, 40, 40), (1, 2, 0))]:
        X = te.placeholder(shape, "float32", name="X")
        Y = ops.transpose(X, axes)
        wide = str(tether.lower(ops.schedule([Y], target=avx512), [X, Y], "t"))
        narrow = str(tether.lower(ops.schedule([Y], target=avx2), [X, Y], "t"))
        assert "vectorized" in wide and "vectorized" not in narrow, (wide, narrow)


@pytest.mark.parametrize("shape,new", [((6, 7), (42,)), ((2, 3, 5), (5, -1)), ((4, 9), (2, 2, 3, 3))])
def test_reshape(run_ops, rng, shape, new):
    x = rng.standard_normal(shape).astype("float32")
    X = te.placeholder(shape, "float32", name="X")
    (out,) = run_ops([(X, x)], [ops.reshape(X, new)])
    np.testing.assert_array_equal(out, x.reshape(new))


def test_flatten_squeeze_expand(run_ops, rng):
    x = rng.standard_normal((2, 1, 3, 5)).astype("float32")
    X = te.placeholder(x.shape, "float32", name="X")
    f, sq, ex = run_ops([(X, x)], [ops.flatten(X), ops.squeeze(X, 1), ops.expand_dims(X, 0)])
    np.testing.assert_array_equal(f, x.reshape(2, -1))
    np.testing.assert_array_equal(sq, x.reshape(2, 3, 5))
    np.testing.assert_array_equal(ex, x[None])


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(run_ops, rng, axis):
    shapes = [(3, 4, 5), (3, 4, 5), (3, 4, 5)]
    shapes = [tuple(s[d] + (i if d == axis % 3 else 0) for d in range(3)) for i, s in enumerate(shapes)]
    xs = [rng.standard_normal(s).astype("float32") for s in shapes]
    Xs = [te.placeholder(s, "float32", name=f"X{i}") for i, s in enumerate(shapes)]
    (out,) = run_ops(list(zip(Xs, xs)), [ops.concat(Xs, axis)])
    np.testing.assert_array_equal(out, np.concatenate(xs, axis))


def test_reshape_error():
    X = te.placeholder((3, 4), "float32", name="X")
    with pytest.raises(ValueError, match="cannot reshape"):
        ops.reshape(X, (5, -1))


def test_batch_norm(run_ops, rng):
    x = rng.standard_normal((2, 6, 5, 7)).astype("float32")
    g, b, m = (rng.standard_normal(6).astype("float32") for _ in range(3))
    v = rng.uniform(0.5, 2.0, 6).astype("float32")
    X = te.placeholder(x.shape, "float32", name="X")
    G, Bt, M, V = (te.placeholder((6,), "float32", name=n) for n in ("g", "b", "m", "v"))
    (out,) = run_ops([(X, x), (G, g), (Bt, b), (M, m), (V, v)], [ops.batch_norm(X, G, Bt, M, V, epsilon=1e-3)])
    sh = (1, 6, 1, 1)
    ref = (x - m.reshape(sh)) / np.sqrt(v.reshape(sh) + 1e-3) * g.reshape(sh) + b.reshape(sh)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
