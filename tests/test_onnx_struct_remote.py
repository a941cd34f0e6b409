"""The structural ONNX ops (reductions, arg-reductions, norms, Resize, ConvTranspose, data-dependent gathers,
OneHot) compiled for emulated aarch64 and armv7 devices (qemu-user) and run there through the graph executor,
against ONNX's conformance data: the index-driven kernels load int32/int64 indices from tensors, which the
32-bit target must address correctly."""
import numpy as np
import pytest

from fixtures import remote_cases
from tether import rpc
from tether.testing.onnx_cases import shape_arg_names

CASES = """argmax_keepdims_random_select_last_index argmin_no_keepdims_random reduce_log_sum_exp_keepdims_random
reduce_l2_do_not_keepdims_random reduce_prod_negative_axes_keepdims_random reduce_mean_keepdims_random
layer_normalization_3d_axis1_epsilon group_normalization_example instancenorm_example
split_variable_parts_2d_opset18 tile expand_dim_changed resize_upsample_scales_linear resize_downsample_scales_cubic
resize_upsample_sizes_nearest_axes_2_3 resize_tf_crop_and_resize convtranspose_pads convtranspose_group_2
convtranspose_1d gather_negative_indices gather_elements_negative_indices gathernd_example_int32_batch_dim1
onehot_with_axis depthtospace_crd_mode_example triu_neg""".split()


@pytest.mark.emulated
def test_emulated_structural_node_cases(emulated_device, tmp_path):
    host, port = emulated_device.address
    with rpc.connect(host, port, timeout=120) as sess:
        for name, case in remote_cases.node_cases(*CASES).items():
            shape_args = shape_arg_names(case.model)
            gather_indices = {n.input[1] for n in case.model.graph.node if n.op_type.startswith("Gather")}
            remote_cases.check_case_on_device(
                sess, name, case, str(tmp_path / name), emulated_device.preset,
                lambda k, v: (v.dtype == np.int64 and k not in gather_indices) or k in shape_args, atol=1e-5)
