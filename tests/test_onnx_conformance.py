"""ONNX node conformance cases through tether on the host, with the code scripts/onnx_conformance.py uses
(tether.testing.onnx_cases): every case that ever gave a wrong result (or crashed at run time), and one case of
every op type tether converts, picked from the installed onnx's cases by op type."""
import os
import tempfile

import pytest

from tether.frontend.onnx import CONVERTERS
from tether.testing import onnx_cases as oc

os.environ.setdefault("ONNX_HOME", os.path.join(tempfile.gettempdir(), "tether-onnx-home"))

# cases that once ran and gave a wrong answer, or crashed at run time: they must pass from now on
EVER_WRONG = ["test_div_int32_trunc", "test_pow_types_int32_float32", "test_pow_types_int64_float32",
              "test_pow_types_int32_int32", "test_pow_types_int64_int64",
              # a float ReduceMax over an all -inf row started from the lowest finite value, not -inf
              "test_attention_23_boolmask_fullymasked_row_nan_robustness_expanded",
              "test_attention_4d_causal_nonpad_negative_offset_structural_empty_expanded",
              "test_attention_23_fullymasked_qk_matmul_output_mode3_zero_expanded",
              # float16 results rounded at a no-op Cast(to=float16) between float32-computed nodes
              "test_attention_4d_causal_fp16_expanded",
              # float Mod fmod=0 with an infinite divisor gave NaN, not x (or the infinity) as numpy does
              "test_mod_float_edge_cases_fmod_0_float32", "test_mod_float_edge_cases_fmod_0_float64",
              # BitwiseNot on uint16 xor-ed with uint8's all-ones mask (255)
              "test_bitwise_not_3d"]
# cases refused by design, passed over when picking an op's case (the reason says why)
REFUSED_BY_DESIGN: dict = {
    "test_scan_sum": "opset-8 Scan (batch axis, sequence_lens input): tether converts Scan from opset 9"}
# op types tether converts only in the forms real exporters write, none of which onnx's cases use
NO_PASSING_CASE = {"Gather": "every case gathers a run-time tensor with tensor indices, which is refused"}
# dtypes the kernels implement: a case reading others is refused by design and is not a candidate
_DTYPES = {"bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32",
           "float64"}

CASES = oc.collect()
OPS = oc.op_types(CASES)
BY_NAME = {c.name: c for c in CASES}


def _candidate(case) -> bool:
    if "_expanded" in case.name or case.name in REFUSED_BY_DESIGN:
        return False
    feeds = oc.case_inputs(case)[0]
    return all(hasattr(v, "dtype") and str(v.dtype) in _DTYPES for v in feeds.values()) and \
        all(hasattr(v, "dtype") and str(v.dtype) in _DTYPES for v in oc.case_outputs(case)[0])


def _one_per_op():
    picked = {}
    for case in CASES:
        op = OPS[case.name]
        if op in CONVERTERS and op not in NO_PASSING_CASE and op not in picked and _candidate(case):
            picked[op] = case.name
    return picked


PER_OP = _one_per_op()
SELECTED = sorted(set(EVER_WRONG) | set(PER_OP.values()))


@pytest.mark.parametrize("name", SELECTED)
def test_case_passes(name):
    status, message = oc.run_tether(BY_NAME[name])
    assert status == oc.PASS, "%s: %s %s" % (name, status, message)


def test_every_converted_op_with_cases_is_selected():
    # an op type tether converts and onnx has a usable case for is covered here (so new converters get tested)
    ops_with_cases = ({OPS[c.name] for c in CASES if _candidate(c)} & set(CONVERTERS)) - set(NO_PASSING_CASE)
    assert ops_with_cases == set(PER_OP)
    assert len(PER_OP) >= 60


def test_a_wrong_result_is_reported_as_wrong():
    """The judge itself: a model whose expected output is altered must be classified ``wrong``."""
    import copy

    import numpy as np

    case = copy.copy(BY_NAME["test_div_int32_trunc"])
    (inputs, outputs), = case.data_sets
    case.data_sets = [(inputs, [np.asarray(outputs[0]) + 1])]
    status, message = oc.run_tether(case)
    assert status == oc.WRONG and "Mismatch" in message


# ---------------------------------------------------------------- ops converted through their function body
# (frontend/onnx/functions.py): one case of each op type with no converter whose body tether converts
# (other such ops' bodies use ops tether lacks - RandomUniformLike, STFT, ... - and are refused)
FUNCTION_BODY_CASES = ["test_sce_none", "test_nllloss_NC", "test_mvn", "test_shrink_hard", "test_swish",
                       "test_causal_conv_with_state_basic", "test_center_crop_pad_crop"]


@pytest.mark.parametrize("name", FUNCTION_BODY_CASES)
def test_function_body_case_passes(name):
    from tether.frontend.onnx.functions import has_function_body
    case = BY_NAME[name]
    assert has_function_body(OPS[name], 100)    # (a converter added later takes precedence; the case must pass)
    status, message = oc.run_tether(case)
    assert status == oc.PASS, "%s: %s %s" % (name, status, message)
