"""Discovery of ONNX test-case folders: one case, several, a parent folder walked, real/light and zoo layouts."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxaccel.conformance import discover
from onnxaccel.errors import InputError


def test_single_case_folder_has_its_model_and_data_set_files(onnx_data):
    (case,) = discover([onnx_data / "simple" / "test_sign_model"])
    assert case.name == "test_sign_model"
    assert case.model == onnx_data / "simple" / "test_sign_model" / "model.onnx"
    assert [d.name for d in case.data_sets] == ["test_data_set_0"]
    assert [p.name for p in case.data_sets[0].inputs] == ["input_0.pb"]
    assert [p.name for p in case.data_sets[0].outputs] == ["output_0.pb"]
    assert case.skip is None


def test_several_folders_keep_the_order_given_and_a_case_reached_twice_once(onnx_data):
    a = onnx_data / "simple" / "test_sign_model"
    b = onnx_data / "pytorch-converted" / "test_Conv2d"
    cases = discover([b, a, b / "model.onnx"])
    assert [c.name for c in cases] == ["test_Conv2d", "test_sign_model"]


def test_parent_folder_is_walked_for_every_case(onnx_data):
    cases = discover([onnx_data / "simple"])
    assert len(cases) == len([p for p in (onnx_data / "simple").iterdir() if p.is_dir()]) == 23
    assert all(c.name.startswith("simple/") and c.model is not None for c in cases)


def test_filter_keeps_matching_case_names(onnx_data):
    cases = discover([onnx_data / "simple"], patterns=["*sequence*"])
    assert cases and all("sequence" in c.name for c in cases)


def test_real_case_with_a_light_url_runs_the_shipped_light_model(onnx_data):
    (case,) = discover([onnx_data / "real" / "test_squeezenet"])
    assert case.skip is None
    assert case.model == onnx_data / "light" / "light_squeezenet.onnx"
    assert case.generated_inputs == "arange"
    assert case.data_sets[0].outputs == (onnx_data / "light" / "light_squeezenet_output_0.pb",)
    assert (case.rtol, case.atol) == (1e-3, 1e-7)  # from its data.json


def test_light_folder_yields_one_case_per_light_model(onnx_data):
    cases = discover([onnx_data / "light"])
    assert len(cases) == 9 and all(c.generated_inputs == "arange" for c in cases)


def test_real_case_that_needs_a_download_is_skipped_with_the_reason(tmp_path):
    folder = tmp_path / "test_resnet50"
    folder.mkdir()
    (folder / "data.json").write_text(json.dumps(
        {"url": "https://download.onnxruntime.ai/onnx/models/resnet50.tar.gz", "model_name": "resnet50"}))
    (case,) = discover([tmp_path])
    assert case.skip and "downloaded" in case.skip and "resnet50.tar.gz" in case.skip


def test_zoo_layout_with_a_model_named_after_itself(tmp_path, onnx_data):
    folder = tmp_path / "sign-12"
    shutil.copytree(onnx_data / "simple" / "test_sign_model", folder)
    (folder / "model.onnx").rename(folder / "sign-12.onnx")
    (case,) = discover([tmp_path])
    assert case.model == folder / "sign-12.onnx" and case.data_sets


def test_legacy_npz_only_case_is_skipped_not_unpickled(tmp_path):
    folder = tmp_path / "old"
    folder.mkdir()
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    onnx.save(helper.make_model(graph), str(folder / "old.onnx"))
    np.savez(folder / "test_data_0.npz", inputs=np.zeros((1, 2), np.float32), outputs=np.zeros((1, 2), np.float32))
    (case,) = discover([tmp_path])
    assert case.skip and "test_data_*.npz" in case.skip


def test_a_path_without_cases_is_an_error_with_a_hint(tmp_path):
    with pytest.raises(InputError) as info:
        discover([tmp_path])
    assert "test_data_set" in info.value.hint
    with pytest.raises(InputError):
        discover([tmp_path / "missing"])


def test_node_cases_are_written_in_generate_data_layout(node_dir):
    cases = discover([node_dir / "test_abs"])
    assert cases[0].data_sets[0].inputs[0].name == "input_0.pb"
    assert len([p for p in node_dir.iterdir() if p.is_dir()]) > 1800
