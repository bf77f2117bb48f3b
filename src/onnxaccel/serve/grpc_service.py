"""``inference.GRPCInferenceService`` (the Open Inference Protocol's gRPC service) on grpc.aio.

Methods are registered by their full names with a generic handler, with message classes built from the
vendored descriptor (grpc_messages.py), so no generated stubs are needed. Besides the protocol's six RPCs it
answers Triton's ModelConfig, ModelStatistics, RepositoryIndex, RepositoryModelLoad/Unload, ModelStreamInfer and
the shared memory RPCs (SystemSharedMemoryStatus/Register/Unregister; the CUDA ones register nothing).

Tensor contents follow open_inference_grpc.proto: inputs come as ``raw_input_contents`` (one bytes per input that
is not in shared memory, in input order, as Triton's infer_handler.cc InferGRPCToInput counts them) or as typed
``contents``; outputs are always returned as ``raw_output_contents``, as Triton does (tritonclient and the KServe
SDK read both). An output written into shared memory gets an empty entry there, so the entries stay one per
output in order (tritonclient's InferResult.as_numpy finds an output's entry by its position; Triton's
ResponseAllocatorHelper adds an empty one too).
"""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np

from onnxaccel.errors import MissingDependencyError
from onnxaccel.serve.core import InferenceService
from onnxaccel.serve.grpc_messages import SERVICE, messages, read_infer_request
from onnxaccel.serve.security import InflightBudget
from onnxaccel.serve.auth import grpc_auth_interceptor, grpc_credentials
from onnxaccel.serve.protocol import (
    DATATYPES, InferRequest, ProtocolError, RequestedOutput, bad_request, check_output_parameters, check_shape,
    check_unsupported, datatype_of, element_count, from_bytes, shm_input, to_bytes,
)
from onnxaccel.serve.peer import grpc_peer
from onnxaccel.serve.shared_memory import CUDA_REFUSED

logger = logging.getLogger(__name__)

#: InferTensorContents field for each datatype (open_inference_grpc.proto comments on each field).
CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def _param_value(param) -> object:
    which = param.WhichOneof("parameter_choice")
    return getattr(param, which) if which else None


def decode_grpc_request(msg, shm=None) -> InferRequest:
    """Turn a gRPC ModelInferRequest into the protocol-independent InferRequest; with ``shm`` (the server's
    shared_memory.SharedMemoryRegistry), inputs read from and outputs placed in system shared memory."""
    request = InferRequest(model_name=msg.model_name, model_version=msg.model_version, id=msg.id,
                           parameters={k: _param_value(v) for k, v in msg.parameters.items()})
    check_unsupported(request.parameters, "the request", offered=shm is not None)  # as over HTTP (protocol.py)
    raw = list(msg.raw_input_contents)
    in_message = sum(1 for t in msg.inputs if "shared_memory_region" not in t.parameters)
    if raw and len(raw) != in_message:
        raise bad_request(f"raw_input_contents has {len(raw)} entries for {in_message} inputs not in shared memory; "
                          "give one per such input, in input order.")
    index = 0
    for tensor in msg.inputs:
        name, datatype, shape = tensor.name, tensor.datatype, tuple(tensor.shape)
        params = {k: _param_value(v) for k, v in tensor.parameters.items()}
        if datatype not in DATATYPES:
            raise bad_request(f"Input '{name}' has datatype {datatype!r}; the protocol's datatypes are "
                              f"{', '.join(DATATYPES)}.")
        if any(d < 0 for d in shape):
            raise bad_request(f"Input '{name}' has a negative dimension in shape {list(shape)}.")
        check_shape(shape, name)
        if name in request.inputs:
            raise bad_request(f"Input '{name}' appears twice in the request.")
        if shm is not None and "shared_memory_region" in params and tensor.HasField("contents"):
            raise bad_request(f"Input '{name}' names shared memory region {params['shared_memory_region']!r} and "
                              "also has typed contents; give its data once.")
        shared = shm_input(shm, params, datatype, shape, name)
        if shared is not None:
            request.inputs[name] = shared
        elif raw:
            if tensor.HasField("contents"):
                raise bad_request(f"Input '{name}' has typed contents while raw_input_contents is used.")
            request.inputs[name] = from_bytes(raw[index], datatype, shape, name)
            index += 1
        else:
            request.inputs[name] = _from_contents(tensor, datatype, shape)
        request.datatypes[name] = datatype
    places: dict[str, object] = {}
    for output in msg.outputs:  # class_count (classification) refused, shared memory checked, as over HTTP
        if output.name not in places:  # each output once, in the order first asked
            places[output.name] = check_output_parameters(
                {k: _param_value(v) for k, v in output.parameters.items()}, output.name, shm)
    if msg.outputs:
        request.outputs = [RequestedOutput(name, shm=place) for name, place in places.items()]
    return request


