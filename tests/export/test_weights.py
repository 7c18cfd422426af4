"""One weights file per directory: every graph points into it, each weight written once.

Checked on the files themselves (what ONNX's external data references say), and through
ONNX Runtime: directories written before there was a weights file still load.
"""

import json
import shutil

import numpy as np
import onnx
from onnx.external_data_helper import uses_external_data

from attnserve.export.weights import INLINE_BYTES, TRANSPOSED_SUFFIX
from attnserve.model.artifacts import (
    EMBEDDINGS_FP16_ONNX_FILENAME,
    EMBEDDINGS_ONNX_FILENAME,
    FP16_ONNX_FILENAME,
    FUSED_ONNX_FILENAME,
    ONNX_FILENAME,
    WEIGHTS_FILENAMES,
    WEIGHTS_INDEX_FILENAME,
    ModelDirectory,
)
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from attnserve.service.ort.sessions import weights_version
from tests.conftest import SMALL_CONFIG

FP32_GRAPHS = (ONNX_FILENAME, EMBEDDINGS_ONNX_FILENAME, FUSED_ONNX_FILENAME)
FP16_GRAPHS = (FP16_ONNX_FILENAME, EMBEDDINGS_FP16_ONNX_FILENAME)


def _references(graph) -> dict[str, tuple[str, int, int]]:
    """name -> (location, offset, length) of each initializer kept outside the graph."""
    found = {}
    for tensor in graph.graph.initializer:
        if uses_external_data(tensor):
            info = {e.key: e.value for e in tensor.external_data}
            found[tensor.name] = (info["location"], int(info["offset"]), int(info["length"]))
    return found


def test_graphs_of_a_directory_share_one_weights_file(small_model_dir):
    for precision, graphs in (("fp32", FP32_GRAPHS), ("fp16", FP16_GRAPHS)):
        weights = small_model_dir / WEIGHTS_FILENAMES[precision]
        shared: dict[str, tuple[str, int, int]] = {}
        for name in graphs:
            proto = onnx.load(str(small_model_dir / name), load_external_data=False)
            references = _references(proto)
            assert references, name
            inline = [t for t in proto.graph.initializer if not uses_external_data(t)]
            assert all(len(t.raw_data) <= INLINE_BYTES for t in inline), name
            for tensor, (location, offset, length) in references.items():
                assert location == weights.name
                assert offset + length <= weights.stat().st_size
                # The same weight is the same bytes in every graph: written once.
                assert shared.setdefault(tensor, (location, offset, length)) == (
                    location,
                    offset,
                    length,
                )
        # Nothing in the file but the weights the graphs point at and, in float32, the
        # parameters the index adds (those the graphs keep inline), and page alignment.
        places = {(offset, length) for _, offset, length in shared.values()}
        if precision == "fp32":
            index = json.loads((small_model_dir / WEIGHTS_INDEX_FILENAME).read_text())
            listed = {(t["offset"], t["length"]) for t in index["tensors"].values()}
            assert places <= listed  # the index names every tensor the graphs point at
            places = listed
        used = sum(length for _, length in places)
        assert used <= weights.stat().st_size <= used + 4096 * len(places)


def test_the_weights_file_holds_the_model_once(small_model, small_model_dir):
    weights = small_model_dir / WEIGHTS_FILENAMES["fp32"]
    parameters = sum(p.numel() for p in small_model.parameters())
    assert weights.stat().st_size <= 4 * parameters + 4096 * len(small_model.state_dict())
    # The graphs themselves are their structure: small beside the weights.
    for name in FP32_GRAPHS:
        assert (small_model_dir / name).stat().st_size < weights.stat().st_size


def test_linear_weights_are_stored_as_matmul_reads_them(small_model, small_model_dir):
    proto = onnx.load(str(small_model_dir / ONNX_FILENAME), load_external_data=False)
    initializers = {t.name for t in proto.graph.initializer}
    # No Transpose of a weight is left for ONNX Runtime to fold into a private copy.
    assert not [
        n for n in proto.graph.node if n.op_type == "Transpose" and n.input[0] in initializers
    ]
    name = "blocks.0.attn.qkv.weight"
    location, offset, length = _references(proto)[name + TRANSPOSED_SUFFIX]
    stored = np.fromfile(small_model_dir / location, np.float32, length // 4, offset=offset)
    want = small_model.state_dict()[name].numpy().T  # (in, out)
    np.testing.assert_array_equal(stored.reshape(want.shape), want)


def test_a_directory_written_before_the_weights_file_still_loads(
    small_model_dir, small_runtime, tmp_path
):
    # Earlier versions kept the weights inside each graph: write the graphs that way.
    old = tmp_path / "old"
    old.mkdir()
    for name in FP32_GRAPHS:
        onnx.save(onnx.load(str(small_model_dir / name)), str(old / name))
    assert not (old / WEIGHTS_FILENAMES["fp32"]).exists()
    runtime = OrtRuntime(old, RuntimeOptions(provider="cpu"))
    ids = np.random.default_rng(0).integers(0, SMALL_CONFIG.vocab_size, size=(2, 33))
    for got, want in zip(runtime.run(ids), small_runtime.run(ids), strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(runtime.embed(ids), small_runtime.embed(ids))
    assert ModelDirectory(old).precisions == ("fp32",)
    assert ModelDirectory(old).weight_bytes("fp32") == (old / ONNX_FILENAME).stat().st_size


def test_the_version_covers_the_weights_file(small_model_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(small_model_dir, copy)
    first = weights_version(copy / ONNX_FILENAME)
    assert first == weights_version(small_model_dir / ONNX_FILENAME)
    weights = copy / WEIGHTS_FILENAMES["fp32"]
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert weights_version(copy / ONNX_FILENAME) != first


def test_a_full_disk_is_said_and_leaves_nothing_behind(small_model, tmp_path, monkeypatch):
    import errno

    import pytest

    from attnserve.export import weights
    from attnserve.export.model_dir import write_model_dir
    from attnserve.export.scratch import ExportWriteError

    def no_space(self, tensor):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(weights.WeightsFile, "reference", no_space)
    out = tmp_path / "model"
    with pytest.raises(ExportWriteError, match=r"is full \(.*\): .*; nothing was written to"):
        write_model_dir(small_model, out, log=lambda _: None)
    assert list(tmp_path.iterdir()) == []  # neither the directory nor its scratch
