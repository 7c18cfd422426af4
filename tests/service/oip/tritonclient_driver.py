"""tritonclient, unmodified, driven by the V2 tests in their own process: one call as a dict
in, one JSON-shaped answer out, the same for its gRPC and its HTTP client.

    {"call": "is_server_live"}                          -> {"result": true}
    {"call": "get_model_metadata", "args": ["m"]}       -> {"result": {...}} (as JSON)
    {"infer": {"model": "m", "inputs": [{"name", "datatype", "shape", "data"}],
               "outputs": ["embeddings"], "parameters": {...}}}
                                                         -> {"outputs": {name: {...}}}
A failed call answers {"error": {"status": "StatusCode.INVALID_ARGUMENT", "message": ...}}.
"""

from __future__ import annotations

import numpy as np
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

AS_JSON = {"get_server_metadata", "get_model_metadata", "get_model_config"}
AS_JSON |= {"get_inference_statistics"}


def infer(triton, client, spec: dict, shm_bytes: int = 0) -> dict:
    """One inference. With `shm_bytes`, its one output goes to a shared-memory region of
    that size, which tritonclient's own utilities make, register, read and remove."""
    if not shm_bytes:
        return _infer(triton, client, spec)
    import tritonclient.utils.shared_memory as shm

    key = f"/attnserve-test-{shm_bytes}"
    handle = shm.create_shared_memory_region("outputs", key, shm_bytes)
    try:
        client.register_system_shared_memory("outputs", key, shm_bytes)
        try:
            return _infer(triton, client, spec, (shm, handle, shm_bytes))
        finally:
            client.unregister_system_shared_memory("outputs")
    finally:
        shm.destroy_shared_memory_region(handle)


def _infer(triton, client, spec: dict, region: tuple | None = None) -> dict:
    inputs = []
    for tensor in spec["inputs"]:
        item = triton.InferInput(tensor["name"], tensor["shape"], tensor["datatype"])
        if tensor["datatype"] == "BYTES":
            data = np.array([s.encode() for s in tensor["data"]], dtype=np.object_)
        else:
            data = np.array(tensor["data"], dtype=triton_to_np_dtype(tensor["datatype"]))
        item.set_data_from_numpy(data.reshape(tensor["shape"]))
        inputs.append(item)
    outputs = [triton.InferRequestedOutput(name) for name in spec.get("outputs", [])]
    if region:
        (output,) = outputs
        output.set_shared_memory("outputs", region[2])
    result = client.infer(
        spec["model"], inputs, outputs=outputs or None, parameters=spec.get("parameters")
    )
    answer = {}
    response = result.get_response()
    for output in response["outputs"] if isinstance(response, dict) else response.outputs:
        if isinstance(output, dict):
            name, datatype, shape = output["name"], output["datatype"], output["shape"]
        else:
            name, datatype, shape = output.name, output.datatype, list(output.shape)
        if region:
            shm, handle, _ = region
            array = shm.get_contents_as_numpy(handle, triton_to_np_dtype(datatype), shape)
        else:
            array = result.as_numpy(name)
        answer[name] = {
            "datatype": datatype,
            "shape": list(array.shape),
            "data": array.astype(np.float64).ravel().tolist(),
        }
    if isinstance(response, dict):
        parameters = dict(response.get("parameters", {}))
    else:  # gRPC: each an InferParameter, one of its fields set
        parameters = {
            key: getattr(value, value.WhichOneof("parameter_choice"))
            for key, value in response.parameters.items()
        }
    return {"outputs": answer, "parameters": parameters}


def handle(protocol: str, triton, client, command: dict) -> dict:
    """One command through `client` (of module `triton`, tritonclient.grpc or .http)."""
    try:
        if "infer" in command:
            return infer(triton, client, command["infer"], command.get("shm_bytes", 0))
        name = command["call"]
        kwargs = {"as_json": True} if protocol == "grpc" and name in AS_JSON else {}
        return {"result": getattr(client, name)(*command.get("args", []), **kwargs)}
    except InferenceServerException as exc:
        return {"error": {"status": exc.status(), "message": exc.message()}}
