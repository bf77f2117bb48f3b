"""Calibration tables in the two formats the MIGraphX/TensorRT providers read, and the --native INT8 path."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from onnxaccel.target import parse_target
from onnxaccel.transform.calibration_table import read_table, write_table

RANGES = {"input": 2.5, "conv_out": 0.125, "mostly_negative": 7.0, "tiny": 1e-6}


def test_flatbuffers_table_reads_back_through_onnxruntimes_schema(tmp_path):
    table = write_table(RANGES, tmp_path, parse_target("tensorrt"))
    assert table.path.name == "calibration.flatbuffers" and not table.native
    from onnxruntime.quantization.CalTableFlatBuffers import TrtTable

    root = TrtTable.TrtTable.GetRootAsTrtTable(table.path.read_bytes(), 0)
    parsed = {root.Dict(i).Key().decode(): float(root.Dict(i).Value()) for i in range(root.DictLength())}
    assert parsed == RANGES  # "value: maximum absolute value in floating point", as a string
    assert table.options == {"trt_int8_enable": "1", "trt_int8_calibration_table_name": str(table.path),
                             "trt_int8_use_native_calibration_table": "0"}


def test_tensorrt_text_table_has_the_trt_header_and_scales(tmp_path):
    table = write_table(RANGES, tmp_path, parse_target("tensorrt"), native=True)
    lines = table.path.read_text().splitlines()
    assert "TRT-" in lines[0].split(":")[0]  # what ReadDynamicRange checks before anything else
    name, _, hexbits = lines[1].partition(":")
    scale = struct.unpack(">f", struct.pack(">I", int(hexbits.strip(), 16)))[0]
    assert scale * 127 == pytest.approx(RANGES[name], rel=1e-6)
    assert read_table(table.path, native=True) == pytest.approx(RANGES, rel=1e-6)
    assert table.options["trt_int8_use_native_calibration_table"] == "1"


def test_native_int8_for_migraphx_is_refused_with_the_qdq_path(invoke, pretrained_cls, calibration_images, tmp_path):
    # The MIGraphX EP reads the table into a local and quantizes with a map nothing fills (ROCm/onnxruntime
    # rel-1.22.1 migraphx_execution_provider.cc L162/L1445): the table path would calibrate on garbage.
    out = tmp_path / "cls.mgx.onnx"
    result = invoke("optimize", pretrained_cls, "-o", out, "-t", "migraphx", "--shape", "x=1x3x48x192",
                    "--int8", "static", "--native", "--calibration", calibration_images, "--mean", "0.5,0.5,0.5",
                    "--std", "0.5,0.5,0.5", "--resize", "48")
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "calibrate on uninitialized values" in text and "--int8 static" in text
    assert not (tmp_path / "cls.mgx.calibration").exists()

def test_native_needs_a_provider_with_a_precision_switch(invoke, mlp_path, tmp_path):
    result = invoke("optimize", mlp_path, "-o", tmp_path / "o.onnx", "-t", "cpu", "--fp16", "--native")
    assert result.exit_code == 2 and "has no fp16 switch" in result.output
