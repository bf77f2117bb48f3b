"""Run by an interpreter that has the KServe SDK (kserve 0.21): infer over REST (JSON and binary) and gRPC
against the server given on the command line; prints one JSON line of results.

    python tests/serve/kserve_client.py HTTP_URL GRPC_ADDRESS
"""

import asyncio
import json
import sys

import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest
from kserve.inference_client import RESTConfig


async def main(http_url: str, grpc_address: str) -> dict:
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    rest = InferenceRESTClient(RESTConfig(protocol="v2", timeout=30))
    out = {"ready": await rest.is_server_ready(http_url)}
    for binary in (False, True):
        inp = InferInput("x", [2, 4], "FP32")
        inp.set_data_from_numpy(x, binary_data=binary)
        response = await rest.infer(http_url, InferRequest(model_name="mlp", infer_inputs=[inp],
                                                           request_id="k1"), model_name="mlp")
        out["rest_binary" if binary else "rest_json"] = response.outputs[0].as_numpy().tolist()
    grpc = InferenceGRPCClient(grpc_address)
    inp = InferInput("x", [2, 4], "FP32")
    inp.set_data_from_numpy(x)
    response = await grpc.infer(InferRequest(model_name="mlp", infer_inputs=[inp], request_id="k2"))
    out["grpc"] = response.outputs[0].as_numpy().tolist()
    await rest.close()
    await grpc.close()
    return out


if __name__ == "__main__":
    sys.stdout.write(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2]))) + "\n")