def _load_parameter_names(request) -> dict:
    """The names of a RepositoryModelLoadRequest's ``parameters`` (field 3 of Triton's grpc_service.proto, a map
    of ModelRepositoryParameter; the vendored descriptor leaves it out, so it arrives as an unknown field: each
    map entry is a message whose field 1 is the key)."""
    try:
        from google.protobuf.unknown_fields import UnknownFieldSet
    except ImportError:  # protobuf < 4.22: nothing to inspect, the load goes on as before
        return {}
    names = {}
    for field in UnknownFieldSet(request):
        if field.field_number != 3 or not isinstance(field.data, bytes):
            continue
        names[_map_key(field.data) or "parameters"] = None
    return names


def _map_key(entry: bytes) -> str:
    """Field 1 (a length-delimited string) of a serialized map entry, or '' when it is not there first."""
    if len(entry) < 2 or entry[0] != 0x0A:
        return ""
    length, offset, shift = 0, 1, 0
    while offset < len(entry):
        byte = entry[offset]
        length |= (byte & 0x7F) << shift
        offset += 1
        shift += 7
        if not byte & 0x80:
            break
    return entry[offset:offset + length].decode(errors="replace")


def _from_contents(tensor, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    if datatype not in CONTENTS_FIELD:
        raise bad_request(f"Input '{tensor.name}' is {datatype}, which has no typed contents field; send it in "
                          "raw_input_contents.")
    values = getattr(tensor.contents, CONTENTS_FIELD[datatype])
    count = element_count(shape)
    if len(values) != count:
        raise bad_request(f"Input '{tensor.name}' has shape {list(shape)} ({count} elements), but "
                          f"contents.{CONTENTS_FIELD[datatype]} holds {len(values)} values.")
    if datatype == "BYTES":
        return np.array(list(values), dtype=object).reshape(shape)
    return np.asarray(values, dtype=DATATYPES[datatype]).reshape(shape)


def encode_grpc_response(m, request: InferRequest, version: str, outputs: dict[str, np.ndarray]):
    """Build a gRPC ModelInferResponse from the outputs, their contents as raw bytes."""
    response = m.ModelInferResponse(model_name=request.model_name, model_version=version, id=request.id)
    shared = {o.name: o for o in request.outputs or [] if o.shm is not None}
    for name, value in outputs.items():
        tensor = response.outputs.add(name=name, datatype=datatype_of(value.dtype), shape=list(value.shape))
        if name in shared:  # written into the client's shared memory: its place, and an empty entry
            for key, param in shared[name].shm.parameters(shared[name].written).items():
                setattr(tensor.parameters[key], "string_param" if isinstance(param, str) else "int64_param", param)
            response.raw_output_contents.append(b"")
        else:
            response.raw_output_contents.append(to_bytes(value))
    return response


def create_grpc_server(service: InferenceService, address: str, *, reuse_port: bool = False,
                       budget: InflightBudget | None = None):
    """A grpc.aio server bound to ``address`` (host:port), not yet started. ``reuse_port`` lets several
    worker processes bind the same port (SO_REUSEPORT: the kernel spreads connections over them); otherwise a
    port already taken is an error rather than shared. ``budget``: the HTTP side's in-flight budget
    (--max-inflight-mb), which inference messages hold too while they are handled."""
    try:
        import grpc
    except ImportError as exc:
        raise MissingDependencyError("grpcio", "serve", "The gRPC endpoint") from exc
    m = messages()
    limit = service.config.max_request_bytes
    # grpc answers RESOURCE_EXHAUSTED itself for messages above max_receive_message_length.
    config = service.config
    interceptors = [grpc_auth_interceptor(config.auth_token)] if config.auth_token else []
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit),
                                      ("grpc.max_send_message_length", max(limit, 256 * 1024 * 1024)),
                                      ("grpc.so_reuseport", 1 if reuse_port else 0)], interceptors=interceptors)
    codes = grpc.StatusCode
    bound: list[int] = []  # the port, once bound: a client's socket is found by its address and the server's

    def peer(context):  # the connection of this call's client, for its shared memory regions (serve/peer.py)
        return lambda: grpc_peer(context.peer(), config.host, bound[0] if bound else None)

    def regions(context):
        return service.shared_memory(peer(context))

    def client_shm(context):
        return service.client_shm(peer(context))

    async def guarded(context, call):
        try:
            return await call()
        except ProtocolError as exc:
            await context.abort(getattr(codes, exc.grpc_code), exc.message)

    async def server_live(_request, _context):
        return m.ServerLiveResponse(live=service.live())

    async def server_ready(_request, _context):
        return m.ServerReadyResponse(ready=service.ready())

    async def model_ready(request, context):
        async def call():
            return m.ModelReadyResponse(ready=service.model_ready(request.name, request.version))
        return await guarded(context, call)

    async def server_metadata(_request, _context):
        return m.ServerMetadataResponse(**service.server_metadata())

    async def model_metadata(request, context):
        async def call():
            metadata = service.model_metadata(request.name, request.version)
            metadata.pop("parameters", None)  # HTTP only: the gRPC message has no such field (image input)
            return m.ModelMetadataResponse(**metadata)
        return await guarded(context, call)

    async def model_config(request, context):
        async def call():
            config = service.model_config(request.name, request.version)
            # The subset of model_config.proto compiled here (proto/triton_extensions.proto) has no parameters
            # map; they (shape buckets, the image input) are read from the HTTP config.
            config.pop("parameters", None)
            return m.ModelConfigResponse(config=config)
        return await guarded(context, call)

    async def model_statistics(request, context):
        async def call():
            return m.ModelStatisticsResponse(**service.model_stats(request.name, request.version))
        return await guarded(context, call)

    async def repository_index(request, _context):
        return m.RepositoryIndexResponse(models=service.repository.index(request.ready))

    async def repository_load(request, context):
        name = request.triton_model_name or request.model_name

        async def call():
            service.check_load_parameters(name, _load_parameter_names(request))
            await service.load(name)
            return m.RepositoryModelLoadResponse(model_name=name, isLoaded=True)
        return await guarded(context, call)

    async def repository_unload(request, context):
        name = request.triton_model_name or request.model_name

        async def call():
            await service.unload(name)
            return m.RepositoryModelUnloadResponse(model_name=name, isUnloaded=True)
        return await guarded(context, call)

    async def shm_status(request, context):
        async def call():
            found = regions(context).status(request.name)
            return m.SystemSharedMemoryStatusResponse(regions={r["name"]: r for r in found})
        return await guarded(context, call)

    async def shm_register(request, context):
        async def call():
            regions(context).register(request.name, request.key, request.offset, request.byte_size)
            return m.SystemSharedMemoryRegisterResponse()
        return await guarded(context, call)

    async def shm_unregister(request, context):
        async def call():
            regions(context).unregister(request.name)
            return m.SystemSharedMemoryUnregisterResponse()
        return await guarded(context, call)

    async def cuda_status(request, context):  # none is ever registered: all of them is an empty map
        async def call():
            if request.name:
                raise bad_request(f"No CUDA shared memory region '{request.name}' is registered. {CUDA_REFUSED}")
            return m.CudaSharedMemoryStatusResponse()
        return await guarded(context, call)

    async def cuda_register(_request, context):
        async def call():
            raise bad_request(CUDA_REFUSED)
        return await guarded(context, call)

    async def cuda_unregister(_request, _context):  # nothing to unregister (perf_analyzer asks, see SERVING.md)
        return m.CudaSharedMemoryUnregisterResponse()

    async def model_infer(request, context):
        start = time.perf_counter()
        label = service.metric_label(request.model_name)
        # grpc has received the whole message; past the budget it is refused at once instead of being decoded,
        # queued and run (24 concurrent 64 MB messages had added 1.9 GB), as HTTP bodies are.
        held = sum(len(raw) for raw in request.raw_input_contents)
        held = held if budget is not None and held > config.max_control_bytes else 0
        if held and not budget.take(held):
            service.metrics.reject("inflight_budget")
            service.metrics.observe_request(label, "grpc", "RESOURCE_EXHAUSTED", time.perf_counter() - start)
            await context.abort(codes.RESOURCE_EXHAUSTED, "The server holds as many request bytes as it may "
                                "(--max-inflight-mb); retry shortly.")
        try:
            return await _infer(request, context, start, label)
        finally:
            if held:
                budget.give(held)

    async def _infer(request, context, start: float, label: str):
        try:
            infer_request = decode_grpc_request(request, client_shm(context))
            outputs, version = await service.infer(infer_request)
            response = encode_grpc_response(m, infer_request, version, outputs)
        except ProtocolError as exc:
            service.metrics.observe_request(label, "grpc", exc.grpc_code, time.perf_counter() - start)
            await context.abort(getattr(codes, exc.grpc_code), exc.message)
        service.metrics.observe_request(label, "grpc", "OK", time.perf_counter() - start)
        return response

    async def model_stream_infer(request_iterator, context):
        """Triton's ModelStreamInfer: requests in, responses out as each finishes (clients match them by id).
        Each request runs as ModelInfer does (budget, statistics, metrics); a failed one is answered in the
        stream with its error message, and the stream stays open."""
        out: asyncio.Queue = asyncio.Queue()
        running: set[asyncio.Task] = set()

        async def one(request) -> None:
            start = time.perf_counter()
            label = service.metric_label(request.model_name)
            held = sum(len(raw) for raw in request.raw_input_contents)
            held = held if budget is not None and held > config.max_control_bytes else 0
            code = "OK"
            try:
                if held and not budget.take(held):
                    held = 0
                    service.metrics.reject("inflight_budget")
                    raise ProtocolError(429, "The server holds as many request bytes as it may (--max-inflight-mb); "
                                        "retry shortly.")
                infer_request = decode_grpc_request(request, client_shm(context))
                outputs, version = await service.infer(infer_request)
                response = m.ModelStreamInferResponse(
                    infer_response=encode_grpc_response(m, infer_request, version, outputs))
            except ProtocolError as exc:
                code = exc.grpc_code
                response = m.ModelStreamInferResponse(error_message=exc.message)
            except Exception as exc:  # noqa: BLE001 - answered in the stream; the stream goes on
                logger.exception("gRPC stream: a request to model '%s' failed", request.model_name)
                code = "INTERNAL"
                response = m.ModelStreamInferResponse(error_message=f"Inference failed: {exc}")
            finally:
                if held:
                    budget.give(held)
            service.metrics.observe_request(label, "grpc", code, time.perf_counter() - start)
            out.put_nowait(response)

        async def read() -> None:
            try:
                async for request in request_iterator:
                    task = asyncio.ensure_future(one(request))
                    running.add(task)
                    task.add_done_callback(running.discard)
                await asyncio.gather(*running, return_exceptions=True)
            finally:
                out.put_nowait(None)  # the client closed its side and every answer is queued (or it went away)

        reader = asyncio.ensure_future(read())
        try:
            while (response := await out.get()) is not None:
                yield response
        finally:
            reader.cancel()
            for task in list(running):
                task.cancel()

    rpcs = {
        "ServerLive": (server_live, m.ServerLiveRequest), "ServerReady": (server_ready, m.ServerReadyRequest),
        "ModelReady": (model_ready, m.ModelReadyRequest),
        "ServerMetadata": (server_metadata, m.ServerMetadataRequest),
        "ModelMetadata": (model_metadata, m.ModelMetadataRequest),
        "ModelConfig": (model_config, m.ModelConfigRequest),
        "ModelStatistics": (model_statistics, m.ModelStatisticsRequest),
        "RepositoryIndex": (repository_index, m.RepositoryIndexRequest),
        "RepositoryModelLoad": (repository_load, m.RepositoryModelLoadRequest),
        "RepositoryModelUnload": (repository_unload, m.RepositoryModelUnloadRequest),
        "SystemSharedMemoryStatus": (shm_status, m.SystemSharedMemoryStatusRequest),
        "SystemSharedMemoryRegister": (shm_register, m.SystemSharedMemoryRegisterRequest),
        "SystemSharedMemoryUnregister": (shm_unregister, m.SystemSharedMemoryUnregisterRequest),
        "CudaSharedMemoryStatus": (cuda_status, m.CudaSharedMemoryStatusRequest),
        "CudaSharedMemoryRegister": (cuda_register, m.CudaSharedMemoryRegisterRequest),
        "CudaSharedMemoryUnregister": (cuda_unregister, m.CudaSharedMemoryUnregisterRequest),
    }
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(fn, request_deserializer=req.FromString,
                                                  response_serializer=lambda r: r.SerializeToString())
        for name, (fn, req) in rpcs.items()
    }
    handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(  # tensors as views of the received bytes
        model_infer, request_deserializer=read_infer_request, response_serializer=lambda r: r.SerializeToString())
    handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
        model_stream_infer, request_deserializer=read_infer_request,
        response_serializer=lambda r: r.SerializeToString())
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    credentials = grpc_credentials(config)
    port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    bound.append(port)
    return server, port
