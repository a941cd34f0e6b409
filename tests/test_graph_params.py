"""The params file format (docs/params.md): round trip, alignment, and clear errors on bad bytes."""
import numpy as np
import pytest

from tether_rpc.params import ParamsFormatError, load_params, save_params


def test_round_trip_keeps_names_dtypes_shapes_and_values(tmp_path):
    rng = np.random.default_rng(0)
    params = {"conv/w": rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "scalar": np.array(3.5, np.float32),
              "idx": np.arange(5, dtype=np.int64), "mask": np.array([True, False]),
              "empty": np.zeros((0, 4), np.float32)}
    blob = save_params(params)
    path = tmp_path / "deploy.params"
    path.write_bytes(blob)
    for loaded in (load_params(blob), load_params(str(path))):
        assert list(loaded) == list(params)
        for k, v in params.items():
            assert loaded[k].dtype == v.dtype and loaded[k].shape == v.shape
            np.testing.assert_array_equal(loaded[k], v)
        assert loaded["conv/w"].ctypes.data % 64 == 0


@pytest.mark.parametrize("mutate, match", [
    (lambda b: b"XXXXXXXX" + b[8:], "not a tether params file"),
    (lambda b: b[:8] + (9).to_bytes(4, "little") + b[12:], "version 9"),
    (lambda b: b[:40], "truncated|past the end"),
    (lambda b: b[:5], "too short"),
])
def test_bad_bytes_give_clear_errors(mutate, match):
    blob = save_params({"w": np.ones((4, 4), np.float32)})
    with pytest.raises(ParamsFormatError, match=match):
        load_params(mutate(blob))


def test_pickle_like_dtypes_are_refused():
    with pytest.raises(ValueError, match="dtype object"):
        save_params({"o": np.array([None], dtype=object)})
