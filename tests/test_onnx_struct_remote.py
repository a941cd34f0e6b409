"""The structural ONNX ops (reductions, arg-reductions, norms, Resize, ConvTranspose, data-dependent gathers,
OneHot) compiled for emulated aarch64 and armv7 devices (qemu-user) and run there through the graph executor,
against ONNX's conformance data: the index-driven kernels load int32/int64 indices from tensors, which the
32-bit target must address correctly."""
import numpy as np
import pytest
from onnx import numpy_helper

import tether
from tether import rpc
from tether.frontend import from_onnx
from tether.rpc.graph_client import RemoteGraphExecutor

CASES = """argmax_keepdims_random_select_last_index argmin_no_keepdims_random reduce_log_sum_exp_keepdims_random
reduce_l2_do_not_keepdims_random reduce_prod_negative_axes_keepdims_random reduce_mean_keepdims_random
layer_normalization_3d_axis1_epsilon group_normalization_example instancenorm_example
split_variable_parts_2d_opset18 tile expand_dim_changed resize_upsample_scales_linear resize_downsample_scales_cubic
resize_upsample_sizes_nearest_axes_2_3 resize_tf_crop_and_resize convtranspose_pads convtranspose_group_2
convtranspose_1d gather_negative_indices gather_elements_negative_indices gathernd_example_int32_batch_dim1
onehot_with_axis depthtospace_crd_mode_example triu_neg""".split()

SHAPE_ARGS = {"Resize": (1, 2, 3), "OneHot": (1,)}


def _case(name):
    import warnings

    from onnx.backend.test.loader import load_model_tests
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {c.name: c for c in load_model_tests(kind="node")}["test_" + name]


def _arr(v):
    return np.asarray(numpy_helper.to_array(v) if hasattr(v, "raw_data") else v)


@pytest.mark.emulated
def test_emulated_structural_node_cases(emulated_device, tmp_path):
    host, port = emulated_device.address
    with rpc.connect(host, port, timeout=120) as sess:
        for name in CASES:
            case = _case(name)
            model = case.model
            inputs, outputs = case.data_sets[0]
            names = [i.name for i in model.graph.input]
            feeds = {k: _arr(v) for k, v in zip(names, inputs)}
            shape_args = {n.input[k] for n in model.graph.node for k in SHAPE_ARGS.get(n.op_type, ())
                          if k < len(n.input) and n.input[k]}
            consts = {k: v for k, v in feeds.items() if (v.dtype == np.int64 and k not in
                      {n.input[1] for n in model.graph.node if n.op_type.startswith("Gather")}) or k in shape_args}
            graph, params = from_onnx(model, constants=consts)
            folder = str(tmp_path / name)
            tether.build_graph(graph, params, target=emulated_device.preset).export(folder)
            with RemoteGraphExecutor(sess, folder, prefix=name + "_") as gm:
                for k, v in feeds.items():
                    if k not in consts:
                        gm.set_input(k, v)
                gm.run()
                for i, ref in enumerate(outputs):
                    np.testing.assert_allclose(gm.get_output(i), _arr(ref), rtol=1e-3, atol=1e-5, err_msg=name)
