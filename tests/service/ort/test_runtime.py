import json
import logging
import os
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest

from attnserve.model.artifacts import (
    CONFIG_METADATA_KEY,
    EMBEDDINGS_ONNX_FILENAME,
    FP16_ONNX_FILENAME,
    FUSED_ONNX_FILENAME,
    ONNX_FILENAME,
    REPORT_FILENAME,
)
from attnserve.service.core.errors import InferenceError, ModelLoadError, ProviderUnavailableError
from attnserve.service.ort import sessions as sessions_module
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from tests.conftest import SMALL_CONFIG


def test_config_comes_from_the_onnx_metadata(small_runtime):
    assert small_runtime.config == SMALL_CONFIG
    assert small_runtime.provider == "cpu"
    assert small_runtime.session.get_providers() == ["CPUExecutionProvider"]


def test_warmup_and_run_shapes(small_runtime):
    small_runtime.warmup()
    emb, att = small_runtime.run(np.zeros((2, 7), dtype=np.int64))
    assert emb.shape == (2, 7, 64) and emb.dtype == np.float32
    assert att.shape == (2, 2, 4, 7, 7) and att.dtype == np.float32
    assert small_runtime.embed(np.zeros((2, 7), dtype=np.int64)).shape == (2, 7, 64)


def test_both_graphs_are_loaded(small_runtime):
    assert small_runtime.embeddings_session is not small_runtime.session
    assert [o.name for o in small_runtime.embeddings_session.get_outputs()] == ["embeddings"]


def test_without_the_embeddings_graph_embed_uses_the_full_one(small_model_dir, tmp_path):
    model_dir = copy_model(small_model_dir, tmp_path)
    (model_dir / EMBEDDINGS_ONNX_FILENAME).unlink()
    runtime = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
    assert runtime.embeddings_session is runtime.session
    ids = np.arange(9, dtype=np.int64)[None]
    np.testing.assert_array_equal(runtime.embed(ids), runtime.run(ids)[0])


def test_on_cpu_the_full_graph_is_the_fused_one_with_the_traced_ones_numbers(
    small_model_dir, small_runtime
):
    traced = OrtRuntime(small_model_dir, RuntimeOptions(provider="cpu", fused_attention=False))
    assert small_runtime.attention_graph.name == FUSED_ONNX_FILENAME
    assert traced.attention_graph.name == ONNX_FILENAME
    rng = np.random.default_rng(0)
    for shape in [(1, 1), (3, 17), (2, SMALL_CONFIG.max_seq_len)]:
        ids = rng.integers(0, SMALL_CONFIG.vocab_size, size=shape)
        for fused, op_by_op in zip(small_runtime.run(ids), traced.run(ids), strict=True):
            np.testing.assert_allclose(fused, op_by_op, rtol=0, atol=1e-6)


def test_without_the_fused_graph_the_traced_one_serves(small_model_dir, tmp_path):
    model_dir = copy_model(small_model_dir, tmp_path)
    (model_dir / FUSED_ONNX_FILENAME).unlink()
    runtime = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
    assert runtime.attention_graph.name == ONNX_FILENAME
    assert runtime.run(np.arange(5)[None])[1].shape == (1, 2, 4, 5, 5)


def test_an_ort_failure_is_an_inference_error_naming_the_shape(small_runtime):
    # The runtime trusts its input (the transports validated it); what ORT itself refuses
    # comes back typed, so the batcher can answer INTERNAL for that batch alone.
    for run in (small_runtime.run, small_runtime.embed):
        with pytest.raises(InferenceError, match=r"ONNX Runtime failed on input_ids of shape"):
            run(np.zeros((1, 4), dtype=np.int32))


def copy_model(small_model_dir, tmp_path):
    target = tmp_path / "model"
    shutil.copytree(small_model_dir, target)
    return target


def test_missing_model_directory(tmp_path):
    with pytest.raises(ModelLoadError, match=f"no {ONNX_FILENAME} in .*attnserve export"):
        OrtRuntime(tmp_path / "nowhere")


def test_truncated_onnx_file(small_model_dir, tmp_path):
    model_dir = copy_model(small_model_dir, tmp_path)
    path = model_dir / ONNX_FILENAME
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="is not a loadable ONNX model"):
        OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))


def rewrite_metadata(model_dir, filename=ONNX_FILENAME, **changes):
    path = model_dir / filename
    proto = onnx.load(str(path))
    props = {p.key: p.value for p in proto.metadata_props}
    props.update(changes)
    del proto.metadata_props[:]
    onnx.helper.set_model_props(proto, {k: v for k, v in props.items() if v is not None})
    onnx.save(proto, str(path))


def test_onnx_without_config_metadata(small_model_dir, tmp_path):
    model_dir = copy_model(small_model_dir, tmp_path)
    rewrite_metadata(model_dir, **{CONFIG_METADATA_KEY: None})
    with pytest.raises(ModelLoadError, match=r"has no 'attnserve\.config' metadata"):
        OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"embeddings_name": "hidden_states"}, "has no 'hidden_states' output"),
        ({"n_layers": 3}, "output 'attentions' has shape"),
        ({"n_heads": 5}, "invalid model config: d_model (64) must be divisible"),
    ],
)
def test_config_that_does_not_match_the_graph(small_model_dir, tmp_path, change, message):
    model_dir = copy_model(small_model_dir, tmp_path)
    config = json.dumps({**SMALL_CONFIG.to_dict(), **change})
    rewrite_metadata(model_dir, **{CONFIG_METADATA_KEY: config})
    with pytest.raises(ModelLoadError) as excinfo:
        OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
    assert message in str(excinfo.value)


def test_graphs_with_different_configs_are_refused(small_model_dir, tmp_path):
    model_dir = copy_model(small_model_dir, tmp_path)
    other = json.dumps({**SMALL_CONFIG.to_dict(), "name": "another-model"})
    rewrite_metadata(model_dir, EMBEDDINGS_ONNX_FILENAME, **{CONFIG_METADATA_KEY: other})
    with pytest.raises(ModelLoadError, match="carry different configs"):
        OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))


def test_cuda_either_really_runs_or_fails_clearly(small_model_dir):
    try:
        runtime = OrtRuntime(small_model_dir, RuntimeOptions(provider="cuda"))
    except ProviderUnavailableError as exc:
        assert "provider=cuda was requested" in str(exc)
        assert "use provider=cpu" in str(exc)
    else:  # on a GPU machine: no silent CPU fallback
        assert runtime.provider == "cuda"
        assert runtime.session.get_providers()[0] == "CUDAExecutionProvider"


def test_auto_falls_back_to_cpu_saying_so_once(small_model_dir, caplog):
    """No GPU on a CPU machine is how it should be: one INFO line a process, naming the ONNX
    Runtime installed, and no warning."""
    sessions_module._note_cpu_fallback.cache_clear()  # as if this process were new
    with caplog.at_level(logging.INFO, logger="attnserve.service.ort.sessions"):
        runtime = OrtRuntime(small_model_dir, RuntimeOptions(provider="auto"))
        OrtRuntime(small_model_dir, RuntimeOptions(provider="auto"))
    if runtime.provider == "cpu":
        (line,) = [r for r in caplog.records if "running on CPU" in r.getMessage()]
        assert line.levelno == logging.INFO
        assert "installed: onnxruntime-gpu (the gpu or cuda extra)" in line.getMessage()
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert runtime.session.get_providers() == ["CPUExecutionProvider"]
    else:
        assert runtime.session.get_providers()[0] == "CUDAExecutionProvider"
    emb, _ = runtime.run(np.ones((1, 3), dtype=np.int64))
    assert np.isfinite(emb).all()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"provider": "tpu"}, "provider must be one of"), ({"intra_op_threads": -1}, ">= 0")],
)
def test_invalid_runtime_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RuntimeOptions(**kwargs)


def test_fp16_precision_serves_the_float16_graphs_in_float32(
    small_model_dir, small_runtime, caplog
):
    report = json.loads((small_model_dir / REPORT_FILENAME).read_text())
    with caplog.at_level(logging.WARNING, logger="service.runtime"):
        fp16 = OrtRuntime(small_model_dir, RuntimeOptions(provider="cpu", precision="fp16"))
    assert fp16.model_path.name == FP16_ONNX_FILENAME and fp16.precision == "fp16"
    assert "precision=fp16 on CPU" in caplog.text
    ids = np.random.default_rng(0).integers(0, SMALL_CONFIG.vocab_size, (2, 40))
    (emb16, att16), (emb32, att32) = fp16.run(ids), small_runtime.run(ids)
    assert emb16.dtype == att16.dtype == np.float32
    # As close to fp32 as export measured against PyTorch, and not identical: really fp16.
    measured = max(
        d
        for case in report["parity"]
        if case["graph"] == FP16_ONNX_FILENAME
        for d in case["max_abs_diff"].values()
    )
    assert 0 < np.abs(emb16 - emb32).max() <= 2 * measured
    assert np.abs(att16 - att32).max() <= 2 * measured
    assert np.abs(fp16.embed(ids) - small_runtime.embed(ids)).max() <= 2 * measured


def test_fp16_precision_without_fp16_graphs_says_how_to_get_them(small_model_dir, tmp_path):
    model_dir = copy_model(small_model_dir, tmp_path)
    (model_dir / FP16_ONNX_FILENAME).unlink()
    # The directory says which precisions it holds, and how to write the missing one.
    message = "holds no fp16 graphs \\(precisions held: fp32\\); .* export --precision fp16"
    with pytest.raises(ModelLoadError, match=message):
        OrtRuntime(model_dir, RuntimeOptions(provider="cpu", precision="fp16"))
    with pytest.raises(ValueError, match="precision must be one of"):
        RuntimeOptions(precision="fp8")


def test_giving_memory_back_keeps_the_answers(small_runtime):
    ids = np.arange(1, 200)[None]
    before = small_runtime.run(ids)
    small_runtime.release_memory()  # empties ORT's arenas: the next run allocates afresh
    for a, b in zip(before, small_runtime.run(ids), strict=True):
        np.testing.assert_array_equal(a, b)


# Warms up and runs the model, then reports the CPU time (ns, from each thread's schedstat)
# that the process's other threads, ORT's workers, used in the 0.3 s after the last run.
IDLE_PROBE = """
import os, sys, threading, time
import numpy as np
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions

def others_ns():
    me, total = threading.get_native_id(), 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) != me:
            try:
                total += int(open(f"/proc/self/task/{tid}/schedstat").read().split()[0])
            except FileNotFoundError:  # the thread ended meanwhile
                pass
    return total

runtime = OrtRuntime(sys.argv[1], RuntimeOptions(provider="cpu"))
runtime.warmup()  # as the server does: every session has run (new pools spin at first)
for _ in range(5):
    runtime.embed(np.zeros((1, 8), dtype=np.int64))
before = others_ns()
time.sleep(0.3)
print(others_ns() - before)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux /proc")
def test_workers_spin_during_a_run_but_not_after_it(small_model_dir):
    """ORT's default keeps workers spinning after a run (tens of ms of CPU here); the
    server's settings stop them when the run ends, so an idle server uses no CPU."""
    out = subprocess.run(
        [sys.executable, "-c", IDLE_PROBE, str(small_model_dir)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(out.stdout) < 5_000_000  # ns of CPU: waking up to park, not spinning
